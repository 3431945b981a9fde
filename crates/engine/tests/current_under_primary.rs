//! Rules for a replica that is current under a connected Primary (`current_under_primary`:
//! a diskful Secondary, UpToDate, whose Primary's list to it ended): it holds every write
//! that Primary completed, whatever its generation ids say against a peer's. Rule Y: it
//! keeps its claims on a peer whose ids are newer (cluster-crash soak seed 201015450).
//! Rule R: a behind peer with older ids that lists claims on it gets them back as its own
//! to pull (disk-errors soak seed 193051170). A diskless Primary (node 0) and two
//! Secondaries over an in-memory network whose disks answer at once and keep their bytes;
//! a direction of a link can be held (its packets wait, in order) to make packets cross.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use tandem_engine::replica::{
    DataRef, DiskChange, DiskState, Event, GenIds, Msg, NodeId, Protocol, RAction, ReplicaAtStart,
    Resource, ResourceSpec, Token, GI_HISTORY,
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
    /// Events the nodes reported: (node, event).
    events: Vec<(NodeId, Event)>,
    now: u64,
}

impl Net {
    /// Node 0 diskless, nodes 1 and 2 keeping the replicas `found` with generation ids
    /// `gens`; no link up, no Primary.
    fn bare(found: [ReplicaAtStart; 2], gens: [GenIds; 2]) -> Net {
        let nodes = (0..3)
            .map(|me| {
                let at = if me == 0 {
                    ReplicaAtStart::None
                } else {
                    found[me as usize - 1]
                };
                let mut res = Resource::new(spec(me), vec![at]);
                if me > 0 {
                    res.restore_generation(0, gens[me as usize - 1], false)
                        .unwrap();
                }
                Node {
                    res,
                    disk: vec![0; SIZE as usize],
                    held: HashMap::new(),
                }
            })
            .collect();
        Net {
            nodes,
            links: Default::default(),
            queue: VecDeque::new(),
            sent: Vec::new(),
            dropped: Vec::new(),
            completed: HashMap::new(),
            events: Vec::new(),
            now: 0,
        }
    }

