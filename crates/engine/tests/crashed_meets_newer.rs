//! Two replicas back from crashes meet under a Primary: the one whose ids descend from the
//! other's went on with the Primary after the other was gone, so the older one's claims on
//! it (its activity log's extents, marked for every peer at the crash) are stale. The older
//! one pulls them instead of claiming them.

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Msg};

/// The Primary writes block `block` as request `req`, acknowledged.
fn write(net: &mut Net, req: u64, block: u64) {
    net.write(req, block * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(req), Some(Ok(())), "write {req}");
}

/// Overlapping soak seed 384011407: node 2 crashed (its log naming block 5), and again in
/// another boot, and stayed away while node 1 took more writes from the diskless Primary,
/// which changed the ids past node 2's; then node 1 crashed too. Back together, node 2
/// claimed block 5 on node 1, which heard it before the Primary's list, node 1 claimed on
/// node 2 what the Primary listed, and neither was up to date: each waited for the other
/// for ever.
#[test]
fn a_crashed_replica_yields_its_claims_to_a_crashed_peer_with_newer_ids() {
    let mut net = Net::diskless_primary();
    write(&mut net, 1, 5);
    net.crash(2, &[(5 * 4096, 4096)]);
    write(&mut net, 2, 5);
    net.lose_power(2, &[(5 * 4096, 4096)]);
    assert_ne!(
        net.claims(2, 1),
        0,
        "node 2 claims its log's extent on node 1"
    );
    write(&mut net, 3, 9);
    let (g1, g2) = (
        *net.nodes[1].generation(0).unwrap(),
        *net.nodes[2].generation(0).unwrap(),
    );
    assert!(
        g1.history.contains(&g2.current),
        "node 1's ids {g1:?} descend from node 2's {g2:?}"
    );
    net.crash(1, &[(9 * 4096, 4096)]);
    // Node 1 hears that node 0 is Primary, not yet its list, when node 2 meets it.
    net.link_up(0, 2);
    net.hold_at(0, 1, |m| matches!(m, Msg::Volume { .. }));
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.release(0, 1);
    net.assert_converges();
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert!(
        net.block(2, 5) == net.block(1, 5),
        "node 2 has node 1's block 5"
    );
}
