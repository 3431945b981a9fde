//! A Secondary back from a crash that the connected Primary's same run settled
//! (`Replicas::settled_by_primary`, event `CrashSettledByRun`): it pulls from a replica
//! being synced (`pick_source`), drops its claims on the others where that Primary lists it
//! a block (`on_out_of_sync`), and lists the others what they lack only after that
//! Primary's list to it has ended (`waits_for_primary_list`, `send_deferred_lists`).
//! Overlapping seeds 39262 and 30003616.
//!
//! A diskless Primary (node 0) and two Secondaries over the in-memory network of `common`,
//! whose disks keep their bytes so that the replicas' data can be compared. A direction of
//! a link can be held (its packets wait, in order), and a node's disk too (its writes have
//! not landed when it crashes). A crash restarts a node's engine as the daemon does after a
//! kill -9 (`Net::crash`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Event, Msg, NodeId, PromoteError, Role};
use tandem_engine::IoError;

/// Whether node `n` reported that the Primary's run settled its crash.
fn settled_by_run(net: &Net, n: NodeId) -> bool {
    (net.events.iter())
        .any(|(m, e)| *m == n && matches!(e, Event::CrashSettledByRun { primary: 0, .. }))
}

/// Node 2's report that it is being synced: what the Primary has not heard yet.
fn inconsistent(m: &Msg) -> bool {
    matches!(
        m,
        Msg::Volume {
            disk: DiskState::Inconsistent,
            ..
        }
    )
}

