//! The superblock: one 4 KiB block, kept twice, naming the replica (device uuid, node id),
//! its geometry, its generation ids and its peers' bitmap slots. Encoding, validation and
//! the rule that picks one of the two copies are pure; `store.rs` does the IO.

use std::fmt;

use crate::error::{PickError, SuperblockError};
use crate::layout::{
    Geometry, Layout, Placement, AL_EXTENT, BITMAP_BLOCK, MAX_NODE_ID, MAX_PEERS, MD_BLOCK_BYTES,
};
use crate::le::{crc_with_hole, first_nonzero, get_u32, get_u64, put_u32, put_u64};

pub const MAGIC: [u8; 8] = *b"TANDEMMD";
/// The format written for metadata with an unsynced map: 3 adds to 2 the Primary's run
/// the replica takes writes from (a version-2 superblock is read, and written back as 3).
pub const VERSION: u32 = 3;
/// An unsynced map and a boot id, no Primary's run: still read.
pub const VERSION_2: u32 = 2;
/// The first format (no unsynced map, no boot id): still read and written as such.
pub const VERSION_1: u32 = 1;
/// Previous generation ids kept, newest first.
pub const HISTORY_LEN: usize = 8;
/// Marks a free peer slot on disk.
const NO_NODE: u8 = 0xff;

/// Byte offsets of the fields (METADATA.md has the same table).
pub(crate) mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const CRC: usize = 12;
    pub const SEQ: usize = 16;
    pub const FLAGS: usize = 24;
    pub const NODE_ID: usize = 28;
    pub const MAX_PEERS: usize = 29;
    pub const PLACEMENT: usize = 30;
    pub const RESERVED_31: usize = 31;
    pub const AL_EXTENTS: usize = 32;
    pub const AL_RING_BLOCKS: usize = 36;
    pub const BITMAP_BLOCK: usize = 40;
    pub const AL_EXTENT_SIZE: usize = 44;
    pub const DATA_SIZE: usize = 48;
    pub const MD_OFFSET: usize = 56;
    pub const MD_SIZE: usize = 64;
    pub const DEVICE_UUID: usize = 72;
    pub const CURRENT_GI: usize = 80;
    pub const HISTORY: usize = 88;
    pub const ABANDONED_GI: usize = 152;
    pub const PEERS: usize = 160;
    pub const PEER_SIZE: usize = 32;
    pub const PEER_NODE_ID: usize = 0;
    pub const PEER_FLAGS: usize = 4;
    pub const PEER_BITMAP_GI: usize = 8;
    pub const PEERS_END: usize = PEERS + 31 * PEER_SIZE;
    /// Versions 2 and 3.
    pub const BOOT_ID: usize = PEERS_END;
    pub const BOOT_ID_END: usize = BOOT_ID + 16;
    /// Version 3 only: the Primary's node (0xff: none), 7 reserved bytes, its incarnation.
    pub const WRITER_NODE: usize = BOOT_ID_END;
    pub const WRITER_INCARNATION: usize = WRITER_NODE + 8;
    pub const WRITER_END: usize = WRITER_INCARNATION + 8;
}

macro_rules! flags {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $bit:expr, $text:literal;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(u32);

        impl $name {
            $($(#[$fm])* pub const $flag: $name = $name($bit);)*
            pub const EMPTY: $name = $name(0);
            /// Every flag this version knows.
            pub const ALL: $name = $name(0 $(| $bit)*);
            const NAMES: &'static [($name, &'static str)] = &[$(($name::$flag, $text)),*];

            pub fn bits(self) -> u32 {
                self.0
            }

            /// `None` if `bits` holds a flag this version does not know.
            pub fn from_bits(bits: u32) -> Option<$name> {
                (bits & !Self::ALL.0 == 0).then_some($name(bits))
            }

            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            pub fn insert(&mut self, other: $name) {
                self.0 |= other.0;
            }

            pub fn remove(&mut self, other: $name) {
                self.0 &= !other.0;
            }

            pub fn set(&mut self, other: $name, on: bool) {
                if on { self.insert(other) } else { self.remove(other) }
            }

            /// The names of the flags set, in bit order.
            pub fn names(self) -> Vec<&'static str> {
                Self::NAMES
                    .iter()
                    .filter(|(f, _)| self.contains(*f))
                    .map(|(_, n)| *n)
                    .collect()
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.names().join("|"))
            }
        }
    };
}

