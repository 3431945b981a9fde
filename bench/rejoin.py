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

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRIES = int(os.environ.get("TRIES", "10"))
AWAY = float(os.environ.get("AWAY", "12"))
SCENARIOS = os.environ.get("SCENARIOS", "restart cable").split()
NODES = [("alpha", True), ("beta", True), ("gamma", False)]
PORT = 7790


def config(addresses, home):
    text = (
        '[resource]\nname = "r0"\nprotocol = "C"\nshared-secret = "bench"\n'
        '\n[[volume]]\nnumber = 0\nsize = "64M"\n'
    )
    for i, (name, diskful) in enumerate(NODES):
        disk = f"{home}/{name}/r0.img" if diskful else "none"
        text += (
            f'\n[[node]]\nname = "{name}"\nnode-id = {i}\naddress = "{addresses[i]}:{PORT}"\n'
            f'  [[node.volume]]\n  number = 0\n  disk = "{disk}"\n'
            f'  nbd = ["unix:{home}/{name}/nbd.sock"]\n'
        )
    return text


class Node:
    def __init__(self, binary, home, name, netns):
        self.binary, self.home, self.name, self.netns = binary, home, name, netns
        self.dir = f"{home}/{name}"
        self.ctl = f"{self.dir}/ctl"
        self.proc = None

    def start(self):
        cmd = [self.binary, "node", "--name", self.name, "--config-dir", f"{self.dir}/cfg",
               "--control", self.ctl]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        log = open(f"{self.dir}/node.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def status(self):
        r = subprocess.run([self.binary, "status", "--json", "--control", self.ctl],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            return None


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"not {what} within {timeout} s")


def all_connected(nodes):
    for n in nodes:
        st = n.status()
        if not st:
            return False
        for p in st[0]["peers"]:
            if p["connection"] != "Connected":
                return False
    return True


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


class Lab:
    """One namespace per node, cabled to a bridge in a hub namespace."""

    def __init__(self, tag):
        self.hub = f"tbr-{tag}-hub"
        self.ns = [f"tbr-{tag}-{i}" for i in range(len(NODES))]
        self.ports = [f"tbr{tag}p{i}" for i in range(len(NODES))]
        self.ips = [f"10.251.{tag % 250}.{i + 1}" for i in range(len(NODES))]
        sh("ip", "netns", "add", self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for ns, port, ip in zip(self.ns, self.ports, self.ips):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def cable(self, i, up):
        sh("ip", "-n", self.hub, "link", "set", self.ports[i], "up" if up else "down")

    def close(self):
        for ns in self.ns + [self.hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def cluster(binary, scenario, tag):
    home = tempfile.mkdtemp(prefix=f"tandem-rejoin-{scenario}-")
    lab = Lab(tag) if scenario == "cable" else None
    addresses = lab.ips if lab else [f"127.0.0.{200 + i}" for i in range(len(NODES))]
    text = config(addresses, home)
    nodes = []
    for i, (name, _) in enumerate(NODES):
        os.makedirs(f"{home}/{name}/cfg")
        with open(f"{home}/{name}/cfg/r0.toml", "w") as f:
            f.write(text)
        nodes.append(Node(binary, home, name, lab.ns[i] if lab else None))
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
