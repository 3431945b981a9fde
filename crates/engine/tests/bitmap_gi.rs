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
    let listed = older_listed(&net, before, 1, 2);
    assert!(
        matches!(listed[..], [(Some(_), 4096)]),
        "node 1 lists node 2 its bitmap: {listed:?}"
    );
    assert_eq!(net.listed_blocks(1, 2), vec![5]);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert!(net.block(2, 5) == net.block(1, 5), "block 5 reached node 2");
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
}

/// The same, but node 1 was still being sent a write of the Primary when it lost it (its
/// peer ack never came): the write may be missing on node 2 and no bitmap names it, so node
/// 1 cannot stop cleanly and comes back as after a crash. Its bitmap's id survives the
/// crash (written when node 2 left), and the activity log's extents, added to the bitmap,
/// name the write: node 2 is listed block 5 and nothing else.
#[test]
fn a_write_not_settled_keeps_a_replica_from_a_clean_stop_and_its_log_names_it() {
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
    assert!(
        matches!(older_listed(&net, before, 1, 2)[..], [(Some(_), 4096)]),
        "{:?}",
        older_listed(&net, before, 1, 2)
    );
    assert_eq!(net.listed_blocks(1, 2), vec![5]);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
}

/// Resync data is marked for no peer: node 1, back from missing block 7 while node 2 was
/// away, pulls it from the Primary (diskful here), and its bitmap for node 2 no longer
/// names all node 2 lacks. Its id is voided; after a crash of every node, node 1, newer,
/// lists node 2 everything, block 7 included. (Kept, node 1 would list node 2 block 5
/// only, and with the Primary still down, node 2 would never get block 7.)
#[test]
fn resync_data_voids_the_bitmaps_id() {
    let mut net = Net::new();
    net.tick(PEER_ACK_DELAY_MS);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.restart_cleanly(2);
    net.write(1, 5 * BLOCK, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    net.link_down(0, 1);
    net.write(2, 7 * BLOCK, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    let before = net.events.len();
    net.link_up(0, 1);
    assert_eq!(net.pulled_blocks(1, 0), vec![7]);
    let voided = (net.events[before..].iter()).any(|(n, e)| {
        *n == 1
            && matches!(
                e,
                Event::BitmapGiChanged {
                    peer: 2,
                    gi: None,
                    ..
                }
            )
    });
    assert!(voided, "node 1's bitmap for node 2 voided by the pull");
    net.tick(PEER_ACK_DELAY_MS);
    net.link_down(0, 1);
    net.restart_cleanly(1);
    let before = net.events.len();
    net.link_up(1, 2);
    assert!(
        matches!(older_listed(&net, before, 1, 2)[..], [(None, _)]),
        "{:?}",
        older_listed(&net, before, 1, 2)
    );
    assert!(net.listed_blocks(1, 2).contains(&7));
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    assert!(net.block(2, 7) == net.block(1, 7), "block 7 reached node 2");
}

/// `OlderPeerListed` events of node `n` about `peer` since event `since`: (the bitmap's
/// id, if only the bitmap was listed; bytes listed).
fn older_listed(net: &Net, since: usize, n: u8, peer: u8) -> Vec<(Option<u64>, u64)> {
    (net.events[since..].iter())
        .filter_map(|(m, e)| match e {
            Event::OlderPeerListed {
                peer: p,
                since,
                bytes,
                ..
            } if *m == n && *p == peer => Some((*since, *bytes)),
            _ => None,
        })
        .collect()
}
