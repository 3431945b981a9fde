//! A failed write's holder whose list from the Primary has not ended (`PeerVol::pull_back`).
//! A diskless Primary (node 0) and two Secondaries over the shared in-memory network
//! (`common`), rebuilding the simulator's seed by holding links.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg};
use tandem_engine::{Io, IoError};
/// Overlapping soak seed 204080907. Node 2 misses a write to the end of block 4 away from
/// both others. A FUA write to node 1 alone (block 10) waits for its flush when node 2
/// returns: the Primary's list to node 2 waits for that write. A write over blocks 3 and
/// 4 (part of each) then reaches both replicas; node 1's link drops before it answers, and
/// the write fails (node 2, lacking block 4, cannot vouch for it). Node 1, up to date and
/// lacking nothing there, is the range's reference; node 2, the holder whose list has not
/// ended, hears its list and then, live, the range again: the list alone leaves its
/// protection of what the Primary wrote it before the list. Back, node 1 serves blocks 3
/// and 4. (Given up, the Primary marked node 1 for blocks 3 and 4, and node 2's list named
/// block 4: each replica lacked block 4 and refused it to the other for ever.)
#[test]
fn a_failed_writes_holder_whose_list_has_not_ended_pulls_it_back_from_the_reference() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 4 * BLOCK + 3072, 1024);
    assert_eq!(net.answer(1), Some(Ok(())));
    // Node 1 writes the FUA write; its flush's answer, and all after it, wait.
    net.hold_at(1, 0, |m| matches!(m, Msg::BarrierAck { .. }));
    let fua = Io::Write {
        offset: 10 * BLOCK,
        len: 4096,
        fua: true,
    };
    net.submit(2, fua);
    assert_eq!(net.block(1, 10)[0], 2);
    net.link_up(0, 2);
    assert!(
        net.listed(0, 2).is_empty(),
        "the list waits for the FUA write"
    );
    net.write(3, 3 * BLOCK + 1024, 4096);
    assert_eq!(net.block(1, 4)[0], 3, "node 1 wrote it");
    assert_eq!(net.block(2, 4)[0], 3, "node 2 wrote it");
    net.link_down(0, 1);
    assert_eq!(net.answer(3), Some(Err(IoError::Os(5))));
    assert_eq!(net.claims(0, 1), 0, "node 1 is the reference");
    // Node 2's list (with the FUA write's block: it failed, and landed on node 1), its
    // end, then the range again, live.
    let told: Vec<(u64, u32)> = (net.delivered(0, 2, |m| matches!(m, Msg::OutOfSync { .. })))
        .iter()
        .filter_map(|m| match *m {
            Msg::OutOfSync { offset, len, .. } => Some((offset, len)),
            _ => None,
        })
        .skip(1)
        .collect();
    assert_eq!(
        told,
        vec![
            (3 * BLOCK, 8192),
            (10 * BLOCK, 4096),
            (0, 0),
            (3 * BLOCK, 8192),
            (0, 0)
        ],
        "node 2 pulls the range back"
    );
    assert_eq!(net.nodes[2].disk(0), DiskState::Inconsistent);
    net.link_up(0, 1);
    net.link_up(1, 2);
    assert!(net.pulled_blocks(1, 2).is_empty(), "node 1 pulls nothing");
    assert_eq!(net.pulled_blocks(2, 1), vec![3, 4, 10]);
    net.assert_converges();
    assert_eq!(
        net.block(2, 4)[4095],
        1,
        "the acknowledged write is on both"
    );
}
