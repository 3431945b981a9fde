//! A small network of Linux network namespaces for cluster tests: one namespace per node, each
//! cabled (a veth pair) to a bridge in a hub namespace, addresses in a private 10.x.y.0/24.
//! A cable can be pulled ([`NetLab::cut`]: the hub's end goes down, so the node's end loses its
//! carrier and every packet either way is lost, without any error reaching the sockets) and
//! plugged back in ([`NetLab::heal`]).
//!
//! Needs root and `ip` (iproute2). Everything is created under names unique to this test
//! process and removed on drop; start the daemons after the lab and stop them before it
//! (declare the [`NetLab`] first), or a namespace lingers until its last process exits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::cluster::Placement;
use super::*;

const IP_TIMEOUT: Duration = Duration::from_secs(20);

/// Where `ip netns add` keeps a namespace's handle.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/var/run/netns").join(name)
}

/// One node's namespace and its cable.
#[derive(Clone, Debug)]
pub struct LabNode {
    /// The namespace the node runs in.
    pub netns: String,
    /// Its address (on `eth0` in its namespace).
    pub ip: String,
    /// The hub's end of its cable, in the hub namespace.
    pub port: String,
}

pub struct NetLab {
    pub hub: String,
    pub nodes: Vec<LabNode>,
    /// Namespaces this lab created, removed on drop.
    created: Vec<String>,
}

/// Runs `ip ARGS`; an error names the command and its output.
fn ip(args: &[&str]) -> Result<Run, String> {
    let r = run(tool("ip").args(args), IP_TIMEOUT);
    if r.success() {
        Ok(r)
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            r.status,
            r.stderr.trim()
        ))
    }
}

