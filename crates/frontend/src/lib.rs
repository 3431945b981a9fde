//! tandem's application-facing frontend.
//!
//! Everything here is sans-IO: functions and state machines that take bytes and return
//! decisions and bytes. The daemon owns the sockets; the fuzzers and unit tests drive the
//! same code without any.

pub mod nbd;
