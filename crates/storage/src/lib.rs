//! Where a replica's bytes live: a regular file or a block device.
//!
//! The functions here are blocking and synchronous; the daemon decides which of them run
//! inline on its event loop (buffered reads and writes land in the page cache in microseconds)
//! and which go to a worker thread (fdatasync, O_DIRECT).

mod aligned;
mod backing;

pub use aligned::AlignedBuf;
pub use backing::{Backing, BackingKind, OpenOptions, Span, StorageError, ZeroError};
