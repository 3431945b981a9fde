//! Failover among three nodes: one Primary at a time, even in partitions only one node
//! bridges (see `replica/primaries.rs`): a node whose peer follows another Primary is not
//! promoted, a Secondary refuses a second Primary, and a Primary without quorum that learns
//! of the new one steps down, failing what it held, and converges from it.

mod common;

use common::*;
use tandem_engine::replica::{
    DiskChange, DiskState, Event, GenIds, LinkLoss, Msg, OnNoQuorum, PromoteError, ProtocolError,
    Role, RoleChange,
};
use tandem_engine::{Io, IoError};

fn promote(net: &mut Net, n: u8) -> Result<(), PromoteError> {
    net.promote_on(n)
}

fn write_on(net: &mut Net, n: u8, req: u64, block: u64) {
    net.write_block_on(n, req, block);
}

/// Why node `n` dropped its link to `peer`, if it did.
fn drop_reason(net: &Net, n: u8, peer: u8) -> Option<LinkLoss> {
    net.events.iter().rev().find_map(|(m, e)| match e {
        Event::PeerLost { peer: p, reason } if *m == n && *p == peer => Some(reason.clone()),
        _ => None,
    })
}

/// Node 0, Primary, writes block 1 (request 1), is cut off from both peers holding write
/// 2 (block 2, suspend-io), and node 1, promoted with node 2, writes block 2 (request 3).
fn cut_off_holding_a_write_while_node_1_writes_on(net: &mut Net) {
    write_on(net, 0, 1, 1);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_down(0, 1);
    net.link_down(0, 2);
    write_on(net, 0, 2, 2);
    assert_eq!(net.answer(2), None, "held without quorum");
    assert_eq!(promote(net, 1), Ok(()));
    write_on(net, 1, 3, 2);
    assert_eq!(net.answer_on(1, 3), Some(Ok(())));
}

/// An asymmetric partition: nodes 0 (Primary) and 1 lose their link, both still reach
/// node 2. Node 1 and node 2 are a majority, but node 2 follows node 0: promoting node 1
/// would make two Primaries, each with a quorum through node 2.
#[test]
fn a_node_whose_peer_follows_another_primary_is_not_promoted() {
    for diskless in [false, true] {
        let mut net = Net::with_quorum(diskless, majority(OnNoQuorum::IoError));
        net.link_down(0, 1);
        assert!(net.nodes[1].status().volumes[0].quorum.unwrap().quorate);
        assert_eq!(
            promote(&mut net, 1),
            Err(PromoteError::PrimaryBeyond { primary: 0, via: 2 })
        );
        let auto = net.attach_on(1);
        assert_eq!(net.nodes[1].role(), Role::Secondary, "{auto:?}");
        // The Primary goes on with node 2.
        write_on(&mut net, 0, 1, 3);
        assert_eq!(net.answer(1), Some(Ok(())));
        // Once node 2 no longer follows it, node 1 may be promoted.
        net.link_down(0, 2);
        assert_eq!(promote(&mut net, 1), Ok(()));
        write_on(&mut net, 1, 2, 4);
        assert_eq!(net.answer_on(1, 2), Some(Ok(())));
    }
}

/// Two promotions that could not see each other (quorum off here, so that node 1 may be
/// promoted alone): node 2, following node 0, refuses node 1 as a second Primary, and
/// none of node 1's writes reaches it.
#[test]
fn a_secondary_refuses_a_second_primary() {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(1, 2);
    assert_eq!(promote(&mut net, 1), Ok(()));
    write_on(&mut net, 1, 7, 5);
    net.dropped.clear();
    net.link_up(1, 2);
    assert!(net.dropped.contains(&(2, 1)), "{:?}", net.dropped);
    assert_eq!(
        drop_reason(&net, 2, 1),
        Some(LinkLoss::Misbehaved(ProtocolError::SecondPrimary {
            first: 0
        }))
    );
    assert_ne!(net.block(2, 5)[0], 7, "node 1's write reached node 2");
}

/// The old Primary, cut off with suspend-io, holds a write; the majority promotes node 1,
/// which writes on. Back, node 0 meets node 1: it fails the held write (never written
/// over the new Primary's data), becomes Secondary, and converges from node 1.
#[test]
fn a_suspended_primary_meeting_the_new_one_steps_down_and_fails_what_it_held() {
    for diskless in [true, false] {
        let mut net = Net::with_quorum(diskless, majority(OnNoQuorum::SuspendIo));
        cut_off_holding_a_write_while_node_1_writes_on(&mut net);
        net.link_up(0, 1);
        assert_eq!(net.answer(2), Some(Err(IoError::NoQuorum)));
        assert_eq!(net.nodes[0].role(), Role::Secondary);
        assert!(net.events.iter().any(|(n, e)| *n == 0
            && matches!(
                e,
                Event::RoleChanged {
                    why: RoleChange::Yielded { to: 1 },
                    ..
                }
            )));
        // The first meeting was dropped (both were Primary); the next one is not.
        net.link_down(0, 1);
        net.dropped.clear();
        net.link_up(0, 1);
        net.link_up(0, 2);
        assert!(net.dropped.is_empty(), "{:?}", net.dropped);
        net.assert_converges();
        assert_eq!(net.block(1, 2)[0], 3);
        assert_eq!(net.block(2, 2)[0], 3);
        if !diskless {
            assert_eq!(net.block(0, 2)[0], 3);
        }
    }
}

/// Two Primaries, each without quorum apart from the other, meet: the later one, promoted
/// while the older was cut off, does not step down for a run it followed before its
/// tenure, whichever hears the other first; the older one steps down and fails what it
/// held (failover seed 347003671: the later one heard the older first and yielded, and
/// the older completed writes after the later one's acknowledged ones).
#[test]
fn a_primary_does_not_yield_to_one_it_followed_before_its_tenure() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::SuspendIo));
    cut_off_holding_a_write_while_node_1_writes_on(&mut net);
    net.link_down(1, 2);
    // Node 0's role reaches node 1 first.
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].role(), Role::Primary);
    assert_eq!(net.nodes[0].role(), Role::Secondary);
    assert_eq!(net.answer(2), Some(Err(IoError::NoQuorum)));
}

