//! The tandem resource configuration file.
//!
//! One TOML file per resource, **the same file on every node** (each node finds its own
//! `[[node]]` table by name). [`load`] reads, parses and validates a file; [`load_dir`] does that
//! for every `*.toml` file in a directory (e.g. `/etc/tandem/`). The result is plain data
//! ([`ResourceConfig`]); this crate does no I/O beyond reading the file and its secret file.
//!
//! # Format
//!
//! Keys are kebab-case and **an unknown key is an error** (a typo never silently falls back to a
//! default).
//!
//! ## `[resource]` (required)
//! | key | value |
//! |---|---|
//! | `name` | required; `[A-Za-z0-9_.-]{1,64}` |
//! | `protocol` | `"A"` (async), `"B"` (peer received), `"C"` (peer wrote; default) |
//! | `shared-secret` | the peers' shared secret; non-empty |
//! | `shared-secret-file` | instead of `shared-secret`: a file holding it (relative paths are relative to the configuration file's directory; trailing newlines are removed; must not be empty) |
//! | `quorum` | `"off"`, `"majority"`, `"all"` or a number of replicas: a Primary completes I/O only while it reaches that many of the nodes keeping a replica of each volume (itself included; with an even number, a partition one short that reaches most diskless nodes keeps a quorum it held); a node without it cannot be promoted. Default `"majority"` with three nodes or more, `"off"` with two |
//! | `quorum-minimum-redundancy` | `"off"` (default), `"majority"`, `"all"` or a number: also that many *up-to-date* replicas reached |
//! | `on-no-quorum` | `"io-error"` (default: a Primary without quorum fails I/O with EIO, including writes in flight, which are not acknowledged) or `"suspend-io"` (requests that arrive without quorum wait and go on when it returns; writes in flight when it went, done on a minority, still fail) |
//! | `after-sb-0pri` | split brain found with neither node Primary (DRBD's names): `"disconnect"` (default: both keep their data, the connection stops until an administrator acts), `"discard-younger-primary"` (the node that was not Primary when the two lost each other discards its changes), `"discard-older-primary"` (the one that was Primary then discards), both falling back to `discard-least-changes` when neither or both were; `"discard-zero-changes"` (a node that changed nothing discards; both changed: disconnect), `"discard-least-changes"` (the node with fewer changed blocks discards; a tie keeps the lower node-id's data) |
//! | `after-sb-1pri` | split brain with one node Primary: `"disconnect"` (default), `"consensus"` (the `after-sb-0pri` verdict if it discards the Secondary's changes, else disconnect), `"discard-secondary"` (the Secondary discards its changes) |
//! | `after-sb-2pri` | split brain with both Primary: `"disconnect"`, the only value (a Primary's data is never discarded) |
//! | `tls` | TLS on the peer links (TLS 1.3), the same on every node: `"off"` (default), `"certificates"` (mutual X.509: each node shows its `tls-certificate`, which `tls-ca` must have signed and whose subject alternative names must hold the node's `name` (a DNS name) or its `address`'s IP; every node needs `tls-certificate` and `tls-key`), `"secret"` (no certificate files: each node makes a throwaway self-signed certificate at start, and the shared secret's challenge-response, bound to the TLS channel, authenticates both ends, so a man in the middle cannot relay it). A node refuses a peer whose `tls` differs |
//! | `tls-ca` | with `tls = "certificates"` (and only then): the CA certificate(s), PEM, that sign the nodes' certificates; relative to the configuration file's directory |
//!
//! Exactly one of `shared-secret` and `shared-secret-file` must be set.
//!
//! ## `[net]` (optional, every key optional)
//! | key | default | meaning |
//! |---|---|---|
//! | `connect-interval` | `"1s"` | how often a peer that does not answer is dialed (both ends dial) |
//! | `max-connect-interval` | `"10s"` | a peer that answers and refuses (StandAlone, wrong secret) is dialed at a doubling interval up to this; `>= connect-interval` |
//! | `ping-interval` | `"1s"` | keepalive sent when the connection is idle |
//! | `ping-timeout` | `"500ms"` | a ping not answered in this time drops the connection to or from the Primary while the peer owes no answer: a dead or cut-off peer is found within `ping-interval + ping-timeout`; `< ping-interval` |
//! | `timeout` | `"6s"` | a replicated write not acknowledged in this time drops the connection; so does a ping not answered in this time from a peer that owes answers (writes, barriers, reads, resync requests: a busy peer, its disk slow or its process stalled, is not taken for a dead one) or on a link between two non-Primary nodes; `> ping-timeout` |
//! | `max-buffer` | `"64M"` | per-peer bytes queued for sending before writers wait; `>= 1M` |
//! | `resync-min-rate` | `"32M"` | bytes per second a resync starts at while the application writes to the volume, and never goes below (it always finishes); from there the controller steers it (see `resync-plan-ahead`); `"0"`: not held back |
//! | `resync-max-rate` | `"0"` | bytes per second a resync never exceeds; `"0"`: unlimited (as fast as the link and disks go with 2 MiB in flight) |
//! | `resync-plan-ahead` | `"500ms"` | while the application writes, a controller sets the resync's rate every 100 ms from what arrived and what is in flight, steering the bytes in flight toward `resync-fill-target` or `resync-delay-target`; it spreads each correction over this time (DRBD's c-plan-ahead; longer is smoother and slower); a multiple of `100ms`, at most `30s`; `"0s"`: no controller, the rate under load is `resync-min-rate` |
//! | `resync-fill-target` | `"0"` | bytes the controller keeps in flight (DRBD's c-fill-target; about twice the link's bandwidth-delay product); at most `512M`; `"0"`: use `resync-delay-target` |
//! | `resync-delay-target` | `"20ms"` | without a fill target, the controller keeps this long's worth of the resync's rate in flight, so its requests, and the application's writes queued behind them, wait about this long (DRBD's c-delay-target); set it above the link's round trip plus one 256 KiB request's transfer time, or the resync stays near `resync-min-rate` under load; `1ms..=10s` |
//!
//! Durations are strings: a whole number and a unit, `ns`, `us`, `ms`, `s` or `m` (minutes), e.g.
//! `"500ms"` ([`parse_duration`]); a bare integer is an error. Every duration is `> 0` and
//! `< 1 hour`. Sizes are a string with an optional binary suffix `K`, `M`, `G`, `T` (e.g. `"64M"`)
//! or an integer number of bytes ([`parse_size`]).
//!
//! ## `[[volume]]` (one or more)
//! | key | value |
//! |---|---|
//! | `number` | `0..=65534`, unique |
//! | `size` | a size, `> 0` and a multiple of 4096 |
//!
//! ## `[[node]]` (2 to 32)
//! | key | value |
//! |---|---|
//! | `name` | unique, `[A-Za-z0-9_.-]{1,64}`; matched against the node's own name |
//! | `node-id` | `0..=31`, unique |
//! | `address` | replication address: IP literal and port (`"10.0.0.1:7789"`, `"[fd00::1]:7789"`), unique |
//! | `nbd-tls` | TLS for this node's NBD endpoints of the resource (`NBD_OPT_STARTTLS`, X.509): `"off"` (default), `"on"` (clients that ask get TLS, others are served in the clear) or `"require"` (a client must start TLS before anything else); needs `tls-certificate` and `tls-key` |
//! | `tls-certificate` | the node's certificate chain, PEM, leaf first (its subject alternative names must hold the host names or addresses clients use; with the resource's `tls = "certificates"` also the node's `name` or its `address`'s IP, and it serves as both TLS server and client: no extended key usage, or both serverAuth and clientAuth); relative paths are relative to the configuration file's directory |
//! | `tls-key` | its private key, PEM (PKCS#8, PKCS#1 or SEC1); set with `tls-certificate` |
//! | `nbd-tls-client-ca` | optional, with `nbd-tls`: NBD clients must present a certificate this CA (PEM) signed (mutual authentication); without it any client may connect |
//! | `metrics` | optional: where this node serves Prometheus metrics over HTTP (`GET /metrics`), IP literal and port, e.g. `"127.0.0.1:9942"`; off when no file sets it. It is the node's, not the resource's: one endpoint serves all the node's resources, so the files that set it for a node must name the same address ([`node_metrics`]; `tandem node --metrics` overrides them) |
//!
//! Each node has one `[[node.volume]]` table for **every** `[[volume]]` (no missing, no duplicate,
//! no unknown numbers):
//!
//! | key | value |
//! |---|---|
//! | `number` | the `[[volume]]` it configures |
//! | `disk` | absolute path of the backing file or block device, or `"none"` for a diskless client; a node may not use one disk for two volumes |
//! | `meta-disk` | where the volume's metadata lives: `"internal"` (default: at the end of the backing file or device, which must hold the volume plus the metadata), `"/path"` (a file or device of its own) or `"pmem:/path"` (a file on persistent memory, memory-mapped); not with `disk = "none"`; absolute paths, not used twice on a node |
//! | `al-extents` | activity-log extents of 4 MiB: `7..=65534`, default 1237 (≈ 4.8 GiB of recently written area resynced after a crash of this node); not with `disk = "none"` |
//! | `max-peers` | bitmap slots this replica's metadata is created with, `1..=31`, at least the other diskful nodes of the volume; default: exactly those. Each spare slot costs 32 MiB of metadata per TiB of volume and lets a diskful node be added to the resource later without `tandem create-md --force` (and the full resync it means); read when the metadata is created, not later; not with `disk = "none"` |
//! | `nbd` | NBD endpoints this node serves the volume on: `"unix:<absolute path>"` or `"tcp:<ip>:<port>"`; may be empty or absent; an endpoint is used at most once per node |
//!
//! Every volume needs at least one node with a disk.
//!
//! # Errors
//!
//! The first problem found is returned as a [`ConfigError`] whose `Display` names the file, the key
//! path and what is wrong, e.g.
//! `r0.toml: node[1] (beta).node-id: node-id 0 is already used by node[0] (alpha)`.
//! Syntax and shape errors (bad TOML, unknown key, wrong type) carry the line and column:
//! `r0.toml:9:1: unknown field `speed`, expected ...`.
//!
//! # Example (`example/r0.toml`)
//!
//! Three nodes: `alpha` and `beta` keep replicas, `gamma` is a diskless client.
//!
#![doc = concat!("```toml\n", include_str!("../example/r0.toml"), "```")]
//!
//! ```
//! let text = include_str!("../example/r0.toml");
//! let cfg = tandem_config::parse(text, std::path::Path::new("r0.toml")).unwrap();
//! assert_eq!(cfg.name, "r0");
//! assert!(cfg.node("gamma").unwrap().volumes[0].disk.is_none());
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

