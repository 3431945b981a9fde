"""Shared by bench/failover.py, bench/rejoin.py and bench/secondary-away.py (imported, not run).

A three-node `tandem node` cluster on one machine: its config, a daemon wrapper, polling,
an optional network-namespace lab (one namespace per node, cabled to a bridge in a hub
namespace), and the machine facts for the reports.
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def config(nodes, addresses, port, home, secret, size_mb, net="", nbd_on_diskful=True):
    """The r0.toml every node gets: resource r0, protocol C, one volume of size_mb MiB.
    `nodes` is [(name, diskful)]; `net` is extra text after [resource] (e.g. a [net] table);
    every node exports NBD at home/name/nbd.sock, or only the diskless ones if
    not nbd_on_diskful (then the diskful ones get `nbd = []`)."""
    text = f'[resource]\nname = "r0"\nprotocol = "C"\nshared-secret = "{secret}"\n'
    text += net
    text += f'\n[[volume]]\nnumber = 0\nsize = "{size_mb}M"\n'
    for i, (name, diskful) in enumerate(nodes):
        disk = f"{home}/{name}/r0.img" if diskful else "none"
        nbd = f'["unix:{home}/{name}/nbd.sock"]' if nbd_on_diskful or not diskful else "[]"
        text += (
            f'\n[[node]]\nname = "{name}"\nnode-id = {i}\naddress = "{addresses[i]}:{port}"\n'
            f'  [[node.volume]]\n  number = 0\n  disk = "{disk}"\n  nbd = {nbd}\n'
        )
    return text


class Node:
    """One `tandem node` daemon in home/name (cfg/, ctl, nbd.sock, node.log, r0.img), in the
    network namespace `netns` if given. stop_timeout: how long a signalled daemon may take
    to exit before it gets SIGKILL."""

    def __init__(self, binary, home, name, netns=None, stop_timeout=20):
        self.binary, self.name, self.netns = binary, name, netns
        self.stop_timeout = stop_timeout
        self.dir = f"{home}/{name}"
        self.ctl = f"{self.dir}/ctl"
        self.sock = f"{self.dir}/nbd.sock"
        self.log = f"{self.dir}/node.log"
        self.disk = f"{self.dir}/r0.img"
        self.proc = None

    def configure(self, text):
        """Writes `text` as the node's cfg/r0.toml (the directories must not exist yet)."""
        os.makedirs(f"{self.dir}/cfg")
        with open(f"{self.dir}/cfg/r0.toml", "w") as f:
            f.write(text)

    def start(self):
        cmd = [self.binary, "node", "--name", self.name, "--config-dir", f"{self.dir}/cfg",
               "--control", self.ctl]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def kill(self):
        """SIGKILL, and wait for the process to be gone."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def signal(self, sig):
        """Sends `sig`; returns the exit status once the process is gone (SIGKILL after
        stop_timeout s)."""
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def stop(self):
        """SIGTERM if running; returns the exit status (None if it was never started)."""
        if self.proc and self.proc.poll() is None:
            return self.signal(signal.SIGTERM)
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc

    def status(self):
        """The first resource of `tandem status --json`, or None if the node does not answer."""
        try:
            r = subprocess.run([self.binary, "status", "--json", "--control", self.ctl],
                               capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)[0]
        except (json.JSONDecodeError, IndexError, KeyError):
            return None

    def lines(self):
        """The node's log so far, without colour codes, as lines."""
        try:
            with open(self.log, "rb") as f:
                return ANSI.sub("", f.read().decode(errors="replace")).splitlines()
        except OSError:
            return []

    def log_size(self):
        return os.path.getsize(self.log) if os.path.exists(self.log) else 0

    def log_since(self, offset, end=None):
        """The node's log from byte `offset` (to `end`), without colour codes."""
        with open(self.log, "rb") as f:
            f.seek(offset)
            data = f.read() if end is None else f.read(max(0, end - offset))
        return ANSI.sub("", data.decode(errors="replace"))


