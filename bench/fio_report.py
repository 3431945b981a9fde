#!/usr/bin/env python3
"""Parse fio JSON output (ioengine=nbd runs) for bench/nbd-peers.sh and
bench/replicated.sh.

Standard library only.

Subcommands
-----------
summary FIO_JSON
    One human-readable line (IOPS, MiB/s, mean/p99 clat) for progress output.

report RECORDS_TSV [--base SERVER] [--targets SPEC]
    Markdown tables for all runs listed in RECORDS_TSV. Each line of that file
    is tab-separated:

        job  server  fio_rc  fio_json_path  samples_path  t_end  runtime  clk_tck

    samples_path is the output of `sample` for that run ("-" if none), t_end
    the epoch time fio exited and runtime fio's measured seconds. fio's
    measured period ends just before it exits, so the server CPU used over
    [t_end - runtime + MARGIN, t_end - MARGIN] (interpolated between samples)
    is divided by IOPS x window length: server CPU per completed I/O. Ramp
    time and fio's (load-dependent) start-up are excluded.

    The ratio table compares --base (default: first server seen) against every
    other server. fio_rc 98 = server died during the job, 99 = skipped.

    If the samples name several processes (see `sample`), a second table
    splits each server's CPU per I/O by process.

    --targets adds a table of goals checked against the ratios. SPEC is a
    list separated by ";" (or newlines) of

        JOB METRIC PEER OP VALUE

    e.g. "randwrite16x2 iops nbdkit >= 0.8; randwrite1 lat_mean nbdkit <= 2":
    the ratio base/PEER of METRIC (iops, mibs, lat_mean, lat_p99, cpu) in
    JOB must satisfy OP (>=, <=, >, <) VALUE.

sample PID[,PID...] OUT [--interval S] [--labels NAME,NAME...]
    Append "epoch_seconds server_ticks host_busy_ticks" to OUT every S
    seconds until SIGTERM. server_ticks is utime+stime (+cutime+cstime) of
    the PIDs and their live descendants; /proc/PID/stat covers all threads.
    host_busy_ticks is the machine's non-idle CPU time from /proc/stat.
    With several PIDs (a server made of several processes, e.g. three
    replicating node daemons), server_ticks is their sum, each line carries
    one more column per PID (that PID and its descendants), and the file
    starts with "# labels NAME..." (--labels, default the PIDs). Sampling
    stops when any of the PIDs is gone.

diffblocks FILE_A FILE_B [--bs N] [--size BYTES]
    Compare two files (replicas) block by block, over their first BYTES if given
    (tandem's internal metadata follows the volume and differs per node), and print
    "<differing blocks> <blocks compared> <size A> <size B>". Reads with
    O_DIRECT where possible, so the page cache is left as it was.
"""

import argparse
import json
import math
import os
import signal
import sys
import time