mod error;
mod raw;
mod units;
mod validate;

pub use error::ConfigError;
pub use units::{parse_duration, parse_size};

/// One resource, as configured. Vectors keep the file's order, except that every node's
/// `volumes` is in the order of [`ResourceConfig::volumes`] (so `node.volumes[i]` configures
/// `volumes[i]`).
#[derive(Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    pub name: String,
    pub protocol: Protocol,
    /// The shared secret (from `shared-secret` or the contents of `shared-secret-file`).
    pub secret: Vec<u8>,
    pub net: NetConfig,
    pub volumes: Vec<VolumeConfig>,
    pub nodes: Vec<NodeConfig>,
    /// Quorum: `quorum`, `quorum-minimum-redundancy`, `on-no-quorum`.
    pub quorum: QuorumConfig,
    /// `after-sb-0pri`, `after-sb-1pri`, `after-sb-2pri`.
    pub after_sb: AfterSplitBrain,
    /// `tls`: TLS on the peer links.
    pub tls: PeerTls,
    /// `tls-ca` (set exactly when `tls` is `Certificates`), made absolute.
    pub tls_ca: Option<PathBuf>,
    /// The file this configuration was read from.
    pub path: PathBuf,
}

/// How many replicas (votes, or up-to-date ones) a partition needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Votes {
    Off,
    Majority,
    All,
    Count(u8),
}

