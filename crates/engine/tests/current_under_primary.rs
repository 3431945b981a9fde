//! Rules for a replica that is current under a connected Primary (`current_under_primary`:
//! a diskful Secondary, UpToDate, whose Primary's list to it ended): it holds every write
//! that Primary completed, whatever its generation ids say against a peer's. Rule Y: it
//! keeps its claims on a peer whose ids are newer (cluster-crash soak seed 201015450).
//! Rule R: a behind peer with older ids that lists claims on it gets them back as its own
//! to pull (disk-errors soak seed 193051170). A diskless Primary (node 0) and two
//! Secondaries over the in-memory network of `common`; a direction of a link can be held
//! (its packets wait, in order) to make packets cross.

mod common;

use common::{gen, Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, ReplicaAtStart};

// ------------------------------------------------------------------------- rule Y

/// Node 1 won the contest after a cluster crash (newer ids, 6 over 5); node 2 was synced
/// from it with no Primary around and kept its older ids: the same data, ids 5 < 6. The
/// diskless Primary is promoted with only node 2 connected.
fn contest_winner_away_from_the_primary() -> Net {
    let found = [ReplicaAtStart::UpToDate, ReplicaAtStart::UpToDate];
    let mut net = Net::diskless_primary_with(found, [gen(6, &[5]), gen(5, &[])]);
    net.link_up(0, 2);
    net.promote();
    assert_eq!(net.disk(2), DiskState::UpToDate);
    net
}

/// Cluster-crash + power-loss soak seed 201015450 (rule Y), met at a connection: a write
/// reaches node 2 alone (links 0-1 and 1-2 down) and node 2 marks node 1; its answer is
/// still on the wire, so the Primary has not rotated the ids yet. Node 1 then connects
/// to node 2 and says UpToDate with newer ids. Node 2, current under the Primary, holds
/// the write: it keeps its claim and node 1 pulls the block from it. (Yielded, node 2 pulled
/// the block back from node 1, which never had the write: the acknowledged write was gone
/// from both replicas.)
#[test]
fn a_replica_current_under_the_primary_keeps_its_claim_on_a_connecting_peer_with_newer_ids() {
    let mut net = contest_winner_away_from_the_primary();
    net.hold(2, 0);
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.block(2, 5)[0], 1, "node 2 wrote it");
    assert_eq!(net.claims(2, 1), BLOCK, "node 2 marks node 1");
    assert_eq!(net.answer(1), None, "node 2's answer is on the wire");
    net.link_up(1, 2);
    assert_eq!(
        net.block(2, 5)[0],
        1,
        "node 2 keeps the write: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.listed_blocks(2, 1), vec![5], "and lists it to node 1");
    assert_eq!(net.pulled_blocks(1, 2), vec![5]);
    assert_eq!(
        net.pulled_blocks(2, 1),
        Vec::<u64>::new(),
        "node 2 pulls nothing"
    );
    assert_eq!(net.block(1, 5)[0], 1, "node 1 has the write");
    net.release(2, 0);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(2, 5)[0], 1, "the acknowledged write is kept");
}

/// Cluster-crash + power-loss soak seed 201015450 (rule Y), as the seed met it: node 1,
/// connected to node 2 but not to the Primary, is being synced from node 2 (a write it
/// missed, block 5) when a second write (block 8) reaches node 2 alone; node 2's live
/// notice of it to node 1 crosses node 1's UpToDate report (newer ids: node 1 is under no
/// Primary, so it keeps its own). Both answers of node 2 are still on the wire: no
/// rotation yet. Node 2 keeps its claims; node 1 hears the notice and pulls block 8 from
/// node 2. (Yielded, node 2 went Inconsistent and asked node 1 for block 8, the
/// acknowledged write it alone held; node 1, told of it, lacked it too, and each waited
/// for the other.)
#[test]
fn a_replica_current_under_the_primary_keeps_its_claims_across_a_crossing_report_with_newer_ids() {
    let mut net = contest_winner_away_from_the_primary();
    net.link_up(1, 2);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    // Node 2's answers to the Primary wait: the Primary rotates no ids meanwhile.
    net.hold(2, 0);
    // Node 1's resync of block 5 from node 2 ends only when its last reply arrives.
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.disk(1), DiskState::Inconsistent, "told live of block 5");
    assert_eq!(net.pulled_blocks(1, 2), vec![5]);
    net.write(2, 8 * BLOCK, 4096);
    assert_eq!(net.block(2, 8)[0], 2);
    assert_eq!(net.claims(2, 1), BLOCK, "block 8 (block 5 is being served)");
    // Node 1 gets block 5 and says UpToDate before it hears of block 8: its report
    // crosses node 2's notice, which waits on the wire behind the reply.
    assert!(matches!(
        net.release_one(2, 1),
        Msg::ResyncReply { offset: 20480, .. }
    ));
    assert!(
        net.in_flight(2, 1).iter().any(|m| matches!(
            m,
            Msg::OutOfSync {
                offset: 32768,
                len: 4096,
                ..
            }
        )),
        "the notice of block 8 is on its way"
    );
    assert_eq!(net.disk(1), DiskState::UpToDate, "node 1's report is out");
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "node 2 keeps the writes: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(
        net.pulled_blocks(2, 1),
        Vec::<u64>::new(),
        "node 2 pulls nothing"
    );
    // (Its claim on block 8 goes with the report, which followed its complete list: a
    // Secondary keeps no blocks told live across it; node 1 hears of block 8 next.)
    assert_eq!(net.claims(2, 1), 0);
    net.release(2, 1);
    assert_eq!(net.pulled_blocks(1, 2), vec![5, 8]);
    assert_eq!(net.block(1, 8)[0], 2);
    net.release(2, 0);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.answer(2), Some(Ok(())));
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(2, 8)[0], 2, "the acknowledged write is kept");
}

