//! Prometheus metrics of a node (`GET /metrics` on the node's `metrics` address), in the
//! text exposition format 0.0.4. Pure: the node hands each resource's `tandem status`
//! answer ([`ResourceStatus`]) and its counters ([`ResourceCounters`]) to an
//! [`Exposition`], resource by resource (a scrape of 1000 resources is built over several
//! rounds of the event loop), and sends what [`Exposition::finish`] returns.
//!
//! Names and labels are drbd-reactor's where the concept is the same (`drbd_resource_role`,
//! `drbd_device_state`, `drbd_connection_state`, `drbd_peerdevice_outofsync_bytes`, ...),
//! so Grafana dashboard 14339 and alerts written for it work; states are drbd-reactor's
//! "enums" form, one sample per state a tandem object can be in, 1 for the one it is in.
//! tandem's own are `tandem_...`: latency histograms of the application's requests and of
//! replicated writes' round trips, resync progress and rate, replication and peer disk
//! states.

use crate::control_api::{Connection, Disk, PeerStatus, Replication, ResourceStatus, Role};
use std::fmt::Write as _;
use std::time::Duration;

/// Finite latency buckets: 16 µs, 32 µs, ... 2^23 µs (8.4 s), then `+Inf`.
pub const BUCKETS: usize = 20;
/// The first bucket's bound is 2^FIRST µs.
const FIRST: u32 = 4;

/// A latency histogram with fixed power-of-two buckets: an observation is a bucket
/// index computed from its leading zeros and two additions (no allocation, no lock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: [u64; BUCKETS + 1],
    sum_ns: u64,
}

impl Histogram {
    #[inline]
    pub fn observe(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // Within bucket i <=> ceil(µs) <= 2^(i+FIRST).
        let us = ns.div_ceil(1000);
        let log2 = if us <= 1 {
            0
        } else {
            64 - (us - 1).leading_zeros()
        };
        let i = (log2.saturating_sub(FIRST) as usize).min(BUCKETS);
        self.counts[i] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// The upper bound of finite bucket `i`, in seconds.
    fn bound(i: usize) -> f64 {
        (1u64 << (i as u32 + FIRST)) as f64 / 1e6
    }
}

/// What the application asks of a volume, for the latency histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 0,
    /// Writes, trims and zeroing.
    Write = 1,
    Flush = 2,
}

pub const OPS: [Op; 3] = [Op::Read, Op::Write, Op::Flush];

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
        }
    }
}

/// A resource's counters beside its status, kept by the node where requests complete.
#[derive(Clone, Debug, Default)]
pub struct ResourceCounters<'a> {
    /// Per volume (the status's order): bytes read from and written to the local replica
    /// (the application's, a peer's and resync's alike).
    pub volumes: Vec<VolumeCounters>,
    /// Per peer (the status's order): per volume, data bytes sent to and received from it
    /// (replicated writes and resync data).
    pub peers: Vec<PeerCounters<'a>>,
    /// Application requests, from their arrival to their reply, per [`Op`].
    pub io: Option<&'a [Histogram; 3]>,
    /// `on-no-quorum = "suspend-io"`: a Primary without quorum holds requests.
    pub suspends_without_quorum: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct VolumeCounters {
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Configured without a disk here (`disk = "none"`).
    pub client: bool,
}

#[derive(Clone, Debug, Default)]
pub struct PeerCounters<'a> {
    /// Per volume: (sent, received) data bytes.
    pub bytes: Vec<(u64, u64)>,
    /// Replicated writes to it, from sending to the first acknowledgement.
    pub round_trips: Option<&'a Histogram>,
}

/// A metric family: name, type, help.
struct Family(&'static str, &'static str, &'static str);

macro_rules! families {
    ($($id:ident = $name:literal $kind:literal $help:literal;)+) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        enum F { $($id),+ }
        const FAMILIES: &[Family] = &[$(Family($name, $kind, $help)),+];
    };
}

