//! A real filesystem on a tandem export: nbdfuse exposes the export as a file, a loop device
//! makes it a block device, ext4 goes on top. The files must survive unmounting, a server
//! restart and a strict fsck.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const TEST: &str = "filesystem::ext4_on_nbdfuse_loop_device";
const SIZE: u64 = 128 * MIB;
const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a cleanup command without panicking (a panic inside a drop during a failing test
/// would abort the whole test binary).
fn cleanup(cmd: &mut Command) -> bool {
    let Ok(mut child) = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    match wait_timeout(&mut child, Duration::from_secs(30)) {
        Some(status) => status.success(),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            false
        }
    }
}

/// nbdfuse serving the export as `<mountpoint>/disk`; unmounted and reaped on drop.
struct Nbdfuse {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Nbdfuse {
    fn start(dir: &TestDir, n: usize, uri: &str) -> Nbdfuse {
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
            fs::metadata(&file).is_ok_and(|m| m.len() == SIZE)
        });
        if !up {
            let status = fuse.child.try_wait().ok().flatten();
            panic!(
                "nbdfuse did not show {} with {SIZE} bytes within 10 s (exit status {status:?}); nbdfuse log:\n{}",
                file.display(),
                fs::read_to_string(&fuse.log).unwrap_or_default()
            );
        }
        fuse
    }

    fn file(&self) -> PathBuf {
        self.mountpoint.join("disk")
    }
}

impl Drop for Nbdfuse {
    fn drop(&mut self) {
        // The loop device lets go of the file asynchronously, so the first tries may find the
        // mount busy.
        for _ in 0..50 {
            if cleanup(tool("fusermount3").arg("-u").arg(&self.mountpoint)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
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
struct LoopDevice(String);

impl LoopDevice {
    /// An error if this machine cannot set up loop devices at all.
    fn attach(file: &Path) -> Result<LoopDevice, String> {
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

impl Drop for LoopDevice {
    fn drop(&mut self) {
        cleanup(tool("losetup").arg("-d").arg(&self.0));
    }
}

struct Mount(PathBuf);

impl Mount {
    fn new(dev: &LoopDevice, at: PathBuf) -> Mount {
        fs::create_dir_all(&at).unwrap();
        run(
            tool("mount").args(["-t", "ext4"]).arg(&dev.0).arg(&at),
            CMD_TIMEOUT,
        )
        .expect_success();
        Mount(at)
    }

    /// Unmounts now, checking that it worked.
    fn unmount(self) {
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

/// FNV-1a, recorded next to the files so a reader of a leftover image can check them too.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn fsck(dev: &LoopDevice) {
    let r = run(tool("e2fsck").arg("-fn").arg(&dev.0), CMD_TIMEOUT);
    assert!(r.success(), "e2fsck -fn found problems: {}", r.describe());
}

#[test]
fn ext4_on_nbdfuse_loop_device() {
    if !is_root() {
        skip(TEST, "needs root (loop devices, mount)");
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        skip(TEST, "no /dev/fuse");
        return;
    }
    if !Path::new("/dev/loop-control").exists() {
        skip(TEST, "no /dev/loop-control (loop driver not available)");
        return;
    }
    if !require_tools(
        TEST,
        &[
            "nbdfuse",
            "fusermount3",
            "losetup",
            "mkfs.ext4",
            "e2fsck",
            "mount",
            "umount",
        ],
    ) {
        return;
    }

    let dir = TestDir::new(TEST);
    let backing = dir.join("disk.img");
    sparse_file(&backing, SIZE);
    let mut server = Server::builder(&dir).export("disk", &backing).start();

    let files: Vec<(String, Vec<u8>)> = [
        1usize,
        511,
        4096,
        4097,
        65_537,
        MIB as usize,
        3 * MIB as usize + 17,
        8 * MIB as usize,
    ]
    .iter()
    .enumerate()
    .map(|(i, &len)| {
        (
            format!("f{i}-{len}.bin"),
            random_bytes(1000 + i as u64, len),
        )
    })
    .collect();

    {
        let fuse = Nbdfuse::start(&dir, 0, &server.uri("disk"));
        let dev = match LoopDevice::attach(&fuse.file()) {
            Ok(dev) => dev,
            Err(e) => {
                skip(
                    TEST,
                    &format!(
                        "cannot set up a loop device here: {}",
                        e.lines().last().unwrap_or("")
                    ),
                );
                return;
            }
        };
        run(
            tool("mkfs.ext4").args(["-q", "-F"]).arg(&dev.0),
            CMD_TIMEOUT,
        )
        .expect_success();
        let mnt = Mount::new(&dev, dir.join("mnt0"));
        fs::create_dir(mnt.0.join("sub")).unwrap();
        let mut manifest = String::new();
        for (name, data) in &files {
            let mut f = File::create(mnt.0.join("sub").join(name)).unwrap();
            f.write_all(data).unwrap();
            f.sync_all().unwrap();
            manifest.push_str(&format!("{:016x} {name}\n", checksum(data)));
        }
        fs::write(mnt.0.join("MANIFEST"), &manifest).unwrap();
        mnt.unmount();
        fsck(&dev);
    }

    // A new server process reading the same file: everything must have reached it.
    server.stop(Duration::from_secs(10));
    let server = Server::builder(&dir).export("disk", &backing).start();

    let fuse = Nbdfuse::start(&dir, 1, &server.uri("disk"));
    let dev =
        LoopDevice::attach(&fuse.file()).unwrap_or_else(|e| panic!("second losetup failed: {e}"));
    fsck(&dev);
    let mnt = Mount::new(&dev, dir.join("mnt1"));
    let manifest =
        fs::read_to_string(mnt.0.join("MANIFEST")).expect("MANIFEST missing after remount");
    assert_eq!(
        manifest.lines().count(),
        files.len(),
        "MANIFEST:\n{manifest}"
    );
    let mut names: Vec<String> = fs::read_dir(mnt.0.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    want.sort();
    assert_eq!(names, want, "files after remount");
    for (name, data) in &files {
        let got = fs::read(mnt.0.join("sub").join(name)).unwrap();
        assert!(
            manifest.contains(&format!("{:016x} {name}", checksum(&got))),
            "checksum of {name} does not match MANIFEST"
        );
        assert_same_data(&format!("{name} after remount"), data, &got);
    }
    mnt.unmount();
    fsck(&dev);
}
