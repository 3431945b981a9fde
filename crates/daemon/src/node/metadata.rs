//! Each replica's metadata (`tandem-meta`): found, created or refused when the node starts,
//! marked running (not clean) before any I/O, and written back from what the engine keeps
//! (`Resource::persisted`) when the node stops cleanly. What the engine may trust at start
//! follows from it: a clean stop while consistent starts `Consistent` with the peers'
//! bitmaps restored; anything else (a crash, a file made before metadata) starts unproven.

use anyhow::{bail, Context, Result};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tandem_config::{MetaDisk, ResourceConfig, VolumeConfig};
use tandem_engine::replica::{
    AbandonedId, GenIds, IdsAtCrash, NodeId, Persisted, PrimaryRun, ReplicaAtStart,
};
use tandem_meta::{
    ActivityLog, CreateInfo, FileTarget, Geometry, Layout, Locate, MetaStore, MetaTarget, NonDax,
    PeerFlags, PeerSlot, Placement, PmemTarget, SbFlags, Superblock, WaitId, AL_EXTENT,
};
use tandem_storage::{Backing, OpenOptions};
use tracing::{info, warn};

use super::unsynced::{self, Unsynced};

/// Internal metadata lives in the backing store itself. A superblock update is written
/// through a second descriptor opened O_DSYNC, which makes durable that write alone: an
/// fdatasync of the file would write back every dirty page of the volume first, on the
/// event loop (a peer lost under load changes the generation ids: up to 0.9 s there, long
/// enough for the Primary to drop this node for a missed ping and fail its writes).
#[derive(Debug)]
pub(super) struct BackingTarget(pub(super) Arc<Backing>, Option<std::fs::File>);

impl BackingTarget {
    pub(super) fn new(backing: Arc<Backing>) -> BackingTarget {
        use std::os::unix::fs::OpenOptionsExt;
        let dsync = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(backing.path())
            .ok();
        BackingTarget(backing, dsync)
    }
}

impl MetaTarget for BackingTarget {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.0.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.0.write_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        match &self.1 {
            Some(f) => f.write_all_at(buf, off),
            None => {
                self.0.write_at(buf, off)?;
                self.0.sync_data()
            }
        }
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.size())
    }
    fn describe(&self) -> String {
        format!("{} (internal metadata)", self.0.path().display())
    }
}

/// Where one replica's metadata is.
#[derive(Debug)]
pub(super) enum Target {
    Internal(BackingTarget),
    File(FileTarget),
    Pmem(PmemTarget),
}

impl MetaTarget for Target {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match self {
            Target::Internal(t) => t.read_at(buf, off),
            Target::File(t) => t.read_at(buf, off),
            Target::Pmem(t) => t.read_at(buf, off),
        }
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        match self {
            Target::Internal(t) => t.write_at(buf, off),
            Target::File(t) => t.write_at(buf, off),
            Target::Pmem(t) => t.write_at(buf, off),
        }
    }
    fn sync(&self) -> io::Result<()> {
        match self {
            Target::Internal(t) => t.sync(),
            Target::File(t) => t.sync(),
            Target::Pmem(t) => t.sync(),
        }
    }
    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        match self {
            Target::Internal(t) => t.write_durable_at(buf, off),
            Target::File(t) => t.write_durable_at(buf, off),
            Target::Pmem(t) => t.write_durable_at(buf, off),
        }
    }
    fn size(&self) -> io::Result<u64> {
        match self {
            Target::Internal(t) => t.size(),
            Target::File(t) => t.size(),
            Target::Pmem(t) => t.size(),
        }
    }
    fn describe(&self) -> String {
        match self {
            Target::Internal(t) => t.describe(),
            Target::File(t) => t.describe(),
            Target::Pmem(t) => t.describe(),
        }
    }
}

/// One replica's metadata while the node runs: the store, and the activity log every
/// write to the replica passes (see `node/activity.rs`).
#[derive(Debug)]
pub(super) struct VolumeMeta {
    store: MetaStore<Target>,
    pub(super) al: ActivityLog,
    /// Per bitmap slot, per page: this page is all zeros on disk, as this process last
    /// wrote it. An eviction skips such a page while the engine's is still all zeros too,
    /// which is every page while the peers are connected and in sync; anything else is
    /// written (an exact rule: no page is skipped on a guess).
    zero_on_disk: Vec<Vec<bool>>,
    /// Extents evicted with writes not yet durable (empty for version-1 metadata).
    unsynced: Unsynced,
    /// The map as read at start names suspect ranges of the replica (a crash in another
    /// boot): `unsynced_after_start` keeps them while the replica stays consistent.
    map_in_suspect: bool,
}

/// Names the start of a data sync for a volume's metadata (`VolumeMeta::sync_started`).
#[derive(Clone, Copy, Debug)]
pub(super) struct DataSyncMark {
    al: tandem_meta::SyncMark,
    unsynced: u64,
    at: Instant,
}

/// The extents `first..=last` a write of `len` bytes at `offset` touches (`len` > 0).
pub(super) fn extents_of(offset: u64, len: u64) -> (u32, u32) {
    let last = offset + len.max(1) - 1;
    ((offset / AL_EXTENT) as u32, (last / AL_EXTENT) as u32)
}

