//! Where every region of a volume's metadata lives: geometry (peer slots, activity-log
//! size), the two placements, and the offsets derived from them.
//!
//! All regions start and end on 4 KiB boundaries so that every metadata read or write is
//! whole, aligned 4 KiB blocks: a backing store opened with `O_DIRECT` needs nothing more.

use serde::Serialize;

use crate::error::LayoutError;

/// Size of one metadata block (superblock slot, activity-log transaction, bitmap page).
pub const MD_BLOCK: u64 = 4096;
/// [`MD_BLOCK`] as a buffer length.
pub const MD_BLOCK_BYTES: usize = MD_BLOCK as usize;
/// Bytes of data one bitmap bit stands for.
pub const BITMAP_BLOCK: u64 = 4096;
/// Bytes of data one activity-log extent covers (4 MiB).
pub const AL_EXTENT: u64 = 4 << 20;
/// Bitmap bits (4 KiB blocks) per activity-log extent.
pub const BLOCKS_PER_EXTENT: u64 = AL_EXTENT / BITMAP_BLOCK;
/// Number of superblock copies.
pub const SUPERBLOCK_SLOTS: usize = 2;
/// Most bitmap slots a volume can have (node ids are below 32, one of them our own).
pub const MAX_PEERS: u8 = 31;
/// Highest node id.
pub const MAX_NODE_ID: u8 = 31;
/// Activity-log size bounds, in extents.
pub const MIN_AL_EXTENTS: u32 = 7;
pub const MAX_AL_EXTENTS: u32 = 65534;
pub const DEFAULT_AL_EXTENTS: u32 = 1237;
/// Activity-log ring size bounds, in 4 KiB blocks.
pub const DEFAULT_AL_RING_BLOCKS: u32 = 8;
pub const MAX_AL_RING_BLOCKS: u32 = 8192;
/// Largest volume (1 PiB): 32 GiB of bitmap per peer slot, extent numbers far below
/// `u32::MAX` (which the activity log uses for "empty").
pub const MAX_DATA_SIZE: u64 = 1 << 50;

/// The superblock area: [`SUPERBLOCK_SLOTS`] blocks.
const SUPERBLOCK_AREA: u64 = SUPERBLOCK_SLOTS as u64 * MD_BLOCK;

/// The sizes chosen when the metadata is created; stored in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Geometry {
    /// Bitmap slots (1..=31): one per peer this replica may ever track.
    pub max_peers: u8,
    /// Extents the activity log may hold hot at once (7..=65534).
    pub al_extents: u32,
    /// Activity-log ring size in 4 KiB transaction blocks.
    pub al_ring_blocks: u32,
    /// The metadata has an unsynced map (format version 2): one bit per 4 MiB extent that
    /// left the activity log while writes to it may not be durable yet. Version 1 has none;
    /// such an extent then leaves the log only after a data sync.
    pub unsynced_map: bool,
}

impl Geometry {
    /// `max_peers` slots, the default activity log (1237 extents, 8 blocks) and an
    /// unsynced map.
    pub fn new(max_peers: u8) -> Geometry {
        Geometry {
            max_peers,
            al_extents: DEFAULT_AL_EXTENTS,
            al_ring_blocks: DEFAULT_AL_RING_BLOCKS,
            unsynced_map: true,
        }
    }

    /// `max_peers` slots, `al_extents` hot extents, and a ring of the default size or the
    /// smallest one that can hold that table, whichever is larger.
    pub fn with_al_extents(max_peers: u8, al_extents: u32) -> Geometry {
        Geometry {
            max_peers,
            al_extents,
            al_ring_blocks: DEFAULT_AL_RING_BLOCKS.max(min_ring_blocks(al_extents)),
            unsynced_map: true,
        }
    }

    pub fn validate(&self) -> Result<(), LayoutError> {
        if !(1..=MAX_PEERS).contains(&self.max_peers) {
            return Err(LayoutError::MaxPeers {
                value: self.max_peers,
            });
        }
        if !(MIN_AL_EXTENTS..=MAX_AL_EXTENTS).contains(&self.al_extents) {
            return Err(LayoutError::AlExtents {
                value: self.al_extents,
            });
        }
        let min = min_ring_blocks(self.al_extents);
        if !(min..=MAX_AL_RING_BLOCKS).contains(&self.al_ring_blocks) {
            return Err(LayoutError::RingBlocks {
                value: self.al_ring_blocks,
                min,
                max: MAX_AL_RING_BLOCKS,
                al_extents: self.al_extents,
            });
        }
        Ok(())
    }
}

