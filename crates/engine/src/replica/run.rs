//! A Primary's run (its node and incarnation) and what a replica records of the one it
//! takes writes from: the state of `writer.rs`, kept on a floor of its own so that the
//! types holding it (`Replicas`, `LocalVol`, `Event`) need not look up at the room.

use super::bitmap::Bitmap;
use super::spec::NodeId;

/// One run of a Primary: its node and its incarnation (new at every start of its engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrimaryRun {
    pub node: NodeId,
    pub incarnation: u64,
}

#[derive(Debug, Default)]
pub(super) struct Writer {
    /// The run whose writes we take, as the metadata must say before any of them lands.
    pub(super) run: Option<PrimaryRun>,
    /// We kept a lost Primary's unsettled writes in this run of ours.
    pub(super) compared: bool,
}

/// A replica back from a crash that took writes from `run`: `log` holds its activity
/// log's extents (the suspect ranges it restarted with).
#[derive(Debug)]
pub(super) struct CrashedUnder {
    pub(super) run: PrimaryRun,
    pub(super) log: Bitmap,
}
