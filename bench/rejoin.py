#!/usr/bin/env python3
"""How fast peers find each other again, for one or more tandem binaries side by side.

Two scenarios, each TRIES times per binary, binaries interleaved per try:

  restart  alpha, beta (diskful) and gamma (diskless) on 127.0.0.X loopback addresses;
           beta is stopped (SIGTERM), stays down AWAY seconds, is started again; measured:
           from beta's control socket answering to every node seeing every peer Connected.
  cable    the same three nodes, each in its own network namespace cabled to a bridge;
           beta's cable is pulled (its hub-side veth goes down) for AWAY seconds, then
           plugged back in; measured: from the heal to every node seeing every peer
           Connected. Needs root and iproute2; skipped otherwise.

Default reconnect settings (connect-interval 1 s, max-connect-interval 10 s), a 64 MiB
volume. Prints the median, min and max per binary and scenario, and the ratio.

  bench/rejoin.py NEW_BIN [OLD_BIN ...]     (default: target/release/tandem)
  TRIES=10 AWAY=12 SCENARIOS="restart cable" bench/rejoin.py target/release/tandem /tmp/old/tandem
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as shared  # noqa: E402 - bench/lab.py, next to this script
from lab import Node, wait  # noqa: E402

TRIES = int(os.environ.get("TRIES", "10"))
AWAY = float(os.environ.get("AWAY", "12"))
SCENARIOS = os.environ.get("SCENARIOS", "restart cable").split()
NODES = [("alpha", True), ("beta", True), ("gamma", False)]
PORT = 7790


def config(addresses, home):
    return shared.config(NODES, addresses, PORT, home, "bench", 64)


def all_connected(nodes):
    for n in nodes:
        st = n.status()
        if not st:
            return False
        for p in st["peers"]:
            if p["connection"] != "Connected":
                return False
    return True


def make_lab(tag):
    """One namespace per node, cabled to a bridge in a hub namespace."""
    return shared.Lab(tag, "tbr", "10.251", len(NODES))


def cluster(binary, scenario, tag):
    home = tempfile.mkdtemp(prefix=f"tandem-rejoin-{scenario}-")
    lab = make_lab(tag) if scenario == "cable" else None
    addresses = lab.ips if lab else [f"127.0.0.{200 + i}" for i in range(len(NODES))]
    text = config(addresses, home)
    nodes = []
    for i, (name, _) in enumerate(NODES):
        nodes.append(Node(binary, home, name, lab.ns[i] if lab else None))
        nodes[-1].configure(text)
    for n in nodes:
        n.start()
    wait(lambda: all_connected(nodes), 30, "connected at start")
    return home, lab, nodes


def one_try(binary, scenario, tag):
    home, lab, nodes = cluster(binary, scenario, tag)
    beta = nodes[1]
    try:
        if scenario == "restart":
            beta.stop()
            time.sleep(AWAY)
            beta.start()
            t0 = wait(lambda: beta.status() is not None, 30, "answering")
        else:
            lab.cable(1, False)
            time.sleep(AWAY)
            lab.cable(1, True)
            t0 = time.monotonic()
        return wait(lambda: all_connected(nodes), 60, "connected again") - t0
    finally:
        for n in nodes:
            n.stop()
        if lab:
            lab.close()
        shutil.rmtree(home, ignore_errors=True)


def main():
    bins = sys.argv[1:] or ["target/release/tandem"]
    bins = [os.path.abspath(b) for b in bins]
    scenarios = [s for s in SCENARIOS if s != "cable" or (os.geteuid() == 0 and shutil.which("ip"))]
    for s in SCENARIOS:
        if s not in scenarios:
            print(f"skipping {s}: needs root and iproute2", file=sys.stderr)
    results = {(b, s): [] for b in bins for s in scenarios}
    tag = os.getpid() % 200
    for s in scenarios:
        for t in range(TRIES):
            for b in bins:
                tag += 1
                dt = one_try(b, s, tag)
                results[(b, s)].append(dt)
                print(f"{s} try {t + 1}/{TRIES} {b}: {dt:.2f} s", file=sys.stderr, flush=True)
    print(f"\n{TRIES} tries each, away {AWAY:.0f} s, default connect-interval 1 s / max 10 s")
    print(f"{'scenario':<8} {'binary':<50} {'median':>8} {'min':>7} {'max':>7}")
    for s in scenarios:
        base = None
        for b in bins:
            v = results[(b, s)]
            med = statistics.median(v)
            base = base or med
            print(f"{s:<8} {b:<50} {med:>7.2f}s {min(v):>6.2f}s {max(v):>6.2f}s"
                  + ("" if med == base else f"   ({med / base:.1f}x the first)"))


if __name__ == "__main__":
    main()
