//! A Secondary back from a crash that the connected Primary's same run settled
//! (`Replicas::settled_by_primary`, event `CrashSettledByRun`): it pulls from a replica
//! being synced (`pick_source`), drops its claims on the others where that Primary lists it
//! a block (`on_out_of_sync`), and lists the others what they lack only after that
//! Primary's list to it has ended (`waits_for_primary_list`, `send_deferred_lists`).
//! Overlapping seeds 39262 and 30003616.
//!
//! Three nodes over an in-memory network whose disks answer at once and keep their bytes,
//! so that the replicas' data can be compared; node 0 is Primary (diskless unless a test
//! says otherwise). A direction of a link can be held (its packets wait, in order), and a
//! node's disk too (its writes have not landed when it crashes). A crash restarts a node's
//! engine as the daemon does after a kill -9: `Crashed`, with its activity log's extents,
//! the run it took writes from, the bitmaps it kept and its generation ids.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use tandem_engine::replica::{
    DataRef, DiskState, Event, Msg, NodeId, PromoteError, Protocol, RAction, ReplicaAtStart,
    Resource, ResourceSpec, Role, Token,
};
use tandem_engine::{DiskKind, Io, IoError, ReqId};

const SIZE: u64 = 1 << 20;
const BLOCK: u64 = 4096;

fn spec(me: NodeId, diskless_primary: bool, incarnation: u64) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: (0..3)
            .map(|id| (id, vec![id != 0 || !diskless_primary]))
            .collect(),
        sizes: vec![SIZE],
        protocol: Protocol::C,
        ping_interval_ms: 1000,
        ping_timeout_ms: 500,
        timeout_ms: 6000,
        resync_chunk: 64 << 10,
        resync_window: 4,
        resync_rates: tandem_engine::replica::ResyncRates::UNLIMITED,
        gi_seed: (0x5eed_0000 + u64::from(me)) ^ (incarnation << 32),
    }
}

struct Node {
    res: Resource,
    disk: Vec<u8>,
    /// Bytes the engine asked to keep ([`RAction::Retain`]).
    held: HashMap<Token, Vec<u8>>,
    /// Disk requests wait here instead of being done (see `Net::hold_disk`).
    disk_held: bool,
    parked: VecDeque<Job>,
    /// Starts of its engine.
    incarnation: u64,
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
    diskless_primary: bool,
    /// Packets delivered: (from, to, message).
    sent: Vec<(NodeId, NodeId, Msg)>,
    events: Vec<(NodeId, Event)>,
    /// Connections a node dropped: (node, peer).
    dropped: Vec<(NodeId, NodeId)>,
    completed: HashMap<ReqId, Result<(), IoError>>,
    now: u64,
}

