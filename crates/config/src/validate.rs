//! Turns the loosely typed [`RawFile`] into a [`ResourceConfig`], checking every rule and naming
//! the key path of the first value that breaks one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::raw::{RawFile, RawNet, RawNode, RawResource, Scalar};
use crate::{
    parse_duration, parse_size, AfterSb0Pri, AfterSb1Pri, AfterSb2Pri, AfterSplitBrain,
    ConfigError, Endpoint, NbdTls, NetConfig, NodeConfig, NodeTls, NodeVolume, OnNoQuorum, PeerTls,
    Protocol, QuorumConfig, ResourceConfig, VolumeConfig, Votes,
};

/// Limits, also documented in the crate docs.
pub(crate) const MIN_NODES: usize = 2;
pub(crate) const MAX_NODES: usize = 32;
pub(crate) const MAX_NODE_ID: i64 = 31;
pub(crate) const MAX_VOLUME_NUMBER: i64 = 65534;
pub(crate) const BLOCK: u64 = 4096;
pub(crate) const MIN_MAX_BUFFER: u64 = 1 << 20;
/// The resync controller's step, and the limits of its settings (DRBD's).
const RESYNC_STEP: Duration = Duration::from_millis(100);
const MAX_PLAN_AHEAD: Duration = Duration::from_secs(30);
const MAX_DELAY_TARGET: Duration = Duration::from_secs(10);
const MAX_FILL_TARGET: u64 = 512 << 20;
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3600);
const MAX_NAME_LEN: usize = 64;

struct Ctx<'a> {
    path: &'a Path,
}

impl Ctx<'_> {
    fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// `[A-Za-z0-9_.-]{1,64}`, and not `.` or `..` (names end up in file names).
pub(crate) fn check_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > MAX_NAME_LEN {
        return Err(format!("{s:?} is longer than {MAX_NAME_LEN} characters"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{s:?} contains {c:?}; only letters, digits, '_', '.' and '-' are allowed"
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("{s:?} is not a usable name"));
    }
    Ok(())
}

