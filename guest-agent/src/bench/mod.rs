//! `bench`: latency and bandwidth of one ordered GPU pair, the way the reference
//! probe measures them (CUDA events around a batch, time per item), repeated.
//!
//! The first round of each measurement is a warm-up and is dropped (`warmup_rounds`).

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::kernels::{chase_next, Kernel};
use crate::stats::Stat;
use vfio_p2p_cuda_driver::{
    peers, CudaError, DeviceBuffer, Event, Gpu, HostGate, Module, Param, Stream,
};

pub mod copy_modes;
pub mod nvbandwidth;
pub mod pingpong;

use copy_modes::CopyMode;
use pingpong::{PingPong, PingPongResult, Placements, PositionSpread};

/// How much to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchPlan {
    /// Kept rounds of each measurement (after one warm-up).
    pub samples: usize,
    /// Kept rounds of the ping-pong (after one warm-up), all with the flags placed
    /// like the reference probe's (see [`PingPongFlags`]). Absent (0) in reports of the
    /// first agent, whose ping-pong took `samples` rounds.
    #[serde(default)]
    pub pingpong_samples: usize,
    /// Other flag places sampled after those rounds, one round each (see
    /// [`flag_offset`]), to show how much the placement moves the figure. Absent (0)
    /// in reports of earlier agents.
    #[serde(default)]
    pub pingpong_positions: usize,
    /// Passes over the flag places of the placement distribution ([`Placements`]); 0 in
    /// reports of earlier agents, which sampled `pingpong_samples` rounds at the
    /// reference place and one round at each other place.
    #[serde(default)]
    pub pingpong_rounds_per_place: usize,
    /// Round trips at each place of a pass, the first one untimed (at least 2).
    pub pingpong_iters: u32,
    /// Dependent loads of each remote chase round.
    pub chase_steps: u32,
    /// Dependent loads of each local chase round (its loads are 6 times faster, so the
    /// same fixed cost of a round weighs more: 3,000 read 1.4 % above 10,000). 0 in
    /// reports of earlier agents, whose local chase took `chase_steps`.
    #[serde(default)]
    pub local_chase_steps: u32,
    /// Words of the pointer-chase array (a power of two).
    pub chase_words: u32,
    pub memcpy_copies: u32,
    /// Streams the 4-byte copy is timed on, one after the other (its modes, see
    /// [`CopyMode`]); 0 in reports of earlier agents (one stream).
    #[serde(default)]
    pub memcpy_streams: usize,
    pub bw_bytes: usize,
    pub bw_copies: u32,
    pub disabled_copies: u32,
    /// Bytes of each staged copy with peer access disabled; 0 (reports of earlier
    /// agents, and FULL) is `bw_bytes`.
    #[serde(default)]
    pub disabled_bytes: usize,
    pub disabled_memcpy_copies: u32,
    /// Both ways at once: both streams wait on one host-memory gate, released once
    /// every copy is queued, so neither direction starts first (false in reports of
    /// earlier agents: the reverse stream waited on an event of the source GPU, starting
    /// some 20 µs late, 1 % of a 3-copy batch).
    #[serde(default)]
    pub bidir_gate: bool,
    /// Rounds run and dropped before each measurement's samples (1 in reports of
    /// earlier agents).
    #[serde(default = "one")]
    pub warmup_rounds: usize,
    /// Adaptive sampling: stop after this many kept rounds once their spread is below
    /// `target_spread_permille` ‰ of the median (up to `samples`). 0 in reports of
    /// earlier agents, which always took `samples`.
    #[serde(default)]
    pub min_samples: usize,
    #[serde(default)]
    pub target_spread_permille: u32,
    /// The ping-pong's adaptive stop: at least this many rounds within the spread
    /// above (up to `pingpong_samples`). 0 in reports of earlier agents, which always
    /// took `pingpong_samples`.
    #[serde(default)]
    pub pingpong_min_samples: usize,
}

