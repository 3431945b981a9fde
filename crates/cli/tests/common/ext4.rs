//! A real filesystem on an NBD export: nbdfuse exposes the export as a file, a loop device
//! makes it a block device, ext4 goes on top. Each piece is undone on drop, so a failing test
//! leaves no mount, loop device or FUSE process behind.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::*;

pub const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// The tools these helpers run.
pub const TOOLS: &[&str] = &[
    "nbdfuse",
    "fusermount3",
    "losetup",
    "mkfs.ext4",
    "e2fsck",
    "mount",
    "umount",
];

/// True if this machine can run the helpers (root, /dev/fuse, the loop driver, the tools);
/// otherwise records a skip naming what is missing.
pub fn require_ext4_on_nbdfuse(test: &str) -> bool {
    if !is_root() {
        skip(test, "needs root (loop devices, mount)");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        skip(test, "no /dev/fuse");
        return false;
    }
    if !Path::new("/dev/loop-control").exists() {
        skip(test, "no /dev/loop-control (loop driver not available)");
        return false;
    }
    require_tools(test, TOOLS)
}

/// nbdfuse serving the export as `<mountpoint>/disk`; unmounted and reaped on drop.
pub struct Nbdfuse {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Nbdfuse {
    /// Starts nbdfuse on `uri` and waits until the file shows `size` bytes.
    pub fn start(dir: &TestDir, n: usize, uri: &str, size: u64) -> Nbdfuse {
        let mountpoint = dir.join(format!("fuse{n}"));
        fs::create_dir_all(&mountpoint).unwrap();
        let file = mountpoint.join("disk");
        let log = dir.join(format!("nbdfuse{n}.log"));
        let out = File::create(&log).unwrap();
        let child = tool("nbdfuse")
            .arg(&file)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting nbdfuse");
        let mut fuse = Nbdfuse {
            child,
            mountpoint,
            log,
        };
        let up = wait_until(Duration::from_secs(10), || {
            fs::metadata(&file).is_ok_and(|m| m.len() == size)
        });
        if !up {
            let status = fuse.child.try_wait().ok().flatten();
            panic!(
                "nbdfuse did not show {} with {size} bytes within 10 s (exit status {status:?}); nbdfuse log:\n{}",
                file.display(),
                fs::read_to_string(&fuse.log).unwrap_or_default()
            );
        }
        fuse
    }

    pub fn file(&self) -> PathBuf {
        self.mountpoint.join("disk")
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// SIGKILL to nbdfuse, for a client whose server died: the kernel aborts the FUSE
    /// connection, so whatever still uses the file (a loop device, a filesystem on it) gets
    /// errors at once instead of waiting on a dead export. The FUSE mount itself goes on drop.
    pub fn abort(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nbdfuse {
    fn drop(&mut self) {
        // The loop device lets go of the file asynchronously, so the first tries may find the
        // mount busy.
        for _ in 0..50 {
            if !is_mounted(&self.mountpoint)
                || cleanup(tool("fusermount3").arg("-u").arg(&self.mountpoint))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Still busy (a loop device that never let go): detach it lazily, never leave it.
        if is_mounted(&self.mountpoint) {
            cleanup(tool("fusermount3").arg("-uz").arg(&self.mountpoint));
        }
        if std::thread::panicking() {
            eprintln!(
                "---- nbdfuse log ----\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// A loop device over a file; detached on drop.
pub struct LoopDevice(pub String);

impl LoopDevice {
    /// An error if this machine cannot set up loop devices at all.
    pub fn attach(file: &Path) -> Result<LoopDevice, String> {
        let run = run(
            tool("losetup").args(["--find", "--show"]).arg(file),
            CMD_TIMEOUT,
        );
        if !run.success() {
            return Err(run.describe());
        }
        let dev = run.stdout.trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        Ok(LoopDevice(dev))
    }
}

impl LoopDevice {
    /// True while the kernel still has this loop device bound to a file (a device detached
    /// while in use is unbound only once its last user lets go).
    pub fn bound(name: &str) -> bool {
        let dev = name.trim_start_matches("/dev/");
        Path::new("/sys/block")
            .join(dev)
            .join("loop/backing_file")
            .exists()
    }
}

impl AsRef<Path> for LoopDevice {
    fn as_ref(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        cleanup(tool("losetup").arg("-d").arg(&self.0));
    }
}

/// An ext4 mount; unmounted on drop (lazily if it is busy).
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn new(dev: &LoopDevice, at: PathBuf) -> Mount {
        fs::create_dir_all(&at).unwrap();
        run(
            tool("mount").args(["-t", "ext4"]).arg(&dev.0).arg(&at),
            CMD_TIMEOUT,
        )
        .expect_success();
        Mount(at)
    }

    /// A read-only mount that replays no journal (`-o ro,noload`): looks at a replica's
    /// backing file without writing to it.
    pub fn read_only(dev: &LoopDevice, at: PathBuf) -> Mount {
        fs::create_dir_all(&at).unwrap();
        run(
            tool("mount")
                .args(["-t", "ext4", "-o", "ro,noload"])
                .arg(&dev.0)
                .arg(&at),
            CMD_TIMEOUT,
        )
        .expect_success();
        Mount(at)
    }

    /// Detaches the mount at once (`umount -l`), for a filesystem whose device is gone: the
    /// kernel lets go of the device once nothing uses the filesystem any more.
    pub fn detach(self) {
        let lazily = cleanup(tool("umount").arg("-l").arg(&self.0));
        assert!(
            lazily || !is_mounted(&self.0),
            "umount -l {} failed",
            self.0.display()
        );
        std::mem::forget(self);
    }

    /// Unmounts now, checking that it worked.
    pub fn unmount(self) {
        run(tool("umount").arg(&self.0), CMD_TIMEOUT).expect_success();
        std::mem::forget(self);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !cleanup(tool("umount").arg(&self.0)) {
            cleanup(tool("umount").arg("-l").arg(&self.0));
        }
    }
}

/// True if something is mounted at `path` (in this mount namespace).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(table) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    // The fifth field is the mount point, with blanks escaped (`\040`); ours have none.
    let want = path.to_string_lossy();
    table
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_ref()))
}

/// `mkfs.ext4 -q -F` on the device.
pub fn mkfs(dev: &LoopDevice) {
    run(
        tool("mkfs.ext4").args(["-q", "-F"]).arg(&dev.0),
        CMD_TIMEOUT,
    )
    .expect_success();
}

/// FNV-1a, recorded next to the files so a reader of a leftover image can check them too.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `e2fsck -fn` on a device or an image file: forced, read-only, must find nothing.
#[track_caller]
pub fn fsck(dev: impl AsRef<Path>) {
    let r = run(tool("e2fsck").arg("-fn").arg(dev.as_ref()), CMD_TIMEOUT);
    assert!(r.success(), "e2fsck -fn found problems: {}", r.describe());
}