def wait(cond, timeout, what):
    """Polls cond() every 20 ms; returns time.monotonic() when it holds, raises after timeout s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"not {what} within {timeout:.0f} s")


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


class Lab:
    """`count` namespaces PREFIX-TAG-I, cabled (hub-side veths PREFIXTAGpI) to a bridge in a
    hub namespace PREFIX-TAG-hub; node I has address SUBNET.(TAG % 250).(I + 1)/24 on eth0."""

    def __init__(self, tag, prefix, subnet, count):
        self.hub = f"{prefix}-{tag}-hub"
        self.ns = [f"{prefix}-{tag}-{i}" for i in range(count)]
        self.ports = [f"{prefix}{tag}p{i}" for i in range(count)]
        self.ips = [f"{subnet}.{tag % 250}.{i + 1}" for i in range(count)]
        try:
            sh("ip", "netns", "add", self.hub)
            sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.hub, "link", "set", "br0", "up")
            for ns, port, ip in zip(self.ns, self.ports, self.ips):
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                sh("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name",
                   "eth0", "netns", ns)
                sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
                sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def cable(self, i, up):
        sh("ip", "-n", self.hub, "link", "set", self.ports[i], "up" if up else "down")

    def close(self):
        for ns in self.ns + [self.hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def address_free(ip, port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---------------------------------------------------------------- the reports

def out(*cmd):
    """A command's stdout, stripped; "?" if it cannot be run."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine():
    """(CPU model, nproc, kernel release)."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        pass
    return cpu, out("nproc"), out("uname", "-r")


def busy_processes():
    """Other processes using a lot of CPU right now (e.g. a simulator soak)."""
    lines = subprocess.run(["ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu", "--no-headers"],
                           capture_output=True, text=True).stdout.splitlines()
    return [" ".join(l.split()[1:]) for l in lines[:6]
            if len(l.split()) > 3 and int(l.split()[0]) != os.getpid()
            and float(l.split()[1]) >= 20]


def tandem_binary(repo):
    """The binary to measure, absolute: the first argument, else $TANDEM_BIN, else
    <repo>/target/release/tandem."""
    return os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.environ.get("TANDEM_BIN", os.path.join(repo, "target/release/tandem")))


def built_from(repo, note_dirty=False):
    """What the binary was built from, for the report: $TANDEM_REV, else the repository's
    commit (with note_dirty: and whether the work tree has uncommitted changes)."""
    rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "?"
    dirty = note_dirty and subprocess.run(
        ["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True).stdout.strip()
    return os.environ.get("TANDEM_REV") or (
        f"repo {rev}{' (with uncommitted changes)' if dirty else ''} "
        "(the binary's own source is not checked: set TANDEM_REV)")


def user_env(names):
    """The variables among `names` the caller set, as shell words, for the report's command."""
    return " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in names if k in os.environ)


def run_line(binary, built, load0, load1, took, extra=""):
    """The report's sentence on the binary, the machine (then `extra`) and the load."""
    cpu, ncpu, kernel = machine()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    mtime = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(os.path.getmtime(binary)))
    return (f"`{binary}` ({version}; built {mtime} from {built}); {cpu}, {ncpu} CPUs, kernel "
            f"{kernel}{extra}. Load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the "
            f"end; the script took {took / 60:.1f} min.")


def busy_line(busy0, busy1):
    """The report's sentence on other busy processes at the start and at the end."""
    return ("Other busy processes at the start: " + ("; ".join(f"`{b}`" for b in busy0) or "none")
            + ". At the end: " + ("; ".join(f"`{b}`" for b in busy1) or "none") + ".")


def write_report(results_dir, name, started, text):
    """Writes `text` to results_dir/NAME-YYYYMMDD-HHMMSS.md (local time of `started`);
    returns the path."""
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, time.strftime(f"{name}-%Y%m%d-%H%M%S.md",
                                                    time.localtime(started)))
    with open(path, "w") as f:
        f.write(text)
    return path
