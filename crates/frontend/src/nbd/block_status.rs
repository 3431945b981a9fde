//! Answers to `NBD_CMD_BLOCK_STATUS` for `base:allocation`: what a store says of a range
//! (its allocation map) turned into descriptors the spec allows.
//!
//! The rules kept here: descriptors are consecutive from the request's offset, each nonzero
//! and a multiple of the minimum block size, none past the request's end (so none past the
//! export's); at least one; exactly one with `NBD_CMD_FLAG_REQ_ONE`. Where the map is coarser
//! or shorter than the request, the rest is reported as data (flags 0), which the spec lets a
//! server say of any block: a hole is only claimed where the store said so for whole blocks.

use super::wire::{STATE_HOLE, STATE_ZERO};

/// The spec asks servers not to send more descriptors than this in one chunk.
pub const MAX_DESCRIPTORS: usize = 1 << 20;

/// A stretch of the store's allocation map, in order from the request's offset: `len`
/// bytes either allocated (or of unknown state) or a hole, which reads as zeroes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stretch {
    pub len: u64,
    pub hole: bool,
}

/// One block status descriptor: `len` bytes with these `base:allocation` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len: u32,
    pub flags: u32,
}

const DATA: u32 = 0;
const HOLE: u32 = STATE_HOLE | STATE_ZERO;

/// The descriptors answering a request for `len` bytes at `offset` (validated: inside the
/// export; aligned to `min_block` unless the client did not agree to block sizes, whose
/// descriptors then start and end where its request does) from the store's `map` of it.
/// Holes are claimed over whole blocks of `min_block` only, in either case. The map may stop short of
/// the request (a store bounds its work; the client asks again from where the answer ends)
/// and may run past it (cut off); an empty map is the whole range as data.
pub fn descriptors(
    offset: u64,
    len: u32,
    min_block: u32,
    req_one: bool,
    map: impl IntoIterator<Item = Stretch>,
) -> Vec<Extent> {
    let end = offset + u64::from(len);
    let min = u64::from(min_block.max(1));
    let mut out = Descriptors {
        extents: Vec::new(),
        at: offset,
    };
    // Where the map has got to, and the start of the hole it is in (adjacent holes are one).
    let mut pos = offset;
    let mut hole_from: Option<u64> = None;
    for s in map {
        if pos >= end || out.extents.len() + 3 > MAX_DESCRIPTORS || (req_one && out.is_full_one()) {
            break;
        }
        if s.len == 0 {
            continue;
        }
        let s_end = pos.saturating_add(s.len).min(end);
        match (s.hole, hole_from) {
            (true, None) => hole_from = Some(pos),
            (true, Some(_)) => {}
            (false, Some(from)) => {
                out.hole(from, pos, min);
                hole_from = None;
            }
            (false, None) => {}
        }
        pos = s_end;
    }
    if let Some(from) = hole_from {
        out.hole(from, pos, min);
    }
    // A block the map covered only in part is data: what lies past the map is unknown.
    let covered = pos.next_multiple_of(min).min(end);
    out.data_to(covered);
    if out.extents.is_empty() {
        out.data_to(end);
    }
    if req_one {
        out.extents.truncate(1);
    }
    out.extents
}

struct Descriptors {
    extents: Vec<Extent>,
    /// Where the descriptors so far end.
    at: u64,
}

impl Descriptors {
    /// Reports the hole `[from, to)` as far as it covers whole blocks, and data up to it.
    fn hole(&mut self, from: u64, to: u64, min: u64) {
        let (start, stop) = (from.next_multiple_of(min), to / min * min);
        if start < stop {
            self.data_to(start);
            self.push(stop - start, HOLE);
        }
    }

    fn data_to(&mut self, to: u64) {
        if to > self.at {
            self.push(to - self.at, DATA);
        }
    }

    fn push(&mut self, len: u64, flags: u32) {
        self.at += len;
        // Never more than the request's length, itself a u32.
        let len = len as u32;
        match self.extents.last_mut() {
            Some(last) if last.flags == flags => last.len += len,
            _ => self.extents.push(Extent { len, flags }),
        }
    }

