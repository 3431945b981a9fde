//! Crash at every step: a target in memory fails every operation from the Nth on (the
//! crash), and the image it leaves (the failing write lost, landed whole, or torn after
//! its first sector, its first half, or all but its first sector) must open, with the previous or the new
//! superblock and an activity log that still names every extent a write was using.

use std::cell::{Cell, RefCell};
use std::io;

use tandem_meta::al::ActivityLog;
use tandem_meta::{
    CreateInfo, Geometry, Layout, Locate, MetaError, MetaStore, MetaTarget, SbFlags,
};

struct Mem {
    data: RefCell<Vec<u8>>,
    ops: Cell<u32>,
    fail_at: u32,
    /// The write that failed: where, and its bytes.
    lost: RefCell<Option<(u64, Vec<u8>)>>,
    /// Every operation, for the ordering test.
    trace: RefCell<Vec<String>>,
}

impl Mem {
    fn new(data: Vec<u8>, fail_at: u32) -> Mem {
        Mem {
            data: RefCell::new(data),
            ops: Cell::new(0),
            fail_at,
            lost: RefCell::new(None),
            trace: RefCell::new(Vec::new()),
        }
    }

    fn tick(&self) -> io::Result<()> {
        let n = self.ops.get();
        self.ops.set(n + 1);
        if n >= self.fail_at {
            return Err(io::Error::other("crash"));
        }
        Ok(())
    }
}

impl MetaTarget for Mem {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let d = self.data.borrow();
        buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if let Err(e) = self.tick() {
            self.lost.borrow_mut().get_or_insert((off, buf.to_vec()));
            return Err(e);
        }
        self.trace.borrow_mut().push(format!("write {off}"));
        self.data.borrow_mut()[off as usize..off as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.tick()?;
        self.trace.borrow_mut().push("sync".into());
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.data.borrow().len() as u64)
    }

    fn describe(&self) -> String {
        "mem".into()
    }
}

/// 31 slots, so that a superblock spans three sectors and a tear after the first one
/// shows (the updates below change slot 19, in the second sector).
fn layout() -> Layout {
    Layout::external(256 << 20, Geometry::new(31)).unwrap()
}

fn created() -> Vec<u8> {
    let l = layout();
    let mem = Mem::new(vec![0; l.md_end() as usize], u32::MAX);
    let store = MetaStore::create(mem, l, CreateInfo::new(0, (1..=20).collect(), 5)).unwrap();
    store.into_target().data.into_inner()
}

/// What a run promised before the crash.
#[derive(Default, Debug)]
struct Promised {
    /// The seq of the last superblock write that returned.
    seq: u64,
    /// Extents some released write was still using.
    in_use: Vec<u32>,
}

/// Start-up, AL traffic, a generation change, a clean shutdown. Stops at the first error.
fn run(store: &mut MetaStore<Mem>, p: &mut Promised) -> Result<(), MetaError> {
    p.seq = store.superblock().seq;
    let mut al = ActivityLog::from_replay(&store.read_al()?).unwrap();

    let mut sb = store.superblock().clone();
    sb.flags.remove(SbFlags::CLEAN);
    sb.peers[19].bitmap_gi += 1;
    p.seq = store.write_superblock(&sb)?;

    let mut previous: Option<(u32, u32)> = None;
    for k in 0..6u32 {
        let range = (k * 10, k * 10 + 1);
        al.begin(range.0, range.1);
        let tx = al.next_transaction().expect("cold extents");
        store.write_al(&tx)?;
        al.committed(tx.seq);
        p.in_use.extend(range.0..=range.1);
        if let Some((f, l)) = previous.take() {
            al.end(f, l);
            p.in_use.retain(|e| !(f..=l).contains(e));
        }
        previous = Some(range);
        if k == 3 {
            sb.push_history(sb.current_gi);
            sb.current_gi = 0x77;
            sb.peers[19].bitmap_gi += 1;
            p.seq = store.write_superblock(&sb)?;
        }
    }
    let (f, l) = previous.expect("six rounds");
    al.end(f, l);
    p.in_use.clear();
    let tx = al.clean().unwrap();
    store.write_al(&tx)?;
    al.committed(tx.seq);
    sb.flags.insert(SbFlags::CLEAN);
    sb.peers[19].bitmap_gi += 1;
    p.seq = store.write_superblock(&sb)?;
    Ok(())
}