// ------------------------------------------------------------------------- rule R

/// Disk-errors soak seed 193051170 (rule R). Node 2 missed a write (block 5) away from
/// both others; back, the Primary lists it and node 1 serves it, and node 2, UpToDate,
/// takes the Primary's ids. Its UpToDate report to node 1 is still on the wire when node 1
/// stops cleanly: node 1's metadata keeps the served block as a claim on node 2. The
/// Primary, losing node 1, rotates its ids; node 2 hears of it only after it has said its
/// old ids (equal to node 1's) to the returning node 1, so node 1 lists its stale claim.
/// Node 2, current under the Primary and with newer ids by then, marks node 1 for the
/// block instead of becoming a sync target of node 1 (which, having heard node 2's new
/// ids, pulls the block from node 2: each refused the other for ever).
#[test]
fn a_replica_current_under_the_primary_gives_a_behind_peers_stale_list_back_as_its_own_to_pull() {
    let found = [ReplicaAtStart::UpToDate, ReplicaAtStart::UpToDate];
    let mut net = Net::diskless_primary_with(found, [gen(0, &[]); 2]);
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        net.link_up(a, b);
    }
    net.promote();
    // Node 2 misses block 5 away from both.
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    // Node 1 serves it; node 2's UpToDate report to node 1 stays on the wire.
    net.hold_at(2, 1, |m| {
        matches!(
            m,
            Msg::Volume {
                disk: DiskState::UpToDate,
                ..
            }
        )
    });
    net.link_up(1, 2);
    assert_eq!(net.pulled_blocks(2, 1), vec![5]);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    let ids = *net.nodes[2].generation(0).unwrap();
    assert_eq!(&ids, net.nodes[1].generation(0).unwrap(), "the same ids");
    // The Primary's peer ack settles block 5's write on node 1 (a replica holding writes
    // not settled cannot stop cleanly).
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    // Node 1 stops cleanly; the Primary's rotation for its loss is on its way to node 2.
    net.hold(0, 2);
    net.link_down(0, 1);
    net.link_down(1, 2);
    assert_eq!(
        net.claims(1, 2),
        BLOCK,
        "the block it served, kept as a claim"
    );
    net.restart_cleanly(1);
    assert_eq!(net.disk(1), DiskState::Outdated);
    // Node 2 says its old ids to node 1; node 1's answers (its state, its list) wait.
    net.hold(1, 2);
    net.link_up(1, 2);
    assert!(
        net.in_flight(1, 2).iter().any(|m| matches!(
            m,
            Msg::OutOfSync {
                offset: 20480,
                len: 4096,
                ..
            }
        )),
        "node 1 lists its stale claim"
    );
    // Node 2 takes the new ids; node 1, hearing them, pulls the block from node 2.
    net.release(0, 2);
    let newer = *net.nodes[2].generation(0).unwrap();
    assert_ne!(newer, ids);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    // Node 1's list reaches node 2.
    net.release(1, 2);
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "not a sync target of node 1: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(net.pulled_blocks(2, 1), vec![5], "only the first resync");
    assert_eq!(
        net.listed_blocks(2, 1),
        vec![5],
        "it tells node 1 it lacks the block"
    );
    assert_eq!(net.pulled_blocks(1, 2), vec![5]);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(1, 5)[0], 1);
    assert_eq!(
        net.nodes[1].generation(0),
        Some(&newer),
        "the Primary's ids, under it"
    );
}
