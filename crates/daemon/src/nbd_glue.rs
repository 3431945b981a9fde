//! The NBD request glue `tandem serve` and `tandem node` share: a decoded command as the
//! engine's request, the engine's error as the errno and message a client gets, and block
//! status answered from a store's allocation map (ours, or a peer's sent to us).

use std::io;
use tandem_engine::{Io, IoError};
use tandem_frontend::nbd::{block_status, reply, Command, Errno, Request, Stretch};
use tandem_storage::Backing;
use tandem_wire::packet::{AllocExtent, MAX_ALLOC_EXTENTS};

/// Spans of a file's allocation map one block status request reads at most: about twice
/// as many lseek calls on the event loop, however fragmented the file. A longer map is
/// answered in part, and clients ask again from where the answer ends.
const MAX_SPANS: usize = 256;
/// With `NBD_CMD_FLAG_REQ_ONE` only the first descriptor is sent: a few spans are enough
/// to know where it ends (a hole narrower than a block merges into the data around it).
const MAX_SPANS_ONE: usize = 4;

/// The engine's request for an NBD command (not `Disconnect`: a connection's own matter).
pub(crate) fn io_of(req: &Request) -> Io {
    let (offset, len) = (req.offset, req.len);
    match req.command {
        Command::Read => Io::Read { offset, len },
        Command::Write { fua } => Io::Write { offset, len, fua },
        Command::Trim { fua } => Io::Trim { offset, len, fua },
        Command::WriteZeroes { fua, no_hole, fast } => Io::Zero {
            offset,
            len,
            fua,
            may_punch: !no_hole,
            fast,
        },
        Command::Flush => Io::Flush,
        Command::Cache => Io::Cache { offset, len },
        Command::Disconnect => unreachable!("a disconnect is handled by the connection"),
        Command::BlockStatus { .. } => unreachable!("block status is answered by the driver"),
    }
}

/// Answers a block status request (`base:allocation`) into `out`: from the allocation map
/// of `store` if given, else the whole range as data (what a server may always say).
/// `min_block`: the export's minimum block size, which every descriptor is a multiple of.
pub(crate) fn block_status(
    out: &mut Vec<u8>,
    req: &Request,
    min_block: u32,
    store: Option<&Backing>,
) {
    let req_one = matches!(req.command, Command::BlockStatus { req_one: true, .. });
    let cap = if req_one { MAX_SPANS_ONE } else { MAX_SPANS };
    let map = store
        .map(|b| b.allocation(req.offset, u64::from(req.len), cap))
        .unwrap_or_default();
    let map = map.iter().map(|s| Stretch {
        len: s.len,
        hole: s.hole,
    });
    answer_block_status(out, req, min_block, map);
}

/// Answers a block status request from the map an up-to-date peer sent (extents in their
/// wire form, `AllocReply`'s), or, without one, with the whole range as data. The peer's
/// extents are of its replica of the same volume: the same offsets, from the request's.
pub(crate) fn block_status_from_peer(
    out: &mut Vec<u8>,
    req: &Request,
    min_block: u32,
    extents: Option<&[u8]>,
) {
    let map = extents
        .into_iter()
        .flat_map(AllocExtent::decode_all)
        .map(|e| Stretch {
            len: u64::from(e.len),
            hole: e.hole,
        });
    answer_block_status(out, req, min_block, map);
}

fn answer_block_status(
    out: &mut Vec<u8>,
    req: &Request,
    min_block: u32,
    map: impl IntoIterator<Item = Stretch>,
) {
    let Command::BlockStatus { req_one, context } = req.command else {
        unreachable!("not a block status request: {req:?}")
    };
    let extents = block_status::descriptors(req.offset, req.len, min_block, req_one, map);
    reply::block_status(out, req.cookie, context, &extents);
}

/// The map of a range of `backing` for a peer's block status, in `AllocReply`'s wire form:
/// at most `MAX_ALLOC_EXTENTS` extents, as many system calls on the event loop as a local
/// block status costs. Returns the number of extents.
pub(crate) fn allocation_extents(
    backing: &Backing,
    offset: u64,
    len: u32,
    out: &mut Vec<u8>,
) -> u32 {
    let spans = backing.allocation(offset, u64::from(len), MAX_ALLOC_EXTENTS);
    for s in &spans {
        // A span lies inside the range asked, whose length is a u32.
        let len = u32::try_from(s.len).unwrap_or(u32::MAX);
        AllocExtent { len, hole: s.hole }.encode(out);
    }
    spans.len() as u32
}