flags! {
    /// The replica's state flags.
    SbFlags {
        /// The data is consistent (not in the middle of being resynced).
        CONSISTENT = 1 << 0, "consistent";
        /// The data was UpToDate when last written.
        WAS_UP_TO_DATE = 1 << 1, "was-up-to-date";
        /// The node was Primary when this was written.
        PRIMARY = 1 << 2, "primary";
        /// The node crashed while Primary (set at attach after finding PRIMARY without CLEAN).
        CRASHED_PRIMARY = 1 << 3, "crashed-primary";
        /// Shut down cleanly: the bitmaps on disk are complete and the activity log holds
        /// nothing that needs replay.
        CLEAN = 1 << 4, "clean";
        /// This replica must be resynced in full (after create or invalidate).
        FULL_SYNC = 1 << 5, "full-sync";
        /// The activity log was not kept up to date (al-updates off): a crash means a
        /// full resync.
        AL_DISABLED = 1 << 6, "al-disabled";
        /// `abandoned_gi` was set aside when quorum was lost (it ranks this replica no
        /// higher among equal ids).
        ABANDONED_WITHOUT_QUORUM = 1 << 7, "abandoned-without-quorum";
    }
}

flags! {
    /// Flags of one peer's bitmap slot.
    PeerFlags {
        /// The peer belongs to the resource.
        EXISTS = 1 << 0, "exists";
        /// The peer must be resynced from us in full.
        FULL_SYNC = 1 << 1, "full-sync";
        /// We wrote some of the slot's blocks as Primary while apart from the peer (a
        /// split brain if it did too).
        WROTE_APART = 1 << 2, "wrote-apart";
        /// `bitmap_gi` holds: the slot's bitmap names every block the peer may lack of
        /// the data since that generation (which may be 0, the first of every lineage).
        BITMAP_GI = 1 << 3, "bitmap-gi";
    }
}

/// One bitmap slot: which peer it tracks and against which generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSlot {
    /// The peer whose out-of-sync blocks this slot records; `None` = free.
    pub node_id: Option<u8>,
    /// The generation the bitmap records changes against (DRBD's bitmap UUID); meaningful
    /// only with [`PeerFlags::BITMAP_GI`].
    pub bitmap_gi: u64,
    pub flags: PeerFlags,
}

impl PeerSlot {
    pub const FREE: PeerSlot = PeerSlot {
        node_id: None,
        bitmap_gi: 0,
        flags: PeerFlags::EMPTY,
    };

    /// A slot for a configured peer.
    pub fn new(node_id: u8) -> PeerSlot {
        PeerSlot {
            node_id: Some(node_id),
            bitmap_gi: 0,
            flags: PeerFlags::EXISTS,
        }
    }
}

/// The decoded superblock. `seq` is assigned by the store on every write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub seq: u64,
    pub flags: SbFlags,
    /// Our own node id (0..=31).
    pub node_id: u8,
    pub layout: Layout,
    /// Random identity of this replica, made at create.
    pub device_uuid: u64,
    /// Generation ids: compared by the replication engine, only stored here.
    pub current_gi: u64,
    pub history: [u64; HISTORY_LEN],
    /// The id the engine's ids were set back from at a crash as Primary (it acknowledged
    /// nothing under it), 0 if none: told to peers after a restart. Every version (the
    /// bytes were reserved, zero, before; an older build refuses a block that has one).
    pub abandoned_gi: u64,
    /// One entry per bitmap slot (`layout.geometry().max_peers` of them).
    pub peers: Vec<PeerSlot>,
    /// The kernel boot the replica was last attached in (`/proc/sys/kernel/random/boot_id`),
    /// zero if unknown. A crash in the same boot was the process's alone: the page cache
    /// kept its completed writes, so the unsynced map names nothing lost. Version 2 only
    /// (a version-1 superblock writes none and reads back zero).
    pub boot_id: [u8; 16],
    /// The Primary's run (node id, incarnation) the replica takes writes from, recorded
    /// before any of them lands: after a crash in the same boot, met again as Primary, it
    /// settles the activity log's extents. Version 3 only (read back as `None` from older
    /// ones, which write none).
    pub writer: Option<(u8, u64)>,
}

impl Superblock {
    /// The slot tracking `node_id`, if any.
    pub fn slot_of_peer(&self, node_id: u8) -> Option<usize> {
        self.peers.iter().position(|p| p.node_id == Some(node_id))
    }

    /// Pushes `gi` to the front of the history, dropping the oldest.
    pub fn push_history(&mut self, gi: u64) {
        self.history.rotate_right(1);
        self.history[0] = gi;
    }