    /// Node 0, diskless, becomes Primary.
    fn promote(&mut self) {
        let mut out = Vec::new();
        self.nodes[0].res.promote(false, &mut out).unwrap();
        self.push(0, out, Inputs::default());
        self.run();
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

    /// The packets waiting from `from` to `to` arrive, in order (before any sent in
    /// answer to them), and the link flows again.
    fn release(&mut self, from: NodeId, to: NodeId) {
        let l = self.link(from, to);
        l.hold = false;
        l.hold_at = None;
        let conn = l.conn;
        let waiting = std::mem::take(&mut l.waiting);
        for (msg, data) in waiting {
            let job = Job::Send {
                to,
                conn,
                msg,
                data,
            };
            self.queue.push_back((from, job));
        }
        self.run();
    }

    /// The first packet waiting from `from` to `to` arrives; the rest still wait.
    fn release_one(&mut self, from: NodeId, to: NodeId) -> Msg {
        let (msg, data) = self.link(from, to).waiting.pop_front().expect("a packet");
        self.deliver(from, to, msg, &data);
        self.run();
        msg
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

fn gen(current: u64, history: &[u64]) -> GenIds {
    let mut h = [0; GI_HISTORY];
    h[..history.len()].copy_from_slice(history);
    GenIds {
        current,
        history: h,
    }
}

impl Net {
    fn disk(&self, n: NodeId) -> DiskState {
        self.nodes[n as usize].res.disk(0)
    }

    /// Node `n`, every link of it down, stops cleanly and starts again from what its
    /// metadata kept: consistent, what it knew each peer lacks, its generation ids.
    fn restart_cleanly(&mut self, n: NodeId) {
        let res = &self.nodes[n as usize].res;
        let kept = res.persisted(0).expect("quiet");
        assert!(kept.consistent);
        let claims: Vec<(NodeId, Vec<u64>, bool)> = (kept.peers.iter())
            .map(|p| (p.node, p.out_of_sync.words().to_vec(), p.wrote_apart))
            .collect();
        let gen = *res.generation(0).expect("a replica");
        let mut res = Resource::new(spec(n), vec![ReplicaAtStart::Consistent]);
        for (peer, words, apart) in claims {
            res.restore_peer(0, peer, &words, apart).unwrap();
        }
        res.restore_generation(0, gen, false).unwrap();
        self.nodes[n as usize].res = res;
    }

    /// Disk changes node `n` reported, in order.
    fn disk_changes(&self, n: NodeId) -> Vec<(DiskState, DiskChange)> {
        (self.events.iter())
            .filter_map(|(at, e)| match e {
                Event::DiskChanged { to, why, .. } if *at == n => Some((*to, why.clone())),
                _ => None,
            })
            .collect()
    }
}

// ------------------------------------------------------------------------- rule Y

/// Node 1 won the contest after a cluster crash (newer ids, 6 over 5); node 2 was synced
/// from it with no Primary around and kept its older ids: the same data, ids 5 < 6. The
/// diskless Primary is promoted with only node 2 connected.
fn contest_winner_away_from_the_primary() -> Net {
    let found = [ReplicaAtStart::UpToDate, ReplicaAtStart::UpToDate];
    let mut net = Net::bare(found, [gen(6, &[5]), gen(5, &[])]);
    net.link_up(0, 2);
    net.promote();
    assert_eq!(net.disk(2), DiskState::UpToDate);
    net
}

/// Cluster-crash + power-loss soak seed 201015450 (rule Y), met at a connection: a write
/// reaches node 2 alone (links 0-1 and 1-2 down) and node 2 marks node 1; its answer is
/// still on the wire, so the Primary has not rotated the ids yet. Node 1 then connects
/// to node 2 and says UpToDate with newer ids. Node 2, current under the Primary, holds
/// the write: it keeps its claim and node 1 pulls the block from it. (Yielded, node 2 pulled
/// the block back from node 1, which never had the write: the acknowledged write was gone
/// from both replicas.)
#[test]
fn a_replica_current_under_the_primary_keeps_its_claim_on_a_connecting_peer_with_newer_ids() {
    let mut net = contest_winner_away_from_the_primary();
    net.hold(2, 0);
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.block(2, 5)[0], 1, "node 2 wrote it");
    assert_eq!(net.claims(2, 1), BLOCK, "node 2 marks node 1");
    assert_eq!(net.result(1), None, "node 2's answer is on the wire");
    net.link_up(1, 2);
    assert_eq!(
        net.block(2, 5)[0],
        1,
        "node 2 keeps the write: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(net.disk(2), DiskState::UpToDate);
    assert_eq!(net.listed(2, 1), vec![5], "and lists it to node 1");
    assert_eq!(net.pulled(1, 2), vec![5]);
    assert_eq!(net.pulled(2, 1), Vec::<u64>::new(), "node 2 pulls nothing");
    assert_eq!(net.block(1, 5)[0], 1, "node 1 has the write");
    net.release(2, 0);
    assert_eq!(net.result(1), Some(Ok(())));
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(2, 5)[0], 1, "the acknowledged write is kept");
}

/// Cluster-crash + power-loss soak seed 201015450 (rule Y), as the seed met it: node 1,
/// connected to node 2 but not to the Primary, is being synced from node 2 (a write it
/// missed, block 5) when a second write (block 8) reaches node 2 alone; node 2's live
/// notice of it to node 1 crosses node 1's UpToDate report (newer ids: node 1 is under no
/// Primary, so it keeps its own). Both answers of node 2 are still on the wire: no
/// rotation yet. Node 2 keeps its claims; node 1 hears the notice and pulls block 8 from
/// node 2. (Yielded, node 2 went Inconsistent and asked node 1 for block 8, the
/// acknowledged write it alone held; node 1, told of it, lacked it too, and each waited
/// for the other.)
#[test]
fn a_replica_current_under_the_primary_keeps_its_claims_across_a_crossing_report_with_newer_ids() {
    let mut net = contest_winner_away_from_the_primary();
    net.link_up(1, 2);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    // Node 2's answers to the Primary wait: the Primary rotates no ids meanwhile.
    net.hold(2, 0);
    // Node 1's resync of block 5 from node 2 ends only when its last reply arrives.
    net.hold_at(2, 1, |m| matches!(m, Msg::ResyncReply { .. }));
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.disk(1), DiskState::Inconsistent, "told live of block 5");
    assert_eq!(net.pulled(1, 2), vec![5]);
    net.write(2, 8 * BLOCK, 4096);
    assert_eq!(net.block(2, 8)[0], 2);
    assert_eq!(net.claims(2, 1), BLOCK, "block 8 (block 5 is being served)");
    // Node 1 gets block 5 and says UpToDate before it hears of block 8: its report
    // crosses node 2's notice, which waits on the wire behind the reply.
    assert!(matches!(
        net.release_one(2, 1),
        Msg::ResyncReply { offset: 20480, .. }
    ));
    assert!(
        (net.links[2][1].waiting.iter()).any(|(m, _)| matches!(
            m,
            Msg::OutOfSync {
                offset: 32768,
                len: 4096,
                ..
            }
        )),
        "the notice of block 8 is on its way"
    );
    assert_eq!(net.disk(1), DiskState::UpToDate, "node 1's report is out");
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "node 2 keeps the writes: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(net.pulled(2, 1), Vec::<u64>::new(), "node 2 pulls nothing");
    // (Its claim on block 8 goes with the report, which followed its complete list: a
    // Secondary keeps no blocks told live across it; node 1 hears of block 8 next.)
    assert_eq!(net.claims(2, 1), 0);
    net.release(2, 1);
    assert_eq!(net.pulled(1, 2), vec![5, 8]);
    assert_eq!(net.block(1, 8)[0], 2);
    net.release(2, 0);
    assert_eq!(net.result(1), Some(Ok(())));
    assert_eq!(net.result(2), Some(Ok(())));
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(2, 8)[0], 2, "the acknowledged write is kept");
}

