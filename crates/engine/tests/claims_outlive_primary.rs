//! A Secondary back from a crash that the Primary's same run settled keeps its claims on a
//! replica away from that Primary: the Primary knows what that replica lacks, but if it
//! dies before the replica returns, the Secondary's claims are all that is left (failover
//! seed 49: node 2 marked node 0 as lacking node 1's write, crashed, and node 1's run
//! settled its restart; node 2 dropped the claim, node 1 died, and node 0 was taken as
//! current without an acknowledged write).
//!
//! Here node 0 is the Primary, node 1 the replica away from it, node 2 the one that
//! crashes (the in-memory network of `common`, whose disks keep their bytes).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::Event;

/// Node 1 cut off; node 0 writes block 0 (node 2 takes it and marks node 1 as lacking
/// it); node 2 crashes with block 0 in its activity log and comes back under the same run
/// of node 0 (which settles its crash), while node 0 writes block 8, which node 2 pulls;
/// then node 0 dies for good.
fn crash_settled_then_primary_dies() -> Net {
    let mut net = Net::new();
    net.link_lost(0, 1);
    net.link_lost(1, 2);
    net.run();
    net.write(1, 0, 4096);
    net.tick(20);
    assert!(net.claims(2, 1) > 0, "node 2 knows node 1 lacks block 0");
    net.crash(2, &[(0, 16 * BLOCK)]);
    net.run();
    net.write(2, 8 * BLOCK, 4096);
    net.link_up(0, 2);
    net.run();
    net.tick(20);
    assert!(
        (net.events.iter())
            .any(|(n, e)| *n == 2 && matches!(e, Event::CrashSettledByRun { primary: 0, .. })),
        "the Primary's run settled node 2's crash"
    );
    assert!(
        net.pulled_blocks(2, 0).contains(&8),
        "node 2 pulled block 8 under the Primary's list"
    );
    net.link_lost(0, 2);
    net.run();
    net
}

#[test]
fn claims_on_a_replica_away_from_the_settling_primary_outlive_it() {
    let mut net = crash_settled_then_primary_dies();
    assert!(
        net.claims(2, 1) > 0,
        "node 2 still knows node 1 lacks block 0"
    );
    net.link_up(1, 2);
    net.run();
    net.tick(50);
    assert!(net.listed_blocks(2, 1).contains(&0), "node 2 lists block 0");
    assert_eq!(net.block(1, 0), net.block(2, 0), "node 1 holds the write");
}

/// Node 2, back from a clean restart with node 1 away, is synced under node 0's list: its
/// claims on node 1 (block 0) are kept under node 0's run (`PeerVol::kept`), moot if node
/// 1 returns to a node 0 that lists them itself. Node 0 then writes block 12, which node
/// 1 misses: node 2's claim on it is no kept one (`Peer::lacks`). Node 1 returns to node 2
/// alone while node 0's run is connected there, and node 0 dies: node 2 names both blocks
/// to node 1, which does not follow node 0 (`settle_held_claims`). Dropped, block 12
/// relied on node 0 to list it (failover soak seed 406002809: that Primary, met by both,
/// stepped down without quorum and forgot its claims; an acknowledged write was lost),
/// and block 0 on a node 0 that node 1 never met again.
#[test]
fn claims_kept_under_a_run_go_only_if_the_peer_follows_its_primary() {
    let mut net = Net::new();
    net.link_lost(0, 1);
    net.link_lost(1, 2);
    net.link_lost(0, 2);
    net.run();
    net.restart_cleanly(2);
    net.write(1, 0, 4096);
    net.link_up(0, 2);
    net.run();
    net.tick(20);
    assert!(
        net.pulled_blocks(2, 0).contains(&0),
        "node 2 pulled block 0 under node 0's list"
    );
    net.write(2, 12 * BLOCK, 4096);
    net.tick(20);
    assert!(net.claims(2, 1) > 0, "node 2 knows node 1 lacks block 12");
    net.link_up(1, 2);
    net.run();
    net.tick(20);
    net.link_lost(0, 2);
    net.run();
    net.tick(50);
    assert!(
        net.listed_blocks(2, 1).contains(&12),
        "node 2 lists block 12"
    );
    assert_eq!(net.block(1, 12), net.block(0, 12), "node 1 holds the write");
    // The kept claim too: node 1 never met node 0, which could not list it.
    assert!(net.listed_blocks(2, 1).contains(&0), "node 2 lists block 0");
    assert_eq!(net.block(1, 0), net.block(0, 0), "node 1 holds block 0");
}
