use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tandem_config::{
    load, load_dir, parse, AfterSb0Pri, AfterSb1Pri, AfterSb2Pri, AfterSplitBrain, ConfigError,
    Endpoint, MetaDisk, NbdTls, NetConfig, NodeConfig, NodeTls, NodeVolume, OnNoQuorum, PeerTls,
    Protocol, QuorumConfig, ResourceConfig, VolumeConfig, Votes, DEFAULT_AL_EXTENTS,
};

const EXAMPLE: &str = include_str!("../example/r0.toml");

/// The example with `from` (which must occur exactly once) replaced by `to`.
fn edit(from: &str, to: &str) -> String {
    edit_in(EXAMPLE, from, to)
}

fn edit_in(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "test bug: {from:?} must occur exactly once"
    );
    text.replacen(from, to, 1)
}

fn parse_r0(text: &str) -> Result<ResourceConfig, ConfigError> {
    parse(text, Path::new("r0.toml"))
}

/// Asserts that `text` is rejected by validation at exactly `key`, with a message containing
/// `fragment`, and that the one-line Display names the file and the key.
#[track_caller]
fn assert_invalid(text: &str, key: &str, fragment: &str) {
    let err = parse_r0(text).expect_err("config should be rejected");
    let shown = err.to_string();
    match &err {
        ConfigError::Invalid {
            path,
            key: k,
            message,
        } => {
            assert_eq!(path, Path::new("r0.toml"));
            assert_eq!(k, key, "wrong key path in: {shown}");
            assert!(
                message.contains(fragment),
                "message {message:?} lacks {fragment:?}"
            );
        }
        other => panic!("expected ConfigError::Invalid, got {other:?} ({shown})"),
    }
    assert_eq!(err.key(), Some(key));
    assert!(
        shown.starts_with(&format!("r0.toml: {key}: ")),
        "display: {shown}"
    );
    assert!(!shown.contains('\n'), "display is not one line: {shown}");
}

/// Asserts a syntax/shape error at `line` whose message contains `fragment`.
#[track_caller]
fn assert_syntax(text: &str, line: usize, fragment: &str) {
    let err = parse_r0(text).expect_err("config should be rejected");
    let shown = err.to_string();
    match &err {
        ConfigError::Syntax {
            path,
            line: l,
            column,
            message,
        } => {
            assert_eq!(path, Path::new("r0.toml"));
            assert_eq!(*l, Some(line), "wrong line in: {shown}");
            assert!(column.is_some(), "no column in: {shown}");
            assert!(
                message.contains(fragment),
                "message {message:?} lacks {fragment:?}"
            );
        }
        other => panic!("expected ConfigError::Syntax, got {other:?} ({shown})"),
    }
    assert!(
        shown.starts_with(&format!("r0.toml:{line}:")),
        "display: {shown}"
    );
    assert!(!shown.contains('\n'), "display is not one line: {shown}");
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle not found")
        + 1
}

