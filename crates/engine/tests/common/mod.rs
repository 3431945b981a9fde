//! The in-memory network of three nodes that the peer-ack, crossing and failed-write tests
//! drive through the engine's public API. A driver's duties are done here as a real one
//! does them, so that what a test sees is the engine's choice: every disk answers at once
//! and keeps its bytes (a payload is copied when its action is queued), and a packet queued
//! on a connection since dropped is never delivered. A test picks the order of events by
//! holding one direction of a link (its packets wait, in order, as on a slow link) and by
//! dropping packets; that is how the simulator's seeds are rebuilt. A node's disk can be
//! held too (its writes have not landed when it crashes), and a node can stop cleanly or
//! crash and start again from what its metadata kept, as the daemon restarts it.

// Each test crate compiles its own copy of this module and uses only part of it.
#![allow(dead_code)]

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use tandem_engine::replica::{
    AfterSplitBrain, AutoPromote, DataRef, DiskChange, DiskState, Event, GenIds, IdsAtCrash, Msg,
    NodeId, OnNoQuorum, PrimaryRun, PromoteError, Protocol, QuorumSpec, RAction, ReplicaAtStart,
    Resource, ResourceSpec, Token, Unresolved, Votes, GI_HISTORY,
};
use tandem_engine::{DiskKind, Io, IoError, ReqId};
use tandem_wire::packet::{AllocExtent, MAX_ALLOC_EXTENTS};

pub const SIZE: u64 = 1 << 20;
pub const BLOCK: u64 = 4096;

/// A node's disk and what its engine asked to keep: the bytes a `DataRef` names must be
/// found when the action naming them is queued, as a driver finds them.
struct Store {
    disk: Vec<u8>,
    /// Bytes the engine asked to keep ([`RAction::Retain`]).
    kept: HashMap<Token, Vec<u8>>,
    /// Disk requests wait in `parked` instead of being done (see `Net::hold_disk`).
    held: bool,
    parked: VecDeque<Job>,
    /// Starts of its engine: each has its own incarnation and draws other generation ids.
    incarnation: u64,
}

impl Store {
    fn new() -> Store {
        Store {
            disk: vec![0; SIZE as usize],
            kept: HashMap::new(),
            held: false,
            parked: VecDeque::new(),
            incarnation: 0,
        }
    }
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

pub struct Net {
    pub nodes: Vec<Resource>,
    stores: Vec<Store>,
    links: [[Link; 3]; 3],
    queue: VecDeque<(NodeId, Job)>,
    /// A filter on packets: `false` drops it (the link loses it).
    pub pass: fn(NodeId, NodeId, &Msg) -> bool,
    /// Packets delivered: (from, to, message).
    pub sent: Vec<(NodeId, NodeId, Msg)>,
    /// `Settled` actions: (node, peer, upto).
    pub settled: Vec<(NodeId, NodeId, u64)>,
    /// Connections a node dropped: (node, peer).
    pub dropped: Vec<(NodeId, NodeId)>,
    /// Application completions: (node, request, result).
    pub done: Vec<(NodeId, ReqId, Result<(), IoError>)>,
    /// The bytes of completions that named some (a read's, a block status's map):
    /// (node, request, bytes).
    pub done_data: Vec<(NodeId, ReqId, Vec<u8>)>,
    pub events: Vec<(NodeId, Event)>,
    /// Per entry of `done`: how many `events` came before it (an event's order against
    /// the completions, which a driver keeps).
    pub done_after: Vec<usize>,
    /// Split brains left unresolved (`RAction::SplitBrain`): (node, peer, why). The link
    /// is cut, as a driver stops the connection.
    pub split_brains: Vec<(NodeId, NodeId, Unresolved)>,
    diskless_primary: bool,
    protocol: Protocol,
    quorum: QuorumSpec,
    /// The after-split-brain policies every node runs with.
    pub after_sb: AfterSplitBrain,
    now: u64,
    /// Nodes stopped (SIGSTOP): `tick` skips them, their links hold (see `freeze`).
    frozen: [bool; 3],
}

impl Net {
    /// Node 0 Primary, every replica up to date, every link up.
    pub fn new() -> Net {
        Net::start(false, Protocol::C)
    }

    /// As `new`, but node 0 has no replica: its writes stand on the Secondaries alone,
    /// which is where a failed write leaves no copy the Primary can vouch for.
    pub fn diskless_primary() -> Net {
        Net::start(true, Protocol::C)
    }

    /// As `diskless_primary`, under replication protocol `protocol`: under A or B a write
    /// a Secondary received (`RecvAck`) may be on it though it never said it wrote it.
    pub fn diskless_primary_under(protocol: Protocol) -> Net {
        Net::start(true, protocol)
    }