impl BenchPlan {
    /// The reference probe's buffer sizes, with batches as short as keep every median
    /// where the probe's batches put it (2 × H100 NVLink, 2026-11-25: the probe's 100,000
    /// ping-pongs a round took 2.6 s of the 3.5 s a direction took; see README, Measured).
    /// Issue 31 shortened each batch to a few milliseconds of GPU time, far above the
    /// microseconds the events around it cost: a sample's spread inside a process was
    /// 0.02–0.3 % for the bandwidths and the chase at the earlier sizes (2 and 4 × H100,
    /// `tests/fixtures/agent/h100-nvswitch`), so 3 copies of 256 MiB (2 ms) stand for 10,
    /// 4 staged copies of 64 MiB (7 ms) for 4 of 256 MiB (one of 256 MiB read 1–2 % high),
    /// 3,000 remote dependent loads for 10,000 and 1,000 ping-pongs (1.7 ms) for 5,000;
    /// no round is dropped before the samples (the ping-pong keeps its warm-up round): a
    /// cold first sample breaks the 1 % agreement and the rule takes 5 samples, whose
    /// median drops it (README, the report beside p2pBandwidthLatencyTest).
    ///
    /// Issue 42: the one-way latency is a distribution over 48 flag places, 24 passes of 40
    /// round trips each, every pass one launch timed inside the kernel ([`Placements`]).
    /// 4 × H200, 5 processes, 12 pairs at 16 passes: the min (the fastest pass) within 1 %,
    /// the median 1.8 %, the max (the slowest place's mean) 2.7 %; 24 passes narrow the
    /// places' mixtures. 32 places or 12 passes let the min move 2.7–3.2 %, and event
    /// timing around one launch per place and pass, 24 places × 3 passes of 400, moved it
    /// up to 9 %. The 4-byte copy is timed on 2 streams (its mode is mostly the process's).
    /// Within p2pBandwidthLatencyTest's wall: the 4-byte copy takes 500 copies a sample,
    /// the staged copy 3 of 64 MiB and 100 4-byte copies.
    pub const FULL: BenchPlan = BenchPlan {
        samples: 5,
        pingpong_samples: 0,
        pingpong_positions: 48,
        pingpong_rounds_per_place: 24,
        pingpong_iters: 40,
        chase_steps: 3_000,
        local_chase_steps: 10_000,
        chase_words: 1 << 22,
        memcpy_copies: 500,
        memcpy_streams: 2,
        bw_bytes: 256 << 20,
        bw_copies: 3,
        disabled_copies: 3,
        disabled_bytes: 64 << 20,
        disabled_memcpy_copies: 100,
        bidir_gate: true,
        warmup_rounds: 0,
        // The 2 × H200 figures agreed to ±0 % over 5 samples (issue 17): 3 within 1 %
        // are as good, and a noisy measurement still gets all 5.
        min_samples: 3,
        target_spread_permille: 10,
        // Unused since issue 42 (each place takes `pingpong_rounds_per_place`).
        pingpong_min_samples: 0,
    };

    /// FULL's batches (measured in issue 31) with fewer samples and flag places: never
    /// longer than the full report (its earlier, larger batches made it slower, 2.9–3.0 s
    /// against 2.2 s on 4 × H100).
    pub const QUICK: BenchPlan = BenchPlan {
        samples: 3,
        pingpong_positions: 16,
        pingpong_rounds_per_place: 4,
        memcpy_streams: 2,
        min_samples: 3,
        target_spread_permille: 0,
        pingpong_min_samples: 0,
        ..BenchPlan::FULL
    };

    /// Number of progress steps of one pair.
    pub const STEPS: u64 = 8;

    /// This plan with `KEY=VALUE` overrides (`report --tune`, a bench aid: the side-by-side
    /// H100 bench runs compare batch sizes in one process build):
    /// `disabled_copies`, `disabled_mib`, `min_samples`, `warmup_rounds`, `pingpong_positions`,
    /// `pingpong_rounds_per_place`, `pingpong_iters`, `memcpy_streams`, `bidir=gate|event`.
    pub fn tuned<'a>(mut self, items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        for item in items {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("--tune {item:?}: KEY=VALUE expected"))?;
            let number = || {
                value
                    .parse::<u32>()
                    .map_err(|_| format!("--tune {key}: {value:?} is not a whole number"))
            };
            match key {
                "disabled_copies" => self.disabled_copies = number()?,
                "disabled_mib" => self.disabled_bytes = (number()? as usize) << 20,
                "min_samples" => self.min_samples = number()? as usize,
                "warmup_rounds" => self.warmup_rounds = number()? as usize,
                "pingpong_positions" => self.pingpong_positions = number()? as usize,
                "pingpong_rounds_per_place" => self.pingpong_rounds_per_place = number()? as usize,
                "pingpong_iters" => self.pingpong_iters = number()?.max(2),
                "memcpy_streams" => self.memcpy_streams = number()? as usize,
                "bidir" => {
                    self.bidir_gate = match value {
                        "gate" => true,
                        "event" => false,
                        _ => return Err(format!("--tune bidir={value}: gate or event")),
                    }
                }
                _ => return Err(format!("--tune {key}: not a bench plan setting")),
            }
        }
        Ok(self)
    }

    /// Bytes of one staged copy with peer access disabled.
    pub fn disabled_copy_bytes(&self) -> usize {
        match self.disabled_bytes {
            0 => self.bw_bytes,
            n => n.min(self.bw_bytes),
        }
    }
}

/// Host gates of finished both-ways measurements, for the next pair: a gate is pinned host
/// memory, and freeing it waits for the device, where other pairs' streams may be waiting
/// at their own gates for threads the driver holds back.
static GATES: std::sync::Mutex<Vec<HostGate>> = std::sync::Mutex::new(Vec::new());

fn one() -> usize {
    1
}

const COPY_BLOCK: u32 = 512;

