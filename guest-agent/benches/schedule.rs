//! The pair schedule (issue 17, item 2), without a GPU:
//! 1. how long colouring N GPUs' pairs into rounds takes (median of 5), N up to 1,024;
//! 2. the executor on a simulated 8-GPU machine: each pair's measurement replaced by a
//!    sleep of PAIR_MS per direction, the rounds run at once (NVSwitch) and one pair at a
//!    time (shared links), beside what `schedule::estimate` predicts for them;
//! 3. what a round of threads costs: 64 GPUs (63 rounds of 32 threads) of empty pairs.
//!
//! `cargo bench -p vfio-p2p-agent --bench schedule` (PAIR_MS=20 by default)

use std::time::{Duration, Instant};

use vfio_p2p_agent::schedule::{self, Fabric, RoundPlan};

fn median_of_5(mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..5)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[2]
}

fn plans(gpus: usize, concurrent: bool) -> Vec<RoundPlan> {
    schedule::plan(
        gpus,
        |_, _| true,
        |_, _| {
            if concurrent {
                (Fabric::NonBlocking, "simulated NVSwitch".into())
            } else {
                (Fabric::Shared, "simulated PCIe".into())
            }
        },
    )
}

fn main() {
    println!("colouring N GPUs' pairs into rounds of disjoint pairs (median of 5):");
    for n in [2usize, 8, 16, 64, 256, 1024] {
        let mut rounds = 0;
        let t = median_of_5(|| rounds = plans(n, true).len());
        println!(
            "  {n:>5} GPUs: {rounds:>4} rounds of {:>3} pairs in {:>9.1} µs",
            n / 2,
            t.as_secs_f64() * 1e6
        );
    }

    let pair_ms: u64 = std::env::var("PAIR_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    println!("simulated 8 GPUs, {pair_ms} ms per direction of a pair (a sleep):");
    for (concurrent, fabric) in [(true, Fabric::NonBlocking), (false, Fabric::Shared)] {
        let p = plans(8, concurrent);
        let start = Instant::now();
        let runs = schedule::execute(&p, &|_, _| {
            std::thread::sleep(Duration::from_millis(2 * pair_ms));
        });
        let wall = start.elapsed().as_secs_f64();
        let own: f64 = runs.iter().flat_map(|r| &r.pair_s).sum();
        let e = schedule::estimate(8, fabric, 2, 0.0, pair_ms as f64 / 1e3);
        println!(
            "  {:<18} {} rounds: {wall:.3} s wall (the pairs' own times add up to {own:.3} s), estimate {:.3} s",
            if concurrent { "at once (NVSwitch)" } else { "one at a time" },
            p.len(),
            e.total_s
        );
    }

    let p = plans(64, true);
    let t = median_of_5(|| {
        schedule::execute(&p, &|a, b| a ^ b);
    });
    println!(
        "64 GPUs of empty pairs: {} rounds of 32 threads in {:.1} ms ({:.0} µs per round)",
        p.len(),
        t.as_secs_f64() * 1e3,
        t.as_secs_f64() * 1e6 / p.len() as f64
    );
}
