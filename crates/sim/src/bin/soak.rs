//! `tandem-sim [FIRST_SEED] [COUNT]`: runs simulation seeds until one fails (exit 1, with
//! the seed and its history) or all pass. A failing seed reruns identically:
//! `tandem-sim <seed> 1`.

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("seed numbers"))
        .collect();
    let first = args.first().copied().unwrap_or(0);
    let count = args.get(1).copied().unwrap_or(100_000);
    let start = std::time::Instant::now();
    match tandem_sim::run_seeds(first, count) {
        Ok(()) => println!(
            "{count} seeds from {first} passed in {:.1?}",
            start.elapsed()
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
