//! Split brain and the after-split-brain policies (`split_brain.rs`): node 2 is away;
//! nodes 0 and 1 lose each other while node 0 is Primary, each then writes as Primary,
//! and they meet again. The policy (or `--discard-my-data`) names a victim, which pulls
//! back from the survivor every block either changed: both replicas end byte-identical
//! with the survivor's data, the connection stays, and node 2, back, converges too. A
//! split brain no policy resolves stops the connection with both sides' data untouched.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{
    AfterSb0Pri, AfterSb1Pri, AfterSplitBrain, DiskState, Event, Msg, NodeId, SbPolicy, Unresolved,
};
use tandem_engine::Io;

/// How the two sides meet.
struct Apart {
    /// Blocks node 0 writes as Primary apart (request ids 10.., so its bytes are 10..).
    zero: &'static [u64],
    /// Blocks node 1 writes as Primary apart (request ids 20..).
    one: &'static [u64],
    /// Node 0 / node 1 still Primary when they meet.
    zero_primary: bool,
    one_primary: bool,
}

const LEAST: AfterSplitBrain = AfterSplitBrain {
    zero: AfterSb0Pri::DiscardLeastChanges,
    one: AfterSb1Pri::Disconnect,
    two: tandem_engine::replica::AfterSb2Pri::Disconnect,
};

fn policies(zero: AfterSb0Pri, one: AfterSb1Pri) -> AfterSplitBrain {
    AfterSplitBrain {
        zero,
        one,
        ..Default::default()
    }
}

fn write(net: &mut Net, n: NodeId, req: u64, block: u64) {
    let io = Io::Write {
        offset: block * BLOCK,
        len: BLOCK as u32,
        fua: false,
    };
    net.submit_on(n, req, io);
    assert_eq!(net.answer_on(n, req), Some(Ok(())), "node {n} write {req}");
}

fn demote(net: &mut Net, n: NodeId) {
    net.demote_on(n);
}

fn promote(net: &mut Net, n: NodeId) {
    net.promote_on(n).unwrap();
}

/// Everything up to the moment they meet (not yet linked): node 2 away, the two apart.
fn before_meeting(p: AfterSplitBrain, a: &Apart) -> Net {
    let mut net = Net::new();
    net.set_after_sb(p);
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.link_down(0, 1);
    for (k, &b) in a.zero.iter().enumerate() {
        write(&mut net, 0, 10 + k as u64, b);
    }
    if !a.zero_primary {
        demote(&mut net, 0);
    }
    promote(&mut net, 1);
    for (k, &b) in a.one.iter().enumerate() {
        write(&mut net, 1, 20 + k as u64, b);
    }
    if !a.one_primary {
        demote(&mut net, 1);
    }
    net
}

fn settle(net: &mut Net) {
    for _ in 0..100 {
        net.tick(50);
    }
}

fn resolved(net: &Net, n: NodeId) -> Vec<(NodeId, SbPolicy, NodeId, u64, u64)> {
    (net.events.iter())
        .filter_map(|(at, e)| match *e {
            Event::SplitBrainResolved {
                peer,
                policy,
                victim,
                discarded_blocks,
                pulled_blocks,
                ..
            } if *at == n => Some((peer, policy, victim, discarded_blocks, pulled_blocks)),
            _ => None,
        })
        .collect()
}

