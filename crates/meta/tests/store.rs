//! The store on real files: create, open, update, reopen after each step; torn and
//! corrupted blocks written into the files.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::Scratch;
use tandem_meta::al::{ActivityLog, Begin};
use tandem_meta::bitmap::{count_set, mark_extent, pages_of_extent};
use tandem_meta::superblock::SlotProblem;
use tandem_meta::{
    CreateInfo, FileTarget, Geometry, Layout, Locate, MetaError, MetaStore, PeerSlot, PickError,
    SbFlags, MD_BLOCK,
};

const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn open(path: &Path, locate: Locate) -> (MetaStore<FileTarget>, tandem_meta::Loaded) {
    MetaStore::open(FileTarget::open(path).unwrap(), locate).unwrap()
}

fn open_err(path: &Path, locate: Locate) -> MetaError {
    MetaStore::open(FileTarget::open(path).unwrap(), locate).unwrap_err()
}

/// External metadata for 1 GiB of data, 3 slots, peers 0 and 2, we are node 1.
fn external(scratch: &Scratch, g: Geometry) -> (std::path::PathBuf, Layout) {
    let layout = Layout::external(GIB, g).unwrap();
    let path = scratch.file("md");
    let target = FileTarget::create(&path, layout.md_end()).unwrap();
    MetaStore::create(target, layout, CreateInfo::new(1, vec![0, 2], 0xC0FFEE)).unwrap();
    (path, layout)
}

fn patch(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
    f.sync_all().unwrap();
}

fn read(path: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, off).unwrap();
    buf
}

#[test]
fn create_open_update_reopen() {
    let s = Scratch::new("cycle");
    let (path, layout) = external(&s, Geometry::new(3));

    let (mut store, loaded) = open(&path, Locate::External);
    let sb = loaded.superblock.clone();
    assert_eq!(sb.seq, 1);
    assert_eq!(sb.layout, layout);
    assert_eq!((sb.node_id, sb.device_uuid), (1, 0xC0FFEE));
    assert_eq!(sb.flags, SbFlags::CLEAN | SbFlags::FULL_SYNC);
    assert_eq!(sb.slot_of_peer(0), Some(0));
    assert_eq!(sb.slot_of_peer(2), Some(1));
    assert_eq!(sb.peers[2], PeerSlot::FREE);
    assert_eq!((loaded.al.newest_seq, loaded.al.hot.len()), (0, 0));
    assert_eq!(loaded.repaired_slot, None);
    for slot in 0..3 {
        assert_eq!(count_set(&store.read_bitmap(slot).unwrap()), 0);
    }

    // Start-up: leave CLEAN, become Primary with a new generation.
    let mut next = sb.clone();
    next.flags = SbFlags::CONSISTENT | SbFlags::WAS_UP_TO_DATE | SbFlags::PRIMARY;
    next.push_history(next.current_gi);
    next.current_gi = 0x1111_2222_3333_4444;
    next.peers[1].bitmap_gi = 0x5555;
    assert_eq!(store.write_superblock(&next).unwrap(), 2);
    drop(store);
    let (store, loaded) = open(&path, Locate::External);
    next.seq = 2;
    assert_eq!(loaded.superblock, next);
    assert_eq!(loaded.repaired_slot, None);

    // Bits of peer slot 1: a few blocks and a whole extent, written page by page.
    let mut words = store.read_bitmap(1).unwrap();
    words[0] = 0b1011;
    mark_extent(&mut words, layout.bitmap_blocks(), 100);
    let pages = pages_of_extent(100);
    store.write_bitmap_pages(1, &words, 0, 1).unwrap();
    store
        .write_bitmap_pages(1, &words, pages.start, pages.end - pages.start)
        .unwrap();
    store.sync().unwrap();
    drop(store);
    let (store, _) = open(&path, Locate::External);
    assert_eq!(store.read_bitmap(1).unwrap(), words);
    assert_eq!(count_set(&store.read_bitmap(1).unwrap()), 3 + 1024);
    assert_eq!(count_set(&store.read_bitmap(0).unwrap()), 0);

    // A few activity-log transactions.
    let (_, loaded) = open(&path, Locate::External);
    let mut al = ActivityLog::from_replay(&loaded.al).unwrap();
    for round in 0..12u32 {
        let Begin::Wait(_) = al.begin(round * 3, round * 3 + 1) else {
            panic!("cold")
        };
        let tx = al.next_transaction().unwrap();
        assert!(tx.evicted.is_empty());
        store.write_al(&tx).unwrap();
        al.committed(tx.seq);
        al.end(round * 3, round * 3 + 1);
    }
    let hot = al.hot_extents();
    assert_eq!(hot.len(), 24);
    let seq = store.superblock().seq;
    drop(store);
    let (store, loaded) = open(&path, Locate::External);
    assert_eq!(loaded.al.hot, hot);
    assert_eq!(loaded.al.next_seq, al.next_seq());
    assert_eq!(loaded.superblock.seq, seq);

    // Clean shutdown: empty the log, then CLEAN.
    let tx = al.clean().unwrap();
    store.write_al(&tx).unwrap();
    al.committed(tx.seq);
    let mut clean = loaded.superblock.clone();
    clean.flags.insert(SbFlags::CLEAN);
    let mut store = store;
    store.write_superblock(&clean).unwrap();
    drop(store);
    let (_, loaded) = open(&path, Locate::External);
    assert!(loaded.al.hot.is_empty());
    assert!(loaded.superblock.flags.contains(SbFlags::CLEAN));
    assert_eq!(loaded.superblock.seq, 3);
}

