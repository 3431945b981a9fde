//! The Primary's `InSync` (a replica it synced holds all its writes now) and the claims it
//! drops on the other Secondaries (`Replicas::on_in_sync`, `Replicas::tell_in_sync_peers`).
//! Three diskful nodes over the shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, PEER_ACK_DELAY_MS};

/// Overlapping seed 238001624, reduced. Node 1 claims node 2 lacks a write it missed
/// while away from both others. Node 1's link to the Primary drops, and the Primary then
/// syncs node 2: its word of that goes to connected replicas only. Node 2 claims in turn
/// a write node 1 misses. When the Primary syncs node 1, it also tells node 1 that node 2
/// holds all its writes: node 1's stale claim goes, and the two meet with nothing to
/// list. (Before, node 1 kept it, listed it at their meeting, node 2, up to date, countered
/// it, and the two redialled for ever: `LackPrimaryWrites`.)
#[test]
fn a_replica_synced_later_hears_which_replicas_hold_all_writes() {
    let mut net = Net::new();
    net.link_down(1, 2);
    net.link_down(0, 2);
    net.write(1, 3 * BLOCK, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.claims(1, 2), 4096);
    net.link_down(0, 1);
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    net.write(2, 7 * BLOCK, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.claims(2, 1), 4096);
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert!(
        net.delivered(0, 1, |m| matches!(m, Msg::InSync { node: 2, .. }))
            .len()
            == 1
    );
    assert_eq!(net.claims(1, 2), 0, "node 2 holds the write");
    assert_eq!(net.claims(2, 1), 0, "node 1 holds the write");
    net.link_up(1, 2);
    assert!(net.listed(1, 2).is_empty());
    assert!(net.listed(2, 1).is_empty());
    net.assert_converges();
}

/// Overlapping seed 232068286, reduced. Node 2, away from both others, misses a write, and
/// node 1 claims it from the Primary's peer ack. Node 1 stops cleanly, its claim kept in
/// its metadata, and comes back under the Primary, which then syncs node 2. Node 1 meets
/// node 2, up to date, and lists it the claim before the Primary's `InSync` for it arrives;
/// node 2's answer (it counters the claim) comes after. The word drops the stale claim
/// though node 2 is connected, since node 2 said on this connection that it is UpToDate,
/// and node 1 then pulls what node 2 says it lacks. (Before, only a node away from it
/// dropped them: node 1 kept the claim, and each took the other's for writes of the
/// Primary it lacked and redialled for ever.)
#[test]
fn in_sync_drops_a_claim_on_a_connected_replica_the_primary_synced() {
    let mut net = Net::new();
    net.link_lost(1, 2);
    net.link_lost(0, 2);
    net.write(1, 8192, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.claims(1, 2), 4096);
    net.link_down(0, 1);
    net.restart_cleanly(1);
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.claims(1, 2), 4096, "kept in its metadata");
    // The Primary syncs node 2; its word to node 1 is on the way when node 1 meets node 2,
    // whose list (node 1's waits for its Volume) comes after.
    net.hold(0, 1);
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    net.hold(2, 1);
    net.link_up(1, 2);
    // Node 2's Role and Volume: node 1 lists it the stale claim, and node 2's answer waits.
    net.release_one(2, 1);
    net.release_one(2, 1);
    assert_eq!(net.seen(1, 2), Some(DiskState::UpToDate));
    assert_eq!(net.listed_blocks(1, 2), vec![2]);
    net.release(0, 1);
    assert!(net
        .sent
        .iter()
        .any(|&(f, t, m)| f == 0 && t == 1 && matches!(m, Msg::InSync { node: 2, .. })));
    assert_eq!(net.claims(1, 2), 0, "the claim went with the sync");
    // Node 2's answer to the stale list comes after the word: node 1 has no claim left to
    // hold against it, and pulls what node 2 says it lacks.
    net.release(2, 1);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    net.assert_converges();
}

/// The `InSync` is about the replica the Primary synced: one that restarted since and told
/// us so on our connection (not UpToDate, or unproven) is not that replica, and what we
/// claim it lacks stays. Node 2 is synced by the Primary, whose word to node 1 is held;
/// node 2 then crashes and comes back (Outdated, unproven), and node 1 meets it. The
/// stale word then arrives: node 1's claim stands, for the lists of this meeting to settle.
#[test]
fn in_sync_leaves_claims_on_a_replica_that_restarted_since() {
    let mut net = Net::new();
    net.link_down(1, 2);
    net.link_down(0, 2);
    net.write(1, 3 * BLOCK, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.claims(1, 2), 4096);
    net.hold(0, 1);
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert!(net
        .in_flight(0, 1)
        .iter()
        .any(|m| matches!(m, Msg::InSync { node: 2, .. })));
    net.link_down(0, 2);
    net.crash(2, &[(0, 64 << 10)]);
    net.hold(1, 2);
    net.link_up(1, 2);
    assert_eq!(net.seen(1, 2), Some(DiskState::Outdated));
    assert_eq!(net.claims(1, 2), 4096);
    net.release(0, 1);
    assert_eq!(
        net.claims(1, 2),
        4096,
        "the word was about the replica before its crash"
    );
    net.release(1, 2);
    net.link_up(0, 2);
    net.assert_converges();
}

/// Cluster-crash soak seed 475010969, with a diskless Primary. Node 2 crashed (its log
/// naming block 5) under the Primary's run and meets node 1 first: node 1's `Role` comes,
/// then the Primary's (the run that settles node 2's crash: its log's extents need no
/// pull), then node 1's `UpToDate` report, before node 1 says it follows that Primary. So
/// node 2's claim on node 1 from its log (block 5) is held under the run, not dropped.
/// Synced, node 2 hears from the Primary that node 1 holds all its writes: the held claim
/// goes too. (Kept, it came back as a claim when the Primary went; node 1 claimed in
/// turn a write node 2 had missed, and the two redialled for ever.)
#[test]
fn in_sync_drops_claims_held_under_the_primarys_run() {
    let mut net = Net::diskless_primary();
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.crash(2, &[(5 * BLOCK, BLOCK)]);
    assert_eq!(net.claims(2, 1), BLOCK, "the log's extent, on every peer");
    net.hold_at(1, 2, |m| matches!(m, Msg::Volume { .. }));
    net.link_up(1, 2);
    net.link_up(0, 2);
    net.release(1, 2);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.claims(2, 1), 0);
    assert!(
        !net.delivered(0, 2, |m| matches!(m, Msg::InSync { node: 1, .. }))
            .is_empty(),
        "the Primary said node 1 holds all its writes"
    );
    // The Primary goes: nothing held comes back as a claim.
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.tick(PEER_ACK_DELAY_MS);
    assert_eq!(net.claims(2, 1), 0, "no claim came back");
    assert!(net.listed_blocks(2, 1).is_empty(), "nothing listed");
    assert_eq!(net.block(1, 5), net.block(2, 5));
}
