//! The thin IO layer: a volume's metadata on one `MetaTarget`. Everything it decides is in
//! the pure modules; here every IO error gets the target's name, the operation and the
//! offset.

use crate::al::{replay, AlBlock, AlReplay, Transaction};
use crate::bitmap::{decode_words, encode_pages};
use crate::error::{LayoutError, MetaError};
use crate::layout::{Geometry, Layout, Placement, MD_BLOCK, MD_BLOCK_BYTES, SUPERBLOCK_SLOTS};
use crate::superblock::{pick_superblock, PeerSlot, SbFlags, SlotRepair, Superblock, HISTORY_LEN};
use crate::target::MetaTarget;

/// Zeroing and bitmap reads go in pieces of this size (a multiple of 4 KiB).
const CHUNK: u64 = 1 << 20;

/// Where `open` looks for the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locate {
    /// A metadata file or device of its own: superblocks at offset 0.
    External,
    /// Internal metadata starting at `md_offset` (the data size).
    Internal { md_offset: u64 },
}

impl Locate {
    /// Where internal metadata of `geometry` starts on a store of `store_size` bytes. The
    /// offset depends on the geometry: open with the geometry the metadata was created with.
    pub fn internal(store_size: u64, geometry: Geometry) -> Result<Locate, LayoutError> {
        Ok(Locate::Internal {
            md_offset: Layout::internal(store_size, geometry)?.md_offset(),
        })
    }

    /// Where the superblock pair starts.
    pub fn md_offset(self) -> u64 {
        match self {
            Locate::External => 0,
            Locate::Internal { md_offset } => md_offset,
        }
    }
}

/// What `create` writes into the superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateInfo {
    pub node_id: u8,
    /// Node ids of the peers, given bitmap slots in this order (at most max-peers).
    pub peers: Vec<u8>,
    /// Random identity of this replica.
    pub device_uuid: u64,
    /// 0 = just created: no generation yet (the engine's rules decide what follows).
    pub current_gi: u64,
    pub flags: SbFlags,
}

impl CreateInfo {
    /// A new replica: CLEAN (empty log, zero bitmaps) and FULL_SYNC (it holds nothing yet).
    pub fn new(node_id: u8, peers: Vec<u8>, device_uuid: u64) -> CreateInfo {
        CreateInfo {
            node_id,
            peers,
            device_uuid,
            current_gi: 0,
            flags: SbFlags::CLEAN | SbFlags::FULL_SYNC,
        }
    }
}

/// What `open` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub superblock: Superblock,
    pub al: AlReplay,
    /// A superblock slot that did not hold the newest copy: log it as a warning. The next
    /// `write_superblock` rewrites it; do one before relying on the state.
    pub repaired_slot: Option<SlotRepair>,
}

/// A volume's metadata on a target.
#[derive(Debug)]
pub struct MetaStore<T: MetaTarget> {
    target: T,
    layout: Layout,
    sb: Superblock,
    /// Which slots hold the newest superblock.
    current: [bool; SUPERBLOCK_SLOTS],
}

impl<T: MetaTarget> MetaStore<T> {
    /// Writes fresh metadata: both superblock copies (seq 1), an initialised activity log,
    /// zeroed bitmaps. The old superblocks are wiped first and the new ones written last,
    /// so a crash part-way leaves no superblock that describes half-written metadata.
    pub fn create(target: T, layout: Layout, init: CreateInfo) -> Result<MetaStore<T>, MetaError> {
        let name = target.describe();
        let g = layout.geometry();
        if init.peers.len() > usize::from(g.max_peers) {
            return Err(MetaError::usage(
                name,
                format!("{} peers for max-peers {}", init.peers.len(), g.max_peers),
            ));
        }
        let mut peers: Vec<PeerSlot> = init.peers.iter().map(|&n| PeerSlot::new(n)).collect();
        peers.resize(usize::from(g.max_peers), PeerSlot::FREE);
        let sb = Superblock {
            seq: 1,
            flags: init.flags,
            node_id: init.node_id,
            layout,
            device_uuid: init.device_uuid,
            current_gi: init.current_gi,
            history: [0; HISTORY_LEN],
            abandoned_gi: 0,
            peers,
            boot_id: [0; 16],
            writer: None,
        };
        let block = sb.encode().map_err(|source| MetaError::InvalidSuperblock {
            target: name.clone(),
            source: Box::new(source),
        })?;
        let mut store = MetaStore {
            target,
            layout,
            sb,
            current: [false; SUPERBLOCK_SLOTS],
        };
        store.check_size()?;
        store.zero(
            layout.superblock_offset(0),
            MD_BLOCK * SUPERBLOCK_SLOTS as u64,
        )?;
        store.sync_op("sync after wiping the superblocks")?;
        store.zero(layout.bitmap_offset(), layout.bitmap_bytes())?;
        store.zero(layout.unsynced_offset(), layout.unsynced_bytes())?;
        let mut ring = vec![0u8; layout.al_size() as usize];
        ring[..MD_BLOCK_BYTES].copy_from_slice(&AlBlock::init(0, g.al_extents).encode()[..]);
        store.write_op("activity-log initialisation", &ring, layout.al_offset())?;
        store.sync_op("sync of the activity log and bitmaps")?;
        for slot in 0..SUPERBLOCK_SLOTS {
            store.write_op(
                "superblock write",
                &block[..],
                layout.superblock_offset(slot),
            )?;
            store.sync_op("superblock sync")?;
            store.current[slot] = true;
        }
        Ok(store)
    }