/// Everything measured for `src` → `dst`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairBench {
    pub src: Bdf,
    pub dst: Bdf,
    pub plan: BenchPlan,
    /// One-way latency of a flag write, from a ping-pong with the flags placed like
    /// the reference probe's (µs), a sample per round. Needs access both ways.
    pub one_way_latency_us: Option<Stat>,
    /// Device addresses of those flags, `[on src, on dst]`, to compare with the
    /// addresses the reference probe prints.
    #[serde(default)]
    pub pingpong_flag_addresses: Option<[String; 2]>,
    /// Reports of earlier agents: the ping-pong with the flags at other places, one
    /// round each. New reports carry `one_way_placements` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pingpong_position_spread: Option<PositionSpread>,
    /// One-way latency over the same flag places in every process (issue 42):
    /// `one_way_latency_us` is its min, median and max. Absent in reports of earlier
    /// agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_way_placements: Option<Placements>,
    /// A ping-pong kernel gave up waiting: a write never arrived.
    pub pingpong_timed_out: bool,
    /// Dependent loads from `dst`'s memory by a kernel on `src` (µs per load).
    pub remote_read_latency_us: Stat,
    /// The same chase in `src`'s own memory, for contrast.
    pub local_read_latency_us: Stat,
    /// One 4-byte `cuMemcpyPeerAsync` (µs per copy), on the pair's stream.
    pub memcpy_latency_us: Stat,
    /// The same on each of `plan.memcpy_streams` streams, the pair's first (empty in
    /// reports of earlier agents).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memcpy_latency_by_stream_us: Vec<Stat>,
    /// The 4-byte copy's modes over those streams: each distinct figure, how many
    /// streams gave it and which.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memcpy_modes: Vec<CopyMode>,
    /// Copy-engine bandwidth src → dst (GB/s, 10^9 bytes).
    pub ce_bandwidth_gbps: Stat,
    /// Copy engines both ways at once, total (GB/s).
    pub ce_bidir_bandwidth_gbps: Stat,
    /// A copy kernel on `src` storing through the peer pointer (GB/s).
    pub sm_copy_bandwidth_gbps: Stat,
    /// Copy-engine copy with peer access disabled both ways: staged through the host.
    pub disabled_bandwidth_gbps: Stat,
    pub disabled_memcpy_latency_us: Stat,
    /// The nvbandwidth testcase each figure corresponds to, by field name (issue 42):
    /// results line up with nvbandwidth and DCGM's nvbandwidth plugin. Figures without
    /// a counterpart there (the one-way ping-pong, the 4-byte copy) are not listed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub nvbandwidth_testcases: std::collections::BTreeMap<String, String>,
    /// Seconds each measurement took (warm-up and setup included), in order: where the
    /// pair's time goes (`report -v`). Absent in reports of earlier agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measure_s: Vec<(String, f64)>,
}

/// A GPU with its module, as the benchmark needs them.
pub type Side<'a, 'g> = (&'g Gpu, &'a Module<'g>);

/// Whether the kept samples `v` are enough under `plan`'s stopping rule: all
/// `plan.samples` of them, or at least `plan.min_samples` whose spread (max − min) is
/// below `plan.target_spread_permille` ‰ of their median.
pub fn enough(v: &[f64], plan: &BenchPlan) -> bool {
    if v.len() >= plan.samples.max(1) {
        return true;
    }
    if plan.target_spread_permille == 0 || plan.min_samples == 0 || v.len() < plan.min_samples {
        return false;
    }
    Stat::of(v.to_vec())
        .is_some_and(|s| s.spread_pct * 10.0 < f64::from(plan.target_spread_permille))
}

/// Runs timed rounds (after `plan.warmup_rounds` dropped ones), each returning one sample,
/// until [`enough`].
fn sampled(
    plan: &BenchPlan,
    mut round: impl FnMut() -> Result<f64, CudaError>,
) -> Result<Stat, CudaError> {
    for _ in 0..plan.warmup_rounds {
        round()?;
    }
    let mut v = Vec::with_capacity(plan.samples);
    while !enough(&v, plan) {
        v.push(round()?);
    }
    Ok(Stat::of(v).expect("at least one sample"))
}

/// Milliseconds taken by what `enqueue` puts on `stream`.
pub(super) fn timed(
    stream: &Stream<'_>,
    enqueue: impl FnOnce() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let gpu = stream.gpu();
    let (start, end) = (Event::new(gpu)?, Event::new(gpu)?);
    start.record(stream)?;
    enqueue()?;
    end.record(stream)?;
    end.synchronize()?;
    end.since(&start)
}

/// The measurements of one pair as they end: the caller's `step`, and the seconds each took.
struct Laps<'s> {
    step: &'s (dyn Fn(&str) + Sync),
    last: std::time::Instant,
    laps: Vec<(String, f64)>,
}

impl<'s> Laps<'s> {
    fn start(step: &'s (dyn Fn(&str) + Sync)) -> Self {
        let last = std::time::Instant::now();
        Laps {
            step,
            last,
            laps: Vec::with_capacity(BenchPlan::STEPS as usize),
        }
    }

    fn done(&mut self, what: &str) {
        let now = std::time::Instant::now();
        self.laps
            .push((what.to_string(), (now - self.last).as_secs_f64()));
        self.last = now;
        (self.step)(what);
    }
}

