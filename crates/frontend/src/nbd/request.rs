//! The transmission-phase request stream: framing, validation against the export, and
//! skipping the payload of writes that are refused.
//!
//! The decoder only looks at bytes; it never trusts a length before checking it, so a hostile
//! client can cost us at most the bytes it sends.

use super::export::BlockSizes;
use super::wire::*;

pub const REQUEST_HEADER_LEN: usize = 28;

/// What the decoder checks requests against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransmissionParams {
    pub size: u64,
    pub read_only: bool,
    pub block: BlockSizes,
    pub structured_replies: bool,
    /// The id of the metadata context the client selected (`Negotiated::meta_context`):
    /// `NBD_CMD_BLOCK_STATUS` is refused without one.
    pub meta_context: Option<u32>,
    /// The client agreed to honour `block` (`Negotiated::block_sizes`): a request not
    /// aligned to its minimum is refused. Any other client may address single bytes; the
    /// maximum payload and the export's bounds hold for every client.
    pub block_sizes: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read,
    Write {
        fua: bool,
    },
    Flush,
    Trim {
        fua: bool,
    },
    WriteZeroes {
        fua: bool,
        no_hole: bool,
        fast: bool,
    },
    Cache,
    /// `req_one`: answer with exactly one descriptor. `context`: the id the reply names.
    BlockStatus {
        req_one: bool,
        context: u32,
    },
    Disconnect,
}

impl Command {
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
        )
    }
}

/// A request that passed validation: inside the export, and aligned to the minimum block
/// size if the client agreed to block sizes (`TransmissionParams::block_sizes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
    pub command: Command,
}

/// A request that gets an error reply instead of being executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub cookie: u64,
    pub command: u16,
    pub offset: u64,
    pub len: u32,
    pub errno: Errno,
    pub reason: &'static str,
}

/// Reasons to hang up on a client in the transmission phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid request; for writes `payload` is exactly `len` bytes, otherwise empty.
    Request(Request, &'a [u8]),
    /// Answer with an error; any payload has been consumed.
    Rejected(Rejection),
    /// A valid write whose payload is not yet complete, returned only when streaming is
    /// enabled ([`RequestDecoder::stream_writes_from`]) and the write is that large. Only the
    /// header was consumed: the caller must consume exactly `len` payload bytes itself
    /// (typically by reading them straight into the write's own buffer) before decoding on.
    WriteHeader(Request),
    /// Wait until the buffer holds at least `need` bytes from the current position.
    NeedMore { need: usize },
    /// Hang up.
    Fatal(ProtocolError),
}

/// Splits a byte stream into requests.
#[derive(Debug)]
pub struct RequestDecoder {
    params: TransmissionParams,
    /// A refused write whose payload is still being discarded.
    skipping: Option<(Rejection, u64)>,
    /// Writes at least this large are handed over as [`Decoded::WriteHeader`].
    stream_from: Option<u32>,
}

impl RequestDecoder {
    pub fn new(params: TransmissionParams) -> RequestDecoder {
        RequestDecoder {
            params,
            skipping: None,
            stream_from: None,
        }
    }

    /// Lets the caller receive the payload of writes of at least `len` bytes itself, so a
    /// large payload need not pass through the input buffer.
    pub fn stream_writes_from(&mut self, len: u32) {
        self.stream_from = Some(len);
    }

    pub fn params(&self) -> &TransmissionParams {
        &self.params
    }