#[test]
fn internal_on_a_sparse_file() {
    let s = Scratch::new("internal");
    let path = s.file("store");
    let size = 10 * GIB + 12345;
    let g = Geometry::new(4);
    let layout = Layout::internal(size, g).unwrap();
    assert!(layout.data_size() + layout.md_size() <= size);
    assert_eq!(layout.md_offset(), layout.data_size());
    let target = FileTarget::create(&path, size).unwrap();
    let store = MetaStore::create(target, layout, CreateInfo::new(0, vec![1, 2, 3], 7)).unwrap();
    drop(store);
    // The data area is untouched (still a hole); the metadata starts right after it.
    assert!(read(&path, layout.data_size() - 4096, 4096)
        .iter()
        .all(|&b| b == 0));
    assert_eq!(&read(&path, layout.md_offset(), 8), b"TANDEMMD");

    let (_, loaded) = open(&path, Locate::internal(size, g).unwrap());
    assert_eq!(loaded.superblock.layout, layout);

    // Opened with another geometry, the superblock is looked for elsewhere: refused,
    // naming the file and both slots.
    let wrong = Locate::internal(size, Geometry::new(5)).unwrap();
    let err = open_err(&path, wrong).to_string();
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("slot 0") && err.contains("slot 1"),
        "{err}"
    );
    // As external metadata: found nowhere either (offset 0 is data).
    assert!(matches!(
        open_err(&path, Locate::External),
        MetaError::Superblock { .. }
    ));
}

/// The layout test for 1 TiB with 2 peers, on a real sparse file: 2 × 32 MiB of bitmap.
#[test]
fn one_tib_two_peers() {
    let s = Scratch::new("tib");
    let path = s.file("store");
    let g = Geometry::new(2);
    // Data, two bitmaps, superblocks, the AL ring, and the unsynced map (32 KiB per TiB).
    let size = TIB + 2 * (32 << 20) + 2 * MD_BLOCK + 8 * MD_BLOCK + (32 << 10);
    let layout = Layout::internal(size, g).unwrap();
    assert_eq!(layout.data_size(), TIB);
    assert_eq!(layout.bitmap_bytes(), 2 * (32 << 20));
    assert_eq!(layout.unsynced_bytes(), 32 << 10);
    assert_eq!(layout.md_end(), size);
    let target = FileTarget::create(&path, size).unwrap();
    let store = MetaStore::create(target, layout, CreateInfo::new(0, vec![1], 1)).unwrap();
    let mut words = store.read_bitmap(1).unwrap();
    assert_eq!(words.len() as u64, TIB / 4096 / 64);
    // The last block of the volume, in the last page of the last slot.
    *words.last_mut().unwrap() = 1 << 63;
    let last = layout.bitmap_pages() - 1;
    store.write_bitmap_pages(1, &words, last, 1).unwrap();
    store.sync().unwrap();
    drop(store);
    assert_eq!(read(&path, size - (32 << 10) - 1, 1), [0x80]);
    let (store, _) = open(&path, Locate::internal(size, g).unwrap());
    assert_eq!(count_set(&store.read_bitmap(1).unwrap()), 1);
}

