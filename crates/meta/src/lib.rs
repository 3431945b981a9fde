//! tandem's on-disk metadata for one replica of a volume: the superblock (identity,
//! geometry, generation ids, peer slots), the per-peer bitmaps and the activity log.
//!
//! The format (docs/METADATA.md) is encoded and decoded by pure code: `layout`,
//! `superblock`, `bitmap`, `al` (the activity log's format, replay and state machine).
//! `store` is the thin IO layer over a `MetaTarget` (`FileTarget`, or `PmemTarget` for
//! persistent memory); `dump` renders everything for the tools.

pub mod al;
pub mod bitmap;
pub mod dump;
pub mod error;
pub mod layout;
mod le;
pub mod pmem;
pub mod store;
pub mod superblock;
pub mod target;

pub use al::{replay, ActivityLog, AlReplay, Begin, SyncMark, Transaction, WaitId};
pub use dump::{uuid_text, MetaDump};
pub use error::{AlBusy, AlError, LayoutError, MetaError, PickError, SuperblockError};
pub use layout::{Geometry, Layout, Placement, AL_EXTENT, BITMAP_BLOCK, MD_BLOCK};
pub use pmem::{NonDax, PmemTarget};
pub use store::{CreateInfo, Loaded, Locate, MetaStore};
pub use superblock::{
    pick_superblock, PeerFlags, PeerSlot, Picked, SbFlags, SlotProblem, SlotRepair, Superblock,
};
pub use target::{FileTarget, MetaTarget};