impl NetLab {
    /// Creates the namespaces `tdm-<pid>-<n>-hub` and `tdm-<pid>-<n>-<i>` for `nodes` nodes,
    /// or says why it cannot (not root, no `ip`, namespaces not permitted here). Setting
    /// `TANDEM_TEST_NO_NETNS` makes it refuse, to exercise the callers' fallback.
    pub fn new(nodes: usize) -> Result<NetLab, String> {
        if std::env::var_os("TANDEM_TEST_NO_NETNS").is_some() {
            return Err("TANDEM_TEST_NO_NETNS is set".into());
        }
        if !is_root() {
            return Err("not root".into());
        }
        if find_tool("ip").is_none() {
            return Err("no `ip` tool (iproute2)".into());
        }
        static NEXT_LAB: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT_LAB.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let prefix = format!("tdm-{pid}-{n}");
        // The namespaces are isolated, so addresses cannot clash with anything outside the
        // lab; they still differ per lab, which keeps logs of parallel tests apart.
        let subnet = format!("10.{}.{}", 100 + pid % 100, n % 250);
        let mut lab = NetLab {
            hub: format!("{prefix}-hub"),
            nodes: (0..nodes)
                .map(|i| LabNode {
                    netns: format!("{prefix}-{i}"),
                    ip: format!("{subnet}.{}", i + 1),
                    port: format!("p{i}"),
                })
                .collect(),
            created: Vec::new(),
        };
        // On an error, dropping `lab` removes what was created.
        lab.build()?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<(), String> {
        let names: Vec<String> = std::iter::once(self.hub.clone())
            .chain(self.nodes.iter().map(|n| n.netns.clone()))
            .collect();
        for ns in &names {
            // A leftover of a crashed run whose pid happened to be ours.
            if netns_path(ns).exists() {
                let _ = ip(&["netns", "del", ns]);
            }
            ip(&["netns", "add", ns])?;
            self.created.push(ns.clone());
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let hub = self.hub.as_str();
        ip(&["-n", hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", hub, "link", "set", "br0", "up"])?;
        for node in &self.nodes {
            let (ns, port) = (node.netns.as_str(), node.port.as_str());
            ip(&[
                "-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])?;
            ip(&["-n", hub, "link", "set", port, "master", "br0"])?;
            ip(&["-n", hub, "link", "set", port, "up"])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", node.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// Each node on its own namespace's address, port `port`.
    pub fn placement(&self, port: u16) -> Vec<Placement> {
        self.nodes
            .iter()
            .map(|n| Placement {
                address: format!("{}:{port}", n.ip),
                netns: Some(n.netns.clone()),
            })
            .collect()
    }

    /// Pulls node `i`'s cable: the hub's end goes down.
    #[track_caller]
    pub fn cut(&self, i: usize) {
        if let Err(e) = ip(&["-n", &self.hub, "link", "set", &self.nodes[i].port, "down"]) {
            panic!("cutting the link of {}: {e}", self.nodes[i].netns);
        }
    }

    /// Plugs node `i`'s cable back in.
    #[track_caller]
    pub fn heal(&self, i: usize) {
        if let Err(e) = ip(&["-n", &self.hub, "link", "set", &self.nodes[i].port, "up"]) {
            panic!("healing the link of {}: {e}", self.nodes[i].netns);
        }
    }

    /// Cuts nodes `i` and `j` apart while each keeps its cable (an asymmetric partition):
    /// each namespace routes the other's address into a blackhole, so what either sends
    /// the other goes nowhere, and nobody is told (TCP retransmits into the void).
    #[track_caller]
    pub fn cut_between(&self, i: usize, j: usize) {
        self.blackhole(i, j, "add");
    }

    /// Undoes [`NetLab::cut_between`].
    #[track_caller]
    pub fn heal_between(&self, i: usize, j: usize) {
        self.blackhole(i, j, "del");
    }

    #[track_caller]
    fn blackhole(&self, i: usize, j: usize, verb: &str) {
        for (from, to) in [(i, j), (j, i)] {
            let (ns, dst) = (&self.nodes[from].netns, format!("{}/32", self.nodes[to].ip));
            if let Err(e) = ip(&["-n", ns, "route", verb, "blackhole", &dst]) {
                panic!("route {verb} blackhole {dst} in {ns}: {e}");
            }
        }
    }

    /// Limits what reaches node `i` over its cable to `rate` (tc's words: `200mbit`);
    /// `None` lifts the limit.
    #[track_caller]
    pub fn limit_to(&self, i: usize, rate: Option<&str>) {
        match rate {
            Some(r) => self.shape(i, r, "256kb", "100ms"),
            None => self.unshape(i),
        }
    }

    /// A token bucket on what reaches node `i` over its cable: `rate`, `burst` and the
    /// longest a packet may wait in its queue (`latency`), in tc's words (`40mbit`,
    /// `32kbit`, `400ms`).
    #[track_caller]
    pub fn shape(&self, i: usize, rate: &str, burst: &str, latency: &str) {
        let port = self.nodes[i].port.as_str();
        self.tc(&[
            "-n", &self.hub, "qdisc", "replace", "dev", port, "root", "tbf", "rate", rate, "burst",
            burst, "latency", latency,
        ]);
    }

    /// Lifts node `i`'s limit.
    #[track_caller]
    pub fn unshape(&self, i: usize) {
        let port = self.nodes[i].port.as_str();
        self.tc(&["-n", &self.hub, "qdisc", "del", "dev", port, "root"]);
    }

    #[track_caller]
    fn tc(&self, args: &[&str]) {
        let r = run(tool("tc").args(args), IP_TIMEOUT);
        assert!(r.success(), "`tc {}`: {}", args.join(" "), r.describe());
    }

    /// Bytes that went over node `i`'s cable: (from the node, to the node).
    #[track_caller]
    pub fn cable_bytes(&self, i: usize) -> (u64, u64) {
        let r = ip(&[
            "-n",
            &self.hub,
            "-s",
            "-j",
            "link",
            "show",
            "dev",
            &self.nodes[i].port,
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let json = Json::parse(&r.stdout)
            .unwrap_or_else(|e| panic!("`ip -j` printed invalid JSON ({e}): {}", r.stdout));
        let link = json
            .as_array()
            .and_then(|a| a.first())
            .unwrap_or_else(|| panic!("`ip -j link show` printed {}", r.stdout));
        let bytes = |dir: &str| {
            link.at(&["stats64", dir, "bytes"])
                .and_then(Json::as_u64)
                .unwrap_or_else(|| panic!("no stats64.{dir}.bytes in {}", r.stdout))
        };
        // The hub's end receives what the node sends.
        (bytes("rx"), bytes("tx"))
    }

    /// The namespace a process is in, as `ip netns identify` names it.
    pub fn netns_of(pid: u32) -> String {
        match ip(&["netns", "identify", &pid.to_string()]) {
            Ok(r) => r.stdout.trim().to_string(),
            Err(e) => e,
        }
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // Deleting a namespace destroys its ends of the cables, and with them the bridge's.
        for ns in self.created.iter().rev() {
            if !cleanup(tool("ip").args(["netns", "del", ns])) {
                eprintln!("cleanup: `ip netns del {ns}` failed");
            }
        }
    }
}