/// The same old Primary meets a Secondary that follows the new Primary first: that
/// Secondary refuses it, and the old Primary, learning of the new one from its report,
/// steps down too (it would otherwise hold its clients' requests for ever, refused by
/// every peer).
#[test]
fn a_suspended_primary_steps_down_when_a_peer_follows_the_new_one() {
    let mut net = Net::with_quorum(true, majority(OnNoQuorum::SuspendIo));
    net.link_down(0, 1);
    net.link_down(0, 2);
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer(2), None);
    assert_eq!(promote(&mut net, 1), Ok(()));
    write_on(&mut net, 1, 3, 2);
    net.link_up(0, 2);
    assert_eq!(
        drop_reason(&net, 2, 0),
        Some(LinkLoss::Misbehaved(ProtocolError::SecondPrimary {
            first: 1
        }))
    );
    assert_eq!(net.answer(2), Some(Err(IoError::NoQuorum)));
    assert_eq!(net.nodes[0].role(), Role::Secondary);
    net.link_down(0, 2);
    net.dropped.clear();
    net.link_up(0, 2);
    net.link_up(0, 1);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    net.assert_converges();
    assert_eq!(net.block(2, 2)[0], 3);
}

/// A Primary that keeps its quorum does not step down for one that has none (the other
/// one does), and with quorum off neither does: two Primaries stay a split brain.
#[test]
fn only_a_primary_without_quorum_steps_down() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::SuspendIo));
    net.link_down(0, 1);
    net.link_down(0, 2);
    assert_eq!(promote(&mut net, 1), Ok(()));
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].role(), Role::Primary);
    assert_eq!(net.nodes[0].role(), Role::Secondary);

    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(0, 2);
    assert_eq!(promote(&mut net, 1), Ok(()));
    net.link_up(0, 1);
    assert_eq!(net.nodes[0].role(), Role::Primary);
    assert_eq!(net.nodes[1].role(), Role::Primary);
    assert_eq!(
        drop_reason(&net, 0, 1),
        Some(LinkLoss::Misbehaved(ProtocolError::BothPrimary))
    );
}

fn leave(net: &mut Net, n: u8) -> bool {
    let mut out = Vec::new();
    let told = net.nodes[n as usize].leave(&mut out);
    net.push(n, out);
    net.run();
    told
}

fn quorate(net: &Net, n: u8) -> bool {
    net.nodes[n as usize].status().volumes[0]
        .quorum
        .unwrap()
        .quorate
}

/// Last man standing: the Secondaries stop cleanly one after the other, each telling the
/// others; the Primary keeps its quorum down to itself, and writes on. A node that
/// vanished instead (dead, cut off) still counts: it may be on the other side of a
/// partition.
#[test]
fn secondaries_stopped_cleanly_drop_out_of_the_quorum_and_vanished_ones_do_not() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    assert!(!leave(&mut net, 0), "a Primary does not leave cleanly");
    assert!(leave(&mut net, 2));
    net.link_down(0, 2);
    net.link_down(1, 2);
    assert!(quorate(&net, 0));
    assert!(leave(&mut net, 1));
    net.link_down(0, 1);
    assert!(quorate(&net, 0), "the last man standing lost quorum");
    write_on(&mut net, 0, 1, 1);
    assert_eq!(net.answer(1), Some(Ok(())));
    let count = net.nodes[0].status().volumes[0].quorum.unwrap().count;
    assert_eq!((count.voters, count.departed), (1, 2));

    // Node 1 is back, then cut off without a word: it counts again, and node 2, departed,
    // no longer drops out (an absent voter's state is unknown).
    net.link_up(0, 1);
    assert!(quorate(&net, 0));
    net.link_down(0, 1);
    assert!(!quorate(&net, 0));
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer(2), Some(Err(IoError::NoQuorum)));
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.assert_converges();
}

/// The Primary cut off from both peers (quorum on) changes no generation id at the loss
/// that leaves it without quorum: it acknowledges nothing from then on, so its ids must not
/// look like writes of its own. The majority promotes node 1 and writes on; node 0 is
/// killed, then the others, all start again (a whole cluster restarted): the
/// contest sees node 1's
/// ids descend from node 0's, and node 0 pulls from it. Before, node 0's rotation at the
/// loss made the two diverge: a split brain reported though node 0 had acknowledged
/// nothing apart, which a split-brain policy could even have resolved against node 1.
#[test]
fn a_primary_losing_quorum_keeps_its_ids_and_a_restarted_cluster_sees_no_split_brain() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    write_on(&mut net, 0, 1, 1);
    let acked = *net.nodes[0].generation(0).unwrap();
    net.link_down(0, 1);
    let before = *net.nodes[0].generation(0).unwrap();
    assert_eq!(*net.nodes[2].generation(0).unwrap(), before);
    net.link_down(0, 2);
    // No rotation at the loss; and without quorum the ids go back to those write 1 was
    // acknowledged under (`Rotations::hold_back`): older than node 2's, never apart.
    assert_eq!(*net.nodes[0].generation(0).unwrap(), acked);
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer(2), Some(Err(IoError::NoQuorum)));
    node_1_writes_on_and_a_restarted_cluster_sees_no_split_brain(&mut net);
}

