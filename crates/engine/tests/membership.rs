//! A node added to a running resource (`tandem adjust`, `Resource::add_peer`): a pair
//! with a Primary takes a third node while writing; the newcomer, created empty, is synced
//! in full and takes the writes from then on, and its vote counts at once.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{
    AddPeerError, DiskState, Event, OnNoQuorum, QuorumSpec, ReplicaAtStart, Votes,
    PEER_ACK_DELAY_MS,
};

fn add_node_2(net: &mut Net) {
    for n in [0, 1] {
        let mut out = Vec::new();
        net.nodes[n].add_peer(2, vec![true], &mut out).unwrap();
        net.push(n as u8, out);
    }
    net.run();
}

#[test]
fn a_node_added_while_the_primary_writes_is_synced_and_takes_the_writes() {
    let mut net = Net::pair_and_a_newcomer(QuorumSpec::OFF, ReplicaAtStart::Created);
    net.write(1, BLOCK, 4096);
    net.write(2, 9 * BLOCK, 8192);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.answer(2), Some(Ok(())));
    add_node_2(&mut net);
    assert!(
        net.nodes[0].status().peers.iter().any(|p| p.id == 2),
        "node 2 is a peer of node 0 now"
    );
    // Written while node 2 is known but away.
    net.write(3, 20 * BLOCK, 4096);
    assert_eq!(net.answer(3), Some(Ok(())));
    net.link_up(0, 2);
    net.link_up(1, 2);
    // A write while it syncs, then one after.
    net.write(4, 9 * BLOCK, 4096);
    net.tick(PEER_ACK_DELAY_MS);
    net.write(5, 30 * BLOCK, 4096);
    assert_eq!(net.answer(4), Some(Ok(())));
    assert_eq!(net.answer(5), Some(Ok(())));
    assert_eq!(net.disk(2), DiskState::UpToDate);
    for b in [1, 9, 10, 20, 30] {
        assert!(net.block(2, b) == net.block(0, b), "block {b} on node 2");
    }
    net.assert_converges();
}

/// Node 2 brings a replica of its own, consistent by its metadata and with the same
/// (never rotated) generation id as the pair, but without block 3, written before it was
/// added. We hold no record of what it has, so it is listed everything (with nothing
/// listed, it would keep its old block 3 and pass for in sync).
#[test]
fn a_node_added_is_listed_everything() {
    let mut net = Net::pair_and_a_newcomer(QuorumSpec::OFF, ReplicaAtStart::Consistent);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    add_node_2(&mut net);
    net.link_up(0, 2);
    net.link_up(1, 2);
    let listed = net.listed_blocks(0, 2);
    assert!(
        listed.len() as u64 >= common::SIZE / BLOCK,
        "node 0 lists node 2 every block: {} listed",
        listed.len()
    );
    assert!(net.block(2, 3) == net.block(0, 3), "block 3 reached node 2");
    net.assert_converges();
}

/// With quorum `majority`, the pair keeps its quorum when a third voter is added (2 of
/// 3); with `all` the Primary loses it until the newcomer is connected and up to date.
#[test]
fn a_node_added_votes_at_once() {
    let majority = QuorumSpec {
        quorum: Votes::Majority,
        on_loss: OnNoQuorum::IoError,
        ..QuorumSpec::OFF
    };
    let mut net = Net::pair_and_a_newcomer(majority, ReplicaAtStart::Created);
    add_node_2(&mut net);
    net.write(1, BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())), "2 of 3 is a majority");

    let all = QuorumSpec {
        quorum: Votes::All,
        ..majority
    };
    let mut net = Net::pair_and_a_newcomer(all, ReplicaAtStart::Created);
    let before = net.events.len();
    add_node_2(&mut net);
    let lost = (net.events[before..].iter())
        .any(|(n, e)| *n == 0 && matches!(e, Event::QuorumChanged { quorate: false, .. }));
    assert!(lost, "node 0 lost quorum: node 2 is a voter now");
    net.write(1, BLOCK, 4096);
    assert!(
        matches!(net.answer(1), Some(Err(_))),
        "no quorum: the write fails"
    );
    net.link_up(0, 2);
    net.link_up(1, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    net.write(2, BLOCK, 4096);
    assert_eq!(net.answer(2), Some(Ok(())), "quorum back with node 2");
    net.assert_converges();
}

#[test]
fn adding_a_known_node_or_a_wrong_shape_is_refused() {
    let mut net = Net::pair_and_a_newcomer(QuorumSpec::OFF, ReplicaAtStart::Created);
    let mut out = Vec::new();
    assert_eq!(
        net.nodes[0].add_peer(1, vec![true], &mut out),
        Err(AddPeerError::Known(1))
    );
    assert_eq!(
        net.nodes[0].add_peer(0, vec![true], &mut out),
        Err(AddPeerError::Known(0))
    );
    assert_eq!(
        net.nodes[0].add_peer(32, vec![true], &mut out),
        Err(AddPeerError::IdOutOfRange(32))
    );
    assert_eq!(
        net.nodes[0].add_peer(2, vec![true, false], &mut out),
        Err(AddPeerError::Volumes { got: 2, want: 1 })
    );
    assert!(out.is_empty());
}
