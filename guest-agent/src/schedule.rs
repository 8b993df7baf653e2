//! Which GPU pairs are measured at the same time, how, and what a larger machine takes.
//!
//! The pairs of n GPUs are coloured into rounds of disjoint pairs (a proper edge
//! colouring of the complete graph, the circle method of round-robin tournaments): n − 1
//! rounds of n/2 pairs for even n, n rounds of (n − 1)/2 for odd n (a phantom GPU sits
//! one out each round). A round's pairs share no GPU; each pair is measured both ways by
//! one thread with its own streams and events, in the per-GPU contexts. Where every pair
//! of a round crosses a non-blocking fabric (NVLink through NVSwitch), the round's
//! threads run at once; where links are shared (PCIe switches, host bridges, direct
//! NVLink) or the link is unknown, they run one after the other.

use std::time::Instant;

use pci_config::Bdf;
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::nvidia_parts::{Boards, GpuPart};

/// How pairs are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fabric {
    /// Every pair over an NVSwitch fabric: disjoint pairs at the same time.
    NonBlocking,
    /// Links shared between pairs (PCIe, direct NVLink), or unknown: one pair at a time.
    Shared,
}

impl Fabric {
    pub fn describe(self) -> &'static str {
        match self {
            Fabric::NonBlocking => "disjoint pairs at once (NVSwitch fabric, non-blocking)",
            Fabric::Shared => "one pair at a time (links shared: PCIe or direct NVLink)",
        }
    }
}

/// One pair's fabric and why, from what the agent knows: the NVLinks NVML counts between
/// the two GPUs (`None` without NVML) and the part table's entry for the GPU.
pub fn pair_fabric(nvlinks: Option<u32>, part: Option<&GpuPart>) -> (Fabric, String) {
    let shared = |why: String| (Fabric::Shared, why);
    let Some(n) = nvlinks else {
        return shared("no NVML: the link between them is unknown".into());
    };
    if n == 0 {
        return shared("PCIe: links shared through switches and host bridges".into());
    }
    let Some(part) = part else {
        return shared(format!(
            "NV{n}, but the GPU is not in the part table: whether an NVSwitch is between them is unknown"
        ));
    };
    if part.boards == Boards::NvSwitch {
        return (
            Fabric::NonBlocking,
            format!(
                "NV{n}: {} boards wire NVLink through NVSwitch only",
                part.name
            ),
        );
    }
    match part.links {
        Some(l) if n == u32::from(l) => (
            Fabric::NonBlocking,
            format!("NV{n}: all {l} NVLinks of the {} reach the peer (NVSwitch fabric)", part.name),
        ),
        Some(l) => shared(format!(
            "NV{n} of the {}'s {l} NVLinks: direct NVLink, links shared",
            part.name
        )),
        None => shared(format!(
            "NV{n}: the NVLink count per {} is not known, so an NVSwitch cannot be told from direct links",
            part.name
        )),
    }
}

/// Rounds of disjoint unordered pairs `(a, b)`, `a < b`, indices into the GPU list:
/// every pair exactly once (the circle method).
pub fn rounds(gpus: usize) -> Vec<Vec<(usize, usize)>> {
    if gpus < 2 {
        return Vec::new();
    }
    // With an odd count, slot n−1 is a phantom: its partner sits the round out.
    let n = gpus + gpus % 2;
    (0..n - 1)
        .map(|r| {
            let slot = |i: usize| if i == 0 { 0 } else { (i - 1 + r) % (n - 1) + 1 };
            (0..n / 2)
                .map(|i| (slot(i), slot(n - 1 - i)))
                .filter(|(a, b)| *a < gpus && *b < gpus)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect()
        })
        .collect()
}

/// One round as it will run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundPlan {
    /// Unordered pairs, indices into the GPU list.
    pub pairs: Vec<(usize, usize)>,
    /// The pairs run at once (one thread each).
    pub concurrent: bool,
    /// Why: all pairs on a non-blocking fabric, or the first pair whose links are shared.
    pub why: String,
}

