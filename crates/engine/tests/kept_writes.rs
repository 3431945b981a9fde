//! A lost Primary's kept writes (`settle.rs`): a Secondary that lost the Primary with
//! writes unsettled asks the other Secondaries how far they got (`PrimaryLost`); one with
//! nothing unsettled answers a zero ("you are the source") unless it is connected to that
//! run of the Primary, which knows what each lacks. Whether it is, it knows only once the
//! Primary's node told its run on that connection: the answer waits for that `Role`.
//!
//! Overlapping soak seeds 204041558 and 204040083: a Secondary back from a crash answered
//! a zero while the Primary's `Role` (the same run) was on its way; the asker claimed its
//! kept write on it just before meeting that run again itself, which released the write
//! but not the claim. The crashed node, the only replica holding what the asker lacked,
//! turned to pull the claimed block from the asker, which lacked it too: stuck for good.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{Msg, NodeId, ReplicaAtStart, Resource};

/// Node `n`'s process dies (kill -9, same boot: its disk keeps every write) and its
/// engine starts again as the daemon starts it: `Crashed`, with its activity log's
/// extents `log`, the Primary's run it took writes from, the bitmaps it kept and its
/// generation ids. Its links stay down.
fn crash(net: &mut Net, n: NodeId, log: &[(u64, u64)]) {
    let old = &net.nodes[n as usize];
    assert!(old.consistent(0), "node {n}");
    let gen = *old.generation(0).expect("a replica");
    let writer = old.writer();
    let peers: Vec<NodeId> = [1, 2].into_iter().filter(|&p| p != n).collect();
    let kept: Vec<(NodeId, Vec<u64>, Option<u64>)> = peers
        .iter()
        .map(|&p| {
            let words = old.out_of_sync_words(0, p).expect("a peer").to_vec();
            (p, words, old.bitmap_gi(0, p))
        })
        .collect();
    for p in (0..3).filter(|&p| p != n) {
        net.cut(n, p);
        net.notice_down(p, n);
    }
    net.run();
    net.start_crashed(n, log, writer, &kept, gen);
}

fn zero_answer(m: &Msg) -> bool {
    matches!(m, Msg::PrimaryLost { seq: 0, .. })
}

/// Seed 204041558, rebuilt: node 1 loses the diskless Primary with write 1 (block 60)
/// unsettled and keeps it; block 60 is written again on node 2 alone, and node 1 catches
/// up from node 2 (the Primary still counts it lacking the block). Node 2 crashes and
/// returns; node 1's question reaches it before the Primary's `Role`, and the Primary's
/// `Role` reaches node 1 after node 2's answer would have.
/// With `primary_restarts`, the Primary's node is down too meanwhile, and comes back as a
/// new run of its engine, Secondary: the run node 1 kept writes of is gone for good.
fn kept_write_then_crash(primary_restarts: bool) -> Net {
    let mut net = Net::diskless_primary();
    let b = 60 * BLOCK;
    net.write(1, b, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    // Write 1 is not settled yet (no peer ack went): node 1 keeps it.
    net.link_down(0, 1);
    net.write(2, b, 4096);
    assert_eq!(net.answer(2), Some(Ok(())));
    net.tick(20);
    assert_eq!(
        net.block(1, 60),
        net.block(2, 60),
        "node 1 caught up from node 2"
    );
    assert_eq!(net.block(2, 60)[0], 2);
    crash(&mut net, 2, &[(b, BLOCK)]);
    if primary_restarts {
        // Its links are down already (to node 1 since the loss, to node 2 at the crash).
        let mut spec = net.spec(0);
        spec.gi_seed ^= 1 << 40;
        net.nodes[0] = Resource::new(spec, vec![ReplicaAtStart::None]);
    }
    // Everything comes back at once; the Primary's packets are slower, and so are node
    // 1's to node 2 after its question (its `Volume`, list and live notices).
    net.hold(0, 1);
    net.hold(0, 2);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.hold_at(1, 2, |m| matches!(m, Msg::Volume { .. }));
    net.link_up(1, 2);
    net
}

/// The held packets land as in the seed: the Primary's at node 1, then at node 2, then
/// node 1's at node 2.
fn release_as_in_the_seed(net: &mut Net) {
    net.release(0, 1);
    net.release(0, 2);
    net.release(1, 2);
}

#[test]
fn no_zero_answer_before_the_primarys_role_names_the_same_run() {
    let mut net = kept_write_then_crash(false);
    // Asked at the loss (node 2, connected to that run, did not answer) and again on the
    // new connection, which the Primary's `Role` has not reached yet.
    let asked = net.delivered(1, 2, |m| matches!(m, Msg::PrimaryLost { seq: 1, .. }));
    assert_eq!(asked.len(), 2);
    release_as_in_the_seed(&mut net);
    // Without the wait: node 2 answered a zero, node 1 claimed block 60 on it, node 2
    // turned to pull it from node 1, which lacks it (the Primary lists it), and node 1
    // waits for an up-to-date source: none is left.
    net.assert_converges();
    assert_eq!(net.block(1, 60)[0], 2);
    // The same run met again settles node 1's kept write and node 2's crash: neither
    // claims anything on the other, and the Primary's lists say what each lacks.
    assert!(net.delivered(2, 1, zero_answer).is_empty());
    assert!(net.listed_blocks(1, 2).is_empty(), "{:?}", net.listed(1, 2));
}

#[test]
fn the_answer_goes_once_the_primarys_connection_ends_without_its_role() {
    let mut net = kept_write_then_crash(false);
    assert!(net.delivered(2, 1, zero_answer).is_empty());
    // The Primary's node is gone before its `Role` reached node 2: node 2 is not connected
    // to that run, and answers; node 1 compares and claims its kept write.
    net.cut(0, 2);
    net.notice_down(2, 0);
    net.notice_down(0, 2);
    net.run();
    assert_eq!(net.delivered(2, 1, zero_answer).len(), 1);
    net.release(1, 2);
    assert_eq!(net.listed_blocks(1, 2), vec![60]);
}

#[test]
fn the_answer_goes_once_the_primarys_node_names_another_run() {
    let mut net = kept_write_then_crash(true);
    assert!(net.delivered(2, 1, zero_answer).is_empty());
    // Its `Role` names a new run: the one node 1 kept writes of is gone, node 2 answers,
    // and node 1 compares as before (a Primary that never returns leaves no comparison
    // open).
    net.release(0, 2);
    assert_eq!(net.delivered(2, 1, zero_answer).len(), 1);
    net.release(1, 2);
    assert_eq!(net.listed_blocks(1, 2), vec![60]);
}