/// Measures `src` → `dst` with the ping-pong flags `(on src, on dst)`; peer access must be
/// enabled src→dst (and dst→src for the ping-pong, which is skipped otherwise). `step` is
/// called after each measurement. `src` and `dst` may be one GPU (a simulated schedule
/// on one GPU): the same figures, within the GPU, and nothing with peer access disabled.
pub fn bench_pair(
    (src, src_mod): Side<'_, '_>,
    (dst, dst_mod): Side<'_, '_>,
    (flag_src, flag_dst): (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
    both_ways: bool,
    plan: &BenchPlan,
    step: &(dyn Fn(&str) + Sync),
) -> Result<PairBench, CudaError> {
    let mut laps = Laps::start(step);
    let sa = Stream::new(src)?;
    let sb = Stream::new(dst)?;
    let pp = if both_ways {
        let pp = PingPong {
            src: (src, src_mod, &sa),
            dst: (dst, dst_mod, &sb),
            stop_a: DeviceBuffer::words(src, 1, 0)?,
            stop_b: DeviceBuffer::words(dst, 1, 0)?,
            iters: plan.pingpong_iters,
        };
        pp.run((flag_src, flag_dst), plan)?
    } else {
        PingPongResult::default()
    };
    laps.done("one-way latency");
    let pair = PairRun {
        src,
        src_mod,
        dst,
        sa: &sa,
        sb: &sb,
        plan,
    };
    let (remote_read_latency_us, local_read_latency_us) = pair.pointer_chase()?;
    laps.done("pointer chase");
    let tiny = (
        DeviceBuffer::words(src, 1, 0)?,
        DeviceBuffer::words(dst, 1, 0)?,
    );
    let memcpy_latency_by_stream_us = pair.memcpy_latency_by_stream(&tiny)?;
    let memcpy_latency_us = memcpy_latency_by_stream_us[0].clone();
    let memcpy_modes = copy_modes::modes(&memcpy_latency_by_stream_us);
    laps.done("memcpy latency");
    let bytes = plan.bw_bytes;
    let (s_src, d_dst) = (
        DeviceBuffer::new(src, bytes)?,
        DeviceBuffer::new(dst, bytes)?,
    );
    let ce_bandwidth_gbps = pair.ce_bandwidth(&s_src, &d_dst, (plan.bw_copies, plan.bw_bytes))?;
    laps.done("copy-engine bandwidth");
    let (ce_bidir_bandwidth_gbps, gated) = pair.bidir_bandwidth(&s_src, &d_dst)?;
    laps.done("bidirectional bandwidth");
    let sm_copy_bandwidth_gbps = pair.sm_copy_bandwidth(&s_src, &d_dst)?;
    laps.done("SM copy bandwidth");
    let (disabled_bandwidth_gbps, disabled_memcpy_latency_us) =
        pair.with_peer_access_disabled(both_ways, &s_src, &d_dst, &tiny)?;
    laps.done("peer access disabled");
    Ok(PairBench {
        src: src.bus_id,
        dst: dst.bus_id,
        plan: BenchPlan {
            bidir_gate: gated,
            ..*plan
        },
        one_way_latency_us: pp.reference,
        pingpong_flag_addresses: pp.flag_addresses,
        pingpong_position_spread: None,
        one_way_placements: pp.placements,
        pingpong_timed_out: pp.timed_out,
        remote_read_latency_us,
        local_read_latency_us,
        memcpy_latency_us,
        memcpy_latency_by_stream_us,
        memcpy_modes,
        ce_bandwidth_gbps,
        ce_bidir_bandwidth_gbps,
        sm_copy_bandwidth_gbps,
        disabled_bandwidth_gbps,
        disabled_memcpy_latency_us,
        nvbandwidth_testcases: nvbandwidth::testcases(),
        measure_s: laps.laps,
    })
}

/// Computes the pointer-chase array of `plan` now (`report` does it beside CUDA's start,
/// off the first pair's path: 4 Mi words took ~20 ms there).
pub fn prepare_chase_chain(plan: &BenchPlan) {
    chase_chain(plan.chase_words);
}

/// The pointer-chase array of `words` words, computed once per process (every pair and
/// direction uploads the same one).
fn chase_chain(words: u32) -> std::sync::Arc<Vec<u32>> {
    static CHAIN: std::sync::Mutex<Option<(u32, std::sync::Arc<Vec<u32>>)>> =
        std::sync::Mutex::new(None);
    let mut cached = CHAIN.lock().unwrap_or_else(|p| p.into_inner());
    match &*cached {
        Some((w, c)) if *w == words => c.clone(),
        _ => {
            let c =
                std::sync::Arc::new((0..words).map(|i| chase_next(i, words)).collect::<Vec<_>>());
            *cached = Some((words, c.clone()));
            c
        }
    }
}

/// One ordered pair being measured: its GPUs, the source's kernels, a stream on each.
struct PairRun<'a, 'g> {
    src: &'g Gpu,
    src_mod: &'a Module<'g>,
    dst: &'g Gpu,
    sa: &'a Stream<'g>,
    sb: &'a Stream<'g>,
    plan: &'a BenchPlan,
}

fn gbps(ms: f64, total: f64) -> f64 {
    total / (ms * 1e-3) / 1e9
}

impl PairRun<'_, '_> {
    /// Dependent reads by one thread from the source: through the peer's memory, then
    /// local memory (µs per read).
    fn pointer_chase(&self) -> Result<(Stat, Stat), CudaError> {
        let plan = self.plan;
        let chain = chase_chain(plan.chase_words);
        let out = DeviceBuffer::words(self.src, 1, 0)?;
        let chase = |array: &DeviceBuffer<'_>, steps: u32| -> Result<Stat, CudaError> {
            let launch = |steps: u32| {
                self.src_mod.launch(
                    Kernel::Chase,
                    1,
                    1,
                    self.sa,
                    &[
                        Param::U64(array.ptr()),
                        Param::U32(steps),
                        Param::U64(out.ptr()),
                    ],
                )
            };
            launch(100)?;
            sampled(plan, || {
                Ok(timed(self.sa, || launch(steps))? * 1e3 / steps as f64)
            })
        };
        let remote = DeviceBuffer::new(self.dst, chain.len() * 4)?;
        remote.upload(&chain)?;
        let remote_us = chase(&remote, plan.chase_steps)?;
        drop(remote);
        let local = DeviceBuffer::new(self.src, chain.len() * 4)?;
        local.upload(&chain)?;
        let local_steps = match plan.local_chase_steps {
            0 => plan.chase_steps,
            n => n,
        };
        let local_us = chase(&local, local_steps)?;
        Ok((remote_us, local_us))
    }

    /// 4-byte peer copies back to back on the pair's stream, then on
    /// `plan.memcpy_streams - 1` more streams of the source (µs per copy, a Stat each).
    fn memcpy_latency_by_stream(
        &self,
        tiny: &(DeviceBuffer<'_>, DeviceBuffer<'_>),
    ) -> Result<Vec<Stat>, CudaError> {
        let copies = self.plan.memcpy_copies;
        let mut v = vec![self.memcpy_latency(tiny, copies, self.sa)?];
        for _ in 1..self.plan.memcpy_streams {
            let s = Stream::new(self.src)?;
            v.push(self.memcpy_latency(tiny, copies, &s)?);
        }
        Ok(v)
    }

    /// 4-byte peer copies back to back on `stream` (µs per copy).
    fn memcpy_latency(
        &self,
        (tiny_src, tiny_dst): &(DeviceBuffer<'_>, DeviceBuffer<'_>),
        copies: u32,
        stream: &Stream<'_>,
    ) -> Result<Stat, CudaError> {
        sampled(self.plan, || {
            let ms = timed(stream, || {
                (0..copies).try_for_each(|_| stream.copy_peer(tiny_dst, tiny_src, 4))
            })?;
            Ok(ms * 1e3 / copies as f64)
        })
    }

    /// Copy-engine copies src → dst (GB/s).
    fn ce_bandwidth(
        &self,
        s_src: &DeviceBuffer<'_>,
        d_dst: &DeviceBuffer<'_>,
        (copies, bytes): (u32, usize),
    ) -> Result<Stat, CudaError> {
        sampled(self.plan, || {
            let ms = timed(self.sa, || {
                (0..copies).try_for_each(|_| self.sa.copy_peer(d_dst, s_src, bytes))
            })?;
            Ok(gbps(ms, copies as f64 * bytes as f64))
        })
    }

    /// Copy-engine copies both ways at once, one stream each (GB/s, both directions), and
    /// whether the streams started at a host gate (else the reverse stream waits on an
    /// event of the source GPU: a driver without stream memory operations).
    fn bidir_bandwidth(
        &self,
        s_src: &DeviceBuffer<'_>,
        d_dst: &DeviceBuffer<'_>,
    ) -> Result<(Stat, bool), CudaError> {
        let (plan, bytes) = (self.plan, self.plan.bw_bytes);
        let s_dst = DeviceBuffer::new(self.dst, bytes)?;
        let d_src = DeviceBuffer::new(self.src, bytes)?;
        let gate = if plan.bidir_gate {
            self.start_gate()
        } else {
            None
        };
        let stat = sampled(plan, || {
            let back_done = Event::new(self.dst)?;
            if let Some(g) = &gate {
                g.close();
                g.hold(self.sa)?;
                g.hold(self.sb)?;
            }
            let ms = timed(self.sa, || {
                if gate.is_none() {
                    let start = Event::new(self.src)?;
                    start.record(self.sa)?;
                    self.sb.wait(&start)?;
                }
                for _ in 0..plan.bw_copies {
                    self.sa.copy_peer(d_dst, s_src, bytes)?;
                    self.sb.copy_peer(&d_src, &s_dst, bytes)?;
                }
                back_done.record(self.sb)?;
                self.sa.wait(&back_done)?;
                if let Some(g) = &gate {
                    g.open();
                }
                Ok(())
            })?;
            Ok(gbps(ms, 2.0 * plan.bw_copies as f64 * bytes as f64))
        });
        let gated = gate.is_some();
        if let Some(g) = gate {
            g.open();
            GATES.lock().unwrap_or_else(|p| p.into_inner()).push(g);
        }
        Ok((stat?, gated))
    }

    /// An open gate both streams have passed once, or none where the driver refuses
    /// stream memory operations (`cuStreamWaitValue32`). Gates come from [`GATES`] and go
    /// back there: never freed while pairs run (`cuMemFreeHost` waits for the device).
    fn start_gate(&self) -> Option<HostGate> {
        let pooled = GATES.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let gate = match pooled {
            Some(g) => g,
            None => HostGate::new(self.src).ok()?,
        };
        gate.open();
        let tried = gate
            .hold(self.sa)
            .and_then(|()| gate.hold(self.sb))
            .and_then(|()| self.sa.synchronize())
            .and_then(|()| self.sb.synchronize());
        tried.ok().map(|()| gate)
    }

    /// A copy kernel on the source's SMs writing into the peer (GB/s).
    fn sm_copy_bandwidth(
        &self,
        s_src: &DeviceBuffer<'_>,
        d_dst: &DeviceBuffer<'_>,
    ) -> Result<Stat, CudaError> {
        let (plan, bytes) = (self.plan, self.plan.bw_bytes);
        let words16 = (bytes / 16) as u64;
        sampled(plan, || {
            let ms = timed(self.sa, || {
                (0..plan.bw_copies).try_for_each(|_| {
                    self.src_mod.launch(
                        Kernel::Copy,
                        self.src.sm_count.max(1) * 4,
                        COPY_BLOCK,
                        self.sa,
                        &[
                            Param::U64(s_src.ptr()),
                            Param::U64(d_dst.ptr()),
                            Param::U64(words16),
                        ],
                    )
                })
            })?;
            Ok(gbps(ms, plan.bw_copies as f64 * bytes as f64))
        })
    }

    /// Bandwidth and copy latency with peer access disabled (the path a guest without
    /// cliques takes); access is restored whatever happens, for the pairs after this one.
    fn with_peer_access_disabled(
        &self,
        both_ways: bool,
        s_src: &DeviceBuffer<'_>,
        d_dst: &DeviceBuffer<'_>,
        tiny: &(DeviceBuffer<'_>, DeviceBuffer<'_>),
    ) -> Result<(Stat, Stat), CudaError> {
        let (src, dst, plan) = (self.src, self.dst, self.plan);
        if std::ptr::eq(src, dst) || plan.disabled_copies == 0 {
            // Not measured: 0 is "none" to the verdict and the tables.
            let none = || Stat::of(vec![0.0]).expect("one sample");
            return Ok((none(), none()));
        }
        peers::disable(src, dst)?;
        peers::disable(dst, src)?;
        let disabled = (|| -> Result<(Stat, Stat), CudaError> {
            let batch = (plan.disabled_copies, plan.disabled_copy_bytes());
            let bw = self.ce_bandwidth(s_src, d_dst, batch)?;
            let lat = self.memcpy_latency(tiny, plan.disabled_memcpy_copies, self.sa)?;
            Ok((bw, lat))
        })();
        let restored = peers::enable(src, dst).and_then(|r| {
            let back = if both_ways {
                peers::enable(dst, src)?
            } else {
                Ok(())
            };
            Ok(r.and(back))
        });
        let measured = disabled?;
        if let Err(e) = restored? {
            return Err(CudaError::Call {
                what: "cuCtxEnablePeerAccess (re-enabling)",
                gpu: src.bus_id.to_string(),
                error: e,
            });
        }
        Ok(measured)
    }
}