/// A replica opened at start: its backing store, what the engine is told, the peers'
/// bitmaps to restore (node, words, wrote apart, bitmap gi), after a crash the ranges its
/// activity log names, and its metadata.
pub(super) struct Opened {
    pub(super) backing: Arc<Backing>,
    pub(super) found: ReplicaAtStart,
    pub(super) restore: Vec<(NodeId, Vec<u64>, bool, Option<u64>)>,
    pub(super) suspect: Vec<(u64, u64)>,
    /// After a crash of the process alone (the same boot): the Primary's run the replica
    /// took writes from, which settles `suspect` if met again (see the engine's
    /// `writer.rs`).
    pub(super) writer: Option<PrimaryRun>,
    /// After a crash in another boot (a power loss): writes to `suspect` may be gone.
    pub(super) lost_power: bool,
    pub(super) meta: VolumeMeta,
}

/// The other nodes keeping a replica of volume `v`: one bitmap slot each.
pub(super) fn diskful_peers(cfg: &ResourceConfig, v: usize, me: NodeId) -> Vec<NodeId> {
    cfg.nodes
        .iter()
        .filter(|n| n.node_id != me && !n.volumes[v].is_diskless())
        .map(|n| n.node_id)
        .collect()
}

/// The bitmap slots new metadata gets: one per other diskful node, or `max-peers` if
/// that is more (spare slots for nodes added later).
fn geometry(cfg: &ResourceConfig, v: usize, me: NodeId, al_extents: u32) -> Geometry {
    let spare = cfg
        .nodes
        .iter()
        .find(|n| n.node_id == me)
        .and_then(|n| n.volumes[v].max_peers)
        .map_or(0, usize::from);
    let peers = diskful_peers(cfg, v, me).len().max(spare).max(1) as u8;
    Geometry::with_al_extents(peers, al_extents)
}

/// A random identity for a new replica.
fn device_uuid() -> Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).context("no randomness for a replica's identity")?;
    Ok(u64::from_le_bytes(b))
}