def load_fio_json(path):
    """fio sometimes prints engine chatter ("fio: connected to NBD server")
    before the JSON document, even with --output; skip to the first '{'."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("{")
    if start < 0:
        raise ValueError(f"{path}: no JSON object in fio output")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


def _pct(lat, key="99.000000"):
    p = lat.get("percentile") or {}
    if key in p:
        return p[key] / 1000.0
    # tolerate other float formatting of the key
    for k, v in p.items():
        try:
            if abs(float(k) - float(key)) < 1e-9:
                return v / 1000.0
        except ValueError:
            pass
    return math.nan


def metrics(fio):
    """Aggregate metrics over all jobs in the fio JSON (normally one, thanks
    to group_reporting)."""
    jobs = fio.get("jobs") or []
    if not jobs:
        raise ValueError("fio JSON has no jobs")
    iops = bw = 0.0
    total_ios = 0
    err = 0
    # latency: IO-count-weighted mean over directions that did I/O; the p99
    # is taken from the direction with the most I/Os (there is only one in
    # every job of this benchmark).
    lat_sum = 0.0
    lat_n = 0
    best = None
    sync_ios = 0
    sync_mean = sync_p99 = math.nan
    tlat_sum = 0.0  # total latency (slat + clat), for the commit estimate
    iodepth = None
    numjobs = 1
    for j in jobs:
        err = err or j.get("error", 0)
        opts = j.get("job options") or {}
        if iodepth is None and "iodepth" in opts:
            iodepth = int(str(opts["iodepth"]))
        if "numjobs" in opts:
            numjobs = int(str(opts["numjobs"]))
        for d in ("read", "write", "trim"):
            s = j.get(d) or {}
            n = int(s.get("total_ios", 0))
            if n <= 0:
                continue
            iops += float(s.get("iops", 0.0))
            bw += float(s.get("bw_bytes", 0.0))
            total_ios += n
            clat = s.get("clat_ns") or s.get("lat_ns") or {}
            lat_sum += float(clat.get("mean", 0.0)) * n
            tlat_sum += float((s.get("lat_ns") or clat).get("mean", 0.0)) * n
            lat_n += n
            if best is None or n > best[0]:
                best = (n, clat)
        s = j.get("sync") or {}
        n = int(s.get("total_ios", 0))
        if n > 0:
            sync_ios += n
            sl = s.get("lat_ns") or {}
            sync_mean = float(sl.get("mean", math.nan)) / 1000.0
            sync_p99 = _pct(sl)
    return {
        "iops": iops,
        "mibs": bw / (1 << 20),
        "total_ios": total_ios,
        "lat_mean_us": (lat_sum / lat_n / 1000.0) if lat_n else math.nan,
        "lat_p99_us": _pct(best[1]) if best else math.nan,
        "tot_lat_mean_us": (tlat_sum / lat_n / 1000.0) if lat_n else math.nan,
        "sync_ios": sync_ios,
        "sync_mean_us": sync_mean,
        "sync_p99_us": sync_p99,
        "iodepth": iodepth if iodepth is not None else 1,
        "numjobs": numjobs,
        "error": err,
    }


def fmt(v, digits=None):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if digits is None:
        a = abs(v)
        digits = 0 if a >= 1000 else 1 if a >= 10 else 2
    return f"{v:,.{digits}f}"


def ratio(a, b):
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def cmd_summary(args):
    m = metrics(load_fio_json(args.json))
    print(
        f"IOPS {fmt(m['iops'])}  {fmt(m['mibs'])} MiB/s  "
        f"clat mean {fmt(m['lat_mean_us'])} us  p99 {fmt(m['lat_p99_us'])} us"
        + (
            f"  flush mean {fmt(m['sync_mean_us'])} us"
            if m["sync_ios"]
            else ""
        )
    )
    return 0


MARGIN = 0.25  # seconds trimmed from each end of fio's measured period


def load_samples(path, labels=None):
    """Rows (t, server_ticks, host_ticks, part_ticks...). If a list is given
    as labels, it receives the per-process labels of the file (if any)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            v = line.split()
            if len(v) >= 2 and v[0] == "#" and v[1] == "labels":
                if labels is not None:
                    labels[:] = v[2:]
                continue
            if len(v) >= 3 and not v[0].startswith("#"):
                out.append((float(v[0]),) + tuple(int(x) for x in v[1:]))
    if labels is not None and labels:
        n = 3 + len(labels)
        out = [r for r in out if len(r) == n]
    return out


def interp(samples, t, idx):
    """Linear interpolation of column idx at time t; None if t is outside
    the sampled range."""
    if not samples or t < samples[0][0] or t > samples[-1][0]:
        return None
    for a, b in zip(samples, samples[1:]):
        if a[0] <= t <= b[0]:
            if b[0] == a[0]:
                return float(a[idx])
            f = (t - a[0]) / (b[0] - a[0])
            return a[idx] + f * (b[idx] - a[idx])
    return float(samples[-1][idx])


def read_records(path):
    recs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            job, server, rc, jpath, spath, t_end, runtime, clk = \
                line.split("\t")
            r = {"job": job, "server": server, "rc": int(rc), "m": None,
                 "cpu_us_per_io": math.nan, "cpu_pct": math.nan,
                 "host_pct": math.nan, "note": "", "parts": []}
            if r["rc"] == 0:
                try:
                    r["m"] = metrics(load_fio_json(jpath))
                    if r["m"]["error"]:
                        r["note"] = f"fio error {r['m']['error']}"
                except (OSError, ValueError) as e:
                    r["note"] = f"unparsable fio output ({e})"
            elif r["rc"] == 98:
                r["note"] = "server died during this job"
            elif r["rc"] == 99:
                r["note"] = "skipped, server died earlier"
            else:
                r["note"] = f"fio exit {r['rc']}"
            if r["m"] and spath not in ("-", ""):
                labels = []
                try:
                    samples = load_samples(spath, labels)
                except OSError:
                    samples = []
                t1 = float(t_end) - MARGIN
                t0 = float(t_end) - float(runtime) + MARGIN
                w = t1 - t0
                c0, c1 = interp(samples, t0, 1), interp(samples, t1, 1)
                h0, h1 = interp(samples, t0, 2), interp(samples, t1, 2)
                if None in (c0, c1) or w <= 0:
                    r["note"] = "no CPU sample"
                else:
                    cpu_s = (c1 - c0) / float(clk)
                    r["cpu_pct"] = 100.0 * cpu_s / w
                    r["host_pct"] = 100.0 * (h1 - h0) / float(clk) / w
                    ios = r["m"]["iops"] * w
                    if ios > 0:
                        r["cpu_us_per_io"] = cpu_s * 1e6 / ios
                    for i, lab in enumerate(labels):
                        p0, p1 = interp(samples, t0, 3 + i), \
                            interp(samples, t1, 3 + i)
                        ps = (p1 - p0) / float(clk)
                        r["parts"].append(
                            (lab, ps * 1e6 / ios if ios > 0 else math.nan,
                             100.0 * ps / w))
            recs.append(r)
    return recs


