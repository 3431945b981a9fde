#!/usr/bin/env python3
"""A thousand resources on one pair of nodes: start, connect, sit idle (issue 16's "Done when").

Two `tandem node` daemons, alpha and beta, each with RESOURCES resources of one SIZE_MB volume
(protocol C, internal metadata, new sparse backing files), all on one replication address per
node (resources share it; each connection is routed by the resource its handshake names).
Alpha serves metrics. Measured:

  start    from launching both daemons until every resource on alpha reports beta Connected
           and its disk UpToDate (`tandem status --json`, polled every 0.5 s)
  RSS      each daemon's VmRSS once connected (and after the idle period)
  idle     each daemon's CPU (utime + stime from /proc) over IDLE_S seconds of nothing, as a
           share of one core
  status   `tandem status` and `status --json`: bytes and time
  scrape   GET /metrics on alpha: bytes and time (client side), three times, and the loop's
           CPU for the build as the next scrape reports it (tandem_metrics_build_seconds)

  bench/scale.py [TANDEM_BIN]       (or TANDEM_BIN=...; default target/release/tandem)
Variables: RESOURCES (1000), SIZE_MB (1), IDLE_S (30), TANDEM_PORT (7990), METRICS_PORT
(9942), WORKDIR_PARENT (system temp dir). Prints a Markdown table; a benchmark, it never fails
on slow numbers. The open-file limit is raised for the daemons (each holds about four
descriptors a resource).
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESOURCES = int(os.environ.get("RESOURCES", "1000"))
SIZE_MB = int(os.environ.get("SIZE_MB", "1"))
IDLE_S = float(os.environ.get("IDLE_S", "30"))
PORT = int(os.environ.get("TANDEM_PORT", "7990"))
METRICS_PORT = int(os.environ.get("METRICS_PORT", "9942"))
NODES = [("alpha", "127.0.0.81"), ("beta", "127.0.0.82")]
HZ = os.sysconf("SC_CLK_TCK")


def say(msg):
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


def config(work, i):
    text = (
        f'[resource]\nname = "r{i}"\nprotocol = "C"\nshared-secret = "s3cret"\n\n'
        f'[[volume]]\nnumber = 0\nsize = "{SIZE_MB}M"\n'
    )
    for node_id, (name, ip) in enumerate(NODES):
        text += f'\n[[node]]\nname = "{name}"\nnode-id = {node_id}\naddress = "{ip}:{PORT}"\n'
        if name == "alpha" and i == 0:
            text += f'metrics = "{ip}:{METRICS_PORT}"\n'
        text += (
            f'  [[node.volume]]\n  number = 0\n  disk = "{work}/{name}/r{i}.img"\n'
            f'  nbd = ["unix:{work}/{name}/r{i}.sock"]\n'
        )
    return text


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def admin(tandem, work, name, *args):
    began = time.monotonic()
    out = subprocess.run(
        [tandem, *args, "--control", f"{work}/{name}/ctl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out, time.monotonic() - began


def all_connected(tandem, work):
    out, _ = admin(tandem, work, "alpha", "status", "--json")
    if out.returncode != 0:
        return 0
    n = 0
    for r in json.loads(out.stdout):
        disks = [v["disk"] for v in r["volumes"]]
        conns = [p["connection"] for p in r["peers"]]
        if conns == ["Connected"] and disks == ["UpToDate"]:
            n += 1
    return n


def main():
    tandem = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "TANDEM_BIN", os.path.join(REPO, "target", "release", "tandem")
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 6 * RESOURCES + 1000
    if hard < want:
        say(f"hard open-file limit {hard} < {want}: the daemons may run short")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    work = tempfile.mkdtemp(prefix="tandem-scale-", dir=os.environ.get("WORKDIR_PARENT"))
    procs = []
    try:
        for name, _ in NODES:
            os.makedirs(f"{work}/{name}/cfg")
        for i in range(RESOURCES):
            text = config(work, i)
            for name, _ in NODES:
                with open(f"{work}/{name}/cfg/r{i}.toml", "w") as f:
                    f.write(text)
        began = time.monotonic()
        for name, _ in NODES:
            log = open(f"{work}/{name}/node.log", "w")
            procs.append(
                subprocess.Popen(
                    [tandem, "node", "--name", name, "--config-dir", f"{work}/{name}/cfg",
                     "--control", f"{work}/{name}/ctl"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        n = 0
        while n < RESOURCES and time.monotonic() - began < 600:
            time.sleep(0.5)
            n = all_connected(tandem, work)
        start_s = time.monotonic() - began
        say(f"{n} of {RESOURCES} resources connected and UpToDate after {start_s:.1f} s")
        rss0 = [rss_mib(p.pid) for p in procs]
        time.sleep(2)
        cpu0 = [cpu_s(p.pid) for p in procs]
        time.sleep(IDLE_S)
        idle = [(cpu_s(p.pid) - c) / IDLE_S * 100 for p, c in zip(procs, cpu0)]
        rss1 = [rss_mib(p.pid) for p in procs]
        text, t_text = admin(tandem, work, "alpha", "status")
        js, t_json = admin(tandem, work, "alpha", "status", "--json")
        scrapes = []
        url = f"http://{NODES[0][1]}:{METRICS_PORT}/metrics"
        for _ in range(3):
            t = time.monotonic()
            body = urllib.request.urlopen(url, timeout=30).read()
            took = time.monotonic() - t
            built = next(
                (float(line.split()[1]) for line in body.decode().splitlines()
                 if line.startswith("tandem_metrics_build_seconds ")),
                0.0,
            )
            scrapes.append((len(body), took, built))
        rows = [
            ("resources connected and UpToDate", f"{n} of {RESOURCES}", ""),
            ("start until all connected", f"{start_s:.1f} s", ""),
            ("RSS once connected (MiB)", f"{rss0[0]:.0f}", f"{rss0[1]:.0f}"),
            (f"RSS after {IDLE_S:.0f} s idle (MiB)", f"{rss1[0]:.0f}", f"{rss1[1]:.0f}"),
            ("idle CPU (% of a core)", f"{idle[0]:.2f}", f"{idle[1]:.2f}"),
            ("`status`", f"{len(text.stdout)} bytes in {t_text * 1000:.0f} ms", ""),
            ("`status --json`", f"{len(js.stdout)} bytes in {t_json * 1000:.0f} ms", ""),
        ]
        for k, (size, took, built) in enumerate(scrapes):
            rows.append((
                f"scrape {k + 1} of /metrics",
                f"{size} bytes in {took * 1000:.0f} ms (previous build: {built * 1000:.1f} ms of the loop's CPU)",
                "",
            ))
        print(f"| {RESOURCES} resources, {SIZE_MB} MiB each | alpha | beta |")
        print("|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
