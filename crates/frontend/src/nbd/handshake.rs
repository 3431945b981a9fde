//! Fixed-newstyle option haggling, from the server's greeting to the transmission phase.
//!
//! [`Handshake`] is a pure state machine: the driver hands it whatever bytes arrived and gets
//! back how many it consumed, the bytes to send, and whether to go on, enter transmission,
//! start TLS or hang up. It never blocks and never allocates per byte.
//!
//! TLS (`NBD_OPT_STARTTLS`, the spec's "TLS support") is decided here and carried out by the
//! driver: under [`TlsMode::On`] (the spec's SELECTIVETLS with no TLS-only export) or
//! [`TlsMode::Require`] (FORCEDTLS) the answer to STARTTLS is an ACK and
//! [`HandshakeStep::StartTls`]; the driver sends the ACK in the clear, wraps the socket in
//! TLS, and feeds the decrypted bytes that follow to the same `Handshake`, which goes on with
//! the options, all negotiation state from before STARTTLS forgotten. Under `Require` every
//! option before STARTTLS but ABORT is answered `NBD_REP_ERR_TLS_REQD`, and an
//! `NBD_OPT_EXPORT_NAME` (which cannot be answered with an error) hangs up.

use super::export::ExportInfo;
use super::meta::{self, MetaRequest};
use super::wire::*;

/// Options larger than this are not buffered: the client is hung up on (the spec allows a
/// hard disconnect against what amounts to a denial of service).
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// A client that keeps haggling past this many options is hung up on.
pub const MAX_OPTIONS: u32 = 1024;

/// The outcome of the handshake for a client that reached the transmission phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Index into the export table passed to [`Handshake::feed`].
    pub export: usize,
    pub structured_replies: bool,
    pub transmission_flags: u16,
    /// The id of `base:allocation` if the client selected it for this export:
    /// `NBD_CMD_BLOCK_STATUS` is allowed only then.
    pub meta_context: Option<u32>,
    /// The client asked for `NBD_INFO_BLOCK_SIZE` in its `NBD_OPT_GO` and so agreed to
    /// honour the block sizes it was sent. Any other client (`NBD_OPT_EXPORT_NAME`, or GO
    /// without the request) may send requests of any byte granularity (the spec's default
    /// minimum block size is 1).
    pub block_sizes: bool,
}

/// Why the server hangs up during the handshake. Each is logged with the client's address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    #[error("client sent unknown client flags {0:#x}")]
    BadClientFlags(u32),
    #[error("client did not negotiate fixed newstyle")]
    NotFixedNewstyle,
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
    #[error("option {option} with {len} bytes of data exceeds the {MAX_OPTION_LEN}-byte limit")]
    OptionTooLong { option: u32, len: u32 },
    #[error("more than {MAX_OPTIONS} options")]
    TooManyOptions,
    #[error("client aborted the negotiation")]
    Aborted,
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    #[error("NBD_OPT_EXPORT_NAME refused: {0}")]
    ExportNameRefused(&'static str),
    #[error("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS: this server requires TLS")]
    TlsRequired,
}

/// What a server offers of TLS (the spec's server modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// NOTLS: `NBD_OPT_STARTTLS` is refused with `NBD_REP_ERR_POLICY`.
    #[default]
    Off,
    /// TLS at the client's choice (SELECTIVETLS with no TLS-only export): STARTTLS is
    /// accepted, and a client that never sends it is served in the clear.
    On,
    /// FORCEDTLS: nothing but STARTTLS and ABORT is accepted before TLS.
    Require,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Everything complete was consumed; wait for more bytes.
    NeedMore,
    /// Negotiation finished; any bytes after the consumed ones belong to the transmission phase.
    Done(Negotiated),
    /// Hang up after sending what is in the output buffer.
    Close(CloseReason),
    /// `NBD_OPT_STARTTLS` was accepted: send what is in the output buffer (the ACK) in the
    /// clear, then start TLS (as the server) on the connection. Every byte after the
    /// consumed ones is TLS; feed this handshake what TLS decrypts from then on.
    StartTls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    ClientFlags,
    Options,
    Finished,
}

/// Server side of one connection's handshake.
#[derive(Debug)]
pub struct Handshake {
    state: State,
    no_zeroes: bool,
    structured: bool,
    /// The export (index) the last `NBD_OPT_SET_META_CONTEXT` selected `base:allocation` for.
    meta_for: Option<usize>,
    options: u32,
    refusals: Vec<String>,
    tls_mode: TlsMode,
    /// STARTTLS was accepted: everything since goes through TLS.
    tls: bool,
    /// An option was refused with `NBD_REP_ERR_TLS_REQD` (logged once per connection: a
    /// plaintext client tries several before it gives up).
    tls_refused: bool,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    /// A handshake of a server without TLS.
    pub fn new() -> Handshake {
        Handshake::with_tls(TlsMode::Off)
    }

