//! The NBD protocol (fixed newstyle), as the server side sees it.
//!
//! - [`wire`]: the numbers the protocol is made of.
//! - [`export`]: what a client can be offered (size, block sizes, transmission flags).
//! - [`handshake`]: option haggling up to the transmission phase.
//! - [`request`]: the transmission-phase request stream: framing, validation, payload skipping.
//! - [`reply`]: encoders for simple and structured replies.

pub mod export;
pub mod handshake;
pub mod reply;
pub mod request;
pub mod wire;

pub use export::{BlockSizes, ExportInfo};
pub use handshake::{CloseReason, Handshake, HandshakeStep, Negotiated};
pub use request::{Command, Decoded, Rejection, Request, RequestDecoder, TransmissionParams};
pub use wire::Errno;
