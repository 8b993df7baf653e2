//! The flag ping-pong: one-way latency between two GPUs as a distribution over the same
//! flag placements in every process ([`Placements`]), each pass over the places one launch
//! timed inside the kernel.

use serde::{Deserialize, Serialize};

use super::BenchPlan;
use crate::kernels::{Kernel, POLLS_PER_CHECK};
use crate::stats::Stat;
use vfio_p2p_cuda_driver::{CudaError, DeviceBuffer, Gpu, Module, Param, Stream};

/// Polls of a flag before a ping-pong kernel gives up (seconds, at any link speed).
const POLL_LIMIT: u64 = 1 << 24;

/// Distance between flag places: a 128 KiB step plus one 128-byte line, so that both the
/// low and the high address bits that pick an L2 slice change from place to place.
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
pub const MAX_PLACES: usize = 64;

/// One-way latency as a distribution over flag placements (issue 42).
///
/// Where the two flags lie moves the one-way latency by some 40 % on H200s (0.53–0.75 µs):
/// by which L2 slice, near or far from the polling SM, holds their line on each side. The
/// agent measures the same `pingpong_positions` places in every process: byte offsets
/// `k × FLAG_STRIDE` into one buffer per GPU, the first allocation of its context
/// ([`PingPongFlags`]). A pass visits every place in one launch of the ping and pong
/// kernels, each place timed inside the kernel (`%globaltimer`, from the end of its first
/// round trip to the end of its last), so no launch or event enters a figure; the flags
/// are zeroed between passes.
///
/// Some places switch from pass to pass between discrete levels, at either end (4 × H200:
/// one place read 0.544 µs on 9 of 16 passes and 0.623 µs on the others, in another
/// process on 6 of 16; another 0.702 or 0.782 µs), so a place's median jumps between its
/// levels and the fastest and slowest places' medians moved 5–10 % and 3–4.6 % between
/// processes, while the fastest level any place reaches stayed within 1 %. Hence a place's
/// figure is the mean of its passes (its mixture, what a flag there costs on average),
/// and `min` is the fastest pass at any place (`fastest_pass_us`, at `min_at`): the floor
/// of the path. The median, `max` and the quarters are over the places' figures, and the
/// verdict uses the median.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placements {
    /// Byte offset of each place's flags (the same on both GPUs).
    pub offsets: Vec<u64>,
    /// Each place's figure, the mean of its passes, in the order of `offsets` (µs);
    /// reports of earlier agents kept the median or the fastest pass (`figure` says which).
    pub one_way_latency_us: Vec<f64>,
    /// How each place's figure came from its passes: `mean` (`median` in reports of the
    /// previous agent; absent in those of earlier ones: `fastest`).
    #[serde(default = "fastest")]
    pub figure: String,
    /// Each pass's figure at each place, pass by pass (µs): how much a place moves inside
    /// one process. Absent in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes_us: Vec<Vec<f64>>,
    /// Passes over the places.
    pub rounds_per_place: usize,
    /// How a pass was timed: `kernel` (the GPU's nanosecond clock inside the pass's one
    /// launch); absent in reports of earlier agents: `events` (CUDA events around one
    /// launch per place and pass, its launch inside the figure).
    #[serde(default = "events")]
    pub timing: String,
    /// The fastest pass at any place (µs), `one_way_latency_us.min`. Absent in reports of
    /// earlier agents, whose min was the fastest place's figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_pass_us: Option<f64>,
    /// Offsets of the places that gave the minimum (its fastest pass), the median and the
    /// maximum.
    pub min_at: u64,
    pub median_at: u64,
    pub max_at: u64,
    /// Mean of the fastest quarter of the places' figures (at least one place), µs.
    /// Absent in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastest_quarter_us: Option<f64>,
    /// Mean of the slowest quarter, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest_quarter_us: Option<f64>,
}

fn fastest() -> String {
    "fastest".into()
}

fn events() -> String {
    "events".into()
}