/// The rounds of `gpus` GPUs, keeping only the pairs `measured` accepts (rounds left
/// empty are dropped), each concurrent when every one of its pairs is non-blocking by
/// `fabric_of` (a round of one pair runs alone).
pub fn plan(
    gpus: usize,
    measured: impl Fn(usize, usize) -> bool,
    fabric_of: impl Fn(usize, usize) -> (Fabric, String),
) -> Vec<RoundPlan> {
    rounds(gpus)
        .into_iter()
        .map(|r| {
            r.into_iter()
                .filter(|&(a, b)| measured(a, b))
                .collect::<Vec<_>>()
        })
        .filter(|r| !r.is_empty())
        .map(|pairs| {
            if pairs.len() == 1 {
                return RoundPlan {
                    pairs,
                    concurrent: false,
                    why: "one pair in this round".into(),
                };
            }
            let fabrics: Vec<(Fabric, String)> =
                pairs.iter().map(|&(a, b)| fabric_of(a, b)).collect();
            let blocking = pairs
                .iter()
                .zip(&fabrics)
                .find(|(_, (f, _))| *f == Fabric::Shared);
            let (concurrent, why) = match blocking {
                Some(((a, b), (_, why))) => (false, format!("GPUs {a}–{b}: {why}")),
                None => (
                    true,
                    format!("all {} pairs non-blocking: {}", pairs.len(), fabrics[0].1),
                ),
            };
            RoundPlan {
                pairs,
                concurrent,
                why,
            }
        })
        .collect()
}

/// What one round of [`execute`] gave: each pair's result and seconds (in the order of
/// the round's pairs), and the round's wall time.
#[derive(Debug)]
pub struct RoundRun<T> {
    pub results: Vec<T>,
    pub pair_s: Vec<f64>,
    pub wall_s: f64,
}

/// Runs `measure` for every pair of every round: a thread per pair where the round is
/// concurrent (all joined before the next round), on this thread one by one otherwise.
/// A panic in a pair's thread is passed on.
pub fn execute<T: Send>(
    rounds: &[RoundPlan],
    measure: &(dyn Fn(usize, usize) -> T + Sync),
) -> Vec<RoundRun<T>> {
    let timed = |a: usize, b: usize| {
        let t = Instant::now();
        let r = measure(a, b);
        (r, t.elapsed().as_secs_f64())
    };
    rounds
        .iter()
        .map(|round| {
            let started = Instant::now();
            let done: Vec<(T, f64)> = if round.concurrent {
                std::thread::scope(|s| {
                    let handles: Vec<_> = round
                        .pairs
                        .iter()
                        .map(|&(a, b)| s.spawn(move || timed(a, b)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                        .collect()
                })
            } else {
                round.pairs.iter().map(|&(a, b)| timed(a, b)).collect()
            };
            let (results, pair_s) = done.into_iter().unzip();
            RoundRun {
                results,
                pair_s,
                wall_s: started.elapsed().as_secs_f64(),
            }
        })
        .collect()
}

/// What `gpus` GPUs would take, from a run of `measured_gpus` GPUs: the setup as measured
/// (it grows with the GPU count only through per-GPU work, counted per GPU), and each
/// pair (both ways) as long as one measured pair; a round as long as one pair on a
/// non-blocking fabric, the pairs one after the other on a shared one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub gpus: usize,
    pub fabric: Fabric,
    pub rounds: usize,
    pub pairs_per_round: usize,
    /// Seconds per GPU of setup (contexts, peer access, buffers) as measured.
    pub setup_s_per_gpu: f64,
    /// Seconds per ordered pair (one direction) as measured.
    pub pair_s: f64,
    pub total_s: f64,
}

/// Estimates `gpus` GPUs from `setup_s` of setup for `measured_gpus` GPUs and `pair_s`
/// seconds per ordered pair.
pub fn estimate(
    gpus: usize,
    fabric: Fabric,
    measured_gpus: usize,
    setup_s: f64,
    pair_s: f64,
) -> Estimate {
    let r = rounds(gpus);
    let pairs: usize = r.iter().map(Vec::len).sum();
    let setup_s_per_gpu = setup_s / measured_gpus.max(1) as f64;
    // Both directions of a pair, one after the other in its thread.
    let serial_steps = match fabric {
        Fabric::NonBlocking => r.len(),
        Fabric::Shared => pairs,
    };
    Estimate {
        gpus,
        fabric,
        rounds: r.len(),
        pairs_per_round: r.iter().map(Vec::len).max().unwrap_or(0),
        setup_s_per_gpu,
        pair_s,
        total_s: setup_s_per_gpu * gpus as f64 + 2.0 * pair_s * serial_steps as f64,
    }
}

/// One round as it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    /// The round's pairs, each measured both ways where peer access allows.
    pub pairs: Vec<(Bdf, Bdf)>,
    /// The pairs ran at once, a thread each.
    pub concurrent: bool,
    pub why: String,
    /// Wall time of the round's verify pass (absent where nothing was verified).
    pub verify_s: Option<f64>,
    /// Wall time of the round's bench pass.
    pub bench_s: f64,
    /// Each pair's own bench time (both ways), in the order of `pairs`.
    pub pair_bench_s: Vec<f64>,
}

