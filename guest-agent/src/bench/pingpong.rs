//! The flag ping-pong: one-way latency between two GPUs, timed like the reference probe,
//! as a distribution over the same flag placements in every process ([`Placements`]).

use serde::{Deserialize, Serialize};

use super::{timed, BenchPlan};
use crate::kernels::{Kernel, POLLS_PER_CHECK};
use crate::stats::Stat;
use vfio_p2p_cuda_driver::{CudaError, DeviceBuffer, Gpu, Module, Param, Stream};

/// Polls of a flag before a ping-pong kernel gives up (seconds, at any link speed).
const POLL_LIMIT: u64 = 1 << 24;

/// Distance between the other flag places sampled after the reference rounds: a
/// 128 KiB step plus one 128-byte line, so that both the low and the high address
/// bits that pick an L2 slice change from place to place.
pub(super) const FLAG_STRIDE: usize = (128 << 10) + 128;

/// One-way latency with the ping-pong flags at other places than the reference's
/// (reports of earlier agents; new reports carry [`Placements`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionSpread {
    /// Byte offset of each place's flags (the same on both GPUs) in a pair of buffers
    /// allocated after the reference flags and the other buffers of earlier pairs.
    pub offsets: Vec<u64>,
    /// One round at each place, in the order of `offsets` (µs).
    pub one_way_latency_us: Stat,
}

/// Flag places of the placement distribution: the most any plan samples.
pub const MAX_PLACES: usize = 32;

/// One-way latency as a distribution over flag placements (issue 42).
///
/// Where the two flags lie moves the one-way latency by some 20 % on one pair of H200s
/// (0.58–0.77 µs, each place steady to 0.1 %), most likely by which L2 slice, near or
/// far from the polling SM, holds their line; so a single figure is a property of
/// one allocation, not of the link. The agent measures the same `MAX_PLACES`
/// placements in every process: byte offsets `k × FLAG_STRIDE` into one buffer per
/// GPU, the first allocation of its context ([`PingPongFlags`]), each place measured in
/// every pass over the places, the median of its passes being its figure (one slow or fast
/// round cannot set it). The headline (`one_way_latency_us`) is the median over places; min
/// and max say how far placement alone moves it, and the means of the fastest and the
/// slowest quarter of the places say it steadily.
///
/// The extremes are judged on more rounds than the middle: a few places' rounds jump
/// between two levels inside one process (0.57 and 0.63 µs, 2 × H200), so the median of 3
/// landed on either and the min and max, each one place's figure, moved up to 5.2 % between
/// 5 processes where the quarters' means moved at most 1.8 %. After the passes the
/// `pingpong_extreme_places` fastest and slowest places ([`Placements::extreme_candidates`])
/// take `pingpong_extreme_rounds` more rounds each (`remeasured`), and such a place's
/// figure is the trimmed mean of all its rounds ([`trimmed_mean`]: a place that alternates
/// reads its mixture, a stray round is dropped), so min and max come from those.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placements {
    /// Byte offset of each place's flags (the same on both GPUs).
    pub offsets: Vec<u64>,
    /// Each place's figure, the median of its passes, in the order of `offsets` (µs);
    /// reports of agents before this rule kept the fastest pass (`figure` says which).
    pub one_way_latency_us: Vec<f64>,
    /// How each place's figure came from its passes: `median` (absent in reports of
    /// earlier agents: `fastest`).
    #[serde(default = "fastest")]
    pub figure: String,
    /// Each pass's round at each place, pass by pass (µs): how much a place moves inside
    /// one process. Absent in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes_us: Vec<Vec<f64>>,
    /// Passes over the places (rounds measured at each place).
    pub rounds_per_place: usize,
    /// The candidate extremes measured again after the passes, each with its further
    /// rounds; their figure is the trimmed mean of every round at the place
    /// ([`Placements::rounds_at`]). Absent in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remeasured: Vec<Remeasured>,
    /// Offsets of the places that gave the minimum, median and maximum.
    pub min_at: u64,
    pub median_at: u64,
    pub max_at: u64,
    /// Mean of the fastest quarter of the places' figures (at least one place), µs: the
    /// fast end of the distribution, steadier than the min. Absent in reports of earlier
    /// agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_quarter_us: Option<f64>,
    /// Mean of the slowest quarter, µs: the slow end, steadier than the max.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest_quarter_us: Option<f64>,
}

/// A place measured again after the passes ([`Placements::remeasured`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remeasured {
    /// The place's index in `offsets`.
    pub place: usize,
    /// Its further rounds, in the order measured (µs).
    pub rounds_us: Vec<f64>,
}

fn fastest() -> String {
    "fastest".into()
}