/// Node 0 (without quorum, its write 2 failed) left behind: node 1 is promoted, writes
/// block 3 and is demoted; every node crashes (node 0, still Primary for its client, with
/// the failed write's extent in its activity log) and all meet again: no split brain, and
/// node 1's write everywhere.
fn node_1_writes_on_and_a_restarted_cluster_sees_no_split_brain(net: &mut Net) {
    assert_eq!(promote(net, 1), Ok(()));
    write_on(net, 1, 3, 3);
    assert_eq!(net.answer_on(1, 3), Some(Ok(())));
    let mut out = Vec::new();
    net.nodes[1].demote(&mut out).unwrap();
    net.push(1, out);
    net.run();
    net.link_down(1, 2);
    net.crash(0, &[(8192, 4096)]);
    for n in [1, 2] {
        net.crash(n, &[(4096, 4096), (12288, 4096)]);
    }
    net.events.clear();
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.link_up(1, 2);
    let diverged: Vec<_> = (net.events.iter())
        .filter(|(_, e)| matches!(e, Event::GenerationsDiverged { .. }))
        .collect();
    assert!(diverged.is_empty(), "{diverged:?}");
    net.assert_converges();
    assert_eq!(net.block(0, 3)[0], 3);
}

/// The same, both links dropping in one instant (failover seeds 86, 163, 175, 204): the
/// first loss still leaves node 0 quorate, so its ids rotate, and the second takes the
/// quorum before node 2 could adopt them. Node 0 acknowledged nothing under them: without
/// quorum it sets them back to those of its last acknowledged write
/// (`Event::GenerationSetBack`), and the whole cluster, restarted after node 1 wrote on as
/// Primary, sees node 0 older instead of a split brain. Before, the rotated ids diverged
/// from node 1's (`GenerationsDiverged` on both of node 0's connections).
#[test]
fn a_primary_losing_both_peers_at_once_sets_its_ids_back_and_no_split_brain_is_seen() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    write_on(&mut net, 0, 1, 1);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    let before = *net.nodes[0].generation(0).unwrap();
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    let rotated = (net.events.iter()).any(|(n, e)| {
        *n == 0 && matches!(e, Event::GenerationChanged { from, .. } if *from == before.current)
    });
    assert!(rotated, "the first loss, with quorum, rotates the ids");
    assert_eq!(*net.nodes[0].generation(0).unwrap(), before);
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer_on(0, 2), Some(Err(IoError::NoQuorum)));
    assert_eq!(*net.nodes[0].generation(0).unwrap(), before);
    node_1_writes_on_and_a_restarted_cluster_sees_no_split_brain(&mut net);
}

/// Node 0, Primary, writes block 1, then loses both peers at once: its ids are set back
/// to `before`, those of that write.
fn quorum_lost_with_ids_set_back() -> (Net, GenIds) {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    write_on(&mut net, 0, 1, 1);
    let before = *net.nodes[0].generation(0).unwrap();
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    assert_eq!(*net.nodes[0].generation(0).unwrap(), before);
    (net, before)
}

/// Quorum back before any other Primary: node 0 takes up the ids it had rotated to (a
/// replica that adopted them while it had them stays older, not apart) and tells its
/// peers, which adopt them as a rotation's.
#[test]
fn a_primary_whose_quorum_returns_takes_up_the_ids_it_set_back() {
    let (mut net, before) = quorum_lost_with_ids_set_back();
    net.link_up(0, 2);
    let after = *net.nodes[0].generation(0).unwrap();
    assert_ne!(after, before);
    assert_eq!(after.history[0], before.current);
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer_on(0, 2), Some(Ok(())));
    net.run();
    // Node 2 holds the ids node 0 wrote on under: they descend from those taken up again.
    let g2 = *net.nodes[2].generation(0).unwrap();
    assert_eq!(g2, *net.nodes[0].generation(0).unwrap());
    assert!(g2.current == after.current || g2.history.contains(&after.current));
    net.link_up(0, 1);
    net.assert_converges();
}

/// Ids taken up again as quorum returns count as acknowledged under only once the peers
/// connected then hold them: node 0's ids reach no peer (the `Generation` is lost on the
/// wire, as when the link drops right after), and a FLUSH completes meanwhile. A crash
/// now must keep the ids set back to, which node 2 holds, not those taken up (failover
/// soak seed 422002192: kept, they were apart from those the next Primary was promoted
/// with, which took them for a Primary that went on without it, stepped down and pulled
/// its tenure's acknowledged writes back from node 0's older replica).
#[test]
fn ids_taken_up_again_are_kept_at_a_crash_only_once_the_peers_hold_them() {
    let (mut net, before) = quorum_lost_with_ids_set_back();
    net.pass = |from, to, m| !(from == 0 && to == 2 && matches!(m, Msg::Generation { .. }));
    net.link_up(0, 2);
    let taken_up = *net.nodes[0].generation(0).unwrap();
    assert_eq!(taken_up.history[0], before.current, "taken up again");
    net.submit_on(0, 2, Io::Flush);
    assert_eq!(net.answer_on(0, 2), Some(Ok(())));
    assert_eq!(*net.nodes[2].generation(0).unwrap(), before);
    let kept = net.nodes[0].ids_at_crash(0).unwrap();
    assert_eq!(kept.gen, before, "the ids node 2 holds");
    assert_eq!(kept.abandoned.map(|a| a.gi), Some(taken_up.current));
}

/// Ids a write was acknowledged under are never set back: node 0 loses node 1 (its ids
/// rotate, node 2 adopts them), acknowledges write 2 with node 2 under them, then loses
/// quorum: its ids stay those write 2 completed under, newer than node 1's, which missed
/// it (the rotation's purpose; a Primary that wrote apart stays apart by its ids).
#[test]
fn a_primary_losing_quorum_keeps_the_ids_it_acknowledged_a_write_under() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    write_on(&mut net, 0, 1, 1);
    let first = *net.nodes[0].generation(0).unwrap();
    net.link_down(0, 1);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_ne!(rotated, first);
    write_on(&mut net, 0, 2, 2);
    assert_eq!(net.answer_on(0, 2), Some(Ok(())));
    net.link_down(0, 2);
    let kept = *net.nodes[0].generation(0).unwrap();
    assert!(kept == rotated || kept.history.contains(&rotated.current));
    let set_back =
        (net.events.iter()).any(|(n, e)| *n == 0 && matches!(e, Event::GenerationSetBack { .. }));
    assert!(!set_back);
    assert_eq!(*net.nodes[1].generation(0).unwrap(), first);
}

