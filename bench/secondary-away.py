#!/usr/bin/env python3
"""A Secondary away for 1 s under 4k random writes: what its resync moves, and how long it takes.

Issue 14's target: "Restart of a Secondary after 1 s away under 4k random writes on a 1 GiB
volume: resync moves <= 2x the data written meanwhile and finishes in under 5 s".

Each try starts a fresh cluster: alpha and beta (diskful, sparse backing files with internal
metadata and the default activity log) and gamma (diskless, Primary), protocol C, on
127.0.0.71-73:7890, a SIZE_MB volume. fio writes 4k random writes at iodepth 8 through
gamma's NBD socket; after WARMUP s beta goes away, by one of two MODES:

  stop   SIGTERM (a clean stop)
  kill   SIGKILL (a crash: beta's activity log names where it may differ)

stays away AWAY s (from its exit to its new start) and is started again. Measured:

  written  bytes fio completed from the signal until beta sees both peers Connected again
           (fio's per-I/O log, --write_iops_log --log_offset=1 --log_unix_epoch=1: one line
           per completed write with its wall-clock millisecond and offset, counted over that
           window of time.time() stamps; the bound printed next to it is the status polling)
  pulled   KiB in beta's "resync from node N finished (K KiB pulled)" lines since its restart
  resync   from beta's control socket answering to beta's disk UpToDate

fio is stopped (SIGINT) once beta is UpToDate, the cluster settles, the daemons stop, and
the replicas are compared over the volume (cmp -n SIZE; internal metadata follows it).
Modes are interleaved try by try. Prints every try and a summary (median, min-max) per mode,
and writes bench/results/secondary-away-YYYYMMDD-HHMMSS.md.

  bench/secondary-away.py [TANDEM_BIN]          (or TANDEM_BIN=...; default target/release/tandem)
  TRIES=3 MODES=kill SIZE_MB=256 bench/secondary-away.py /tmp/tgt-bench/release/tandem

Variables: TRIES (5), MODES ("stop kill"), AWAY (1), WARMUP (3), SIZE_MB (1024), IODEPTH (8),
TANDEM_REV (what the binary was built from, for the report), TANDEM_PORT (7890), TANDEM_IPS
("127.0.0.71 127.0.0.72 127.0.0.73"), RESYNC_MIN_RATE (unset: the default; e.g. "0" for an
unpaced resync), RESULTS_DIR (bench/results), KEEP_WORKDIR (0; 1 keeps each try's directory
with logs, fio's log and the images), WORKDIR_PARENT (system temp dir).

A try in which fio gets I/O errors is marked EIO and left out of the summary's figures; the
exit status is 1 if a try failed, fio got I/O errors or the replicas differed.
"""

import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as shared  # noqa: E402 - bench/lab.py, next to this script
from lab import address_free, busy_processes, wait  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIES = int(os.environ.get("TRIES", "5"))
MODES = os.environ.get("MODES", "stop kill").split()
AWAY = float(os.environ.get("AWAY", "1"))
WARMUP = float(os.environ.get("WARMUP", "3"))
SIZE_MB = int(os.environ.get("SIZE_MB", "1024"))
SIZE = SIZE_MB << 20
IODEPTH = int(os.environ.get("IODEPTH", "8"))
PORT = int(os.environ.get("TANDEM_PORT", "7890"))
IPS = os.environ.get("TANDEM_IPS", "127.0.0.71 127.0.0.72 127.0.0.73").split()
RESULTS_DIR = os.environ.get("RESULTS_DIR", os.path.join(REPO, "bench", "results"))
KEEP = os.environ.get("KEEP_WORKDIR", "0") == "1"
WORKDIR_PARENT = os.environ.get("WORKDIR_PARENT") or None
RESYNC_MIN_RATE = os.environ.get("RESYNC_MIN_RATE")
NODES = [("alpha", True), ("beta", True), ("gamma", False)]
POLL = 0.01
SIGNALS = {"stop": signal.SIGTERM, "kill": signal.SIGKILL}
GEN = re.compile(r"^(\S+)Z .*generation \S+ -> (\S+) \(a replica missed a write\).*$", re.M)


def stamp(iso):
    """Seconds of a log line's UTC time stamp (2026-11-25T20:11:18.432338)."""
    d, t = iso.split("T")
    h, m, sec = t.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def say(msg):
    print(f"[secondary-away] {msg}", file=sys.stderr, flush=True)


