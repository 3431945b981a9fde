//! A replica back from a crash, cut off from the Primary, outranks by its ids a peer back
//! from a crash too; that peer follows the Primary and relays its writes we missed. Those
//! notices are no contest claim: they name writes newer than anything we hold.

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Msg};

/// Failover seed 2270: node 1, back from a crash and cut off from the Primary (node 0),
/// outranked node 2 (older ids, being synced under node 0), and dropped node 2's notice of
/// a write of node 0 it missed; node 0 died, and node 1, promoted later, served the block
/// without that acknowledged write.
#[test]
fn a_relayed_write_of_a_primary_we_do_not_reach_is_pulled_even_from_an_outranked_peer() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 3 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.crash(2, &[]);
    net.crash(1, &[(3 * 4096, 4096)]);
    let (g1, g2) = (
        *net.nodes[1].generation(0).unwrap(),
        *net.nodes[2].generation(0).unwrap(),
    );
    assert!(
        g1.history.contains(&g2.current),
        "node 1's ids {g1:?} are newer than node 2's {g2:?}"
    );
    // Node 2 follows node 0 again and is being synced (its disk stalls: the resync does
    // not end).
    net.hold_disk(2);
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    // Node 1 meets node 2 only: no Primary within its reach.
    net.link_up(1, 2);
    assert_eq!(net.disk(1), DiskState::Outdated);
    // Node 0 writes block 7: node 2 receives it and tells node 1, which missed it.
    net.write(2, 7 * BLOCK, BLOCK as u32);
    let told = net.delivered(
        2,
        1,
        |m| matches!(m, Msg::OutOfSync { offset, len, .. } if *offset == 7 * 4096 && *len > 0),
    );
    assert!(!told.is_empty(), "node 2 relays the write node 1 missed");
    let st = net.nodes[1].status();
    assert_eq!(st.volumes[0].disk, DiskState::Inconsistent, "{st:?}");
    assert!(
        st.volumes[0].resync_remaining.unwrap_or(0) > 0,
        "node 1 pulls the block it missed: {st:?}"
    );
}
