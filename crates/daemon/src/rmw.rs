//! Byte-granular requests, from clients that did not agree to block sizes (the spec's
//! default minimum block size is 1; `TransmissionParams::block_sizes`). Pure logic: the
//! drivers (`serve_core`, `node/clients.rs`) carry it out.
//!
//! The engines and stores work in blocks of the export's minimum block size, the *grain*:
//! the replicated engine tracks fresh data in 512-byte sectors, and O_DIRECT needs the
//! device's logical block. A request not aligned to it is served in aligned parts, a
//! [`Job`]: a read reads the blocks it touches and answers the bytes asked for; a write or a
//! zeroing reads the blocks its edges cut, merges, and writes whole blocks
//! (read-modify-write). A trim only trims the whole blocks it covers (it is advisory), and a
//! cache hint covers the blocks it touches. Aligned requests never become jobs.
//!
//! A read-modify-write writes back bytes it did not change, as they were when it read them.
//! So no other write may change them in between, and it must not read them before an
//! earlier write of them has landed: either would lose that write's bytes, although the two
//! requests share no byte. The [`Gate`] orders writes by the blocks they touch: a
//! read-modify-write waits for every earlier write it overlaps, and every later write that
//! overlaps it waits for it, in arrival order. Writes that are not read-modify-writes do not
//! wait for one another (NBD orders nothing between requests in flight together; the
//! replicated engine orders overlapping writes itself). Reads are not gated: a
//! read-modify-write rewrites the bytes it did not change with the values they have, since
//! nothing else changes them meanwhile, so a read finds every write completed before it
//! arrived whatever it overlaps, and a write still in flight may or may not be seen.

use slab::Slab;
use tandem_engine::{Io, IoError};
use tandem_frontend::nbd::{Command, Request};

/// Whether `req` needs nothing of this module: offset and length are multiples of `grain`
/// (a power of two). Always so for clients that agreed to block sizes.
pub(crate) fn is_aligned(req: &Request, grain: u32) -> bool {
    (req.offset | u64::from(req.len)) & (u64::from(grain) - 1) == 0
}

/// What becomes of a request that is not aligned.
#[derive(Debug)]
pub(crate) enum Unaligned {
    /// The engine takes this aligned request instead (a cache hint's covering blocks).
    Engine(Io),
    /// The whole blocks a trim covers: a write for the [`Gate`].
    Gated(Io),
    /// A trim that covers no whole block: nothing to do, answered at once.
    Nothing,
    /// Answered with this error (a fast zeroing: the edges would be written, not fast).
    Fail(IoError),
    Job(Job),
}

