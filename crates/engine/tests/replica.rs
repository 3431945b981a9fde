//! Direct tests of the replicated engine's refusals. The simulator (crates/sim) covers the
//! data path under failures; these pin down what a misbehaving peer or operator gets.

use tandem_engine::replica::{
    AutoPromote, DiskChange, DiskState, Event, GenIds, LinkLoss, Msg, PromoteError, Protocol,
    ProtocolError, RAction, ReplicaAtStart, Resource, ResourceSpec, Role, RoleChange, Token,
    GI_HISTORY,
};
use tandem_engine::{DiskKind, Io, IoError, ReqId};
use tandem_wire::packet::{write_flags, Packet};

fn spec(me: u8) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: vec![(0, vec![true]), (1, vec![true]), (2, vec![false])],
        sizes: vec![1 << 20],
        protocol: Protocol::C,
        ping_interval_ms: 1000,
        ping_timeout_ms: 500,
        timeout_ms: 6000,
        resync_chunk: 64 << 10,
        resync_window: 4,
        resync_rates: tandem_engine::replica::ResyncRates::UNLIMITED,
        gi_seed: 0x5eed_0000 + u64::from(me),
        quorum: tandem_engine::replica::QuorumSpec::OFF,
        after_sb: Default::default(),
    }
}

fn node(me: u8) -> Resource {
    let disk = if me == 2 {
        ReplicaAtStart::None
    } else {
        ReplicaAtStart::UpToDate
    };
    Resource::new(spec(me), vec![disk])
}

/// Peer 1's list to us of volume 0 ended, naming nothing we lack (a promotion waits for
/// it: `PromoteError::PeerListing`).
fn listed_nothing(p: &mut Resource, out: &mut Vec<RAction>) {
    let end = Packet::OutOfSync {
        volume: 0,
        offset: 0,
        len: 0,
    };
    p.packet(1, &end, out);
}

fn disconnects(out: &[RAction]) -> Vec<LinkLoss> {
    out.iter()
        .filter_map(|a| {
            if let RAction::Disconnect { reason, .. } = a {
                Some(reason.clone())
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn a_peer_with_another_volume_size_is_dropped_and_nothing_changes() {
    let mut n = node(0);
    let mut out = Vec::new();
    n.peer_up(1, &mut out);
    out.clear();
    n.packet(
        1,
        &Packet::Volume {
            volume: 0,
            size: 2 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    let d = disconnects(&out);
    assert_eq!(d.len(), 1, "{out:?}");
    assert!(
        matches!(
            d[0],
            LinkLoss::Misbehaved(ProtocolError::SizeMismatch {
                volume: 0,
                theirs: 2097152,
                ours: 1048576
            })
        ),
        "{d:?}"
    );
    assert_eq!(n.disk(0), DiskState::UpToDate);
    assert!(!n.status().peers[0].connected);
}

#[test]
fn a_second_primary_is_refused() {
    let mut n = node(1);
    let mut out = Vec::new();
    n.peer_up(0, &mut out);
    n.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    n.packet(
        0,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        &mut out,
    );
    let err = n.promote(false, &mut out).unwrap_err();
    assert_eq!(err, PromoteError::PeerPrimary(0), "{err}");
    assert_eq!(n.role(), Role::Secondary);
    // And if both claim it anyway, the connection is dropped rather than both writing.
    let mut p = node(0);
    let mut out = Vec::new();
    p.peer_up(1, &mut out);
    p.packet(1, &Packet::Primaries { nodes: 0 }, &mut out);
    p.packet(
        1,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    listed_nothing(&mut p, &mut out);
    p.promote(false, &mut out).unwrap();
    out.clear();
    p.packet(
        1,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        &mut out,
    );
    assert!(
        disconnects(&out).contains(&LinkLoss::Misbehaved(ProtocolError::BothPrimary)),
        "{out:?}"
    );
}

#[test]
fn writes_from_a_node_that_is_not_primary_are_a_protocol_error() {
    let mut n = node(1);
    let mut out = Vec::new();
    n.peer_up(0, &mut out);
    out.clear();
    let w = Packet::Write {
        volume: 0,
        seq: 1,
        offset: 0,
        flags: write_flags::ACK_WRITE,
        targets: 0b11,
        data: &[1; 512],
    };
    n.packet(0, &w, &mut out);
    assert!(
        disconnects(&out).contains(&LinkLoss::Misbehaved(ProtocolError::WriteFromSecondary)),
        "{out:?}"
    );
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Disk { .. })),
        "nothing written"
    );
}

#[test]
fn a_write_beyond_the_volume_is_a_protocol_error() {
    let mut n = node(1);
    let mut out = Vec::new();
    n.peer_up(0, &mut out);
    n.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    n.packet(
        0,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        &mut out,
    );
    out.clear();
    let w = Packet::Write {
        volume: 0,
        seq: 1,
        offset: (1 << 20) - 256,
        flags: 0,
        targets: 0b11,
        data: &[1; 512],
    };
    n.packet(0, &w, &mut out);
    assert!(
        disconnects(&out)
            .iter()
            .any(|r| matches!(r, LinkLoss::Misbehaved(ProtocolError::OutOfRange { .. }))),
        "{out:?}"
    );
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Disk { .. })),
        "nothing written"
    );
}

#[test]
fn a_secondary_refuses_application_io() {
    let mut n = node(0);
    let mut out = Vec::new();
    n.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 0,
            len: 512,
            fua: false,
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![RAction::Complete {
            req: ReqId(1),
            result: Err(IoError::ReadOnly),
            data: None
        }]
    );
}

#[test]
fn a_diskless_node_cannot_promote_without_an_up_to_date_peer() {
    let mut n = node(2);
    let mut out = Vec::new();
    assert_eq!(
        n.promote(false, &mut out).unwrap_err(),
        PromoteError::NoUpToDate(0)
    );
    n.peer_up(1, &mut out);
    n.packet(1, &Packet::Primaries { nodes: 0 }, &mut out);
    n.packet(
        1,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    n.promote(false, &mut out).unwrap();
    assert!(out.iter().any(|a| matches!(
        a,
        RAction::Send {
            peer: 1,
            msg: Msg::Role {
                role: Role::Primary,
                ..
            }
        }
    )));
}

#[test]
fn protocol_c_completes_only_after_every_peer_wrote() {
    let mut p = node(0);
    let mut out = Vec::new();
    p.peer_up(1, &mut out);
    p.packet(1, &Packet::Primaries { nodes: 0 }, &mut out);
    p.packet(
        1,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    listed_nothing(&mut p, &mut out);
    p.promote(false, &mut out).unwrap();
    out.clear();
    p.submit(
        ReqId(7),
        0,
        Io::Write {
            offset: 4096,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let local = out
        .iter()
        .find_map(|a| {
            if let RAction::Disk { token, kind, .. } = a {
                Some((*token, *kind))
            } else {
                None
            }
        })
        .unwrap();
    let seq = out
        .iter()
        .find_map(|a| {
            if let RAction::Send {
                msg: Msg::Write { seq, .. },
                ..
            } = a
            {
                Some(*seq)
            } else {
                None
            }
        })
        .expect("sent to the peer");
    out.clear();
    p.disk_done(0, local.0, local.1, Ok(()), &mut out);
    p.packet(1, &Packet::RecvAck { seq }, &mut out);
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Complete { .. })),
        "not before the peer wrote it: {out:?}"
    );
    p.packet(1, &Packet::WriteAck { seq }, &mut out);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Complete {
                req: ReqId(7),
                result: Ok(()),
                ..
            }
        )),
        "{out:?}"
    );
}

/// The result a request got, if it completed in these actions.
fn completion(out: &[RAction], req: ReqId) -> Option<Result<(), IoError>> {
    out.iter().find_map(|a| match a {
        RAction::Complete { req: r, result, .. } if *r == req => Some(*result),
        _ => None,
    })
}

/// Runs every local disk operation in `out`, and those they lead to, to success; returns
/// every action produced meanwhile.
fn run_disk(n: &mut Resource, out: &[RAction]) -> Vec<RAction> {
    let mut all = Vec::new();
    let mut todo = out.to_vec();
    while !todo.is_empty() {
        let mut more = Vec::new();
        for a in &todo {
            if let RAction::Disk {
                volume,
                token,
                kind,
                ..
            } = a
            {
                n.disk_done(*volume, *token, *kind, Ok(()), &mut more);
            }
        }
        all.extend(more.iter().cloned());
        todo = more;
    }
    all
}

/// Regression (simulator seeds 47 and 196 with a Primary keeping only volume 0): a FLUSH,
/// or a FUA write, on volume 1 succeeded on the Primary's own fdatasync, which covers only
/// the volume it keeps, while no replica of volume 1 flushed.
#[test]
fn a_flush_succeeds_only_if_a_replica_of_its_volume_flushed() {
    let spec = ResourceSpec {
        me: 0,
        nodes: vec![(0, vec![true, false]), (1, vec![true, true])],
        sizes: vec![1 << 20, 1 << 20],
        ..spec(0)
    };
    let mut p = Resource::new(spec, vec![ReplicaAtStart::UpToDate, ReplicaAtStart::None]);
    let mut out = Vec::new();
    p.peer_up(1, &mut out);
    p.packet(1, &Packet::Primaries { nodes: 0 }, &mut out);
    for volume in 0..2 {
        p.packet(
            1,
            &Packet::Volume {
                volume,
                size: 1 << 20,
                disk: DiskState::UpToDate,
                flags: 0,
                gen: Default::default(),
            },
            &mut out,
        );
    }
    listed_nothing(&mut p, &mut out);
    p.promote(false, &mut out).unwrap();
    // A write to volume 1 reaches node 1 only.
    out.clear();
    let write = Io::Write {
        offset: 0,
        len: 4096,
        fua: false,
    };
    p.submit(ReqId(1), 1, write, &mut out);
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Disk { .. })),
        "no local replica of volume 1: {out:?}"
    );
    p.packet(1, &Packet::RecvAck { seq: 1 }, &mut out);
    p.packet(1, &Packet::WriteAck { seq: 1 }, &mut out);
    assert_eq!(completion(&out, ReqId(1)), Some(Ok(())));
    // Node 1 goes away before flushing it: only our fdatasync (of volume 0) runs.
    p.peer_down(1, &mut out);
    out.clear();
    p.submit(ReqId(2), 1, Io::Flush, &mut out);
    p.submit(ReqId(3), 0, Io::Flush, &mut out);
    let done = run_disk(&mut p, &out);
    assert_eq!(
        completion(&done, ReqId(2)),
        Some(Err(IoError::Os(5))),
        "volume 1's write is durable nowhere: {done:?}"
    );
    assert_eq!(completion(&done, ReqId(3)), Some(Ok(())), "{done:?}");
}

/// A diskless Primary (node 2) with both diskful peers connected and up to date.
fn diskless_primary() -> Resource {
    let mut p = node(2);
    let mut out = Vec::new();
    for peer in [0, 1] {
        p.peer_up(peer, &mut out);
        p.packet(peer, &Packet::Primaries { nodes: 0 }, &mut out);
        p.packet(
            peer,
            &Packet::Volume {
                volume: 0,
                size: 1 << 20,
                disk: DiskState::UpToDate,
                flags: 0,
                gen: Default::default(),
            },
            &mut out,
        );
    }
    p.promote(false, &mut out).unwrap();
    p
}

