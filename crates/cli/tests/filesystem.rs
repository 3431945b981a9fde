//! A real filesystem on a tandem export: nbdfuse exposes the export as a file, a loop device
//! makes it a block device, ext4 goes on top. The files must survive unmounting, a server
//! restart and a strict fsck.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::time::Duration;

use common::ext4::*;
use common::*;

const TEST: &str = "filesystem::ext4_on_nbdfuse_loop_device";
const SIZE: u64 = 128 * MIB;

#[test]
fn ext4_on_nbdfuse_loop_device() {
    if !require_ext4_on_nbdfuse(TEST) {
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
        let fuse = Nbdfuse::start(&dir, 0, &server.uri("disk"), SIZE);
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
        mkfs(&dev);
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

    let fuse = Nbdfuse::start(&dir, 1, &server.uri("disk"), SIZE);
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
