//! The part of driving a [`Resource`](crate::replica::Resource) that every driver does
//! alike, shared by the node daemon and the simulator: where the bytes the engine's data
//! references name are kept ([`DataStore`]), and carrying out a batch of actions
//! ([`execute`]) in order, with what a disk operation completed at once sets off queued
//! behind the actions already waiting (as the daemon's buffered writes and small syncs
//! do). What touches the world — a disk, a socket, a client — is the driver's own
//! ([`Driver`]).

use crate::io::{DiskKind, IoError, ReqId};
use crate::replica::{DataRef, Event, LinkLoss, Msg, NodeId, RAction, Token};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// What came with the event being handled: the bytes of the packet that arrived and the
/// payload of the request that was submitted. They live only as long as the event; the
/// engine has whatever it needs later kept ([`RAction::Retain`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Inputs<'a> {
    pub incoming: Option<&'a [u8]>,
    pub payload: Option<(ReqId, &'a [u8])>,
}

/// The bytes of one resource on one node that outlive the event they came with: payloads
/// the engine asked to keep (under a [`Token`]) and the buffers of finished reads
/// (`DataRef::Disk`), of any buffer type the driver reads into.
#[derive(Debug)]
pub struct DataStore<B> {
    held: HashMap<Token, Vec<u8>>,
    reads: HashMap<Token, B>,
}

impl<B> Default for DataStore<B> {
    fn default() -> Self {
        DataStore {
            held: HashMap::default(),
            reads: HashMap::default(),
        }
    }
}

impl<B: AsRef<[u8]>> DataStore<B> {
    /// The bytes `d` names (from its start: the caller cuts the length it needs), or
    /// `None` if they are not here (a reference the engine should not have made).
    pub fn resolve<'a>(&'a self, d: DataRef, inputs: &Inputs<'a>) -> Option<&'a [u8]> {
        match d {
            DataRef::Request(req) => match inputs.payload {
                Some((id, p)) if id == req => Some(p),
                // A request's payload kept past its submission (a write that waited).
                _ => self.held.get(&Token::App(req)).map(Vec::as_slice),
            },
            DataRef::Incoming { at } => inputs.incoming.and_then(|b| b.get(at as usize..)),
            DataRef::Disk(t) => self.reads.get(&t).map(AsRef::as_ref),
            DataRef::Held { key, at } => self.held.get(&key).and_then(|v| v.get(at as usize..)),
        }
    }

    /// Keeps a copy of the bytes at `from` under `key` ([`RAction::Retain`]).
    pub fn retain(&mut self, from: DataRef, key: Token, inputs: &Inputs<'_>) {
        let bytes = self.resolve(from, inputs).map(<[u8]>::to_vec);
        debug_assert!(bytes.is_some(), "retaining {from:?}, which is not here");
        self.held.insert(key, bytes.unwrap_or_default());
    }

    /// Drops what was kept under `key` ([`RAction::Forget`]).
    pub fn forget(&mut self, key: Token) {
        self.held.remove(&key);
    }

    /// A disk write ended (done or failed): a peer's or a resync write's kept bytes go. An
    /// application write's stay until its request completes: its packets to peers may
    /// still be queued behind an inline completion.
    pub fn write_ended(&mut self, token: Token) {
        if matches!(token, Token::PeerWrite { .. } | Token::ResyncWrite { .. }) {
            self.held.remove(&token);
        }
    }

    /// An application request completed: the bytes kept for it go.
    pub fn request_ended(&mut self, req: ReqId) {
        self.held.remove(&Token::App(req));
    }

    /// A read finished into `buf`: the engine names it `DataRef::Disk(token)`.
    pub fn read_done(&mut self, token: Token, buf: B) {
        self.reads.insert(token, buf);
    }

    /// Takes a read's buffer back (once the actions of its completion ran, or to move
    /// its bytes into a reply without a copy).
    pub fn take_read(&mut self, token: Token) -> Option<B> {
        self.reads.remove(&token)
    }

    /// Forgets everything (the node restarted); hands back the read buffers.
    pub fn clear(&mut self) -> Vec<B> {
        self.held.clear();
        self.reads.drain().map(|(_, b)| b).collect()
    }

    /// How many payloads are kept (a driver's check that nothing leaks).
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// What a driver does with the engine's actions that reach the world.
pub trait Driver {
    type Buf: AsRef<[u8]>;

    fn store(&mut self) -> &mut DataStore<Self::Buf>;