/// Node 0 keeps no replica (a quorum tiebreaker); node 1 is made Primary, node 2 is the
/// other replica.
fn tiebreaker_net() -> Net {
    let mut net = Net::with_quorum(true, majority(OnNoQuorum::IoError));
    let mut out = Vec::new();
    net.nodes[0].demote(&mut out).unwrap();
    net.push(0, out);
    net.run();
    assert_eq!(promote(&mut net, 1), Ok(()));
    net
}

fn outdated_by_tiebreaker(net: &Net, n: u8) -> bool {
    net.events.iter().any(|(m, e)| {
        *m == n
            && matches!(
                e,
                Event::DiskChanged {
                    why: DiskChange::MissedWritesOfAPrimary { told_by: 0 },
                    ..
                }
            )
    })
}

/// The link between the two replicas breaks; the Primary keeps quorum through the
/// tiebreaker and acknowledges writes node 2 lacks. The tiebreaker learnt that node 2 is
/// behind before any of them was acknowledged and told it: when the Primary then dies,
/// node 2 (with the tiebreaker, a quorum) cannot be promoted without those writes.
#[test]
fn a_tiebreaker_does_not_let_a_replica_that_missed_writes_be_promoted() {
    let mut net = tiebreaker_net();
    write_on(&mut net, 1, 1, 1);
    assert_eq!(net.answer_on(1, 1), Some(Ok(())));
    net.link_down(1, 2);
    write_on(&mut net, 1, 2, 2);
    assert_eq!(
        net.answer_on(1, 2),
        Some(Ok(())),
        "quorum through the tiebreaker"
    );
    assert!(outdated_by_tiebreaker(&net, 2));
    assert_eq!(net.disk(2), DiskState::Outdated);
    // The Primary dies.
    net.link_down(0, 1);
    assert!(quorate(&net, 2), "node 2 and the tiebreaker are a quorum");
    assert_eq!(promote(&mut net, 2), Err(PromoteError::NoUpToDate(0)));
    // Back, the Primary's lists bring node 2 up to date, and the tiebreaker forgets it:
    // a later reconnection tells it nothing.
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 2)[0], 2);
    net.events.clear();
    net.link_down(0, 2);
    net.link_up(0, 2);
    assert!(!outdated_by_tiebreaker(&net, 2));
    assert_eq!(net.disk(2), DiskState::UpToDate);
}

/// The Primary is cut off from both: it notices the other replica's loss first, while
/// its link to the tiebreaker is dead but not yet judged so. Its rotation waits for the
/// tiebreaker, so the write it takes meanwhile is never acknowledged, and fails once the
/// tiebreaker's loss is noticed; node 2, told nothing, may be promoted and loses nothing.
#[test]
fn a_primary_acknowledges_nothing_through_a_tiebreaker_it_cannot_reach() {
    let mut net = tiebreaker_net();
    net.cut(0, 1);
    net.link_down(1, 2);
    write_on(&mut net, 1, 2, 2);
    assert_eq!(net.answer_on(1, 2), None, "acknowledged on node 1 alone");
    net.notice_down(1, 0);
    net.notice_down(0, 1);
    net.run();
    assert_eq!(net.answer_on(1, 2), Some(Err(IoError::NoQuorum)));
    assert!(!outdated_by_tiebreaker(&net, 2));
    assert_eq!(promote(&mut net, 2), Ok(()));
}

/// A client attaching just as a peer connects, before that peer said which Primary it
/// follows, is refused for a moment only: the promotion goes through once it has.
#[test]
fn a_client_attaching_as_a_peer_connects_is_promoted_once_the_peer_has_spoken() {
    let mut net = Net::new();
    let mut out = Vec::new();
    net.nodes[0].demote(&mut out).unwrap();
    net.push(0, out);
    net.run();
    net.link_down(1, 2);
    net.hold(2, 1);
    net.link_up(1, 2);
    let auto = net.attach_on(1);
    assert_eq!(
        auto,
        tandem_engine::replica::AutoPromote::Refused(PromoteError::PeerUnheard(2))
    );
    assert_eq!(net.nodes[1].role(), Role::Secondary);
    net.release(2, 1);
    net.run();
    assert_eq!(net.nodes[1].role(), Role::Primary);
    write_on(&mut net, 1, 1, 1);
    assert_eq!(net.answer_on(1, 1), Some(Ok(())));
}

/// Node 0 Primary (diskless if `diskless`), quorum majority with suspend-io, writes block
/// 1, then is cut off from both peers and holds write 2 (block 2).
fn primary_cut_off_holding_a_write(diskless: bool) -> Net {
    let mut net = Net::with_quorum(diskless, majority(OnNoQuorum::SuspendIo));
    write_on(&mut net, 0, 1, 1);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    write_on(&mut net, 0, 2, 2);
    net.run();
    assert_eq!(net.answer_on(0, 2), None, "held without quorum");
    net
}

/// An old Primary, once superseded, completes none of what it held (failover soak seed
/// 320013211): node 0, Primary, is cut off from both peers and holds write 2 (suspend-io);
/// node 1 is promoted with node 2 and writes nothing yet; node 1 is cut off from node 2,
/// and node 2 meets node 0 again. Node 2 follows no Primary then, and node 0 and node 2
/// are a majority: node 0 completed write 2 after node 1's tenure began, under the
/// application node 1 had started for. Node 1's promotion with node 0 away gives node 1
/// new ids at once (DRBD makes them at the first write), which node 2 adopts: node 0
/// meets newer data, steps down and fails what it held.
#[test]
fn a_superseded_primary_completes_nothing_it_held() {
    let mut net = primary_cut_off_holding_a_write(false);
    assert_eq!(promote(&mut net, 1), Ok(()));
    let g1 = *net.nodes[1].generation(0).unwrap();
    assert_eq!(
        *net.nodes[2].generation(0).unwrap(),
        g1,
        "node 2 adopted node 1's ids"
    );
    net.link_lost(1, 2);
    net.run();
    net.link_up(0, 2);
    net.run();
    assert_eq!(
        net.answer_on(0, 2),
        Some(Err(IoError::NoQuorum)),
        "node 0 completed a write it held after node 1's tenure began"
    );
    assert_ne!(net.nodes[0].role(), Role::Primary);
    // Node 1 wrote on; everyone meets again on node 1's data (write 2 failed: a block
    // may show it or not, the same on every replica).
    write_on(&mut net, 1, 3, 3);
    net.link_up(1, 2);
    net.link_up(0, 1);
    net.run();
    assert_eq!(net.answer_on(1, 3), Some(Ok(())));
    net.assert_converges();
    assert_eq!(net.block(2, 3)[0], 3);
    assert_eq!(net.block(2, 1)[0], 1);
}