/// Regression (simulator seed 1891 with overlapping faults): three overlapping writes, the
/// second and third waiting behind the first, and then every replica goes away. The first
/// failed, the second failed at once when its turn came, and the third waited forever: its
/// NBD client hung. Every one must be answered.
#[test]
fn writes_queued_behind_each_other_all_fail_when_the_last_replica_goes() {
    let mut p = diskless_primary();
    let mut out = Vec::new();
    for (req, offset) in [(1, 0), (2, 4096), (3, 8192)] {
        let write = Io::Write {
            offset,
            len: 8192,
            fua: false,
        };
        p.submit(ReqId(req), 0, write, &mut out);
    }
    let sent = out
        .iter()
        .filter(|a| {
            matches!(
                a,
                RAction::Send {
                    msg: Msg::Write { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        sent, 2,
        "only the first write goes out (to both peers): {out:?}"
    );
    out.clear();
    p.peer_down(0, &mut out);
    p.peer_down(1, &mut out);
    for req in 1..=3 {
        assert!(
            matches!(completion(&out, ReqId(req)), Some(Err(_))),
            "write {req} must fail, not wait: {out:?}"
        );
    }
}

/// Regression (simulator seed 1417 with overlapping faults): a replica that reconnected
/// says UpToDate before it has heard what it missed; a sync target that pulled from it then
/// copied stale data and lost an acknowledged write. Until every connected peer has ended
/// its list of what we lack, resync requests are refused with EAGAIN (the target asks
/// elsewhere or later).
#[test]
fn an_up_to_date_replica_serves_resync_only_once_it_knows_what_it_lacks() {
    let mut s = node(1);
    let mut out = Vec::new();
    let resync_req = Packet::ResyncReq {
        volume: 0,
        id: 9,
        offset: 0,
        len: 4096,
    };
    let answer = |out: &[RAction]| {
        out.iter().find_map(|a| match a {
            RAction::Send {
                msg: Msg::ResyncReply { errno, .. },
                ..
            } => Some(*errno),
            RAction::Disk { .. } => Some(0),
            _ => None,
        })
    };
    s.peer_up(0, &mut out);
    s.peer_up(2, &mut out);
    for peer in [0, 2] {
        let disk = if peer == 2 {
            DiskState::Diskless
        } else {
            DiskState::Inconsistent
        };
        s.packet(
            peer,
            &Packet::Volume {
                volume: 0,
                size: 1 << 20,
                disk,
                flags: 0,
                gen: Default::default(),
            },
            &mut out,
        );
    }
    // Node 2 (the Primary) has not ended its list of what we lack yet.
    out.clear();
    s.packet(0, &resync_req, &mut out);
    assert_eq!(
        answer(&out),
        Some(11),
        "EAGAIN while a list is open: {out:?}"
    );
    for peer in [0, 2] {
        s.packet(
            peer,
            &Packet::OutOfSync {
                volume: 0,
                offset: 0,
                len: 0,
            },
            &mut out,
        );
    }
    out.clear();
    s.packet(0, &resync_req, &mut out);
    assert_eq!(
        answer(&out),
        Some(0),
        "served once every list ended: {out:?}"
    );
}

/// Regression (simulator seed 26135 with overlapping faults): a FLUSH answered only by a
/// replica that is being synced. It lacked a write that only the replica gone meanwhile
/// had, so the FLUSH succeeded with that write durable nowhere. Only an UpToDate replica
/// answers for a volume; the Inconsistent one is still flushed.
#[test]
fn a_flush_answered_only_by_a_replica_being_synced_fails() {
    let mut p = diskless_primary();
    let mut out = Vec::new();
    p.packet(
        1,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::Inconsistent,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    out.clear();
    p.submit(ReqId(7), 0, Io::Flush, &mut out);
    let barrier = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 1,
                msg: Msg::Barrier { id },
            } => Some(*id),
            _ => None,
        })
        .expect("the replica being synced is flushed too");
    p.peer_down(0, &mut out);
    out.clear();
    p.packet(
        1,
        &Packet::BarrierAck {
            id: barrier,
            errno: 0,
        },
        &mut out,
    );
    assert!(
        matches!(completion(&out, ReqId(7)), Some(Err(_))),
        "the FLUSH fails: {out:?}"
    );
}

// ------------------------------------------------------------------ replicas created at start

/// Two-node spec (both keep a replica) plus the diskless node 2.
fn started(me: u8, found: ReplicaAtStart) -> Resource {
    let found = if me == 2 { ReplicaAtStart::None } else { found };
    Resource::new(spec(me), vec![found])
}

/// Delivers every control packet `from` queued for `to` (payloads are not needed here).
fn deliver(from: u8, out: &mut Vec<RAction>, to: u8, dst: &mut Resource) -> Vec<RAction> {
    let mut answers = Vec::new();
    for a in std::mem::take(out) {
        if let RAction::Send { peer, msg } = a {
            if peer == to {
                dst.packet(from, &msg.to_packet(|_, _| &[]), &mut answers);
            }
        }
    }
    answers
}

/// Connects two engines and lets them exchange packets until both are quiet.
fn connect(a: (u8, &mut Resource), b: (u8, &mut Resource)) {
    let (ia, ea) = a;
    let (ib, eb) = b;
    let mut out_a = Vec::new();
    let mut out_b = Vec::new();
    ea.peer_up(ib, &mut out_a);
    eb.peer_up(ia, &mut out_b);
    for _ in 0..10 {
        let to_a = deliver(ib, &mut out_b, ia, ea);
        let to_b = deliver(ia, &mut out_a, ib, eb);
        out_a = to_a;
        out_b = to_b;
    }
}

/// `peer` connects to `n`: its replica is `disk`, and it has nothing to list.
/// An Outdated one restarted without metadata (unproven).
fn meets(n: &mut Resource, peer: u8, disk: DiskState, out: &mut Vec<RAction>) {
    n.peer_up(peer, out);
    n.packet(peer, &Packet::Primaries { nodes: 0 }, out);
    let flags = if disk == DiskState::Outdated {
        tandem_wire::packet::volume_flags::UNPROVEN
    } else {
        0
    };
    for p in [
        Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk,
            flags,
            gen: Default::default(),
        },
        Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 0,
        },
    ] {
        n.packet(peer, &p, out);
    }
}

/// Node 0 connects to `n` as an up-to-date Primary with nothing to list.
fn primary_meets(n: &mut Resource, out: &mut Vec<RAction>) {
    n.peer_up(0, out);
    n.packet(0, &Packet::Primaries { nodes: 0 }, out);
    n.packet(
        0,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        out,
    );
    for p in [
        Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 0,
        },
    ] {
        n.packet(0, &p, out);
    }
}

/// `(id, offset, len)` of every resync request sent to node 0.
fn resync_requests_to_alpha(out: &[RAction]) -> Vec<(u64, u64, u32)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Send {
                peer: 0,
                msg: Msg::ResyncReq {
                    id, offset, len, ..
                },
            } => Some((*id, *offset, *len)),
            _ => None,
        })
        .collect()
}

/// `(offset, len)` of every resync write issued.
fn resync_writes(out: &[RAction]) -> Vec<(u64, u32)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Disk {
                token: Token::ResyncWrite { .. },
                kind: DiskKind::Write { offset, len },
                ..
            } => Some((*offset, *len)),
            _ => None,
        })
        .collect()
}

fn resync_requests(out: &[RAction]) -> Vec<(u64, u32)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Send {
                msg: Msg::ResyncReq { offset, len, .. },
                ..
            } => Some((*offset, *len)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_replica_created_at_start_is_inconsistent_and_synced_in_full() {
    // Beta's backing file was deleted while it was down: it comes back created, empty.
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut beta = started(1, ReplicaAtStart::Created);
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
    connect((0, &mut alpha), (1, &mut beta));
    // Still Inconsistent (it holds nothing), and alpha counts all of it as out of sync.
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
    let oos = alpha.status().peers[0].volumes[0].out_of_sync_bytes;
    assert_eq!(oos, 1 << 20, "alpha must list the created replica in full");
    // Its resync covers the whole volume.
    assert_eq!(beta.status().volumes[0].resync_remaining, Some(1 << 20));
    // It never serves a read, and cannot make its node Primary on its own.
    let mut lone = started(1, ReplicaAtStart::Created);
    let mut out = Vec::new();
    assert_eq!(
        lone.promote(false, &mut out),
        Err(PromoteError::NoUpToDate(0))
    );
}

#[test]
fn a_created_replica_pulls_everything_even_if_no_peer_lists_it() {
    // Alpha is UpToDate but has not yet heard that beta is new; beta pulls the whole
    // volume by itself, in block order, from the first byte.
    let mut beta = started(1, ReplicaAtStart::Created);
    let mut out = Vec::new();
    meets(&mut beta, 0, DiskState::UpToDate, &mut out);
    let reqs = resync_requests(&out);
    assert_eq!(reqs.first(), Some(&(0, 64 << 10)), "{out:?}");
    assert_eq!(reqs.len(), 4, "a window of requests: {out:?}");
}

#[test]
fn a_new_cluster_is_up_to_date_without_a_sync() {
    let mut alpha = started(0, ReplicaAtStart::Created);
    let mut beta = started(1, ReplicaAtStart::Created);
    assert_eq!(alpha.disk(0), DiskState::Inconsistent);
    connect((0, &mut alpha), (1, &mut beta));
    for n in [&alpha, &beta] {
        assert_eq!(n.disk(0), DiskState::UpToDate);
        let st = n.status();
        assert_eq!(st.volumes[0].resync_remaining, None);
        assert!(st.peers.iter().all(|p| p.volumes[0].out_of_sync_bytes == 0));
    }
}

#[test]
fn the_only_replica_created_at_start_is_a_new_cluster_of_one() {
    let spec = ResourceSpec {
        nodes: vec![(0, vec![true]), (1, vec![false])],
        ..spec(0)
    };
    let n = Resource::new(spec, vec![ReplicaAtStart::Created]);
    assert_eq!(n.disk(0), DiskState::UpToDate);
}

#[test]
fn a_created_replica_next_to_one_that_holds_data_is_no_new_cluster() {
    // Alpha restarted with its file (Outdated, maybe the only copy of acknowledged
    // writes); beta's file is gone. Neither may call itself current.
    let mut alpha = started(0, ReplicaAtStart::Existing);
    let mut beta = started(1, ReplicaAtStart::Created);
    connect((0, &mut alpha), (1, &mut beta));
    assert_eq!(alpha.disk(0), DiskState::Outdated);
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
    // The administrator picks alpha: beta is then synced in full from it.
    let mut out = Vec::new();
    alpha.promote(true, &mut out).unwrap();
    let oos = alpha.status().peers[0].volumes[0].out_of_sync_bytes;
    assert_eq!(oos, 1 << 20);
}

#[test]
fn a_created_replica_that_received_data_no_longer_counts_as_new() {
    // Beta was created while alpha was UpToDate and received replicated writes; later
    // alpha also comes back created. Beta holds part of the data: no new cluster.
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut beta = started(1, ReplicaAtStart::Created);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    alpha.promote(false, &mut out).unwrap();
    deliver(0, &mut out, 1, &mut beta);
    alpha.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 0,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let mut to_beta = Vec::new();
    for a in out.drain(..) {
        if let RAction::Send { peer: 1, msg } = a {
            let data = [7u8; 4096];
            beta.packet(0, &msg.to_packet(|_, _| &data), &mut to_beta);
        }
    }
    assert!(
        to_beta.iter().any(|a| matches!(a, RAction::Disk { .. })),
        "beta writes the replicated block: {to_beta:?}"
    );
    // Alpha is replaced by a node whose file was lost too.
    let mut out = Vec::new();
    beta.peer_down(0, &mut out);
    let mut alpha = started(0, ReplicaAtStart::Created);
    connect((0, &mut alpha), (1, &mut beta));
    assert_eq!(alpha.disk(0), DiskState::Inconsistent);
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
}

// ------------------------------------------------------------------ split brain

/// Exchanges packets between two connected engines (payloads of the right length), runs
/// their disk operations to success, and returns every action each produced.
fn exchange(
    a: (u8, &mut Resource, Vec<RAction>),
    b: (u8, &mut Resource, Vec<RAction>),
) -> (Vec<RAction>, Vec<RAction>) {
    static DATA: [u8; 1 << 16] = [9; 1 << 16];
    let (ia, ea, mut out_a) = a;
    let (ib, eb, mut out_b) = b;
    let (mut all_a, mut all_b) = (out_a.clone(), out_b.clone());
    for _ in 0..20 {
        let mut to_a = Vec::new();
        let mut to_b = Vec::new();
        for act in std::mem::take(&mut out_b) {
            if let RAction::Send { peer, msg } = act {
                if peer == ia {
                    ea.packet(
                        ib,
                        &msg.to_packet(|_, len| &DATA[..len as usize]),
                        &mut to_a,
                    );
                }
            }
        }
        for act in std::mem::take(&mut out_a) {
            if let RAction::Send { peer, msg } = act {
                if peer == ib {
                    eb.packet(
                        ia,
                        &msg.to_packet(|_, len| &DATA[..len as usize]),
                        &mut to_b,
                    );
                }
            }
        }
        to_a.extend(run_disk(ea, &to_a.clone()));
        to_b.extend(run_disk(eb, &to_b.clone()));
        all_a.extend(to_a.iter().cloned());
        all_b.extend(to_b.iter().cloned());
        out_a = to_a;
        out_b = to_b;
    }
    (all_a, all_b)
}

/// A Primary on its own writes a block and steps down again.
fn write_alone(n: &mut Resource, offset: u64) {
    let mut out = Vec::new();
    n.promote(false, &mut out).unwrap();
    out.clear();
    n.submit(
        ReqId(offset),
        0,
        Io::Write {
            offset,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let done = run_disk(n, &out);
    assert_eq!(completion(&done, ReqId(offset)), Some(Ok(())));
    n.demote(&mut out).unwrap();
}

fn split_brains(out: &[RAction]) -> Vec<(u8, u64, u64, bool)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::SplitBrain {
                peer,
                mine,
                theirs,
                reported,
                ..
            } => Some((*peer, *mine, *theirs, *reported)),
            _ => None,
        })
        .collect()
}

