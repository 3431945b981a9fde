#!/usr/bin/env python3
"""Failover time: from the death of the Primary to the first completed write through a new one.

Issue 15 item 3: "Measure the failover time: from kill -9 of the Primary to the first completed
write through the new one (target: <= ping-timeout + 0.5 s with defaults)", i.e. 1.0 s with the
default ping-timeout of 500 ms.

Three `tandem node` daemons: alpha and beta (diskful, sparse backing files, internal metadata)
and gamma (diskless), protocol C, a 64 MiB volume, default [net] settings and the default
quorum (majority: alpha and beta vote, gamma breaks the tie). Every try starts a FRESH cluster
(new directories, new backing files, all three in sync) and tears it down afterwards, so no
try inherits a resync or a returning node from the one before. Scenarios:

  diskless  gamma is Primary (an NBD client attached to gamma writes 4 KiB blocks in a loop,
            queue depth 1); after WARMUP s gamma gets kill -9; at once a client attaches to
            alpha and writes one 4 KiB block, attaching again after every refusal (EPERM:
            alpha still sees a Primary, or the promotion was refused; EIO) until one write
            completes.
  diskful   alpha is Primary (client on alpha); kill -9 alpha; the new Primary is beta, the
            surviving replica: beta (1 of 2 voters) is quorate with gamma as tiebreaker, and
            as a diskful Primary it writes locally and to nobody else.
  diskful-gamma  the same kill of alpha, but the new Primary is gamma (diskless): its writes
            go over the network to beta, the only up-to-date replica left.
  cut       alpha is Primary, each node in its own network namespace cabled to a bridge (as
            bench/rejoin.py's cable scenario); alpha's cable is pulled (hub-side veth down)
            while its client writes; alpha is not reset and keeps running. The survivors
            only learn of it from unanswered pings (ping-interval + ping-timeout); the new
            Primary is beta. Needs root and iproute2 (skipped otherwise). Also measured: when
            alpha, without quorum now, stopped acknowledging writes (its client's first
            error, and its last acknowledged write).

Measured per try (the clock starts just before the SIGKILL / the `ip link set down`):
  write    the first 4 KiB write completed through the new Primary (its reply received)
  primary  the new node's `tandem status --json` first says role Primary (polled in a
           thread alongside the attach loop, each `tandem status` call a few ms and 10 ms
           apart: an upper bound by one poll; the client whose write completed stays
           attached until the poll saw Primary, as an application would, so the role is not
           given back in between)
  attempts attaches until the write completed, and the errors met (EPERM, EIO, ...)

Correctness, after every try: the whole volume is read back through the new Primary with the
same client; every block the old Primary acknowledged must hold its last acknowledged data
(a block whose later write was in flight at the kill may hold that one instead), blocks never
written must read as zeroes, and the probe block must hold the probe write. Any mismatch is
printed loudly, listed in the report, and makes the exit status 1.

The NBD client is written here (fixed newstyle handshake, NBD_OPT_GO for export "r0", simple
replies, NBD_CMD_WRITE / READ / DISC); no package needed.

  bench/failover.py [TANDEM_BIN]               (or TANDEM_BIN=...; default target/release/tandem)
  TRIES=3 SCENARIOS="diskless diskful" bench/failover.py /tmp/tgt/release/tandem

Variables: TRIES (10), SCENARIOS ("diskless diskful diskful-gamma cut"), WARMUP (1 s of writes
before the kill), TANDEM_PORT (7892), TANDEM_IPS ("127.0.0.91 127.0.0.92 127.0.0.93"),
TANDEM_REV (what the binary was built from, for the report), RESULTS_DIR (bench/results),
KEEP_WORKDIR (0; 1 keeps each try's directory with the daemons' logs), WORKDIR_PARENT (system
temp dir). Writes bench/results/failover-YYYYMMDD-HHMMSS.md.
"""