    /// Reads the superblock (the load rule in `pick_superblock`) and replays the activity
    /// log. Writes nothing.
    pub fn open(target: T, locate: Locate) -> Result<(MetaStore<T>, Loaded), MetaError> {
        let name = target.describe();
        let size = target
            .size()
            .map_err(|source| io_err(&name, "size query", 0, 0, source))?;
        let md_offset = locate.md_offset();
        if !md_offset.is_multiple_of(MD_BLOCK) {
            return Err(MetaError::usage(
                name,
                format!("metadata offset {md_offset} is not a multiple of 4096"),
            ));
        }
        let offsets = [md_offset, md_offset + MD_BLOCK];
        if size < md_offset + 2 * MD_BLOCK {
            return Err(MetaError::TooSmall {
                target: name,
                size,
                needed: md_offset + 2 * MD_BLOCK,
                what: format!("a superblock pair at offset {md_offset}"),
            });
        }
        let mut both = vec![0u8; 2 * MD_BLOCK_BYTES];
        target
            .read_at(&mut both, md_offset)
            .map_err(|source| io_err(&name, "superblock read", md_offset, 2 * MD_BLOCK, source))?;
        let (b0, b1) = both.split_at(MD_BLOCK_BYTES);
        let picked = pick_superblock([block_ref(b0), block_ref(b1)]).map_err(|source| {
            MetaError::Superblock {
                target: name.clone(),
                offsets,
                source: Box::new(source),
            }
        })?;
        let sb = picked.superblock;
        let layout = sb.layout;
        let expected = match locate {
            Locate::External => Placement::External,
            Locate::Internal { .. } => Placement::Internal,
        };
        if layout.placement() != expected || layout.md_offset() != md_offset {
            return Err(MetaError::Mismatch {
                target: name,
                offset: md_offset,
                detail: format!(
                    "where it was found: it describes {} metadata at offset {}, found as {} \
                     metadata at offset {md_offset}",
                    layout.placement().name(),
                    layout.md_offset(),
                    expected.name()
                ),
            });
        }
        let mut current = [false; SUPERBLOCK_SLOTS];
        match &picked.repair {
            None => current = [true; SUPERBLOCK_SLOTS],
            Some(r) => current[1 - r.slot] = true,
        }
        let store = MetaStore {
            target,
            layout,
            sb: sb.clone(),
            current,
        };
        store.check_size()?;
        let al = store.read_al()?;
        Ok((
            store,
            Loaded {
                superblock: sb,
                al,
                repaired_slot: picked.repair,
            },
        ))
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The newest superblock written or loaded.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn target(&self) -> &T {
        &self.target
    }

    pub fn into_target(self) -> T {
        self.target
    }

    /// Writes `sb` (its `seq` is replaced by the next one, returned) to the slot not
    /// holding the newest copy, syncs, then to the other slot, and syncs: at every moment
    /// one slot holds a complete copy of the new or the previous version. The layout
    /// cannot change here.
    pub fn write_superblock(&mut self, sb: &Superblock) -> Result<u64, MetaError> {
        if sb.layout != self.layout {
            return Err(MetaError::usage(
                self.name(),
                "write_superblock cannot change the layout (geometry, placement, data size)",
            ));
        }
        let mut new = sb.clone();
        new.seq = self.sb.seq + 1;
        let block = new
            .encode()
            .map_err(|source| MetaError::InvalidSuperblock {
                target: self.name(),
                source: Box::new(source),
            })?;
        let first = self.current.iter().position(|c| !c).unwrap_or(0);
        for slot in [first, 1 - first] {
            self.current[slot] = false;
            let off = self.layout.superblock_offset(slot);
            self.write_durable_op("superblock write", &block[..], off)?;
            self.current[slot] = true;
            if slot == first {
                // From here a crash loads the new version: it is the store's state.
                self.current[1 - first] = false;
                self.sb = new.clone();
            }
        }
        Ok(new.seq)
    }

    /// One slot's bitmap, `layout.bitmap_words()` words.
    pub fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>, MetaError> {
        self.check_slot(slot)?;
        let words = self.layout.bitmap_words();
        let bytes = words as u64 * 8;
        let base = self.layout.bitmap_slot_offset(slot);
        let mut out = Vec::with_capacity(words);
        let mut buf = vec![0u8; CHUNK as usize];
        let mut done = 0;
        // Whole pages are read; only the words that exist are kept.
        while done < bytes {
            let len = (self.layout.bitmap_slot_bytes() - done).min(CHUNK);
            let buf = &mut buf[..len as usize];
            self.read_op("bitmap read", buf, base + done)?;
            let want = ((bytes - done).min(len) / 8) as usize;
            out.extend(decode_words(buf, want));
            done += len;
        }
        assert_eq!(out.len(), words);
        Ok(out)
    }

    /// Writes pages `first_page..first_page + pages` of `slot` from `words`, the caller's
    /// whole in-memory bitmap of that slot. Not synced: call `sync()` (before the activity
    /// log transaction that evicts these extents).
    pub fn write_bitmap_pages(
        &self,
        slot: usize,
        words: &[u64],
        first_page: u64,
        pages: u64,
    ) -> Result<(), MetaError> {
        self.check_slot(slot)?;
        if words.len() != self.layout.bitmap_words() {
            return Err(MetaError::usage(
                self.name(),
                format!(
                    "bitmap of {} words for a slot of {}",
                    words.len(),
                    self.layout.bitmap_words()
                ),
            ));
        }
        let total = self.layout.bitmap_pages();
        if first_page.checked_add(pages).is_none_or(|end| end > total) {
            return Err(MetaError::usage(
                self.name(),
                format!("bitmap pages {first_page}+{pages} of a slot of {total}"),
            ));
        }
        if pages == 0 {
            return Ok(());
        }
        let bytes = encode_pages(words, first_page, pages);
        let off = self.layout.bitmap_page_offset(slot, first_page);
        self.write_op("bitmap write", &bytes, off)
    }

    /// The unsynced map, one bit per extent (`ceil(extents / 64)` words); empty without one
    /// (version 1).
    pub fn read_unsynced(&self) -> Result<Vec<u64>, MetaError> {
        let words = self.unsynced_words();
        if words == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; self.layout.unsynced_bytes() as usize];
        self.read_op("unsynced-map read", &mut buf, self.layout.unsynced_offset())?;
        Ok(decode_words(&buf, words))
    }

