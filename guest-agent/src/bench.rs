//! `bench`: latency and bandwidth of one ordered GPU pair, the way the reference
//! probe measures them (CUDA events around a batch, time per item), repeated.
//!
//! The first round of each measurement is a warm-up and is dropped.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::cuda::{peers, CudaError, DeviceBuffer, Event, Gpu, Module, Param, Stream};
use crate::kernels::{chase_next, Kernel};
use crate::stats::Stat;

/// How much to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Kept rounds of each measurement (after one warm-up).
    pub samples: usize,
    pub pingpong_iters: u32,
    pub chase_steps: u32,
    /// Words of the pointer-chase array (a power of two).
    pub chase_words: u32,
    pub memcpy_copies: u32,
    pub bw_bytes: usize,
    pub bw_copies: u32,
    pub disabled_copies: u32,
    pub disabled_memcpy_copies: u32,
}

impl Plan {
    /// The reference probe's sizes.
    pub const FULL: Plan = Plan {
        samples: 5,
        pingpong_iters: 100_000,
        chase_steps: 20_000,
        chase_words: 1 << 22,
        memcpy_copies: 10_000,
        bw_bytes: 256 << 20,
        bw_copies: 20,
        disabled_copies: 10,
        disabled_memcpy_copies: 2_000,
    };

    pub const QUICK: Plan = Plan {
        samples: 3,
        pingpong_iters: 10_000,
        chase_steps: 5_000,
        chase_words: 1 << 22,
        memcpy_copies: 2_000,
        bw_bytes: 64 << 20,
        bw_copies: 8,
        disabled_copies: 2,
        disabled_memcpy_copies: 200,
    };

    /// Number of progress steps of one pair.
    pub const STEPS: u64 = 8;
}

/// Polls of a flag before a ping-pong kernel gives up (seconds, at any link speed).
const SPIN_LIMIT: u64 = 1 << 24;
const COPY_BLOCK: u32 = 512;

/// Everything measured for `src` → `dst`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairBench {
    pub src: Bdf,
    pub dst: Bdf,
    pub plan: Plan,
    /// One-way latency of a flag write, from a ping-pong (µs). Needs access both ways.
    pub one_way_latency_us: Option<Stat>,
    /// A ping-pong kernel gave up waiting: a write never arrived.
    pub pingpong_timed_out: bool,
    /// Dependent loads from `dst`'s memory by a kernel on `src` (µs per load).
    pub remote_read_latency_us: Stat,
    /// The same chase in `src`'s own memory, for contrast.
    pub local_read_latency_us: Stat,
    /// One 4-byte `cuMemcpyPeerAsync` (µs per copy).
    pub memcpy_latency_us: Stat,
    /// Copy-engine bandwidth src → dst (GB/s, 10^9 bytes).
    pub ce_bandwidth_gbps: Stat,
    /// Copy engines both ways at once, total (GB/s).
    pub ce_bidir_bandwidth_gbps: Stat,
    /// A copy kernel on `src` storing through the peer pointer (GB/s).
    pub sm_copy_bandwidth_gbps: Stat,
    /// Copy-engine copy with peer access disabled both ways: staged through the host.
    pub disabled_bandwidth_gbps: Stat,
    pub disabled_memcpy_latency_us: Stat,
}

/// A GPU with its module, as the benchmark needs them.
pub type Side<'a, 'g> = (&'g Gpu, &'a Module<'g>);

/// Runs `rounds` timed rounds (plus a warm-up), each returning one sample.
fn sampled(
    samples: usize,
    mut round: impl FnMut() -> Result<f64, CudaError>,
) -> Result<Stat, CudaError> {
    round()?;
    let v = (0..samples)
        .map(|_| round())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Stat::of(v).expect("at least one sample"))
}

