//! A backing store: open, size, read, write, flush, trim, zero.

use crate::aligned::{AlignedBuf, DIRECT_ALIGN};
use std::fs::{File, OpenOptions as FsOpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackingKind {
    File,
    BlockDevice,
}

/// How to open a backing store.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub path: PathBuf,
    /// For regular files: the size to create a missing file with (sparse), and the size an
    /// existing file must have. Ignored for block devices, whose size is their own.
    pub size: Option<u64>,
    pub direct: bool,
    pub read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} does not exist; give a size to create it")]
    MissingSize { path: PathBuf },
    #[error("{path} is {actual} bytes but a size of {wanted} was given; refusing to resize an existing backing file")]
    SizeMismatch {
        path: PathBuf,
        actual: u64,
        wanted: u64,
    },
    #[error("{path} is neither a regular file nor a block device")]
    Unsupported { path: PathBuf },
    #[error("{path} is in use by another process (locked)")]
    Locked { path: PathBuf },
    #[error("{path} has size 0")]
    Empty { path: PathBuf },
}

/// Why a zeroing request was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum ZeroError {
    /// The caller asked for a fast zero and only a slow one (writing zeroes) is possible.
    #[error("zeroing this range would not be fast")]
    NotFast,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A stretch of a store's allocation map ([`Backing::allocation`]): `len` bytes that are
/// allocated (or whose state is unknown), or a hole, which reads as zeroes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub len: u64,
    pub hole: bool,
}

/// An open backing store. All methods take `&self`: positioned I/O needs no shared cursor,
/// so one `Backing` serves the event loop and the worker threads at once.
#[derive(Debug)]
pub struct Backing {
    file: File,
    path: PathBuf,
    size: u64,
    kind: BackingKind,
    direct: bool,
    /// Logical block size of the underlying device: O_DIRECT offsets and lengths must be
    /// multiples of it.
    logical_block: u32,
}

const ZERO_CHUNK: usize = 1 << 20;

