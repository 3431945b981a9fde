//! One activity-log transaction block (4 KiB, little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `AL_MAGIC` |
//! | 4 | 2 | kind: 1 = Init (the table is empty from here on), 2 = Update |
//! | 6 | 2 | number of updates (0..=64) |
//! | 8 | 8 | seq (transaction number) |
//! | 16 | 4 | crc32c of the block with this field zero |
//! | 20 | 4 | al_extents (table size) |
//! | 24 | 2 | context_start (first table slot of the window) |
//! | 26 | 2 | context_len (slots in the window, 0..=888) |
//! | 28 | 4 | reserved, zero |
//! | 32 | 64 × 8 | updates: slot u16, reserved u16 (zero), extent u32 (`u32::MAX` = emptied) |
//! | 544 | 888 × 4 | context: extent of slots `context_start..context_start + context_len` |
//!
//! Unused update and context entries are zero. The window of transaction `seq` is window
//! number `seq % windows_per_table`, so any `windows_per_table` consecutive transactions
//! hold the whole table; it shows the table as it is after the transaction.

use crate::error::AlBlockError;
use crate::layout::{AL_EXTENT, MAX_AL_EXTENTS, MAX_DATA_SIZE, MD_BLOCK_BYTES, MIN_AL_EXTENTS};
use crate::le::{
    crc_with_hole, first_nonzero, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64,
};

/// "TAL1" in the block's first four bytes.
pub const AL_MAGIC: u32 = u32::from_le_bytes(*b"TAL1");
/// A table slot holding no extent.
pub const EXTENT_NONE: u32 = u32::MAX;
pub const HEADER_BYTES: usize = 32;
/// Slot changes one transaction can carry.
pub const UPDATES_PER_TRANSACTION: usize = 64;
pub const UPDATE_BYTES: usize = 8;
/// Table slots one transaction's context window holds.
pub const CONTEXT_PER_TRANSACTION: usize = 888;
/// Extents of the largest volume: any extent number in a block must be below this.
pub const MAX_EXTENTS: u64 = MAX_DATA_SIZE / AL_EXTENT;

const UPDATES_AT: usize = HEADER_BYTES;
const CONTEXT_AT: usize = UPDATES_AT + UPDATES_PER_TRANSACTION * UPDATE_BYTES;
const _: () = assert!(CONTEXT_AT + CONTEXT_PER_TRANSACTION * 4 == MD_BLOCK_BYTES);
const _: () = assert!(MAX_EXTENTS < EXTENT_NONE as u64);

mod off {
    pub const MAGIC: usize = 0;
    pub const KIND: usize = 4;
    pub const N_UPDATES: usize = 6;
    pub const SEQ: usize = 8;
    pub const CRC: usize = 16;
    pub const AL_EXTENTS: usize = 20;
    pub const CONTEXT_START: usize = 24;
    pub const CONTEXT_LEN: usize = 26;
    pub const RESERVED: usize = 28;
}

/// Transactions needed to hold the whole table: `ceil(al_extents / 888)`.
pub fn windows_per_table(al_extents: u32) -> u32 {
    al_extents.div_ceil(CONTEXT_PER_TRANSACTION as u32)
}

/// The window of table slots transaction `seq` carries: `(start, len)`.
pub fn context_window(seq: u64, al_extents: u32) -> (u32, u32) {
    let k = u64::from(windows_per_table(al_extents));
    let start = (seq % k) as u32 * CONTEXT_PER_TRANSACTION as u32;
    let len = (al_extents - start).min(CONTEXT_PER_TRANSACTION as u32);
    (start, len)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlKind {
    /// The table is empty as of this transaction; older blocks no longer matter.
    Init,
    /// Slot changes and a window of the table.
    Update,
}

/// One slot change: `slot` now holds `extent` (`EXTENT_NONE` = emptied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlUpdate {
    pub slot: u16,
    pub extent: u32,
}

/// A decoded transaction block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlBlock {
    pub kind: AlKind,
    pub seq: u64,
    pub al_extents: u32,
    pub updates: Vec<AlUpdate>,
    pub context_start: u32,
    /// Extents of slots `context_start..context_start + context.len()`.
    pub context: Vec<u32>,
}

impl AlBlock {
    pub fn init(seq: u64, al_extents: u32) -> AlBlock {
        AlBlock {
            kind: AlKind::Init,
            seq,
            al_extents,
            updates: Vec::new(),
            context_start: 0,
            context: Vec::new(),
        }
    }

    /// An update transaction: `updates` applied, `table` the table after them.
    pub fn update(seq: u64, updates: Vec<AlUpdate>, table: &[u32]) -> AlBlock {
        let al_extents = u32::try_from(table.len()).expect("table size fits u32");
        let (start, len) = context_window(seq, al_extents);
        let context = table[start as usize..(start + len) as usize].to_vec();
        AlBlock {
            kind: AlKind::Update,
            seq,
            al_extents,
            updates,
            context_start: start,
            context,
        }
    }