    /// Words of the unsynced map in memory (0 without one).
    pub fn unsynced_words(&self) -> usize {
        if self.layout.geometry().unsynced_map {
            usize::try_from(self.layout.extents().div_ceil(64)).expect("fits in memory")
        } else {
            0
        }
    }

    /// Writes page `page` of the unsynced map from `words`, the caller's whole map. Not
    /// synced: call `sync()` (before the activity-log transaction that evicts the extents
    /// it names).
    pub fn write_unsynced_page(&self, words: &[u64], page: u64) -> Result<(), MetaError> {
        if words.len() != self.unsynced_words() || page >= self.layout.unsynced_pages() {
            return Err(MetaError::usage(
                self.name(),
                format!(
                    "unsynced-map page {page} from {} words, for a map of {} words in {} pages",
                    words.len(),
                    self.unsynced_words(),
                    self.layout.unsynced_pages()
                ),
            ));
        }
        let bytes = encode_pages(words, page, 1);
        let off = self.layout.unsynced_offset() + page * MD_BLOCK;
        self.write_op("unsynced-map write", &bytes, off)
    }

    /// Writes an activity-log transaction and syncs it: when this returns, the writes it
    /// releases may be issued.
    pub fn write_al(&self, tx: &Transaction) -> Result<(), MetaError> {
        let ring = self.layout.geometry().al_ring_blocks;
        if tx.block_index >= ring || u64::from(tx.block_index) != tx.seq % u64::from(ring) {
            return Err(MetaError::usage(
                self.name(),
                format!(
                    "AL transaction {} for block {} of a ring of {ring}",
                    tx.seq, tx.block_index
                ),
            ));
        }
        debug_assert!(AlBlock::decode(&tx.block)
            .is_ok_and(|b| b.al_extents == self.layout.geometry().al_extents));
        let off = self.layout.al_block_offset(tx.block_index);
        self.write_op("activity-log write", &tx.block[..], off)?;
        self.sync_op("activity-log sync")
    }

