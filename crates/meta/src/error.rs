//! Typed errors. The pure layers (layout, superblock, activity-log format) say what is
//! wrong with a value or a block; the store adds which file, which slot or block, which
//! offset, and how an operator recovers.

use std::io;

/// Recovery advice for metadata that cannot be trusted.
pub const RECREATE_HINT: &str = "inspect it with `tandem dump-md`; `tandem create-md --force` \
     reinitialises it and the replica is then resynced in full from a peer";

/// A geometry or size that cannot be laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("max-peers {value} is out of range 1..=31")]
    MaxPeers { value: u8 },

    #[error("al-extents {value} is out of range 7..=65534")]
    AlExtents { value: u32 },

    #[error(
        "an activity-log ring of {value} blocks does not fit al-extents {al_extents}: \
         it needs {min}..={max} blocks of 4 KiB"
    )]
    RingBlocks {
        value: u32,
        min: u32,
        max: u32,
        al_extents: u32,
    },

    #[error("a data size of 0 bytes")]
    DataSizeZero,

    #[error("a data size of {size} bytes is above the supported {max} bytes")]
    DataTooLarge { size: u64, max: u64 },

    #[error("internal metadata needs a data size that is a multiple of 4096, not {size}")]
    DataMisaligned { size: u64 },

    #[error(
        "the backing store holds {store_size} bytes but internal metadata with this geometry \
         needs at least {needed} (4 KiB of data plus the metadata): use a larger store, \
         fewer max-peers, or external metadata"
    )]
    StoreTooSmall { store_size: u64, needed: u64 },
}

/// Why one 4 KiB superblock copy cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    #[error("the block is all zeroes (never written, or wiped)")]
    Blank,

    #[error("bad magic {} (not tandem metadata)", show_magic(found))]
    BadMagic { found: [u8; 8] },

    #[error("checksum mismatch: stored {stored:08x}, computed {computed:08x} (torn or corrupted)")]
    Checksum { stored: u32, computed: u32 },

    #[error("unsupported format version {found}: this build reads versions 1 and 2")]
    UnsupportedVersion { found: u32 },

    #[error("geometry out of range: {0}")]
    Geometry(LayoutError),

    #[error("{field}: {detail}")]
    Field { field: &'static str, detail: String },

    #[error("bitmap slots {first} and {second} both belong to node {node_id}")]
    DuplicatePeer {
        node_id: u8,
        first: usize,
        second: usize,
    },
}

fn show_magic(m: &[u8; 8]) -> String {
    m.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

/// Why neither superblock copy can be loaded (`pick_superblock`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    #[error("slot 0: {slot0}; slot 1: {slot1}")]
    BothInvalid {
        slot0: SuperblockError,
        slot1: SuperblockError,
    },

    /// The valid copy says the node shut down cleanly and the other copy's header does
    /// not show it as part of an update around that version (torn while entering or
    /// leaving CLEAN): it was damaged at rest, and might have held a newer version.
    #[error(
        "slot {invalid_slot}: {problem}; slot {valid_slot} is valid (seq {valid_seq}) and marked \
         CLEAN, and slot {invalid_slot} is not a write torn next to it (its header {header}): it \
         was damaged at rest and may have held a newer version"
    )]
    DamagedAtRest {
        valid_slot: usize,
        valid_seq: u64,
        invalid_slot: usize,
        problem: SuperblockError,
        /// What the damaged copy's header shows, e.g. "is unreadable" or "says seq 12".
        header: String,
    },

    #[error("both slots hold seq {seq} with different contents (two writers?)")]
    SameSeqDiffer { seq: u64 },
}

/// Why one activity-log block cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlBlockError {
    #[error("the block is all zeroes (never written)")]
    Blank,

    #[error("bad magic {found:08x}")]
    BadMagic { found: u32 },

    #[error("checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum { stored: u32, computed: u32 },

    #[error("{field}: {detail}")]
    Field { field: &'static str, detail: String },
}

