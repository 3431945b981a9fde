//! Rules for notices and reports that cross on the wire, and for crash records around a
//! lost link: a Primary's live notice against a replica's UpToDate report (rule L), the
//! blocks a write covers only in part (rule F), and the run a Secondary records after its
//! link to the Primary dropped with writes unsettled (rule W). Three nodes over an
//! in-memory network whose disks answer at once; a direction of a link can be held (its
//! packets wait, in order) to make two packets cross.

mod common;

use common::{Net, BLOCK, SIZE};
use tandem_engine::replica::{DiskState, Event, Msg, NodeId, ReplicaAtStart, Resource};
use tandem_engine::{Io, IoError};

/// Overlapping seed 15630, up to the crossing. A diskless Primary; node 1, back from a
/// link drop, is being synced from node 2 when a write to blocks 7-9 (30720+6656, blocks 7
/// and 9 in part) goes to both. Node 1 writes it; node 2's link to the Primary drops before
/// its answer, so the write fails, node 2 is the reference (it was up to date, its answer
/// lost) and the Primary tells node 1 live that it lacks the range. Node 1's resync ends
/// before that notice reaches it: its UpToDate report crosses the notice. Returns with the
/// report handled by the Primary and the Primary's packets to node 1 still in flight.
fn report_crosses_notice() -> Net {
    let mut net = Net::diskless_primary();
    // Node 1 misses a write away from both others; back, the Primary lists it, and it has
    // no source until node 2 returns.
    net.link_down(1, 2);
    net.link_down(0, 1);
    net.write(1, 64 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::Inconsistent);
    // Node 2 returns to it; node 1's resync request waits on the wire.
    net.hold(1, 2);
    net.link_up(1, 2);
    assert!(
        (net.in_flight(1, 2).iter()).any(|m| matches!(m, Msg::ResyncReq { .. })),
        "{:?}",
        net.in_flight(1, 2)
    );
    // The write to blocks 7-9: both write it, node 2's answer is lost with its link.
    net.hold(2, 0);
    net.write(2, 30720, 6656);
    assert_eq!(net.answer(2), None, "waits for node 2, the one up to date");
    net.hold(0, 1);
    net.link_down(0, 2);
    assert!(matches!(net.answer(2), Some(Err(_))), "{:?}", net.answer(2));
    assert!(
        (net.in_flight(0, 1).iter()).any(|m| matches!(
            m,
            Msg::OutOfSync {
                offset: 30720,
                len: 6656,
                ..
            }
        )),
        "the notice is on its way: {:?}",
        net.in_flight(0, 1)
    );
    // Node 1's resync ends: it reports UpToDate before it hears the notice.
    net.release(1, 2);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    assert_eq!(net.seen(0, 1), Some(DiskState::UpToDate));
    net
}

/// Overlapping seed 15630 (rule L): the Primary, a notice to node 1 in flight, gets node 1's
/// UpToDate report sent before node 1 heard it. Cleared at the report, the notified blocks
/// looked current on node 1, and a write node 1 alone then took split block 8's newest
/// sectors between node 1 and node 2. The Primary keeps them out of sync and pings node 1
/// behind the notice; the ping's answer comes after node 1 went Inconsistent, so they stay
/// until node 1 has pulled them back from node 2.
#[test]
fn an_up_to_date_report_that_crosses_a_live_notice_leaves_the_notified_blocks_out_of_sync() {
    let mut net = report_crosses_notice();
    assert_eq!(
        net.claims(0, 1),
        3 * BLOCK,
        "blocks 7-9, told live since node 1's last UpToDate, stay out of sync"
    );
    let notice = Msg::OutOfSync {
        volume: 0,
        offset: 30720,
        len: 6656,
    };
    let behind = net.in_flight(0, 1);
    let at = |m: Msg| behind.iter().position(|&x| x == m);
    assert!(
        at(Msg::Ping).is_some_and(|ping| at(notice).is_some_and(|n| n < ping)),
        "a ping follows the notice: {behind:?}"
    );
    // The notice lands: node 1 goes Inconsistent before it answers the ping, so the
    // answer clears nothing, and it pulls the blocks back from node 2, the reference.
    net.release(0, 1);
    assert!(!net.delivered(1, 0, |m| *m == Msg::PingAck).is_empty());
    assert_eq!(net.pulled(1, 2).last(), Some(&(7 * BLOCK, 3 * 4096)));
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    assert_eq!(net.claims(0, 1), 0);
}

