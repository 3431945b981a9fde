//! Where a block status answer comes from (`Resource::allocation_map`): decided as a read
//! is. The local replica's holes are the volume's only where a read would be served from
//! it; elsewhere the driver reports everything as data. Over the shared in-memory network
//! (`common`).

mod common;

use common::Net;
use tandem_engine::replica::{AllocationMap, DiskState, OnNoQuorum, QuorumSpec, Votes};
use tandem_engine::IoError;

#[test]
fn an_up_to_date_primary_answers_from_its_replica_and_a_secondary_not_at_all() {
    let net = Net::new();
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Local));
    // A Secondary serves no request, reads included.
    assert_eq!(net.nodes[1].allocation_map(0), Err(IoError::ReadOnly));
}

#[test]
fn a_diskless_primary_knows_no_holes() {
    let net = Net::diskless_primary();
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Unknown));
}

/// A Primary being synced reads from its peer; its own file's holes may be blocks it
/// still lacks.
#[test]
fn a_primary_being_synced_knows_no_holes_until_it_is_up_to_date() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.link_down(1, 2);
    let mut out = Vec::new();
    net.nodes[0].invalidate(0, &mut out).unwrap();
    net.hold(1, 0);
    net.push(0, out);
    net.run();
    assert_eq!(net.disk(0), DiskState::Inconsistent);
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Unknown));
    net.release(1, 0);
    assert_eq!(net.disk(0), DiskState::UpToDate);
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Local));
}

#[test]
fn without_quorum_it_fails_as_a_read_does_or_knows_nothing_while_reads_are_held() {
    for (on_loss, expect) in [
        (OnNoQuorum::IoError, Err(IoError::NoQuorum)),
        (OnNoQuorum::SuspendIo, Ok(AllocationMap::Unknown)),
    ] {
        let quorum = QuorumSpec {
            quorum: Votes::Majority,
            min_redundancy: Votes::Off,
            on_loss,
        };
        let mut net = Net::with_quorum(false, quorum);
        assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Local));
        net.link_down(0, 1);
        net.link_down(0, 2);
        assert_eq!(net.nodes[0].allocation_map(0), expect, "{on_loss:?}");
    }
}
