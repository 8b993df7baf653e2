//! Which GPU pairs can be measured at the same time, and what a larger machine would take.
//!
//! On an NVSwitch fabric every GPU has all of its links into a non-blocking switch, so
//! pairs that share no GPU do not slow each other: n GPUs' n(n−1) ordered pairs fit in
//! 2(n−1) rounds of n/2 disjoint pairs (the circle method of round-robin tournaments,
//! each round run once per direction). Over PCIe switches, host bridges or direct
//! NVLinks the links are shared between pairs, so pairs go one at a time.

use serde::{Deserialize, Serialize};

/// How pairs are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fabric {
    /// Every pair over an NVSwitch fabric: disjoint pairs at the same time.
    NonBlocking,
    /// Links shared between pairs (PCIe, direct NVLink): one pair at a time.
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

/// The fabric of a set of pairs: non-blocking when every pair has all of the GPU's
/// NVLinks (`links_per_gpu`, from the part table) to the other (so they go to a switch).
pub fn fabric(pair_nvlinks: &[u32], links_per_gpu: Option<u8>) -> Fabric {
    match links_per_gpu {
        Some(l) if !pair_nvlinks.is_empty() && pair_nvlinks.iter().all(|n| *n == u32::from(l)) => {
            Fabric::NonBlocking
        }
        _ => Fabric::Shared,
    }
}

/// Rounds of ordered pairs (indices into the GPU list); the pairs of a round share no
/// GPU on a non-blocking fabric, and every round holds one pair on a shared one.
pub fn rounds(gpus: usize, fabric: Fabric) -> Vec<Vec<(usize, usize)>> {
    if gpus < 2 {
        return Vec::new();
    }
    if fabric == Fabric::Shared {
        return (0..gpus)
            .flat_map(|a| {
                (0..gpus)
                    .filter(move |b| *b != a)
                    .map(move |b| vec![(a, b)])
            })
            .collect();
    }
    // Circle method: with an odd count, a phantom slot sits out each round.
    let n = gpus + gpus % 2;
    let mut one_way = Vec::with_capacity(n - 1);
    for r in 0..n - 1 {
        let slot = |i: usize| if i == 0 { 0 } else { (i - 1 + r) % (n - 1) + 1 };
        let round: Vec<(usize, usize)> = (0..n / 2)
            .map(|i| (slot(i), slot(n - 1 - i)))
            .filter(|(a, b)| *a < gpus && *b < gpus)
            .collect();
        one_way.push(round);
    }
    let back: Vec<Vec<(usize, usize)>> = one_way
        .iter()
        .map(|r| r.iter().map(|(a, b)| (*b, *a)).collect())
        .collect();
    one_way.into_iter().chain(back).collect()
}

/// What `gpus` GPUs would take, from a run of `measured_gpus` GPUs: the setup as measured
/// (it grows with the GPU count only through per-GPU work, counted per GPU), and each
/// round as long as one measured pair.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub gpus: usize,
    pub fabric: Fabric,
    pub rounds: usize,
    pub pairs_per_round: usize,
    /// Seconds per GPU of setup (contexts, peer access, buffers) as measured.
    pub setup_s_per_gpu: f64,
    /// Seconds per ordered pair as measured.
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
    let r = rounds(gpus, fabric);
    let setup_s_per_gpu = setup_s / measured_gpus.max(1) as f64;
    Estimate {
        gpus,
        fabric,
        rounds: r.len(),
        pairs_per_round: r.iter().map(Vec::len).max().unwrap_or(0),
        setup_s_per_gpu,
        pair_s,
        total_s: setup_s_per_gpu * gpus as f64 + pair_s * r.len() as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn check_rounds(gpus: usize, fabric: Fabric) -> Vec<Vec<(usize, usize)>> {
        let r = rounds(gpus, fabric);
        let mut all = BTreeSet::new();
        for round in &r {
            let mut used = BTreeSet::new();
            for (a, b) in round {
                assert!(a != b && *a < gpus && *b < gpus);
                assert!(used.insert(*a) && used.insert(*b), "{round:?} shares a GPU");
                assert!(all.insert((*a, *b)), "({a}, {b}) twice");
            }
        }
        assert_eq!(all.len(), gpus * (gpus - 1), "every ordered pair once");
        r
    }

    #[test]
    fn non_blocking_rounds_are_disjoint_and_cover_every_pair() {
        for gpus in 2..=16 {
            let r = check_rounds(gpus, Fabric::NonBlocking);
            let n = gpus + gpus % 2;
            assert_eq!(r.len(), 2 * (n - 1), "{gpus} GPUs");
        }
        let r = rounds(8, Fabric::NonBlocking);
        assert_eq!(r.len(), 14);
        assert!(r.iter().all(|x| x.len() == 4));
    }

    #[test]
    fn shared_links_go_one_pair_at_a_time() {
        let r = check_rounds(8, Fabric::Shared);
        assert_eq!(r.len(), 56);
        assert!(r.iter().all(|x| x.len() == 1));
        assert!(rounds(1, Fabric::Shared).is_empty());
    }

    #[test]
    fn fabric_from_link_counts() {
        assert_eq!(fabric(&[18, 18], Some(18)), Fabric::NonBlocking);
        assert_eq!(fabric(&[6, 6, 6], Some(18)), Fabric::Shared);
        assert_eq!(fabric(&[0, 0], Some(18)), Fabric::Shared);
        assert_eq!(fabric(&[18], None), Fabric::Shared);
        assert_eq!(fabric(&[], Some(18)), Fabric::Shared);
    }

    #[test]
    fn eight_gpus_from_two() {
        // 2 GPUs: 0.4 s setup, 2 ordered pairs of 0.5 s each.
        let e = estimate(8, Fabric::NonBlocking, 2, 0.4, 0.5);
        assert_eq!((e.rounds, e.pairs_per_round), (14, 4));
        assert!((e.total_s - (0.2 * 8.0 + 0.5 * 14.0)).abs() < 1e-9);
        let s = estimate(8, Fabric::Shared, 2, 0.4, 0.5);
        assert!((s.total_s - (0.2 * 8.0 + 0.5 * 56.0)).abs() < 1e-9);
    }
}
