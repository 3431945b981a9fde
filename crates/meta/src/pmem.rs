//! Metadata on persistent memory: the metadata file is mapped, a write is a copy into the
//! mapping plus a write-back of the touched cache lines and one store fence. No syscall on
//! the write path when the mapping is DAX (`MAP_SYNC`: the filesystem guarantees that the
//! mapping's blocks are allocated and its metadata durable, so a flushed cache line is
//! durable).
//!
//! Without DAX (tmpfs, ext4 without `dax`) the mapping is an ordinary shared mapping of
//! the page cache; `NonDax` says what `sync` does then. On other architectures than x86_64
//! no cache-line instructions are used and `sync` is always `msync`.
//!
//! The only `unsafe` of the crate lives here: the mapping, the copies in and out, the
//! cache-line instructions.

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::target::MetaTarget;

/// What to do when the file cannot be mapped with `MAP_SYNC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonDax {
    /// Map it shared and flush cache lines as on pmem, but `sync` does no syscall: this
    /// emulates pmem's latency, not its durability (the data survives a process crash,
    /// not a power loss). For tests and benchmarks on `/dev/shm`.
    Emulate,
    /// Map it shared; `sync` is `msync(MS_SYNC)`: durable, at the cost of a syscall.
    Msync,
    /// Fail with the error `mmap` gave.
    Refuse,
}

/// How dirty cache lines are written back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and evict, weakly ordered.
    ClflushOpt,
    /// `clflush`: write back and evict, serialised.
    Clflush,
    /// No cache-line instructions (not x86_64): `sync` is `msync`.
    None,
}

const CACHE_LINE: usize = 64;

/// A metadata target over a memory-mapped file.
#[derive(Debug)]
pub struct PmemTarget {
    map: NonNull<u8>,
    len: usize,
    path: PathBuf,
    dax: bool,
    non_dax: NonDax,
    flush: Flush,
}

// SAFETY: the mapping belongs to this value alone (unmapped on drop) and holds no
// thread-affine state, so it may move to another thread. It is not `Sync`: `write_at`
// takes `&self`, and two threads writing one range would race.
unsafe impl Send for PmemTarget {}

impl PmemTarget {
    /// Maps the whole file at `path` (which must exist and be non-empty), with `MAP_SYNC`
    /// if the filesystem supports it.
    pub fn open(path: &Path, non_dax: NonDax) -> io::Result<PmemTarget> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.seek(SeekFrom::End(0))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: cannot map {len} bytes", path.display()),
                )
            })?;
        let (map, dax) = map_file(&file, len, non_dax)?;
        // The mapping outlives the descriptor.
        drop(file);
        Ok(PmemTarget {
            map,
            len,
            path: path.to_path_buf(),
            dax,
            non_dax,
            flush: detect_flush(),
        })
    }

    /// Whether the mapping is DAX (`MAP_SYNC` accepted): flushed cache lines are durable.
    pub fn is_dax(&self) -> bool {
        self.dax
    }

    /// The cache-line write-back in use.
    pub fn flush_kind(&self) -> Flush {
        self.flush
    }

    fn check(&self, off: u64, len: usize) -> io::Result<usize> {
        usize::try_from(off)
            .ok()
            .filter(|&o| o.checked_add(len).is_some_and(|end| end <= self.len))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: {len} bytes at offset {off} are beyond the mapping of {} bytes",
                        self.path.display(),
                        self.len
                    ),
                )
            })
    }

    fn msync(&self) -> io::Result<()> {
        // SAFETY: `map..map + len` is our live mapping.
        let rc = unsafe { libc::msync(self.map.as_ptr().cast(), self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl MetaTarget for PmemTarget {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let off = self.check(off, buf.len())?;
        // SAFETY: `check` keeps `off..off + len` inside the mapping; `buf` is ours and
        // cannot overlap it (the mapping is never handed out as a slice).
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), buf.as_mut_ptr(), buf.len());
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let off = self.check(off, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `read_at`; the type is not `Sync`, so no other thread writes here.
        unsafe {
            let dst = self.map.as_ptr().add(off);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, buf.len());
            write_back(self.flush, dst, buf.len());
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        match self.flush {
            // Every write already wrote its lines back and fenced; a fence here orders
            // whatever the caller does next after them.
            Flush::Clwb | Flush::ClflushOpt | Flush::Clflush
                if self.dax || self.non_dax == NonDax::Emulate =>
            {
                fence();
                Ok(())
            }
            _ => self.msync(),
        }
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.len as u64)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for PmemTarget {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once; nothing borrows it past `self`.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.len);
        }
    }
}

fn map_file(file: &std::fs::File, len: usize, non_dax: NonDax) -> io::Result<(NonNull<u8>, bool)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mmap = |flags: libc::c_int| -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), of a file we hold
        // open; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(NonNull::new(p.cast()).expect("mmap does not return null on success"))
    };
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        match mmap(libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC) {
            Ok(p) => return Ok((p, true)),
            // Not DAX: the filesystem refuses MAP_SYNC.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
                    && non_dax != NonDax::Refuse => {}
            Err(e) => return Err(e),
        }
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    if non_dax == NonDax::Refuse {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "pmem with MAP_SYNC is supported on x86_64 Linux only",
        ));
    }
    Ok((mmap(libc::MAP_SHARED)?, false))
}

#[cfg(target_arch = "x86_64")]
fn detect_flush() -> Flush {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // The intrinsics are safe functions on newer toolchains and unsafe on older ones.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86_64 CPU; leaf 7 is read only if leaf 0 says it exists.
    let ebx = unsafe {
        if __cpuid(0).eax >= 7 {
            __cpuid_count(7, 0).ebx
        } else {
            0
        }
    };
    if ebx & (1 << 24) != 0 {
        Flush::Clwb
    } else if ebx & (1 << 23) != 0 {
        Flush::ClflushOpt
    } else {
        Flush::Clflush
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_flush() -> Flush {
    Flush::None
}

/// Writes back every cache line of `ptr..ptr + len`, then fences.
///
/// # Safety
/// `ptr..ptr + len` must be mapped memory; `flush` must be what `detect_flush` returned.
unsafe fn write_back(flush: Flush, ptr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let first = ptr as usize & !(CACHE_LINE - 1);
        let end = ptr as usize + len;
        for line in (first..end).step_by(CACHE_LINE) {
            let p = line as *const u8;
            // SAFETY: `p` is in a line that overlaps the caller's mapped range, hence
            // mapped (mappings are whole pages); the instruction was detected on this CPU.
            unsafe {
                match flush {
                    Flush::Clwb => {
                        std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    Flush::ClflushOpt => {
                        std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    Flush::Clflush => std::arch::x86_64::_mm_clflush(p),
                    Flush::None => {}
                }
            }
        }
        fence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (flush, ptr, len);
}

fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SFENCE has no memory operands and exists on every x86_64 CPU (SSE); newer
    // toolchains make the intrinsic safe, hence the allow.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