/// Answers a request that arrived while the daemon shuts down: it is not started.
pub(crate) fn refuse_shutting_down(out: &mut Vec<u8>, structured: bool, cookie: u64) {
    let msg = "server is shutting down";
    reply::error(out, structured, cookie, Errno::Shutdown, msg);
}

/// Where the engine runs: its errors mean a little more in a replicated node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// `tandem serve`: one local volume.
    Local,
    /// `tandem node`: a replicated volume.
    Replicated,
}

/// The errno and message for a failed request.
pub(crate) fn describe(e: IoError, served: Served) -> (Errno, String) {
    match (e, served) {
        (IoError::Os(code), _) => (
            Errno::from_os(code),
            format!("I/O error: {}", io::Error::from_raw_os_error(code)),
        ),
        (IoError::NotFast, Served::Local) => {
            (Errno::NotSup, "zeroing this range would not be fast".into())
        }
        (IoError::NotFast, Served::Replicated) => (
            Errno::NotSup,
            "zeroing would not be fast on every replica".into(),
        ),
        (IoError::NoData, Served::Local) => (
            Errno::Io,
            "the volume's disk has failed; no I/O is served".into(),
        ),
        (IoError::NoData, Served::Replicated) => {
            (Errno::Io, "no up-to-date replica is reachable".into())
        }
        (IoError::ReadOnly, Served::Local) => (Errno::Perm, "the volume is read-only".into()),
        (IoError::ReadOnly, Served::Replicated) => (Errno::Perm, "this node is not Primary".into()),
        (IoError::NoQuorum, _) => (
            Errno::Io,
            "this node has no quorum (it reaches too few replicas; see `tandem status`)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_map_to_requests() {
        let req = |command| Request {
            cookie: 1,
            offset: 4096,
            len: 512,
            command,
        };
        assert_eq!(
            io_of(&req(Command::WriteZeroes {
                fua: true,
                no_hole: true,
                fast: false
            })),
            Io::Zero {
                offset: 4096,
                len: 512,
                fua: true,
                may_punch: false,
                fast: false
            }
        );
        assert_eq!(io_of(&req(Command::Flush)), Io::Flush);
        assert_eq!(
            describe(IoError::ReadOnly, Served::Replicated).0,
            Errno::Perm
        );
    }

    #[test]
    fn block_status_without_a_store_is_one_data_descriptor() {
        let req = Request {
            cookie: 5,
            offset: 8192,
            len: 1 << 20,
            command: Command::BlockStatus {
                req_one: false,
                context: 3,
            },
        };
        let mut out = Vec::new();
        block_status(&mut out, &req, 4096, None);
        let mut want = Vec::new();
        let data = tandem_frontend::nbd::Extent {
            len: 1 << 20,
            flags: 0,
        };
        reply::block_status(&mut want, 5, 3, &[data]);
        assert_eq!(out, want);
    }

    /// A peer's map, as its extents came: the same descriptors a local map gives (holes in
    /// whole minimum blocks, cut at the request's end); none, or an error, all data.
    #[test]
    fn block_status_from_a_peers_extents() {
        let req = Request {
            cookie: 7,
            offset: 4096,
            len: 65536,
            command: Command::BlockStatus {
                req_one: false,
                context: 2,
            },
        };
        let mut extents = Vec::new();
        for (len, hole) in [(6144, true), (4096, false), (1 << 20, true)] {
            AllocExtent { len, hole }.encode(&mut extents);
        }
        let mut out = Vec::new();
        block_status_from_peer(&mut out, &req, 4096, Some(&extents));
        let mut want = Vec::new();
        let ext = |len, flags| tandem_frontend::nbd::Extent { len, flags };
        let hole = tandem_frontend::nbd::wire::STATE_HOLE | tandem_frontend::nbd::wire::STATE_ZERO;
        // 4096..10240 is a hole over one whole block; the data block 10240..14336 makes
        // 8192..16384 data; the rest is a hole up to the request's end.
        let descriptors = [ext(4096, hole), ext(8192, 0), ext(53248, hole)];
        reply::block_status(&mut want, 7, 2, &descriptors);
        assert_eq!(out, want);
        let mut out = Vec::new();
        block_status_from_peer(&mut out, &req, 4096, None);
        let mut want = Vec::new();
        reply::block_status(&mut want, 7, 2, &[ext(65536, 0)]);
        assert_eq!(out, want);
    }
}
