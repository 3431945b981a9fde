//! A failed write's holder told to pull it back from the write's reference, away, as its
//! report that it turned UpToDate crossed the Primary's decision; at the reference's
//! return each needs something of the other (`Replicas::current_but_for`, and
//! `pick_source` under a connected Primary), or, the reference back from a power loss,
//! the holder keeps the range (`Replicas::keep_pull_back`). A diskless Primary (node 0)
//! and two Secondaries over the shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Event, Msg, NotQuiet};

/// Overlapping seed 238083584, reduced. Node 1, back from missing blocks 9 and 12, pulls
/// them from node 2. Block 5's write goes to both; node 1 writes it while still being
/// synced, and only then do node 2's replies end its resync: its write acknowledgement and
/// its UpToDate report are on their way to the Primary, in that order, with the
/// acknowledgement of a new write of block 12 after them. Node 2's link to the Primary
/// drops (its acknowledgements of both lost) and it stops cleanly, keeping as claims on
/// node 1 what it served (blocks 9 and 12: node 1's report to it was lost). The Primary
/// fails block 5's write (node 1 was being synced when it answered), makes node 2 its
/// reference and tells node 1 to pull the block back; block 12's write succeeds on node 1,
/// now known current, and node 2 is marked for it. At node 2's return: node 1, being synced
/// only since the Primary's live notice, holds every write the Primary completed but block
/// 5, so it counters node 2's stale claims (`current_but_for`); and it pulls block 5 from
/// node 2, back from a clean stop and being synced itself, under the connected Primary
/// (`pick_source`). (Before, node 1 took the stale claim on block 12, which node 2 lacked
/// too, and neither would pull from the other, being synced and restarted.)
///
/// Since a replica holding writes of a lost Primary not settled cannot stop cleanly
/// (`NotQuiet::Unsettled`: a clean stop forgot them, and cluster-crash seed 300200352 left
/// two replicas different), node 2 comes back as after a crash, with blocks 5 and 12 in its
/// activity log. Its process alone crashed (the same boot): the Primary's run it took
/// writes from settles its crash (`CrashSettledByRun`), so it may pull from node 1 being
/// synced (`settled_by_primary`), and the two converge. (Ignored until wip/refclass as the
/// open gap below; it converged already with 460dc74.)
#[test]
fn a_pull_back_that_crossed_an_up_to_date_report_converges() {
    let net = pull_back_crossing_a_report(false);
    assert!(net
        .events
        .iter()
        .any(|(n, e)| *n == 2 && matches!(e, Event::CrashSettledByRun { primary: 0, .. })));
}

/// As above, but node 2's machine lost power (another boot; its disk happened to keep
/// every write): no run settles its crash, and it pulls its log's extents (blocks 5 and
/// 12) from an up-to-date source only, while node 1 waits to pull block 5 back from it,
/// the failed write's reference (cluster-crash + power-loss seed 279028646). Node 1, being
/// synced only since the connected Primary's live notice (`current_but_for`), holds every
/// write that Primary completed, block 5 too: it keeps block 5 and marks node 2 as lacking
/// it (`keep_pull_back`), is up to date, and node 2 pulls both blocks from it (and block
/// 9, which it claimed node 1 lacks: countered, `current_but_for`). (Before,
/// each waited for the other for ever.)
#[test]
fn a_pull_back_whose_reference_lost_power_is_kept_by_its_holder() {
    let net = pull_back_crossing_a_report(true);
    assert_eq!(
        net.pulled_blocks(2, 1),
        vec![5, 9, 12],
        "9: its stale claim, countered"
    );
    assert_eq!(
        net.pulled_blocks(1, 2),
        vec![9, 12],
        "before the crash: block 5 kept"
    );
}

/// The schedule of both tests; `power_lost`: node 2 lost power instead of its process
/// alone crashing.
fn pull_back_crossing_a_report(power_lost: bool) -> Net {
    let mut net = Net::diskless_primary();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.write(1, 9 * BLOCK, 4096);
    net.write(10, 12 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.answer(10), Some(Ok(())));
    net.link_up(0, 1);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    // Node 2's replies for blocks 9 and 12 wait; node 1's report to node 2 will be lost.
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.link_up(1, 2);
    net.pass = |from, to, m| !(from == 1 && to == 2 && matches!(m, Msg::Volume { .. }));
    net.hold(1, 0);
    net.hold(2, 0);
    net.write(2, 5 * BLOCK, 4096);
    assert_eq!(net.block(1, 5)[0], 2);
    net.release(2, 1);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    net.write(3, 12 * BLOCK, 4096);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.pass = |_, _, _| true;
    // It holds writes of the lost Primary not settled (blocks 5 and 12): it cannot stop
    // cleanly (`NotQuiet::Unsettled`), and comes back as after a crash, their extent in
    // its activity log.
    assert!(matches!(
        net.nodes[2].persisted(0),
        Err(NotQuiet::Unsettled(2))
    ));
    let log = [(5 * BLOCK, 4096), (12 * BLOCK, 4096)];
    if power_lost {
        net.lose_power(2, &log);
    } else {
        net.crash(2, &log);
    }
    assert_eq!(
        net.claims(2, 1),
        3 * 4096,
        "blocks 9 and 12, served, and 5, in its log"
    );
    net.release(1, 0);
    assert!(matches!(net.answer(2), Some(Err(_))), "{:?}", net.answer(2));
    assert_eq!(net.answer(3), Some(Ok(())));
    assert_eq!(net.disk(1), DiskState::Inconsistent, "block 5 to pull back");
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 12)[0], 3);
    assert_eq!(net.block(1, 5), net.block(2, 5));
    net
}