/// Opens (or creates) volume `v`'s backing store and its metadata, and says what the engine
/// may trust. Corrupted metadata is refused with the file and the way out; nothing is
/// reinitialised behind the operator's back.
pub(super) fn open_replica(
    cfg: &ResourceConfig,
    v: usize,
    me: NodeId,
    disk: &Path,
    meta_disk: &MetaDisk,
    al_extents: u32,
) -> Result<Opened> {
    let vc = &cfg.volumes[v];
    let what = || format!("resource {} volume {}", cfg.name, vc.number);
    let g = geometry(cfg, v, me, al_extents);
    let existed = disk.exists();
    let (backing, target, md_existed) = match meta_disk {
        MetaDisk::Internal => {
            let layout = Layout::new(Placement::Internal, g, vc.size)
                .with_context(|| format!("{}: internal metadata", what()))?;
            let (backing, had_room) =
                open_internal(vc, disk, layout.md_end()).with_context(what)?;
            (
                Arc::clone(&backing),
                Target::Internal(BackingTarget::new(backing)),
                had_room,
            )
        }
        MetaDisk::External(path) | MetaDisk::Pmem(path) => {
            let backing = Arc::new(open_backing(disk, Some(vc.size)).with_context(what)?);
            if !existed && path.exists() {
                // The data it described is gone (a new disk, a deleted file): it must not
                // vouch for a file of zeroes. Made new below, over the same file.
                warn!(resource = %cfg.name, volume = vc.number,
                    "backing file {} is new: the metadata in {} describes data that is gone; writing new metadata",
                    disk.display(), path.display());
            }
            let md_existed = existed && path.exists();
            if !path.exists() {
                let size = Layout::required_external_size(vc.size, g)?;
                FileTarget::create(path, size).with_context(|| {
                    format!("{}: creating meta-disk {}", what(), path.display())
                })?;
            }
            let target = match meta_disk {
                MetaDisk::Pmem(_) => {
                    let t = PmemTarget::open(path, non_dax_of(path))
                        .with_context(|| format!("{}: mapping {}", what(), path.display()))?;
                    if !t.is_dax() {
                        warn!(resource = %cfg.name, volume = vc.number, "meta-disk {} is not on a DAX filesystem: {}", path.display(),
                        if on_tmpfs(path) {
                            "on tmpfs it emulates persistent memory's latency, not its durability (the file is gone at reboot, and the replica is then resynced in full)"
                        } else {
                            "each update is made durable with msync (a system call), not with cache-line write-backs"
                        });
                    }
                    Target::Pmem(t)
                }
                _ => Target::File(
                    FileTarget::open(path)
                        .with_context(|| format!("{}: opening {}", what(), path.display()))?,
                ),
            };
            (backing, target, md_existed)
        }
    };
    // What the page cache kept of writes acknowledged before a kill -9 is made durable
    // before anything is served: a flush after the start must cover them, and the sync
    // plan starts knowing of no write (seed 97 of the simulator's crash family).
    backing
        .sync_data()
        .with_context(|| format!("{}: fdatasync of {} at start", what(), disk.display()))?;
    let (placement, locate) = placement_of(meta_disk, vc.size);
    let peers = diskful_peers(cfg, v, me);
    if !md_existed {
        // New metadata: for a new replica (it holds nothing), or for one that holds data
        // of unknown currency (made before metadata existed): unproven, synced in full.
        let layout = Layout::new(placement, g, vc.size)?;
        let mut init = CreateInfo::new(me, peers, device_uuid()?);
        if existed {
            init.flags = SbFlags::EMPTY;
            warn!(resource = %cfg.name, volume = vc.number,
                "{} has no metadata: created it; the replica's data is of unknown currency and is synced in full from an up-to-date peer",
                disk.display());
        }
        let store = MetaStore::create(target, layout, init)
            .with_context(|| format!("{}: creating metadata", what()))?;
        let al = activity_log(&store).with_context(what)?;
        let found = if existed {
            ReplicaAtStart::Existing
        } else {
            warn!(resource = %cfg.name, volume = vc.number,
                "backing file {} did not exist: created it empty. It holds no data, so it starts Inconsistent and is synced in full from an up-to-date peer before it serves reads, unless every node's replica of this volume is new (a new cluster)",
                disk.display());
            ReplicaAtStart::Created
        };
        return Ok(Opened {
            backing,
            found,
            restore: Vec::new(),
            suspect: Vec::new(),
            writer: None,
            lost_power: false,
            meta: VolumeMeta::new(store, al, Vec::new()),
        });
    }
    let (store, loaded) = MetaStore::open(target, locate).with_context(|| {
        format!(
            "{}: the replica's metadata cannot be used; the volume is not attached",
            what()
        )
    })?;
    if let Some(r) = &loaded.repaired_slot {
        warn!(resource = %cfg.name, volume = vc.number,
            "metadata of {}: {r:?}; the other copy is used and this one is rewritten",
            disk.display());
    }
    let sb = &loaded.superblock;
    if sb.node_id != me {
        bail!(
            "{}: the metadata of {} belongs to node id {}, this node is {me}; was the disk moved? `tandem create-md --force` makes it this node's (and resyncs it in full)",
            what(),
            disk.display(),
            sb.node_id
        );
    }
    if sb.layout.data_size() != vc.size {
        bail!(
            "{}: the metadata of {} describes a volume of {} bytes, the configuration {} bytes",
            what(),
            disk.display(),
            sb.layout.data_size(),
            vc.size
        );
    }
    let clean = sb.flags.contains(SbFlags::CLEAN);
    let consistent = sb.flags.contains(SbFlags::CONSISTENT);
    // A torn newest transaction is tolerated (a crash while writing it); anything else
    // refuses the volume, as corrupted metadata does.
    let al = activity_log(&store).with_context(|| {
        format!(
            "{}: the replica's activity log cannot be used; the volume is not attached",
            what()
        )
    })?;
    let found = if clean && consistent {
        ReplicaAtStart::Consistent
    } else if clean && sb.flags.contains(SbFlags::FULL_SYNC) {
        // Created, never synced, stopped cleanly: it still holds nothing.
        ReplicaAtStart::Created
    } else if !clean && consistent {
        ReplicaAtStart::Crashed
    } else if clean {
        // Stopped cleanly while not consistent (being synced): its data is of unknown
        // currency, but the stop wrote its bitmaps whole, and they may name a Primary's
        // writes that reached it alone.
        ReplicaAtStart::Inconsistent
    } else {
        // Crashed while not consistent: its data is of unknown currency, and its bitmaps
        // are no account of what its peers lack (the pages are as their extents last left
        // the log, and the log's extents, coarse, would claim writes every peer holds).
        ReplicaAtStart::Existing
    };
    // After a crash the log's extents are where this replica may differ from its peers,
    // and after a crash of more than the process (another boot) also those the unsynced
    // map names: writes to them may have been lost with the page cache.
    let map = store.read_unsynced()?;
    let same_boot = sb.boot_id != [0; 16] && sb.boot_id == unsynced::boot_id();
    let mut extents = Vec::new();
    let mut from_map = 0;
    if found == ReplicaAtStart::Crashed {
        extents = al.hot_extents();
        if !same_boot {
            let before = extents.len();
            extents.extend(unsynced::set_extents(&map));
            extents.sort_unstable();
            extents.dedup();
            from_map = extents.len() - before;
        }
    }
    let suspect: Vec<(u64, u64)> = extents
        .into_iter()
        .map(|e| u64::from(e) * AL_EXTENT)
        .filter(|&o| o < vc.size)
        .map(|o| (o, AL_EXTENT.min(vc.size - o)))
        .collect();
    let writer = sb
        .writer
        .filter(|_| found == ReplicaAtStart::Crashed && same_boot)
        .map(|(node, incarnation)| PrimaryRun { node, incarnation });
    if found == ReplicaAtStart::Crashed {
        warn!(resource = %cfg.name, volume = vc.number,
        "{} did not stop cleanly{}{}; its activity log{} names {} extents ({} MiB) where it may differ from its peers: those are pulled under the Primary, not the whole volume{}",
        disk.display(),
        if sb.flags.contains(SbFlags::PRIMARY) { " (it was Primary)" } else { "" },
        if !store.layout().geometry().unsynced_map { "" }
            else if same_boot { " (the process only: the page cache kept its writes)" }
            else { " (in another boot: writes in the page cache may be lost)" },
        if from_map > 0 { format!(" and its unsynced map ({from_map} more)") } else { String::new() },
        suspect.len(),
        suspect.iter().map(|&(_, l)| l).sum::<u64>() >> 20,
        match writer {
            Some(r) => format!(", or none of them if node {} is Primary in the same run as before (its list then names all this replica lacks)", r.node),
            None => String::new(),
        });
    }
    let mut restore = Vec::new();
    if matches!(
        found,
        ReplicaAtStart::Consistent | ReplicaAtStart::Crashed | ReplicaAtStart::Inconsistent
    ) {
        for &p in &peers {
            if let Some(slot) = sb.slot_of_peer(p) {
                let mut words = store.read_bitmap(slot)?;
                // After a crash the pages hold what was marked when their extents left
                // the log; what was marked since lies in the log's extents: every peer
                // may lack those.
                for &(offset, len) in &suspect {
                    set_blocks(&mut words, offset, len);
                }
                let apart = sb.peers[slot].flags.contains(PeerFlags::WROTE_APART);
                let slot = &sb.peers[slot];
                // Kept through a crash too: every change is written before what follows
                // it, and the log's extents, added above, name what changed since.
                let gi = (slot.flags)
                    .contains(PeerFlags::BITMAP_GI)
                    .then_some(slot.bitmap_gi);
                restore.push((p, words, apart, gi));
            }
        }
    }
    info!(resource = %cfg.name, volume = vc.number,
        "metadata of {}: {}; starts {found:?}",
        disk.display(),
        if clean { "stopped cleanly" } else { "did not stop cleanly (crash or kill)" });
    Ok(Opened {
        backing,
        found,
        restore,
        suspect,
        writer,
        lost_power: found == ReplicaAtStart::Crashed && !same_boot,
        meta: VolumeMeta {
            map_in_suspect: found == ReplicaAtStart::Crashed
                && !same_boot
                && map.iter().any(|&w| w != 0),
            ..VolumeMeta::new(store, al, map)
        },
    })
}