/// Milliseconds taken by what `enqueue` puts on `stream`.
fn timed(
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

/// Measures `src` → `dst`; peer access must be enabled src→dst (and dst→src for
/// the ping-pong, which is skipped otherwise). `step` is called after each measurement.
pub fn bench_pair(
    (src, src_mod): Side<'_, '_>,
    (dst, dst_mod): Side<'_, '_>,
    both_ways: bool,
    plan: &Plan,
    step: &dyn Fn(&str),
) -> Result<PairBench, CudaError> {
    let sa = Stream::new(src)?;
    let sb = Stream::new(dst)?;

    let (one_way_latency_us, pingpong_timed_out) = if both_ways {
        let (s, t) = pingpong((src, src_mod, &sa), (dst, dst_mod, &sb), plan)?;
        (Some(s), t)
    } else {
        (None, false)
    };
    step("one-way latency");

    let chain: Vec<u32> = (0..plan.chase_words)
        .map(|i| chase_next(i, plan.chase_words))
        .collect();
    let out = DeviceBuffer::words(src, 1, 0)?;
    let chase = |array: &DeviceBuffer<'_>| -> Result<Stat, CudaError> {
        let launch = |steps: u32| {
            src_mod.launch(
                Kernel::Chase,
                1,
                1,
                &sa,
                &[
                    Param::U64(array.ptr()),
                    Param::U32(steps),
                    Param::U64(out.ptr()),
                ],
            )
        };
        launch(100)?;
        sampled(plan.samples, || {
            Ok(timed(&sa, || launch(plan.chase_steps))? * 1e3 / plan.chase_steps as f64)
        })
    };
    let remote = DeviceBuffer::new(dst, chain.len() * 4)?;
    remote.upload(&chain)?;
    let remote_read_latency_us = chase(&remote)?;
    drop(remote);
    let local = DeviceBuffer::new(src, chain.len() * 4)?;
    local.upload(&chain)?;
    let local_read_latency_us = chase(&local)?;
    drop(local);
    step("pointer chase");

    let (tiny_src, tiny_dst) = (
        DeviceBuffer::words(src, 1, 0)?,
        DeviceBuffer::words(dst, 1, 0)?,
    );
    let memcpy_latency = |copies: u32| {
        sampled(plan.samples, || {
            let ms = timed(&sa, || {
                (0..copies).try_for_each(|_| sa.copy_peer(&tiny_dst, &tiny_src, 4))
            })?;
            Ok(ms * 1e3 / copies as f64)
        })
    };
    let memcpy_latency_us = memcpy_latency(plan.memcpy_copies)?;
    step("memcpy latency");

    let bytes = plan.bw_bytes;
    let gbps = |ms: f64, total: f64| total / (ms * 1e-3) / 1e9;
    let s_src = DeviceBuffer::new(src, bytes)?;
    let d_dst = DeviceBuffer::new(dst, bytes)?;
    let ce_bandwidth_gbps = sampled(plan.samples, || {
        let ms = timed(&sa, || {
            (0..plan.bw_copies).try_for_each(|_| sa.copy_peer(&d_dst, &s_src, bytes))
        })?;
        Ok(gbps(ms, plan.bw_copies as f64 * bytes as f64))
    })?;
    step("copy-engine bandwidth");

    let s_dst = DeviceBuffer::new(dst, bytes)?;
    let d_src = DeviceBuffer::new(src, bytes)?;
    let ce_bidir_bandwidth_gbps = sampled(plan.samples, || {
        let back_done = Event::new(dst)?;
        let ms = timed(&sa, || {
            let start = Event::new(src)?;
            start.record(&sa)?;
            sb.wait(&start)?;
            for _ in 0..plan.bw_copies {
                sa.copy_peer(&d_dst, &s_src, bytes)?;
                sb.copy_peer(&d_src, &s_dst, bytes)?;
            }
            back_done.record(&sb)?;
            sa.wait(&back_done)
        })?;
        Ok(gbps(ms, 2.0 * plan.bw_copies as f64 * bytes as f64))
    })?;
    drop((s_dst, d_src));
    step("bidirectional bandwidth");

    let words16 = (bytes / 16) as u64;
    let sm_copy_bandwidth_gbps = sampled(plan.samples, || {
        let ms = timed(&sa, || {
            (0..plan.bw_copies).try_for_each(|_| {
                src_mod.launch(
                    Kernel::Copy,
                    src.sm_count.max(1) * 4,
                    COPY_BLOCK,
                    &sa,
                    &[
                        Param::U64(s_src.ptr()),
                        Param::U64(d_dst.ptr()),
                        Param::U64(words16),
                    ],
                )
            })
        })?;
        Ok(gbps(ms, plan.bw_copies as f64 * bytes as f64))
    })?;
    step("SM copy bandwidth");

    peers::disable(src, dst)?;
    peers::disable(dst, src)?;
    let disabled = (|| -> Result<(Stat, Stat), CudaError> {
        let bw = sampled(plan.samples, || {
            let ms = timed(&sa, || {
                (0..plan.disabled_copies).try_for_each(|_| sa.copy_peer(&d_dst, &s_src, bytes))
            })?;
            Ok(gbps(ms, plan.disabled_copies as f64 * bytes as f64))
        })?;
        let lat = memcpy_latency(plan.disabled_memcpy_copies)?;
        Ok((bw, lat))
    })();
    // Restore access whatever happened, for the pairs measured after this one.
    let restored = peers::enable(src, dst).and_then(|r| {
        let back = if both_ways {
            peers::enable(dst, src)?
        } else {
            Ok(())
        };
        Ok(r.and(back))
    });
    let (disabled_bandwidth_gbps, disabled_memcpy_latency_us) = disabled?;
    if let Err(e) = restored? {
        return Err(CudaError::Call {
            what: "cuCtxEnablePeerAccess (re-enabling)",
            gpu: src.bus_id.to_string(),
            error: e,
        });
    }
    step("peer access disabled");

    Ok(PairBench {
        src: src.bus_id,
        dst: dst.bus_id,
        plan: *plan,
        one_way_latency_us,
        pingpong_timed_out,
        remote_read_latency_us,
        local_read_latency_us,
        memcpy_latency_us,
        ce_bandwidth_gbps,
        ce_bidir_bandwidth_gbps,
        sm_copy_bandwidth_gbps,
        disabled_bandwidth_gbps,
        disabled_memcpy_latency_us,
    })
}