def cmd_report(args):
    recs = read_records(args.records)
    if not recs:
        print("_no results_")
        return 1
    jobs, servers = [], []
    for r in recs:
        if r["job"] not in jobs:
            jobs.append(r["job"])
        if r["server"] not in servers:
            servers.append(r["server"])
    by = {(r["job"], r["server"]): r for r in recs}
    out = []
    w = out.append

    w("### Results")
    w("")
    w("| job | server | IOPS | MiB/s | mean lat µs | p99 lat µs "
      "| server CPU µs/IO | server CPU % | host busy % |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for job in jobs:
        for s in servers:
            r = by.get((job, s))
            if r is None:
                continue
            m = r["m"]
            if m is None:
                w(f"| {job} | {s} | FAILED: {r['note']} | | | | | | |")
                continue
            note = f" ({r['note']})" if r["note"] else ""
            w(f"| {job} | {s} | {fmt(m['iops'])} | {fmt(m['mibs'])} "
              f"| {fmt(m['lat_mean_us'])} | {fmt(m['lat_p99_us'])} "
              f"| {fmt(r['cpu_us_per_io'])}{note} | {fmt(r['cpu_pct'], 0)} "
              f"| {fmt(r['host_pct'], 0)} |")
    w("")

    # FLUSH latency for jobs that issued flushes (fsync=1).
    flush_rows = [(job, s) for job in jobs for s in servers
                  if by.get((job, s)) and by[(job, s)]["m"]
                  and by[(job, s)]["m"]["sync_ios"]]
    if flush_rows:
        w("### FLUSH latency (jobs with fsync)")
        w("")
        w("| job | server | flushes/s | flush mean µs | flush p99 µs "
          "| commit mean µs (write + flush) |")
        w("|---|---|---:|---:|---:|---:|")
        for job, s in flush_rows:
            m = by[(job, s)]["m"]
            w(f"| {job} | {s} | {fmt(m['iops'])} | {fmt(m['sync_mean_us'])} "
              f"| {fmt(m['sync_p99_us'])} "
              f"| {fmt(m['tot_lat_mean_us'] + m['sync_mean_us'])} |")
        w("")

    part_rows = [(job, s) for job in jobs for s in servers
                 if by.get((job, s)) and by[(job, s)]["m"]
                 and by[(job, s)]["parts"]]
    if part_rows:
        w("### Server CPU by process")
        w("")
        w("CPU µs per completed I/O (and % of one core) of each process of "
          "a multi-process server, over the same window as above; they add "
          "up to the server's CPU µs/IO.")
        w("")
        w("| job | server | CPU µs/IO by process |")
        w("|---|---|---|")
        for job, s in part_rows:
            r = by[(job, s)]
            w(f"| {job} | {s} | " + ", ".join(
                f"{lab} {fmt(us)} ({fmt(pct, 0)} %)"
                for lab, us, pct in r["parts"]) + " |")
        w("")

    base = args.base or servers[0]
    others = [s for s in servers if s != base]
    if base in servers and others:
        w(f"### Ratios {base} / peer")
        w("")
        w("IOPS: higher is better for "
          f"{base}. CPU/IO and latency: lower is better for {base}.")
        w("")
        hdr = ["job"]
        for o in others:
            hdr += [f"IOPS {base}/{o}", f"CPU/IO {base}/{o}"]
        for o in others:
            hdr += [f"mean lat {base}/{o}", f"p99 lat {base}/{o}"]
        w("| " + " | ".join(hdr) + " |")
        w("|---|" + "---:|" * (len(hdr) - 1))
        for job in jobs:
            rb = by.get((job, base))
            mb = rb["m"] if rb else None
            cells = [job]
            for o in others:
                ro = by.get((job, o))
                mo = ro["m"] if ro else None
                cells.append(ratio(mb["iops"], mo["iops"])
                             if mb and mo else "n/a")
                cells.append(ratio(rb["cpu_us_per_io"], ro["cpu_us_per_io"])
                             if mb and mo else "n/a")
            qd1 = mb is not None and mb["iodepth"] == 1 and mb["numjobs"] == 1
            for o in others:
                ro = by.get((job, o))
                mo = ro["m"] if ro else None
                if qd1 and mo:
                    cells.append(ratio(mb["lat_mean_us"], mo["lat_mean_us"]))
                    cells.append(ratio(mb["lat_p99_us"], mo["lat_p99_us"]))
                else:
                    cells += ["–", "–"]
            w("| " + " | ".join(cells) + " |")
        w("")
        w("Latency ratios are given for the iodepth-1, single-connection jobs "
          "only (at higher queue depths latency is just depth / IOPS).")
        w("")
    if args.targets:
        out += targets_table(args.targets, by, base)
    print("\n".join(out))
    failed = [r for r in recs if r["m"] is None]
    return 1 if failed and args.strict else 0


TARGET_METRICS = {
    "iops": ("IOPS", "iops", None),
    "mibs": ("MiB/s", "mibs", None),
    "lat_mean": ("mean latency", "lat_mean_us", None),
    "lat_p99": ("p99 latency", "lat_p99_us", None),
    "cpu": ("CPU per I/O", None, "cpu_us_per_io"),
}
TARGET_OPS = {
    ">=": (lambda a, b: a >= b, "≥"),
    "<=": (lambda a, b: a <= b, "≤"),
    ">": (lambda a, b: a > b, ">"),
    "<": (lambda a, b: a < b, "<"),
}


def parse_targets(spec):
    out = []
    for item in spec.replace("\n", ";").split(";"):
        v = item.split()
        if not v:
            continue
        if (len(v) != 5 or v[1] not in TARGET_METRICS
                or v[3] not in TARGET_OPS):
            raise ValueError(f"bad target '{item.strip()}' (want: JOB METRIC "
                             f"PEER OP VALUE; METRIC one of "
                             f"{', '.join(TARGET_METRICS)}; OP one of "
                             f"{', '.join(TARGET_OPS)})")
        out.append((v[0], v[1], v[2], v[3], float(v[4])))
    return out


def _target_value(r, metric):
    if r is None or r["m"] is None:
        return math.nan
    _, mkey, rkey = TARGET_METRICS[metric]
    return float(r["m"][mkey]) if mkey else float(r[rkey])


def targets_table(spec, by, base):
    out = ["### Against the targets", "",
           f"| target | {base} | peer | ratio | met? |",
           "|---|---:|---:|---:|---|"]
    for job, metric, peer, op, val in parse_targets(spec):
        if (job, base) not in by and (job, peer) not in by:
            continue  # job or peer not run
        name, _, _ = TARGET_METRICS[metric]
        test, sym = TARGET_OPS[op]
        a = _target_value(by.get((job, base)), metric)
        b = _target_value(by.get((job, peer)), metric)
        ok = "n/a"
        q = math.nan
        if not (math.isnan(a) or math.isnan(b)) and b != 0:
            q = a / b
            ok = "yes" if test(q, val) else "**no**"
        out.append(f"| {job} {name} {base}/{peer} {sym} {val:g}× "
                   f"| {fmt(a)} | {fmt(b)} "
                   f"| {'n/a' if math.isnan(q) else f'{q:.2f}×'} | {ok} |")
    out.append("")
    return out


def _open_uncached(path):
    """Open for reading with O_DIRECT where the filesystem allows it, so a
    comparison neither fills the page cache (large folios: see
    BENCHMARKS.md) nor evicts what the servers cached; falls back to
    buffered reads. Returns (fd, direct)."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return os.open(path, os.O_RDONLY | flag), True
        except OSError:
            pass
    return os.open(path, os.O_RDONLY), False


def cmd_diffblocks(args):
    """Count differing --bs blocks of two files (a shorter file is compared
    over its length; the sizes are printed so the caller sees a mismatch)."""
    import mmap
    bs = args.bs
    chunk = bs * 256
    diff = total = 0
    fds = [_open_uncached(args.a), _open_uncached(args.b)]
    # page-aligned buffers, as O_DIRECT wants
    bufs = [mmap.mmap(-1, chunk), mmap.mmap(-1, chunk)]
    off = 0
    try:
        while True:
            ns = []
            for (fd, _), buf in zip(fds, bufs):
                n = 0
                while n < chunk:
                    r = os.preadv(fd, [memoryview(buf)[n:]], off + n)
                    if r <= 0:
                        break
                    n += r
                ns.append(n)
            n = min(ns)
            if args.size is not None:
                n = max(0, min(n, args.size - off))
            if n == 0:
                break
            total += (n + bs - 1) // bs
            x, y = memoryview(bufs[0])[:n], memoryview(bufs[1])[:n]
            if x != y:
                for o in range(0, n, bs):
                    if x[o:o + bs] != y[o:o + bs]:
                        diff += 1
            off += n
            if n < chunk:
                break
    finally:
        for fd, direct in fds:
            if not direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    print(diff, total, os.path.getsize(args.a), os.path.getsize(args.b))
    return 0


def _proc_ticks(pid):
    """utime+stime+cutime+cstime of one process (all its threads)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        st = f.read()
    rest = st[st.rindex(b")") + 2:].split()
    # rest[0] is field 3 (state); utime is field 14.
    return int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])