impl Net {
    /// Node 0 Primary (diskless or not), the other replicas up to date, every link up.
    fn new(diskless_primary: bool) -> Net {
        let nodes = (0..3)
            .map(|me| Node {
                res: Resource::new(
                    spec(me, diskless_primary, 0),
                    vec![if me == 0 && diskless_primary {
                        ReplicaAtStart::None
                    } else {
                        ReplicaAtStart::UpToDate
                    }],
                ),
                disk: vec![0; SIZE as usize],
                held: HashMap::new(),
                disk_held: false,
                parked: VecDeque::new(),
                incarnation: 0,
            })
            .collect();
        let mut net = Net {
            nodes,
            links: Default::default(),
            queue: VecDeque::new(),
            diskless_primary,
            sent: Vec::new(),
            events: Vec::new(),
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

    /// Node `n`'s disk requests wait: what it is sent has not landed yet.
    fn hold_disk(&mut self, n: NodeId) {
        self.nodes[n as usize].disk_held = true;
    }

    /// Node `n`'s engine dies (kill -9; the page cache keeps what landed) and starts again
    /// `Crashed`, as `tandem node` starts it: its activity log's extents `log` are suspect,
    /// the Primary run it took writes from is restored, each peer's bitmap is what it held
    /// at the crash plus the log's extents, and its generation ids are kept.
    fn crash(&mut self, n: NodeId, log: &[(u64, u64)]) {
        let gen = *self.nodes[n as usize].res.generation(0).expect("a replica");
        let writer = self.nodes[n as usize].res.writer();
        assert!(self.nodes[n as usize].res.consistent(0), "node {n}");
        for p in (0..3).filter(|&p| p != n) {
            self.link_down(n, p);
        }
        let peers: Vec<NodeId> = (0..3)
            .filter(|&p| p != n && (p != 0 || !self.diskless_primary))
            .collect();
        let kept: Vec<(NodeId, Vec<u64>)> = peers
            .iter()
            .map(|&p| {
                let mut words = self.nodes[n as usize]
                    .res
                    .out_of_sync_words(0, p)
                    .expect("a peer")
                    .to_vec();
                for &(offset, len) in log {
                    for b in offset / BLOCK..(offset + len).div_ceil(BLOCK) {
                        words[(b / 64) as usize] |= 1 << (b % 64);
                    }
                }
                (p, words)
            })
            .collect();
        let node = &mut self.nodes[n as usize];
        node.incarnation += 1;
        node.parked.clear();
        node.held.clear();
        node.disk_held = false;
        let mut res = Resource::new(
            spec(n, self.diskless_primary, node.incarnation),
            vec![ReplicaAtStart::Crashed],
        );
        res.restore_suspect(0, log.iter().copied()).unwrap();
        if let Some(run) = writer {
            res.restore_writer(0, run).unwrap();
        }
        for (p, words) in &kept {
            res.restore_peer(0, *p, words, false).unwrap();
        }
        res.restore_generation(0, gen, false).unwrap();
        node.res = res;
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
                RAction::Event(e) => self.events.push((n, e)),
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
                job @ Job::Disk { .. } if self.nodes[n as usize].disk_held => {
                    self.nodes[n as usize].parked.push_back(job);
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

    fn disk(&self, n: NodeId) -> DiskState {
        self.nodes[n as usize].res.disk(0)
    }

    fn block(&self, n: NodeId, b: u64) -> &[u8] {
        &self.nodes[n as usize].disk[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
    }

    /// Whether node `n` reported that the Primary's run settled its crash.
    fn settled_by_run(&self, n: NodeId) -> bool {
        self.events
            .iter()
            .any(|(m, e)| *m == n && matches!(e, Event::CrashSettledByRun { primary: 0, .. }))
    }

    /// Every link up and time passing: every replica ends up to date, no node claims a
    /// peer lacks anything, and the replicas hold the same bytes.
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
        let replicas: Vec<NodeId> = if self.diskless_primary {
            vec![1, 2]
        } else {
            vec![0, 1, 2]
        };
        for &n in &replicas {
            assert_eq!(self.disk(n), DiskState::UpToDate, "node {n}");
        }
        for &n in &replicas[1..] {
            let differ: Vec<u64> = (0..SIZE / BLOCK)
                .filter(|&b| self.block(replicas[0], b) != self.block(n, b))
                .collect();
            assert!(
                differ.is_empty(),
                "node {n}: blocks that differ: {differ:?}"
            );
        }
        assert!(self.dropped.is_empty(), "{:?}", self.dropped);
    }
}

/// Node 2's report that it is being synced: what the Primary has not heard yet.
fn inconsistent(m: &Msg) -> bool {
    matches!(
        m,
        Msg::Volume {
            disk: DiskState::Inconsistent,
            ..
        }
    )
}

/// Rule 1, overlapping seed 39262. Node 2, cut off from the diskless Primary, missed a
/// write (block 10) that node 1 holds; back with the Primary and listed it, it waits for
/// a source. Node 1 crashes and misses a write (block 20) that node 2 takes. Node 1 is
/// back under the same run of the Primary (which settles its crash): it lacks block 20,
/// held by node 2, which is being synced; node 2 lacks block 10, held by node 1, which
/// restarted. A restarted replica waits for an up-to-date source, but not under the run
/// that settled its crash: its list named all node 2 lacks. Node 1 pulls block 20 from
/// node 2, is up to date, and node 2 pulls block 10 from it. (Without the rule neither
/// pulled from the other, for ever.)
#[test]
fn a_replica_back_under_the_run_that_settled_its_crash_pulls_from_one_being_synced() {
    let mut net = Net::new(true);
    net.link_down(1, 2);
    net.link_down(0, 2);
    net.write(1, 10 * BLOCK, 4096);
    assert_eq!(net.result(1), Some(Ok(())));
    // Back with the Primary, node 2 is listed block 10 and waits for a source; its report
    // of that is still on its way.
    net.hold_at(2, 0, inconsistent);
    net.link_up(0, 2);
    assert_eq!(net.listed(0, 2), vec![10]);
    assert_eq!(net.disk(2), DiskState::Inconsistent, "no source in reach");
    // Node 1 crashes with a write to block 20 received, not landed; node 2 takes it (the
    // Primary, its report still on the way, counted node 2 current there).
    net.hold_disk(1);
    net.write(2, 20 * BLOCK, 4096);
    net.crash(1, &[(20 * BLOCK, BLOCK)]);
    net.release(2, 0);
    assert_eq!(net.result(2), Some(Ok(())), "node 2 took it");
    assert_eq!(net.block(1, 20)[0], 0);
    net.sent.clear();
    net.link_up(0, 1);
    assert!(net.settled_by_run(1));
    assert_eq!(net.listed(0, 1), vec![20]);
    net.link_up(1, 2);
    for _ in 0..20 {
        net.tick(50);
    }
    assert_eq!(
        net.pulled(1, 2),
        vec![20],
        "node 1 pulls from node 2 being synced"
    );
    assert_eq!(net.pulled(2, 1), vec![10], "and then node 2 from node 1");
    net.assert_converges();
    assert_eq!(net.block(1, 20)[0], 2);
    assert_eq!(net.block(2, 10)[0], 1);
}

/// Overlapping seed 30003616. Node 2 is away from the diskless Primary and misses a
/// write to block 30 that node 1 takes. A write to block 9 then reaches node 1 alone,
/// which marks node 2 as lacking it; node 1 crashes before the write lands and before
/// its answers (and its notice to node 2) leave: the write fails. Node 1 comes back with
/// claims on node 2 for blocks 9 and 30 (as the simulator restores them: the bitmap held
/// at the crash and the log's extents, which name neither block: the writes were landed
/// and flushed long ago, or not at all). The Primary, whose same run settles node 1's
/// crash, settles the failed write against node 1 (it lists node 1 block 9) and lists
/// node 2 block 30. Block 9 is current on node 2 only, block 30 on node 1 only.
fn claims_from_a_failed_write() -> Net {
    claims_from_a_failed_write_ack(true, true)
}

/// `ack_lost`: node 1's receipt of the write to block 9 is lost with its link (else the
/// Primary hears it); `block_30`: node 2 misses the write to block 30 first.
fn claims_from_a_failed_write_ack(ack_lost: bool, block_30: bool) -> Net {
    let mut net = Net::new(true);
    net.link_down(0, 2);
    net.hold(1, 2);
    if block_30 {
        net.write(1, 30 * BLOCK, 4096);
        assert_eq!(net.result(1), Some(Ok(())));
    }
    net.hold_disk(1);
    if ack_lost {
        net.hold(1, 0);
    }
    net.write(2, 9 * BLOCK, 4096);
    let claimed = if block_30 { 2 * 4096 } else { 4096 };
    assert_eq!(net.claims(1, 2), claimed, "node 1 marks node 2");
    net.crash(1, &[]);
    assert_eq!(net.result(2), Some(Err(IoError::Os(5))), "the write failed");
    assert_eq!(net.claims(1, 2), claimed, "restored");
    assert_eq!(net.block(1, 9)[0], 0, "it never landed");
    net.sent.clear();
    net
}

/// The end of both nodes' convergence: each pulled from the other the block it lacked,
/// and node 1 never told node 2 it lacks block 9.
fn assert_each_pulls_what_it_lacks(net: &mut Net) {
    assert_eq!(net.listed(1, 2), vec![30], "block 9 is no claim");
    net.assert_converges();
    assert_eq!(net.listed(0, 1), vec![9]);
    assert_eq!(net.listed(0, 2), vec![30]);
    assert_eq!(net.pulled(1, 2), vec![9]);
    assert_eq!(net.pulled(2, 1), vec![30]);
    assert_eq!(net.block(2, 30)[0], 1);
    assert_eq!(net.block(1, 9)[0], 0, "the failed write is nowhere");
}

/// Rule 2, overlapping seed 30003616 (`on_out_of_sync`): back under the run that settled
/// its crash, node 1 hears the Primary's list (block 9) before it meets node 2. What the
/// Primary lists us we claim no peer lacks: node 1 drops its claim on block 9 and lists
/// node 2 block 30 only. (Kept, node 2 lacked block 9 too, and each refused the other.)
#[test]
fn a_block_the_settling_primary_lists_us_is_no_claim_on_another_replica() {
    let mut net = claims_from_a_failed_write();
    net.link_up(0, 1);
    assert!(net.settled_by_run(1));
    assert_eq!(net.listed(0, 1), vec![9]);
    assert_eq!(net.claims(1, 2), 4096, "block 30's claim only");
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    net.link_up(1, 2);
    assert_each_pulls_what_it_lacks(&mut net);
}

/// Rule 3, overlapping seed 30003616 (`waits_for_primary_list`, `send_deferred_lists`):
/// node 1 meets node 2 while the Primary's list to it (block 9) is still on its way. Its
/// list to node 2 waits for the end of the Primary's: then it names block 30 only. (Sent
/// at once it named block 9 too, just before the Primary listed us the block, and could
/// not be taken back.)
#[test]
fn a_list_to_another_replica_waits_for_the_settling_primarys_list() {
    let mut net = claims_from_a_failed_write();
    net.hold_at(0, 1, |m| matches!(m, Msg::OutOfSync { .. }));
    net.link_up(0, 1);
    assert!(net.settled_by_run(1), "node 1 knows the Primary's run");
    net.link_up(0, 2);
    net.link_up(1, 2);
    assert!(
        net.sent
            .iter()
            .any(|&(f, t, m)| (f, t) == (2, 1) && matches!(m, Msg::OutOfSync { len: 0, .. })),
        "node 2 listed to node 1"
    );
    assert!(
        !net.sent
            .iter()
            .any(|&(f, t, m)| (f, t) == (1, 2) && matches!(m, Msg::OutOfSync { .. })),
        "node 1's list waits"
    );
    assert_eq!(net.claims(1, 2), 2 * 4096);
    net.release(0, 1);
    assert_eq!(net.listed(0, 1), vec![9]);
    assert_each_pulls_what_it_lacks(&mut net);
}

/// Whether `from` ended a list to `to`.
fn list_ended(net: &Net, from: NodeId, to: NodeId) -> bool {
    net.sent
        .iter()
        .any(|&(f, t, m)| (f, t) == (from, to) && matches!(m, Msg::OutOfSync { len: 0, .. }))
}

/// Rule 3's liveness (`send_deferred_lists` in `peer_down`): a list waiting for the
/// settling Primary's goes as soon as that Primary is lost, its list never come. (Node 1's
/// claim on block 9 then stands and is listed; met again, the Primary settles it.)
#[test]
fn a_waiting_list_goes_when_the_settling_primary_is_lost() {
    let mut net = claims_from_a_failed_write();
    net.hold_at(0, 1, |m| matches!(m, Msg::OutOfSync { .. }));
    net.link_up(0, 1);
    net.link_up(1, 2);
    assert!(list_ended(&net, 2, 1));
    assert!(!list_ended(&net, 1, 2), "node 1's list waits");
    net.link_down(0, 1);
    assert!(list_ended(&net, 1, 2), "sent at the Primary's loss");
    assert_eq!(net.listed(1, 2), vec![9, 30], "no Primary said otherwise");
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.assert_converges();
    assert_eq!(net.block(2, 30)[0], 1);
}

/// Rule 3's liveness (`send_deferred_lists` at a peer's role change): the settling Primary
/// demotes before its list to node 1 (which waits for node 1's state) is sent; node 1's
/// waiting list goes at the demotion. Node 1 cannot be promoted itself while its list
/// waits: a peer is Primary (so `send_deferred_lists`, which does nothing on a Primary,
/// never strands a list).
#[test]
fn a_waiting_list_goes_when_the_settling_primary_demotes() {
    let mut net = claims_from_a_failed_write();
    net.hold(1, 0);
    net.link_up(0, 1);
    assert!(net.settled_by_run(1), "node 1 heard the Primary's role");
    net.link_up(1, 2);
    assert!(list_ended(&net, 2, 1));
    assert!(!list_ended(&net, 1, 2), "node 1's list waits");
    let mut out = Vec::new();
    assert_eq!(
        net.nodes[1].res.promote(false, &mut out),
        Err(PromoteError::PeerPrimary(0))
    );
    assert_eq!(
        net.nodes[1].res.promote(true, &mut out),
        Err(PromoteError::PeerPrimary(0))
    );
    net.nodes[0].res.demote(&mut out).unwrap();
    net.push(0, out, Inputs::default());
    net.run();
    assert_eq!(net.nodes[1].res.peer_primary(), None);
    assert!(list_ended(&net, 1, 2), "sent at the Primary's demotion");
    assert_eq!(net.nodes[1].res.role(), Role::Secondary);
}

/// Found writing these tests (not fixed; on wip/anaO and before it): as in
/// `claims_from_a_failed_write`, but node 1's receipt of the failed write reaches the
/// Primary before the crash, and node 1 is back with the Primary before node 2. The
/// Primary marked node 2 (away) as lacking the write a replica may hold, then, node 1 back
/// from a crash, settles the write against node 1 too: block 9 is marked on both replicas,
/// neither holds a version the other may pull, and they never converge.
#[test]
#[ignore = "engine gap: a failed write marked on both replicas (see the doc comment)"]
fn a_failed_write_whose_crashed_holder_returns_first_is_not_marked_on_both_replicas() {
    let mut net = claims_from_a_failed_write_ack(false, true);
    net.link_up(0, 1);
    net.link_up(0, 2);
    net.link_up(1, 2);
    // The Primary lists block 9 to both: no source left.
    assert_eq!(net.listed(0, 1), vec![9]);
    net.assert_converges();
}

/// Found writing these tests (not fixed; on wip/anaO and before it): as in
/// `claims_from_a_failed_write` without the write to block 30. Node 2, away from the
/// Primary, meets node 1 first: node 1's generation ids are newer (the Primary's, from
/// before node 2 left), and node 2 goes Outdated (`OlderThan`). The diskless Primary
/// lists it nothing, but proves it neither (no up-to-date diskful peer; node 1, back from
/// a crash, is unproven), and node 1, Inconsistent, lacks block 9 that only node 2 holds:
/// never converged.
#[test]
#[ignore = "engine gap: an Outdated replica a diskless Primary listed nothing is never proven"]
fn a_replica_outdated_by_a_crashed_peer_is_proven_by_the_diskless_primarys_empty_list() {
    let mut net = claims_from_a_failed_write_ack(true, false);
    net.link_up(0, 1);
    net.link_up(1, 2);
    net.link_up(0, 2);
    assert_eq!(net.listed(0, 2), Vec::<u64>::new());
    net.assert_converges();
}
