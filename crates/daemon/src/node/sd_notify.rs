//! systemd's readiness protocol (`Type=notify`): a datagram to `$NOTIFY_SOCKET` once every
//! resource listens (`READY=1`), and as the node begins to stop (`STOPPING=1`). Without
//! the variable (not under systemd) nothing is sent. A path starting with `@` names an
//! abstract socket.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use tracing::warn;

pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        warn!("telling systemd {state:?} through {path} failed: {e}");
    }
}
