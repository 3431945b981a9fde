//! Out-of-sync bitmap: one bit per 4 KiB block, set when the block may differ on a peer.

/// Granularity of the per-peer out-of-sync bitmaps.
pub const BLOCK: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    blocks: u64,
    set: u64,
    block: u64,
}

impl Bitmap {
    /// A bitmap with 4 KiB blocks.
    pub fn new(size: u64) -> Bitmap {
        Bitmap::with_block(size, BLOCK)
    }

    pub fn with_block(size: u64, block: u64) -> Bitmap {
        assert!(block.is_power_of_two());
        let blocks = size.div_ceil(block);
        Bitmap {
            words: vec![0; blocks.div_ceil(64) as usize],
            blocks,
            set: 0,
            block,
        }
    }

    /// An empty bitmap of the same size and block.
    pub fn cleared(&self) -> Bitmap {
        Bitmap {
            words: vec![0; self.words.len()],
            blocks: self.blocks,
            set: 0,
            block: self.block,
        }
    }

    pub fn block_size(&self) -> u64 {
        self.block
    }

    /// The words as kept on disk (`tandem-meta`): bit `j` of word `w` is block `64w + j`.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Loads words read back from disk. Bits past the last block are ignored (a slot on
    /// disk is rounded up to whole pages); a length that does not cover every block is the
    /// caller's bug.
    pub fn load_words(&mut self, words: &[u64]) {
        assert!(
            words.len() >= self.words.len(),
            "{} words for {} blocks",
            words.len(),
            self.blocks
        );
        // Only the words that differ are written: a bitmap is allocated zeroed and its
        // pages cost memory once written, so a restored bitmap with few bits set stays
        // small (bench/memory.py: a node restarted with a 1 TiB volume held all 32 MiB of
        // each peer's bitmap when every word was copied).
        for (mine, &theirs) in self.words.iter_mut().zip(words) {
            if *mine != theirs {
                *mine = theirs;
            }
        }
        let tail = self.blocks % 64;
        if tail != 0 {
            *self.words.last_mut().expect("tail implies a word") &= (1u64 << tail) - 1;
        }
        self.set = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
    }

    /// It covers a volume of `size` bytes, and its count of set blocks is the true one.
    pub fn check(&self, size: u64) -> Result<(), String> {
        if self.blocks != size.div_ceil(self.block) {
            return Err(format!(
                "a bitmap of {} blocks of {} for {size} bytes",
                self.blocks, self.block
            ));
        }
        if self.set > self.blocks {
            return Err(format!(
                "a bitmap counts {} set blocks of {}",
                self.set, self.blocks
            ));
        }
        // Counting every word is the slow part: debug builds only.
        let real = if cfg!(debug_assertions) {
            self.words.iter().map(|w| u64::from(w.count_ones())).sum()
        } else {
            self.set
        };
        if real != self.set {
            return Err(format!(
                "a bitmap counts {} set blocks, holds {real}",
                self.set
            ));
        }
        Ok(())
    }

