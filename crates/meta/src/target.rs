//! Where metadata bytes go. The store only ever reads and writes whole, 4 KiB-aligned
//! blocks, so a target over an `O_DIRECT` file needs no read-modify-write (it still needs
//! memory-aligned buffers: the store's are plain `Vec`s, a direct target copies through
//! its own aligned buffer).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A file or device holding metadata.
pub trait MetaTarget {
    /// Fills `buf` from `off`; a short read is an error.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Writes all of `buf` at `off`.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Writes all of `buf` at `off` and makes that write durable (a target may leave
    /// other writes as they are: internal metadata does not flush the volume's data).
    fn write_durable_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.write_at(buf, off)?;
        self.sync()
    }
    /// Bytes the target holds (the superblock's offsets are checked against it).
    fn size(&self) -> io::Result<u64>;
    /// Names the target in errors, e.g. its path.
    fn describe(&self) -> String;
}

/// Metadata in a regular file or block device, with buffered IO.
#[derive(Debug)]
pub struct FileTarget {
    file: File,
    path: PathBuf,
}

impl FileTarget {
    /// Opens an existing file or device for reading and writing.
    pub fn open(path: &Path) -> io::Result<FileTarget> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(FileTarget::from_file(file, path))
    }

    /// Opens an existing file or device for reading only (`dump-md` and `show-gi`): a write
    /// through it fails.
    pub fn open_read_only(path: &Path) -> io::Result<FileTarget> {
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(FileTarget::from_file(file, path))
    }

    /// Creates a new sparse file of `size` bytes, e.g. for external metadata of the size
    /// `Layout::required_external_size` gives. Fails if `path` exists: metadata is never
    /// truncated behind the operator's back (reinitialise an existing file with `open`
    /// and `MetaStore::create`).
    pub fn create(path: &Path, size: u64) -> io::Result<FileTarget> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(size)?;
        Ok(FileTarget::from_file(file, path))
    }

    /// Wraps a file already open for reading and writing.
    pub fn from_file(file: File, path: &Path) -> FileTarget {
        FileTarget {
            file,
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl MetaTarget for FileTarget {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.file.write_all_at(buf, off)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        // A block device reports length 0 in its metadata; seeking to the end works for both.
        (&self.file).seek(SeekFrom::End(0))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

impl<T: MetaTarget + ?Sized> MetaTarget for &T {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        (**self).read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        (**self).write_at(buf, off)
    }

    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }

    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}