#[test]
fn a_superblock_write_torn_while_running_is_repaired() {
    let s = Scratch::new("torn-sb");
    let (path, layout) = external(&s, Geometry::new(31));
    let (mut store, loaded) = open(&path, Locate::External);
    let mut running = loaded.superblock.clone();
    running.flags.remove(SbFlags::CLEAN);
    store.write_superblock(&running).unwrap();
    drop(store);

    // The crash: the next update (seq 3) to slot 0, of which only the first sector landed.
    let mut next = running.clone();
    next.seq = 3;
    next.peers[20] = PeerSlot::new(20);
    let block = next.encode().unwrap();
    patch(&path, layout.superblock_offset(0), &block[..512]);

    let (mut store, loaded) = open(&path, Locate::External);
    assert_eq!(loaded.superblock.seq, 2);
    let repair = loaded.repaired_slot.clone().unwrap();
    assert_eq!(repair.slot, 0);
    assert!(matches!(repair.problem, SlotProblem::Invalid(_)));
    // The next write goes to the damaged slot first, and both are whole again.
    assert_eq!(store.write_superblock(&loaded.superblock).unwrap(), 3);
    drop(store);
    let (_, loaded) = open(&path, Locate::External);
    assert_eq!((loaded.superblock.seq, loaded.repaired_slot), (3, None));
}

#[test]
fn a_crash_between_the_two_writes_leaves_the_new_version() {
    let s = Scratch::new("between");
    let (path, layout) = external(&s, Geometry::new(3));
    let (_, loaded) = open(&path, Locate::External);
    let mut next = loaded.superblock.clone();
    next.seq = 2;
    next.current_gi = 42;
    // Slot 0 written and synced, then the crash.
    patch(
        &path,
        layout.superblock_offset(0),
        &next.encode().unwrap()[..],
    );
    let (_, loaded) = open(&path, Locate::External);
    assert_eq!(
        (loaded.superblock.seq, loaded.superblock.current_gi),
        (2, 42)
    );
    assert_eq!(
        loaded.repaired_slot.unwrap().problem,
        SlotProblem::Stale { seq: 1 }
    );
}

