//! Resync progress seen from every node, not only the two that sync: a sync target tells
//! its other peers how far it is (`Packet::SyncProgress`, about once a second and once at
//! its end), so a diskless Primary, or a third replica, shows "beta: 37 % from alpha" in
//! `status`, the events and the metrics. Status only: the engine ignores the packet, and
//! it goes only to peers whose handshake offered `features::SYNC_PROGRESS`.

use super::state::{Entry, NodeReactor};
use tandem_engine::replica::NodeId;
use tandem_wire::features::SYNC_PROGRESS;
use tandem_wire::Packet;

/// What a peer said of its resync of one volume. Its rate is its own measure: one made
/// here from reports a second apart, sampled a second apart, would alias (the fresh-clone
/// run saw 41 MiB/s on a 24 MiB/s cable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeerSync {
    pub(super) source: NodeId,
    pub(super) left: u64,
    pub(super) done: u64,
    /// Bytes a second; 0 while not known.
    pub(super) rate: u64,
}

impl NodeReactor {
    /// Once a second: every resync of ours (`ours`, from `sample_resyncs`: resource,
    /// volume, source, left, done), told to each peer; one that ended since, told once
    /// more with nothing left.
    pub(super) fn tell_sync_progress(&mut self, ours: &[(usize, u16, NodeId, u64, u64)]) {
        let now_ms = self.now_ms();
        let ended = (self.progress_told.iter())
            .filter(|&&(r, v)| !ours.iter().any(|o| (o.0, o.1) == (r, v)))
            .map(|&(r, v)| (r, v, self.res[r].me, 0, 0));
        let reports: Vec<_> = ours.iter().copied().chain(ended).collect();
        for (r, v, source, left, done) in reports {
            let rate = (left > 0)
                .then(|| self.resyncs.get(&(r, v, None)))
                .flatten()
                .and_then(|p| p.view(now_ms, Some(done), left).rate)
                .unwrap_or(0);
            let packet = Packet::SyncProgress {
                volume: self.res[r].cfg.volumes[usize::from(v)].number,
                source,
                left,
                done,
                rate,
            };
            // The source too: what it shows of a resync it serves is its own view, and
            // this where it has none.
            let conns: Vec<usize> = (self.res[r].peers.iter()).filter_map(|p| p.conn).collect();
            for k in conns {
                if let Some(Entry::Peer(pc)) = self.entries.get_mut(k) {
                    if !pc.dead && pc.features & SYNC_PROGRESS != 0 {
                        tandem_wire::encode(&packet, &mut pc.out);
                        self.mark_dirty(k);
                    }
                }
            }
        }
        self.progress_told = ours.iter().map(|o| (o.0, o.1)).collect();
    }

    /// Peer `peer` of resource `r` told us how far its resync of a volume (by number) is.
    pub(super) fn peer_sync_progress(&mut self, r: usize, peer: NodeId, p: &Packet<'_>) {
        let Packet::SyncProgress {
            volume,
            source,
            left,
            done,
            rate,
        } = *p
        else {
            return;
        };
        let Some(v) = (self.res[r].cfg.volumes.iter()).position(|c| c.number == volume) else {
            return;
        };
        let key = (r, peer, v as u16);
        if left == 0 {
            self.peer_syncs.remove(&key);
        } else {
            let sync = PeerSync {
                source,
                left,
                done,
                rate,
            };
            self.peer_syncs.insert(key, sync);
        }
        self.touch(r);
    }
}