    /// A handshake of a server offering TLS as `mode` says.
    pub fn with_tls(tls_mode: TlsMode) -> Handshake {
        Handshake {
            state: State::ClientFlags,
            no_zeroes: false,
            structured: false,
            meta_for: None,
            options: 0,
            refusals: Vec::new(),
            tls_mode,
            tls: false,
            tls_refused: false,
        }
    }

    /// Whether STARTTLS was accepted on this connection.
    pub fn tls_started(&self) -> bool {
        self.tls
    }

    /// The server's opening bytes.
    pub fn greeting(out: &mut Vec<u8>) {
        out.extend_from_slice(&NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    }

    /// Refused options since the last call, for the log (the client got an error reply).
    pub fn take_refusals(&mut self) -> Vec<String> {
        std::mem::take(&mut self.refusals)
    }

    /// Consumes as many complete messages from `input` as there are. `exports[0]` is the
    /// default export (the empty name). `shutting_down` makes every option but ABORT fail
    /// with `NBD_REP_ERR_SHUTDOWN`.
    pub fn feed(
        &mut self,
        input: &[u8],
        exports: &[ExportInfo],
        shutting_down: bool,
        out: &mut Vec<u8>,
    ) -> (usize, HandshakeStep) {
        let mut consumed = 0;
        loop {
            let rest = &input[consumed..];
            match self.state {
                State::Finished => return (consumed, HandshakeStep::NeedMore),
                State::ClientFlags => {
                    let Some(flags) = rest.get(..4) else {
                        return (consumed, HandshakeStep::NeedMore);
                    };
                    consumed += 4;
                    let flags = u32::from_be_bytes(flags.try_into().unwrap());
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        return self.close(consumed, CloseReason::BadClientFlags(flags));
                    }
                    if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
                        // Plain newstyle clients only know EXPORT_NAME and cannot parse option
                        // replies; we only speak fixed newstyle.
                        return self.close(consumed, CloseReason::NotFixedNewstyle);
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = State::Options;
                }
                State::Options => {
                    let Some(hdr) = rest.get(..16) else {
                        return (consumed, HandshakeStep::NeedMore);
                    };
                    let magic = u64::from_be_bytes(hdr[0..8].try_into().unwrap());
                    let option = u32::from_be_bytes(hdr[8..12].try_into().unwrap());
                    let len = u32::from_be_bytes(hdr[12..16].try_into().unwrap());
                    if magic != IHAVEOPT {
                        return self.close(consumed + 16, CloseReason::BadOptionMagic(magic));
                    }
                    if len > MAX_OPTION_LEN {
                        return self
                            .close(consumed + 16, CloseReason::OptionTooLong { option, len });
                    }
                    let total = 16 + len as usize;
                    let Some(msg) = rest.get(..total) else {
                        return (consumed, HandshakeStep::NeedMore);
                    };
                    consumed += total;
                    self.options += 1;
                    if self.options > MAX_OPTIONS {
                        return self.close(consumed, CloseReason::TooManyOptions);
                    }
                    if let Some(step) = self.option(option, &msg[16..], exports, shutting_down, out)
                    {
                        return (consumed, step);
                    }
                }
            }
        }
    }

    fn close(&mut self, consumed: usize, reason: CloseReason) -> (usize, HandshakeStep) {
        self.state = State::Finished;
        (consumed, HandshakeStep::Close(reason))
    }