pub(crate) fn validate(raw: RawFile, path: &Path) -> Result<ResourceConfig, ConfigError> {
    let cx = Ctx { path };
    let RawFile {
        resource,
        net,
        volume,
        node,
    } = raw;

    check_name(&resource.name).map_err(|m| cx.err("resource.name", m))?;
    let protocol = match resource.protocol.as_deref() {
        None => Protocol::C,
        Some("A") => Protocol::A,
        Some("B") => Protocol::B,
        Some("C") => Protocol::C,
        Some(other) => {
            return Err(cx.err(
                "resource.protocol",
                format!("{other:?} is not a protocol; expected \"A\", \"B\" or \"C\""),
            ))
        }
    };
    let secret = secret(&cx, &resource)?;
    let net = net_config(&cx, net)?;

    // [[volume]]
    if volume.is_empty() {
        return Err(cx.err("volume", "at least one [[volume]] is required"));
    }
    let mut volumes: Vec<VolumeConfig> = Vec::with_capacity(volume.len());
    for (i, v) in volume.into_iter().enumerate() {
        let key = format!("volume[{i}]");
        let number = volume_number(v.number).map_err(|m| cx.err(format!("{key}.number"), m))?;
        if let Some(j) = volumes.iter().position(|o| o.number == number) {
            return Err(cx.err(
                format!("{key}.number"),
                format!("volume number {number} is already used by volume[{j}]"),
            ));
        }
        let size = size(&v.size).map_err(|m| cx.err(format!("{key}.size"), m))?;
        if size == 0 {
            return Err(cx.err(format!("{key}.size"), "must be greater than 0"));
        }
        if size % BLOCK != 0 {
            return Err(cx.err(
                format!("{key}.size"),
                format!("{size} bytes is not a multiple of {BLOCK}"),
            ));
        }
        volumes.push(VolumeConfig { number, size });
    }

    // [[node]]
    if !(MIN_NODES..=MAX_NODES).contains(&node.len()) {
        return Err(cx.err(
            "node",
            format!(
                "{} [[node]] table(s) found; a resource needs {MIN_NODES} to {MAX_NODES} nodes",
                node.len()
            ),
        ));
    }
    let mut nodes: Vec<NodeConfig> = Vec::with_capacity(node.len());
    for (i, n) in node.into_iter().enumerate() {
        nodes.push(node_config(&cx, i, n, &nodes, &volumes)?);
    }

    for (i, v) in volumes.iter().enumerate() {
        let diskful = nodes.iter().any(|n| {
            n.volumes
                .iter()
                .any(|nv| nv.number == v.number && nv.disk.is_some())
        });
        let with_disk = nodes.iter().filter(|n| n.volumes[i].disk.is_some()).count();
        for (j, n) in nodes.iter().enumerate() {
            let Some(m) = n.volumes[i].max_peers else {
                continue;
            };
            let others = with_disk - 1;
            if usize::from(m) < others {
                return Err(cx.err(
                    format!("node[{j}] ({}).volume[{i}].max-peers", n.name),
                    format!(
                        "{m} is fewer than the other diskful nodes of volume {} ({others}): each needs a bitmap slot",
                        v.number
                    ),
                ));
            }
        }
        if !diskful {
            return Err(cx.err(
                format!("volume[{i}]"),
                format!(
                    "no node has a disk for volume {} (all have disk = \"none\"); at least one node must be diskful",
                    v.number
                ),
            ));
        }
    }

    let quorum = quorum_config(&cx, &resource, &nodes, volumes.len())?;
    let after_sb = after_sb(&cx, &resource)?;
    let (tls, tls_ca) = peer_tls(&cx, &resource, &nodes)?;
    Ok(ResourceConfig {
        name: resource.name,
        protocol,
        secret,
        net,
        volumes,
        nodes,
        quorum,
        after_sb,
        tls,
        tls_ca,
        path: path.to_owned(),
    })
}

/// `tls` and `tls-ca`: with certificates, the CA and every node's certificate and key are
/// required (every node dials and is dialed).
fn peer_tls(
    cx: &Ctx,
    r: &RawResource,
    nodes: &[NodeConfig],
) -> Result<(PeerTls, Option<PathBuf>), ConfigError> {
    let tls = match r.tls.as_deref() {
        None | Some("off") => PeerTls::Off,
        Some("certificates") => PeerTls::Certificates,
        Some("secret") => PeerTls::Secret,
        Some(other) => {
            return Err(cx.err(
                "resource.tls",
                format!(
                    "{other:?} is not a TLS mode for peer links; expected \"off\", \"certificates\" or \"secret\""
                ),
            ))
        }
    };
    let ca = match r.tls_ca.as_deref() {
        None => None,
        Some("") => return Err(cx.err("resource.tls-ca", "must not be empty")),
        Some(f) => Some(match cx.path.parent() {
            Some(dir) if Path::new(f).is_relative() => dir.join(f),
            _ => PathBuf::from(f),
        }),
    };
    match (tls, &ca) {
        (PeerTls::Certificates, None) => {
            return Err(cx.err(
                "resource.tls-ca",
                "tls = \"certificates\" needs tls-ca: the CA that signs the nodes' certificates",
            ))
        }
        (PeerTls::Certificates, Some(_)) => {}
        (_, Some(_)) => {
            return Err(cx.err(
                "resource.tls-ca",
                format!(
                    "only with tls = \"certificates\" (tls is \"{tls}\"): set it, or remove tls-ca"
                ),
            ))
        }
        (_, None) => {}
    }
    if tls == PeerTls::Certificates {
        if let Some((i, n)) = (nodes.iter().enumerate()).find(|(_, n)| n.tls.certificate.is_none())
        {
            return Err(cx.err(
                format!("node[{i}] ({}).tls-certificate", n.name),
                "tls = \"certificates\" needs every node's certificate: set tls-certificate and tls-key",
            ));
        }
    }
    Ok((tls, ca))
}

