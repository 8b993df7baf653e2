//! The flag ping-pong: one-way latency between two GPUs, timed like the reference probe,
//! with the flags placed like the probe's ([`PingPongFlags`]) and then at other places
//! ([`PositionSpread`]) to show how much the placement moves the figure.

use serde::{Deserialize, Serialize};

use super::{enough, timed, BenchPlan};
use crate::cuda::{CudaError, DeviceBuffer, Gpu, Module, Param, Stream};
use crate::kernels::{Kernel, POLLS_PER_CHECK};
use crate::stats::Stat;

/// Polls of a flag before a ping-pong kernel gives up (seconds, at any link speed).
const POLL_LIMIT: u64 = 1 << 24;

/// Distance between the other flag places sampled after the reference rounds: a
/// 128 KiB step plus one 128-byte line, so that both the low and the high address
/// bits that pick an L2 slice change from place to place.
pub(super) const FLAG_STRIDE: usize = (128 << 10) + 128;

/// One-way latency with the ping-pong flags at other places than the reference's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionSpread {
    /// Byte offset of each place's flags (the same on both GPUs) in a pair of buffers
    /// allocated after the reference flags and the other buffers of earlier pairs.
    pub offsets: Vec<u64>,
    /// One round at each place, in the order of `offsets` (µs).
    pub one_way_latency_us: Stat,
}

/// The ping-pong flags, placed like the reference probe's: each GPU's flag is a
/// 4-byte allocation of its own, the first of its context.
///
/// The ping-pong latency depends on where the flags lie (most likely on which L2 slice,
/// near or far from the polling SM, holds their line): flags at other places of the
/// same two H200s measured 0.58–0.77 µs, each place steady to 0.1 %, where the probe's
/// flags gave 0.613–0.614 µs in every process. The probe enables peer access, then
/// takes `cudaMalloc(4)` on each GPU before anything else (its kernels load lazily, at
/// their first launch), so the agent does the same: this is made right after peer
/// access is enabled and before the module is loaded or any other buffer is allocated.
/// Every ordered pair uses the flags of its two GPUs, as the probe does in both
/// directions.
pub struct PingPongFlags<'g> {
    flags: Vec<DeviceBuffer<'g>>,
}

impl<'g> PingPongFlags<'g> {
    /// One zeroed 4-byte flag per entry of `gpus` (a GPU listed twice, as a simulated
    /// schedule lists it, gets a flag per entry); call before anything else allocates there.
    pub fn allocate(gpus: impl IntoIterator<Item = &'g Gpu>) -> Result<Self, CudaError> {
        let flags = gpus
            .into_iter()
            .map(|g| DeviceBuffer::words(g, 1, 0))
            .collect::<Result<_, _>>()?;
        Ok(PingPongFlags { flags })
    }

    /// The flag of the `i`-th GPU given to [`PingPongFlags::allocate`].
    pub fn at(&self, i: usize) -> &DeviceBuffer<'g> {
        &self.flags[i]
    }
}

/// Byte offset of the `place`-th other flag place (see [`PositionSpread`]).
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
    pub(super) positions: Option<PositionSpread>,
    pub(super) timed_out: bool,
}

impl PingPong<'_, '_> {
    /// A warm-up and `plan.pingpong_samples` rounds with the reference flags, then one
    /// round at each of `plan.pingpong_positions` other places. Stops at the first
    /// round that timed out.
    pub(super) fn run(
        &self,
        (flag_a, flag_b): (&DeviceBuffer<'_>, &DeviceBuffer<'_>),
        plan: &BenchPlan,
    ) -> Result<PingPongResult, CudaError> {
        let mut out = PingPongResult {
            flag_addresses: Some([flag_a.ptr(), flag_b.ptr()].map(|p| format!("{p:#x}"))),
            ..PingPongResult::default()
        };
        let mut samples = Vec::with_capacity(plan.pingpong_samples);
        // Round 0 is the warm-up; then rounds until `pingpong_samples`, or fewer once
        // `pingpong_min_samples` agree within the plan's spread (batches sized by the
        // spread measured, as the other measurements are).
        let steady = BenchPlan {
            samples: plan.pingpong_samples,
            min_samples: plan.pingpong_min_samples,
            ..*plan
        };
        let mut round = 0;
        while round == 0 || !enough(&samples, &steady) {
            let Some(us) = self.round((flag_a, flag_b), 0)? else {
                out.reference = Stat::of(samples);
                out.timed_out = true;
                return Ok(out);
            };
            if round > 0 {
                samples.push(us);
            }
            round += 1;
        }
        out.reference = Stat::of(samples);
        if plan.pingpong_positions == 0 {
            return Ok(out);
        }
        let bytes = flag_offset(plan.pingpong_positions - 1) + 4;
        let places_a = DeviceBuffer::new(self.src.0, bytes)?;
        let places_b = DeviceBuffer::new(self.dst.0, bytes)?;
        let offsets: Vec<u64> = (0..plan.pingpong_positions)
            .map(|p| flag_offset(p) as u64)
            .collect();
        let mut at_places = Vec::with_capacity(offsets.len());
        for &at in &offsets {
            match self.round((&places_a, &places_b), at)? {
                Some(us) => at_places.push(us),
                None => {
                    out.timed_out = true;
                    break;
                }
            }
        }
        out.positions = Stat::of(at_places).map(|one_way_latency_us| PositionSpread {
            offsets: offsets[..one_way_latency_us.samples.len()].to_vec(),
            one_way_latency_us,
        });
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
