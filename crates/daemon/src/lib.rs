//! The daemon: everything in tandem that touches a socket, a file, a thread or a clock.
//!
//! One event loop ([`reactor`]) owns the listeners, the client connections and the volumes'
//! engines, so a request travels from socket to page cache and back without a lock or a
//! thread hop. Only operations that block for long (fdatasync, O_DIRECT, large zeroing) go
//! to the [`worker`] pool and come back through a waker.

pub mod adjust;
mod bufpool;
mod busy_poll;
mod conn;
pub mod control_api;
pub mod events;
mod listener;
pub mod metrics;
mod nbd_glue;
pub mod node;
mod reactor;
mod rmw;
pub mod serve;
mod serve_core;
pub mod tls;
mod worker;

pub use serve::{ExportConfig, ListenAddr, ServeConfig};

/// An error and its causes on one line, `context: cause: cause`, as `{:#}` prints it but
/// without a cause whose text is already there: many errors put their source in their own
/// message (`{path}: {source}`), so `{:#}` would name the OS error twice.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out += ": ";
        }
        out += &text;
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(2);
        let storage = tandem_storage::StorageError::Io {
            path: "/srv/r0.img".into(),
            source: io,
        };
        let e = anyhow::Error::new(storage).context("volume 0");
        assert_eq!(
            format!("{e:#}").matches("os error 2").count(),
            2,
            "the case this is for"
        );
        let line = super::error_chain(&e);
        assert_eq!(
            line,
            "volume 0: /srv/r0.img: No such file or directory (os error 2)"
        );
    }
}
