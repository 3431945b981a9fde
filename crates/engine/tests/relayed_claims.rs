//! Claims a Secondary relays from the connected Primary's own writes, met by a peer whose
//! generation ids are newer than ours (`PeerVol::relayed`, a capped list of ranges). A
//! diskless Primary (node 0) and two Secondaries over the shared in-memory network
//! (`common`), rebuilding the simulator's seed by holding links.

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{DiskState, Msg};

/// Overlapping soak seed 204004523. Node 1 misses a write (block 3) away from both others,
/// so the Primary rotates the ids node 2 takes. Back, node 1 says UpToDate and hears the
/// Primary's list (block 3); its Inconsistent report is still on the wire when node 2 is
/// cut off and the next write (block 8) goes to node 1 alone: vouched for (node 1 was up
/// to date for it when it went out) and acknowledged. Node 1, whose ids are older than
/// node 2's (being synced, it could adopt none), marks node 2 lacking block 8 and records
/// the range as relayed. Node 2 returns to both and tells node 1 UpToDate, with newer ids,
/// before the Primary's list (block 8) reaches it. Node 1 keeps its claim: it relays the
/// connected Primary's own write, which that Primary marked node 2 for too. (Yielded, node
/// 1 pulled block 8 from node 2, which lacked it, while node 2 pulled it from node 1, which
/// now said it lacked it: each refused the other for ever.)
#[test]
fn a_relay_of_the_connected_primarys_write_is_kept_against_a_peer_with_newer_ids() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    let older = *net.nodes[1].generation(0).unwrap();
    assert_ne!(
        net.nodes[2].generation(0).unwrap(),
        &older,
        "node 2 took new ids"
    );
    // Node 1's packets to the Primary wait from its Inconsistent report on.
    net.hold_at(1, 0, |m| {
        matches!(
            m,
            Msg::Volume {
                disk: DiskState::Inconsistent,
                ..
            }
        )
    });
    net.link_up(0, 1);
    assert_eq!(
        net.nodes[1].disk(0),
        DiskState::Inconsistent,
        "listed block 3"
    );
    assert_eq!(
        net.seen(0, 1),
        Some(DiskState::UpToDate),
        "its report waits"
    );
    net.link_down(0, 2);
    net.write(2, 8 * BLOCK, 4096);
    assert_eq!(net.block(1, 8)[0], 2, "node 1 wrote it");
    assert_eq!(net.claims(1, 2), BLOCK, "and marks node 2");
    net.release(1, 0);
    assert_eq!(net.answer(2), Some(Ok(())), "acknowledged");
    assert_eq!(
        net.nodes[1].generation(0),
        Some(&older),
        "node 1 adopted no ids"
    );
    // Node 2 returns; the Primary's list to it waits, so node 2 says UpToDate to node 1.
    net.hold(0, 2);
    net.link_up(0, 2);
    net.link_up(1, 2);
    assert_eq!(net.seen(1, 2), Some(DiskState::UpToDate));
    assert_eq!(net.claims(1, 2), BLOCK, "node 1 keeps its claim");
    assert_eq!(net.listed_blocks(1, 2), vec![8], "and lists it");
    assert!(
        !net.pulled_blocks(1, 2).contains(&8),
        "node 1 does not pull the write it holds"
    );
    // Node 2, UpToDate when node 1's list came, claimed block 3 on node 1: each lacked
    // what the other held, which only the Primary settles, and node 2 dropped the link
    // to redial (as it does while apart from the Primary). The Primary's list reaches it.
    assert_eq!(net.dropped, vec![(2, 1)]);
    net.dropped.clear();
    net.link_down(1, 2);
    net.release(0, 2);
    assert_eq!(
        net.nodes[2].disk(0),
        DiskState::Inconsistent,
        "listed block 8"
    );
    net.link_up(1, 2);
    assert_eq!(
        net.pulled_blocks(2, 1),
        vec![8],
        "from node 1, which holds it"
    );
    net.assert_converges();
    assert_eq!(net.block(2, 8)[0], 2, "the acknowledged write is on both");
    assert_eq!(net.block(1, 3)[0], 1);
}