families! {
    UP = "drbdreactor_up" "gauge" "Always 1 while tandem node serves metrics (drbd-reactor's name: dashboards list their instances by it)";
    BUILD = "tandem_build_info" "gauge" "The tandem version, as a label; always 1";
    RESOURCES = "drbd_resource_resources" "gauge" "Number of resources";
    ROLE = "drbd_resource_role" "gauge" "DRBD role of the resource";
    SUSPENDED = "drbd_resource_suspended" "gauge" "Boolean whether the resource is suspended (a Primary without quorum with on-no-quorum = suspend-io)";
    NOT_ATTACHED = "tandem_resource_not_attached" "gauge" "Boolean whether the resource is down on this node: a replica could not be attached at start";
    IN_FLIGHT = "tandem_resource_requests_in_flight" "gauge" "Application requests taken and not yet answered";
    RES_REQUESTS = "tandem_resource_requests_total" "counter" "Application requests answered, per operation";
    RES_SECONDS = "tandem_resource_request_seconds_total" "counter" "Time application requests took from arrival to reply, summed, per operation";
    DEV_STATE = "drbd_device_state" "gauge" "DRBD device state";
    DEV_CLIENT = "drbd_device_client" "gauge" "Boolean whether this device is a client (i.e., intentional diskless)";
    DEV_UNINTENTIONAL = "drbd_device_unintentionaldiskless" "gauge" "Boolean whether the devices is unintentional diskless";
    DEV_QUORUM = "drbd_device_quorum" "gauge" "Boolean if this device has DRBD quorum";
    DEV_SIZE = "drbd_device_size_bytes" "gauge" "Device size in bytes";
    DEV_READ = "drbd_device_read_bytes_total" "counter" "Net data read from local hard disk";
    DEV_WRITTEN = "drbd_device_written_bytes_total" "counter" "Net data written on local disk";
    DEV_WRITES_IN_FLIGHT = "tandem_device_writes_in_flight" "gauge" "Writes to the volume taken and not yet completed";
    CONN_STATE = "drbd_connection_state" "gauge" "DRBD connection state";
    CONN_SPLIT_BRAIN = "tandem_connection_split_brain" "gauge" "Boolean whether a split brain with this peer waits for the administrator (the connection is StandAlone)";
    CONN_PEER_ROLE = "tandem_connection_peer_role" "gauge" "The peer's role, as this node last heard it";
    CONN_UNACKED = "tandem_connection_unacked_requests" "gauge" "Replicated writes sent to the peer and not yet acknowledged";
    PD_OUT_OF_SYNC = "drbd_peerdevice_outofsync_bytes" "gauge" "Number of bytes currently out of sync with this peer, according to the bitmap that DRBD has for it";
    PD_SENT = "drbd_peerdevice_sent_bytes" "counter" "Number of bytes currently sent to this peer";
    PD_RECEIVED = "drbd_peerdevice_received_bytes" "counter" "Number of bytes currently received from this peer";
    PD_REPL = "tandem_peerdevice_replication_state" "gauge" "Replication state with this peer (DRBD's repl)";
    PD_PEER_DISK = "tandem_peerdevice_peer_disk_state" "gauge" "The peer's disk state (DRBD's peer-disk)";
    RESYNC_RATE = "tandem_resync_bytes_per_second" "gauge" "A running resync's rate over the last ~10 s (on the source and on the target)";
    RESYNC_LEFT = "tandem_resync_remaining_bytes" "gauge" "A running resync's bytes left to copy";
    RESYNC_DONE = "tandem_resync_done_bytes" "gauge" "A running resync's bytes copied so far";
    IO = "tandem_io_duration_seconds" "histogram" "Application requests of every resource, from their arrival to their reply, per operation";
    RTT = "tandem_replication_round_trip_seconds" "histogram" "Replicated writes, from sending them to a peer to its first acknowledgement (received with protocol B, written with C), per peer";
    BUILD_SECONDS = "tandem_metrics_build_seconds" "gauge" "CPU time the event loop spent building the previous scrape (over several rounds, a few resources each)";
}

