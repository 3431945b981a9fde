use std::io;
use std::path::PathBuf;

/// Why a configuration file (or directory) was rejected.
///
/// Every variant names the file; `Display` is one line, e.g.
/// `r0.toml: node[1] (beta).volume[0].nbd[0]: "tcp:nonsense" is not tcp:<ip>:<port> or unix:<absolute path>`
/// or `r0.toml:7:1: unknown field `sped`, expected one of ...`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read: {error}", path.display())]
    Read { path: PathBuf, error: io::Error },

    /// The configuration directory could not be listed.
    #[error("{}: cannot list directory: {error}", path.display())]
    ReadDir { path: PathBuf, error: io::Error },

    /// TOML syntax error, unknown key, missing key or wrong value type. `line` and `column` are
    /// 1-based and present whenever the TOML parser knows where the problem is.
    #[error("{}{}: {message}", path.display(), location(*line, *column))]
    Syntax {
        path: PathBuf,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },

    /// The file is well-formed TOML but a value breaks a rule. `key` is the key path, e.g.
    /// `net.ping-timeout` or `node[1] (beta).volume[0].disk`.
    #[error("{}: {key}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

fn location(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

impl ConfigError {
    /// The key path of an [`Invalid`](ConfigError::Invalid) error.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}