impl fmt::Display for Votes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Votes::Off => f.write_str("off"),
            Votes::Majority => f.write_str("majority"),
            Votes::All => f.write_str("all"),
            Votes::Count(n) => write!(f, "{n}"),
        }
    }
}

/// What a Primary without quorum does with application I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnNoQuorum {
    IoError,
    SuspendIo,
}

/// The resource's quorum settings (see the `[resource]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumConfig {
    pub quorum: Votes,
    pub minimum_redundancy: Votes,
    pub on_no_quorum: OnNoQuorum,
}

/// `after-sb-0pri`: a split brain found while neither node is Primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterSb0Pri {
    #[default]
    Disconnect,
    DiscardYoungerPrimary,
    DiscardOlderPrimary,
    DiscardZeroChanges,
    DiscardLeastChanges,
}

/// `after-sb-1pri`: a split brain found while one of the two nodes is Primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterSb1Pri {
    #[default]
    Disconnect,
    Consensus,
    DiscardSecondary,
}

/// `after-sb-2pri`: both Primary. Only `disconnect` (a Primary never discards its data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterSb2Pri {
    #[default]
    Disconnect,
}

/// The after-split-brain policies (see the `[resource]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AfterSplitBrain {
    pub zero: AfterSb0Pri,
    pub one: AfterSb1Pri,
    pub two: AfterSb2Pri,
}

