//! A real disk error under a replica: beta's backing file is an NBD export of nbdkit's
//! file plugin behind its `error` filter, turned into a file by nbdfuse. While a trigger
//! file exists every request to it fails with EIO (this kernel has no device-mapper, so no
//! dm-error). The replica must detach (Diskless), the Primary go on with alpha and lose
//! nothing, and know beta lacks what it missed.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use common::cluster::*;
use common::*;

const SIZE: u64 = 64 * MIB;

/// nbdkit with the error filter, mounted as a file by nbdfuse; unmounted and stopped on
/// drop.
struct FailingDisk {
    nbdkit: Child,
    fuse: Child,
    mount: PathBuf,
    trigger: PathBuf,
}

impl FailingDisk {
    fn start(dir: &TestDir) -> FailingDisk {
        let image = dir.join("failing.img");
        sparse_file(&image, SIZE);
        let sock = dir.join("failing.sock");
        let trigger = dir.join("trigger");
        let mount = dir.join("fuse");
        std::fs::create_dir_all(&mount).unwrap();
        let nbdkit = tool("nbdkit")
            .args(["-U"])
            .arg(&sock)
            .args(["-f", "--filter=error", "file"])
            .arg(&image)
            .args(["error=EIO", "error-rate=100%"])
            .arg(format!("error-file={}", trigger.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit starts");
        assert!(
            wait_until(Duration::from_secs(10), || sock.exists()),
            "nbdkit's socket"
        );
        let fuse = tool("nbdfuse")
            .arg(&mount)
            .arg("--unix")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdfuse starts");
        let file = mount.join("nbd");
        assert!(
            wait_until(Duration::from_secs(10), || std::fs::metadata(&file)
                .is_ok_and(|m| m.len() == SIZE)),
            "nbdfuse's file"
        );
        FailingDisk {
            nbdkit,
            fuse,
            mount,
            trigger,
        }
    }

    fn file(&self) -> PathBuf {
        self.mount.join("nbd")
    }

    fn fail(&self) {
        std::fs::write(&self.trigger, b"").unwrap();
    }

    fn heal(&self) {
        let _ = std::fs::remove_file(&self.trigger);
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        self.heal();
        for (cmd, args) in [("fusermount3", &["-u"][..]), ("umount", &[][..])] {
            let _ = Command::new(cmd)
                .args(args)
                .arg(&self.mount)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.fuse.kill();
        let _ = self.fuse.wait();
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }
}

#[test]
fn a_replica_whose_disk_fails_detaches_and_nothing_is_lost() {
    const TEST: &str = "disk_errors::a_replica_whose_disk_fails_detaches_and_nothing_is_lost";
    if !is_root() {
        return skip(TEST, "needs root for FUSE mounts");
    }
    if !require_tools(TEST, &["nbdkit", "nbdfuse"]) {
        return;
    }
    let scratch = TestDir::new(TEST);
    let disk = FailingDisk::start(&scratch);
    let failing = disk.file().display().to_string();
    // Beta's replica is the failing disk; alpha's exists too (an empty file, made before
    // its daemon starts), so both start Outdated and alpha is declared current by hand.
    let tweak = move |node: &str, text: String| {
        let disk_line = |who: &str| {
            text.lines()
                .find(|l| l.contains("disk = ") && l.contains(&format!("/{who}/")))
                .map(str::to_string)
                .unwrap_or_else(|| panic!("{who}'s disk line"))
        };
        if node == "alpha" {
            let line = disk_line("alpha");
            let path = line.split('"').nth(1).expect("a quoted path");
            sparse_file(std::path::Path::new(path), SIZE);
        }
        // The failing disk cannot grow: beta's metadata goes to a file of its own.
        let beta = disk_line("beta");
        let beta_path = beta.split('"').nth(1).expect("a quoted path").to_string();
        text.replace(
            &beta,
            &format!("  disk = \"{failing}\"\n  meta-disk = \"{beta_path}.md\""),
        )
    };
    let specs = [ALPHA, BETA];
    let mut setup = Setup::new("C", &specs);
    setup.tweak = &tweak;
    setup.size = SIZE;
    let mut c = Cluster::start_with(TEST, setup);
    c.node("alpha")
        .daemon
        .admin(&["primary", RESOURCE, "--force"])
        .expect_success();
    c.wait_in_sync(SYNC_TIMEOUT);

    let first = random_bytes(0xd15c, MIB as usize);
    let mut client = Nbd::go(Conn::unix(&c.node("alpha").nbd), RESOURCE, false);
    client.write(0, &first);
    client.flush();

    disk.fail();
    let second = random_bytes(0xdead, MIB as usize);
    client.write(MIB, &second);
    client.flush();
    drop(client);

    c.wait_for("beta detached", Duration::from_secs(10), |statuses| {
        let beta = &statuses.iter().find(|(n, _)| *n == "beta").unwrap().1;
        let disk = str_of(&arr_of(beta, "volumes")[0], "disk").to_string();
        if disk != "Diskless" {
            return Err(format!("beta's disk is {disk}"));
        }
        let alpha = &statuses.iter().find(|(n, _)| *n == "alpha").unwrap().1;
        let peer = peer_of(alpha, "beta").ok_or("alpha lists no peer beta")?;
        let oos = num_of(&arr_of(peer, "volumes")[0], "out_of_sync_kib").unwrap_or(0);
        if oos < 1024 {
            return Err(format!("alpha knows beta lacks {oos} KiB"));
        }
        Ok(())
    });
    let log = c.node("beta").daemon.log();
    assert!(
        log.contains("local replica failed"),
        "beta's log names the failure\n{log}"
    );
    // The disk works again: beta stays detached until it restarts.
    disk.heal();
    thread::sleep(Duration::from_millis(500));
    let beta = c.node("beta").status();
    assert_eq!(str_of(&arr_of(&beta, "volumes")[0], "disk"), "Diskless");
    // Nothing acknowledged was lost: alpha holds both writes.
    let alpha_disk = &c.node("alpha").disk;
    assert_same_data(
        "the first write on alpha",
        &first,
        &read_at(alpha_disk, 0, first.len()),
    );
    assert_same_data(
        "the write after beta's disk failed, on alpha",
        &second,
        &read_at(alpha_disk, MIB, second.len()),
    );
    c.stop_all();
}
