//! The history checker of runs with failover (`Scenario::failover`): one model of the
//! application's writes across every Primary, whichever node answered them.
//!
//! - Reads (through any Primary): per sector, the value of the latest write acknowledged
//!   before the read began, or of a write that was not over when that one was submitted
//!   (in flight then or since, acknowledged after, failed, or abandoned with a killed
//!   Primary); never an older one, never a value no write wrote ([`Sim::allowed_in_history`],
//!   stricter than `allowed_at`, which lets any failed write show).
//! - At the end (`check_final`, `check_safety`): every sector holds the latest acknowledged
//!   write, or a failed or abandoned one that ended after it (`allowed_final`, over the
//!   global history).
//! - Tenures: each promotion starts one (node, clock at the promotion). Two writes
//!   acknowledged by different tenures are ordered: the later acknowledgement's tenure
//!   began after the earlier one's tenure last acknowledged a write. Checked at each
//!   acknowledgement ([`Sim::check_tenures`]): no other tenure acknowledged a write after
//!   this one began. With quorum on, two sides of a partition never both complete writes,
//!   and an old Primary, once superseded, completes none.

use crate::check::WriteRec;
use crate::Sim;
use tandem_engine::replica::NodeId;

/// One Primary's time in office, from its promotion on.
#[derive(Clone, Debug)]
pub(crate) struct Tenure {
    pub(crate) node: NodeId,
    /// The clock at the promotion, and the simulated time.
    pub(crate) start: u64,
    pub(crate) start_us: u64,
    /// The clock at its last acknowledged write, and that write's stamp.
    pub(crate) last_ack: Option<(u64, u64)>,
    pub(crate) acks: usize,
}

impl Sim {
    /// The stamps a read submitted at clock `submitted` may show at sector `at`: the latest
    /// write acknowledged before it began (or the initial zeros), and every write covering
    /// the sector that was not over (acknowledged, failed, abandoned) when that one was
    /// submitted.
    pub(crate) fn allowed_in_history(&self, volume: u16, at: u64, submitted: u64) -> Vec<u64> {
        let covering: Vec<&WriteRec> = self
            .writes
            .iter()
            .filter(|w| w.volume == volume && w.offset <= at && at < w.offset + w.len)
            .collect();
        let last = covering
            .iter()
            .filter(|w| w.completed.is_some() && w.order < submitted && self.counts(w))
            .max_by_key(|w| w.order);
        let mut allowed = vec![last.map_or(0, |w| w.stamp)];
        for w in &covering {
            if let Some(l) = last {
                if w.stamp == l.stamp && w.order == l.order {
                    continue;
                }
                // Over before the last acknowledged one was submitted: overwritten.
                if w.completed.is_some() && w.order <= l.submit_order {
                    continue;
                }
            }
            allowed.push(w.stamp);
        }
        allowed
    }

    /// A write acknowledged by node `node`: no other Primary's tenure acknowledged one
    /// after this node's tenure began.
    pub(crate) fn check_tenures(&mut self, node: NodeId, w: &WriteRec) {
        if !self.sc.failover {
            return;
        }
        let Some(t) = self.fo.tenure_of[node as usize] else {
            panic!(
                "seed {}: node {node} acknowledged write {} without being promoted\n{}",
                self.sc.seed,
                w.stamp,
                self.tail_log(300)
            );
        };
        let mine = &self.fo.tenures[t];
        for (k, other) in self.fo.tenures.iter().enumerate() {
            if k == t {
                continue;
            }
            if let Some((at, stamp)) = other.last_ack {
                assert!(
                    at < mine.start,
                    "seed {}: two Primaries completed writes apart: node {} (Primary since {} µs) acknowledged write {} after node {} (Primary since {} µs) acknowledged write {stamp}, after the first's tenure began\n{:?}\n{}",
                    self.sc.seed,
                    node,
                    mine.start_us,
                    w.stamp,
                    other.node,
                    other.start_us,
                    self.sc,
                    self.tail_log(600)
                );
            }
        }
        let mine = &mut self.fo.tenures[t];
        mine.last_ack = Some((w.order, w.stamp));
        mine.acks += 1;
        if t > 0 {
            self.fo.stats.acked_after_failover += 1;
        }
    }
}