const ROLES: [Role; 3] = [Role::Unknown, Role::Primary, Role::Secondary];
const OWN_DISKS: [Disk; 4] = [
    Disk::Diskless,
    Disk::Inconsistent,
    Disk::Outdated,
    Disk::UpToDate,
];
const PEER_DISKS: [Disk; 5] = [
    Disk::Diskless,
    Disk::Inconsistent,
    Disk::Outdated,
    Disk::UpToDate,
    Disk::DUnknown,
];
const CONNECTIONS: [&str; 3] = ["StandAlone", "Connecting", "Connected"];
const REPLICATIONS: [Replication; 4] = [
    Replication::Off,
    Replication::Established,
    Replication::SyncSource,
    Replication::SyncTarget,
];

/// A scrape being built: one body per family, filled resource by resource, so that each
/// family's samples stay together as the format requires.
pub struct Exposition {
    bodies: Vec<String>,
    resources: usize,
    io: [Histogram; 3],
    /// Per peer name, over every resource.
    rtt: Vec<(String, Histogram)>,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition::new()
    }
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::sized(&[])
    }

    /// With room for each family's samples as `hint` says (the last scrape's
    /// [`Exposition::sizes`]), so the text is not copied as it grows.
    pub fn sized(hint: &[usize]) -> Exposition {
        let room = |i: usize| hint.get(i).map_or(0, |n| n + n / 8);
        Exposition {
            bodies: (0..FAMILIES.len())
                .map(|i| String::with_capacity(room(i)))
                .collect(),
            resources: 0,
            io: Default::default(),
            rtt: Vec::new(),
        }
    }

    /// Each family's samples so far, in bytes.
    pub fn sizes(&self) -> Vec<usize> {
        self.bodies.iter().map(String::len).collect()
    }

    fn body(&mut self, f: F) -> &mut String {
        &mut self.bodies[f as usize]
    }

    /// `name value` with labels `{labels}` (already written, comma separated).
    /// Pieces pushed as they are, the formatting machinery only for the number: a scrape
    /// of 1000 resources is some 40,000 samples.
    fn sample(&mut self, f: F, labels: &str, value: impl std::fmt::Display) {
        let name = FAMILIES[f as usize].0;
        let b = self.body(f);
        b.push_str(name);
        b.push('{');
        b.push_str(labels);
        b.push_str("} ");
        let _ = write!(b, "{value}");
        b.push('\n');
    }

    /// One sample per state of `states`: 1 for `now`, 0 for the others (drbd-reactor's
    /// enums: the state is a label named like the metric).
    fn states<S: PartialEq + AsRef<str>>(&mut self, f: F, labels: &str, states: &[S], now: &S) {
        let name = FAMILIES[f as usize].0;
        let b = self.body(f);
        for s in states {
            b.push_str(name);
            b.push('{');
            b.push_str(labels);
            b.push(',');
            b.push_str(name);
            b.push_str("=\"");
            b.push_str(s.as_ref());
            b.push_str(if s == now { "\"} 1\n" } else { "\"} 0\n" });
        }
    }

    /// One resource's samples.
    pub fn resource(&mut self, st: &ResourceStatus, c: &ResourceCounters<'_>) {
        self.resources += 1;
        let name = escape(&st.name);
        let res = format!("name=\"{name}\"");
        let role = if st.not_attached.is_some() {
            Role::Unknown
        } else {
            st.role
        };
        self.states(F::ROLE, &res, &ROLES, &role);
        let no_quorum = st
            .volumes
            .iter()
            .any(|v| v.quorum.is_some_and(|q| !q.quorate));
        let suspended = c.suspends_without_quorum && st.role == Role::Primary && no_quorum;
        self.sample(F::SUSPENDED, &res, u8::from(suspended));
        self.sample(F::NOT_ATTACHED, &res, u8::from(st.not_attached.is_some()));
        self.sample(F::IN_FLIGHT, &res, st.app_in_flight);
        if let Some(io) = c.io {
            for (op, h) in OPS.iter().zip(io) {
                let labels = format!("{res},op=\"{}\"", op.label());
                self.sample(F::RES_REQUESTS, &labels, h.count());
                self.sample(F::RES_SECONDS, &labels, h.sum().as_secs_f64());
                self.io[*op as usize].merge(h);
            }
        }
        for (i, v) in st.volumes.iter().enumerate() {
            let vc = c.volumes.get(i).copied().unwrap_or_default();
            let dev = format!("{res},volume=\"{}\"", v.volume);
            self.states(F::DEV_STATE, &dev, &OWN_DISKS, &v.disk);
            self.sample(F::DEV_CLIENT, &dev, u8::from(vc.client));
            let unintentional = !vc.client && v.disk == Disk::Diskless;
            self.sample(F::DEV_UNINTENTIONAL, &dev, u8::from(unintentional));
            // Without quorum configured DRBD says it has one.
            self.sample(
                F::DEV_QUORUM,
                &dev,
                u8::from(v.quorum.is_none_or(|q| q.quorate)),
            );
            self.sample(F::DEV_SIZE, &dev, v.size);
            self.sample(F::DEV_READ, &dev, vc.read_bytes);
            self.sample(F::DEV_WRITTEN, &dev, vc.written_bytes);
            self.sample(F::DEV_WRITES_IN_FLIGHT, &dev, v.writes_in_flight);
        }
        for (j, p) in st.peers.iter().enumerate() {
            self.connection(&res, p, c.peers.get(j));
        }
    }

    /// A connection's samples and its peer devices'.
    fn connection(&mut self, res: &str, p: &PeerStatus, pc: Option<&PeerCounters<'_>>) {
        let conn = format!(
            "{res},conn_name=\"{}\",peer_node_id=\"{}\"",
            escape(&p.name),
            p.node_id
        );
        // DRBD's connection after a split brain is StandAlone; tandem says why apart.
        let state = match p.connection {
            Connection::Connected => "Connected",
            Connection::Connecting => "Connecting",
            Connection::StandAlone | Connection::SplitBrain => "StandAlone",
        };
        self.states(F::CONN_STATE, &conn, &CONNECTIONS, &state);
        let split = p.connection == Connection::SplitBrain;
        self.sample(F::CONN_SPLIT_BRAIN, &conn, u8::from(split));
        self.states(F::CONN_PEER_ROLE, &conn, &ROLES, &p.role);
        self.sample(F::CONN_UNACKED, &conn, p.unacked);
        for (v, pv) in p.volumes.iter().enumerate() {
            let pd = format!("{conn},volume=\"{}\"", pv.volume);
            let (sent, received) = pc
                .and_then(|pc| pc.bytes.get(v))
                .copied()
                .unwrap_or_default();
            self.sample(F::PD_OUT_OF_SYNC, &pd, pv.out_of_sync_kib * 1024);
            self.sample(F::PD_SENT, &pd, sent);
            self.sample(F::PD_RECEIVED, &pd, received);
            let repl = pv.replication;
            self.states(F::PD_REPL, &pd, &REPLICATIONS, &repl);
            self.states(F::PD_PEER_DISK, &pd, &PEER_DISKS, &pv.peer_disk);
            if let Some(rs) = &pv.resync {
                let labels = format!("{pd},direction=\"{repl}\"");
                if let Some(rate) = rs.rate_kib_s {
                    self.sample(F::RESYNC_RATE, &labels, rate * 1024);
                }
                self.sample(F::RESYNC_LEFT, &labels, rs.left_kib * 1024);
                self.sample(F::RESYNC_DONE, &labels, rs.done_kib * 1024);
            }
        }
        if let Some(h) = pc.and_then(|pc| pc.round_trips) {
            match self.rtt.iter_mut().find(|(n, _)| *n == p.name) {
                Some((_, sum)) => sum.merge(h),
                None => self.rtt.push((p.name.clone(), h.clone())),
            }
        }
    }

    fn histogram(&mut self, f: F, labels: &str, h: &Histogram) {
        let name = FAMILIES[f as usize].0;
        let b = &mut self.bodies[f as usize];
        let mut seen = 0;
        for (i, n) in h.counts[..BUCKETS].iter().enumerate() {
            seen += n;
            let le = Histogram::bound(i);
            let _ = writeln!(b, "{name}_bucket{{{labels},le=\"{le}\"}} {seen}");
        }
        let count = h.count();
        let _ = writeln!(b, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(b, "{name}_sum{{{labels}}} {}", h.sum().as_secs_f64());
        let _ = writeln!(b, "{name}_count{{{labels}}} {count}");
    }

    /// The whole text, in pieces to send one after the other: each family's help and
    /// type, then its samples (moved, not copied: 3.7 MB for 1000 resources).
    /// `last_build`: how long the previous scrape took to build.
    pub fn finish(mut self, last_build: Duration) -> Vec<Vec<u8>> {
        let up = FAMILIES[F::UP as usize].0;
        let _ = writeln!(self.body(F::UP), "{up} 1");
        let version = concat!("version=\"", env!("CARGO_PKG_VERSION"), "\"");
        self.sample(F::BUILD, version, 1);
        let n = self.resources;
        let resources = FAMILIES[F::RESOURCES as usize].0;
        let _ = writeln!(self.body(F::RESOURCES), "{resources} {n}");
        let io = std::mem::take(&mut self.io);
        for (op, h) in OPS.iter().zip(&io) {
            self.histogram(F::IO, &format!("op=\"{}\"", op.label()), h);
        }
        let mut rtt = std::mem::take(&mut self.rtt);
        rtt.sort_by(|a, b| a.0.cmp(&b.0));
        for (peer, h) in &rtt {
            self.histogram(F::RTT, &format!("conn_name=\"{}\"", escape(peer)), h);
        }
        let build = FAMILIES[F::BUILD_SECONDS as usize].0;
        let secs = last_build.as_secs_f64();
        let _ = writeln!(self.body(F::BUILD_SECONDS), "{build} {secs}");
        let mut out = Vec::with_capacity(2 * FAMILIES.len());
        for (Family(name, kind, help), body) in FAMILIES.iter().zip(self.bodies) {
            out.push(format!("# HELP {name} {help}\n# TYPE {name} {kind}\n").into_bytes());
            out.push(body.into_bytes());
        }
        out
    }
}

