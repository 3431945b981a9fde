//! Quorum: a Primary completes I/O only while it reaches a majority of the replicas (a
//! diskless node breaking a tie for a partition that held quorum), fails or holds it
//! otherwise, and a node without quorum cannot be promoted.

mod common;

use common::*;
use tandem_engine::replica::{
    DiskChange, DiskState, Event, Msg, OnNoQuorum, PromoteError, RAction, Role,
};
use tandem_engine::{Io, IoError};

/// Quorum changes node `n` reported, in order.
fn quorum_changes(net: &Net, n: u8) -> Vec<bool> {
    (net.events.iter())
        .filter(|(m, _)| *m == n)
        .filter_map(|(_, e)| match e {
            Event::QuorumChanged { quorate, .. } => Some(*quorate),
            _ => None,
        })
        .collect()
}

fn promote(net: &mut Net, n: u8) -> Result<(), PromoteError> {
    net.promote_on(n)
}

#[test]
fn a_primary_cut_off_from_both_peers_fails_writes() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(quorum_changes(&net, 0), vec![true]);
    net.link_down(0, 1);
    // Two of three: still a majority.
    net.write(2, 4096, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    net.link_down(0, 2);
    assert_eq!(quorum_changes(&net, 0), vec![true, false]);
    net.write(3, 8192, 4096);
    assert_eq!(net.answer(3), Some(Err(IoError::NoQuorum)));
    net.submit(
        4,
        Io::Read {
            offset: 0,
            len: 4096,
        },
    );
    assert_eq!(net.answer(4), Some(Err(IoError::NoQuorum)));
    net.submit(5, Io::Flush);
    assert_eq!(net.answer(5), Some(Err(IoError::NoQuorum)));
    // The other two still make a majority: either may be promoted.
    assert!(net.nodes[1].status().volumes[0].quorum.unwrap().quorate);
    assert_eq!(promote(&mut net, 1), Ok(()));
}

#[test]
fn a_write_in_flight_when_quorum_is_lost_is_not_acknowledged() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.hold(0, 1);
    net.hold(0, 2);
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), None);
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    // Written here only: acknowledged, the other side of the partition (which may
    // promote a Primary and write) would never have it.
    assert_eq!(net.answer(1), Some(Err(IoError::NoQuorum)));
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
}

#[test]
fn a_node_cut_off_from_both_peers_is_not_promoted() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.link_down(1, 0);
    net.link_down(1, 2);
    assert_eq!(quorum_changes(&net, 1), vec![true, false]);
    assert_eq!(promote(&mut net, 1), Err(PromoteError::NoQuorum(0)));
    assert_eq!(net.nodes[1].role(), Role::Secondary);
    // Forcing does not help: the majority may have a Primary.
    let mut out = Vec::new();
    assert_eq!(
        net.nodes[1].promote(true, &mut out),
        Err(PromoteError::NoQuorum(0))
    );
    assert!(
        !out.iter()
            .any(|a| matches!(a, RAction::Event(Event::DiskChanged { .. }))),
        "a refused promotion changes nothing: {out:?}"
    );
}

#[test]
fn a_diskless_tiebreaker_keeps_the_quorum_of_the_half_it_reaches() {
    // Node 0 diskless and Primary, nodes 1 and 2 the two voters.
    let mut net = Net::with_quorum(true, majority(OnNoQuorum::IoError));
    net.link_down(0, 1);
    // Node 0 reaches one voter of two and is the tiebreaker: it keeps quorum.
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(quorum_changes(&net, 0), vec![true]);
    // Node 1 still reaches node 2: two of two.
    assert_eq!(quorum_changes(&net, 1), vec![true]);
    // Now node 1 is alone: one of two and no tiebreaker. Node 2 has node 0.
    net.link_down(1, 2);
    assert_eq!(quorum_changes(&net, 1), vec![true, false]);
    assert_eq!(quorum_changes(&net, 2), vec![true]);
    net.write(2, 4096, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    assert_eq!(promote(&mut net, 1), Err(PromoteError::NoQuorum(0)));
}

#[test]
fn a_tiebreaker_does_not_give_back_a_lost_quorum() {
    let mut net = Net::with_quorum(true, majority(OnNoQuorum::IoError));
    net.link_down(0, 1);
    net.link_down(0, 2);
    assert_eq!(quorum_changes(&net, 0), vec![true, false]);
    // Back with one voter of two: the other may have gone on with another tiebreaker.
    net.link_up(0, 1);
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), Some(Err(IoError::NoQuorum)));
    assert_eq!(quorum_changes(&net, 0), vec![true, false]);
    net.link_up(0, 2);
    assert_eq!(quorum_changes(&net, 0), vec![true, false, true]);
    net.write(2, 0, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    net.assert_converges();
}

