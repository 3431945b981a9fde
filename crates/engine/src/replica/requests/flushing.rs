//! FLUSH and FUA on the Primary: a barrier over every replica (a local fdatasync, batched,
//! and `Barrier` to each peer), answered once every replica of the volume did its part.

use super::{Requests, EIO};
use crate::io::{IoError, ReqId};
use crate::replica::action::RAction;
use crate::replica::barriers::{FlushOp, FlushWaiter};
use crate::replica::generation::Missed;
use crate::replica::local::LocalVol;
use crate::replica::msg::Msg;
use crate::replica::nodeset::NodeSet;
use crate::replica::replicas::Replicas;

impl Requests {
    /// Starts a barrier over every replica for these waiters.
    pub(in crate::replica) fn start_barrier(
        &mut self,
        rep: &mut Replicas,
        waiters: Vec<(ReqId, u16)>,
        out: &mut Vec<RAction>,
    ) {
        let id = rep.alloc_id();
        let mut op = FlushOp {
            waiters,
            ..FlushOp::default()
        };
        if rep.vols.iter().any(LocalVol::takes_writes) {
            op.local_pending = true;
            rep.flush_locally(&mut self.barriers, FlushWaiter::Op(id), out);
        }
        for p in rep.peers.iter_mut() {
            if p.up && p.vols.iter().any(|pv| pv.diskful) {
                op.peers_pending.insert(p.id);
                op.peers_asked.insert(p.id);
                p.barriers_out.insert(id, id);
                let msg = Msg::Barrier { id };
                out.push(RAction::Send { peer: p.id, msg });
            }
        }
        self.barriers.open(id, op);
        self.check_flush(rep, id, out);
    }

    pub(in crate::replica) fn check_flush(
        &mut self,
        rep: &mut Replicas,
        id: u64,
        out: &mut Vec<RAction>,
    ) {
        let Some(op) = self.barriers.take_done(id) else {
            return;
        };
        let missed = op.peers_asked.minus(op.peers_ok);
        for (req, volume) in op.waiters {
            // A FUA write vouches for itself only; a FLUSH for every write before it.
            let range = (self.writes.get_mut(req)).map(|w| (w.offset, u64::from(w.len)));
            let ok = rep.barrier_answers_for(volume as usize, op.local_ok, op.peers_ok, range);
            let result = if ok {
                Ok(())
            } else {
                Err(IoError::Os(EIO as i32))
            };
            if let Some(w) = self.writes.get_mut(req) {
                w.unflushed = missed;
                self.finish_write(rep, req, result, out);
            } else if !(ok && self.flush_waits_for_ids(rep, req, missed, out)) {
                self.complete_flush(rep, req, volume as usize, result, out);
            }
        }
    }

    /// A FLUSH whose barrier missed replicas (`missed`: their link dropped first, or their
    /// fdatasync failed) that may hold the current generation id of a volume waits, as a
    /// write that missed one does (`Requests::finish_write`), for the ids to change: the
    /// replicas that answered hold the new ids durably first, so if every node crashes
    /// then, the one that missed the barrier (what it holds of the writes before it maybe
    /// lost) is the older and syncs from them. Completed at the drop, the new ids were
    /// still on the wire at the crash; with the same ids the replica that missed the
    /// barrier won the contest by its lower node id, and the other pulled its activity
    /// log's extents back from it (cluster-crash + power-loss seed 267015082: a write
    /// the FLUSH made durable was gone from both replicas). The barrier flushed every
    /// volume: it waits for each one's ids. Returns whether it waits.
    fn flush_waits_for_ids(
        &mut self,
        rep: &mut Replicas,
        req: ReqId,
        missed: NodeSet,
        out: &mut Vec<RAction>,
    ) -> bool {
        if missed.is_empty() {
            return false;
        }
        let mut rotations = 0;
        for v in 0..rep.vols.len() {
            if self.rotations.missed(rep, v, req, missed, out) == Missed::Waits {
                rotations += 1;
            }
        }
        if rotations > 0 {
            self.flushes_parked.insert(req, rotations);
        }
        rotations > 0
    }

    /// A rotation released `req`, a FLUSH waiting for the ids (see `flush_waits_for_ids`):
    /// it completes once every volume's ids changed.
    pub(in crate::replica) fn flush_released(
        &mut self,
        rep: &Replicas,
        req: ReqId,
        out: &mut Vec<RAction>,
    ) {
        let Some(rotations) = self.flushes_parked.get_mut(&req) else {
            return;
        };
        *rotations -= 1;
        if *rotations == 0 {
            self.flushes_parked.remove(&req);
            // It flushed every volume: each must have quorum.
            let v = (0..rep.vols.len()).find(|&v| !rep.has_quorum(v));
            self.complete_flush(rep, req, v.unwrap_or(0), Ok(()), out);
        }
    }

    /// The local fdatasync `seq` finished: answers everyone it covered.
    pub(in crate::replica) fn flushed(
        &mut self,
        rep: &mut Replicas,
        seq: u64,
        ok: bool,
        out: &mut Vec<RAction>,
    ) {
        if !ok {
            rep.fdatasync_failed(out);
        }
        let (waiters, next) = self.barriers.flushed(seq);
        for waiter in waiters {
            match waiter {
                FlushWaiter::Op(id) => {
                    self.barriers.local_answered(id, ok);
                    self.check_flush(rep, id, out);
                }
                FlushWaiter::PeerBarrier { peer, conn, id } => {
                    let same = rep.peers.get(peer).is_some_and(|p| p.up && p.conn == conn);
                    if same {
                        let errno = if ok { 0 } else { EIO };
                        let msg = Msg::BarrierAck { id, errno };
                        out.push(RAction::Send { peer, msg });
                    }
                }
                FlushWaiter::ResyncDone { volume } => {
                    rep.resync_finished(&mut self.barriers, volume, ok, out)
                }
            }
        }
        self.barriers.issue_next(next, out);
    }
}
