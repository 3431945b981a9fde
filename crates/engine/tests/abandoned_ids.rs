//! Ids a Primary rotated to and crashed under before it acknowledged anything: the
//! metadata keeps the ids it last acknowledged under (`Resource::ids_at_crash`), so the
//! restarted node is older than the next Primary's rotation from the same ancestor rather
//! than apart from it, and it tells its peers the id it abandoned (`Msg::Abandoned`).

mod common;

use common::*;
use tandem_engine::replica::{Event, Msg, Role};
use tandem_engine::ReqId;

/// Node 0 rotates its ids for a write that misses both peers (its links to them are
/// down) and is killed before its own disk completes it: nothing was acknowledged under
/// the new ids. Cut off too (quorum off here), node 1 is promoted and writes on under a
/// rotation of its own from the same ancestor. Back, node 0 is older, not apart: no split
/// brain, and it converges from node 1. With the rotated ids kept, both sides changed
/// since their common ancestor (failover seed 1077).
#[test]
fn a_primary_killed_before_acknowledging_under_rotated_ids_restarts_older() {
    let mut net = Net::new();
    let before = *net.nodes[0].generation(0).unwrap();
    net.link_down(0, 1);
    net.link_down(0, 2);
    net.hold_disk(0);
    net.write(1, BLOCK, BLOCK as u32);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_ne!(
        rotated, before,
        "the write missed both peers: the ids rotate"
    );
    assert_eq!(net.answer(1), None, "its own disk holds it back");
    let ids = net.nodes[0].ids_at_crash(0).unwrap();
    assert_eq!(
        ids.gen, before,
        "nothing acknowledged under the rotated ids"
    );
    assert_eq!(
        ids.abandoned.map(|a| (a.gi, a.without_quorum)),
        Some((rotated.current, false))
    );
    net.crash(0, &[(BLOCK, BLOCK)]);
    assert_eq!(*net.nodes[0].generation(0).unwrap(), before);

    let mut out = Vec::new();
    net.nodes[1].promote(false, &mut out).unwrap();
    net.push(1, out);
    net.run();
    net.link_down(1, 2);
    net.submit_on(
        1,
        2,
        tandem_engine::Io::Write {
            offset: 3 * BLOCK,
            len: BLOCK as u32,
            fua: false,
        },
    );
    assert_eq!(net.answer_on(1, 2), Some(Ok(())));
    net.link_up(1, 2);

    net.link_up(0, 1);
    net.link_up(0, 2);
    assert!(net.split_brains.is_empty(), "{:?}", net.split_brains);
    assert!(
        !net.events
            .iter()
            .any(|(_, e)| matches!(e, Event::SplitBrainResolved { .. })),
        "a split brain was seen"
    );
    let abandoned: Vec<Msg> = net.delivered(0, 1, |m| matches!(m, Msg::Abandoned { .. }));
    assert_eq!(
        abandoned,
        vec![Msg::Abandoned {
            volume: 0,
            gi: rotated.current,
            without_quorum: false,
        }]
    );
    net.assert_converges();
    assert_eq!(net.block(0, 3), net.block(1, 3));
    assert_eq!(net.nodes[1].role(), Role::Primary);
}

/// The first write acknowledged under rotated ids moves the metadata's ids to them, and
/// the driver hears so before the completion (it makes them durable first).
#[test]
fn the_first_acknowledgement_under_rotated_ids_is_announced_before_the_completion() {
    let mut net = Net::new();
    net.link_down(0, 2);
    net.hold_disk(0);
    net.write(1, BLOCK, BLOCK as u32);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_ne!(net.nodes[0].ids_at_crash(0).unwrap().gen, rotated);
    net.release_disk(0);
    assert_eq!(net.answer(1), Some(Ok(())));
    let acked = net.events.iter().position(|(n, e)| {
        *n == 0
            && matches!(e, Event::GenerationAcked { volume: 0, current }
                if *current == rotated.current)
    });
    let completed = net.done.iter().position(|d| d.0 == 0 && d.1 == ReqId(1));
    let before_completion = completed.map(|c| net.done_after[c]);
    assert!(
        matches!((acked, before_completion), (Some(a), Some(c)) if a < c),
        "GenerationAcked at event {acked:?}, the completion after {before_completion:?} events"
    );
    let ids = net.nodes[0].ids_at_crash(0).unwrap();
    assert_eq!(ids.gen, rotated);
    assert_eq!(ids.abandoned, None);
}

