#!/usr/bin/env python3
"""Helper of bench/sparse-copy.sh (Python 3, stdlib only).

layout OUT SIZE DATA PIECES
    Write the sparse source image: a file of SIZE bytes holding DATA bytes of
    random data (os.urandom) in pieces whose sizes cycle through PIECES (a
    space-separated list of byte counts, e.g. "4194304 1048576 262144 65536";
    the last piece is cut so the total is exactly DATA), placed at evenly
    spaced offsets: piece i starts at i * stride (stride = SIZE / pieces,
    rounded down to 1 MiB). The file is fsynced. Prints
    "<pieces> <stride> <data bytes>".

map FILE SIZE
    Print "<data ranges> <bytes in them>" of the first SIZE bytes of FILE, as
    SEEK_DATA/SEEK_HOLE see them.

cmp A B SIZE
    Compare the first SIZE bytes of two files, reading only the ranges where
    either holds data (SEEK_DATA/SEEK_HOLE; a range that is a hole in both
    reads as zeroes in both). A short file reads as zeroes past its end.
    Prints "<differing 4 KiB blocks> <bytes compared>"; exit status 1 if any
    block differs.

warm FILE [FILE...] SIZE
    Read the data ranges of each file (into the page cache).

nbdlog LOGFILE
    Sum the requests in an nbdkit log filter file: prints "<reads> <bytes
    read> <block status requests> <bytes they asked about> <failed requests>".

report RECORDS [--counts COUNTS] [--base SERVER] [--target X]
    Markdown tables from the records file sparse-copy.sh writes, one line per
    copy, tab-separated:
        round tool server rc seconds rchar read_bytes cpu_ticks clk_tck
        dest_alloc verify
    (rc: the copy's exit status; rchar / read_bytes: increase of the server
    processes' /proc/PID/io counters over the copy; cpu_ticks: increase of
    their utime + stime; dest_alloc: allocated bytes of the copy; verify:
    "ok", "<n> blocks differ", or "-" when not checked.) COUNTS: one line per
    copy through the counting proxy, tab-separated:
        tool server rc reads read_bytes extents extents_bytes failed
"""
import os
import re
import statistics
import sys

BS = 4096
CHUNK = 1 << 20


def data_ranges(fd, size):
    """[(start, end)] of the data in [0, size); everything if the file
    system cannot tell."""
    out, off = [], 0
    while off < size:
        try:
            s = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == 6:  # ENXIO: no data after off
                break
            return [(0, size)]
        if s >= size:
            break
        e = min(os.lseek(fd, s, os.SEEK_HOLE), size)
        out.append((s, e))
        off = e
    return out