#[test]
fn every_crash_point_opens() {
    let base = created();
    // How many operations a full run takes.
    let total = {
        let (mut store, _) =
            MetaStore::open(Mem::new(base.clone(), u32::MAX), Locate::External).unwrap();
        run(&mut store, &mut Promised::default()).unwrap();
        store.target().ops.get()
    };
    assert!(total > 20, "{total} operations");
    for crash in 0..=total {
        let (mut store, _) =
            MetaStore::open(Mem::new(base.clone(), crash), Locate::External).unwrap();
        let mut p = Promised::default();
        let finished = run(&mut store, &mut p).is_ok();
        assert_eq!(finished, crash == total, "crash at {crash}");
        let mem = store.into_target();
        let image = mem.data.into_inner();
        let mut images = vec![("lost", image.clone())];
        if let Some((off, bytes)) = mem.lost.into_inner() {
            for (what, n) in [
                ("whole", bytes.len()),
                ("first sector", 512),
                ("half", 2048),
            ] {
                let mut im = image.clone();
                let n = n.min(bytes.len());
                im[off as usize..off as usize + n].copy_from_slice(&bytes[..n]);
                images.push((what, im));
            }
            if bytes.len() > 512 {
                let mut im = image.clone();
                im[off as usize + 512..off as usize + bytes.len()].copy_from_slice(&bytes[512..]);
                images.push(("all but the first sector", im));
            }
        }
        for (what, im) in images {
            let (_, loaded) = MetaStore::open(Mem::new(im, u32::MAX), Locate::External)
                .unwrap_or_else(|e| panic!("crash at {crash}, write {what}: {e}"));
            let seq = loaded.superblock.seq;
            assert!(
                seq == p.seq || seq == p.seq + 1,
                "crash at {crash}, write {what}: seq {seq}, promised {}",
                p.seq
            );
            for e in &p.in_use {
                assert!(
                    loaded.al.hot.contains(e),
                    "crash at {crash}, write {what}: extent {e} in use but not in the log {:?}",
                    loaded.al.hot
                );
            }
        }
    }
}

/// The two-slot rule as operations: the slot not holding the newest copy first, each
/// write followed by its sync.
#[test]
fn superblock_writes_are_ordered() {
    let l = layout();
    let (mut store, _) = MetaStore::open(Mem::new(created(), u32::MAX), Locate::External).unwrap();
    let sb = store.superblock().clone();
    store.write_superblock(&sb).unwrap();
    let trace = store.target().trace.borrow().clone();
    let s0 = format!("write {}", l.superblock_offset(0));
    let s1 = format!("write {}", l.superblock_offset(1));
    assert_eq!(
        trace,
        vec![s0.clone(), "sync".into(), s1.clone(), "sync".into()]
    );

    // Slot 0 holds an older copy: it is written first.
    let mut image = store.into_target().data.into_inner();
    let mut old = sb.clone();
    old.seq = 1;
    image[..4096].copy_from_slice(&old.encode().unwrap()[..]);
    let (mut store, loaded) =
        MetaStore::open(Mem::new(image.clone(), u32::MAX), Locate::External).unwrap();
    assert_eq!(loaded.repaired_slot.unwrap().slot, 0);
    store.write_superblock(&sb).unwrap();
    assert_eq!(store.target().trace.borrow()[0], s0);

    // Slot 1 holds it: slot 1 first.
    image.copy_within(4096..8192, 0);
    image[4096..8192].copy_from_slice(&old.encode().unwrap()[..]);
    let (mut store, loaded) = MetaStore::open(Mem::new(image, u32::MAX), Locate::External).unwrap();
    assert_eq!(loaded.repaired_slot.unwrap().slot, 1);
    store.write_superblock(&sb).unwrap();
    assert_eq!(store.target().trace.borrow()[0], s1);
    assert_eq!(store.target().trace.borrow()[2], s0);
}

/// An IO error names the target, the operation and the offset.
#[test]
fn io_errors_say_where() {
    let (mut store, _) = MetaStore::open(Mem::new(created(), 0), Locate::External).unwrap();
    let sb = store.superblock().clone();
    let err = store.write_superblock(&sb).unwrap_err().to_string();
    assert_eq!(
        err,
        "mem: superblock write of 4096 bytes at offset 0 failed: crash"
    );
}