/// Node 1 adopted the ids node 0 rotated to (it was connected) and node 0 was killed
/// before acknowledging anything under them. Back, node 0 tells node 1 it abandoned them:
/// node 1 sets its ids back to the ones before, as node 0 did, rather than rank newer
/// than every replica with nothing newer to give (failover seed 1071: the only holder was
/// Inconsistent, listed everything to the others, and none was up to date again).
#[test]
fn a_secondary_holding_abandoned_ids_sets_them_back() {
    let mut net = Net::new();
    let before = *net.nodes[0].generation(0).unwrap();
    net.link_down(0, 2);
    net.hold_disk(0);
    net.write(1, BLOCK, BLOCK as u32);
    let rotated = *net.nodes[0].generation(0).unwrap();
    assert_eq!(*net.nodes[1].generation(0).unwrap(), rotated, "adopted");
    net.crash(0, &[(BLOCK, BLOCK)]);
    net.link_up(0, 1);
    assert_eq!(*net.nodes[1].generation(0).unwrap(), before);
    assert!(net.events.iter().any(|(n, e)| *n == 1
        && matches!(e, Event::GenerationAbandoned { peer: 0, from, to, .. }
            if *from == rotated.current && *to == before.current)));
    net.link_up(0, 2);
    net.assert_converges();
}

/// Node 2, Primary, rotates its ids for write 2 (node 0 away), loses quorum before
/// acknowledging it, sets them back and is killed: it abandoned the id set aside
/// *without quorum*. Back with every node crashed and the same ids, it does not rank
/// first: a majority may have gone on without it, and a Primary it had outrun may have
/// acknowledged more under those ids (failover soak seed 414006758: ranked first, it was
/// the source of the replica missing an acknowledged write). Node 0 is the source by node
/// id, as with nothing abandoned.
#[test]
fn ids_set_aside_without_quorum_rank_their_replica_no_higher() {
    use tandem_engine::replica::{DiskChange, DiskState, OnNoQuorum};
    let mut net = Net::with_quorum(false, majority(OnNoQuorum::IoError));
    net.demote_on(0);
    net.promote_on(2).unwrap();
    net.submit_on(
        2,
        1,
        tandem_engine::Io::Write {
            offset: BLOCK,
            len: BLOCK as u32,
            fua: false,
        },
    );
    assert_eq!(net.answer_on(2, 1), Some(Ok(())));
    let before = *net.nodes[2].generation(0).unwrap();
    net.link_down(0, 2);
    net.hold_disk(2);
    net.submit_on(
        2,
        2,
        tandem_engine::Io::Write {
            offset: 2 * BLOCK,
            len: BLOCK as u32,
            fua: false,
        },
    );
    let rotated = *net.nodes[2].generation(0).unwrap();
    assert_ne!(rotated, before, "write 2 missed node 0");
    net.link_down(1, 2);
    assert_eq!(*net.nodes[2].generation(0).unwrap(), before, "set back");
    let kept = net.nodes[2].ids_at_crash(0).unwrap();
    assert_eq!(
        kept.abandoned.map(|a| (a.gi, a.without_quorum)),
        Some((rotated.current, true))
    );
    net.crash(2, &[(2 * BLOCK, BLOCK)]);
    net.crash(0, &[]);
    net.crash(1, &[]);

    net.link_up(1, 2);
    net.link_up(0, 2);
    net.link_up(0, 1);
    let told = net.delivered(2, 0, |m| matches!(m, Msg::Abandoned { .. }));
    assert_eq!(
        told,
        vec![Msg::Abandoned {
            volume: 0,
            gi: rotated.current,
            without_quorum: true,
        }]
    );
    let source = |n: u8| {
        net.disk_changes(n).iter().any(|(d, why)| {
            *d == DiskState::UpToDate && matches!(why, DiskChange::ProvenByGeneration { .. })
        })
    };
    assert!(source(0), "node 0: {:?}", net.disk_changes(0));
    assert!(!source(2), "node 2 ranked first: {:?}", net.disk_changes(2));
    net.assert_converges();
}
