//! Whose writes this replica takes: the run of the Primary (its node and incarnation) that
//! the metadata records, so that a Secondary back from a crash in the same boot (the page
//! cache kept every write the process made) that meets that same run as Primary again
//! needs none of its activity log's extents.
//!
//! That Primary, alive all along, marked every write it sent us and did not hear answered
//! as missing here (at the link's drop: `unconfirmed` when nothing else may hold it, see
//! `resource/links.rs`), and told the other replicas what each lacks (peer acks), so its
//! list names all we lack; and every write we hold that others lack, it marked for them.
//! The log's extents then neither need a pull nor stand as claims on the peers (the
//! restored bitmaps add them to every peer, since a claim made while its extent was in the
//! log may not have reached the bitmap's pages).
//!
//! Not recorded while we keep a lost Primary's unsettled writes, nor ever again in this run
//! of ours once claims on peers were made from them (see `settle.rs`): those are known to
//! no Primary, and may lie in the log's extents only. A record made before we kept them
//! stays until such a claim (`claimed_from_lost_writes`): the run, met again, knows which
//! replicas got each of those writes and marks the others; a Secondary stopped with
//! SIGTERM under writes (its last ones not settled, so not a clean stop) is back in the
//! same boot with its log settled by that run, not pulled (`bench/secondary-away.py`:
//! before, 1.66× the data written and 5.4 s). Nor as Primary: our own writes are in the
//! log.

use super::action::RAction;
use super::event::Event;
use super::peer::KeptClaims;
use super::replicas::Replicas;
use super::run::PrimaryRun;
use tandem_wire::packet::Role;

impl Replicas {
    /// We take writes from `run` now (`None`: from no run we may record).
    fn record_writer(&mut self, run: Option<PrimaryRun>, out: &mut Vec<RAction>) {
        if self.writer.run != run {
            self.writer.run = run;
            out.push(RAction::Event(Event::WriterChanged { run }));
        }
    }

    /// After every event: the connected Primary's run is recorded once it may be (every
    /// claim we hold on the peers is then one it knows too: it made them), and a record is
    /// dropped before another Primary's writes or our own can land.
    pub(super) fn check_writer(&mut self, out: &mut Vec<RAction>) {
        if self.role == Role::Primary {
            return self.record_writer(None, out);
        }
        let primary = self.peers.primary_peer();
        let run = primary.map(|p| p.run());
        if run.is_some_and(|r| self.writer.run != Some(r)) {
            self.record_writer(None, out);
        }
        let Some(run) = run else {
            // Away from every Primary: the one recorded still knows what it sent us.
            return;
        };
        let may = self.writer.run.is_none()
            && !self.writer.compared
            && self.lost.iter().all(|l| l.writes.is_empty())
            && self.vols.iter().any(|v| v.diskful)
            && self
                .peers
                .iter()
                .all(|p| p.vols.iter().all(|pv| pv.oos.count() == 0));
        if may {
            self.record_writer(Some(run), out);
        }
    }

    /// A comparison of a lost Primary's writes made claims on a peer: no run is recorded
    /// again in this run of ours (see the module's comment). Kept writes that made none,
    /// released when that run is met again, leave no claim any Primary does not know
    /// (overlapping soak seed 30002577: a Secondary whose link dropped once with writes
    /// unsettled, and that met the same run again, recorded no run for good; back from a
    /// crash, its log's extents stood as claims on the only current replica).
    pub(super) fn claimed_from_lost_writes(&mut self, out: &mut Vec<RAction>) {
        self.writer.compared = true;
        self.record_writer(None, out);
    }

    /// Back from a crash and not UpToDate since, our replica of `v` was settled by the run
    /// of the Primary connected now (`met_writer`), and we made no claim from a lost
    /// Primary's writes since: that Primary marked every write we missed (its list names
    /// all we lack) and every write we hold that a peer lacks, and settles every write that
    /// failed (`unanswered_lost`): a peer's replica that no list names as lacking a block
    /// holds it current, as for a replica that never restarted, and what that Primary
    /// lists us we claim no peer lacks (overlapping seeds 39262, 30003616).
    pub(super) fn settled_by_primary(&self, v: usize) -> bool {
        let vol = &self.vols[v];
        let Some(run) = vol.settled_by.filter(|_| vol.standing.is_some()) else {
            return false;
        };
        !self.writer.compared
            && self.peers.up().any(|p| {
                p.role == Role::Primary && p.id == run.node && p.incarnation == run.incarnation
            })
    }

    /// Peer `i` is Primary in its run: a replica back from a crash under that same run
    /// needs none of its log's extents; under another run it pulls them as before.
    pub(super) fn met_writer(&mut self, i: usize, out: &mut Vec<RAction>) {
        let run = self.peers[i].run();
        for v in 0..self.vols.len() {
            let Some(c) = self.vols[v].crashed_under.take() else {
                continue;
            };
            if c.run != run {
                continue;
            }
            let vol = &mut self.vols[v];
            let Some(suspect) = vol.suspect.as_mut() else {
                continue;
            };
            // What claims on the peers were folded into the suspect ranges stays (they
            // came from the bitmap's pages too).
            suspect.subtract(&c.log);
            // Our claims within the log's extents, set in every peer's bitmap at the
            // crash, may hide real ones (a write of the run a peer missed, whose bit the
            // bitmap's pages had not yet kept): the Primary knows those, but only for
            // itself and the peers that follow it now, whose lists it gives. Claims on a
            // peer away from it stay: if the Primary dies before that peer meets it, we
            // may be the only one left who knows (failover seed 49: a write of node 1
            // missed node 0; node 2, restarted and settled by node 1's run, dropped its
            // claim; node 1 died, and node 0 was taken as current without it). If that
            // peer returns while the run is connected, they go then (`drop_kept_claims`).
            for p in self.peers.iter_mut() {
                let pv = &mut p.vols[v];
                if p.id == run.node || (p.up && p.primaries.contains(run.node)) {
                    pv.oos.subtract(&c.log);
                } else if !(p.up && p.primaries_heard) {
                    // Away, or connected and not yet heard (its `Volume` may still come and
                    // turn these claims into pulls: the cli test pulled 9,800 KiB so).
                    match pv.kept.as_mut() {
                        Some(k) if k.run == run => {
                            if let Some(within) = k.within.as_mut() {
                                within.union_with(&c.log);
                            }
                        }
                        _ => {
                            let within = Some(c.log.clone());
                            pv.kept = Some(KeptClaims { run, within });
                        }
                    }
                }
            }
            vol.settled_by = Some(run);
            let bytes = c.log.count() * c.log.block_size();
            out.push(RAction::Event(Event::CrashSettledByRun {
                volume: v as u16,
                primary: run.node,
                bytes,
            }));
        }
    }
}