#[test]
fn a_damaged_slot_next_to_a_clean_one_is_refused() {
    let s = Scratch::new("clean-bad");
    let (path, layout) = external(&s, Geometry::new(3));
    // Created metadata is CLEAN. The magic of slot 1 rots at rest: its header no longer
    // shows which version it held, so it may have been a newer one.
    let off = layout.superblock_offset(1) + 2;
    let byte = read(&path, off, 1)[0];
    patch(&path, off, &[byte ^ 0x10]);
    let err = open_err(&path, Locate::External);
    let MetaError::Superblock { source, .. } = &err else {
        panic!("{err}")
    };
    assert!(matches!(
        **source,
        PickError::DamagedAtRest {
            valid_slot: 0,
            invalid_slot: 1,
            ..
        }
    ));
    let text = err.to_string();
    for word in [
        path.to_str().unwrap(),
        "slot 1",
        "offset 4096",
        "bad magic",
        "damaged at rest",
        "tandem dump-md",
        "create-md --force",
    ] {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
    patch(&path, off, &[byte]);
    // A bit of slot 0's history, in its first sector, rots: no torn write explains it.
    let off = layout.superblock_offset(0) + 100;
    let byte = read(&path, off, 1)[0];
    patch(&path, off, &[byte ^ 0x40]);
    let text = open_err(&path, Locate::External).to_string();
    for word in [
        path.to_str().unwrap(),
        "slot 0",
        "checksum mismatch",
        "create-md",
    ] {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
}

/// Damage past the first sector of a copy of the same version as the clean one: the clean
/// one is the newest either way (and this is also what a shutdown torn in its second
/// superblock write looks like), so it is used and the damaged slot reported.
#[test]
fn a_damaged_copy_of_the_same_version_next_to_a_clean_one_is_repaired() {
    let s = Scratch::new("clean-same");
    let (path, layout) = external(&s, Geometry::new(3));
    let off = layout.superblock_offset(1) + 3000;
    let byte = read(&path, off, 1)[0];
    patch(&path, off, &[byte ^ 0x10]);
    let (mut store, loaded) = open(&path, Locate::External);
    let repair = loaded.repaired_slot.clone().unwrap();
    assert_eq!(repair.slot, 1);
    assert!(repair.to_string().contains("checksum mismatch"), "{repair}");
    store.write_superblock(&loaded.superblock).unwrap();
    drop(store);
    assert_eq!(open(&path, Locate::External).1.repaired_slot, None);
}

#[test]
fn both_slots_bad_is_refused() {
    let s = Scratch::new("both-bad");
    let (path, layout) = external(&s, Geometry::new(3));
    patch(&path, layout.superblock_offset(0), b"XXXXXXXX");
    patch(&path, layout.superblock_offset(1), &[0; 4096]);
    let err = open_err(&path, Locate::External);
    let text = err.to_string();
    let MetaError::Superblock { source, .. } = &err else {
        panic!("{err}")
    };
    assert!(matches!(**source, PickError::BothInvalid { .. }));
    for word in [
        path.to_str().unwrap(),
        "slot 0",
        "bad magic XXXXXXXX",
        "slot 1",
        "all zeroes",
    ] {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
}

#[test]
fn an_unsupported_version_says_so() {
    let s = Scratch::new("version");
    let (path, layout) = external(&s, Geometry::new(3));
    for slot in 0..2 {
        patch(
            &path,
            layout.superblock_offset(slot) + 8,
            &7u32.to_le_bytes(),
        );
    }
    let text = open_err(&path, Locate::External).to_string();
    assert!(text.contains("unsupported format version 7"), "{text}");
}

/// Several transactions, then: the next one torn (tolerated), or an older one damaged
/// (refused, naming the block and the transaction).
#[test]
fn activity_log_torn_and_corrupted_on_disk() {
    let s = Scratch::new("al");
    let (path, layout) = external(&s, Geometry::new(3));
    let (store, loaded) = open(&path, Locate::External);
    let mut al = ActivityLog::from_replay(&loaded.al).unwrap();
    let ring = layout.geometry().al_ring_blocks;
    // 13 transactions of 60 extents each (the ring of 8 wraps): the table fills slots
    // 0..780, so even transactions' windows (slots 0..888) reach past the first 2 KiB of
    // their block, and a torn half shows.
    for t in 0..13u32 {
        al.begin(t * 100, t * 100 + 59);
        let tx = al.next_transaction().unwrap();
        assert_eq!(tx.added.len(), 60);
        store.write_al(&tx).unwrap();
        al.committed(tx.seq);
        al.end(t * 100, t * 100 + 59);
    }
    let hot = al.hot_extents();
    drop(store);
    let (store, loaded) = open(&path, Locate::External);
    assert_eq!(loaded.al.hot, hot);
    assert_eq!(loaded.al.newest_seq, 13);

    // Transaction 14, torn: the first half of its block landed over transaction 6.
    al.begin(5000, 5000);
    let tx = al.next_transaction().unwrap();
    assert_eq!((tx.seq, tx.block_index), (14, 14 % ring));
    let off = layout.al_block_offset(tx.block_index);
    assert_ne!(read(&path, off + 2048, 2048), tx.block[2048..]);
    patch(&path, off, &tx.block[..2048]);
    drop(store);
    let (_, loaded) = open(&path, Locate::External);
    assert_eq!(loaded.al.hot, hot);
    assert_eq!(loaded.al.newest_seq, 13);
    assert_eq!(loaded.al.torn_block.as_ref().map(|t| t.0), Some(14 % ring));

    // Transaction 10 (block 2) damaged at rest.
    let off = layout.al_block_offset(10 % ring) + 40;
    let byte = read(&path, off, 1)[0];
    patch(&path, off, &[byte ^ 1]);
    let err = open_err(&path, Locate::External);
    assert!(matches!(err, MetaError::Al { .. }));
    let text = err.to_string();
    for word in [
        path.to_str().unwrap(),
        "block 2",
        "transaction 10",
        "checksum mismatch",
        "create-md --force",
    ] {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
}

#[test]
fn sizes_and_misuse_are_refused() {
    let s = Scratch::new("misuse");
    let g = Geometry::new(3);
    let layout = Layout::external(GIB, g).unwrap();
    let path = s.file("small");
    let small = FileTarget::create(&path, layout.md_end() - 4096).unwrap();
    let err = MetaStore::create(small, layout, CreateInfo::new(1, vec![0], 1)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&layout.md_end().to_string()) && text.contains("max-peers 3"),
        "{text}"
    );

    let (path, _) = external(&s, g);
    // An existing metadata file is never truncated by `create`.
    assert!(FileTarget::create(&path, 4096).is_err());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), layout.md_end());
    // A truncated metadata file is refused at open.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (mut store, loaded) = open(&path, Locate::External);
    f.set_len(layout.md_end() - 4096).unwrap();
    assert!(matches!(
        open_err(&path, Locate::External),
        MetaError::TooSmall { .. }
    ));
    f.set_len(layout.md_end()).unwrap();

    let mut sb = loaded.superblock.clone();
    sb.peers[2] = PeerSlot::new(0);
    let err = store.write_superblock(&sb).unwrap_err().to_string();
    assert!(err.contains("both belong to node 0"), "{err}");
    sb.peers[2] = PeerSlot::FREE;
    sb.layout = Layout::external(2 * GIB, g).unwrap();
    assert!(store.write_superblock(&sb).is_err());
    // Nothing was written by the refusals.
    assert_eq!(store.superblock().seq, 1);

    let words = store.read_bitmap(0).unwrap();
    assert!(store.write_bitmap_pages(3, &words, 0, 1).is_err());
    assert!(store.write_bitmap_pages(0, &words[1..], 0, 1).is_err());
    assert!(store
        .write_bitmap_pages(0, &words, layout.bitmap_pages(), 1)
        .is_err());
    let mut al = ActivityLog::from_replay(&loaded.al).unwrap();
    al.begin(1, 1);
    let mut tx = al.next_transaction().unwrap();
    tx.block_index += 1;
    assert!(store.write_al(&tx).is_err());
}

/// A volume whose size is not a multiple of 4 KiB or of 64 blocks: the last word and the
/// last page are partial.
#[test]
fn partial_last_page() {
    let s = Scratch::new("partial");
    let data = 130 * 1024 * 1024 + 4096 * 5 + 100; // 33286 blocks: 2 pages
    let layout = Layout::external(data, Geometry::new(1)).unwrap();
    assert_eq!(layout.bitmap_blocks(), 33286);
    assert_eq!(layout.bitmap_pages(), 2);
    let path = s.file("md");
    let target = FileTarget::create(&path, layout.md_end()).unwrap();
    let store = MetaStore::create(target, layout, CreateInfo::new(0, vec![], 1)).unwrap();
    let mut words = store.read_bitmap(0).unwrap();
    for e in 0..=layout.extents() as u32 {
        mark_extent(&mut words, layout.bitmap_blocks(), e);
    }
    assert_eq!(count_set(&words), layout.bitmap_blocks());
    store.write_bitmap_pages(0, &words, 0, 2).unwrap();
    drop(store);
    let (store, _) = open(&path, Locate::External);
    assert_eq!(store.read_bitmap(0).unwrap(), words);
}

/// Version 2's unsynced map round-trips page by page; version-1 metadata (made before the
/// map existed) still opens, has no map, and is written back as version 1 with its layout
/// unchanged.
#[test]
fn the_unsynced_map_and_version_1_metadata() {
    let s = Scratch::new("unsynced");
    let (path, layout) = external(&s, Geometry::new(3));
    assert_eq!(
        layout.unsynced_bytes(),
        MD_BLOCK,
        "256 extents fit one page"
    );
    let (store, _) = open(&path, Locate::External);
    let mut words = store.read_unsynced().unwrap();
    assert_eq!(
        words,
        vec![0; 4],
        "1 GiB = 256 extents = 4 words, all clear"
    );
    words[0] = 1 << 5;
    words[3] = 1 << 63;
    store.write_unsynced_page(&words, 0).unwrap();
    assert!(
        store.write_unsynced_page(&words, 1).is_err(),
        "one page only"
    );
    assert!(store.write_unsynced_page(&words[..3], 0).is_err());
    store.sync().unwrap();
    drop(store);
    let (store, loaded) = open(&path, Locate::External);
    assert_eq!(store.read_unsynced().unwrap(), words);
    let dump = store.dump(&loaded).unwrap();
    assert_eq!(dump.format_version, 3);
    assert_eq!(dump.unsynced_extents, Some(vec![5, 255]));

    let v1 = Geometry {
        unsynced_map: false,
        ..Geometry::new(3)
    };
    let (path, layout) = {
        let layout = Layout::external(GIB, v1).unwrap();
        let path = s.file("md-v1");
        let target = FileTarget::create(&path, layout.md_end()).unwrap();
        MetaStore::create(target, layout, CreateInfo::new(1, vec![0, 2], 1)).unwrap();
        (path, layout)
    };
    assert_eq!(
        layout.md_end() + MD_BLOCK,
        Layout::external(GIB, Geometry::new(3)).unwrap().md_end()
    );
    assert_eq!(
        read(&path, 8, 4),
        1u32.to_le_bytes(),
        "written as version 1"
    );
    let (mut store, loaded) = open(&path, Locate::External);
    assert!(!loaded.superblock.layout.geometry().unsynced_map);
    assert!(store.read_unsynced().unwrap().is_empty());
    assert_eq!(store.dump(&loaded).unwrap().unsynced_extents, None);
    let mut sb = loaded.superblock.clone();
    sb.boot_id = [7; 16];
    store.write_superblock(&sb).unwrap();
    drop(store);
    assert_eq!(read(&path, 8, 4), 1u32.to_le_bytes(), "still version 1");
    let (_, loaded) = open(&path, Locate::External);
    assert_eq!(
        loaded.superblock.boot_id, [0; 16],
        "version 1 keeps no boot id"
    );
}