    /// As `new` (or `diskless_primary`), with quorum settings `quorum`.
    pub fn with_quorum(diskless_primary: bool, quorum: QuorumSpec) -> Net {
        Net::start_with(diskless_primary, Protocol::C, quorum)
    }

    fn start(diskless_primary: bool, protocol: Protocol) -> Net {
        Net::start_with(diskless_primary, protocol, QuorumSpec::OFF)
    }

    fn start_with(diskless_primary: bool, protocol: Protocol, quorum: QuorumSpec) -> Net {
        let mut net = Net::stopped(diskless_primary, protocol, quorum, |_| {
            ReplicaAtStart::UpToDate
        });
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            net.link_up(a, b);
        }
        net.promote();
        net
    }

    /// Node 0 diskless, nodes 1 and 2 keeping the replicas `found` with generation ids
    /// `gens`: no link up and no Primary yet (see `promote`), as after a cluster crash.
    pub fn diskless_primary_with(found: [ReplicaAtStart; 2], gens: [GenIds; 2]) -> Net {
        let mut net = Net::stopped(true, Protocol::C, QuorumSpec::OFF, |me| {
            found[me as usize - 1]
        });
        for n in [1, 2] {
            net.nodes[n]
                .restore_generation(0, gens[n - 1], false)
                .unwrap();
        }
        net
    }

    /// Nodes 0 and 1 configured without node 2 (node 0 Primary, both up to date, linked),
    /// and node 2 started with the replica `found`, configured with all three, no link
    /// up: as before `tandem adjust` adds node 2 to nodes 0 and 1 (`Resource::add_peer`).
    pub fn pair_and_a_newcomer(quorum: QuorumSpec, found: ReplicaAtStart) -> Net {
        let mut net = Net::stopped(false, Protocol::C, quorum, |me| {
            if me == 2 {
                found
            } else {
                ReplicaAtStart::UpToDate
            }
        });
        for me in [0, 1] {
            let mut s = spec(me, false, Protocol::C, quorum, 0);
            s.nodes.retain(|&(id, _)| id != 2);
            net.nodes[me as usize] = Resource::new(s, vec![ReplicaAtStart::UpToDate]);
        }
        net.link_up(0, 1);
        net.promote();
        net
    }

    /// Every node started, a diskful one with the replica `found(me)`; no link up.
    fn stopped(
        diskless_primary: bool,
        protocol: Protocol,
        quorum: QuorumSpec,
        found: impl Fn(NodeId) -> ReplicaAtStart,
    ) -> Net {
        let nodes = (0..3)
            .map(|me| {
                let at = if me == 0 && diskless_primary {
                    ReplicaAtStart::None
                } else {
                    found(me)
                };
                Resource::new(spec(me, diskless_primary, protocol, quorum, 0), vec![at])
            })
            .collect();
        Net {
            nodes,
            stores: (0..3).map(|_| Store::new()).collect(),
            links: Default::default(),
            queue: VecDeque::new(),
            pass: |_, _, _| true,
            sent: Vec::new(),
            settled: Vec::new(),
            dropped: Vec::new(),
            done: Vec::new(),
            done_data: Vec::new(),
            events: Vec::new(),
            done_after: Vec::new(),
            split_brains: Vec::new(),
            diskless_primary,
            protocol,
            quorum,
            after_sb: AfterSplitBrain::default(),
            now: 0,
            frozen: [false; 3],
        }
    }

    /// Node 0 becomes Primary.
    pub fn promote(&mut self) {
        self.promote_on(0).unwrap();
    }

    /// Node `n` is asked to become Primary (not forced); the network runs after.
    pub fn promote_on(&mut self, n: NodeId) -> Result<(), PromoteError> {
        let mut out = Vec::new();
        let r = self.nodes[n as usize].promote(false, &mut out);
        self.push(n, out);
        self.run();
        r
    }

    /// Node `n` becomes Secondary; the network runs after.
    pub fn demote_on(&mut self, n: NodeId) {
        let mut out = Vec::new();
        self.nodes[n as usize].demote(&mut out).unwrap();
        self.push(n, out);
        self.run();
    }

    /// An application client attaches to node `n` (auto-promote); the network runs after.
    pub fn attach_on(&mut self, n: NodeId) -> AutoPromote {
        let mut out = Vec::new();
        let r = self.nodes[n as usize].client_attached(&mut out);
        self.push(n, out);
        self.run();
        r
    }

    /// An application client leaves node `n` (auto-demote); the network runs after.
    pub fn detach_on(&mut self, n: NodeId) {
        let mut out = Vec::new();
        self.nodes[n as usize].client_detached(&mut out);
        self.push(n, out);
        self.run();
    }

