//! Encoders for transmission-phase replies. They append to a caller-owned buffer so a batch of
//! replies goes out in one write.

use super::block_status::Extent;
use super::wire::*;

/// A simple reply header; for a successful read on a connection without structured replies
/// the data follows it.
#[inline]
pub fn simple(out: &mut Vec<u8>, cookie: u64, error: u32) {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&b);
}

pub const SIMPLE_REPLY_LEN: usize = 16;
pub const STRUCTURED_HEADER_LEN: usize = 20;
/// Header of an `OFFSET_DATA` chunk including its 8-byte offset.
pub const DATA_CHUNK_HEADER_LEN: usize = STRUCTURED_HEADER_LEN + 8;

fn structured_header(out: &mut Vec<u8>, flags: u16, typ: u16, cookie: u64, len: u32) {
    let mut b = [0u8; STRUCTURED_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&typ.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&b);
}

/// The final `OFFSET_DATA` chunk of a read: header and offset; `len` data bytes follow.
#[inline]
pub fn read_data_chunk(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32) {
    structured_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        cookie,
        len + 8,
    );
    out.extend_from_slice(&offset.to_be_bytes());
}

/// The `BLOCK_STATUS` chunk for metadata context `context`, final: tandem offers one
/// context, so a reply is this one chunk. `extents` must not be empty (the spec asks for at
/// least one descriptor).
pub fn block_status(out: &mut Vec<u8>, cookie: u64, context: u32, extents: &[Extent]) {
    debug_assert!(!extents.is_empty());
    let len = 4 + 8 * extents.len() as u32;
    structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, len);
    out.extend_from_slice(&context.to_be_bytes());
    for e in extents {
        out.extend_from_slice(&e.len.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
    }
}

/// A final error chunk with a human-readable message (truncated to fit the spec's limits).
pub fn structured_error(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let mut msg = &message.as_bytes()[..message.len().min(MAX_STRING)];
    while std::str::from_utf8(msg).is_err() {
        msg = &msg[..msg.len() - 1];
    }
    structured_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + msg.len() as u32,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// An error reply in whichever form the connection negotiated. Reads on a structured
/// connection must not get a simple reply; everything else may, but the message helps.
pub fn error(out: &mut Vec<u8>, structured: bool, cookie: u64, errno: Errno, message: &str) {
    if structured {
        structured_error(out, cookie, errno.code(), message);
    } else {
        simple(out, cookie, errno.code());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_status_chunk_layout() {
        let mut out = vec![0xee];
        let extents = [
            Extent {
                len: 4096,
                flags: 0,
            },
            Extent {
                len: 1 << 20,
                flags: STATE_HOLE | STATE_ZERO,
            },
        ];
        block_status(&mut out, 0x0102_0304_0506_0708, 9, &extents);
        let mut want = vec![0xee];
        want.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        want.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
        want.extend_from_slice(&5u16.to_be_bytes());
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        want.extend_from_slice(&20u32.to_be_bytes()); // 4 + 2 × 8
        want.extend_from_slice(&9u32.to_be_bytes());
        for (len, flags) in [(4096u32, 0u32), (1 << 20, 3)] {
            want.extend_from_slice(&len.to_be_bytes());
            want.extend_from_slice(&flags.to_be_bytes());
        }
        assert_eq!(out, want);
    }
}
