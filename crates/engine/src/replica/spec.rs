//! What a resource is: its nodes, volumes and protocol, and what the driver found on disk.

pub type NodeId = u8;

/// Replication protocol of the resource's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Complete when the write is in the local send buffer.
    A,
    /// Complete when every peer has received it.
    B,
    /// Complete when every peer has written it.
    C,
}

/// The static shape of a resource, from its configuration.
#[derive(Clone, Debug)]
pub struct ResourceSpec {
    pub me: NodeId,
    /// Every node (this one included) and, per volume, whether it keeps a replica.
    pub nodes: Vec<(NodeId, Vec<bool>)>,
    pub sizes: Vec<u64>,
    pub protocol: Protocol,
    pub ping_interval_ms: u64,
    pub ping_timeout_ms: u64,
    /// A replicated request not acknowledged in this time drops the connection.
    pub timeout_ms: u64,
    /// Bytes per resync request and requests in flight per resync.
    pub resync_chunk: u32,
    pub resync_window: usize,
    /// How fast a resync may pull (see `pace.rs`).
    pub resync_rates: super::pace::ResyncRates,
    /// Seeds the generation ids this node makes: random per start (the daemon), or from
    /// the simulator's seed; two starts must not share one.
    pub gi_seed: u64,
    /// Whether a Primary needs a majority (or more) of the replicas to complete I/O.
    pub quorum: super::quorum::QuorumSpec,
    /// What a split brain found with a peer does (see `split_brain.rs`).
    pub after_sb: super::split_brain::AfterSplitBrain,
}

/// What the driver found of a volume's local replica when the node started. The engine
/// decides from it what the replica may be trusted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaAtStart {
    /// The node keeps no replica of this volume.
    None,
    /// The backing file did not exist and was created now: it holds nothing (all zeroes).
    /// Inconsistent, pulled in full from an up-to-date peer, unless every replica of the
    /// volume was created at its start (a new cluster: all zeroes everywhere, nothing to
    /// sync). A deleted file or a typo in a `disk` path must never pass for a current
    /// replica.
    Created,
    /// The backing store existed: without persistent metadata its currency is unknown, so
    /// it is Outdated and resynced from an up-to-date peer.
    Existing,
    /// Its metadata says it was shut down cleanly while consistent (UpToDate, or waiting
    /// for proof after an earlier clean restart), and what it knew of its peers was
    /// restored ([`Resource::restore_peer`](super::Resource::restore_peer)): it is as if
    /// every link had been cut meanwhile. Outdated until proven current: an up-to-date
    /// (and itself proven) peer's list has ended and it pulled what that list named, or
    /// every diskful node has met and listed to it and none restarted without proof.
    /// Peers list it only what they know it missed, not everything.
    Consistent,
    /// Its metadata says the node crashed (kill -9, power loss) while the replica was
    /// consistent, and names where it may differ from its peers: the extents of its
    /// activity log, given with [`Resource::restore_suspect`](super::Resource::restore_suspect)
    /// (writes in flight, or completed but maybe not durable). Outdated and unproven like
    /// [`ReplicaAtStart::Existing`], but peers list it only what they know it missed: it
    /// pulls its suspect ranges itself, and only under a Primary (whose list is the only
    /// complete account of what it missed). Until then it waits.
    Crashed,
    /// Its metadata says it stopped cleanly while not consistent (being synced): its data
    /// is of unknown currency, as for [`ReplicaAtStart::Existing`], but what it knew its
    /// peers lack was written whole at the stop and is given back with
    /// [`Resource::restore_peer`](super::Resource::restore_peer). Being synced, it took a
    /// Primary's writes, and may hold the only copy of an acknowledged one (failover seed
    /// 430004651: a replica being synced held a write its up-to-date peer lacked and,
    /// restarted without that claim, pulled the block from the peer over it). After a
    /// crash while not consistent it starts `Existing`: the bitmap pages are as their
    /// extents last left the activity log, and the log's extents, 4 MiB each, would claim
    /// writes every peer holds (a replica killed mid-resync and its up-to-date peer
    /// redialled for ever, each claiming the other lacked a block).
    Inconsistent,
    /// Known to be current (tests).
    UpToDate,
}