#[test]
fn suspend_io_holds_requests_until_quorum_returns() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::SuspendIo));
    net.hold(0, 1);
    net.hold(0, 2);
    net.write(1, 0, 4096);
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    // In flight when quorum went, done here alone (a minority): it fails under suspend-io
    // too (see `requests/suspended.rs`).
    assert_eq!(net.answer(1), Some(Err(IoError::NoQuorum)));
    // What arrives now waits.
    net.write(2, 4096, 4096);
    net.submit(3, Io::Flush);
    net.submit(
        4,
        Io::Read {
            offset: 4096,
            len: 4096,
        },
    );
    assert_eq!(
        (net.answer(2), net.answer(3), net.answer(4)),
        (None, None, None)
    );
    assert_eq!(net.nodes[0].app_in_flight(), 3);
    net.link_up(0, 1);
    assert_eq!(quorum_changes(&net, 0), vec![true, false, true]);
    for req in 2..=4 {
        assert_eq!(net.answer(req), Some(Ok(())), "request {req}");
    }
    // The held write went to the replica back: on two of three before it was answered.
    assert_eq!(net.block(1, 1)[0], 2);
    net.link_up(0, 2);
    net.assert_converges();
    for n in 0..3 {
        assert_eq!(net.block(n, 1)[0], 2, "node {n}");
    }
}

#[test]
fn quorum_off_keeps_a_lone_primary_writing() {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert!(net.nodes[0].status().volumes[0].quorum.is_none());
}

/// Node 0, Primary, is cut off from both peers with a write in flight (held on both
/// links), which fails; the majority promotes node 1, which writes block 2; node 0, demoted,
/// rejoins without a split brain. Returns the network, converged.
fn cut_off_then_rejoin(diskless_primary: bool) -> Net {
    cut_off_then_rejoin_after(diskless_primary, |_| {})
}