/// Issue 12: each node was Primary while the two were apart and wrote a block the other
/// lacks. Both find the split brain when they meet (before this, only the node receiving
/// the other's list did, and it dropped and redialled forever; the other went
/// Inconsistent), with the blocks each side changed, and neither gives up its data.
#[test]
fn two_primaries_apart_are_a_split_brain_found_on_both_sides() {
    let mut alpha = node(0);
    let mut beta = node(1);
    write_alone(&mut alpha, 0);
    write_alone(&mut alpha, 8192);
    write_alone(&mut beta, 4096);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (a, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    let (sa, sb) = (split_brains(&a), split_brains(&b));
    assert!(
        sa.iter().any(|&(p, m, t, _)| p == 1 && m == 2 && t == 1),
        "alpha: {sa:?}"
    );
    assert!(
        sb.iter().any(|&(p, m, t, _)| p == 0 && m == 1 && t == 2),
        "beta: {sb:?}"
    );
    assert!(
        sa.iter().any(|s| !s.3) && sb.iter().any(|s| !s.3),
        "each found it itself"
    );
    // Nobody pulled anything: both keep their writes for the administrator to choose.
    assert_eq!(alpha.disk(0), DiskState::UpToDate);
    assert_eq!(beta.disk(0), DiskState::UpToDate);
    assert!(resync_requests(&a).is_empty() && resync_requests(&b).is_empty());
}

/// Only one side was Primary: the other just missed its writes. No split brain, the
/// usual resync.
#[test]
fn one_primary_apart_is_a_plain_resync() {
    let mut alpha = node(0);
    let mut beta = node(1);
    write_alone(&mut alpha, 0);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (a, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert!(split_brains(&a).is_empty() && split_brains(&b).is_empty());
    assert_eq!(beta.disk(0), DiskState::UpToDate, "beta synced: {b:?}");
    assert_eq!(alpha.status().peers[0].volumes[0].out_of_sync_bytes, 0);
}

/// A Primary whose own replica is still being synced (a new node made Primary next to an
/// UpToDate one): an application write to a range whose resync data is on its way to the
/// disk waits for it. Disks complete in any order, so issuing both let the older resync
/// data land last and the acknowledged write vanish (simulator seed 40014553).
#[test]
fn a_primary_being_synced_writes_after_the_resync_write_to_the_same_range() {
    let mut alpha = started(0, ReplicaAtStart::Created);
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut out_a);
    beta.peer_up(0, &mut out_b);
    for _ in 0..5 {
        let first = out_a.iter().find_map(|a| match a {
            RAction::Send {
                msg: Msg::ResyncReq {
                    id, offset, len, ..
                },
                ..
            } => Some((*id, *offset, *len)),
            _ => None,
        });
        let to_a = deliver(1, &mut out_b, 0, &mut alpha);
        let to_b = deliver(0, &mut out_a, 1, &mut beta);
        out_a = to_a;
        out_b = to_b;
        if let Some((id, offset, len)) = first {
            // Beta's answer to alpha's first request.
            let data = vec![0u8; len as usize];
            let mut out = Vec::new();
            alpha.packet(
                1,
                &Packet::ResyncReply {
                    volume: 0,
                    id,
                    offset,
                    errno: 0,
                    lacking: 0,
                    data: &data,
                },
                &mut out,
            );
            let resync_write = out
                .iter()
                .find_map(|a| match a {
                    RAction::Disk {
                        token: token @ Token::ResyncWrite { .. },
                        kind,
                        ..
                    } => Some((*token, *kind)),
                    _ => None,
                })
                .expect("the resync data goes to the disk");
            alpha.promote(false, &mut out).unwrap();
            out.clear();
            alpha.submit(
                ReqId(1),
                0,
                Io::Write {
                    offset: offset + 4096,
                    len: 4096,
                    fua: false,
                },
                &mut out,
            );
            let app_disk = |out: &[RAction]| {
                out.iter().any(|a| {
                    matches!(
                        a,
                        RAction::Disk {
                            token: Token::App(ReqId(1)),
                            ..
                        }
                    )
                })
            };
            assert!(
                !app_disk(&out),
                "the write went to the disk while resync data for its range was in flight: {out:?}"
            );
            let mut done = Vec::new();
            alpha.disk_done(0, resync_write.0, resync_write.1, Ok(()), &mut done);
            assert!(app_disk(&done), "the write waits forever: {done:?}");
            return;
        }
    }
    panic!("alpha never asked beta for resync data");
}

// ------------------------------------------------------------------ resync endings

/// Runs the packets of two connected engines back and forth (payloads of the right
/// length) and their disk operations to success, except `held`'s flushes, which are kept
/// back and returned.
fn sync_holding_flushes(
    a: (u8, &mut Resource),
    b: (u8, &mut Resource),
    mut out_a: Vec<RAction>,
    mut out_b: Vec<RAction>,
) -> Vec<(Token, DiskKind)> {
    static DATA: [u8; 1 << 16] = [7; 1 << 16];
    let (ia, ea) = a;
    let (ib, eb) = b;
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut to_a = Vec::new();
        let mut to_b = Vec::new();
        for act in std::mem::take(&mut out_b) {
            if let RAction::Send { peer, msg } = act {
                if peer == ia {
                    let p = msg.to_packet(|_, len| &DATA[..len as usize]);
                    ea.packet(ib, &p, &mut to_a);
                }
            }
        }
        for act in std::mem::take(&mut out_a) {
            match act {
                RAction::Send { peer, msg } if peer == ib => {
                    let p = msg.to_packet(|_, len| &DATA[..len as usize]);
                    eb.packet(ia, &p, &mut to_b);
                }
                RAction::Disk { token, kind, .. } if kind == DiskKind::Flush => {
                    held.push((token, kind));
                }
                RAction::Disk {
                    volume,
                    token,
                    kind,
                    ..
                } => ea.disk_done(volume, token, kind, Ok(()), &mut to_a),
                _ => {}
            }
        }
        to_b.extend(run_disk(eb, &to_b.clone()));
        out_a = to_a;
        out_b = to_b;
    }
    held
}

/// The diskless Primary (node 2) connects to `n` and says what it is; its list follows.
fn diskless_primary_connects(n: &mut Resource, out: &mut Vec<RAction>) {
    n.peer_up(2, out);
    n.packet(2, &Packet::Primaries { nodes: 0 }, out);
    n.packet(
        2,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        out,
    );
    n.packet(
        2,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::Diskless,
            flags: 0,
            gen: Default::default(),
        },
        out,
    );
}

/// Regression (simulator seed 2001780 with overlapping faults): a replica ending its
/// resync (the final flush running) when the diskless Primary reconnected called itself
/// UpToDate before the Primary had ended its list of writes it lacked. The Primary, hearing
/// UpToDate after its list, took the list as served and forgot those blocks: an
/// acknowledged write was lost. The resync ends only once every connected peer listed.
#[test]
fn a_resync_ends_only_after_every_connected_peer_listed_what_we_lack() {
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut beta = started(1, ReplicaAtStart::Existing);
    assert_eq!(beta.disk(0), DiskState::Outdated);
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    beta.peer_up(0, &mut out_b);
    alpha.peer_up(1, &mut out_a);
    let held = sync_holding_flushes((1, &mut beta), (0, &mut alpha), out_b, out_a);
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
    assert_eq!(beta.status().volumes[0].resync_remaining, Some(0));
    assert!(!held.is_empty(), "the final flush of the resync runs");
    // The diskless Primary connects while that flush runs; its list has not ended.
    let mut out = Vec::new();
    diskless_primary_connects(&mut beta, &mut out);
    for (token, kind) in held {
        beta.disk_done(0, token, kind, Ok(()), &mut out);
    }
    assert_eq!(
        beta.disk(0),
        DiskState::Inconsistent,
        "UpToDate before the Primary's list ended"
    );
    // Its list names a block we lack: pulled, and only then UpToDate.
    beta.packet(
        2,
        &Packet::OutOfSync {
            volume: 0,
            offset: 8192,
            len: 4096,
        },
        &mut out,
    );
    beta.packet(
        2,
        &Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 0,
        },
        &mut out,
    );
    assert_eq!(resync_requests(&out), vec![(8192, 4096)], "{out:?}");
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
}

/// Regression (simulator seed 2021338 with overlapping faults): the diskless Primary
/// reconnected to a Secondary and sent a new write before its list of what the Secondary
/// missed (the list waited for older writes in flight). The list named the block of that
/// write, the Secondary pulled the block from the other replica, which had been cut off
/// from the Primary and lacked the write, and the resync data overwrote it: an
/// acknowledged write was lost. What the Primary wrote on this connection is newer than
/// anything its list is about.
#[test]
fn a_write_sent_before_the_primarys_list_is_not_overwritten_by_resync() {
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    connect((0, &mut alpha), (1, &mut beta));
    assert_eq!(beta.disk(0), DiskState::UpToDate);
    let mut out = Vec::new();
    diskless_primary_connects(&mut beta, &mut out);
    // A new write to sector 17, then a list naming its block (8192..12288).
    beta.packet(
        2,
        &Packet::Write {
            volume: 0,
            seq: 1,
            offset: 8704,
            flags: write_flags::ACK_WRITE,
            targets: 0b11,
            data: &[5; 512],
        },
        &mut out,
    );
    out.extend(run_disk(&mut beta, &out.clone()));
    for (offset, len) in [(8192, 4096), (0, 0)] {
        beta.packet(
            2,
            &Packet::OutOfSync {
                volume: 0,
                offset,
                len,
            },
            &mut out,
        );
    }
    let reqs = resync_requests_to_alpha(&out);
    assert_eq!(reqs.len(), 1, "{out:?}");
    let (id, offset, len) = reqs[0];
    assert_eq!((offset, len), (8192, 4096));
    out.clear();
    beta.packet(
        0,
        &Packet::ResyncReply {
            volume: 0,
            id,
            offset,
            errno: 0,
            lacking: 0,
            data: &[0; 4096],
        },
        &mut out,
    );
    let written = resync_writes(&out);
    assert!(
        !written.is_empty(),
        "the rest of the block is written: {out:?}"
    );
    for (o, l) in written {
        assert!(
            o + u64::from(l) <= 8704 || o >= 9216,
            "resync data overwrote the Primary's newer write: {o}+{l}"
        );
    }
}

/// Regression (simulator seed 5001807 with overlapping faults): a replica acknowledged
/// receipt of a write, then its link dropped because it died before writing it. The
/// Primary took receipt for "written" and never marked the block for it; that replica
/// later served the block to the only other one, and an acknowledged write was lost.
/// Like DRBD, only a write acknowledgement counts.
#[test]
fn a_write_received_but_not_acknowledged_as_written_is_out_of_sync_when_the_link_drops() {
    let mut p = diskless_primary();
    let mut out = Vec::new();
    p.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 4096,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let seq = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 0,
                msg: Msg::Write { seq, .. },
            } => Some(*seq),
            _ => None,
        })
        .expect("replicated to node 0");
    p.packet(0, &Packet::RecvAck { seq }, &mut out);
    p.packet(1, &Packet::RecvAck { seq }, &mut out);
    p.packet(1, &Packet::WriteAck { seq }, &mut out);
    p.peer_down(0, &mut out);
    // Node 0 may hold the current generation id: the id changes before the write
    // completes, and node 1 (which has the write) must hold the new one first.
    assert_eq!(completion(&out, ReqId(1)), None, "{out:?}");
    let gen = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 1,
                msg: Msg::Generation { gen, .. },
            } => Some(*gen),
            _ => None,
        })
        .expect("the new generation goes to node 1");
    assert_ne!(gen.current, 0);
    p.packet(
        1,
        &Packet::GenAck {
            volume: 0,
            gi: gen.current,
            adopted: true,
        },
        &mut out,
    );
    assert_eq!(completion(&out, ReqId(1)), Some(Ok(())), "{out:?}");
    let st = p.status();
    let oos = st.peers.iter().find(|q| q.id == 0).unwrap().volumes[0].out_of_sync_bytes;
    assert_eq!(oos, 4096, "node 0 may lack the write it only received");
}