/// Rule 1, overlapping seed 39262. Node 2, cut off from the diskless Primary, missed a
/// write (block 10) that node 1 holds; back with the Primary and listed it, it waits for
/// a source. Node 1 crashes and misses a write (block 20) that node 2 takes. Node 1 is
/// back under the same run of the Primary (which settles its crash): it lacks block 20,
/// held by node 2, which is being synced; node 2 lacks block 10, held by node 1, which
/// restarted. A restarted replica waits for an up-to-date source, but not under the run
/// that settled its crash: its list named all node 2 lacks. Node 1 pulls block 20 from
/// node 2, is up to date, and node 2 pulls block 10 from it. (Without the rule neither
/// pulled from the other, for ever.)
#[test]
fn a_replica_back_under_the_run_that_settled_its_crash_pulls_from_one_being_synced() {
    let mut net = Net::diskless_primary();
    net.link_down(1, 2);
    net.link_down(0, 2);
    net.write(1, 10 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    // Back with the Primary, node 2 is listed block 10 and waits for a source; its report
    // of that is still on its way.
    net.hold_at(2, 0, inconsistent);
    net.link_up(0, 2);
    assert_eq!(net.listed_blocks(0, 2), vec![10]);
    assert_eq!(net.disk(2), DiskState::Inconsistent, "no source in reach");
    // Node 1 crashes with a write to block 20 received, not landed; node 2 takes it (the
    // Primary, its report still on the way, counted node 2 current there).
    net.hold_disk(1);
    net.write(2, 20 * BLOCK, 4096);
    net.crash(1, &[(20 * BLOCK, BLOCK)]);
    net.release_stepwise(2, 0);
    assert_eq!(net.answer(2), Some(Ok(())), "node 2 took it");
    assert_eq!(net.block(1, 20)[0], 0);
    net.sent.clear();
    net.link_up(0, 1);
    assert!(settled_by_run(&net, 1));
    assert_eq!(net.listed_blocks(0, 1), vec![20]);
    net.link_up(1, 2);
    for _ in 0..20 {
        net.tick(50);
    }
    assert_eq!(
        net.pulled_blocks(1, 2),
        vec![20],
        "node 1 pulls from node 2 being synced"
    );
    assert_eq!(
        net.pulled_blocks(2, 1),
        vec![10],
        "and then node 2 from node 1"
    );
    net.assert_converges();
    assert_eq!(net.block(1, 20)[0], 2);
    assert_eq!(net.block(2, 10)[0], 1);
}

/// Overlapping seed 30003616. Node 2 is away from the diskless Primary and misses a
/// write to block 30 that node 1 takes. A write to block 9 then reaches node 1 alone,
/// which marks node 2 as lacking it; node 1 crashes before the write lands and before
/// its answers (and its notice to node 2) leave: the write fails. Node 1 comes back with
/// claims on node 2 for blocks 9 and 30 (as the simulator restores them: the bitmap held
/// at the crash and the log's extents, which name neither block: the writes were landed
/// and flushed long ago, or not at all). The Primary, whose same run settles node 1's
/// crash, settles the failed write against node 1 (it lists node 1 block 9) and lists
/// node 2 block 30. Block 9 is current on node 2 only, block 30 on node 1 only.
fn claims_from_a_failed_write() -> Net {
    claims_from_a_failed_write_ack(true, true)
}

/// `ack_lost`: node 1's receipt of the write to block 9 is lost with its link (else the
/// Primary hears it); `block_30`: node 2 misses the write to block 30 first.
fn claims_from_a_failed_write_ack(ack_lost: bool, block_30: bool) -> Net {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.hold(1, 2);
    if block_30 {
        net.write(1, 30 * BLOCK, 4096);
        assert_eq!(net.answer(1), Some(Ok(())));
    }
    net.hold_disk(1);
    if ack_lost {
        net.hold(1, 0);
    }
    net.write(2, 9 * BLOCK, 4096);
    let claimed = if block_30 { 2 * 4096 } else { 4096 };
    assert_eq!(net.claims(1, 2), claimed, "node 1 marks node 2");
    net.crash(1, &[]);
    assert_eq!(net.answer(2), Some(Err(IoError::Os(5))), "the write failed");
    assert_eq!(net.claims(1, 2), claimed, "restored");
    assert_eq!(net.block(1, 9)[0], 0, "it never landed");
    net.sent.clear();
    net
}

/// The end of both nodes' convergence: each pulled from the other the block it lacked,
/// and node 1 never told node 2 it lacks block 9.
fn assert_each_pulls_what_it_lacks(net: &mut Net) {
    assert_eq!(net.listed_blocks(1, 2), vec![30], "block 9 is no claim");
    net.assert_converges();
    assert_eq!(net.listed_blocks(0, 1), vec![9]);
    assert_eq!(net.listed_blocks(0, 2), vec![30]);
    assert_eq!(net.pulled_blocks(1, 2), vec![9]);
    assert_eq!(net.pulled_blocks(2, 1), vec![30]);
    assert_eq!(net.block(2, 30)[0], 1);
    assert_eq!(net.block(1, 9)[0], 0, "the failed write is nowhere");
}

/// Rule 2, overlapping seed 30003616 (`on_out_of_sync`): back under the run that settled
/// its crash, node 1 hears the Primary's list (block 9) before it meets node 2. What the
/// Primary lists us we claim no peer lacks: node 1 drops its claim on block 9 and lists
/// node 2 block 30 only. (Kept, node 2 lacked block 9 too, and each refused the other.)
#[test]
fn a_block_the_settling_primary_lists_us_is_no_claim_on_another_replica() {
    let mut net = claims_from_a_failed_write();
    net.link_up(0, 1);
    assert!(settled_by_run(&net, 1));
    assert_eq!(net.listed_blocks(0, 1), vec![9]);
    assert_eq!(net.claims(1, 2), 4096, "block 30's claim only");
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    net.link_up(1, 2);
    assert_each_pulls_what_it_lacks(&mut net);
}

/// Rule 3, overlapping seed 30003616 (`waits_for_primary_list`, `send_deferred_lists`):
/// node 1 meets node 2 while the Primary's list to it (block 9) is still on its way. Its
/// list to node 2 waits for the end of the Primary's: then it names block 30 only. (Sent
/// at once it named block 9 too, just before the Primary listed us the block, and could
/// not be taken back.)
#[test]
fn a_list_to_another_replica_waits_for_the_settling_primarys_list() {
    let mut net = claims_from_a_failed_write();
    net.hold_at(0, 1, |m| matches!(m, Msg::OutOfSync { .. }));
    net.link_up(0, 1);
    assert!(settled_by_run(&net, 1), "node 1 knows the Primary's run");
    net.link_up(0, 2);
    net.link_up(1, 2);
    assert!(
        net.sent
            .iter()
            .any(|&(f, t, m)| (f, t) == (2, 1) && matches!(m, Msg::OutOfSync { len: 0, .. })),
        "node 2 listed to node 1"
    );
    assert!(
        !net.sent
            .iter()
            .any(|&(f, t, m)| (f, t) == (1, 2) && matches!(m, Msg::OutOfSync { .. })),
        "node 1's list waits"
    );
    assert_eq!(net.claims(1, 2), 2 * 4096);
    net.release_stepwise(0, 1);
    assert_eq!(net.listed_blocks(0, 1), vec![9]);
    assert_each_pulls_what_it_lacks(&mut net);
}

/// Whether `from` ended a list to `to`.
fn list_ended(net: &Net, from: NodeId, to: NodeId) -> bool {
    net.sent
        .iter()
        .any(|&(f, t, m)| (f, t) == (from, to) && matches!(m, Msg::OutOfSync { len: 0, .. }))
}

/// Rule 3's liveness (`send_deferred_lists` in `peer_down`): a list waiting for the
/// settling Primary's goes as soon as that Primary is lost, its list never come. (Node 1's
/// claim on block 9 then stands and is listed; met again, the Primary settles it.)
#[test]
fn a_waiting_list_goes_when_the_settling_primary_is_lost() {
    let mut net = claims_from_a_failed_write();
    net.hold_at(0, 1, |m| matches!(m, Msg::OutOfSync { .. }));
    net.link_up(0, 1);
    net.link_up(1, 2);
    assert!(list_ended(&net, 2, 1));
    assert!(!list_ended(&net, 1, 2), "node 1's list waits");
    net.link_down(0, 1);
    assert!(list_ended(&net, 1, 2), "sent at the Primary's loss");
    assert_eq!(
        net.listed_blocks(1, 2),
        vec![9, 30],
        "no Primary said otherwise"
    );
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 30)[0], 1);
}