/// A small valid config: `n` nodes (n0, n1, ...), one volume, all diskful.
fn generated(n: usize) -> String {
    let mut s = String::from(
        "[resource]\nname = \"g\"\nshared-secret = \"x\"\n[[volume]]\nnumber = 0\nsize = \"4K\"\n",
    );
    for i in 0..n {
        s += &format!(
            "[[node]]\nname = \"n{i}\"\nnode-id = {i}\naddress = \"10.0.1.{i}:7789\"\n\
             [[node.volume]]\nnumber = 0\ndisk = \"/d{i}\"\n"
        );
    }
    s
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// The example and the happy paths

#[test]
fn example_parses_to_expected_structure() {
    let cfg = parse(EXAMPLE, Path::new("/etc/tandem/r0.toml")).unwrap();
    let unix = |p: &str| Endpoint::Unix(PathBuf::from(p));
    let tcp = |a: &str| Endpoint::Tcp(sa(a));
    let expected = ResourceConfig {
        name: "r0".into(),
        protocol: Protocol::C,
        secret: b"s3cret".to_vec(),
        net: NetConfig {
            connect_interval: Duration::from_secs(1),
            max_connect_interval: Duration::from_secs(10),
            ping_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(6),
            max_buffer: 64 * 1024 * 1024,
            resync_min_rate: 32 << 20,
            resync_max_rate: 0,
            resync_plan_ahead: Duration::from_millis(500),
            resync_fill_target: 0,
            resync_delay_target: Duration::from_millis(20),
        },
        volumes: vec![
            VolumeConfig {
                number: 0,
                size: 1 << 30,
            },
            VolumeConfig {
                number: 1,
                size: 256 << 20,
            },
        ],
        quorum: QuorumConfig {
            quorum: Votes::Majority,
            minimum_redundancy: Votes::Off,
            on_no_quorum: OnNoQuorum::IoError,
        },
        nodes: vec![
            NodeConfig {
                name: "alpha".into(),
                node_id: 0,
                address: sa("10.0.0.1:7789"),
                metrics: None,
                tls: Default::default(),
                volumes: vec![
                    NodeVolume {
                        number: 0,
                        disk: Some("/var/lib/tandem/r0-0.img".into()),
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![unix("/run/tandem/r0-0.sock"), tcp("127.0.0.1:10809")],
                    },
                    NodeVolume {
                        number: 1,
                        disk: Some("/dev/vg0/r0-1".into()),
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![unix("/run/tandem/r0-1.sock")],
                    },
                ],
            },
            NodeConfig {
                name: "beta".into(),
                node_id: 1,
                address: sa("10.0.0.2:7789"),
                metrics: None,
                tls: Default::default(),
                volumes: vec![
                    NodeVolume {
                        number: 0,
                        disk: Some("/var/lib/tandem/r0-0.img".into()),
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![unix("/run/tandem/r0-0.sock")],
                    },
                    NodeVolume {
                        number: 1,
                        disk: Some("/dev/vg0/r0-1".into()),
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![],
                    },
                ],
            },
            NodeConfig {
                name: "gamma".into(),
                node_id: 2,
                address: sa("10.0.0.3:7789"),
                metrics: None,
                tls: Default::default(),
                volumes: vec![
                    NodeVolume {
                        number: 0,
                        disk: None,
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![tcp("0.0.0.0:10809")],
                    },
                    NodeVolume {
                        number: 1,
                        disk: None,
                        meta: MetaDisk::Internal,
                        al_extents: DEFAULT_AL_EXTENTS,
                        max_peers: None,
                        nbd: vec![tcp("0.0.0.0:10810")],
                    },
                ],
            },
        ],
        after_sb: AfterSplitBrain::default(),
        tls: PeerTls::Off,
        tls_ca: None,
        path: PathBuf::from("/etc/tandem/r0.toml"),
    };
    assert_eq!(cfg, expected);
    // The example spells out the defaults.
    assert_eq!(cfg.net, NetConfig::default());
}

#[test]
fn lookups() {
    let cfg = parse_r0(EXAMPLE).unwrap();
    assert_eq!(cfg.node("beta").unwrap().node_id, 1);
    assert!(cfg.node("delta").is_none());
    assert_eq!(cfg.node_by_id(2).unwrap().name, "gamma");
    assert!(cfg.node_by_id(3).is_none());
    assert_eq!(cfg.volume(1).unwrap().size, 256 << 20);
    assert!(cfg.volume(2).is_none());
    let gamma = cfg.node("gamma").unwrap();
    assert!(gamma.volume(0).unwrap().is_diskless());
    assert!(!cfg.node("alpha").unwrap().volume(1).unwrap().is_diskless());
}

#[test]
fn minimal_file_gets_defaults() {
    let cfg = parse_r0(&generated(2)).unwrap();
    assert_eq!(cfg.protocol, Protocol::C);
    assert_eq!(cfg.net, NetConfig::default());
    assert_eq!(cfg.net.max_buffer, 64 << 20);
    assert_eq!(cfg.net.ping_timeout, Duration::from_millis(500));
    assert_eq!(cfg.nodes[1].volumes[0].nbd, vec![]);
    assert_eq!(cfg.volumes[0].size, 4096);
    let cfg = parse_r0(&generated(32)).unwrap();
    assert_eq!(cfg.nodes.len(), 32);
}

#[test]
fn protocols_and_net_overrides() {
    for (p, want) in [("A", Protocol::A), ("B", Protocol::B), ("C", Protocol::C)] {
        let cfg = parse_r0(&edit("protocol = \"C\"", &format!("protocol = \"{p}\""))).unwrap();
        assert_eq!(cfg.protocol, want);
        assert_eq!(cfg.protocol.to_string(), p);
    }
    let text = edit("max-buffer = \"64M\"", "max-buffer = 2097152");
    let text = edit_in(&text, "timeout = \"6s\"", "timeout = \"2m\"");
    let text = edit_in(
        &text,
        "ping-timeout = \"500ms\"",
        "ping-timeout = \"250000us\"",
    );
    let cfg = parse_r0(&text).unwrap();
    assert_eq!(cfg.net.max_buffer, 2 << 20);
    assert_eq!(cfg.net.timeout, Duration::from_secs(120));
    assert_eq!(cfg.net.ping_timeout, Duration::from_millis(250));
}

#[test]
fn volume_order_is_followed_by_node_volumes() {
    // alpha lists volume 1 before volume 0; its volumes still follow [[volume]] order.
    let text = generated(2).replace(
        "[[volume]]\nnumber = 0\nsize = \"4K\"\n",
        "[[volume]]\nnumber = 0\nsize = \"4K\"\n[[volume]]\nnumber = 1\nsize = 8192\n",
    );
    let text = text.replacen(
        "[[node.volume]]\nnumber = 0\ndisk = \"/d0\"\n",
        "[[node.volume]]\nnumber = 1\ndisk = \"none\"\n[[node.volume]]\nnumber = 0\ndisk = \"/d0\"\n",
        1,
    );
    let text = text.replacen(
        "[[node.volume]]\nnumber = 0\ndisk = \"/d1\"\n",
        "[[node.volume]]\nnumber = 0\ndisk = \"/d1\"\n[[node.volume]]\nnumber = 1\ndisk = \"/e1\"\n",
        1,
    );
    let cfg = parse_r0(&text).unwrap();
    let numbers: Vec<u16> = cfg.nodes[0].volumes.iter().map(|v| v.number).collect();
    assert_eq!(numbers, vec![0, 1]);
    assert_eq!(cfg.nodes[0].volumes[1].disk, None);
    assert_eq!(cfg.volumes[1].size, 8192);
}

#[test]
fn debug_redacts_the_secret() {
    let cfg = parse_r0(EXAMPLE).unwrap();
    let dbg = format!("{cfg:?}");
    assert!(!dbg.contains("s3cret"), "{dbg}");
    assert!(dbg.contains("6 bytes, redacted"), "{dbg}");
}

#[test]
fn endpoints_parse_and_display() {
    for s in [
        "unix:/run/tandem/r0.sock",
        "tcp:127.0.0.1:10809",
        "tcp:[::1]:10809",
    ] {
        let e: Endpoint = s.parse().unwrap();
        assert_eq!(e.to_string(), s);
    }
    for bad in [
        "tcp:nonsense",
        "tcp:localhost:10809",
        "tcp:127.0.0.1",
        "tcp:127.0.0.1:0",
        "unix:",
        "unix:run/x.sock",
        "udp:127.0.0.1:1",
        "/run/x.sock",
        "",
    ] {
        assert!(bad.parse::<Endpoint>().is_err(), "{bad:?} accepted");
    }
    let long = format!("unix:/{}", "x".repeat(107));
    let e = long.parse::<Endpoint>().unwrap_err();
    assert!(e.contains("longer than 107 bytes"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// [resource]

#[test]
fn resource_name_charset() {
    assert_invalid(
        &edit("name = \"r0\"", "name = \"r 0\""),
        "resource.name",
        "contains ' '; only letters, digits",
    );
    assert_invalid(
        &edit("name = \"r0\"", "name = \"r0/x\""),
        "resource.name",
        "contains '/'",
    );
    assert_invalid(
        &edit("name = \"r0\"", "name = \"\""),
        "resource.name",
        "must not be empty",
    );
    assert_invalid(
        &edit("name = \"r0\"", &format!("name = \"{}\"", "a".repeat(65))),
        "resource.name",
        "longer than 64 characters",
    );
    assert_invalid(
        &edit("name = \"r0\"", "name = \"..\""),
        "resource.name",
        "not a usable name",
    );
    let ok = parse_r0(&edit(
        "name = \"r0\"",
        &format!("name = \"{}\"", "a".repeat(64)),
    ));
    assert!(ok.is_ok());
    let ok = parse_r0(&edit("name = \"r0\"", "name = \"db_1.prod-x\"")).unwrap();
    assert_eq!(ok.name, "db_1.prod-x");
}

#[test]
fn protocol_must_be_a_b_or_c() {
    assert_invalid(
        &edit("protocol = \"C\"", "protocol = \"D\""),
        "resource.protocol",
        "\"D\" is not a protocol; expected \"A\", \"B\" or \"C\"",
    );
    assert_invalid(
        &edit("protocol = \"C\"", "protocol = \"c\""),
        "resource.protocol",
        "is not a protocol",
    );
}

#[test]
fn secret_is_required_once_and_non_empty() {
    assert_invalid(
        &edit("shared-secret = \"s3cret\"", ""),
        "resource",
        "shared-secret (or shared-secret-file) is required",
    );
    assert_invalid(
        &edit(
            "shared-secret = \"s3cret\"",
            "shared-secret = \"s3cret\"\nshared-secret-file = \"/etc/tandem/r0.secret\"",
        ),
        "resource",
        "either shared-secret or shared-secret-file, not both",
    );
    assert_invalid(
        &edit("shared-secret = \"s3cret\"", "shared-secret = \"\""),
        "resource.shared-secret",
        "must not be empty",
    );
    assert_invalid(
        &edit("shared-secret = \"s3cret\"", "shared-secret-file = \"\""),
        "resource.shared-secret-file",
        "must not be empty",
    );
}

#[test]
fn secret_file_relative_and_absolute() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r0.secret"), "t0p-secret\n").unwrap();
    let text = edit(
        "shared-secret = \"s3cret\"",
        "shared-secret-file = \"r0.secret\"",
    );
    let conf = dir.path().join("r0.toml");
    std::fs::write(&conf, &text).unwrap();

    // Relative to the configuration file's directory, trailing newline removed.
    let cfg = load(&conf).unwrap();
    assert_eq!(cfg.secret, b"t0p-secret");
    assert_eq!(cfg.path, conf);

    // Absolute path; CRLF and several trailing newlines removed, inner newline kept.
    let abs = dir.path().join("abs.secret");
    std::fs::write(&abs, "a\nb\r\n\n").unwrap();
    let text = edit(
        "shared-secret = \"s3cret\"",
        &format!("shared-secret-file = {:?}", abs.to_str().unwrap()),
    );
    let cfg = parse(&text, Path::new("/nonexistent/r0.toml")).unwrap();
    assert_eq!(cfg.secret, b"a\nb");
}

#[test]
fn secret_file_empty_or_missing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.secret"), "\n").unwrap();
    let conf = dir.path().join("r0.toml");

    std::fs::write(
        &conf,
        edit(
            "shared-secret = \"s3cret\"",
            "shared-secret-file = \"empty.secret\"",
        ),
    )
    .unwrap();
    let err = load(&conf).unwrap_err();
    assert_eq!(err.key(), Some("resource.shared-secret-file"));
    assert!(err.to_string().contains("empty.secret is empty"), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{}: ", conf.display())),
        "{err}"
    );

    std::fs::write(
        &conf,
        edit(
            "shared-secret = \"s3cret\"",
            "shared-secret-file = \"missing.secret\"",
        ),
    )
    .unwrap();
    let err = load(&conf).unwrap_err();
    assert_eq!(err.key(), Some("resource.shared-secret-file"));
    let shown = err.to_string();
    assert!(
        shown.contains("cannot read") && shown.contains("missing.secret"),
        "{shown}"
    );
}

// ---------------------------------------------------------------------------------------------
// [net]

#[test]
fn ping_timeout_below_ping_interval() {
    assert_invalid(
        &edit("ping-timeout = \"500ms\"", "ping-timeout = \"1s\""),
        "net.ping-timeout",
        "ping-timeout (1s) must be less than ping-interval (1s)",
    );
}

#[test]
fn timeout_above_ping_timeout() {
    assert_invalid(
        &edit("timeout = \"6s\"", "timeout = \"500ms\""),
        "net.timeout",
        "timeout (500ms) must be greater than ping-timeout (500ms)",
    );
}

#[test]
fn max_connect_interval_not_below_connect_interval() {
    assert_invalid(
        &edit("connect-interval = \"1s\"", "connect-interval = \"20s\""),
        "net.max-connect-interval",
        "must not be less than connect-interval",
    );
}

#[test]
fn durations_positive_and_below_an_hour() {
    assert_invalid(
        &edit("connect-interval = \"1s\"", "connect-interval = \"0ms\""),
        "net.connect-interval",
        "must be greater than 0",
    );
    assert_invalid(
        &edit(
            "max-connect-interval = \"10s\"",
            "max-connect-interval = \"60m\"",
        ),
        "net.max-connect-interval",
        "must be less than 1 hour",
    );
    assert_invalid(
        &edit("timeout = \"6s\"", "timeout = \"3600s\""),
        "net.timeout",
        "must be less than 1 hour",
    );
    let ok = parse_r0(&edit("timeout = \"6s\"", "timeout = \"3599999ms\"")).unwrap();
    assert_eq!(ok.net.timeout, Duration::from_millis(3_599_999));
}

#[test]
fn durations_need_a_unit() {
    assert_invalid(
        &edit("ping-interval = \"1s\"", "ping-interval = 1"),
        "net.ping-interval",
        "use a unit, e.g. \"1s\"",
    );
    assert_invalid(
        &edit("ping-interval = \"1s\"", "ping-interval = \"1\""),
        "net.ping-interval",
        "use a unit, e.g. \"1s\"",
    );
    assert_invalid(
        &edit("ping-interval = \"1s\"", "ping-interval = 1.5"),
        "net.ping-interval",
        "use a whole number with a unit",
    );
    assert_invalid(
        &edit("ping-interval = \"1s\"", "ping-interval = \"1h\""),
        "net.ping-interval",
        "unknown unit \"h\"",
    );
}

#[test]
fn max_buffer_at_least_1m() {
    assert_invalid(
        &edit("max-buffer = \"64M\"", "max-buffer = \"1023K\""),
        "net.max-buffer",
        "must be at least 1M",
    );
    assert_invalid(
        &edit("max-buffer = \"64M\"", "max-buffer = -1"),
        "net.max-buffer",
        "-1 is negative",
    );
    assert_invalid(
        &edit("max-buffer = \"64M\"", "max-buffer = \"64MB\""),
        "net.max-buffer",
        "unknown suffix",
    );
    let ok = parse_r0(&edit("max-buffer = \"64M\"", "max-buffer = \"1M\"")).unwrap();
    assert_eq!(ok.net.max_buffer, 1 << 20);
}

#[test]
fn resync_rates_are_sizes_per_second_and_the_floor_fits_under_the_ceiling() {
    let rates = |min: &str, max: &str| {
        edit(
            "resync-min-rate = \"32M\"",
            &format!("resync-min-rate = {min}"),
        )
        .replace(
            "resync-max-rate = \"0\"",
            &format!("resync-max-rate = {max}"),
        )
    };
    let ok = parse_r0(&rates("\"8M\"", "\"1G\"")).unwrap();
    assert_eq!(
        (ok.net.resync_min_rate, ok.net.resync_max_rate),
        (8 << 20, 1 << 30)
    );
    let off = parse_r0(&rates("\"0\"", "\"0\"")).unwrap();
    assert_eq!(off.net.resync_min_rate, 0);
    assert_invalid(
        &rates("\"64M\"", "\"32M\""),
        "net.resync-min-rate",
        "above resync-max-rate",
    );
    assert_invalid(&rates("\"8M\"", "\"fast\""), "net.resync-max-rate", "");
}

/// The resync controller's settings: DRBD's names, durations and a size, with the
/// defaults when unset, and clear errors out of range.
#[test]
fn resync_controller_settings_parse_and_bad_values_are_refused() {
    const DEFAULTS: [(&str, &str); 3] = [
        ("resync-plan-ahead", "\"500ms\""),
        ("resync-fill-target", "\"0\""),
        ("resync-delay-target", "\"20ms\""),
    ];
    // The example with `key = value` for the given keys (`None`: the key left out).
    let net = |set: &[(&str, Option<&str>)]| {
        let mut text = EXAMPLE.to_string();
        for (key, value) in set {
            let (_, default) = DEFAULTS.iter().find(|(k, _)| k == key).unwrap();
            let old = format!("{key} = {default}");
            assert!(text.contains(&old), "the example sets {old}");
            let new = value.map(|v| format!("{key} = {v}")).unwrap_or_default();
            text = text.replace(&old, &new);
        }
        text
    };
    let unset = [
        ("resync-plan-ahead", None),
        ("resync-fill-target", None),
        ("resync-delay-target", None),
    ];
    let d = parse_r0(&net(&unset)).unwrap().net;
    assert_eq!(
        (
            d.resync_plan_ahead,
            d.resync_fill_target,
            d.resync_delay_target
        ),
        (Duration::from_millis(500), 0, Duration::from_millis(20))
    );
    let ok = parse_r0(&net(&[
        ("resync-plan-ahead", Some("\"2s\"")),
        ("resync-fill-target", Some("\"1M\"")),
        ("resync-delay-target", Some("\"100ms\"")),
    ]))
    .unwrap()
    .net;
    assert_eq!(
        (
            ok.resync_plan_ahead,
            ok.resync_fill_target,
            ok.resync_delay_target
        ),
        (Duration::from_secs(2), 1 << 20, Duration::from_millis(100))
    );
    let off = parse_r0(&net(&[("resync-plan-ahead", Some("\"0s\""))]))
        .unwrap()
        .net;
    assert_eq!(off.resync_plan_ahead, Duration::ZERO);
    for (key, value, says) in [
        ("resync-plan-ahead", "\"250ms\"", "not a multiple of 100ms"),
        ("resync-plan-ahead", "\"31s\"", "at most 30s"),
        ("resync-plan-ahead", "20", "has no unit"),
        ("resync-delay-target", "\"0ms\"", "greater than 0"),
        ("resync-delay-target", "\"500us\"", "at least 1ms"),
        ("resync-delay-target", "\"11s\"", "at most 10s"),
        ("resync-fill-target", "\"1G\"", "at most 512M"),
        ("resync-fill-target", "-1", "negative"),
    ] {
        assert_invalid(&net(&[(key, Some(value))]), &format!("net.{key}"), says);
    }
}

#[test]
fn drbd_max_epoch_size_is_refused() {
    // DRBD's max-epoch-size has no meaning here (every write is acknowledged on its own,
    // barriers come from flushes): refused rather than silently ignored.
    let text = edit(
        "max-buffer = \"64M\"",
        "max-buffer = \"64M\"\nmax-epoch-size = 2048",
    );
    assert_syntax(
        &text,
        line_of(&text, "max-epoch-size ="),
        "unknown field `max-epoch-size`",
    );
}

// ---------------------------------------------------------------------------------------------
// [[volume]]

#[test]
fn at_least_one_volume() {
    let text = generated(2).replace("[[volume]]\nnumber = 0\nsize = \"4K\"\n", "");
    assert_invalid(&text, "volume", "at least one [[volume]] is required");
}

#[test]
fn volume_number_range_and_uniqueness() {
    assert_invalid(
        &edit(
            "number = 1\nsize = \"256M\"",
            "number = 65535\nsize = \"256M\"",
        ),
        "volume[1].number",
        "65535 is out of range 0..=65534",
    );
    assert_invalid(
        &edit("number = 1\nsize = \"256M\"", "number = 0\nsize = \"256M\""),
        "volume[1].number",
        "volume number 0 is already used by volume[0]",
    );
}

#[test]
fn volume_size_rules() {
    assert_invalid(
        &edit("size = \"256M\"", "size = 0"),
        "volume[1].size",
        "must be greater than 0",
    );
    assert_invalid(
        &edit("size = \"256M\"", "size = 1000"),
        "volume[1].size",
        "1000 bytes is not a multiple of 4096",
    );
    assert_invalid(
        &edit("size = \"256M\"", "size = \"4608\""),
        "volume[1].size",
        "4608 bytes is not a multiple of 4096",
    );
    assert_invalid(
        &edit("size = \"1G\"", "size = \"1.5G\""),
        "volume[0].size",
        "\"1.5G\" is not a size",
    );
    assert_invalid(
        &edit("size = \"1G\"", "size = 1.5"),
        "volume[0].size",
        "not a size",
    );
    let ok = parse_r0(&edit("size = \"256M\"", "size = 8192")).unwrap();
    assert_eq!(ok.volumes[1].size, 8192);
}

// ---------------------------------------------------------------------------------------------
// [[node]]

#[test]
fn two_to_thirty_two_nodes() {
    assert_invalid(
        &generated(1),
        "node",
        "1 [[node]] table(s) found; a resource needs 2 to 32 nodes",
    );
    assert_invalid(&generated(0), "node", "0 [[node]] table(s) found");
    assert_invalid(&generated(33), "node", "33 [[node]] table(s) found");
}

#[test]
fn node_name_charset_and_uniqueness() {
    assert_invalid(
        &edit("name = \"beta\"", "name = \"be ta\""),
        "node[1].name",
        "contains ' '",
    );
    assert_invalid(
        &edit("name = \"beta\"", "name = \"\""),
        "node[1].name",
        "must not be empty",
    );
    assert_invalid(
        &edit("name = \"gamma\"", "name = \"alpha\""),
        "node[2] (alpha).name",
        "node name \"alpha\" is already used by node[0]",
    );
}

#[test]
fn node_id_range_and_uniqueness() {
    let text = edit("node-id = 1", "node-id = 0");
    assert_invalid(
        &text,
        "node[1] (beta).node-id",
        "node-id 0 is already used by node[0] (alpha)",
    );
    let err = parse_r0(&text).unwrap_err().to_string();
    assert_eq!(
        err,
        "r0.toml: node[1] (beta).node-id: node-id 0 is already used by node[0] (alpha)"
    );
    assert_invalid(
        &edit("node-id = 2", "node-id = 32"),
        "node[2] (gamma).node-id",
        "32 is out of range 0..=31",
    );
    assert_invalid(
        &edit("node-id = 2", "node-id = -1"),
        "node[2] (gamma).node-id",
        "-1 is out of range 0..=31",
    );
    let ok = parse_r0(&edit("node-id = 2", "node-id = 31")).unwrap();
    assert_eq!(ok.node_by_id(31).unwrap().name, "gamma");
}

#[test]
fn node_address_format_and_uniqueness() {
    assert_invalid(
        &edit(
            "address = \"10.0.0.2:7789\"",
            "address = \"beta.example:7789\"",
        ),
        "node[1] (beta).address",
        "\"beta.example:7789\" is not an IP address and port",
    );
    assert_invalid(
        &edit("address = \"10.0.0.2:7789\"", "address = \"10.0.0.2\""),
        "node[1] (beta).address",
        "is not an IP address and port",
    );
    assert_invalid(
        &edit("address = \"10.0.0.2:7789\"", "address = \"10.0.0.2:0\""),
        "node[1] (beta).address",
        "port 0",
    );
    assert_invalid(
        &edit("address = \"10.0.0.3:7789\"", "address = \"10.0.0.1:7789\""),
        "node[2] (gamma).address",
        "address 10.0.0.1:7789 is already used by node[0] (alpha)",
    );
    // Same IP, different port: fine (e.g. two nodes on one test host).
    let ok = parse_r0(&edit(
        "address = \"10.0.0.3:7789\"",
        "address = \"10.0.0.1:7790\"",
    ))
    .unwrap();
    assert_eq!(ok.nodes[2].address, sa("10.0.0.1:7790"));
    let ok = parse_r0(&edit(
        "address = \"10.0.0.3:7789\"",
        "address = \"[fd00::3]:7789\"",
    ))
    .unwrap();
    assert_eq!(ok.nodes[2].address, sa("[fd00::3]:7789"));
}

#[test]
fn node_tls_keys_are_checked_and_paths_made_absolute() {
    let alpha = "address = \"10.0.0.1:7789\"";
    let with = |lines: &str| edit(alpha, &format!("{alpha}\n{lines}"));
    let files = "tls-certificate = \"pki/alpha.pem\"\ntls-key = \"/etc/tandem/alpha.key\"";
    let ok = parse(
        &with(&format!(
            "nbd-tls = \"require\"\n{files}\nnbd-tls-client-ca = \"ca.pem\""
        )),
        Path::new("/etc/tandem/r0.toml"),
    )
    .unwrap();
    let t = &ok.nodes[0].tls;
    assert_eq!(t.nbd, NbdTls::Require);
    assert_eq!(
        t.certificate.as_deref(),
        Some(Path::new("/etc/tandem/pki/alpha.pem"))
    );
    assert_eq!(t.key.as_deref(), Some(Path::new("/etc/tandem/alpha.key")));
    assert_eq!(
        t.nbd_client_ca.as_deref(),
        Some(Path::new("/etc/tandem/ca.pem"))
    );
    assert_eq!(ok.nodes[1].tls, NodeTls::default());
    let on = parse_r0(&with(&format!("nbd-tls = \"on\"\n{files}"))).unwrap();
    assert_eq!(on.nodes[0].tls.nbd, NbdTls::On);
    assert_invalid(
        &with("nbd-tls = \"yes\""),
        "node[0] (alpha).nbd-tls",
        "\"yes\" is not a TLS mode",
    );
    assert_invalid(
        &with("nbd-tls = \"on\""),
        "node[0] (alpha).nbd-tls",
        "set tls-certificate and tls-key",
    );
    assert_invalid(
        &with("tls-certificate = \"a.pem\""),
        "node[0] (alpha)",
        "without tls-key",
    );
    assert_invalid(
        &with(&format!("{files}\nnbd-tls-client-ca = \"ca.pem\"")),
        "node[0] (alpha).nbd-tls-client-ca",
        "nbd-tls is off",
    );
    assert_invalid(
        &with("nbd-tls = \"on\"\ntls-certificate = \"\"\ntls-key = \"k\""),
        "node[0] (alpha).tls-certificate",
        "must not be empty",
    );
}

#[test]
fn peer_tls_keys_are_checked_and_certificates_need_the_ca_and_every_node_s_files() {
    let with = |lines: &str| edit("tls = \"off\"\n", &format!("{lines}\n"));
    assert_eq!(parse_r0(EXAMPLE).unwrap().tls, PeerTls::Off);
    let secret = parse_r0(&with("tls = \"secret\"")).unwrap();
    assert_eq!((secret.tls, secret.tls_ca), (PeerTls::Secret, None));
    assert_invalid(
        &with("tls = \"on\""),
        "resource.tls",
        "\"on\" is not a TLS mode for peer links",
    );
    assert_invalid(
        &with("tls = \"certificates\""),
        "resource.tls-ca",
        "needs tls-ca",
    );
    assert_invalid(
        &with("tls = \"secret\"\ntls-ca = \"ca.pem\""),
        "resource.tls-ca",
        "only with tls = \"certificates\"",
    );
    assert_invalid(&with("tls-ca = \"ca.pem\""), "resource.tls-ca", "only with");
    // Certificates: every node needs its own (gamma, the diskless one, too).
    let certs = with("tls = \"certificates\"\ntls-ca = \"pki/ca.pem\"");
    assert_invalid(
        &certs,
        "node[0] (alpha).tls-certificate",
        "needs every node's certificate",
    );
    let mut text = certs.clone();
    for (n, ip) in [("alpha", 1), ("beta", 2)] {
        let addr = format!("address = \"10.0.0.{ip}:7789\"");
        text = text.replace(
            &addr,
            &format!("{addr}\ntls-certificate = \"{n}.pem\"\ntls-key = \"{n}.key\""),
        );
    }
    assert_invalid(
        &text,
        "node[2] (gamma).tls-certificate",
        "needs every node's certificate",
    );
    let addr = "address = \"10.0.0.3:7789\"";
    let text = text.replace(
        addr,
        &format!("{addr}\ntls-certificate = \"g.pem\"\ntls-key = \"g.key\""),
    );
    let ok = parse(&text, Path::new("/etc/tandem/r0.toml")).unwrap();
    assert_eq!(ok.tls, PeerTls::Certificates);
    assert_eq!(
        ok.tls_ca.as_deref(),
        Some(Path::new("/etc/tandem/pki/ca.pem"))
    );
}

#[test]
fn node_metrics_address_is_checked_and_agreed_across_files() {
    let alpha = "address = \"10.0.0.1:7789\"";
    let with = |m: &str| edit(alpha, &format!("{alpha}\nmetrics = \"{m}\""));
    let ok = parse_r0(&with("127.0.0.1:9942")).unwrap();
    assert_eq!(ok.nodes[0].metrics, Some(sa("127.0.0.1:9942")));
    assert_eq!(ok.nodes[1].metrics, None);
    assert_invalid(
        &with("localhost:9942"),
        "node[0] (alpha).metrics",
        "\"localhost:9942\" is not an IP address and port, e.g. \"127.0.0.1:9942\"",
    );
    assert_invalid(
        &with(":9942"),
        "node[0] (alpha).metrics",
        "is not an IP address",
    );
    assert_invalid(&with("127.0.0.1:0"), "node[0] (alpha).metrics", "port 0");
    // One endpoint per node: the files that set it agree, or the later one is named.
    let a = parse(&with("127.0.0.1:9942"), Path::new("a.toml")).unwrap();
    let b = parse(
        &edit_in(&with("127.0.0.1:9942"), "name = \"r0\"", "name = \"r1\""),
        Path::new("b.toml"),
    )
    .unwrap();
    let c = parse(
        &edit_in(&with("127.0.0.1:9943"), "name = \"r0\"", "name = \"r2\""),
        Path::new("c.toml"),
    )
    .unwrap();
    let unset = parse_r0(EXAMPLE).unwrap();
    let all = [unset.clone(), a.clone(), b.clone()];
    assert_eq!(
        tandem_config::node_metrics(&all, "alpha").unwrap(),
        Some(sa("127.0.0.1:9942"))
    );
    assert_eq!(tandem_config::node_metrics(&all, "beta").unwrap(), None);
    assert_eq!(
        tandem_config::node_metrics(&[unset], "alpha").unwrap(),
        None
    );
    let err = tandem_config::node_metrics(&[a, b, c], "alpha").unwrap_err();
    assert_eq!(
        err.to_string(),
        "c.toml: node[0] (alpha).metrics: 127.0.0.1:9943 differs from 127.0.0.1:9942 in a.toml: node alpha serves one metrics endpoint for all its resources"
    );
}

// ---------------------------------------------------------------------------------------------
// [[node.volume]]

const BETA_VOL1: &str =
    "  [[node.volume]]\n  number = 1\n  disk = \"/dev/vg0/r0-1\"\n  # nbd omitted: beta does not serve volume 1\n";

#[test]
fn every_node_lists_every_volume() {
    assert_invalid(
        &edit(BETA_VOL1, ""),
        "node[1] (beta).volume",
        "volume 1 is missing; every node must list every [[volume]]",
    );
}

#[test]
fn node_volume_listed_twice() {
    assert_invalid(
        &edit(BETA_VOL1, &BETA_VOL1.replace("number = 1", "number = 0")),
        "node[1] (beta).volume[1].number",
        "volume 0 is listed twice for this node (also volume[0])",
    );
}

#[test]
fn node_volume_unknown_number() {
    assert_invalid(
        &edit(BETA_VOL1, &BETA_VOL1.replace("number = 1", "number = 7")),
        "node[1] (beta).volume[1].number",
        "volume 7 is not defined by any [[volume]]",
    );
    assert_invalid(
        &edit(
            BETA_VOL1,
            &BETA_VOL1.replace("number = 1", "number = 70000"),
        ),
        "node[1] (beta).volume[1].number",
        "70000 is out of range 0..=65534",
    );
}

#[test]
fn every_volume_needs_a_diskful_node() {
    let text = edit(
        "  number = 1\n  disk = \"/dev/vg0/r0-1\"\n  nbd",
        "  number = 1\n  disk = \"none\"\n  nbd",
    );
    let text = edit_in(
        &text,
        BETA_VOL1,
        &BETA_VOL1.replace("\"/dev/vg0/r0-1\"", "\"none\""),
    );
    assert_invalid(
        &text,
        "volume[1]",
        "no node has a disk for volume 1 (all have disk = \"none\"); at least one node must be diskful",
    );
}

#[test]
fn disk_must_be_absolute_or_none() {
    assert_invalid(
        &edit(
            BETA_VOL1,
            &BETA_VOL1.replace("\"/dev/vg0/r0-1\"", "\"vg0/r0-1\""),
        ),
        "node[1] (beta).volume[1].disk",
        "\"vg0/r0-1\" is not an absolute path (use \"none\" for a diskless node)",
    );
    assert_invalid(
        &edit(BETA_VOL1, &BETA_VOL1.replace("\"/dev/vg0/r0-1\"", "\"\"")),
        "node[1] (beta).volume[1].disk",
        "is not an absolute path",
    );
    assert_invalid(
        &edit(
            BETA_VOL1,
            &BETA_VOL1.replace("\"/dev/vg0/r0-1\"", "\"None\""),
        ),
        "node[1] (beta).volume[1].disk",
        "is not an absolute path",
    );
}

#[test]
fn disk_not_shared_by_two_volumes_of_a_node() {
    assert_invalid(
        &edit(
            BETA_VOL1,
            &BETA_VOL1.replace("\"/dev/vg0/r0-1\"", "\"/var/lib/tandem/r0-0.img\""),
        ),
        "node[1] (beta).volume[1].disk",
        "\"/var/lib/tandem/r0-0.img\" is already the disk of volume 0",
    );
}

#[test]
fn nbd_endpoint_format() {
    let text = edit(
        "nbd = [\"unix:/run/tandem/r0-0.sock\"]\n",
        "nbd = [\"tcp:nonsense\"]\n",
    );
    assert_invalid(
        &text,
        "node[1] (beta).volume[0].nbd[0]",
        "\"tcp:nonsense\" is not tcp:<ip>:<port> or unix:<absolute path>",
    );
    assert_eq!(
        parse_r0(&text).unwrap_err().to_string(),
        "r0.toml: node[1] (beta).volume[0].nbd[0]: \"tcp:nonsense\" is not tcp:<ip>:<port> or unix:<absolute path>"
    );
    assert_invalid(
        &edit(
            "nbd = [\"unix:/run/tandem/r0-0.sock\", \"tcp:127.0.0.1:10809\"]",
            "nbd = [\"unix:/run/tandem/r0-0.sock\", \"unix:run/x.sock\"]",
        ),
        "node[0] (alpha).volume[0].nbd[1]",
        "the socket path must be absolute",
    );
    assert_invalid(
        &edit("nbd = [\"tcp:0.0.0.0:10810\"]", "nbd = [\"10810\"]"),
        "node[2] (gamma).volume[1].nbd[0]",
        "\"10810\" is not tcp:<ip>:<port> or unix:<absolute path>",
    );
}

#[test]
fn nbd_endpoint_not_reused_on_a_node() {
    // Across volumes of one node.
    assert_invalid(
        &edit(
            "nbd = [\"tcp:0.0.0.0:10810\"]",
            "nbd = [\"tcp:0.0.0.0:10809\"]",
        ),
        "node[2] (gamma).volume[1].nbd[0]",
        "\"tcp:0.0.0.0:10809\" is already used by volume[0].nbd[0] on this node",
    );
    // Within one volume.
    assert_invalid(
        &edit(
            "nbd = [\"unix:/run/tandem/r0-1.sock\"]",
            "nbd = [\"unix:/run/tandem/r0-1.sock\", \"unix:/run/tandem/r0-1.sock\"]",
        ),
        "node[0] (alpha).volume[1].nbd[1]",
        "is already used by volume[1].nbd[0] on this node",
    );
    // The same endpoint on two different nodes is fine (alpha and beta both use r0-0.sock).
    assert!(parse_r0(EXAMPLE).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Syntax and shape errors

#[test]
fn unknown_key_at_top_level() {
    let text = format!("speed = 3\n{EXAMPLE}");
    assert_syntax(&text, 1, "unknown field `speed`");
}

#[test]
fn unknown_key_in_resource() {
    let text = edit("name = \"r0\"", "name = \"r0\"\nsecret = \"x\"");
    assert_syntax(
        &text,
        line_of(&text, "secret = \"x\""),
        "unknown field `secret`",
    );
}

#[test]
fn unknown_key_in_net() {
    let text = edit(
        "max-buffer = \"64M\"",
        "max-buffer = \"64M\"\nping-int = \"1s\"",
    );
    assert_syntax(
        &text,
        line_of(&text, "ping-int ="),
        "unknown field `ping-int`",
    );
}

#[test]
fn unknown_key_in_node() {
    let text = edit("node-id = 1", "node-id = 1\nport = 7789");
    assert_syntax(&text, line_of(&text, "port = 7789"), "unknown field `port`");
}

#[test]
fn unknown_key_in_node_volume() {
    let text = edit(
        "# nbd omitted: beta does not serve volume 1",
        "speed = \"fast\"",
    );
    assert_syntax(&text, line_of(&text, "speed"), "unknown field `speed`");
}

#[test]
fn unknown_key_in_volume() {
    let text = edit("size = \"256M\"", "size = \"256M\"\nname = \"v1\"");
    assert_syntax(
        &text,
        line_of(&text, "name = \"v1\""),
        "unknown field `name`",
    );
}

#[test]
fn toml_syntax_error_keeps_position() {
    let text = edit("[resource]", "[resource");
    let err = parse_r0(&text).unwrap_err();
    match &err {
        ConfigError::Syntax { line, column, .. } => {
            assert_eq!(*line, Some(line_of(&text, "[resource")));
            assert_eq!(*column, Some(10));
        }
        other => panic!("expected Syntax, got {other:?}"),
    }
    assert!(err.to_string().starts_with("r0.toml:5:10: "), "{err}");
}

#[test]
fn wrong_type_and_missing_key() {
    let text = edit("node-id = 1", "node-id = \"1\"");
    assert_syntax(
        &text,
        line_of(&text, "node-id = \"1\""),
        "invalid type: string \"1\"",
    );
    let text = edit("address = \"10.0.0.2:7789\"", "");
    assert_syntax(
        &text,
        line_of(&text, "name = \"beta\"") - 1,
        "missing field `address`",
    );
    assert_syntax(
        "[net]\nmax-buffer = \"2M\"\n",
        1,
        "missing field `resource`",
    );
}

// ---------------------------------------------------------------------------------------------
// Files and directories

#[test]
fn load_reports_unreadable_file() {
    let err = load(Path::new("/nonexistent/tandem/r9.toml")).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.starts_with("/nonexistent/tandem/r9.toml: cannot read: "),
        "{shown}"
    );
}

#[test]
fn load_dir_reads_every_toml_file_sorted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r0.toml"), EXAMPLE).unwrap();
    std::fs::write(
        dir.path().join("a-first.toml"),
        edit("name = \"r0\"", "name = \"r1\""),
    )
    .unwrap();
    // Not configuration files: ignored.
    std::fs::write(dir.path().join("r0.toml.bak"), "garbage").unwrap();
    std::fs::write(dir.path().join("README"), "garbage").unwrap();
    std::fs::create_dir(dir.path().join("sub.toml")).unwrap();

    let all = load_dir(dir.path()).unwrap();
    let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["r1", "r0"]);
    assert_eq!(all[0].path, dir.path().join("a-first.toml"));
    assert_eq!(all[1].path, dir.path().join("r0.toml"));

    let empty = tempfile::tempdir().unwrap();
    assert_eq!(load_dir(empty.path()).unwrap(), vec![]);
}

#[test]
fn load_dir_rejects_duplicate_resource_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r0.toml"), EXAMPLE).unwrap();
    std::fs::write(dir.path().join("r0-copy.toml"), EXAMPLE).unwrap();
    let err = load_dir(dir.path()).unwrap_err();
    assert_eq!(err.key(), Some("resource.name"));
    let shown = err.to_string();
    // r0-copy.toml sorts first, so r0.toml is the duplicate.
    assert_eq!(
        shown,
        format!(
            "{}: resource.name: resource \"r0\" is already defined in {}",
            dir.path().join("r0.toml").display(),
            dir.path().join("r0-copy.toml").display()
        )
    );
}

