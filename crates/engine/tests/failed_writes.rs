//! Failed writes and the replica that comes back from a dropped link holding them
//! (`Replicas::unanswered_lost`): which replica is the range's reference, and who pulls
//! what. A diskless Primary (node 0) and two Secondaries over an in-memory network whose
//! disks answer at once and keep their bytes, so that the replicas' data can be compared.
//! A link may be held (its packets wait, in order, as on a slow link) to choose the order
//! in which things happen, as the simulator's seeds did.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use tandem_engine::replica::{
    DataRef, DiskState, Msg, NodeId, Protocol, RAction, ReplicaAtStart, Resource, ResourceSpec,
    Token,
};
use tandem_engine::{DiskKind, Io, IoError, ReqId};

const SIZE: u64 = 1 << 20;
const BLOCK: u64 = 4096;

fn spec(me: NodeId) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: vec![(0, vec![false]), (1, vec![true]), (2, vec![true])],
        sizes: vec![SIZE],
        protocol: Protocol::C,
        ping_interval_ms: 1000,
        ping_timeout_ms: 500,
        timeout_ms: 6000,
        resync_chunk: 64 << 10,
        resync_window: 4,
        resync_rates: tandem_engine::replica::ResyncRates::UNLIMITED,
        gi_seed: 0x5eed_0000 + u64::from(me),
    }
}

struct Node {
    res: Resource,
    disk: Vec<u8>,
    /// Bytes the engine asked to keep ([`RAction::Retain`]).
    held: HashMap<Token, Vec<u8>>,
}

/// One direction of a link.
#[derive(Default)]
struct Link {
    up: bool,
    /// Counts the connections: a packet queued on an earlier one is never delivered.
    conn: u32,
    /// Packets wait here instead of being delivered.
    hold: bool,
    /// The link is held from the first packet this picks out.
    hold_at: Option<fn(&Msg) -> bool>,
    waiting: VecDeque<(Msg, Vec<u8>)>,
}

enum Job {
    Send {
        to: NodeId,
        conn: u32,
        msg: Msg,
        data: Vec<u8>,
    },
    Disk {
        volume: u16,
        token: Token,
        kind: DiskKind,
        data: Vec<u8>,
    },
}

