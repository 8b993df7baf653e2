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
/// slowest quarter of the places say it steadily: a place's rounds spread up to 20–40 %
/// inside one process, so min and max, each one place's figure, moved up to 5.2 % between
/// 5 processes where the quarters' means moved at most 1.8 % (2 and 4 × H200,
/// `tests/fixtures/agent/reference-comparison`).
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

fn fastest() -> String {
    "fastest".into()
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
        })
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
    /// processes). Stops at the first round that timed out.
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
        out.reference = out.placements.as_ref().map(Placements::stat);
        Ok(out)
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
