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
mod nbd_glue;
pub mod node;
mod reactor;
pub mod serve;
mod serve_core;
mod worker;

pub use serve::{ExportConfig, ListenAddr, ServeConfig};
