//! Peer acks (`settle.rs`): a receiving replica holds a Primary's write until the Primary
//! says every replica has it, and Secondaries that lose the Primary compare what they
//! received. Three diskful nodes over an in-memory network whose disks answer at once.

mod common;

use common::{Net, SIZE};
use tandem_engine::replica::{DiskState, Msg, NodeId, RAction, ReplicaAtStart, Resource, Role};

#[test]
fn a_secondary_holds_a_write_until_the_primary_settles_it() {
    let mut net = Net::new();
    net.write(1, 8192, 4096);
    for n in [1, 2] {
        assert_eq!(
            net.nodes[n].unsettled_writes(0),
            vec![(8192, 4096)],
            "node {n} wrote it and holds it"
        );
    }
    assert!(net.settled.is_empty(), "{:?}", net.settled);
    // Both wrote it; the Primary tells them after a short delay (or a full batch).
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    for n in [1, 2] {
        assert!(net.nodes[n].unsettled_writes(0).is_empty());
        assert!(
            net.settled.contains(&(n as NodeId, 0, 1)),
            "{:?}",
            net.settled
        );
    }
}

#[test]
fn a_peer_ack_naming_a_node_that_lacks_the_write_marks_it_on_the_others() {
    let mut net = Net::new();
    // Node 2 receives the write, but its acknowledgement is lost: the link drops.
    net.pass = |from, to, msg| !(from == 2 && to == 0 && matches!(msg, Msg::WriteAck { .. }));
    net.write(1, 8192, 4096);
    net.link_lost(0, 2);
    net.run();
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    // Settled with node 2 missing: node 1 marks node 2 (and, connected to it, tells it:
    // node 2 pulls the block from node 1).
    assert_eq!(net.listed(1, 2), vec![(8192, 4096)]);
    assert_eq!(net.pulled(2, 1), vec![(8192, 4096)]);
    assert!(net.settled.contains(&(1, 0, 1)), "{:?}", net.settled);
}

/// Simulator crash-family seed 52: the Primary dies with a write that reached node 1 only.
/// The two Secondaries compare what they received; node 1 holds the later write and lists
/// it to node 2, which pulls it.
#[test]
fn secondaries_that_lost_the_primary_reconcile_a_write_only_one_received() {
    let mut net = Net::new();
    net.pass = |from, to, msg| !(from == 0 && to == 2 && matches!(msg, Msg::Write { .. }));
    net.write(1, 8192, 4096);
    assert_eq!(net.nodes[1].unsettled_writes(0), vec![(8192, 4096)]);
    assert!(net.nodes[2].unsettled_writes(0).is_empty());
    net.pass = |_, _, _| true;
    // The Primary dies.
    for n in [1, 2] {
        net.cut(0, n);
        net.notice_down(n, 0);
    }
    net.run();
    net.tick(1);
    for n in [1, 2] {
        assert_eq!(net.nodes[n].disk(0), DiskState::UpToDate, "node {n}");
        assert_eq!(net.nodes[n].role(), Role::Secondary);
        let st = net.nodes[n].status();
        assert!(
            st.peers.iter().all(|p| p.volumes[0].out_of_sync_bytes == 0),
            "node {n}: {st:?}"
        );
    }
    assert_eq!(net.listed(1, 2), vec![(8192, 4096)]);
    assert_eq!(
        net.pulled(2, 1),
        vec![(8192, 4096)],
        "node 2 pulls the write it missed"
    );
    assert!(net.listed(2, 1).is_empty());
    assert!(
        net.nodes[1].unsettled_writes(0).is_empty(),
        "compared: released"
    );
    assert!(net.settled.contains(&(1, 0, u64::MAX)), "{:?}", net.settled);
}

/// The Primary's links drop one after the other: node 2 asks node 1 how far it got while
/// node 1 is still connected to that run. Node 1 keeps the question and compares once it
/// loses the Primary too; before, it dropped it, and the later write it alone held was
/// never listed to node 2 (the real-daemon test `ext4_survives_the_death_of_its_diskless_
/// primary`: the replicas differed by the writes the last Secondary received). With
/// `first_write_missed`, node 2 received nothing of that run and asks with a zero.
fn a_question_asked_while_still_connected(diskless: bool, first_write_missed: bool) {
    let mut net = if diskless {
        Net::diskless_primary()
    } else {
        Net::new()
    };
    if !first_write_missed {
        net.write(1, 0, 4096);
    }
    net.pass = |from, to, msg| !(from == 0 && to == 2 && matches!(msg, Msg::Write { .. }));
    net.write(2, 8192, 4096);
    net.pass = |_, _, _| true;
    net.cut(0, 1);
    net.cut(0, 2);
    net.notice_down(2, 0);
    net.run();
    assert!(
        !net.delivered(2, 1, |m| matches!(m, Msg::PrimaryLost { .. }))
            .is_empty(),
        "node 2 asked node 1 while it was still connected to the Primary"
    );
    net.notice_down(1, 0);
    net.run();
    net.tick(1);
    assert_eq!(
        net.listed(1, 2),
        vec![(8192, 4096)],
        "node 1 lists its later write"
    );
    assert_eq!(net.pulled(2, 1), vec![(8192, 4096)], "node 2 pulls it");
    for n in [1, 2] {
        assert_eq!(net.nodes[n].disk(0), DiskState::UpToDate, "node {n}");
        assert!(
            net.nodes[n].unsettled_writes(0).is_empty(),
            "node {n} compared"
        );
    }
    assert_eq!(net.block(1, 2), net.block(2, 2));
}

