//! Replicas back from crashes with the same generation ids rank each other to pick the
//! source of what either may have lost. One whose node lost power (another boot) may have
//! lost writes to its activity log's extents with the page cache; one whose process alone
//! crashed kept them. With nothing else to choose by, the one that kept them is the source.

mod common;

use common::*;
use tandem_engine::replica::DiskState;

/// Cluster-crash soak seed 456019065, reduced: a write both replicas held; node 1 lost
/// power and its copy went back to the zeroes it had last made durable; node 2's process
/// crashed. Met again with equal ids and no Primary, node 1 outranked node 2 by node id,
/// and node 2 pulled node 1's zeroes over the acknowledged write.
#[test]
fn a_replica_that_lost_power_is_not_the_source_for_one_that_kept_its_writes() {
    let mut net = Net::diskless_primary();
    net.write(1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(1), Some(Ok(())));
    // The Primary's links drop with the nodes: neither replica hears of a rotation.
    net.cut(0, 1);
    net.cut(0, 2);
    net.lose_power(1, &[(5 * BLOCK, BLOCK)]);
    net.lose_block(1, 5);
    net.crash(2, &[(5 * BLOCK, BLOCK)]);
    assert_eq!(
        net.nodes[1].generation(0),
        net.nodes[2].generation(0),
        "equal ids: only the contest decides"
    );
    net.link_up(1, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate, "node 2 is the source");
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    for n in [1, 2] {
        assert!(
            net.block(n, 5) == [1u8; BLOCK as usize],
            "node {n}'s block 5"
        );
    }
}