/// What a `pmem:` meta-disk does without DAX: on tmpfs, which keeps nothing across a
/// reboot anyway, stores and fences as on persistent memory (the benchmarks' stand-in);
/// anywhere else, msync, so that metadata on an ordinary filesystem is still durable.
fn non_dax_of(path: &Path) -> NonDax {
    if on_tmpfs(path) {
        NonDax::Emulate
    } else {
        NonDax::Msync
    }
}

fn on_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the size statfs(2) fills.
    let rc = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    // SAFETY: statfs filled it when it returned 0.
    rc == 0 && unsafe { st.assume_init() }.f_type == libc::TMPFS_MAGIC
}

/// Sets the bits of the 4 KiB blocks `offset..offset + len` touches.
fn set_blocks(words: &mut [u64], offset: u64, len: u64) {
    let block = tandem_meta::BITMAP_BLOCK;
    let (first, end) = (offset / block, (offset + len).div_ceil(block));
    for b in first..end.min(words.len() as u64 * 64) {
        words[(b / 64) as usize] |= 1 << (b % 64);
    }
}

/// The activity log as its ring left it.
fn activity_log(store: &MetaStore<Target>) -> Result<ActivityLog> {
    let replay = store.read_al()?;
    Ok(ActivityLog::from_replay(&replay)?)
}

/// Where a volume of `size` bytes keeps its metadata, and where `open` finds the superblock
/// (internal metadata starts right after the volume).
fn placement_of(meta: &MetaDisk, size: u64) -> (Placement, Locate) {
    match meta {
        MetaDisk::Internal => (Placement::Internal, Locate::Internal { md_offset: size }),
        MetaDisk::External(_) | MetaDisk::Pmem(_) => (Placement::External, Locate::External),
    }
}

/// The backing file with room for internal metadata of `md_end` bytes in all: created so,
/// grown to it when it is exactly the volume's size (made before metadata existed), a
/// block device that big; and whether it already had that room (and so metadata).
fn open_internal(vc: &VolumeConfig, disk: &Path, md_end: u64) -> Result<(Arc<Backing>, bool)> {
    if !disk.exists() {
        return Ok((Arc::new(open_backing(disk, Some(md_end))?), false));
    }
    let mut b = open_backing(disk, None)?;
    let size = b.size();
    if size == vc.size {
        b.grow_to(md_end).with_context(|| {
            format!(
                "{} holds the volume but no room for its metadata",
                disk.display()
            )
        })?;
        return Ok((Arc::new(b), false));
    }
    // Metadata made with another geometry (fewer bitmap slots, other al-extents) is
    // smaller than this configuration's: its superblock, right after the volume, says
    // its own size, which `MetaStore::open` checks. Only a file that cannot hold even a
    // superblock pair is refused here.
    if size < vc.size + 2 * tandem_meta::MD_BLOCK {
        bail!(
            "{} is {size} bytes; the volume ({} bytes) and its internal metadata need {md_end} (or use meta-disk = \"/path\")",
            disk.display(),
            vc.size
        );
    }
    Ok((Arc::new(b), true))
}

fn open_backing(disk: &Path, size: Option<u64>) -> Result<Backing> {
    Ok(Backing::open(&OpenOptions {
        path: PathBuf::from(disk),
        size,
        direct: false,
        read_only: false,
    })?)
}

