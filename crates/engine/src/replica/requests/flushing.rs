//! FLUSH and FUA on the Primary: a barrier over every replica (a local fdatasync, batched,
//! and `Barrier` to each peer), answered once every replica of the volume did its part.

use super::{Requests, EIO};
use crate::io::{IoError, ReqId};
use crate::replica::action::RAction;
use crate::replica::barriers::{FlushOp, FlushWaiter};
use crate::replica::local::LocalVol;
use crate::replica::msg::Msg;
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
        for (req, volume) in op.waiters {
            let result = if rep.barrier_answers_for(volume as usize, op.local_ok, op.peers_ok) {
                Ok(())
            } else {
                Err(IoError::Os(EIO as i32))
            };
            if self.writes.contains(req) {
                self.finish_write(rep, req, result, out);
            } else {
                out.push(RAction::Complete {
                    req,
                    result,
                    data: None,
                });
            }
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
