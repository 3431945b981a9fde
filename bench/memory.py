#!/usr/bin/env python3
"""What a node's memory and start time cost with a 1 TiB volume and two peers.

Issue 14's target: "the in-memory bitmaps cost at most DRBD's 32 MiB per TiB per peer; report
the RSS of a node with a 1 TiB sparse volume and two peers, and its start time (reading the
metadata back)".

The cluster of bench/secondary-away.py (its config and node helpers are reused): alpha and
beta diskful (sparse backing files, internal metadata, the default activity log), gamma
diskless, protocol C. For each volume size (SIZES_GB, default "1 1024": the small one is the
baseline that the per-TiB figure is taken against):

  create   start the three daemons on new backing files; time until all are Connected and
           UpToDate (creating the metadata: superblock, activity log, one bitmap slot per peer)
  idle     RSS of each daemon (VmRSS, and the peak VmHWM)
  written  gamma Primary, WRITE_S seconds of 4k random writes over the whole volume through
           gamma (fio, iodepth 16); RSS again (bitmaps touched all over)
  away     beta stopped cleanly, WRITE_S more seconds of writes: alpha and gamma mark what
           beta misses all over the volume; RSS again
  restart  every daemon stopped cleanly and started again; time until all are Connected and
           UpToDate (reading the metadata back: bitmaps, activity log), RSS again

Reported per size and node, and alpha's and gamma's growth per TiB against the baseline,
which is what the bitmaps cost (alpha keeps a bitmap for each of its two peers).

  bench/memory.py [TANDEM_BIN]       (or TANDEM_BIN=...; default target/release/tandem)
Variables: SIZES_GB ("1 1024"), WRITE_S (5), TANDEM_PORT (7890), TANDEM_IPS
("127.0.0.71 127.0.0.72 127.0.0.73"), RESULTS_DIR (bench/results), WORKDIR_PARENT (system
temp dir). The backing files are sparse: a 1 TiB volume needs a filesystem that allows 1 TiB
files, not 1 TiB of space.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("away", os.path.join(HERE, "secondary-away.py"))
away = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(away)

SIZES_GB = [int(s) for s in os.environ.get("SIZES_GB", "1 1024").split()]
WRITE_S = int(os.environ.get("WRITE_S", "5"))
RESULTS_DIR = os.environ.get("RESULTS_DIR", os.path.join(away.REPO, "bench", "results"))
WORKDIR_PARENT = os.environ.get("WORKDIR_PARENT") or None


def say(msg):
    print(f"[memory] {msg}", file=sys.stderr, flush=True)


def rss_kib(node):
    """(VmRSS, VmHWM) of the node's process, in KiB."""
    got = {}
    with open(f"/proc/{node.proc.pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(val.split()[0])
    return got["VmRSS"], got["VmHWM"]


def start_all(nodes, what):
    """Starts every node; seconds until all are Connected and UpToDate."""
    t0 = time.monotonic()
    for n in nodes:
        n.start()
    away.wait(lambda: away.in_sync(nodes), 600, what)
    return time.monotonic() - t0


def write(gamma, size, seconds, home, tag):
    r = subprocess.run(
        ["fio", f"--name={tag}", "--ioengine=nbd",
         f"--uri=nbd+unix:///?socket={gamma.dir}/nbd.sock", "--rw=randwrite", "--bs=4k",
         "--iodepth=16", f"--size={size}", "--time_based", f"--runtime={seconds}",
         "--norandommap", "--randrepeat=0", "--output-format=json",
         f"--output={home}/fio-{tag}.json"],
        capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode != 0:
        raise RuntimeError(f"fio {tag} failed: {r.stderr.strip()[-400:]}")


def one_size(binary, gb):
    away.SIZE_MB = gb * 1024
    home = tempfile.mkdtemp(prefix=f"tandem-memory-{gb}G-", dir=WORKDIR_PARENT)
    nodes = [away.Node(binary, home, name) for name, _ in away.NODES]
    alpha, beta, gamma = nodes
    row = {"gb": gb}
    try:
        text = away.config(home)
        for n in nodes:
            os.makedirs(f"{n.dir}/cfg")
            with open(f"{n.dir}/cfg/r0.toml", "w") as f:
                f.write(text)
        row["create_s"] = start_all(nodes, "connected and in sync at start")
        row["idle"] = {n.name: rss_kib(n) for n in nodes}
        subprocess.run([binary, "primary", "r0", "--control", gamma.ctl], check=True,
                       capture_output=True, timeout=30)
        size = gb << 30
        write(gamma, size, WRITE_S, home, "written")
        away.wait(lambda: away.in_sync(nodes), 600, "in sync after the writes")
        row["written"] = {n.name: rss_kib(n) for n in nodes}
        beta.stop()
        write(gamma, size, WRITE_S, home, "away")
        row["away"] = {n.name: rss_kib(n) for n in (alpha, gamma)}
        beta.start()
        away.wait(lambda: away.in_sync(nodes), 600, "in sync after beta's return")
        subprocess.run([binary, "secondary", "r0", "--control", gamma.ctl], check=True,
                       capture_output=True, timeout=30)
        for n in nodes:
            n.stop()
        row["restart_s"] = start_all(nodes, "connected and in sync after the restart")
        row["restarted"] = {n.name: rss_kib(n) for n in nodes}
        return row
    finally:
        for n in nodes:
            n.stop()
        shutil.rmtree(home, ignore_errors=True)


def mib(kib):
    return f"{kib / 1024:.1f}"


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "TANDEM_BIN", os.path.join(away.REPO, "target/release/tandem")))
    if not os.access(binary, os.X_OK):
        sys.exit(f"no tandem binary at {binary} (cargo build --release -p tandem-cli)")
    if not shutil.which("fio"):
        sys.exit("fio is needed (apt-get install fio)")
    busy = [ip for ip in away.IPS if not away.address_free(ip)]
    if busy:
        sys.exit(f"{', '.join(busy)}:{away.PORT} in use (set TANDEM_IPS / TANDEM_PORT)")
    rows = []
    for gb in SIZES_GB:
        say(f"{gb} GiB volume ...")
        r = one_size(binary, gb)
        rows.append(r)
        say(f"{gb} GiB: created and in sync in {r['create_s']:.2f} s, restarted in "
            f"{r['restart_s']:.2f} s; RSS MiB idle/written/away/restarted: " + ", ".join(
                f"{n} {mib(r['idle'][n][0])}/{mib(r['written'][n][0])}/"
                f"{mib(r['away'][n][0]) if n in r['away'] else '-'}/{mib(r['restarted'][n][0])}"
                for n in ("alpha", "beta", "gamma")))
    lines = [
        "# bench/memory.py", "",
        f"`{' '.join(f'{k}={os.environ[k]}' for k in ('SIZES_GB', 'WRITE_S') if k in os.environ)}"
        f" bench/memory.py {binary}` on {time.strftime('%Y-%m-%d %H:%M:%S')}"
        f" (load before: {os.getloadavg()[0]:.2f})", "",
        "| volume | node | create→in sync (s) | restart→in sync (s) | RSS idle (MiB) | "
        "after writes | with beta away | after restart | peak (VmHWM) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for n in ("alpha", "beta", "gamma"):
            aw = mib(r["away"][n][0]) if n in r["away"] else "-"
            peak = max(v[n][1] for k, v in r.items() if k in ("idle", "written", "away",
                                                              "restarted") and n in v)
            lines.append(f"| {r['gb']} GiB | {n} | {r['create_s']:.2f} | {r['restart_s']:.2f} | "
                         f"{mib(r['idle'][n][0])} | {mib(r['written'][n][0])} | {aw} | "
                         f"{mib(r['restarted'][n][0])} | {mib(peak)} |")
    if len(rows) >= 2:
        base, big = rows[0], rows[-1]
        tib = (big["gb"] - base["gb"]) / 1024
        lines += ["", f"Growth from {base['gb']} GiB to {big['gb']} GiB, per TiB "
                  "(peak RSS; alpha has two peers, so DRBD's bitmaps would be 64 MiB):", ""]
        for n in ("alpha", "beta", "gamma"):
            def peak(r):
                return max(v[n][1] for k, v in r.items()
                           if k in ("idle", "written", "away", "restarted") and n in v)
            lines.append(f"- {n}: {(peak(big) - peak(base)) / 1024 / tib:.1f} MiB per TiB")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, time.strftime("memory-%Y%m%d-%H%M%S.md"))
    with open(path, "w") as f:
        f.write(text)
    say(f"written to {path}")


if __name__ == "__main__":
    main()
