//! Shared harness of the integration tests: scratch directories, a `tandem serve` child
//! process, external tools (found or skipped, never silently passed), and a raw NBD client
//! for protocol-level tests.

// Every test binary compiles this module but uses a different part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tandem_frontend::nbd::request::encode_request;
use tandem_frontend::nbd::wire::*;

pub mod cluster;
pub mod ext4;
pub mod netns;
pub mod pki;
pub mod prom;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

/// How long a server gets to start listening, and a raw client to get an answer.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The binary under test. `TANDEM_BIN` lets a run point at another build (or, while
/// developing the harness, at a stand-in) without recompiling the tests.
pub fn tandem_bin() -> PathBuf {
    std::env::var_os("TANDEM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tandem")))
}

// ---------------------------------------------------------------------------------------
// Skips

/// Where skipped tests are recorded; `scripts/test` empties it first and prints it last, so a
/// skip is never mistaken for a pass.
pub fn skip_file() -> PathBuf {
    std::env::var_os("TANDEM_SKIP_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-skips.txt")
        })
}

pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED {test}: {reason}");
    eprintln!("{line}");
    let path = skip_file();
    if let Some(parent) = path.parent() {
        let _ = fs::create_dir_all(parent);
    }
    // One write of one short line with O_APPEND: parallel tests do not interleave.
    match OpenOptions::new().create(true).append(true).open(&path) {
        Ok(mut f) => {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
        Err(e) => eprintln!("cannot record the skip in {}: {e}", path.display()),
    }
}

/// Finds an executable on PATH, or in the sbin directories that a non-login root shell may
/// lack on its PATH (losetup, mkfs.ext4, e2fsck live there).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// True if every tool is there; otherwise records a skip naming the missing ones.
pub fn require_tools(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| find_tool(t).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    skip(
        test,
        &format!(
            "missing tool(s): {} (scripts/test installs them)",
            missing.join(", ")
        ),
    );
    false
}

/// A command for a tool that [`require_tools`] found.
pub fn tool(name: &str) -> Command {
    Command::new(
        find_tool(name).unwrap_or_else(|| panic!("{name} not found; call require_tools first")),
    )
}