/// `after-sb-0pri`, `after-sb-1pri`, `after-sb-2pri`: DRBD's names, each `disconnect` by
/// default (tandem implements the policies that discard a replica's changes and resync it;
/// DRBD's handler-calling ones have no meaning without handlers).
fn after_sb(cx: &Ctx, r: &RawResource) -> Result<AfterSplitBrain, ConfigError> {
    fn pick<T: Copy + Default>(
        cx: &Ctx,
        key: &str,
        value: &Option<String>,
        known: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let Some(v) = value else {
            return Ok(T::default());
        };
        known
            .iter()
            .find(|(name, _)| name == v)
            .map(|&(_, t)| t)
            .ok_or_else(|| {
                let names: Vec<String> = known.iter().map(|(n, _)| format!("{n:?}")).collect();
                cx.err(
                    format!("resource.{key}"),
                    format!("{v:?} is not a policy; expected {}", names.join(", ")),
                )
            })
    }
    use AfterSb0Pri as Z;
    use AfterSb1Pri as O;
    Ok(AfterSplitBrain {
        zero: pick(
            cx,
            "after-sb-0pri",
            &r.after_sb_0pri,
            &[
                ("disconnect", Z::Disconnect),
                ("discard-younger-primary", Z::DiscardYoungerPrimary),
                ("discard-older-primary", Z::DiscardOlderPrimary),
                ("discard-zero-changes", Z::DiscardZeroChanges),
                ("discard-least-changes", Z::DiscardLeastChanges),
            ],
        )?,
        one: pick(
            cx,
            "after-sb-1pri",
            &r.after_sb_1pri,
            &[
                ("disconnect", O::Disconnect),
                ("consensus", O::Consensus),
                ("discard-secondary", O::DiscardSecondary),
            ],
        )?,
        two: pick(
            cx,
            "after-sb-2pri",
            &r.after_sb_2pri,
            &[("disconnect", AfterSb2Pri::Disconnect)],
        )?,
    })
}

/// `quorum` defaults to `majority` with three nodes or more (diskful ones and diskless
/// tiebreakers), else `off`; `on-no-quorum` to `io-error`.
fn quorum_config(
    cx: &Ctx,
    r: &RawResource,
    nodes: &[NodeConfig],
    volumes: usize,
) -> Result<QuorumConfig, ConfigError> {
    // The fewest nodes keeping a replica of any volume: the voters a count can reach.
    let voters = (0..volumes)
        .map(|i| nodes.iter().filter(|n| n.volumes[i].disk.is_some()).count())
        .min()
        .unwrap_or(0);
    let votes = |key: &str, value: &Option<Scalar>| -> Result<Option<Votes>, ConfigError> {
        let full = format!("resource.{key}");
        let v = match value {
            None => return Ok(None),
            Some(Scalar::Str(s)) if s == "off" => Votes::Off,
            Some(Scalar::Str(s)) if s == "majority" => Votes::Majority,
            Some(Scalar::Str(s)) if s == "all" => Votes::All,
            Some(Scalar::Int(n)) if (1..=MAX_NODES as i64).contains(n) => {
                if *n as usize > voters {
                    return Err(cx.err(
                        full,
                        format!(
                            "{n} is more than the {voters} node(s) keeping a replica of a volume: it could never be met"
                        ),
                    ));
                }
                Votes::Count(*n as u8)
            }
            Some(other) => {
                return Err(cx.err(
                    full,
                    format!(
                        "{} is not a quorum; expected \"off\", \"majority\", \"all\" or a number of nodes (1 to {voters})",
                        match other {
                            Scalar::Str(s) => format!("{s:?}"),
                            Scalar::Int(n) => n.to_string(),
                            Scalar::Float(x) => x.to_string(),
                        }
                    ),
                ))
            }
        };
        Ok(Some(v))
    };
    let default = if nodes.len() >= 3 {
        Votes::Majority
    } else {
        Votes::Off
    };
    let quorum = votes("quorum", &r.quorum)?.unwrap_or(default);
    let minimum_redundancy =
        votes("quorum-minimum-redundancy", &r.quorum_minimum_redundancy)?.unwrap_or(Votes::Off);
    let on_no_quorum = match r.on_no_quorum.as_deref() {
        None | Some("io-error") => OnNoQuorum::IoError,
        Some("suspend-io") => OnNoQuorum::SuspendIo,
        Some(other) => {
            return Err(cx.err(
                "resource.on-no-quorum",
                format!("{other:?} is not a policy; expected \"io-error\" or \"suspend-io\""),
            ))
        }
    };
    if quorum == Votes::Off && r.on_no_quorum.is_some() && minimum_redundancy == Votes::Off {
        return Err(cx.err(
            "resource.on-no-quorum",
            "quorum is off: there is no quorum to lose (set quorum too, or remove on-no-quorum)",
        ));
    }
    Ok(QuorumConfig {
        quorum,
        minimum_redundancy,
        on_no_quorum,
    })
}