// ------------------------------------------------------------------------- rule R

/// Disk-errors soak seed 193051170 (rule R). Node 2 missed a write (block 5) away from
/// both others; back, the Primary lists it and node 1 serves it, and node 2, UpToDate,
/// takes the Primary's ids. Its UpToDate report to node 1 is still on the wire when node 1
/// stops cleanly: node 1's metadata keeps the served block as a claim on node 2. The
/// Primary, losing node 1, rotates its ids; node 2 hears of it only after it has said its
/// old ids (equal to node 1's) to the returning node 1, so node 1 lists its stale claim.
/// Node 2, current under the Primary and with newer ids by then, marks node 1 for the
/// block instead of becoming a sync target of node 1 (which, having heard node 2's new
/// ids, pulls the block from node 2: each refused the other for ever).
#[test]
fn a_replica_current_under_the_primary_gives_a_behind_peers_stale_list_back_as_its_own_to_pull() {
    let found = [ReplicaAtStart::UpToDate, ReplicaAtStart::UpToDate];
    let mut net = Net::bare(found, [gen(0, &[]); 2]);
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        net.link_up(a, b);
    }
    net.promote();
    // Node 2 misses block 5 away from both.
    net.link_down(0, 2);
    net.link_down(1, 2);
    net.write(1, 5 * BLOCK, 4096);
    assert_eq!(net.result(1), Some(Ok(())));
    net.link_up(0, 2);
    assert_eq!(net.disk(2), DiskState::Inconsistent);
    // Node 1 serves it; node 2's UpToDate report to node 1 stays on the wire.
    net.hold_at(2, 1, |m| {
        matches!(
            m,
            Msg::Volume {
                disk: DiskState::UpToDate,
                ..
            }
        )
    });
    net.link_up(1, 2);
    assert_eq!(net.pulled(2, 1), vec![5]);
    assert_eq!(net.disk(2), DiskState::UpToDate);
    let ids = *net.nodes[2].res.generation(0).unwrap();
    assert_eq!(
        &ids,
        net.nodes[1].res.generation(0).unwrap(),
        "the same ids"
    );
    // Node 1 stops cleanly; the Primary's rotation for its loss is on its way to node 2.
    net.hold(0, 2);
    net.link_down(0, 1);
    net.link_down(1, 2);
    assert_eq!(
        net.claims(1, 2),
        BLOCK,
        "the block it served, kept as a claim"
    );
    net.restart_cleanly(1);
    assert_eq!(net.disk(1), DiskState::Outdated);
    // Node 2 says its old ids to node 1; node 1's answers (its state, its list) wait.
    net.hold(1, 2);
    net.link_up(1, 2);
    assert!(
        (net.links[1][2].waiting.iter()).any(|(m, _)| matches!(
            m,
            Msg::OutOfSync {
                offset: 20480,
                len: 4096,
                ..
            }
        )),
        "node 1 lists its stale claim"
    );
    // Node 2 takes the new ids; node 1, hearing them, pulls the block from node 2.
    net.release(0, 2);
    let newer = *net.nodes[2].res.generation(0).unwrap();
    assert_ne!(newer, ids);
    assert_eq!(net.disk(1), DiskState::Inconsistent);
    // Node 1's list reaches node 2.
    net.release(1, 2);
    assert_eq!(
        net.disk(2),
        DiskState::UpToDate,
        "not a sync target of node 1: {:?}",
        net.disk_changes(2)
    );
    assert_eq!(net.pulled(2, 1), vec![5], "only the first resync");
    assert_eq!(
        net.listed(2, 1),
        vec![5],
        "it tells node 1 it lacks the block"
    );
    assert_eq!(net.pulled(1, 2), vec![5]);
    assert_eq!(net.disk(1), DiskState::UpToDate);
    net.link_up(0, 1);
    net.assert_converges();
    assert_eq!(net.block(1, 5)[0], 1);
    assert_eq!(
        net.nodes[1].res.generation(0),
        Some(&newer),
        "the Primary's ids, under it"
    );
}