#[cfg(test)]
mod tests {
    use super::pingpong::{flag_offset, FLAG_STRIDE};
    use super::*;

    /// `--quick` never measures more than the full report: every batch and count at most
    /// FULL's (its earlier batches, 10,000 ping-pongs a round, made it the slower one).
    #[test]
    fn quick_measures_no_more_than_full() {
        let (q, f) = (BenchPlan::QUICK, BenchPlan::FULL);
        let counts = |p: &BenchPlan| {
            [
                p.samples as u64,
                p.pingpong_samples as u64,
                p.pingpong_positions as u64,
                (p.pingpong_positions * p.pingpong_rounds_per_place) as u64
                    * p.pingpong_iters as u64,
                p.chase_steps as u64,
                p.local_chase_steps as u64,
                p.memcpy_copies as u64,
                p.bw_bytes as u64 * p.bw_copies as u64,
                p.disabled_copy_bytes() as u64 * p.disabled_copies as u64,
                p.warmup_rounds as u64,
                p.disabled_memcpy_copies as u64,
            ]
        };
        for (i, (a, b)) in counts(&q).iter().zip(counts(&f)).enumerate() {
            assert!(*a <= b, "QUICK's count {i} is {a}, FULL's {b}");
        }
    }

    #[test]
    fn tune_overrides_only_the_named_settings_and_refuses_the_rest() {
        let t = BenchPlan::FULL
            .tuned([
                "disabled_copies=1",
                "disabled_mib=256",
                "bidir=event",
                "warmup_rounds=1",
                "pingpong_rounds_per_place=5",
                "pingpong_iters=240",
            ])
            .unwrap();
        assert_eq!((t.pingpong_rounds_per_place, t.pingpong_iters), (5, 240));
        assert_eq!((t.disabled_copies, t.disabled_copy_bytes()), (1, 256 << 20));
        assert!(!t.bidir_gate);
        assert_eq!(t.warmup_rounds, 1);
        assert_eq!(
            BenchPlan {
                disabled_copies: 3,
                disabled_bytes: 64 << 20,
                bidir_gate: true,
                warmup_rounds: 0,
                pingpong_rounds_per_place: 24,
                pingpong_iters: 40,
                ..t
            },
            BenchPlan::FULL
        );
        // 0 bytes (reports of earlier agents) is a copy of bw_bytes; never more than it.
        let old = BenchPlan {
            disabled_bytes: 0,
            ..BenchPlan::FULL
        };
        assert_eq!(old.disabled_copy_bytes(), 256 << 20);
        assert_eq!(
            BenchPlan::FULL
                .tuned(["disabled_mib=1024"])
                .unwrap()
                .disabled_copy_bytes(),
            256 << 20
        );
        for bad in ["disabled_copies", "bidir=maybe", "samples=x", "chase=3"] {
            assert!(BenchPlan::FULL.tuned([bad]).is_err(), "{bad}");
        }
    }