#[test]
fn a_question_asked_while_still_connected_to_the_primary_is_answered_at_its_loss() {
    a_question_asked_while_still_connected(false, false);
}

#[test]
fn a_diskless_primarys_secondaries_compare_though_one_lost_it_first() {
    a_question_asked_while_still_connected(true, false);
}

#[test]
fn a_zero_asked_while_still_connected_to_the_primary_is_answered_at_its_loss() {
    a_question_asked_while_still_connected(true, true);
}

/// Cluster-crash seed 424, reduced: node 1 loses the Primary and asks node 2, still under
/// it, which keeps the question; node 1 is back under the same run, withdraws it, and takes
/// the next write with node 2. When node 2 then loses the Primary with that write not
/// settled, it marks nothing on node 1 (before, it compared with node 1's stale last write
/// and claimed node 1 lacked the write both held).
#[test]
fn a_question_withdrawn_at_meeting_the_run_again_is_not_compared() {
    let mut net = Net::new();
    net.write(1, 0, 4096);
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    net.link_down(0, 1);
    assert!(!net
        .delivered(1, 2, |m| matches!(m, Msg::PrimaryLost { seq: 1, .. }))
        .is_empty());
    net.link_up(0, 1);
    node_2_loses_the_next_write_unsettled(&mut net);
}

/// Failover seed 151, reduced: both Secondaries lose the Primary; node 1, which received
/// the later write, compares with node 2's question, and its own reaches node 2 only once
/// node 2 is back under the same run, which keeps it. Node 1 met that run again too: it
/// withdraws the question though it had compared already.
#[test]
fn a_question_compared_then_withdrawn_is_not_compared_again() {
    let mut net = Net::new();
    net.write(1, 0, 4096);
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    net.pass = |from, to, msg| !(from == 0 && to == 2 && matches!(msg, Msg::Write { .. }));
    net.write(2, 4096, 4096);
    net.pass = |_, _, _| true;
    net.cut(0, 1);
    net.cut(0, 2);
    net.hold(1, 2);
    net.notice_down(2, 0);
    net.notice_down(1, 0);
    net.notice_down(0, 1);
    net.notice_down(0, 2);
    net.run();
    assert!(
        net.claims(1, 2) > 0,
        "node 1 compared: node 2 lacks write 2"
    );
    net.link_up(0, 2);
    net.release(1, 2);
    net.link_up(0, 1);
    node_2_loses_the_next_write_unsettled(&mut net);
}

/// Node 1 withdrew its question; the next write reaches both Secondaries and is not settled
/// when node 2 loses the Primary: node 2 marks nothing on node 1.
fn node_2_loses_the_next_write_unsettled(net: &mut Net) {
    assert!(!net
        .delivered(1, 2, |m| matches!(
            m,
            Msg::PrimaryLost { seq: u64::MAX, .. }
        ))
        .is_empty());
    net.assert_converges();
    net.pass = |_, _, msg| !matches!(msg, Msg::PeerAck { .. });
    net.write(9, 8192, 4096);
    assert_eq!(net.answer(9), Some(Ok(())));
    for n in [1, 2] {
        assert_eq!(
            net.nodes[n].unsettled_writes(0),
            vec![(8192, 4096)],
            "node {n}"
        );
    }
    net.pass = |_, _, _| true;
    net.link_down(0, 2);
    net.tick(1);
    assert_eq!(net.claims(2, 1), 0, "node 1 holds the write");
    assert!(net.listed(2, 1).is_empty());
    net.link_up(0, 2);
    net.assert_converges();
    assert_eq!(net.claims(2, 1), 0);
}

