//! A replica being synced, with no Primary connected, never pulls from a peer whose ids
//! its own descend from: what it lacks was written under its ids or later ones, which
//! that peer never held. Three diskful nodes over the shared in-memory network (`common`).

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Event, Msg};

/// Node 0 is cut off and node 2 becomes Primary (its ids rotate; node 1 adopts them).
/// Node 2 writes block 5 with node 1, then block 6 alone (its ids rotate again), and node
/// 1 is pulling block 6 from it when node 2 crashes. Node 1 meets node 0, up to date with
/// the ids from before node 2's tenure: pulled from it, block 6 took node 0's older data,
/// node 1 called itself up to date, and node 2, back, pulled the blocks its activity log
/// names from those two: write 3, acknowledged, was gone from every replica (found while
/// trying a fix for failover seed 497000244).
#[test]
fn a_primary_back_from_a_crash_keeps_the_writes_of_its_tenure() {
    let mut net = Net::new();
    net.demote_on(0);
    let before = *net.nodes[0].generation(0).unwrap();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.promote_on(2).unwrap();
    net.write_block_on(2, 2, 5);
    assert_eq!(net.answer_on(2, 2), Some(Ok(())));
    net.link_down(1, 2);
    net.write_block_on(2, 3, 6);
    assert_eq!(net.answer_on(2, 3), Some(Ok(())));
    let tenure = *net.nodes[1].generation(0).unwrap();
    assert!(tenure.history.contains(&before.current), "{tenure:?}");
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.link_up(1, 2);
    assert_eq!(
        net.nodes[1].disk(0),
        DiskState::Inconsistent,
        "lacks block 6"
    );
    net.crash(2, &[(5 * BLOCK, 2 * BLOCK)]);
    net.link_up(0, 1);
    assert_ne!(
        net.nodes[1].disk(0),
        DiskState::UpToDate,
        "block 6 is not node 0's to give"
    );
    assert_eq!(net.block(1, 6)[0], 0, "nothing pulled into block 6");
    let waits = |e: &Event| {
        matches!(
            e,
            Event::ResyncWaitsForNewer {
                volume: 0,
                older: 0
            }
        )
    };
    let told = net
        .events
        .iter()
        .filter(|(n, e)| *n == 1 && waits(e))
        .count();
    assert_eq!(told, 1, "node 1 says once why it waits");
    net.link_up(0, 2);
    net.link_up(1, 2);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    net.assert_converges();
    assert_eq!(net.block(0, 5)[0], 2, "write 2 survived");
    assert_eq!(net.block(0, 6)[0], 3, "write 3 survived");
}
