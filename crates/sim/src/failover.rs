//! Failover (`Scenario::failover`, [`crate::Family::Failover`]): any node may become
//! Primary. The faults are partitions of every shape on three nodes (one link cut, so two
//! nodes are apart while both reach the third; one node cut off, the Primary often; every
//! link cut), kills of the Primary (kill -9: its requests in flight are abandoned, it
//! restarts from its metadata later, as in `crash.rs`), and restarts of Secondaries.
//!
//! A cluster manager (as Pacemaker would, on a simulated delay) watches the Primary the
//! workload runs through: when it is dead, no longer Primary, or has lost quorum, it
//! detaches its clients (the workload stops submitting there; what it holds is answered
//! by the engine, failed or completed) and tries the other live nodes in a drawn order,
//! each with `promote(false)` or, half the time, a client attaching (`client_attached`,
//! auto-promote); refusals are counted by reason and are fine. Once one is Primary, the
//! workload goes on through it; the old Primary, if alive and still Primary, has its
//! auto-promote clients detached (it steps down once its requests are answered) or, half
//! the time, is demoted by the manager (`demote`, retried while requests are in flight),
//! else it is left to step down by itself when it meets the new one (`primaries.rs`).
//! Now and then a node that merely cannot see a healthy Primary tries to take over (a
//! manager on the wrong side of an asymmetric partition): the engine must refuse it.
//! No promotion works: the manager tries again later, and gives the clients back to the
//! old Primary if it is fit again. What must hold is checked in `history.rs`.

use crate::history::Tenure;
use crate::rng::Rng;
use crate::{Ev, Sim};
use tandem_engine::driver::Inputs;
use tandem_engine::replica::{AutoPromote, NodeId, PromoteError, Role};

/// Faults a run injects at most: then every cut heals and the cluster must settle, and
/// a node be promoted within [`crate::STUCK_AFTER_US`] (restarts that leave no replica
/// up to date, faults without end, would keep every promotion refused for ever).
const MAX_FAULTS: usize = 40;

/// What failovers did in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FailoverStats {
    /// Promotions after the first, and the attempts refused, by reason.
    pub(crate) failovers: usize,
    pub(crate) refused_peer_primary: usize,
    pub(crate) refused_no_up_to_date: usize,
    pub(crate) refused_no_quorum: usize,
    pub(crate) refused_primary_beyond: usize,
    pub(crate) refused_peer_unheard: usize,
    /// Attempts by a node that merely could not see a fit Primary, and those that
    /// succeeded (the Primary had lost quorum meanwhile).
    pub(crate) spurious: usize,
    pub(crate) spurious_promoted: usize,
    /// Promotions by a client attaching (auto-promote).
    pub(crate) auto_promotions: usize,
    /// Of those, a probe that left at once (the node stepped down), and the client after
    /// it that promoted the node again.
    pub(crate) probes: usize,
    pub(crate) probes_followed: usize,
    /// Faults: partitions with one link cut (asymmetric), with a node cut off (the
    /// Primary), with every link cut; kills of a Primary; restarts of a Secondary.
    pub(crate) asymmetric: usize,
    pub(crate) isolated: usize,
    pub(crate) isolated_primary: usize,
    pub(crate) all_cut: usize,
    pub(crate) kills: usize,
    pub(crate) secondary_restarts: usize,
    /// Old Primaries that stepped down for a new one by themselves
    /// (`RoleChange::Yielded`), that the manager demoted, that stepped down when their
    /// last client left.
    pub(crate) yielded: usize,
    pub(crate) demoted: usize,
    /// Connections an engine dropped (a second Primary refused, a conflict).
    pub(crate) drops: usize,
    /// Writes acknowledged by a Primary other than the first.
    pub(crate) acked_after_failover: usize,
    /// No replica of some volume was left up to date: no node could be promoted, and the
    /// workload ended early.
    pub(crate) gave_up: bool,
}