fn secret(cx: &Ctx, r: &RawResource) -> Result<Vec<u8>, ConfigError> {
    match (&r.shared_secret, &r.shared_secret_file) {
        (Some(_), Some(_)) => Err(cx.err(
            "resource",
            "set either shared-secret or shared-secret-file, not both",
        )),
        (None, None) => Err(cx.err(
            "resource",
            "shared-secret (or shared-secret-file) is required",
        )),
        (Some(s), None) => {
            if s.is_empty() {
                Err(cx.err("resource.shared-secret", "must not be empty"))
            } else {
                Ok(s.as_bytes().to_vec())
            }
        }
        (None, Some(f)) => {
            let key = "resource.shared-secret-file";
            if f.is_empty() {
                return Err(cx.err(key, "must not be empty"));
            }
            // A relative path is relative to the directory of the configuration file.
            let file = match cx.path.parent() {
                Some(dir) if Path::new(f).is_relative() => dir.join(f),
                _ => PathBuf::from(f),
            };
            let mut bytes = std::fs::read(&file)
                .map_err(|e| cx.err(key, format!("cannot read {}: {e}", file.display())))?;
            while matches!(bytes.last(), Some(b'\n' | b'\r')) {
                bytes.pop();
            }
            if bytes.is_empty() {
                return Err(cx.err(key, format!("{} is empty", file.display())));
            }
            Ok(bytes)
        }
    }
}

fn duration(v: &Scalar) -> Result<Duration, String> {
    let d = match v {
        Scalar::Str(s) => parse_duration(s)?,
        Scalar::Int(n) => {
            return Err(format!(
                "{n} has no unit; use a unit, e.g. \"1s\" (units: ns, us, ms, s, m)"
            ))
        }
        Scalar::Float(x) => {
            return Err(format!(
                "{x} is not a duration; use a whole number with a unit, e.g. \"500ms\""
            ))
        }
    };
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    if d >= MAX_DURATION {
        return Err(format!("{d:?} is too long; must be less than 1 hour"));
    }
    Ok(d)
}

/// The resync controller's plan ahead: `"0s"` (no controller) or whole steps of 100 ms,
/// up to 30 s (DRBD's c-plan-ahead range).
fn plan_ahead(v: &Scalar) -> Result<Duration, String> {
    if let Scalar::Str(s) = v {
        if parse_duration(s).is_ok_and(|d| d.is_zero()) {
            return Ok(Duration::ZERO);
        }
    }
    let d = duration(v)?;
    if d.as_nanos() % RESYNC_STEP.as_nanos() != 0 {
        return Err(format!(
            "{d:?} is not a multiple of 100ms (the resync controller's step); \"0s\" turns the controller off"
        ));
    }
    if d > MAX_PLAN_AHEAD {
        return Err(format!("{d:?} is too long; at most 30s"));
    }
    Ok(d)
}

