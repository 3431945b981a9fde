//! A block still to pull that the Primary's writes cover whole during the resync leaves
//! the pull (`Resync::written_whole`): the replica holds its newest data, and a reply
//! would write none of it. A diskless Primary (node 0) and two Secondaries over the
//! shared in-memory network (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::DiskState;

/// Overlapping seed 232031512, reduced. Node 1, away from both others, misses a write to
/// block 5. Back under the Primary alone (its link to node 2, the only other replica, still
/// down), it is listed block 5 and has no source for it. The Primary then writes block 5
/// whole to both replicas: node 1 holds the block's newest data, and its resync ends with
/// nothing pulled. (Before, block 5 stayed to pull: node 1 waited for a source, and in the
/// seed the only other replica, lacking the block too, refused it for ever.)
#[test]
fn a_block_written_whole_during_the_resync_is_not_pulled() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.write(1, 5 * BLOCK + 512, 1024);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.link_up(0, 1);
    assert_eq!(net.listed_blocks(0, 1), vec![5]);
    assert_eq!(
        net.disk(1),
        DiskState::Inconsistent,
        "no source for block 5"
    );
    net.write(2, 5 * BLOCK, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    assert_eq!(net.block(1, 5)[0], 2);
    assert_eq!(
        net.disk(1),
        DiskState::UpToDate,
        "block 5 is whole on node 1"
    );
    assert_eq!(net.claims(0, 1), 0);
    assert!(net.pulled_blocks(1, 2).is_empty());
    net.link_up(1, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 5)[4095], 2);
}
