//! Scratch directories for the tests (under /tmp, or /dev/shm for pmem), removed on drop.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct Scratch(PathBuf);

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Scratch {
    /// A fresh directory under `base` named after the test.
    pub fn new_in(base: &str, tag: &str) -> Scratch {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = Path::new(base).join(format!("tandem-meta-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    pub fn new(tag: &str) -> Scratch {
        Scratch::new_in("/tmp", tag)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
