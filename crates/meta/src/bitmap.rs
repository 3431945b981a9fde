//! The per-peer bitmaps on disk: one bit per 4 KiB block of data, little-endian `u64`
//! words (word `w` holds blocks `64w..64w+63`, bit `j` = block `64w + j`), 512 words per
//! 4 KiB page. Pages carry no checksum: see the contract in METADATA.md ("Bitmaps").

use std::ops::Range;

use crate::layout::{BITMAP_BLOCK, BLOCKS_PER_EXTENT, MD_BLOCK_BYTES};

/// Words in one 4 KiB page.
pub const WORDS_PER_PAGE: usize = MD_BLOCK_BYTES / 8;
/// Blocks (bits) one page covers: 32768 blocks = 128 MiB of data.
pub const BLOCKS_PER_PAGE: u64 = WORDS_PER_PAGE as u64 * 64;

/// The page holding the bit of 4 KiB block `block`.
pub fn page_of_block(block: u64) -> u64 {
    block / BLOCKS_PER_PAGE
}

/// The pages holding the bits of activity-log extent `extent`. An extent is 1024 bits,
/// so it always lies within one page; a range keeps callers independent of that.
pub fn pages_of_extent(extent: u32) -> Range<u64> {
    let first = u64::from(extent) * BLOCKS_PER_EXTENT;
    page_of_block(first)..page_of_block(first + BLOCKS_PER_EXTENT - 1) + 1
}

/// The block of data holding byte `offset`.
pub fn block_of_offset(offset: u64) -> u64 {
    offset / BITMAP_BLOCK
}

/// Sets the bits of every block of `extent` that exists in a volume of `blocks` blocks
/// (after a crash, every extent in the activity log is marked in every slot).
pub fn mark_extent(words: &mut [u64], blocks: u64, extent: u32) {
    assert!(
        words.len() as u64 * 64 >= blocks,
        "{} words for {blocks} blocks",
        words.len()
    );
    let first = u64::from(extent) * BLOCKS_PER_EXTENT;
    let end = (first + BLOCKS_PER_EXTENT).min(blocks);
    // Extents are 1024-bit aligned, so whole words except at the volume's end.
    let mut b = first;
    while b < end {
        let w = (b / 64) as usize;
        let n = (end - b).min(64);
        words[w] |= if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        b += n;
    }
}

/// Set bits in `words`.
pub fn count_set(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// Pages `first_page..first_page + pages` of a slot, as bytes to write. Words past the
/// end of `words` (the last page's tail) are written as zero.
pub fn encode_pages(words: &[u64], first_page: u64, pages: u64) -> Vec<u8> {
    let mut out = vec![0u8; pages as usize * MD_BLOCK_BYTES];
    let start = first_page as usize * WORDS_PER_PAGE;
    let end = (start + pages as usize * WORDS_PER_PAGE).min(words.len());
    if start < end {
        for (chunk, w) in out.chunks_exact_mut(8).zip(&words[start..end]) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
    }
    out
}

/// The first `words` words of a slot read from disk.
pub fn decode_words(bytes: &[u8], words: usize) -> Vec<u64> {
    assert!(
        bytes.len() >= words * 8,
        "{} bytes for {words} words",
        bytes.len()
    );
    bytes[..words * 8]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_extents() {
        assert_eq!(BLOCKS_PER_PAGE, 32768);
        assert_eq!(page_of_block(0), 0);
        assert_eq!(page_of_block(32767), 0);
        assert_eq!(page_of_block(32768), 1);
        // 32 extents per page.
        assert_eq!(pages_of_extent(0), 0..1);
        assert_eq!(pages_of_extent(31), 0..1);
        assert_eq!(pages_of_extent(32), 1..2);
        assert_eq!(pages_of_extent(u32::MAX - 1).count(), 1);
        assert_eq!(block_of_offset(4096 * 3 + 5), 3);
    }

    #[test]
    fn bit_order_on_disk() {
        let mut words = vec![0u64; 600];
        words[0] = 1 << 3; // block 3
        words[513] = 1 << 63; // block 513 × 64 + 63, page 1
        let bytes = encode_pages(&words, 0, 2);
        assert_eq!(bytes.len(), 8192);
        assert_eq!(bytes[0], 0b1000);
        assert_eq!(bytes[4096 + 8 + 7], 0x80);
        assert_eq!(decode_words(&bytes, 600), words);
        let second = encode_pages(&words, 1, 1);
        assert_eq!(&second[..], &bytes[4096..]);
    }

    #[test]
    fn mark_extent_clips_to_the_volume() {
        // 1500 blocks: extent 0 whole, extent 1 has 476 blocks.
        let mut words = vec![0u64; 1500usize.div_ceil(64)];
        mark_extent(&mut words, 1500, 1);
        assert_eq!(count_set(&words), 476);
        assert_eq!(words[15], 0);
        assert_eq!(words[16], u64::MAX);
        assert_eq!(words[23], (1 << (1500 - 23 * 64)) - 1);
        mark_extent(&mut words, 1500, 0);
        assert_eq!(count_set(&words), 1500);
    }
}
