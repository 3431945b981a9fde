//! A replica back from a crash with a write in flight at its loss, unanswered, whose ids
//! are newer than those of the one other replica: the Primary does not take that older
//! replica as the source of the write's range (`Replicas::unanswered_lost`). A diskless
//! Primary (node 0) and two Secondaries over the shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Event, Msg};

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

/// Overlapping seed 244057993, reduced. Node 2 is cut off from the Primary, which writes
/// block 5 to node 1 alone: the Primary changes its ids (node 1 takes them, node 2 keeps
/// the old ones) and marks node 2; node 1 tells node 2 live, and node 2 pulls the block
/// from it and is UpToDate again, away from the Primary. The Primary writes block 9 to
/// node 1 alone, which writes it and crashes before it answers or tells node 2: the write
/// fails, unanswered on node 1. Node 1, back, meets node 2 before the Primary: with no
/// Primary in its view and newer ids, it lists node 2 everything (`full_sync_if_older`).
/// Node 2 meets the Primary (which lists it block 5, marked while it was away) and says
/// UpToDate first; then node 1 meets the Primary, whose run settles its crash. Node 1's
/// ids being newer than node 2's, node 2 is no source for the failed write's range: node 1
/// is its reference, node 2 pulls it with the rest. (Before, the Primary took node 2,
/// UpToDate and not marked at block 9, for current there and listed node 1 block 9; node 2,
/// listed everything by node 1, refused it, and pulled nothing from node 1, which was
/// being synced after a crash: each waited for the other for ever.)
#[test]
fn an_older_replica_is_no_source_for_a_newer_ones_unanswered_write() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "pulled block 5 from node 1"
    );
    assert_eq!(net.block(2, 5)[0], 1);
    assert!(net.claims(0, 2) > 0, "the Primary marks node 2");
    // Block 9 reaches node 1 alone; its answer and its notice to node 2 never leave it.
    net.hold(1, 0);
    net.hold(1, 2);
    net.write(2, 9 * BLOCK, 4096);
    assert_eq!(net.block(1, 9)[0], 2);
    net.crash(1, &[(9 * BLOCK, BLOCK)]);
    assert!(matches!(net.answer(2), Some(Err(_))), "{:?}", net.answer(2));
    // Node 1 meets node 2 first; its list reaches node 2 late.
    net.hold(1, 2);
    net.link_up(1, 2);
    // Node 2 meets the Primary; its report that the Primary's list makes it Inconsistent
    // waits.
    net.hold_at(2, 0, inconsistent);
    net.link_up(0, 2);
    net.link_up(0, 1);
    assert!(
        (net.events.iter())
            .any(|(n, e)| *n == 1 && matches!(e, Event::CrashSettledByRun { primary: 0, .. })),
        "the Primary's run settles node 1's crash"
    );
    net.release(1, 2);
    net.release(2, 0);
    net.assert_converges();
    assert_eq!(net.block(2, 5)[0], 1);
    assert_eq!(net.block(2, 9)[0], net.block(1, 9)[0]);
}