/// Meets, expects `victim` named by `policy` on both sides, and checks that both replicas
/// hold the survivor's data for the whole volume, the connection kept.
fn meet_and_resolve(mut net: Net, a: &Apart, victim: NodeId, policy: SbPolicy) -> Net {
    let survivor = 1 - victim;
    let before: Vec<Vec<u8>> = (0..common::SIZE / BLOCK)
        .map(|b| net.block(survivor, b).to_vec())
        .collect();
    net.link_up(0, 1);
    settle(&mut net);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    let discarded = if victim == 0 { a.zero } else { a.one }.len() as u64;
    let mut union: Vec<u64> = a.zero.iter().chain(a.one).copied().collect();
    union.sort();
    union.dedup();
    let pulled = union.len() as u64;
    assert_eq!(
        resolved(&net, victim),
        vec![(survivor, policy, victim, discarded, pulled)],
        "victim"
    );
    assert_eq!(
        resolved(&net, survivor),
        vec![(victim, policy, victim, discarded, pulled)],
        "survivor"
    );
    // The victim pulled exactly those blocks, from the survivor; the survivor nothing.
    assert_eq!(net.pulled_blocks(victim, survivor), union);
    assert!(net.pulled(survivor, victim).is_empty());
    // The survivor marked the victim as lacking both sides' changes (its list named its
    // own; the victim's were told after the verdict).
    assert_eq!(net.listed_blocks(survivor, victim), union);
    for n in [0, 1] {
        assert_eq!(net.disk(n), DiskState::UpToDate, "node {n}");
    }
    for (b, want) in before.iter().enumerate() {
        assert_eq!(net.block(victim, b as u64), &want[..], "block {b}");
        assert_eq!(net.block(survivor, b as u64), &want[..], "block {b}");
    }
    assert_eq!(net.claims(0, 1), 0);
    assert_eq!(net.claims(1, 0), 0);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    // Its data is the survivor's: so are its ids (a later restart of both is no split
    // brain by generation ids).
    assert_eq!(
        net.nodes[victim as usize].generation(0),
        net.nodes[survivor as usize].generation(0)
    );
    // Node 2 back: every replica the same.
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.assert_converges();
    net
}

/// Meets and expects the split brain left to the administrator on both sides: the
/// connection stopped, nothing pulled, each replica as it was.
fn meet_and_stop(mut net: Net, why: Unresolved) {
    let disks: Vec<Vec<u8>> = (0..2)
        .map(|n| {
            (0..common::SIZE / BLOCK)
                .flat_map(|b| net.block(n, b).to_vec())
                .collect()
        })
        .collect();
    net.link_up(0, 1);
    settle(&mut net);
    assert!(resolved(&net, 0).is_empty() && resolved(&net, 1).is_empty());
    let whys: Vec<Unresolved> = net.split_brains.iter().map(|s| s.2).collect();
    assert!(
        whys.contains(&why),
        "{:?} {:?}",
        net.split_brains,
        net.events
    );
    let stopped: Vec<NodeId> = net.split_brains.iter().map(|s| s.0).collect();
    assert!(stopped.contains(&0) && stopped.contains(&1), "{stopped:?}");
    assert!(net.pulled(0, 1).is_empty() && net.pulled(1, 0).is_empty());
    for n in 0..2u8 {
        let now: Vec<u8> = (0..common::SIZE / BLOCK)
            .flat_map(|b| net.block(n, b).to_vec())
            .collect();
        assert!(now == disks[n as usize], "node {n}'s data changed");
        assert_eq!(net.disk(n), DiskState::UpToDate);
    }
}

const THREE_ONE: Apart = Apart {
    zero: &[1, 2, 3],
    one: &[3, 7],
    zero_primary: false,
    one_primary: false,
};

#[test]
fn least_changes_discards_the_side_with_fewer_changed_blocks() {
    let net = before_meeting(LEAST, &THREE_ONE);
    meet_and_resolve(net, &THREE_ONE, 1, SbPolicy::ZeroPri(LEAST.zero));
    let more = Apart {
        zero: &[1],
        one: &[3, 7, 9],
        ..THREE_ONE
    };
    let net = before_meeting(LEAST, &more);
    meet_and_resolve(net, &more, 0, SbPolicy::ZeroPri(LEAST.zero));
}

/// Documented tie: the lower node id keeps its data.
#[test]
fn least_changes_tie_keeps_the_lower_node_ids_data() {
    let tie = Apart {
        zero: &[1, 2],
        one: &[2, 9],
        ..THREE_ONE
    };
    let net = before_meeting(LEAST, &tie);
    meet_and_resolve(net, &tie, 1, SbPolicy::ZeroPri(LEAST.zero));
}

/// Node 0 was Primary when the two lost each other (the older Primary); node 1 was
/// promoted apart (the younger), whatever the number of changes.
#[test]
fn younger_and_older_primary() {
    let p = policies(AfterSb0Pri::DiscardYoungerPrimary, AfterSb1Pri::Disconnect);
    let many = Apart {
        zero: &[1],
        one: &[3, 7, 9],
        ..THREE_ONE
    };
    let net = before_meeting(p, &many);
    meet_and_resolve(net, &many, 1, SbPolicy::ZeroPri(p.zero));
    let p = policies(AfterSb0Pri::DiscardOlderPrimary, AfterSb1Pri::Disconnect);
    let net = before_meeting(p, &THREE_ONE);
    meet_and_resolve(net, &THREE_ONE, 0, SbPolicy::ZeroPri(p.zero));
}

