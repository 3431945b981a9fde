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
    net.demote_on(0);
    net.promote_on(1).unwrap();
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

/// Failover soak seed 414007734. Node 2, a sync target, keeps sectors node 0 wrote it
/// before their link dropped (orphans under node 0's ids). Node 1 is Primary for a
/// moment, connected to node 2 but writing nothing there, and goes with ids it then sets
/// back (no quorum, nothing acknowledged): no replica ever holds them. Node 0, Primary
/// again, writes one of those sectors while node 2 is away, and dies. Node 1 lists the
/// block to node 2: its ids hold node 0's, so the orphans give way. Before, node 1's
/// passing ids counted among the orphans' writers, no lister held them, and node 2 kept
/// the older sector for good.
#[test]
fn a_primary_that_wrote_no_fresh_sector_does_not_keep_the_orphans() {
    use tandem_engine::replica::OnNoQuorum;
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.link_down(0, 2);
    write_on(&mut net, 0, 1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    net.pass = |_, to, m| !(to == 2 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    write_on(&mut net, 0, 2, 7 * BLOCK, 1024);
    assert_eq!(net.answer_on(0, 2), Some(Ok(())));
    assert_eq!(net.block(2, 7)[512], 2);
    net.link_down(0, 2);

    // Node 1's tenure: ids rotated (node 0 away), nothing written, set back alone.
    net.demote_on(0);
    net.link_down(0, 1);
    net.promote_on(1).unwrap();
    let passing = net.nodes[1].generation(0).unwrap().current;
    net.link_down(1, 2);
    assert_ne!(
        net.nodes[1].generation(0).unwrap().current,
        passing,
        "set back"
    );
    net.demote_on(1);

    // Node 0 again, without node 2: sector 1 of block 7 rewritten.
    net.link_up(0, 1);
    net.promote_on(0).unwrap();
    write_on(&mut net, 0, 3, 7 * BLOCK + 512, 512);
    assert_eq!(net.answer_on(0, 3), Some(Ok(())));
    net.link_down(0, 1);

    net.pass = |_, _, _| true;
    net.link_up(1, 2);
    net.tick(1000);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.block(2, 7)[512], 3, "the older orphan kept");
    assert_eq!(net.block(2, 7), net.block(1, 7));
}

/// Node 0, Primary, loses node 1 and rotates its ids for write 2, which lands on node 2,
/// a sync target, alone (node 0's own disk holds it). Node 2's link drops too: without
/// quorum, node 0 fails write 2 and sets its ids back, the rotated id (returned) set
/// aside. Node 2's fresh sectors are orphans under that id, which no lister ever holds.
fn orphans_under_an_id_set_aside() -> (Net, u64) {
    use tandem_engine::replica::OnNoQuorum;
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.link_down(0, 2);
    write_on(&mut net, 0, 1, 5 * BLOCK, BLOCK as u32);
    assert_eq!(net.answer_on(0, 1), Some(Ok(())));
    let acked = *net.nodes[0].generation(0).unwrap();
    net.pass = |_, to, m| !(to == 2 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);

    net.link_down(0, 1);
    net.link_down(1, 2);
    net.hold_disk(0);
    write_on(&mut net, 0, 2, 7 * BLOCK, 1024);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_ne!(rotated, acked, "write 2 missed node 1");
    assert_eq!(net.block(2, 7)[512], 2);
    net.link_down(0, 2);
    assert_eq!(*net.nodes[0].generation(0).unwrap(), acked, "set back");
    (net, rotated.current)
}

/// Node 0, back or demoted, meets node 2 first and tells it of the id set aside; then
/// node 1, Primary with node 0, rewrites sector 1 of block 7 while node 2 is away, and
/// steps down. Node 0 lists block 7 to node 2 (written since they last met), its ids
/// those before the orphans' writer's: node 2 must take the block whole.
fn node_1_rewrites_an_orphan_and_node_0_lists_it(mut net: Net, set_aside: u64) {
    net.pass = |_, _, _| true;
    net.link_up(0, 2);
    let told = net.delivered(0, 2, |m| matches!(m, Msg::Abandoned { .. }));
    assert_eq!(
        told,
        vec![Msg::Abandoned {
            volume: 0,
            gi: set_aside,
            without_quorum: true,
        }]
    );
    net.link_down(0, 2);

    net.link_up(0, 1);
    net.promote_on(1).unwrap();
    write_on(&mut net, 1, 3, 7 * BLOCK + 512, 512);
    assert_eq!(net.answer_on(1, 3), Some(Ok(())));
    net.demote_on(1);

    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.block(0, 7)[512], 3);
    assert!(net.block(2, 7) == net.block(0, 7), "node 2 kept the orphan");
    net.link_up(1, 2);
    net.assert_converges();
}