/// Simulator seed 1006061: no replica within reach was UpToDate (one Inconsistent, one
/// being synced), and the sync target asked the other every 20 ms, forever, for blocks it
/// lacked too. Until metadata can prove which replica is current, such a cluster must sit
/// still and say why: requests back off (at most one per peer every 2 s), status says no
/// up-to-date replica is within reach, and the log says so once.
#[test]
fn without_an_up_to_date_replica_a_resync_waits_quietly() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    beta.tick(0, &mut out);
    beta.peer_up(0, &mut out);
    beta.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    beta.packet(
        0,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::Inconsistent,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    diskless_primary_connects(&mut beta, &mut out);
    for (offset, len) in [(8192, 4096), (0, 0)] {
        beta.packet(
            2,
            &Packet::OutOfSync {
                volume: 0,
                offset,
                len,
            },
            &mut out,
        );
    }
    assert_eq!(beta.disk(0), DiskState::Inconsistent);
    assert!(!beta.status().volumes[0].up_to_date_within_reach);
    let (mut asked, mut notes) = (0, Vec::new());
    for now in (0..20_000).step_by(10) {
        beta.tick(now, &mut out);
        for a in std::mem::take(&mut out) {
            match a {
                RAction::Send {
                    peer: 0,
                    msg: Msg::ResyncReq { id, offset, .. },
                } => {
                    asked += 1;
                    let refusal = Packet::ResyncReply {
                        volume: 0,
                        id,
                        offset,
                        errno: 11,
                        lacking: 0,
                        data: &[],
                    };
                    beta.packet(0, &refusal, &mut out);
                }
                RAction::Send {
                    peer,
                    msg: Msg::Ping,
                } => beta.packet(peer, &Packet::PingAck, &mut out),
                RAction::Event(e) => notes.push(e),
                _ => {}
            }
        }
    }
    assert!(beta.status().peers.iter().all(|p| p.connected));
    assert!(asked >= 2, "it asks again: {asked}");
    assert!(
        asked <= 20,
        "{asked} resync requests in 20 s to a peer that lacks it too"
    );
    let waits: Vec<_> = notes
        .iter()
        .filter(|e| matches!(e, Event::ResyncStalled { volume: 0 }))
        .collect();
    assert_eq!(waits.len(), 1, "said once: {notes:?}");
    // The peer becomes UpToDate: asked again at once, and the data ends the wait.
    beta.packet(
        0,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: Default::default(),
        },
        &mut out,
    );
    assert_eq!(resync_requests(&out), vec![(8192, 4096)], "{out:?}");
    assert!(beta.status().volumes[0].up_to_date_within_reach);
}

/// Regression (simulator seed 30028803 with overlapping faults): a resync read for a peer
/// completed after its connection dropped. The source cleared the range from the peer's
/// out-of-sync blocks as if the reply went out, forgetting a write the peer had missed
/// meanwhile; on the next connection the range was not listed and the peer kept old data.
#[test]
fn a_resync_read_for_a_dropped_connection_forgets_nothing() {
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    meets(&mut alpha, 1, DiskState::Outdated, &mut out);
    let oos = |n: &Resource| n.status().peers[0].volumes[0].out_of_sync_bytes;
    assert_eq!(oos(&alpha), 1 << 20, "an Outdated peer lacks everything");
    out.clear();
    let req = Packet::ResyncReq {
        volume: 0,
        id: 1,
        offset: 0,
        len: 16384,
    };
    alpha.packet(1, &req, &mut out);
    let (token, kind) = out
        .iter()
        .find_map(|a| match a {
            RAction::Disk { token, kind, .. } => Some((*token, *kind)),
            _ => None,
        })
        .expect("the range is read for the peer");
    alpha.peer_down(1, &mut out);
    out.clear();
    alpha.disk_done(0, token, kind, Ok(()), &mut out);
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Send { .. })),
        "nothing goes to a dropped connection: {out:?}"
    );
    assert_eq!(oos(&alpha), 1 << 20, "the range is still out of sync");
}

/// Soak seed 80087183 (overlapping faults): the source served a resync read and its
/// reply was lost when the link dropped right after; it had cleared the range from what
/// the peer lacks, so its next list left it out, and the peer filled it from a replica cut
/// off from the Primary. Blocks served are put back when the connection ends before the
/// peer reports UpToDate.
#[test]
fn a_resync_reply_lost_with_the_link_is_listed_again() {
    let mut alpha = started(0, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    meets(&mut alpha, 1, DiskState::Outdated, &mut out);
    let oos = |n: &Resource| n.status().peers[0].volumes[0].out_of_sync_bytes;
    out.clear();
    let req = Packet::ResyncReq {
        volume: 0,
        id: 1,
        offset: 0,
        len: 16384,
    };
    alpha.packet(1, &req, &mut out);
    let (token, kind) = out
        .iter()
        .find_map(|a| match a {
            RAction::Disk { token, kind, .. } => Some((*token, *kind)),
            _ => None,
        })
        .expect("the range is read for the peer");
    out.clear();
    alpha.disk_done(0, token, kind, Ok(()), &mut out);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Send {
                msg: Msg::ResyncReply { errno: 0, .. },
                ..
            }
        )),
        "served: {out:?}"
    );
    assert_eq!(oos(&alpha), (1 << 20) - 16384, "the peer pulls it now");
    // The reply is lost with the link.
    alpha.peer_down(1, &mut out);
    assert_eq!(
        oos(&alpha),
        1 << 20,
        "the served range may not have arrived"
    );
    out.clear();
    meets(&mut alpha, 1, DiskState::Inconsistent, &mut out);
    let listed: u64 = out
        .iter()
        .filter_map(|a| match a {
            RAction::Send {
                msg: Msg::OutOfSync { len, .. },
                ..
            } => Some(u64::from(*len)),
            _ => None,
        })
        .sum();
    assert_eq!(listed, 1 << 20, "listed again in full: {out:?}");
}

/// Regression (simulator seed 60017710 with overlapping faults): a replica cut off from
/// the Primary (it lacked writes without knowing) was reading a block for a restarted
/// peer's resync when the Primary reconnected. The read was issued while no list was
/// open; the reply went out after the Primary's list began, with stale data the restarted
/// peer wrote over its own newer copy. A resync read is checked again when it completes.
#[test]
fn a_resync_read_is_not_served_if_the_source_learned_meanwhile_that_it_may_lack_it() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    // Alpha (node 0) restarted: Outdated, asks beta for everything.
    meets(&mut beta, 0, DiskState::Outdated, &mut out);
    out.clear();
    let req = Packet::ResyncReq {
        volume: 0,
        id: 1,
        offset: 0,
        len: 16384,
    };
    beta.packet(0, &req, &mut out);
    let (token, kind) = out
        .iter()
        .find_map(|a| match a {
            RAction::Disk { token, kind, .. } => Some((*token, *kind)),
            _ => None,
        })
        .expect("beta reads the range for alpha");
    // The diskless Primary comes back while the read runs; its list has not ended.
    diskless_primary_connects(&mut beta, &mut out);
    out.clear();
    beta.disk_done(0, token, kind, Ok(()), &mut out);
    let errno = out.iter().find_map(|a| match a {
        RAction::Send {
            peer: 0,
            msg: Msg::ResyncReply { errno, .. },
        } => Some(*errno),
        _ => None,
    });
    assert_eq!(errno, Some(11), "EAGAIN, not data beta may lack: {out:?}");
    let oos = beta.status().peers[0].volumes[0].out_of_sync_bytes;
    assert_eq!(oos, 1 << 20, "still owed to alpha in full");
}

/// The engine says when it next needs a tick; a driver that ticks only then sees every
/// timer fire on time: the keepalive ping, a ping unanswered for too long, a resync retry.
#[test]
fn ticking_only_at_poll_timeout_fires_every_timer_on_time() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    beta.tick(1000, &mut out);
    assert_eq!(beta.poll_timeout(), None, "no peer, nothing timed");
    beta.peer_up(0, &mut out);
    // The peer is Primary: an idle link with it is judged by pings (see `busy_peer.rs`).
    let role = Packet::Role {
        role: Role::Primary,
        incarnation: 1,
    };
    beta.packet(0, &role, &mut out);
    // spec: ping every 1000 ms of silence, answered within 500 ms.
    assert_eq!(beta.poll_timeout(), Some(2000));
    out.clear();
    beta.tick(1999, &mut out);
    assert!(!out
        .iter()
        .any(|a| matches!(a, RAction::Send { msg: Msg::Ping, .. })));
    beta.tick(2000, &mut out);
    assert!(
        out.iter()
            .any(|a| matches!(a, RAction::Send { msg: Msg::Ping, .. })),
        "the ping goes out at the time asked for: {out:?}"
    );
    assert_eq!(beta.poll_timeout(), Some(2501));
    out.clear();
    beta.tick(2500, &mut out);
    assert!(disconnects(&out).is_empty(), "not before the timeout");
    beta.tick(beta.poll_timeout().unwrap(), &mut out);
    assert!(
        disconnects(&out)
            .iter()
            .any(|r| matches!(r, LinkLoss::PingTimeout(_))),
        "dropped once the ping is overdue: {out:?}"
    );
    assert_eq!(beta.poll_timeout(), None);
}

fn role_changes(out: &[RAction]) -> Vec<(Role, RoleChange)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Event(Event::RoleChanged { to, why, .. }) => Some((*to, *why)),
            _ => None,
        })
        .collect()
}

/// DRBD's auto-promote, decided by the engine: the first client promotes a node when no
/// other is Primary; the last one to leave demotes it once its requests are answered; a
/// node the administrator promoted stays Primary.
#[test]
fn clients_promote_and_the_last_one_leaving_demotes_once_its_requests_are_answered() {
    let mut n = node(0);
    let mut out = Vec::new();
    assert_eq!(n.client_attached(&mut out), AutoPromote::Promoted);
    assert_eq!(
        role_changes(&out),
        vec![(Role::Primary, RoleChange::ClientAttached)]
    );
    assert_eq!(n.client_attached(&mut out), AutoPromote::Unchanged);
    out.clear();
    let write = Io::Write {
        offset: 0,
        len: 512,
        fua: false,
    };
    n.submit(ReqId(1), 0, write, &mut out);
    n.client_detached(&mut out);
    n.client_detached(&mut out);
    assert_eq!(n.role(), Role::Primary, "a write is in flight");
    n.disk_done(
        0,
        Token::App(ReqId(1)),
        DiskKind::Write {
            offset: 0,
            len: 512,
        },
        Ok(()),
        &mut out,
    );
    assert_eq!(n.role(), Role::Secondary, "answered: {out:?}");
    assert_eq!(
        role_changes(&out),
        vec![(Role::Secondary, RoleChange::LastClientLeft)]
    );

    // Promoted by the administrator: clients come and go, it stays Primary.
    out.clear();
    n.promote(false, &mut out).unwrap();
    assert_eq!(n.client_attached(&mut out), AutoPromote::Unchanged);
    n.client_detached(&mut out);
    assert_eq!(n.role(), Role::Primary);

    // Another node is Primary: a client attaching changes nothing.
    let mut m = node(1);
    m.peer_up(0, &mut out);
    m.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    m.packet(
        0,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        &mut out,
    );
    assert_eq!(m.client_attached(&mut out), AutoPromote::Unchanged);
    assert_eq!(m.role(), Role::Secondary);
    // Without an up-to-date replica within reach it is refused, and says why.
    let mut d = node(2);
    assert_eq!(
        d.client_attached(&mut out),
        AutoPromote::Refused(PromoteError::NoUpToDate(0))
    );
}

fn listed(out: &[RAction], to: u8) -> Vec<(u64, u32)> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Send {
                peer,
                msg: Msg::OutOfSync { offset, len, .. },
            } if *peer == to && *len > 0 => Some((*offset, *len)),
            _ => None,
        })
        .collect()
}

