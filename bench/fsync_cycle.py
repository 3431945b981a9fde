#!/usr/bin/env python3
"""fsync_cycle.py — where one fio `fsync=1` cycle through a diskless Primary spends its time.

Reads `perf script -F comm,pid,tid,cpu,time,event,trace` output of a system-wide
`perf record` taken during fio `--rw=randwrite --bs=4k --iodepth=1 --fsync=1` on the
Primary (the events are listed in BENCHMARKS.md, "a device-level trace"), splits it into
cycles at the Primary's 4,124-byte NBD reads (a 4 KiB write request) and prints medians
in µs after that read: when each Secondary enters its fdatasync, when the block layer
issues the data writes and cache flushes, when the fdatasyncs return, and how often both
Secondaries sat on the same CPU when the write arrived.

usage: fsync_cycle.py PERF_SCRIPT_TXT PRIMARY_PID SECONDARY_PID SECONDARY_PID
"""
import re
import statistics as st
import sys

LINE = re.compile(r"\s*\S+\s+(\d+)/\d+\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__.strip().splitlines()[-1])
    path, primary, *secondaries = sys.argv[1:]
    cycles, cur, cpu = [], None, {}
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        pid, c, t, ev, rest = m.groups()
        t = float(t) * 1e6
        if pid in secondaries:
            cpu[pid] = c
        if pid == primary and ev == "syscalls:sys_exit_recvfrom" and rest.strip() == "0x101c":
            if cur:
                cycles.append(cur)
            one_cpu = len({cpu.get(p) for p in secondaries}) == 1
            cur = {"t0": t, "one_cpu": one_cpu, "enter": [], "write": [], "flush": [], "exit": []}
            continue
        if cur is None:
            continue
        dt = t - cur["t0"]
        if ev == "block:block_rq_issue" and (" WS " in rest or " W " in rest):
            cur["write"].append(dt)
        elif ev == "block:block_rq_issue" and " FF " in rest:
            cur["flush"].append(dt)
        elif ev == "syscalls:sys_enter_fdatasync" and pid in secondaries:
            cur["enter"].append(dt)
        elif ev == "syscalls:sys_exit_fdatasync" and pid in secondaries:
            cur["exit"].append(dt)
    whole = [c for c in cycles if all(len(c[k]) == 2 for k in ("enter", "write", "exit"))]
    if not whole:
        sys.exit("no complete cycle found (wrong pids, or not a fsync=1 run?)")
    print(f"cycles: {len(cycles)}, with two syncs and two data writes: {len(whole)}")
    same = sum(c["one_cpu"] for c in cycles)
    print(f"both Secondaries on one CPU when the write arrived: {same} of {len(cycles)}")

    def med(key, i):
        vals = [c[key][i] for c in whole if len(c[key]) > i]
        return f"{st.median(vals):.0f}" if vals else "-"

    for key, what in (("enter", "fdatasync entered"), ("write", "data write issued"),
                      ("flush", "cache flush issued"), ("exit", "fdatasync returned")):
        print(f"{what:20} 1st {med(key, 0):>5}  2nd {med(key, 1):>5}  µs")
    gaps = [b["t0"] - a["t0"] for a, b in zip(cycles, cycles[1:])]
    print(f"{'cycle':20} {st.median(gaps):.0f} µs")


if __name__ == "__main__":
    main()
