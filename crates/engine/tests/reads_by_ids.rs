//! Where a Primary without an up-to-date replica of its own sends a read: among the
//! up-to-date peers, those holding its generation ids first.

mod common;

use common::{gen, Net};
use tandem_engine::replica::{Msg, ReplicaAtStart};
use tandem_engine::Io;

/// Failover seed 370000115: the diskless node 0, restarted, meets two up-to-date replicas
/// that have not met each other, node 1 with newer ids (6 over 5) than node 2, which may
/// have missed writes of the run that changed them. Promoted, node 0 takes node 1's ids
/// and reads from node 1 only (round robin over both read a block without an acknowledged
/// write from node 2).
#[test]
fn a_diskless_primary_reads_from_the_replicas_holding_its_ids() {
    let found = [ReplicaAtStart::UpToDate, ReplicaAtStart::UpToDate];
    let mut net = Net::diskless_primary_with(found, [gen(6, &[5]), gen(5, &[])]);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.promote();
    for req in 1..=4 {
        let io = Io::Read {
            offset: req * 4096,
            len: 4096,
        };
        net.submit_on(0, req, io);
        net.run();
        assert_eq!(net.answer(req), Some(Ok(())), "read {req}");
    }
    let asked = |to| {
        net.delivered(0, to, |m| matches!(m, Msg::ReadReq { .. }))
            .len()
    };
    assert_eq!(asked(1), 4, "node 1 holds the Primary's ids");
    assert_eq!(asked(2), 0, "node 2's ids are older");
}