    /// Reports of earlier agents (no gate, one warm-up round) load as what they measured.
    #[test]
    fn plans_of_earlier_agents_load_with_their_warm_up_and_no_gate() {
        let mut v = serde_json::to_value(BenchPlan::FULL).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["bidir_gate", "warmup_rounds", "disabled_bytes"] {
            o.remove(k);
        }
        let p: BenchPlan = serde_json::from_value(v).unwrap();
        assert!(!p.bidir_gate);
        assert_eq!(p.warmup_rounds, 1);
        assert_eq!(p.disabled_copy_bytes(), p.bw_bytes);
    }

    #[test]
    fn adaptive_sampling_stops_when_steady() {
        let full = BenchPlan::FULL;
        assert!(!enough(&[], &full));
        assert!(!enough(&[394.0, 394.1], &full));
        // Three within 1 % (0.05 %): enough.
        assert!(enough(&[394.0, 394.1, 393.9], &full));
        // Three spread 2 %: more, up to the five of the plan.
        assert!(!enough(&[394.0, 402.0, 394.1], &full));
        assert!(!enough(&[394.0, 402.0, 394.1, 390.0], &full));
        assert!(enough(&[394.0, 402.0, 394.1, 390.0, 395.0], &full));
        // QUICK keeps its fixed count; a report of an earlier agent (0s) too.
        assert!(!enough(&[1.0, 1.0], &BenchPlan::QUICK));
        assert!(enough(&[1.0, 1.0, 1.0], &BenchPlan::QUICK));
        let old = BenchPlan {
            min_samples: 0,
            target_spread_permille: 0,
            ..BenchPlan::FULL
        };
        assert!(!enough(&[1.0; 4], &old));
        assert!(enough(&[1.0; 5], &old));
    }