fn size(v: &Scalar) -> Result<u64, String> {
    match v {
        Scalar::Str(s) => parse_size(s),
        Scalar::Int(n) => u64::try_from(*n).map_err(|_| format!("{n} is negative")),
        Scalar::Float(x) => Err(format!(
            "{x} is not a size; use a whole number of bytes or a suffix, e.g. \"64M\""
        )),
    }
}

fn net_config(cx: &Ctx, raw: RawNet) -> Result<NetConfig, ConfigError> {
    let d = NetConfig::default();
    let dur = |key: &str, v: &Option<Scalar>, default: Duration| match v {
        None => Ok(default),
        Some(v) => duration(v).map_err(|m| cx.err(format!("net.{key}"), m)),
    };
    let net = NetConfig {
        connect_interval: dur(
            "connect-interval",
            &raw.connect_interval,
            d.connect_interval,
        )?,
        max_connect_interval: dur(
            "max-connect-interval",
            &raw.max_connect_interval,
            d.max_connect_interval,
        )?,
        ping_interval: dur("ping-interval", &raw.ping_interval, d.ping_interval)?,
        ping_timeout: dur("ping-timeout", &raw.ping_timeout, d.ping_timeout)?,
        timeout: dur("timeout", &raw.timeout, d.timeout)?,
        max_buffer: match &raw.max_buffer {
            None => d.max_buffer,
            Some(v) => size(v).map_err(|m| cx.err("net.max-buffer", m))?,
        },
        resync_min_rate: match &raw.resync_min_rate {
            None => d.resync_min_rate,
            Some(v) => size(v).map_err(|m| cx.err("net.resync-min-rate", m))?,
        },
        resync_max_rate: match &raw.resync_max_rate {
            None => d.resync_max_rate,
            Some(v) => size(v).map_err(|m| cx.err("net.resync-max-rate", m))?,
        },
        resync_plan_ahead: match &raw.resync_plan_ahead {
            None => d.resync_plan_ahead,
            Some(v) => plan_ahead(v).map_err(|m| cx.err("net.resync-plan-ahead", m))?,
        },
        resync_fill_target: match &raw.resync_fill_target {
            None => d.resync_fill_target,
            Some(v) => size(v)
                .and_then(|n| {
                    if n > MAX_FILL_TARGET {
                        Err(format!("{n} bytes is too much; at most 512M"))
                    } else {
                        Ok(n)
                    }
                })
                .map_err(|m| cx.err("net.resync-fill-target", m))?,
        },
        resync_delay_target: match &raw.resync_delay_target {
            None => d.resync_delay_target,
            Some(v) => duration(v)
                .and_then(|t| {
                    if t < Duration::from_millis(1) {
                        Err(format!("{t:?} is too short; must be at least 1ms"))
                    } else if t > MAX_DELAY_TARGET {
                        Err(format!("{t:?} is too long; at most 10s"))
                    } else {
                        Ok(t)
                    }
                })
                .map_err(|m| cx.err("net.resync-delay-target", m))?,
        },
    };
    if net.resync_max_rate != 0 && net.resync_min_rate > net.resync_max_rate {
        return Err(cx.err(
            "net.resync-min-rate",
            format!(
                "{} bytes/s is above resync-max-rate ({} bytes/s); the resync could never get it",
                net.resync_min_rate, net.resync_max_rate
            ),
        ));
    }
    if net.max_buffer < MIN_MAX_BUFFER {
        return Err(cx.err(
            "net.max-buffer",
            format!("{} bytes is too small; must be at least 1M", net.max_buffer),
        ));
    }
    if net.max_connect_interval < net.connect_interval {
        return Err(cx.err(
            "net.max-connect-interval",
            format!(
                "max-connect-interval ({:?}) must not be less than connect-interval ({:?})",
                net.max_connect_interval, net.connect_interval
            ),
        ));
    }
    if net.ping_timeout >= net.ping_interval {
        return Err(cx.err(
            "net.ping-timeout",
            format!(
                "ping-timeout ({:?}) must be less than ping-interval ({:?})",
                net.ping_timeout, net.ping_interval
            ),
        ));
    }
    if net.timeout <= net.ping_timeout {
        return Err(cx.err(
            "net.timeout",
            format!(
                "timeout ({:?}) must be greater than ping-timeout ({:?})",
                net.timeout, net.ping_timeout
            ),
        ));
    }
    Ok(net)
}

