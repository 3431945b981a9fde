//! The activity log: which 4 MiB extents may have writes in flight, so that after a crash
//! only those (plus what the bitmaps record) need resync.
//!
//! `format` is one transaction block, `replay` rebuilds the table from the ring, `log` is
//! the state machine the replication engine embeds. All three are pure.

pub mod format;
pub mod log;
pub mod replay;

pub use format::{AlBlock, AlKind, AlUpdate, EXTENT_NONE};
pub use log::{ActivityLog, Begin, SyncMark, Transaction, WaitId};
pub use replay::{replay, AlReplay};
