//! `verify`: do writes across the P2P path really land in the peer's memory?
//!
//! The source GPU writes a pattern into the destination's memory (by a kernel through
//! the peer pointer, and by a copy-engine copy); then a kernel running **on the
//! destination GPU** checks every word. Checking from the source side could read back
//! through the same broken aperture and see its own writes.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::cuda::{CudaError, DeviceBuffer, Gpu, Module, Param, Stream};
use crate::kernels::Kernel;

/// What a buffer freshly allocated for the check holds before the writes.
const POISON: u32 = 0xdead_beef;
const BLOCK: u32 = 256;

/// The result of one way of writing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteCheck {
    /// Words that did not hold the pattern afterwards.
    pub bad_words: u64,
    pub first_bad: Option<u64>,
}

impl WriteCheck {
    pub fn ok(&self) -> bool {
        self.bad_words == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyResult {
    pub src: Bdf,
    pub dst: Bdf,
    pub words: u64,
    /// A kernel on `src` stored through the peer pointer.
    pub kernel_write: WriteCheck,
    /// `cuMemcpyPeerAsync` from `src`'s memory.
    pub ce_copy: WriteCheck,
}

impl VerifyResult {
    pub fn ok(&self) -> bool {
        self.kernel_write.ok() && self.ce_copy.ok()
    }
}

fn grid(gpu: &Gpu) -> u32 {
    gpu.sm_count.max(1) * 4
}

/// Checks `src` → `dst` with `words` 32-bit words; peer access src→dst must be enabled.
pub fn verify_pair(
    (src, src_mod): (&Gpu, &Module<'_>),
    (dst, dst_mod): (&Gpu, &Module<'_>),
    words: usize,
) -> Result<VerifyResult, CudaError> {
    let target = DeviceBuffer::words(dst, words, POISON)?;
    let src_stream = Stream::new(src)?;
    let dst_stream = Stream::new(dst)?;
    let n = words as u64;

    let seed_kernel = 0x5eed_0001;
    fill_words(src, src_mod, &src_stream, target.ptr(), n, seed_kernel)?;
    src_stream.synchronize()?;
    let kernel_write = check_on(dst, dst_mod, &dst_stream, &target, seed_kernel)?;

    let seed_ce = 0x5eed_0002;
    target.fill_u32(POISON)?;
    let staging = DeviceBuffer::new(src, words * 4)?;
    fill_words(src, src_mod, &src_stream, staging.ptr(), n, seed_ce)?;
    src_stream.copy_peer(&target, &staging, words * 4)?;
    src_stream.synchronize()?;
    let ce_copy = check_on(dst, dst_mod, &dst_stream, &target, seed_ce)?;

    Ok(VerifyResult {
        src: src.bus_id,
        dst: dst.bus_id,
        words: n,
        kernel_write,
        ce_copy,
    })
}

/// Runs the `check` kernel on the GPU that owns `buf`.
fn check_on(
    gpu: &Gpu,
    module: &Module<'_>,
    stream: &Stream<'_>,
    buf: &DeviceBuffer<'_>,
    seed: u32,
) -> Result<WriteCheck, CudaError> {
    check_words(gpu, module, stream, buf.ptr(), buf.bytes() as u64 / 4, seed)
}

/// Runs the `check` kernel on `gpu` over `words` words at `ptr` (memory `gpu` owns):
/// how many do not hold the pattern of `seed`.
pub fn check_words(
    gpu: &Gpu,
    module: &Module<'_>,
    stream: &Stream<'_>,
    ptr: u64,
    words: u64,
    seed: u32,
) -> Result<WriteCheck, CudaError> {
    let counters = DeviceBuffer::new(gpu, 16)?;
    counters.upload(&[0u64, u64::MAX])?;
    module.launch(
        Kernel::Check,
        grid(gpu),
        BLOCK,
        stream,
        &[
            Param::U64(ptr),
            Param::U64(words),
            Param::U32(seed),
            Param::U64(counters.ptr()),
            Param::U64(counters.ptr() + 8),
        ],
    )?;
    stream.synchronize()?;
    let mut out = [0u64; 2];
    counters.download(&mut out)?;
    Ok(WriteCheck {
        bad_words: out[0],
        first_bad: (out[0] > 0).then_some(out[1]),
    })
}

/// Writes the pattern of `seed` into `words` words at `ptr` by a kernel on `gpu` (the
/// memory may be another GPU's, mapped here).
pub fn fill_words(
    gpu: &Gpu,
    module: &Module<'_>,
    stream: &Stream<'_>,
    ptr: u64,
    words: u64,
    seed: u32,
) -> Result<(), CudaError> {
    module.launch(
        Kernel::Fill,
        grid(gpu),
        BLOCK,
        stream,
        &[Param::U64(ptr), Param::U64(words), Param::U32(seed)],
    )
}
