//! Failed writes and the replica that comes back from a dropped link holding them
//! (`Replicas::unanswered_lost`): which replica is the range's reference, and who pulls
//! what. A diskless Primary (node 0) and two Secondaries over an in-memory network whose
//! disks answer at once and keep their bytes, so that the replicas' data can be compared.
//! A link may be held (its packets wait, in order, as on a slow link) to choose the order
//! in which things happen, as the simulator's seeds did.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg, NodeId};
use tandem_engine::IoError;

/// The write of the Group A seeds: 1 KiB inside block 9, bytes of `1`.
const FAILED: (u64, u32) = (9 * BLOCK + 512, 1024);

/// `holder` alone is sent the write (`other`'s link to the Primary is down), and its link
/// drops before it answers: the write fails, and `holder` wrote it.
fn write_reaches_only(net: &mut Net, holder: NodeId, other: NodeId) {
    net.link_down(0, other);
    net.hold(holder, 0);
    net.write(1, FAILED.0, FAILED.1);
    net.link_down(0, holder);
    assert_eq!(net.answer(1), Some(Err(IoError::Os(5))), "the write failed");
    assert_eq!(net.block(holder, 9)[512], 1, "its holder wrote it");
    assert_eq!(net.block(other, 9)[512], 0);
}

/// Who pulls the failed write's block once every link is back: `other` (told by the
/// Primary, and by `holder`, that it lacks it) from `holder`, and nobody else; both end
/// up to date with `holder`'s version, the failed write in it.
fn assert_holder_is_the_reference(net: &mut Net, holder: NodeId, other: NodeId) {
    net.assert_converges();
    assert_eq!(
        net.listed_blocks(0, other),
        vec![9],
        "the Primary marks the replica that missed it"
    );
    assert_eq!(
        net.listed_blocks(0, holder),
        Vec::<u64>::new(),
        "and not its holder"
    );
    assert_eq!(net.pulled_blocks(other, holder), vec![9]);
    assert_eq!(net.pulled_blocks(holder, other), Vec::<u64>::new());
    assert_eq!(net.block(other, 9)[512], 1, "the holder's version");
}

/// Rule D, overlapping seed 11606 (and 13206, its mirror image with node 1 the holder): a
/// write goes to one Secondary only, which relays live to the other that it lacks the
/// write; the holder's link to the Primary drops before it answers. The relay reaches the
/// other Secondary only after the holder is back with the Primary, which then knew the
/// other one as up to date and unmarked. Taking it as the source would have the holder
/// pull the range from a replica it has told to pull it from the holder: each refuses the
/// other for ever. The Primary takes the holder as the reference instead.
#[test]
fn a_failed_write_relayed_by_its_only_holder_makes_it_the_reference() {
    for (holder, other) in [(2, 1), (1, 2)] {
        let mut net = Net::diskless_primary();
        net.hold(holder, other);
        write_reaches_only(&mut net, holder, other);
        // The other Secondary is back with the Primary first; what it says to the holder
        // (its new generation ids) reaches it only after the holder is back too.
        net.hold(other, holder);
        net.link_up(0, other);
        net.link_up(0, holder);
        assert_eq!(
            net.claims(0, other),
            4096,
            "holder {holder}: the Primary marks node {other}"
        );
        assert_eq!(
            net.claims(0, holder),
            0,
            "holder {holder}: and not the holder"
        );
        net.release_stepwise(holder, other);
        net.release_stepwise(other, holder);
        assert_holder_is_the_reference(&mut net, holder, other);
    }
}