/// Soak seed 80045903: a replica restarted (its currency unknown), was synced in full by a
/// Secondary cut off from the Primary (which lacked a write the restarted one had) and
/// called itself UpToDate before the Primary came back; the Primary listed only what it
/// knew the replica had missed, and an acknowledged write was gone from two replicas. Now
/// the replica stays unproven (and says so) until it is synced under a Primary's list, and
/// a diskful Primary lists everything to it.
#[test]
fn a_diskful_primary_lists_everything_to_an_unproven_up_to_date_replica() {
    let mut p = node(0);
    let mut out = Vec::new();
    p.promote(false, &mut out).unwrap();
    out.clear();
    p.peer_up(1, &mut out);
    let volume = |flags| Packet::Volume {
        volume: 0,
        size: 1 << 20,
        disk: DiskState::UpToDate,
        flags,
        gen: Default::default(),
    };
    p.packet(
        1,
        &volume(tandem_wire::packet::volume_flags::UNPROVEN),
        &mut out,
    );
    assert_eq!(listed(&out, 1), vec![(0, 1 << 20)], "{out:?}");

    // A proven one hears only what it missed (nothing here).
    let mut p = node(0);
    p.promote(false, &mut out).unwrap();
    out.clear();
    p.peer_up(1, &mut out);
    p.packet(1, &Packet::Primaries { nodes: 0 }, &mut out);
    p.packet(1, &volume(0), &mut out);
    assert_eq!(listed(&out, 1), vec![]);

    // The replica's side: synced by a Secondary while no Primary is connected (node 2, the
    // Primary's node, is away), it stays unproven when UpToDate; it tells its peers so.
    // (With every node met and none Primary it would be proven: nobody knows more.)
    let mut r = Resource::new(spec(1), vec![ReplicaAtStart::Existing]);
    out.clear();
    r.peer_up(0, &mut out);
    let says_unproven = |out: &[RAction]| {
        out.iter().any(|a| {
            matches!(
                a,
                RAction::Send {
                    msg: Msg::Volume {
                        disk: DiskState::UpToDate,
                        unproven: true,
                        ..
                    },
                    ..
                }
            )
        })
    };
    // Node 0 (a Secondary here) is UpToDate and lists everything to our Outdated replica.
    meets(&mut r, 0, DiskState::UpToDate, &mut out);
    r.packet(
        0,
        &Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 1 << 20,
        },
        &mut out,
    );
    r.packet(
        0,
        &Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 0,
        },
        &mut out,
    );
    let out = served_by(&mut r, 0, out);
    assert_eq!(r.disk(0), DiskState::UpToDate, "{out:?}");
    assert!(
        says_unproven(&out),
        "synced with no Primary connected: still unproven: {out:?}"
    );
}

/// Serves every resync request `r` sends node `source` (zeroes) and completes every disk
/// operation, from the actions `out` on; returns every action taken.
fn served_by(r: &mut Resource, source: u8, out: Vec<RAction>) -> Vec<RAction> {
    let mut queue: std::collections::VecDeque<RAction> = out.into();
    let mut seen = Vec::new();
    while let Some(a) = queue.pop_front() {
        let mut next = Vec::new();
        match &a {
            RAction::Send {
                peer,
                msg: Msg::ResyncReq {
                    id, offset, len, ..
                },
            } if *peer == source => {
                let data = vec![0u8; *len as usize];
                let reply = Packet::ResyncReply {
                    volume: 0,
                    id: *id,
                    offset: *offset,
                    errno: 0,
                    lacking: 0,
                    data: &data,
                };
                r.packet(source, &reply, &mut next);
            }
            RAction::Disk { token, kind, .. } => r.disk_done(0, *token, *kind, Ok(()), &mut next),
            _ => {}
        }
        seen.push(a);
        queue.extend(next);
    }
    seen
}

/// Failover seed 237: a replica that restarted with no metadata to say where it may differ
/// (`Existing`) met only a peer that is not current itself (Inconsistent), which named a
/// block it lacks; pulled, that made it "UpToDate" without a current replica's full list, and it
/// was promoted without an acknowledged write only the absent third replica knew it lacked.
/// It stays Outdated (and unproven) until a current replica lists it everything.
#[test]
fn an_unproven_replica_synced_by_a_peer_not_current_is_not_up_to_date() {
    let mut r = Resource::new(spec(1), vec![ReplicaAtStart::Existing]);
    let mut out = Vec::new();
    meets(&mut r, 0, DiskState::Inconsistent, &mut out);
    for (offset, len) in [(65536, 4096), (0, 0)] {
        let notice = Packet::OutOfSync {
            volume: 0,
            offset,
            len,
        };
        r.packet(0, &notice, &mut out);
    }
    let out = served_by(&mut r, 0, out);
    assert!(
        !resync_requests(&out).is_empty(),
        "it pulls what it was told it lacks: {out:?}"
    );
    assert_eq!(r.disk(0), DiskState::Outdated, "{out:?}");
    let said: Vec<String> = events(&out)
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                Event::DiskChanged {
                    to: DiskState::Outdated,
                    ..
                }
            )
        })
        .map(|e| e.to_string())
        .collect();
    assert!(
        said.iter().any(|l| l.contains("no source was up to date")),
        "{said:?}"
    );
}

/// Soak seed 93076773 (disk errors): node 2's disk had failed (Diskless, still connected)
/// and relayed to node 1 a write of the Primary that node 1 missed while cut off from it.
/// Node 1, knowing node 2 lacked writes too, took that for "each replica lacks writes of
/// the Primary that the other has", dropped the connection and redialled, forever. A peer
/// whose replica failed holds none of the writes it relays: node 1 is simply behind.
#[test]
fn a_notice_relayed_by_a_peer_whose_disk_failed_is_no_conflict() {
    let mut s = spec(1);
    s.nodes = vec![(0, vec![true]), (1, vec![true]), (2, vec![true])];
    let mut beta = Resource::new(s, vec![ReplicaAtStart::UpToDate]);
    let mut out = Vec::new();
    primary_meets(&mut beta, &mut out);
    // A write of the Primary that could not go to node 2: node 2 lacks it.
    let data = [7u8; 4096];
    let write = Packet::Write {
        volume: 0,
        seq: 1,
        offset: 0,
        flags: write_flags::ACK_WRITE,
        targets: 0b011,
        data: &data,
    };
    beta.packet(0, &write, &mut out);
    let _ = run_disk(&mut beta, &out);
    assert_eq!(beta.status().peers[1].volumes[0].out_of_sync_bytes, 4096);
    // Node 2 connects with its failed replica and relays a write node 1 missed.
    out.clear();
    meets(&mut beta, 2, DiskState::Diskless, &mut out);
    let relay = Packet::OutOfSync {
        volume: 0,
        offset: 65536,
        len: 4096,
    };
    beta.packet(2, &relay, &mut out);
    assert_eq!(disconnects(&out), vec![], "{out:?}");
    assert_eq!(beta.status().volumes[0].disk, DiskState::Inconsistent);
}

/// Soak seed 94003653 (disk errors, protocol B): a Secondary whose replica had just
/// detached refused a write at once while an older write it overlapped was still being
/// written there; the older one's acknowledgement came after the refusal, and the Primary
/// took it for the newest data of the range. The refusal waits its turn.
#[test]
fn a_detached_replica_answers_overlapping_writes_in_order() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    primary_meets(&mut beta, &mut out);
    let data = [7u8; 8192];
    let write = |seq: u64, offset: u64, len: usize| Packet::Write {
        volume: 0,
        seq,
        offset,
        flags: write_flags::ACK_WRITE,
        targets: 0b011,
        data: &data[..len],
    };
    let disk = |out: &[RAction], seq: u64| {
        out.iter()
            .find_map(|a| match a {
                RAction::Disk { token, kind, .. }
                    if matches!(token, Token::PeerWrite { seq: s, .. } if *s == seq) =>
                {
                    Some((*token, *kind))
                }
                _ => None,
            })
            .expect("written")
    };
    out.clear();
    beta.packet(0, &write(1, 0, 8192), &mut out);
    let first = disk(&out, 1);
    beta.packet(0, &write(2, 65536, 4096), &mut out);
    let second = disk(&out, 2);
    // The second fails: the replica detaches while the first is still being written.
    beta.disk_done(0, second.0, second.1, Err(IoError::Os(5)), &mut out);
    assert_eq!(beta.status().volumes[0].disk, DiskState::Diskless);
    out.clear();
    beta.packet(0, &write(3, 4096, 4096), &mut out);
    let answers = |out: &[RAction]| -> Vec<(u64, bool)> {
        out.iter()
            .filter_map(|a| match a {
                RAction::Send {
                    msg: Msg::WriteAck { seq },
                    ..
                } => Some((*seq, true)),
                RAction::Send {
                    msg: Msg::NegAck { seq, .. },
                    ..
                } => Some((*seq, false)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(answers(&out), vec![], "refused only in its turn: {out:?}");
    out.clear();
    beta.disk_done(0, first.0, first.1, Ok(()), &mut out);
    assert_eq!(answers(&out), vec![(1, true), (3, false)], "{out:?}");
    assert!(
        !out.iter().any(|a| matches!(a, RAction::Disk { .. })),
        "nothing goes to the detached disk: {out:?}"
    );
}

/// Disk-errors soak seed 94017354: a dead disk answered the Primary's read with EIO and
/// the replica stayed UpToDate (only the application's own reads detached it). A read
/// that fails for a peer detaches the replica too.
#[test]
fn a_read_for_a_peer_that_fails_detaches_the_replica() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    meets(&mut beta, 0, DiskState::UpToDate, &mut out);
    out.clear();
    let req = Packet::ReadReq {
        volume: 0,
        id: 1,
        offset: 0,
        len: 4096,
    };
    beta.packet(0, &req, &mut out);
    let (token, kind) = out
        .iter()
        .find_map(|a| match a {
            RAction::Disk { token, kind, .. } => Some((*token, *kind)),
            _ => None,
        })
        .expect("read for the peer");
    out.clear();
    beta.disk_done(0, token, kind, Err(IoError::Os(5)), &mut out);
    assert_eq!(beta.status().volumes[0].disk, DiskState::Diskless);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Send {
                msg: Msg::ReadReply { errno: 5, .. },
                ..
            }
        )),
        "{out:?}"
    );
}

/// Disk-errors soak seeds 94000749 and 94021068: a sync the driver started ahead of a
/// flush failed with no flush waiting; the engine heard of it only at the next flush, and
/// writes kept going to the disk that had lost some. The driver tells it at once.
#[test]
fn a_failed_sync_nobody_waits_for_detaches_every_replica() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    beta.sync_failed(&mut out);
    assert_eq!(beta.status().volumes[0].disk, DiskState::Diskless);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Event(Event::DiskChanged {
                to: DiskState::Diskless,
                ..
            })
        )),
        "{out:?}"
    );
}

/// Two connections racing at a new cluster's start (the replication test
/// `stopped_peer_back_pressure`, once in four runs): beta applied the new-cluster rule on
/// the first connection, alpha only on the second, where it still said Inconsistent and
/// created; beta listed it everything, and alpha pulled the whole volume of zeroes (and,
/// with beta stopped before it heard alpha's UpToDate, later took the restored list for a
/// split brain). Two replicas that both hold nothing but zeroes list nothing.
#[test]
fn a_new_cluster_met_again_over_a_second_connection_lists_nothing() {
    let mut beta = started(1, ReplicaAtStart::Created);
    let created = |disk| Packet::Volume {
        volume: 0,
        size: 1 << 20,
        disk,
        flags: tandem_wire::packet::volume_flags::CREATED,
        gen: Default::default(),
    };
    let mut out = Vec::new();
    beta.peer_up(0, &mut out);
    beta.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    beta.packet(0, &created(DiskState::Inconsistent), &mut out);
    assert_eq!(
        beta.status().volumes[0].disk,
        DiskState::UpToDate,
        "a new cluster"
    );
    beta.peer_down(0, &mut out);
    out.clear();
    beta.peer_up(0, &mut out);
    beta.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    beta.packet(0, &created(DiskState::Inconsistent), &mut out);
    let listed: u64 = out
        .iter()
        .filter_map(|a| match a {
            RAction::Send {
                msg: Msg::OutOfSync { len, .. },
                ..
            } => Some(u64::from(*len)),
            _ => None,
        })
        .sum();
    assert_eq!(listed, 0, "{out:?}");
}

/// Issue 14: a node stopped cleanly and started again from what its metadata kept
/// (`persisted` at the stop, `ReplicaAtStart::Consistent` + `restore_peer` at the start).
fn restarted(n: &Resource, me: u8) -> Resource {
    let kept = n.persisted(0).expect("quiet at the stop");
    let mut again = started(me, ReplicaAtStart::after_clean_stop(kept.consistent));
    for p in &kept.peers {
        again
            .restore_peer(0, p.node, p.out_of_sync.words(), p.wrote_apart, p.bitmap_gi)
            .unwrap();
    }
    again
}

fn synced_bytes(out: &[RAction]) -> Option<u64> {
    out.iter().find_map(|a| match a {
        RAction::Event(Event::DiskChanged {
            why: tandem_engine::replica::DiskChange::Synced { bytes, .. },
            ..
        }) => Some(*bytes),
        _ => None,
    })
}

/// A Secondary stopped cleanly while the Primary wrote two blocks comes back listed only
/// those two blocks (not everything, as a replica without metadata is) and is UpToDate
/// after pulling them.
#[test]
fn a_secondary_back_from_a_clean_restart_pulls_only_what_it_missed() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    beta.peer_down(0, &mut out);
    alpha.peer_down(1, &mut out);
    let mut beta = restarted(&beta, 1);
    assert_eq!(beta.disk(0), DiskState::Outdated);
    write_alone(&mut alpha, 0);
    write_alone(&mut alpha, 65536);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (_, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert_eq!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert_eq!(synced_bytes(&b), Some(8192), "only the two blocks: {b:?}");
    assert_eq!(alpha.status().peers[0].volumes[0].out_of_sync_bytes, 0);
}