/// Redacts the secret.
impl fmt::Debug for ResourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceConfig")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field(
                "secret",
                &format_args!("<{} bytes, redacted>", self.secret.len()),
            )
            .field("net", &self.net)
            .field("volumes", &self.volumes)
            .field("nodes", &self.nodes)
            .field("quorum", &self.quorum)
            .field("after_sb", &self.after_sb)
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca)
            .field("path", &self.path)
            .finish()
    }
}

impl ResourceConfig {
    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The node with node-id `id`.
    pub fn node_by_id(&self, id: u8) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.node_id == id)
    }

    /// The volume numbered `number`.
    pub fn volume(&self, number: u16) -> Option<&VolumeConfig> {
        self.volumes.iter().find(|v| v.number == number)
    }
}

/// Replication protocol: when a peer's part of a write counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    /// Asynchronous: the write is in the local send buffer.
    A,
    /// Memory-synchronous: the peer acknowledged receipt.
    B,
    /// Synchronous: the peer acknowledged that its write completed.
    #[default]
    C,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::A => "A",
            Protocol::B => "B",
            Protocol::C => "C",
        })
    }
}

/// The `[net]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// How often a peer that does not answer is dialed.
    pub connect_interval: Duration,
    /// Longest wait before dialing again a peer that answered and refused (the wait
    /// doubles from `connect_interval`).
    pub max_connect_interval: Duration,
    /// Keepalive when idle.
    pub ping_interval: Duration,
    /// A ping not answered in this time drops a connection to or from the Primary on
    /// which the peer owes no answer.
    pub ping_timeout: Duration,
    /// A replicated write not acknowledged in this time drops the connection; so does a
    /// ping not answered in this time from a peer that owes answers, or between two
    /// non-Primary nodes (see the table above).
    pub timeout: Duration,
    /// Per-peer bytes queued for sending before writers wait (back-pressure).
    pub max_buffer: u64,
    /// Bytes per second a resync gets while the application writes (0: not held back).
    pub resync_min_rate: u64,
    /// Bytes per second a resync never exceeds (0: unlimited).
    pub resync_max_rate: u64,
    /// The resync controller spreads its corrections over this (a multiple of 100 ms; 0:
    /// no controller, a resync under load goes at `resync_min_rate`).
    pub resync_plan_ahead: Duration,
    /// Bytes a resync under load keeps in flight (0: derived from `resync_delay_target`).
    pub resync_fill_target: u64,
    /// Without a fill target, a resync under load keeps this long's worth of its rate in
    /// flight: about how long its requests wait to be answered.
    pub resync_delay_target: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            connect_interval: Duration::from_secs(1),
            max_connect_interval: Duration::from_secs(10),
            ping_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(6),
            max_buffer: 64 << 20,
            resync_min_rate: 32 << 20,
            resync_max_rate: 0,
            resync_plan_ahead: Duration::from_millis(500),
            resync_fill_target: 0,
            resync_delay_target: Duration::from_millis(20),
        }
    }
}

/// A `[[volume]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeConfig {
    pub number: u16,
    /// Size in bytes, a multiple of 4096.
    pub size: u64,
}