/// fio is built with optional engines; the NBD one needs libnbd at build time.
pub fn require_fio_nbd(test: &str) -> bool {
    if !require_tools(test, &["fio"]) {
        return false;
    }
    let help = run(tool("fio").arg("--enghelp"), Duration::from_secs(30));
    if help.stdout.split_whitespace().any(|w| w == "nbd") {
        return true;
    }
    skip(test, "this fio has no nbd ioengine");
    false
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------
// Running tools

/// A finished command.
pub struct Run {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    pub fn describe(&self) -> String {
        format!(
            "{} exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }

    #[track_caller]
    pub fn expect_success(&self) -> &Run {
        assert!(self.success(), "{}", self.describe());
        self
    }
}

/// Runs a command to completion with a deadline; a hung tool fails the test instead of
/// hanging the suite.
#[track_caller]
pub fn run(cmd: &mut Command, timeout: Duration) -> Run {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let Some(status) = wait_timeout(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not finish within {timeout:?}");
    };
    let stdout = String::from_utf8_lossy(&out.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    Run {
        what,
        status,
        stdout,
        stderr,
    }
}

/// Runs a cleanup command without panicking (a panic inside a drop during a failing test
/// would abort the whole test binary).
pub fn cleanup(cmd: &mut Command) -> bool {
    let Ok(mut child) = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    match wait_timeout(&mut child, Duration::from_secs(30)) {
        Some(status) => status.success(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            false
        }
    }
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions; the pid is our own unreaped child,
    // so it cannot have been recycled for another process.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Polls `cond` until it holds or the deadline passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------
// Scratch directories and data

/// A fresh directory per test, removed on drop. Short on purpose: it holds the server's Unix
/// socket, whose path may not exceed 108 bytes.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(test: &str) -> TestDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let mut base = std::env::temp_dir();
        if base.as_os_str().len() > 40 {
            base = PathBuf::from("/tmp");
        }
        let path = base.join(format!("tandem-test-{}-{n}", std::process::id()));
        // A leftover of an earlier run whose pid happened to be ours.
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        // Names the owner of a directory left behind by a crashed run.
        fs::write(path.join("TEST"), test).unwrap();
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::env::var_os("TANDEM_KEEP_TEST_DIRS").is_some() {
            eprintln!("keeping {}", self.path.display());
            return;
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Deterministic pseudo-random bytes (xorshift64): reproducible without a rand crate, and
/// incompressible enough that a server returning stale or zeroed blocks cannot pass.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Creates (or truncates) a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    f.set_len(size).unwrap();
    f
}

pub fn write_at(path: &Path, offset: u64, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    f.write_all_at(data, offset).unwrap();
}

pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("reading {} at {offset}: {e}", path.display()));
    buf
}

/// Compares without printing megabytes: reports the first difference and how much differs.
#[track_caller]
pub fn assert_same_data(what: &str, expected: &[u8], actual: &[u8]) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: got {} bytes, expected {}",
        actual.len(),
        expected.len()
    );
    if let Some(i) = expected.iter().zip(actual).position(|(e, a)| e != a) {
        let differing = expected.iter().zip(actual).filter(|(e, a)| e != a).count();
        panic!(
            "{what}: first difference at byte {i} (expected {:#04x}, got {:#04x}); {differing} of {} bytes differ",
            expected[i],
            actual[i],
            expected.len()
        );
    }
}

// ---------------------------------------------------------------------------------------
// The server

static NEXT_SERVER: AtomicUsize = AtomicUsize::new(0);

/// `tandem serve` arguments; `--socket` is always added so the harness knows when the server
/// is ready.
pub struct ServerBuilder<'a> {
    dir: &'a TestDir,
    socket: PathBuf,
    log: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl ServerBuilder<'_> {
    pub fn export(mut self, name: &str, path: &Path) -> Self {
        let mut arg = OsString::from(format!("{name}="));
        arg.push(path);
        self.args.push(arg);
        self
    }

    /// An export without `NAME=`: named after the file stem.
    pub fn unnamed_export(mut self, path: &Path) -> Self {
        self.args.push(path.into());
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn socket(mut self, socket: PathBuf) -> Self {
        self.socket = socket;
        self
    }

    fn command(&self) -> (Command, File) {
        let log = File::create(&self.log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.log.display()));
        let mut cmd = Command::new(tandem_bin());
        cmd.arg("serve")
            .arg("--socket")
            .arg(&self.socket)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log.try_clone().unwrap());
        (cmd, log)
    }

    /// Starts the server and waits until its socket accepts connections.
    #[track_caller]
    pub fn start(self) -> Server {
        let (mut cmd, _log) = self.command();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tandem_bin().display()));
        let mut server = Server {
            socket: self.socket,
            log: self.log,
            child: Some(child),
            status: None,
            command: format!("{cmd:?}"),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = server.child.as_mut().unwrap().try_wait().unwrap() {
                server.status = Some(status);
                server.child = None;
                // The drop of `server` prints the log.
                panic!("{} exited with {status} before listening", server.command);
            }
            // The probe connection is closed right away; the server must shrug that off.
            if UnixStream::connect(&server.socket).is_ok() {
                return server;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} not listening on {} after {STARTUP_TIMEOUT:?}",
                    server.command,
                    server.socket.display()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// For invocations that must fail: runs the server until it exits and returns the exit
    /// status (`None` if it was still running after `timeout`, then it is killed) and its log.
    pub fn run_to_exit(self, timeout: Duration) -> (Option<ExitStatus>, String) {
        let (mut cmd, _log) = self.command();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tandem_bin().display()));
        let status = wait_timeout(&mut child, timeout);
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        (status, fs::read_to_string(&self.log).unwrap_or_default())
    }
}

/// A running `tandem serve`. Dropping it stops it (SIGTERM, then SIGKILL) and, if the test is
/// failing, prints its log.
pub struct Server {
    socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    status: Option<ExitStatus>,
    command: String,
}

impl Server {
    pub fn builder(dir: &TestDir) -> ServerBuilder<'_> {
        let n = NEXT_SERVER.fetch_add(1, Ordering::SeqCst);
        ServerBuilder {
            dir,
            socket: dir.join(format!("s{n}.sock")),
            log: dir.join(format!("server-{n}.log")),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// URI of an export (the default export for `""`), as libnbd and QEMU spell it.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    pub fn log(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Waits until the log contains one of `needles` (case-insensitive); the log is written by
    /// another process, so it may lag behind what the client saw.
    pub fn log_mentions(&self, needles: &[&str], timeout: Duration) -> bool {
        wait_until(timeout, || {
            let log = self.log().to_lowercase();
            needles.iter().any(|n| log.contains(&n.to_lowercase()))
        })
    }

    #[track_caller]
    pub fn expect_log(&self, needles: &[&str], what: &str) {
        assert!(
            self.log_mentions(needles, Duration::from_secs(5)),
            "server log does not mention {what} (looked for any of {needles:?}); log:\n{}",
            self.log()
        );
    }

    #[track_caller]
    pub fn assert_running(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().unwrap() {
                self.status = Some(status);
                self.child = None;
            }
        }
        if let Some(status) = self.status {
            panic!("the server exited with {status}");
        }
    }

