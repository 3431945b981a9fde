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

        job  server  fio_rc  fio_json_path  cpu_ticks  window_s  clk_tck

    cpu_ticks is the server's utime+stime (clock ticks, all threads) consumed
    during a measurement window of window_s seconds that lies inside fio's
    measured (post-ramp) period. Server CPU per I/O is then
    (cpu_ticks / clk_tck) / (window_s * IOPS), i.e. CPU seconds divided by the
    number of I/Os completed in the same window. A cpu_ticks of "-" means the
    sample is missing (e.g. the server died).

    The ratio table compares --base (default: first server seen) against every
    other server.
"""

import argparse
import json
import math
import sys


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


def read_records(path):
    recs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            job, server, rc, jpath, ticks, window, clk = line.split("\t")
            r = {"job": job, "server": server, "rc": int(rc), "m": None,
                 "cpu_us_per_io": math.nan, "cpu_pct": math.nan,
                 "note": ""}
            if r["rc"] == 0:
                try:
                    r["m"] = metrics(load_fio_json(jpath))
                    if r["m"]["error"]:
                        r["note"] = f"fio error {r['m']['error']}"
                except (OSError, ValueError) as e:
                    r["note"] = f"unparsable fio output ({e})"
            else:
                r["note"] = f"fio exit {r['rc']}"
            if r["m"] and ticks not in ("-", "") and window not in ("-", ""):
                cpu_s = int(ticks) / float(clk)
                w = float(window)
                ios = r["m"]["iops"] * w
                if w > 0:
                    r["cpu_pct"] = 100.0 * cpu_s / w
                if ios > 0:
                    r["cpu_us_per_io"] = cpu_s * 1e6 / ios
            elif r["m"] and not r["note"]:
                r["note"] = "no CPU sample"
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
      "| server CPU µs/IO | server CPU % |")
    w("|---|---|---:|---:|---:|---:|---:|---:|")
    for job in jobs:
        for s in servers:
            r = by.get((job, s))
            if r is None:
                continue
            m = r["m"]
            if m is None:
                w(f"| {job} | {s} | FAILED: {r['note']} | | | | | |")
                continue
            note = f" ({r['note']})" if r["note"] else ""
            w(f"| {job} | {s} | {fmt(m['iops'])} | {fmt(m['mibs'])} "
              f"| {fmt(m['lat_mean_us'])} | {fmt(m['lat_p99_us'])} "
              f"| {fmt(r['cpu_us_per_io'])}{note} | {fmt(r['cpu_pct'], 0)} |")
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
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
