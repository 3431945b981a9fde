//! Carrying out the engines' actions with the driver core the daemon uses
//! ([`tandem_engine::driver`]): the simulated disk operations (completed later, or inline
//! as the seed says), events counted for coverage, dropped connections healed later.

use crate::{DiskOpState, Ev, Sim};
use tandem_engine::driver::{execute, DataStore, DiskRequest, Driver, Inputs, SplitBrain};
use tandem_engine::replica::{
    DataRef, DiskChange, Event, LinkLoss, Msg, NodeId, RAction, RoleChange,
};
use tandem_engine::sync_plan::FlushPlan;
use tandem_engine::{DiskKind, IoError, ReqId};

impl Sim {
    /// The bytes `data` names, which the engine promises are there: a reference to bytes
    /// the driver no longer has (a payload used after its submission and not kept) fails
    /// the run.
    pub(crate) fn resolve(
        &self,
        node: NodeId,
        data: DataRef,
        inputs: &Inputs<'_>,
        len: usize,
    ) -> Vec<u8> {
        let bytes = self.nodes[node as usize]
            .data
            .resolve(data, inputs)
            .unwrap_or_else(|| {
                panic!(
                    "seed {}: node {node} refers to {data:?}, which it no longer has",
                    self.sc.seed
                )
            });
        bytes[..len].to_vec()
    }

    /// Carries out a node's actions with the driver core the daemon uses
    /// ([`tandem_engine::driver::execute`]): in order, a disk operation that completes
    /// inline (see [`Knobs::inline_disk_pct`]) having the engine told at once and what
    /// follows queued behind the rest.
    pub(crate) fn run_actions(&mut self, node: NodeId, actions: Vec<RAction>, inputs: &Inputs<'_>) {
        execute(&mut NodeDriver { sim: self, node }, actions, inputs);
    }

    /// A disk operation a node's engine asked for ([`Driver::disk`]).
    fn disk_op(
        &mut self,
        node: NodeId,
        op: DiskRequest,
        inputs: &Inputs<'_>,
        then: &mut Vec<RAction>,
    ) {
        let DiskRequest {
            volume,
            token,
            kind,
            data,
        } = op;
        let (i, v) = (node as usize, volume as usize);
        // The engine names volume 0 for a flush; the driver flushes every
        // replica the node keeps.
        let has_replica = if kind == DiskKind::Flush {
            self.sc.any_replica(i)
        } else {
            v < self.sc.sizes.len() && self.sc.replica(i, v)
        };
        assert!(
            has_replica,
            "seed {}: node {node} issued {kind:?} on volume {volume}, of which it keeps no replica",
            self.sc.seed
        );
        self.check_no_io_when_detached(node, volume, token, kind);
        let bytes = data.map(|d| self.resolve(node, d, inputs, kind.len() as usize));
        let covers = (kind == DiskKind::Flush).then(|| self.nodes[i].disk.covers());
        let op = self.next_op;
        self.next_op += 1;
        let inc = self.nodes[i].incarnation;
        self.nodes[i].ops.insert(
            op,
            DiskOpState {
                volume,
                token,
                kind,
                data: bytes,
                incarnation: inc,
                covers,
                sync_gen: None,
            },
        );
        if kind == DiskKind::Flush && self.sc.knobs.sync_plan {
            // The daemon's way: the plan says which fdatasync answers it.
            self.nodes[i].ops.remove(&op);
            match self.nodes[i].syncs.flush((volume, token)) {
                FlushPlan::Answer((v, t), r) => {
                    self.flushes_without_sync += 1;
                    let r = r.map_err(|()| IoError::Os(5));
                    if r.is_err() {
                        self.told_eio(node, None);
                    }
                    self.nodes[i].engine.disk_done(v, t, kind, r, then);
                }
                FlushPlan::Wait => {}
                FlushPlan::Start(st) => self.start_sync(node, st),
            }
            return;
        }
        let pct = self.sc.knobs.inline_disk_pct;
        let inline = pct > 0
            && !matches!(kind, DiskKind::Read { .. })
            && self.fault_rng.below(100) < u64::from(pct);
        if inline {
            self.inline_ops += 1;
            then.extend(self.finish_disk_op(node, op));
        } else {
            let d = 5 + self.rng.below(300);
            self.at(d, Ev::DiskDone { node, op });
        }
    }