impl RoundRecord {
    /// `round` as it ran: `bdf` names each GPU index, `bench` is the round's wall time
    /// and each pair's own.
    pub(crate) fn of(
        round: &RoundPlan,
        bdf: impl Fn(usize) -> Bdf,
        verify_s: Option<f64>,
        (bench_s, pair_bench_s): (f64, &[f64]),
    ) -> RoundRecord {
        RoundRecord {
            pairs: round.pairs.iter().map(|&(a, b)| (bdf(a), bdf(b))).collect(),
            concurrent: round.concurrent,
            why: round.why.clone(),
            verify_s,
            bench_s,
            pair_bench_s: pair_bench_s.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use vfio_p2p_contract::nvidia_parts::gpu_part;

    /// Every unordered pair once, rounds disjoint, the expected round count and sizes.
    fn check_rounds(gpus: usize) {
        let r = rounds(gpus);
        let mut all = BTreeSet::new();
        for round in &r {
            let mut used = BTreeSet::new();
            for &(a, b) in round {
                assert!(a < b && b < gpus, "({a}, {b}) of {gpus}");
                assert!(used.insert(a) && used.insert(b), "{round:?} shares a GPU");
                assert!(all.insert((a, b)), "({a}, {b}) twice");
            }
            assert_eq!(round.len(), gpus / 2, "{gpus} GPUs: a round of {round:?}");
        }
        assert_eq!(
            all.len(),
            gpus * gpus.saturating_sub(1) / 2,
            "every pair once"
        );
        let want = match gpus {
            0 | 1 => 0,
            n if n % 2 == 0 => n - 1,
            n => n,
        };
        assert_eq!(r.len(), want, "{gpus} GPUs");
    }

    proptest! {
        #[test]
        fn rounds_colour_the_complete_graph(gpus in 0usize..=64) {
            check_rounds(gpus);
        }

        #[test]
        fn plan_keeps_exactly_the_measured_pairs(gpus in 2usize..=64, drop_mod in 2usize..7) {
            let measured = |a: usize, b: usize| !(a + b).is_multiple_of(drop_mod);
            let p = plan(gpus, measured, |_, _| (Fabric::NonBlocking, "switch".into()));
            let got: BTreeSet<_> = p.iter().flat_map(|r| r.pairs.iter().copied()).collect();
            let want: BTreeSet<_> = (0..gpus)
                .flat_map(|a| (a + 1..gpus).map(move |b| (a, b)))
                .filter(|&(a, b)| measured(a, b))
                .collect();
            prop_assert_eq!(got, want);
            prop_assert!(p.iter().all(|r| !r.pairs.is_empty()));
            prop_assert!(p.iter().all(|r| r.concurrent == (r.pairs.len() > 1)));
        }
    }

    #[test]
    fn eight_gpus_take_seven_rounds_of_four() {
        let r = rounds(8);
        assert_eq!(r.len(), 7);
        assert!(r.iter().all(|x| x.len() == 4));
        assert_eq!(rounds(2), vec![vec![(0, 1)]]);
        assert_eq!(rounds(3).len(), 3);
        assert!(rounds(1).is_empty());
    }

    #[test]
    fn a_round_with_a_shared_link_runs_one_pair_at_a_time() {
        let p = plan(
            4,
            |_, _| true,
            |a, b| {
                if (a, b) == (1, 2) {
                    (Fabric::Shared, "PCIe".into())
                } else {
                    (Fabric::NonBlocking, "NV18".into())
                }
            },
        );
        assert_eq!(p.len(), 3);
        let with = p.iter().find(|r| r.pairs.contains(&(1, 2))).unwrap();
        assert!(!with.concurrent);
        assert_eq!(with.why, "GPUs 1–2: PCIe");
        let others: Vec<_> = p.iter().filter(|r| !r.pairs.contains(&(1, 2))).collect();
        assert!(others.iter().all(|r| r.concurrent));
        assert!(others[0].why.starts_with("all 2 pairs non-blocking: NV18"));
    }

    #[test]
    fn pair_fabric_from_what_the_agent_knows() {
        let h200 = gpu_part(0x2335).expect("H200 SXM in the part table");
        let (f, why) = pair_fabric(Some(18), Some(h200));
        assert_eq!(f, Fabric::NonBlocking, "{why}");
        assert!(why.contains("NVSwitch"), "{why}");
        let (f, why) = pair_fabric(Some(6), Some(h200));
        assert_eq!(f, Fabric::Shared);
        assert!(why.contains("direct NVLink"), "{why}");
        assert_eq!(pair_fabric(Some(0), Some(h200)).0, Fabric::Shared);
        assert_eq!(pair_fabric(None, Some(h200)).0, Fabric::Shared);
        assert_eq!(pair_fabric(Some(18), None).0, Fabric::Shared);
    }

    #[test]
    fn concurrent_rounds_run_their_pairs_at_once_and_serial_ones_alone() {
        for concurrent in [true, false] {
            let p: Vec<RoundPlan> = rounds(8)
                .into_iter()
                .map(|pairs| RoundPlan {
                    pairs,
                    concurrent,
                    why: String::new(),
                })
                .collect();
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let b = std::sync::Barrier::new(if concurrent { 4 } else { 1 });
            let out = execute(&p, &|a, c| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                // Concurrent: the four pairs of a round all reach this before any leaves.
                b.wait();
                now.fetch_sub(1, Ordering::SeqCst);
                (a, c)
            });
            assert_eq!(most.load(Ordering::SeqCst), if concurrent { 4 } else { 1 });
            let got: Vec<_> = out.iter().flat_map(|r| r.results.clone()).collect();
            let want: Vec<_> = p.iter().flat_map(|r| r.pairs.clone()).collect();
            assert_eq!(got, want, "results in the order of the rounds' pairs");
            assert!(out.iter().all(|r| r.pair_s.len() == 4));
        }
    }

    #[test]
    fn eight_gpus_from_two() {
        // 2 GPUs: 0.4 s setup, 0.5 s per ordered pair.
        let e = estimate(8, Fabric::NonBlocking, 2, 0.4, 0.5);
        assert_eq!((e.rounds, e.pairs_per_round), (7, 4));
        assert!((e.total_s - (0.2 * 8.0 + 2.0 * 0.5 * 7.0)).abs() < 1e-9);
        let s = estimate(8, Fabric::Shared, 2, 0.4, 0.5);
        assert!((s.total_s - (0.2 * 8.0 + 2.0 * 0.5 * 28.0)).abs() < 1e-9);
    }
}