/// The smallest ring that keeps the whole slot table recoverable with a margin:
/// `2 × ceil(al_extents / window) + 1` blocks. Replay needs the last
/// `ceil(al_extents / window)` transactions (their context windows together hold the
/// table) and may lose the block after the newest to a torn write; the factor 2 leaves
/// room to relax the replay rule later without changing the format (see METADATA.md).
pub fn min_ring_blocks(al_extents: u32) -> u32 {
    2 * crate::al::format::windows_per_table(al_extents) + 1
}

/// Where the metadata lives relative to the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// At the end of the backing store; the data area shrinks by the metadata size.
    Internal,
    /// In a file or device of its own; the data keeps the whole backing store.
    External,
}

impl Placement {
    pub(crate) fn code(self) -> u8 {
        match self {
            Placement::Internal => 1,
            Placement::External => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Placement> {
        match code {
            1 => Some(Placement::Internal),
            2 => Some(Placement::External),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Placement::Internal => "internal",
            Placement::External => "external",
        }
    }
}

/// The validated geometry, placement and data size with every offset derived from them.
/// Offsets are bytes in the metadata target (the backing store itself for internal
/// metadata, the metadata file for external).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    placement: Placement,
    geometry: Geometry,
    data_size: u64,
    md_offset: u64,
    bitmap_slot_bytes: u64,
}

/// One named region, for tests and `dump-md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Region {
    pub name: String,
    pub offset: u64,
    pub len: u64,
}