/// Failover soak seed 422002317: node 0 is killed while its ids are set back, and tells
/// the id set aside after the restart (`Resource::ids_at_crash`). Before, node 2 kept
/// write 2's sector against write 3, acknowledged, and was up to date: a read there
/// returned the older data.
#[test]
fn an_id_set_back_without_quorum_is_abandoned_at_a_crash() {
    let (mut net, set_aside) = orphans_under_an_id_set_aside();
    let kept = net.nodes[0].ids_at_crash(0).unwrap();
    assert_eq!(
        kept.abandoned.map(|a| (a.gi, a.without_quorum)),
        Some((set_aside, true))
    );
    net.crash(0, &[(7 * BLOCK, BLOCK)]);
    node_1_rewrites_an_orphan_and_node_0_lists_it(net, set_aside);
}

/// As above, node 0 demoted instead (`Rotations::demoted`): the id set aside is never
/// taken up again.
#[test]
fn an_id_set_back_without_quorum_is_abandoned_at_a_demotion() {
    let (mut net, set_aside) = orphans_under_an_id_set_aside();
    net.release_disk(0);
    assert!(matches!(net.answer_on(0, 2), Some(Err(_))));
    net.demote_on(0);
    assert_eq!(net.nodes[0].role(), Role::Secondary);
    node_1_rewrites_an_orphan_and_node_0_lists_it(net, set_aside);
}

/// Failover seed 497002182. Nodes 1 and 2, back from missing write 1, are both synced by
/// the Primary (node 0), the replies to their pulls lost. Write 2 (block 5) reaches both
/// during their resyncs: fresh on both. Write 3, to the same block, reaches node 1 alone
/// before node 0 dies: node 1 received every write of that run node 2 did, and lists
/// block 5 to it when they compare. Node 2's fresh sectors from that run give way to the
/// list, whatever node 1's ids: before, node 2 kept write 2 there (node 1, syncing too,
/// had not adopted the dead Primary's newest id), and the replicas stayed different.
/// `unsettled`: node 2 still holds write 2 unsettled at the loss, else the Primary's peer
/// ack settled it; either way the two compare their last writes of that run.
fn a_later_write_of_a_dead_primary_replaces_its_fresh_sectors(unsettled: bool) {
    let mut net = Net::new();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.write_block_on(0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.pass = |_, to, m| !(to != 0 && matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 1);
    net.link_up(0, 2);
    assert_eq!(net.nodes[1].disk(0), DiskState::Inconsistent);
    assert_eq!(net.nodes[2].disk(0), DiskState::Inconsistent);
    if unsettled {
        net.pass =
            |_, to, m| !(to != 0 && matches!(m, Msg::ResyncReply { .. } | Msg::PeerAck { .. }));
    }
    net.write_block_on(0, 2, 5);
    assert_eq!(net.answer(2), Some(Ok(())));
    assert_eq!((net.block(1, 5)[0], net.block(2, 5)[0]), (2, 2));
    net.hold(0, 2);
    net.write_block_on(0, 3, 5);
    assert_eq!((net.block(1, 5)[0], net.block(2, 5)[0]), (3, 2));
    assert_eq!(net.answer(3), None);
    net.pass = |_, _, _| true;
    net.cut(0, 1);
    net.cut(0, 2);
    net.notice_down(1, 0);
    net.notice_down(2, 0);
    net.run();
    // Write 3 to node 2 went with the connection.
    net.release(0, 2);
    net.crash(0, &[(5 * BLOCK, BLOCK)]);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    let ends: Vec<u8> = (0..3).map(|n| net.block(n, 5)[0]).collect();
    assert_eq!(
        ends,
        [3, 3, 3],
        "node 2 kept the dead Primary's older write"
    );
    assert_eq!(net.block(2, 3)[0], 1);
}

#[test]
fn a_later_write_of_a_dead_primary_replaces_its_fresh_sectors_compared() {
    a_later_write_of_a_dead_primary_replaces_its_fresh_sectors(true);
}

#[test]
fn a_later_write_of_a_dead_primary_replaces_its_fresh_sectors_settled() {
    a_later_write_of_a_dead_primary_replaces_its_fresh_sectors(false);
}
