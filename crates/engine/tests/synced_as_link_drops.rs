//! A replica being synced under a Primary's list takes the Primary's ids when its resync
//! ends, and tells the Primary so. If the link drops before that report arrives, the
//! Primary does not know the replica holds its ids: it changes them all the same at the
//! next write that replica misses, as DRBD makes a new current UUID at the first write
//! after losing a peer disk. Otherwise its later writes, landed on the other replica
//! alone, are under ids both replicas hold, and nothing tells which of the two is newer
//! (overlapping soak seed 451053910, in `crates/sim/tests/seeds.rs`).

mod common;

use common::*;
use tandem_engine::replica::DiskState;

/// The Primary writes block `block` as request `req`, acknowledged.
fn write(net: &mut Net, req: u64, block: u64) {
    net.write(req, block * BLOCK, BLOCK as u32);
    assert_eq!(net.answer(req), Some(Ok(())), "write {req}");
}

/// Node 1, away while block 5 was written, is synced from node 2 under the diskless
/// Primary's list; its report that it is up to date is lost with its link to the Primary.
fn synced_as_the_link_drops() -> Net {
    let mut net = Net::diskless_primary();
    write(&mut net, 1, 3);
    net.link_down(0, 1);
    net.link_down(1, 2);
    write(&mut net, 2, 5);
    // Its resync's write waits on its disk while its report to the Primary is held.
    net.hold_disk(1);
    net.link_up(0, 1);
    net.link_up(1, 2);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    net.hold(1, 0);
    net.release_disk(1);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    assert_eq!(net.block(1, 5), net.block(2, 5), "node 1 pulled block 5");
    assert_eq!(
        net.nodes[1].generation(0),
        net.nodes[2].generation(0),
        "node 1 took the Primary's ids at the end of its resync"
    );
    net.link_down(0, 1);
    net
}

#[test]
fn a_primary_losing_a_replica_being_synced_changes_its_ids() {
    let mut net = synced_as_the_link_drops();
    write(&mut net, 3, 7);
    let (g1, g2) = (
        *net.nodes[1].generation(0).unwrap(),
        *net.nodes[2].generation(0).unwrap(),
    );
    assert!(
        g2.current != g1.current && g2.history.contains(&g1.current),
        "node 2's ids {g2:?} descend from node 1's {g1:?}"
    );
}
