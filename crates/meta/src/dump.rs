//! Everything a volume's metadata holds, as a serialisable value (`tandem dump-md` prints
//! it as JSON) and as a short text for `tandem show-gi`. Generation ids are printed as 16
//! hex digits.

use std::fmt::Write;

use serde::Serialize;

use crate::bitmap::count_set;
use crate::error::MetaError;
use crate::layout::{Region, AL_EXTENT, BITMAP_BLOCK};
use crate::store::{Loaded, MetaStore};
use crate::superblock::{VERSION, VERSION_1};
use crate::target::MetaTarget;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MetaDump {
    pub target: String,
    pub format_version: u32,
    pub layout: LayoutDump,
    pub superblock: SuperblockDump,
    pub peers: Vec<PeerDump>,
    pub activity_log: AlDump,
    /// Extents that left the activity log with writes not yet known durable (version 2;
    /// `None` for version 1, which has no unsynced map). After a crash that was more than
    /// the process's (another boot), they are resynced like the log's own extents.
    pub unsynced_extents: Option<Vec<u32>>,
    /// A superblock slot that did not hold the newest copy, and why.
    pub repaired_slot: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayoutDump {
    pub placement: &'static str,
    pub data_size: u64,
    pub md_offset: u64,
    pub md_size: u64,
    pub max_peers: u8,
    pub al_extents: u32,
    pub al_ring_blocks: u32,
    pub bitmap_block: u64,
    pub al_extent: u64,
    pub bitmap_slot_bytes: u64,
    pub regions: Vec<Region>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriterDump {
    pub node_id: u8,
    pub incarnation: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SuperblockDump {
    pub seq: u64,
    pub flags: Vec<&'static str>,
    pub node_id: u8,
    pub device_uuid: String,
    pub current_gi: String,
    /// Newest first.
    pub history: Vec<String>,
    /// The id the generation ids were set back from at a crash as Primary (see
    /// `Superblock::abandoned_gi`); `None` if none.
    pub abandoned_gi: Option<String>,
    /// The kernel boot the replica was last attached in (a UUID); `None` if unknown.
    pub boot_id: Option<String>,
    /// The Primary's run the replica takes writes from (see `Superblock::writer`).
    pub writer: Option<WriterDump>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerDump {
    pub slot: usize,
    /// `None`: a free slot.
    pub node_id: Option<u8>,
    pub bitmap_gi: String,
    pub flags: Vec<&'static str>,
    /// Set bits: 4 KiB blocks that may differ on that peer.
    pub out_of_sync_blocks: u64,
    pub out_of_sync_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AlDump {
    pub newest_seq: u64,
    pub next_seq: u64,
    pub replayed_transactions: u32,
    pub hot_extents: Vec<u32>,
    /// The block after the newest, ignored as a torn write, and why.
    pub torn_block: Option<String>,
}

/// A boot id as the kernel prints it (8-4-4-4-12 lower-case hex digits).
pub fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A generation id (or uuid) as 16 upper-case hex digits.
pub fn hex(v: u64) -> String {
    format!("{v:016X}")
}

impl MetaDump {
    /// From what `open` loaded, each slot's count of set bits and the unsynced map's
    /// words (empty without one).
    pub fn new(target: &str, loaded: &Loaded, set_bits: &[u64], unsynced: &[u64]) -> MetaDump {
        let sb = &loaded.superblock;
        let l = &sb.layout;
        let g = l.geometry();
        assert_eq!(set_bits.len(), sb.peers.len(), "one count per slot");
        MetaDump {
            target: target.to_string(),
            format_version: if g.unsynced_map { VERSION } else { VERSION_1 },
            layout: LayoutDump {
                placement: l.placement().name(),
                data_size: l.data_size(),
                md_offset: l.md_offset(),
                md_size: l.md_size(),
                max_peers: g.max_peers,
                al_extents: g.al_extents,
                al_ring_blocks: g.al_ring_blocks,
                bitmap_block: BITMAP_BLOCK,
                al_extent: AL_EXTENT,
                bitmap_slot_bytes: l.bitmap_slot_bytes(),
                regions: l.regions(),
            },
            superblock: SuperblockDump {
                seq: sb.seq,
                flags: sb.flags.names(),
                node_id: sb.node_id,
                device_uuid: hex(sb.device_uuid),
                current_gi: hex(sb.current_gi),
                history: sb.history.iter().map(|&g| hex(g)).collect(),
                abandoned_gi: (sb.abandoned_gi != 0).then(|| hex(sb.abandoned_gi)),
                boot_id: (sb.boot_id != [0; 16]).then(|| uuid_text(&sb.boot_id)),
                writer: sb.writer.map(|(node_id, incarnation)| WriterDump {
                    node_id,
                    incarnation: hex(incarnation),
                }),
            },
            peers: sb
                .peers
                .iter()
                .zip(set_bits)
                .enumerate()
                .map(|(slot, (p, &bits))| PeerDump {
                    slot,
                    node_id: p.node_id,
                    bitmap_gi: hex(p.bitmap_gi),
                    flags: p.flags.names(),
                    out_of_sync_blocks: bits,
                    out_of_sync_bytes: (bits * BITMAP_BLOCK).min(l.data_size()),
                })
                .collect(),
            activity_log: AlDump {
                newest_seq: loaded.al.newest_seq,
                next_seq: loaded.al.next_seq,
                replayed_transactions: loaded.al.replayed,
                hot_extents: loaded.al.hot.clone(),
                torn_block: loaded
                    .al
                    .torn_block
                    .as_ref()
                    .map(|(b, e)| format!("block {b}: {e}")),
            },
            unsynced_extents: g.unsynced_map.then(|| {
                (0..l.extents())
                    .filter(|&e| unsynced[(e / 64) as usize] & (1 << (e % 64)) != 0)
                    .map(|e| e as u32)
                    .collect()
            }),
            repaired_slot: loaded.repaired_slot.as_ref().map(|r| r.to_string()),
        }
    }

    /// The generation ids and flags, for `tandem show-gi`.
    pub fn show_gi(&self) -> String {
        let sb = &self.superblock;
        let mut out = String::new();
        let _ = writeln!(out, "node {} ({})", sb.node_id, self.target);
        let _ = writeln!(out, "current   {}", sb.current_gi);
        for p in self.peers.iter() {
            let Some(node) = p.node_id else { continue };
            let _ = writeln!(
                out,
                "bitmap    {}  node {node} (slot {}), {} blocks out of sync{}",
                // Without the flag the slot counts from no generation (0 is a real one).
                if p.flags.contains(&"bitmap-gi") {
                    p.bitmap_gi.as_str()
                } else {
                    "none            "
                },
                p.slot,
                p.out_of_sync_blocks,
                if p.flags.contains(&"full-sync") {
                    ", full sync"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(out, "history   {}", sb.history.join(" "));
        if let Some(gi) = &sb.abandoned_gi {
            let how = if sb.flags.contains(&"abandoned-without-quorum") {
                "set aside as Primary when quorum was lost"
            } else {
                "set back from at a crash as Primary"
            };
            let _ = writeln!(
                out,
                "abandoned {gi}  ({how}: nothing acknowledged under it)"
            );
        }
        let _ = writeln!(out, "flags     {}", sb.flags.join(" "));
        out
    }
}

impl<T: MetaTarget> MetaStore<T> {
    /// Reads every bitmap slot to count its bits.
    pub fn dump(&self, loaded: &Loaded) -> Result<MetaDump, MetaError> {
        let slots = usize::from(self.layout().geometry().max_peers);
        let counts = (0..slots)
            .map(|s| self.read_bitmap(s).map(|w| count_set(&w)))
            .collect::<Result<Vec<_>, _>>()?;
        let unsynced = self.read_unsynced()?;
        Ok(MetaDump::new(
            &self.target().describe(),
            loaded,
            &counts,
            &unsynced,
        ))
    }
}
