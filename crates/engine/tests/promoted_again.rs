//! A Primary whose ids are changing steps down only once every connected peer has
//! answered the change: promoted again before the answers came, it would take a peer's
//! ids from before its adoption of ours and rotate apart from them.

mod common;

use common::*;
use tandem_engine::replica::{AutoPromote, DemoteError, Msg, OnNoQuorum, Role};

/// Node 0, a diskless Secondary, node 2 away; node 1's answers to node 0 are slow.
/// A client attaches to node 0 (auto-promote): its ids change at once, node 2 being
/// away, and node 1 adopts the new ones.
fn promoted_for_a_client_while_node_1s_answer_is_on_its_way() -> Net {
    let mut net = Net::with_quorum(true, majority(OnNoQuorum::IoError));
    net.demote_on(0);
    net.link_down(0, 2);
    net.hold_at(1, 0, |m| {
        matches!(m, Msg::GenAck { .. } | Msg::Volume { .. })
    });
    assert_eq!(net.attach_on(0), AutoPromote::Promoted);
    net
}

/// Real-daemon test `cut_link_and_heal`, once in seven runs: fio's first connection (a
/// probe) promoted node 0 and left 0.3 ms later, and node 0 stepped down; fio's next
/// connection, 100 ms later, promoted it again before node 1's answer had come. Node 0
/// took node 1's ids as it knew them, those from before the rotation, and rotated from
/// them; node 1's report of the ids it had adopted then looked like another Primary's
/// that went on without node 0, which stepped down and failed fio's writes with EIO.
/// Now node 0 stays Primary until node 1 has answered.
#[test]
fn a_primary_whose_ids_are_changing_steps_down_once_they_are_answered() {
    let mut net = promoted_for_a_client_while_node_1s_answer_is_on_its_way();
    // Node 0 is diskless: its ids show on node 1, which adopted them.
    let first = *net.nodes[1].generation(0).unwrap();
    assert_ne!(first.current, 0, "node 0's ids changed at its promotion");
    net.detach_on(0);
    assert_eq!(
        net.nodes[0].role(),
        Role::Primary,
        "stepped down unanswered"
    );
    assert_eq!(net.attach_on(0), AutoPromote::Unchanged);
    net.release(1, 0);
    assert_eq!(net.nodes[0].role(), Role::Primary, "node 0 stepped down");
    net.write_block_on(0, 1, 3);
    assert_eq!(net.answer(1), Some(Ok(())));
    assert_eq!(net.block(1, 3)[0], 1);
    let now = *net.nodes[1].generation(0).unwrap();
    assert!(
        now == first || now.history.contains(&first.current),
        "{now:?} descends from {first:?}"
    );
    // The client leaves for good: node 0 steps down at once, nothing unanswered.
    net.detach_on(0);
    assert_eq!(net.nodes[0].role(), Role::Secondary);
}

/// The client leaves and none follows: node 0 steps down as node 1's answer comes.
/// The administrator is told to try again meanwhile (the CLI does, for a while).
#[test]
fn a_demotion_waits_for_the_answers_to_the_ids_changing() {
    let mut net = promoted_for_a_client_while_node_1s_answer_is_on_its_way();
    let mut out = Vec::new();
    assert_eq!(
        net.nodes[0].demote(&mut out),
        Err(DemoteError::IdsChanging { volume: 0, peer: 1 })
    );
    assert!(net.nodes[0].demote(&mut out).unwrap_err().is_momentary());
    net.push(0, out);
    net.run();
    net.release(1, 0);
    net.demote_on(0);
    assert_eq!(net.nodes[0].role(), Role::Secondary);

    let mut net = promoted_for_a_client_while_node_1s_answer_is_on_its_way();
    net.detach_on(0);
    assert_eq!(net.nodes[0].role(), Role::Primary);
    net.release(1, 0);
    assert_eq!(
        net.nodes[0].role(),
        Role::Secondary,
        "auto-demoted once answered"
    );
}