/// A label value as the format wants it (names are `[A-Za-z0-9_.-]`, so usually as is).
fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['\\', '"', '\n']) {
        return s.into();
    }
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control_api::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_holds_it() {
        let mut h = Histogram::default();
        for us in [0, 1, 16] {
            h.observe(Duration::from_micros(us));
        }
        // Just over 16 µs: the 32 µs bucket.
        h.observe(Duration::from_nanos(16_001));
        h.observe(Duration::from_micros(32));
        h.observe(Duration::from_micros(33));
        h.observe(Duration::from_secs(3600));
        assert_eq!(h.counts[0], 3);
        assert_eq!(h.counts[1], 2);
        assert_eq!(h.counts[2], 1);
        assert_eq!(h.counts[BUCKETS], 1);
        assert_eq!(h.count(), 7);
        assert_eq!(Histogram::bound(0), 0.000016);
        assert_eq!(Histogram::bound(BUCKETS - 1), 8.388608);
    }

    fn status() -> ResourceStatus {
        ResourceStatus {
            name: "r0".into(),
            node_id: 0,
            role: Role::Primary,
            app_in_flight: 2,
            nbd_clients: 1,
            volumes: vec![VolumeStatus {
                volume: 0,
                disk: Disk::UpToDate,
                size: 1 << 20,
                writes_in_flight: 1,
                resync_remaining_kib: None,
                resync: None,
                up_to_date_within_reach: true,
                quorum: None,
            }],
            peers: vec![PeerStatus {
                name: "beta".into(),
                node_id: 1,
                connection: Connection::Connected,
                role: Role::Secondary,
                unacked: 0,
                last_error: None,
                split_brain: None,
                split_brain_resolved: None,
                volumes: vec![PeerVolumeStatus {
                    volume: 0,
                    peer_disk: Disk::Inconsistent,
                    replication: Replication::SyncSource,
                    out_of_sync_kib: 8,
                    resync: Some(ResyncProgress {
                        peer: Some("beta".into()),
                        done_kib: 4,
                        left_kib: 8,
                        percent: 33.3,
                        rate_kib_s: Some(2),
                        eta_s: Some(4),
                    }),
                }],
            }],
            not_attached: None,
        }
    }

    #[test]
    fn a_resource_reads_as_drbd_reactor_writes_it() {
        let mut e = Exposition::new();
        let mut io: [Histogram; 3] = Default::default();
        io[1].observe(Duration::from_micros(100));
        let mut rtt = Histogram::default();
        rtt.observe(Duration::from_micros(50));
        e.resource(
            &status(),
            &ResourceCounters {
                volumes: vec![VolumeCounters {
                    read_bytes: 4096,
                    written_bytes: 8192,
                    client: false,
                }],
                peers: vec![PeerCounters {
                    bytes: vec![(1000, 2000)],
                    round_trips: Some(&rtt),
                }],
                io: Some(&io),
                suspends_without_quorum: false,
            },
        );
        let text = String::from_utf8(e.finish(Duration::from_millis(2)).concat()).unwrap();
        for line in [
            "# TYPE drbd_resource_role gauge",
            "drbd_resource_role{name=\"r0\",drbd_resource_role=\"Primary\"} 1",
            "drbd_resource_role{name=\"r0\",drbd_resource_role=\"Secondary\"} 0",
            "drbd_device_state{name=\"r0\",volume=\"0\",drbd_device_state=\"UpToDate\"} 1",
            "drbd_device_written_bytes_total{name=\"r0\",volume=\"0\"} 8192",
            "drbd_device_quorum{name=\"r0\",volume=\"0\"} 1",
            "drbd_connection_state{name=\"r0\",conn_name=\"beta\",peer_node_id=\"1\",drbd_connection_state=\"Connected\"} 1",
            "drbd_peerdevice_outofsync_bytes{name=\"r0\",conn_name=\"beta\",peer_node_id=\"1\",volume=\"0\"} 8192",
            "drbd_peerdevice_sent_bytes{name=\"r0\",conn_name=\"beta\",peer_node_id=\"1\",volume=\"0\"} 1000",
            "tandem_peerdevice_replication_state{name=\"r0\",conn_name=\"beta\",peer_node_id=\"1\",volume=\"0\",tandem_peerdevice_replication_state=\"SyncSource\"} 1",
            "tandem_resync_bytes_per_second{name=\"r0\",conn_name=\"beta\",peer_node_id=\"1\",volume=\"0\",direction=\"SyncSource\"} 2048",
            "tandem_io_duration_seconds_bucket{op=\"write\",le=\"0.000064\"} 0",
            "tandem_io_duration_seconds_bucket{op=\"write\",le=\"0.000128\"} 1",
            "tandem_io_duration_seconds_count{op=\"write\"} 1",
            "tandem_replication_round_trip_seconds_bucket{conn_name=\"beta\",le=\"+Inf\"} 1",
            "tandem_resource_requests_total{name=\"r0\",op=\"write\"} 1",
            "drbd_resource_resources 1",
            "drbdreactor_up 1",
            "tandem_metrics_build_seconds 0.002",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        // Each family once, its samples together.
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