/// Rule D, overlapping seed 7542: as in 11606, but the link between the Secondaries is
/// down: the holder marks the other Secondary and lists it when that link is back. The
/// other Secondary also missed an earlier write (block 10) while away from the Primary,
/// and is back with it first: listed that block, it goes Inconsistent, but its report is
/// still on its way when the holder returns, so the Primary knows it as up to date and
/// unmarked in block 9. It must make the same choice as the holder's list (it marked the
/// holder instead, and each Secondary then refused the other block 9 for ever).
#[test]
fn a_failed_write_its_only_holder_lists_later_makes_it_the_reference() {
    let (holder, other) = (2, 1);
    let mut net = Net::diskless_primary();
    net.link_down(1, 2);
    net.link_down(0, other);
    net.write(7, 10 * BLOCK, 4096);
    assert_eq!(net.answer(7), Some(Ok(())));
    write_reaches_only(&mut net, holder, other);
    net.hold_at(other, 0, |m| {
        matches!(
            m,
            Msg::Volume {
                disk: DiskState::Inconsistent,
                ..
            }
        )
    });
    net.link_up(0, other);
    net.link_up(0, holder);
    assert_eq!(
        net.claims(0, other),
        2 * 4096,
        "the Primary marks node 1 for block 9 too"
    );
    assert_eq!(net.claims(0, holder), 0, "and not the holder");
    net.link_up(1, 2);
    assert_eq!(
        net.listed_blocks(holder, other),
        vec![9, 10],
        "as the holder's list does"
    );
    net.release_stepwise(other, 0);
    net.assert_converges();
    assert_eq!(net.listed_blocks(0, other), vec![9, 10]);
    assert_eq!(net.listed_blocks(0, holder), Vec::<u64>::new());
    assert_eq!(net.pulled_blocks(other, holder), vec![9, 10]);
    assert_eq!(net.pulled_blocks(holder, other), Vec::<u64>::new());
    assert_eq!(net.block(other, 9)[512], 1, "the holder's version");
}

/// Rule P, overlapping seed 34041. Node 1 is being synced; a partial-block write to block
/// 20 lands on it and on node 2, whose link drops before it answers: the write fails, node
/// 2 (up to date, cut off under it) is its reference and node 1 is marked to pull the block
/// back. A whole-block write to block 10, in flight to node 2 at the same drop, succeeds
/// later on node 1 (its sync over by then), so node 2 is marked for block 10. Both blocks
/// are in node 2's unanswered range, and node 1, marked there, is no source for it. At
/// node 2's return its own marks count block by block: it pulls block 10 only, and stays
/// the source of block 20. (Marking it for the whole range because of block 10 left block
/// 20 lacking on both replicas.)
#[test]
fn a_returning_replica_pulls_only_the_blocks_of_its_unanswered_range_it_was_marked_for() {
    let mut net = Net::diskless_primary();
    // Node 1 misses a write to block 30 and is synced from node 2, slowly.
    net.link_down(0, 1);
    net.hold(2, 1);
    net.write(1, 30 * BLOCK, 4096);
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::Inconsistent);
    // Two writes in flight to node 2 when its link drops: block 20's reaches both, block
    // 10's reaches node 1 only after its sync.
    net.hold(2, 0);
    net.write(2, 20 * BLOCK + 512, 1024);
    net.hold(0, 1);
    net.write(3, 10 * BLOCK, 4096);
    net.link_down(0, 2);
    assert_eq!(
        net.answer(2),
        Some(Err(IoError::Os(5))),
        "only node 1 being synced has it"
    );
    net.release_stepwise(2, 1);
    assert_eq!(net.nodes[1].disk(0), DiskState::UpToDate);
    // Node 1's request for block 20 reaches node 2 only after node 2 is back.
    net.hold(1, 2);
    net.release_stepwise(0, 1);
    assert_eq!(net.answer(3), Some(Ok(())), "node 1, up to date, holds it");
    assert_eq!(net.claims(0, 1), 4096, "node 1 pulls block 20 back");
    net.link_up(0, 2);
    assert_eq!(
        net.listed_blocks(0, 2),
        vec![10],
        "node 2 pulls block 10 only"
    );
    assert_eq!(net.claims(0, 2), 4096);
    assert_eq!(net.claims(0, 1), 4096, "node 1 still pulls block 20");
    net.release_stepwise(1, 2);
    net.assert_converges();
    assert_eq!(net.pulled_blocks(2, 1), vec![10]);
    assert!(
        net.pulled_blocks(1, 2).contains(&20),
        "{:?}",
        net.pulled_blocks(1, 2)
    );
    assert_eq!(net.block(2, 10)[0], 3);
    assert_eq!(net.block(1, 20)[512], 2);
}