    pub fn validate(&self) -> Result<(), SuperblockError> {
        let g = self.layout.geometry();
        if self.node_id > MAX_NODE_ID {
            return Err(field("node_id", format!("{} is above 31", self.node_id)));
        }
        if let Some((n, _)) = self.writer {
            if n > MAX_NODE_ID {
                return Err(field("writer", format!("node id {n} is above 31")));
            }
            if !g.unsynced_map {
                return Err(field("writer", "a version-1 superblock keeps none".into()));
            }
        }
        if self.peers.len() != usize::from(g.max_peers) {
            return Err(field(
                "peers",
                format!("{} slots for max-peers {}", self.peers.len(), g.max_peers),
            ));
        }
        for (i, p) in self.peers.iter().enumerate() {
            match p.node_id {
                None if *p != PeerSlot::FREE => {
                    return Err(field(
                        "peers",
                        format!("free slot {i} has a bitmap gi or flags"),
                    ));
                }
                None => {}
                Some(n) if n > MAX_NODE_ID => {
                    return Err(field("peers", format!("slot {i}: node id {n} is above 31")));
                }
                Some(n) if n == self.node_id => {
                    return Err(field(
                        "peers",
                        format!("slot {i} is for our own node id {n}"),
                    ));
                }
                Some(n) => {
                    if let Some(first) = self.peers[..i].iter().position(|q| q.node_id == Some(n)) {
                        return Err(SuperblockError::DuplicatePeer {
                            node_id: n,
                            first,
                            second: i,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<Box<[u8; MD_BLOCK_BYTES]>, SuperblockError> {
        self.validate()?;
        let g = self.layout.geometry();
        let mut b = Box::new([0u8; MD_BLOCK_BYTES]);
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&MAGIC);
        let v2 = g.unsynced_map;
        put_u32(
            &mut b[..],
            off::VERSION,
            if v2 { VERSION } else { VERSION_1 },
        );
        put_u64(&mut b[..], off::SEQ, self.seq);
        put_u32(&mut b[..], off::FLAGS, self.flags.bits());
        b[off::NODE_ID] = self.node_id;
        b[off::MAX_PEERS] = g.max_peers;
        b[off::PLACEMENT] = self.layout.placement().code();
        put_u32(&mut b[..], off::AL_EXTENTS, g.al_extents);
        put_u32(&mut b[..], off::AL_RING_BLOCKS, g.al_ring_blocks);
        put_u32(&mut b[..], off::BITMAP_BLOCK, BITMAP_BLOCK as u32);
        put_u32(&mut b[..], off::AL_EXTENT_SIZE, AL_EXTENT as u32);
        put_u64(&mut b[..], off::DATA_SIZE, self.layout.data_size());
        put_u64(&mut b[..], off::MD_OFFSET, self.layout.md_offset());
        put_u64(&mut b[..], off::MD_SIZE, self.layout.md_size());
        put_u64(&mut b[..], off::DEVICE_UUID, self.device_uuid);
        put_u64(&mut b[..], off::CURRENT_GI, self.current_gi);
        for (i, gi) in self.history.iter().enumerate() {
            put_u64(&mut b[..], off::HISTORY + 8 * i, *gi);
        }
        put_u64(&mut b[..], off::ABANDONED_GI, self.abandoned_gi);
        for (i, p) in self.peers.iter().enumerate() {
            let at = off::PEERS + i * off::PEER_SIZE;
            b[at + off::PEER_NODE_ID] = p.node_id.unwrap_or(NO_NODE);
            put_u32(&mut b[..], at + off::PEER_FLAGS, p.flags.bits());
            put_u64(&mut b[..], at + off::PEER_BITMAP_GI, p.bitmap_gi);
        }
        if v2 {
            b[off::BOOT_ID..off::BOOT_ID_END].copy_from_slice(&self.boot_id);
            let (node, incarnation) = self.writer.unwrap_or((NO_NODE, 0));
            b[off::WRITER_NODE] = node;
            put_u64(&mut b[..], off::WRITER_INCARNATION, incarnation);
        }
        let crc = crc_with_hole(&b[..], off::CRC);
        put_u32(&mut b[..], off::CRC, crc);
        Ok(b)
    }

    pub fn decode(b: &[u8; MD_BLOCK_BYTES]) -> Result<Superblock, SuperblockError> {
        if b.iter().all(|&x| x == 0) {
            return Err(SuperblockError::Blank);
        }
        let magic: [u8; 8] = b[off::MAGIC..off::MAGIC + 8].try_into().expect("8 bytes");
        if magic != MAGIC {
            return Err(SuperblockError::BadMagic { found: magic });
        }
        // Version before checksum: a newer format may checksum differently, and "newer
        // version" is the message an operator can act on.
        let version = get_u32(b, off::VERSION);
        if ![VERSION, VERSION_2, VERSION_1].contains(&version) {
            return Err(SuperblockError::UnsupportedVersion { found: version });
        }
        let v2 = version != VERSION_1;
        let v3 = version == VERSION;
        let tail = match version {
            VERSION => off::WRITER_END,
            VERSION_2 => off::BOOT_ID_END,
            _ => off::PEERS_END,
        };
        let stored = get_u32(b, off::CRC);
        let computed = crc_with_hole(b, off::CRC);
        if stored != computed {
            return Err(SuperblockError::Checksum { stored, computed });
        }
        let writer_reserved = if v3 {
            off::WRITER_NODE + 1..off::WRITER_INCARNATION
        } else {
            0..0
        };
        for range in [
            off::RESERVED_31..off::RESERVED_31 + 1,
            writer_reserved,
            tail..MD_BLOCK_BYTES,
        ] {
            if let Some(at) = first_nonzero(b, range) {
                return Err(field("reserved", format!("byte {at} is not zero")));
            }
        }
        let flags = get_u32(b, off::FLAGS);
        let flags = SbFlags::from_bits(flags)
            .ok_or_else(|| field("flags", format!("unknown flags {flags:#x}")))?;
        let bitmap_block = get_u32(b, off::BITMAP_BLOCK);
        if u64::from(bitmap_block) != BITMAP_BLOCK {
            return Err(field(
                "bitmap_block",
                format!("{bitmap_block} bytes per bit: this build supports 4096 only"),
            ));
        }
        let al_extent = get_u32(b, off::AL_EXTENT_SIZE);
        if u64::from(al_extent) != AL_EXTENT {
            return Err(field(
                "al_extent_size",
                format!("{al_extent} bytes per extent: this build supports 4 MiB only"),
            ));
        }
        let placement = Placement::from_code(b[off::PLACEMENT]).ok_or_else(|| {
            field(
                "placement",
                format!("unknown placement code {}", b[off::PLACEMENT]),
            )
        })?;
        let geometry = Geometry {
            max_peers: b[off::MAX_PEERS],
            al_extents: get_u32(b, off::AL_EXTENTS),
            al_ring_blocks: get_u32(b, off::AL_RING_BLOCKS),
            unsynced_map: v2,
        };
        let layout = Layout::new(placement, geometry, get_u64(b, off::DATA_SIZE))
            .map_err(SuperblockError::Geometry)?;
        for (name, at, want) in [
            ("md_offset", off::MD_OFFSET, layout.md_offset()),
            ("md_size", off::MD_SIZE, layout.md_size()),
        ] {
            let found = get_u64(b, at);
            if found != want {
                return Err(field(
                    name,
                    format!("{found}, but the geometry and data size give {want}"),
                ));
            }
        }
        let mut history = [0; HISTORY_LEN];
        for (i, gi) in history.iter_mut().enumerate() {
            *gi = get_u64(b, off::HISTORY + 8 * i);
        }
        let peers = decode_peers(b, geometry.max_peers)?;
        let sb = Superblock {
            seq: get_u64(b, off::SEQ),
            flags,
            node_id: b[off::NODE_ID],
            layout,
            device_uuid: get_u64(b, off::DEVICE_UUID),
            current_gi: get_u64(b, off::CURRENT_GI),
            history,
            abandoned_gi: get_u64(b, off::ABANDONED_GI),
            peers,
            boot_id: if v2 {
                b[off::BOOT_ID..off::BOOT_ID_END]
                    .try_into()
                    .expect("16 bytes")
            } else {
                [0; 16]
            },
            writer: match (v3, b[off::WRITER_NODE], get_u64(b, off::WRITER_INCARNATION)) {
                (false, ..) | (true, NO_NODE, 0) => None,
                (true, NO_NODE, i) => {
                    return Err(field("writer", format!("no node, but incarnation {i:#x}")));
                }
                (true, n, i) => Some((n, i)),
            },
        };
        sb.validate()?;
        Ok(sb)
    }
}

fn decode_peers(b: &[u8], max_peers: u8) -> Result<Vec<PeerSlot>, SuperblockError> {
    let mut peers = Vec::with_capacity(usize::from(max_peers));
    for i in 0..usize::from(MAX_PEERS) {
        let at = off::PEERS + i * off::PEER_SIZE;
        let entry = at..at + off::PEER_SIZE;
        if i >= usize::from(max_peers) {
            if let Some(at) = first_nonzero(b, entry) {
                return Err(field(
                    "peers",
                    format!("slot {i} is beyond max-peers {max_peers} but byte {at} is set"),
                ));
            }
            continue;
        }
        if let Some(at) = first_nonzero(b, at + 1..at + off::PEER_FLAGS) {
            return Err(field("reserved", format!("byte {at} is not zero")));
        }
        if let Some(at) = first_nonzero(b, at + 16..at + off::PEER_SIZE) {
            return Err(field("reserved", format!("byte {at} is not zero")));
        }
        let flag_bits = get_u32(b, at + off::PEER_FLAGS);
        let flags = PeerFlags::from_bits(flag_bits)
            .ok_or_else(|| field("peers", format!("slot {i}: unknown flags {flag_bits:#x}")))?;
        let node = b[at + off::PEER_NODE_ID];
        peers.push(PeerSlot {
            node_id: (node != NO_NODE).then_some(node),
            bitmap_gi: get_u64(b, at + off::PEER_BITMAP_GI),
            flags,
        });
    }
    Ok(peers)
}

fn field(field: &'static str, detail: String) -> SuperblockError {
    SuperblockError::Field { field, detail }
}

/// The copy `pick_superblock` chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picked {
    pub superblock: Superblock,
    /// The slot it came from (0 when both hold it).
    pub slot: usize,
    /// The other slot, if it does not hold the same block: the caller logs it and must
    /// write a superblock (which rewrites both slots) before relying on this one.
    pub repair: Option<SlotRepair>,
}

/// A superblock slot that does not hold the newest copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRepair {
    pub slot: usize,
    pub problem: SlotProblem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotProblem {
    /// Unreadable: a write torn by a crash (or damage, see `pick_superblock`).
    Invalid(SuperblockError),
    /// A complete older copy: a crash fell between the two writes of an update.
    Stale { seq: u64 },
}

impl fmt::Display for SlotRepair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.problem {
            SlotProblem::Invalid(e) => write!(
                f,
                "superblock slot {} is unreadable ({e}), most likely a write torn by a crash; \
                 the next superblock update rewrites it",
                self.slot
            ),
            SlotProblem::Stale { seq } => write!(
                f,
                "superblock slot {} holds the previous version (seq {seq}): a crash fell \
                 between the two writes of an update; the next superblock update rewrites it",
                self.slot
            ),
        }
    }
}

/// The load rule, on the two 4 KiB copies:
/// - both valid: the higher seq (equal seqs must be the same block);
/// - one invalid, the valid one not CLEAN: the valid one (the node was running, the other
///   is plausibly a write torn by a crash);
/// - one invalid, the valid one (seq `n`) CLEAN: a clean node writes no superblock, except
///   the update entering CLEAN (seq `n`, at shutdown) and the one leaving it (`n + 1`, at
///   start-up), either of which a crash may tear next to the clean copy. A write torn at
///   sector granularity leaves a first sector that is the clean copy's own, or another
///   version's (`n - 1` or `n + 1`) with that version's header. The clean copy is used if
///   the damaged one looks like that; otherwise it was damaged at rest: refused, as it
///   may have held a newer version (and the medium deserves a look);
/// - both invalid: an error naming both problems.
pub fn pick_superblock(blocks: [&[u8; MD_BLOCK_BYTES]; 2]) -> Result<Picked, PickError> {
    let decoded = [Superblock::decode(blocks[0]), Superblock::decode(blocks[1])];
    match decoded {
        [Ok(a), Ok(b)] => {
            if a.seq == b.seq {
                if blocks[0] != blocks[1] {
                    return Err(PickError::SameSeqDiffer { seq: a.seq });
                }
                return Ok(Picked {
                    superblock: a,
                    slot: 0,
                    repair: None,
                });
            }
            let (newer, slot, older) = if a.seq > b.seq { (a, 0, b) } else { (b, 1, a) };
            Ok(Picked {
                superblock: newer,
                slot,
                repair: Some(SlotRepair {
                    slot: 1 - slot,
                    problem: SlotProblem::Stale { seq: older.seq },
                }),
            })
        }
        [Err(slot0), Err(slot1)] => Err(PickError::BothInvalid { slot0, slot1 }),
        [Ok(sb), Err(problem)] => one_valid(sb, 0, problem, blocks),
        [Err(problem), Ok(sb)] => one_valid(sb, 1, problem, blocks),
    }
}

fn one_valid(
    sb: Superblock,
    slot: usize,
    problem: SuperblockError,
    blocks: [&[u8; MD_BLOCK_BYTES]; 2],
) -> Result<Picked, PickError> {
    if sb.flags.contains(SbFlags::CLEAN) {
        if let Err(header) = torn_next_to(blocks[1 - slot], blocks[slot], sb.seq) {
            return Err(PickError::DamagedAtRest {
                valid_slot: slot,
                valid_seq: sb.seq,
                invalid_slot: 1 - slot,
                problem,
                header,
            });
        }
    }
    Ok(Picked {
        superblock: sb,
        slot,
        repair: Some(SlotRepair {
            slot: 1 - slot,
            problem: SlotProblem::Invalid(problem),
        }),
    })
}

/// Smallest unit a write can be torn at (a sector).
const TORN_UNIT: usize = 512;

/// Can `damaged` be a write of version `seq - 1`, `seq` or `seq + 1` torn at sector
/// granularity next to `valid` (version `seq`)? Its first sector, which holds the header,
/// is then either `valid`'s own or another version's with that version's header. If not,
/// says what the header shows.
fn torn_next_to(
    damaged: &[u8; MD_BLOCK_BYTES],
    valid: &[u8; MD_BLOCK_BYTES],
    seq: u64,
) -> Result<(), String> {
    if damaged[..TORN_UNIT] == valid[..TORN_UNIT] {
        return Ok(());
    }
    let ours = damaged[off::MAGIC..off::MAGIC + 8] == MAGIC
        && get_u32(damaged, off::VERSION) == get_u32(valid, off::VERSION);
    if !ours {
        return Err("is unreadable".into());
    }
    match get_u64(damaged, off::SEQ) {
        h if h.abs_diff(seq) == 1 => Ok(()),
        h if h == seq => Err(format!(
            "says seq {h} too, but its first {TORN_UNIT} bytes differ from the valid copy's"
        )),
        h => Err(format!("says seq {h}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u64) -> Superblock {
        let layout = Layout::internal(10 << 30, Geometry::new(31)).unwrap();
        let mut peers = vec![PeerSlot::FREE; 31];
        peers[0] = PeerSlot {
            node_id: Some(0),
            bitmap_gi: 0xabcdef,
            flags: PeerFlags::EXISTS | PeerFlags::FULL_SYNC,
        };
        peers[1] = PeerSlot::new(5);
        Superblock {
            seq,
            flags: SbFlags::CONSISTENT | SbFlags::WAS_UP_TO_DATE,
            node_id: 2,
            layout,
            device_uuid: 0x1234_5678_9abc_def0,
            current_gi: 0xfeed_f00d_dead_beef,
            history: [1, 2, 3, 4, 5, 6, 7, 8],
            abandoned_gi: 0x0123_4567_89ab_cdef,
            peers,
            boot_id: *b"0123456789abcdef",
            writer: Some((1, 0x0bad_cafe_1234_5678)),
        }
    }

    #[test]
    fn version_3_keeps_the_writer_and_version_2_is_read_without_one() {
        let v3 = sample(7);
        let b = v3.encode().unwrap();
        assert_eq!(get_u32(&b[..], off::VERSION), 3);
        assert_eq!(Superblock::decode(&b).unwrap(), v3);
        let none = Superblock {
            writer: None,
            ..v3.clone()
        };
        let b = none.encode().unwrap();
        assert_eq!(b[off::WRITER_NODE], 0xff);
        assert_eq!(Superblock::decode(&b).unwrap(), none);
        // A version-2 block (as an older build wrote it): the same bytes, no writer.
        let mut old = b.clone();
        put_u32(&mut old[..], off::VERSION, 2);
        old[off::WRITER_NODE] = 0;
        let crc = crc_with_hole(&old[..], off::CRC);
        put_u32(&mut old[..], off::CRC, crc);
        assert_eq!(Superblock::decode(&old).unwrap(), none);
        // ...and one with bytes where version 3 keeps the writer is refused.
        old[off::WRITER_NODE] = 1;
        let crc = crc_with_hole(&old[..], off::CRC);
        put_u32(&mut old[..], off::CRC, crc);
        let err = Superblock::decode(&old).unwrap_err();
        assert!(err.to_string().contains("reserved"), "{err}");
        // A version-3 block naming no node but an incarnation is refused.
        let mut bad = b.clone();
        put_u64(&mut bad[..], off::WRITER_INCARNATION, 5);
        let crc = crc_with_hole(&bad[..], off::CRC);
        put_u32(&mut bad[..], off::CRC, crc);
        let err = Superblock::decode(&bad).unwrap_err();
        assert!(err.to_string().contains("writer"), "{err}");
    }

    #[test]
    fn version_2_keeps_a_boot_id_and_version_1_stays_version_1() {
        let v2 = sample(7);
        let b = v2.encode().unwrap();
        assert_eq!(get_u32(&b[..], off::VERSION), 3);
        assert_eq!(Superblock::decode(&b).unwrap(), v2);
        // Metadata made before the unsynced map is written back as it was: version 1,
        // no boot id, the same layout (an older build can still read it).
        let g = Geometry {
            unsynced_map: false,
            ..v2.layout.geometry()
        };
        let v1 = Superblock {
            layout: Layout::internal(10 << 30, g).unwrap(),
            writer: None,
            ..v2.clone()
        };
        let b = v1.encode().unwrap();
        assert_eq!(get_u32(&b[..], off::VERSION), 1);
        assert!(b[off::BOOT_ID..off::BOOT_ID_END].iter().all(|&x| x == 0));
        let back = Superblock::decode(&b).unwrap();
        assert_eq!(back.boot_id, [0; 16]);
        assert!(!back.layout.geometry().unsynced_map);
        assert_eq!(back.layout.unsynced_bytes(), 0);
        // A version-1 block with bytes where version 2 keeps the boot id is refused.
        let mut bad = b.clone();
        bad[off::BOOT_ID] = 1;
        let crc = crc_with_hole(&bad[..], off::CRC);
        put_u32(&mut bad[..], off::CRC, crc);
        let err = Superblock::decode(&bad).unwrap_err();
        assert!(err.to_string().contains("reserved"), "{err}");
    }

    #[test]
    fn round_trip() {
        let sb = sample(42);
        let b = sb.encode().unwrap();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        assert_eq!(&b[..8], b"TANDEMMD");
    }

    /// Every byte of every field region, flipped, is caught (by the checksum, or by the
    /// magic and version checks that come first).
    #[test]
    fn a_flipped_byte_anywhere_is_detected() {
        let b = sample(7).encode().unwrap();
        for at in 0..MD_BLOCK_BYTES {
            let mut bad = b.clone();
            bad[at] ^= 0x20;
            let err = Superblock::decode(&bad).unwrap_err();
            match at {
                0..8 => assert!(
                    matches!(err, SuperblockError::BadMagic { .. }),
                    "{at}: {err}"
                ),
                8..12 => assert!(
                    matches!(err, SuperblockError::UnsupportedVersion { .. }),
                    "{at}: {err}"
                ),
                _ => assert!(
                    matches!(err, SuperblockError::Checksum { .. }),
                    "{at}: {err}"
                ),
            }
        }
    }

    #[test]
    fn version_and_validation_errors() {
        let mut sb = sample(1);
        let mut b = sb.encode().unwrap();
        put_u32(&mut b[..], off::VERSION, 4);
        let err = Superblock::decode(&b).unwrap_err();
        assert_eq!(err, SuperblockError::UnsupportedVersion { found: 4 });
        assert!(err.to_string().contains("version 4"), "{err}");

        sb.peers[2] = PeerSlot::new(0);
        let err = sb.encode().unwrap_err();
        assert_eq!(
            err,
            SuperblockError::DuplicatePeer {
                node_id: 0,
                first: 0,
                second: 2
            }
        );
        sb.peers[2] = PeerSlot::new(2);
        assert!(sb.encode().unwrap_err().to_string().contains("own node id"));
        sb.peers.pop();
        assert!(sb.encode().is_err());
    }

    /// A block with a valid checksum but a value out of range (as a buggy writer would
    /// make) is refused by the field checks.
    #[test]
    fn fields_out_of_range_are_refused() {
        let b = sample(1).encode().unwrap();
        let reseal = |f: &dyn Fn(&mut [u8])| {
            let mut x = b.clone();
            f(&mut x[..]);
            let crc = crc_with_hole(&x[..], off::CRC);
            put_u32(&mut x[..], off::CRC, crc);
            Superblock::decode(&x).unwrap_err()
        };
        assert!(matches!(
            reseal(&|x| x[off::MAX_PEERS] = 0),
            SuperblockError::Geometry(_)
        ));
        assert!(matches!(
            reseal(&|x| put_u32(x, off::AL_EXTENTS, 3)),
            SuperblockError::Geometry(_)
        ));
        assert!(reseal(&|x| put_u64(x, off::MD_OFFSET, 4096))
            .to_string()
            .contains("md_offset"));
        assert!(reseal(&|x| put_u32(x, off::FLAGS, 1 << 20))
            .to_string()
            .contains("unknown flags"));
        assert!(reseal(&|x| x[4000] = 1).to_string().contains("reserved"));
        assert!(reseal(&|x| x[off::PLACEMENT] = 9)
            .to_string()
            .contains("placement"));
        assert!(reseal(&|x| put_u32(x, off::BITMAP_BLOCK, 8192))
            .to_string()
            .contains("4096 only"));
        // Slot 1's node id made equal to slot 0's.
        let dup = reseal(&|x| x[off::PEERS + off::PEER_SIZE] = 0);
        assert!(matches!(
            dup,
            SuperblockError::DuplicatePeer { node_id: 0, .. }
        ));
    }

    #[test]
    fn pick_both_valid_takes_the_higher_seq() {
        let old = sample(5).encode().unwrap();
        let new = sample(6).encode().unwrap();
        let p = pick_superblock([&old, &new]).unwrap();
        assert_eq!((p.superblock.seq, p.slot), (6, 1));
        assert_eq!(p.repair.unwrap().problem, SlotProblem::Stale { seq: 5 });
        let p = pick_superblock([&new, &new]).unwrap();
        assert_eq!((p.superblock.seq, p.slot, p.repair), (6, 0, None));
        let mut other = sample(6);
        other.current_gi ^= 1;
        let other = other.encode().unwrap();
        assert_eq!(
            pick_superblock([&new, &other]).unwrap_err(),
            PickError::SameSeqDiffer { seq: 6 }
        );
    }

    /// A torn write: the first sector of the new copy landed, the rest is the old one.
    /// Every field lives in the first 1152 bytes, so the update must change a field past
    /// byte 512 (the last peer slots) for the tear to show.
    fn torn(new: &Superblock, old: &[u8; MD_BLOCK_BYTES]) -> Box<[u8; MD_BLOCK_BYTES]> {
        let mut t = Box::new(*old);
        t[..512].copy_from_slice(&new.encode().unwrap()[..512]);
        t
    }

    fn next_of(sb: &Superblock) -> Superblock {
        let mut next = sb.clone();
        next.seq += 1;
        next.peers[30] = PeerSlot::new(30);
        next
    }

    #[test]
    fn pick_one_torn_while_running() {
        let running = sample(9);
        let block = running.encode().unwrap();
        let t = torn(&next_of(&running), &block);
        let p = pick_superblock([&t, &block]).unwrap();
        assert_eq!((p.superblock.seq, p.slot), (9, 1));
        let repair = p.repair.unwrap();
        assert_eq!(repair.slot, 0);
        assert!(matches!(
            repair.problem,
            SlotProblem::Invalid(SuperblockError::Checksum { .. })
        ));
        assert!(repair.to_string().contains("slot 0"), "{repair}");
    }

    fn clean(seq: u64) -> Superblock {
        let mut sb = sample(seq);
        sb.flags.insert(SbFlags::CLEAN);
        sb
    }

    /// A damaged copy next to a clean one that no torn write explains: refused.
    #[test]
    fn pick_refuses_a_clean_copy_next_to_a_damaged_one() {
        let block = clean(9).encode().unwrap();
        let refused = |damaged: &[u8; MD_BLOCK_BYTES]| {
            let err = pick_superblock([&block, damaged]).unwrap_err();
            assert!(
                matches!(
                    err,
                    PickError::DamagedAtRest {
                        valid_slot: 0,
                        invalid_slot: 1,
                        ..
                    }
                ),
                "{err}"
            );
            let text = err.to_string();
            assert!(text.contains("slot 1") && text.contains("CLEAN"), "{text}");
            text
        };
        // The magic rotted: the header is unreadable.
        let mut rotted = block.clone();
        rotted[2] ^= 1;
        assert!(refused(&rotted).contains("unreadable"));
        // A bit of the history rotted: same seq, but no tear makes a first sector that is
        // neither this version's nor another's.
        let mut rotted = block.clone();
        rotted[100] ^= 0x40;
        assert!(refused(&rotted).contains("differ from the valid copy"));
        // A header from far away: seq 20 next to a clean seq 9.
        let far = torn(&next_of(&sample(19)), &block);
        assert!(refused(&far).contains("says seq 20"));
    }

    /// Damage past the first sector of a copy of the clean version cannot be told from a
    /// tear of the shutdown update: accepted (the clean copy is the newest either way).
    #[test]
    fn pick_accepts_damage_a_tear_could_explain() {
        let block = clean(9).encode().unwrap();
        let mut rotted = block.clone();
        rotted[3000] ^= 1;
        let p = pick_superblock([&rotted, &block]).unwrap();
        assert_eq!((p.slot, p.repair.unwrap().slot), (1, 0));
    }

    /// The update leaving CLEAN at start-up, torn in its first write: the clean copy is
    /// the newest the node relied on.
    #[test]
    fn pick_accepts_a_clean_copy_next_to_its_torn_successor() {
        let clean = clean(9);
        let mut running = next_of(&clean);
        running.flags.remove(SbFlags::CLEAN);
        let block = clean.encode().unwrap();
        let t = torn(&running, &block);
        let p = pick_superblock([&block, &t]).unwrap();
        assert_eq!(p.superblock.seq, 9);
        assert_eq!(p.repair.unwrap().slot, 1);
    }

    /// The update entering CLEAN at shutdown, torn in its second write: the other slot
    /// shows this seq (first sector landed) or the one before (it did not).
    #[test]
    fn pick_accepts_a_clean_copy_next_to_its_own_torn_second_write() {
        let mut before = sample(8);
        before.peers[30] = PeerSlot::new(29);
        let before = before.encode().unwrap();
        let clean = clean(9);
        let block = clean.encode().unwrap();
        // First sector landed: header seq 9.
        let t = torn(&clean, &before);
        assert!(Superblock::decode(&t).is_err());
        assert_eq!(pick_superblock([&block, &t]).unwrap().superblock.seq, 9);
        // Only later sectors landed: header seq 8.
        let mut late = Box::new(*block);
        late[..512].copy_from_slice(&before[..512]);
        assert!(Superblock::decode(&late).is_err());
        assert_eq!(pick_superblock([&late, &block]).unwrap().superblock.seq, 9);
    }

    #[test]
    fn pick_both_bad() {
        let zero = [0u8; MD_BLOCK_BYTES];
        let mut junk = [0x5au8; MD_BLOCK_BYTES];
        let err = pick_superblock([&zero, &junk]).unwrap_err();
        assert!(matches!(
            err,
            PickError::BothInvalid {
                slot0: SuperblockError::Blank,
                slot1: SuperblockError::BadMagic { .. }
            }
        ));
        junk[..8].copy_from_slice(&MAGIC);
        let text = pick_superblock([&junk, &zero]).unwrap_err().to_string();
        assert!(text.contains("slot 0") && text.contains("slot 1"), "{text}");
    }

    #[test]
    fn flags_names() {
        let f = SbFlags::CLEAN | SbFlags::PRIMARY;
        assert_eq!(f.names(), vec!["primary", "clean"]);
        assert!(SbFlags::from_bits(1 << 31).is_none());
        let mut g = f;
        g.set(SbFlags::PRIMARY, false);
        assert_eq!(g, SbFlags::CLEAN);
        assert_eq!(format!("{g:?}"), "SbFlags(clean)");
    }

    #[test]
    fn history_rolls() {
        let mut sb = sample(1);
        sb.push_history(100);
        assert_eq!(sb.history, [100, 1, 2, 3, 4, 5, 6, 7]);
    }
}