fn volume_number(n: i64) -> Result<u16, String> {
    if (0..=MAX_VOLUME_NUMBER).contains(&n) {
        Ok(n as u16)
    } else {
        Err(format!("{n} is out of range 0..={MAX_VOLUME_NUMBER}"))
    }
}

fn node_config(
    cx: &Ctx,
    i: usize,
    raw: RawNode,
    earlier: &[NodeConfig],
    volumes: &[VolumeConfig],
) -> Result<NodeConfig, ConfigError> {
    check_name(&raw.name).map_err(|m| cx.err(format!("node[{i}].name"), m))?;
    let node = format!("node[{i}] ({})", raw.name);
    let position = |f: &dyn Fn(&NodeConfig) -> bool| earlier.iter().position(f);

    if let Some(j) = position(&|o| o.name == raw.name) {
        return Err(cx.err(
            format!("{node}.name"),
            format!("node name {:?} is already used by node[{j}]", raw.name),
        ));
    }

    if !(0..=MAX_NODE_ID).contains(&raw.node_id) {
        return Err(cx.err(
            format!("{node}.node-id"),
            format!("{} is out of range 0..={MAX_NODE_ID}", raw.node_id),
        ));
    }
    let node_id = raw.node_id as u8;
    if let Some(j) = position(&|o| o.node_id == node_id) {
        return Err(cx.err(
            format!("{node}.node-id"),
            format!(
                "node-id {node_id} is already used by node[{j}] ({})",
                earlier[j].name
            ),
        ));
    }

    let address: SocketAddr = raw.address.parse().map_err(|_| {
        cx.err(
            format!("{node}.address"),
            format!(
                "{:?} is not an IP address and port, e.g. \"10.0.0.1:7789\" or \"[fd00::1]:7789\"",
                raw.address
            ),
        )
    })?;
    if address.port() == 0 {
        return Err(cx.err(format!("{node}.address"), "port 0 is not allowed"));
    }
    if let Some(j) = position(&|o| o.address == address) {
        return Err(cx.err(
            format!("{node}.address"),
            format!(
                "address {address} is already used by node[{j}] ({})",
                earlier[j].name
            ),
        ));
    }

    let metrics = match raw.metrics.as_deref() {
        None => None,
        Some(m) => Some(metrics_address(m).map_err(|e| cx.err(format!("{node}.metrics"), e))?),
    };

    let tls = node_tls(cx, &node, &raw)?;

    // [[node.volume]]: collected by index into `volumes`, so the result is in the same order.
    let mut listed: Vec<Option<(usize, NodeVolume)>> = vec![None; volumes.len()];
    let mut endpoints: HashMap<Endpoint, String> = HashMap::new();
    let mut disks: HashMap<PathBuf, u16> = HashMap::new();
    for (j, nv) in raw.volume.into_iter().enumerate() {
        let vkey = format!("volume[{j}]");
        let key = format!("{node}.{vkey}");
        let number = volume_number(nv.number).map_err(|m| cx.err(format!("{key}.number"), m))?;
        let Some(slot) = volumes.iter().position(|v| v.number == number) else {
            return Err(cx.err(
                format!("{key}.number"),
                format!("volume {number} is not defined by any [[volume]]"),
            ));
        };
        if let Some((k, _)) = &listed[slot] {
            return Err(cx.err(
                format!("{key}.number"),
                format!("volume {number} is listed twice for this node (also volume[{k}])"),
            ));
        }

        let disk = if nv.disk == "none" {
            None
        } else if !nv.disk.is_empty() && Path::new(&nv.disk).is_absolute() {
            let disk = PathBuf::from(&nv.disk);
            if let Some(other) = disks.insert(disk.clone(), number) {
                return Err(cx.err(
                    format!("{key}.disk"),
                    format!("{:?} is already the disk of volume {other}", nv.disk),
                ));
            }
            Some(disk)
        } else {
            return Err(cx.err(
                format!("{key}.disk"),
                format!(
                    "{:?} is not an absolute path (use \"none\" for a diskless node)",
                    nv.disk
                ),
            ));
        };

        let (meta, al_extents) = meta_of(&nv, disk.is_some(), &key, &mut disks, number)
            .map_err(|(k, m)| cx.err(k, m))?;
        let max_peers = match (nv.max_peers, disk.is_some()) {
            (None, _) => None,
            (Some(_), false) => {
                return Err(cx.err(
                    format!("{key}.max-peers"),
                    "a diskless node keeps no bitmaps (remove max-peers or set a disk)",
                ))
            }
            (Some(n @ 1..=31), true) => Some(n as u8),
            (Some(n), true) => {
                return Err(cx.err(
                    format!("{key}.max-peers"),
                    format!("{n} is out of range 1..=31"),
                ))
            }
        };

        let mut nbd = Vec::with_capacity(nv.nbd.len());
        for (k, s) in nv.nbd.iter().enumerate() {
            let ekey = format!("{vkey}.nbd[{k}]");
            let ep: Endpoint = s.parse().map_err(|m| cx.err(format!("{node}.{ekey}"), m))?;
            if let Some(first) = endpoints.get(&ep) {
                return Err(cx.err(
                    format!("{node}.{ekey}"),
                    format!("{s:?} is already used by {first} on this node"),
                ));
            }
            endpoints.insert(ep.clone(), ekey);
            nbd.push(ep);
        }
        listed[slot] = Some((
            j,
            NodeVolume {
                number,
                disk,
                meta,
                al_extents,
                max_peers,
                nbd,
            },
        ));
    }

    let mut node_volumes = Vec::with_capacity(volumes.len());
    for (v, l) in volumes.iter().zip(listed) {
        match l {
            Some((_, nv)) => node_volumes.push(nv),
            None => {
                return Err(cx.err(
                    format!("{node}.volume"),
                    format!(
                        "volume {} is missing; every node must list every [[volume]] (disk = \"none\" for a diskless node)",
                        v.number
                    ),
                ))
            }
        }
    }

    Ok(NodeConfig {
        name: raw.name,
        node_id,
        address,
        metrics,
        tls,
        volumes: node_volumes,
    })
}

