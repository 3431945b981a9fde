//! A diskful Primary whose own replica turns UpToDate while an application write is in
//! flight (`Writes::local_current`): its local copy vouches for the write, as a peer's
//! does once its resync ends (`Writes::peer_current`). Over the shared in-memory network
//! (`common`).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg};

/// Cluster-crash + power-loss soak seed 215025115: node 0, Primary, pulled what it lacked
/// from node 1 while the application wrote; its resync ended with a write still in flight,
/// and node 1's link then dropped before it answered. The write had landed on node 0's
/// replica, up to date by then, and failed (EIO): only a replica up to date when the write
/// went out vouched for it.
#[test]
fn a_write_in_flight_when_the_primarys_own_resync_ends_is_vouched_by_its_replica() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.link_down(1, 2);
    let mut out = Vec::new();
    net.nodes[0].invalidate(0, &mut out).unwrap();
    // Node 1's answers wait: its resync replies, then the write's acknowledgement.
    net.hold(1, 0);
    net.push(0, out);
    net.run();
    assert_eq!(net.disk(0), DiskState::Inconsistent);
    // Replies arrive until node 0 has asked for the whole volume: node 1 answers the
    // write after the replies to those requests.
    let asked = |net: &Net| {
        net.pulled(0, 1)
            .iter()
            .map(|&(_, l)| u64::from(l))
            .sum::<u64>()
    };
    while asked(&net) < common::SIZE {
        net.release_one(1, 0);
    }
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.block(0, 3)[0], 1, "node 0 wrote it");
    // The resync's last replies arrive, and node 0 turns UpToDate; the write's answer is
    // still on its way.
    while net.disk(0) != DiskState::UpToDate {
        let m = net.release_one(1, 0);
        assert!(
            !matches!(m, Msg::WriteAck { .. }),
            "the resync ends before the write is answered"
        );
    }
    assert_eq!(net.answer(1), None, "still waiting for node 1");
    net.link_down(0, 1);
    assert_eq!(
        net.answer(1),
        Some(Ok(())),
        "node 0's replica vouches for it"
    );
}