#[test]
fn load_dir_reports_the_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r0.toml"), EXAMPLE).unwrap();
    std::fs::write(
        dir.path().join("r1.toml"),
        edit("name = \"r0\"", "name = \"r1\"\nbogus = 1"),
    )
    .unwrap();
    let err = load_dir(dir.path()).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}:7:", dir.path().join("r1.toml").display())),
        "{shown}"
    );
    assert!(shown.contains("unknown field `bogus`"), "{shown}");

    let err = load_dir(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, ConfigError::ReadDir { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot list directory"), "{err}");
}

#[test]
fn meta_disk_and_al_extents() {
    let text = edit(
        "disk = \"/var/lib/tandem/r0-0.img\"    # absolute path of a file or block device",
        "disk = \"/var/lib/tandem/r0-0.img\"\n  meta-disk = \"pmem:/mnt/pmem/r0-0.md\"\n  al-extents = 64",
    );
    let cfg = parse_r0(&text).unwrap();
    let v = &cfg.node("alpha").unwrap().volumes[0];
    assert_eq!(v.meta, MetaDisk::Pmem("/mnt/pmem/r0-0.md".into()));
    assert_eq!(v.al_extents, 64);
    let ext = edit(
        "disk = \"/var/lib/tandem/r0-0.img\"    # absolute path of a file or block device",
        "disk = \"/var/lib/tandem/r0-0.img\"\n  meta-disk = \"/var/lib/tandem/r0-0.md\"",
    );
    let v = parse_r0(&ext).unwrap().node("alpha").unwrap().volumes[0].clone();
    assert_eq!(v.meta, MetaDisk::External("/var/lib/tandem/r0-0.md".into()));
    let bad = |line: &str, key: &str, fragment: &str| {
        let text = edit(
            "disk = \"/var/lib/tandem/r0-0.img\"    # absolute path of a file or block device",
            &format!("disk = \"/var/lib/tandem/r0-0.img\"\n  {line}"),
        );
        assert_invalid(&text, key, fragment);
    };
    bad(
        "meta-disk = \"md.img\"",
        "node[0] (alpha).volume[0].meta-disk",
        "absolute path",
    );
    bad(
        "meta-disk = \"pmem:\"",
        "node[0] (alpha).volume[0].meta-disk",
        "absolute path",
    );
    bad(
        "meta-disk = \"/var/lib/tandem/r0-0.img\"",
        "node[0] (alpha).volume[0].meta-disk",
        "already a disk",
    );
    bad(
        "al-extents = 6",
        "node[0] (alpha).volume[0].al-extents",
        "7..=65534",
    );
    bad(
        "al-extents = 70000",
        "node[0] (alpha).volume[0].al-extents",
        "7..=65534",
    );
}

#[test]
fn max_peers_keeps_spare_bitmap_slots() {
    let with = |line: &str| {
        edit(
            "disk = \"/var/lib/tandem/r0-0.img\"    # absolute path of a file or block device",
            &format!("disk = \"/var/lib/tandem/r0-0.img\"\n  {line}"),
        )
    };
    let cfg = parse_r0(&with("max-peers = 3")).unwrap();
    assert_eq!(cfg.node("alpha").unwrap().volumes[0].max_peers, Some(3));
    assert_eq!(cfg.node("beta").unwrap().volumes[0].max_peers, None);
    let key = "node[0] (alpha).volume[0].max-peers";
    assert_invalid(&with("max-peers = 0"), key, "1..=31");
    assert_invalid(&with("max-peers = 32"), key, "1..=31");
    // Three nodes, two of them diskful for volume 0: alpha needs a slot for beta.
    let two = edit(
        "disk = \"/var/lib/tandem/r0-0.img\"    # absolute path of a file or block device",
        "disk = \"/var/lib/tandem/r0-0.img\"\n  max-peers = 1",
    );
    assert!(parse_r0(&two).is_ok());
    let three = edit_in(
        &two,
        "disk = \"none\"                # diskless client: reads and writes go to alpha/beta",
        "disk = \"/var/lib/tandem/r0-0.img\"",
    );
    assert_invalid(
        &three,
        key,
        "fewer than the other diskful nodes of volume 0 (2)",
    );
    assert_invalid(
        &edit(
            "disk = \"none\"                # diskless client: reads and writes go to alpha/beta",
            "disk = \"none\"\n  max-peers = 2",
        ),
        "node[2] (gamma).volume[0].max-peers",
        "diskless node keeps no bitmaps",
    );
}

#[test]
fn quorum_defaults_to_majority_from_three_nodes() {
    let two = parse_r0(&generated(2)).unwrap();
    assert_eq!(two.quorum.quorum, Votes::Off);
    let three = parse_r0(&generated(3)).unwrap();
    assert_eq!(
        three.quorum,
        QuorumConfig {
            quorum: Votes::Majority,
            minimum_redundancy: Votes::Off,
            on_no_quorum: OnNoQuorum::IoError,
        }
    );
    // The example's three nodes: two diskful and a diskless tiebreaker.
    let example = parse_r0(EXAMPLE).unwrap();
    assert_eq!(example.quorum.quorum, Votes::Majority);
}

#[test]
fn quorum_settings_parse_and_bad_ones_are_named() {
    let with =
        |lines: &str| generated(3).replacen("[resource]\n", &format!("[resource]\n{lines}\n"), 1);
    let cfg = parse_r0(&with(
        "quorum = 2\nquorum-minimum-redundancy = \"all\"\non-no-quorum = \"suspend-io\"",
    ))
    .unwrap();
    assert_eq!(
        cfg.quorum,
        QuorumConfig {
            quorum: Votes::Count(2),
            minimum_redundancy: Votes::All,
            on_no_quorum: OnNoQuorum::SuspendIo,
        }
    );
    assert_eq!(
        parse_r0(&with("quorum = \"off\"")).unwrap().quorum.quorum,
        Votes::Off
    );
    assert_eq!(
        parse_r0(&with("quorum = \"all\"")).unwrap().quorum.quorum,
        Votes::All
    );
    assert_invalid(
        &with("quorum = \"most\""),
        "resource.quorum",
        "\"most\" is not a quorum; expected \"off\", \"majority\", \"all\" or a number of nodes (1 to 3)",
    );
    assert_invalid(
        &with("quorum = 4"),
        "resource.quorum",
        "4 is more than the 3 node(s) keeping a replica",
    );
    assert_invalid(&with("quorum = 0"), "resource.quorum", "0 is not a quorum");
    assert_invalid(
        &with("quorum-minimum-redundancy = 1.5"),
        "resource.quorum-minimum-redundancy",
        "1.5 is not a quorum",
    );
    assert_invalid(
        &with("on-no-quorum = \"freeze\""),
        "resource.on-no-quorum",
        "\"freeze\" is not a policy; expected \"io-error\" or \"suspend-io\"",
    );
    assert_invalid(
        &with("quorum = \"off\"\non-no-quorum = \"suspend-io\""),
        "resource.on-no-quorum",
        "quorum is off",
    );
}

#[test]
fn after_split_brain_policies_parse_and_default_to_disconnect() {
    let cfg = parse_r0(&generated(2)).unwrap();
    assert_eq!(cfg.after_sb, AfterSplitBrain::default());
    assert_eq!(cfg.after_sb.zero, AfterSb0Pri::Disconnect);
    assert_eq!(cfg.after_sb.one, AfterSb1Pri::Disconnect);
    let zero = [
        ("disconnect", AfterSb0Pri::Disconnect),
        (
            "discard-younger-primary",
            AfterSb0Pri::DiscardYoungerPrimary,
        ),
        ("discard-older-primary", AfterSb0Pri::DiscardOlderPrimary),
        ("discard-zero-changes", AfterSb0Pri::DiscardZeroChanges),
        ("discard-least-changes", AfterSb0Pri::DiscardLeastChanges),
    ];
    for (name, want) in zero {
        let text = edit_in(
            &generated(2),
            "[resource]\n",
            &format!("[resource]\nafter-sb-0pri = \"{name}\"\n"),
        );
        assert_eq!(parse_r0(&text).unwrap().after_sb.zero, want, "{name}");
    }
    let one = [
        ("disconnect", AfterSb1Pri::Disconnect),
        ("consensus", AfterSb1Pri::Consensus),
        ("discard-secondary", AfterSb1Pri::DiscardSecondary),
    ];
    for (name, want) in one {
        let text = edit_in(
            &generated(2),
            "[resource]\n",
            &format!("[resource]\nafter-sb-1pri = \"{name}\"\n"),
        );
        assert_eq!(parse_r0(&text).unwrap().after_sb.one, want, "{name}");
    }
    let text = edit_in(
        &generated(2),
        "[resource]\n",
        "[resource]\nafter-sb-2pri = \"disconnect\"\n",
    );
    assert_eq!(
        parse_r0(&text).unwrap().after_sb.two,
        AfterSb2Pri::Disconnect
    );
}

#[test]
fn after_split_brain_policies_reject_unknown_values_naming_the_key() {
    for (key, bad, fragment) in [
        (
            "after-sb-0pri",
            "discard-secondary",
            "\"discard-least-changes\"",
        ),
        (
            "after-sb-1pri",
            "discard-least-changes",
            "\"discard-secondary\"",
        ),
        (
            "after-sb-2pri",
            "discard-secondary",
            "expected \"disconnect\"",
        ),
        ("after-sb-0pri", "Disconnect", "is not a policy"),
    ] {
        let text = edit_in(
            &generated(2),
            "[resource]\n",
            &format!("[resource]\n{key} = \"{bad}\"\n"),
        );
        assert_invalid(&text, &format!("resource.{key}"), fragment);
    }
}