/// The Primary stopped cleanly first, having written while the Secondary was away: its
/// metadata kept what the Secondary lacks. Both start again; neither is up to date on its
/// own, but once both have met and listed, the Primary's side lacks nothing and is
/// proven, and the Secondary pulls the one block (no `--force`, no full resync).
#[test]
fn a_whole_cluster_back_from_clean_restarts_needs_no_force() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    beta.peer_down(0, &mut out);
    alpha.peer_down(1, &mut out);
    write_alone(&mut alpha, 4096);
    let mut alpha = restarted(&alpha, 0);
    let mut beta = restarted(&beta, 1);
    assert_eq!(alpha.disk(0), DiskState::Outdated, "not proven alone");
    assert_eq!(
        alpha.promote(false, &mut out).unwrap_err(),
        PromoteError::NoUpToDate(0)
    );
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (a, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert_eq!(alpha.disk(0), DiskState::UpToDate, "{a:?}");
    assert_eq!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert_eq!(synced_bytes(&a), None, "alpha lacked nothing");
    assert_eq!(synced_bytes(&b), Some(4096), "{b:?}");
}

/// A node that crashed (no clean stop: unproven) forgot what it knew of the others: a
/// replica back from a clean restart does not take it for proof, and both wait for an
/// up-to-date replica (or the administrator) rather than guess.
#[test]
fn a_crashed_peer_is_no_proof() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    beta.peer_down(0, &mut out);
    let mut beta = restarted(&beta, 1);
    let mut alpha = started(0, ReplicaAtStart::Existing);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert_eq!(alpha.disk(0), DiskState::Outdated);
    assert_eq!(beta.disk(0), DiskState::Outdated);
}

#[test]
fn the_state_is_taken_only_when_quiet_and_restored_only_into_a_consistent_start() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    assert_eq!(
        alpha.persisted(0).unwrap_err(),
        tandem_engine::replica::NotQuiet::PeerUp(1)
    );
    let mut crashed = started(1, ReplicaAtStart::Existing);
    assert_eq!(
        crashed
            .restore_peer(0, 0, &[0; 4], false, None)
            .unwrap_err(),
        tandem_engine::replica::RestoreError::NotConsistent(0)
    );
    let mut clean = started(1, ReplicaAtStart::Consistent);
    assert!(matches!(
        clean.restore_peer(0, 2, &[0; 4], false, None).unwrap_err(),
        tandem_engine::replica::RestoreError::NotAPeer(2, 0)
    ));
    assert!(matches!(
        clean.restore_peer(0, 0, &[0; 1], false, None).unwrap_err(),
        tandem_engine::replica::RestoreError::Short { .. }
    ));
}

/// Issue 14: a node back from a crash (kill -9, power loss) whose metadata said its
/// replica was consistent and whose activity log names `suspect` ranges.
fn crashed(me: u8, suspect: &[(u64, u64)]) -> Resource {
    let mut n = started(me, ReplicaAtStart::Crashed);
    n.restore_suspect(0, suspect.iter().copied()).unwrap();
    n
}

/// A Secondary back from a crash pulls, under the Primary, the ranges its activity log
/// names and what the Primary lists it missed meanwhile — not the whole volume, as a
/// replica without metadata is — and is UpToDate (proven) after.
#[test]
fn a_secondary_back_from_a_crash_pulls_its_activity_log_and_what_it_missed() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    alpha.peer_down(1, &mut out);
    let mut beta = crashed(1, &[(0, 8192)]);
    assert_eq!(beta.disk(0), DiskState::Outdated);
    write_alone(&mut alpha, 65536);
    alpha.promote(false, &mut out).unwrap();
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (a, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert_eq!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert_eq!(
        synced_bytes(&b),
        Some(3 * 4096),
        "two suspect blocks and the one missed: {b:?}"
    );
    let listed: u64 = listed(&a, 1).iter().map(|&(_, l)| u64::from(l)).sum();
    assert_eq!(
        listed, 4096,
        "the Primary lists only what it knows was missed"
    );
    // Proven: a later clean stop keeps it consistent.
    let mut out = Vec::new();
    beta.peer_down(0, &mut out);
    assert!(beta.persisted(0).unwrap().consistent);
}

/// Without a Primary, a replica back from a crash waits: a Secondary's list is not all it
/// missed, and that Secondary may be behind where the crashed one is suspect. Once the
/// up-to-date node is promoted, it pulls under it.
#[test]
fn a_replica_back_from_a_crash_waits_for_a_primary() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    alpha.peer_down(1, &mut out);
    let mut beta = crashed(1, &[(4096, 4096)]);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (_, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert_ne!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert!(resync_requests(&b).is_empty(), "{b:?}");
    let mut up_a = Vec::new();
    alpha.promote(false, &mut up_a).unwrap();
    let (_, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, Vec::new()));
    assert_eq!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert_eq!(synced_bytes(&b), Some(4096), "{b:?}");
}

/// Regression (simulator seed 381, `--cluster-crash`): a Primary back from a crash,
/// promoted while pulling its activity log's extents, writes into one of them while a
/// resync request for it is out; the reply, read at the source before that write reached
/// it, comes after and must not land over the newer data (DRBD's rule), as on a Secondary.
#[test]
fn a_primary_pulling_its_crashed_extents_keeps_its_own_newer_writes() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    alpha.peer_down(1, &mut out);
    let mut beta = crashed(1, &[(0, 8192)]);
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    let mut out = Vec::new();
    beta.promote(false, &mut out).unwrap();
    assert_eq!(beta.disk(0), DiskState::Inconsistent, "{out:?}");
    let (id, offset, len) = *resync_requests_to_alpha(&out)
        .first()
        .expect("the new Primary pulls its suspect ranges");
    assert_eq!((offset, len), (0, 8192));
    // The application writes sector 8 while that request is out; the write lands here.
    out.clear();
    let write = Io::Write {
        offset: 4096,
        len: 512,
        fua: false,
    };
    beta.submit(ReqId(1), 0, write, &mut out);
    let landed = run_disk(&mut beta, &out);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Disk {
                token: Token::App(ReqId(1)),
                ..
            }
        )),
        "{out:?}"
    );
    // Alpha had read the range before the write reached it: the reply holds older data.
    let mut out = Vec::new();
    beta.packet(
        0,
        &Packet::ResyncReply {
            volume: 0,
            id,
            offset,
            errno: 0,
            lacking: 0,
            data: &[0; 8192],
        },
        &mut out,
    );
    let written = resync_writes(&out);
    assert_eq!(
        written,
        vec![(0, 4096), (4608, 8192 - 4608)],
        "the rest of the range is written, not the sector the Primary wrote: {out:?} {landed:?}"
    );
}

/// A replica back from a crash tells its peers it pulls its suspect ranges itself: an
/// up-to-date Primary lists it only what it missed (the flag), where one without that
/// flag (no metadata) is listed everything.
#[test]
fn a_primary_lists_a_crashed_replica_only_what_it_missed() {
    use tandem_wire::packet::volume_flags::{PULLS_SUSPECT, UNPROVEN};
    for (flags, want) in [(UNPROVEN | PULLS_SUSPECT, 0), (UNPROVEN, 1 << 20)] {
        let mut alpha = node(0);
        let mut out = Vec::new();
        alpha.promote(false, &mut out).unwrap();
        out.clear();
        alpha.peer_up(1, &mut out);
        let volume = Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::Outdated,
            flags,
            gen: Default::default(),
        };
        alpha.packet(1, &volume, &mut out);
        let listed: u64 = listed(&out, 1).iter().map(|&(_, l)| u64::from(l)).sum();
        assert_eq!(listed, want, "flags {flags:#x}");
    }
}

#[test]
fn suspect_ranges_are_restored_only_into_a_crashed_start() {
    let mut clean = started(1, ReplicaAtStart::Consistent);
    assert_eq!(
        clean.restore_suspect(0, [(0, 4096)]).unwrap_err(),
        tandem_engine::replica::RestoreError::NotCrashed(0)
    );
    // The only replica there is: nothing to pull from, nothing newer anywhere.
    let mut alone = Resource::new(
        ResourceSpec {
            nodes: vec![(0, vec![true])],
            ..spec(0)
        },
        vec![ReplicaAtStart::Crashed],
    );
    assert_eq!(alone.disk(0), DiskState::UpToDate);
    assert!(alone.restore_suspect(0, [(0, 4096)]).is_err());
}

/// A replica back from a crash keeps what its metadata knew its peers lack (the bitmap
/// pages it wrote plus its activity log's extents): that knowledge may be nowhere else
/// (soak seed 101022420). A replica that proves nothing else (`Existing`) takes none.
#[test]
fn a_crashed_replica_restores_what_its_peers_lack() {
    let mut beta = crashed(1, &[(0, 4096)]);
    let words = [0b1010u64; 4];
    beta.restore_peer(0, 0, &words, false, None).unwrap();
    let kept = beta.out_of_sync_words(0, 0).unwrap();
    assert_eq!(kept[0], 0b1010, "{kept:?}");
    let mut existing = started(1, ReplicaAtStart::Existing);
    assert!(matches!(
        existing
            .restore_peer(0, 0, &words, false, None)
            .unwrap_err(),
        tandem_engine::replica::RestoreError::NotConsistent(0)
    ));
}

/// What a replica back from a crash kept of what an up-to-date peer lacks is not listed
/// to it as a claim (unproven, it is no proof of being newer; the up-to-date peer's own
/// list would meet it as a conflict and the link would loop): those blocks are pulled
/// from the peer instead, like the activity log's.
#[test]
fn a_crashed_replica_pulls_what_it_kept_against_an_up_to_date_peer() {
    let mut alpha = node(0);
    let mut beta = node(1);
    connect((0, &mut alpha), (1, &mut beta));
    let mut out = Vec::new();
    alpha.peer_down(1, &mut out);
    let mut beta = crashed(1, &[(0, 4096)]);
    // Block 5 marked for alpha long ago (a stale bitmap page).
    beta.restore_peer(0, 0, &[1 << 5, 0, 0, 0], false, None)
        .unwrap();
    write_alone(&mut alpha, 65536);
    alpha.promote(false, &mut out).unwrap();
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (a, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    assert!(listed(&b, 0).is_empty(), "beta claims nothing: {b:?}");
    assert_eq!(alpha.disk(0), DiskState::UpToDate, "{a:?}");
    assert_eq!(beta.disk(0), DiskState::UpToDate, "{b:?}");
    assert_eq!(
        synced_bytes(&b),
        Some(3 * 4096),
        "the suspect block, the kept one and the one missed: {b:?}"
    );
}

/// Node 0 Primary, node 1 an existing replica pulled at `resync-max-rate` 640 KiB/s: the
/// two, and what their connection's first exchange made node 1 emit.
fn paced_pair() -> (Resource, Resource, Vec<RAction>) {
    let mut alpha = node(0);
    let mut out = Vec::new();
    alpha.promote(false, &mut out).unwrap();
    let mut beta = Resource::new(
        ResourceSpec {
            resync_rates: tandem_engine::replica::ResyncRates {
                min: 0,
                max: 640 << 10,
                ..tandem_engine::replica::ResyncRates::UNLIMITED
            },
            ..spec(1)
        },
        vec![ReplicaAtStart::Existing],
    );
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (_, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    (alpha, beta, b)
}

/// The resync-rate controller: at `resync-max-rate` 640 KiB/s a full resync of 1 MiB
/// (64 KiB requests) asks for at most a tenth of a second's worth (one request) at once,
/// goes on as time passes (the engine asks to be woken for it), and finishes.
#[test]
fn a_paced_resync_asks_as_time_allows_and_finishes() {
    let (mut alpha, mut beta, b) = paced_pair();
    let first: u32 = resync_requests(&b).iter().map(|&(_, l)| l).sum();
    assert_eq!(first, 64 << 10, "one request's worth at first: {b:?}");
    assert_ne!(beta.disk(0), DiskState::UpToDate);
    let mut pulled = u64::from(first);
    let mut now = 0;
    while beta.disk(0) != DiskState::UpToDate {
        let wake = beta
            .poll_timeout()
            .expect("a paced resync asks to be woken");
        assert!(wake > now, "woken at {wake} after {now}");
        now = wake;
        assert!(
            now <= 3_000,
            "1 MiB at 640 KiB/s takes about 1.6 s, not {now} ms"
        );
        let mut t = Vec::new();
        beta.tick(now, &mut t);
        pulled += resync_requests(&t)
            .iter()
            .map(|&(_, l)| u64::from(l))
            .sum::<u64>();
        exchange((1, &mut beta, t), (0, &mut alpha, Vec::new()));
    }
    assert_eq!(pulled, 1 << 20);
    assert!(now >= 1_400, "1 MiB at 640 KiB/s cannot end at {now} ms");
}

/// A paced resync whose source went away asks for no wake-up it would do nothing with:
/// the timer was left at the time the budget allowed the next request, in the past once
/// that passed, and a driver polled without end (the simulator's failover seed 1231: a
/// tick every microsecond for seconds; the daemon's reactor would spin a core).
#[test]
fn a_paced_resync_without_a_source_asks_for_no_wake_up() {
    let (_alpha, mut beta, _) = paced_pair();
    let wake = beta
        .poll_timeout()
        .expect("a paced resync asks to be woken");
    let mut t = Vec::new();
    beta.peer_down(0, &mut t);
    let now = wake + 1_000;
    beta.tick(now, &mut t);
    assert_ne!(beta.disk(0), DiskState::UpToDate);
    assert!(
        beta.poll_timeout().is_none_or(|at| at > now),
        "woken at {:?} ms, at or before now ({now} ms), with no source to pull from",
        beta.poll_timeout()
    );
}

/// Under load (the Primary's writes arrive) a resync is held to `resync-min-rate`.
#[test]
fn a_resync_under_replicated_writes_is_held_to_the_minimum_rate() {
    let mut alpha = node(0);
    let mut out = Vec::new();
    alpha.promote(false, &mut out).unwrap();
    let mut beta = Resource::new(
        ResourceSpec {
            resync_rates: tandem_engine::replica::ResyncRates {
                min: 640 << 10,
                max: 0,
                ..tandem_engine::replica::ResyncRates::UNLIMITED
            },
            ..spec(1)
        },
        vec![ReplicaAtStart::Existing],
    );
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    // A write from the application arrives with the connection.
    alpha.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 0,
            len: 4096,
            fua: false,
        },
        &mut up_a,
    );
    let (_, b) = exchange((0, &mut alpha, up_a), (1, &mut beta, up_b));
    let asked: u32 = resync_requests(&b).iter().map(|&(_, l)| l).sum();
    assert!(
        asked <= 128 << 10,
        "{asked} bytes asked at once under load: {b:?}"
    );
}

