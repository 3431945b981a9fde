//! The ids a Primary rotated to while we were being synced (`Resync::writer_ids`): we take
//! every write it makes under them but, not up to date, cannot hold them. If it is gone
//! when our resync ends from another replica, we hold its data under them too. A diskful
//! Primary (node 0) and two Secondaries over the shared in-memory network (`common`).

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Msg};

/// Failover seed 477000473 (the "seed-237 class" of false split brains). Node 1, cut off,
/// misses block 3. Back, it pulls block 3 from node 2, and the Primary lists it too. Node
/// 2 is cut off from the Primary, which rotates its ids; node 1, being synced, answers that
/// it could not adopt them, and takes write 2 (block 8) under them, acknowledged. The
/// Primary is cut off and steps down; node 1's pull from node 2 ends. Holding the gone
/// Primary's ids (it took all it wrote under them, and the rest from node 2, whose ids
/// they descend from), node 1 ranks newer than node 2 (told of block 8, node 2 is being
/// synced by then: its report comes before node 1's pull ends), and node 2, promoted,
/// rotates from them when it writes without node 1: the old Primary, back, is older, not
/// apart. (With node 1 keeping its older ids, node 2 was promoted from its own, and the
/// old Primary, back, found a split brain where no two Primaries wrote apart.)
#[test]
fn a_resync_ending_after_the_primary_went_takes_the_ids_it_wrote_us_under() {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.write_block_on(0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    let before = *net.nodes[1].generation(0).unwrap();
    // Node 2's reply to node 1's pull waits.
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.link_up(1, 2);
    assert_eq!(
        net.nodes[1].disk(0),
        DiskState::Inconsistent,
        "lacks block 3"
    );
    net.link_up(0, 1);
    net.link_down(0, 2);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_ne!(
        &rotated,
        net.nodes[2].generation(0).unwrap(),
        "the Primary rotated"
    );
    assert_eq!(
        net.nodes[1].generation(0),
        Some(&before),
        "node 1 adopted nothing"
    );
    net.write_block_on(0, 2, 8);
    assert_eq!(net.answer(2), Some(Ok(())), "acknowledged with node 1");
    assert_eq!(net.block(1, 8)[0], 2, "node 1 holds it");
    // The Primary is cut off and steps down; node 1's pull from node 2 ends.
    net.link_down(0, 1);
    net.demote_on(0);
    net.release(2, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    assert_eq!(
        net.nodes[1].generation(0),
        Some(&rotated),
        "node 1 holds the gone Primary's ids"
    );
    assert_eq!(net.block(2, 8)[0], 2, "node 2 took block 8 from node 1");
    // Node 2 is promoted, is cut off from node 1 and writes alone, under new ids; the old
    // Primary returns.
    net.promote_on(2).unwrap();
    net.link_down(1, 2);
    net.write_block_on(2, 3, 9);
    assert_eq!(net.answer_on(2, 3), Some(Ok(())));
    let after = net.nodes[2].generation(0).unwrap();
    assert!(after.history.contains(&rotated.current), "{after:?}");
    net.link_up(1, 2);
    net.link_up(0, 1);
    net.link_up(0, 2);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    net.assert_converges();
    assert_eq!(net.block(0, 8)[0], 2, "write 2 survived");
}
