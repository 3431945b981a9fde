//! The NBD protocol (fixed newstyle), as the server side sees it.
//!
//! - [`wire`]: the numbers the protocol is made of.
//! - [`export`]: what a client can be offered (size, block sizes, transmission flags).
//! - [`handshake`]: option haggling up to the transmission phase.
//! - [`meta`]: metadata contexts (`base:allocation`): the LIST/SET options' data and what
//!   their queries select.
//! - [`request`]: the transmission-phase request stream: framing, validation, payload skipping.
//! - [`reply`]: encoders for simple and structured replies.
//! - [`block_status`]: a store's allocation map as the descriptors of a block status reply.

pub mod block_status;
pub mod export;
pub mod handshake;
pub mod meta;
pub mod reply;
pub mod request;
pub mod wire;

pub use block_status::{Extent, Stretch};
pub use export::{BlockSizes, ExportInfo};
pub use handshake::{CloseReason, Handshake, HandshakeStep, Negotiated, TlsMode};
pub use request::{Command, Decoded, Rejection, Request, RequestDecoder, TransmissionParams};
pub use wire::Errno;
