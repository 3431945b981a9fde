//! A replica that pulls blocks changes: another diskful node may lack the new content as
//! well, and only the source's bitmap said so. The puller marks them for that node: told
//! at once if it reaches that node, listed when the two meet otherwise, even once the
//! source is gone.

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Role};

/// Node 0 (Primary) writes block 5 with both peers away; node 1 comes back and pulls it;
/// node 0 dies before node 2 returns. Node 1, promoted, lists block 5 to node 2 (failover
/// seed 29: a failed write of a Primary, pulled by one replica and marked only on that
/// Primary, stayed missing on the third replica).
#[test]
fn a_pulled_block_is_marked_for_a_node_we_do_not_reach() {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 1);
    net.run();
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert!(net.block(1, 5) == net.block(0, 5), "node 1 pulled block 5");
    let marked = net.nodes[1].out_of_sync_words(0, 2).unwrap()[0];
    assert_ne!(marked & 1 << 5, 0, "node 1 marks block 5 for node 2");
    // Node 0 is gone for good; node 1 takes over and meets node 2.
    net.link_down(0, 1);
    let mut out = Vec::new();
    net.nodes[1].promote(false, &mut out).unwrap();
    net.push(1, out);
    net.run();
    assert_eq!(net.nodes[1].role(), Role::Primary);
    net.link_up(1, 2);
    net.run();
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert!(net.block(2, 5) == net.block(1, 5), "node 2 has the write");
}

/// Node 0 (Primary) writes block 5 cut off from both peers, which stay linked; node 2 comes
/// back to node 0 and pulls it, the source saying node 1 lacks it too. Node 2 tells node 1,
/// which pulls it from node 2, even though node 0 dies without meeting node 1 (failover
/// seed 2861: a Primary's failed write pulled by one replica, with the replica lacking it
/// linked to the puller only, stayed missing there: the replicas differed at the end).
#[test]
fn a_pulled_block_is_told_to_a_node_we_reach_that_lacks_it() {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.write(1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 2);
    net.run();
    assert!(net.block(2, 5) == net.block(0, 5), "node 2 pulled block 5");
    assert!(
        net.block(1, 5) == net.block(0, 5),
        "node 1 pulled block 5 from node 2"
    );
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.claims(2, 1), 0);
}