/// A node's `nbd-tls`, `tls-certificate`, `tls-key` and `nbd-tls-client-ca`.
fn node_tls(cx: &Ctx, node: &str, raw: &RawNode) -> Result<NodeTls, ConfigError> {
    let file = |key: &str, v: &Option<String>| -> Result<Option<PathBuf>, ConfigError> {
        match v.as_deref() {
            None => Ok(None),
            Some("") => Err(cx.err(format!("{node}.{key}"), "must not be empty")),
            Some(f) => Ok(Some(match cx.path.parent() {
                Some(dir) if Path::new(f).is_relative() => dir.join(f),
                _ => PathBuf::from(f),
            })),
        }
    };
    let nbd = match raw.nbd_tls.as_deref() {
        None | Some("off") => NbdTls::Off,
        Some("on") => NbdTls::On,
        Some("require") => NbdTls::Require,
        Some(other) => {
            return Err(cx.err(
                format!("{node}.nbd-tls"),
                format!("{other:?} is not a TLS mode; expected \"off\", \"on\" or \"require\""),
            ))
        }
    };
    let tls = NodeTls {
        nbd,
        certificate: file("tls-certificate", &raw.tls_certificate)?,
        key: file("tls-key", &raw.tls_key)?,
        nbd_client_ca: file("nbd-tls-client-ca", &raw.nbd_tls_client_ca)?,
    };
    match (&tls.certificate, &tls.key) {
        (Some(_), None) => return Err(cx.err(node, "tls-certificate is set without tls-key")),
        (None, Some(_)) => return Err(cx.err(node, "tls-key is set without tls-certificate")),
        (None, None) if nbd != NbdTls::Off => {
            return Err(cx.err(
                format!("{node}.nbd-tls"),
                "TLS needs the node's certificate: set tls-certificate and tls-key",
            ))
        }
        _ => {}
    }
    if tls.nbd_client_ca.is_some() && nbd == NbdTls::Off {
        return Err(cx.err(
            format!("{node}.nbd-tls-client-ca"),
            "nbd-tls is off: set nbd-tls = \"on\" or \"require\" too, or remove it",
        ));
    }
    Ok(tls)
}