/// Rule 3's liveness (`send_deferred_lists` at a peer's role change): the settling Primary
/// demotes before its list to node 1 (which waits for node 1's state) is sent; node 1's
/// waiting list goes at the demotion. Node 1 cannot be promoted itself while its list
/// waits: a peer is Primary (so `send_deferred_lists`, which does nothing on a Primary,
/// never strands a list).
#[test]
fn a_waiting_list_goes_when_the_settling_primary_demotes() {
    let mut net = claims_from_a_failed_write();
    net.hold(1, 0);
    net.link_up(0, 1);
    assert!(settled_by_run(&net, 1), "node 1 heard the Primary's role");
    net.link_up(1, 2);
    assert!(list_ended(&net, 2, 1));
    assert!(!list_ended(&net, 1, 2), "node 1's list waits");
    let mut out = Vec::new();
    assert_eq!(
        net.nodes[1].promote(false, &mut out),
        Err(PromoteError::PeerPrimary(0))
    );
    assert_eq!(
        net.nodes[1].promote(true, &mut out),
        Err(PromoteError::PeerPrimary(0))
    );
    net.nodes[0].demote(&mut out).unwrap();
    net.push(0, out);
    net.run();
    assert_eq!(net.nodes[1].peer_primary(), None);
    assert!(list_ended(&net, 1, 2), "sent at the Primary's demotion");
    assert_eq!(net.nodes[1].role(), Role::Secondary);
}

/// `unanswered_lost`: as in `claims_from_a_failed_write`, but node 1's receipt of the
/// failed write reaches the Primary before the crash, and node 1 is back with the Primary
/// before node 2. The Primary marked node 2 (away) as lacking the write a replica may
/// hold, then, node 1 back from a crash, settled the write against node 1 too: block 9
/// was marked on both replicas, neither held a version the other could pull, and they
/// never converged. An away peer already marked as lacking the block is no current
/// replica there: node 1 is the reference, and node 2 pulls the block from it.
#[test]
fn a_failed_write_whose_crashed_holder_returns_first_is_not_marked_on_both_replicas() {
    let mut net = claims_from_a_failed_write_ack(false, true);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.link_up(1, 2);
    // Node 2, away, is marked for block 9 already: node 1 is the reference there, and
    // the Primary lists it nothing (it listed block 9 to both: no source was left).
    assert_eq!(net.listed_blocks(0, 1), Vec::<u64>::new());
    net.assert_converges();
    assert_eq!(net.listed_blocks(0, 2), vec![9, 30]);
    assert_eq!(
        net.pulled_blocks(2, 1),
        vec![9, 30],
        "node 2 pulls both from node 1"
    );
    assert_eq!(net.block(2, 30)[0], 1);
    assert_eq!(net.block(2, 9)[0], 0, "the failed write is nowhere");
}