    fn stat(v: &[f64]) -> Stat {
        Stat::of(v.to_vec()).unwrap()
    }

    fn pair_bench() -> PairBench {
        PairBench {
            src: "0000:00:06.0".parse().unwrap(),
            dst: "0000:00:07.0".parse().unwrap(),
            plan: BenchPlan::QUICK,
            one_way_latency_us: Some(stat(&[0.614, 0.613, 0.614])),
            pingpong_flag_addresses: Some(["0x7f0000000000".into(), "0x7f0000200000".into()]),
            pingpong_position_spread: None,
            one_way_placements: Placements::of(
                (0..3).map(|p| flag_offset(p) as u64).collect(),
                vec![0.68, 0.61, 0.73],
                2,
            ),
            pingpong_timed_out: false,
            remote_read_latency_us: stat(&[0.85]),
            local_read_latency_us: stat(&[0.19]),
            memcpy_latency_us: stat(&[1.6]),
            memcpy_latency_by_stream_us: vec![stat(&[1.6]), stat(&[2.5])],
            memcpy_modes: copy_modes::modes(&[stat(&[1.6]), stat(&[2.5])]),
            ce_bandwidth_gbps: stat(&[395.0]),
            ce_bidir_bandwidth_gbps: stat(&[780.0]),
            sm_copy_bandwidth_gbps: stat(&[368.0]),
            disabled_bandwidth_gbps: stat(&[37.0]),
            disabled_memcpy_latency_us: stat(&[18.5]),
            nvbandwidth_testcases: nvbandwidth::testcases(),
            measure_s: vec![],
        }
    }

    #[test]
    fn reports_of_earlier_agents_load_without_the_placement_fields() {
        let mut v = serde_json::to_value(pair_bench()).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in [
            "pingpong_flag_addresses",
            "one_way_placements",
            "memcpy_latency_by_stream_us",
            "memcpy_modes",
            "nvbandwidth_testcases",
        ] {
            o.remove(k);
        }
        let plan = o["plan"].as_object_mut().unwrap();
        for k in [
            "pingpong_positions",
            "pingpong_rounds_per_place",
            "memcpy_streams",
        ] {
            plan.remove(k);
        }
        let b: PairBench = serde_json::from_value(v).unwrap();
        assert_eq!(b.pingpong_flag_addresses, None);
        assert_eq!(b.one_way_placements, None);
        assert!(b.memcpy_modes.is_empty() && b.nvbandwidth_testcases.is_empty());
        assert_eq!(b.plan.pingpong_positions, 0);
        assert_eq!(b.one_way_latency_us, pair_bench().one_way_latency_us);
    }

