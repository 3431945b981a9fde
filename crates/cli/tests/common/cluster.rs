//! A cluster of `tandem node` daemons for the integration tests: one config directory per node
//! (like separate machines), NBD and control on Unix sockets in a scratch directory, status
//! JSON helpers, byte comparison of the replicas, fio helpers.
//!
//! By default each node listens on its own 127.0.0.X address; [`Setup::placement`] puts nodes
//! on other addresses, each in its own network namespace if wanted (see `common::netns`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::*;

/// Daemons answering and peers connected.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Replicas in sync after a load (a full resync of 256 MiB included).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
pub const FIO_TIMEOUT: Duration = Duration::from_secs(180);

pub const BLOCK: u64 = 4096;
pub const RESOURCE: &str = "r0";
pub const SECRET: &str = "s3cret";

// ---------------------------------------------------------------------------------------
// A cluster of node daemons

#[derive(Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub diskful: bool,
}

pub const ALPHA: Spec = Spec {
    name: "alpha",
    diskful: true,
};
pub const BETA: Spec = Spec {
    name: "beta",
    diskful: true,
};
pub const GAMMA: Spec = Spec {
    name: "gamma",
    diskful: false,
};

pub struct Node {
    pub name: &'static str,
    pub diskful: bool,
    /// Volume 0's backing file (diskful nodes only) and NBD socket.
    pub disk: PathBuf,
    pub nbd: PathBuf,
    /// Every volume's backing file and NBD socket (`disks[0]` is `disk`).
    pub disks: Vec<PathBuf>,
    pub nbds: Vec<PathBuf>,
    pub address: String,
    /// The network namespace the daemon runs in (`None`: the test's own).
    pub netns: Option<String>,
    pub daemon: NodeDaemon,
}

impl Node {
    pub fn uri(&self) -> String {
        self.uri_of(0)
    }

    pub fn uri_of(&self, volume: usize) -> String {
        format!("nbd+unix:///?socket={}", self.nbds[volume].display())
    }

    pub fn status(&self) -> Json {
        let all = self
            .daemon
            .status()
            .unwrap_or_else(|e| panic!("status of {}: {e}", self.name));
        resource_of(&all)
            .unwrap_or_else(|| panic!("{}'s status has no resource {RESOURCE}: {all:?}", self.name))
            .clone()
    }
}

pub struct Cluster {
    pub test: &'static str,
    // Declared before `dir`: the daemons stop before their directory is removed.
    pub nodes: Vec<Node>,
    pub dir: TestDir,
    /// The resource's volume sizes (volume numbers 0, 1, ...).
    pub sizes: Vec<u64>,
}

/// The config file as one node sees it (tests edit a node's copy to break things).
pub type Tweak<'a> = &'a dyn Fn(&str, String) -> String;

pub fn no_tweak(_node: &str, text: String) -> String {
    text
}

/// Where one node runs: its replication address (`IP:PORT`) and its network namespace.
#[derive(Clone, Debug)]
pub struct Placement {
    pub address: String,
    pub netns: Option<String>,
}

/// Everything [`Cluster::start_with`] varies.
pub struct Setup<'a> {
    pub protocol: &'a str,
    pub specs: &'a [Spec],
    pub tweak: Tweak<'a>,
    /// Volume 0's size, a whole number of MiB (written as `"<n>M"`).
    pub size: u64,
    /// Sizes of volumes 1, 2, ... (whole MiB). Volume 0 keeps the file names of
    /// single-volume clusters (`r0.img`, `nbd.sock`); volume v > 0 is `r0-v.img`, `nbd-v.sock`.
    pub more_volumes: &'a [u64],
    /// Extra lines for the `[net]` table (`key = "value"`, one a line).
    pub net: &'a str,
    /// One per spec, in order; empty: each node on its own 127.0.0.X address, in the test's
    /// network namespace.
    pub placement: Vec<Placement>,
}

impl<'a> Setup<'a> {
    /// 256 MiB, default timeouts, loopback addresses.
    pub fn new(protocol: &'a str, specs: &'a [Spec]) -> Setup<'a> {
        Setup {
            protocol,
            specs,
            tweak: &no_tweak,
            size: 256 * MIB,
            more_volumes: &[],
            net: "",
            placement: Vec::new(),
        }
    }
}