def config(home):
    net = f'\n[net]\nresync-min-rate = "{RESYNC_MIN_RATE}"\n' if RESYNC_MIN_RATE is not None else ""
    return shared.config(NODES, IPS, PORT, home, "secondary-away", SIZE_MB, net=net,
                         nbd_on_diskful=False)


def peer(st, name):
    return next((p for p in st["peers"] if p["name"] == name), None)


def in_sync(nodes):
    """Every node sees every other Connected; alpha and beta UpToDate, nothing out of sync,
    in flight or unacknowledged."""
    for n in nodes:
        st = n.status()
        if not st or st["app_in_flight"] != 0:
            return False
        for v in st["volumes"]:
            want = "UpToDate" if n.name != "gamma" else "Diskless"
            if v["disk"] != want or v["writes_in_flight"] or (v.get("resync_remaining_kib") or 0):
                return False
        for o in nodes:
            if o is n:
                continue
            p = peer(st, o.name)
            if not p or p["connection"] != "Connected" or p["unacked"]:
                return False
            want = "UpToDate" if o.name != "gamma" else "Diskless"
            if not p["volumes"] or any(pv["peer_disk"] != want or pv["out_of_sync_kib"]
                                       for pv in p["volumes"]):
                return False
    return True


# --- fio's I/O log --------------------------------------------------------------------