/// A Secondary still connected to the Primary does not compare: the Primary knows what
/// each replica lacks (node 1's link alone dropped).
#[test]
fn a_secondary_still_under_the_primary_does_not_compare() {
    let mut net = Net::new();
    net.pass = |from, to, msg| !(from == 1 && to == 0 && matches!(msg, Msg::WriteAck { .. }));
    net.write(1, 8192, 4096);
    net.link_lost(0, 1);
    net.run();
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    let st = net.nodes[2].status();
    assert!(
        st.peers.iter().all(|p| p.volumes[0].out_of_sync_bytes == 0),
        "{st:?}"
    );
    assert!(net.listed(1, 2).is_empty(), "node 1 claims nothing");
    // The Primary settled the write with node 1 missing: node 2 tells node 1, which
    // pulls the block (it may have written it before its link dropped, or not).
    assert_eq!(net.listed(2, 1), vec![(8192, 4096)]);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    // It keeps the write held until it has compared with node 2 (once node 2 loses the
    // Primary too) or meets the same run of the Primary again, which never forgot.
    assert_eq!(net.nodes[1].unsettled_writes(0), vec![(8192, 4096)]);
    net.link_up(0, 1);
    assert!(net.nodes[1].unsettled_writes(0).is_empty());
    assert!(net.settled.contains(&(1, 0, u64::MAX)), "{:?}", net.settled);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
}

/// A Primary that restarted is another run: meeting it again settles nothing, and the
/// Secondaries still compare what the lost run sent them.
#[test]
fn a_restarted_primary_does_not_settle_what_its_last_run_sent() {
    let mut net = Net::new();
    net.pass = |from, to, msg| !(from == 0 && to == 2 && matches!(msg, Msg::Write { .. }));
    net.write(1, 8192, 4096);
    net.pass = |_, _, _| true;
    // Node 0 crashes; node 2's link to node 1 is down meanwhile, so they cannot compare.
    net.link_lost(1, 2);
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    let mut s = net.spec(0);
    s.gi_seed ^= 1;
    net.nodes[0] = Resource::new(s, vec![ReplicaAtStart::UpToDate]);
    net.link_up(0, 1);
    net.link_up(0, 2);
    assert_eq!(
        net.nodes[1].unsettled_writes(0),
        vec![(8192, 4096)],
        "still held: the new run knows nothing of it"
    );
    net.link_up(1, 2);
    assert_eq!(net.listed(1, 2), vec![(8192, 4096)]);
    assert!(net.nodes[1].unsettled_writes(0).is_empty());
}

/// A peer's acknowledgement of everything, or its loss of a node that is not in the
/// resource, changes nothing it should not: the first settles what it sent us, the second
/// drops the connection with a typed error (never a panic).
#[test]
fn hostile_peer_acks_and_lost_primaries_are_handled() {
    use tandem_engine::replica::{LinkLoss, ProtocolError};
    use tandem_wire::packet::Packet;
    let mut net = Net::new();
    net.write(1, 8192, 4096);
    let mut out = Vec::new();
    let all = Packet::PeerAck {
        seq: u64::MAX,
        missing: u32::MAX,
    };
    net.nodes[1].packet(0, &all, &mut out);
    assert!(net.nodes[1].unsettled_writes(0).is_empty());
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Settled {
                peer: 0,
                upto: u64::MAX,
                ..
            }
        )),
        "{out:?}"
    );
    out.clear();
    let stranger = Packet::PrimaryLost {
        primary: 9,
        incarnation: 1,
        seq: 5,
    };
    net.nodes[1].packet(2, &stranger, &mut out);
    let dropped = out.iter().any(|a| {
        matches!(
            a,
            RAction::Disconnect {
                peer: 2,
                reason: LinkLoss::Misbehaved(ProtocolError::UnknownNode(9))
            }
        )
    });
    assert!(dropped, "{out:?}");
}

/// Node 2 crashes (the same boot) and comes back with its whole volume named by its
/// activity log and the run it took writes from, as its metadata keeps them; node 0
/// wrote one block meanwhile. `primary_restarts`: node 0 restarted too (a new run).
fn crash_node_2(primary_restarts: bool) -> Net {
    let mut net = Net::new();
    net.write(1, 0, 4096);
    net.tick(20);
    let run = net.nodes[2]
        .writer()
        .expect("node 2 recorded the Primary's run");
    assert_eq!(run.node, 0);
    net.link_lost(0, 2);
    net.link_lost(1, 2);
    net.run();
    net.write(2, 65536, 4096);
    if primary_restarts {
        net.link_lost(0, 1);
        let mut s = net.spec(0);
        s.gi_seed ^= 1;
        net.nodes[0] = Resource::new(s, vec![ReplicaAtStart::UpToDate]);
        net.link_up(0, 1);
        let mut out = Vec::new();
        net.nodes[0].promote(false, &mut out).unwrap();
        net.push(0, out);
        net.run();
    }
    net.nodes[2] = Resource::new(net.spec(2), vec![ReplicaAtStart::Crashed]);
    net.nodes[2].restore_suspect(0, [(0, SIZE)]).unwrap();
    net.nodes[2].restore_writer(0, run).unwrap();
    net.sent.clear();
    net.link_up(0, 2);
    net.link_up(1, 2);
    for _ in 0..50 {
        net.tick(20);
    }
    net
}