/// The backing store of a replica whose node must be stopped: locked, it is in use by
/// the node (`hint` says what to do); any other error names the file once, as it is.
fn open_stopped(disk: &Path, hint: &str) -> Result<Backing> {
    let options = OpenOptions {
        path: PathBuf::from(disk),
        size: None,
        direct: false,
        read_only: false,
    };
    match Backing::open(&options) {
        Err(e @ tandem_storage::StorageError::Locked { .. }) => {
            bail!("{e}: is its node running? {hint}")
        }
        r => Ok(r?),
    }
}

impl VolumeMeta {
    /// `map`: the unsynced map as read (empty for new metadata: then all zeroes).
    fn new(store: MetaStore<Target>, al: ActivityLog, map: Vec<u64>) -> VolumeMeta {
        let pages = store.layout().bitmap_pages() as usize;
        let slots = store.superblock().peers.len();
        let map = if map.is_empty() {
            vec![0; store.unsynced_words()]
        } else {
            map
        };
        VolumeMeta {
            store,
            al,
            zero_on_disk: vec![vec![false; pages]; slots],
            unsynced: Unsynced::new(map, Instant::now()),
            map_in_suspect: false,
        }
    }

    /// Evicting an extent whose writes may not be durable records it in the unsynced map
    /// instead of syncing the data first: the metadata has a map, and a sync of it is not
    /// a sync of the data anyway (internal metadata's is: there the old rule is as cheap).
    pub(super) fn records_unsynced(&self) -> bool {
        self.unsynced.present() && !matches!(self.store.target(), Target::Internal(_))
    }

    /// Writes that left the activity log wait for a data sync in the unsynced map, the
    /// oldest for `interval` or more.
    pub(super) fn unsynced_due(&self, now: Instant, interval: Duration) -> bool {
        self.unsynced.due(now, interval)
    }

    /// A data sync of the volume starts: give the mark to `sync_done` if it succeeds.
    pub(super) fn sync_started(&mut self) -> DataSyncMark {
        DataSyncMark {
            al: self.al.sync_started(),
            unsynced: self.unsynced.started(),
            at: Instant::now(),
        }
    }

    /// That sync succeeded: the extents it covers are clean, and leave the unsynced map.
    pub(super) fn sync_done(&mut self, mark: DataSyncMark) -> Result<()> {
        self.al.sync_done(mark.al);
        let pages = self.unsynced.synced(mark.unsynced, mark.at);
        self.write_unsynced(&pages)
    }

    /// Writes pages of the unsynced map (not synced).
    fn write_unsynced(&self, pages: &[u64]) -> Result<()> {
        for &p in pages {
            self.store.write_unsynced_page(self.unsynced.words(), p)?;
        }
        Ok(())
    }

    /// After the start-up fdatasync, once `set_state` wrote what a crash is judged by:
    /// every write so far is durable, so the map empties. Unless the replica keeps suspect
    /// ranges (`keeps_suspect`: back from a crash, consistent and not yet proven,
    /// `Resource::suspect_ranges`) that the map's extents are among (a crash in another
    /// boot): a second crash must find them again. They stay until `release_unsynced`, and
    /// the boot is written as unknown meanwhile, so that a crash of the process alone
    /// reads the map too.
    pub(super) fn unsynced_after_start(&mut self, keeps_suspect: bool) -> Result<()> {
        if keeps_suspect && self.map_in_suspect {
            self.unsynced.hold();
            let mut sb = self.store.superblock().clone();
            sb.boot_id = [0; 16];
            self.store.write_superblock(&sb)?;
            return Ok(());
        }
        let pages = self.unsynced.clear();
        self.write_unsynced(&pages)?;
        if !pages.is_empty() {
            self.store.sync()?;
        }
        Ok(())
    }

    /// The replica is proven, or being synced (no longer consistent): the held extents
    /// leave the map with the next data sync, and the boot is this one again.
    pub(super) fn release_unsynced(&mut self) -> Result<()> {
        if !self.unsynced.holds() {
            return Ok(());
        }
        self.unsynced.release(Instant::now());
        let mut sb = self.store.superblock().clone();
        sb.boot_id = unsynced::boot_id();
        self.store.write_superblock(&sb)?;
        Ok(())
    }

    /// Before the first I/O: the metadata no longer says "stopped cleanly", so a crash from
    /// now on is seen as one. Peers configured since it was made get a free slot.
    pub(super) fn mark_running(&mut self, peers: &[NodeId]) -> Result<()> {
        let mut sb = self.store.superblock().clone();
        sb.flags.remove(SbFlags::CLEAN);
        sb.boot_id = unsynced::boot_id();
        // A new run of ours takes writes from no Primary yet.
        sb.writer = None;
        for &p in peers {
            if sb.slot_of_peer(p).is_none() {
                let free = self.free_slot(&sb, p)?;
                sb.peers[free] = PeerSlot::new(p);
            }
        }
        self.store.write_superblock(&sb)?;
        Ok(())
    }