fn demote(net: &mut Net, n: u8) {
    net.demote_on(n);
}

/// Node 1, Primary while node 0 was away, wrote block 5 apart from it and still claims
/// it on node 0 when they meet again; meanwhile node 0 caught up through node 2, took
/// node 1's ids there at its promotion and wrote block 6 apart from node 1 in turn. Each
/// wrote apart, but node 0's ids descend from node 1's: one history, no split brain (each
/// counted the other's writes apart and stopped the connection: failover seed 109). Node
/// 1 gives up its stale claim and pulls block 6; a real split brain, two Primaries
/// writing apart from the same ids, is still found (`split_brain.rs` tests).
#[test]
fn writes_apart_by_a_replica_whose_ids_the_other_descends_from_are_no_split_brain() {
    let mut net = Net::new();
    demote(&mut net, 0);
    net.link_down(0, 1);
    net.link_down(0, 2);
    assert_eq!(promote(&mut net, 1), Ok(()));
    write_on(&mut net, 1, 1, 5);
    assert_eq!(net.answer_on(1, 1), Some(Ok(())));
    assert!(net.claims(1, 0) > 0, "node 1 claims block 5 on node 0");
    demote(&mut net, 1);
    net.link_down(1, 2);
    // Node 0 catches up through node 2 and, promoted, writes apart from node 1.
    net.link_up(0, 2);
    assert_eq!(net.block(0, 5)[0], 1);
    assert_eq!(promote(&mut net, 0), Ok(()));
    write_on(&mut net, 0, 2, 6);
    assert_eq!(net.answer(2), Some(Ok(())));
    let g0 = *net.nodes[0].generation(0).unwrap();
    let g1 = *net.nodes[1].generation(0).unwrap();
    assert!(
        g0.history.contains(&g1.current),
        "{g0:?} descends from {g1:?}"
    );
    net.link_up(0, 1);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    net.link_up(1, 2);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    net.assert_converges();
    assert_eq!(net.block(1, 6)[0], 2);
    assert_eq!(net.block(1, 5)[0], 1);
    assert_eq!(net.block(0, 5)[0], 1);
}

/// A Primary's ids that ours descend from are never adopted: our data is newer (failover
/// seed 3091: an old Primary, superseded as it took up the ids it had set aside without
/// quorum, sent them; node 0, whose ids had gone on from them under another Primary,
/// took them, and its later ids diverged from that Primary's: a split brain between
/// ordered histories).
#[test]
fn a_secondary_never_takes_ids_its_own_descend_from() {
    use tandem_engine::replica::{Msg, RAction};
    let mut net = Net::new();
    net.link_down(0, 2);
    let older = *net.nodes[1].generation(0).unwrap();
    net.link_up(0, 2);
    net.link_down(0, 2);
    let newer = *net.nodes[1].generation(0).unwrap();
    assert!(
        newer.history.contains(&older.current),
        "{newer:?} from {older:?}"
    );
    assert_eq!(*net.nodes[0].generation(0).unwrap(), newer);
    let msg = Msg::Generation {
        volume: 0,
        gen: older,
    };
    net.push(0, vec![RAction::Send { peer: 1, msg }]);
    net.run();
    assert_eq!(*net.nodes[1].generation(0).unwrap(), newer);
}

/// Node `n`'s replica thrown away (`tandem invalidate`): Inconsistent, pulled again.
fn invalidate(net: &mut Net, n: u8) {
    let mut out = Vec::new();
    net.nodes[n as usize].invalidate(0, &mut out).unwrap();
    net.push(n, out);
    net.run();
}

/// Failover soak seed 337009897, first half. Node 0, Primary, is cut off and holds a
/// flush; node 2 is being synced (Inconsistent: it takes no ids, so nothing in them shows
/// that a Primary went on) when node 1 is promoted with it. Node 2 meets node 0 again: its
/// `Volume` alone must not give node 0 its quorum back (node 2 votes for node 1, as its
/// next packet says, and node 0 then steps down).
#[test]
fn an_old_primary_steps_down_for_a_run_it_never_followed() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::SuspendIo));
    write_on(&mut net, 0, 1, 1);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    // The flush's barriers are on their way when both links drop.
    net.hold(0, 1);
    net.hold(0, 2);
    net.submit_on(0, 2, Io::Flush);
    net.run();
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    assert_eq!(net.answer_on(0, 2), None, "held without quorum");
    // Node 2 thrown away and pulled from node 1, whose replies are lost.
    net.pass = |from, to, m| !(from == 1 && to == 2 && matches!(m, Msg::ResyncReply { .. }));
    invalidate(&mut net, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    assert_eq!(promote(&mut net, 1), Ok(()));
    assert_eq!(
        net.nodes[2].generation(0).unwrap().current,
        0,
        "node 2 took no ids"
    );

    // Node 2's `Volume` comes, its `Primaries` (naming node 1) waits, and so does node
    // 0's `Role` (node 2 would refuse it as a second Primary).
    net.hold(0, 2);
    net.hold_at(2, 0, |m| matches!(m, Msg::Primaries { .. }));
    net.link_up(0, 2);
    assert!(!net
        .delivered(2, 0, |m| matches!(m, Msg::Volume { .. }))
        .is_empty());
    assert_eq!(
        net.answer_on(0, 2),
        None,
        "node 0 took its quorum back through a node that follows node 1"
    );
    net.release(2, 0);
    net.run();
    assert_eq!(net.answer_on(0, 2), Some(Err(IoError::NoQuorum)));
    assert_ne!(net.nodes[0].role(), Role::Primary);
    net.release(0, 2);
    net.run();
}

