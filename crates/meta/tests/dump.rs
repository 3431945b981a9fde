//! `MetaDump` as JSON and the `show-gi` text.

mod common;

use common::Scratch;
use tandem_meta::al::ActivityLog;
use tandem_meta::bitmap::mark_extent;
use tandem_meta::{
    CreateInfo, FileTarget, Geometry, Layout, Locate, MetaStore, PeerFlags, SbFlags,
};

#[test]
fn dump_and_show_gi() {
    let s = Scratch::new("dump");
    let path = s.file("md");
    let layout = Layout::external(1 << 30, Geometry::new(3)).unwrap();
    let target = FileTarget::create(&path, layout.md_end()).unwrap();
    let mut store =
        MetaStore::create(target, layout, CreateInfo::new(1, vec![0, 2], 0xD1CE)).unwrap();
    let mut sb = store.superblock().clone();
    sb.current_gi = 0x0123_4567_89AB_CDEF;
    sb.peers[1].bitmap_gi = 0xBEEF;
    sb.peers[1].flags.insert(PeerFlags::BITMAP_GI);
    sb.history[0] = 0x42;
    sb.flags = SbFlags::CONSISTENT | SbFlags::PRIMARY;
    store.write_superblock(&sb).unwrap();
    let mut words = store.read_bitmap(1).unwrap();
    mark_extent(&mut words, layout.bitmap_blocks(), 3);
    store.write_bitmap_pages(1, &words, 0, 1).unwrap();
    let (_, loaded) = MetaStore::open(FileTarget::open(&path).unwrap(), Locate::External).unwrap();
    let mut al = ActivityLog::from_replay(&loaded.al).unwrap();
    al.begin(3, 4);
    let tx = al.next_transaction().unwrap();
    store.write_al(&tx).unwrap();
    drop(store);

    let (store, loaded) =
        MetaStore::open(FileTarget::open_read_only(&path).unwrap(), Locate::External).unwrap();
    let dump = store.dump(&loaded).unwrap();
    // Read only: a write through it fails.
    assert!(store.sync().is_ok());
    assert!(store.write_bitmap_pages(1, &words, 0, 1).is_err());
    let json: serde_json::Value = serde_json::to_value(&dump).unwrap();
    assert_eq!(json["format_version"], 3);
    assert_eq!(json["superblock"]["writer"], serde_json::Value::Null);
    assert_eq!(json["unsynced_extents"], serde_json::json!([]));
    assert_eq!(json["superblock"]["boot_id"], serde_json::Value::Null);
    assert_eq!(json["superblock"]["current_gi"], "0123456789ABCDEF");
    assert_eq!(json["superblock"]["device_uuid"], "000000000000D1CE");
    assert_eq!(
        json["superblock"]["flags"],
        serde_json::json!(["consistent", "primary"])
    );
    assert_eq!(json["superblock"]["history"][0], "0000000000000042");
    assert_eq!(json["peers"][1]["node_id"], 2);
    assert_eq!(json["peers"][1]["bitmap_gi"], "000000000000BEEF");
    assert_eq!(json["peers"][1]["out_of_sync_blocks"], 1024);
    assert_eq!(
        json["peers"][1]["flags"],
        serde_json::json!(["exists", "bitmap-gi"])
    );
    assert_eq!(json["peers"][2]["node_id"], serde_json::Value::Null);
    assert_eq!(
        json["activity_log"]["hot_extents"],
        serde_json::json!([3, 4])
    );
    assert_eq!(json["activity_log"]["newest_seq"], 1);
    assert_eq!(json["layout"]["placement"], "external");
    assert_eq!(json["layout"]["regions"][2]["name"], "activity-log");
    assert_eq!(json["layout"]["regions"][2]["offset"], 8192);

    let text = dump.show_gi();
    assert!(text.contains("current   0123456789ABCDEF"), "{text}");
    assert!(
        text.contains("000000000000BEEF  node 2 (slot 1), 1024 blocks"),
        "{text}"
    );
    // Node 0's slot counts from no generation (no BITMAP_GI flag).
    assert!(text.contains("none              node 0 (slot 0)"), "{text}");
    assert!(text.contains("flags     consistent primary"), "{text}");
    assert!(
        text.contains("history   0000000000000042 0000000000000000"),
        "{text}"
    );
}