/// As in `claims_from_a_failed_write` without the write to block 30. Node 2, away from the
/// Primary, meets node 1 first: node 1's generation ids are newer (the Primary's, from
/// before node 2 left), and node 2 goes Outdated (`OlderThan`). The diskless Primary lists
/// it nothing, but proves it neither (no up-to-date diskful peer; node 1, back from a crash,
/// is unproven), and node 1, Inconsistent, is listed block 9 (the failed write settled
/// against it: node 2 is its reference) that only node 2, serving nothing, could give:
/// never converged. Node 1's crash is settled by the Primary's run and it outranks node 2
/// by ids, so no replica holds a completed write it missed: it keeps block 9, marks node 2
/// as lacking it (`settle_named_by_generation`), is up to date, and node 2 pulls the block
/// from it. (A fix proving node 2 by the Primary's empty list was not taken: a Primary that
/// demoted and was promoted again in the same run, another having written meanwhile, would
/// prove it wrongly.)
#[test]
fn a_failed_writes_holder_outranking_its_outdated_reference_keeps_the_range() {
    let mut net = claims_from_a_failed_write_ack(true, false);
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.link_up(0, 2);
    assert_eq!(net.listed_blocks(0, 2), Vec::<u64>::new());
    assert_eq!(net.listed_blocks(0, 1), vec![9]);
    net.assert_converges();
    assert_eq!(
        net.pulled_blocks(2, 1),
        vec![9],
        "node 2 takes node 1's block 9"
    );
    assert_eq!(net.block(1, 9), net.block(2, 9));
}

/// Node 1 crashes after writes to blocks 0..4 (its activity log names blocks 0..16) and
/// misses a write to block 40; it comes back under the same run of the diskless Primary,
/// whose list names block 40 only, and meets node 2 (`first`: before the Primary).
/// It pulls block 40 and nothing of its log: neither node lists it more (cli test
/// a_secondary_killed_under_a_live_primary_pulls_only_what_it_missed, which pulled 8 MiB
/// more when node 2 had not said whom it follows as node 1 took the Primary's run).
/// The Primary's list to node 1 (its first `OutOfSync`, and all after it).
fn primary_list(m: &Msg) -> bool {
    matches!(m, Msg::OutOfSync { .. })
}

/// Node 2's report of the Primaries it follows.
fn primaries(m: &Msg) -> bool {
    matches!(m, Msg::Primaries { .. })
}

fn back_under_the_run_pulls_only_what_it_missed(node_2_first: bool, list_held: bool) {
    back_under_the_run(node_2_first, list_held, false);
}

fn back_under_the_run(node_2_first: bool, list_held: bool, node_2_unheard: bool) {
    let mut net = Net::diskless_primary();
    for b in 0..4 {
        net.write(b + 1, b * BLOCK, 4096);
    }
    net.run();
    net.tick(20);
    net.crash(1, &[(0, 16 * BLOCK)]);
    net.write(10, 40 * BLOCK, 4096);
    net.run();
    assert_eq!(net.answer(10), Some(Ok(())));
    net.sent.clear();
    if list_held {
        net.hold_at(0, 1, primary_list);
    }
    if node_2_unheard {
        net.hold_at(2, 1, primaries);
    }
    if node_2_first {
        net.link_up(1, 2);
        net.link_up(0, 1);
    } else {
        net.link_up(0, 1);
        net.link_up(1, 2);
    }
    net.run();
    if list_held {
        net.release(0, 1);
    }
    if node_2_unheard {
        net.release(2, 1);
    }
    net.run();
    for _ in 0..20 {
        net.tick(50);
    }
    assert!(settled_by_run(&net, 1));
    net.assert_converges();
    let mut pulled = net.pulled_blocks(1, 0);
    pulled.extend(net.pulled_blocks(1, 2));
    assert_eq!(pulled, vec![40], "node 1 pulls only the block it missed");
    assert!(
        net.listed_blocks(1, 2).is_empty(),
        "node 1 claims nothing on node 2"
    );
}

#[test]
fn a_replica_back_under_the_run_pulls_only_what_it_missed() {
    back_under_the_run_pulls_only_what_it_missed(false, false);
}

#[test]
fn a_replica_back_under_the_run_meeting_a_replica_first_pulls_only_what_it_missed() {
    back_under_the_run_pulls_only_what_it_missed(true, false);
}

/// Node 2 meets node 1 before the Primary's list to node 1 has ended: that run is
/// connected all the same, and knows what node 2 lacks (the fresh-clone run of the cli test
/// pulled 9,800 KiB when node 1's claims waited for the end of that list).
#[test]
fn a_replica_back_under_the_run_meeting_a_replica_before_its_list_ends_pulls_only_what_it_missed() {
    back_under_the_run_pulls_only_what_it_missed(false, true);
}

/// Node 2 meets node 1 first, but has not said whom it follows when the Primary's run
/// settles node 1's crash (the other ordering of the same cli test).
#[test]
fn a_replica_back_under_the_run_meeting_an_unheard_replica_first_pulls_only_what_it_missed() {
    back_under_the_run(true, false, true);
}
