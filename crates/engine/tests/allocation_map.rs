//! Where a block status answer comes from (`Resource::allocation_map`): decided as a read
//! is. The local replica's holes are the volume's only where a read would be served from
//! it; an up-to-date peer's where a read would go to it (`Resource::block_status`);
//! elsewhere the driver reports everything as data. Over the shared in-memory network
//! (`common`, whose disks map a block of zeroes as a hole).

mod common;

use common::{majority, Net, BLOCK, SIZE};
use tandem_engine::replica::{AllocationMap, DiskState, Msg, OnNoQuorum, Protocol};
use tandem_engine::{DiskKind, IoError};
use tandem_wire::packet::AllocExtent;

#[test]
fn an_up_to_date_primary_answers_from_its_replica_and_a_secondary_not_at_all() {
    let net = Net::new();
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Local));
    // A Secondary serves no request, reads included.
    assert_eq!(net.nodes[1].allocation_map(0), Err(IoError::ReadOnly));
}

/// A read would go to an up-to-date peer, and so does the block status: its replica's
/// holes are the volume's.
#[test]
fn a_diskless_primary_asks_an_up_to_date_peer_for_its_map() {
    let mut net = Net::diskless_primary();
    net.write(1, 2 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Peer));
    net.block_status(0, 10, 0, SIZE as u32);
    assert_eq!(net.answer(10), Some(Ok(())));
    assert_eq!(
        net.block_status_answer(0, 10),
        Some(vec![hole(2 * BLOCK), data(BLOCK), hole(SIZE - 3 * BLOCK)])
    );
    let asked: Vec<_> = [1, 2]
        .into_iter()
        .flat_map(|p| net.delivered(0, p, |m| matches!(m, Msg::AllocReq { .. })))
        .collect();
    assert_eq!(asked.len(), 1, "one peer is asked: {asked:?}");
    // A range of its own: the map starts at its offset.
    net.block_status(0, 11, 2 * BLOCK, 2 * BLOCK as u32);
    assert_eq!(
        net.block_status_answer(0, 11),
        Some(vec![data(BLOCK), hole(BLOCK)])
    );
    assert_eq!(net.nodes[0].app_in_flight(), 0);
}

#[test]
fn a_diskless_primary_with_no_peer_up_to_date_knows_no_holes() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 1);
    net.link_down(0, 2);
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Unknown));
    // Asked all the same (a peer may have gone meanwhile): all data, never an error.
    net.block_status(0, 10, 0, SIZE as u32);
    assert_eq!(net.answer(10), Some(Ok(())));
    assert_eq!(net.block_status_answer(0, 10), None);
}

/// The Primary still takes it for up to date (its news is on the way): the peer answers
/// an error, and the request completes without a map rather than failing.
#[test]
fn a_peer_no_longer_up_to_date_answers_an_error_and_the_range_is_all_data() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.hold(1, 0);
    // Node 1 is synced anew from node 2, whose answers wait.
    net.hold(2, 1);
    let mut out = Vec::new();
    net.nodes[1].invalidate(0, &mut out).unwrap();
    net.push(1, out);
    net.run();
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    assert_eq!(net.seen(0, 1), Some(DiskState::UpToDate));
    net.block_status(0, 10, 0, SIZE as u32);
    assert_eq!(net.answer(10), None);
    net.release(1, 0);
    let replies = net.delivered(1, 0, |m| matches!(m, Msg::AllocReply { .. }));
    assert!(
        matches!(replies[..], [Msg::AllocReply { errno, extents: 0, .. }] if errno != 0),
        "{replies:?}"
    );
    assert_eq!(net.answer(10), Some(Ok(())));
    assert_eq!(net.block_status_answer(0, 10), None);
}

#[test]
fn a_peer_lost_with_the_request_outstanding_leaves_the_range_all_data() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.hold(1, 0);
    net.block_status(0, 10, 0, SIZE as u32);
    assert_eq!(net.answer(10), None);
    assert_eq!(
        net.nodes[0].app_in_flight(),
        1,
        "it is in flight as a read is"
    );
    net.link_down(0, 1);
    assert_eq!(net.answer(10), Some(Ok(())));
    assert_eq!(net.block_status_answer(0, 10), None);
    assert_eq!(net.nodes[0].app_in_flight(), 0);
}

/// A write the Primary completed before it asked (protocol B: received, not yet written
/// there) is in the map: the peer maps the range only once the write has landed, as it
/// serves a read.
#[test]
fn the_peer_maps_only_once_the_writes_it_received_before_have_landed() {
    let mut net = Net::diskless_primary_under(Protocol::B);
    net.hold_disk(1);
    net.write(1, 2 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())), "received by both: done");
    net.link_down(0, 2);
    net.block_status(0, 10, 0, SIZE as u32);
    assert_eq!(net.answer(10), None);
    assert_eq!(
        net.parked(1),
        vec![DiskKind::Write {
            offset: 2 * BLOCK,
            len: BLOCK as u32
        }],
        "the map waits for the write, not behind it on the disk"
    );
    net.release_disk(1);
    assert_eq!(
        net.block_status_answer(0, 10),
        Some(vec![hole(2 * BLOCK), data(BLOCK), hole(SIZE - 3 * BLOCK)])
    );
}

fn hole(len: u64) -> AllocExtent {
    AllocExtent {
        len: len as u32,
        hole: true,
    }
}

fn data(len: u64) -> AllocExtent {
    AllocExtent {
        len: len as u32,
        hole: false,
    }
}

/// A Primary being synced reads from its peer, and asks it for the map: its own file's
/// holes may be blocks it still lacks.
#[test]
fn a_primary_being_synced_asks_its_peer_until_it_is_up_to_date() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.link_down(1, 2);
    let mut out = Vec::new();
    net.nodes[0].invalidate(0, &mut out).unwrap();
    net.hold(1, 0);
    net.push(0, out);
    net.run();
    assert_eq!(net.disk(0), DiskState::Inconsistent);
    assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Peer));
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
        let mut net = Net::with_quorum(false, majority(on_loss));
        assert_eq!(net.nodes[0].allocation_map(0), Ok(AllocationMap::Local));
        net.link_down(0, 1);
        net.link_down(0, 2);
        assert_eq!(net.nodes[0].allocation_map(0), expect, "{on_loss:?}");
    }
}