    /// Reads the whole ring and replays it.
    pub fn read_al(&self) -> Result<AlReplay, MetaError> {
        let g = self.layout.geometry();
        let off = self.layout.al_offset();
        let mut buf = vec![0u8; self.layout.al_size() as usize];
        self.read_op("activity-log read", &mut buf, off)?;
        let blocks: Vec<[u8; MD_BLOCK_BYTES]> = buf
            .chunks_exact(MD_BLOCK_BYTES)
            .map(|c| c.try_into().expect("4 KiB"))
            .collect();
        let al = replay(&blocks).map_err(|source| MetaError::Al {
            target: self.name(),
            offset: off,
            source: Box::new(source),
        })?;
        if al.al_extents != g.al_extents {
            return Err(MetaError::Mismatch {
                target: self.name(),
                offset: self.layout.md_offset(),
                detail: format!(
                    "its activity log: al-extents {} in the superblock, {} in the log",
                    g.al_extents, al.al_extents
                ),
            });
        }
        Ok(al)
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<(), MetaError> {
        self.sync_op("sync")
    }

    fn name(&self) -> String {
        self.target.describe()
    }

    fn check_size(&self) -> Result<(), MetaError> {
        let size = self
            .target
            .size()
            .map_err(|source| io_err(&self.name(), "size query", 0, 0, source))?;
        let needed = self.layout.md_end();
        if size < needed {
            let g = self.layout.geometry();
            return Err(MetaError::TooSmall {
                target: self.name(),
                size,
                needed,
                what: format!(
                    "{} metadata for {} bytes of data with max-peers {}, al-extents {}, \
                     an AL ring of {} blocks",
                    self.layout.placement().name(),
                    self.layout.data_size(),
                    g.max_peers,
                    g.al_extents,
                    g.al_ring_blocks
                ),
            });
        }
        Ok(())
    }

    fn check_slot(&self, slot: usize) -> Result<(), MetaError> {
        let max = self.layout.geometry().max_peers;
        if slot >= usize::from(max) {
            return Err(MetaError::usage(
                self.name(),
                format!("bitmap slot {slot} of max-peers {max}"),
            ));
        }
        Ok(())
    }

    fn zero(&self, off: u64, len: u64) -> Result<(), MetaError> {
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            self.write_op("zeroing", &zeros[..n as usize], off + done)?;
            done += n;
        }
        Ok(())
    }

    fn read_op(&self, op: &'static str, buf: &mut [u8], off: u64) -> Result<(), MetaError> {
        debug_assert!(off.is_multiple_of(MD_BLOCK) && (buf.len() as u64).is_multiple_of(MD_BLOCK));
        self.target
            .read_at(buf, off)
            .map_err(|source| io_err(&self.name(), op, off, buf.len() as u64, source))
    }

    fn write_op(&self, op: &'static str, buf: &[u8], off: u64) -> Result<(), MetaError> {
        debug_assert!(off.is_multiple_of(MD_BLOCK) && (buf.len() as u64).is_multiple_of(MD_BLOCK));
        self.target
            .write_at(buf, off)
            .map_err(|source| io_err(&self.name(), op, off, buf.len() as u64, source))
    }

    fn write_durable_op(&self, op: &'static str, buf: &[u8], off: u64) -> Result<(), MetaError> {
        debug_assert!(off.is_multiple_of(MD_BLOCK) && (buf.len() as u64).is_multiple_of(MD_BLOCK));
        self.target
            .write_durable_at(buf, off)
            .map_err(|source| io_err(&self.name(), op, off, buf.len() as u64, source))
    }

    fn sync_op(&self, op: &'static str) -> Result<(), MetaError> {
        self.target
            .sync()
            .map_err(|source| io_err(&self.name(), op, 0, 0, source))
    }
}

fn io_err(
    target: &str,
    op: &'static str,
    offset: u64,
    len: u64,
    source: std::io::Error,
) -> MetaError {
    MetaError::Io {
        target: target.to_string(),
        op,
        offset,
        len,
        source,
    }
}

fn block_ref(b: &[u8]) -> &[u8; MD_BLOCK_BYTES] {
    b.try_into().expect("4 KiB")
}