/// Both changed blocks: discard-zero-changes cannot choose.
#[test]
fn zero_changes_with_both_changed_disconnects() {
    let p = policies(
        AfterSb0Pri::DiscardZeroChanges,
        AfterSb1Pri::DiscardSecondary,
    );
    meet_and_stop(before_meeting(p, &THREE_ONE), Unresolved::BothChanged);
}

#[test]
fn disconnect_is_the_default_and_stops_both_sides() {
    let net = before_meeting(AfterSplitBrain::default(), &THREE_ONE);
    meet_and_stop(net, Unresolved::Policy { primaries: 0 });
}

/// Node 0 still Primary when they meet: after-sb-1pri.
#[test]
fn discard_secondary_keeps_the_primarys_data_and_its_later_writes() {
    let a = Apart {
        zero: &[1],
        one: &[3, 7, 9],
        zero_primary: true,
        one_primary: false,
    };
    let p = policies(AfterSb0Pri::Disconnect, AfterSb1Pri::DiscardSecondary);
    let mut net = before_meeting(p, &a);
    net = meet_and_resolve(net, &a, 1, SbPolicy::OnePri(p.one));
    // Replication goes on: a new write lands on every replica.
    write(&mut net, 0, 40, 7);
    net.assert_converges();
    assert!(net.block(1, 7).iter().all(|&x| x == 40));
}

#[test]
fn one_primary_disconnects_by_default() {
    let a = Apart {
        zero_primary: true,
        ..THREE_ONE
    };
    meet_and_stop(
        before_meeting(AfterSplitBrain::default(), &a),
        Unresolved::Policy { primaries: 1 },
    );
}

/// Consensus: the 0pri verdict stands only if it discards the Secondary.
#[test]
fn consensus_follows_the_zero_primary_verdict_only_against_the_secondary() {
    let p = policies(AfterSb0Pri::DiscardLeastChanges, AfterSb1Pri::Consensus);
    let a = Apart {
        zero_primary: true,
        ..THREE_ONE
    };
    let net = before_meeting(p, &a);
    meet_and_resolve(net, &a, 1, SbPolicy::OnePri(p.one));
    let a = Apart {
        zero: &[1],
        one: &[3, 7, 9],
        zero_primary: true,
        one_primary: false,
    };
    meet_and_stop(before_meeting(p, &a), Unresolved::NoConsensus);
}

/// Two Primaries never get as far as their lists: the connection is refused (as before
/// policies), so after-sb-2pri (disconnect only) never discards anything; data untouched.
#[test]
fn two_primaries_are_refused_and_keep_their_data() {
    let p = policies(
        AfterSb0Pri::DiscardLeastChanges,
        AfterSb1Pri::DiscardSecondary,
    );
    let a = Apart {
        zero_primary: true,
        one_primary: true,
        ..THREE_ONE
    };
    let mut net = before_meeting(p, &a);
    let before: Vec<Vec<u8>> = (0..2u8).map(|n| net.block(n, 3).to_vec()).collect();
    net.link_up(0, 1);
    settle(&mut net);
    assert!(resolved(&net, 0).is_empty() && resolved(&net, 1).is_empty());
    assert!(net.pulled(0, 1).is_empty() && net.pulled(1, 0).is_empty());
    let refused = (net.events.iter()).any(|(_, e)| {
        matches!(e, Event::PeerLost { reason, .. } if format!("{reason:?}").contains("BothPrimary"))
    });
    assert!(refused, "{:?}", net.events);
    for n in 0..2u8 {
        assert_eq!(net.block(n, 3), &before[n as usize][..]);
    }
}

/// `tandem connect --discard-my-data` on node 0: it discards its changes though it has
/// more and the policy is disconnect.
#[test]
fn discard_my_data_makes_this_node_the_victim_whatever_the_policy() {
    let mut net = before_meeting(AfterSplitBrain::default(), &THREE_ONE);
    net.nodes[0].discard_my_data(1).unwrap();
    meet_and_resolve(net, &THREE_ONE, 0, SbPolicy::DiscardMyData);
}