impl Backing {
    pub fn open(opts: &OpenOptions) -> Result<Backing, StorageError> {
        let path = opts.path.clone();
        let io_err = |source| StorageError::Io {
            path: path.clone(),
            source,
        };
        let existing = match std::fs::metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(e)),
        };
        let mut fs_opts = FsOpenOptions::new();
        fs_opts.read(true).write(!opts.read_only);
        if opts.direct {
            fs_opts.custom_flags(libc::O_DIRECT);
        }
        let (file, kind) = match existing {
            None => {
                let size = opts
                    .size
                    .ok_or_else(|| StorageError::MissingSize { path: path.clone() })?;
                if opts.read_only {
                    return Err(io_err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "cannot create a read-only export",
                    )));
                }
                let file = fs_opts
                    .clone()
                    .create_new(true)
                    .open(&path)
                    .map_err(io_err)?;
                file.set_len(size).map_err(io_err)?;
                (file, BackingKind::File)
            }
            Some(m) if m.file_type().is_file() => {
                (fs_opts.open(&path).map_err(io_err)?, BackingKind::File)
            }
            Some(m) if m.file_type().is_block_device() => (
                fs_opts.open(&path).map_err(io_err)?,
                BackingKind::BlockDevice,
            ),
            Some(_) => return Err(StorageError::Unsupported { path }),
        };
        // Two servers writing one backing store would corrupt it silently; refuse instead.
        // SAFETY: flock on a valid fd has no memory-safety preconditions.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(StorageError::Locked { path });
            }
            return Err(io_err(e));
        }
        let (size, logical_block) = match kind {
            BackingKind::File => {
                let size = file.metadata().map_err(io_err)?.len();
                if let Some(wanted) = opts.size {
                    if wanted != size {
                        return Err(StorageError::SizeMismatch {
                            path,
                            actual: size,
                            wanted,
                        });
                    }
                }
                (size, 512)
            }
            BackingKind::BlockDevice => (
                blockdev_size(&file).map_err(io_err)?,
                blockdev_logical_block(&file).map_err(io_err)?,
            ),
        };
        if size == 0 {
            return Err(StorageError::Empty { path });
        }
        Ok(Backing {
            file,
            path,
            size,
            kind,
            direct: opts.direct,
            logical_block,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn kind(&self) -> BackingKind {
        self.kind
    }
    pub fn is_direct(&self) -> bool {
        self.direct
    }
    /// The smallest I/O unit this store accepts (O_DIRECT) or prefers.
    pub fn logical_block(&self) -> u32 {
        self.logical_block
    }

    /// Fills `buf` from `offset`. A short read (the store shrank under us) is an error, never
    /// silently zero-filled.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct && !is_aligned(buf.as_ptr(), buf.len()) {
            let mut bounce = AlignedBuf::new(buf.len());
            self.file.read_exact_at(&mut bounce, offset)?;
            buf.copy_from_slice(&bounce);
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }

    /// Fills `buf` from `offset` only if that needs no disk I/O (every byte is in the page
    /// cache): `Ok(false)` means it would have waited for the disk, and nothing useful is in
    /// `buf`. Lets an event loop serve cached reads inline and hand the rest to threads,
    /// instead of stalling every other request behind one disk read.
    pub fn read_cached(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        if self.direct {
            return Ok(false);
        }
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            let at = offset + done as u64;
            // SAFETY: one iovec over `rest`, which outlives the call.
            let n = unsafe {
                libc::preadv2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    at as libc::off_t,
                    libc::RWF_NOWAIT,
                )
            };
            match n {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EINTR) => {}
                        // EOPNOTSUPP: this file system cannot tell; let a thread read it.
                        Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) => return Ok(false),
                        _ => return Err(e),
                    }
                }
            }
        }
        Ok(true)
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.direct && !is_aligned(buf.as_ptr(), buf.len()) {
            let mut bounce = AlignedBuf::new(buf.len());
            bounce.copy_from_slice(buf);
            return self.file.write_all_at(&bounce, offset);
        }
        self.file.write_all_at(buf, offset)
    }

    /// Makes every completed write durable (fdatasync; for block devices this also flushes
    /// the device's volatile cache).
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Makes a regular file `size` bytes long (sparse), e.g. to give a file made before
    /// metadata existed room for it at its end. Refused for block devices and for
    /// shrinking: data is never cut off.
    pub fn grow_to(&mut self, size: u64) -> io::Result<()> {
        if self.kind != BackingKind::File {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a block device cannot grow",
            ));
        }
        if size < self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("would shrink {} bytes to {size}", self.size),
            ));
        }
        self.file.set_len(size)?;
        self.size = size;
        Ok(())
    }

    /// Discards a range. TRIM is advisory, so a store that cannot punch holes ignores it.
    pub fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if is_unsupported(&e) => Ok(()),
            r => r,
        }
    }

    /// Makes a range read as zeroes. `may_punch` allows deallocating it (no NO_HOLE flag);
    /// `fast_only` refuses with [`ZeroError::NotFast`] rather than writing zeroes.
    pub fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_punch: bool,
        fast_only: bool,
    ) -> Result<(), ZeroError> {
        if may_punch {
            match self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => return Ok(()),
                Err(e) if is_unsupported(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // On a block device ZERO_RANGE may silently fall back to writing zeroes in the
        // kernel, so it is only "fast" on regular files.
        if self.kind == BackingKind::File || !fast_only {
            match self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => return Ok(()),
                Err(e) if is_unsupported(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if fast_only {
            return Err(ZeroError::NotFast);
        }
        let zeroes = AlignedBuf::new(ZERO_CHUNK.min(len as usize));
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeroes.len() as u64) as usize;
            self.file.write_all_at(&zeroes[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Maps `[offset, offset + len)` into data and holes with `lseek(SEEK_DATA/SEEK_HOLE)`,
    /// in order from `offset`, stopping after `max_spans` spans: the answer may cover less
    /// than asked (a block status client asks again from where it ends), so one request
    /// costs at most about `2 × max_spans` system calls however fragmented the file.
    ///
    /// Saying "data" is always true (a hole is only an optimisation for the reader), so a
    /// block device (whose holes, if any, the kernel does not report), a file system without
    /// hole support (data everywhere) or any error answers the rest of the range as data.
    pub fn allocation(&self, offset: u64, len: u64, max_spans: usize) -> Vec<Span> {
        let end = offset.saturating_add(len);
        let mut spans = Vec::new();
        if len == 0 {
            return spans;
        }
        if self.kind == BackingKind::BlockDevice {
            spans.push(Span { len, hole: false });
            return spans;
        }
        let push = |spans: &mut Vec<Span>, len: u64, hole: bool| match spans.last_mut() {
            Some(last) if last.hole == hole => last.len += len,
            _ => spans.push(Span { len, hole }),
        };
        let mut pos = offset;
        while pos < end && spans.len() < max_spans.max(1) {
            let data = match self.seek(pos, libc::SEEK_DATA) {
                Ok(d) => d.min(end),
                // No data at or after `pos`: a hole to the end of the file and beyond.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => end,
                Err(_) => break,
            };
            if data > pos {
                push(&mut spans, data - pos, true);
                pos = data;
                if pos >= end || spans.len() >= max_spans.max(1) {
                    break;
                }
            }
            // `pos` is data: it runs to the next hole (there is always one at the end of
            // the file).
            let hole = match self.seek(pos, libc::SEEK_HOLE) {
                Ok(h) if h > pos => h.min(end),
                _ => break,
            };
            push(&mut spans, hole - pos, false);
            pos = hole;
        }
        // Only an error or an odd answer stops the walk before the cap: the rest is data.
        if pos < end && spans.len() < max_spans.max(1) {
            push(&mut spans, end - pos, false);
        }
        spans
    }

    fn seek(&self, offset: u64, whence: i32) -> io::Result<u64> {
        let Ok(at) = libc::off_t::try_from(offset) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: lseek has no memory-safety preconditions. The file offset it moves is
        // shared by no one: every read and write here is positioned.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), at, whence) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as u64)
    }

    /// Hints that a range will be read soon (NBD_CMD_CACHE).
    pub fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: posix_fadvise has no memory-safety preconditions.
        let rc = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as i64,
                len as i64,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate has no memory-safety preconditions.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn is_aligned(ptr: *const u8, len: usize) -> bool {
    (ptr as usize).is_multiple_of(DIRECT_ALIGN) && len.is_multiple_of(512)
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

fn blockdev_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we pass.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn blockdev_logical_block(file: &File) -> io::Result<u32> {
    let mut sz: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer we pass.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sz as *mut libc::c_int) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sz as u32)
}

// From <linux/fs.h>: _IOR(0x12, 114, size_t) and _IO(0x12, 104).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tandem-storage-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    fn opts(path: &Path, size: Option<u64>, direct: bool) -> OpenOptions {
        OpenOptions {
            path: path.to_path_buf(),
            size,
            direct,
            read_only: false,
        }
    }

    #[test]
    fn cached_reads_return_the_data_or_decline() {
        let p = tmp("cached");
        let b = Backing::open(&opts(&p, Some(1 << 20), false)).unwrap();
        b.write_at(&[9u8; 8192], 4096).unwrap();
        let mut r = vec![0u8; 8192];
        // Just written: in the page cache.
        assert!(b.read_cached(&mut r, 4096).unwrap());
        assert!(r.iter().all(|&x| x == 9));
        b.sync_data().unwrap();
        // Evicted (where the file system honours it): declined, and a normal read works.
        let rc =
            unsafe { libc::posix_fadvise(b.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        let mut r = vec![0u8; 8192];
        if b.read_cached(&mut r, 4096).unwrap() {
            assert!(
                r.iter().all(|&x| x == 9),
                "a cached read returned wrong bytes"
            );
        } else {
            b.read_at(&mut r, 4096).unwrap();
            assert!(r.iter().all(|&x| x == 9));
        }
        // Past the end is an error, not zeroes.
        assert!(b.read_cached(&mut r, (1 << 20) - 4096).is_err());
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn creates_sparse_and_round_trips() {
        let p = tmp("rt");
        let b = Backing::open(&opts(&p, Some(1 << 20), false)).unwrap();
        assert_eq!(b.size(), 1 << 20);
        b.write_at(&[7u8; 4096], 8192).unwrap();
        let mut r = vec![0u8; 4096];
        b.read_at(&mut r, 8192).unwrap();
        assert!(r.iter().all(|&x| x == 7));
        b.sync_data().unwrap();
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn missing_file_without_size_is_an_error() {
        let p = tmp("nosize");
        assert!(matches!(
            Backing::open(&opts(&p, None, false)),
            Err(StorageError::MissingSize { .. })
        ));
    }

    #[test]
    fn size_mismatch_is_refused() {
        let p = tmp("mismatch");
        drop(Backing::open(&opts(&p, Some(1 << 20), false)).unwrap());
        assert!(matches!(
            Backing::open(&opts(&p, Some(2 << 20), false)),
            Err(StorageError::SizeMismatch { .. })
        ));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn second_open_is_locked_out() {
        let p = tmp("lock");
        let _a = Backing::open(&opts(&p, Some(1 << 20), false)).unwrap();
        assert!(matches!(
            Backing::open(&opts(&p, None, false)),
            Err(StorageError::Locked { .. })
        ));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn zeroes_and_trim_read_back_as_zero() {
        let p = tmp("zero");
        let b = Backing::open(&opts(&p, Some(1 << 20), false)).unwrap();
        b.write_at(&[9u8; 65536], 0).unwrap();
        b.write_zeroes(0, 4096, true, false).unwrap();
        b.write_zeroes(4096, 4096, false, false).unwrap();
        b.trim(8192, 4096).unwrap();
        let mut r = vec![1u8; 65536];
        b.read_at(&mut r, 0).unwrap();
        assert!(r[..8192].iter().all(|&x| x == 0));
        assert!(r[12288..].iter().all(|&x| x == 9));
        std::fs::remove_file(&p).unwrap();
    }

    /// Whether the file system under the temporary directory reports holes (tmpfs, ext4,
    /// xfs, btrfs do); elsewhere everything is data, which `allocation` must say instead.
    /// Asked of a file not yet written.
    fn reports_holes(b: &Backing) -> bool {
        b.seek(0, libc::SEEK_HOLE).is_ok_and(|h| h == 0)
    }

    #[test]
    fn allocation_maps_data_and_holes_of_a_sparse_file() {
        let p = tmp("alloc");
        let size = 16u64 << 20;
        let b = Backing::open(&opts(&p, Some(size), false)).unwrap();
        let holes = reports_holes(&b);
        // Data at 1 MiB (64 KiB) and 8 MiB (1 MiB), the rest never written.
        b.write_at(&[1u8; 65536], 1 << 20).unwrap();
        b.write_at(&vec![2u8; 1 << 20], 8 << 20).unwrap();
        let map = b.allocation(0, size, 64);
        let total: u64 = map.iter().map(|s| s.len).sum();
        assert_eq!(total, size, "{map:?}");
        // Written bytes are always data.
        let mut at = 0;
        for s in &map {
            for (start, len) in [(1u64 << 20, 65536u64), (8 << 20, 1 << 20)] {
                let overlaps = at < start + len && start < at + s.len;
                assert!(!(overlaps && s.hole), "written data in a hole: {map:?}");
            }
            at += s.len;
        }
        if holes {
            let hole = |len| Span { len, hole: true };
            let data = |len| Span { len, hole: false };
            assert_eq!(
                map,
                vec![
                    hole(1 << 20),
                    data(65536),
                    hole((7 << 20) - 65536),
                    data(1 << 20),
                    hole(7 << 20),
                ]
            );
            // A range starting inside data, ending inside a hole.
            assert_eq!(
                b.allocation((1 << 20) + 4096, 65536, 64),
                vec![data(65536 - 4096), hole(4096)]
            );
            // A punched range becomes a hole again.
            b.trim(8 << 20, 1 << 20).unwrap();
            assert_eq!(b.allocation(4 << 20, 8 << 20, 64), vec![hole(8 << 20)]);
        } else {
            eprintln!("the temporary directory's file system reports no holes; data only");
        }
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn allocation_stops_after_the_cap() {
        let p = tmp("alloc-cap");
        let b = Backing::open(&opts(&p, Some(1 << 20), false)).unwrap();
        let holes = reports_holes(&b);
        // Every other 64 KiB written: 16 spans over the file.
        for i in (0..16u64).step_by(2) {
            b.write_at(&[3u8; 65536], i * 65536).unwrap();
        }
        let map = b.allocation(0, 1 << 20, 3);
        assert!(!map.is_empty() && map.len() <= 3, "{map:?}");
        assert!(!map[0].hole, "{map:?}");
        let total: u64 = map.iter().map(|s| s.len).sum();
        if holes {
            assert_eq!(total, 3 * 65536, "{map:?}");
        } else {
            assert_eq!(
                map,
                vec![Span {
                    len: 1 << 20,
                    hole: false
                }]
            );
        }
        // An empty range has no map.
        assert!(b.allocation(4096, 0, 3).is_empty());
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn direct_io_with_unaligned_buffers() {
        let p = tmp("direct");
        let b = match Backing::open(&opts(&p, Some(1 << 20), true)) {
            Ok(b) => b,
            // tmpfs has no O_DIRECT; nothing to test there.
            Err(StorageError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                return
            }
            Err(e) => panic!("{e}"),
        };
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        b.write_at(&data[..4096], 4096).unwrap();
        let mut r = vec![0u8; 4097];
        b.read_at(&mut r[1..], 4096).unwrap();
        assert_eq!(&r[1..], &data[..4096]);
        std::fs::remove_file(&p).unwrap();
    }
}