/// How an unaligned request is served. `payload` is a write's data; `max` the largest
/// read or write the engine is handed (the export's maximum payload, a multiple of
/// `grain`).
pub(crate) fn unaligned(req: &Request, payload: &[u8], grain: u32, max: u32) -> Unaligned {
    let g = u64::from(grain);
    let (offset, len) = (req.offset, req.len);
    let end = offset + u64::from(len);
    let (start, stop) = (offset / g * g, end.next_multiple_of(g));
    match req.command {
        Command::Read => Unaligned::Job(Job::new(req, JobKind::Read, grain, max)),
        Command::Write { fua } => {
            debug_assert_eq!(payload.len(), len as usize);
            let mut job = Job::new(req, JobKind::Write { fua }, grain, max);
            let at = (offset - start) as usize;
            job.buf = vec![0; (stop - start) as usize];
            job.buf[at..at + payload.len()].copy_from_slice(payload);
            Unaligned::Job(job)
        }
        Command::WriteZeroes { fast: true, .. } => Unaligned::Fail(IoError::NotFast),
        Command::WriteZeroes { fua, no_hole, .. } => Unaligned::Job(Job::new(
            req,
            JobKind::Zero {
                fua,
                may_punch: !no_hole,
            },
            grain,
            max,
        )),
        Command::Trim { fua } => {
            let (first, last) = (offset.next_multiple_of(g), end / g * g);
            if first >= last {
                return Unaligned::Nothing;
            }
            Unaligned::Gated(Io::Trim {
                offset: first,
                len: (last - first) as u32,
                fua,
            })
        }
        Command::Cache => {
            // A hint: the blocks it touches, as many as a request can name.
            let most = u64::from(u32::MAX) / g * g;
            Unaligned::Engine(Io::Cache {
                offset: start,
                len: (stop - start).min(most) as u32,
            })
        }
        Command::Flush | Command::Disconnect | Command::BlockStatus { .. } => {
            unreachable!("{req:?} is aligned or not the engine's")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobKind {
    Read,
    Write { fua: bool },
    Zero { fua: bool, may_punch: bool },
}

/// One unaligned read, write or zeroing served in aligned parts: reads first (the blocks a
/// read touches, or a write's cut edge blocks), then, for a write, the writes; the request
/// is answered once every part ended, with the first error any part met.
#[derive(Debug)]
pub(crate) struct Job {
    /// The client's bytes.
    offset: u64,
    len: u32,
    /// The blocks they touch: `start..stop`.
    start: u64,
    stop: u64,
    grain: u32,
    max: u32,
    kind: JobKind,
    /// A read's answer (`len` bytes); a write's blocks `start..stop`, its payload in place
    /// and the edges filled in as they are read; unused for a zeroing.
    buf: Vec<u8>,
    /// A zeroing's edge blocks (offset, bytes), the client's bytes zeroed as they are read.
    edges: Vec<(u64, Vec<u8>)>,
    /// Parts issued and not ended.
    pending: usize,
    error: Option<IoError>,
}

/// An aligned write of a job, with its bytes (none for a zeroing's middle).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WritePart {
    pub(crate) io: Io,
    pub(crate) data: Option<Vec<u8>>,
}

impl Job {
    fn new(req: &Request, kind: JobKind, grain: u32, max: u32) -> Job {
        let g = u64::from(grain);
        let end = req.offset + u64::from(req.len);
        Job {
            offset: req.offset,
            len: req.len,
            start: req.offset / g * g,
            stop: end.next_multiple_of(g),
            grain,
            max,
            kind,
            buf: if kind == JobKind::Read {
                vec![0; req.len as usize]
            } else {
                Vec::new()
            },
            edges: Vec::new(),
            pending: 0,
            error: None,
        }
    }

    /// Whether it changes data, so it must pass the [`Gate`] before its first read.
    pub(crate) fn writes_data(&self) -> bool {
        self.kind != JobKind::Read
    }

    /// The blocks it touches, `start..stop`: what the [`Gate`] holds for it.
    pub(crate) fn blocks(&self) -> (u64, u64) {
        (self.start, self.stop)
    }

    /// The aligned reads to issue first; each is answered with [`Job::read_done`]. A read
    /// job reads every block it touches (in pieces of at most `max`), a write only the
    /// blocks its edges cut.
    pub(crate) fn reads(&mut self) -> Vec<Io> {
        let g = u64::from(self.grain);
        let reads: Vec<Io> = if self.kind == JobKind::Read {
            pieces(self.start, self.stop, self.max)
                .map(|(offset, len)| Io::Read { offset, len })
                .collect()
        } else {
            let end = self.offset + u64::from(self.len);
            let mut blocks = Vec::with_capacity(2);
            if !self.offset.is_multiple_of(g) {
                blocks.push(self.start);
            }
            if !end.is_multiple_of(g) && blocks.last() != Some(&(self.stop - g)) {
                blocks.push(self.stop - g);
            }
            blocks
                .into_iter()
                .map(|offset| Io::Read {
                    offset,
                    len: self.grain,
                })
                .collect()
        };
        self.pending = reads.len();
        reads
    }

    /// A read of [`Job::reads`] ended, with the bytes read (at least its length) if it
    /// succeeded. True once every read ended.
    pub(crate) fn read_done(&mut self, io: Io, result: Result<&[u8], IoError>) -> bool {
        let Io::Read { offset, len } = io else {
            unreachable!("not a read of this job: {io:?}")
        };
        self.pending -= 1;
        let bytes = match result {
            Ok(b) => &b[..len as usize],
            Err(e) => {
                self.error.get_or_insert(e);
                return self.pending == 0;
            }
        };
        let (first, end) = (self.offset, self.offset + u64::from(self.len));
        match self.kind {
            JobKind::Read => {
                // The part of the client's bytes this piece holds.
                let (from, to) = (first.max(offset), end.min(offset + u64::from(len)));
                if from < to {
                    let src = &bytes[(from - offset) as usize..(to - offset) as usize];
                    let at = (from - first) as usize;
                    self.buf[at..at + src.len()].copy_from_slice(src);
                }
            }
            JobKind::Write { .. } => {
                // The block's bytes around the payload, which stays where it is.
                let base = (offset - self.start) as usize;
                let keep_to = first.clamp(offset, offset + u64::from(len));
                let keep_from = end.clamp(offset, offset + u64::from(len));
                let head = (keep_to - offset) as usize;
                let tail = (keep_from - offset) as usize;
                self.buf[base..base + head].copy_from_slice(&bytes[..head]);
                self.buf[base + tail..base + len as usize].copy_from_slice(&bytes[tail..]);
            }
            JobKind::Zero { .. } => {
                let mut block = bytes.to_vec();
                let from = first.clamp(offset, offset + u64::from(len)) - offset;
                let to = end.clamp(offset, offset + u64::from(len)) - offset;
                block[from as usize..to as usize].fill(0);
                self.edges.push((offset, block));
            }
        }
        self.pending == 0
    }

    /// Once every read ended without error: the aligned writes to issue (none for a read
    /// job), each answered with [`Job::write_done`]. A write job writes every block it
    /// touches (in pieces of at most `max`); a zeroing writes its edge blocks and zeroes
    /// the whole blocks between them. Each carries the request's FUA.
    pub(crate) fn writes(&mut self) -> Vec<WritePart> {
        debug_assert!(self.pending == 0 && self.error.is_none());
        let parts: Vec<WritePart> = match self.kind {
            JobKind::Read => Vec::new(),
            JobKind::Write { fua } => {
                let mut buf = std::mem::take(&mut self.buf);
                let mut parts = Vec::new();
                for (offset, len) in pieces(self.start, self.stop, self.max).rev() {
                    let data = buf.split_off((offset - self.start) as usize);
                    parts.push(WritePart {
                        io: Io::Write { offset, len, fua },
                        data: Some(data),
                    });
                }
                parts.reverse();
                parts
            }
            JobKind::Zero { fua, may_punch } => {
                let g = u64::from(self.grain);
                let mut edges = std::mem::take(&mut self.edges);
                edges.sort_by_key(|&(offset, _)| offset);
                let first = self.offset.next_multiple_of(g);
                let last = (self.offset + u64::from(self.len)) / g * g;
                let mut parts: Vec<WritePart> = edges
                    .into_iter()
                    .map(|(offset, block)| WritePart {
                        io: Io::Write {
                            offset,
                            len: self.grain,
                            fua,
                        },
                        data: Some(block),
                    })
                    .collect();
                if first < last {
                    parts.push(WritePart {
                        io: Io::Zero {
                            offset: first,
                            len: (last - first) as u32,
                            fua,
                            may_punch,
                            fast: false,
                        },
                        data: None,
                    });
                }
                parts
            }
        };
        self.pending = parts.len();
        parts
    }

    /// A write of [`Job::writes`] ended. True once every write ended.
    pub(crate) fn write_done(&mut self, result: Result<(), IoError>) -> bool {
        self.pending -= 1;
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        self.pending == 0
    }

    /// Whether a part failed: the request fails with that error (a write job whose read
    /// failed writes nothing).
    pub(crate) fn error(&self) -> Option<IoError> {
        self.error
    }

    /// A read job's answer, once every read ended without error.
    pub(crate) fn answer(&self) -> &[u8] {
        debug_assert!(self.kind == JobKind::Read && self.pending == 0);
        &self.buf
    }
}

/// `start..stop` in consecutive pieces of at most `max` bytes.
fn pieces(start: u64, stop: u64, max: u32) -> impl DoubleEndedIterator<Item = (u64, u32)> {
    let max = u64::from(max);
    (0..(stop - start).div_ceil(max)).map(move |i| {
        let offset = start + i * max;
        (offset, (stop - offset).min(max) as u32)
    })
}

/// A write's place in the [`Gate`], from [`Gate::enter`] until [`Gate::leave`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ticket(usize);

#[derive(Debug)]
struct Entry {
    /// Arrival order.
    seq: u64,
    start: u64,
    stop: u64,
    rmw: bool,
}

/// Orders the writes of one volume around read-modify-writes (see the module's text).
/// Every write enters it when it arrives and leaves when it completes; a write that may not
/// go yet waits until a [`Gate::leave`] releases it.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    entries: Slab<Entry>,
    next_seq: u64,
    /// The read-modify-writes among them: the only ones a plain write may wait for.
    rmws: Vec<usize>,
    /// Those waiting, in arrival order.
    waiting: Vec<usize>,
}

impl Gate {
    /// A write of the blocks `start..stop` arrives (`rmw`: a read-modify-write's). True in
    /// the answer: it may go now; else it waits to be released.
    pub(crate) fn enter(&mut self, start: u64, stop: u64, rmw: bool) -> (Ticket, bool) {
        debug_assert!(start < stop);
        let seq = self.next_seq;
        self.next_seq += 1;
        let key = self.entries.insert(Entry {
            seq,
            start,
            stop,
            rmw,
        });
        if rmw {
            self.rmws.push(key);
        }
        // The common case, a plain write with no read-modify-write about, costs no search.
        let go = (!rmw && self.rmws.is_empty()) || self.may_go(key);
        if !go {
            self.waiting.push(key);
        }
        (Ticket(key), go)
    }

    /// A write that went completed (or failed). The writes this lets go are appended to
    /// `released`, in arrival order.
    pub(crate) fn leave(&mut self, t: Ticket, released: &mut Vec<Ticket>) {
        let e = self.entries.remove(t.0);
        debug_assert!(!self.waiting.contains(&t.0), "a waiting write left");
        if e.rmw {
            self.rmws.retain(|&k| k != t.0);
        }
        if self.waiting.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let key = self.waiting[i];
            if self.may_go(key) {
                self.waiting.remove(i);
                released.push(Ticket(key));
            } else {
                i += 1;
            }
        }
    }

    /// Writes in the gate (going or waiting).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// No earlier write overlaps it where one of the two is a read-modify-write.
    fn may_go(&self, key: usize) -> bool {
        let e = &self.entries[key];
        let conflicts = |f: &Entry| f.seq < e.seq && f.start < e.stop && e.start < f.stop;
        if e.rmw {
            !self.entries.iter().any(|(_, f)| conflicts(f))
        } else {
            !self.rmws.iter().any(|&k| conflicts(&self.entries[k]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(offset: u64, len: u32, command: Command) -> Request {
        Request {
            cookie: 1,
            offset,
            len,
            command,
        }
    }

    const W: Command = Command::Write { fua: false };

    #[test]
    fn alignment_is_that_of_offset_and_length() {
        assert!(is_aligned(&req(4096, 512, W), 512));
        assert!(is_aligned(&req(0, 0, Command::Flush), 4096));
        assert!(!is_aligned(&req(1, 512, W), 512));
        assert!(!is_aligned(&req(512, 511, W), 512));
        assert!(is_aligned(&req(3, 5, W), 1));
    }

    /// Carries out a job on `disk` at once, part by part, as a driver would.
    fn run(job: &mut Job, disk: &mut [u8]) {
        let reads = job.reads();
        let n = reads.len();
        for (i, io) in reads.into_iter().enumerate() {
            let Io::Read { offset, len } = io else {
                unreachable!()
            };
            let bytes = disk[offset as usize..offset as usize + len as usize].to_vec();
            assert_eq!(job.read_done(io, Ok(&bytes)), i + 1 == n);
        }
        let writes = job.writes();
        let n = writes.len();
        for (i, p) in writes.into_iter().enumerate() {
            match (p.io, p.data) {
                (Io::Write { offset, len, .. }, Some(d)) => {
                    assert_eq!(d.len(), len as usize);
                    disk[offset as usize..offset as usize + d.len()].copy_from_slice(&d);
                }
                (Io::Zero { offset, len, .. }, None) => {
                    disk[offset as usize..(offset + u64::from(len)) as usize].fill(0)
                }
                other => panic!("unexpected part {other:?}"),
            }
            assert_eq!(job.write_done(Ok(())), i + 1 == n);
        }
    }

    fn job(u: Unaligned) -> Job {
        match u {
            Unaligned::Job(j) => j,
            other => panic!("not a job: {other:?}"),
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn an_unaligned_write_changes_its_bytes_only() {
        for (offset, len) in [
            (1u64, 1u32),
            (510, 3),
            (0, 1),
            (511, 1),
            (7, 1500),
            (512, 1),
        ] {
            for max in [512u32, 1024, 1 << 20] {
                let mut disk = pattern(4096);
                let payload: Vec<u8> = (0..len).map(|i| 0xa0 ^ i as u8).collect();
                let r = req(offset, len, W);
                let mut j = job(unaligned(&r, &payload, 512, max));
                assert!(j.writes_data());
                let mut want = disk.clone();
                want[offset as usize..offset as usize + len as usize].copy_from_slice(&payload);
                run(&mut j, &mut disk);
                assert_eq!(disk, want, "{offset} {len} {max}");
                assert_eq!(j.error(), None);
            }
        }
    }

    #[test]
    fn a_write_reads_only_the_blocks_its_edges_cut() {
        let reads = |offset, len| {
            let payload = vec![1; len as usize];
            let mut j = job(unaligned(&req(offset, len, W), &payload, 512, 1 << 20));
            j.reads()
        };
        let r = |offset| Io::Read { offset, len: 512 };
        assert_eq!(reads(1, 1), vec![r(0)]);
        assert_eq!(reads(510, 3), vec![r(0), r(512)]);
        assert_eq!(reads(512, 1), vec![r(512)]);
        assert_eq!(reads(511, 1), vec![r(0)]);
        assert_eq!(reads(100, 4096), vec![r(0), r(4096)]);
        assert_eq!(reads(512, 4095), vec![r(4096)]);
    }

    #[test]
    fn an_unaligned_read_answers_its_bytes() {
        let disk = pattern(8192);
        for (offset, len) in [(1u64, 1u32), (510, 3), (100, 5000), (8191, 1)] {
            for max in [512u32, 2048, 1 << 20] {
                let mut j = job(unaligned(&req(offset, len, Command::Read), &[], 512, max));
                assert!(!j.writes_data());
                let reads = j.reads();
                assert!(reads
                    .iter()
                    .all(|io| matches!(io, Io::Read { len, .. } if *len <= max)));
                for io in reads {
                    let Io::Read { offset, len } = io else {
                        unreachable!()
                    };
                    j.read_done(
                        io,
                        Ok(&disk[offset as usize..(offset + u64::from(len)) as usize]),
                    );
                }
                assert!(j.writes().is_empty());
                let want = &disk[offset as usize..offset as usize + len as usize];
                assert_eq!(j.answer(), want, "{offset} {len} {max}");
            }
        }
    }

    #[test]
    fn an_unaligned_zeroing_rewrites_its_edges_and_zeroes_the_blocks_between() {
        let zero = Command::WriteZeroes {
            fua: true,
            no_hole: false,
            fast: false,
        };
        for (offset, len) in [(1u64, 1u32), (510, 3), (100, 8000), (512, 1025), (1, 511)] {
            let mut disk = pattern(16384);
            let mut want = disk.clone();
            want[offset as usize..offset as usize + len as usize].fill(0);
            let mut j = job(unaligned(&req(offset, len, zero), &[], 512, 1 << 20));
            run(&mut j, &mut disk);
            assert_eq!(disk, want, "{offset} {len}");
        }
        // The middle is one zeroing of whole blocks, with the request's flags.
        let mut j = job(unaligned(&req(100, 8000, zero), &[], 512, 1 << 20));
        for io in j.reads() {
            j.read_done(io, Ok(&[9; 512]));
        }
        let parts = j.writes();
        assert_eq!(parts.len(), 3);
        assert_eq!(
            parts[2],
            WritePart {
                io: Io::Zero {
                    offset: 512,
                    len: 7168,
                    fua: true,
                    may_punch: true,
                    fast: false
                },
                data: None
            }
        );
        assert!(matches!(parts[0].io, Io::Write { fua: true, .. }));
        let fast = Command::WriteZeroes {
            fua: false,
            no_hole: false,
            fast: true,
        };
        assert!(matches!(
            unaligned(&req(1, 4096, fast), &[], 512, 1 << 20),
            Unaligned::Fail(IoError::NotFast)
        ));
    }

    #[test]
    fn an_unaligned_trim_trims_the_whole_blocks_it_covers() {
        let trim = Command::Trim { fua: true };
        assert!(matches!(
            unaligned(&req(1, 1000, trim), &[], 512, 1 << 20),
            Unaligned::Nothing
        ));
        assert!(matches!(
            unaligned(&req(1, 1500, trim), &[], 512, 1 << 20),
            Unaligned::Gated(Io::Trim {
                offset: 512,
                len: 512,
                fua: true
            })
        ));
        assert!(matches!(
            unaligned(&req(1, 1, Command::Cache), &[], 512, 1 << 20),
            Unaligned::Engine(Io::Cache {
                offset: 0,
                len: 512
            })
        ));
    }

    #[test]
    fn a_failed_part_fails_the_job() {
        let mut j = job(unaligned(&req(510, 3, W), &[1, 2, 3], 512, 1 << 20));
        let reads = j.reads();
        assert!(!j.read_done(reads[0], Err(IoError::Os(5))));
        assert!(j.read_done(reads[1], Ok(&[0; 512])));
        assert_eq!(j.error(), Some(IoError::Os(5)));
        let mut j = job(unaligned(&req(1, 3, W), &[1, 2, 3], 512, 1 << 20));
        let r = j.reads();
        j.read_done(r[0], Ok(&[0; 512]));
        let w = j.writes();
        assert!(j.write_done(Err(IoError::NoQuorum)) && w.len() == 1);
        assert_eq!(j.error(), Some(IoError::NoQuorum));
    }

    #[test]
    fn the_gate_orders_read_modify_writes_with_every_overlapping_write() {
        let mut g = Gate::default();
        let mut rel = Vec::new();
        // Plain writes go together, overlapping or not.
        let (a, go_a) = g.enter(0, 1024, false);
        let (b, go_b) = g.enter(512, 1024, false);
        assert!(go_a && go_b);
        // A read-modify-write waits for the earlier writes it overlaps...
        let (m, go_m) = g.enter(512, 1024, true);
        assert!(!go_m);
        // ...and the later ones that overlap it wait for it; others go.
        let (c, go_c) = g.enter(0, 1024, false);
        let (d, go_d) = g.enter(1024, 2048, false);
        assert!(!go_c && go_d);
        // A second read-modify-write waits behind the waiting write it overlaps.
        let (n, go_n) = g.enter(0, 512, true);
        assert!(!go_n);
        g.leave(a, &mut rel);
        assert!(rel.is_empty());
        g.leave(b, &mut rel);
        assert_eq!(rel, vec![m]);
        rel.clear();
        g.leave(d, &mut rel);
        assert!(rel.is_empty());
        g.leave(m, &mut rel);
        assert_eq!(rel, vec![c]);
        rel.clear();
        g.leave(c, &mut rel);
        assert_eq!(rel, vec![n]);
        rel.clear();
        g.leave(n, &mut rel);
        assert!(rel.is_empty());
        assert_eq!(g.len(), 0);
    }

    /// A deterministic generator for the model test (no dependency for one test).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const GRAIN: u32 = 8;
    const DISK: usize = 32;

    /// One client write of the model: its bytes, when it arrived and when it was answered
    /// (steps of the model's clock).
    #[derive(Clone, Debug)]
    struct ClientWrite {
        offset: usize,
        data: Vec<u8>,
        arrived: u64,
        answered: Option<u64>,
    }

    /// What a disk operation in flight is for.
    #[derive(Clone, Copy, Debug)]
    enum For {
        Plain(usize),
        JobRead(usize),
        JobWrite(usize),
    }

    /// A disk operation issued: carried out at some later step, answered at a later one.
    #[derive(Debug)]
    struct Op {
        io: Io,
        data: Option<Vec<u8>>,
        read: Option<Vec<u8>>,
        done: bool,
        what: For,
    }

    struct Model {
        rng: Rng,
        disk: Vec<u8>,
        gate: Gate,
        writes: Vec<ClientWrite>,
        tickets: Vec<Option<Ticket>>,
        jobs: Vec<Option<Job>>,
        ops: Vec<Op>,
        clock: u64,
    }

    impl Model {
        fn arrive(&mut self, w: usize) {
            let ClientWrite { offset, data, .. } = self.writes[w].clone();
            let r = req(offset as u64, data.len() as u32, W);
            if is_aligned(&r, GRAIN) {
                let (t, go) = self
                    .gate
                    .enter(r.offset, r.offset + u64::from(r.len), false);
                self.tickets[w] = Some(t);
                if go {
                    self.go(w);
                }
            } else {
                let j = job(unaligned(&r, &data, GRAIN, 16));
                let (s, e) = j.blocks();
                let (t, go) = self.gate.enter(s, e, true);
                self.tickets[w] = Some(t);
                self.jobs[w] = Some(j);
                if go {
                    self.go(w);
                }
            }
        }

        fn go(&mut self, w: usize) {
            match self.jobs[w].as_mut() {
                None => {
                    let ClientWrite { offset, data, .. } = self.writes[w].clone();
                    let io = Io::Write {
                        offset: offset as u64,
                        len: data.len() as u32,
                        fua: false,
                    };
                    self.issue(io, Some(data), For::Plain(w));
                }
                Some(j) => {
                    for io in j.reads() {
                        self.issue(io, None, For::JobRead(w));
                    }
                }
            }
        }

        fn issue(&mut self, io: Io, data: Option<Vec<u8>>, what: For) {
            self.ops.push(Op {
                io,
                data,
                read: None,
                done: false,
                what,
            });
        }

        /// Carries out one operation in flight (reads see the disk as it is then).
        fn carry_out(&mut self, i: usize) {
            let op = &mut self.ops[i];
            match op.io {
                Io::Read { offset, len } => {
                    op.read = Some(
                        self.disk[offset as usize..(offset + u64::from(len)) as usize].to_vec(),
                    )
                }
                Io::Write { offset, .. } => {
                    let d = op.data.as_ref().unwrap();
                    self.disk[offset as usize..offset as usize + d.len()].copy_from_slice(d);
                }
                other => unreachable!("{other:?}"),
            }
            op.done = true;
        }

        /// Answers one operation carried out.
        fn answer(&mut self, i: usize) {
            let op = self.ops.swap_remove(i);
            match op.what {
                For::Plain(w) => self.finish(w),
                For::JobRead(w) => {
                    let j = self.jobs[w].as_mut().unwrap();
                    if j.read_done(op.io, Ok(op.read.as_deref().unwrap())) {
                        let parts = j.writes();
                        for p in parts {
                            self.issue(p.io, p.data, For::JobWrite(w));
                        }
                    }
                }
                For::JobWrite(w) => {
                    if self.jobs[w].as_mut().unwrap().write_done(Ok(())) {
                        self.finish(w);
                    }
                }
            }
        }

        fn finish(&mut self, w: usize) {
            self.writes[w].answered = Some(self.clock);
            let mut released = Vec::new();
            self.gate
                .leave(self.tickets[w].take().unwrap(), &mut released);
            for t in released {
                let w = self.tickets.iter().position(|&x| x == Some(t)).unwrap();
                self.go(w);
            }
        }
    }

    /// Whether `disk` is what some serial order of `writes` on `initial` gives, an order in
    /// which a write answered before another arrived comes first.
    fn serial(initial: &[u8], writes: &[ClientWrite], disk: &[u8]) -> bool {
        fn search(state: &[u8], writes: &[ClientWrite], used: &mut Vec<bool>, disk: &[u8]) -> bool {
            if used.iter().all(|&u| u) {
                return state == disk;
            }
            for i in 0..writes.len() {
                if used[i] {
                    continue;
                }
                // Every write answered before this one arrived must be applied already.
                let blocked = (0..writes.len())
                    .any(|k| !used[k] && k != i && writes[k].answered.unwrap() < writes[i].arrived);
                if blocked {
                    continue;
                }
                let mut next = state.to_vec();
                let w = &writes[i];
                next[w.offset..w.offset + w.data.len()].copy_from_slice(&w.data);
                used[i] = true;
                if search(&next, writes, used, disk) {
                    return true;
                }
                used[i] = false;
            }
            false
        }
        search(initial, writes, &mut vec![false; writes.len()], disk)
    }

    /// Two clients write random, mostly unaligned, overlapping ranges (each a few writes,
    /// up to two in flight), and the disk carries out and answers operations in random
    /// order. The end is always some serial order of the writes that keeps every write
    /// answered before another arrived ahead of it: no write's bytes are lost, whoever
    /// shares its blocks. Without the gate (every write let go at once) this fails.
    #[test]
    fn random_interleavings_of_unaligned_writes_end_in_a_serial_order() {
        for seed in 1..=3000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            // Unlike every byte written (those are 1 modulo 4).
            let initial: Vec<u8> = (0..DISK).map(|i| (i * 4) as u8).collect();
            let mut writes = Vec::new();
            // (client, index in writes) in the order each client sends them.
            let mut queues: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
            for (c, q) in queues.iter_mut().enumerate() {
                for k in 0..3 {
                    let aligned = rng.below(4) == 0;
                    let (offset, len) = if aligned {
                        let b = rng.below(DISK as u64 / 8) as usize * 8;
                        (
                            b,
                            8 * (1 + rng.below(((DISK - b) / 8) as u64) as usize).min(2),
                        )
                    } else {
                        let o = rng.below(DISK as u64 - 1) as usize;
                        (o, 1 + rng.below((DISK - o).min(12) as u64) as usize)
                    };
                    let tag = (c * 16 + k * 4 + 1) as u8;
                    q.push(writes.len());
                    writes.push(ClientWrite {
                        offset,
                        data: (0..len)
                            .map(|i| tag.wrapping_add((i as u8).wrapping_mul(64)))
                            .collect(),
                        arrived: 0,
                        answered: None,
                    });
                }
            }
            let n = writes.len();
            let mut m = Model {
                rng,
                disk: initial.clone(),
                gate: Gate::default(),
                writes,
                tickets: vec![None; n],
                jobs: (0..n).map(|_| None).collect(),
                ops: Vec::new(),
                clock: 0,
            };
            let mut sent = [0usize; 2];
            loop {
                m.clock += 1;
                // Choices: a client sends its next write (at most two of its own in
                // flight), or an operation is carried out, or one carried out is answered.
                let mut choices = Vec::new();
                for c in 0..2 {
                    let in_flight = queues[c][..sent[c]]
                        .iter()
                        .filter(|&&w| m.writes[w].answered.is_none())
                        .count();
                    if sent[c] < queues[c].len() && in_flight < 2 {
                        choices.push((0, c));
                    }
                }
                for (i, op) in m.ops.iter().enumerate() {
                    choices.push((if op.done { 2 } else { 1 }, i));
                }
                if choices.is_empty() {
                    break;
                }
                let (what, i) = choices[m.rng.below(choices.len() as u64) as usize];
                match what {
                    0 => {
                        let w = queues[i][sent[i]];
                        sent[i] += 1;
                        m.writes[w].arrived = m.clock;
                        m.arrive(w);
                    }
                    1 => m.carry_out(i),
                    _ => m.answer(i),
                }
            }
            assert!(m.writes.iter().all(|w| w.answered.is_some()), "seed {seed}");
            assert_eq!(m.gate.len(), 0);
            assert!(
                serial(&initial, &m.writes, &m.disk),
                "seed {seed}: {:?} on {initial:?} gave {:?}",
                m.writes,
                m.disk
            );
        }
    }
}
