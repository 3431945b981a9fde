//! A sync target's fresh sectors (written by the application during its resync, protected
//! from older resync data) whose writer is gone: the Primary that wrote them died before
//! it answered. A later list naming the range, from a peer whose ids hold the ones that
//! Primary wrote under, voids their protection (`Resync::writer_gone`, `orphan_listed`):
//! else the target keeps the dead Primary's sectors inside a block whose other sectors it
//! takes from the reference, and the replicas stay different (failover seeds 124, 132,
//! 162, 223, 294).

mod common;

use common::*;
use tandem_engine::replica::{DiskState, Msg, Role};
use tandem_engine::Io;

fn write_on(net: &mut Net, n: u8, req: u64, offset: u64, len: u32) {
    let io = Io::Write {
        offset,
        len,
        fua: false,
    };
    net.submit_on(n, req, io);
}

/// As failover seed 162: node 0 a diskless client, node 1 Primary, node 2 being synced.
#[test]
fn a_dead_primarys_write_on_a_sync_target_gives_way_to_the_reference() {
    let mut net = Net::diskless_primary();
    let mut out = Vec::new();
    net.nodes[0].demote(&mut out).unwrap();
    net.push(0, out);
    net.run();
    let mut out = Vec::new();
    net.nodes[1].promote(false, &mut out).unwrap();
    net.push(1, out);
    net.run();
    assert_eq!(net.nodes[1].role(), Role::Primary);
    // Node 2 misses write 1: back, it is a sync target, its pulls held.
    net.link_down(1, 2);
    write_on(&mut net, 1, 1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer_on(1, 1), Some(Ok(())));
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReq { .. }));
    net.link_up(1, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    // Write 2, part of block 7, lands on node 2 alone (node 1's own disk holds it), and
    // node 1 dies before it answers: nothing more goes out of it.
    net.hold_disk(1);
    write_on(&mut net, 1, 2, 7 * BLOCK + 1024, 1024);
    assert_eq!(net.block(2, 7)[1024], 2);
    assert_eq!(net.answer_on(1, 2), None);
    net.cut(1, 0);
    net.cut(1, 2);
    net.notice_down(0, 1);
    net.notice_down(2, 1);
    net.run();
    net.crash(1, &[(7 * BLOCK, BLOCK)]);
    // Back, its log naming block 7, it is the reference (newer ids) and lists the block
    // to node 2, still behind: node 2 takes the whole block from it.
    net.link_up(1, 0);
    net.link_up(1, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 7), net.block(1, 7));
    assert_eq!(net.block(2, 5)[0], 1);
}