/// As `cut_off_then_rejoin`, `before` done once the first write is acknowledged.
fn cut_off_then_rejoin_after(diskless_primary: bool, before: impl FnOnce(&mut Net)) -> Net {
    let mut net = Net::with_quorum(diskless_primary, majority(OnNoQuorum::IoError));
    net.write(1, 0, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    before(&mut net);
    net.hold(0, 1);
    net.hold(0, 2);
    net.write(2, 4096, 4096);
    // Its cable is cut: every node notices by its timers (node 0 both peers in one tick;
    // with a write outstanding, by the request timeout, 6 s).
    net.cut(0, 1);
    net.cut(0, 2);
    for _ in 0..80 {
        net.tick(100);
    }
    assert!(matches!(net.answer(2), Some(Err(_))), "{:?}", net.answer(2));
    assert_eq!(quorum_changes(&net, 0), vec![true, false]);
    if !diskless_primary {
        assert_eq!(
            net.block(0, 1)[0],
            2,
            "the failed write is on node 0's replica"
        );
    }
    assert_eq!(promote(&mut net, 1), Ok(()));
    let write = Io::Write {
        offset: 8192,
        len: 4096,
        fua: false,
    };
    net.submit_on(1, 3, write);
    assert_eq!(net.answer_on(1, 3), Some(Ok(())));
    let mut out = Vec::new();
    net.nodes[0].demote(&mut out).unwrap();
    net.push(0, out);
    net.run();
    // The drops by the timers are done with: what follows must drop nothing.
    net.dropped.clear();
    net.link_up(0, 2);
    net.link_up(0, 1);
    let diverged: Vec<_> = (net.events.iter())
        .filter(|(_, e)| matches!(e, Event::GenerationsDiverged { .. }))
        .collect();
    assert!(diverged.is_empty(), "{diverged:?}");
    assert!(
        net.dropped.is_empty(),
        "connections dropped: {:?}",
        net.dropped
    );
    // Converged (assert_converges compares the replicas of every diskful node).
    net.assert_converges();
    assert_eq!(net.block(1, 2)[0], 3);
    net
}

/// A diskless Primary: the failed write, which no replica may be said to lack by a node
/// that kept no copy and had no quorum, is settled by the replicas themselves.
#[test]
fn a_diskless_primary_cut_off_rejoins_the_majority_that_went_on() {
    cut_off_then_rejoin(true);
}

/// A diskful Primary: its failed write landed on its own replica only. Demoted without
/// quorum, it turns Outdated and pulls that back from the new Primary, as after a crash.
#[test]
fn a_diskful_primary_cut_off_rejoins_the_majority_that_went_on() {
    let net = cut_off_then_rejoin(false);
    let lost = |e: &Event| {
        matches!(
            e,
            Event::DiskChanged {
                why: DiskChange::LostQuorum { bytes: 4096 },
                ..
            }
        )
    };
    assert!(
        (net.events.iter()).any(|(n, e)| *n == 0 && lost(e)),
        "node 0 did not turn Outdated for its failed write: {:?}",
        net.events
    );
    for n in 0..3 {
        assert_eq!(net.block(n, 1)[0], 0, "node {n}: the failed write");
        assert_eq!(net.block(n, 2)[0], 3, "node {n}");
    }
}

/// Connected to a majority is not enough: a write is acknowledged only once a majority of
/// the replicas holds it. Node 2 comes back while a write sent to node 1 alone is in
/// flight (it is never sent the write: it will pull it); node 1 then goes. Nodes 0 and 2
/// are a majority, but only node 0 holds the write: it fails (quorum + stalls seed
/// 303006807).
#[test]
fn a_write_held_by_fewer_than_a_majority_is_not_acknowledged() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.link_down(0, 2);
    net.hold(0, 1);
    net.write(1, 0, 4096);
    net.link_up(0, 2);
    assert_eq!(net.answer(1), None);
    net.link_down(0, 1);
    assert!(net.nodes[0].status().volumes[0].quorum.unwrap().quorate);
    assert_eq!(net.answer(1), Some(Err(IoError::NoQuorum)));
    net.link_up(0, 1);
    net.assert_converges();
}

/// Failover seed 1439: a Primary being synced (here: invalidated, block 1 pulled already)
/// writes block 1 with both links stalled; the write lands on its own replica only and
/// fails when its cable is cut. Demoted without quorum, node 0 forgets what it claims its
/// peers lack there, as every such Primary: being synced, it pulls those ranges back, its
/// write there no longer protected as newer than its source's data. Before, it kept the
/// failed write, and the replicas differed at the end.
#[test]
fn a_primary_being_synced_pulls_back_its_failed_write_when_demoted_without_quorum() {
    let net = cut_off_then_rejoin_after(false, |net| {
        // Node 0 throws its replica away: pulled in full, nothing arrives yet.
        net.hold(1, 0);
        net.hold(2, 0);
        let mut out = Vec::new();
        net.nodes[0].invalidate(0, &mut out).unwrap();
        net.push(0, out);
        net.run();
        assert_eq!(net.disk(0), DiskState::Inconsistent);
        // The first chunk (block 1 among it) arrives: pulled, no longer to pull.
        for from in [1, 2] {
            let first = (net.in_flight(from, 0).into_iter())
                .position(|m| matches!(m, Msg::ResyncReply { offset: 0, .. }));
            for _ in 0..first.map_or(0, |k| k + 1) {
                net.release_one(from, 0);
            }
        }
    });
    for n in 0..3 {
        assert_eq!(net.block(n, 1)[0], 0, "node {n}: the failed write");
        assert_eq!(net.block(n, 2)[0], 3, "node {n}");
    }
}