/// `n` addresses 127.0.0.X:PORT for a new cluster. Concurrent clusters of this test binary
/// get different addresses, concurrent runs of test binaries different ports.
pub fn loopback_placement(n: usize) -> Vec<Placement> {
    static NEXT_CLUSTER: AtomicUsize = AtomicUsize::new(0);
    let c = NEXT_CLUSTER.fetch_add(1, Ordering::SeqCst);
    assert!(n <= 4);
    // 127.0.0.100 .. 127.0.0.251, four addresses per cluster.
    let octet = |i: usize| 100 + (c % 38) * 4 + i;
    let port = 20000 + std::process::id() % 10000;
    (0..n)
        .map(|i| Placement {
            address: format!("127.0.0.{}:{port}", octet(i)),
            netns: None,
        })
        .collect()
}

impl Cluster {
    /// [`Cluster::start_with`] a 256 MiB volume on loopback addresses.
    pub fn start(test: &'static str, protocol: &str, specs: &[Spec], tweak: Tweak<'_>) -> Cluster {
        Cluster::start_with(
            test,
            Setup {
                tweak,
                ..Setup::new(protocol, specs)
            },
        )
    }

    /// [`Cluster::start`] with one volume per entry of `sizes` (whole MiB).
    pub fn start_volumes(
        test: &'static str,
        protocol: &str,
        specs: &[Spec],
        sizes: &[u64],
        tweak: Tweak<'_>,
    ) -> Cluster {
        Cluster::start_with(
            test,
            Setup {
                tweak,
                size: sizes[0],
                more_volumes: &sizes[1..],
                ..Setup::new(protocol, specs)
            },
        )
    }

