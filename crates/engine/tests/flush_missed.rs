//! A FLUSH (or FUA write) whose barrier missed a replica that may hold the current
//! generation id completes only once the ids changed, as a write that missed one does
//! (`generation.rs`): the replicas that answered the barrier hold the new ids durably
//! first, so if every node then crashes, the one that missed it (what it holds of the
//! writes before the barrier maybe gone with its page cache) is the older one and syncs
//! from them. A diskless Primary (node 0) and two Secondaries under protocol A over the
//! shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, NodeId, Protocol, ReplicaAtStart, Resource};
use tandem_engine::Io;

/// Write 1 (block 3) lands on both Secondaries; then request 2 (`io`, a FLUSH or a FUA
/// write of block 5) starts a barrier: node 2 answers it, node 1 never gets it (held) and
/// its link drops. The Primary's packets to node 2 wait from then on: its new ids (node 1
/// may hold the current ones) are on the wire.
fn barrier_missing_node_1(io: Io) -> Net {
    let mut net = Net::diskless_primary_under(Protocol::A);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!((net.block(1, 3)[0], net.block(2, 3)[0]), (1, 1), "on both");
    net.hold_at(0, 1, |m| matches!(m, Msg::Barrier { .. }));
    net.submit(2, io);
    let answered = net.delivered(2, 0, |m| matches!(m, Msg::BarrierAck { errno: 0, .. }));
    assert_eq!(answered.len(), 1, "node 2 answered the barrier");
    assert_eq!(net.answer(2), None, "node 1's part is open");
    net.hold(0, 2);
    net.link_down(0, 1);
    net
}

fn fua_write() -> Io {
    Io::Write {
        offset: 5 * BLOCK,
        len: 4096,
        fua: true,
    }
}

/// Every node crashes at once (what is on the wire is lost); node 1's power loss takes
/// block 3 back (it never flushed it). Nodes 1 and 2 start again `Crashed`, block 3 in
/// their activity logs, with their ids and bitmaps (plus the log's extent); node 0 as a
/// new run of its engine.
fn crash_every_node(net: &mut Net) {
    let mut kept = Vec::new();
    for n in [1, 2] {
        let old = &net.nodes[n as usize];
        let gen = *old.generation(0).expect("a replica");
        let peer: NodeId = 3 - n;
        let mut words = old.out_of_sync_words(0, peer).expect("a peer").to_vec();
        words[0] |= 1 << 3; // the log's extent, as the daemon restores a bitmap
        kept.push((
            n,
            old.writer(),
            vec![(peer, words, old.bitmap_gi(0, peer))],
            gen,
        ));
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        net.cut(a, b);
    }
    net.lose_block(1, 3);
    for (n, writer, peers, gen) in kept {
        net.start_crashed(n, &[(3 * BLOCK, BLOCK)], writer, &peers, gen);
    }
    let mut spec = net.spec(0);
    spec.gi_seed ^= 1 << 40;
    net.nodes[0] = Resource::new(spec, vec![ReplicaAtStart::None]);
}

/// Cluster-crash + power-loss seed 267015082, reduced: the FLUSH waits for node 2 to hold
/// the new ids. (Before, it completed at node 1's drop, node 2's new ids still on the
/// wire.)
#[test]
fn a_flush_that_missed_a_replica_waits_for_the_new_ids() {
    let mut net = barrier_missing_node_1(Io::Flush);
    assert_eq!(net.answer(2), None, "node 2 does not hold the new ids yet");
    net.release(0, 2);
    assert_eq!(net.answer(2), Some(Ok(())));
    let (g1, g2) = (net.nodes[1].generation(0), net.nodes[2].generation(0));
    let (g1, g2) = (*g1.unwrap(), *g2.unwrap());
    assert!(g2.history.contains(&g1.current), "node 2's ids are newer");
}

/// The same for a FUA write: its data reached node 1 (which answered it), its barrier
/// did not.
#[test]
fn a_fua_write_whose_barrier_missed_a_replica_waits_for_the_new_ids() {
    let mut net = barrier_missing_node_1(fua_write());
    assert_eq!(net.answer(2), None, "node 2 does not hold the new ids yet");
    net.release(0, 2);
    assert_eq!(net.answer(2), Some(Ok(())));
}

/// The seed's end: every node crashes the moment the FLUSH is answered. Node 2, with
/// the newer ids, is the reference, and node 1 pulls block 3 back from it: write 1, which
/// the FLUSH made durable, is on both. (Before: answered at node 1's drop, with the same
/// ids on both; node 1 won the contest by its lower node id, node 2 pulled its activity
/// log's block 3 from it, and write 1 was gone from both replicas.)
#[test]
fn a_write_a_flush_made_durable_survives_a_crash_of_every_node_after_it() {
    let mut net = barrier_missing_node_1(Io::Flush);
    if net.answer(2).is_none() {
        net.release(0, 2);
    }
    assert_eq!(net.answer(2), Some(Ok(())));
    crash_every_node(&mut net);
    net.link_up(1, 2);
    net.tick(50);
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "node 2 is the reference: {:?}",
        net.disk_changes(2)
    );
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.promote();
    net.assert_converges();
    assert_eq!(net.block(2, 3)[0], 1, "node 2 kept write 1");
    assert_eq!(net.block(1, 3)[0], 1, "node 1 pulled it back");
}

/// A replica back after a cut says UpToDate until the Primary's list reaches it, and the
/// list waits for the writes in flight that missed it: the barrier of a FLUSH may reach
/// it first. Its answer vouches only for what it holds, not for the write it missed while
/// away, so when the replica that holds that write is gone too the FLUSH fails, not
/// completes with the write durable nowhere (overlapping seed 286090154).
#[test]
fn a_replica_the_primary_knows_lacks_writes_does_not_answer_for_a_flush() {
    let mut net = Net::diskless_primary();
    net.link_down(1, 2);
    net.link_down(0, 2);
    // On node 1 only.
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!((net.block(1, 3)[0], net.block(2, 3)[0]), (1, 0));
    // Write 2 is in flight to node 1 alone (held) when node 2 returns: the list to node 2
    // waits for it, and the FLUSH's barrier goes out first.
    net.hold(0, 1);
    net.write(2, 7 * BLOCK, 4096);
    net.link_up(0, 2);
    net.submit(3, Io::Flush);
    let answered = net.delivered(2, 0, |m| matches!(m, Msg::BarrierAck { errno: 0, .. }));
    assert_eq!(answered.len(), 1, "node 2 answered the barrier");
    // Node 1, which holds write 1, goes with its page cache.
    net.link_down(0, 1);
    assert_ne!(
        net.answer(3),
        Some(Ok(())),
        "the FLUSH completed though no replica that answered it holds write 1"
    );
}