def _children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rindex(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def _host_busy():
    with open("/proc/stat", "rb") as f:
        v = f.readline().split()
    # cpu user nice system idle iowait irq softirq steal ...
    return sum(int(x) for x in v[1:4]) + sum(int(x) for x in v[6:9])


def _descendants_of(roots):
    kids = _children_map()
    out = []
    for root in roots:
        tree, todo = [], [root]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(kids.get(p, []))
        out.append(tree)
    return out


def cmd_sample(args):
    """Write 'epoch_seconds server_ticks host_busy_ticks [per-PID ticks...]'
    every --interval seconds until SIGTERM/SIGINT or until a server process
    is gone."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    roots = [int(p) for p in str(args.pid).split(",") if p.strip()]
    labels = args.labels.split(",") if args.labels else [str(p) for p in roots]
    if len(labels) != len(roots):
        print("sample: --labels must name every PID", file=sys.stderr)
        return 2
    trees, rescan_at = [[p] for p in roots], 0.0
    with open(args.out, "w", encoding="utf-8") as out:
        if len(roots) > 1:
            out.write("# labels " + " ".join(labels) + "\n")
        while True:
            now = time.time()
            if now >= rescan_at:
                try:
                    trees = _descendants_of(roots)
                except OSError:
                    pass
                rescan_at = now + 1.0
            parts = []
            for tree in trees:
                try:
                    t = _proc_ticks(tree[0])
                except (OSError, ValueError):
                    return 0  # a server process is gone
                for p in tree[1:]:
                    try:
                        t += _proc_ticks(p)
                    except (OSError, ValueError):
                        pass
                parts.append(t)
            extra = "".join(f" {t}" for t in parts) if len(roots) > 1 else ""
            out.write(f"{time.time():.4f} {sum(parts)} {_host_busy()}"
                      f"{extra}\n")
            out.flush()
            if stop:
                return 0
            time.sleep(max(0.0, args.interval - (time.time() - now)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("summary", help="one-line summary of a fio JSON file")
    p.add_argument("json")
    p.set_defaults(func=cmd_summary)
    p = sub.add_parser("report", help="markdown tables from a records TSV")
    p.add_argument("records")
    p.add_argument("--base", help="server for the ratio table "
                   "(default: first server in the records)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 if any run failed")
    p.add_argument("--targets", help="goals for the ratios: "
                   "'JOB METRIC PEER OP VALUE; ...' (see the module doc)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("sample", help="sample a server's CPU ticks "
                       "periodically (used by nbd-peers.sh, replicated.sh)")
    p.add_argument("pid", help="PID, or PIDs separated by commas")
    p.add_argument("out")
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--labels", help="names of the PIDs, separated by commas")
    p.set_defaults(func=cmd_sample)
    p = sub.add_parser("diffblocks", help="count differing blocks of two "
                       "replica files")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--bs", type=int, default=4096)
    p.add_argument("--size", type=int, default=None,
                   help="compare only the first SIZE bytes")
    p.set_defaults(func=cmd_diffblocks)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