/// Rule L's other half (overlapping seed 15630): the blocks kept at an UpToDate report go
/// at the ping's answer when the replica heard the notice first, pulled them and still says
/// UpToDate: the barrier delays the Primary's trust in those blocks by one round trip, no
/// more.
#[test]
fn a_replica_that_heard_the_notice_before_its_report_is_cleared_at_the_ping_answer() {
    let mut net = Net::diskless_primary();
    net.link_down(1, 2);
    net.link_down(0, 1);
    net.write(1, 64 * BLOCK, 4096);
    net.link_up(0, 1);
    net.hold(1, 2);
    net.link_up(1, 2);
    net.hold(2, 0);
    net.write(2, 30720, 6656);
    net.hold(0, 1);
    net.link_down(0, 2);
    assert!(matches!(net.answer(2), Some(Err(_))));
    // The notice reaches node 1 while its resync runs: it pulls blocks 7-9 too.
    net.release(0, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::Inconsistent);
    net.hold(0, 1);
    net.release(1, 2);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    assert!(net.pulled(1, 2).contains(&(7 * BLOCK, 3 * 4096)));
    assert_eq!(net.claims(0, 1), 3 * BLOCK, "kept until the ping's answer");
    assert_eq!(net.in_flight(0, 1), vec![Msg::Ping]);
    net.release(0, 1);
    assert_eq!(
        net.claims(0, 1),
        0,
        "still UpToDate at the answer: it held them"
    );
    assert_eq!(net.seen(0, 1), Some(DiskState::UpToDate));
}

/// Overlapping seed 15630 (rule F): a diskless Primary whose only reachable up-to-date
/// replica is known to lack blocks 7-9 (a notice on its way, its UpToDate report crossing
/// it) refuses a Zero that covers block 7 whole and block 8 in part: written there alone,
/// block 8's newest sectors would be split between that replica (the Zero's) and node 2
/// (the rest). A write covering only whole blocks leaves no block split, and is taken.
#[test]
fn a_diskless_primary_refuses_a_write_to_part_of_a_block_its_only_current_replica_lacks() {
    let mut net = report_crosses_notice();
    let zero = Io::Zero {
        offset: 28672,
        len: 5632,
        fua: false,
        may_punch: false,
        fast: false,
    };
    net.submit(3, zero);
    net.write(4, 8 * BLOCK, 4096);
    net.release(0, 1);
    assert_eq!(net.answer(3), Some(Err(IoError::NoData)));
    assert!(
        net.delivered(0, 1, |m| matches!(m, Msg::Zero { .. }))
            .is_empty(),
        "the Zero went nowhere"
    );
    assert_eq!(net.answer(4), Some(Ok(())), "block 8 written whole");
}

