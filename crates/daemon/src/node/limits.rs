//! The open-file limit: a node needs about four descriptors a resource (a replication
//! listener, an NBD socket, a backing file, a peer connection), so the common soft limit
//! of 1024 stops it near 250 resources (`Too many open files`, resources half-connected).
//! It is raised to the hard limit at start, as servers that hold many sockets do, and
//! `status` says when the descriptors in use come near it.

use crate::control_api::OpenFiles;
use tracing::{info, warn};

/// Descriptors a node with `resources` resources needs, with some to spare: five each
/// at the peak, when every resource dials its peers at once (a thousand resources on one
/// node hold about 4,000 once settled, and briefly 5,000).
pub fn needed(resources: usize) -> u64 {
    5 * resources as u64 + 64
}

/// Raises the soft open-file limit to the hard one; says so, and warns when even the
/// hard limit is below what `resources` need.
pub fn raise_open_files(resources: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return warn!(
            "reading the open-file limit failed: {}",
            std::io::Error::last_os_error()
        );
    }
    let (soft, hard) = (lim.rlim_cur, lim.rlim_max);
    if soft < hard {
        lim.rlim_cur = hard;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
            info!("open-file limit {soft} raised to the hard limit {hard}");
        } else {
            let e = std::io::Error::last_os_error();
            warn!("raising the open-file limit {soft} to {hard} failed: {e}");
        }
    }
    let need = needed(resources);
    if hard < need {
        warn!("the open-file hard limit {hard} is below the ~{need} that {resources} resources need: raise it (LimitNOFILE= in the systemd unit, or ulimit -Hn) or some resources will not connect");
    }
}

/// Descriptors open now, and the limit (None if /proc is not there).
pub fn open_files() -> Option<OpenFiles> {
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some(OpenFiles {
        open,
        limit: lim.rlim_cur,
    })
}