    /// Decodes the next item from `buf`, returning how many bytes it consumed. A result of
    /// `NeedMore` may still have consumed bytes (payload being skipped).
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> (usize, Decoded<'a>) {
        if let Some((rejection, remaining)) = self.skipping.as_mut() {
            let n = (*remaining).min(buf.len() as u64);
            *remaining -= n;
            if *remaining == 0 {
                let rejection = *rejection;
                self.skipping = None;
                return (n as usize, Decoded::Rejected(rejection));
            }
            return (n as usize, Decoded::NeedMore { need: 1 });
        }
        let Some(hdr) = buf.get(..REQUEST_HEADER_LEN) else {
            return (
                0,
                Decoded::NeedMore {
                    need: REQUEST_HEADER_LEN,
                },
            );
        };
        let magic = u32::from_be_bytes(hdr[0..4].try_into().unwrap());
        if magic != REQUEST_MAGIC {
            return (0, Decoded::Fatal(ProtocolError::BadMagic(magic)));
        }
        let flags = u16::from_be_bytes(hdr[4..6].try_into().unwrap());
        let typ = u16::from_be_bytes(hdr[6..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(hdr[8..16].try_into().unwrap());
        let offset = u64::from_be_bytes(hdr[16..24].try_into().unwrap());
        let len = u32::from_be_bytes(hdr[24..28].try_into().unwrap());
        let payload_len = if typ == CMD_WRITE { len as usize } else { 0 };

        match validate(&self.params, flags, typ, offset, len) {
            Ok(command) => {
                let total = REQUEST_HEADER_LEN + payload_len;
                match buf.get(REQUEST_HEADER_LEN..total) {
                    Some(payload) => (
                        total,
                        Decoded::Request(
                            Request {
                                cookie,
                                offset,
                                len,
                                command,
                            },
                            payload,
                        ),
                    ),
                    None if matches!(command, Command::Write { .. })
                        && self.stream_from.is_some_and(|t| len >= t) =>
                    {
                        let request = Request {
                            cookie,
                            offset,
                            len,
                            command,
                        };
                        (REQUEST_HEADER_LEN, Decoded::WriteHeader(request))
                    }
                    None => (0, Decoded::NeedMore { need: total }),
                }
            }
            Err((errno, reason)) => {
                let rejection = Rejection {
                    cookie,
                    command: typ,
                    offset,
                    len,
                    errno,
                    reason,
                };
                if payload_len == 0 {
                    return (REQUEST_HEADER_LEN, Decoded::Rejected(rejection));
                }
                self.skipping = Some((rejection, payload_len as u64));
                let (n, decoded) = self.decode(&buf[REQUEST_HEADER_LEN..]);
                (REQUEST_HEADER_LEN + n, decoded)
            }
        }
    }
}

/// Checks one request header against the export. The order matters only for which error a
/// request with several faults gets; it follows the spec's "SHOULD"s.
fn validate(
    p: &TransmissionParams,
    flags: u16,
    typ: u16,
    offset: u64,
    len: u32,
) -> Result<Command, (Errno, &'static str)> {
    let fua = flags & CMD_FLAG_FUA != 0;
    let allowed = match typ {
        CMD_BLOCK_STATUS if p.meta_context.is_none() || !p.structured_replies => {
            return Err((
                Errno::Inval,
                "block status without a metadata context negotiated",
            ))
        }
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        CMD_READ if p.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_READ | CMD_WRITE | CMD_DISC | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        _ => return Err((Errno::Inval, "unknown command")),
    };
    if flags & !allowed != 0 {
        return Err((Errno::Inval, "command flag not valid for this command"));
    }
    let command = match typ {
        CMD_READ => Command::Read,
        CMD_WRITE => Command::Write { fua },
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => {
            if offset != 0 || len != 0 {
                return Err((Errno::Inval, "flush with non-zero offset or length"));
            }
            return Ok(Command::Flush);
        }
        CMD_TRIM => Command::Trim { fua },
        CMD_CACHE => Command::Cache,
        CMD_BLOCK_STATUS => Command::BlockStatus {
            req_one: flags & CMD_FLAG_REQ_ONE != 0,
            context: p.meta_context.expect("checked above"),
        },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            fua,
            no_hole: flags & CMD_FLAG_NO_HOLE != 0,
            fast: flags & CMD_FLAG_FAST_ZERO != 0,
        },
        _ => unreachable!("filtered above"),
    };
    if p.read_only && command.is_write() {
        return Err((Errno::Perm, "write to a read-only export"));
    }
    if len == 0 {
        return Err((Errno::Inval, "zero-length request"));
    }
    if matches!(command, Command::Read | Command::Write { .. }) && len > p.block.maximum {
        return Err((Errno::Inval, "length exceeds the maximum block size"));
    }
    let min = u64::from(p.block.minimum);
    let aligned = offset.is_multiple_of(min) && u64::from(len).is_multiple_of(min);
    if p.block_sizes && !aligned {
        return Err((
            Errno::Inval,
            "offset or length not aligned to the minimum block size",
        ));
    }
    let in_bounds = offset
        .checked_add(u64::from(len))
        .is_some_and(|end| end <= p.size);
    if !in_bounds {
        // The spec asks for ENOSPC on writes past the end and EINVAL otherwise ("read or trim").
        let writes_data = matches!(command, Command::Write { .. } | Command::WriteZeroes { .. });
        let errno = if writes_data {
            Errno::NoSpc
        } else {
            Errno::Inval
        };
        return Err((errno, "request beyond the end of the export"));
    }
    Ok(command)
}

/// Encodes a request header (for tests, fuzzers and the benchmark tools; the server never
/// sends requests).
pub fn encode_request(out: &mut Vec<u8>, flags: u16, typ: u16, cookie: u64, offset: u64, len: u32) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&typ.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}
