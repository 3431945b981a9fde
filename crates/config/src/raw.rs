//! The file as serde sees it. Values are kept loose (strings, `i64`) so that validation can
//! reject them with the exact key path; only the shape (known keys, TOML types) is checked here.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawFile {
    pub resource: RawResource,
    #[serde(default)]
    pub net: RawNet,
    #[serde(default)]
    pub volume: Vec<RawVolume>,
    #[serde(default)]
    pub node: Vec<RawNode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawResource {
    pub name: String,
    pub protocol: Option<String>,
    pub shared_secret: Option<String>,
    pub shared_secret_file: Option<String>,
    pub quorum: Option<Scalar>,
    pub quorum_minimum_redundancy: Option<Scalar>,
    pub on_no_quorum: Option<String>,
    pub after_sb_0pri: Option<String>,
    pub after_sb_1pri: Option<String>,
    pub after_sb_2pri: Option<String>,
    pub tls: Option<String>,
    pub tls_ca: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawNet {
    pub connect_interval: Option<Scalar>,
    pub max_connect_interval: Option<Scalar>,
    pub ping_interval: Option<Scalar>,
    pub ping_timeout: Option<Scalar>,
    pub timeout: Option<Scalar>,
    pub max_buffer: Option<Scalar>,
    pub resync_min_rate: Option<Scalar>,
    pub resync_max_rate: Option<Scalar>,
    pub resync_plan_ahead: Option<Scalar>,
    pub resync_fill_target: Option<Scalar>,
    pub resync_delay_target: Option<Scalar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawVolume {
    pub number: i64,
    pub size: Scalar,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawNode {
    pub name: String,
    pub node_id: i64,
    pub address: String,
    pub metrics: Option<String>,
    pub nbd_tls: Option<String>,
    pub tls_certificate: Option<String>,
    pub tls_key: Option<String>,
    pub nbd_tls_client_ca: Option<String>,
    #[serde(default)]
    pub volume: Vec<RawNodeVolume>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawNodeVolume {
    pub number: i64,
    pub disk: String,
    pub meta_disk: Option<String>,
    pub al_extents: Option<i64>,
    pub max_peers: Option<i64>,
    #[serde(default)]
    pub nbd: Vec<String>,
}

/// A value that may be written as a string or a number (durations, sizes); which forms are
/// allowed is decided by validation, which can then name the key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar {
    Str(String),
    Int(i64),
    Float(f64),
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string such as \"1s\" or \"64M\", or an integer")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                i64::try_from(v)
                    .map(Scalar::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
        }
        d.deserialize_any(V)
    }
}