    /// Handles one option; `Some` ends the handshake.
    fn option(
        &mut self,
        option: u32,
        data: &[u8],
        exports: &[ExportInfo],
        shutting_down: bool,
        out: &mut Vec<u8>,
    ) -> Option<HandshakeStep> {
        if shutting_down && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                self.state = State::Finished;
                return Some(HandshakeStep::Close(CloseReason::ExportNameRefused(
                    "server is shutting down",
                )));
            }
            self.error(out, option, REP_ERR_SHUTDOWN, "server is shutting down");
            return None;
        }
        if self.tls_mode == TlsMode::Require
            && !self.tls
            && option != OPT_STARTTLS
            && option != OPT_ABORT
        {
            if option == OPT_EXPORT_NAME {
                self.state = State::Finished;
                return Some(HandshakeStep::Close(CloseReason::TlsRequired));
            }
            self.error(
                out,
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            );
            return None;
        }
        match option {
            OPT_EXPORT_NAME => {
                let name = match std::str::from_utf8(data) {
                    Ok(n) => n,
                    Err(_) => {
                        self.state = State::Finished;
                        return Some(HandshakeStep::Close(CloseReason::ExportNameRefused(
                            "export name is not UTF-8",
                        )));
                    }
                };
                self.state = State::Finished;
                let Some(index) = find_export(exports, name) else {
                    return Some(HandshakeStep::Close(CloseReason::UnknownExport(
                        name.to_string(),
                    )));
                };
                let export = &exports[index];
                let flags = export.transmission_flags(self.structured);
                out.extend_from_slice(&export.size.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Some(HandshakeStep::Done(self.negotiated(index, flags, false)))
            }
            OPT_ABORT => {
                reply(out, option, REP_ACK, &[]);
                self.state = State::Finished;
                Some(HandshakeStep::Close(CloseReason::Aborted))
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.error(out, option, REP_ERR_INVALID, "NBD_OPT_LIST carries no data");
                    return None;
                }
                for e in exports.iter().filter(|e| !e.name.is_empty()) {
                    let mut payload = Vec::with_capacity(4 + e.name.len() + e.description.len());
                    payload.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    payload.extend_from_slice(e.name.as_bytes());
                    payload.extend_from_slice(e.description.as_bytes());
                    reply(out, option, REP_SERVER, &payload);
                }
                reply(out, option, REP_ACK, &[]);
                None
            }
            OPT_STARTTLS => self.starttls(data, out),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.error(
                        out,
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY carries no data",
                    );
                } else if self.structured {
                    self.error(
                        out,
                        option,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    );
                } else {
                    self.structured = true;
                    reply(out, option, REP_ACK, &[]);
                }
                None
            }
            OPT_INFO | OPT_GO => self.info_or_go(option, data, exports, out),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data, exports, out);
                None
            }
            _ => {
                self.error(out, option, REP_ERR_UNSUP, "option not supported");
                None
            }
        }
    }

    fn starttls(&mut self, data: &[u8], out: &mut Vec<u8>) -> Option<HandshakeStep> {
        let option = OPT_STARTTLS;
        if self.tls_mode == TlsMode::Off {
            self.error(
                out,
                option,
                REP_ERR_POLICY,
                "TLS is not configured on this server",
            );
        } else if !data.is_empty() {
            self.error(
                out,
                option,
                REP_ERR_INVALID,
                "NBD_OPT_STARTTLS carries no data",
            );
        } else if self.tls {
            self.error(out, option, REP_ERR_INVALID, "TLS is already running");
        } else {
            reply(out, option, REP_ACK, &[]);
            self.tls = true;
            // The spec: nothing negotiated before STARTTLS survives it (a man in the middle
            // could have sent it).
            self.structured = false;
            self.meta_for = None;
            return Some(HandshakeStep::StartTls);
        }
        None
    }

    fn info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
        exports: &[ExportInfo],
        out: &mut Vec<u8>,
    ) -> Option<HandshakeStep> {
        let Some(parsed) = parse_info_request(data) else {
            self.error(
                out,
                option,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/NBD_OPT_GO request",
            );
            return None;
        };
        let (name, requests) = parsed;
        let Some(index) = find_export(exports, name) else {
            self.error(
                out,
                option,
                REP_ERR_UNKNOWN,
                // Bounded, so 1024 probes for long names cannot pile up megabytes of messages.
                &format!(
                    "export {:?} not found",
                    name.chars().take(64).collect::<String>()
                ),
            );
            return None;
        };
        let export = &exports[index];
        let flags = export.transmission_flags(self.structured);
        let mut info = Vec::with_capacity(16);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&export.size.to_be_bytes());
        info.extend_from_slice(&flags.to_be_bytes());
        reply(out, option, REP_INFO, &info);
        let wants = |item: u16| {
            requests
                .chunks_exact(2)
                .any(|c| u16::from_be_bytes([c[0], c[1]]) == item)
        };
        if wants(INFO_NAME) {
            info.clear();
            info.extend_from_slice(&INFO_NAME.to_be_bytes());
            info.extend_from_slice(export.name.as_bytes());
            reply(out, option, REP_INFO, &info);
        }
        if wants(INFO_DESCRIPTION) && !export.description.is_empty() {
            info.clear();
            info.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
            info.extend_from_slice(export.description.as_bytes());
            reply(out, option, REP_INFO, &info);
        }
        // Only to a client that asked: a GO that asked binds the client to these sizes,
        // and every other client is served at any byte granularity (the spec's default
        // minimum of 1), which an unasked minimum of 512 would contradict (libnbd, for
        // one, then refuses unaligned requests itself).
        let asked = wants(INFO_BLOCK_SIZE);
        if asked {
            info.clear();
            info.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
            info.extend_from_slice(&export.block.minimum.to_be_bytes());
            info.extend_from_slice(&export.block.preferred.to_be_bytes());
            info.extend_from_slice(&export.block.maximum.to_be_bytes());
            reply(out, option, REP_INFO, &info);
        }
        reply(out, option, REP_ACK, &[]);
        if option == OPT_GO {
            self.state = State::Finished;
            return Some(HandshakeStep::Done(self.negotiated(index, flags, asked)));
        }
        None
    }

    fn negotiated(&self, export: usize, transmission_flags: u16, block_sizes: bool) -> Negotiated {
        Negotiated {
            export,
            structured_replies: self.structured,
            transmission_flags,
            // The spec ties the selection to the export then entered; one made for another
            // export does not carry over.
            meta_context: (self.meta_for == Some(export)).then_some(meta::BASE_ALLOCATION_ID),
            block_sizes,
        }
    }

    /// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
    fn meta_context(
        &mut self,
        option: u32,
        data: &[u8],
        exports: &[ExportInfo],
        out: &mut Vec<u8>,
    ) {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            // A SET replaces the selection even when it fails.
            self.meta_for = None;
            // Block status is only ever answered in structured replies (LIST may come
            // first: it selects nothing).
            if !self.structured {
                let msg = "NBD_OPT_SET_META_CONTEXT needs structured replies negotiated first";
                return self.error(out, option, REP_ERR_INVALID, msg);
            }
        }
        let request = match MetaRequest::parse(data) {
            Ok(r) => r,
            Err(e) => return self.error(out, option, REP_ERR_INVALID, &e.to_string()),
        };
        let Some(index) = find_export(exports, request.export) else {
            let name: String = request.export.chars().take(64).collect();
            return self.error(
                out,
                option,
                REP_ERR_UNKNOWN,
                &format!("export {name:?} not found"),
            );
        };
        if set {
            if request.selects_base_allocation() {
                self.meta_for = Some(index);
                let payload = meta::context_reply(meta::BASE_ALLOCATION_ID, meta::BASE_ALLOCATION);
                reply(out, option, REP_META_CONTEXT, &payload);
            }
        } else if let Some(name) = request.listed() {
            // The id of a listed context is reserved; the spec asks for zero.
            reply(out, option, REP_META_CONTEXT, &meta::context_reply(0, name));
        }
        reply(out, option, REP_ACK, &[]);
    }

    fn error(&mut self, out: &mut Vec<u8>, option: u32, kind: u32, message: &str) {
        reply(out, option, kind, message.as_bytes());
        if kind == REP_ERR_TLS_REQD {
            if self.tls_refused {
                return;
            }
            self.tls_refused = true;
        }
        self.refusals.push(format!(
            "option {} refused ({}): {message}",
            option_name(option),
            rep_name(kind)
        ));
    }
}

