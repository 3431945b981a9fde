//! What a diskless Primary's list can settle: the writes of its own tenure that a replica
//! missed, not those from before it (see `Replicas::lacks_all_before_tenure`).

mod common;

use common::*;
use tandem_engine::replica::{DiskState, ReplicaAtStart, Resource};

/// Failover soak seed 422008346, reduced. Node 2 is away while node 0, diskless Primary,
/// writes block 3 to node 1 alone, then crashes and comes back (a new run of its engine,
/// which knows nothing of what node 2 missed); node 2 crashes too. Node 0 is promoted
/// again with both replicas connected to it but not to each other. Node 2's ids are older
/// than those node 0 was promoted with: node 0's list, all it knows of its tenure, cannot
/// name block 3, so it lists everything, and node 2 waits for node 1 to pull from.
/// (Before: node 2, back from its crash, pulled its activity log's extents under that
/// empty list and was UpToDate; node 0's word that it held all its writes (`InSync`) then
/// cleared node 1's claim on it, and block 3 was never synced.)
#[test]
fn a_replica_older_than_a_diskless_primarys_tenure_is_not_settled_by_its_list() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.crash(2, &[]);
    net.link_down(0, 1);
    let mut spec = net.spec(0);
    spec.gi_seed ^= 1 << 40;
    net.nodes[0] = Resource::new(spec, vec![ReplicaAtStart::None]);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.promote();
    assert_ne!(net.disk(2), DiskState::UpToDate, "node 2 lacks block 3");
    net.link_up(1, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.block(2, 3), net.block(1, 3));
    net.assert_converges();
}