def read_io_log(path):
    """[(completion_ms, bytes, offset)] of every write, from fio's per-I/O log
    (--write_iops_log without --log_avg_msec, --log_offset=1, --log_unix_epoch=1): one line
    per completed I/O, "time_ms, 1, dir, bs, offset, prio", the time in epoch ms."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split(",")
            if len(parts) >= 5 and parts[2].strip() == "1":
                out.append((int(parts[0]), int(parts[3]), int(parts[4])))
    return out


def written_between(ios, t0, t1):
    """(bytes, distinct 4 KiB blocks) of the writes fio completed in [t0, t1] (epoch s;
    fio stamps whole milliseconds, so a stamp t covers [t, t + 1 ms))."""
    a, b = t0 * 1000 - 1, t1 * 1000
    sel = [(n, o) for t, n, o in ios if a < t <= b]
    blocks = {o // 4096 + i for n, o in sel for i in range(max(1, n // 4096))}
    return sum(n for n, _ in sel), len(blocks)


# --- one try --------------------------------------------------------------------------

PULLED = re.compile(r"resync from node (\S+) finished \((\d+) KiB pulled\)")
AL_NAMES = re.compile(r"activity log names (\d+) extents \((\d+) MiB\)")
CRASH_PULL = re.compile(r"back from a crash; pulling the (\d+) KiB")
INTERESTING = re.compile(r"resync|activity log names|back from a crash|back from a clean|"
                         r"Outdated|UpToDate|Inconsistent|split|full|WARN|ERROR", re.I)


def first_diffs(a, b, limit=10):
    """Numbers of the first differing 4 KiB blocks over the volume, and their count."""
    diffs, count = [], 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for off in range(0, SIZE, 1 << 20):
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x == y:
                continue
            for i in range(0, max(len(x), len(y)), 4096):
                if x[i:i + 4096] != y[i:i + 4096]:
                    count += 1
                    if len(diffs) < limit:
                        diffs.append((off + i) // 4096)
    return diffs, count


def one_try(binary, mode, n_try):
    home = tempfile.mkdtemp(prefix=f"tandem-secondary-away-{mode}-", dir=WORKDIR_PARENT)
    nodes = [shared.Node(binary, home, name, stop_timeout=30) for name, _ in NODES]
    alpha, beta, gamma = nodes
    fio = None
    r = {"mode": mode, "try": n_try}
    try:
        text = config(home)
        for n in nodes:
            n.configure(text)
        for n in nodes:
            n.start()
        wait(lambda: in_sync(nodes), 60, "connected and in sync at start")
        subprocess.run([binary, "primary", "r0", "--control", gamma.ctl], check=True,
                       capture_output=True, timeout=30)
        fio_cmd = [
            "fio", "--name=away", "--ioengine=nbd",
            f"--uri=nbd+unix:///?socket={gamma.dir}/nbd.sock",
            "--rw=randwrite", "--bs=4k", f"--iodepth={IODEPTH}", f"--size={SIZE}",
            "--time_based", "--runtime=600", "--norandommap", "--randrepeat=0",
            f"--write_iops_log={home}/fio", "--log_offset=1", "--log_unix_epoch=1",
            "--output-format=json", f"--output={home}/fio.json",
        ]
        r["fio_cmd"] = fio_cmd
        with open(f"{home}/fio.out", "w") as out:
            # Its own session: SIGINT to the group stops it as Ctrl-C would.
            t_fio = time.time()
            fio = subprocess.Popen(fio_cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        time.sleep(WARMUP)
        if fio.poll() is not None:
            raise RuntimeError(f"fio exited early: {open(f'{home}/fio.out').read()}")

        # Away.
        beta_log_at = beta.log_size()
        alpha_log_at = alpha.log_size()
        gamma_log_at = gamma.log_size()
        t_signal = time.time()
        r["exit_status"] = beta.signal(SIGNALS[mode])
        t_exit = time.time()
        # What gamma and alpha marked for beta, just before it comes back.
        time.sleep(max(0.0, t_exit + AWAY - 0.08 - time.time()))
        for who in (gamma, alpha):
            st = who.status()
            p = peer(st, "beta") if st else None
            r[f"oos_{who.name}_kib"] = (sum(v["out_of_sync_kib"] for v in p["volumes"])
                                        if p else None)
        time.sleep(max(0.0, t_exit + AWAY - time.time()))
        restart_log_at = beta.log_size()
        t_start = time.time()
        beta.start()

        # Back: poll beta until UpToDate.
        t_answer = t_conn = t_conn_lo = t_up = None
        prev_start = t_start
        max_done = 0
        deadline = time.time() + 600
        while t_up is None:
            if time.time() > deadline:
                raise RuntimeError("beta not UpToDate within 600 s of its restart")
            if beta.proc.poll() is not None:
                raise RuntimeError(f"beta exited ({beta.proc.returncode}) after its restart")
            c0 = time.time()
            st = beta.status()
            c1 = time.time()
            if st is not None:
                if t_answer is None:
                    t_answer = c1
                if t_conn is None and len(st["peers"]) == len(NODES) - 1 and all(
                        p["connection"] == "Connected" for p in st["peers"]):
                    t_conn, t_conn_lo = c1, prev_start
                for v in st["volumes"]:
                    if v.get("resync"):
                        max_done = max(max_done, v["resync"]["done_kib"])
                if t_conn is not None and all(v["disk"] == "UpToDate" for v in st["volumes"]):
                    t_up = c1
            prev_start = c0
            time.sleep(POLL)
        t_sigint = time.time()
        r["fio_early_exit"] = fio.poll()  # not None: fio ended by itself (an I/O error)
        if r["fio_early_exit"] is None:
            try:
                os.killpg(fio.pid, signal.SIGINT)
                fio.wait(60)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(fio.pid, signal.SIGKILL)
        fio.wait()
        fio = None
        with open(f"{home}/fio.out", errors="replace") as f:
            errs = [l.strip() for l in f if "error" in l]
        r["fio_errors"], r["fio_error_lines"] = len(errs), errs[:3]

        r.update(stop_s=t_exit - t_signal, away_s=t_start - t_exit,
                 answer_s=t_answer - t_start, connect_s=t_conn - t_answer,
                 resync_s=t_up - t_answer, status_done_kib=max_done)
        # Written while away: from the signal to beta seeing its peers Connected, taken as
        # the midpoint between the poll that saw it and the one before; the bound is the
        # earliest and the latest end possible.
        ios = read_io_log(f"{home}/fio_iops.1.log")
        t_mid = (t_conn_lo + t_conn) / 2
        r["written"], r["written_blocks"] = written_between(ios, t_signal, t_mid)
        r["written_lo"], _ = written_between(ios, t_signal, t_conn_lo)
        r["written_hi"], _ = written_between(ios, t_signal, t_conn)
        r["window_s"] = t_mid - t_signal
        # Where in the window the writes went: while beta stopped, while it was down, while
        # it started and connected; and the longest time without a completed write.
        r["phases"] = [written_between(ios, a, b)[0]
                       for a, b in ((t_signal, t_exit), (t_exit, t_start), (t_start, t_mid))]
        stamps = [t for t, _, _ in ios if (t_signal - 1) * 1000 <= t <= t_up * 1000]
        gaps = [(b - a, a) for a, b in zip(stamps, stamps[1:])]
        gap, at = max(gaps) if gaps else (0, t_signal * 1000)
        r["stall_ms"], r["stall_at_ms"] = gap, at - t_signal * 1000
        r["marks_ms"] = {"exit": (t_exit - t_signal) * 1000, "start": (t_start - t_signal) * 1000,
                         "connected": (t_mid - t_signal) * 1000, "uptodate": (t_up - t_signal) * 1000}
        r["iops_before"] = len([1 for t, _, _ in ios
                                if (t_signal - 2) * 1000 < t <= t_signal * 1000]) / 2
        r["iops_after"] = len([1 for t, _, _ in ios
                               if (t_up - 2) * 1000 < t <= t_up * 1000]) / 2
        with open(f"{home}/fio.json") as f:
            t = f.read()
        jobj = json.loads(t[t.find("{"):])["jobs"][0]
        job = jobj["write"]
        r["fio_error"] = jobj.get("error", 0)
        r["fio_failed"] = bool(r["fio_error"] or r["fio_errors"] or r["fio_early_exit"] is not None)
        # The daemons' warnings and errors from the signal on (a dropped peer, failed I/O).
        r["warnings"] = []
        for who, at in ((alpha, alpha_log_at), (gamma, gamma_log_at), (beta, beta_log_at)):
            for l in who.log_since(at).splitlines():
                if re.search(r"\s(WARN|ERROR)\s", l) and "did not stop cleanly" not in l:
                    r["warnings"].append(f"{who.name}: {l}")
        r["log_ios"], r["fio_ios"] = len(ios), job["total_ios"]
        # Our clock against fio's stamps: its first completion after it was started, its
        # last around the SIGINT.
        r["fio_first_ms"] = (ios[0][0] - t_fio * 1000) if ios else None
        r["fio_last_ms"] = (ios[-1][0] - t_sigint * 1000) if ios else None

        # Beta's log since the restart.
        blog = beta.log_since(restart_log_at)
        pulls = [(m.group(1), int(m.group(2))) for m in PULLED.finditer(blog)]
        r["pulled"] = sum(k for _, k in pulls) * 1024
        r["pulls"] = pulls
        m = AL_NAMES.search(blog)
        r["al_extents"], r["al_mib"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        m = CRASH_PULL.search(blog)
        r["crash_pull_kib"] = int(m.group(1)) if m else None
        r["beta_lines"] = [l for l in blog.splitlines() if INTERESTING.search(l)]
        r["beta_stop_lines"] = [l for l in beta.log_since(beta_log_at, restart_log_at)
                                .splitlines() if re.search(r"WARN|ERROR", l)]
        alog = alpha.log_since(alpha_log_at)
        r["alpha_pulled"] = [l for l in alog.splitlines() if PULLED.search(l)]
        # The Primary's new generation id after losing beta, and when alpha adopted it
        # (writes wait for that: alpha writes it to its metadata durably first).
        r["gen_adopt_ms"], r["gen_lines"] = None, []
        m = GEN.search(gamma.log_since(gamma_log_at))
        if m:
            a = re.search(r"^(\S+)Z .*generation \S+ -> " + m.group(2), alog, re.M)
            r["gen_lines"] = [f"gamma: {m.group(0)}"] + ([f"alpha: {a.group(0)}"] if a else [])
            if a:
                r["gen_adopt_ms"] = (stamp(a.group(1)) - stamp(m.group(1))) * 1000

        # Settle, stop, compare.
        wait(lambda: in_sync(nodes), 120, "in sync after fio stopped")
        r["final_exit"] = {n.name: n.stop() for n in nodes}
        c = subprocess.run(["cmp", "-n", str(SIZE), alpha.disk, beta.disk],
                           capture_output=True, text=True)
        r["identical"] = c.returncode == 0
        if not r["identical"]:
            r["cmp"] = (c.stdout + c.stderr).strip()
            r["diff_blocks"], r["diff_count"] = first_diffs(alpha.disk, beta.disk)
            r["alpha_lines"] = [l for l in alpha.log_since(0).splitlines()
                                if INTERESTING.search(l)]
            r["gamma_lines"] = [l for l in gamma.log_since(0).splitlines()
                                if INTERESTING.search(l)]
        return r
    finally:
        if fio is not None and fio.poll() is None:
            try:
                os.killpg(fio.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            fio.wait()
        for n in nodes:
            n.stop()
        if KEEP:
            say(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


# --- report ---------------------------------------------------------------------------

def mib(b):
    return b / (1 << 20)


def med_range(vals, fmt):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    return f"{fmt(statistics.median(vals))} ({fmt(min(vals))}–{fmt(max(vals))})"


def try_row(r):
    ratio = r["pulled"] / r["written"] if r["written"] else float("inf")
    oos = "/".join("—" if r.get(k) is None else f"{r[k] / 1024:.1f}"
                   for k in ("oos_gamma_kib", "oos_alpha_kib"))
    al = "—" if r["al_extents"] is None else f"{r['al_extents']} ({r['al_mib']} MiB)"
    gen = "—" if r["gen_adopt_ms"] is None else f"{r['gen_adopt_ms']:.0f}"
    return (f"| {r['mode']} | {r['try']} | {r['stop_s']:.3f} | {r['window_s']:.2f} | "
            f"{mib(r['written']):.1f} [{mib(r['written_lo']):.1f}–{mib(r['written_hi']):.1f}] | "
            f"{r['written_blocks'] / 256:.1f} | "
            f"{' / '.join(f'{mib(x):.1f}' for x in r['phases'])} | "
            f"{r['stall_ms']:.0f} @ {r['stall_at_ms'] / 1000:+.2f} | {gen} | {oos} | {al} | {mib(r['pulled']):.1f} | {ratio:.2f} | {r['connect_s']:.2f} | "
            f"{r['resync_s']:.2f} | {'**EIO**' if r['fio_failed'] else 'ok'} | "
            f"{'yes' if r['identical'] else '**NO**'} |")


def summary_rows(results):
    rows = []
    for mode in MODES:
        rs = [r for r in results if r["mode"] == mode]
        if not rs:
            continue
        # Tries where fio failed (I/O errors) wrote nothing more: left out of the numbers.
        ok = [r for r in rs if not r["fio_failed"]]
        ratios = [r["pulled"] / r["written"] for r in ok if r["written"]]
        rows.append(
            f"| {mode} | {len(rs)} | {len(rs) - len(ok)} | "
            f"{med_range([mib(r['written']) for r in ok], lambda v: f'{v:.1f}')} | "
            f"{med_range([mib(r['pulled']) for r in ok], lambda v: f'{v:.1f}')} | "
            f"{med_range(ratios, lambda v: f'{v:.2f}')} | {sum(x <= 2 for x in ratios)}/{len(ok)} | "
            f"{med_range([r['resync_s'] for r in ok], lambda v: f'{v:.2f}')} | "
            f"{sum(r['resync_s'] < 5 for r in ok)}/{len(ok)} | "
            f"{med_range([r['stall_ms'] for r in rs], lambda v: f'{v:.0f}')} | "
            f"{sum(r['identical'] for r in rs)}/{len(rs)} |")
    return rows


def main():
    binary = shared.tandem_binary(REPO)
    if not os.access(binary, os.X_OK):
        sys.exit(f"no tandem binary at {binary} (cargo build --release -p tandem-cli)")
    for tool in ("fio", "cmp"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt-get install fio diffutils)")
    for m in MODES:
        if m not in SIGNALS:
            sys.exit(f"unknown mode {m} (stop, kill)")
    busy = [ip for ip in IPS if not address_free(ip, PORT)]
    if busy:
        sys.exit(f"{', '.join(busy)}:{PORT} in use (set TANDEM_IPS / TANDEM_PORT)")

    started = time.time()
    load0 = os.getloadavg()
    busy0 = busy_processes()
    results, failures = [], []
    for t in range(1, TRIES + 1):
        for mode in MODES:
            try:
                r = one_try(binary, mode, t)
            except Exception as e:  # a failed try is reported, the others go on
                failures.append(f"{mode} try {t}: {e}")
                say(f"{mode} try {t}/{TRIES} FAILED: {e}")
                continue
            results.append(r)
            ratio = r["pulled"] / r["written"] if r["written"] else float("inf")
            say(f"{mode} try {t}/{TRIES}: written {mib(r['written']):.1f} MiB "
                f"[{mib(r['written_lo']):.1f}-{mib(r['written_hi']):.1f}] in {r['window_s']:.2f} s, "
                f"pulled {mib(r['pulled']):.1f} MiB (ratio {ratio:.2f}), resync {r['resync_s']:.2f} s, "
                f"replicas {'identical' if r['identical'] else 'DIFFER'}"
                f"{'; fio got I/O ERRORS' if r['fio_failed'] else ''}")
    load1 = os.getloadavg()
    busy1 = busy_processes()
    took = time.time() - started

    fiover = shared.out("fio", "--version")
    built = shared.built_from(REPO, note_dirty=True)
    env = shared.user_env(("TRIES", "MODES", "AWAY", "WARMUP", "SIZE_MB", "IODEPTH", "TANDEM_PORT",
                           "TANDEM_IPS", "RESYNC_MIN_RATE", "KEEP_WORKDIR", "TANDEM_REV"))
    command = f"{env + ' ' if env else ''}bench/secondary-away.py {binary}"
    fio_cmd = results[0]["fio_cmd"] if results else []

    head = ["| mode | try | stop s | window s | written MiB [bound] | distinct MiB | "
            "stopping / down / starting MiB | longest stall ms @ s | new id adopted ms | "
            "marked MiB gamma/alpha | AL names | pulled MiB | pulled / written | connect s | "
            "resync s | fio | identical |",
            "|---|---:|---:|---:|---|---:|---|---|---:|---|---|---:|---:|---:|---:|---|---|"]
    shead = ["| mode | tries | fio got I/O errors | written while away MiB | pulled MiB | "
             "pulled / written | ≤ 2× | resync s | < 5 s | longest write stall ms | "
             "replicas identical |",
             "|---|---:|---:|---|---|---|---:|---|---:|---|---:|"]
    lines = [
        f"# A Secondary away for {AWAY:g} s under 4k random writes — "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))}",
        "",
        f"Command (cwd `{REPO}`): `{command}`",
        "",
        shared.run_line(binary, built, load0, load1, took, extra=f"; {fiover}"),
        "",
        shared.busy_line(busy0, busy1),
        "",
        f"Every try: a fresh cluster (alpha, beta diskful with sparse backing files, internal "
        f"metadata, default activity log; gamma diskless and Primary; protocol C; "
        f"{IPS[0]}–{IPS[-1].rsplit('.', 1)[1]}:{PORT}), a {SIZE_MB} MiB volume, in sync; fio "
        f"4k random writes at iodepth {IODEPTH} through gamma; after {WARMUP:g} s beta gets "
        f"SIGTERM (`stop`) or SIGKILL (`kill`), is started again {AWAY:g} s after it exited, "
        f"fio is stopped (SIGINT) once beta is UpToDate; the cluster settles, the daemons stop "
        f"and `cmp -n {SIZE}` compares alpha's and beta's backing files.",
        "",
        f"fio: `{' '.join(shlex.quote(a) for a in fio_cmd)}`",
        "",
        "- **written**: bytes fio completed from the signal to beta until beta's status shows "
        "both peers Connected. fio's per-I/O log (`--write_iops_log` without "
        "`--log_avg_msec`, `--log_offset=1 --log_unix_epoch=1`) has one line per completed "
        "write with its wall-clock millisecond, bytes and offset; the writes stamped inside "
        "the window of the script's `time.time()` stamps are counted (the log holds exactly "
        "fio's `total_ios` lines, checked per try below). The window ends at the midpoint "
        "between the status poll that saw Connected and the one before; the bound in "
        "brackets is the earliest and the latest end possible (one poll, ~10–30 ms, at "
        "~50k writes/s about ±2–6 MiB), plus 1 ms for fio's millisecond stamps. fio's clock "
        "and the script's are the same wall clock: fio's first completion lands a few ms "
        "after the script started it and its last within ms of the SIGINT (below).",
        "- **distinct**: the distinct 4 KiB blocks among those writes (what beta actually "
        "missed, at the least; random writes over the volume overlap).",
        "- **stopping / down / starting**: the written bytes split at beta's exit and its "
        "new start (signal → exit → start → Connected).",
        "- **longest stall**: the longest time without a completed write from 1 s before the "
        "signal until beta is UpToDate, and when it began (seconds from the signal).",
        "- **new id adopted**: from gamma's log line \"generation A -> B (a replica missed "
        "a write)\" after it lost beta to alpha's line adopting B (a write that missed beta "
        "completes only once alpha holds B durably).",
        "- **marked**: what gamma and alpha list out of sync for beta ~80 ms before its "
        "restart (`out_of_sync_kib`).",
        "- **AL names**: after a kill, beta's \"activity log names N extents\" line (4 MiB "
        "extents it must pull because it crashed).",
        "- **pulled**: the sum of beta's \"resync from node N finished (K KiB pulled)\" lines "
        "since its restart.",
        "- **connect**: beta's control socket answering → beta sees both peers Connected; "
        "**resync**: control socket answering → beta UpToDate (status polled every ~10 ms "
        "plus the call itself).",
        "- **stop s**: signal → process gone.",
        "- **fio**: `EIO` when fio got I/O errors (then it ended by itself, and wrote nothing "
        "more): such tries are left out of the written / pulled / resync figures of the "
        "summary.",
        "",
        "## Per try",
        "",
        *head,
        *[try_row(r) for r in results],
        "",
        "## Summary (median, min–max)",
        "",
        "Targets: pulled ≤ 2× written, resync < 5 s.",
        "",
        *shead,
        *summary_rows(results),
        "",
    ]
    if failures:
        lines += ["## Failed tries", "", *[f"- {f}" for f in failures], ""]
    lines += ["## Details per try", ""]
    for r in results:
        fl = "?" if r["fio_first_ms"] is None else f"{r['fio_first_ms']:.0f}"
        ll = "?" if r["fio_last_ms"] is None else f"{r['fio_last_ms']:+.0f}"
        lines += [f"### {r['mode']} try {r['try']}", "",
                  f"beta's exit status {r['exit_status']}, away {r['away_s']:.3f} s, control "
                  f"socket answering {r['answer_s']:.3f} s after the start; fio "
                  f"{r['iops_before']:.0f} IOPS in the 2 s before the signal, "
                  f"{r['iops_after']:.0f} in the 2 s before beta was UpToDate; fio's log "
                  f"{r['log_ios']} writes, fio {r['fio_ios']}; first completion {fl} ms after "
                  f"fio was started, last {ll} ms from the SIGINT; "
                  f"status's largest resync done_kib seen {r['status_done_kib']}; exits at the "
                  f"end {r['final_exit']}; alpha's pulls: {len(r['alpha_pulled'])}.", "",
                  "generation ids:", "", "```", *r["gen_lines"], "```", "",
                  *([f"**fio got I/O errors** ({r['fio_errors']} error lines, job error "
                     f"{r['fio_error']}, exited by itself: {r['fio_early_exit'] is not None}):",
                     "", "```", *r["fio_error_lines"], "```", ""] if r["fio_failed"] else []),
                  "warnings and errors of the daemons from the signal on:", "", "```",
                  *[l[:400] for l in r["warnings"][:30]], "```", "",
                  "beta since its restart:", "", "```",
                  *[l[:400] for l in r["beta_lines"]], "```", ""]
        if r["beta_stop_lines"]:
            lines += ["beta's warnings while stopping:", "", "```",
                      *[l[:400] for l in r["beta_stop_lines"]], "```", ""]
        if not r["identical"]:
            lines += [f"**Replicas differ**: {r['cmp']}; {r['diff_count']} differing 4 KiB "
                      f"blocks, first {r['diff_blocks']}", "", "alpha:", "", "```",
                      *[l[:400] for l in r["alpha_lines"]], "```", "", "gamma:", "", "```",
                      *[l[:400] for l in r["gamma_lines"]], "```", ""]
    report = "\n".join(lines)
    out = shared.write_report(RESULTS_DIR, "secondary-away", started, report)
    print("\n".join(["Per try:", *head, *[try_row(r) for r in results], "",
                     "Summary (median, min–max); targets: pulled ≤ 2× written, resync < 5 s:",
                     *shead, *summary_rows(results)]))
    if failures:
        print("\nFailed tries:\n" + "\n".join(failures))
    say(f"took {took / 60:.1f} min; results written to {out}")
    return 1 if failures or any(not r["identical"] or r["fio_failed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