    /// Encodes a block this crate built; an inconsistent block is a bug and panics.
    pub fn encode(&self) -> Box<[u8; MD_BLOCK_BYTES]> {
        if let Err((field, detail)) = self.check() {
            panic!(
                "encoding an invalid AL block (seq {}): {field}: {detail}",
                self.seq
            );
        }
        let mut b = Box::new([0u8; MD_BLOCK_BYTES]);
        put_u32(&mut b[..], off::MAGIC, AL_MAGIC);
        let kind = match self.kind {
            AlKind::Init => 1,
            AlKind::Update => 2,
        };
        put_u16(&mut b[..], off::KIND, kind);
        put_u16(&mut b[..], off::N_UPDATES, self.updates.len() as u16);
        put_u64(&mut b[..], off::SEQ, self.seq);
        put_u32(&mut b[..], off::AL_EXTENTS, self.al_extents);
        put_u16(&mut b[..], off::CONTEXT_START, self.context_start as u16);
        put_u16(&mut b[..], off::CONTEXT_LEN, self.context.len() as u16);
        for (i, u) in self.updates.iter().enumerate() {
            let at = UPDATES_AT + i * UPDATE_BYTES;
            put_u16(&mut b[..], at, u.slot);
            put_u32(&mut b[..], at + 4, u.extent);
        }
        for (i, e) in self.context.iter().enumerate() {
            put_u32(&mut b[..], CONTEXT_AT + 4 * i, *e);
        }
        let crc = crc_with_hole(&b[..], off::CRC);
        put_u32(&mut b[..], off::CRC, crc);
        b
    }

