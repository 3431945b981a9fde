//! The replicated engine: one resource, its volumes and its peers, as a sans-IO state
//! machine (see `docs/ARCHITECTURE.md`, "How a replicated write travels").
//!
//! Drivers call [`Resource`]'s event methods — an application request, a disk completion,
//! a packet from a peer, a peer connection going up or down, a clock tick, an administrator
//! verb — and execute the [`RAction`]s it pushes. Payload bytes never enter the engine: they
//! are named by [`DataRef`] and stay with the driver.
//!
//! Rooms: `spec` (what a resource is), `msg` (what goes to peers, how disk operations and
//! payloads are named), `action` (what the driver is asked to do), `status`, `nodeset`, `peer` (one
//! peer's state), `resync` (a sync target's progress), `bitmap` and `overlap` (data
//! structures), and `resource`, the dispatcher that holds them together.

mod action;
mod apply;
mod barriers;
mod bitmap;
mod event;
mod local;
mod msg;
mod nodeset;
mod overlap;
mod peer;
mod reads;
mod receive;
mod replicas;
mod requests;
mod resource;
mod resync;
mod spec;
mod status;
mod sync;
mod writes;

pub use action::{DemoteError, PromoteError, RAction};
pub use bitmap::Bitmap;
pub use event::{DiskChange, Event, LinkLoss, LocalFailure, ProtocolError};
pub use msg::{DataRef, Msg, Token};
pub use nodeset::NodeSet;
pub use resource::Resource;
pub use spec::{NodeId, Protocol, ReplicaAtStart, ResourceSpec};
pub use status::{PeerStatus, PeerVolumeStatus, Repl, Status, VolumeStatus};
pub use tandem_wire::packet::{DiskState, Role};
