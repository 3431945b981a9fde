//! `tandem serve`: export local files or block devices over NBD, unreplicated.

use crate::listener::Listener;
use crate::reactor::Reactor;
use crate::serve_core::VolumeCtx;
use crate::tls::{NbdTls, NbdTlsConfig, TlsMode};
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tandem_engine::Volume;
use tandem_frontend::nbd::{BlockSizes, ExportInfo};
use tandem_storage::{Backing, OpenOptions};
use tracing::info;

#[derive(Clone, Debug)]
pub struct ExportConfig {
    pub name: String,
    pub path: PathBuf,
    pub description: String,
    /// Size to create a missing file with, and that an existing file must have.
    pub size: Option<u64>,
    pub read_only: bool,
    pub direct: bool,
    pub min_block: u32,
}

#[derive(Clone, Debug)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub exports: Vec<ExportConfig>,
    pub listen: Vec<ListenAddr>,
    /// Threads for blocking disk operations (fdatasync, O_DIRECT).
    pub disk_threads: usize,
    /// Busy-poll window after a burst of events (zero: always block).
    pub busy_poll: std::time::Duration,
    /// NBD STARTTLS: off, or on/require with a certificate.
    pub tls: Option<NbdTlsConfig>,
}

/// Opens every export, binds every address, and serves until SIGTERM or SIGINT.
pub fn run(config: ServeConfig) -> Result<()> {
    let tls = match &config.tls {
        Some(t) => NbdTls::load(t).context("TLS")?,
        None => None,
    };
    if let Some(t) = &config.tls {
        if t.mode != TlsMode::Off {
            let mutual = t.client_ca.as_ref().map(|c| c.display().to_string());
            info!(mode = ?t.mode, certificate = %t.files.certificate.display(), client_ca = mutual.as_deref().unwrap_or("none"), "NBD TLS");
        }
    }
    let volumes = open_volumes(&config.exports)?;
    let listeners = bind(&config.listen)?;
    for l in &listeners {
        info!("listening on {}", l.describe());
    }
    Reactor::new(
        volumes,
        listeners,
        config.disk_threads,
        config.busy_poll,
        tls,
    )?
    .run()?;
    Ok(())
}

pub(crate) fn open_volumes(exports: &[ExportConfig]) -> Result<Vec<VolumeCtx>> {
    if exports.is_empty() {
        bail!("no export given");
    }
    let mut volumes = Vec::with_capacity(exports.len());
    for (i, e) in exports.iter().enumerate() {
        if exports[..i].iter().any(|o| o.name == e.name) {
            bail!("export name {:?} is given twice", e.name);
        }
        let backing = Backing::open(&OpenOptions {
            path: e.path.clone(),
            size: e.size,
            direct: e.direct,
            read_only: e.read_only,
        })?;
        let min_block = if e.direct {
            e.min_block.max(backing.logical_block())
        } else {
            e.min_block
        };
        let block = BlockSizes::new(min_block);
        block
            .validate()
            .map_err(|m| anyhow::anyhow!("export {:?}: {m}", e.name))?;
        if backing.size() % u64::from(min_block) != 0 {
            bail!(
                "{}: size {} is not a multiple of the block size {min_block}",
                e.path.display(),
                backing.size()
            );
        }
        info!(
            export = %e.name,
            path = %e.path.display(),
            size = backing.size(),
            read_only = e.read_only,
            direct = e.direct,
            min_block,
            "export ready"
        );
        let export = ExportInfo {
            name: e.name.clone(),
            description: e.description.clone(),
            size: backing.size(),
            read_only: e.read_only,
            block,
        };
        volumes.push(VolumeCtx {
            engine: Volume::new(backing.size(), e.read_only),
            inline_rw: !e.direct,
            backing: Arc::new(backing),
            export,
            gate: Default::default(),
        });
    }
    Ok(volumes)
}

pub(crate) fn bind(addrs: &[ListenAddr]) -> Result<Vec<Listener>> {
    let mut listeners = Vec::new();
    for a in addrs {
        match a {
            ListenAddr::Tcp(addr) => {
                let l = mio::net::TcpListener::bind(*addr)
                    .with_context(|| format!("cannot listen on {addr}"))?;
                listeners.push(Listener::Tcp(l));
            }
            ListenAddr::Unix(path) => {
                // A stale socket file from a crashed server would block us forever; a live
                // one answers connect() and must not be stolen.
                if path.exists() {
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        bail!("{} is in use by a running server", path.display());
                    }
                    std::fs::remove_file(path).with_context(|| {
                        format!("cannot remove stale socket {}", path.display())
                    })?;
                }
                let l = mio::net::UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                listeners.push(Listener::Unix(l, path.clone()));
            }
        }
    }
    Ok(listeners)
}
