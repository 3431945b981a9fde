//! The vocabulary between a driver and the engine.

/// Names one application request for its whole life. Chosen by the driver (it is usually an
/// index into the driver's own request table), opaque to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// An application request, already validated by the frontend (aligned, inside the volume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    Read {
        offset: u64,
        len: u32,
    },
    /// The payload stays with the driver under the request's [`ReqId`].
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    /// `may_punch`: the range may be deallocated. `fast`: fail with [`IoError::NotFast`]
    /// rather than write zeroes.
    Zero {
        offset: u64,
        len: u32,
        fua: bool,
        may_punch: bool,
        fast: bool,
    },
    Flush,
    Cache {
        offset: u64,
        len: u32,
    },
}

impl Io {
    pub fn is_write(&self) -> bool {
        matches!(self, Io::Write { .. } | Io::Trim { .. } | Io::Zero { .. })
    }
    fn fua(&self) -> bool {
        matches!(
            self,
            Io::Write { fua: true, .. } | Io::Trim { fua: true, .. } | Io::Zero { fua: true, .. }
        )
    }
    pub(crate) fn needs_flush_after(&self) -> bool {
        self.fua()
    }
}

/// Why a request failed, in terms the frontend can map to its protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// The storage reported an error (errno as reported by the OS).
    Os(i32),
    /// A fast zero was asked for and would have been slow.
    NotFast,
    /// The volume cannot serve I/O (its disk failed, or it has no up-to-date data).
    NoData,
    /// Writes are not allowed here (read-only, or not Primary).
    ReadOnly,
    /// The Primary has no quorum and `on-no-quorum` is `io-error` (see `replica/quorum.rs`).
    NoQuorum,
}

/// Identifies a disk operation when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiskToken {
    /// The operation that carries out this request's data (read, write, trim, zero, cache).
    Req(ReqId),
    /// A durability barrier (fdatasync) with this sequence number.
    Flush(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskKind {
    /// Read into the driver's reply buffer for the request.
    Read {
        offset: u64,
        len: u32,
    },
    /// Write the request's payload.
    Write {
        offset: u64,
        len: u32,
    },
    Trim {
        offset: u64,
        len: u32,
    },
    Zero {
        offset: u64,
        len: u32,
        may_punch: bool,
        fast: bool,
    },
    Cache {
        offset: u64,
        len: u32,
    },
    /// Make every write that completed before this was issued durable.
    Flush,
    /// Map the range into data and holes, for a peer's block status: the driver puts the
    /// map (at most `tandem_wire::packet::MAX_ALLOC_EXTENTS` extents from `offset`, each an
    /// `AllocExtent` in its wire form) in the reply buffer, as a read does, and reports it
    /// with [`Resource::allocation_done`](crate::replica::Resource::allocation_done). It
    /// changes nothing and needs no buffer from the engine.
    Allocation {
        offset: u64,
        len: u32,
    },
}

impl DiskKind {
    /// Where the operation starts (0 for a flush).
    pub fn offset(&self) -> u64 {
        match *self {
            DiskKind::Read { offset, .. }
            | DiskKind::Write { offset, .. }
            | DiskKind::Trim { offset, .. }
            | DiskKind::Zero { offset, .. }
            | DiskKind::Cache { offset, .. }
            | DiskKind::Allocation { offset, .. } => offset,
            DiskKind::Flush => 0,
        }
    }

    /// How many bytes it covers (0 for a flush).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u32 {
        match *self {
            DiskKind::Read { len, .. }
            | DiskKind::Write { len, .. }
            | DiskKind::Trim { len, .. }
            | DiskKind::Zero { len, .. }
            | DiskKind::Cache { len, .. }
            | DiskKind::Allocation { len, .. } => len,
            DiskKind::Flush => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskOp {
    pub token: DiskToken,
    pub kind: DiskKind,
    /// The request completes only after a later barrier (FUA). Drivers echo the op back
    /// unchanged in the completion, so the engine needs no table for this.
    pub barrier_after: bool,
}

impl DiskOp {
    pub fn flush(seq: u64) -> DiskOp {
        DiskOp {
            token: DiskToken::Flush(seq),
            kind: DiskKind::Flush,
            barrier_after: false,
        }
    }
}

/// What the engine asks its driver to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Disk(DiskOp),
    /// Answer the application. For a successful read, the data is whatever the driver read
    /// for this request.
    Complete {
        req: ReqId,
        result: Result<(), IoError>,
    },
}