    /// A bitmap slot no node holds, for node `p`.
    fn free_slot(&self, sb: &Superblock, p: NodeId) -> Result<usize> {
        (sb.peers.iter().position(|s| s.node_id.is_none())).with_context(|| {
            format!(
                "{}: no bitmap slot left for node {p} (the metadata has {}, all taken); `tandem create-md --force` remakes it for the configured nodes (the replica is then resynced in full; set `max-peers` on the volume to keep spare slots for nodes added later)",
                self.store.target().describe(),
                sb.peers.len()
            )
        })
    }

    /// Whether node `p` has a bitmap slot here or can get one (`add_peer` would not fail
    /// for want of a slot).
    pub(super) fn has_room_for(&self, p: NodeId) -> bool {
        let sb = self.store.superblock();
        sb.slot_of_peer(p).is_some() || sb.peers.iter().any(|s| s.node_id.is_none())
    }

    /// Node `p` was added to the running resource (`tandem adjust`): its bitmap slot (a
    /// free one, or the one it had if it was configured before) holds `words` on disk
    /// before the node is a peer, with no bitmap id, so a crash of ours keeps what the
    /// engine lists it (everything).
    pub(super) fn add_peer(&mut self, p: NodeId, words: &[u64]) -> Result<()> {
        let mut sb = self.store.superblock().clone();
        let slot = match sb.slot_of_peer(p) {
            Some(slot) => slot,
            None => self.free_slot(&sb, p)?,
        };
        let pages = self.store.layout().bitmap_pages();
        self.zero_on_disk[slot].fill(false);
        self.store.write_bitmap_pages(slot, words, 0, pages)?;
        self.store.sync()?;
        sb.peers[slot] = PeerSlot::new(p);
        self.store.write_superblock(&sb)?;
        Ok(())
    }

    /// The flags a crash is judged by, written (and synced) when they change: whether the
    /// replica is consistent (a crash then starts it `Crashed`, trusting its activity log,
    /// else `Existing`) and whether this node is Primary. Called before any write that
    /// could make the replica otherwise lands.
    pub(super) fn set_state(
        &mut self,
        consistent: bool,
        primary: bool,
        ids: Option<IdsAtCrash>,
        writer: Option<PrimaryRun>,
        bitmap_gi: impl Fn(NodeId) -> Option<u64>,
    ) -> Result<()> {
        let mut sb = self.store.superblock().clone();
        for slot in &mut sb.peers {
            let Some(node) = slot.node_id else { continue };
            let gi = bitmap_gi(node);
            slot.bitmap_gi = gi.unwrap_or(0);
            slot.flags.set(PeerFlags::BITMAP_GI, gi.is_some());
        }
        // A version-1 superblock keeps none: a crash then pulls the whole log, as before.
        if sb.layout.geometry().unsynced_map {
            sb.writer = writer.map(|r| (r.node, r.incarnation));
        }
        sb.flags.set(SbFlags::CONSISTENT, consistent);
        sb.flags.set(SbFlags::PRIMARY, primary);
        if primary {
            sb.flags.insert(SbFlags::WAS_UP_TO_DATE);
        }
        if let Some(ids) = ids {
            sb.current_gi = ids.gen.current;
            sb.history = ids.gen.history;
            sb.abandoned_gi = ids.abandoned.map_or(0, |a| a.gi);
            let without_quorum = ids.abandoned.is_some_and(|a| a.without_quorum);
            sb.flags
                .set(SbFlags::ABANDONED_WITHOUT_QUORUM, without_quorum);
        }
        let old = self.store.superblock();
        if sb.flags != old.flags
            || sb.current_gi != old.current_gi
            || sb.history != old.history
            || sb.abandoned_gi != old.abandoned_gi
            || sb.writer != old.writer
            || sb.peers != old.peers
        {
            self.store.write_superblock(&sb)?;
        }
        Ok(())
    }

    /// The generation ids the metadata kept, and the id they were set back from as
    /// Primary, if any (at a crash, or without quorum).
    pub(super) fn kept_ids(&self) -> IdsAtCrash {
        let sb = self.store.superblock();
        IdsAtCrash {
            gen: GenIds {
                current: sb.current_gi,
                history: sb.history,
            },
            abandoned: Some(sb.abandoned_gi)
                .filter(|&gi| gi != 0)
                .map(|gi| AbandonedId {
                    gi,
                    without_quorum: sb.flags.contains(SbFlags::ABANDONED_WITHOUT_QUORUM),
                }),
        }
    }

    /// The node was Primary when the metadata was last written (it crashed as Primary:
    /// a clean stop clears the flag).
    pub(super) fn was_primary(&self) -> bool {
        self.store.superblock().flags.contains(SbFlags::PRIMARY)
    }

