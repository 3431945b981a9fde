//! A few thousand simulated failure schedules on every test run. A longer soak:
//! `cargo run --release -p tandem-sim -- 0 100000`.

use tandem_engine::replica::Protocol;
use tandem_sim::{Family, Knobs, Scenario, Sim};

/// Seeds per run: `TANDEM_SIM_SEEDS`, default 2,000.
fn seed_count() -> u64 {
    std::env::var("TANDEM_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

/// Single faults converge, except where restarts (which outdate a replica until
/// persistent metadata) left no replica of a volume up to date: that cluster must sit
/// still, not spin, and is checked for safety only (rare: at most 0.5%).
#[test]
fn thousands_of_seeds() {
    let count = seed_count();
    match tandem_sim::run_family(0, count, Family::Single) {
        Ok((stuck, cov)) => {
            eprintln!("{cov}");
            assert!(cov.restarted * 40 >= count, "too few restarts: {cov}");
            assert!(cov.resynced * 4 >= count, "too few resyncs: {cov}");
            assert!(cov.lost_disk > 0, "no restart lost its disk: {cov}");
            assert!(
                stuck.len() as u64 * 200 <= count,
                "more than 0.5% of single-fault runs never converged: {stuck:?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// Overlapping faults: a second failure before the first has healed, so a volume may lose
/// every replica for a while. A few schedules do not converge yet (0.02 % of 0..20,000:
/// a 4 KiB block whose newest sectors lie split between two replicas being synced, seed
/// 3164, and others); those are checked for safety only: every request answered, every
/// read correct, nothing acknowledged that reached a replica lost.
/// Stalled Secondaries (`--stalls`: SIGSTOP, then SIGCONT) lose nothing acknowledged and
/// converge; a stall shorter than the request timeout is rarely a drop (only an idle link
/// to the Primary is judged by pings). With every link judged by pings (the rule of
/// `peer::Judge` off), the 78 short stalls in the first 1,000 seeds cost 92 links (and no
/// long one was dropped by the request timeout); with it, the 86 short stalls cost 1.
#[test]
fn stalled_secondaries_lose_nothing_and_short_stalls_are_kept() {
    let count = seed_count() / 2;
    let extra = tandem_sim::Extra {
        stalls: true,
        ..Default::default()
    };
    let b = tandem_sim::run_family_keep_going(0, count, Family::Single, extra);
    let cov = &b.coverage;
    eprintln!("{cov}");
    assert!(b.failed.is_empty(), "failed: {:?}", b.failed);
    assert!(b.stuck.is_empty(), "never converged: {:?}", b.stuck);
    assert!(
        cov.short_stalls * 40 >= count,
        "too few short stalls: {cov}"
    );
    assert!(
        cov.stall_write_timeouts > 0 && cov.stall_silent > 0,
        "no long stall was dropped by the request timeout: {cov}"
    );
    assert!(
        cov.short_stall_drops * 5 <= cov.short_stalls,
        "short stalls cost links: {cov}"
    );
}

#[test]
fn overlapping_faults_lose_nothing_acknowledged() {
    let count = seed_count();
    match tandem_sim::run_family(0, count, Family::Overlapping) {
        Ok((stuck, cov)) => {
            eprintln!("{cov}");
            assert!(cov.restarted * 40 >= count, "too few restarts: {cov}");
            assert!(cov.resynced * 4 >= count, "too few resyncs: {cov}");
            assert!(
                stuck.len() as u64 * 200 <= count,
                "more than 0.5% of overlapping-fault runs never converged: {stuck:?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// Quorum on (a majority), overlapping faults: the Primary, often cut off from every peer,
/// fails or holds its I/O; every write it acknowledges under protocol C is on a majority of
/// the replicas (checked at each acknowledgement), and nothing acknowledged is lost.
#[test]
fn quorum_acknowledges_only_on_a_majority_and_loses_nothing() {
    let count = seed_count();
    match tandem_sim::run_family(0, count, Family::Quorum) {
        Ok((stuck, cov)) => {
            eprintln!("{cov}");
            assert!(
                cov.quorum_lost_runs * 10 >= count,
                "too few quorum losses: {cov}"
            );
            assert!(
                cov.failed_for_quorum > 0,
                "nothing failed for quorum: {cov}"
            );
            assert!(
                stuck.len() as u64 * 200 <= count,
                "more than 0.5% of quorum runs never converged: {stuck:?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// Failover seeds of 0..200 that fail with the engine of 2026-11-26 (main at e284154 and
/// 67a9ac7), each for an engine gap described in `docs/ARCHITECTURE.md` (simulator,
/// failover): a replica back from a kill that another Primary's writes missed and that is
/// promoted or synced without them (17, 49). Drop a seed from the list once the engine
/// passes it (36, 65, 86, 163, 175: passing since the Primary without quorum sets its ids
/// back, 36 and 65 on shifted paths; 124 and 132: a dead Primary's fresh sectors on a sync
/// target give way to the reference, `failover_regressions`; 109: writes apart by a replica
/// whose ids the other descends from are no split brain, `split_brain_regressions`).
/// 27: the same gap as 17 (a write failed for want of quorum, kept by its Primary's
/// replica only, then known to no live node), reached since a promotion with a node away
/// changes the ids at once. 17, 49 (and 109, on a shifted path) pass since a replica back
/// from a crash keeps its claims on a node away from the Primary that settled it
/// (`claims_outlive_their_primary`). 27, cause B (the resync source alone knew), passes
/// on a shifted path since 2026-11-27 (a Primary counts a peer's vote once the peer said
/// which Primaries it follows); the gap itself is open.
const FAILOVER_KNOWN: [u64; 0] = [];

/// Failover seeds where a replica back from a crash dropped its claims on a node it did
/// not reach, trusting the Primary to know (49: its activity log's extents at
/// `CrashSettledByRun`, the rest at its resync's end under that Primary's list); the
/// Primary died, and the node was taken as current without a write only the dropped
/// claims named. 17 passes by the second rule too (not traced further). Claims on a node
/// we do not reach now stay (`writer.rs`, `pull.rs`).
#[test]
fn claims_outlive_their_primary() {
    for seed in [17, 49] {
        Sim::new(Family::Failover.scenario(seed)).run();
    }
}

/// Failover seeds an engine gap left with replicas different, now closed: a write of a
/// Primary killed (or demoted) before it answered landed on a sync target, protected from
/// older resync data as fresh sectors; the replica that later won the contest, which
/// lacked it, listed the range, and the target took the block's other sectors from it and
/// kept the dead Primary's (`Resync::orphan_listed`; 124, 132, 162, 223, 294; 162 failed so
/// with a rule tried and not kept, that a resync from a replica not itself current proves
/// nothing, see `docs/ARCHITECTURE.md`).
#[test]
fn failover_regressions() {
    for seed in [124, 132, 162, 223, 294] {
        Sim::new(Family::Failover.scenario(seed)).run();
    }
}

/// Failover seeds that reported a split brain between ordered ids: a replica, Primary
/// once while the other was away, still claimed blocks on it after the other caught up
/// through a third node, took its ids there and wrote apart as Primary in turn; each side
/// counted the other's writes apart (`Replicas::void_ordered_apart`; 109, 1411, 1477,
/// 2155, 2222, 3195 (the older side's id the root), 3599, 3912; 2254 passes too,
/// unconverged). 3091: a Secondary took a superseded Primary's ids its own descended
/// from, and diverged later (`on_generation` adopts no ancestor).
#[test]
fn split_brain_regressions() {
    for seed in [109, 1411, 1477, 2155, 2222, 3091, 3195, 3599, 3912] {
        Sim::new(Family::Failover.scenario(seed)).run();
    }
}

/// Failover seeds where an old Primary, cut off with writes held (suspend-io), completed
/// them after another node's promotion (the tenure check): a peer that followed the new
/// Primary gave it back its quorum. A promotion with a voter away now changes the ids at
/// once, and a Primary meeting newer ids, or diverged ones it has no quorum without,
/// steps down (`Rotations::superseded`; soak seed 320013211, 398). Soak seeds 337009897
/// and 347003671: the peer that gave the quorum back was a sync target with no ids; a
/// Primary now counts a peer only once it said it follows no other Primary, and steps
/// down when a peer asks about a run of another Primary it never followed
/// (`Replicas::followed_elsewhere`). Soak seed 337009897 left this list when a Primary's
/// crash began keeping the ids it last acknowledged under (`Resource::ids_at_crash`): its
/// path changed, and it now fails in a known open class (a Primary being synced, with
/// quorum from another sync target, crashes Inconsistent and restarts with nothing to
/// rank by; a failed write stays on the other target alone, protected as an orphan).
#[test]
fn superseded_primaries_complete_nothing() {
    for seed in [320_013_211, 398, 347_003_671] {
        Sim::new(Family::Failover.scenario(seed)).run();
    }
}

/// Failover (issue 15, item 6): three nodes, quorum on, partitions of every shape
/// (asymmetric ones too), kills of the Primary, and a cluster manager promoting another
/// node when the Primary is dead or without quorum (`failover.rs`). Checked against one
/// history across Primaries (`history.rs`): no acknowledged write lost, reads never older
/// than a write acknowledged before they began, writes of two Primaries ordered by their
/// tenures. 200 seeds (a tenth of the others: a run costs about ten times more); failures
/// other than the known ones fail the test. Runs whose kills and restarts left no replica
/// up to date (no node promotable 20 s after the last fault) end their workload early and
/// are checked for safety only, as in the other families (3 of 0..200).
#[test]
fn failover_keeps_one_history_across_primaries() {
    let count = seed_count() / 10;
    let b = tandem_sim::run_family_keep_going(0, count, Family::Failover, Default::default());
    let cov = &b.coverage;
    eprintln!("{cov}");
    let unexplained: Vec<_> = (b.failed.iter())
        .filter(|(seed, _)| !FAILOVER_KNOWN.contains(seed))
        .collect();
    assert!(unexplained.is_empty(), "failed: {unexplained:#?}");
    assert!(cov.failover_runs * 3 >= count, "too few failovers: {cov}");
    assert!(
        cov.primary_kills > 0 && cov.asymmetric > 0,
        "faults missing: {cov}"
    );
    assert!(
        cov.refused_no_quorum > 0 && cov.refused_no_up_to_date > 0,
        "refusals missing: {cov}"
    );
    assert!(
        cov.acked_after_failover > 0,
        "no write after a failover: {cov}"
    );
    assert!(
        b.stuck.len() as u64 * 25 <= count,
        "more than 4% of failover runs never converged: {:?}",
        b.stuck
    );
    // A seed reruns identically.
    for seed in (0..20).filter(|s| !FAILOVER_KNOWN.contains(s)) {
        let run = || Sim::new(Family::Failover.scenario(seed)).run();
        assert_eq!(run(), run(), "failover seed {seed}");
    }
}

/// Failover with probing clients (`--probes`): half the clients that auto-promote a node
/// leave at once, the node stepping down, and the next one attaches within 0.5 ms. A
/// Primary whose ids are changing steps down only once its peers answered (real-daemon
/// test `cut_link_and_heal`: promoted again before the answer came, a diskless Primary
/// took a replica's older ids, rotated apart from its own, and stepped down for them,
/// failing the client's writes with EIO; with probes, 14 of 1,500 failover schedules
/// from 497M had a node step down for ids it had held itself, 1 since). The same checks
/// as the failover family.
#[test]
fn failover_with_probing_clients_keeps_one_history() {
    let count = seed_count() / 10;
    let extra = tandem_sim::Extra {
        probes: true,
        ..Default::default()
    };
    let b = tandem_sim::run_family_keep_going(0, count, Family::Failover, extra);
    let cov = &b.coverage;
    eprintln!("{cov}");
    assert!(b.failed.is_empty(), "failed: {:#?}", b.failed);
    assert!(
        cov.probes * 10 >= count && cov.probes_followed * 10 >= count,
        "too few probes: {cov}"
    );
    assert!(
        b.stuck.len() as u64 * 25 <= count,
        "more than 4% of failover runs never converged: {:?}",
        b.stuck
    );
}

/// Quorum with stalls: seed 303006807 acknowledged a write held by the Primary alone,
/// connected to a majority whose other member had come back while the write was in flight
/// (now a write needs a majority of holders, `Replicas::quorum_holds`).
#[test]
fn quorum_regressions() {
    for seed in [303006807, 303008199, 303019440, 303028187] {
        Sim::new(Family::Quorum.scenario(seed).with_stalls()).run();
    }
}

/// One node's disk fails, for good (every later write, read and fdatasync on it returns
/// EIO) or at one write or one fdatasync only: the engine detaches the replicas the EIO
/// was for (and issues no more reads or writes on them), the Primary goes on with the
/// others (diskless if it was its own disk), knows the failed replica lacks what was
/// written after, and nothing acknowledged is lost while an up-to-date replica is
/// reachable. One failure at a time otherwise; runs left with no up-to-date replica are
/// checked for safety only (none of 0..20,000 since 2026-11-26).
#[test]
fn disk_errors_detach_the_replica_and_lose_nothing() {
    let count = seed_count();
    match tandem_sim::run_family(0, count, Family::DiskErrors) {
        Ok((stuck, cov)) => {
            eprintln!("{cov}");
            assert!(
                cov.disk_failures * 10 >= count,
                "too few disk failures: {cov}"
            );
            assert!(
                cov.primary_disk_failures * 50 >= count,
                "too few Primaries lost their disk: {cov}"
            );
            assert!(
                cov.one_off_eios * 25 >= count,
                "too few failures of one write or fdatasync: {cov}"
            );
            assert!(
                cov.detached * 10 >= count,
                "too few replicas detached by the engine: {cov}"
            );
            assert!(
                stuck.len() as u64 * 200 <= count,
                "more than 0.5% of disk-error runs never converged: {stuck:?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// Restarts that are power losses: per 4 KiB block, what the node wrote since its last
/// fdatasync is kept, lost, or torn per sector. The node comes back Outdated (until
/// metadata), and every replica must end identical with every acknowledged write.
#[test]
fn power_losses_lose_nothing_acknowledged() {
    let count = seed_count();
    match tandem_sim::run_family(0, count, Family::PowerLoss) {
        Ok((stuck, cov)) => {
            eprintln!("{cov}");
            assert!(cov.power_lost * 20 >= count, "too few power losses: {cov}");
            assert!(
                cov.sectors_reverted > 0,
                "no power loss took anything: {cov}"
            );
            assert!(
                stuck.len() as u64 * 200 <= count,
                "more than 0.5% of power-loss runs never converged: {stuck:?}"
            );
        }
        Err(e) => panic!("{e}"),
    }
}

/// Every node crashes at once in the middle of the workload, the Primary included (kill
/// -9, its page cache kept; in the power-loss variant most nodes also lose what no
/// fdatasync made durable), or in some runs the Primary alone. Requests in flight are
/// abandoned (no answer: they may or may not have happened); every node restarts from what
/// its metadata kept, with no Primary, and the replicas must settle among themselves (the
/// one ranked first by its generation ids UpToDate, the others pulling from it) before
/// node 0 is promoted again, which must happen within the stuck window; the workload then
/// goes on. Every write acknowledged, before the crash too, must be there (except, after a
/// power loss, one no FLUSH or FUA made durable; and after a crash of every node, one a
/// diskless Primary acknowledged under protocol B before a peer had written it), the
/// replicas identical, every run converged. 800 seeds of each variant (`TANDEM_SIM_SEEDS`
/// × 2/5), about 15 s in the test profile; `tandem-sim FROM COUNT --cluster-crash
/// [--power-loss]` for more.
#[test]
fn cluster_crashes_lose_nothing_acknowledged() {
    let count = seed_count() * 2 / 5;
    for family in [Family::ClusterCrash, Family::PowerLossClusterCrash] {
        match tandem_sim::run_family(0, count, family) {
            Ok((stuck, cov)) => {
                eprintln!("{}: {cov}", family.name());
                assert!(
                    stuck.is_empty(),
                    "{}: runs that never converged: {stuck:?}",
                    family.name()
                );
                assert!(
                    cov.cluster_crashes * 2 >= count,
                    "too few crashes of every node: {cov}"
                );
                assert!(
                    cov.primary_crashes * 10 >= count,
                    "too few crashes of the Primary: {cov}"
                );
                assert!(
                    cov.diskful_primary_crashes * 20 >= count,
                    "too few crashes of a Primary keeping a replica: {cov}"
                );
                assert!(
                    cov.proven_by_generation_runs * 2 >= count,
                    "too few replicas proven by generation ids: {cov}"
                );
                assert!(cov.promote_refusals > 0, "no promotion was refused: {cov}");
                assert!(
                    cov.abandoned > 0,
                    "no request was in flight at a crash: {cov}"
                );
                if family == Family::PowerLossClusterCrash {
                    assert!(cov.power_lost * 2 >= count, "too few power losses: {cov}");
                    assert!(
                        cov.lossy > 0,
                        "no power loss could take an acknowledged write: {cov}"
                    );
                }
            }
            Err(e) => panic!("{e}"),
        }
        for seed in 0..20 {
            let run = || Sim::new(family.scenario(seed)).run();
            assert_eq!(run(), run(), "seed {seed}, {family:?}");
        }
    }
}

/// Engine gaps the crash families found and this session closed, checked in every run:
/// - 40: a replica that was not consistent when every node crashed (being synced) was
///   synced by the contest's winner and stayed unproven; the Primary promoted later set all
///   its out-of-sync bits for it without listing them, and the run never converged (now a
///   resync from an up-to-date source with every node met and none Primary proves it).
/// - 97: a node's `SyncPlan` starts clean after the crash, so the first FLUSH was answered
///   without an fdatasync while the page cache still held writes acknowledged before the
///   kill -9 (now every backing file is fdatasync'ed at start, as `tandem node` does).
/// - 738: only a diskless Primary knew which writes a cut-off Secondary missed; after a
///   crash of every node that Secondary, older by its ids, was synced only from the
///   winner's bitmaps (now a restarted replica lists an older one everything when no
///   Primary is around: no bitmap is tied to the ids it covers yet, as DRBD's bitmap UUID).
/// - 2925 (`--power-loss`): a replica not consistent at the crash pulled from a contender
///   that was itself being synced (now an unsettled replica is no source).
/// - 117: two replicas that restored bitmaps (with their activity logs) against each other
///   were synced from the winner, then met: each listed the other its stale claims, "each
///   replica lacks writes of the Primary that the other has", and they redialled forever
///   (now a restarted replica synced from the reference, or under a Primary's list, drops
///   what it restored of what the others lack).
/// - 381: the Primary alone crashed and, promoted again while pulling its crashed extents,
///   wrote a range whose resync reply (read on the peer before that write reached it)
///   landed after it, over the newer data: an acknowledged write lost (now a Primary being
///   synced protects what it writes from older resync data, as a Secondary does what the
///   Primary writes to it).
/// - 52: the Primary alone crashed while a write was in flight; one Secondary wrote it, the
///   other never received it, and nothing reconciled the two: the replicas differed for
///   good (about 60 % of the crash family's failures). Now Secondaries that lose the
///   Primary with writes it never settled compare what they received (`PrimaryLost`), and
///   the one that received more lists its unsettled writes to the other.
/// - 2693: under a diskless Primary, a write in flight when every node crashed was written
///   and synced on one Secondary, whose activity log let go of it once written, and never
///   reached the other: nothing named it. Now a Secondary holds a Primary's write in its
///   log until the Primary says every replica has it (peer acks, `RAction::Settled`).
/// - 74 (and `--power-loss` 418): the contest's winner synced a replica before every node
///   had met, so that replica stayed unproven; promoted, the winner marked all of it
///   without telling it (its list was sent already), and the run never went quiet. Now
///   bits a Primary sets for a peer it has listed to are listed again.
/// - 141005682: a Secondary stopped cleanly with a protocol-B write received and not yet
///   written; after every node crashed it was the cleanest replica, the contest made it the
///   source, and the acknowledged write was lost. Now a replica with writes still to land
///   is not kept consistent across a clean stop.
/// - 215025115 (with power loss): a diskful Primary's own resync ended with a write in
///   flight; the one current peer's link dropped before it answered, and the write failed
///   although it had landed on the Primary's replica, up to date by then. Now a replica
///   turning UpToDate vouches for the writes in flight it takes.
/// - 300200352 (the family's Secondaries may stop cleanly instead of crashing since the
///   eleventh session): a Secondary shut down cleanly as every other node crashed kept a
///   write of the Primary no other replica received; the clean stop forgot it, the
///   replica won the contest as the cleanly stopped one, and the replicas stayed
///   different. Now a replica holding writes of a Primary not settled cannot stop cleanly
///   (`NotQuiet::Unsettled`: `tandem node` leaves its metadata as after a crash).
/// - 267015082 (with power loss): a diskless Primary's FLUSH, answered by node 2, completed
///   when node 1's link dropped before node 1 answered its barrier; the Primary's new
///   generation ids (node 1 may hold the current ones) were still on their way to node 2
///   when every node crashed. Both replicas came back with the same ids, node 1 won the
///   contest by its lower node id, and node 2 pulled its activity log's extents back from
///   it: a write the FLUSH had made durable was gone from both. Now a FLUSH (or FUA
///   write) whose barrier missed a replica that may hold the current ids waits for them
///   to change, as a write that missed one does.
/// - 330002298, 330003015, 330004162, 331013103, 331024764, 331036895, 331038056 (soak of
///   2026-11-26, the four last with power loss): a replica synced under a Primary's list
///   kept its claims on a node away from it (838434b, so that they outlive a Primary that
///   dies first); that node came back with the Primary still up, the two listed each
///   other stale claims and redialled until the event limit. Now kept claims go when the
///   node returns while that Primary's run is connected (`PeerVol::kept`).
/// - 456019065 (soak of 2026-11-28, with power loss): node 1 lost power, and every node
///   crashed before it met a peer again; back with the same ids as node 2, whose process
///   alone had crashed, it won the contest by node id, and node 2 pulled node 1's
///   reverted block over a write a later FLUSH counted as durable. Now a replica whose
///   suspect ranges come from a power loss ranks below one that kept its page cache
///   (`volume_flags::LOST_POWER`), through a second crash in the same boot too.
#[test]
fn cluster_crash_regressions() {
    for (seed, family) in [
        (40, Family::ClusterCrash),
        (97, Family::ClusterCrash),
        (738, Family::ClusterCrash),
        (117, Family::ClusterCrash),
        (381, Family::ClusterCrash),
        (52, Family::ClusterCrash),
        (2693, Family::ClusterCrash),
        (74, Family::ClusterCrash),
        (141005682, Family::ClusterCrash),
        (300_200_352, Family::ClusterCrash),
        (2925, Family::PowerLossClusterCrash),
        (418, Family::PowerLossClusterCrash),
        (215_025_115, Family::PowerLossClusterCrash),
        (267_015_082, Family::PowerLossClusterCrash),
        (330_002_298, Family::ClusterCrash),
        (330_003_015, Family::ClusterCrash),
        (330_004_162, Family::ClusterCrash),
        (331_013_103, Family::PowerLossClusterCrash),
        (331_024_764, Family::PowerLossClusterCrash),
        (331_036_895, Family::PowerLossClusterCrash),
        (331_038_056, Family::PowerLossClusterCrash),
        (456_019_065, Family::PowerLossClusterCrash),
    ] {
        Sim::new(family.scenario(seed)).run();
    }
}

/// Two engine gaps the disk-errors family found, now closed and checked in every run:
/// seed 683, a peer's write that waited behind an overlapping one when node 1's replica
/// detached (its fdatasync failed) was issued to the detached disk when the first landed
/// (`ApplyQueue::detach` now refuses what waits, completed as failed); soak seed
/// 90004521, a failed write whose only acknowledgement was lost with a link had landed on
/// that Secondary, and the Primary did not mark it for the detached replica, which then
/// differed from the live ones unknown to it (`Requests::finish_write` now marks a
/// detached replica for every write it missed, like DRBD's diskless peers); soak seed
/// 94003653, with protocol B the detached replica refused a write at once while an older
/// overlapping one was still in flight there, the older one's acknowledgement came after
/// and the Primary took it for the newest data of the range (now the refusal waits its
/// turn in the apply queue); soak seed 94017354, a dead disk failed a read for a peer and
/// the replica stayed UpToDate (now a failed peer or resync read detaches it too); soak
/// seeds 94000749 and 94021068, a sync started ahead of a flush failed with no flush
/// waiting, and writes kept going to the failed disk until the next flush (now
/// `Resource::sync_failed` detaches at once); soak seed 110042041, a replica back from a
/// clean stop listed blocks it had marked for the other, which had since pulled them from
/// the Primary and was up to date with newer generation ids: the two redialled forever
/// (now the newer one lists them back, and the older one takes its version).
#[test]
fn disk_errors_regressions() {
    for seed in [
        683, 90004521, 94003653, 94017354, 94000749, 94021068, 110042041,
    ] {
        if let Err(e) = tandem_sim::run_family_with(seed, 1, Family::DiskErrors, Default::default())
        {
            panic!("{e}");
        }
    }
}

/// Regressions found with overlapping faults. Seeds 31 and 1891: a write that failed had
/// landed on one Secondary only, and the other Secondary was never told it lacked it, so
/// the replicas differed after the heal. Seed 5603: a Secondary listed by the diskful
/// Primary pulled from the other Secondary, which was cut off from the Primary and lacked
/// an acknowledged write without knowing it (now the Primary is the source whenever it
/// keeps an up-to-date replica). Seed 26135: a FLUSH answered by a replica being synced
/// alone, which lacked a write only a replica gone meanwhile had (now only a replica
/// UpToDate when it acknowledges answers for its volume). Two more bugs these runs found,
/// a resync source that did not yet know what it lacked and writes queued behind a failed
/// one left unanswered, have engine tests in `crates/engine/tests/replica.rs`. Seed
/// 3017270: a write that failed (its FUA flush reached only a replica being synced) had
/// landed on that replica, and the Primary never marked it for the replica that was cut
/// off. Seed 5001807: a protocol-B receipt counted as
/// written, although the receiver died before writing. Seed 2021338: resync overwrote a
/// write the Primary sent before its list. Seed 30028803: a resync read finishing after
/// its connection dropped made the source forget a write the peer had missed since. Seed
/// 30093754: a write failed when the only replica it was sent to dropped, while another
/// had connected after it started (a request goes to the replicas connected when it
/// starts; the checker now says so). Seed 60017710: a resync source learned it lacked a
/// block while reading it for a restarted peer, and served it anyway. Seed 60032299: a
/// restarted replica being synced in full from a peer that was behind was met by the
/// Primary, which listed only what it knew the replica had missed (now an unproven
/// replica says so, and is listed in full). Seed 80045903: the same, with the restarted
/// replica's resync finished before the Primary returned (it stays unproven, and a diskful
/// Primary lists everything to it). Seed 80087183: a resync reply lost with the link; the
/// source had already forgotten the range (now put back when the connection ends).
/// Seed 101022420: a Secondary cut off before any write came back after a crash while
/// the other, which had every write since, crashed too; the only knowledge of what the
/// first missed was the second's bitmap, dropped at its crash (a crashed replica now
/// restores the bitmaps its metadata kept). Seed 109066599: a write failed after its only
/// target received and wrote it; nobody marked the replica that was away, which kept an
/// older write there protected from resync data (a write some replica received now marks
/// the replicas that never got it). Seed 286090154: a FLUSH's barrier reached a replica
/// back from a cut before the Primary's list did; it answered as UpToDate, and with the
/// replica that held an earlier write gone, the FLUSH completed with that write durable
/// nowhere (a replica the Primary knows lacks blocks now answers for no FLUSH). Seed
/// 451053910: a replica's resync ended, and it took the diskless Primary's ids, as its link
/// to the Primary dropped; the Primary never heard, kept its ids, and a write it then
/// acknowledged on the other replica alone was lost when both replicas came back from
/// crashes under those equal ids (a replica being synced, once lost, now makes the next
/// write it misses wait for the Primary's ids to change: `VolRotation::unheard`).
#[test]
fn overlapping_fault_regressions() {
    for seed in [
        31, 1891, 5603, 26135, 3017270, 5001807, 2021338, 30028803, 30093754, 60017710, 60032299,
        80045903, 80087183, 101022420, 109066599, 286090154, 451053910,
    ] {
        let mut sc = Scenario::random(seed);
        sc.overlapping_faults = true;
        Sim::new(sc).run();
    }
}

/// Overlapping soak seed 326058706 (2026-11-26, engine 961825b): the Primary's write
/// reached node 1 just before node 1's resync began; node 1 pulled the block from the
/// Primary, whose resync read ran before its own write of it landed, and the older data
/// overwrote the acknowledged write on node 1. Writes of a connected Primary not settled
/// when a resync begins are now fresh in it (`Replicas::resync_mut`).
#[test]
fn a_write_received_just_before_a_resync_is_kept() {
    let out = Sim::new(Family::Overlapping.scenario(326_058_706)).run();
    assert!(out.converged, "the replicas converge");
}

/// An engine gap (overlapping soak 83,000,000+, found 2026-11-25; fails with the engine of
/// ec571bf too, so older than the metadata work): a write that failed landed on node 1 only;
/// node 1 told node 2 at once (live OutOfSync), but node 2, being synced, had an older
/// write of the Primary in that range marked fresh (protected from resync data), and only
/// a Primary's list voids that protection. Node 2 kept the older sectors, node 1 the newer:
/// replicas differ at the end. Voiding on any live notice is not safe either (a newer write
/// may reach us before the notice of the older one): it needs an order between a notice
/// and our writes (DRBD's dagtags, or the generation ids of issue 14). The seed passes on
/// 2026-11-26 (already with the engine of 00441e9): whether the rules for failed writes
/// since (the reference of a failed write, `unanswered_lost`) closed the gap or the
/// schedule no longer reaches it was not analysed. Kept as a regression seed.
#[test]
fn overlapping_fault_seed_83055400() {
    let mut sc = Scenario::random(83055400);
    sc.overlapping_faults = true;
    Sim::new(sc).run();
}

/// Overlapping seed 232031512 (soak of 2026-11-26, engine 97144ae): a block the Primary's
/// write covered whole on a replica being synced stayed to pull, and the other replica,
/// lacking it too, refused it for ever while this one refused it the blocks after. Such a
/// block now leaves the pull (`Resync::written_whole`).
#[test]
fn a_block_written_whole_during_a_resync_converges() {
    let out = Sim::new(Family::Overlapping.scenario(232_031_512)).run();
    assert!(out.converged, "overlapping seed 232031512");
}

/// Overlapping seed 232029211 (soak of 2026-11-26, engine 97144ae): a write unanswered on
/// node 2's dropped link had not been sent to node 1, which pulled the range afterwards
/// and turned UpToDate; node 2, back with older ids, was still the reference there, and
/// each refused the other for ever. Node 1 is a source again for it
/// (`Replicas::caught_up_after_failure`).
#[test]
fn a_replica_that_pulled_a_failed_write_is_its_source_again() {
    let out = Sim::new(Family::Overlapping.scenario(232_029_211)).run();
    assert!(out.converged, "overlapping seed 232029211");
}

/// Overlapping seeds 232068286 (soak of 2026-11-26, engine 97144ae) and 238001624 (soak
/// 238,000,000): a Secondary kept claims on a replica the Primary had synced, its `InSync`
/// ignored because the two had just met (232068286) or never sent to it because it was
/// away from the Primary then (238001624); the two redialled for ever. The word applies on
/// a connection where the synced replica said UpToDate, and a replica the Primary syncs
/// hears it of every replica that holds all its writes (`Replicas::on_in_sync`,
/// `Replicas::tell_in_sync_peers`).
#[test]
fn stale_claims_on_a_replica_the_primary_synced_go() {
    for seed in [232_068_286, 238_001_624] {
        let out = Sim::new(Family::Overlapping.scenario(seed)).run();
        assert!(out.converged, "overlapping seed {seed}");
    }
}

/// Overlapping seed 238083584 (soak 238,000,000): a failed write's holder, its UpToDate
/// report crossing the Primary's decision, was told to pull the write back from the
/// write's reference, away; at the reference's return from a clean stop the holder took its
/// stale claims, and each waited for the other. The holder, being synced only since the
/// Primary's live notice, counters them (`Replicas::current_but_for`), and pulls from the
/// restarted reference under the connected Primary (`pick_source`).
#[test]
fn a_pull_back_crossing_an_up_to_date_report_converges() {
    let out = Sim::new(Family::Overlapping.scenario(238_083_584)).run();
    assert!(out.converged, "overlapping seed 238083584");
}

/// Overlapping seed 384011407 (soak of 2026-11-27, engine 0d73d30): a replica crashed twice
/// claimed its activity log's extents on a peer back from a crash too, whose ids descended
/// from its own; that peer, which had heard the Primary's role but not its list, took the
/// claims, and each waited for the other with no up-to-date replica left. The older one
/// yields them, under a Primary as without one (`Replicas::crashed_meets_newer`).
#[test]
fn a_crashed_replica_yields_to_a_newer_crashed_peer() {
    let out = Sim::new(Family::Overlapping.scenario(384_011_407)).run();
    assert!(out.converged, "overlapping seed 384011407");
}

/// Failover seeds 237 and 2861: a failed write of a dead Primary, pulled by one replica,
/// stayed missing on the third. 2861: the source did not reach the third node, linked to
/// the puller alone, which now tells it (`Replicas::resync_reply`, `lacking`). 237: a
/// replica back from a crash mid-resync restarted without its ids (it was being synced),
/// pulled only what an Inconsistent peer knew it lacked and called itself UpToDate; it now
/// waits, Outdated, for a current replica's full list (`Replicas::resync_finished`).
#[test]
fn a_failed_write_pulled_by_one_replica_reaches_the_third() {
    for seed in [237, 2861] {
        Sim::new(Family::Failover.scenario(seed)).run();
    }
}

/// Restarts that lose the whole disk (a replaced disk, a deleted backing file): the node
/// comes back with an empty replica it created, which must be synced in full before it
/// serves a read or counts as a copy. Every read and the final contents are checked, so
/// an empty replica taken for UpToDate fails here. New clusters (every replica created
/// at start) are UpToDate once their nodes meet, without a sync.
#[test]
fn restarts_that_lose_the_disk_lose_nothing() {
    let (mut lost, mut fresh) = (0, 0);
    for seed in 0..3000 {
        let mut sc = Scenario::random(seed);
        if !sc.restarts {
            continue;
        }
        sc.lose_disks = true;
        fresh += usize::from(sc.fresh_start);
        let out = Sim::new(sc).run();
        assert!(out.converged, "seed {seed}");
        lost += out.disks_lost;
    }
    eprintln!("{lost} disks lost, {fresh} new clusters");
    assert!(lost >= 20, "only {lost} restarts lost their disks");
    assert!(fresh >= 5, "only {fresh} new clusters");
}

/// Regression of a new cluster (every replica created at start): seed 40014553 found the
/// nodes dropping each other over resync replies to a resync the new-cluster rule had
/// just dropped, then a Primary still being synced losing a write to older resync data
/// that reached its disk last (engine test
/// `a_primary_being_synced_writes_after_the_resync_write_to_the_same_range`).
#[test]
fn new_cluster_regressions() {
    let seed = 40014553;
    let out = Sim::new(Scenario::random(seed)).run();
    assert!(out.converged, "seed {seed}");
}

#[test]
fn a_seed_reproduces_exactly() {
    for seed in 0..100 {
        // The crash families are checked in their own test, failover too (it has known
        // failing seeds: `failover_keeps_one_history_across_primaries`).
        for family in Family::ALL
            .into_iter()
            .filter(|f| f.scenario(seed).crash.is_none() && *f != Family::Failover)
        {
            let run = || Sim::new(family.scenario(seed)).run();
            assert_eq!(run(), run(), "seed {seed}, {family:?}");
        }
    }
}

#[test]
fn every_protocol_and_shape_without_faults() {
    for protocol in [Protocol::A, Protocol::B, Protocol::C] {
        for diskful in [
            vec![true, true],
            vec![false, true, true],
            vec![true, true, true],
        ] {
            let sc = Scenario {
                seed: 7,
                protocol,
                diskful,
                sizes: vec![256 << 10],
                no_replica: Vec::new(),
                ops: 300,
                max_in_flight: 8,
                faults: false,
                restarts: false,
                overlapping_faults: false,
                fresh_start: false,
                lose_disks: false,
                disk_errors: false,
                one_off_eio: false,
                power_loss: false,
                clean_stops: false,
                pending_checks: false,
                knobs: Knobs::default(),
                crash: None,
                stalls: false,
                failover: false,
                probes: false,
            };
            let out = Sim::new(sc).run();
            assert_eq!(out.failed, 0, "{protocol:?}: nothing fails without faults");
            assert_eq!(out.completed, 300);
        }
    }
}

#[test]
fn several_volumes_of_different_sizes_without_faults() {
    for protocol in [Protocol::A, Protocol::B, Protocol::C] {
        for (diskful, no_replica) in [
            (vec![true, true], vec![]),
            (vec![false, true, true], vec![]),
            (vec![true, true, true], vec![(0, 1)]),
            (vec![true, true, true], vec![(2, 0)]),
        ] {
            let sc = Scenario {
                seed: 11,
                protocol,
                diskful,
                sizes: vec![256 << 10, 128 << 10, 100 << 10],
                no_replica,
                ops: 300,
                max_in_flight: 8,
                faults: false,
                restarts: false,
                overlapping_faults: false,
                fresh_start: false,
                lose_disks: false,
                disk_errors: false,
                one_off_eio: false,
                power_loss: false,
                clean_stops: false,
                pending_checks: false,
                knobs: Knobs::default(),
                crash: None,
                stalls: false,
                failover: false,
                probes: false,
            };
            let out = Sim::new(sc).run();
            assert_eq!(out.failed, 0, "{protocol:?}: nothing fails without faults");
            assert_eq!(out.completed, 300);
        }
    }
}

#[test]
fn a_good_fraction_of_seeds_has_several_volumes() {
    let multi = (0..1000)
        .filter(|&s| Scenario::random(s).sizes.len() > 1)
        .count();
    let partial = (0..1000)
        .filter(|&s| !Scenario::random(s).no_replica.is_empty())
        .count();
    assert!((400..600).contains(&multi), "{multi} of 1000");
    assert!(partial > 20, "{partial} of 1000");
}

/// Regressions: a Primary that keeps only volume 0 answered a FLUSH (seed 47) and a FUA
/// write (seed 196) on volume 1 with its own fdatasync, after every replica of volume 1 had
/// gone; the write acknowledged before was durable nowhere. Overlapping faults are needed
/// to lose both replicas of volume 1.
#[test]
fn a_flush_is_answered_only_by_replicas_of_its_volume() {
    for (seed, protocol, sizes, max_in_flight, restarts) in [
        (47, Protocol::A, vec![256 << 10, 256 << 10], 1, false),
        (196, Protocol::C, vec![256 << 10, 128 << 10], 6, true),
    ] {
        let sc = Scenario {
            seed,
            protocol,
            diskful: vec![true, true, true],
            sizes,
            no_replica: vec![(0, 1)],
            ops: 200,
            max_in_flight,
            faults: true,
            restarts,
            overlapping_faults: true,
            fresh_start: false,
            lose_disks: false,
            disk_errors: false,
            one_off_eio: false,
            power_loss: false,
            clean_stops: false,
            pending_checks: false,
            knobs: Knobs::default(),
            crash: None,
            stalls: false,
            failover: false,
            probes: false,
        };
        Sim::new(sc).run();
    }
}

#[test]
fn restarted_secondaries_are_resynced() {
    let mut resyncs = 0;
    for seed in 0..200 {
        let mut sc = Scenario::random(seed);
        sc.restarts = true;
        sc.faults = false;
        resyncs += Sim::new(sc).run().resyncs;
    }
    assert!(resyncs > 0, "the restart schedules must exercise resync");
}

/// Regressions: a link that drops during a resync and comes back. The sync target had
/// protected sectors the application wrote during the resync from older resync data; the
/// protection outlived the connection, so a later write it missed there (listed again by
/// the Primary) was never pulled and the replica ended UpToDate with stale data. Seed 926:
/// two nodes; seed 1994: three, with a restart.
#[test]
fn a_resync_interrupted_by_a_flapping_link_pulls_what_was_listed_again() {
    for (seed, diskful, max_in_flight, restarts) in [
        (926, vec![true, true], 2, false),
        (1994, vec![true, true, true], 1, true),
    ] {
        let sc = Scenario {
            seed,
            protocol: Protocol::C,
            diskful,
            sizes: vec![256 << 10],
            no_replica: vec![],
            ops: 200,
            max_in_flight,
            faults: true,
            restarts,
            overlapping_faults: true,
            fresh_start: false,
            lose_disks: false,
            disk_errors: false,
            one_off_eio: false,
            power_loss: false,
            clean_stops: false,
            pending_checks: false,
            knobs: Knobs::default(),
            crash: None,
            stalls: false,
            failover: false,
            probes: false,
        };
        Sim::new(sc).run();
    }
}

/// Overlapping-fault runs that never converged (about 70 % of the unconverged ones): a
/// diskless Primary's last replica received a protocol-B write (seed 621: the link
/// dropped before its write acknowledgement; seed 479: a FUA write failed after the
/// receipt) and was then marked as lacking it, though no other replica could hold it: it
/// went Inconsistent with no source, for good. Now such a mark waits for the replica's
/// return and stands only if it restarted since (`volume_flags::MET_BEFORE` absent).
#[test]
fn a_sole_holder_is_not_marked_as_lacking_its_write() {
    for seed in [621, 479, 1749] {
        let out = Sim::new(Family::Overlapping.scenario(seed)).run();
        assert!(out.converged, "seed {seed}");
    }
}

/// Overlapping seed 1799 (found with peer acks): a replica up to date under the Primary
/// met a peer with newer ids and took back what it had claimed the peer lacked, as if the
/// peer had listed it; the peer's list on that connection had ended long before, so the
/// resync waited for an end that never came and the replica stayed Inconsistent for good.
#[test]
fn claims_taken_back_after_the_peers_list_ended_wait_for_no_list() {
    let out = Sim::new(Family::Overlapping.scenario(1799)).run();
    assert!(out.converged);
}

/// Overlapping seed 1574: under a diskless Primary, a FUA write landed only on the replica
/// being synced (its barrier could not vouch for it, so it failed) while the link to the
/// up-to-date replica dropped. The Primary marked the up-to-date replica as lacking the
/// write, which left no replica up to date and the range's newest data split between the
/// two. Now the replica being synced is marked instead and pulls the range back.
#[test]
fn a_failed_write_held_only_by_a_replica_being_synced_is_pulled_back() {
    let out = Sim::new(Family::Overlapping.scenario(1574)).run();
    assert!(out.converged);
}

/// Overlapping seed 3731: the only up-to-date Secondary was killed with a write in flight
/// (which then failed) while the other, stopped long before, was behind. Back in the same
/// boot under the same run of the Primary, its activity log's extents are settled by that
/// Primary (`writer.rs`), and the write in flight, which nothing else may hold, leaves its
/// content as the range's: the other pulls from it, instead of both waiting for a source.
#[test]
fn a_crashed_secondary_under_the_same_primary_run_is_the_source_again() {
    let out = Sim::new(Family::Overlapping.scenario(3731)).run();
    assert!(out.converged);
}

/// Overlapping seed 5730: two Secondaries cut off from each other each missed writes in
/// turn while cut off from the Primary, and each was synced by it; their claims on each
/// other were stale, each took the other's for a conflict only the Primary could settle,
/// and they redialled forever. The Primary's `InSync` (`in_sync.rs`) drops such claims as
/// each sync ends.
#[test]
fn secondaries_the_primary_synced_in_turn_do_not_redial_forever() {
    let out = Sim::new(Family::Overlapping.scenario(5730)).run();
    assert!(out.converged);
}

/// Disk-errors seed 4826: the only replica (the Primary's own disk had failed) stopped
/// cleanly while a write it received was landing; the simulator took the state before the
/// write landed, so the replica restarted unproven and could never be proven again.
/// `tandem node` lets received writes land before it takes the state (`peers_gone`); the
/// simulator's clean stop now does too.
#[test]
fn the_only_replica_stopped_cleanly_with_writes_landing_comes_back_up_to_date() {
    let out = Sim::new(Family::DiskErrors.scenario(4826)).run();
    assert!(out.converged);
}

/// Disk-errors seed 2934 (found with the rule above): a protocol-B write acknowledged at
/// receipt by the last replica, which was killed before writing it, was taken for a write
/// in flight, and the replica's stale content for the range's: an acknowledged write was
/// lost. Acknowledged writes only it may hold still mark it at its return (`unconfirmed`),
/// apart from those in flight (`unanswered`). Since a diskless Primary with one up-to-date
/// replica waits for it to write (`AppWrite::protocol`), no such write exists: the run
/// converges with every acknowledged write.
#[test]
fn an_acknowledged_write_only_a_killed_replica_held_is_not_its_content() {
    let out = Sim::new(Family::DiskErrors.scenario(2934)).run();
    assert!(out.converged);
}

/// Unconverged runs of 0..20,000 (2026-11-26), each a diskless Primary whose last current
/// replica went away with writes in flight, and now converged with every acknowledged
/// write:
/// - the replica held writes no other could (`unconfirmed`), was back from a crash or a
///   clean stop, and was marked as lacking them: overlapping 2465, 9180, 3746, 7445,
///   11288, disk-errors 7484 (now settled as writes in flight at its loss, or dropped after
///   a clean stop);
/// - the last current replica crashed and its activity log's extents had no source, the
///   contest by generation ids being off under any Primary: overlapping 7927, 8615, 9259
///   (now a diskless Primary does not stop it);
/// - a failed write's up-to-date holder, whose answer was lost with its link, was marked,
///   and a replica being synced held only the write's sectors of a block: 7391 (now the
///   reference);
/// - the only up-to-date replica was killed after its receipt of a protocol-B write and
///   before writing it: overlapping 3459, 17948 (the acknowledged write was gone; now the
///   Primary waits for the write there).
#[test]
fn a_diskless_primarys_last_current_replica_going_away_converges() {
    for seed in [
        2465, 9180, 3746, 7445, 11288, 7927, 8615, 9259, 7391, 3459, 17948,
    ] {
        let out = Sim::new(Family::Overlapping.scenario(seed)).run();
        assert!(out.converged, "overlapping seed {seed}");
    }
    let out = Sim::new(Family::DiskErrors.scenario(7484)).run();
    assert!(out.converged, "disk-errors seed 7484");
}

/// Disk-errors soak seed 163037919 (found with the rule that a write must land on an
/// up-to-date replica): a write acknowledged by a replica finishing its resync, whose
/// `UpToDate` reached the Primary after that acknowledgement, failed once the other
/// replica's link dropped, though the first was up to date by then.
#[test]
fn a_write_on_a_replica_that_finished_its_resync_meanwhile_succeeds() {
    let _ = Sim::new(Family::DiskErrors.scenario(163_037_919)).run();
}

/// Disk-errors soak seed 175058684 (there before this session's changes too): a diskful
/// Primary's write landed on its own replica, whose fdatasync then failed and detached it;
/// the peer's link had dropped under the write, which was then acknowledged with no copy
/// left anywhere. A replica that failed since no longer vouches for a write.
#[test]
fn a_write_only_a_since_detached_replica_held_fails() {
    let _ = Sim::new(Family::DiskErrors.scenario(175_058_684)).run();
}

/// Overlapping soak seed 180025125 (there before this session's changes too): a replica
/// being synced, back on a new connection to the Primary, asked it for a range before its
/// list came; a sector the Primary had written it before the link dropped stayed protected
/// from the reply, and the list left out the block it had served, so nothing voided that
/// protection: the replica said UpToDate without an acknowledged write. The list names the
/// blocks served on its connection before it.
#[test]
fn a_list_names_the_blocks_served_before_it() {
    let _ = Sim::new(Family::Overlapping.scenario(180_025_125)).run();
}

/// The last unconverged runs of overlapping 0..20,000 (2026-11-26) and overlapping soak
/// seed 30002577, each under a diskless Primary:
/// - 7542, 11606, 13206: a write in flight to the only current replica failed when its link
///   dropped; that replica had told the other, which the write missed, that it lacked it.
///   Back, it was marked to pull the range from that other one, which waited for it: each
///   refused the other for ever. A peer the write missed is no source for it now; the
///   returning replica is the reference.
/// - 15630: a replica being synced reported UpToDate as the Primary's notice that it lacked
///   a failed write's range crossed it; the Primary cleared the mark, a write it alone
///   received split a block's newest sectors between it and the reference. The Primary
///   keeps such marks until a ping shows the replica heard them first, and vouches for a
///   write, or takes it, only with a replica holding the blocks it covers in part.
/// - 34041 (20,000..40,000): the reference for failed writes held only by a replica being
///   synced was marked for all of them at its return, for one unrelated mark among their
///   blocks; it is now marked block by block.
/// - 30002577: a Secondary whose link once dropped with writes unsettled met the same run
///   again but recorded no run for good; back from a crash, its log's extents stood as
///   claims on the only current replica, which waited for them from a replica lacking nearly
///   everything. Kept writes that made no claim no longer stop the run being recorded.
/// - 39262, 30003616: under a diskless Primary, a Secondary back from a crash that the
///   Primary's same run settled pulled only from an up-to-date replica, and the other
///   replica, being synced, pulled from no such contender, though each held what the other
///   lacked (30003616: the first also listed a claim, restored from a write that failed,
///   on a block the Primary then listed it). Under that run it pulls from a replica being
///   synced, and lists the others only after that Primary's list, minus what it names.
///   Soak seeds 204010155, 204050846 and 204095975 had the same shapes.
#[test]
fn the_last_unconverged_overlapping_runs_converge() {
    for seed in [
        7542,
        11606,
        13206,
        15630,
        34041,
        39262,
        30_002_577,
        30_003_616,
        204_010_155,
        204_050_846,
        204_095_975,
    ] {
        let out = Sim::new(Family::Overlapping.scenario(seed)).run();
        assert!(out.converged, "overlapping seed {seed}");
    }
}

/// Soak seeds 204041558 and 204040083 (overlapping): a Secondary kept a lost Primary's
/// unsettled writes; the other, back from a crash, answered its comparison with "nothing
/// unsettled here" while that Primary's `Role` (the same run) was on its way to it. The
/// asker claimed its kept write on it a few microseconds before meeting that run itself,
/// which settled the write but not the claim: the crashed replica, the only one holding
/// what the asker lacked, turned to pull the claimed block from the asker, and both
/// waited for good. A node answers only once it knows whether it is connected to that run.
#[test]
fn a_comparison_waits_for_the_primarys_role() {
    for seed in [204_041_558, 204_040_083] {
        let out = Sim::new(Family::Overlapping.scenario(seed)).run();
        assert!(out.converged, "overlapping seed {seed}");
    }
}

/// Soak seed 204006330: a replica back from away said UpToDate before it heard the
/// Primary's list, which named a block a write then covered in part; the Primary refused
/// the write (rule F) with that replica the only one in reach. The checker counts a
/// replica as in reach for a write only where the Primary would let it vouch for it.
#[test]
fn a_write_to_part_of_a_block_its_only_replica_in_reach_lacks_may_fail() {
    let out = Sim::new(Family::Overlapping.scenario(204_006_330)).run();
    assert!(out.converged, "overlapping seed 204006330");
}

/// Soak seeds of a replica current under a connected Primary (`current_under_primary`):
/// - disk-errors 193051170: a Secondary stopped cleanly as the other, synced from it, said
///   UpToDate, and listed the blocks it had served as claims at its return; the other, up
///   to date, became a sync target of a replica that could serve nothing. It now marks the
///   lister instead.
/// - cluster-crash + power-loss 201015450: a replica synced with no Primary around kept
///   older ids, then alone held a Primary's acknowledged write, and yielded its claim to a
///   peer with newer ids that lacked the write. It now keeps the claim.
/// - cluster-crash + power-loss 203039356 and cluster-crash 208008376, 208014974: converge
///   with these rules and the ones for a crash settled by the Primary's run.
#[test]
fn a_replica_current_under_the_primary_outranks_ids() {
    for (seed, family) in [
        (193_051_170, Family::DiskErrors),
        (201_015_450, Family::PowerLossClusterCrash),
        (203_039_356, Family::PowerLossClusterCrash),
        (208_008_376, Family::ClusterCrash),
        (208_014_974, Family::ClusterCrash),
    ] {
        let out = Sim::new(family.scenario(seed)).run();
        assert!(out.converged, "{family:?} seed {seed}");
    }
}

/// Overlapping soak seed 204080907: a failed write's holder whose list from the Primary
/// had not ended made the Primary give up the up-to-date reference and mark it; the
/// holder's list named a block of the range from its time away, and both lacked it. The
/// holder is now told the range live after its list (`pull_back`).
#[test]
fn a_failed_writes_holder_listed_late_pulls_it_back() {
    let out = Sim::new(Family::Overlapping.scenario(204_080_907)).run();
    assert!(out.converged, "overlapping seed 204080907");
}

/// Overlapping soak seed 204004523: a replica being synced alone held the Primary's
/// acknowledged write and marked the other; that one, back with newer ids, said UpToDate
/// before the Primary's list reached it, and the claim was yielded as the holder's to pull:
/// each refused the other for ever. A relay of the connected Primary's own write is now
/// kept (`primary_relays`, a capped list of ranges per peer).
#[test]
fn a_relay_of_the_connected_primarys_write_is_kept() {
    let out = Sim::new(Family::Overlapping.scenario(204_004_523)).run();
    assert!(out.converged, "overlapping seed 204004523");
}

/// Disk-errors seed 245032910 (unconverged with 92e6594 and older builds): under
/// protocol B a diskless Primary's write was received by node 1, whose disk then failed it
/// (`NegAck`, detached), and by node 2, which wrote it as its link dropped unanswered.
/// Node 1's receipt vouched for the write, so the Primary acknowledged it and marked node 2
/// as lacking it; node 1 also relayed the peer ack naming node 2 as a claim. At its return
/// node 2, the only replica left, waited for ever for a source. A replica that failed a
/// write holds nothing: its receipt vouches for nothing while the write is open, and a
/// detached replica claims nothing from peer acks.
#[test]
fn a_receipt_its_replica_then_failed_vouches_for_nothing() {
    let out = Sim::new(Family::DiskErrors.scenario(245_032_910)).run();
    assert!(out.converged, "disk-errors seed 245032910");
}

/// Overlapping seed 244057993 (unconverged with 92e6594 and older builds): node 2, away
/// from the diskless Primary, caught up from node 1 and kept its older ids; node 1 crashed
/// with a write in flight that node 2 was not sent, met node 2 before the Primary and
/// listed it everything (`full_sync_if_older`); the Primary then took node 2 (UpToDate,
/// not marked there) for the source of the write's range and listed it to node 1, which
/// node 2 refused: each waited for the other. A peer with older ids than the returning
/// replica's is no source for its unanswered range (`Replicas::unanswered_lost`).
#[test]
fn an_older_replica_is_no_source_for_a_newer_ones_unanswered_write() {
    let out = Sim::new(Family::Overlapping.scenario(244_057_993)).run();
    assert!(out.converged, "overlapping seed 244057993");
}

/// Disk-errors seed 251048620 (unconverged with 398bd63 and older builds): under
/// protocol A a diskless Primary's FUA write was written by node 1 (`WriteAck`) and
/// received by node 2 (`RecvAck`); node 1's fdatasync then failed under the write's
/// barrier (detached, `BarrierAck` EIO), and node 2 crashed before it answered. The write
/// failed, but node 1's answer still counted it as landed there, so node 2 was marked as
/// lacking it and, back, waited for ever for a source, the only other replica detached. A
/// replica whose flush failed holds nothing: it leaves the open write's holders.
#[test]
fn a_replica_whose_flush_failed_holds_no_fua_write() {
    let out = Sim::new(Family::DiskErrors.scenario(251_048_620)).run();
    assert!(out.converged, "disk-errors seed 251048620");
}

/// Cluster-crash + power-loss seed 279028646 (unconverged with 460dc74 and older builds):
/// a write failed on the diskless Primary as node 1, its reference (up to date, cut off),
/// restarted with a power loss, and node 2, which had turned UpToDate as its report
/// crossed the write's failure, was told to pull the write's range back from node 1.
/// Node 1 came back pulling its activity log's extents, the range among them, from an
/// up-to-date source only; node 2 waited to pull the range from node 1: each waited for
/// the other. Node 2, being synced only since the Primary's live notice on the same
/// connection (`current_but_for`), holds every write that Primary completed there too: it
/// keeps the range and marks node 1 as lacking it (`Replicas::keep_pull_back`).
#[test]
fn a_pull_back_whose_reference_lost_power_converges() {
    let out = Sim::new(Family::PowerLossClusterCrash.scenario(279_028_646)).run();
    assert!(out.converged, "cluster-crash + power-loss seed 279028646");
}

/// Overlapping seed 268029396 (unconverged with 460dc74 and older builds): node 1, being
/// synced, asked node 2 for a chunk of blocks; an acknowledged write of two whole blocks of
/// that chunk landed on node 1 alone meanwhile (`written_whole` took them out of the pull,
/// but they were asked for), and node 2, which missed the write, refused the chunk. The
/// refusal put the whole chunk back in the pull: node 1 waited for the two blocks from node
/// 2, which waited for them from node 1. Blocks written whole since the resync began stay
/// out of the pull at a refusal too (`Resync::refused_by`).
#[test]
fn a_block_written_whole_while_asked_for_converges() {
    let out = Sim::new(Family::Overlapping.scenario(268_029_396)).run();
    assert!(out.converged, "overlapping seed 268029396");
}

/// Failover seeds where a Primary rotated its ids and was killed before it acknowledged
/// anything under them; its metadata now keeps the ids it acknowledged under
/// (`Resource::ids_at_crash`) and names the one it abandoned (`Msg::Abandoned`). 1077,
/// 1352, 2125: a false split brain with the next Primary's rotation from the same ancestor.
/// 1071: a replica that had adopted the abandoned ids ranked newer than all the others,
/// was Inconsistent, and no replica was up to date again; it now sets them back
/// (`Replicas::on_abandoned`). 370000341: two Primaries back from crashes with the same
/// ids, the earlier one Inconsistent, outranked the later one by node id and no replica
/// was up to date again; the one that rotated from them is the reference
/// (`Standing::rotated_from`).
#[test]
fn a_primary_killed_before_acknowledging_under_new_ids_restarts_with_the_ids_before() {
    for seed in [1077, 1352, 2125, 1071, 370_000_341] {
        let out = Sim::new(Family::Failover.scenario(seed)).run();
        assert!(out.converged, "failover seed {seed}");
    }
}

/// Promotions and tenures (`generation.rs`, `sync.rs`): a diskless Primary cut off with
/// writes held, meeting a replica of the Primary promoted meanwhile, steps down, that
/// promotion having changed the ids with the diskless node away (406008806: two
/// Primaries completed writes apart); a Primary that completed nothing in its tenure
/// steps down for ids diverged from its own (406001429: two Primaries completed writes
/// apart); a node is promoted only once its peers have listed what it lacks (1930: an
/// Outdated replica, its Primary's writes skipping it, proven UpToDate without them, the
/// replicas differed; 406007080: an up-to-date replica that missed an acknowledged write,
/// promoted between two redials, lost it).
#[test]
fn promotions_wait_for_lists_and_tenures_that_completed_nothing_step_down() {
    for seed in [406_008_806, 406_001_429, 1930, 406_007_080] {
        let out = Sim::new(Family::Failover.scenario(seed)).run();
        assert!(out.converged, "failover seed {seed}");
    }
}

/// A live notice relaying a write of a Primary out of reach voids the protection of our
/// fresh sectors there (406006296: a sync target kept the sectors that Primary had written
/// to it before their link dropped, against its later write, acknowledged with the
/// lister; the acknowledged write was lost).
#[test]
fn a_relayed_write_of_a_primary_out_of_reach_is_newer_than_its_orphans() {
    let out = Sim::new(Family::Failover.scenario(406_006_296)).run();
    assert!(out.converged, "failover seed 406006296");
}

/// Claims a Secondary kept under a Primary's run, on a replica away from it, stay until
/// that replica is synced under the Primary, or go to it if the Primary is gone first
/// (406002809: the Primary, met by both, stepped down without quorum and forgot its
/// claims; dropped on the Secondary too, an acknowledged write was lost).
#[test]
fn claims_kept_under_a_run_outlive_its_primary_stepping_down() {
    let out = Sim::new(Family::Failover.scenario(406_002_809)).run();
    assert!(out.converged, "failover seed 406002809");
}

/// A run heard of before our promotion does not outrun us (414000809: a Primary quorate
/// through a tiebreaker lost it for a moment; the tiebreaker, reconnecting, named a run
/// that had ended before the promotion, the Primary stepped down and pulled its own
/// acknowledged write back from an older replica).
#[test]
fn a_primary_is_not_outrun_by_a_run_that_ended_before_it() {
    let out = Sim::new(Family::Failover.scenario(414_000_809)).run();
    assert!(out.converged, "failover seed 414000809");
}

/// A Primary that wrote none of a sync target's fresh sectors adds no ids their
/// protection waits for (414007734: a Primary for a moment, its ids set back, never held
/// by any lister; an orphan of an older run kept a later acknowledged write out of the
/// sector). Checked for safety only: the run ends with no replica of volume 1 up to date
/// anywhere (the stall named in issue 15's notes), which the history check allows.
#[test]
fn orphans_wait_only_for_the_ids_of_their_writers() {
    let _ = Sim::new(Family::Failover.scenario(414_007_734)).run();
}

/// A Primary demoted without quorum pulls back only its own tenure's writes
/// (370002771: every claim pulled back, the only replica holding an acknowledged write
/// took the range from replicas that lacked it). Checked for safety only: the run ends
/// with no replica up to date anywhere (the stall named in issue 15's notes).
#[test]
fn a_primary_demoted_without_quorum_keeps_what_it_held_before_its_tenure() {
    let _ = Sim::new(Family::Failover.scenario(370_002_771)).run();
}

/// Ids taken up again as quorum returns count as acknowledged under only once the peers
/// hold them (422002192: a FLUSH completed under ids the peer never heard of, the Primary
/// crashed keeping them, and the peer, promoted later, took them for a Primary that went
/// on without it and pulled its own acknowledged write back from the older replica).
#[test]
fn ids_taken_up_again_are_kept_only_once_the_peers_hold_them() {
    let out = Sim::new(Family::Failover.scenario(422_002_192)).run();
    assert!(out.converged, "failover seed 422002192");
}

/// Ids set back without quorum are abandoned once they will never be taken up again (a
/// crash or a demotion), and told to peers as a crash's are (422002317: a replica away at
/// the set-back kept a failed write's sector as an orphan under the id set aside, which
/// no lister ever held; up to date later, it was the source of that sector for the
/// Primary, and a read returned data older than an acknowledged write; the engine tests
/// in `orphan_fresh.rs` show the mechanism). Told so, they rank their replica no higher
/// (414006758: ranked first among equal ids, the old Primary's replica was the source
/// for one missing a write the Primary it had outrun acknowledged, and a FLUSH was not
/// durable).
#[test]
fn ids_set_aside_without_quorum_are_abandoned_and_rank_no_higher() {
    for seed in [422_002_317, 414_006_758] {
        let out = Sim::new(Family::Failover.scenario(seed)).run();
        assert!(out.converged, "failover seed {seed}");
    }
}

/// A diskless Primary lists everything to a replica whose ids are older than those it was
/// promoted with (422008346: its empty list made a replica that had missed an
/// acknowledged write while down UpToDate, and the write was never synced to it).
#[test]
fn a_diskless_primary_does_not_settle_a_replica_older_than_its_tenure() {
    let out = Sim::new(Family::Failover.scenario(422_008_346)).run();
    assert!(out.converged, "failover seed 422008346");
}

/// A replica synced under a Primary's list takes its ids though it stepped down before
/// the end (430000390: kept older, they let a Primary promoted with that replica's vote
/// and cut off before its `Role` came take it for one that had missed the other tenure,
/// and both Primaries completed writes apart).
#[test]
fn a_replica_synced_under_a_demoted_primarys_list_takes_its_ids() {
    let out = Sim::new(Family::Failover.scenario(430_000_390)).run();
    assert!(out.converged, "failover seed 430000390");
}

/// A replica of unknown currency (back from a crash while Inconsistent) serves no resync
/// (430002177: listed two blocks by a peer being synced itself, it served that peer a
/// block it had never pulled, and the peer became UpToDate without an acknowledged
/// write). Safety only: every replica that held the write is left waiting for a current
/// one, which never returns in this run.
#[test]
fn a_replica_of_unknown_currency_serves_no_resync() {
    let _ = Sim::new(Family::Failover.scenario(430_002_177)).run();
}

/// A replica stopped cleanly while being synced comes back with its claims, and keeps
/// those on a peer with newer ids while no Primary is connected (430004651: it held an
/// acknowledged write its up-to-date peer lacked; back without the claim, it pulled the
/// block from that peer and the write was gone).
#[test]
fn a_replica_stopped_while_being_synced_keeps_its_claims() {
    let out = Sim::new(Family::Failover.scenario(430_004_651)).run();
    assert!(out.converged, "failover seed 430004651");
}

/// A replica restarted and being synced keeps, as claims, its relays of a gone Primary's
/// writes when it meets a peer whose ids are no newer than its own (467009619: it was the
/// Primary's only peer to take a write, turned the claim into a pull from that peer, and
/// the acknowledged write was gone; engine test `relayed_claims.rs`).
#[test]
fn relays_of_a_gone_primary_stay_claims_against_equal_ids() {
    let out = Sim::new(Family::Failover.scenario(467_009_619)).run();
    assert!(out.converged, "failover seed 467009619");
}

/// The Primary's word that a replica holds all its writes (`InSync`) drops what a replica
/// back from a crash held out of its list under that Primary's run (475010969 and
/// 476011003: kept, those claims came back when the Primary died, against a replica that
/// claimed in turn a write the first had missed, and the two redialled for ever; engine
/// test `in_sync.rs`).
#[test]
fn in_sync_settles_claims_held_under_the_run() {
    let runs = [
        (475_010_969, Family::ClusterCrash),
        (476_011_003, Family::PowerLossClusterCrash),
    ];
    for (seed, family) in runs {
        let out = Sim::new(family.scenario(seed)).run();
        assert!(out.converged, "{family:?} seed {seed}");
    }
}

/// A replica being synced takes, at its resync's end, the ids of a gone Primary that it
/// could not adopt while it took that Primary's writes under them (477000473, 490001983:
/// kept older, the next Primary rotated apart from those ids, and the old Primary, back,
/// saw a split brain where no two Primaries wrote apart). Not when they would rank it above
/// a connected up-to-date replica (490004312, 490008836: a failed write's sectors it held
/// stayed apart from that replica for good; engine test `writer_ids.rs`).
///
/// 490004312 is run for safety only since a replica being synced with no Primary
/// connected pulls nothing from a peer whose ids its own descend from
/// (`Replicas::lacks_what_we_lack`): the old Primary, back from its crash, is listed
/// everything by the replica that took its writes but kept older ids (the exception
/// above), and waits instead of pulling from it. Safe, and the ids that name less than a
/// replica holds are what is left to fix.
#[test]
fn a_resync_takes_the_ids_of_a_gone_writer_it_could_not_adopt() {
    for seed in [477_000_473, 490_001_983, 490_008_836] {
        let out = Sim::new(Family::Failover.scenario(seed)).run();
        assert!(out.converged, "failover seed {seed}");
    }
    Sim::new(Family::Failover.scenario(490_004_312)).run();
}

/// A sync target's fresh sectors, written by a Primary that died, give way to the list of
/// a replica that received every write of that run it did (their `PrimaryLost` compared),
/// whatever that replica's ids: 497002182 kept the dead Primary's zeroes against a later
/// write of it the lister held, and the replicas stayed different (engine test
/// `orphan_fresh.rs`, `a_later_write_of_a_dead_primary_replaces_its_fresh_sectors_*`).
#[test]
fn fresh_sectors_of_a_dead_primary_give_way_to_a_replica_that_received_more_of_it() {
    let out = Sim::new(Family::Failover.scenario(497_002_182)).run();
    assert!(out.converged, "failover seed 497002182");
}