/// The second half of seed 337009897 alone: node 0 kept its held write through the first
/// meeting; node 1, Primary since, is gone with a write node 2 took and never saw settled.
/// Node 2, following no Primary, meets node 0: its `PrimaryLost` names node 1's run.
#[test]
fn an_old_primary_told_of_a_run_it_never_followed_fails_what_it_held() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::SuspendIo));
    net.link_lost(0, 1);
    net.link_lost(0, 2);
    net.run();
    write_on(&mut net, 0, 2, 2);
    net.run();
    assert_eq!(net.answer_on(0, 2), None, "held without quorum");
    net.pass = |from, to, m| {
        !(from == 1 && to == 2 && matches!(m, Msg::ResyncReply { .. } | Msg::PeerAck { .. }))
    };
    invalidate(&mut net, 2);
    assert_eq!(promote(&mut net, 1), Ok(()));
    // A write of node 1's reaches node 2; its settling (the peer ack) does not.
    write_on(&mut net, 1, 3, 3);
    net.run();
    net.link_lost(1, 2);
    net.run();
    net.link_up(0, 2);
    net.run();
    assert!(
        !net.delivered(2, 0, |m| matches!(m, Msg::PrimaryLost { primary: 1, .. }))
            .is_empty(),
        "node 2 did not ask node 0 about node 1's run"
    );
    assert_eq!(
        net.answer_on(0, 2),
        Some(Err(IoError::NoQuorum)),
        "node 0 completed a write it held after node 1's tenure began"
    );
    assert_ne!(net.nodes[0].role(), Role::Primary);
    assert!(net.events.iter().any(|(n, e)| *n == 0
        && matches!(
            e,
            Event::Outrun {
                peer: 2,
                primary: 1
            }
        )));
}

