//! A replica whose fdatasync fails under a FUA write's barrier (`BarrierAck` with an
//! error, its replica detached) holds nothing: while the write is still open it vouches
//! for nothing and counts as no holder of it. A diskless Primary (node 0) and two
//! Secondaries under protocol A over the shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, Protocol};
use tandem_engine::Io;

/// Disk-errors seed 251048620, reduced. The Primary writes block 3 with FUA to both
/// Secondaries. Both receive and write it; node 1 answers, node 2's answers are held.
/// The barrier goes out; node 1's fdatasync fails (EIO): it detaches and answers the
/// barrier with EIO. Node 2 crashes before its answers leave. No replica that said it
/// holds the write is left, so the write fails, and node 2, unanswered, is settled at its
/// return: no other replica is up to date, so its content is the range's and it turns
/// UpToDate. (Before, node 1's write answer still counted: the failed write "landed"
/// on node 1, node 2 was marked as lacking block 3, and at its return it waited for ever
/// for a source, the only other replica being detached.)
#[test]
fn a_replica_whose_flush_failed_holds_no_fua_write() {
    let mut net = Net::diskless_primary_under(Protocol::A);
    net.hold_at(2, 0, |m| matches!(m, Msg::WriteAck { .. }));
    net.hold_at(0, 1, |m| matches!(m, Msg::Barrier { .. }));
    let io = Io::Write {
        offset: 3 * BLOCK,
        len: 4096,
        fua: true,
    };
    net.submit(1, io);
    assert_eq!(net.block(1, 3)[0], 1, "node 1 wrote it");
    assert_eq!(net.block(2, 3)[0], 1, "node 2 wrote it");
    assert_eq!(
        net.delivered(2, 0, |m| matches!(m, Msg::RecvAck { .. }))
            .len(),
        1,
        "node 2's receipt reached the Primary"
    );
    assert_eq!(net.answer(1), None, "the barrier is open");
    net.hold_disk(1);
    net.release(0, 1);
    net.crash(2, &[(0, 16 * BLOCK)]);
    net.fail_held_disk(1);
    assert_eq!(net.disk(1), DiskState::Diskless, "node 1 detached");
    assert!(
        matches!(net.answer(1), Some(Err(_))),
        "no replica holds it that said so: {:?}",
        net.answer(1)
    );
    net.link_up(0, 2);
    net.link_up(1, 2);
    for _ in 0..100 {
        net.tick(50);
    }
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "listed 0->2 {:?}; {:?}",
        net.listed(0, 2),
        net.nodes[2].status()
    );
    assert_eq!(net.claims(0, 2), 0, "the Primary marks nothing on node 2");
    assert_eq!(net.block(2, 3)[0], 1);
}
