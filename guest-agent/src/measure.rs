//! Verifying and measuring every pair by the schedule ([`crate::schedule`]): rounds of
//! disjoint pairs, a thread per pair where every pair of the round is on a non-blocking
//! fabric, one pair after the other elsewhere; each pair both ways in its thread.
//! What it fills: each ordered pair's record ([`PairReport`], which `report` judges and
//! prints) and the seconds each phase of the run took ([`Phases`]).

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::bench::pingpong::PingPongFlags;
use crate::bench::{self, BenchPlan, PairBench};
use crate::peers::PeerCheck;
use crate::schedule::{self, RoundPlan, RoundRecord};
use crate::sysfs::gpus::Scan;
use crate::verify::{self, VerifyResult};
use vfio_p2p_contract::Verdict;
use vfio_p2p_cuda_driver::{Gpu, Module};

/// All that is known about one ordered pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairReport {
    pub src: Bdf,
    pub dst: Bdf,
    pub peer: PeerCheck,
    pub verify: Option<VerifyResult>,
    pub bench: Option<PairBench>,
    /// The host's expectation for this pair, if any.
    pub expected: Option<Verdict>,
    pub expected_nvlinks: Option<u32>,
    /// Each figure against what the pair's link should carry (issue 42); absent without
    /// a bench, a known link, or in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_verdict: Option<crate::link_verdict::LinkVerdict>,
    /// The pair is as expected (P2P working, unless the host said otherwise).
    pub as_expected: bool,
    pub summary: String,
}

/// Seconds per phase of a run, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Phases {
    pub laps: Vec<(String, f64)>,
    /// `-v`: each phase is also printed on stderr as it ends.
    #[serde(skip)]
    pub verbose: bool,
}

impl Phases {
    /// Ends phase `name` now; `started` is the run's start.
    pub fn lap(&mut self, name: &str, started: std::time::Instant) {
        let so_far: f64 = self.laps.iter().map(|(_, s)| s).sum();
        let s = started.elapsed().as_secs_f64() - so_far;
        if self.verbose {
            eprintln!("vfio-p2p-agent: {name}: {s:.3} s");
        }
        self.laps.push((name.to_string(), s));
    }