/// The cluster manager's state and the Primaries' tenures.
pub(crate) struct FailoverState {
    /// The failover family's draws, apart from every other stream.
    rng: Rng,
    /// Whether a client that promotes a node is a probe, and how long until the next
    /// one: a stream of its own, so the schedules before the first probe stay as they were.
    probe_rng: Rng,
    /// A probe left node `.0`, promoted in place of node `.1`: the next client attaches.
    reattach: Option<(NodeId, NodeId)>,
    /// The workload's clients are attached to the Primary (`Sim::primary`): always, but
    /// while a failover is under way.
    pub(crate) attached: bool,
    /// Per node: killed, its process not back before this simulated µs.
    dead_until: Vec<u64>,
    /// Per node: stepping down for another Primary since its last promotion.
    yielding: Vec<bool>,
    /// Per node: clients attached (auto-promote), and whether the manager wants it
    /// Secondary.
    clients: Vec<usize>,
    demote_wanted: Vec<bool>,
    /// A failover is scheduled; it is a node's that merely cannot see the Primary.
    scheduled: bool,
    spurious: bool,
    /// Faults injected; when the last one came (none after [`MAX_FAULTS`]).
    faults: usize,
    faults_over: Option<u64>,
    /// When the workload's polling chain runs next (one chain only).
    pub(crate) next_poll: Option<u64>,
    pub(crate) tenures: Vec<Tenure>,
    /// Per node: its tenure, while Primary.
    pub(crate) tenure_of: Vec<Option<usize>>,
    pub(crate) stats: FailoverStats,
}

impl FailoverState {
    pub(crate) fn new(seed: u64, nodes: usize) -> FailoverState {
        FailoverState {
            rng: Rng::new(seed ^ 0xfa11_0fe2),
            probe_rng: Rng::new(seed ^ 0x0096_0be5),
            reattach: None,
            attached: true,
            dead_until: vec![0; nodes],
            yielding: vec![false; nodes],
            clients: vec![0; nodes],
            demote_wanted: vec![false; nodes],
            scheduled: false,
            spurious: false,
            faults: 0,
            faults_over: None,
            next_poll: None,
            tenures: Vec::new(),
            tenure_of: vec![None; nodes],
            stats: FailoverStats::default(),
        }
    }

    /// Node `n` is killed and not restarted yet at `now`.
    pub(crate) fn dead(&self, n: NodeId, now: u64) -> bool {
        self.dead_until[n as usize] > now
    }

    /// Node `n` began stepping down for another Primary (`Event::YieldingTo`).
    pub(crate) fn yielding(&mut self, n: NodeId) {
        self.yielding[n as usize] = true;
    }

    /// Node `n` fails what it held because it steps down for another Primary.
    pub(crate) fn yielded(&self, n: NodeId) -> bool {
        self.yielding[n as usize]
    }
}

impl Sim {
    /// Node 0's first promotion: the first tenure; the manager starts watching.
    pub(crate) fn first_tenure(&mut self) {
        self.start_tenure(0);
        self.at(2_000, Ev::Manage);
    }

    fn start_tenure(&mut self, node: NodeId) {
        self.clock += 1;
        self.fo.tenures.push(Tenure {
            node,
            start: self.clock,
            start_us: self.now,
            last_ack: None,
            acks: 0,
        });
        self.fo.tenure_of[node as usize] = Some(self.fo.tenures.len() - 1);
        self.fo.yielding[node as usize] = false;
    }

    fn alive(&self, n: NodeId) -> bool {
        !self.fo.dead(n, self.now)
    }

    fn role(&self, n: NodeId) -> Role {
        self.nodes[n as usize].engine.role()
    }

    /// The workload may run through node `p`: alive, Primary, quorate on every volume,
    /// not stepping down.
    fn fit(&self, p: NodeId) -> bool {
        if !self.alive(p) || self.role(p) != Role::Primary || self.fo.yielding[p as usize] {
            return false;
        }
        let st = self.nodes[p as usize].engine.status();
        st.volumes
            .iter()
            .all(|v| v.quorum.is_none_or(|q| q.quorate))
    }

    fn link_up(&self, a: NodeId, b: NodeId) -> bool {
        self.links.get(&(a, b)).is_some_and(|l| l.up)
    }