/// What came with the event whose actions are being queued (see `DataRef`).
#[derive(Clone, Copy, Default)]
struct Inputs<'a> {
    incoming: Option<&'a [u8]>,
    payload: Option<(ReqId, &'a [u8])>,
    read: Option<(Token, &'a [u8])>,
}

struct Net {
    nodes: Vec<Node>,
    links: [[Link; 3]; 3],
    queue: VecDeque<(NodeId, Job)>,
    /// Packets delivered: (from, to, message).
    sent: Vec<(NodeId, NodeId, Msg)>,
    /// Connections a node dropped: (node, peer).
    dropped: Vec<(NodeId, NodeId)>,
    completed: HashMap<ReqId, Result<(), IoError>>,
    now: u64,
}

impl Net {
    /// Node 0 diskless and Primary, nodes 1 and 2 up to date, every link up.
    fn new() -> Net {
        let nodes = (0..3)
            .map(|me| Node {
                res: Resource::new(
                    spec(me),
                    vec![if me == 0 {
                        ReplicaAtStart::None
                    } else {
                        ReplicaAtStart::UpToDate
                    }],
                ),
                disk: vec![0; SIZE as usize],
                held: HashMap::new(),
            })
            .collect();
        let mut net = Net {
            nodes,
            links: Default::default(),
            queue: VecDeque::new(),
            sent: Vec::new(),
            dropped: Vec::new(),
            completed: HashMap::new(),
            now: 0,
        };
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            net.link_up(a, b);
        }
        let mut out = Vec::new();
        net.nodes[0].res.promote(false, &mut out).unwrap();
        net.push(0, out, Inputs::default());
        net.run();
        net
    }

    fn link(&mut self, from: NodeId, to: NodeId) -> &mut Link {
        &mut self.links[from as usize][to as usize]
    }

    fn link_up(&mut self, a: NodeId, b: NodeId) {
        for (x, y) in [(a, b), (b, a)] {
            let l = self.link(x, y);
            l.up = true;
            l.conn += 1;
        }
        for (x, y) in [(a, b), (b, a)] {
            let mut out = Vec::new();
            self.nodes[x as usize].res.peer_up(y, &mut out);
            self.push(x, out, Inputs::default());
        }
        self.run();
    }

    fn link_down(&mut self, a: NodeId, b: NodeId) {
        for (x, y) in [(a, b), (b, a)] {
            let l = self.link(x, y);
            l.up = false;
            l.hold = false;
            l.hold_at = None;
            l.waiting.clear();
        }
        for (x, y) in [(a, b), (b, a)] {
            let mut out = Vec::new();
            self.nodes[x as usize].res.peer_down(y, &mut out);
            self.push(x, out, Inputs::default());
        }
        self.run();
    }

    /// Packets from `from` to `to` wait (in order) until `release`.
    fn hold(&mut self, from: NodeId, to: NodeId) {
        self.link(from, to).hold = true;
    }

    /// Packets from `from` to `to` wait from the first one `at` picks out.
    fn hold_at(&mut self, from: NodeId, to: NodeId, at: fn(&Msg) -> bool) {
        self.link(from, to).hold_at = Some(at);
    }

    fn release(&mut self, from: NodeId, to: NodeId) {
        let l = self.link(from, to);
        l.hold = false;
        l.hold_at = None;
        while let Some((msg, data)) = self.link(from, to).waiting.pop_front() {
            self.deliver(from, to, msg, &data);
            self.run();
        }
        self.run();
    }

    fn resolve(&self, n: NodeId, d: DataRef, inputs: &Inputs<'_>) -> Vec<u8> {
        let held = &self.nodes[n as usize].held;
        match d {
            DataRef::Request(req) => match inputs.payload {
                Some((id, p)) if id == req => p.to_vec(),
                _ => held[&Token::App(req)].clone(),
            },
            DataRef::Incoming { at } => inputs.incoming.expect("a packet")[at as usize..].to_vec(),
            DataRef::Disk(t) => match inputs.read {
                Some((token, buf)) if token == t => buf.to_vec(),
                _ => panic!("node {n}: no read {t:?} here"),
            },
            DataRef::Held { key, at } => held[&key][at as usize..].to_vec(),
        }
    }

    /// Queues `n`'s actions, their bytes taken now (as a driver copies them).
    fn push(&mut self, n: NodeId, out: Vec<RAction>, inputs: Inputs<'_>) {
        for a in out {
            match a {
                RAction::Send { peer, msg } => {
                    let named = Cell::new(None);
                    msg.to_packet(|d, len| {
                        named.set(d.map(|d| (d, len)));
                        &[]
                    });
                    let data = named.get().map_or_else(Vec::new, |(d, len)| {
                        self.resolve(n, d, &inputs)[..len as usize].to_vec()
                    });
                    let conn = self.link(n, peer).conn;
                    let job = Job::Send {
                        to: peer,
                        conn,
                        msg,
                        data,
                    };
                    self.queue.push_back((n, job));
                }
                RAction::Disk {
                    volume,
                    token,
                    kind,
                    data,
                } => {
                    let data = data.map_or_else(Vec::new, |d| {
                        self.resolve(n, d, &inputs)[..kind.len() as usize].to_vec()
                    });
                    let job = Job::Disk {
                        volume,
                        token,
                        kind,
                        data,
                    };
                    self.queue.push_back((n, job));
                }
                RAction::Retain { from, key } => {
                    let bytes = self.resolve(n, from, &inputs);
                    self.nodes[n as usize].held.insert(key, bytes);
                }
                RAction::Forget { key } => {
                    self.nodes[n as usize].held.remove(&key);
                }
                RAction::Complete { req, result, .. } => {
                    self.completed.insert(req, result);
                }
                RAction::Disconnect { peer, .. } => self.dropped.push((n, peer)),
                _ => {}
            }
        }
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, msg: Msg, data: &[u8]) {
        self.sent.push((from, to, msg));
        let packet = msg.to_packet(|d, len| match d {
            Some(_) => &data[..len as usize],
            None => &[],
        });
        let mut out = Vec::new();
        self.nodes[to as usize].res.packet(from, &packet, &mut out);
        let inputs = Inputs {
            incoming: Some(data),
            ..Inputs::default()
        };
        self.push(to, out, inputs);
    }

    fn run(&mut self) {
        while let Some((n, job)) = self.queue.pop_front() {
            match job {
                Job::Send {
                    to,
                    conn,
                    msg,
                    data,
                } => {
                    let l = self.link(n, to);
                    if !l.up || l.conn != conn {
                        continue;
                    }
                    if l.hold_at.is_some_and(|at| at(&msg)) {
                        l.hold = true;
                    }
                    if l.hold {
                        l.waiting.push_back((msg, data));
                        continue;
                    }
                    self.deliver(n, to, msg, &data);
                }
                Job::Disk {
                    volume,
                    token,
                    kind,
                    data,
                } => {
                    let disk = &mut self.nodes[n as usize].disk;
                    let range = |o: u64, l: u32| o as usize..(o + u64::from(l)) as usize;
                    let mut read = None;
                    match kind {
                        DiskKind::Read { offset, len } => {
                            read = Some(disk[range(offset, len)].to_vec());
                        }
                        DiskKind::Write { offset, len } => {
                            disk[range(offset, len)].copy_from_slice(&data);
                        }
                        DiskKind::Trim { offset, len } | DiskKind::Zero { offset, len, .. } => {
                            disk[range(offset, len)].fill(0);
                        }
                        DiskKind::Cache { .. } | DiskKind::Flush => {}
                    }
                    let mut out = Vec::new();
                    self.nodes[n as usize]
                        .res
                        .disk_done(volume, token, kind, Ok(()), &mut out);
                    let inputs = Inputs {
                        read: read.as_deref().map(|b| (token, b)),
                        ..Inputs::default()
                    };
                    self.push(n, out, inputs);
                }
            }
        }
    }

    fn tick(&mut self, ms: u64) {
        self.now += ms;
        for n in 0..3u8 {
            let mut out = Vec::new();
            self.nodes[n as usize].res.tick(self.now, &mut out);
            self.push(n, out, Inputs::default());
        }
        self.run();
    }

    /// The application writes `len` bytes of `req as u8` at `offset` through the Primary.
    fn write(&mut self, req: u64, offset: u64, len: u32) {
        let payload = vec![req as u8; len as usize];
        let io = Io::Write {
            offset,
            len,
            fua: false,
        };
        let mut out = Vec::new();
        self.nodes[0].res.submit(ReqId(req), 0, io, &mut out);
        let inputs = Inputs {
            payload: Some((ReqId(req), &payload)),
            ..Inputs::default()
        };
        self.push(0, out, inputs);
        self.run();
    }

    fn result(&self, req: u64) -> Option<Result<(), IoError>> {
        self.completed.get(&ReqId(req)).copied()
    }

    /// The blocks `from` told `to` it lacks, live or listed (4 KiB block numbers).
    fn listed(&self, from: NodeId, to: NodeId) -> Vec<u64> {
        let mut blocks: Vec<u64> = self
            .sent
            .iter()
            .filter_map(|&(f, t, msg)| match msg {
                Msg::OutOfSync { offset, len, .. } if f == from && t == to && len > 0 => {
                    Some(offset / BLOCK..(offset + u64::from(len)).div_ceil(BLOCK))
                }
                _ => None,
            })
            .flatten()
            .collect();
        blocks.sort();
        blocks.dedup();
        blocks
    }

    /// The blocks `from` asked `to` for in resync requests.
    fn pulled(&self, from: NodeId, to: NodeId) -> Vec<u64> {
        let mut blocks: Vec<u64> = self
            .sent
            .iter()
            .filter_map(|&(f, t, msg)| match msg {
                Msg::ResyncReq { offset, len, .. } if f == from && t == to => {
                    Some(offset / BLOCK..(offset + u64::from(len)).div_ceil(BLOCK))
                }
                _ => None,
            })
            .flatten()
            .collect();
        blocks.sort();
        blocks.dedup();
        blocks
    }

    /// What node `n` says peer `p` lacks of the volume, in bytes.
    fn claims(&self, n: NodeId, p: NodeId) -> u64 {
        let st = self.nodes[n as usize].res.status();
        let peer = st.peers.iter().find(|x| x.id == p).expect("a peer");
        peer.volumes[0].out_of_sync_bytes
    }

    fn block(&self, n: NodeId, b: u64) -> &[u8] {
        &self.nodes[n as usize].disk[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
    }

    /// Every link up and time passing: both replicas end up to date, no node claims a
    /// peer lacks anything, and the two replicas hold the same bytes.
    fn assert_converges(&mut self) {
        for _ in 0..200 {
            self.tick(50);
        }
        for n in 0..3u8 {
            let st = self.nodes[n as usize].res.status();
            for p in &st.peers {
                assert!(p.connected, "node {n}: {st:?}");
                assert_eq!(p.volumes[0].out_of_sync_bytes, 0, "node {n}: {st:?}");
            }
        }
        for n in [1, 2] {
            let st = self.nodes[n].res.status();
            assert_eq!(st.volumes[0].disk, DiskState::UpToDate, "node {n}: {st:?}");
        }
        let differ: Vec<u64> = (0..SIZE / BLOCK)
            .filter(|&b| self.block(1, b) != self.block(2, b))
            .collect();
        assert!(differ.is_empty(), "blocks that differ: {differ:?}");
        assert!(self.dropped.is_empty(), "{:?}", self.dropped);
    }
}

/// The write of the Group A seeds: 1 KiB inside block 9, bytes of `1`.
const FAILED: (u64, u32) = (9 * BLOCK + 512, 1024);

/// `holder` alone is sent the write (`other`'s link to the Primary is down), and its link
/// drops before it answers: the write fails, and `holder` wrote it.
fn write_reaches_only(net: &mut Net, holder: NodeId, other: NodeId) {
    net.link_down(0, other);
    net.hold(holder, 0);
    net.write(1, FAILED.0, FAILED.1);
    net.link_down(0, holder);
    assert_eq!(net.result(1), Some(Err(IoError::Os(5))), "the write failed");
    assert_eq!(net.block(holder, 9)[512], 1, "its holder wrote it");
    assert_eq!(net.block(other, 9)[512], 0);
}

/// Who pulls the failed write's block once every link is back: `other` (told by the
/// Primary, and by `holder`, that it lacks it) from `holder`, and nobody else; both end
/// up to date with `holder`'s version, the failed write in it.
fn assert_holder_is_the_reference(net: &mut Net, holder: NodeId, other: NodeId) {
    net.assert_converges();
    assert_eq!(
        net.listed(0, other),
        vec![9],
        "the Primary marks the replica that missed it"
    );
    assert_eq!(
        net.listed(0, holder),
        Vec::<u64>::new(),
        "and not its holder"
    );
    assert_eq!(net.pulled(other, holder), vec![9]);
    assert_eq!(net.pulled(holder, other), Vec::<u64>::new());
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
        let mut net = Net::new();
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
        net.release(holder, other);
        net.release(other, holder);
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
    let mut net = Net::new();
    net.link_down(1, 2);
    net.link_down(0, other);
    net.write(7, 10 * BLOCK, 4096);
    assert_eq!(net.result(7), Some(Ok(())));
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
        net.listed(holder, other),
        vec![9, 10],
        "as the holder's list does"
    );
    net.release(other, 0);
    net.assert_converges();
    assert_eq!(net.listed(0, other), vec![9, 10]);
    assert_eq!(net.listed(0, holder), Vec::<u64>::new());
    assert_eq!(net.pulled(other, holder), vec![9, 10]);
    assert_eq!(net.pulled(holder, other), Vec::<u64>::new());
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
    let mut net = Net::new();
    // Node 1 misses a write to block 30 and is synced from node 2, slowly.
    net.link_down(0, 1);
    net.hold(2, 1);
    net.write(1, 30 * BLOCK, 4096);
    net.link_up(0, 1);
    assert_eq!(net.nodes[1].res.disk(0), DiskState::Inconsistent);
    // Two writes in flight to node 2 when its link drops: block 20's reaches both, block
    // 10's reaches node 1 only after its sync.
    net.hold(2, 0);
    net.write(2, 20 * BLOCK + 512, 1024);
    net.hold(0, 1);
    net.write(3, 10 * BLOCK, 4096);
    net.link_down(0, 2);
    assert_eq!(
        net.result(2),
        Some(Err(IoError::Os(5))),
        "only node 1 being synced has it"
    );
    net.release(2, 1);
    assert_eq!(net.nodes[1].res.disk(0), DiskState::UpToDate);
    // Node 1's request for block 20 reaches node 2 only after node 2 is back.
    net.hold(1, 2);
    net.release(0, 1);
    assert_eq!(net.result(3), Some(Ok(())), "node 1, up to date, holds it");
    assert_eq!(net.claims(0, 1), 4096, "node 1 pulls block 20 back");
    net.link_up(0, 2);
    assert_eq!(net.listed(0, 2), vec![10], "node 2 pulls block 10 only");
    assert_eq!(net.claims(0, 2), 4096);
    assert_eq!(net.claims(0, 1), 4096, "node 1 still pulls block 20");
    net.release(1, 2);
    net.assert_converges();
    assert_eq!(net.pulled(2, 1), vec![10]);
    assert!(net.pulled(1, 2).contains(&20), "{:?}", net.pulled(1, 2));
    assert_eq!(net.block(2, 10)[0], 3);
    assert_eq!(net.block(1, 20)[512], 2);
}