    /// `name 0.12 s, …`
    pub fn line(&self) -> String {
        self.laps
            .iter()
            .map(|(n, s)| format!("{n} {s:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A round's results, each a pair's measurements by report index: the first error, or
/// all of them.
fn by_report<T>(results: Vec<Result<Vec<(usize, T)>>>) -> Result<Vec<(usize, T)>> {
    Ok(results
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect())
}

/// `src → dst` of each report, for progress and errors.
fn labels(reports: &[PairReport]) -> Vec<String> {
    reports
        .iter()
        .map(|r| format!("{} → {}", r.src, r.dst))
        .collect()
}

/// For each ordered pair of GPU indices, the index of its report, where peer access
/// was enabled (so the pair is measured).
struct Enabled {
    n: usize,
    at: Vec<Option<usize>>,
}

impl Enabled {
    fn of(gpus: &[Gpu], reports: &[PairReport]) -> Enabled {
        let n = gpus.len();
        let mut at = vec![None; n * n];
        for (i, r) in reports.iter().enumerate().filter(|(_, r)| r.peer.enabled) {
            at[index_of(gpus, r.src) * n + index_of(gpus, r.dst)] = Some(i);
        }
        Enabled { n, at }
    }

    fn get(&self, s: usize, d: usize) -> Option<usize> {
        self.at[s * self.n + d]
    }

    /// The ordered pairs of `{a, b}` to measure, with their report indices.
    fn both_ways(&self, a: usize, b: usize) -> Vec<(usize, usize, usize)> {
        [(a, b), (b, a)]
            .into_iter()
            .filter_map(|(s, d)| self.get(s, d).map(|i| (s, d, i)))
            .collect()
    }
}

fn index_of(gpus: &[Gpu], bdf: Bdf) -> usize {
    gpus.iter()
        .position(|g| g.bus_id == bdf)
        .expect("pairs come from these GPUs")
}

/// The rounds for these GPUs: the pairs with peer access enabled at least one way, each
/// round concurrent when every pair in it is non-blocking by NVML's NVLink count and the
/// part table (see [`schedule::pair_fabric`]).
pub fn plan_rounds(gpus: &[Gpu], reports: &[PairReport], scan: Option<&Scan>) -> Vec<RoundPlan> {
    let enabled = Enabled::of(gpus, reports);
    schedule::plan(
        gpus.len(),
        |a, b| !enabled.both_ways(a, b).is_empty(),
        |a, b| {
            let nvlinks = enabled
                .both_ways(a, b)
                .first()
                .and_then(|&(_, _, i)| reports[i].peer.link.as_ref())
                .map(|l| l.nvlinks);
            schedule::pair_fabric(nvlinks, scan.and_then(|s| s.part_of(gpus[a].bus_id)))
        },
    )
}

/// One-way writes checked on the destination for every enabled pair, by `rounds`:
/// the results go into `reports`; the wall time of each round.
pub fn verify_by_rounds(
    gpus: &[Gpu],
    modules: &[Module<'_>],
    reports: &mut [PairReport],
    (words, inject): (usize, &verify::Injection),
    rounds: &[RoundPlan],
) -> Result<Vec<f64>> {
    let enabled = Enabled::of(gpus, reports);
    let labels = labels(reports);
    let runs = schedule::execute(rounds, &|a, b| {
        enabled
            .both_ways(a, b)
            .into_iter()
            .map(|(s, d, i)| {
                let v = verify::verify_pair(
                    (&gpus[s], &modules[s]),
                    (&gpus[d], &modules[d]),
                    words,
                    inject,
                )
                .with_context(|| format!("verifying {}", labels[i]))?;
                Ok((i, v))
            })
            .collect::<Result<Vec<(usize, VerifyResult)>>>()
    });
    let mut walls = Vec::with_capacity(runs.len());
    for run in runs {
        walls.push(run.wall_s);
        for (i, v) in by_report(run.results)? {
            reports[i].verify = Some(v);
        }
    }
    Ok(walls)
}

fn progress(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .expect("static template is valid"),
    );
    pb
}

/// Latency and bandwidth of every enabled pair, by `rounds`, with each GPU's ping-pong
/// flag (`flags`, in the order of `gpus`): the results go into `reports`; the rounds as
/// they ran (`verify_s` from `verify_walls` when given).
pub fn bench_by_rounds(
    (gpus, modules): (&[Gpu], &[Module<'_>]),
    flags: &PingPongFlags<'_>,
    reports: &mut [PairReport],
    plan: &BenchPlan,
    (rounds, verify_walls): (&[RoundPlan], Option<&[f64]>),
) -> Result<Vec<RoundRecord>> {
    let enabled = Enabled::of(gpus, reports);
    let ordered: usize = reports.iter().filter(|r| r.peer.enabled).count();
    let pb = progress(ordered as u64 * BenchPlan::STEPS);
    let labels = labels(reports);
    let runs = schedule::execute(rounds, &|a, b| {
        let ways = enabled.both_ways(a, b);
        let both = ways.len() == 2;
        ways.into_iter()
            .map(|(s, d, i)| {
                let step = |what: &str| {
                    pb.set_message(format!("{}: {what}", labels[i]));
                    pb.inc(1);
                };
                let b = bench::bench_pair(
                    (&gpus[s], &modules[s]),
                    (&gpus[d], &modules[d]),
                    (flags.at(s), flags.at(d)),
                    both,
                    plan,
                    &step,
                )
                .with_context(|| format!("measuring {}", labels[i]))?;
                Ok((i, b))
            })
            .collect::<Result<Vec<(usize, PairBench)>>>()
    });
    pb.finish_and_clear();
    let mut out = Vec::with_capacity(runs.len());
    for (k, (run, round)) in runs.into_iter().zip(rounds).enumerate() {
        let verify_s = verify_walls.and_then(|w| w.get(k).copied());
        out.push(RoundRecord::of(
            round,
            |a| gpus[a].bus_id,
            verify_s,
            (run.wall_s, &run.pair_s),
        ));
        for (i, b) in by_report(run.results)? {
            reports[i].bench = Some(b);
        }
    }
    Ok(out)
}

/// `bench --simulate N`: the schedule of N GPUs run on the GPUs at hand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulatedRun {
    pub simulated_gpus: usize,
    /// The GPUs at hand; simulated GPU i is `gpus[i % gpus.len()]`.
    pub gpus: Vec<Bdf>,
    pub rounds: Vec<RoundRecord>,
    /// Each round's pairs of simulated GPUs.
    pub schedule: Vec<Vec<(usize, usize)>>,
    /// Every simulated pair both ways, in the order of the rounds.
    pub pairs: Vec<PairBench>,
    /// Where the time went (set by the command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    pub elapsed_s: f64,
}

/// Runs the N-GPU schedule on `gpus`: simulated GPU i is GPU i mod count (with one GPU
/// every pair is that GPU with itself: within the GPU, not P2P). Each simulated GPU has
/// its own ping-pong flag; nothing is measured with peer access disabled (pairs that
/// share a GPU would turn it off under each other), and both ways at once start by an
/// event, not at a host gate. The rounds run as on an NVSwitch
/// fabric (`concurrent`), or one pair at a time, to compare.
pub fn simulate(
    (gpus, modules): (&[Gpu], &[Module<'_>]),
    simulated: usize,
    concurrent: bool,
    plan: &BenchPlan,
) -> Result<SimulatedRun> {
    let started = Instant::now();
    let real = |v: usize| v % gpus.len();
    let flags = PingPongFlags::allocate((0..simulated).map(|v| &gpus[real(v)]))?;
    // No host gate for both ways at once either: a pair's buffer freed on a GPU another
    // pair shares waits for that pair's streams, which wait at its gate for a thread the
    // driver holds back (a simulated 4-GPU run on 2 H100s hung, issue 31).
    let plan = BenchPlan {
        disabled_copies: 0,
        disabled_memcpy_copies: 0,
        bidir_gate: false,
        ..*plan
    };
    let why = if concurrent {
        format!(
            "simulated {simulated}-GPU schedule: a round's pairs at once, as on an NVSwitch fabric"
        )
    } else {
        format!("simulated {simulated}-GPU schedule, one pair at a time (--serial)")
    };
    let rounds: Vec<RoundPlan> = schedule::rounds(simulated)
        .into_iter()
        .map(|pairs| RoundPlan {
            concurrent: concurrent && pairs.len() > 1,
            pairs,
            why: why.clone(),
        })
        .collect();
    let runs = schedule::execute(&rounds, &|a, b| {
        [(a, b), (b, a)]
            .into_iter()
            .map(|(s, d)| {
                let (rs, rd) = (real(s), real(d));
                bench::bench_pair(
                    (&gpus[rs], &modules[rs]),
                    (&gpus[rd], &modules[rd]),
                    (flags.at(s), flags.at(d)),
                    true,
                    &plan,
                    &|_| {},
                )
                .with_context(|| format!("measuring simulated GPUs {s} → {d}"))
            })
            .collect::<Result<Vec<PairBench>>>()
    });
    let mut out = SimulatedRun {
        simulated_gpus: simulated,
        gpus: gpus.iter().map(|g| g.bus_id).collect(),
        rounds: Vec::new(),
        schedule: rounds.iter().map(|r| r.pairs.clone()).collect(),
        pairs: Vec::new(),
        phases: None,
        elapsed_s: 0.0,
    };
    for (run, round) in runs.into_iter().zip(&rounds) {
        for b in run.results.into_iter().collect::<Result<Vec<_>>>()? {
            out.pairs.extend(b);
        }
        let bdf = |v: usize| gpus[real(v)].bus_id;
        out.rounds
            .push(RoundRecord::of(round, bdf, None, (run.wall_s, &run.pair_s)));
    }
    out.elapsed_s = started.elapsed().as_secs_f64();
    Ok(out)
}