/// A `[[node]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: String,
    pub node_id: u8,
    /// Replication address.
    pub address: SocketAddr,
    /// Where this node serves Prometheus metrics (`metrics`): a setting of the node, not
    /// of the resource, so every file that sets it for the node must agree
    /// ([`node_metrics`]).
    pub metrics: Option<SocketAddr>,
    /// Its certificate and key, and TLS for its NBD clients.
    pub tls: NodeTls,
    /// One entry per [`ResourceConfig::volumes`], in the same order.
    pub volumes: Vec<NodeVolume>,
}

/// `tls`: TLS on a resource's peer links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PeerTls {
    /// In the clear (the shared secret's challenge-response authenticates peers).
    #[default]
    Off,
    /// Mutual X.509 with the nodes' `tls-certificate`s, signed by `tls-ca`.
    Certificates,
    /// Throwaway self-signed certificates; the challenge-response over the shared secret,
    /// bound to the TLS channel, authenticates.
    Secret,
}

impl fmt::Display for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerTls::Off => "off",
            PeerTls::Certificates => "certificates",
            PeerTls::Secret => "secret",
        })
    }
}

/// `nbd-tls`: what a node's NBD endpoints of the resource offer of TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NbdTls {
    /// No TLS (`NBD_OPT_STARTTLS` refused).
    #[default]
    Off,
    /// TLS for clients that ask (STARTTLS); the others are served in the clear.
    On,
    /// TLS only: a client must start TLS before any other option.
    Require,
}

/// A node's TLS settings (`[[node]]`): file paths, made absolute (relative ones are
/// relative to the configuration file's directory). The files are read by the daemon at
/// start, not here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTls {
    /// `nbd-tls`.
    pub nbd: NbdTls,
    /// `tls-certificate`: the node's certificate chain (PEM), leaf first.
    pub certificate: Option<PathBuf>,
    /// `tls-key`: its private key (PEM).
    pub key: Option<PathBuf>,
    /// `nbd-tls-client-ca`: NBD clients must present a certificate this CA signed.
    pub nbd_client_ca: Option<PathBuf>,
}

impl NodeConfig {
    /// This node's settings for volume `number`.
    pub fn volume(&self, number: u16) -> Option<&NodeVolume> {
        self.volumes.iter().find(|v| v.number == number)
    }
}

/// A `[[node.volume]]`: one node's settings for one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVolume {
    pub number: u16,
    /// Backing file or block device; `None` = diskless client (`disk = "none"`).
    pub disk: Option<PathBuf>,
    /// Where the volume's metadata lives (only with a disk).
    pub meta: MetaDisk,
    /// Activity-log extents (4 MiB each) the metadata holds (`al-extents`).
    pub al_extents: u32,
    /// Bitmap slots the metadata is created with (`max-peers`); `None`: one per other
    /// diskful node of the volume. Spare slots let a diskful node join later without
    /// remaking this replica's metadata.
    pub max_peers: Option<u8>,
    /// NBD endpoints this node serves the volume on.
    pub nbd: Vec<Endpoint>,
}

impl NodeVolume {
    pub fn is_diskless(&self) -> bool {
        self.disk.is_none()
    }
}

/// Where a volume's metadata lives (`meta-disk`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaDisk {
    /// At the end of the backing file or device (`"internal"`, the default): the file
    /// tandem creates is that much larger than the volume; a device must be.
    Internal,
    /// A file or device of its own (`"/path"`).
    External(PathBuf),
    /// A file on persistent memory, memory-mapped (`"pmem:/path"`): updates are stores
    /// and cache-line write-backs, no syscall.
    Pmem(PathBuf),
}

/// `al-extents` when not set: DRBD's default (about 4.8 GiB of hot area).
pub const DEFAULT_AL_EXTENTS: u32 = 1237;

