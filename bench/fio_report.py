#!/usr/bin/env python3
"""Parse fio JSON output (ioengine=nbd runs) for bench/nbd-peers.sh.

Standard library only.

Subcommands
-----------
summary FIO_JSON
    One human-readable line (IOPS, MiB/s, mean/p99 clat) for progress output.

report RECORDS_TSV [--base SERVER]
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

sample PID OUT [--interval S]
    Append "epoch_seconds server_ticks host_busy_ticks" to OUT every S
    seconds until SIGTERM. server_ticks is utime+stime (+cutime+cstime) of
    PID and its live descendants; /proc/PID/stat covers all threads.
    host_busy_ticks is the machine's non-idle CPU time from /proc/stat.
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


def load_samples(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            v = line.split()
            if len(v) == 3:
                out.append((float(v[0]), int(v[1]), int(v[2])))
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
                 "host_pct": math.nan, "note": ""}
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
                try:
                    samples = load_samples(spath)
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
    print("\n".join(out))
    failed = [r for r in recs if r["m"] is None]
    return 1 if failed and args.strict else 0


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


def _descendants(pid):
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _host_busy():
    with open("/proc/stat", "rb") as f:
        v = f.readline().split()
    # cpu user nice system idle iowait irq softirq steal ...
    return sum(int(x) for x in v[1:4]) + sum(int(x) for x in v[6:9])


def cmd_sample(args):
    """Write 'epoch_seconds server_ticks host_busy_ticks' every --interval
    seconds until SIGTERM/SIGINT or until the server process is gone."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    pids, rescan_at = [args.pid], 0.0
    with open(args.out, "w", encoding="utf-8") as out:
        while True:
            now = time.time()
            if now >= rescan_at:
                try:
                    pids = _descendants(args.pid)
                except OSError:
                    pass
                rescan_at = now + 1.0
            total = 0
            try:
                total = _proc_ticks(args.pid)
            except (OSError, ValueError):
                return 0  # server gone
            for p in pids[1:]:
                try:
                    total += _proc_ticks(p)
                except (OSError, ValueError):
                    pass
            out.write(f"{time.time():.4f} {total} {_host_busy()}\n")
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
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("sample", help="sample a server's CPU ticks "
                       "periodically (used by nbd-peers.sh)")
    p.add_argument("pid", type=int)
    p.add_argument("out")
    p.add_argument("--interval", type=float, default=0.2)
    p.set_defaults(func=cmd_sample)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