def merged(ranges, size):
    out = []
    for s, e in sorted((s // BS * BS, min(-(-e // BS) * BS, size)) for s, e in ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def cmd_layout(out, size, data, pieces):
    size, data = int(size), int(data)
    sizes = [int(p) for p in pieces.split()]
    if not sizes or any(p <= 0 or p % 65536 for p in sizes):
        sys.exit("PIECES must be positive multiples of 64 KiB")
    lens, total, i = [], 0, 0
    while total < data:
        n = min(sizes[i % len(sizes)], data - total)
        lens.append(n)
        total += n
        i += 1
    if not lens:
        sys.exit("DATA must be > 0")
    stride = size // len(lens) // (1 << 20) * (1 << 20)
    if stride < max(lens):
        sys.exit(f"{len(lens)} pieces of up to {max(lens)} bytes do not fit in {size} bytes "
                 f"with a gap between them (stride {stride}): lower DATA or raise SIZE")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for k, n in enumerate(lens):
            off, done = k * stride, 0
            while done < n:
                m = min(CHUNK, n - done)
                os.pwrite(fd, os.urandom(m), off + done)
                done += m
        os.fsync(fd)
    finally:
        os.close(fd)
    print(len(lens), stride, total)


def cmd_map(path, size):
    size = int(size)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = data_ranges(fd, size)
    finally:
        os.close(fd)
    print(len(r), sum(e - s for s, e in r))


def cmd_cmp(a, b, size):
    size = int(size)
    fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
    diff = compared = 0
    for s, e in merged(data_ranges(fa, size) + data_ranges(fb, size), size):
        off = s
        while off < e:
            n = min(CHUNK, e - off)
            x = os.pread(fa, n, off).ljust(n, b"\0")
            y = os.pread(fb, n, off).ljust(n, b"\0")
            if x != y:
                diff += sum(1 for o in range(0, n, BS) if x[o:o + BS] != y[o:o + BS])
            compared += n
            off += n
    print(diff, compared)
    sys.exit(1 if diff else 0)


def cmd_warm(*args):
    *paths, size = args
    size = int(size)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            for s, e in data_ranges(fd, size):
                off = s
                while off < e:
                    n = min(CHUNK * 8, e - off)
                    os.pread(fd, n, off)
                    off += n
        finally:
            os.close(fd)


REQ = re.compile(r" (Read|Extents) id=(\d+) offset=0x[0-9a-f]+ count=0x([0-9a-f]+)")
RET = re.compile(r" \.\.\.(Read|Extents) id=\d+ .*return=(-?\d+)")


def cmd_nbdlog(path):
    n = {"Read": [0, 0], "Extents": [0, 0]}
    failed = 0
    with open(path, errors="replace") as f:
        for line in f:
            m = REQ.search(line)
            if m:
                n[m.group(1)][0] += 1
                n[m.group(1)][1] += int(m.group(3), 16)
                continue
            m = RET.search(line)
            if m and m.group(2) != "0":
                failed += 1
    print(n["Read"][0], n["Read"][1], n["Extents"][0], n["Extents"][1], failed)


def fmt(x, nd=2):
    return "n/a" if x is None else f"{x:.{nd}f}"


def cmd_report(path, *opts):
    base, target, counts = "nbdkit", 1.2, None
    it = iter(opts)
    for o in it:
        if o == "--counts":
            counts = next(it)
        elif o == "--base":
            base = next(it)
        elif o == "--target":
            target = float(next(it))
        else:
            sys.exit(f"unknown option {o}")
    rows, order_t, order_s, every = {}, [], [], {}
    with open(path) as f:
        for line in f:
            v = line.rstrip("\n").split("\t")
            if len(v) != 11:
                continue
            rnd, tool, srv, rc, sec, rchar, rbytes, ticks, tck, alloc, verify = v
            if tool not in order_t:
                order_t.append(tool)
            if srv not in order_s:
                order_s.append(srv)
            rec = dict(rc=int(rc), sec=float(sec), rchar=int(rchar), rbytes=int(rbytes),
                       cpu=int(ticks) / int(tck), alloc=int(alloc), verify=verify)
            rows.setdefault((tool, srv), []).append(rec)
            every[(int(rnd), tool, srv)] = rec

    def med(runs, key):
        vals = [r[key] for r in runs if r["rc"] == 0]
        return statistics.median(vals) if vals else None

    mib = 1 << 20
    out = ["| server | tool | time s (median) | min–max s | bytes read MiB | "
           "disk read MiB | server CPU s | dest allocated MiB | copies checked | "
           f"time / {base} | bytes read / {base} |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    ratios = []
    for tool in order_t:
        b = rows.get((tool, base), [])
        bt, bb = med(b, "sec"), med(b, "rchar")
        for srv in order_s:
            runs = rows.get((tool, srv))
            if not runs:
                continue
            ok = [r for r in runs if r["rc"] == 0]
            failed = len(runs) - len(ok)
            t, rb = med(runs, "sec"), med(runs, "rchar")
            secs = [r["sec"] for r in ok]
            spread = f"{min(secs):.2f}–{max(secs):.2f}" if secs else "n/a"
            disk, cpu, alloc = med(runs, "rbytes"), med(runs, "cpu"), med(runs, "alloc")
            checks = [r["verify"] for r in runs if r["verify"] != "-"]
            bad = [c for c in checks if c != "ok"]
            chk = (f"{len(checks)} identical" if checks and not bad
                   else ("; ".join(bad) if bad else "not checked"))
            if failed:
                chk += f"; **{failed} of {len(runs)} copies failed**"
            tr = t / bt if t is not None and bt else None
            br = rb / bb if rb is not None and bb else None
            out.append(
                f"| {srv} | {tool} | {fmt(t)} | {spread} | "
                f"{fmt(None if rb is None else rb / mib, 1)} | "
                f"{fmt(None if disk is None else disk / mib, 1)} | {fmt(cpu)} | "
                f"{fmt(None if alloc is None else alloc / mib, 1)} | {chk} | "
                f"{'n/a' if tr is None else f'{tr:.2f}×'} | "
                f"{'n/a' if br is None else f'{br:.2f}×'} |")
            if srv.startswith("tandem") and tr is not None:
                ratios.append((srv, tool, t, bt, tr))
    out.append("")
    if ratios:
        out += ["### Against the target", "",
                f"Issue 17: copying out the volume takes at most {target:g}× nbdkit's time "
                "(median over the rounds).", "",
                f"| server | tool | time s | {base} s | ratio | ≤ {target:g}×? |",
                "|---|---|---:|---:|---:|---|"]
        for srv, tool, t, bt, tr in ratios:
            out.append(f"| {srv} | {tool} | {t:.2f} | {bt:.2f} | {tr:.2f}× | "
                       f"{'yes' if tr <= target else '**no**'} |")
        out.append("")
    if counts and os.path.exists(counts):
        out += ["### Requests the tools made", "",
                "One more copy per tool and server after the timed rounds, through an nbdkit "
                "proxy that logs every request (`nbdkit --filter=log nbd socket=SOCK`; not "
                "timed): what the client asked for over NBD, whatever the server then reads "
                "from its file.", "",
                "| server | tool | NBD reads | NBD read MiB | block status requests | "
                "asked about GiB | failed requests |",
                "|---|---|---:|---:|---:|---:|---:|"]
        with open(counts) as f:
            for line in f:
                v = line.rstrip("\n").split("\t")
                if len(v) != 8:
                    continue
                tool, srv, rc, nr, rb, ne, eb, nf = v
                if rc != "0":
                    out.append(f"| {srv} | {tool} | copy failed (exit {rc}) | | | | |")
                    continue
                out.append(f"| {srv} | {tool} | {nr} | {int(rb) / mib:.1f} | {ne} | "
                           f"{int(eb) / (1 << 30):.1f} | {nf} |")
        out.append("")
    out += ["### Every copy", "",
            "| round | tool | server | time s | bytes read MiB | server CPU s | check |",
            "|---:|---|---|---:|---:|---:|---|"]
    for (rnd, tool, srv), r in sorted(every.items(), key=lambda kv: kv[0][0]):
        t = "failed" if r["rc"] else f"{r['sec']:.2f}"
        out.append(f"| {rnd} | {tool} | {srv} | {t} | {r['rchar'] / mib:.1f} | "
                   f"{r['cpu']:.2f} | {r['verify']} |")
    out.append("")
    print("\n".join(out))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    fn = {"layout": cmd_layout, "map": cmd_map, "cmp": cmd_cmp, "warm": cmd_warm,
          "nbdlog": cmd_nbdlog, "report": cmd_report}.get(cmd)
    if fn is None:
        sys.exit(__doc__)
    fn(*args)


if __name__ == "__main__":
    main()