import os
import re
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as shared  # noqa: E402 - bench/lab.py, next to this script
from lab import Node, address_free, busy_processes, wait  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIES = int(os.environ.get("TRIES", "10"))
SCENARIOS = os.environ.get("SCENARIOS", "diskless diskful diskful-gamma cut").split()
WARMUP = float(os.environ.get("WARMUP", "1"))
PORT = int(os.environ.get("TANDEM_PORT", "7892"))
IPS = os.environ.get("TANDEM_IPS", "127.0.0.91 127.0.0.92 127.0.0.93").split()
RESULTS_DIR = os.environ.get("RESULTS_DIR", os.path.join(REPO, "bench", "results"))
KEEP = os.environ.get("KEEP_WORKDIR", "0") == "1"
WORKDIR_PARENT = os.environ.get("WORKDIR_PARENT") or None
NODES = [("alpha", True), ("beta", True), ("gamma", False)]
SIZE_MB = 64
SIZE = SIZE_MB << 20
BLOCK = 4096
PROBE_OFF = SIZE - BLOCK          # the failover probe's block; the writer never touches it
WRITER_BLOCKS = SIZE // BLOCK - 1
PING_TIMEOUT = 0.5                # the default [net] ping-timeout
PING_INTERVAL = 1.0               # the default [net] ping-interval
TARGET = PING_TIMEOUT + 0.5
GIVE_UP = 30.0                    # a failover not done by then fails the try

# scenario -> (old Primary, new Primary, how the old one goes)
PLAN = {
    "diskless": ("gamma", "alpha", "kill"),
    "diskful": ("alpha", "beta", "kill"),
    "diskful-gamma": ("alpha", "gamma", "kill"),
    "cut": ("alpha", "beta", "cut"),
}


def say(msg):
    print(f"[failover] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- a minimal NBD client

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
REQ_MAGIC = 0x25609513
SIMPLE_REPLY = 0x67446698
OPT_GO = 7
REP_ACK, REP_INFO = 1, 3
CMD_READ, CMD_WRITE, CMD_DISC = 0, 1, 2
ERRNO = {1: "EPERM", 5: "EIO", 12: "ENOMEM", 22: "EINVAL", 28: "ENOSPC", 108: "ESHUTDOWN"}


class NbdError(Exception):
    """The server answered a request with an error (errno in .errno)."""

    def __init__(self, errno, what):
        super().__init__(f"{what}: {ERRNO.get(errno, errno)}")
        self.errno = errno


class Nbd:
    """Fixed newstyle, NBD_OPT_GO, simple replies, one request at a time."""

    def __init__(self, path, export="r0", timeout=30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            self._handshake(export)
        except BaseException:
            self.sock.close()
            raise
        self.cookie = 0

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def _handshake(self, export):
        magic, opt, flags = struct.unpack(">QQH", self._recv(18))
        if magic != NBDMAGIC or opt != IHAVEOPT or not flags & 1:
            raise ConnectionError("not a fixed newstyle NBD server")
        no_zeroes = flags & 2
        self.sock.sendall(struct.pack(">I", 1 | no_zeroes))
        name = export.encode()
        data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
        self.sock.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
        self.size = None
        while True:
            magic, opt, rtype, length = struct.unpack(">QIII", self._recv(20))
            payload = self._recv(length)
            if magic != REPLY_MAGIC or opt != OPT_GO:
                raise ConnectionError("bad option reply")
            if rtype == REP_ACK:
                break
            if rtype == REP_INFO and len(payload) >= 12 and struct.unpack(">H", payload[:2])[0] == 0:
                self.size, self.tflags = struct.unpack(">QH", payload[2:12])
            elif rtype & 0x80000000:
                raise ConnectionError(f"NBD_OPT_GO refused ({rtype:#x}): {payload[4:]!r}")

    def _request(self, cmd, offset, length, data=b""):
        self.cookie += 1
        self.sock.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, cmd, self.cookie, offset, length)
                          + data)
        magic, err, cookie = struct.unpack(">IIQ", self._recv(16))
        if magic != SIMPLE_REPLY or cookie != self.cookie:
            raise ConnectionError("bad reply")
        if err:
            raise NbdError(err, f"{'write' if cmd == CMD_WRITE else 'read'} at {offset}")
        return self._recv(length) if cmd == CMD_READ else None

    def write(self, offset, data):
        self._request(CMD_WRITE, offset, len(data), data)

    def read(self, offset, length):
        return self._request(CMD_READ, offset, length)

    def close(self):
        try:
            self.sock.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_DISC, 0, 0, 0))
        except OSError:
            pass
        self.sock.close()