    /// Every node runs with the after-split-brain policies `p` from now on.
    pub fn set_after_sb(&mut self, p: AfterSplitBrain) {
        self.after_sb = p;
        for n in &mut self.nodes {
            n.set_after_split_brain(p);
        }
    }

    /// Node `me`'s spec in this network, to restart it with.
    pub fn spec(&self, me: NodeId) -> ResourceSpec {
        let incarnation = self.stores[me as usize].incarnation;
        ResourceSpec {
            after_sb: self.after_sb,
            ..spec(
                me,
                self.diskless_primary,
                self.protocol,
                self.quorum,
                incarnation,
            )
        }
    }

    fn link(&mut self, from: NodeId, to: NodeId) -> &mut Link {
        &mut self.links[from as usize][to as usize]
    }

    pub fn link_up(&mut self, a: NodeId, b: NodeId) {
        for (x, y) in [(a, b), (b, a)] {
            let l = self.link(x, y);
            l.up = true;
            l.conn += 1;
        }
        for (x, y) in [(a, b), (b, a)] {
            let mut out = Vec::new();
            self.nodes[x as usize].peer_up(y, &mut out);
            self.queue_actions(x, out, Inputs::default());
        }
        self.run();
    }

    /// The link drops, both nodes see it, and what they do about it is done.
    pub fn link_down(&mut self, a: NodeId, b: NodeId) {
        self.link_lost(a, b);
        self.run();
    }

    /// The link drops and both nodes see it; what they do waits for `run`, or is handled
    /// along with the next step's actions, as when drops and writes come at one moment.
    pub fn link_lost(&mut self, a: NodeId, b: NodeId) {
        self.cut(a, b);
        self.notice_down(a, b);
        self.notice_down(b, a);
    }

    /// The link carries nothing more, its waiting packets lost, before either node knows:
    /// a node that died, or one side that sees the drop before the other.
    pub fn cut(&mut self, a: NodeId, b: NodeId) {
        for (x, y) in [(a, b), (b, a)] {
            let l = self.link(x, y);
            l.up = false;
            l.hold = false;
            l.hold_at = None;
            l.waiting.clear();
        }
    }

    /// Node `n` sees its link to `peer` drop; what it does waits for `run`, so that
    /// several nodes can see drops at the same moment.
    pub fn notice_down(&mut self, n: NodeId, peer: NodeId) {
        let mut out = Vec::new();
        self.nodes[n as usize].peer_down(peer, &mut out);
        self.queue_actions(n, out, Inputs::default());
    }

    /// Packets from `from` to `to` wait (in order) until `release`.
    pub fn hold(&mut self, from: NodeId, to: NodeId) {
        self.link(from, to).hold = true;
    }

    /// Packets from `from` to `to` wait from the first one `at` picks out: the packet to
    /// stop at may not exist yet when the test can still act.
    pub fn hold_at(&mut self, from: NodeId, to: NodeId, at: fn(&Msg) -> bool) {
        self.link(from, to).hold_at = Some(at);
    }