    pub fn decode(b: &[u8; MD_BLOCK_BYTES]) -> Result<AlBlock, AlBlockError> {
        if b.iter().all(|&x| x == 0) {
            return Err(AlBlockError::Blank);
        }
        let magic = get_u32(b, off::MAGIC);
        if magic != AL_MAGIC {
            return Err(AlBlockError::BadMagic { found: magic });
        }
        let stored = get_u32(b, off::CRC);
        let computed = crc_with_hole(b, off::CRC);
        if stored != computed {
            return Err(AlBlockError::Checksum { stored, computed });
        }
        let kind = match get_u16(b, off::KIND) {
            1 => AlKind::Init,
            2 => AlKind::Update,
            k => return Err(field("kind", format!("unknown kind {k}"))),
        };
        if get_u32(b, off::RESERVED) != 0 {
            return Err(field("reserved", "not zero".into()));
        }
        let n = usize::from(get_u16(b, off::N_UPDATES));
        if n > UPDATES_PER_TRANSACTION {
            return Err(field("n_updates", format!("{n} is above 64")));
        }
        let len = usize::from(get_u16(b, off::CONTEXT_LEN));
        if len > CONTEXT_PER_TRANSACTION {
            return Err(field("context_len", format!("{len} is above 888")));
        }
        let updates = (0..n)
            .map(|i| {
                let at = UPDATES_AT + i * UPDATE_BYTES;
                if get_u16(b, at + 2) != 0 {
                    return Err(field("updates", format!("entry {i}: reserved bytes set")));
                }
                Ok(AlUpdate {
                    slot: get_u16(b, at),
                    extent: get_u32(b, at + 4),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(at) = first_nonzero(b, UPDATES_AT + n * UPDATE_BYTES..CONTEXT_AT) {
            return Err(field("updates", format!("unused byte {at} is set")));
        }
        if let Some(at) = first_nonzero(b, CONTEXT_AT + 4 * len..MD_BLOCK_BYTES) {
            return Err(field("context", format!("unused byte {at} is set")));
        }
        let block = AlBlock {
            kind,
            seq: get_u64(b, off::SEQ),
            al_extents: get_u32(b, off::AL_EXTENTS),
            updates,
            context_start: u32::from(get_u16(b, off::CONTEXT_START)),
            context: (0..len).map(|i| get_u32(b, CONTEXT_AT + 4 * i)).collect(),
        };
        block.check().map_err(|(f, d)| field(f, d))?;
        Ok(block)
    }

    /// The rules a well-formed block keeps, whoever wrote it.
    fn check(&self) -> Result<(), (&'static str, String)> {
        let e = self.al_extents;
        if !(MIN_AL_EXTENTS..=MAX_AL_EXTENTS).contains(&e) {
            return Err(("al_extents", format!("{e} is out of range 7..=65534")));
        }
        if self.updates.len() > UPDATES_PER_TRANSACTION {
            return Err(("n_updates", format!("{} is above 64", self.updates.len())));
        }
        let window = match self.kind {
            AlKind::Init => (0, 0),
            AlKind::Update => context_window(self.seq, e),
        };
        if self.kind == AlKind::Init && !self.updates.is_empty() {
            return Err(("n_updates", "an Init transaction carries updates".into()));
        }
        if (self.context_start, self.context.len() as u32) != window {
            return Err((
                "context",
                format!(
                    "window {}+{} where transaction {} carries {}+{}",
                    self.context_start,
                    self.context.len(),
                    self.seq,
                    window.0,
                    window.1
                ),
            ));
        }
        for (i, u) in self.updates.iter().enumerate() {
            if u32::from(u.slot) >= e {
                return Err(("updates", format!("slot {} of {e}", u.slot)));
            }
            if !extent_ok(u.extent) {
                return Err(("updates", format!("extent {} out of range", u.extent)));
            }
            if self.updates[..i].iter().any(|v| v.slot == u.slot) {
                return Err(("updates", format!("slot {} changed twice", u.slot)));
            }
            // The window shows the table after the updates: the two must agree.
            let in_window = u32::from(u.slot).checked_sub(self.context_start);
            if let Some(&shown) = in_window.and_then(|i| self.context.get(i as usize)) {
                if shown != u.extent {
                    return Err((
                        "updates",
                        format!(
                            "slot {} set to {} but the window shows {shown}",
                            u.slot, u.extent
                        ),
                    ));
                }
            }
        }
        if let Some(x) = self.context.iter().find(|x| !extent_ok(**x)) {
            return Err(("context", format!("extent {x} out of range")));
        }
        Ok(())
    }
}

fn extent_ok(e: u32) -> bool {
    e == EXTENT_NONE || u64::from(e) < MAX_EXTENTS
}

fn field(field: &'static str, detail: String) -> AlBlockError {
    AlBlockError::Field { field, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u64) -> AlBlock {
        let mut table = vec![EXTENT_NONE; 1237];
        for (i, t) in table.iter_mut().enumerate().step_by(3) {
            *t = i as u32 * 7;
        }
        let updates = (0..64)
            .map(|i| AlUpdate {
                slot: i * 3,
                extent: u32::from(i) * 21,
            })
            .collect();
        AlBlock::update(seq, updates, &table)
    }

    #[test]
    fn sizes_fit_one_block() {
        assert_eq!(HEADER_BYTES + 64 * UPDATE_BYTES + 888 * 4, 4096);
        assert_eq!(windows_per_table(1237), 2);
        assert_eq!(windows_per_table(888), 1);
        assert_eq!(windows_per_table(65534), 74);
        assert_eq!(context_window(0, 1237), (0, 888));
        assert_eq!(context_window(1, 1237), (888, 349));
        assert_eq!(context_window(2, 1237), (0, 888));
    }

    #[test]
    fn round_trip() {
        for seq in [0, 1, 2, u64::MAX / 3] {
            let b = sample(seq);
            assert_eq!(AlBlock::decode(&b.encode()).unwrap(), b);
        }
        let init = AlBlock::init(9, 7);
        assert_eq!(AlBlock::decode(&init.encode()).unwrap(), init);
        assert_eq!(&init.encode()[..4], b"TAL1");
    }

    #[test]
    fn damage_is_detected() {
        let b = sample(5).encode();
        for at in (0..MD_BLOCK_BYTES).step_by(7) {
            let mut bad = b.clone();
            bad[at] ^= 0x01;
            let err = AlBlock::decode(&bad).unwrap_err();
            if at < 4 {
                assert!(matches!(err, AlBlockError::BadMagic { .. }), "{at}");
            } else {
                assert!(matches!(err, AlBlockError::Checksum { .. }), "{at}");
            }
        }
        assert_eq!(
            AlBlock::decode(&[0; MD_BLOCK_BYTES]).unwrap_err(),
            AlBlockError::Blank
        );
    }

    #[test]
    fn well_sealed_nonsense_is_refused() {
        // An even seq: window 0..888, which the updates' slots fall in.
        let b = sample(4).encode();
        let reseal = |f: &dyn Fn(&mut [u8])| {
            let mut x = b.clone();
            f(&mut x[..]);
            let crc = crc_with_hole(&x[..], off::CRC);
            put_u32(&mut x[..], off::CRC, crc);
            AlBlock::decode(&x).unwrap_err().to_string()
        };
        assert!(reseal(&|x| put_u16(x, off::KIND, 3)).contains("kind"));
        assert!(reseal(&|x| put_u16(x, off::N_UPDATES, 65)).contains("n_updates"));
        assert!(reseal(&|x| put_u16(x, off::CONTEXT_START, 888)).contains("window"));
        assert!(reseal(&|x| put_u16(x, UPDATES_AT, 2000)).contains("slot 2000"));
        assert!(reseal(&|x| put_u32(x, off::AL_EXTENTS, 3)).contains("al_extents"));
        assert!(reseal(&|x| put_u32(x, UPDATES_AT + 4, 1 << 30)).contains("out of range"));
        assert!(reseal(&|x| put_u32(x, UPDATES_AT + 4, 5)).contains("window shows"));
        assert!(reseal(&|x| put_u16(x, UPDATES_AT + 8, 0)).contains("twice"));
    }
}
