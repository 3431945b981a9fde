//! A peer's bitmap id (DRBD's bitmap UUID, `bitmap_gi` in the metadata): the generation id
//! from which our out-of-sync bitmap for that peer names every block where our replica may
//! differ from its replica, so that a whole cluster back from a stop or a crash with no
//! Primary lists an older replica only its bitmap instead of everything
//! (`full_sync_if_older`).
//!
//! It is set when the peer's connection ends while both replicas were UpToDate and both
//! lists had ended: the two then differed only where the bitmaps say (the running engine
//! trusts exactly that when it meets an older replica again). From then on every change
//! to our replica is a write, and a write the peer missed is marked for it: by us as
//! Primary, by the Primary's relays (`note_third_parties`) and peer acks (`mark_lacking`);
//! a Primary's writes not settled here stay in the activity log, whose extents a crash
//! adds to every peer's bitmap, and keep a clean stop from happening
//! (`NotQuiet::Unsettled`). Resync data is marked for no peer, so it voids every peer's
//! id (`pulled`), and so, at the disconnect, does anything else the bitmap would not name:
//! writes in flight to it when the link dropped, writes only it may hold, suspect ranges
//! of our own. A connection that ends before the two were in sync keeps the id it had:
//! what it changed on either side is in the bitmap too. On the peer's side, resync data
//! from a third node lands with its ids unchanged until its sync ends; it says so
//! (`volume_flags::PULLED_ELSEWHERE`), and the bitmap does not cover it then. Every
//! change is an [`Event::BitmapGiChanged`] the driver makes durable before the actions
//! after it, so a crash keeps the id too. `None`: the peer is listed everything.

use super::action::RAction;
use super::bitmap::Bitmap;
use super::event::Event;
use super::generation::GenIds;
use super::peer::ListState;
use super::replicas::Replicas;
use tandem_wire::packet::DiskState;

impl Replicas {
    /// Peer `i`'s connection is ending (before what it was told is forgotten): per volume,
    /// whether the two replicas were in sync on it.
    pub(super) fn in_sync_at_disconnect(&self, i: usize) -> Vec<bool> {
        (self.vols.iter().zip(&self.peers[i].vols))
            .map(|(vol, pv)| {
                vol.diskful
                    && vol.up_to_date()
                    && pv.diskful
                    && pv.disk == Some(DiskState::UpToDate)
                    && pv.listed
                    && matches!(pv.list, ListState::Sent | ListState::Stale)
            })
            .collect()
    }

    /// Peer `i`'s connection ended, and what waited on it is settled: the id its bitmap
    /// counts from, per volume (`in_sync` from [`Replicas::in_sync_at_disconnect`]).
    pub(super) fn bitmap_gi_at_disconnect(
        &mut self,
        i: usize,
        in_sync: &[bool],
        out: &mut Vec<RAction>,
    ) {
        let peer = self.peers[i].id;
        let kept = |b: &Option<Bitmap>| b.as_ref().is_some_and(|b| b.count() > 0);
        for (v, &in_sync) in in_sync.iter().enumerate() {
            let suspect = self.vols[v].suspect.as_ref().filter(|b| b.count() > 0);
            let pv = &mut self.peers[i].vols[v];
            let unsettled = kept(&pv.unanswered) || kept(&pv.unconfirmed);
            // Not in sync: an id kept from before still holds, since what changed on
            // this connection changed in the bitmap too (blocks it was served and may
            // not have written are put back, data we pulled voided the id already,
            // writes it missed are marked), and so does our own suspect ranges' doubt
            // where the bitmap names them (a crash adds them to every peer's bitmap at
            // restore). A connection that ended before the two were in sync (a second
            // one replacing it when both nodes dialed, a link that dropped during the
            // lists after a whole-cluster restart) then does not cost the peer a full
            // resync at the next restart (cli test
            // `a_whole_cluster_killed_lists_an_older_replica_only_its_bitmap_and_log`).
            let gi = match (in_sync, unsettled, suspect) {
                (_, true, _) | (true, _, Some(_)) => None,
                (true, false, None) => Some(pv.gen.current),
                (false, false, Some(s)) if !s.within(&pv.oos) => None,
                (false, false, _) => pv.bitmap_gi,
            };
            if pv.bitmap_gi != gi {
                pv.bitmap_gi = gi;
                out.push(RAction::Event(Event::BitmapGiChanged {
                    volume: v as u16,
                    peer,
                    gi,
                }));
            }
        }
    }

    /// Resync data is landing on our replica of `v`: it is marked for no peer.
    pub(super) fn pulled(&mut self, v: usize, out: &mut Vec<RAction>) {
        for p in self.peers.iter_mut() {
            if p.vols[v].bitmap_gi.take().is_some() {
                out.push(RAction::Event(Event::BitmapGiChanged {
                    volume: v as u16,
                    peer: p.id,
                    gi: None,
                }));
            }
        }
    }

    /// Back from a restart with peer `i` older than us: our bitmap for it (after a crash,
    /// with our activity log's extents) names all it lacks if it counts from an id the
    /// peer holds or an older one (the peer's current id is in our lineage no earlier
    /// than the bitmap's), and nothing but its ids' data and ours landed there: resync
    /// data from a third node, which a restarted replica takes with its ids unchanged
    /// until the sync ends, is in no bitmap of ours.
    pub(super) fn bitmap_covers(&self, i: usize, v: usize) -> bool {
        let Some(me) = self.vols[v].standing else {
            return false;
        };
        let pv = &self.peers[i].vols[v];
        let Some(base) = pv.bitmap_gi.filter(|_| !pv.pulled_elsewhere) else {
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