/// Delivers packets between two nodes for `n` rounds (disk operations complete at once);
/// returns what each still has to send, and what the second emitted in these rounds.
fn rounds(
    a: (u8, &mut Resource, Vec<RAction>),
    b: (u8, &mut Resource, Vec<RAction>),
    n: usize,
) -> (Vec<RAction>, Vec<RAction>, Vec<RAction>) {
    static DATA: [u8; 1 << 16] = [9; 1 << 16];
    let (ia, ea, mut out_a) = a;
    let (ib, eb, mut out_b) = b;
    let mut all_b = Vec::new();
    for _ in 0..n {
        let (mut to_a, mut to_b) = (Vec::new(), Vec::new());
        for act in std::mem::take(&mut out_b) {
            if let RAction::Send { peer, msg } = act {
                if peer == ia {
                    ea.packet(ib, &msg.to_packet(|_, l| &DATA[..l as usize]), &mut to_a);
                }
            }
        }
        for act in std::mem::take(&mut out_a) {
            if let RAction::Send { peer, msg } = act {
                if peer == ib {
                    eb.packet(ia, &msg.to_packet(|_, l| &DATA[..l as usize]), &mut to_b);
                }
            }
        }
        to_a.extend(run_disk(ea, &to_a.clone()));
        to_b.extend(run_disk(eb, &to_b.clone()));
        all_b.extend(to_b.iter().cloned());
        out_a = to_a;
        out_b = to_b;
    }
    (out_a, out_b, all_b)
}

/// Writes that start after the resync did still hold it to `resync-min-rate`.
#[test]
fn writes_arriving_mid_resync_hold_it() {
    let mut alpha = node(0);
    let mut out = Vec::new();
    alpha.promote(false, &mut out).unwrap();
    let mut beta = Resource::new(
        ResourceSpec {
            resync_rates: tandem_engine::replica::ResyncRates {
                min: 640 << 10,
                max: 0,
                ..tandem_engine::replica::ResyncRates::UNLIMITED
            },
            ..spec(1)
        },
        vec![ReplicaAtStart::Existing],
    );
    let (mut up_a, mut up_b) = (Vec::new(), Vec::new());
    alpha.peer_up(1, &mut up_a);
    beta.peer_up(0, &mut up_b);
    let (mut pending_a, pending_b, b) = rounds((0, &mut alpha, up_a), (1, &mut beta, up_b), 3);
    let before: u32 = resync_requests(&b).iter().map(|&(_, l)| l).sum();
    assert!(before > 0, "the resync started unloaded: {b:?}");
    alpha.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 0,
            len: 4096,
            fua: false,
        },
        &mut pending_a,
    );
    // The write reaches beta in the next round, with replies to earlier requests; count
    // what beta asks for from the round after.
    let (pending_a, pending_b, _) =
        rounds((0, &mut alpha, pending_a), (1, &mut beta, pending_b), 1);
    let (_, _, b) = rounds((0, &mut alpha, pending_a), (1, &mut beta, pending_b), 20);
    let after: u32 = resync_requests(&b).iter().map(|&(_, l)| l).sum();
    assert!(
        after <= 128 << 10,
        "{after} bytes asked after a write arrived (before: {before}): {b:?}"
    );
}

// ------------------------------------------------------------------ generation ids

fn gen(current: u64, history: &[u64]) -> GenIds {
    let mut h = [0; GI_HISTORY];
    h[..history.len()].copy_from_slice(history);
    GenIds {
        current,
        history: h,
    }
}

/// A replica back from a stop (`crashed`: kill -9 or power loss) with generation ids
/// `g`, knowing its peer may lack `claims` (its bitmap, plus its activity log's extents
/// after a crash, which are also its suspect ranges).
fn back_with_ids(me: u8, crashed: bool, g: GenIds, claims: &[(u64, u64)]) -> Resource {
    let found = if crashed {
        ReplicaAtStart::Crashed
    } else {
        ReplicaAtStart::Consistent
    };
    let mut n = started(me, found);
    let mut words = vec![0u64; (1 << 20) / 4096 / 64];
    for &(o, l) in claims {
        for b in o / 4096..(o + l).div_ceil(4096) {
            words[(b / 64) as usize] |= 1 << (b % 64);
        }
    }
    if crashed {
        n.restore_suspect(0, claims.iter().copied()).unwrap();
    }
    n.restore_peer(0, 1 - me, &words, false, None).unwrap();
    n.restore_generation(0, g, false).unwrap();
    n
}

/// Connects the two replicas and the diskless node 2 (no Primary anywhere) and runs
/// everything to the end; returns what each replica did.
fn whole_cluster_meets(a: &mut Resource, b: &mut Resource) -> (Vec<RAction>, Vec<RAction>) {
    let mut client = started(2, ReplicaAtStart::None);
    connect((0, a), (2, &mut client));
    connect((1, b), (2, &mut client));
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    a.peer_up(1, &mut out_a);
    b.peer_up(0, &mut out_b);
    exchange((0, a, out_a), (1, b, out_b))
}

fn pulled_bytes(out: &[RAction]) -> u64 {
    resync_requests(out)
        .iter()
        .map(|&(_, l)| u64::from(l))
        .sum()
}