    /// The manager looks at the Primary (every 2 to 10 ms until the workload is issued).
    pub(crate) fn manage(&mut self) {
        for n in 0..self.nodes.len() as NodeId {
            if self.fo.demote_wanted[n as usize] {
                self.try_demote(n);
            }
        }
        if self.issued >= self.sc.ops {
            if self.fo.demote_wanted.contains(&true) {
                self.at(5_000, Ev::Manage);
            }
            return;
        }
        let p = self.primary;
        if !self.fo.scheduled {
            if !self.fit(p) {
                let d = 1_000 + self.fo.rng.below(30_000);
                self.note(format!(
                    "manager: node {p} is {}; failing over in {d} µs",
                    if !self.alive(p) {
                        "dead"
                    } else if self.role(p) != Role::Primary {
                        "not Primary"
                    } else {
                        "without quorum"
                    }
                ));
                self.fo.scheduled = true;
                self.at(d, Ev::Failover);
            } else if !self.fo.attached {
                self.note(format!("manager: clients back on node {p}"));
                self.fo.attached = true;
                self.at(1, Ev::Workload);
            } else if self.fo.rng.chance(0.05)
                && (0..self.nodes.len() as NodeId)
                    .any(|c| c != p && self.alive(c) && !self.link_up(c, p))
            {
                self.fo.scheduled = true;
                self.fo.spurious = true;
                let d = 1_000 + self.fo.rng.below(10_000);
                self.at(d, Ev::Failover);
            }
        }
        let d = 2_000 + self.fo.rng.below(8_000);
        self.at(d, Ev::Manage);
    }

    fn try_demote(&mut self, n: NodeId) {
        if !self.alive(n) || n == self.primary || self.role(n) != Role::Primary {
            self.fo.demote_wanted[n as usize] = false;
            return;
        }
        let mut out = Vec::new();
        let r = self.nodes[n as usize].engine.demote(&mut out);
        self.run_actions(n, out, &Inputs::default());
        if r.is_ok() {
            self.note(format!("manager: node {n} demoted"));
            self.fo.stats.demoted += 1;
            self.fo.demote_wanted[n as usize] = false;
        }
    }