    /// With REQ_ONE only the first descriptor goes out: once a second has begun, the first
    /// cannot change and the rest of the map need not be read.
    fn is_full_one(&self) -> bool {
        self.extents.len() >= 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(spans: &[(u64, bool)]) -> Vec<Stretch> {
        spans
            .iter()
            .map(|&(len, hole)| Stretch { len, hole })
            .collect()
    }

    fn ext(v: &[(u32, u32)]) -> Vec<Extent> {
        v.iter()
            .map(|&(len, flags)| Extent { len, flags })
            .collect()
    }

    #[test]
    fn aligned_map_is_reported_as_is_and_merged() {
        let m = map(&[(4096, false), (8192, true), (4096, false), (4096, false)]);
        assert_eq!(
            descriptors(0, 20480, 512, false, m),
            ext(&[(4096, 0), (8192, 3), (8192, 0)])
        );
    }

    #[test]
    fn holes_shrink_to_whole_blocks_and_data_grows() {
        // Min block 4096: a hole from 1000 to 9000 covers only the block 4096..8192.
        let m = map(&[(1000, false), (8000, true), (7384, false)]);
        assert_eq!(
            descriptors(0, 16384, 4096, false, m),
            ext(&[(4096, 0), (4096, 3), (8192, 0)])
        );
        // A hole smaller than a block is no hole.
        let m = map(&[(1000, false), (3000, true), (12384, false)]);
        assert_eq!(descriptors(0, 16384, 4096, false, m), ext(&[(16384, 0)]));
    }

    #[test]
    fn a_short_map_ends_on_a_block_boundary_as_data() {
        // The map stops at 5000: the block 4096..8192 is known only in part.
        let m = map(&[(5000, true)]);
        assert_eq!(
            descriptors(8192, 16384, 4096, false, m),
            ext(&[(4096, 3), (4096, 0)])
        );
        let m = map(&[(4096, true)]);
        assert_eq!(descriptors(0, 16384, 4096, false, m), ext(&[(4096, 3)]));
    }

    #[test]
    fn a_map_past_the_request_is_cut_off() {
        let m = map(&[(512, false), (1 << 30, true)]);
        assert_eq!(
            descriptors(512, 4096, 512, false, m),
            ext(&[(512, 0), (3584, 3)])
        );
    }

    #[test]
    fn an_empty_map_is_all_data() {
        assert_eq!(
            descriptors(0, 65536, 512, false, Vec::new()),
            ext(&[(65536, 0)])
        );
        assert_eq!(
            descriptors(0, 65536, 512, true, map(&[(0, true)])),
            ext(&[(65536, 0)])
        );
    }

    #[test]
    fn req_one_gives_exactly_the_first_descriptor() {
        let m = map(&[(8192, true), (4096, false), (4096, true)]);
        assert_eq!(descriptors(0, 16384, 512, true, m), ext(&[(8192, 3)]));
        let m = map(&[(1 << 20, true)]);
        assert_eq!(descriptors(0, 4096, 512, true, m), ext(&[(4096, 3)]));
    }

    /// A client without block sizes may ask at any byte: the answer starts and ends at its
    /// bytes, holes still over whole blocks.
    #[test]
    fn an_unaligned_request_is_tiled_from_its_first_byte() {
        let m = map(&[(100, false), (5000, true), (10_000, false)]);
        assert_eq!(
            descriptors(1000, 10_000, 512, false, m),
            ext(&[(536, 0), (4096, 3), (5368, 0)])
        );
        let m = map(&[(3, true)]);
        assert_eq!(descriptors(1, 3, 512, true, m), ext(&[(3, 0)]));
    }

    #[test]
    fn adjacent_holes_are_one() {
        // Split at an unaligned point: together they still cover every block.
        let m = map(&[(1000, true), (7192, true), (8192, false)]);
        assert_eq!(
            descriptors(0, 16384, 4096, false, m),
            ext(&[(8192, 3), (8192, 0)])
        );
    }

    #[test]
    fn descriptors_always_tile_an_aligned_prefix_of_the_request() {
        // Every map shape from a small alphabet: the rules of the module's comment hold.
        let pieces = [
            (100u64, false),
            (512, true),
            (4096, false),
            (5000, true),
            (8192, true),
        ];
        for a in 0..pieces.len() {
            for b in 0..pieces.len() {
                for c in 0..pieces.len() {
                    for min in [512u32, 4096] {
                        for req_one in [false, true] {
                            let m = map(&[pieces[a], pieces[b], pieces[c]]);
                            let (offset, len) = (u64::from(min) * 3, min * 7);
                            let d = descriptors(offset, len, min, req_one, m);
                            assert!(!d.is_empty());
                            if req_one {
                                assert_eq!(d.len(), 1);
                            }
                            let total: u64 = d.iter().map(|e| u64::from(e.len)).sum();
                            assert!(total <= u64::from(len), "{d:?}");
                            for e in &d {
                                assert!(e.len > 0 && e.len % min == 0, "{d:?}");
                            }
                            for w in d.windows(2) {
                                assert_ne!(w[0].flags, w[1].flags, "{d:?}");
                            }
                        }
                    }
                }
            }
        }
    }
}