/// The mean of `v` without its fastest and its slowest value (the plain mean of fewer
/// than 3), `None` for none: one stray round either way sets nothing, and a place whose
/// rounds alternate between two levels reads their mixture where a median jumps between
/// them.
pub fn trimmed_mean(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.len() >= 3 {
        v = v[1..v.len() - 1].to_vec();
    }
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The median of `v` (the mean of the middle two at an even count), `None` for none.
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

impl Placements {
    /// The distribution of `values` (µs) measured at `offsets`, or `None` for none.
    /// `median_at` is the place nearest the median (the lower of two at an even count).
    pub fn of(offsets: Vec<u64>, values: Vec<f64>, rounds_per_place: usize) -> Option<Self> {
        if values.is_empty() || values.len() != offsets.len() {
            return None;
        }
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let at = |rank: usize| offsets[order[rank]];
        let quarter = values.len().div_ceil(4);
        let mean = |ranks: &[usize]| ranks.iter().map(|&i| values[i]).sum::<f64>() / quarter as f64;
        let (fastest, slowest) = (
            mean(&order[..quarter]),
            mean(&order[order.len() - quarter..]),
        );
        Some(Placements {
            fastest_quarter_us: Some(fastest),
            slowest_quarter_us: Some(slowest),
            min_at: at(0),
            median_at: at((order.len() - 1) / 2),
            max_at: at(order.len() - 1),
            offsets,
            one_way_latency_us: values,
            rounds_per_place,
            figure: "median".into(),
            passes_us: Vec::new(),
            remeasured: Vec::new(),
        })
    }

    /// The `per_end` fastest and the `per_end` slowest places by figure (indices into
    /// `offsets`), ascending, each once.
    pub fn extreme_candidates(&self, per_end: usize) -> Vec<usize> {
        let v = &self.one_way_latency_us;
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let per_end = per_end.min(v.len());
        let mut picked: Vec<usize> = order[..per_end]
            .iter()
            .chain(&order[v.len() - per_end..])
            .copied()
            .collect();
        picked.sort_unstable();
        picked.dedup();
        picked
    }

    /// Every round measured at place `p`: its passes', then its further ones.
    pub fn rounds_at(&self, p: usize) -> Vec<f64> {
        let passes = self.passes_us.iter().filter_map(|k| k.get(p).copied());
        let again = self.remeasured.iter().filter(|r| r.place == p);
        passes
            .chain(again.flat_map(|r| r.rounds_us.iter().copied()))
            .collect()
    }

    /// This distribution with further rounds at some places (`again`): each such place's
    /// figure becomes the trimmed mean of every round at it, and the statistics, their
    /// places and the quarters follow. Every round stays in the JSON.
    pub fn with_remeasured(self, again: Vec<Remeasured>) -> Self {
        let mut values = self.one_way_latency_us.clone();
        let mut with = self.clone();
        with.remeasured = again;
        for r in &with.remeasured {
            if let Some(x) = values.get_mut(r.place) {
                *x = trimmed_mean(&with.rounds_at(r.place)).unwrap_or(*x);
            }
        }
        let Some(d) = Self::of(self.offsets, values, self.rounds_per_place) else {
            return with;
        };
        Placements {
            passes_us: self.passes_us,
            remeasured: with.remeasured,
            ..d
        }
    }

    /// The distribution of whole passes over `offsets` (`passes[k][p]`: pass k's round at
    /// place p, µs), each place's figure the median of its passes. A pass cut short (a
    /// round timed out) counts at the places it reached; places no pass reached are left
    /// out.
    pub fn of_passes(offsets: &[u64], passes: Vec<Vec<f64>>) -> Option<Self> {
        let reached = passes.iter().map(Vec::len).max().unwrap_or(0);
        let figures: Vec<f64> = (0..reached.min(offsets.len()))
            .map_while(|p| {
                median(
                    &passes
                        .iter()
                        .filter_map(|k| k.get(p).copied())
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let mut d = Self::of(offsets[..figures.len()].to_vec(), figures, passes.len())?;
        d.passes_us = passes;
        Some(d)
    }

    /// min, median and max over the places.
    pub fn stat(&self) -> Stat {
        Stat::of(self.one_way_latency_us.clone()).expect("a distribution has places")
    }
}

/// The ping-pong flags of every GPU: one buffer each holding [`MAX_PLACES`] flag
/// places ([`Placements`]), the first allocation of its context.
///
/// The reference probe enables peer access, then takes `cudaMalloc(4)` on each GPU
/// before anything else; the agent likewise allocates this right after peer access is
/// enabled and before the module is loaded or any other buffer is allocated, so the
/// places are the same in every process of the same build. Every ordered pair uses
/// the buffers of its two GPUs.
pub struct PingPongFlags<'g> {
    flags: Vec<DeviceBuffer<'g>>,
}

impl<'g> PingPongFlags<'g> {
    /// One zeroed flag buffer per entry of `gpus` (a GPU listed twice, as a simulated
    /// schedule lists it, gets one per entry); call before anything else allocates there.
    pub fn allocate(gpus: impl IntoIterator<Item = &'g Gpu>) -> Result<Self, CudaError> {
        let words = (flag_offset(MAX_PLACES - 1) + 4) / 4;
        let flags = gpus
            .into_iter()
            .map(|g| DeviceBuffer::words(g, words, 0))
            .collect::<Result<_, _>>()?;
        Ok(PingPongFlags { flags })
    }

    /// The flag buffer of the `i`-th GPU given to [`PingPongFlags::allocate`].
    pub fn at(&self, i: usize) -> &DeviceBuffer<'g> {
        &self.flags[i]
    }
}

/// Byte offset of the `place`-th flag place (see [`Placements`]).
pub fn flag_offset(place: usize) -> usize {
    place * FLAG_STRIDE
}

/// Flag ping-pong between a kernel on each GPU; each polls its own memory and
/// writes the other's, so one round trip is two one-way writes. Timed like the
/// reference probe: CUDA events on `src`'s stream around the ping kernel, the pong
/// kernel already queued on `dst`.
pub(super) struct PingPong<'a, 'g> {
    pub(super) src: (&'g Gpu, &'a Module<'g>, &'a Stream<'g>),
    pub(super) dst: (&'g Gpu, &'a Module<'g>, &'a Stream<'g>),
    /// Set by a kernel that gave up waiting for its flag.
    pub(super) stop_a: DeviceBuffer<'g>,
    pub(super) stop_b: DeviceBuffer<'g>,
    pub(super) iters: u32,
}

#[derive(Default)]
pub(super) struct PingPongResult {
    pub(super) reference: Option<Stat>,
    pub(super) flag_addresses: Option<[String; 2]>,
    pub(super) placements: Option<Placements>,
    pub(super) timed_out: bool,
}

impl PingPong<'_, '_> {
    /// A warm-up round, then `plan.pingpong_rounds_per_place` passes over the first
    /// `plan.pingpong_positions` places (at most [`MAX_PLACES`]), each place's figure the
    /// median of its passes. Inside one process a place's rounds differ by up to a few %
    /// from pass to pass, and right after the previous pair re-enabled peer access the
    /// first ~10 ms of rounds can read up to 35 % slow (2 × H200, 2 of 8 processes, issue
    /// 42): the median of 3 passes drops one such round whichever way it strays, where the
    /// fastest of 2 kept every low stray (the min over places moved 3–6 % between
    /// processes). Then the candidate extremes take their further rounds
    /// ([`Placements::with_remeasured`]). Stops at the first round that timed out.
    pub(super) fn run(
        &self,
        (flag_a, flag_b): (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        plan: &BenchPlan,
    ) -> Result<PingPongResult, CudaError> {
        let mut out = PingPongResult {
            flag_addresses: Some([flag_a.ptr(), flag_b.ptr()].map(|p| format!("{p:#x}"))),
            ..PingPongResult::default()
        };
        let places = plan.pingpong_positions.clamp(1, MAX_PLACES);
        let rounds = plan.pingpong_rounds_per_place.max(1);
        if self.round((flag_a, flag_b), 0)?.is_none() {
            out.timed_out = true;
            return Ok(out);
        }
        let offsets: Vec<u64> = (0..places).map(|p| flag_offset(p) as u64).collect();
        // Pass after pass over every place.
        let mut passes: Vec<Vec<f64>> = Vec::with_capacity(rounds);
        'passes: for _ in 0..rounds {
            passes.push(Vec::with_capacity(places));
            for &at in &offsets {
                match self.round((flag_a, flag_b), at)? {
                    Some(us) => passes.last_mut().expect("a pass").push(us),
                    None => {
                        out.timed_out = true;
                        break 'passes;
                    }
                }
            }
        }
        out.placements = Placements::of_passes(&offsets, passes);
        if let Some(d) = out.placements.take() {
            let again = if out.timed_out {
                Vec::new()
            } else {
                self.remeasure_extremes((flag_a, flag_b), &d, plan, &mut out)?
            };
            out.placements = Some(d.with_remeasured(again));
        }
        out.reference = out.placements.as_ref().map(Placements::stat);
        Ok(out)
    }

    /// `plan.pingpong_extreme_rounds` more passes over `d`'s candidate extremes (the
    /// `plan.pingpong_extreme_places` fastest and slowest places), each place's further
    /// rounds; stops at the first round that timed out.
    fn remeasure_extremes(
        &self,
        flags: (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        d: &Placements,
        plan: &BenchPlan,
        out: &mut PingPongResult,
    ) -> Result<Vec<Remeasured>, CudaError> {
        let mut again: Vec<Remeasured> = d
            .extreme_candidates(plan.pingpong_extreme_places)
            .into_iter()
            .map(|place| Remeasured {
                place,
                rounds_us: Vec::with_capacity(plan.pingpong_extreme_rounds),
            })
            .collect();
        for _ in 0..plan.pingpong_extreme_rounds {
            for r in again.iter_mut() {
                match self.round(flags, d.offsets[r.place])? {
                    Some(us) => r.rounds_us.push(us),
                    None => {
                        out.timed_out = true;
                        return Ok(again);
                    }
                }
            }
        }
        Ok(again)
    }

    /// One round with the flags `at` bytes into `a` (on src) and `b` (on dst), which
    /// are zeroed first: the one-way latency (µs), or `None` if a kernel gave up.
    fn round(
        &self,
        (a, b): (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        at: u64,
    ) -> Result<Option<f64>, CudaError> {
        let (src_mod, sa) = (self.src.1, self.src.2);
        let (dst_mod, sb) = (self.dst.1, self.dst.2);
        a.fill_u32(0)?;
        b.fill_u32(0)?;
        let args = |my: &DeviceBuffer<'_>, peer: &DeviceBuffer<'_>, stop: &DeviceBuffer<'_>| {
            [
                Param::U64(my.ptr() + at),
                Param::U64(peer.ptr() + at),
                Param::U32(self.iters),
                Param::U64(POLL_LIMIT / POLLS_PER_CHECK),
                Param::U64(stop.ptr()),
            ]
        };
        dst_mod.launch(Kernel::Pong, 1, 1, sb, &args(b, a, &self.stop_b))?;
        let ms = timed(sa, || {
            src_mod.launch(Kernel::Ping, 1, 1, sa, &args(a, b, &self.stop_a))
        })?;
        sb.synchronize()?;
        let (mut x, mut y) = ([0u32], [0u32]);
        self.stop_a.download(&mut x)?;
        self.stop_b.download(&mut y)?;
        if x[0] != 0 || y[0] != 0 {
            return Ok(None);
        }
        Ok(Some(ms * 1e3 / self.iters as f64 / 2.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2 fastest and 2 slowest places take further rounds; each such place's figure
    /// is the trimmed mean of all its rounds, so a place alternating between two levels
    /// reads their mixture and one stray round sets nothing; min, max and their places
    /// follow, every round stays in the JSON.
    #[test]
    fn the_extremes_are_judged_on_more_rounds_by_their_trimmed_mean() {
        let passes = vec![
            vec![0.57, 0.66, 0.70, 0.61, 0.76, 0.65],
            vec![0.63, 0.66, 0.70, 0.61, 0.76, 0.65],
            vec![0.57, 0.66, 0.71, 0.62, 0.90, 0.65],
        ];
        let d = Placements::of_passes(&[0, 1, 2, 3, 4, 5], passes).unwrap();
        assert_eq!(d.one_way_latency_us[0], 0.57);
        assert_eq!(d.extreme_candidates(2), vec![0, 2, 3, 4]);
        assert_eq!(d.extreme_candidates(9), (0..6).collect::<Vec<_>>());
        let again = |place, rounds_us: &[f64]| Remeasured {
            place,
            rounds_us: rounds_us.to_vec(),
        };
        let r = d.clone().with_remeasured(vec![
            again(0, &[0.63, 0.63, 0.57]),
            again(2, &[0.70, 0.71, 0.70]),
            again(3, &[0.61, 0.62, 0.61]),
            again(4, &[0.76, 0.77, 0.76]),
        ]);
        // Place 0: 0.57 0.57 0.57 0.63 0.63 0.63 → 0.57 and 0.63 dropped, mean 0.60.
        assert!((r.one_way_latency_us[0] - 0.60).abs() < 1e-12);
        assert_eq!(r.rounds_at(0), vec![0.57, 0.63, 0.57, 0.63, 0.63, 0.57]);
        // Place 4's stray 0.90 is dropped.
        assert!((r.one_way_latency_us[4] - 0.7625).abs() < 1e-12);
        // Place 1 was not re-measured: still the median of its passes.
        assert_eq!(r.one_way_latency_us[1], 0.66);
        let s = r.stat();
        assert!((s.min - 0.60).abs() < 1e-12 && (s.max - 0.7625).abs() < 1e-12);
        assert_eq!((r.min_at, r.max_at), (0, 4));
        assert_eq!((r.passes_us.len(), r.remeasured.len()), (3, 4));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["remeasured"][3]["rounds_us"][1], 0.77);
        let back: Placements = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        // Nothing re-measured: the distribution of the passes as it was.
        assert_eq!(d.clone().with_remeasured(Vec::new()), d);
        assert_eq!(trimmed_mean(&[0.6, 0.8]), Some(0.7));
        assert_eq!(trimmed_mean(&[]), None);
    }
}