/// Failover soak seed 370004285, its first fault. Node 1, back from a crash with the ids
/// it had then, is being synced (resync data lost on the way) and takes the Primary's
/// writes. Node 2, up to date with newer ids, is cut off from the Primary, which writes
/// block 5 on nodes 0 and 1 only; node 1 relays that node 2 lacks it. Node 2 must take the
/// relay as a write it missed: turned back as node 1's lack (node 1's ids are older), node
/// 2 stayed up to date without the write and later served the block as current.
#[test]
fn a_relayed_write_of_a_primary_out_of_reach_is_a_write_missed_whatever_the_relays_ids() {
    let mut net = Net::new();
    net.crash(1, &[]);
    write_on(&mut net, 0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    let g1 = *net.nodes[1].generation(0).unwrap();
    let g2 = *net.nodes[2].generation(0).unwrap();
    assert!(g2.history.contains(&g1.current), "{g2:?} from {g1:?}");
    // Node 1 comes back and is synced, but no resync data reaches it.
    net.pass = |_, to, m| !(to == 1 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(1, 2);
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert!(net.claims(2, 1) > 0, "node 2 claims block 3 on node 1");
    net.link_down(0, 2);
    let told_before = net.listed(2, 1).len();
    write_on(&mut net, 0, 2, 5);
    assert_eq!(net.answer(2), Some(Ok(())));
    assert!(
        net.listed(1, 2).contains(&(5 * 4096, 4096)),
        "node 1 relays the write node 2 missed: {:?}",
        net.listed(1, 2)
    );
    assert_eq!(
        net.listed(2, 1)[told_before..],
        [],
        "node 2 turned the relay back"
    );
    assert_eq!(
        net.disk(2),
        DiskState::Inconsistent,
        "node 2 missed block 5"
    );
    net.pass = |_, _, _| true;
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.assert_converges();
    for n in 0..3 {
        assert_eq!(net.block(n, 5)[0], 2, "node {n}");
        assert_eq!(net.block(n, 3)[0], 1, "node {n}");
    }
}

/// Failover seed 183. Node 1, back from a crash and being synced, takes a write of the
/// diskless Primary that never reaches node 2; the Primary dies before it completes. At
/// their meeting node 1 claims the write's block on node 2 (its last write of that run is
/// older), and, unproven against node 2 up to date, pulls the claim from node 2 instead.
/// The write's sectors, fresh on node 1 with their writer gone, must take node 2's data:
/// protected, they stayed on node 1 alone and the replicas differed with none marked.
#[test]
fn a_pulled_claim_takes_the_peers_data_over_orphaned_fresh_sectors() {
    let mut net = Net::diskless_primary();
    net.crash(1, &[]);
    write_on(&mut net, 0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    // Node 1 comes back to the Primary and is synced, but no resync data reaches it.
    net.pass = |_, to, m| !(to == 1 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    // Block 5 reaches node 1 only; the Primary dies before it completes.
    net.hold(0, 2);
    write_on(&mut net, 0, 2, 5);
    assert_eq!(net.block(1, 5)[0], 2, "node 1 wrote it");
    assert_eq!(net.answer(2), None);
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.pass = |_, _, _| true;
    net.link_up(1, 2);
    // With no Primary and node 0 away, node 1 waits for one (see `pick_source`).
    assert_eq!(promote(&mut net, 1), Ok(()));
    for _ in 0..100 {
        net.tick(50);
    }
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.block(1, 3)[0], 1);
    assert_eq!(net.block(2, 3)[0], 1);
    assert_eq!(
        net.block(1, 5)[0],
        net.block(2, 5)[0],
        "block 5 differs: 2 on node 1, none on node 2"
    );
    assert!(net.block(1, 5) == net.block(2, 5));
}

/// Node 1 is cut off from both peers while node 0 (Primary) writes block 3 (request
/// `req`, acknowledged with node 2).
fn node_1_alone_misses_block_3(net: &mut Net, req: u64) {
    net.link_down(0, 1);
    net.link_down(1, 2);
    write_on(net, 0, req, 3);
    assert_eq!(net.answer(req), Some(Ok(())));
}

/// Failover soak seed 370000394. Node 1 is being synced (its resync data lost) when node
/// 2 is cut off and the Primary writes block 5 on nodes 0 and 1 alone, acknowledged: the
/// Primary's ids move past node 2's, and node 1 holds a claim relayed from that run. The
/// Primary dies; node 2, up to date with older ids, meets node 1, whose ids (a sync
/// target takes none) are older still. Node 1's claim stands: node 2 missed a write of a
/// run that rotated past it. Yielded (node 1 pulling block 5 from node 2), node 2 stayed
/// up to date without the write and was promoted with node 1's vote; the Primary's
/// return then met diverged ids.
#[test]
fn a_claim_relayed_from_a_dead_primarys_run_past_the_peers_ids_stands() {
    let mut net = Net::new();
    // Node 1, alone, misses block 3 (the ids move on without it) and is then synced.
    node_1_alone_misses_block_3(&mut net, 9);
    net.pass = |_, to, m| !(to == 1 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    net.link_down(0, 2);
    write_on(&mut net, 0, 1, 5);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.block(1, 5)[0], 1, "node 1 took the write");
    let g0 = *net.nodes[0].generation(0).unwrap();
    let g2 = *net.nodes[2].generation(0).unwrap();
    assert!(g0.history.contains(&g2.current), "{g0:?} past {g2:?}");
    net.link_down(0, 1);
    net.pass = |_, _, _| true;
    net.link_up(1, 2);
    assert!(
        net.listed(1, 2).contains(&(5 * 4096, 4096)),
        "node 1 yielded its claim: {:?}",
        net.listed(1, 2)
    );
    // Node 2 cannot tell that claim from a stale one: it keeps neither the claim nor
    // the connection (no quorum through node 1), and waits for the Primary's return.
    assert_eq!(
        drop_reason(&net, 2, 1),
        Some(LinkLoss::Misbehaved(ProtocolError::LackPrimaryWrites {
            volume: 0
        }))
    );
}

/// Node 0, a diskless Primary, is cut off from both replicas with a write held; node 2
/// is promoted and writes, then loses node 1 (and its quorum). Node 0 meets node 1
/// again: node 1's replica holds node 2's tenure (node 2's promotion changed the ids, a
/// node being away, diskless or not), so node 0 steps down and fails what it held. Kept,
/// it completed them once node 2 yielded to it and their quorum returned, after node 2
/// had acknowledged writes (failover soak seed 406008806: two Primaries completed writes
/// apart).
#[test]
fn a_diskless_primary_meeting_a_replica_of_the_next_primary_steps_down() {
    let mut net = primary_cut_off_holding_a_write(true);
    assert_eq!(promote(&mut net, 2), Ok(()));
    write_on(&mut net, 2, 3, 3);
    net.run();
    assert_eq!(net.answer_on(2, 3), Some(Ok(())));
    net.link_lost(1, 2);
    net.run();
    net.link_up(0, 1);
    assert_eq!(
        net.answer_on(0, 2),
        Some(Err(IoError::NoQuorum)),
        "node 0 kept the write it held, to complete it once a quorum returns"
    );
    assert_ne!(net.nodes[0].role(), Role::Primary);
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.run();
    net.assert_converges();
    assert_eq!(net.block(1, 3)[0], 3);
    assert_eq!(net.block(1, 1)[0], 1);
}

/// Node 1 meets node 2, whose list's end is lost: node 1's replica is `disk` and its
/// promotion is refused until node 2 has listed; then they meet again and it has.
fn refused_until_node_2_has_listed(net: &mut Net, disk: DiskState) {
    net.pass = |from, to, m| !(from == 2 && to == 1 && matches!(m, Msg::OutOfSync { len: 0, .. }));
    net.link_up(1, 2);
    assert_eq!(net.nodes[1].status().volumes[0].disk, disk);
    assert_eq!(
        promote(net, 1),
        Err(PromoteError::PeerListing { volume: 0, peer: 2 })
    );
    net.pass = |_, _, _| true;
    net.link_down(1, 2);
    net.link_up(1, 2);
}

/// A node is not promoted before every connected peer keeping a replica has listed what
/// ours lacks (`Replicas::awaiting_list`). Node 1, back from a clean restart, meets node
/// 2, whose ids are newer (node 0 was promoted meanwhile): Outdated until node 2's list
/// ends. Promoted in that moment, its writes would skip its own replica, and node 2's
/// list, sent before they reached node 2, would then prove it UpToDate without them
/// (failover seed 1930: the replicas differed). Up to date, a list may still name writes
/// of a dead Primary that it missed (failover seed 406007080).
#[test]
fn a_node_is_not_promoted_before_its_peers_have_listed_what_it_lacks() {
    let mut net = Net::new();
    demote(&mut net, 0);
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.restart_cleanly(1);
    assert_eq!(promote(&mut net, 0), Ok(()));
    demote(&mut net, 0);
    net.link_down(0, 2);
    refused_until_node_2_has_listed(&mut net, DiskState::Outdated);
    assert_eq!(net.nodes[1].status().volumes[0].disk, DiskState::UpToDate);
    // Up to date now: the next connection's list is awaited too.
    net.link_down(1, 2);
    refused_until_node_2_has_listed(&mut net, DiskState::UpToDate);
    assert_eq!(promote(&mut net, 1), Ok(()));
    write_on(&mut net, 1, 1, 2);
    assert_eq!(net.answer_on(1, 1), Some(Ok(())));
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    assert_eq!(net.block(0, 2)[0], 1);
}

/// Failover soak seed 414000809. Node 1, Primary, dies; node 2, restarted since (it forgot
/// following node 1), hears of node 1's run from the tiebreaker while Secondary, and is
/// promoted with the tiebreaker's vote once node 1, back for a while, is gone again. Its link to the tiebreaker drops and comes back:
/// the tiebreaker's `PrimaryLost` of node 1's run arrives again before its `Volume` gives
/// node 2 its quorum back. That run ended before node 2's tenure began, so nothing ran
/// beside it: node 2 stays Primary (stepping down, it took its own acknowledged writes
/// for a minority's and pulled them back from node 1's older replica).
#[test]
fn a_primary_is_not_outrun_by_a_run_it_heard_of_before_its_promotion() {
    let mut net = tiebreaker_net();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.link_down(0, 2);
    net.restart_cleanly(2);
    net.link_up(0, 2);
    assert!(
        !net.delivered(0, 2, |m| matches!(m, Msg::PrimaryLost { primary: 1, .. }))
            .is_empty(),
        "the tiebreaker tells node 2 of node 1's run"
    );
    // Node 1 is back as a Secondary, all meet, and node 1 is gone again: node 2, quorate
    // until then, keeps its quorum through the tiebreaker.
    net.restart_cleanly(1);
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.assert_converges();
    net.link_down(0, 1);
    net.link_down(1, 2);
    assert_eq!(promote(&mut net, 2), Ok(()));
    write_on(&mut net, 2, 1, 1);
    assert_eq!(net.answer_on(2, 1), Some(Ok(())));
    net.link_down(0, 2);
    assert!(!quorate(&net, 2));
    net.link_up(0, 2);
    assert!(
        net.delivered(0, 2, |m| matches!(m, Msg::PrimaryLost { primary: 1, .. }))
            .len()
            > 1,
        "told again"
    );
    assert_eq!(net.nodes[2].role(), Role::Primary);
    // No quorum back through the tiebreaker alone; node 1's return gives it, and node 1
    // takes block 1 from node 2.
    net.link_up(0, 1);
    net.link_up(1, 2);
    write_on(&mut net, 2, 2, 2);
    assert_eq!(net.answer_on(2, 2), Some(Ok(())));
    net.assert_converges();
    assert_eq!(net.block(1, 1)[0], 1);
}

/// Failover soak seed 370002771. A Primary demoted without quorum pulls back only what
/// its own tenure wrote: a claim from before it (here a write of its previous tenure that
/// node 2 missed) names data it holds as current as anyone. Before, every claim was
/// pulled back under the next Primary, and a replica that alone held an acknowledged
/// write pulled it back from peers that lacked it.
#[test]
fn a_primary_demoted_without_quorum_pulls_back_only_its_tenures_writes() {
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.link_down(0, 2);
    write_on(&mut net, 0, 1, 3);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    demote(&mut net, 0);
    assert_eq!(promote(&mut net, 0), Ok(()));
    write_on(&mut net, 0, 2, 4);
    assert_eq!(net.answer_on(0, 2), Some(Ok(())));
    assert_eq!(net.claims(0, 2), 2 * 4096, "blocks 3 and 4");
    net.link_down(0, 1);
    assert!(!quorate(&net, 0));
    demote(&mut net, 0);
    let pulled_back: Vec<u64> = (net.events.iter())
        .filter_map(|(n, e)| match e {
            Event::DiskChanged {
                why: DiskChange::LostQuorum { bytes },
                ..
            } if *n == 0 => Some(*bytes),
            _ => None,
        })
        .collect();
    assert_eq!(pulled_back, [4096], "block 4 only");
}

/// Node 1, back after node 0 (Primary) wrote block 3 without it, pulls under node 0's
/// list, and node 0 steps down before the pull ends. Node 1 then holds all node 0's
/// tenure wrote: it takes node 0's ids, as it would have under a Primary still in office
/// (failover seed 430000390: kept older, they let a Primary cut off since before that
/// tenure take node 1 for a replica that had missed it, and write apart from it).
#[test]
fn a_replica_synced_under_a_primarys_list_takes_its_ids_though_it_stepped_down_meanwhile() {
    let mut net = Net::new();
    node_1_alone_misses_block_3(&mut net, 1);
    let g0 = *net.nodes[0].generation(0).unwrap();
    assert_ne!(*net.nodes[1].generation(0).unwrap(), g0, "node 1 missed it");
    net.hold_at(1, 0, |m| matches!(m, Msg::ResyncReq { .. }));
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent, "pulling block 3");
    demote(&mut net, 0);
    net.release(1, 0);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.block(1, 3)[0], 1);
    assert_eq!(*net.nodes[1].generation(0).unwrap(), g0);
}

/// Node 2, back with a replica of unknown currency (it crashed while Inconsistent), is
/// made Inconsistent by the list of node 1, itself being synced, which names only block
/// 3. Node 2 holds nothing known current: it serves none of node 1's pull (failover seed
/// 430002177: such a replica served a block it had never pulled, and the peer became
/// UpToDate without an acknowledged write).
#[test]
fn a_replica_of_unknown_currency_serves_no_pull_though_a_list_made_it_inconsistent() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.link_down(1, 2);
    write_on(&mut net, 0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.start_unproven(2);
    net.hold_at(1, 0, |m| matches!(m, Msg::ResyncReq { .. }));
    invalidate(&mut net, 1);
    net.link_down(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    net.link_up(1, 2);
    assert_eq!(net.listed_blocks(1, 2), vec![3]);
    assert_eq!(net.disk(2), DiskState::Inconsistent, "pulling block 3");
    assert!(!net.pulled(1, 2).is_empty(), "node 1 asked node 2");
    let served = net.delivered(2, 1, |m| matches!(m, Msg::ResyncReply { errno: 0, .. }));
    assert!(served.is_empty(), "{served:?}");
    assert_eq!(net.disk(1), DiskState::Inconsistent);
}