/// The mean of `v`, `None` for none.
fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Placements {
    /// The distribution of `values` (µs) measured at `offsets`, or `None` for none; its
    /// min is the fastest place's figure until [`Placements::of_passes`] sets the floor.
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
            figure: "mean".into(),
            timing: "kernel".into(),
            fastest_pass_us: None,
            passes_us: Vec::new(),
        })
    }

    /// The distribution of whole passes over `offsets` (`passes[k][p]`: pass k's figure at
    /// place p, µs): each place's figure the mean of its passes, the min the fastest pass
    /// at any place. A pass cut short (a wait timed out) counts at the places it reached;
    /// places no pass reached are left out.
    pub fn of_passes(offsets: &[u64], passes: Vec<Vec<f64>>) -> Option<Self> {
        let reached = passes.iter().map(Vec::len).max().unwrap_or(0);
        let at_place =
            |p: usize| -> Vec<f64> { passes.iter().filter_map(|k| k.get(p).copied()).collect() };
        let figures: Vec<f64> = (0..reached.min(offsets.len()))
            .map_while(|p| mean(&at_place(p)))
            .collect();
        let mut d = Self::of(offsets[..figures.len()].to_vec(), figures, passes.len())?;
        let fastest = (0..d.offsets.len())
            .flat_map(|p| at_place(p).into_iter().map(move |us| (us, p)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((us, p)) = fastest {
            d.fastest_pass_us = Some(us);
            d.min_at = d.offsets[p];
        }
        d.passes_us = passes;
        Some(d)
    }

    /// min (the fastest pass where the report has it, else the fastest place), median and
    /// max over the places.
    pub fn stat(&self) -> Stat {
        let s = Stat::of(self.one_way_latency_us.clone()).expect("a distribution has places");
        match self.fastest_pass_us {
            Some(floor) => s.with_min(floor),
            None => s,
        }
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

/// Flag ping-pong between a kernel on each GPU; each polls its own memory and writes the
/// other's, so one round trip is two one-way writes. A pass visits every place in one
/// launch on each side, the pong kernel queued first; the ping kernel stamps each place.
pub(super) struct PingPong<'a, 'g> {
    pub(super) src: (&'g Gpu, &'a Module<'g>, &'a Stream<'g>),
    pub(super) dst: (&'g Gpu, &'a Module<'g>, &'a Stream<'g>),
    /// Set by a kernel that gave up waiting for its flag.
    pub(super) stop_a: DeviceBuffer<'g>,
    pub(super) stop_b: DeviceBuffer<'g>,
    /// Round trips at each place of a pass (the first one warms the lines, untimed).
    pub(super) iters: u32,
}

#[derive(Default)]
pub(super) struct PingPongResult {
    pub(super) reference: Option<Stat>,
    pub(super) flag_addresses: Option<[String; 2]>,
    pub(super) placements: Option<Placements>,
    pub(super) timed_out: bool,
}

/// The buffers of a pass over the places: each side's table of offsets and the ping
/// side's stamps (start and end of each place, ns).
struct PassBuffers<'g> {
    table_a: DeviceBuffer<'g>,
    table_b: DeviceBuffer<'g>,
    stamps: DeviceBuffer<'g>,
}

impl PingPong<'_, '_> {
    /// A warm-up pass over the first place, then `plan.pingpong_rounds_per_place` passes over
    /// the first `plan.pingpong_positions` places (at most [`MAX_PLACES`]). Stops at the
    /// first wait that timed out, keeping the places its pass reached.
    pub(super) fn run(
        &self,
        flags: (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        plan: &BenchPlan,
    ) -> Result<PingPongResult, CudaError> {
        let mut out = PingPongResult {
            flag_addresses: Some([flags.0.ptr(), flags.1.ptr()].map(|p| format!("{p:#x}"))),
            ..PingPongResult::default()
        };
        let places = plan.pingpong_positions.clamp(1, MAX_PLACES);
        let offsets: Vec<u64> = (0..places).map(|p| flag_offset(p) as u64).collect();
        let buffers = self.pass_buffers(&offsets)?;
        let warm = self.pass(flags, &buffers, 1)?;
        let mut passes: Vec<Vec<f64>> = Vec::with_capacity(plan.pingpong_rounds_per_place);
        if warm.len() == 1 {
            for _ in 0..plan.pingpong_rounds_per_place.max(1) {
                let pass = self.pass(flags, &buffers, places)?;
                let cut = pass.len() < places;
                passes.push(pass);
                if cut {
                    break;
                }
            }
        }
        out.timed_out = warm.is_empty() || passes.last().is_some_and(|p| p.len() < places);
        out.placements = Placements::of_passes(&offsets, passes);
        out.reference = out.placements.as_ref().map(Placements::stat);
        Ok(out)
    }

    fn pass_buffers(&self, offsets: &[u64]) -> Result<PassBuffers<'_>, CudaError> {
        let table = |g| -> Result<DeviceBuffer<'_>, CudaError> {
            let t = DeviceBuffer::new(g, offsets.len() * 8)?;
            t.upload(offsets)?;
            Ok(t)
        };
        Ok(PassBuffers {
            table_a: table(self.src.0)?,
            table_b: table(self.dst.0)?,
            stamps: DeviceBuffer::new(self.src.0, offsets.len() * 16)?,
        })
    }

    /// One pass over the first `places` places of the tables, the flags `(a on src, b on
    /// dst)` zeroed first: each reached place's one-way latency (µs), in order; fewer than
    /// `places` if a kernel gave up.
    fn pass(
        &self,
        (a, b): (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        buf: &PassBuffers<'_>,
        places: usize,
    ) -> Result<Vec<f64>, CudaError> {
        let (src_mod, sa) = (self.src.1, self.src.2);
        let (dst_mod, sb) = (self.dst.1, self.dst.2);
        a.fill_u32(0)?;
        b.fill_u32(0)?;
        buf.stamps.fill_u32(0)?;
        let args = |my: &DeviceBuffer<'_>,
                    peer: &DeviceBuffer<'_>,
                    table: &DeviceBuffer<'_>,
                    stop: &DeviceBuffer<'_>| {
            vec![
                Param::U64(my.ptr()),
                Param::U64(peer.ptr()),
                Param::U64(table.ptr()),
                Param::U32(places as u32),
                Param::U32(self.iters.max(2)),
                Param::U64(POLL_LIMIT / POLLS_PER_CHECK),
                Param::U64(stop.ptr()),
            ]
        };
        dst_mod.launch(
            Kernel::Pong,
            1,
            1,
            sb,
            &args(b, a, &buf.table_b, &self.stop_b),
        )?;
        let mut ping = args(a, b, &buf.table_a, &self.stop_a);
        ping.push(Param::U64(buf.stamps.ptr()));
        src_mod.launch(Kernel::Ping, 1, 1, sa, &ping)?;
        sa.synchronize()?;
        sb.synchronize()?;
        let mut stamps = vec![0u64; places * 2];
        buf.stamps.download(&mut stamps)?;
        let timed_trips = 2.0 * f64::from(self.iters.max(2) - 1);
        Ok(stamps
            .chunks(2)
            .map_while(|s| (s[1] > 0).then(|| s[1].saturating_sub(s[0]) as f64 / 1e3 / timed_trips))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each place's figure is the mean of its passes (a place switching between two levels
    /// reads its mixture); the min is the fastest pass at any place, the max the slowest
    /// place's mean; every pass stays in the JSON.
    #[test]
    fn min_is_the_fastest_pass_and_the_rest_are_over_the_places_means() {
        let passes = vec![
            vec![0.62, 0.66, 0.70, 0.61, 0.70, 0.65],
            vec![0.54, 0.66, 0.70, 0.61, 0.78, 0.65],
            vec![0.61, 0.66, 0.70, 0.61, 0.78, 0.65],
            vec![0.63, 0.66, 0.70, 0.61, 0.70, 0.65],
        ];
        let d = Placements::of_passes(&[0, 1, 2, 3, 4, 5], passes.clone()).unwrap();
        let want = [0.60, 0.66, 0.70, 0.61, 0.74, 0.65];
        for (got, want) in d.one_way_latency_us.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{got} {want}");
        }
        assert_eq!(d.fastest_pass_us, Some(0.54));
        let s = d.stat();
        assert!((s.min, s.median) == (0.54, 0.655) && (s.max - 0.74).abs() < 1e-12);
        assert!((s.spread_pct - (0.74 - 0.54) / 0.655 * 100.0).abs() < 1e-9);
        // The fastest pass was at place 0, whose mean (0.60) is the fastest figure too;
        // place 4's median would jump between its levels, its mean is their mixture.
        assert_eq!((d.min_at, d.max_at), (0, 4));
        assert_eq!(d.figure, "mean");
        assert_eq!(d.passes_us, passes);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            (v["timing"].as_str(), v["fastest_pass_us"].as_f64()),
            (Some("kernel"), Some(0.54))
        );
        let back: Placements = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }

    /// A report of an earlier agent (no fastest pass, events timing): its min is still the
    /// fastest place's figure.
    #[test]
    fn reports_of_earlier_agents_keep_their_min() {
        let d = Placements::of(vec![0, 1, 2], vec![0.61, 0.57, 0.70], 3).unwrap();
        let mut v = serde_json::to_value(&d).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("timing");
        o.remove("fastest_pass_us");
        let old: Placements = serde_json::from_value(v).unwrap();
        assert_eq!(old.timing, "events");
        assert_eq!((old.stat().min, old.min_at), (0.57, 1));
    }
}