    /// The JSON carries the distribution with the place of each statistic, the copy's
    /// modes and the nvbandwidth names.
    #[test]
    fn placement_modes_and_testcases_are_in_the_json() {
        let v = serde_json::to_value(pair_bench()).unwrap();
        assert_eq!(v["pingpong_flag_addresses"][1], "0x7f0000200000");
        let d = &v["one_way_placements"];
        assert_eq!(d["offsets"][1], FLAG_STRIDE as u64);
        assert_eq!(d["min_at"], FLAG_STRIDE as u64);
        assert_eq!(d["median_at"], 0);
        assert_eq!(d["max_at"], 2 * FLAG_STRIDE as u64);
        assert_eq!(d["rounds_per_place"], 2);
        assert!(v.get("pingpong_position_spread").is_none());
        assert_eq!(v["memcpy_modes"][1]["streams"][0], 1);
        assert_eq!(v["memcpy_modes"].as_array().unwrap().len(), 2);
        let t = &v["nvbandwidth_testcases"];
        assert_eq!(t["ce_bandwidth_gbps"], "device_to_device_memcpy_write_ce");
        assert_eq!(
            t["ce_bidir_bandwidth_gbps"],
            "device_to_device_bidirectional_memcpy_write_ce"
        );
        assert_eq!(
            t["sm_copy_bandwidth_gbps"],
            "device_to_device_memcpy_write_sm"
        );
        assert_eq!(t["remote_read_latency_us"], "device_to_device_latency_sm");
        // Every name is a field the JSON has.
        for (field, _) in nvbandwidth::TESTCASES {
            assert!(v.get(field).is_some(), "{field}");
        }
    }

    /// The headline is the median over places; min and max are the extremes.
    #[test]
    fn headline_is_the_distribution_over_places() {
        let d = Placements::of(vec![0, 10, 20, 30], vec![0.70, 0.60, 0.74, 0.62], 2).unwrap();
        let s = d.stat();
        assert_eq!((s.min, s.max), (0.60, 0.74));
        assert!((s.median - 0.66).abs() < 1e-12);
        assert_eq!((d.min_at, d.max_at), (10, 20));
        // The lower middle place of an even count.
        assert_eq!(d.median_at, 30);
        // Eight places: the quarters are the means of the two fastest and two slowest.
        let e = Placements::of(
            (0..8).collect(),
            vec![0.70, 0.60, 0.74, 0.62, 0.66, 0.65, 0.80, 0.58],
            3,
        )
        .unwrap();
        assert!((e.fastest_quarter_us.unwrap() - 0.59).abs() < 1e-12);
        assert!((e.slowest_quarter_us.unwrap() - 0.77).abs() < 1e-12);
        assert!(Placements::of(vec![0], vec![], 1).is_none());
        assert!(Placements::of(vec![0, 1], vec![0.6], 1).is_none());
    }

    /// Each place's figure is the mean of its passes (one stray pass moves it by its share);
    /// the passes stay in the JSON; a pass cut short counts where it got to.
    #[test]
    fn each_place_is_the_mean_of_its_passes() {
        let passes = vec![
            vec![0.70, 0.60, 0.74],
            vec![0.72, 0.57, 0.80],
            vec![0.71, 0.63, 0.77],
        ];
        let d = Placements::of_passes(&[0, 10, 20], passes.clone()).unwrap();
        for (got, want) in d.one_way_latency_us.iter().zip([0.71, 0.60, 0.77]) {
            assert!((got - want).abs() < 1e-12, "{got} {want}");
        }
        assert_eq!((d.rounds_per_place, d.figure.as_str()), (3, "mean"));
        // The min is the fastest pass (place 10's 0.57), the max the slowest mean.
        assert_eq!(
            (d.min_at, d.max_at, d.fastest_pass_us),
            (10, 20, Some(0.57))
        );
        // One place a quarter of three: the quarters are the fastest and slowest means.
        let (fq, sq) = (d.fastest_quarter_us.unwrap(), d.slowest_quarter_us.unwrap());
        assert!((fq - 0.60).abs() < 1e-12 && (sq - 0.77).abs() < 1e-12);
        assert_eq!(d.passes_us, passes);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["passes_us"][1][1], 0.57);
        // A pass cut short by a timed-out wait counts where it got to.
        let cut = Placements::of_passes(&[0, 10, 20], vec![vec![0.70, 0.60], vec![0.72]]).unwrap();
        assert_eq!(cut.offsets, vec![0, 10]);
        assert!((cut.one_way_latency_us[0] - 0.71).abs() < 1e-12);
        assert_eq!(cut.one_way_latency_us[1], 0.60);
        assert!(Placements::of_passes(&[0, 10], vec![vec![]]).is_none());
        // Reports of earlier agents kept each place's fastest pass and say so.
        let mut old = serde_json::to_value(&d).unwrap();
        old.as_object_mut().unwrap().remove("figure");
        let old: Placements = serde_json::from_value(old).unwrap();
        assert_eq!(old.figure, "fastest");
    }

    #[test]
    fn other_flag_places_move_both_line_and_high_address_bits() {
        let places: Vec<usize> = (0..BenchPlan::FULL.pingpong_positions)
            .map(flag_offset)
            .collect();
        assert_eq!(places[0], 0);
        for (k, w) in places.windows(2).enumerate() {
            assert_eq!(w[1] - w[0], FLAG_STRIDE);
            // Each place is on its own 128-byte line and in its own 128 KiB block.
            assert_eq!(w[1] % 128, 0);
            assert_eq!(w[1] / 128 % 1024, k + 1);
            assert_eq!(w[1] >> 17, k + 1);
        }
    }
}
