//! Recycled data buffers, so the steady-state I/O path does not allocate.

use tandem_storage::AlignedBuf;

/// A buffer of `len` bytes carved from a pooled, O_DIRECT-aligned allocation.
pub struct DataBuf {
    buf: AlignedBuf,
    len: usize,
}

impl std::ops::Deref for DataBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl AsRef<[u8]> for DataBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::DerefMut for DataBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

const MIN_CLASS: u32 = 12; // 4 KiB
const MAX_CLASS: u32 = 25; // 32 MiB

/// Free lists by power-of-two size class.
pub struct BufPool {
    classes: Vec<Vec<AlignedBuf>>,
}

impl Default for BufPool {
    fn default() -> Self {
        BufPool {
            classes: (MIN_CLASS..=MAX_CLASS).map(|_| Vec::new()).collect(),
        }
    }
}

impl BufPool {
    fn class(len: usize) -> u32 {
        (len.max(1).next_power_of_two().trailing_zeros()).max(MIN_CLASS)
    }

    pub fn get(&mut self, len: usize) -> DataBuf {
        let class = Self::class(len);
        let buf = self
            .classes
            .get_mut((class - MIN_CLASS) as usize)
            .and_then(|c| c.pop())
            .unwrap_or_else(|| AlignedBuf::new(1usize << class));
        debug_assert!(buf.len() >= len);
        DataBuf { buf, len }
    }

    pub fn put(&mut self, buf: DataBuf) {
        let class = Self::class(buf.buf.len());
        // Keep many small buffers, few large ones: a burst of 32 MiB writes must not pin
        // gigabytes after it ends.
        let keep = if class <= 20 { 256 } else { 4 };
        if let Some(list) = self.classes.get_mut((class - MIN_CLASS) as usize) {
            if list.len() < keep && buf.buf.len() == 1usize << class {
                list.push(buf.buf);
            }
        }
    }
}