    /// The packets waiting from `from` to `to` arrive together, in order, before anything
    /// they cause: a stalled link that flows again delivers its backlog at once.
    pub fn release(&mut self, from: NodeId, to: NodeId) {
        let l = self.link(from, to);
        l.hold = false;
        l.hold_at = None;
        let conn = l.conn;
        for (msg, data) in std::mem::take(&mut l.waiting) {
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

    /// The packets waiting from `from` to `to` arrive one at a time, each handled to the
    /// end (what it causes on the other links and disks is done) before the next: the
    /// order in which the failed-write seeds met them. What they cause on this direction
    /// waits behind the rest, as on a connection, where nothing overtakes.
    pub fn release_stepwise(&mut self, from: NodeId, to: NodeId) {
        while !self.link(from, to).waiting.is_empty() {
            self.release_one(from, to);
        }
        let l = self.link(from, to);
        l.hold = false;
        l.hold_at = None;
    }

    /// The first packet waiting from `from` to `to` arrives and what it causes is done;
    /// the rest still wait, and what is sent on the link meanwhile waits behind them.
    pub fn release_one(&mut self, from: NodeId, to: NodeId) -> Msg {
        let (msg, data) = self.link(from, to).waiting.pop_front().expect("a packet");
        self.deliver(from, to, msg, &data);
        self.run();
        msg
    }

    /// Packets waiting from `from` to `to`: a test checks what will land, and in which
    /// order, before it lets them.
    pub fn in_flight(&self, from: NodeId, to: NodeId) -> Vec<Msg> {
        let l = &self.links[from as usize][to as usize];
        l.waiting.iter().map(|&(m, _)| m).collect()
    }

    /// Node `n`'s disk requests wait: what it is sent has not landed yet.
    pub fn hold_disk(&mut self, n: NodeId) {
        self.stores[n as usize].held = true;
    }

    /// Node `n`'s held disk requests (see `hold_disk`) land, in order, and its disk
    /// answers at once again.
    pub fn release_disk(&mut self, n: NodeId) {
        let store = &mut self.stores[n as usize];
        store.held = false;
        for job in std::mem::take(&mut store.parked) {
            self.queue.push_back((n, job));
        }
        self.run();
    }

    /// The kinds of node `n`'s held disk requests, in order.
    pub fn parked(&self, n: NodeId) -> Vec<DiskKind> {
        (self.stores[n as usize].parked.iter())
            .filter_map(|j| match j {
                Job::Disk { kind, .. } => Some(*kind),
                Job::Send { .. } => None,
            })
            .collect()
    }

    /// Node `n`'s held disk requests (see `hold_disk`) fail with EIO, in order, and its
    /// disk answers again: a disk that fails the writes it was given (its engine detaches
    /// the replica at the first error).
    pub fn fail_held_disk(&mut self, n: NodeId) {
        let store = &mut self.stores[n as usize];
        store.held = false;
        for job in std::mem::take(&mut store.parked) {
            let Job::Disk {
                volume,
                token,
                kind,
                ..
            } = job
            else {
                continue;
            };
            let mut out = Vec::new();
            let eio = Err(IoError::Os(5));
            self.nodes[n as usize].disk_done(volume, token, kind, eio, &mut out);
            self.queue_actions(n, out, Inputs::default());
        }
        self.run();
    }

    /// Node `n`, every link of it down, stops cleanly and starts again from what its
    /// metadata kept: consistent, what it knew each peer lacks, its generation ids.
    pub fn restart_cleanly(&mut self, n: NodeId) {
        self.restart_from_clean_stop(n, true);
    }

    /// Node `n`, every link of it down, stops cleanly with its replica `consistent` or
    /// not, and starts again from what its metadata kept (`Consistent` or `Inconsistent`).
    fn restart_from_clean_stop(&mut self, n: NodeId, consistent: bool) {
        let res = &self.nodes[n as usize];
        let kept = res.persisted(0).expect("quiet");
        assert_eq!(kept.consistent, consistent, "node {n}");
        let claims: Vec<(NodeId, Vec<u64>, bool, Option<u64>)> = (kept.peers.iter())
            .map(|p| {
                (
                    p.node,
                    p.out_of_sync.words().to_vec(),
                    p.wrote_apart,
                    p.bitmap_gi,
                )
            })
            .collect();
        let gen = *res.generation(0).expect("a replica");
        let store = &mut self.stores[n as usize];
        store.parked.clear();
        store.kept.clear();
        store.held = false;
        let found = ReplicaAtStart::after_clean_stop(consistent);
        let mut res = self.restarted(n, found);
        for (peer, words, apart, gi) in claims {
            res.restore_peer(0, peer, &words, apart, gi).unwrap();
        }
        res.restore_generation(0, gen, false).unwrap();
        self.nodes[n as usize] = res;
    }

    /// A power loss took back what node `n` wrote to block `b` since its last fdatasync,
    /// which the test knows found it zero: this disk keeps every write otherwise.
    pub fn lose_block(&mut self, n: NodeId, b: u64) {
        let disk = &mut self.stores[n as usize].disk;
        disk[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].fill(0);
    }

    /// Node `n`'s engine dies (kill -9; the page cache keeps what landed) and starts again
    /// `Crashed`, as `tandem node` starts it: its activity log's extents `log` are suspect,
    /// the Primary run it took writes from is restored, each peer's bitmap is what it held
    /// at the crash plus the log's extents, and its generation ids are kept.
    pub fn crash(&mut self, n: NodeId, log: &[(u64, u64)]) {
        self.crash_as(n, log, true);
    }

    /// As `crash`, but the whole machine lost power (another boot): the Primary run it
    /// took writes from is not restored (the page cache did not keep its writes), so no
    /// run settles its crash. The test takes back the blocks lost (`lose_block`).
    pub fn lose_power(&mut self, n: NodeId, log: &[(u64, u64)]) {
        self.crash_as(n, log, false);
    }

    fn crash_as(&mut self, n: NodeId, log: &[(u64, u64)], same_boot: bool) {
        // As the daemon's metadata keeps them (see `Resource::ids_at_crash`).
        let ids = self.nodes[n as usize].ids_at_crash(0).expect("a replica");
        let writer = self.nodes[n as usize].writer().filter(|_| same_boot);
        // The bitmaps' ids as the metadata kept them (before the links drop: a crashed
        // engine hears of no drop).
        let gis: Vec<Option<u64>> = (0..3)
            .map(|p| self.nodes[n as usize].bitmap_gi(0, p))
            .collect();
        assert!(self.nodes[n as usize].consistent(0), "node {n}");
        for p in (0..3).filter(|&p| p != n) {
            self.link_down(n, p);
        }
        let peers: Vec<NodeId> = (0..3)
            .filter(|&p| p != n && (p != 0 || !self.diskless_primary))
            .collect();
        let kept: Vec<(NodeId, Vec<u64>, Option<u64>)> = peers
            .iter()
            .map(|&p| {
                let mut words = self.nodes[n as usize]
                    .out_of_sync_words(0, p)
                    .expect("a peer")
                    .to_vec();
                for &(offset, len) in log {
                    for b in offset / BLOCK..(offset + len).div_ceil(BLOCK) {
                        words[(b / 64) as usize] |= 1 << (b % 64);
                    }
                }
                (p, words, gis[p as usize])
            })
            .collect();
        self.start_crashed(n, log, writer, &kept, ids);
        if !same_boot {
            self.nodes[n as usize].restore_lost_power(0).unwrap();
        }
    }

    /// Node `n`'s engine started again `Crashed` from what its metadata kept: the
    /// activity log's extents `log`, the Primary run it took writes from, each peer's
    /// bitmap words, its generation ids (as `tandem node` restores them). Its links are
    /// left as they are.
    pub fn start_crashed(
        &mut self,
        n: NodeId,
        log: &[(u64, u64)],
        writer: Option<PrimaryRun>,
        kept: &[(NodeId, Vec<u64>, Option<u64>)],
        ids: impl Into<IdsAtCrash>,
    ) {
        let store = &mut self.stores[n as usize];
        store.parked.clear();
        store.kept.clear();
        store.held = false;
        let mut res = self.restarted(n, ReplicaAtStart::Crashed);
        res.restore_suspect(0, log.iter().copied()).unwrap();
        if let Some(run) = writer {
            res.restore_writer(0, run).unwrap();
        }
        for (p, words, gi) in kept {
            res.restore_peer(0, *p, words, false, *gi).unwrap();
        }
        res.restore_ids(0, ids.into(), false).unwrap();
        self.nodes[n as usize] = res;
    }

    /// Node `n`, every link of it down, stops cleanly while its replica is not consistent
    /// (being synced) and starts again `Inconsistent`, as `tandem node` starts it: of
    /// unknown currency, but with what it knew each peer lacks, and its generation ids.
    pub fn restart_cleanly_inconsistent(&mut self, n: NodeId) {
        self.restart_from_clean_stop(n, false);
    }

    /// Node `n`'s engine, every link of it down, started again with a replica of unknown
    /// currency (`Existing`: found without metadata), its generation ids kept.
    pub fn start_unproven(&mut self, n: NodeId) {
        let gen = *self.nodes[n as usize].generation(0).expect("a replica");
        let mut res = self.restarted(n, ReplicaAtStart::Existing);
        res.restore_generation(0, gen, false).unwrap();
        self.nodes[n as usize] = res;
    }

    /// Node `n`'s engine started again (a new incarnation) with the replica `found`, its
    /// metadata not restored yet.
    fn restarted(&mut self, n: NodeId, found: ReplicaAtStart) -> Resource {
        self.stores[n as usize].incarnation += 1;
        Resource::new(self.spec(n), vec![found])
    }

    fn resolve(&self, n: NodeId, d: DataRef, inputs: &Inputs<'_>) -> Vec<u8> {
        let kept = &self.stores[n as usize].kept;
        match d {
            DataRef::Request(req) => match inputs.payload {
                Some((id, p)) if id == req => p.to_vec(),
                _ => kept[&Token::App(req)].clone(),
            },
            DataRef::Incoming { at } => inputs.incoming.expect("a packet")[at as usize..].to_vec(),
            DataRef::Disk(t) => match inputs.read {
                Some((token, buf)) if token == t => buf.to_vec(),
                _ => panic!("node {n}: no read {t:?} here"),
            },
            DataRef::Held { key, at } => kept[&key][at as usize..].to_vec(),
        }
    }

    /// Queues actions a test had node `n` take by hand.
    pub fn push(&mut self, n: NodeId, out: Vec<RAction>) {
        self.queue_actions(n, out, Inputs::default());
    }

    /// Queues `n`'s actions, their bytes taken now (as a driver copies them).
    fn queue_actions(&mut self, n: NodeId, out: Vec<RAction>, inputs: Inputs<'_>) {
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
                    self.stores[n as usize].kept.insert(key, bytes);
                }
                RAction::Forget { key } => {
                    self.stores[n as usize].kept.remove(&key);
                }
                RAction::Complete { req, result, data } => {
                    if let Some(d) = data {
                        let bytes = self.resolve(n, d, &inputs);
                        self.done_data.push((n, req, bytes));
                    }
                    self.done.push((n, req, result));
                    self.done_after.push(self.events.len());
                }
                RAction::Settled { peer, upto, .. } => self.settled.push((n, peer, upto)),
                RAction::Disconnect { peer, .. } => self.dropped.push((n, peer)),
                RAction::Event(e) => self.events.push((n, e)),
                RAction::SplitBrain { peer, why, .. } => {
                    self.split_brains.push((n, peer, why));
                    self.cut(n, peer);
                    self.notice_down(n, peer);
                    self.notice_down(peer, n);
                }
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
        self.nodes[to as usize].packet(from, &packet, &mut out);
        let inputs = Inputs {
            incoming: Some(data),
            ..Inputs::default()
        };
        self.queue_actions(to, out, inputs);
    }

    pub fn run(&mut self) {
        while let Some((n, job)) = self.queue.pop_front() {
            match job {
                Job::Send {
                    to,
                    conn,
                    msg,
                    data,
                } => {
                    let pass = self.pass;
                    let l = self.link(n, to);
                    if !l.up || l.conn != conn || !pass(n, to, &msg) {
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
                job @ Job::Disk { .. } if self.stores[n as usize].held => {
                    self.stores[n as usize].parked.push_back(job);
                }
                Job::Disk {
                    volume,
                    token,
                    kind,
                    data,
                } => {
                    let disk = &mut self.stores[n as usize].disk;
                    let range = |o: u64, l: u32| o as usize..(o + u64::from(l)) as usize;
                    let mut read = None;
                    if let DiskKind::Allocation { offset, len } = kind {
                        let map = allocation(&disk[range(offset, len)]);
                        let mut out = Vec::new();
                        let n_extents = map.len() as u32;
                        let bytes: Vec<u8> = map
                            .iter()
                            .flat_map(|e| {
                                let mut b = Vec::new();
                                e.encode(&mut b);
                                b
                            })
                            .collect();
                        let node = &mut self.nodes[n as usize];
                        node.allocation_done(volume, token, Ok(n_extents), &mut out);
                        let inputs = Inputs {
                            read: Some((token, &bytes)),
                            ..Inputs::default()
                        };
                        self.queue_actions(n, out, inputs);
                        continue;
                    }
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
                        DiskKind::Cache { .. } | DiskKind::Flush | DiskKind::Allocation { .. } => {}
                    }
                    let mut out = Vec::new();
                    self.nodes[n as usize].disk_done(volume, token, kind, Ok(()), &mut out);
                    let inputs = Inputs {
                        read: read.as_deref().map(|b| (token, b)),
                        ..Inputs::default()
                    };
                    self.queue_actions(n, out, inputs);
                }
            }
        }
    }

    /// Node `n` stops (SIGSTOP): nothing it would send goes out, what is sent to it waits,
    /// its clock and timers stand still.
    pub fn freeze(&mut self, n: NodeId) {
        self.frozen[n as usize] = true;
        for p in (0..3u8).filter(|&p| p != n) {
            self.hold(n, p);
            self.hold(p, n);
        }
    }

    /// Node `n` goes on (SIGCONT) as the daemon does: its clock jumps to now, it reads
    /// what arrived while it was stopped, then what it sends flows; its timers run at the
    /// next `tick`.
    pub fn thaw(&mut self, n: NodeId) {
        self.frozen[n as usize] = false;
        self.nodes[n as usize].advance(self.now);
        for p in (0..3u8).filter(|&p| p != n) {
            self.release(p, n);
        }
        for p in (0..3u8).filter(|&p| p != n) {
            self.release(n, p);
        }
    }

    /// Time passes: `ms` more, every node not frozen ticks.
    pub fn tick(&mut self, ms: u64) {
        self.now += ms;
        for n in 0..3u8 {
            if self.frozen[n as usize] {
                continue;
            }
            let mut out = Vec::new();
            self.nodes[n as usize].tick(self.now, &mut out);
            self.queue_actions(n, out, Inputs::default());
        }
        self.run();
    }

    /// The application submits `io` to the Primary; a write's bytes are `req as u8`, so
    /// that the replicas show which write they hold.
    pub fn submit(&mut self, req: u64, io: Io) {
        self.submit_on(0, req, io);
    }

    /// As `submit`, to node `n` (a Primary after a failover).
    pub fn submit_on(&mut self, n: NodeId, req: u64, io: Io) {
        let payload = match io {
            Io::Write { len, .. } => vec![req as u8; len as usize],
            _ => Vec::new(),
        };
        let mut out = Vec::new();
        self.nodes[n as usize].submit(ReqId(req), 0, io, &mut out);
        let inputs = Inputs {
            payload: Some((ReqId(req), &payload)),
            ..Inputs::default()
        };
        self.queue_actions(n, out, inputs);
        self.run();
    }

    /// The application asks node `n` for the block status of `len` bytes at `offset`, as
    /// the daemon does where `Resource::allocation_map` says a peer answers.
    pub fn block_status(&mut self, n: NodeId, req: u64, offset: u64, len: u32) {
        let mut out = Vec::new();
        self.nodes[n as usize].block_status(ReqId(req), 0, offset, len, &mut out);
        self.queue_actions(n, out, Inputs::default());
        self.run();
    }

    /// The map a block status request `req` of node `n` completed with: `None` if it
    /// completed without one (the whole range is data), unanswered or failed.
    pub fn block_status_answer(&self, n: NodeId, req: u64) -> Option<Vec<AllocExtent>> {
        (self.done_data.iter())
            .find(|&&(m, r, _)| m == n && r == ReqId(req))
            .map(|(_, _, b)| AllocExtent::decode_all(b).collect())
    }

    pub fn write(&mut self, req: u64, offset: u64, len: u32) {
        let io = Io::Write {
            offset,
            len,
            fua: false,
        };
        self.submit(req, io);
    }

    /// Node `n` writes 4 KiB block `block` for request `req` (its bytes: `req`).
    pub fn write_block_on(&mut self, n: NodeId, req: u64, block: u64) {
        let io = Io::Write {
            offset: block * BLOCK,
            len: BLOCK as u32,
            fua: false,
        };
        self.submit_on(n, req, io);
    }

    /// How the Primary answered request `req`, if it did.
    pub fn answer(&self, req: u64) -> Option<Result<(), IoError>> {
        self.answer_on(0, req)
    }

    /// How node `n` answered request `req`, if it did.
    pub fn answer_on(&self, n: NodeId, req: u64) -> Option<Result<(), IoError>> {
        (self.done.iter())
            .find(|&&(m, r, _)| m == n && r == ReqId(req))
            .map(|&(_, _, res)| res)
    }

    /// What node `n` counts peer `p` out of sync with volume 0, in bytes.
    pub fn claims(&self, n: NodeId, p: NodeId) -> u64 {
        let st = self.nodes[n as usize].status();
        let peer = st.peers.iter().find(|x| x.id == p).expect("a peer");
        peer.volumes[0].out_of_sync_bytes
    }

    /// The disk state node `n` last heard from peer `p`.
    pub fn seen(&self, n: NodeId, p: NodeId) -> Option<DiskState> {
        let st = self.nodes[n as usize].status();
        let peer = st.peers.iter().find(|x| x.id == p).expect("a peer");
        peer.volumes[0].disk
    }

    /// Node `n`'s disk state.
    pub fn disk(&self, n: NodeId) -> DiskState {
        self.nodes[n as usize].disk(0)
    }

    /// Disk changes node `n` reported, in order.
    pub fn disk_changes(&self, n: NodeId) -> Vec<(DiskState, DiskChange)> {
        (self.events.iter())
            .filter_map(|(at, e)| match e {
                Event::DiskChanged { to, why, .. } if *at == n => Some((*to, why.clone())),
                _ => None,
            })
            .collect()
    }

    /// Packets delivered from `from` to `to` that `f` picks.
    pub fn delivered(&self, from: NodeId, to: NodeId, f: impl Fn(&Msg) -> bool) -> Vec<Msg> {
        (self.sent.iter())
            .filter(|&&(a, b, ref m)| (a, b) == (from, to) && f(m))
            .map(|&(_, _, m)| m)
            .collect()
    }

    /// What `from` told `to` it lacks, live or listed.
    pub fn listed(&self, from: NodeId, to: NodeId) -> Vec<(u64, u32)> {
        (self.sent.iter())
            .filter_map(|&(f, t, msg)| match msg {
                Msg::OutOfSync { offset, len, .. } if (f, t) == (from, to) && len > 0 => {
                    Some((offset, len))
                }
                _ => None,
            })
            .collect()
    }

    /// Resync requests `from` sent to `to`.
    pub fn pulled(&self, from: NodeId, to: NodeId) -> Vec<(u64, u32)> {
        (self.sent.iter())
            .filter_map(|&(f, t, msg)| match msg {
                Msg::ResyncReq { offset, len, .. } if (f, t) == (from, to) => Some((offset, len)),
                _ => None,
            })
            .collect()
    }

    /// The blocks of `listed`, in order and once each: a block is told in any of several
    /// ways (live, listed, in one range or in two), and the tests ask which.
    pub fn listed_blocks(&self, from: NodeId, to: NodeId) -> Vec<u64> {
        blocks(self.listed(from, to)).into_iter().collect()
    }

    /// The blocks of `pulled`, in order and once each.
    pub fn pulled_blocks(&self, from: NodeId, to: NodeId) -> Vec<u64> {
        blocks(self.pulled(from, to)).into_iter().collect()
    }

    /// Bytes of distinct blocks node `n` asked its peers for: what a resync cost, however
    /// it was split between them.
    pub fn distinct_pulled(&self, n: NodeId) -> u64 {
        let all = (0..3).filter(|&p| p != n).flat_map(|p| self.pulled(n, p));
        blocks(all).len() as u64 * BLOCK
    }

    /// Block `b` of node `n`'s disk: the bytes show which write a replica holds.
    pub fn block(&self, n: NodeId, b: u64) -> &[u8] {
        &self.stores[n as usize].disk[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
    }

    /// Every link up and time passing: every replica ends up to date, no node claims a
    /// peer lacks anything, and the replicas hold the same bytes.
    pub fn assert_converges(&mut self) {
        for _ in 0..200 {
            self.tick(50);
        }
        for n in 0..3u8 {
            let st = self.nodes[n as usize].status();
            for p in &st.peers {
                assert!(p.connected, "node {n}: {st:?}");
                assert_eq!(p.volumes[0].out_of_sync_bytes, 0, "node {n}: {st:?}");
            }
        }
        let replicas: Vec<NodeId> = (0..3)
            .filter(|&n| n != 0 || !self.diskless_primary)
            .collect();
        for &n in &replicas {
            let st = self.nodes[n as usize].status();
            assert_eq!(st.volumes[0].disk, DiskState::UpToDate, "node {n}: {st:?}");
        }
        for &n in &replicas[1..] {
            let differ: Vec<u64> = (0..SIZE / BLOCK)
                .filter(|&b| self.block(replicas[0], b) != self.block(n, b))
                .collect();
            assert!(differ.is_empty(), "blocks that differ: {differ:?}");
        }
        assert!(self.dropped.is_empty(), "{:?}", self.dropped);
    }
}

fn spec(
    me: NodeId,
    diskless_primary: bool,
    protocol: Protocol,
    quorum: QuorumSpec,
    incarnation: u64,
) -> ResourceSpec {
    ResourceSpec {
        me,
        nodes: (0..3)
            .map(|id| (id, vec![id != 0 || !diskless_primary]))
            .collect(),
        sizes: vec![SIZE],
        protocol,
        ping_interval_ms: 1000,
        ping_timeout_ms: 500,
        timeout_ms: 6000,
        resync_chunk: 64 << 10,
        resync_window: 4,
        resync_rates: tandem_engine::replica::ResyncRates::UNLIMITED,
        gi_seed: (0x5eed_0000 + u64::from(me)) ^ (incarnation << 32),
        quorum,
        after_sb: AfterSplitBrain::default(),
    }
}

/// Quorum by majority, no minimum redundancy, `on_loss` without it.
pub fn majority(on_loss: OnNoQuorum) -> QuorumSpec {
    QuorumSpec {
        quorum: Votes::Majority,
        min_redundancy: Votes::Off,
        on_loss,
    }
}

/// Generation ids: `current` and, newest first, `history`.
pub fn gen(current: u64, history: &[u64]) -> GenIds {
    let mut h = [0; GI_HISTORY];
    h[..history.len()].copy_from_slice(history);
    GenIds {
        current,
        history: h,
    }
}

/// The 4 KiB blocks the ranges cover.
fn blocks(ranges: impl IntoIterator<Item = (u64, u32)>) -> BTreeSet<u64> {
    (ranges.into_iter())
        .flat_map(|(o, len)| o / BLOCK..(o + u64::from(len)).div_ceil(BLOCK))
        .collect()
}

/// The allocation map of `bytes` as this disk keeps it: a 4 KiB block of zeroes (or the
/// zero tail of the range) is a hole, adjacent extents of one kind merged, at most
/// `MAX_ALLOC_EXTENTS` of them (the rest is left out, as a driver stops at its cap).
fn allocation(bytes: &[u8]) -> Vec<AllocExtent> {
    let mut map: Vec<AllocExtent> = Vec::new();
    for chunk in bytes.chunks(BLOCK as usize) {
        let hole = chunk.iter().all(|&b| b == 0);
        let len = chunk.len() as u32;
        let full = map.len() == MAX_ALLOC_EXTENTS;
        match map.last_mut() {
            Some(last) if last.hole == hole => last.len += len,
            _ if full => break,
            _ => map.push(AllocExtent { len, hole }),
        }
    }
    map
}
