//! A busy peer is not a dead one (`peer::Judge`): a peer that owes us answers (here a
//! replicated write, a barrier) is judged by the request timeout, not by the ping
//! timeout, and so is a link between two Secondaries; an idle peer of the Primary that
//! stops answering is still dropped within `ping_interval + ping_timeout`. A diskless
//! Primary (node 0) and two Secondaries over the shared in-memory network (`common`);
//! the spec pings every 1000 ms of silence, waits 500 ms for an answer, and gives a
//! request 6000 ms. A stalled node is `Net::freeze`: what it sends and what is sent to
//! it waits, its timers stand still (SIGSTOP), and `Net::thaw` goes on as the daemon
//! does after SIGCONT (clock first, then what arrived, then its timers).

mod common;

use common::{Net, BLOCK};
use tandem_engine::replica::{Event, LinkLoss, Msg, NodeId};
use tandem_engine::Io;

/// Why node `n` dropped `peer`, every time it did.
fn losses(net: &Net, n: NodeId, peer: NodeId) -> Vec<LinkLoss> {
    net.events
        .iter()
        .filter_map(|(m, e)| match e {
            Event::PeerLost { peer: p, reason } if *m == n && *p == peer => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

/// Ticks of 100 ms until `ms` have passed.
fn wait(net: &mut Net, ms: u64) {
    for _ in 0..ms / 100 {
        net.tick(100);
    }
}

/// Node 1 stalls 3 s (less than the request timeout, far more than a ping's) with a
/// write of the Primary outstanding: neither the Primary (owed the write) nor node 2 (a
/// Secondary like it) drops it; back, it answers and the write completes, and node 1's
/// own timers, expired while it was stopped, drop nobody. (Judged by pings, as before,
/// the Primary dropped it 1.5 s into the stall.)
#[test]
fn a_secondary_stalled_with_a_write_outstanding_less_than_the_timeout_is_kept() {
    let mut net = Net::diskless_primary();
    net.tick(100);
    net.freeze(1);
    net.write(1, 0, BLOCK as u32);
    assert_eq!(
        net.answer(1),
        None,
        "protocol C: the write waits for node 1"
    );
    wait(&mut net, 3000);
    assert!(
        net.dropped.is_empty(),
        "nobody dropped node 1: {:?}",
        net.dropped
    );
    net.thaw(1);
    net.tick(100);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.write(2, BLOCK, BLOCK as u32);
    assert_eq!(net.answer(2), Some(Ok(())), "writes go on");
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    net.assert_converges();
}

/// The same with a FLUSH outstanding (a barrier node 1 owes): kept for 3 s too.
#[test]
fn a_secondary_stalled_with_a_barrier_outstanding_is_kept() {
    let mut net = Net::diskless_primary();
    net.tick(100);
    net.freeze(1);
    net.submit(1, Io::Flush);
    assert_eq!(net.answer(1), None, "the flush waits for node 1's barrier");
    wait(&mut net, 3000);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    net.thaw(1);
    net.tick(100);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.assert_converges();
}

/// And with a read outstanding (the diskless Primary reads from an up-to-date peer, the
/// one round robin picks: that one is stalled; the other runs on).
#[test]
fn a_secondary_stalled_with_a_read_outstanding_is_kept() {
    let mut net = Net::diskless_primary();
    net.tick(100);
    net.freeze(1);
    net.freeze(2);
    net.submit(
        1,
        Io::Read {
            offset: 0,
            len: BLOCK as u32,
        },
    );
    let asked =
        |net: &Net, n| (net.in_flight(0, n).iter()).any(|m| matches!(m, Msg::ReadReq { .. }));
    let (busy, idle) = if asked(&net, 1) { (1, 2) } else { (2, 1) };
    assert!(asked(&net, busy));
    net.thaw(idle);
    assert_eq!(net.answer(1), None, "the read waits for the stalled peer");
    wait(&mut net, 3000);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    net.thaw(busy);
    net.tick(100);
    assert_eq!(net.answer(1), Some(Ok(())));
    net.assert_converges();
}

/// Stalled past the request timeout with a write outstanding: the Primary drops it when
/// the write is `timeout` old (`WriteTimeout`) and completes the write on node 2 alone;
/// node 2, judging the Secondary–Secondary link by the request timeout, drops it once
/// its ping has gone unanswered that long (`Silent`). Back, node 1 reconnects and is
/// synced: the replicas converge.
#[test]
fn a_secondary_stalled_past_the_timeout_is_dropped_and_resyncs_on_return() {
    let mut net = Net::diskless_primary();
    net.tick(100);
    net.freeze(1);
    net.write(1, 0, BLOCK as u32);
    wait(&mut net, 5900);
    assert!(
        net.dropped.is_empty(),
        "not before the timeout: {:?}",
        net.dropped
    );
    wait(&mut net, 200);
    assert_eq!(losses(&net, 0, 1), [LinkLoss::WriteTimeout(6000)]);
    assert_eq!(net.answer(1), Some(Ok(())), "completed on node 2 alone");
    wait(&mut net, 1000);
    assert_eq!(losses(&net, 2, 1), [LinkLoss::Silent(6000)]);
    // Node 1 wakes to closed connections; it reconnects.
    net.cut(0, 1);
    net.cut(1, 2);
    net.thaw(1);
    net.notice_down(1, 0);
    net.notice_down(1, 2);
    net.run();
    net.dropped.clear();
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.assert_converges();
    assert_eq!(net.block(1, 0), &[1u8; BLOCK as usize][..], "synced");
}

/// An idle Secondary of the Primary that stops answering is dropped by the ping timeout:
/// a ping after 1000 ms of silence, unanswered 500 ms later. Node 2, a Secondary too,
/// judges the link by the request timeout and keeps it meanwhile.
#[test]
fn an_idle_silent_secondary_is_dropped_by_the_ping_timeout() {
    let mut net = Net::diskless_primary();
    // Every node last heard the others at 0 (the clock of the start).
    net.freeze(1);
    wait(&mut net, 1500);
    assert!(
        net.dropped.is_empty(),
        "not before ping-interval + ping-timeout"
    );
    wait(&mut net, 100);
    assert_eq!(losses(&net, 0, 1), [LinkLoss::PingTimeout(500)]);
    assert!(
        losses(&net, 2, 1).is_empty(),
        "node 2 waits for the request timeout"
    );
}

/// A Secondary loses a Primary that stops answering (nothing owed either way) within
/// `ping_interval + ping_timeout` too: what a failover waits for.
#[test]
fn a_silent_primary_is_dropped_by_the_ping_timeout() {
    let mut net = Net::diskless_primary();
    net.freeze(0);
    wait(&mut net, 1500);
    assert!(net.dropped.is_empty());
    wait(&mut net, 100);
    assert_eq!(losses(&net, 1, 0), [LinkLoss::PingTimeout(500)]);
    assert_eq!(losses(&net, 2, 0), [LinkLoss::PingTimeout(500)]);
    assert!(losses(&net, 1, 2).is_empty() && losses(&net, 2, 1).is_empty());
}

/// The driver's transport statistics tell a stopped process from a dead host: node 1 owes
/// the Primary a write; while its host acknowledges what is sent (silence short of the
/// ping timeout) it is kept, however long the stall; once its host has acknowledged
/// nothing for the ping timeout it is dropped (`LinkLoss::Unreachable`), well before the
/// request timeout, and the write completes on node 2.
#[test]
fn a_peer_whose_host_acknowledges_nothing_is_dropped_within_the_ping_timeout() {
    let mut net = Net::diskless_primary();
    net.tick(100);
    net.freeze(1);
    net.write(1, 0, BLOCK as u32);
    let mut out = Vec::new();
    net.nodes[0].transport_silent(1, 499, &mut out);
    net.push(0, out);
    net.run();
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    let mut out = Vec::new();
    net.nodes[0].transport_silent(1, 500, &mut out);
    net.push(0, out);
    net.run();
    assert_eq!(losses(&net, 0, 1), vec![LinkLoss::Unreachable(500)]);
    assert_eq!(net.answer(1), Some(Ok(())));
}
