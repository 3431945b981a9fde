//! The replicated engine: one resource, its volumes and its peers, as a sans-IO state
//! machine (see `docs/ARCHITECTURE.md`, "How a replicated write travels").
//!
//! Drivers call [`Resource`]'s event methods — an application request, a disk completion,
//! a packet from a peer, a peer connection going up or down, a clock tick, an administrator
//! verb — and execute the [`RAction`]s it pushes. Payload bytes never enter the engine: they
//! are named by [`DataRef`] and stay with the driver.

mod bitmap;
mod overlap;
mod resource;

pub use bitmap::Bitmap;
pub use resource::*;