    /// Blocks touched by the byte range.
    fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let first = offset / self.block;
        let end = (offset + len).div_ceil(self.block).min(self.blocks);
        first..end
    }

    pub fn set_range(&mut self, offset: u64, len: u64) {
        for b in self.blocks_of(offset, len) {
            let (w, m) = ((b / 64) as usize, 1u64 << (b % 64));
            if self.words[w] & m == 0 {
                self.words[w] |= m;
                self.set += 1;
            }
        }
    }

    /// Clears only the blocks entirely inside the byte range: a partial block written is
    /// not known to be in sync.
    pub fn clear_range(&mut self, offset: u64, len: u64) {
        if self.set == 0 {
            return; // the common case: a peer in sync
        }
        let first = offset.div_ceil(self.block);
        let end = ((offset + len) / self.block).min(self.blocks);
        for b in first..end {
            let (w, m) = ((b / 64) as usize, 1u64 << (b % 64));
            if self.words[w] & m != 0 {
                self.words[w] &= !m;
                self.set -= 1;
            }
        }
    }

    /// Moves the set blocks of a range into `into` (same size and block): they leave this
    /// bitmap and are set there.
    pub fn move_range(&mut self, offset: u64, len: u64, into: &mut Bitmap) {
        debug_assert_eq!((self.blocks, self.block), (into.blocks, into.block));
        for b in self.blocks_of(offset, len) {
            if self.is_set(b) {
                into.set_range(b * self.block, self.block);
            }
        }
        self.clear_range(offset, len);
    }

    /// Sets every block set in `other` (same size and block).
    pub fn union_with(&mut self, other: &Bitmap) {
        debug_assert_eq!((self.blocks, self.block), (other.blocks, other.block));
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
        self.set = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
    }

    /// Some block is set in both (same size and block).
    pub fn intersects(&self, other: &Bitmap) -> bool {
        debug_assert_eq!((self.blocks, self.block), (other.blocks, other.block));
        self.words.iter().zip(&other.words).any(|(w, o)| w & o != 0)
    }

    /// Every block set here is set in `other` too (same size and block).
    pub fn within(&self, other: &Bitmap) -> bool {
        debug_assert_eq!((self.blocks, self.block), (other.blocks, other.block));
        self.words
            .iter()
            .zip(&other.words)
            .all(|(w, o)| w & !o == 0)
    }

    /// Clears every block set in `other` (same size and block).
    pub fn subtract(&mut self, other: &Bitmap) {
        debug_assert_eq!((self.blocks, self.block), (other.blocks, other.block));
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        self.set = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
    }

    /// Keeps only the blocks also set in `other` (same size and block).
    pub fn intersect_with(&mut self, other: &Bitmap) {
        debug_assert_eq!((self.blocks, self.block), (other.blocks, other.block));
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= o;
        }
        self.set = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
    }

    pub fn set_all(&mut self) {
        for b in 0..self.blocks {
            self.words[(b / 64) as usize] |= 1u64 << (b % 64);
        }
        self.set = self.blocks;
    }

    pub fn is_set(&self, block: u64) -> bool {
        self.words[(block / 64) as usize] & (1u64 << (block % 64)) != 0
    }

    /// Some block the byte range covers only in part is set: a write of the range leaves
    /// that block as lacking as it was (its other sectors; `clear_range` keeps it set).
    pub fn any_partial(&self, offset: u64, len: u64) -> bool {
        if self.set == 0 {
            return false;
        }
        let whole = offset.div_ceil(self.block)..(offset + len) / self.block;
        self.blocks_of(offset, len)
            .any(|b| !whole.contains(&b) && self.is_set(b))
    }

    pub fn any_in(&self, offset: u64, len: u64) -> bool {
        self.set != 0 && self.blocks_of(offset, len).any(|b| self.is_set(b))
    }

    /// Bytes of the range in blocks not set: what the range adds to the bitmap's count.
    pub fn bytes_clear_in(&self, offset: u64, len: u64) -> u64 {
        self.blocks_of(offset, len)
            .filter(|&b| !self.is_set(b))
            .count() as u64
            * self.block
    }

    /// Blocks set.
    pub fn count(&self) -> u64 {
        self.set
    }

    /// The runs of set blocks as byte ranges `(offset, len)` in order, each at most `max`
    /// bytes (at least one block), the last clipped to a volume of `size` bytes.
    pub fn runs(&self, size: u64, max: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let block = self.block;
        let blocks = size.div_ceil(block).min(self.blocks);
        let max_blocks = (max / block).max(1);
        let mut from = 0;
        std::iter::from_fn(move || {
            let first = self.next_set(from).filter(|&b| b < blocks)?;
            let mut end = first + 1;
            while end < blocks && end - first < max_blocks && self.is_set(end) {
                end += 1;
            }
            from = end;
            let offset = first * block;
            Some((offset, ((end - first) * block).min(size - offset)))
        })
    }

    /// The first set block at or after `from`.
    pub fn next_set(&self, from: u64) -> Option<u64> {
        let mut b = from;
        while b < self.blocks {
            let w = self.words[(b / 64) as usize] >> (b % 64);
            if w != 0 {
                let found = b + u64::from(w.trailing_zeros());
                return (found < self.blocks).then_some(found);
            }
            b = (b / 64 + 1) * 64;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_count_next() {
        let mut b = Bitmap::new(1 << 20);
        b.set_range(4096 * 3 + 1, 4096);
        assert_eq!(b.count(), 2, "an unaligned range touches two blocks");
        assert_eq!(b.next_set(0), Some(3));
        b.clear_range(4096 * 3, 4096 * 2 - 1);
        assert_eq!(b.count(), 1, "only whole blocks are cleared");
        assert_eq!(b.next_set(0), Some(4));
        b.set_all();
        assert_eq!(b.count(), 256);
        assert_eq!(b.next_set(255), Some(255));
        b.clear_range(0, 1 << 20);
        assert_eq!(b.next_set(0), None);
    }

    #[test]
    fn runs_are_capped_and_the_last_is_clipped() {
        // 10 blocks and 1000 bytes: the last block is partial.
        let size = 4096 * 9 + 1000;
        let mut b = Bitmap::new(size);
        b.set_range(4096, 4096 * 4);
        b.set_range(4096 * 7, size - 4096 * 7);
        let runs: Vec<_> = b.runs(size, 3 * 4096).collect();
        assert_eq!(
            runs,
            vec![
                (4096, 3 * 4096),
                (4 * 4096, 4096),
                (7 * 4096, 2 * 4096 + 1000)
            ]
        );
        let whole: Vec<_> = b.runs(size, u64::MAX).collect();
        assert_eq!(whole, vec![(4096, 4 * 4096), (7 * 4096, 2 * 4096 + 1000)]);
        assert_eq!(b.cleared().runs(size, u64::MAX).count(), 0);
    }

    /// Rule F (overlapping seed 15630): a write vouched for by a replica known to lack a
    /// block it covers only in part would leave that block's newest sectors split between
    /// two replicas; blocks it covers whole, or does not touch, do not count.
    #[test]
    fn any_partial_sees_only_set_blocks_a_range_covers_in_part() {
        let mut b = Bitmap::new(1 << 20);
        assert!(!b.any_partial(0, 1 << 20), "nothing set");
        b.set_range(8 * 4096, 4096);
        // Whole blocks only: covered, or beside it.
        assert!(!b.any_partial(8 * 4096, 4096), "block 8 covered whole");
        assert!(!b.any_partial(7 * 4096, 3 * 4096), "blocks 7-9 whole");
        assert!(!b.any_partial(9 * 4096 + 512, 512), "inside block 9 only");
        assert!(
            !b.any_partial(7 * 4096 + 512, 4096 - 512),
            "ends at block 8's start"
        );
        // Block 8 in part: its first sectors, its last, or a range that ends or starts in it.
        assert!(b.any_partial(8 * 4096, 512), "block 8's first sector");
        assert!(b.any_partial(9 * 4096 - 512, 512), "block 8's last sector");
        // Seed 15630's Zero: block 7 whole, sectors 0-2 of block 8.
        assert!(b.any_partial(28672, 5632));
        assert!(
            b.any_partial(8 * 4096 + 512, 2 * 4096),
            "starts inside block 8"
        );
        // Seed 15630's failed write, 30720+6656: blocks 7 and 9 in part, block 8 whole.
        assert!(!b.any_partial(30720, 6656));
        b.set_range(9 * 4096, 1);
        assert!(
            b.any_partial(30720, 6656),
            "block 9 set and covered in part"
        );
    }
}