    /// Writes the next activity-log transaction, if one can serve the waiting writes: an
    /// evicted extent with writes not yet durable recorded in the unsynced map (or, without
    /// one, the data synced first), the evicted
    /// extents' bitmap pages (from `oos`, per peer node) before the block. Returns the
    /// writes it released, `None` if none could be served now (every victim in use).
    pub(super) fn write_transaction<'a>(
        &mut self,
        data: &Backing,
        oos: impl Fn(NodeId) -> Option<&'a [u64]>,
    ) -> Result<Option<Vec<WaitId>>> {
        let Some(tx) = self.al.next_transaction() else {
            return Ok(None);
        };
        let mut wrote = false;
        if tx.evicts_dirty() {
            if self.records_unsynced() {
                let pages = self.unsynced.record(&tx.evicted_dirty, Instant::now());
                self.write_unsynced(&pages)?;
                wrote = !pages.is_empty();
            } else {
                let mark = self.sync_started();
                data.sync_data()
                    .context("fdatasync of the data before an activity-log transaction")?;
                self.sync_done(mark)?;
            }
        }
        if !tx.evicted.is_empty() {
            let layout = *self.store.layout();
            let extent_blocks = AL_EXTENT / tandem_meta::BITMAP_BLOCK;
            let page_blocks = tandem_meta::MD_BLOCK * 8;
            let mut pages: Vec<u64> = tx
                .evicted
                .iter()
                .map(|&e| u64::from(e) * extent_blocks / page_blocks)
                .filter(|&p| p < layout.bitmap_pages())
                .collect();
            pages.sort_unstable();
            pages.dedup();
            let sb = self.store.superblock();
            let page_words = (tandem_meta::MD_BLOCK / 8) as usize;
            for (slot, ps) in sb.peers.iter().enumerate() {
                let Some(w) = ps.node_id.and_then(&oos) else {
                    continue;
                };
                // The engine's bitmap is the slot's size (both `ceil(blocks / 64)` words):
                // written from where it is, no copy.
                for &p in &pages {
                    let start = (p as usize * page_words).min(w.len());
                    let zero = w[start..(start + page_words).min(w.len())]
                        .iter()
                        .all(|&x| x == 0);
                    let known = &mut self.zero_on_disk[slot][p as usize];
                    if zero && *known {
                        continue;
                    }
                    // Unknown until written: a failed write leaves it unknown.
                    *known = false;
                    self.store.write_bitmap_pages(slot, w, p, 1)?;
                    self.zero_on_disk[slot][p as usize] = zero;
                    wrote = true;
                }
            }
        }
        if wrote {
            self.store.sync()?;
        }
        self.store.write_al(&tx)?;
        Ok(Some(self.al.committed(tx.seq)))
    }

    /// At a clean stop (data already flushed): the engine's knowledge written back, then
    /// the superblock saying so.
    pub(super) fn stop_cleanly(&mut self, kept: &Persisted<'_>) -> Result<()> {
        let mut sb = self.store.superblock().clone();
        let layout = *self.store.layout();
        for p in &kept.peers {
            let Some(slot) = sb.slot_of_peer(p.node) else {
                continue;
            };
            self.zero_on_disk[slot].fill(false);
            self.store
                .write_bitmap_pages(slot, p.out_of_sync.words(), 0, layout.bitmap_pages())?;
            sb.peers[slot]
                .flags
                .set(PeerFlags::WROTE_APART, p.wrote_apart);
            sb.peers[slot].bitmap_gi = p.bitmap_gi.unwrap_or(0);
            sb.peers[slot]
                .flags
                .set(PeerFlags::BITMAP_GI, p.bitmap_gi.is_some());
        }
        // The data is durable: the unsynced map empties too.
        let pages = self.unsynced.clear();
        self.write_unsynced(&pages)?;
        self.store.sync()?;
        // The whole bitmap is on disk: an empty log (a clean start trusts no log anyway).
        if let Ok(tx) = self.al.clean() {
            self.store.write_al(&tx)?;
            self.al.committed(tx.seq);
        }
        sb.flags.set(SbFlags::CONSISTENT, kept.consistent);
        sb.flags.set(SbFlags::WAS_UP_TO_DATE, kept.up_to_date);
        sb.flags
            .set(SbFlags::FULL_SYNC, kept.created && !kept.consistent);
        sb.flags.remove(SbFlags::PRIMARY);
        sb.flags.insert(SbFlags::CLEAN);
        self.store.write_superblock(&sb)?;
        Ok(())
    }

    pub(super) fn describe(&self) -> String {
        self.store.target().describe()
    }
}

/// One node's replica of one volume, from its resource file: `(config, volume index, node id,
/// disk, meta-disk, al-extents)`.
fn replica_of(
    config_dir: &Path,
    resource: &str,
    node: &str,
    volume: u16,
) -> Result<(ResourceConfig, usize, NodeId, PathBuf, MetaDisk, u32)> {
    let cfg = tandem_config::load_dir(config_dir)?
        .into_iter()
        .find(|c| c.name == resource)
        .with_context(|| format!("no resource {resource:?} in {}", config_dir.display()))?;
    let me = cfg
        .node(node)
        .with_context(|| format!("resource {resource} has no node {node:?}"))?;
    let v = cfg
        .volumes
        .iter()
        .position(|vc| vc.number == volume)
        .with_context(|| format!("resource {resource} has no volume {volume}"))?;
    let nv = &me.volumes[v];
    let Some(disk) = nv.disk.clone() else {
        bail!("node {node} keeps no replica of {resource} volume {volume} (disk = \"none\"): no metadata");
    };
    Ok((
        cfg.clone(),
        v,
        me.node_id,
        disk,
        nv.meta.clone(),
        nv.al_extents,
    ))
}

