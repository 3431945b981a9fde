//! The replicated engine: one resource, its volumes and its peers, as a sans-IO state
//! machine (see `docs/ARCHITECTURE.md`, "How a replicated write travels").
//!
//! Drivers call [`Resource`]'s event methods — an application request, a disk completion,
//! a packet from a peer, a peer connection going up or down, a clock tick, an administrator
//! verb — and execute the [`RAction`]s it pushes. Payload bytes never enter the engine: they
//! are named by [`DataRef`] and stay with the driver.
//!
//! Rooms (the map with what each owns and handles is in `docs/ARCHITECTURE.md`, "The
//! engine's rooms"): `resource` dispatches over `replicas` (our replicas and the peers')
//! and `requests` (the Primary's application I/O: `writes`, `reads`, `barriers`, block
//! statuses);
//! `receive` is what a Secondary does for its peers (`apply` queue), `sync` the
//! out-of-sync lists and who syncs whom, `pull` a sync target's pulling (`resync`, `pace`),
//! `settle` the peer acks (`acks`), `writer` the Primary's run a crash may trust,
//! `generation` and `standing` the ids and the contest, `persist` what a restart keeps,
//! `bitmap_gi` from which id a peer's bitmap counts, `split_brain` the after-split-brain
//! policies and their verdict; `local`, `peer`, `event`, `msg`,
//! `action`, `spec`, `status`, `nodeset`, `bitmap`, `overlap` and `run` hold the types.

mod acks;
mod action;
mod apply;
mod barriers;
mod bitmap;
mod bitmap_gi;
mod event;
mod generation;
mod in_sync;
mod local;
mod msg;
mod nodeset;
mod overlap;
mod pace;
mod peer;
mod persist;
mod plan_ahead;
mod primaries;
mod pull;
mod quorum;
mod reads;
mod receive;
mod replicas;
mod requests;
mod resource;
mod resync;
mod role;
mod run;
mod settle;
mod spec;
mod split_brain;
mod standing;
mod status;
mod sync;
mod tiebreak;
mod writer;
mod writes;

pub use acks::DELAY_MS as PEER_ACK_DELAY_MS;
pub use action::{AutoPromote, DemoteError, InvalidateError, PromoteError, RAction};
pub use bitmap::Bitmap;
pub use event::{DiskChange, Event, LinkLoss, LocalFailure, ProtocolError, RoleChange};
pub use generation::{lineage, GenIds, Lineage, GI_HISTORY};
pub use msg::{DataRef, Msg, Token};
pub use nodeset::NodeSet;
pub use pace::ResyncRates;
pub use persist::{AbandonedId, IdsAtCrash, NotQuiet, Persisted, PersistedPeer, RestoreError};
pub use quorum::{OnNoQuorum, QuorumCount, QuorumSpec, Votes};
pub use requests::AllocationMap;
pub use resource::AddPeerError;
pub use resource::Resource;
pub use run::PrimaryRun;
pub use spec::{NodeId, Protocol, ReplicaAtStart, ResourceSpec};
pub use split_brain::{
    decide as decide_split_brain, AfterSb0Pri, AfterSb1Pri, AfterSb2Pri, AfterSplitBrain,
    DiscardMyDataError, Report as SplitBrainReport, SbPolicy, Unresolved, Verdict,
};
pub use status::{PeerStatus, PeerVolumeStatus, Repl, Status, VolumeQuorum, VolumeStatus};
pub use tandem_wire::packet::{DiskState, Role};