    /// The scheduled failover: promote another node, if the Primary is still unfit.
    pub(crate) fn failover(&mut self) {
        let spurious = std::mem::take(&mut self.fo.spurious);
        self.fo.scheduled = false;
        let old = self.primary;
        let fit = self.fit(old);
        if fit && !spurious {
            self.fo.attached = true;
            self.at(1, Ev::Workload);
            return;
        }
        if !spurious && self.fo.attached {
            self.note(format!("manager: clients detached from node {old}"));
            self.fo.attached = false;
        }
        let mut candidates: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&c| self.alive(c) && !(c == old && self.role(old) == Role::Primary))
            .filter(|&c| !spurious || (c != old && !self.link_up(c, old)))
            .collect();
        // A drawn order.
        for i in (1..candidates.len()).rev() {
            let j = self.fo.rng.below(i as u64 + 1) as usize;
            candidates.swap(i, j);
        }
        if spurious {
            self.fo.stats.spurious += 1;
        }
        for c in candidates {
            let auto = self.fo.rng.chance(0.5);
            let already = self.role(c) == Role::Primary;
            let mut out = Vec::new();
            let e = &mut self.nodes[c as usize].engine;
            let result = if auto {
                match e.client_attached(&mut out) {
                    AutoPromote::Promoted => Ok(()),
                    AutoPromote::Unchanged => {
                        Err(PromoteError::PeerPrimary(e.peer_primary().unwrap_or(c)))
                    }
                    AutoPromote::Refused(e) => Err(e),
                }
            } else {
                e.promote(false, &mut out)
            };
            self.run_actions(c, out, &Inputs::default());
            match result {
                Ok(()) => {
                    if auto {
                        self.fo.clients[c as usize] += 1;
                        self.fo.stats.auto_promotions += 1;
                    }
                    if spurious {
                        self.fo.stats.spurious_promoted += 1;
                    }
                    let probe = self.sc.probes && auto && !already && !spurious;
                    if probe && self.fo.probe_rng.chance(0.5) {
                        self.probe_leaves(c, old);
                        return;
                    }
                    self.took_over(c, old, already);
                    return;
                }
                Err(e) => {
                    self.note(format!(
                        "manager: node {c} not promoted{}: {e}",
                        if auto { " (client attached)" } else { "" }
                    ));
                    let s = &mut self.fo.stats;
                    match e {
                        PromoteError::PeerPrimary(_) => s.refused_peer_primary += 1,
                        PromoteError::NoUpToDate(_) => s.refused_no_up_to_date += 1,
                        PromoteError::NoQuorum(_) => s.refused_no_quorum += 1,
                        PromoteError::PrimaryBeyond { .. } => s.refused_primary_beyond += 1,
                        PromoteError::PeerUnheard(_) | PromoteError::PeerListing { .. } => {
                            s.refused_peer_unheard += 1
                        }
                    }
                    if auto {
                        // The client goes away again.
                        let mut out = Vec::new();
                        self.nodes[c as usize].engine.client_detached(&mut out);
                        self.run_actions(c, out, &Inputs::default());
                    }
                }
            }
        }
        if spurious {
            return;
        }
        if self.fit(old) {
            self.note(format!("manager: clients back on node {old}"));
            self.fo.attached = true;
            self.at(1, Ev::Workload);
        } else {
            // The last fault healed within 80 ms (a restart within 200 ms).
            let over = self
                .fo
                .faults_over
                .is_some_and(|t| self.now - t > crate::STUCK_AFTER_US);
            if over && self.no_up_to_date_replica() {
                // Kills and restarts left no replica of some volume provably current: only
                // an administrator (`promote --force`) can choose one. As in the other
                // families, the run ends here and is checked for safety only.
                self.note(format!(
                    "manager: no replica up to date anywhere {} s after the last fault; the workload ends ({} requests never issued)",
                    crate::STUCK_AFTER_US / 1_000_000,
                    self.sc.ops - self.issued
                ));
                self.fo.stats.gave_up = true;
                self.issued = self.sc.ops;
                return;
            }
            if over {
                let status: Vec<_> = self.nodes.iter().map(|n| n.engine.status()).collect();
                panic!(
                    "seed {}: no node promoted within {} s of the last fault\n{status:#?}\n{}",
                    self.sc.seed,
                    crate::STUCK_AFTER_US / 1_000_000,
                    self.tail_log(300)
                );
            }
            self.fo.scheduled = true;
            let d = 5_000 + self.fo.rng.below(15_000);
            self.at(d, Ev::Failover);
        }
    }

    /// The client that promoted node `c` was a probe (`nbdinfo`, `qemu-img info`, fio's
    /// first connection): it leaves at once, the node steps down (once its peers have
    /// answered a change of its ids), and the application's own client attaches 0 to
    /// 500 µs later (real-daemon test `cut_link_and_heal`: a
    /// diskless node promoted again this soon took ids older than its last tenure's,
    /// whose adoption was still on its way, and stepped down for them).
    fn probe_leaves(&mut self, c: NodeId, old: NodeId) {
        self.note(format!(
            "manager: node {c}'s first client was a probe; it leaves"
        ));
        self.fo.stats.probes += 1;
        self.fo.clients[c as usize] -= 1;
        let mut out = Vec::new();
        self.nodes[c as usize].engine.client_detached(&mut out);
        self.run_actions(c, out, &Inputs::default());
        // No other failover meanwhile: this one is not over.
        self.fo.scheduled = true;
        self.fo.reattach = Some((c, old));
        let d = self.fo.probe_rng.below(500);
        self.at(d, Ev::Reattach);
    }

    /// The application's client attaches after a probe left (see `probe_leaves`).
    pub(crate) fn reattach(&mut self) {
        let (c, old) = self.fo.reattach.take().expect("a probe left");
        self.fo.scheduled = false;
        if self.alive(c) {
            let mut out = Vec::new();
            let r = self.nodes[c as usize].engine.client_attached(&mut out);
            self.run_actions(c, out, &Inputs::default());
            match r {
                AutoPromote::Promoted | AutoPromote::Unchanged if self.role(c) == Role::Primary => {
                    self.fo.clients[c as usize] += 1;
                    self.fo.stats.probes_followed += 1;
                    self.took_over(c, old, false);
                    return;
                }
                r => {
                    self.note(format!(
                        "manager: node {c} not promoted again after the probe: {r:?}"
                    ));
                    let mut out = Vec::new();
                    self.nodes[c as usize].engine.client_detached(&mut out);
                    self.run_actions(c, out, &Inputs::default());
                }
            }
        }
        self.fo.scheduled = true;
        let d = 1_000 + self.fo.rng.below(10_000);
        self.at(d, Ev::Failover);
    }

    /// Node `c` was promoted in place of `old` (or `already` Primary, an old Primary
    /// that never stepped down and is fit again: its tenure goes on).
    fn took_over(&mut self, c: NodeId, old: NodeId, already: bool) {
        self.note(format!("manager: node {c} is Primary now (was node {old})"));
        self.fo.stats.failovers += 1;
        if !already || self.fo.tenure_of[c as usize].is_none() {
            self.start_tenure(c);
        }
        self.primary = c;
        self.fo.attached = true;
        self.at(1, Ev::Workload);
        if old == c || !self.alive(old) || self.role(old) != Role::Primary {
            return;
        }
        // The old Primary's clients leave: auto-promoted, it steps down once its requests
        // are answered.
        for _ in 0..std::mem::take(&mut self.fo.clients[old as usize]) {
            let mut out = Vec::new();
            self.nodes[old as usize].engine.client_detached(&mut out);
            self.run_actions(old, out, &Inputs::default());
        }
        if self.role(old) == Role::Primary && self.fo.rng.chance(0.5) {
            self.fo.demote_wanted[old as usize] = true;
            self.try_demote(old);
        }
    }

    // ------------------------------------------------------------------ faults

    /// The failover family's faults (instead of `Sim::fault`'s).
    pub(crate) fn failover_fault(&mut self) {
        let roll = self.fo.rng.below(100);
        let p = self.primary;
        if roll < 35 {
            let target = (0..self.nodes.len() as NodeId)
                .find(|&n| n == p && self.alive(n) && self.role(n) == Role::Primary);
            match target {
                Some(n) => self.kill(n),
                None => self.partition(),
            }
        } else if roll < 45 {
            let n = self.fo.rng.below(self.nodes.len() as u64) as NodeId;
            if self.alive(n) && self.role(n) == Role::Secondary {
                self.fo.stats.secondary_restarts += 1;
                self.fo.dead_until[n as usize] = self.now + 30_000;
                self.restart(n);
            } else {
                self.partition();
            }
        } else {
            self.partition();
        }
        self.fo.faults += 1;
        if self.issued < self.sc.ops && self.fo.faults < MAX_FAULTS {
            let t = 2_000 + self.fo.rng.below(18_000);
            self.at(t, Ev::Fault);
        } else {
            self.fo.faults_over = Some(self.now);
        }
    }

    /// Links cut, each healed 2 to 80 ms later: one (two nodes apart, both reaching the
    /// third), those of one node (the Primary half the time), or all.
    fn partition(&mut self) {
        let n = self.nodes.len() as NodeId;
        let mut cut = Vec::new();
        match self.fo.rng.below(4) {
            0 => {
                let a = self.fo.rng.below(u64::from(n)) as NodeId;
                let b = (a + 1 + self.fo.rng.below(u64::from(n) - 1) as NodeId) % n;
                self.fo.stats.asymmetric += 1;
                cut.push((a.min(b), a.max(b)));
            }
            1 | 2 => {
                let x = if self.fo.rng.chance(0.5) {
                    self.fo.stats.isolated_primary += 1;
                    self.primary
                } else {
                    self.fo.rng.below(u64::from(n)) as NodeId
                };
                self.fo.stats.isolated += 1;
                for o in (0..n).filter(|&o| o != x) {
                    cut.push((x.min(o), x.max(o)));
                }
            }
            _ => {
                self.fo.stats.all_cut += 1;
                for a in 0..n {
                    for b in a + 1..n {
                        cut.push((a, b));
                    }
                }
            }
        }
        let together = self.fo.rng.chance(0.5);
        let mut t = 2_000 + self.fo.rng.below(78_000);
        for (a, b) in cut {
            self.cut(a, b, None);
            if !together {
                t = 2_000 + self.fo.rng.below(78_000);
            }
            self.at(t, Ev::Heal { a, b });
        }
    }

    /// kill -9 of a Primary: its peers see it go, what it was asked is abandoned (the
    /// application saw no answer), and it restarts from its metadata 20 to 200 ms later,
    /// as a Secondary (see `crash.rs`).
    fn kill(&mut self, node: NodeId) {
        self.note(format!("node {node}, a Primary, is killed"));
        self.fo.stats.kills += 1;
        let kept = self.kept_at_crash(node as usize);
        self.mark_lossy(node, false, false);
        self.abandon_requests(Some(node));
        for other in (0..self.nodes.len() as NodeId).filter(|&o| o != node) {
            self.cut(node.min(other), node.max(other), Some(node));
        }
        self.start_after_crash(node, kept);
        let i = node as usize;
        self.fo.clients[i] = 0;
        self.fo.demote_wanted[i] = false;
        self.fo.yielding[i] = false;
        self.fo.tenure_of[i] = None;
        let d = 20_000 + self.fo.rng.below(180_000);
        self.fo.dead_until[i] = self.now + d;
        self.at(d, Ev::Restart { node });
    }
}