/// `u32 name length, name, u16 count, count × u16`; `None` if the lengths disagree or the
/// name is not a valid string.
fn parse_info_request(data: &[u8]) -> Option<(&str, &[u8])> {
    let name_len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    if name_len > MAX_STRING {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let count_at = 4 + name_len;
    let count = u16::from_be_bytes(data.get(count_at..count_at + 2)?.try_into().ok()?) as usize;
    let requests = data.get(count_at + 2..)?;
    if requests.len() != count * 2 {
        return None;
    }
    let name = std::str::from_utf8(name).ok()?;
    if name.contains('\0') {
        return None;
    }
    Some((name, requests))
}

fn find_export(exports: &[ExportInfo], name: &str) -> Option<usize> {
    if name.is_empty() {
        return if exports.is_empty() { None } else { Some(0) };
    }
    exports.iter().position(|e| e.name == name)
}

fn reply(out: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

fn option_name(option: u32) -> String {
    match option {
        OPT_EXPORT_NAME => "EXPORT_NAME".into(),
        OPT_ABORT => "ABORT".into(),
        OPT_LIST => "LIST".into(),
        OPT_STARTTLS => "STARTTLS".into(),
        OPT_INFO => "INFO".into(),
        OPT_GO => "GO".into(),
        OPT_STRUCTURED_REPLY => "STRUCTURED_REPLY".into(),
        OPT_LIST_META_CONTEXT => "LIST_META_CONTEXT".into(),
        OPT_SET_META_CONTEXT => "SET_META_CONTEXT".into(),
        11 => "EXTENDED_HEADERS".into(),
        n => format!("#{n}"),
    }
}

fn rep_name(kind: u32) -> &'static str {
    match kind {
        REP_ERR_UNSUP => "ERR_UNSUP",
        REP_ERR_POLICY => "ERR_POLICY",
        REP_ERR_INVALID => "ERR_INVALID",
        REP_ERR_UNKNOWN => "ERR_UNKNOWN",
        REP_ERR_SHUTDOWN => "ERR_SHUTDOWN",
        REP_ERR_TLS_REQD => "ERR_TLS_REQD",
        _ => "ERR",
    }
}
