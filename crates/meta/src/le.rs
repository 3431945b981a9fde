//! Little-endian field access on fixed blocks. Offsets are constants of the formats, so an
//! out-of-range offset is a bug in this crate and panics.

pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}

pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// crc32c of `block` as if the 4 bytes at `crc_off` were zero.
pub(crate) fn crc_with_hole(block: &[u8], crc_off: usize) -> u32 {
    let crc = crc32c::crc32c(&block[..crc_off]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &block[crc_off + 4..])
}

/// The first non-zero byte in `b[range]`, as an offset into `b`.
pub(crate) fn first_nonzero(b: &[u8], range: std::ops::Range<usize>) -> Option<usize> {
    let start = range.start;
    b[range].iter().position(|&x| x != 0).map(|i| start + i)
}