fn events(out: &[RAction]) -> Vec<&Event> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// Every node of a cluster was killed (kill -9) with the same generation ids: no replica
/// can be proven current by a peer, and none needs `--force`. The lower node id ranks
/// first; the other pulls its own activity-log extents and the winner's claims from it,
/// and nothing else.
#[test]
fn a_whole_cluster_back_from_a_crash_settles_by_generation_ids() {
    let g = gen(7, &[]);
    let mut a = back_with_ids(0, true, g, &[(0, 8192)]);
    let mut b = back_with_ids(1, true, g, &[(65536, 4096)]);
    let (out_a, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert_eq!(a.disk(0), DiskState::UpToDate, "{:?}", events(&out_a));
    assert_eq!(b.disk(0), DiskState::UpToDate, "{:?}", events(&out_b));
    assert!(events(&out_a).iter().any(|e| matches!(
        e,
        Event::DiskChanged {
            why: DiskChange::ProvenByGeneration { current: 7 },
            ..
        }
    )));
    let mut pulled = resync_requests(&out_b);
    pulled.sort();
    assert_eq!(
        pulled,
        vec![(0, 8192), (65536, 4096)],
        "the union of both logs, no more"
    );
    assert!(
        resync_requests(&out_a).is_empty(),
        "the winner pulls nothing"
    );
    assert_eq!(b.generation(0), Some(&g));
}

/// As above, but the winner's activity-log extents are in no bitmap of its: it met the
/// other up to date with the same ids before (both running), and its claims became ranges
/// to pull from it, listed to no one (`claims_become_suspect`); then the other crashed too.
/// Proven the reference, the winner has the others take those extents: kept out of every
/// list, a write of its that failed stayed on it alone (failover soak seed 370002353).
#[test]
fn a_replica_proven_by_generation_ids_has_the_others_take_its_suspect_ranges() {
    let g = gen(7, &[]);
    let mut a = started(0, ReplicaAtStart::Crashed);
    a.restore_suspect(0, [(0, 8192)]).unwrap();
    a.restore_peer(0, 1, &[0u64; (1 << 20) / 4096 / 64], false, None)
        .unwrap();
    a.restore_generation(0, g, false).unwrap();
    let mut b = back_with_ids(1, true, g, &[(65536, 4096)]);
    let (_, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert_eq!(a.disk(0), DiskState::UpToDate);
    assert_eq!(b.disk(0), DiskState::UpToDate, "{:?}", events(&out_b));
    // Its own extents are pulled again after the winner's notice (it keeps them until a
    // resync under a Primary's list ends): what counts is which ranges, not how often.
    let mut pulled = resync_requests(&out_b);
    pulled.sort();
    pulled.dedup();
    assert_eq!(
        pulled,
        vec![(0, 8192), (65536, 4096)],
        "the winner's extents and its own"
    );
}

/// A replica back from a crash and not yet proven (Outdated: it takes no writes) that
/// crashes again starts as after the first crash, as a driver restores it from what
/// `consistent` and `suspect_ranges` said: with its ids, ranking above an older replica.
/// Before, its metadata said "not consistent": it restarted with no standing, the older
/// replica won the contest, and the acknowledged write only it held was pulled over
/// (failover seed 370003279).
#[test]
fn a_second_crash_before_the_proof_keeps_the_ids_and_the_suspect_ranges() {
    let newer = gen(9, &[5]);
    let mut a = back_with_ids(0, true, newer, &[(0, 8192)]);
    let mut client = started(2, ReplicaAtStart::None);
    connect((0, &mut a), (2, &mut client));
    assert_eq!(
        a.disk(0),
        DiskState::Outdated,
        "waits for the other replica"
    );
    // Crashed again: what the driver keeps decides how it starts.
    let mut a = if a.consistent(0) {
        back_with_ids(0, true, *a.generation(0).unwrap(), &a.suspect_ranges(0))
    } else {
        started(0, ReplicaAtStart::Existing)
    };
    assert_eq!(
        a.suspect_ranges(0),
        vec![(0, 8192)],
        "the first crash's ranges"
    );
    let mut b = back_with_ids(1, true, gen(5, &[]), &[(65536, 4096)]);
    let (out_a, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert_eq!(a.disk(0), DiskState::UpToDate, "{:?}", events(&out_a));
    assert!(
        resync_requests(&out_a).is_empty(),
        "the newer replica pulls nothing: {:?}",
        events(&out_a)
    );
    assert_eq!(
        b.generation(0).map(|g| g.current),
        Some(9),
        "{:?}",
        events(&out_b)
    );
    assert_eq!(
        pulled_bytes(&out_b),
        1 << 20,
        "the older one is synced in full"
    );
}

/// The same whole-cluster crash after node 1 was cut off while node 0 took writes (the
/// Primary changed the ids first): node 1's ids are older, so node 0 is the source even
/// though node 1 has the lower rank otherwise, and node 1's own claims are pulled, not
/// listed (they would have made node 0 pull old data).
#[test]
fn the_replica_with_newer_generation_ids_is_the_source() {
    let mut a = back_with_ids(0, true, gen(5, &[]), &[(0, 4096)]);
    let mut b = back_with_ids(1, true, gen(9, &[5]), &[(0, 16384)]);
    let (out_a, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert_eq!(b.disk(0), DiskState::UpToDate, "{:?}", events(&out_b));
    assert_eq!(a.disk(0), DiskState::UpToDate, "{:?}", events(&out_a));
    assert!(
        resync_requests(&out_b).is_empty(),
        "the newer replica pulls nothing"
    );
    // Older by its ids, it may lack writes no bitmap names (one in flight to it when its
    // link dropped was known only to the Primary): synced in full.
    assert_eq!(pulled_bytes(&out_a), 1 << 20);
    assert_eq!(
        a.generation(0).unwrap().current,
        9,
        "it adopts the source's ids"
    );
}

/// A replica that stopped cleanly ranks above one that crashed with the same ids.
#[test]
fn a_clean_stop_ranks_above_a_crash_with_the_same_ids() {
    let g = gen(3, &[1]);
    let mut a = back_with_ids(0, true, g, &[(4096, 4096)]);
    let mut b = back_with_ids(1, false, g, &[]);
    let (out_a, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert_eq!(b.disk(0), DiskState::UpToDate, "{:?}", events(&out_b));
    assert_eq!(a.disk(0), DiskState::UpToDate, "{:?}", events(&out_a));
    assert_eq!(resync_requests(&out_a), vec![(4096, 4096)]);
}

/// Ids that each changed apart from the other (two partitions each wrote) are a split
/// brain: reported on both sides, and neither becomes UpToDate.
#[test]
fn diverged_generation_ids_are_a_split_brain() {
    let mut a = back_with_ids(0, false, gen(11, &[5]), &[]);
    let mut b = back_with_ids(1, false, gen(12, &[5]), &[]);
    let (out_a, out_b) = whole_cluster_meets(&mut a, &mut b);
    assert!(!split_brains(&out_a).is_empty(), "{:?}", events(&out_a));
    assert!(!split_brains(&out_b).is_empty(), "{:?}", events(&out_b));
    assert_eq!(a.disk(0), DiskState::Outdated);
    assert_eq!(b.disk(0), DiskState::Outdated);
}

/// Until every node keeping a replica has met it, a restarted replica cannot know that
/// none holds newer data: it waits.
#[test]
fn a_restarted_replica_waits_for_every_diskful_node_before_ranking() {
    let mut a = back_with_ids(0, true, gen(7, &[]), &[]);
    let mut client = started(2, ReplicaAtStart::None);
    connect((0, &mut a), (2, &mut client));
    assert_eq!(a.disk(0), DiskState::Outdated);
    assert!(a.promote(false, &mut Vec::new()).is_err());
}

/// The Primary writes while a replica that held the current ids is away: the ids change
/// before the write completes, the connected replica adopts them (durably: the event comes
/// before the acknowledgement), and only then does the write complete.
#[test]
fn a_write_missing_a_replica_completes_after_the_ids_changed() {
    let mut p = diskless_primary();
    let mut out = Vec::new();
    p.peer_down(0, &mut out);
    let g = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 1,
                msg: Msg::Generation { gen, .. },
            } => Some(*gen),
            _ => None,
        })
        .expect("losing a holder changes the ids at once");
    out.clear();
    p.submit(
        ReqId(1),
        0,
        Io::Write {
            offset: 0,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let seq = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 1,
                msg: Msg::Write { seq, .. },
            } => Some(*seq),
            _ => None,
        })
        .unwrap();
    p.packet(1, &Packet::WriteAck { seq }, &mut out);
    assert_eq!(
        completion(&out, ReqId(1)),
        None,
        "the rotation is not answered yet"
    );
    p.packet(
        1,
        &Packet::GenAck {
            volume: 0,
            gi: g.current,
            adopted: true,
        },
        &mut out,
    );
    assert_eq!(completion(&out, ReqId(1)), Some(Ok(())));
    // Node 1 holds the ids now; node 0 does not: a second write waits for nothing.
    out.clear();
    p.submit(
        ReqId(2),
        0,
        Io::Write {
            offset: 8192,
            len: 4096,
            fua: false,
        },
        &mut out,
    );
    let seq = out
        .iter()
        .find_map(|a| match a {
            RAction::Send {
                peer: 1,
                msg: Msg::Write { seq, .. },
            } => Some(*seq),
            _ => None,
        })
        .unwrap();
    p.packet(1, &Packet::WriteAck { seq }, &mut out);
    assert_eq!(completion(&out, ReqId(2)), Some(Ok(())));
}

/// A Secondary adopts the Primary's new ids only when it is up to date under it (the
/// Primary's list ended); else it says so, and the Primary does not count it a holder.
#[test]
fn a_secondary_adopts_new_ids_only_when_up_to_date_under_the_primary() {
    let mut beta = started(1, ReplicaAtStart::UpToDate);
    let mut out = Vec::new();
    beta.peer_up(0, &mut out);
    beta.packet(0, &Packet::Primaries { nodes: 0 }, &mut out);
    beta.packet(
        0,
        &Packet::Role {
            role: Role::Primary,
            incarnation: 1,
        },
        &mut out,
    );
    beta.packet(
        0,
        &Packet::Volume {
            volume: 0,
            size: 1 << 20,
            disk: DiskState::UpToDate,
            flags: 0,
            gen: gen(0, &[]),
        },
        &mut out,
    );
    let g = gen(42, &[0]);
    out.clear();
    beta.packet(0, &Packet::Generation { volume: 0, gen: g }, &mut out);
    assert!(
        out.iter().any(|a| matches!(
            a,
            RAction::Send {
                msg: Msg::GenAck {
                    adopted: false,
                    gi: 42,
                    ..
                },
                ..
            }
        )),
        "its list has not ended: {out:?}"
    );
    assert_eq!(beta.generation(0).unwrap().current, 0);
    beta.packet(
        0,
        &Packet::OutOfSync {
            volume: 0,
            offset: 0,
            len: 0,
        },
        &mut out,
    );
    assert_eq!(
        beta.generation(0),
        Some(&g),
        "up to date under its list: it adopts"
    );
    let g2 = gen(43, &[42, 0]);
    out.clear();
    beta.packet(0, &Packet::Generation { volume: 0, gen: g2 }, &mut out);
    let changed = out
        .iter()
        .position(|a| matches!(a, RAction::Event(Event::GenerationChanged { to: 43, .. })))
        .expect("an event the driver persists");
    let acked = out
        .iter()
        .position(|a| {
            matches!(
                a,
                RAction::Send {
                    msg: Msg::GenAck {
                        adopted: true,
                        gi: 43,
                        ..
                    },
                    ..
                }
            )
        })
        .expect("answered");
    assert!(changed < acked, "persisted before the answer: {out:?}");
}

/// Node 1 kept running, UpToDate, after it was cut off; node 0 took writes meanwhile (the
/// Primary changed the ids first), then node 0 and the Primary died. Node 0 returns with
/// newer ids: node 1 is behind it, not the reference. Without the ids, node 0 would have
/// pulled its activity log from node 1 and lost acknowledged writes.
#[test]
fn a_running_replica_with_older_ids_is_synced_from_the_newer_one() {
    let mut c = back_with_ids(0, true, gen(9, &[5]), &[(0, 8192)]);
    let mut r = started(1, ReplicaAtStart::UpToDate);
    r.restore_generation(0, gen(5, &[]), false).unwrap();
    let (out_c, out_r) = whole_cluster_meets(&mut c, &mut r);
    assert_eq!(c.disk(0), DiskState::UpToDate, "{:?}", events(&out_c));
    assert_eq!(r.disk(0), DiskState::UpToDate, "{:?}", events(&out_r));
    assert!(
        resync_requests(&out_c).is_empty(),
        "the newer replica pulls nothing"
    );
    assert_eq!(
        pulled_bytes(&out_r),
        1 << 20,
        "older by its ids: synced in full"
    );
    assert!(events(&out_r).iter().any(|e| matches!(
        e,
        Event::DiskChanged {
            why: DiskChange::OlderThan { peer: 0 },
            ..
        }
    )));
    assert_eq!(r.generation(0).unwrap().current, 9);
}

/// A diskless Primary under protocol B, with the diskful peers in `peers` connected and
/// up to date.
fn diskless_primary_b(peers: &[u8]) -> Resource {
    let mut sp = spec(2);
    sp.protocol = Protocol::B;
    let mut p = Resource::new(sp, vec![ReplicaAtStart::None]);
    let mut out = Vec::new();
    for &peer in peers {
        meets(&mut p, peer, DiskState::UpToDate, &mut out);
    }
    p.promote(false, &mut out).unwrap();
    // Promoted with node 1 away (`peers` without it): the ids changed, node 0 adopts them.
    adopt_new_ids(&mut p, &mut out);
    p
}

/// The sequence number of the write sent to `peer`.
fn sent_seq(out: &[RAction], to: u8) -> u64 {
    out.iter()
        .find_map(|a| match a {
            RAction::Send {
                peer,
                msg: Msg::Write { seq, .. },
            } if *peer == to => Some(*seq),
            _ => None,
        })
        .expect("a write sent to the peer")
}

/// Simulator overlapping seeds 3459 and 17948, disk-errors 2934: a diskless Primary under
/// protocol B acknowledged a write on the receipt of the only up-to-date replica it had,
/// which was then killed before writing it: an acknowledged write no replica held. With at
/// most one up-to-date replica to vouch for it, a write waits for it to be written there;
/// with two, a receipt by both is two copies in two processes, as protocol B means.
#[test]
fn a_diskless_primary_with_one_up_to_date_replica_waits_for_it_to_write() {
    let write = Io::Write {
        offset: 4096,
        len: 4096,
        fua: false,
    };
    let mut p = diskless_primary_b(&[0]);
    let mut out = Vec::new();
    p.submit(ReqId(1), 0, write, &mut out);
    let seq = sent_seq(&out, 0);
    out.clear();
    // Node 1, away, misses it: the ids change before it completes (answered at once).
    p.packet(0, &Packet::RecvAck { seq }, &mut out);
    adopt_new_ids(&mut p, &mut out);
    assert_eq!(completion(&out, ReqId(1)), None, "not on receipt: {out:?}");
    p.packet(0, &Packet::WriteAck { seq }, &mut out);
    adopt_new_ids(&mut p, &mut out);
    assert_eq!(completion(&out, ReqId(1)), Some(Ok(())), "{out:?}");

    let mut p = diskless_primary_b(&[0, 1]);
    let mut out = Vec::new();
    p.submit(ReqId(1), 0, write, &mut out);
    let seqs = [sent_seq(&out, 0), sent_seq(&out, 1)];
    out.clear();
    p.packet(0, &Packet::RecvAck { seq: seqs[0] }, &mut out);
    assert_eq!(completion(&out, ReqId(1)), None);
    p.packet(1, &Packet::RecvAck { seq: seqs[1] }, &mut out);
    assert_eq!(
        completion(&out, ReqId(1)),
        Some(Ok(())),
        "received by both up-to-date replicas: {out:?}"
    );
}

/// Node 0 adopts the ids a `Generation` in `out` sends it, if any.
fn adopt_new_ids(p: &mut Resource, out: &mut Vec<RAction>) {
    let gi = out.iter().find_map(|a| match a {
        RAction::Send {
            peer: 0,
            msg: Msg::Generation { gen, .. },
        } => Some(gen.current),
        _ => None,
    });
    if let Some(gi) = gi {
        let adopted = Packet::GenAck {
            volume: 0,
            gi,
            adopted: true,
        };
        p.packet(0, &adopted, out);
    }
}

fn barrier_acks(out: &[RAction]) -> Vec<u64> {
    out.iter()
        .filter_map(|a| match a {
            RAction::Send {
                peer: 0,
                msg: Msg::BarrierAck { id, .. },
            } => Some(*id),
            _ => None,
        })
        .collect()
}

/// Simulator overlapping seed 17794: a Secondary's fdatasync for a Primary's barrier
/// finished after their link had dropped and come back; the answer went out on the new
/// connection, which never sent that barrier, and the Primary dropped it as a protocol
/// error. An answer goes only on the connection its barrier came on.
#[test]
fn a_barrier_is_answered_only_on_the_connection_it_came_on() {
    for reconnect in [false, true] {
        let mut s = node(1);
        let mut out = Vec::new();
        primary_meets(&mut s, &mut out);
        out.clear();
        s.packet(0, &Packet::Barrier { id: 5 }, &mut out);
        let flush = out
            .iter()
            .find_map(|a| match a {
                RAction::Disk { token, kind, .. } if *kind == DiskKind::Flush => {
                    Some((*token, *kind))
                }
                _ => None,
            })
            .expect("an fdatasync for the barrier");
        if reconnect {
            s.peer_down(0, &mut out);
            primary_meets(&mut s, &mut out);
        }
        out.clear();
        s.disk_done(0, flush.0, flush.1, Ok(()), &mut out);
        let want = if reconnect { vec![] } else { vec![5] };
        assert_eq!(
            barrier_acks(&out),
            want,
            "reconnected: {reconnect}: {out:?}"
        );
    }
}
