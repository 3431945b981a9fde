//! The store through `PmemTarget` on /dev/shm (tmpfs: not DAX, so the emulated mode),
//! read back through `FileTarget`.

mod common;

use common::Scratch;
use tandem_meta::al::ActivityLog;
use tandem_meta::bitmap::{count_set, mark_extent};
use tandem_meta::pmem::Flush;
use tandem_meta::{
    CreateInfo, FileTarget, Geometry, Layout, Locate, MetaStore, MetaTarget, NonDax, PmemTarget,
    SbFlags,
};

const GIB: u64 = 1 << 30;

#[test]
fn create_open_update_through_pmem_then_read_as_a_file() {
    let s = Scratch::new_in("/dev/shm", "pmem");
    let path = s.file("md");
    let layout = Layout::external(4 * GIB, Geometry::new(2)).unwrap();
    FileTarget::create(&path, layout.md_end()).unwrap();

    let pmem = PmemTarget::open(&path, NonDax::Emulate).unwrap();
    assert!(!pmem.is_dax(), "tmpfs has no DAX");
    #[cfg(target_arch = "x86_64")]
    assert_ne!(pmem.flush_kind(), Flush::None);
    assert_eq!(pmem.size().unwrap(), layout.md_end());
    MetaStore::create(pmem, layout, CreateInfo::new(3, vec![1, 2], 99)).unwrap();

    // Reopen through a new mapping and update everything.
    let pmem = PmemTarget::open(&path, NonDax::Emulate).unwrap();
    let (mut store, loaded) = MetaStore::open(pmem, Locate::External).unwrap();
    let mut sb = loaded.superblock.clone();
    sb.flags = SbFlags::CONSISTENT | SbFlags::PRIMARY;
    sb.current_gi = 0xABCD_EF01_2345_6789;
    store.write_superblock(&sb).unwrap();
    let mut words = store.read_bitmap(1).unwrap();
    mark_extent(&mut words, layout.bitmap_blocks(), 7);
    words[3] |= 1 << 9;
    store.write_bitmap_pages(1, &words, 0, 1).unwrap();
    let mut al = ActivityLog::from_replay(&loaded.al).unwrap();
    al.begin(7, 8);
    let tx = al.next_transaction().unwrap();
    store.write_al(&tx).unwrap();
    al.committed(tx.seq);
    store.sync().unwrap();
    drop(store);

    // The same bytes through the page cache.
    let (store, loaded) =
        MetaStore::open(FileTarget::open(&path).unwrap(), Locate::External).unwrap();
    sb.seq = 2;
    assert_eq!(loaded.superblock, sb);
    assert_eq!(loaded.al.hot, vec![7, 8]);
    assert_eq!(store.read_bitmap(1).unwrap(), words);
    assert_eq!(count_set(&store.read_bitmap(0).unwrap()), 0);
}

#[test]
fn pmem_bounds_and_modes() {
    let s = Scratch::new_in("/dev/shm", "pmem-modes");
    let path = s.file("md");
    FileTarget::create(&path, 3 * 4096).unwrap();
    // tmpfs refuses MAP_SYNC: with Refuse, that is an error.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    assert!(PmemTarget::open(&path, NonDax::Refuse).is_err());

    let pmem = PmemTarget::open(&path, NonDax::Msync).unwrap();
    let block = [0x5a_u8; 4096];
    pmem.write_at(&block, 8192).unwrap();
    pmem.sync().unwrap();
    assert!(pmem.write_at(&block, 8193).is_err());
    let mut buf = [0u8; 4096];
    assert!(pmem.read_at(&mut buf, 3 * 4096).is_err());
    pmem.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, block);
    // Unaligned small writes flush every line they touch.
    pmem.write_at(&[1, 2, 3], 63).unwrap();
    let mut small = [0u8; 3];
    FileTarget::open(&path)
        .unwrap()
        .read_at(&mut small, 63)
        .unwrap();
    assert_eq!(small, [1, 2, 3]);

    let empty = s.file("empty");
    FileTarget::create(&empty, 0).unwrap();
    assert!(PmemTarget::open(&empty, NonDax::Emulate).is_err());
}