    fn event(&mut self, node: NodeId, e: Event) {
        match e {
            Event::DiskChanged {
                why: DiskChange::Synced { .. },
                ..
            } => self.resyncs += 1,
            Event::DiskChanged {
                volume,
                why: DiskChange::Failed(_),
                ..
            } => {
                self.detached[node as usize][volume as usize] = true;
                self.replicas_detached += 1;
            }
            Event::DiskChanged {
                why: DiskChange::ProvenByGeneration { .. },
                ..
            } => self.crash.proven_by_generation += 1,
            Event::GenerationChanged { .. } => self.crash.generation_changes += 1,
            Event::QuorumChanged { quorate: false, .. } if node == self.primary => {
                self.quorum_losses += 1
            }
            Event::YieldingTo { .. } | Event::Superseded { .. } | Event::Outrun { .. } => {
                self.fo.yielding(node)
            }
            Event::RoleChanged {
                why:
                    RoleChange::Yielded { .. }
                    | RoleChange::Superseded { .. }
                    | RoleChange::Outrun { .. },
                ..
            } => self.fo.stats.yielded += 1,
            Event::OlderPeerListed { since, .. } => match since {
                Some(_) => self.crash.older_listed_bitmap += 1,
                None => self.crash.older_listed_full += 1,
            },
            _ => {}
        }
        self.note(format!("node {node}: {e}"));
    }

    fn disconnect(&mut self, node: NodeId, peer: NodeId, reason: LinkLoss) {
        self.note(format!("node {node} drops {peer}: {reason}"));
        self.drops += 1;
        self.count_stall_drop(peer, &reason);
        self.cut(node, peer, Some(node));
        if self.sc.failover {
            self.fo.stats.drops += 1;
        }
        let t = 50_000 + self.rng.below(50_000);
        self.at(
            t,
            Ev::Heal {
                a: node.min(peer),
                b: node.max(peer),
            },
        );
    }
}

/// One node of the simulation as the driver core sees it ([`Driver`]).
struct NodeDriver<'a> {
    sim: &'a mut Sim,
    node: NodeId,
}

impl Driver for NodeDriver<'_> {
    type Buf = Vec<u8>;

    fn store(&mut self) -> &mut DataStore<Vec<u8>> {
        &mut self.sim.nodes[self.node as usize].data
    }

    fn disk(&mut self, op: DiskRequest, inputs: &Inputs<'_>, then: &mut Vec<RAction>) {
        self.sim.disk_op(self.node, op, inputs, then);
    }

    fn send(&mut self, peer: NodeId, msg: Msg, inputs: &Inputs<'_>) {
        self.sim.send(self.node, peer, msg, inputs);
    }

    fn complete(
        &mut self,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        inputs: &Inputs<'_>,
    ) {
        self.sim.complete(self.node, req, result, data, inputs);
    }

    fn disconnect(&mut self, peer: NodeId, reason: LinkLoss) {
        self.sim.disconnect(self.node, peer, reason);
    }

    // With quorum on (failover), no two Primaries write apart: no split brain either.
    // The simulator asks the engine what a crash finds held (`Resource::unsettled_writes`).
    fn settled(&mut self, _peer: NodeId, _conn: u32, _upto: u64) {}

    // Likewise for the Primary's own writes (`Sim::held_in_log`, unless `--pending-checks`).
    fn write_settled(&mut self, _req: ReqId, _volume: u16) {}

    fn split_brain(&mut self, found: SplitBrain) {
        panic!(
            "seed {}: node {} reports a split brain with node {} on volume {}, but no two Primaries wrote apart\n{}",
            self.sim.sc.seed,
            self.node,
            found.peer,
            found.volume,
            self.sim.tail_log(300)
        );
    }

    fn event(&mut self, event: Event) {
        self.sim.event(self.node, event);
    }
}