/// Asked on the survivor-to-be under discard-least-changes, it overrides the policy.
#[test]
fn discard_my_data_overrides_the_policy() {
    let mut net = before_meeting(LEAST, &THREE_ONE);
    net.nodes[0].discard_my_data(1).unwrap();
    meet_and_resolve(net, &THREE_ONE, 0, SbPolicy::DiscardMyData);
}

/// A Primary never discards its data: refused when asked, and a node that asked, then was
/// promoted, is no victim either (the connection stops, saying why).
#[test]
fn a_primary_is_never_the_victim() {
    let a = Apart {
        one_primary: true,
        ..THREE_ONE
    };
    let mut net = before_meeting(AfterSplitBrain::default(), &a);
    assert!(
        net.nodes[1].discard_my_data(0).is_err(),
        "refused on a Primary"
    );
    demote(&mut net, 1);
    net.nodes[1].discard_my_data(0).unwrap();
    promote(&mut net, 1);
    meet_and_stop(
        net,
        Unresolved::VictimPrimary {
            victim: 1,
            policy: SbPolicy::DiscardMyData,
        },
    );
    // discard-secondary with the Secondary the one that asked: still resolved.
    let p = policies(AfterSb0Pri::Disconnect, AfterSb1Pri::DiscardSecondary);
    let a = Apart {
        zero_primary: true,
        ..THREE_ONE
    };
    let mut net = before_meeting(p, &a);
    net.nodes[0].discard_my_data(1).unwrap_err();
    meet_and_resolve(net, &a, 1, SbPolicy::OnePri(p.one));
}

/// The flag is spent by the connection it was meant for: a later split brain with the
/// same peer follows the policy again.
#[test]
fn discard_my_data_is_spent_by_the_next_connection() {
    let mut net = before_meeting(AfterSplitBrain::default(), &THREE_ONE);
    net.nodes[0].discard_my_data(1).unwrap();
    net.link_up(0, 1);
    settle(&mut net);
    assert_eq!(resolved(&net, 0).len(), 1);
    // Apart again, both write as Primary again.
    net.link_down(0, 1);
    promote(&mut net, 1);
    write(&mut net, 1, 30, 11);
    demote(&mut net, 1);
    promote(&mut net, 0);
    write(&mut net, 0, 31, 12);
    demote(&mut net, 0);
    net.link_up(0, 1);
    settle(&mut net);
    assert_eq!(resolved(&net, 0).len(), 1, "no second resolution");
    let whys: Vec<Unresolved> = net.split_brains.iter().map(|s| s.2).collect();
    assert!(
        whys.contains(&Unresolved::Policy { primaries: 0 }),
        "{whys:?}"
    );
}

/// The victim's link drops while its pull is under way (the survivor's replies held): at
/// the next connection neither finds a split brain again, and the victim finishes its pull
/// from the survivor.
#[test]
fn a_victim_cut_off_during_its_pull_finishes_it_at_the_next_connection() {
    let mut net = before_meeting(LEAST, &THREE_ONE);
    let survivor_data: Vec<Vec<u8>> = (0..16).map(|b| net.block(0, b).to_vec()).collect();
    net.hold_at(0, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.link_up(0, 1);
    assert_eq!(resolved(&net, 1).len(), 1, "{:?}", net.events);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    net.link_down(0, 1);
    net.link_up(0, 1);
    settle(&mut net);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    assert_eq!(resolved(&net, 1).len(), 1, "no second split brain");
    assert_eq!(net.disk(1), DiskState::UpToDate);
    for (b, want) in survivor_data.iter().enumerate() {
        assert_eq!(net.block(1, b as u64), &want[..], "block {b}");
    }
    net.link_up(0, 2);
    net.link_up(1, 2);
    net.assert_converges();
}

/// A connection that ends before the peer's lists did (both nodes dialed at once and one
/// connection replaced the other: the fresh-clone run of the cli test) does not spend
/// `--discard-my-data`: the next connection's split brain still makes this node the victim.
#[test]
fn discard_my_data_survives_a_connection_that_ended_before_its_lists() {
    let mut net = before_meeting(AfterSplitBrain::default(), &THREE_ONE);
    net.nodes[0].discard_my_data(1).unwrap();
    net.hold(1, 0);
    net.link_up(0, 1);
    net.link_down(0, 1);
    assert!(resolved(&net, 0).is_empty());
    net.link_up(0, 1);
    settle(&mut net);
    let r = resolved(&net, 0);
    assert_eq!(r.len(), 1, "{:?}", net.split_brains);
}
