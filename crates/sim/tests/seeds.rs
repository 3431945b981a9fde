//! A few thousand simulated failure schedules on every test run. A longer soak:
//! `cargo run --release -p tandem-sim -- 0 100000`.

use tandem_engine::replica::Protocol;
use tandem_sim::{Scenario, Sim};

#[test]
fn thousands_of_seeds() {
    let count = std::env::var("TANDEM_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    if let Err(e) = tandem_sim::run_seeds(0, count) {
        panic!("{e}");
    }
}

#[test]
fn a_seed_reproduces_exactly() {
    let a = Sim::new(Scenario::random(42)).run();
    let b = Sim::new(Scenario::random(42)).run();
    assert_eq!(
        (a.completed, a.failed, a.resyncs, a.events),
        (b.completed, b.failed, b.resyncs, b.events)
    );
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
                size: 256 << 10,
                ops: 300,
                max_in_flight: 8,
                faults: false,
                restarts: false,
                overlapping_faults: false,
            };
            let out = Sim::new(sc).run();
            assert_eq!(out.failed, 0, "{protocol:?}: nothing fails without faults");
            assert_eq!(out.completed, 300);
        }
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