    /// Runs a disk operation; a write's bytes are at `data`. One that completes at once is
    /// reported to the engine here, and what the engine answers goes into `then`: carried
    /// out after the actions already queued.
    fn disk(&mut self, op: DiskRequest, inputs: &Inputs<'_>, then: &mut Vec<RAction>);

    /// Queues a packet to a peer (dropped if it is not connected).
    fn send(&mut self, peer: NodeId, msg: Msg, inputs: &Inputs<'_>);

    /// Answers the application; a read's bytes are at `data`.
    fn complete(
        &mut self,
        req: ReqId,
        result: Result<(), IoError>,
        data: Option<DataRef>,
        inputs: &Inputs<'_>,
    );

    fn disconnect(&mut self, peer: NodeId, reason: LinkLoss);

    /// See [`RAction::Settled`]: the activity log may let these writes go once written.
    fn settled(&mut self, peer: NodeId, conn: u32, upto: u64);

    /// See [`RAction::WriteSettled`]: the activity log may let it go once answered.
    fn write_settled(&mut self, req: ReqId, volume: u16);

    /// See [`RAction::SplitBrain`].
    fn split_brain(&mut self, found: SplitBrain);

    fn event(&mut self, event: Event);
}

/// A disk operation the engine asked for ([`RAction::Disk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskRequest {
    pub volume: u16,
    pub token: Token,
    pub kind: DiskKind,
    pub data: Option<DataRef>,
}

/// A split brain the engine found ([`RAction::SplitBrain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitBrain {
    pub peer: NodeId,
    pub volume: u16,
    pub mine: u64,
    pub theirs: u64,
    pub reported: bool,
    /// Why no after-split-brain policy resolved it.
    pub why: crate::replica::Unresolved,
}

/// Carries out `actions` in order. Never nests: what an inline completion sets off waits
/// its turn at the back of the queue, so every driver produces the same order.
pub fn execute<D: Driver>(d: &mut D, actions: Vec<RAction>, inputs: &Inputs<'_>) {
    let mut queue: VecDeque<RAction> = actions.into();
    let mut then = Vec::new();
    while let Some(a) = queue.pop_front() {
        match a {
            RAction::Disk {
                volume,
                token,
                kind,
                data,
            } => {
                let op = DiskRequest {
                    volume,
                    token,
                    kind,
                    data,
                };
                d.disk(op, inputs, &mut then);
                queue.extend(then.drain(..));
            }
            RAction::Send { peer, msg } => d.send(peer, msg, inputs),
            RAction::Complete { req, result, data } => {
                d.complete(req, result, data, inputs);
                d.store().request_ended(req);
            }
            RAction::Retain { from, key } => d.store().retain(from, key, inputs),
            RAction::Forget { key } => d.store().forget(key),
            RAction::Disconnect { peer, reason } => d.disconnect(peer, reason),
            RAction::Settled { peer, conn, upto } => d.settled(peer, conn, upto),
            RAction::WriteSettled { req, volume } => d.write_settled(req, volume),
            RAction::SplitBrain {
                peer,
                volume,
                mine,
                theirs,
                reported,
                why,
            } => d.split_brain(SplitBrain {
                peer,
                volume,
                mine,
                theirs,
                reported,
                why,
            }),
            RAction::Event(e) => d.event(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it was asked; completes writes inline, which the engine answers
    /// with the `Send` the test planted.
    #[derive(Default)]
    struct Log {
        store: DataStore<Vec<u8>>,
        seen: Vec<String>,
    }

    impl Driver for Log {
        type Buf = Vec<u8>;
        fn store(&mut self) -> &mut DataStore<Vec<u8>> {
            &mut self.store
        }
        fn disk(&mut self, op: DiskRequest, inputs: &Inputs<'_>, then: &mut Vec<RAction>) {
            let bytes = op.data.and_then(|d| self.store.resolve(d, inputs));
            self.seen.push(format!("disk {:?} {:?}", op.token, bytes));
            self.store.write_ended(op.token);
            then.push(RAction::Send {
                peer: 9,
                msg: Msg::Ping,
            });
        }
        fn send(&mut self, peer: NodeId, _msg: Msg, _inputs: &Inputs<'_>) {
            self.seen.push(format!("send {peer}"));
        }
        fn complete(
            &mut self,
            req: ReqId,
            _r: Result<(), IoError>,
            _d: Option<DataRef>,
            _i: &Inputs<'_>,
        ) {
            self.seen.push(format!("complete {}", req.0));
        }
        fn disconnect(&mut self, peer: NodeId, _reason: LinkLoss) {
            self.seen.push(format!("disconnect {peer}"));
        }
        fn split_brain(&mut self, found: SplitBrain) {
            self.seen.push(format!("split brain {}", found.peer));
        }
        fn settled(&mut self, peer: NodeId, _conn: u32, upto: u64) {
            self.seen.push(format!("settled {peer} {upto}"));
        }
        fn write_settled(&mut self, req: ReqId, _volume: u16) {
            self.seen.push(format!("write settled {}", req.0));
        }
        fn event(&mut self, _event: Event) {}
    }

    #[test]
    fn an_inline_completion_queues_behind_the_waiting_actions_and_kept_bytes_live_as_long_as_they_should(
    ) {
        let mut d = Log::default();
        let peer_write = Token::PeerWrite {
            peer: 1,
            conn: 1,
            seq: 7,
        };
        let packet = [1u8, 2, 3, 4];
        let inputs = Inputs {
            incoming: Some(&packet),
            payload: Some((ReqId(5), &[9, 9])),
        };
        let actions = vec![
            RAction::Retain {
                from: DataRef::Incoming { at: 0 },
                key: peer_write,
            },
            RAction::Retain {
                from: DataRef::Request(ReqId(5)),
                key: Token::App(ReqId(5)),
            },
            RAction::Disk {
                volume: 0,
                token: peer_write,
                kind: DiskKind::Write { offset: 0, len: 2 },
                data: Some(DataRef::Held {
                    key: peer_write,
                    at: 2,
                }),
            },
            RAction::Send {
                peer: 2,
                msg: Msg::Ping,
            },
        ];
        execute(&mut d, actions, &inputs);
        assert_eq!(
            d.seen,
            vec![
                format!("disk {peer_write:?} Some([3, 4])"),
                "send 2".to_string(),
                "send 9".to_string(),
            ]
        );
        assert_eq!(
            d.store.held(),
            1,
            "the peer's write is done, the request is not"
        );
        // Later, outside the submission: its payload comes from what was kept.
        let later = Inputs::default();
        assert_eq!(
            d.store.resolve(DataRef::Request(ReqId(5)), &later),
            Some(&[9u8, 9][..])
        );
        let done = RAction::Complete {
            req: ReqId(5),
            result: Ok(()),
            data: None,
        };
        execute(&mut d, vec![done], &later);
        assert_eq!(d.store.held(), 0);
        assert_eq!(d.store.resolve(DataRef::Request(ReqId(5)), &later), None);
    }
}