/// A `metrics` value: where the node serves Prometheus metrics.
pub(crate) fn metrics_address(s: &str) -> Result<SocketAddr, String> {
    let a: SocketAddr = s.parse().map_err(|_| {
        format!("{s:?} is not an IP address and port, e.g. \"127.0.0.1:9942\" or \"[::1]:9942\"")
    })?;
    if a.port() == 0 {
        return Err(format!("{s:?}: port 0 is not allowed"));
    }
    Ok(a)
}

/// A node volume's `meta-disk` and `al-extents`; errors as (key, message).
fn meta_of(
    nv: &crate::raw::RawNodeVolume,
    diskful: bool,
    key: &str,
    disks: &mut HashMap<PathBuf, u16>,
    number: u16,
) -> Result<(crate::MetaDisk, u32), (String, String)> {
    use crate::MetaDisk;
    if !diskful {
        if nv.meta_disk.is_some() {
            return Err((
                format!("{key}.meta-disk"),
                "a diskless node keeps no metadata (remove meta-disk or set a disk)".into(),
            ));
        }
        if nv.al_extents.is_some() {
            return Err((
                format!("{key}.al-extents"),
                "a diskless node keeps no activity log (remove al-extents or set a disk)".into(),
            ));
        }
        return Ok((MetaDisk::Internal, crate::DEFAULT_AL_EXTENTS));
    }
    let meta = match nv.meta_disk.as_deref() {
        None | Some("internal") => MetaDisk::Internal,
        Some(m) => {
            let (pmem, path) = match m.strip_prefix("pmem:") {
                Some(p) => (true, p),
                None => (false, m),
            };
            if path.is_empty() || !Path::new(path).is_absolute() {
                return Err((
                    format!("{key}.meta-disk"),
                    format!("{m:?} is neither \"internal\" nor an absolute path (\"/path\" or \"pmem:/path\")"),
                ));
            }
            let path = PathBuf::from(path);
            if let Some(other) = disks.insert(path.clone(), number) {
                return Err((
                    format!("{key}.meta-disk"),
                    format!(
                        "{:?} is already a disk or meta-disk of volume {other}",
                        path
                    ),
                ));
            }
            if pmem {
                MetaDisk::Pmem(path)
            } else {
                MetaDisk::External(path)
            }
        }
    };
    let al = match nv.al_extents {
        None => crate::DEFAULT_AL_EXTENTS,
        Some(n @ 7..=65534) => n as u32,
        Some(n) => {
            return Err((
                format!("{key}.al-extents"),
                format!("{n} is out of range 7..=65534"),
            ))
        }
    };
    Ok((meta, al))
}