#[test]
fn a_secondary_back_from_a_crash_under_the_same_primary_run_pulls_only_what_it_missed() {
    let net = crash_node_2(false);
    let pulled = net.distinct_pulled(2);
    assert_eq!(pulled, 4096, "only the block written while it was away");
    assert_eq!(net.nodes[2].disk(0), DiskState::UpToDate);
}

#[test]
fn a_secondary_back_from_a_crash_under_a_new_primary_run_pulls_its_log() {
    let net = crash_node_2(true);
    let pulled = net.distinct_pulled(2);
    assert_eq!(pulled, SIZE, "its activity log names the whole volume");
    assert_eq!(net.nodes[2].disk(0), DiskState::UpToDate);
    assert_eq!(net.nodes[2].writer().map(|r| r.node), Some(0));
}

/// Node `n`'s link to the Primary drops, and the write `req` at `offset` misses it; the
/// peer ack tells the other Secondary.
fn misses_write(net: &mut Net, n: NodeId, req: u64, offset: u64) {
    net.link_lost(0, n);
    net.write(req, offset, 4096);
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
}

/// Simulator overlapping seed 5730: two Secondaries apart from each other each missed
/// writes in turn while cut off from the Primary, and each was synced by it. Their claims
/// on each other were stale; they listed them to each other at every meeting, each took
/// the other's for a conflict only the Primary could settle (`LackPrimaryWrites`) and they
/// redialled forever. The Primary's `InSync` drops them as each sync ends.
#[test]
fn a_replica_the_primary_synced_is_no_longer_claimed_by_a_secondary_away_from_it() {
    let mut net = Net::new();
    net.link_lost(1, 2);
    // Node 2 misses a write: the peer ack tells node 1, which claims it.
    misses_write(&mut net, 2, 1, 8192);
    assert_eq!(net.claims(1, 2), 4096);
    // The Primary syncs node 2; node 1, away from node 2, hears it.
    net.link_up(0, 2);
    assert_eq!(net.nodes[2].disk(0), DiskState::UpToDate);
    assert!(net
        .sent
        .iter()
        .any(|&(f, t, m)| f == 0 && t == 1 && matches!(m, Msg::InSync { node: 2, .. })));
    assert_eq!(net.claims(1, 2), 0, "the claim went with the sync");
    // In turn node 1 misses one, and node 2 claims it until the Primary syncs node 1.
    misses_write(&mut net, 1, 2, 65536);
    assert_eq!(net.claims(2, 1), 4096);
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    assert_eq!(net.claims(2, 1), 0);
    // They meet: nothing to list, nothing to pull, no redial.
    net.link_up(1, 2);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    assert!(net.listed(1, 2).is_empty() && net.listed(2, 1).is_empty());
    assert!(net.pulled(1, 2).is_empty() && net.pulled(2, 1).is_empty());
}

/// A claim made after the Primary's word (a write the node missed since) stays: only what
/// the node pulled goes. The word from a Secondary, or naming no other node or volume, is
/// refused.
#[test]
fn in_sync_keeps_later_claims_and_is_refused_from_a_secondary() {
    let mut net = Net::new();
    net.link_lost(1, 2);
    misses_write(&mut net, 2, 1, 8192);
    net.link_up(0, 2);
    assert_eq!(net.claims(1, 2), 0);
    // Node 2 misses another write after its sync: that claim is new, and stays.
    misses_write(&mut net, 2, 2, 16384);
    assert_eq!(net.claims(1, 2), 4096);
    // A hostile or confused word: from a Secondary it is refused, naming an unknown node
    // or volume too; none of them touches the claim.
    let mut out = Vec::new();
    let bad = [
        (
            2,
            tandem_wire::packet::Packet::InSync { volume: 0, node: 2 },
        ),
        (
            0,
            tandem_wire::packet::Packet::InSync { volume: 0, node: 9 },
        ),
        (
            0,
            tandem_wire::packet::Packet::InSync { volume: 3, node: 2 },
        ),
        (
            0,
            tandem_wire::packet::Packet::InSync { volume: 0, node: 0 },
        ),
    ];
    for (from, p) in bad {
        net.nodes[1].packet(from, &p, &mut out);
    }
    assert_eq!(net.claims(1, 2), 4096);
}
