//! Threads for disk operations that would stall the event loop: fdatasync, O_DIRECT reads
//! and writes, and zeroing or trimming of large ranges.

use crate::bufpool::DataBuf;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::Arc;
use tandem_engine::{DiskKind, IoError};
use tandem_storage::{Backing, ZeroError};

/// A disk operation for a worker. `tag` is the driver's own name for it, returned with
/// the completion.
pub struct Job<T> {
    pub tag: T,
    pub backing: Arc<Backing>,
    pub kind: DiskKind,
    /// Payload for writes, destination for reads.
    pub buf: Option<DataBuf>,
    /// A flush: further stores it covers (a node's other volumes). It fails if any fails.
    pub also: Vec<Arc<Backing>>,
}

pub struct Done<T> {
    pub tag: T,
    pub kind: DiskKind,
    pub result: Result<(), IoError>,
    pub buf: Option<DataBuf>,
}

pub struct Workers<T> {
    jobs: Sender<Job<T>>,
    pub done: Receiver<Done<T>>,
}

impl<T: Send + 'static> Workers<T> {
    pub fn start(threads: usize, waker: Arc<mio::Waker>) -> Workers<T> {
        // One queue all workers wait on, each parked on its own: a job wakes one thread
        // (a mutex around a std receiver woke a second one for every job, to hand the
        // lock on; measured as twice the context switches on 2 cores).
        let (job_tx, job_rx) = unbounded::<Job<T>>();
        let (done_tx, done_rx) = unbounded::<Done<T>>();
        for i in 0..threads {
            let job_rx = job_rx.clone();
            let done_tx = done_tx.clone();
            let waker = Arc::clone(&waker);
            std::thread::Builder::new()
                .name(format!("tandem-disk-{i}"))
                .spawn(move || loop {
                    let job = match job_rx.recv() {
                        Ok(job) => job,
                        Err(_) => return, // the reactor is gone
                    };
                    let mut buf = job.buf;
                    let mut result = execute(&job.backing, job.kind, buf.as_deref_mut());
                    for b in &job.also {
                        let r = execute(b, job.kind, None);
                        result = result.and(r);
                    }
                    if done_tx
                        .send(Done {
                            tag: job.tag,
                            kind: job.kind,
                            result,
                            buf,
                        })
                        .is_err()
                    {
                        return;
                    }
                    let _ = waker.wake();
                })
                .expect("spawning a disk worker thread");
        }
        Workers {
            jobs: job_tx,
            done: done_rx,
        }
    }

    pub fn submit(&self, job: Job<T>) {
        self.jobs
            .send(job)
            .unwrap_or_else(|_| panic!("all disk workers exited"));
    }
}

/// The engine's error for a failed system call (EIO when the error carries no errno).
pub fn os_error(e: std::io::Error) -> IoError {
    IoError::Os(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Runs one disk operation. Used by the workers and, for operations cheap enough to run
/// inline, by the event loop itself.
pub fn execute(backing: &Backing, kind: DiskKind, buf: Option<&mut [u8]>) -> Result<(), IoError> {
    match kind {
        DiskKind::Read { offset, .. } => backing
            .read_at(buf.expect("read without a buffer"), offset)
            .map_err(os_error),
        DiskKind::Write { offset, .. } => backing
            .write_at(buf.expect("write without a payload"), offset)
            .map_err(os_error),
        DiskKind::Trim { offset, len } => backing.trim(offset, u64::from(len)).map_err(os_error),
        DiskKind::Zero {
            offset,
            len,
            may_punch,
            fast,
        } => backing
            .write_zeroes(offset, u64::from(len), may_punch, fast)
            .map_err(|e| match e {
                ZeroError::NotFast => IoError::NotFast,
                ZeroError::Io(e) => os_error(e),
            }),
        DiskKind::Cache { offset, len } => backing.cache(offset, u64::from(len)).map_err(os_error),
        DiskKind::Flush => backing.sync_data().map_err(os_error),
        // Made on the event loop (`NodeReactor::allocation`: bounded, and its result is a
        // number of extents this answer has no room for). A peer's request must never
        // panic a node: refused.
        DiskKind::Allocation { .. } => Err(IoError::Os(libc::EINVAL)),
    }
}