/// An NBD listening endpoint: `unix:<absolute path>` or `tcp:<ip>:<port>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// Longest unix socket path that fits `sockaddr_un.sun_path` with its terminating NUL.
const MAX_UNIX_PATH: usize = 107;

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let not = || format!("{s:?} is not tcp:<ip>:<port> or unix:<absolute path>");
        if let Some(p) = s.strip_prefix("unix:") {
            if !Path::new(p).is_absolute() {
                return Err(format!("{} (the socket path must be absolute)", not()));
            }
            if p.len() > MAX_UNIX_PATH {
                return Err(format!(
                    "{s:?}: the socket path is longer than {MAX_UNIX_PATH} bytes"
                ));
            }
            Ok(Endpoint::Unix(PathBuf::from(p)))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            let addr: SocketAddr = a.parse().map_err(|_| not())?;
            if addr.port() == 0 {
                return Err(format!("{s:?}: port 0 is not allowed"));
            }
            Ok(Endpoint::Tcp(addr))
        } else {
            Err(not())
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// Reads, parses and validates the resource configuration file at `path`.
pub fn load(path: &Path) -> Result<ResourceConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    parse(&text, path)
}

/// Parses and validates `text`. `path` is used in error messages, to resolve a relative
/// `shared-secret-file`, and is stored in [`ResourceConfig::path`].
pub fn parse(text: &str, path: &Path) -> Result<ResourceConfig, ConfigError> {
    let raw: raw::RawFile = toml::from_str(text).map_err(|e| syntax_error(&e, text, path))?;
    validate::validate(raw, path)
}

fn syntax_error(e: &toml::de::Error, text: &str, path: &Path) -> ConfigError {
    let (line, column) = match e.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let before = &text[..start];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            (
                Some(before.matches('\n').count() + 1),
                Some(before[line_start..].chars().count() + 1),
            )
        }
        None => (None, None),
    };
    ConfigError::Syntax {
        path: path.to_owned(),
        line,
        column,
        message: e.message().trim_end().replace('\n', "; "),
    }
}

/// Loads every `*.toml` file in `dir` (not recursively), in file-name order. Two files that
/// define the same resource name are an error.
pub fn load_dir(dir: &Path) -> Result<Vec<ResourceConfig>, ConfigError> {
    check_dir(dir)?.into_iter().map(|(_, r)| r).collect()
}

/// The metrics address of node `node` (its `metrics` key) across its resources: `None`
/// if no file sets it; an error naming the file and key of the first that disagrees with
/// an earlier one (a node serves one endpoint for all its resources).
pub fn node_metrics(
    configs: &[ResourceConfig],
    node: &str,
) -> Result<Option<SocketAddr>, ConfigError> {
    let mut first: Option<(SocketAddr, &Path)> = None;
    for cfg in configs {
        let Some((i, n)) = cfg.nodes.iter().enumerate().find(|(_, n)| n.name == node) else {
            continue;
        };
        let Some(addr) = n.metrics else { continue };
        match first {
            None => first = Some((addr, &cfg.path)),
            Some((a, _)) if a == addr => {}
            Some((a, path)) => {
                return Err(ConfigError::Invalid {
                    path: cfg.path.clone(),
                    key: format!("node[{i}] ({node}).metrics"),
                    message: format!(
                        "{addr} differs from {a} in {}: node {node} serves one metrics endpoint for all its resources",
                        path.display()
                    ),
                })
            }
        }
    }
    Ok(first.map(|(a, _)| a))
}

/// A resource file and what it holds, or what is wrong with it.
pub type Checked = (PathBuf, Result<ResourceConfig, ConfigError>);

/// Every `*.toml` file in `dir` (not recursively), in file-name order, each with its
/// resource or its error (a resource name defined by an earlier file is one): all the
/// errors at once, for `tandem check`. Only a directory that cannot be read fails whole.
pub fn check_dir(dir: &Path) -> Result<Vec<Checked>, ConfigError> {
    let read_dir_err = |error| ConfigError::ReadDir {
        path: dir.to_owned(),
        error,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir_err)? {
        let path = entry.map_err(read_dir_err)?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();

    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let loaded = load(&file).and_then(|cfg| match seen.get(&cfg.name) {
            Some(first) => Err(ConfigError::Invalid {
                path: file.clone(),
                key: "resource.name".into(),
                message: format!(
                    "resource {:?} is already defined in {}",
                    cfg.name,
                    first.display()
                ),
            }),
            None => {
                seen.insert(cfg.name.clone(), file.clone());
                Ok(cfg)
            }
        });
        out.push((file, loaded));
    }
    Ok(out)
}