/// `tandem dump-md`: everything a replica's metadata holds (read only; works while the node
/// runs, showing what was last written).
pub fn dump_md(
    config_dir: &Path,
    resource: &str,
    node: &str,
    volume: u16,
) -> Result<tandem_meta::MetaDump> {
    let (cfg, v, _, disk, meta, _) = replica_of(config_dir, resource, node, volume)?;
    let (_, locate) = placement_of(&meta, cfg.volumes[v].size);
    let path = match &meta {
        MetaDisk::Internal => &disk,
        MetaDisk::External(p) | MetaDisk::Pmem(p) => p,
    };
    let target = FileTarget::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (store, loaded) = MetaStore::open(target, locate)?;
    Ok(store.dump(&loaded)?)
}

/// `tandem invalidate`: throws away a replica whose node is not running. Its metadata is
/// kept but no longer vouches for the data (not consistent, never up to date, stopped
/// cleanly): at the next start the replica proves nothing and is resynced in full from an
/// up-to-date peer; it serves nothing before. Returns where the metadata is.
pub fn invalidate(config_dir: &Path, resource: &str, node: &str, volume: u16) -> Result<String> {
    let (cfg, v, _, disk, meta, _) = replica_of(config_dir, resource, node, volume)?;
    // The lock a running node holds on its backing store: never under a running node.
    let backing = open_stopped(
        &disk,
        "stop it first: a running replica is not thrown away under it",
    )?;
    let (_, locate) = placement_of(&meta, cfg.volumes[v].size);
    let target = match &meta {
        MetaDisk::Internal => Target::Internal(BackingTarget::new(Arc::new(backing))),
        MetaDisk::External(p) | MetaDisk::Pmem(p) => {
            Target::File(FileTarget::open(p).with_context(|| format!("opening {}", p.display()))?)
        }
    };
    let name = target.describe();
    let (mut store, _) = MetaStore::open(target, locate).with_context(|| {
        format!("{name}: no usable metadata to invalidate (`tandem create-md --force` writes new metadata, which also resyncs the replica in full)")
    })?;
    let mut sb = store.superblock().clone();
    for f in [
        SbFlags::CONSISTENT,
        SbFlags::WAS_UP_TO_DATE,
        SbFlags::PRIMARY,
        SbFlags::FULL_SYNC,
    ] {
        sb.flags.remove(f);
    }
    // A thrown-away replica claims nothing of its peers either: its metadata's bitmaps
    // are restored at a start that is not consistent (`ReplicaAtStart::Inconsistent`).
    let pages = store.layout().bitmap_pages();
    for (i, slot) in sb.peers.iter_mut().enumerate() {
        slot.bitmap_gi = 0;
        slot.flags.remove(PeerFlags::BITMAP_GI);
        slot.flags.remove(PeerFlags::WROTE_APART);
        if slot.node_id.is_some() {
            let zero = vec![0u64; store.layout().bitmap_words()];
            store.write_bitmap_pages(i, &zero, 0, pages)?;
        }
    }
    store.sync()?;
    sb.flags.insert(SbFlags::CLEAN);
    store.write_superblock(&sb)?;
    store.sync()?;
    Ok(name)
}

/// `tandem create-md`: writes new metadata for a replica whose node is not running. Over
/// metadata that is there (valid or not) only with `force`; the replica's data is then of
/// unknown currency and is resynced in full from an up-to-date peer when the node starts.
pub fn create_md(
    config_dir: &Path,
    resource: &str,
    node: &str,
    volume: u16,
    force: bool,
) -> Result<String> {
    let (cfg, v, me, disk, meta, al) = replica_of(config_dir, resource, node, volume)?;
    let vc = &cfg.volumes[v];
    let g = geometry(&cfg, v, me, al);
    // The lock a running node holds on its backing store: never under a running node.
    let backing = open_stopped(&disk, "stop it first")?;
    let (placement, locate) = placement_of(&meta, vc.size);
    let target = match &meta {
        MetaDisk::Internal => {
            let layout = Layout::new(Placement::Internal, g, vc.size)?;
            if backing.size() < layout.md_end() {
                bail!(
                    "{} is {} bytes; the volume and its internal metadata need {}",
                    disk.display(),
                    backing.size(),
                    layout.md_end()
                );
            }
            Target::Internal(BackingTarget::new(Arc::new(backing)))
        }
        MetaDisk::External(p) | MetaDisk::Pmem(p) => {
            drop(backing);
            if !p.exists() {
                FileTarget::create(p, Layout::required_external_size(vc.size, g)?)?;
            }
            Target::File(FileTarget::open(p)?)
        }
    };
    let mut buf = vec![0u8; 2 * tandem_meta::MD_BLOCK as usize];
    let blank = target.read_at(&mut buf, locate.md_offset()).is_ok() && buf.iter().all(|&b| b == 0);
    if !blank && !force {
        bail!(
            "{} already holds metadata (or something else) where the superblock goes; `--force` overwrites it, and the replica is then resynced in full",
            target.describe()
        );
    }
    let name = target.describe();
    let layout = Layout::new(placement, g, vc.size)?;
    let mut init = CreateInfo::new(me, diskful_peers(&cfg, v, me), device_uuid()?);
    // Whatever the data holds, it is unproven: resynced in full from an up-to-date peer.
    init.flags = SbFlags::CLEAN;
    MetaStore::create(target, layout, init)?;
    Ok(name)
}