/// Why the activity log cannot be replayed (or a table handed to `ActivityLog::new` is
/// unusable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlError {
    #[error("ring of {blocks} blocks: at least 2 are needed")]
    RingTooSmall { blocks: usize },

    #[error("no block of the ring holds a valid transaction (block 0: {first_problem})")]
    NoValidBlock { first_problem: AlBlockError },

    #[error(
        "block {block} should hold transaction {expected_seq} (the newest is {newest_seq}): \
         {problem}"
    )]
    Invalid {
        block: u32,
        expected_seq: u64,
        newest_seq: u64,
        problem: AlBlockError,
    },

    #[error(
        "block {block} holds transaction {found_seq} where transaction {expected_seq} belongs \
         (the newest is {newest_seq})"
    )]
    UnexpectedSeq {
        block: u32,
        expected_seq: u64,
        found_seq: u64,
        newest_seq: u64,
    },

    #[error("block {block} holds transaction {seq}, which belongs in block {home}")]
    Misplaced { block: u32, seq: u64, home: u64 },

    #[error("block {block} is for a log of {found} extents, block {other} for {expected}")]
    SizeMismatch {
        block: u32,
        found: u32,
        other: u32,
        expected: u32,
    },

    #[error("extent {extent} is in slots {first} and {second}")]
    DuplicateExtent {
        extent: u32,
        first: u32,
        second: u32,
    },

    #[error("slot {slot} of the table is in no transaction's window")]
    Incomplete { slot: u32 },

    #[error("a table of {len} slots for a log of {al_extents} extents")]
    TableSize { len: usize, al_extents: u32 },

    #[error("table slot {slot}: extent {extent} is out of range")]
    BadExtent { slot: u32, extent: u32 },

    #[error("{0}")]
    Geometry(LayoutError),
}

/// `ActivityLog::clean` was called while the log is busy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the activity log is busy: {in_use} extent uses, {waiting} waiting writes, \
     transaction in flight: {in_flight}"
)]
pub struct AlBusy {
    pub in_use: u64,
    pub waiting: usize,
    pub in_flight: bool,
}

/// An error of the metadata store: names the target (file or device) and what was done.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{target}: {op} of {len} bytes at offset {offset} failed: {source}")]
    Io {
        target: String,
        op: &'static str,
        offset: u64,
        len: u64,
        source: io::Error,
    },

    #[error("{target}: {source}")]
    Layout { target: String, source: LayoutError },

    #[error("{target} holds {size} bytes but {what} needs {needed}")]
    TooSmall {
        target: String,
        size: u64,
        needed: u64,
        what: String,
    },

    #[error(
        "{target}: no usable metadata superblock (slot 0 at offset {}, slot 1 at offset {}): \
         {source}; {hint}",
        offsets[0], offsets[1], hint = RECREATE_HINT
    )]
    Superblock {
        target: String,
        offsets: [u64; 2],
        source: Box<PickError>,
    },

    #[error("{target}: superblock (offset {offset}) does not match {detail}; {hint}", hint = RECREATE_HINT)]
    Mismatch {
        target: String,
        offset: u64,
        detail: String,
    },

    #[error(
        "{target}: the activity log (ring at offset {offset}) cannot be replayed: {source}; \
         it names the 4 MiB extents that may differ from the peers after a crash, so {hint}",
        hint = RECREATE_HINT
    )]
    Al {
        target: String,
        offset: u64,
        source: Box<AlError>,
    },

    #[error("{target}: refusing to write an invalid superblock: {source}")]
    InvalidSuperblock {
        target: String,
        source: Box<SuperblockError>,
    },

    #[error("{target}: a caller error: {detail}")]
    Usage { target: String, detail: String },
}

impl MetaError {
    pub(crate) fn usage(target: String, detail: impl Into<String>) -> MetaError {
        MetaError::Usage {
            target,
            detail: detail.into(),
        }
    }
}