/// Failover soak seed 430004651, with a diskless Primary. As above up to the write of
/// block 8, which reached node 1 alone (being synced, its ids older than node 2's) and was
/// acknowledged. Then the Primary goes, and node 1 stops cleanly while still Inconsistent:
/// it starts again `Inconsistent`, with its claim that node 2 lacks block 8 restored from
/// its metadata but without the record that the claim relays a Primary's write (memory
/// only).
/// It meets node 2, UpToDate with newer ids. Node 1 keeps the claim: a sync target's older
/// ids say nothing of the Primary's writes it took. (Yielded, as the claims of a replica
/// with older ids are to an up-to-date one, node 1 pulled block 8 from node 2, which
/// lacked it, and the acknowledged write was gone.) Node 2's list names block 8 too: only
/// a Primary settles which of them is newer, so node 1 redials rather than pull it.
#[test]
fn claims_restored_after_a_stop_while_inconsistent_are_not_yielded_to_newer_ids() {
    let mut net = Net::diskless_primary();
    net.link_down(0, 1);
    net.link_down(1, 2);
    net.write(1, 3 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.hold_at(1, 0, |m| {
        matches!(
            m,
            Msg::Volume {
                disk: DiskState::Inconsistent,
                ..
            }
        )
    });
    net.link_up(0, 1);
    net.link_down(0, 2);
    net.write(2, 8 * BLOCK, 4096);
    net.release(1, 0);
    assert_eq!(net.answer(2), Some(Ok(())), "acknowledged");
    assert_eq!(net.claims(1, 2), BLOCK, "node 1 marks node 2");
    assert_eq!(net.nodes[1].disk(0), DiskState::Inconsistent);
    // The Primary tells node 1 which replicas have the write (a clean stop waits for
    // that), then goes; node 1 stops cleanly while being synced.
    net.tick(1000);
    net.link_down(0, 1);
    net.restart_cleanly_inconsistent(1);
    assert_eq!(net.claims(1, 2), BLOCK, "restored");
    assert_ne!(
        net.nodes[1].generation(0),
        net.nodes[2].generation(0),
        "node 2's ids are newer"
    );
    net.link_up(1, 2);
    assert_eq!(net.claims(1, 2), BLOCK, "node 1 keeps its claim");
    assert_eq!(net.listed_blocks(1, 2), vec![8], "and lists it");
    assert!(
        !net.pulled_blocks(1, 2).contains(&8),
        "node 1 does not pull the write it alone holds"
    );
    assert_eq!(
        net.block(1, 8)[0],
        2,
        "the acknowledged write is still on node 1"
    );
    // Node 2 lists everything to a replica of unknown currency, block 8 among them: each
    // claims the other lacks it, which only a Primary settles, and each drops the link to
    // redial, as replicas apart from the Primary do.
    assert_eq!(net.dropped, vec![(1, 2), (2, 1)]);
}

/// Failover soak seed 467009619. Node 2 lost power (its log naming block 5) and, back,
/// meets the Primary only: it pulls block 5 from it, and its packets to the Primary wait
/// from that request on, so it stays `Inconsistent` and unproven. Node 1 is cut off from
/// the Primary, and the next write (block 8) reaches node 2 alone of the Secondaries;
/// node 2 marks node 1 lacking it and records the range as relayed. The Primary goes
/// (cut off from node 2 too, it completes the write alone), and node 2 meets node 1, up
/// to date with ids no newer than node 2's. Node 2's claims from its crash (block 5)
/// become ranges to pull, but not the relay: the gone Primary's ids moved past node 1's,
/// so node 1 missed writes of that run, and node 2's copy may be the only one. (Turned
/// into a pull, node 2 took node 1's older block 8: in the seed, node 2 was the
/// Primary's only peer with the write, and the acknowledged write was gone from every
/// replica.)
#[test]
fn a_relay_of_a_gone_primarys_write_stays_a_claim_when_unproven_meets_equal_ids() {
    let mut net = Net::new();
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.lose_power(2, &[(5 * BLOCK, BLOCK)]);
    net.link_down(0, 1);
    net.hold_at(2, 0, |m| matches!(m, Msg::ResyncReq { .. }));
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent, "pulling block 5");
    net.write(2, 8 * BLOCK, 4096);
    assert_eq!(net.block(2, 8)[0], 2, "node 2 wrote it");
    assert_eq!(net.block(1, 8)[0], 0, "node 1 did not");
    assert_eq!(
        net.claims(2, 1),
        2 * BLOCK,
        "node 2 marks node 1 (and block 5)"
    );
    net.link_down(0, 2);
    assert_eq!(net.answer(2), Some(Ok(())), "acknowledged");
    assert_eq!(net.disk(2), DiskState::Inconsistent, "still unproven");
    let (g1, g2) = (
        *net.nodes[1].generation(0).unwrap(),
        *net.nodes[2].generation(0).unwrap(),
    );
    assert!(
        g1 == g2 || g1.history.contains(&g2.current),
        "node 1's ids {g1:?} are no older than node 2's {g2:?}"
    );
    net.link_up(1, 2);
    assert!(
        !net.pulled_blocks(2, 1).contains(&8),
        "node 2 does not pull the write it holds"
    );
    assert_eq!(net.listed_blocks(2, 1), vec![8], "it lists it");
    assert_eq!(net.block(2, 8)[0], 2, "the write is still on node 2");
}
