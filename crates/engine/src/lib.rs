//! The engine: what happens to an application's I/O between the frontend and the disks.
//!
//! It is sans-IO. Drivers (the daemon, the simulator) feed it events — a new request, a disk
//! completion — and execute the [`Action`]s it returns. It never sees a byte of data, a
//! socket or a file: payloads stay with the driver, named by the request they belong to.
//! `sync_plan` is the drivers' sans-IO part of durability: which fdatasync answers which
//! flush the engine asked for, and starting one ahead of it; `driver` is the rest they
//! share: the data store that resolves the engine's data references, and the order in
//! which actions are carried out.

pub mod driver;
mod flush;
mod io;
pub mod replica;
pub mod sync_plan;
mod volume;

pub use flush::FlushBatcher;
pub use io::{Action, DiskKind, DiskOp, DiskToken, Io, IoError, ReqId};
pub use volume::{DiskState, Volume};
