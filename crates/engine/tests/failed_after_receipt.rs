//! A replica that received a write (protocol B's `RecvAck`) and then failed to write it
//! (`NegAck`, its replica detached) holds nothing: it vouches for nothing while the write
//! is still open. A diskless Primary (node 0) and two Secondaries under protocol B over the
//! shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, Protocol};

/// Disk-errors seed 245032910, reduced. The Primary writes block 3 to both Secondaries.
/// Node 1 acknowledges receipt, then its disk fails the write (EIO): it answers `NegAck`
/// and detaches. Node 2 receives and writes it, but its answers never reach the Primary:
/// the link drops first. No replica confirmed holding the write, so it fails, and node 2,
/// unanswered, is settled at its return: it lacks nothing else, no other replica is up to
/// date, so its content is the range's and it stays UpToDate. (Before, node 1's receipt
/// vouched for the write though node 1 then failed it: the write succeeded, node 2 was
/// marked as lacking block 3, and at its return it waited for ever for a source, the only
/// other replica being detached.)
#[test]
fn a_receipt_its_replica_then_failed_vouches_for_nothing() {
    let mut net = Net::diskless_primary_under(Protocol::B);
    net.hold_disk(1);
    net.hold(2, 0);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(
        net.delivered(1, 0, |m| matches!(m, Msg::RecvAck { .. }))
            .len(),
        1
    );
    assert_eq!(net.block(2, 3)[0], 1, "node 2 wrote it");
    assert_eq!(net.answer(1), None, "node 2 has not answered");
    net.fail_held_disk(1);
    assert_eq!(net.disk(1), DiskState::Diskless, "node 1 detached");
    net.link_down(0, 2);
    assert!(
        matches!(net.answer(1), Some(Err(_))),
        "no replica holds it that said so: {:?}",
        net.answer(1)
    );
    net.link_up(0, 2);
    for _ in 0..100 {
        net.tick(50);
    }
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "listed 0->2 {:?} 1->2 {:?} answer {:?}; {:?}",
        net.listed(0, 2),
        net.listed(1, 2),
        net.answer(1),
        net.nodes[2].status()
    );
    assert_eq!(net.claims(0, 2), 0, "the Primary marks nothing on node 2");
    assert_eq!(net.block(2, 3)[0], 1);
}
