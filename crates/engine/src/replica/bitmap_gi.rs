//! A peer's bitmap id (DRBD's bitmap UUID, `bitmap_gi` in the metadata): the generation id
//! from which our out-of-sync bitmap for that peer names every block where our replica may
//! differ from its replica, so that a whole cluster back from a clean stop with no Primary
//! lists an older replica only its bitmap instead of everything (`full_sync_if_older`).
//!
//! It is set when the peer's connection ends while both replicas were UpToDate and both
//! lists had ended: the two then differed only where the bitmaps say (the running engine
//! trusts exactly that when it meets an older replica again). From then on every change
//! to our replica is a write, and a write the peer missed is marked for it: by us as
//! Primary, by the Primary's relays (`note_third_parties`) and peer acks (`mark_lacking`).
//! Writes of a Primary not settled here are in no bitmap: they prevent a clean stop
//! (`NotQuiet::Unsettled`), and a crash voids every id (its activity log is tied to no
//! peer's id). Data pulled by a resync is marked for no peer, so it voids every peer's id
//! (`pulled`); so, at the stop, does anything that qualifies a bitmap besides it
//! (`bitmap_gi_at_stop`). None: the peer is listed everything.

use super::bitmap::Bitmap;
use super::generation::GenIds;
use super::peer::ListState;
use super::replicas::Replicas;
use tandem_wire::packet::DiskState;

impl Replicas {
    /// Peer `i`'s connection is ending: the id its bitmap counts from, per volume.
    pub(super) fn bitmap_gi_at_disconnect(&mut self, i: usize) {
        for v in 0..self.vols.len() {
            let ours = self.vols[v].diskful && self.vols[v].up_to_date();
            let pv = &mut self.peers[i].vols[v];
            let in_sync = ours
                && pv.diskful
                && pv.disk == Some(DiskState::UpToDate)
                && pv.listed
                && matches!(pv.list, ListState::Sent | ListState::Stale);
            pv.bitmap_gi = in_sync.then_some(pv.gen.current);
        }
    }

    /// Resync data is landing on our replica of `v`: it is marked for no peer.
    pub(super) fn pulled(&mut self, v: usize) {
        for p in self.peers.iter_mut() {
            p.vols[v].bitmap_gi = None;
        }
    }

    /// At a clean stop, every peer disconnected: the id peer `i`'s bitmap keeps, if nothing
    /// but the bitmap would have to qualify it: not with suspect ranges of our own, nor
    /// with anything kept of the peer besides its bitmap. (Writes of a Primary not settled
    /// here prevent a clean stop altogether: `NotQuiet::Unsettled`.)
    pub(super) fn bitmap_gi_at_stop(&self, i: usize, v: usize) -> Option<u64> {
        let pv = &self.peers[i].vols[v];
        let kept = |b: &Option<Bitmap>| b.as_ref().is_some_and(|b| b.count() > 0);
        let doubtful = kept(&self.vols[v].suspect)
            || kept(&pv.unconfirmed)
            || kept(&pv.unanswered)
            || kept(&pv.pull_back)
            || pv.unsure.is_some();
        pv.bitmap_gi.filter(|_| !doubtful)
    }

    /// Back from a clean stop with peer `i` older than us: our bitmap for it names all it
    /// lacks if it counts from an id the peer holds or an older one (the peer's current id
    /// is in our lineage no earlier than the bitmap's).
    pub(super) fn bitmap_covers(&self, i: usize, v: usize) -> bool {
        let Some(me) = self.vols[v].standing.filter(|s| s.clean) else {
            return false;
        };
        let pv = &self.peers[i].vols[v];
        let Some(base) = pv.bitmap_gi else {
            return false;
        };
        let at = |gi: u64| position(&me.gen, gi);
        matches!((at(pv.gen.current), at(base)), (Some(theirs), Some(base)) if theirs <= base)
    }
}

/// How far back `gi` is in `g`'s lineage: 0 for the current id, then the history, newest
/// first; 0 (the id every lineage starts from) is the oldest of all.
fn position(g: &GenIds, gi: u64) -> Option<usize> {
    if gi == g.current {
        Some(0)
    } else if gi == 0 {
        Some(usize::MAX)
    } else {
        g.history.iter().position(|&x| x == gi).map(|k| k + 1)
    }
}
