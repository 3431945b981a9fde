//! One volume as its local node sees it.
//!
//! Today a volume has one replica, the local disk. The replication engine extends this same
//! state machine with peers; the driver interface (submit / disk_done / actions) stays.

use crate::flush::FlushBatcher;
use crate::io::{Action, DiskKind, DiskOp, DiskToken, Io, IoError, ReqId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskState {
    UpToDate,
    /// The disk reported a failed flush: the page cache may have dropped writes we
    /// acknowledged, so nothing read or written here can be trusted any more.
    Failed,
}

#[derive(Debug)]
pub struct Volume {
    size: u64,
    read_only: bool,
    disk: DiskState,
    flushes: FlushBatcher,
    /// Requests whose data operation completed but that still wait for a barrier (FUA).
    in_flight: usize,
}

impl Volume {
    pub fn new(size: u64, read_only: bool) -> Volume {
        Volume {
            size,
            read_only,
            disk: DiskState::UpToDate,
            flushes: FlushBatcher::default(),
            in_flight: 0,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn disk_state(&self) -> DiskState {
        self.disk
    }

    /// Requests submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A new application request.
    pub fn submit(&mut self, req: ReqId, io: Io, out: &mut Vec<Action>) {
        self.in_flight += 1;
        if self.disk == DiskState::Failed {
            return self.complete(req, Err(IoError::NoData), out);
        }
        if self.read_only && io.is_write() {
            return self.complete(req, Err(IoError::ReadOnly), out);
        }
        let kind = match io {
            Io::Read { offset, len } => DiskKind::Read { offset, len },
            Io::Write { offset, len, .. } => DiskKind::Write { offset, len },
            Io::Trim { offset, len, .. } => DiskKind::Trim { offset, len },
            Io::Zero {
                offset,
                len,
                may_punch,
                fast,
                ..
            } => DiskKind::Zero {
                offset,
                len,
                may_punch,
                fast,
            },
            Io::Cache { offset, len } => DiskKind::Cache { offset, len },
            Io::Flush => return self.barrier(req, out),
        };
        debug_assert!(match kind {
            DiskKind::Read { offset, len }
            | DiskKind::Write { offset, len }
            | DiskKind::Trim { offset, len }
            | DiskKind::Zero { offset, len, .. }
            | DiskKind::Cache { offset, len }
            | DiskKind::Allocation { offset, len } => offset + u64::from(len) <= self.size,
            DiskKind::Flush => true,
        });
        let barrier_after = io.needs_flush_after();
        out.push(Action::Disk(DiskOp {
            token: DiskToken::Req(req),
            kind,
            barrier_after,
        }));
    }

    /// A disk operation finished. `kind` is the kind the engine issued (drivers echo it back).
    pub fn disk_done(&mut self, op: DiskOp, result: Result<(), IoError>, out: &mut Vec<Action>) {
        match op.token {
            DiskToken::Req(req) => {
                match result {
                    Ok(()) if op.barrier_after => self.barrier(req, out),
                    Ok(()) => self.complete(req, Ok(()), out),
                    // A failed cache hint is not an error the application needs to see.
                    Err(_) if matches!(op.kind, DiskKind::Cache { .. }) => {
                        self.complete(req, Ok(()), out)
                    }
                    Err(e) => self.complete(req, Err(e), out),
                }
            }
            DiskToken::Flush(seq) => {
                if result.is_err() {
                    self.disk = DiskState::Failed;
                }
                let (covered, next) = self.flushes.finished(seq);
                for &req in &covered {
                    self.complete(req, result, out);
                }
                self.flushes.recycle(covered);
                if let Some(seq) = next {
                    out.push(Action::Disk(DiskOp::flush(seq)));
                }
            }
        }
    }

    fn barrier(&mut self, req: ReqId, out: &mut Vec<Action>) {
        if let Some(seq) = self.flushes.request(req) {
            out.push(Action::Disk(DiskOp::flush(seq)));
        }
    }

    fn complete(&mut self, req: ReqId, result: Result<(), IoError>, out: &mut Vec<Action>) {
        debug_assert!(self.in_flight > 0);
        self.in_flight -= 1;
        out.push(Action::Complete { req, result });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_ops(out: &[Action]) -> Vec<DiskOp> {
        out.iter()
            .filter_map(|a| {
                if let Action::Disk(op) = a {
                    Some(*op)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn fua_write_completes_only_after_a_barrier() {
        let mut v = Volume::new(1 << 20, false);
        let mut out = Vec::new();
        v.submit(
            ReqId(1),
            Io::Write {
                offset: 0,
                len: 4096,
                fua: true,
            },
            &mut out,
        );
        let ops = disk_ops(&out);
        assert_eq!(ops.len(), 1);
        out.clear();
        v.disk_done(ops[0], Ok(()), &mut out);
        let ops = disk_ops(&out);
        assert_eq!(
            ops,
            vec![DiskOp::flush(0)],
            "the write must be followed by a flush before completing"
        );
        out.clear();
        v.disk_done(ops[0], Ok(()), &mut out);
        assert_eq!(
            out,
            vec![Action::Complete {
                req: ReqId(1),
                result: Ok(())
            }]
        );
        assert_eq!(v.in_flight(), 0);
    }

    #[test]
    fn failed_flush_fails_the_disk_and_everything_after() {
        let mut v = Volume::new(1 << 20, false);
        let mut out = Vec::new();
        v.submit(ReqId(1), Io::Flush, &mut out);
        let op = disk_ops(&out)[0];
        out.clear();
        v.disk_done(op, Err(IoError::Os(5)), &mut out);
        assert_eq!(
            out,
            vec![Action::Complete {
                req: ReqId(1),
                result: Err(IoError::Os(5))
            }]
        );
        assert_eq!(v.disk_state(), DiskState::Failed);
        out.clear();
        v.submit(
            ReqId(2),
            Io::Read {
                offset: 0,
                len: 512,
            },
            &mut out,
        );
        assert_eq!(
            out,
            vec![Action::Complete {
                req: ReqId(2),
                result: Err(IoError::NoData)
            }]
        );
    }

    #[test]
    fn read_only_refuses_writes() {
        let mut v = Volume::new(1 << 20, true);
        let mut out = Vec::new();
        v.submit(
            ReqId(1),
            Io::Trim {
                offset: 0,
                len: 512,
                fua: false,
            },
            &mut out,
        );
        assert_eq!(
            out,
            vec![Action::Complete {
                req: ReqId(1),
                result: Err(IoError::ReadOnly)
            }]
        );
    }
}