/// Flag ping-pong between a kernel on each GPU; each polls its own memory and
/// writes the other's, so one round trip is two one-way writes.
fn pingpong(
    (src, src_mod, sa): (&Gpu, &Module<'_>, &Stream<'_>),
    (dst, dst_mod, sb): (&Gpu, &Module<'_>, &Stream<'_>),
    plan: &Plan,
) -> Result<(Stat, bool), CudaError> {
    let flag_a = DeviceBuffer::words(src, 2, 0)?;
    let flag_b = DeviceBuffer::words(dst, 2, 0)?;
    let iters = plan.pingpong_iters;
    let mut timed_out = false;
    let stat = sampled(plan.samples, || {
        flag_a.fill_u32(0)?;
        flag_b.fill_u32(0)?;
        let args = |my: &DeviceBuffer<'_>, peer: &DeviceBuffer<'_>| {
            [
                Param::U64(my.ptr()),
                Param::U64(peer.ptr()),
                Param::U32(iters),
                Param::U64(SPIN_LIMIT),
                Param::U64(my.ptr() + 4),
            ]
        };
        dst_mod.launch(Kernel::Pong, 1, 1, sb, &args(&flag_b, &flag_a))?;
        let ms = timed(sa, || {
            src_mod.launch(Kernel::Ping, 1, 1, sa, &args(&flag_a, &flag_b))
        })?;
        sb.synchronize()?;
        let (mut a, mut b) = ([0u32; 2], [0u32; 2]);
        flag_a.download(&mut a)?;
        flag_b.download(&mut b)?;
        timed_out |= a[1] != 0 || b[1] != 0;
        Ok(ms * 1e3 / iters as f64 / 2.0)
    })?;
    Ok((stat, timed_out))
}