    /// Writes one config directory per node (like separate machines), starts every node and
    /// waits until each answers on its control socket. Does not wait for connections.
    pub fn start_with(test: &'static str, setup: Setup<'_>) -> Cluster {
        let Setup {
            protocol,
            specs,
            tweak,
            size,
            more_volumes,
            net,
            mut placement,
        } = setup;
        let sizes: Vec<u64> = std::iter::once(size)
            .chain(more_volumes.iter().copied())
            .collect();
        for size in &sizes {
            assert!(
                size % MIB == 0,
                "volume size {size} is not a whole number of MiB"
            );
        }
        if placement.is_empty() {
            placement = loopback_placement(specs.len());
        }
        assert_eq!(placement.len(), specs.len(), "one placement per node");
        let dir = TestDir::new(test);
        let mut text = format!(
            "# written by {test}\n\
             [resource]\n\
             name = \"{RESOURCE}\"\n\
             protocol = \"{protocol}\"\n\
             shared-secret = \"{SECRET}\"\n\
             \n\
             [net]\n\
             connect-interval = \"200ms\"\n\
             max-connect-interval = \"1s\"\n\
             {net}"
        );
        for (v, size) in sizes.iter().enumerate() {
            text += &format!(
                "\n[[volume]]\n\
                 number = {v}\n\
                 size = \"{}M\"\n",
                size / MIB
            );
        }
        let mut layout = Vec::new();
        for (i, (s, place)) in specs.iter().zip(placement).enumerate() {
            let home = dir.join(s.name);
            std::fs::create_dir_all(home.join("cfg")).unwrap();
            let suffix = |v: usize| match v {
                0 => String::new(),
                v => format!("-{v}"),
            };
            let disks: Vec<PathBuf> = (0..sizes.len())
                .map(|v| home.join(format!("r0{}.img", suffix(v))))
                .collect();
            let nbds: Vec<PathBuf> = (0..sizes.len())
                .map(|v| home.join(format!("nbd{}.sock", suffix(v))))
                .collect();
            text += &format!(
                "\n[[node]]\n\
                 name = \"{}\"\n\
                 node-id = {i}\n\
                 address = \"{}\"\n",
                s.name, place.address,
            );
            for v in 0..sizes.len() {
                let disk_value = if s.diskful {
                    disks[v].display().to_string()
                } else {
                    "none".to_string()
                };
                text += &format!(
                    "  [[node.volume]]\n  \
                     number = {v}\n  \
                     disk = \"{disk_value}\"\n  \
                     nbd = [\"unix:{}\"]\n",
                    nbds[v].display()
                );
            }
            layout.push((*s, home, disks, nbds, place));
        }
        let mut nodes = Vec::new();
        for (s, home, disks, nbds, place) in layout {
            let cfg = home.join("cfg");
            std::fs::write(cfg.join("r0.toml"), tweak(s.name, text.clone())).unwrap();
            let daemon = NodeDaemon::start_in(
                place.netns.as_deref(),
                s.name,
                &cfg,
                &home.join("ctl"),
                &home.join("node.log"),
            );
            nodes.push(Node {
                name: s.name,
                diskful: s.diskful,
                disk: disks[0].clone(),
                nbd: nbds[0].clone(),
                disks,
                nbds,
                address: place.address,
                netns: place.netns,
                daemon,
            });
        }
        let mut cluster = Cluster {
            test,
            nodes,
            dir,
            sizes,
        };
        for n in &mut cluster.nodes {
            n.daemon.wait_ready(READY_TIMEOUT);
        }
        cluster
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn diskful(&self) -> Vec<&Node> {
        self.nodes.iter().filter(|n| n.diskful).collect()
    }

    /// Panics if a daemon that should run has died.
    #[track_caller]
    pub fn assert_running(&mut self, names: &[&str]) {
        for n in &mut self.nodes {
            if names.contains(&n.name) {
                n.daemon.assert_running();
            }
        }
    }

    /// For `watch`, alpha and beta keep running and neither sees the other Connected
    /// (`why`: what keeps them apart, for the failure message).
    pub fn assert_alpha_and_beta_never_connect(&mut self, watch: Duration, why: &str) {
        let deadline = Instant::now() + watch;
        while Instant::now() < deadline {
            self.assert_running(&["alpha", "beta"]);
            for (me, other) in [("alpha", "beta"), ("beta", "alpha")] {
                let st = self.node(me).status();
                let conn = peer_of(&st, other).map(|p| str_of(p, "connection"));
                assert!(
                    conn.is_some_and(|s| s != "Connected"),
                    "{me} sees {other} {conn:?} although {why}\n{}",
                    self.describe()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn running(&mut self) -> Vec<&'static str> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.daemon.is_running().then_some(n.name))
            .collect()
    }

    /// Every running node's status, for failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            out += &format!("--- status of {} ---\n", n.name);
            match tandem_admin(&n.daemon.control, &["status"]) {
                r if r.success() => out += &r.stdout,
                r => out += &format!("(no status: {})\n", r.stderr.trim()),
            }
        }
        out
    }

    /// Polls until `check` (over the running nodes' statuses) passes; panics with the last
    /// reason and every node's status otherwise. A node that dies meanwhile fails at once.
    #[track_caller]
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&[(&'static str, Json)]) -> Result<(), String>,
    ) {
        let running = self.running();
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running(&running);
            let statuses: Result<Vec<(&'static str, Json)>, String> = self
                .nodes
                .iter()
                .filter(|n| running.contains(&n.name))
                .map(|n| {
                    let all = n.daemon.status()?;
                    let r = resource_of(&all)
                        .ok_or_else(|| format!("{}: no resource {RESOURCE} in {all:?}", n.name))?;
                    Ok((n.name, r.clone()))
                })
                .collect();
            let last = match statuses.and_then(|s| check(&s)) {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!(
                    "{}: not {what} after {timeout:?}: {last}\n{}",
                    self.test,
                    self.describe()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Until every running node sees every other running node Connected.
    #[track_caller]
    pub fn wait_connected(&mut self) {
        let running = self.running();
        self.wait_for("connected", READY_TIMEOUT, |statuses| {
            for (me, st) in statuses {
                for other in running.iter().filter(|o| *o != me) {
                    let p = peer_of(st, other)
                        .ok_or_else(|| format!("{me}'s status lists no peer {other}"))?;
                    let conn = str_of(p, "connection");
                    if conn != "Connected" {
                        return Err(format!("{me} sees {other} {conn}"));
                    }
                }
            }
            Ok(())
        });
    }

    /// Until all running nodes are connected, every replica UpToDate, nothing out of sync,
    /// in flight or unacknowledged: the moment to compare backing files.
    #[track_caller]
    pub fn wait_in_sync(&mut self, timeout: Duration) {
        let running = self.running();
        let diskful: Vec<&'static str> = self
            .nodes
            .iter()
            .filter(|n| n.diskful)
            .map(|n| n.name)
            .collect();
        self.wait_for("in sync", timeout, |statuses| {
            for (me, st) in statuses {
                let want_disk = if diskful.contains(me) {
                    "UpToDate"
                } else {
                    "Diskless"
                };
                if num_of(st, "app_in_flight") != Some(0) {
                    return Err(format!("{me}: app_in_flight {:?}", st.get("app_in_flight")));
                }
                for v in arr_of(st, "volumes") {
                    let disk = str_of(v, "disk");
                    if disk != want_disk {
                        return Err(format!("{me}: disk {disk}"));
                    }
                    if !matches!(v.get("resync_remaining_kib"), None | Some(Json::Null))
                        && num_of(v, "resync_remaining_kib") != Some(0)
                    {
                        return Err(format!(
                            "{me}: resync remaining {:?}",
                            v.get("resync_remaining_kib")
                        ));
                    }
                    if num_of(v, "writes_in_flight").unwrap_or(0) != 0 {
                        return Err(format!(
                            "{me}: writes in flight {:?}",
                            v.get("writes_in_flight")
                        ));
                    }
                }
                for other in running.iter().filter(|o| *o != me) {
                    let p = peer_of(st, other)
                        .ok_or_else(|| format!("{me}'s status lists no peer {other}"))?;
                    let conn = str_of(p, "connection");
                    if conn != "Connected" {
                        return Err(format!("{me} sees {other} {conn}"));
                    }
                    if num_of(p, "unacked").unwrap_or(0) != 0 {
                        return Err(format!("{me}: {:?} unacked by {other}", p.get("unacked")));
                    }
                    let want_peer_disk = if diskful.contains(other) {
                        "UpToDate"
                    } else {
                        "Diskless"
                    };
                    let vols = arr_of(p, "volumes");
                    if vols.is_empty() {
                        return Err(format!("{me}: no volumes for peer {other}"));
                    }
                    for pv in vols {
                        let oos = num_of(pv, "out_of_sync_kib");
                        if oos != Some(0) {
                            return Err(format!("{me}: {oos:?} KiB out of sync with {other}"));
                        }
                        // Not the replication state: see `resync_returns_to_established`.
                        let pd = str_of(pv, "peer_disk");
                        if pd != want_peer_disk {
                            return Err(format!("{me} sees {other} peer-disk {pd}"));
                        }
                    }
                }
            }
            Ok(())
        });
    }

    /// `tandem ARGS --name NODE --config-dir <NODE's config>`: the tools that work on a
    /// stopped node's replica (dump-md, show-gi, create-md, invalidate).
    pub fn replica_tool(&self, node: &str, args: &[&str]) -> Run {
        let mut cmd = std::process::Command::new(tandem_bin());
        cmd.args(args)
            .args(["--name", node, "--config-dir"])
            .arg(self.dir.join(node).join("cfg"));
        run(&mut cmd, Duration::from_secs(30))
    }

    /// Every diskful node's backing file equals the first one's, byte for byte.
    #[track_caller]
    pub fn assert_replicas_identical(&self) {
        let disks = self.diskful();
        assert!(disks.len() >= 2, "fewer than two replicas to compare");
        for v in 0..self.sizes.len() {
            for other in &disks[1..] {
                let size = self.sizes[v];
                if let Err(e) = compare_files(&disks[0].disks[v], &other.disks[v], size) {
                    panic!(
                        "{}: the replicas of volume {v} on {} and {} differ: {e}\n{}",
                        self.test,
                        disks[0].name,
                        other.name,
                        self.describe()
                    );
                }
            }
        }
    }

    /// SIGTERM to every running node; each must exit 0.
    #[track_caller]
    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if n.daemon.is_running() {
                n.daemon.stop(Duration::from_secs(10));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Status JSON

pub fn resource_of(all: &Json) -> Option<&Json> {
    all.as_array()?
        .iter()
        .find(|r| r.get("name").and_then(Json::as_str) == Some(RESOURCE))
}

pub fn peer_of<'a>(res: &'a Json, name: &str) -> Option<&'a Json> {
    arr_of(res, "peers")
        .iter()
        .find(|p| p.get("name").and_then(Json::as_str) == Some(name))
}

pub fn arr_of<'a>(v: &'a Json, key: &str) -> &'a [Json] {
    v.get(key)
        .and_then(Json::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn str_of<'a>(v: &'a Json, key: &str) -> &'a str {
    v.get(key).and_then(Json::as_str).unwrap_or("?")
}

pub fn num_of(v: &Json, key: &str) -> Option<u64> {
    v.get(key).and_then(Json::as_u64)
}

/// The peer's connection is up *and* its volumes were exchanged (the size check passed): a
/// connection that the daemon drops within the same instant after a failed check does not
/// count.
pub fn replicating_with(res: &Json, peer: &str) -> bool {
    peer_of(res, peer).is_some_and(|p| {
        str_of(p, "connection") == "Connected"
            && arr_of(p, "volumes")
                .iter()
                .any(|v| str_of(v, "peer_disk") != "DUnknown" || str_of(v, "replication") != "Off")
    })
}

// ---------------------------------------------------------------------------------------
// Backing files

/// Byte comparison of the first `size` bytes (the volume: internal metadata, which is
/// each node's own, follows it) in 1 MiB steps; names the differing 4 KiB blocks.
pub fn compare_files(a: &Path, b: &Path, size: u64) -> Result<(), String> {
    let (fa, fb) = (
        File::open(a).map_err(|e| format!("{}: {e}", a.display()))?,
        File::open(b).map_err(|e| format!("{}: {e}", b.display()))?,
    );
    let (la, lb) = (fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    if la < size || lb < size {
        return Err(format!(
            "{} has {la} bytes, {} has {lb}, the volume {size}",
            a.display(),
            b.display()
        ));
    }
    let la = size;
    let mut ba = vec![0u8; MIB as usize];
    let mut bb = vec![0u8; MIB as usize];
    let mut differing = 0u64;
    let mut first = Vec::new();
    let mut off = 0;
    while off < la {
        let n = (la - off).min(MIB) as usize;
        fa.read_exact_at(&mut ba[..n], off).unwrap();
        fb.read_exact_at(&mut bb[..n], off).unwrap();
        if ba[..n] != bb[..n] {
            for (i, (x, y)) in ba[..n]
                .chunks(BLOCK as usize)
                .zip(bb[..n].chunks(BLOCK as usize))
                .enumerate()
            {
                if x != y {
                    differing += 1;
                    if first.len() < 8 {
                        first.push(off + i as u64 * BLOCK);
                    }
                }
            }
        }
        off += n as u64;
    }
    if differing == 0 {
        Ok(())
    } else {
        Err(format!(
            "{differing} of {} blocks of 4 KiB differ, the first at offsets {first:?}",
            la / BLOCK
        ))
    }
}

/// How many 4 KiB blocks of `[start, end)` hold anything but zeroes.
pub fn nonzero_blocks(path: &Path, start: u64, end: u64) -> u64 {
    let f = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = vec![0u8; MIB as usize];
    let mut count = 0;
    let mut off = start;
    while off < end {
        let n = (end - off).min(MIB) as usize;
        f.read_exact_at(&mut buf[..n], off).unwrap();
        count += buf[..n]
            .chunks(BLOCK as usize)
            .filter(|c| c.iter().any(|&b| b != 0))
            .count() as u64;
        off += n as u64;
    }
    count
}
// ---------------------------------------------------------------------------------------
// fio

pub fn nbd_engine(node: &Node) -> Vec<String> {
    nbd_volume_engine(node, 0)
}

pub fn nbd_volume_engine(node: &Node, volume: usize) -> Vec<String> {
    vec![
        "--ioengine=nbd".into(),
        format!("--uri={}", node.uri_of(volume)),
    ]
}

/// fio on a backing file directly, to check a replica without its daemon.
pub fn file_engine(path: &Path) -> Vec<String> {
    vec![
        "--ioengine=psync".into(),
        format!("--filename={}", path.display()),
    ]
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// 4 KiB random writes by two jobs (two NBD connections) on disjoint 64 MiB halves of the
pub fn fio(job: Vec<String>, engine: Vec<String>, extra: &[&str]) -> Run {
    run(tool("fio").args(job).args(engine).args(extra), FIO_TIMEOUT)
}

/// A child process killed (SIGKILL) when the test ends early.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Log checks

/// True if one line of `log` contains one of `needles` from every group (case-insensitive).
pub fn log_line_with(log: &str, groups: &[&[&str]]) -> bool {
    log.lines().any(|line| {
        let line = line.to_lowercase();
        groups
            .iter()
            .all(|g| g.iter().any(|n| line.contains(&n.to_lowercase())))
    })
}

pub fn wait_log_line(node: &Node, groups: &[&[&str]], timeout: Duration) -> bool {
    wait_until(timeout, || log_line_with(&node.daemon.log(), groups))
}

/// The state of `st`'s node's connection to `peer` (status JSON), or why there is none.
pub fn connection(st: &Json, peer: &str) -> String {
    peer_of(st, peer)
        .map(|p| str_of(p, "connection").to_string())
        .unwrap_or_else(|| format!("(no peer {peer})"))
}

/// KiB that `st`'s node records as out of sync with `peer`.
pub fn out_of_sync_kib(st: &Json, peer: &str) -> u64 {
    peer_of(st, peer)
        .map(|p| {
            arr_of(p, "volumes")
                .iter()
                .filter_map(|v| num_of(v, "out_of_sync_kib"))
                .sum()
        })
        .unwrap_or(0)
}