impl Layout {
    /// Internal metadata on a backing store of `store_size` bytes: the largest data size
    /// (a multiple of 4 KiB) whose metadata still fits behind it.
    pub fn internal(store_size: u64, geometry: Geometry) -> Result<Layout, LayoutError> {
        geometry.validate()?;
        let usable = store_size / MD_BLOCK * MD_BLOCK;
        let smallest = MD_BLOCK + md_size(MD_BLOCK, &geometry);
        if usable < smallest {
            return Err(LayoutError::StoreTooSmall {
                store_size,
                needed: smallest,
            });
        }
        // data + md_size(data) grows with data: binary search for the largest fit, in
        // 4 KiB units. `lo` always fits, `hi` never does.
        let mut lo = 1u64;
        let mut hi = usable / MD_BLOCK + 1;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let data = mid * MD_BLOCK;
            if data + md_size(data, &geometry) <= usable {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let data_size = lo * MD_BLOCK;
        if data_size > MAX_DATA_SIZE {
            return Err(LayoutError::DataTooLarge {
                size: data_size,
                max: MAX_DATA_SIZE,
            });
        }
        let layout = Layout::new(Placement::Internal, geometry, data_size)?;
        assert!(layout.md_end() <= store_size);
        Ok(layout)
    }

    /// External metadata for a data area of `data_size` bytes (the whole backing store).
    pub fn external(data_size: u64, geometry: Geometry) -> Result<Layout, LayoutError> {
        Layout::new(Placement::External, geometry, data_size)
    }

    /// How large an external metadata file or device must be for `data_size` bytes of data.
    pub fn required_external_size(data_size: u64, geometry: Geometry) -> Result<u64, LayoutError> {
        Ok(Layout::external(data_size, geometry)?.md_end())
    }

    /// The layout a superblock describes. Internal placement puts the metadata right after
    /// the data, so the data size must be a multiple of 4 KiB there.
    pub fn new(
        placement: Placement,
        geometry: Geometry,
        data_size: u64,
    ) -> Result<Layout, LayoutError> {
        geometry.validate()?;
        if data_size == 0 {
            return Err(LayoutError::DataSizeZero);
        }
        if data_size > MAX_DATA_SIZE {
            return Err(LayoutError::DataTooLarge {
                size: data_size,
                max: MAX_DATA_SIZE,
            });
        }
        let md_offset = match placement {
            Placement::Internal => {
                if !data_size.is_multiple_of(MD_BLOCK) {
                    return Err(LayoutError::DataMisaligned { size: data_size });
                }
                data_size
            }
            Placement::External => 0,
        };
        let layout = Layout {
            placement,
            geometry,
            data_size,
            md_offset,
            bitmap_slot_bytes: bitmap_slot_bytes(data_size),
        };
        debug_assert_eq!(layout.md_size(), md_size(data_size, &geometry));
        Ok(layout)
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Bytes of data the bitmaps cover (the volume size).
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Where the metadata area starts in the metadata target.
    pub fn md_offset(&self) -> u64 {
        self.md_offset
    }

    /// Bytes of metadata: superblocks, activity-log ring, bitmaps, unsynced map.
    pub fn md_size(&self) -> u64 {
        SUPERBLOCK_AREA + self.al_size() + self.bitmap_bytes() + self.unsynced_bytes()
    }

    /// The first byte past the metadata: the metadata target must be at least this large.
    pub fn md_end(&self) -> u64 {
        self.md_offset + self.md_size()
    }

    pub fn superblock_offset(&self, slot: usize) -> u64 {
        assert!(slot < SUPERBLOCK_SLOTS, "superblock slot {slot}");
        self.md_offset + slot as u64 * MD_BLOCK
    }

    pub fn al_offset(&self) -> u64 {
        self.md_offset + SUPERBLOCK_AREA
    }

    pub fn al_size(&self) -> u64 {
        u64::from(self.geometry.al_ring_blocks) * MD_BLOCK
    }

    pub fn al_block_offset(&self, index: u32) -> u64 {
        assert!(index < self.geometry.al_ring_blocks, "AL block {index}");
        self.al_offset() + u64::from(index) * MD_BLOCK
    }

    pub fn bitmap_offset(&self) -> u64 {
        self.al_offset() + self.al_size()
    }

    /// Bytes of all bitmap slots.
    pub fn bitmap_bytes(&self) -> u64 {
        u64::from(self.geometry.max_peers) * self.bitmap_slot_bytes
    }

    /// Bytes of one slot's bitmap on disk (whole pages).
    pub fn bitmap_slot_bytes(&self) -> u64 {
        self.bitmap_slot_bytes
    }

    pub fn bitmap_slot_offset(&self, slot: usize) -> u64 {
        assert!(
            slot < usize::from(self.geometry.max_peers),
            "bitmap slot {slot} of {}",
            self.geometry.max_peers
        );
        self.bitmap_offset() + slot as u64 * self.bitmap_slot_bytes
    }

    pub fn bitmap_page_offset(&self, slot: usize, page: u64) -> u64 {
        assert!(page < self.bitmap_pages(), "bitmap page {page}");
        self.bitmap_slot_offset(slot) + page * MD_BLOCK
    }

    /// Bits per slot: 4 KiB blocks of data (the last may be partial).
    pub fn bitmap_blocks(&self) -> u64 {
        self.data_size.div_ceil(BITMAP_BLOCK)
    }

    /// `u64` words per slot in memory (`ceil(blocks / 64)`).
    pub fn bitmap_words(&self) -> usize {
        usize::try_from(self.bitmap_blocks().div_ceil(64)).expect("bitmap fits in memory")
    }

    /// 4 KiB pages per slot on disk.
    pub fn bitmap_pages(&self) -> u64 {
        self.bitmap_slot_bytes / MD_BLOCK
    }

    /// 4 MiB extents of data (the last may be partial).
    pub fn extents(&self) -> u64 {
        self.data_size.div_ceil(AL_EXTENT)
    }

    /// Where the unsynced map starts (after the bitmaps); its size is `unsynced_bytes`.
    pub fn unsynced_offset(&self) -> u64 {
        self.bitmap_offset() + self.bitmap_bytes()
    }

    /// Bytes of the unsynced map on disk: one bit per extent, whole pages; 0 without one.
    pub fn unsynced_bytes(&self) -> u64 {
        unsynced_bytes(self.data_size, &self.geometry)
    }

    /// 4 KiB pages of the unsynced map (`MD_BLOCK * 8` extents each).
    pub fn unsynced_pages(&self) -> u64 {
        self.unsynced_bytes() / MD_BLOCK
    }

    /// Every region in order, for `dump-md` and the layout tests.
    pub fn regions(&self) -> Vec<Region> {
        let mut out = Vec::new();
        if self.placement == Placement::Internal {
            out.push(Region {
                name: "data".into(),
                offset: 0,
                len: self.data_size,
            });
        }
        for slot in 0..SUPERBLOCK_SLOTS {
            out.push(Region {
                name: format!("superblock[{slot}]"),
                offset: self.superblock_offset(slot),
                len: MD_BLOCK,
            });
        }
        out.push(Region {
            name: "activity-log".into(),
            offset: self.al_offset(),
            len: self.al_size(),
        });
        for slot in 0..usize::from(self.geometry.max_peers) {
            out.push(Region {
                name: format!("bitmap[{slot}]"),
                offset: self.bitmap_slot_offset(slot),
                len: self.bitmap_slot_bytes,
            });
        }
        if self.geometry.unsynced_map {
            out.push(Region {
                name: "unsynced-map".into(),
                offset: self.unsynced_offset(),
                len: self.unsynced_bytes(),
            });
        }
        out
    }
}

/// `ceil(blocks / 64) × 8` bytes rounded up to whole pages.
fn bitmap_slot_bytes(data_size: u64) -> u64 {
    let blocks = data_size.div_ceil(BITMAP_BLOCK);
    (blocks.div_ceil(64) * 8).div_ceil(MD_BLOCK) * MD_BLOCK
}

/// One bit per 4 MiB extent, rounded up to whole pages (a 1 TiB volume: 32 KiB).
fn unsynced_bytes(data_size: u64, geometry: &Geometry) -> u64 {
    if !geometry.unsynced_map {
        return 0;
    }
    data_size
        .div_ceil(AL_EXTENT)
        .div_ceil(8)
        .div_ceil(MD_BLOCK)
        .max(1)
        * MD_BLOCK
}

fn md_size(data_size: u64, geometry: &Geometry) -> u64 {
    SUPERBLOCK_AREA
        + u64::from(geometry.al_ring_blocks) * MD_BLOCK
        + u64::from(geometry.max_peers) * bitmap_slot_bytes(data_size)
        + unsynced_bytes(data_size, geometry)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    fn assert_sane(layout: &Layout, target_size: u64) {
        let regions = layout.regions();
        let mut end = 0;
        for r in &regions {
            assert_eq!(r.offset % MD_BLOCK, 0, "{r:?} misaligned");
            assert_eq!(r.len % MD_BLOCK, 0, "{r:?} length misaligned");
            assert!(r.offset >= end, "{r:?} overlaps the region before");
            end = r.offset + r.len;
        }
        assert_eq!(end, layout.md_end());
        assert!(layout.md_end() <= target_size);
        assert!(layout.bitmap_slot_bytes() * 8 >= layout.bitmap_blocks());
    }

    #[test]
    fn thirty_two_mib_of_bitmap_per_tib_per_peer() {
        let layout = Layout::external(TIB, Geometry::new(2)).unwrap();
        assert_eq!(layout.bitmap_slot_bytes(), 32 << 20);
        assert_eq!(layout.bitmap_bytes(), 2 * (32 << 20));
        assert_eq!(
            layout.md_size(),
            2 * MD_BLOCK + 8 * MD_BLOCK + 2 * (32 << 20) + (32 << 10)
        );
        assert_eq!(
            Layout::required_external_size(TIB, Geometry::new(2)).unwrap(),
            layout.md_end()
        );
        assert_sane(&layout, layout.md_end());
    }

    #[test]
    fn internal_fills_the_store_and_stays_aligned() {
        for store in [
            TIB,
            TIB + 12345,
            GIB,
            GIB - 1,
            10 * GIB + 4096 * 7 + 3,
            1 << 20,
            300 * 1024 + 17,
        ] {
            for peers in [1, 2, 7, 31] {
                let g = Geometry::new(peers);
                let layout = Layout::internal(store, g).unwrap();
                assert_eq!(layout.data_size() % MD_BLOCK, 0);
                assert_eq!(layout.md_offset(), layout.data_size());
                assert_sane(&layout, store);
                // Maximal: one more 4 KiB block of data would not fit.
                let bigger = layout.data_size() + MD_BLOCK;
                let more = Layout::new(Placement::Internal, g, bigger).unwrap();
                assert!(
                    more.md_end() > store / MD_BLOCK * MD_BLOCK,
                    "{store} {peers}"
                );
            }
        }
    }

    #[test]
    fn internal_refuses_a_store_too_small() {
        let g = Geometry::new(3);
        let needed = MD_BLOCK + md_size(MD_BLOCK, &g);
        let err = Layout::internal(needed - 1, g).unwrap_err();
        assert_eq!(
            err,
            LayoutError::StoreTooSmall {
                store_size: needed - 1,
                needed
            }
        );
        assert!(err.to_string().contains("external metadata"), "{err}");
        assert_eq!(Layout::internal(needed, g).unwrap().data_size(), MD_BLOCK);
    }

    #[test]
    fn geometry_ranges() {
        assert!(Geometry::new(0).validate().is_err());
        assert!(Geometry::new(32).validate().is_err());
        assert!(Geometry::new(31).validate().is_ok());
        assert!(Geometry::with_al_extents(1, 6).validate().is_err());
        assert!(Geometry::with_al_extents(1, 65535).validate().is_err());
        let big = Geometry::with_al_extents(1, 65534);
        assert!(big.validate().is_ok());
        assert_eq!(big.al_ring_blocks, min_ring_blocks(65534));
        let err = Geometry {
            al_ring_blocks: 8,
            ..big
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("149..=8192"), "{err}");
        // The defaults need 2 × ceil(1237 / 888) + 1 = 5 blocks.
        assert_eq!(min_ring_blocks(DEFAULT_AL_EXTENTS), 5);
        assert!(Geometry::new(1).validate().is_ok());
    }

    #[test]
    fn external_sizes() {
        let g = Geometry::new(1);
        assert_eq!(Layout::external(0, g), Err(LayoutError::DataSizeZero));
        let odd = Layout::external(4097, g).unwrap();
        assert_eq!(odd.bitmap_blocks(), 2);
        assert_eq!(odd.bitmap_words(), 1);
        assert_eq!(odd.bitmap_pages(), 1);
        assert_eq!(odd.md_offset(), 0);
        assert!(Layout::new(Placement::Internal, g, 4097).is_err());
        assert!(Layout::external(MAX_DATA_SIZE + 1, g).is_err());
    }
}