/// Node 1, cut off from both others, misses a write to block 8 that node 2 takes; node 2
/// then leaves, and node 1 returns. Node 1's first report says UpToDate; the Primary's list
/// naming block 8 is on its way to it. Returns there.
fn listed_but_not_heard() -> Net {
    let mut net = Net::diskless_primary();
    net.link_down(1, 2);
    net.link_down(0, 1);
    net.write(1, 8 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.hold(0, 1);
    net.link_up(0, 1);
    assert_eq!(net.seen(0, 1), Some(DiskState::UpToDate));
    assert_eq!(net.claims(0, 1), BLOCK);
    assert!(
        (net.in_flight(0, 1).iter()).any(|m| matches!(
            m,
            Msg::OutOfSync {
                offset: 32768,
                len: 4096,
                ..
            }
        )),
        "{:?}",
        net.in_flight(0, 1)
    );
    net
}

/// Rule F without a crossing report (the case of overlapping seed 15630's Zero, met at a
/// reconnection): a replica says UpToDate until it hears what it missed. With node 2 away,
/// a write to part of block 8 would be vouched for by node 1 alone, which lacks the block's
/// other sectors while node 2, which holds them, lacks the write: refused instead.
#[test]
fn a_replica_that_has_not_yet_heard_its_list_vouches_for_no_write_to_part_of_a_listed_block() {
    let mut net = listed_but_not_heard();
    net.link_down(0, 2);
    net.write(2, 8 * BLOCK + 512, 1024);
    net.release(0, 1);
    assert_eq!(net.answer(2), Some(Err(IoError::NoData)));
    assert!(net
        .delivered(0, 1, |m| matches!(m, Msg::Write { .. }))
        .is_empty());
}

/// Rule F on the vouching side (overlapping seed 15630): with node 2 reachable the write to
/// part of block 8 is taken and goes to both, but node 1, known to lack block 8, is no
/// current replica for it. Node 2's answer is lost with its link: the write fails rather
/// than stand on node 1 alone.
#[test]
fn a_replica_known_to_lack_part_of_a_block_does_not_vouch_for_a_write_to_it() {
    let mut net = listed_but_not_heard();
    net.hold(2, 0);
    net.write(2, 8 * BLOCK + 512, 1024);
    assert_eq!(net.answer(2), None);
    net.release(0, 1);
    assert!(
        !net.delivered(1, 0, |m| matches!(m, Msg::WriteAck { .. }))
            .is_empty(),
        "node 1 wrote it"
    );
    assert_eq!(net.answer(2), None, "protocol C: it waits for node 2 too");
    net.link_down(0, 2);
    assert!(
        matches!(net.answer(2), Some(Err(e)) if e != IoError::NoData),
        "{:?}",
        net.answer(2)
    );
}

/// The run node 2's metadata names now (its last `WriterChanged`).
fn recorded_writer(net: &Net, n: NodeId) -> Option<tandem_engine::replica::PrimaryRun> {
    (net.events.iter().rev())
        .find_map(|(at, e)| match e {
            Event::WriterChanged { run } if *at == n => Some(*run),
            _ => None,
        })
        .flatten()
}

/// Node 2 crashes (the same boot) away from the others, its whole volume in its activity
/// log and its metadata naming the run `recorded_writer` says; node 0 writes block 16
/// meanwhile. It comes back to both.
fn crash_node_2(net: &mut Net) {
    let run = recorded_writer(net, 2);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(9, 16 * BLOCK, 4096);
    net.nodes[2] = Resource::new(net.spec(2), vec![ReplicaAtStart::Crashed]);
    net.nodes[2].restore_suspect(0, [(0, SIZE)]).unwrap();
    if let Some(run) = run {
        net.nodes[2].restore_writer(0, run).unwrap();
    }
    net.sent.clear();
    net.events.clear();
    net.link_up(0, 2);
    net.link_up(1, 2);
    for _ in 0..50 {
        net.tick(20);
    }
    assert_eq!(net.nodes[2].disk(0), DiskState::UpToDate);
}

fn settled_by_run(net: &Net, n: NodeId) -> Vec<u64> {
    (net.events.iter())
        .filter_map(|(at, e)| match e {
            Event::CrashSettledByRun { bytes, .. } if *at == n => Some(*bytes),
            _ => None,
        })
        .collect()
}

/// Overlapping soak seed 30002577 (rule W): node 2's link to the Primary drops with a write
/// not yet settled, so it keeps it; its record of the run stays, as no claim was made from
/// it (since the eleventh session; before, the record was dropped and made again once the
/// run was met). It meets that same run again, which settles what it kept. Back from a
/// later crash, it pulls only the block it missed, not its activity log's extents (before
/// seed 30002577, it recorded no run for the rest of its process life, and its log stood
/// as claims on the only current replica).
#[test]
fn a_secondary_that_kept_writes_then_met_the_same_primary_run_again_settles_a_later_crash_by_it() {
    let mut net = Net::new();
    net.write(1, 0, 4096);
    net.link_down(0, 2);
    assert_eq!(net.nodes[2].unsettled_writes(0), vec![(0, 4096)]);
    assert_eq!(
        recorded_writer(&net, 2).map(|r| r.node),
        Some(0),
        "the record stays while kept: no claim was made from the write"
    );
    net.tick(tandem_engine::replica::PEER_ACK_DELAY_MS);
    net.link_up(0, 2);
    assert!(net.nodes[2].unsettled_writes(0).is_empty());
    assert_eq!(net.claims(2, 1), 0, "its kept write claimed nothing");
    let recorded = recorded_writer(&net, 2);
    crash_node_2(&mut net);
    assert_eq!(net.distinct_pulled(2), BLOCK, "only block 16");
    assert_eq!(settled_by_run(&net, 2), vec![SIZE], "{:?}", net.events);
    assert_eq!(recorded.map(|r| r.node), Some(0), "the run, recorded again");
}

/// Rule W's limit (see `writer.rs`): kept writes that did make a claim (compared with node 1,
/// which lacked one: the Primary's links both dropped, its run alive) still taint node 2 for
/// its process life: the claim may live in its activity log only, so a later crash pulls
/// the log, though node 2 met that run again.
#[test]
fn a_secondary_whose_kept_writes_made_a_claim_records_no_run_again() {
    let mut net = Net::new();
    net.pass = |from, to, msg| !(from == 0 && to == 1 && matches!(msg, Msg::Write { .. }));
    net.write(1, 0, 4096);
    net.pass = |_, _, _| true;
    // Both Secondaries lose the Primary at once, and compare.
    for n in [1, 2] {
        net.cut(0, n);
        net.notice_down(n, 0);
    }
    net.run();
    assert_eq!(
        net.pulled(1, 2),
        vec![(0, 4096)],
        "node 2 listed the write to node 1"
    );
    // The Primary, alive in the same run, sees the links drop and come back.
    for n in [1, 2] {
        net.notice_down(0, n);
        net.run();
        net.link_up(0, n);
    }
    net.tick(20);
    assert!(net.nodes[2].unsettled_writes(0).is_empty());
    assert_eq!(net.claims(2, 1), 0, "node 1 pulled the write");
    let recorded = recorded_writer(&net, 2);
    crash_node_2(&mut net);
    assert_eq!(net.distinct_pulled(2), SIZE, "its log");
    assert!(settled_by_run(&net, 2).is_empty(), "{:?}", net.events);
    assert_eq!(recorded, None);
}