    /// Sends `sig` and waits up to `timeout` for the exit. Returns the status and how long the
    /// exit took, or `None` if the server was still running (it is then killed).
    pub fn signal_and_wait(
        &mut self,
        sig: i32,
        timeout: Duration,
    ) -> Option<(ExitStatus, Duration)> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        signal(&child, sig);
        match wait_timeout(&mut child, timeout) {
            Some(status) => {
                self.status = Some(status);
                Some((status, start.elapsed()))
            }
            None => {
                let _ = child.kill();
                self.status = child.wait().ok();
                None
            }
        }
    }

    /// SIGTERM and wait; panics (with the log) unless the server exits 0 within `timeout`.
    #[track_caller]
    pub fn stop(&mut self, timeout: Duration) -> Duration {
        match self.signal_and_wait(libc::SIGTERM, timeout) {
            Some((status, took)) if status.success() => took,
            Some((status, _)) => panic!(
                "the server exited with {status} on SIGTERM; log:\n{}",
                self.log()
            ),
            None => panic!(
                "the server did not exit within {timeout:?} of SIGTERM; log:\n{}",
                self.log()
            ),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
        }
        if thread::panicking() {
            eprintln!(
                "---- {} ({}) ----\n{}---- end of server log ----",
                self.log.display(),
                self.command,
                self.log()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The node daemon (`tandem node`) and its administration verbs

/// Runs `tandem ARGS --control CONTROL` (an administration verb) to completion.
pub fn tandem_admin(control: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(tandem_bin());
    cmd.args(args)
        .arg("--control")
        .arg(control)
        .env_remove("TANDEM_CONTROL");
    run(&mut cmd, Duration::from_secs(15))
}

/// `tandem status --json` of one node, parsed: the array of its resources.
pub fn node_status(control: &Path) -> Result<Json, String> {
    let r = tandem_admin(control, &["status", "--json"]);
    if !r.success() {
        return Err(r.describe());
    }
    Json::parse(&r.stdout)
        .map_err(|e| format!("status --json printed invalid JSON ({e}):\n{}", r.stdout))
}

/// A `tandem node` process. It can be killed and started again with the same command (the
/// log is appended to, with a marker per start). Dropping it stops it (SIGTERM, then SIGKILL
/// after 5 s) and, if the test is failing, prints its log.
pub struct NodeDaemon {
    pub name: String,
    pub config_dir: PathBuf,
    pub control: PathBuf,
    /// The network namespace (a name under /run/netns) the daemon runs in.
    pub netns: Option<String>,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
    command: String,
    /// More `tandem node` arguments for the next (re)starts.
    pub extra_args: Vec<String>,
    /// Environment variables set for the next (re)starts.
    pub extra_env: Vec<(String, String)>,
}

impl NodeDaemon {
    /// Starts `tandem node --name NAME --config-dir DIR --control CONTROL`, logging to `log`.
    /// Call [`NodeDaemon::wait_ready`] before talking to it.
    pub fn start(name: &str, config_dir: &Path, control: &Path, log: &Path) -> NodeDaemon {
        NodeDaemon::start_in(None, name, config_dir, control, log)
    }

    /// [`NodeDaemon::start`] with these environment variables set (on every restart too).
    pub fn start_with_env(
        name: &str,
        config_dir: &Path,
        control: &Path,
        log: &Path,
        env: &[(&str, &str)],
    ) -> NodeDaemon {
        let mut d = NodeDaemon::unstarted(None, name, config_dir, control, log);
        d.extra_env = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        d.restart();
        d
    }

    /// [`NodeDaemon::start`] inside the network namespace `netns` (a name that `ip netns`
    /// created), if given. The child joins it with setns(2) right before exec, so the pid is
    /// the daemon's own and, unlike `ip netns exec`, it shares the test's mount namespace:
    /// later mounts and unmounts of the test are the daemon's too.
    pub fn start_in(
        netns: Option<&str>,
        name: &str,
        config_dir: &Path,
        control: &Path,
        log: &Path,
    ) -> NodeDaemon {
        let mut d = NodeDaemon::unstarted(netns, name, config_dir, control, log);
        d.restart();
        d
    }

    fn unstarted(
        netns: Option<&str>,
        name: &str,
        config_dir: &Path,
        control: &Path,
        log: &Path,
    ) -> NodeDaemon {
        NodeDaemon {
            name: name.to_string(),
            config_dir: config_dir.to_owned(),
            control: control.to_owned(),
            netns: netns.map(str::to_string),
            log: log.to_owned(),
            child: None,
            starts: 0,
            command: String::new(),
            extra_args: Vec::new(),
            extra_env: Vec::new(),
        }
    }

    /// Starts the daemon (again) with the same command line.
    #[track_caller]
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "node {} is still running", self.name);
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        let _ = writeln!(
            log,
            "==== test harness: start #{} of node {} ====",
            self.starts, self.name
        );
        let mut cmd = Command::new(tandem_bin());
        cmd.arg("node")
            .arg("--name")
            .arg(&self.name)
            .arg("--config-dir")
            .arg(&self.config_dir)
            .arg("--control")
            .arg(&self.control)
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env_remove("TANDEM_CONTROL")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let _netns_fd = self.netns.as_ref().map(|ns| {
            let path = netns::netns_path(ns);
            let f = File::open(&path)
                .unwrap_or_else(|e| panic!("opening network namespace {}: {e}", path.display()));
            let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
            // SAFETY: setns is a plain system call, async-signal-safe, so it may run between
            // fork and exec; `f` (opened with O_CLOEXEC) outlives the spawn below.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::last_os_error())
                    }
                });
            }
            f
        });
        self.command = match &self.netns {
            Some(ns) => format!("(in network namespace {ns}) {cmd:?}"),
            None => format!("{cmd:?}"),
        };
        self.child = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.command)),
        );
    }

    /// Waits until the control socket answers `status`; panics if the daemon exits first.
    #[track_caller]
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                panic!(
                    "node {} exited with {status} before answering on {}",
                    self.name,
                    self.control.display()
                );
            }
            if UnixStream::connect(&self.control).is_ok() && node_status(&self.control).is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "node {} does not answer on {} after {timeout:?}",
                    self.name,
                    self.control.display()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status if the daemon has exited (it is then reaped).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let status = self
            .child
            .as_mut()?
            .try_wait()
            .expect("waiting for a node")?;
        self.child = None;
        Some(status)
    }

    pub fn is_running(&mut self) -> bool {
        self.try_exit();
        self.child.is_some()
    }

    #[track_caller]
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_exit() {
            panic!("node {} exited with {status}", self.name);
        }
        assert!(self.child.is_some(), "node {} is not running", self.name);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn status(&self) -> Result<Json, String> {
        node_status(&self.control)
    }

    /// Runs an administration verb against this node.
    pub fn admin(&self, args: &[&str]) -> Run {
        tandem_admin(&self.control, args)
    }

    pub fn log(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// SIGKILL: no flushing, no goodbye to the peers.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it is still running after `timeout`. Returns the exit status
    /// of a daemon that exited by itself (`None` if it had to be killed or was not running).
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        signal(&child, libc::SIGTERM);
        match wait_timeout(&mut child, timeout) {
            Some(status) => Some(status),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }

    /// SIGTERM; panics unless the daemon exits 0 within `timeout`.
    #[track_caller]
    pub fn stop(&mut self, timeout: Duration) {
        assert!(self.child.is_some(), "node {} is not running", self.name);
        match self.terminate(timeout) {
            Some(status) if status.success() => {}
            Some(status) => panic!("node {} exited with {status} on SIGTERM", self.name),
            None => panic!(
                "node {} did not exit within {timeout:?} of SIGTERM",
                self.name
            ),
        }
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
        if thread::panicking() {
            eprintln!(
                "---- log of node {} ({}; {}) ----\n{}---- end of the log of node {} ----",
                self.name,
                self.log.display(),
                self.command,
                self.log(),
                self.name
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// JSON of nbdinfo, fio and `tandem status --json`: serde_json's `Value`, with the two
// helpers the tests use.

pub type Json = serde_json::Value;

pub trait JsonExt {
    fn parse(text: &str) -> Result<Json, String>;
    /// The value at a path of object keys.
    fn at(&self, path: &[&str]) -> Option<&Json>;
}

impl JsonExt for Json {
    fn parse(text: &str) -> Result<Json, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    fn at(&self, path: &[&str]) -> Option<&Json> {
        path.iter().try_fold(self, |v, k| v.get(k))
    }
}

// ---------------------------------------------------------------------------------------
// Raw NBD client

/// A client connection over either transport the server listens on.
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub fn unix(path: &Path) -> Conn {
        let s = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(REPLY_TIMEOUT)).unwrap();
        Conn::Unix(s)
    }

    pub fn tcp(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn::Tcp(s)
    }

    pub fn try_clone(&self) -> Conn {
        match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone().unwrap()),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone().unwrap()),
        }
    }

    pub fn set_read_timeout(&self, t: Duration) {
        match self {
            Conn::Unix(s) => s.set_read_timeout(Some(t)).unwrap(),
            Conn::Tcp(s) => s.set_read_timeout(Some(t)).unwrap(),
        }
    }

    pub fn shutdown_write(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Write),
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
        };
    }

    #[track_caller]
    pub fn send(&mut self, bytes: &[u8]) {
        self.write_all(bytes)
            .unwrap_or_else(|e| panic!("sending {} bytes: {e}", bytes.len()));
    }

    #[track_caller]
    pub fn recv_exact(&mut self, len: usize, what: &str) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        if let Err(e) = self.read_exact(&mut buf) {
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    panic!("no {what} from the server within {REPLY_TIMEOUT:?}")
                }
                io::ErrorKind::UnexpectedEof => {
                    panic!("the server closed the connection instead of sending {what}")
                }
                _ => panic!("reading {what}: {e}"),
            }
        }
        buf
    }

    pub fn recv_u16(&mut self, what: &str) -> u16 {
        u16::from_be_bytes(self.recv_exact(2, what).try_into().unwrap())
    }

    pub fn recv_u32(&mut self, what: &str) -> u32 {
        u32::from_be_bytes(self.recv_exact(4, what).try_into().unwrap())
    }

    pub fn recv_u64(&mut self, what: &str) -> u64 {
        u64::from_be_bytes(self.recv_exact(8, what).try_into().unwrap())
    }

    /// Waits for the server to hang up. Bytes it sends first (an error reply, say) are
    /// allowed and counted; a connection still open at the deadline is an error.
    pub fn wait_closed(&mut self, timeout: Duration) -> Result<usize, String> {
        self.set_read_timeout(Duration::from_millis(100));
        let deadline = Instant::now() + timeout;
        let mut received = 0;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.read(&mut buf) {
                Ok(0) => return Ok(received),
                Ok(n) => received += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Reset or similar: closed all the same.
                Err(_) => return Ok(received),
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "connection still open {timeout:?} later ({received} bytes received)"
                ));
            }
        }
    }

    // Handshake pieces, for tests that take the handshake apart.

    /// Reads the server's greeting and returns its handshake flags.
    #[track_caller]
    pub fn greeting(&mut self) -> u16 {
        let magic = self.recv_u64("the greeting");
        assert_eq!(magic, NBDMAGIC, "bad greeting magic {magic:#x}");
        let opt = self.recv_u64("the greeting");
        assert_eq!(
            opt, IHAVEOPT,
            "server does not speak newstyle (got {opt:#x})"
        );
        self.recv_u16("the handshake flags")
    }

    pub fn client_flags(&mut self, flags: u32) {
        self.send(&flags.to_be_bytes());
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = Vec::with_capacity(16 + data.len());
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    #[track_caller]
    pub fn option_reply(&mut self) -> OptReply {
        let magic = self.recv_u64("an option reply");
        assert_eq!(
            magic, OPTION_REPLY_MAGIC,
            "bad option reply magic {magic:#x}"
        );
        let option = self.recv_u32("an option reply");
        let kind = self.recv_u32("an option reply");
        let len = self.recv_u32("an option reply");
        assert!(len <= 64 * 1024, "option reply of {len} bytes");
        let data = self.recv_exact(len as usize, "an option reply payload");
        OptReply { option, kind, data }
    }

    /// Reads INFO/GO replies up to the final ACK; an error reply ends it early.
    #[track_caller]
    pub fn info_replies(&mut self, option: u32) -> Result<ExportDetails, OptReply> {
        let mut d = ExportDetails::default();
        loop {
            let r = self.option_reply();
            assert_eq!(
                r.option, option,
                "reply for option {} while waiting for {option}",
                r.option
            );
            match r.kind {
                REP_ACK => {
                    assert!(d.size.is_some(), "ACK without NBD_INFO_EXPORT");
                    return Ok(d);
                }
                REP_INFO => {
                    assert!(r.data.len() >= 2, "NBD_REP_INFO of {} bytes", r.data.len());
                    let item = u16::from_be_bytes([r.data[0], r.data[1]]);
                    let body = &r.data[2..];
                    match item {
                        INFO_EXPORT => {
                            assert_eq!(body.len(), 10, "NBD_INFO_EXPORT length");
                            d.size = Some(u64::from_be_bytes(body[..8].try_into().unwrap()));
                            d.flags = u16::from_be_bytes(body[8..10].try_into().unwrap());
                        }
                        INFO_NAME => d.name = Some(String::from_utf8_lossy(body).into_owned()),
                        INFO_DESCRIPTION => {
                            d.description = Some(String::from_utf8_lossy(body).into_owned())
                        }
                        INFO_BLOCK_SIZE => {
                            assert_eq!(body.len(), 12, "NBD_INFO_BLOCK_SIZE length");
                            let u =
                                |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
                            d.block = Some([u(0), u(4), u(8)]);
                        }
                        _ => {}
                    }
                }
                kind if kind & 0x8000_0000 != 0 => return Err(r),
                kind => panic!("unexpected option reply type {kind:#x}"),
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

impl OptReply {
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

#[derive(Clone, Debug, Default)]
pub struct ExportDetails {
    pub size: Option<u64>,
    pub flags: u16,
    pub name: Option<String>,
    pub description: Option<String>,
    /// minimum, preferred, maximum
    pub block: Option<[u32; 3]>,
}

/// The data of NBD_OPT_INFO / NBD_OPT_GO.
pub fn info_request(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

pub fn errno_name(e: u32) -> &'static str {
    match e {
        0 => "OK",
        1 => "EPERM",
        5 => "EIO",
        12 => "ENOMEM",
        22 => "EINVAL",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        95 => "ENOTSUP",
        108 => "ESHUTDOWN",
        _ => "?",
    }
}

/// One complete reply to one request.
#[derive(Clone, Debug)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
    /// The message of a structured error chunk.
    pub message: String,
    /// Chunk types in arrival order; empty for a simple reply.
    pub chunks: Vec<u16>,
    /// A block status reply's metadata context id and descriptors (length, flags).
    pub context: Option<u32>,
    pub extents: Vec<(u32, u32)>,
    covered: u64,
}

impl Reply {
    pub fn describe(&self) -> String {
        format!(
            "{} ({}) message {:?} chunks {:x?}",
            self.error,
            errno_name(self.error),
            self.message,
            self.chunks
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    command: u16,
    offset: u64,
    len: u32,
}

/// A client in the transmission phase. It checks framing strictly (cookies, chunk bounds,
/// reply forms) so a protocol slip fails the test even when the data happens to be right.
pub struct Nbd {
    pub conn: Conn,
    pub structured: bool,
    pub details: ExportDetails,
    next_cookie: u64,
    pending: HashMap<u64, Pending>,
    partial: HashMap<u64, Reply>,
}

impl Nbd {
    /// Fixed-newstyle handshake ending in NBD_OPT_GO for `export`.
    #[track_caller]
    pub fn go(mut conn: Conn, export: &str, structured: bool) -> Nbd {
        let hs = conn.greeting();
        assert!(
            hs & FLAG_FIXED_NEWSTYLE != 0,
            "server does not offer fixed newstyle (flags {hs:#x})"
        );
        let no_zeroes = if hs & FLAG_NO_ZEROES != 0 {
            FLAG_C_NO_ZEROES
        } else {
            0
        };
        conn.client_flags(FLAG_C_FIXED_NEWSTYLE | no_zeroes);
        Nbd::go_after_flags(conn, export, structured)
    }

    /// [`Nbd::go`] without asking for `NBD_INFO_BLOCK_SIZE`: a client not bound to block
    /// sizes, which may address single bytes.
    #[track_caller]
    pub fn go_unsized(mut conn: Conn, export: &str, structured: bool) -> Nbd {
        conn.greeting();
        conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        if structured {
            conn.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(
                conn.option_reply().kind,
                REP_ACK,
                "NBD_OPT_STRUCTURED_REPLY"
            );
        }
        conn.option(OPT_GO, &info_request(export, &[]));
        let details = conn
            .info_replies(OPT_GO)
            .unwrap_or_else(|r| panic!("NBD_OPT_GO {export:?} refused: {:?}", r.message()));
        Nbd::transmission(conn, structured, details)
    }

    /// The old way in, `NBD_OPT_EXPORT_NAME`, which cannot ask for block sizes.
    #[track_caller]
    pub fn export_name(mut conn: Conn, export: &str) -> Nbd {
        conn.greeting();
        conn.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        conn.option(OPT_EXPORT_NAME, export.as_bytes());
        let size = conn.recv_u64("the NBD_OPT_EXPORT_NAME reply");
        let flags = conn.recv_u16("the NBD_OPT_EXPORT_NAME reply");
        let details = ExportDetails {
            size: Some(size),
            flags,
            ..Default::default()
        };
        Nbd::transmission(conn, false, details)
    }

    /// The rest of [`Nbd::go`], for tests that sent other options first.
    #[track_caller]
    pub fn go_after_flags(mut conn: Conn, export: &str, structured: bool) -> Nbd {
        if structured {
            conn.option(OPT_STRUCTURED_REPLY, &[]);
            let r = conn.option_reply();
            assert_eq!(
                (r.option, r.kind),
                (OPT_STRUCTURED_REPLY, REP_ACK),
                "NBD_OPT_STRUCTURED_REPLY: {:?}",
                r
            );
        }
        conn.option(OPT_GO, &info_request(export, &[INFO_BLOCK_SIZE]));
        let details = conn.info_replies(OPT_GO).unwrap_or_else(|r| {
            panic!(
                "NBD_OPT_GO {export:?} refused: {:#x} {:?}",
                r.kind,
                r.message()
            )
        });
        Nbd::transmission(conn, structured, details)
    }

    pub fn transmission(conn: Conn, structured: bool, details: ExportDetails) -> Nbd {
        conn.set_read_timeout(REPLY_TIMEOUT);
        // Cookies with high bits set catch a server that truncates them.
        Nbd {
            conn,
            structured,
            details,
            next_cookie: 0xc0ff_ee00_0000_0000,
            pending: HashMap::new(),
            partial: HashMap::new(),
        }
    }

    pub fn size(&self) -> u64 {
        self.details.size.unwrap()
    }

    pub fn flags(&self) -> u16 {
        self.details.flags
    }

    /// Encodes a request and records it as outstanding; the caller sends the bytes.
    pub fn encode(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> u64 {
        self.next_cookie += 1;
        let cookie = self.next_cookie;
        encode_request(out, flags, command, cookie, offset, len);
        out.extend_from_slice(payload);
        self.pending.insert(
            cookie,
            Pending {
                command,
                offset,
                len,
            },
        );
        cookie
    }

    pub fn send(&mut self, flags: u16, command: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        let mut b = Vec::with_capacity(28 + payload.len());
        let cookie = self.encode(flags, command, offset, len, payload, &mut b);
        self.conn.send(&b);
        cookie
    }

    /// One request, one reply.
    #[track_caller]
    pub fn request(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = self.send(flags, command, offset, len, payload);
        let r = self.recv();
        assert_eq!(
            r.cookie, cookie,
            "reply for cookie {:#x} while only {cookie:#x} was outstanding",
            r.cookie
        );
        r
    }

    #[track_caller]
    pub fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let r = self.request(0, CMD_READ, offset, len, &[]);
        assert_eq!(r.error, 0, "READ {offset}+{len} failed: {}", r.describe());
        r.data
    }

    #[track_caller]
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let r = self.request(0, CMD_WRITE, offset, data.len() as u32, data);
        assert_eq!(
            r.error,
            0,
            "WRITE {offset}+{} failed: {}",
            data.len(),
            r.describe()
        );
    }

    #[track_caller]
    pub fn flush(&mut self) {
        let r = self.request(0, CMD_FLUSH, 0, 0, &[]);
        assert_eq!(r.error, 0, "FLUSH failed: {}", r.describe());
    }

    /// NBD_CMD_BLOCK_STATUS (the connection selected a metadata context): the
    /// descriptors (length, flags), checked to start at `offset`, to stay inside the
    /// request, and to be exactly one with `req_one`.
    #[track_caller]
    pub fn block_status(&mut self, offset: u64, len: u32, req_one: bool) -> Vec<(u32, u32)> {
        let flags = if req_one { CMD_FLAG_REQ_ONE } else { 0 };
        let r = self.request(flags, CMD_BLOCK_STATUS, offset, len, &[]);
        assert_eq!(
            r.error,
            0,
            "BLOCK_STATUS {offset}+{len} failed: {}",
            r.describe()
        );
        assert!(!r.extents.is_empty(), "BLOCK_STATUS without descriptors");
        let total: u64 = r.extents.iter().map(|&(l, _)| u64::from(l)).sum();
        assert!(
            total <= u64::from(len),
            "descriptors cover {total} bytes of a {len}-byte request: {:?}",
            r.extents
        );
        if req_one {
            assert_eq!(r.extents.len(), 1, "REQ_ONE: {:?}", r.extents);
        }
        r.extents
    }

    /// The next complete reply, whichever request it answers.
    #[track_caller]
    pub fn recv(&mut self) -> Reply {
        loop {
            let magic = self.conn.recv_u32("a reply");
            match magic {
                SIMPLE_REPLY_MAGIC => {
                    let error = self.conn.recv_u32("a simple reply");
                    let cookie = self.conn.recv_u64("a simple reply");
                    let p = self.pending.remove(&cookie).unwrap_or_else(|| {
                        panic!("simple reply (error {error}) for unknown cookie {cookie:#x}")
                    });
                    assert!(
                        !(self.structured && p.command == CMD_READ),
                        "simple reply (error {error}) to a READ on a connection with structured replies"
                    );
                    let data = if error == 0 && p.command == CMD_READ {
                        self.conn.recv_exact(p.len as usize, "READ data")
                    } else {
                        Vec::new()
                    };
                    return Reply {
                        cookie,
                        error,
                        data,
                        message: String::new(),
                        chunks: Vec::new(),
                        context: None,
                        extents: Vec::new(),
                        covered: 0,
                    };
                }
                STRUCTURED_REPLY_MAGIC => {
                    assert!(
                        self.structured,
                        "structured reply on a connection that did not negotiate them"
                    );
                    let flags = self.conn.recv_u16("a chunk header");
                    let typ = self.conn.recv_u16("a chunk header");
                    let cookie = self.conn.recv_u64("a chunk header");
                    let length = self.conn.recv_u32("a chunk header");
                    assert!(u64::from(length) <= 33 * MIB, "chunk of {length} bytes");
                    let payload = self.conn.recv_exact(length as usize, "a chunk payload");
                    if let Some(reply) = self.chunk(flags, typ, cookie, &payload) {
                        return reply;
                    }
                }
                other => panic!("bad reply magic {other:#010x}"),
            }
        }
    }

    fn chunk(&mut self, flags: u16, typ: u16, cookie: u64, payload: &[u8]) -> Option<Reply> {
        let p = *self
            .pending
            .get(&cookie)
            .unwrap_or_else(|| panic!("chunk type {typ:#x} for unknown cookie {cookie:#x}"));
        let reply = self.partial.entry(cookie).or_insert_with(|| Reply {
            cookie,
            error: 0,
            data: if p.command == CMD_READ {
                vec![0; p.len as usize]
            } else {
                Vec::new()
            },
            message: String::new(),
            chunks: Vec::new(),
            context: None,
            extents: Vec::new(),
            covered: 0,
        });
        reply.chunks.push(typ);
        let in_request = |offset: u64, len: u64| {
            assert!(
                offset >= p.offset && offset + len <= p.offset + u64::from(p.len),
                "chunk {offset}+{len} outside the request {}+{}",
                p.offset,
                p.len
            );
            (offset - p.offset) as usize
        };
        match typ {
            REPLY_TYPE_NONE => {
                assert!(
                    payload.is_empty(),
                    "NONE chunk with {} bytes",
                    payload.len()
                );
                assert!(
                    flags & REPLY_FLAG_DONE != 0,
                    "NONE chunk without the DONE flag"
                );
            }
            REPLY_TYPE_OFFSET_DATA => {
                assert_eq!(
                    p.command, CMD_READ,
                    "OFFSET_DATA chunk for command {}",
                    p.command
                );
                assert!(
                    payload.len() > 8,
                    "OFFSET_DATA chunk of {} bytes",
                    payload.len()
                );
                let offset = u64::from_be_bytes(payload[..8].try_into().unwrap());
                let data = &payload[8..];
                let at = in_request(offset, data.len() as u64);
                reply.data[at..at + data.len()].copy_from_slice(data);
                reply.covered += data.len() as u64;
            }
            2 => {
                // OFFSET_HOLE: reads as zeros, which the buffer already holds.
                assert_eq!(
                    p.command, CMD_READ,
                    "OFFSET_HOLE chunk for command {}",
                    p.command
                );
                assert_eq!(payload.len(), 12, "OFFSET_HOLE chunk length");
                let offset = u64::from_be_bytes(payload[..8].try_into().unwrap());
                let len = u32::from_be_bytes(payload[8..12].try_into().unwrap());
                let at = in_request(offset, u64::from(len));
                reply.data[at..at + len as usize].fill(0);
                reply.covered += u64::from(len);
            }
            REPLY_TYPE_BLOCK_STATUS => {
                assert_eq!(
                    p.command, CMD_BLOCK_STATUS,
                    "BLOCK_STATUS chunk for command {}",
                    p.command
                );
                assert!(
                    payload.len() >= 12 && (payload.len() - 4).is_multiple_of(8),
                    "BLOCK_STATUS chunk of {} bytes",
                    payload.len()
                );
                assert!(
                    reply.context.is_none(),
                    "two BLOCK_STATUS chunks for one context"
                );
                reply.context = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                for d in payload[4..].chunks_exact(8) {
                    let len = u32::from_be_bytes(d[..4].try_into().unwrap());
                    let flags = u32::from_be_bytes(d[4..].try_into().unwrap());
                    assert_ne!(len, 0, "block status descriptor of length 0");
                    reply.extents.push((len, flags));
                }
            }
            t if t & 0x8000 != 0 => {
                assert!(payload.len() >= 6, "error chunk of {} bytes", payload.len());
                let error = u32::from_be_bytes(payload[..4].try_into().unwrap());
                let msg_len = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
                assert!(
                    6 + msg_len <= payload.len(),
                    "error message length {msg_len} exceeds the chunk"
                );
                assert_ne!(error, 0, "error chunk with error 0");
                if reply.error == 0 {
                    reply.error = error;
                    reply.message = String::from_utf8_lossy(&payload[6..6 + msg_len]).into_owned();
                }
            }
            other => panic!("unknown chunk type {other:#x}"),
        }
        if flags & REPLY_FLAG_DONE == 0 {
            return None;
        }
        self.pending.remove(&cookie);
        let reply = self.partial.remove(&cookie).unwrap();
        if p.command == CMD_READ && reply.error == 0 {
            assert_eq!(
                reply.covered,
                u64::from(p.len),
                "successful READ reply covers {} of {} bytes",
                reply.covered,
                p.len
            );
        }
        Some(reply)
    }
}

/// fio's JSON (it may print notices before it).
pub fn fio_json(run: &Run) -> Json {
    let start = if run.stdout.starts_with('{') {
        0
    } else {
        run.stdout.find("\n{").map(|i| i + 1).unwrap_or(0)
    };
    Json::parse(&run.stdout[start..])
        .unwrap_or_else(|e| panic!("fio printed invalid JSON ({e}): {}", run.describe()))
}

/// fio succeeded, reported no verify or I/O error, and moved `bytes` in `direction` ("read"
/// or "write"); `None` accepts any positive amount.
#[track_caller]
pub fn check_fio(run: &Run, direction: &str, bytes: Option<u64>) {
    assert!(run.success(), "{}", run.describe());
    for bad in [
        "verify:",
        "bad magic",
        "crc32c: verify failed",
        "fio: io_u error",
    ] {
        assert!(
            !run.stderr.contains(bad) && !run.stdout.contains(bad),
            "fio reported {bad:?}: {}",
            run.describe()
        );
    }
    let json = fio_json(run);
    let jobs = json
        .get("jobs")
        .and_then(Json::as_array)
        .expect("fio JSON without jobs");
    for job in jobs {
        assert_eq!(
            job.get("error").and_then(Json::as_u64),
            Some(0),
            "fio job error: {job:?}"
        );
    }
    let total: u64 = jobs
        .iter()
        .filter_map(|j| j.at(&[direction, "io_bytes"]).and_then(Json::as_u64))
        .sum();
    match bytes {
        Some(b) => assert_eq!(total, b, "fio {direction} bytes: {}", run.describe()),
        None => assert!(total > 0, "fio {direction} nothing: {}", run.describe()),
    }
}
