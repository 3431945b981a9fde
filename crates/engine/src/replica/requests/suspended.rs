//! Application I/O of a Primary without quorum (see `quorum.rs`): failed, or held until
//! quorum returns (`on-no-quorum`). The gate is asked where a request would start and
//! where it would complete successfully. A request that arrives without quorum fails
//! (io-error) or waits and starts once quorum is back (suspend-io), then reaching every
//! replica connected. A write in flight when quorum goes, done on the replicas it reached
//! (a minority), fails under either policy: the minority of a partition never acknowledges
//! a write, and a failed one never rotates the generation ids nor counts as written apart
//! from the replicas it missed. (Held instead, it would have to wait, once quorum is back,
//! for the replicas that missed it to be synced, while their lists wait for it to end:
//! simulator quorum seed 1845 acknowledged such writes on one replica of two.) A FLUSH
//! every replica reached answers when quorum is back.

use super::Requests;
use crate::io::{Io, IoError, ReqId};
use crate::replica::action::RAction;
use crate::replica::quorum::OnNoQuorum;
use crate::replica::replicas::Replicas;

/// What the quorum lets a request of volume `v` do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    Go,
    Fail,
    Hold,
}

impl Gate {
    pub(super) fn of(rep: &Replicas, v: usize) -> Gate {
        if rep.yielding.is_some() {
            // Stepping down for another Primary (`primaries.rs`): nothing more completes.
            Gate::Fail
        } else if rep.has_quorum(v) {
            Gate::Go
        } else {
            match rep.spec.quorum.on_loss {
                OnNoQuorum::IoError => Gate::Fail,
                OnNoQuorum::SuspendIo => Gate::Hold,
            }
        }
    }
}

/// Requests held while their volume has no quorum.
#[derive(Debug, Default)]
pub(in crate::replica) struct Suspended {
    /// Arrived without quorum, not started, in order (a write's payload retained under
    /// `Token::App`).
    arrived: Vec<(ReqId, u16, Io)>,
    /// FLUSH requests every replica answered, to complete once quorum returns.
    flushes: Vec<(ReqId, usize)>,
}

impl Suspended {
    /// Requests held that are not in the Primary's write set.
    pub(super) fn len(&self) -> usize {
        self.arrived.len() + self.flushes.len()
    }

    pub(super) fn arrive(&mut self, req: ReqId, volume: u16, io: Io) {
        self.arrived.push((req, volume, io));
    }

    pub(super) fn flush_done(&mut self, req: ReqId, v: usize) {
        self.flushes.push((req, v));
    }
}

impl Requests {
    /// Quorum returned for some volume: what was held there goes on, in the order it came.
    pub(in crate::replica) fn resume_suspended(
        &mut self,
        rep: &mut Replicas,
        out: &mut Vec<RAction>,
    ) {
        let flushes = std::mem::take(&mut self.suspended.flushes);
        let arrived = std::mem::take(&mut self.suspended.arrived);
        for (req, v) in flushes {
            if rep.has_quorum(v) {
                self.rotations.acked(rep, None, out);
                out.push(RAction::Complete {
                    req,
                    result: Ok(()),
                    data: None,
                });
            } else {
                self.suspended.flush_done(req, v);
            }
        }
        for (req, volume, io) in arrived {
            if rep.has_quorum(volume as usize) {
                self.submit_io(rep, req, volume, io, true, out);
            } else {
                self.suspended.arrive(req, volume, io);
            }
        }
    }

    /// Stepping down for another Primary: every request held fails.
    pub(in crate::replica) fn fail_suspended(&mut self, out: &mut Vec<RAction>) {
        let flushes = std::mem::take(&mut self.suspended.flushes);
        let arrived = std::mem::take(&mut self.suspended.arrived);
        let failed = flushes.into_iter().map(|(req, _)| req);
        for req in failed.chain(arrived.into_iter().map(|(req, _, _)| req)) {
            out.push(RAction::Complete {
                req,
                result: Err(IoError::NoQuorum),
                data: None,
            });
        }
    }

    /// A FLUSH answered by every replica completes, fails or waits, as the quorum says.
    pub(super) fn complete_flush(
        &mut self,
        rep: &Replicas,
        req: ReqId,
        v: usize,
        result: Result<(), IoError>,
        out: &mut Vec<RAction>,
    ) {
        let result = match (result, Gate::of(rep, v)) {
            (Ok(()), Gate::Hold) => return self.suspended.flush_done(req, v),
            (Ok(()), Gate::Fail) => Err(IoError::NoQuorum),
            (r, _) => r,
        };
        if result.is_ok() {
            self.rotations.acked(rep, None, out);
        }
        out.push(RAction::Complete {
            req,
            result,
            data: None,
        });
    }
}