def block_data(tag, seq):
    """A 4 KiB block no other write of the run has: tag and sequence number repeated."""
    word = f"{tag}:{seq:010d};".encode()
    return (word * (BLOCK // len(word) + 1))[:BLOCK]


class Writer(threading.Thread):
    """The application on the old Primary: 4 KiB writes at QD1 over successive blocks, until
    the first error. Remembers what was acknowledged (offset -> data) and what is in flight."""

    def __init__(self, path, tag):
        super().__init__(daemon=True)
        self.path, self.tag = path, tag
        self.acked = {}
        self.inflight = None          # (offset, data) of the write without a reply
        self.count = 0
        self.last_ack = None          # time.monotonic() of the last acknowledged write
        self.error = None
        self.error_at = None
        self.stop_flag = False

    def run(self):
        try:
            c = Nbd(self.path)
        except (OSError, ConnectionError) as e:
            self.error, self.error_at = f"attach: {e}", time.monotonic()
            return
        seq = 0
        try:
            while not self.stop_flag:
                off = (seq % WRITER_BLOCKS) * BLOCK
                data = block_data(self.tag, seq)
                self.inflight = (off, data)
                c.write(off, data)
                self.last_ack = time.monotonic()
                self.acked[off] = data
                self.inflight = None
                self.count += 1
                seq += 1
            c.close()
        except (OSError, ConnectionError, NbdError) as e:
            self.error, self.error_at = str(e) or type(e).__name__, time.monotonic()
            try:
                c.sock.close()
            except OSError:
                pass


# ---------------------------------------------------------------- the cluster

def config(addresses, home):
    return shared.config(NODES, addresses, PORT, home, "failover", SIZE_MB)


def in_sync(nodes):
    for n in nodes:
        st = n.status()
        if not st:
            return False
        for v in st["volumes"]:
            want = "Diskless" if n.name == "gamma" else "UpToDate"
            if v["disk"] != want or (v.get("resync_remaining_kib") or 0):
                return False
        for p in st["peers"]:
            want = "Diskless" if p["name"] == "gamma" else "UpToDate"
            if p["connection"] != "Connected" or any(
                    pv["peer_disk"] != want or pv["out_of_sync_kib"] for pv in p["volumes"]):
                return False
    return True


def make_lab(tag):
    """One namespace per node, cabled to a bridge in a hub namespace (as bench/rejoin.py)."""
    return shared.Lab(tag, "tfo", "10.252", len(NODES))


# ---------------------------------------------------------------- one try

def failover_probe(node, t0, tag):
    """Attaches to `node` and writes the probe block, attaching again after each failure,
    until a write completes. Returns (seconds from t0, attempts, errors, probe data, the
    client, still attached: the application stays, and with it the Primary role)."""
    errors = {}
    attempts = 0
    deadline = t0 + GIVE_UP
    while time.monotonic() < deadline:
        attempts += 1
        data = block_data(tag + "-probe", attempts)
        c = None
        try:
            c = Nbd(node.sock, timeout=GIVE_UP)
            c.write(PROBE_OFF, data)
            return time.monotonic() - t0, attempts, errors, data, c
        except NbdError as e:
            key = ERRNO.get(e.errno, str(e.errno))
        except (OSError, ConnectionError) as e:
            key = type(e).__name__
        errors[key] = errors.get(key, 0) + 1
        if c:
            c.close()
        time.sleep(0.002)
    raise RuntimeError(f"no write completed through {node.name} within {GIVE_UP:.0f} s "
                       f"({attempts} attempts: {errors})")


class RolePoller(threading.Thread):
    """Polls a node's status until it says Primary; .at is that moment (monotonic)."""

    def __init__(self, node):
        super().__init__(daemon=True)
        self.node, self.at, self.stop_flag, self.polls = node, None, False, 0

    def run(self):
        while not self.stop_flag:
            st = self.node.status()
            self.polls += 1
            if st and st.get("role") == "Primary":
                self.at = time.monotonic()
                return
            time.sleep(0.01)


def verify(node, writer, probe):
    """Reads the volume through `node`; returns a list of problems (empty: all good)."""
    problems = []
    c = Nbd(node.sock)
    try:
        chunk = 1 << 20
        inflight = writer.inflight
        for base in range(0, SIZE, chunk):
            data = c.read(base, chunk)
            for off in range(base, base + chunk, BLOCK):
                got = data[off - base:off - base + BLOCK]
                if off == PROBE_OFF:
                    if got != probe:
                        problems.append(f"probe block at {off}: not the completed probe write "
                                        f"({got[:24]!r})")
                    continue
                want = writer.acked.get(off, bytes(BLOCK))
                ok = got == want or (inflight is not None and inflight[0] == off
                                     and got == inflight[1])
                if not ok:
                    what = "acknowledged block" if off in writer.acked else "never written block"
                    problems.append(f"{what} at {off}: holds {got[:24]!r}, expected "
                                    f"{want[:24]!r}")
    finally:
        c.close()
    return problems


def one_try(binary, scenario, t, tag):
    old_name, new_name, how = PLAN[scenario]
    home = tempfile.mkdtemp(prefix=f"tandem-failover-{scenario}-", dir=WORKDIR_PARENT)
    lab = make_lab(tag) if how == "cut" else None
    addresses = lab.ips if lab else IPS
    text = config(addresses, home)
    nodes = {}
    for i, (name, _) in enumerate(NODES):
        nodes[name] = Node(binary, home, name, lab.ns[i] if lab else None)
        nodes[name].configure(text)
    writer = None
    r = {"scenario": scenario, "try": t, "old": old_name, "new": new_name, "problems": []}
    try:
        for n in nodes.values():
            n.start()
        wait(lambda: in_sync(nodes.values()), 60, "in sync at start")
        old, new = nodes[old_name], nodes[new_name]
        wtag = f"{scenario}{t}"
        writer = Writer(old.sock, wtag)
        writer.start()
        wait(lambda: writer.count > 0 or writer.error, 10, "writing")
        if writer.error:
            raise RuntimeError(f"the writer on {old_name} failed at once: {writer.error}")
        wait(lambda: (old.status() or {}).get("role") == "Primary", 10, f"{old_name} Primary")
        time.sleep(WARMUP)
        if writer.error:
            raise RuntimeError(f"the writer on {old_name} failed before the fault: {writer.error}")
        r["writes_before"] = writer.count
        r["rate"] = writer.count / WARMUP
        poller = RolePoller(new)
        t0 = time.monotonic()
        if how == "kill":
            old.kill()
        else:
            lab.cable(list(nodes).index(old_name), False)
        r["fault_s"] = time.monotonic() - t0
        poller.start()
        r["write_s"], r["attempts"], r["errors"], probe, app = failover_probe(new, t0, wtag)
        poller.join(5)
        poller.stop_flag = True
        app.close()
        r["primary_s"] = None if poller.at is None else poller.at - t0
        r["polls"] = poller.polls
        if how == "cut":
            # the isolated old Primary: its client's writes must fail (no quorum)
            wait(lambda: writer.error is not None, 20, f"{old_name}'s writes failing")
        else:
            writer.join(10)
        writer.stop_flag = True
        writer.join(10)
        r["writer_error"] = writer.error
        r["writer_error_s"] = None if writer.error_at is None else writer.error_at - t0
        r["last_ack_s"] = None if writer.last_ack is None else writer.last_ack - t0
        r["acked"] = len(writer.acked)
        r["writes_total"] = writer.count
        r["problems"] = verify(new, writer, probe)
        st = new.status() or {}
        r["new_role"] = st.get("role")
        r["new_quorum"] = [v.get("quorum") for v in st.get("volumes", [])]
        r["log"] = [f"{n.name}: {x}" for n in nodes.values() for x in n.lines()
                    if re.search(r"WARN|ERROR|promot|Primary|quorum", x)][-40:]
        return r
    finally:
        if writer:
            writer.stop_flag = True
        for n in nodes.values():
            n.stop()
        if lab:
            lab.close()
        if KEEP:
            say(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------- report

def ms(x):
    return "–" if x is None else f"{x * 1000:.0f}"


def try_row(r):
    errs = ", ".join(f"{k}×{v}" for k, v in sorted(r["errors"].items())) or "none"
    extra = ""
    if r["scenario"] == "cut":
        extra = f" | {ms(r['last_ack_s'])} | {ms(r['writer_error_s'])} ({r['writer_error']})"
    return (f"| {r['scenario']} | {r['try']} | {ms(r['write_s'])} | {ms(r['primary_s'])} | "
            f"{r['attempts']} | {errs} | {r['writes_before']} ({r['rate']:.0f}/s) | "
            f"{'OK' if not r['problems'] else '**' + str(len(r['problems'])) + ' MISMATCHES**'}"
            f"{extra} |")


def summary(scenario, rs):
    target = TARGET if scenario != "cut" else PING_INTERVAL + PING_TIMEOUT + 0.5
    w = [r["write_s"] for r in rs]
    p = [r["primary_s"] for r in rs if r["primary_s"] is not None]
    met = sum(1 for x in w if x <= target)
    med = statistics.median(w)
    pp = f"{statistics.median(p) * 1000:.0f} ({min(p) * 1000:.0f}–{max(p) * 1000:.0f})" if p else "–"
    bad = sum(1 for r in rs if r["problems"])
    note = "target" if scenario != "cut" else "reference (not the issue's target)"
    return (f"| {scenario} | {PLAN[scenario][0]} → {PLAN[scenario][1]} | {len(rs)} | "
            f"**{med * 1000:.0f}** | {min(w) * 1000:.0f} | {max(w) * 1000:.0f} | {pp} | "
            f"{target:.1f} s {note}: median {'met' if med <= target else 'NOT met'}, "
            f"{met}/{len(rs)} tries | {bad} |")


def main():
    binary = shared.tandem_binary(REPO)
    if not os.access(binary, os.X_OK):
        sys.exit(f"no tandem binary at {binary} (build it: cargo build --release -p tandem-cli)")
    for s in SCENARIOS:
        if s not in PLAN:
            sys.exit(f"unknown scenario {s!r} (known: {' '.join(PLAN)})")
    scenarios = [s for s in SCENARIOS
                 if PLAN[s][2] != "cut" or (os.geteuid() == 0 and shutil.which("ip"))]
    for s in SCENARIOS:
        if s not in scenarios:
            say(f"skipping {s}: needs root and iproute2")
    if any(PLAN[s][2] == "kill" for s in scenarios):
        busy = [ip for ip in IPS if not address_free(ip, PORT)]
        if busy:
            sys.exit(f"{PORT} is in use on {busy}: set TANDEM_IPS / TANDEM_PORT")
    started = time.time()
    load0 = os.getloadavg()
    busy0 = busy_processes()
    results, failures = [], []
    tag = os.getpid() % 200
    for t in range(1, TRIES + 1):
        for s in scenarios:
            tag += 1
            try:
                r = one_try(binary, s, t, tag)
            except Exception as e:  # noqa: BLE001 - a failed try is reported, the rest go on
                failures.append(f"{s} try {t}: {e}")
                say(f"{s} try {t}/{TRIES} FAILED: {e}")
                continue
            results.append(r)
            errs = ", ".join(f"{k}×{v}" for k, v in sorted(r["errors"].items())) or "no errors"
            say(f"{s} try {t}/{TRIES}: first write {ms(r['write_s'])} ms, Primary at "
                f"{ms(r['primary_s'])} ms, {r['attempts']} attach(es) ({errs}); "
                f"{r['acked']} blocks acknowledged before"
                + (f"; old Primary's last ack {ms(r['last_ack_s'])} ms, first error "
                   f"{ms(r['writer_error_s'])} ms ({r['writer_error']})" if s == "cut" else "")
                + ("; read back OK" if not r["problems"] else
                   f"; !!! {len(r['problems'])} MISMATCHES !!!"))
            for p in r["problems"][:10]:
                say(f"!!! MISMATCH {s} try {t}: {p}")
    took = time.time() - started
    load1 = os.getloadavg()
    busy1 = busy_processes()

    built = shared.built_from(REPO)
    env = shared.user_env(("TRIES", "SCENARIOS", "WARMUP", "TANDEM_PORT", "TANDEM_IPS",
                           "KEEP_WORKDIR", "TANDEM_REV"))
    command = f"{env + ' ' if env else ''}bench/failover.py {binary}"
    head = ["| scenario | try | first write ms | Primary ms | attaches | errors before | "
            "writes before the fault | read back |"
            + (" old Primary's last ack ms | its first error ms |" if "cut" in scenarios else ""),
            "|---|---:|---:|---:|---:|---|---:|---|" + ("---:|---|" if "cut" in scenarios else "")]
    shead = ["| scenario | old → new Primary | tries | first write median ms | min | max | "
             "Primary ms median (min–max) | target | tries with mismatches |",
             "|---|---|---:|---:|---:|---:|---|---|---:|"]
    srows = [summary(s, [r for r in results if r["scenario"] == s]) for s in scenarios
             if any(r["scenario"] == s for r in results)]
    lines = [
        f"# Failover time — {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))}",
        "",
        f"Command (cwd `{REPO}`): `{command}`",
        "",
        shared.run_line(binary, built, load0, load1, took),
        "",
        shared.busy_line(busy0, busy1),
        "",
        f"Every try: a fresh cluster (alpha, beta diskful, gamma diskless; protocol C; default "
        f"[net] and quorum = majority; a {SIZE_MB} MiB volume; {IPS[0]}–"
        f"{IPS[-1].rsplit('.', 1)[1]}:{PORT}, or for `cut` one network namespace per node on a "
        f"bridge), in sync; a client on the old Primary writes 4 KiB blocks at QD1 for "
        f"{WARMUP:g} s; then the fault (kill -9, or for `cut` the old Primary's cable pulled); "
        f"at once a client attaches to the new node and writes one 4 KiB block, attaching "
        f"again after every error, until a write completes. Times from just before the "
        f"SIGKILL (or `ip link set down`): **first write** = that write's reply received, "
        f"**Primary** = the new node's `tandem status --json` first says Primary (polled every "
        f"~10 ms, each call a few ms: an upper bound by one poll; the probe's client stays "
        f"attached until then). Then the whole volume is read through the new Primary: every block the old "
        f"Primary acknowledged holds its last acknowledged data (or the write in flight at the "
        f"fault), every other block zeroes, the probe block the probe.",
        "",
        f"Target (issue 15): ≤ ping-timeout + 0.5 s = {TARGET:.1f} s with the defaults. `cut` "
        f"is not held to it: the survivors only detect a silent peer after ping-interval + "
        f"ping-timeout ({PING_INTERVAL + PING_TIMEOUT:.1f} s); it is shown against that + 0.5 s.",
        "",
        "## Summary",
        "",
        *shead, *srows,
        "",
        "## Per try",
        "",
        *head, *[try_row(r) for r in results],
        "",
    ]
    if failures:
        lines += ["## Failed tries", "", *[f"- {f}" for f in failures], ""]
    mism = [r for r in results if r["problems"]]
    if mism:
        lines += ["## MISMATCHES", ""]
        for r in mism:
            lines += [f"### {r['scenario']} try {r['try']}", "",
                      *[f"- {p}" for p in r["problems"][:50]], ""]
    lines += ["## Log lines per try (warnings, errors, promotions, quorum; last 40)", ""]
    for r in results:
        lines += [f"### {r['scenario']} try {r['try']}", "",
                  f"new Primary's role after the read-back client left {r['new_role']}, quorum {r['new_quorum']}; "
                  f"writer: {r['writes_total']} writes, stopped by `{r['writer_error']}` at "
                  f"{ms(r['writer_error_s'])} ms; {r['polls']} status polls.", "",
                  "```", *[l[:300] for l in r["log"]], "```", ""]
    out = shared.write_report(RESULTS_DIR, "failover", started, "\n".join(lines))
    print("\n".join(["Per try:", *head, *[try_row(r) for r in results], "",
                     "Summary (ms):", *shead, *srows]))
    if failures:
        print("\nFailed tries:\n" + "\n".join(failures))
    if mism:
        print(f"\n!!! {len(mism)} tries with MISMATCHES: see {out} !!!")
    say(f"took {took / 60:.1f} min; results written to {out}")
    return 1 if failures or mism else 0


if __name__ == "__main__":
    sys.exit(main())
