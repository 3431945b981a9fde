//! A peer's bitmap id (DRBD's bitmap UUID, `bitmap_gi.rs`): a replica back from a clean
//! stop, with no Primary around, lists a consistent peer with older ids only what its
//! bitmap names when that bitmap counts from an id the peer holds; else everything. A
//! diskless Primary (node 0) and two Secondaries over the shared in-memory network
//! (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Event, NotQuiet, PEER_ACK_DELAY_MS};

/// Node 2 leaves in sync and stops cleanly; block 5 is written on node 1 alone (the
/// Primary changes the ids first); node 1 stops cleanly too, and the Primary is gone. The
/// two meet with no Primary: node 1, newer, lists node 2 block 5 only (before: every block
/// of the volume), is proven by the ids, and node 2 pulls the block from it.
#[test]
fn a_whole_cluster_back_from_clean_stops_lists_an_older_replica_its_bitmap() {
    let mut net = Net::diskless_primary();
    net.write(1, BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.tick(PEER_ACK_DELAY_MS);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.restart_cleanly(2);
    net.write(2, 5 * BLOCK, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    net.tick(PEER_ACK_DELAY_MS);
    net.link_down(0, 1);
    net.restart_cleanly(1);
    let before = net.events.len();
    net.link_up(1, 2);
    let listed: Vec<_> = (net.events[before..].iter())
        .filter_map(|(n, e)| match e {
            Event::OlderPeerListed {
                peer: 2,
                since,
                bytes,
                ..
            } if *n == 1 => Some((*since, *bytes)),
            _ => None,
        })
        .collect();
    assert!(
        matches!(listed[..], [(Some(_), 4096)]),
        "node 1 lists node 2 its bitmap: {listed:?}"
    );
    assert_eq!(net.listed_blocks(1, 2), vec![5]);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.block(2, 5), net.block(1, 5));
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
}

/// The same, but node 1 was still being sent a write of the Primary when it lost it (its
/// peer ack never came): the write may be missing on node 2, and no bitmap names it, so
/// node 1 cannot stop cleanly; it comes back as after a crash, its bitmap tied to no id,
/// and lists node 2 everything.
#[test]
fn a_write_not_settled_keeps_a_replica_from_a_clean_stop() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.restart_cleanly(2);
    net.write(2, 5 * BLOCK, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    net.link_down(0, 1);
    assert!(matches!(
        net.nodes[1].persisted(0),
        Err(NotQuiet::Unsettled(1))
    ));
    net.crash(1, &[(5 * BLOCK, 4096)]);
    let before = net.events.len();
    net.link_up(1, 2);
    let full = (net.events[before..].iter()).any(|(n, e)| {
        *n == 1
            && matches!(
                e,
                Event::OlderPeerListed {
                    peer: 2,
                    since: None,
                    ..
                }
            )
    });
    assert!(full, "node 1 lists node 2 everything");
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
}
