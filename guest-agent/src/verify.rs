//! `verify`: do writes across the P2P path really land in the peer's memory?
//!
//! The source GPU writes a pattern into the destination's memory (by a kernel through
//! the peer pointer, and by a copy-engine copy); then a kernel running **on the
//! destination GPU** checks every word. Checking from the source side could read back
//! through the same broken aperture and see its own writes.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::kernels::Kernel;
use vfio_p2p_cuda_driver::{CudaError, DeviceBuffer, Gpu, Module, Param, Stream};

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
    /// `--inject`: the words corrupted on purpose (a self-test, not a fault of the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<Injection>,
}

impl VerifyResult {
    pub fn ok(&self) -> bool {
        self.kernel_write.ok() && self.ce_copy.ok()
    }
}

fn grid(gpu: &Gpu) -> u32 {
    gpu.sm_count.max(1) * 4
}

const SEED_KERNEL: u32 = 0x5eed_0001;
const SEED_CE: u32 = 0x5eed_0002;

/// Which of the pair's two GPUs owns a buffer or runs a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

/// The steps of a write check, on the pair's two GPUs: CUDA's ([`CudaLab`]), or a
/// simulator's in the tests, which also records where each check ran.
pub trait WriteLab {
    type Buf;
    /// `words` words on `side`'s GPU, each `value`.
    fn alloc(&self, side: Side, words: usize, value: u32) -> Result<Self::Buf, CudaError>;
    /// A kernel on `by`'s GPU writes the pattern of `seed` into `buf` (through the peer
    /// mapping when the other GPU owns it), and waits.
    fn fill(&self, by: Side, buf: &Self::Buf, seed: u32) -> Result<(), CudaError>;
    /// A copy-engine copy of all of `from` into `to`, issued on `by`'s GPU, and waits.
    fn copy(&self, by: Side, to: &Self::Buf, from: &Self::Buf) -> Result<(), CudaError>;
    /// Sets every word of `buf` to `value`.
    fn set_all(&self, buf: &Self::Buf, value: u32) -> Result<(), CudaError>;
    /// Sets word `i` of `buf` to `value` (the self-test's corruption).
    fn set_word(&self, buf: &Self::Buf, i: u64, value: u32) -> Result<(), CudaError>;
    /// A kernel on `on`'s GPU counts the words of `buf` that do not hold the pattern of `seed`.
    fn check(&self, on: Side, buf: &Self::Buf, seed: u32) -> Result<WriteCheck, CudaError>;
}

/// `--inject`, a test aid: words corrupted after the writes landed, on the destination
/// (the check must report exactly these) and on the source (which the check must not
/// see: it reads the destination's memory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    /// Word indices set to the complement of their pattern on the destination.
    pub dst_words: Vec<u64>,
    /// Word indices set likewise in the source's copy of the data (the copy-engine
    /// copy's source buffer).
    pub src_words: Vec<u64>,
}

impl Injection {
    pub fn is_empty(&self) -> bool {
        self.dst_words.is_empty() && self.src_words.is_empty()
    }

    /// Parses `dst:WORD` and `src:WORD` items (`--inject dst:4097,src:12`).
    pub fn parse(items: &[String]) -> Result<Injection, String> {
        let mut out = Injection::default();
        for item in items.iter().flat_map(|s| s.split(',')) {
            let (side, word) = item.split_once(':').ok_or_else(|| {
                format!("--inject {item:?}: write dst:WORD or src:WORD (a word index)")
            })?;
            let word: u64 = word
                .parse()
                .map_err(|_| format!("--inject {item:?}: {word:?} is not a word index"))?;
            match side {
                "dst" => out.dst_words.push(word),
                "src" => out.src_words.push(word),
                _ => return Err(format!("--inject {item:?}: the side is dst or src")),
            }
        }
        Ok(out)
    }

    fn corrupt<L: WriteLab>(
        &self,
        lab: &L,
        buf: &L::Buf,
        words: &[u64],
        seed: u32,
    ) -> Result<(), CudaError> {
        for &w in words {
            lab.set_word(buf, w, !crate::kernels::pattern(w, seed))?;
        }
        Ok(())
    }

    /// The first word beyond a buffer of `words` words, if any.
    pub fn out_of_range(&self, words: u64) -> Option<u64> {
        self.dst_words
            .iter()
            .chain(&self.src_words)
            .copied()
            .find(|&w| w >= words)
    }
}

/// The write check of one ordered pair: a kernel on the source writes through the peer
/// mapping, then a copy-engine copy from the source's memory; after each, a kernel **on
/// the destination** checks every word of the destination's buffer. `inject` corrupts
/// words after the writes (a self-test). The kernel write's and the copy's results.
pub fn check_writes<L: WriteLab>(
    lab: &L,
    words: usize,
    inject: &Injection,
) -> Result<(WriteCheck, WriteCheck), CudaError> {
    let target = lab.alloc(Side::Dst, words, POISON)?;
    lab.fill(Side::Src, &target, SEED_KERNEL)?;
    inject.corrupt(lab, &target, &inject.dst_words, SEED_KERNEL)?;
    let kernel_write = lab.check(Side::Dst, &target, SEED_KERNEL)?;

    lab.set_all(&target, POISON)?;
    let staging = lab.alloc(Side::Src, words, POISON)?;
    lab.fill(Side::Src, &staging, SEED_CE)?;
    lab.copy(Side::Src, &target, &staging)?;
    inject.corrupt(lab, &target, &inject.dst_words, SEED_CE)?;
    inject.corrupt(lab, &staging, &inject.src_words, SEED_CE)?;
    let ce_copy = lab.check(Side::Dst, &target, SEED_CE)?;
    Ok((kernel_write, ce_copy))
}

/// The two GPUs of a pair, with a stream each, as a [`WriteLab`].
pub struct CudaLab<'a, 'g> {
    sides: [(&'a Gpu, &'a Module<'g>, Stream<'a>); 2],
}

impl<'a, 'g> CudaLab<'a, 'g> {
    pub fn new(
        (src, src_mod): (&'a Gpu, &'a Module<'g>),
        (dst, dst_mod): (&'a Gpu, &'a Module<'g>),
    ) -> Result<Self, CudaError> {
        Ok(CudaLab {
            sides: [
                (src, src_mod, Stream::new(src)?),
                (dst, dst_mod, Stream::new(dst)?),
            ],
        })
    }

    fn side(&self, s: Side) -> &(&'a Gpu, &'a Module<'g>, Stream<'a>) {
        &self.sides[match s {
            Side::Src => 0,
            Side::Dst => 1,
        }]
    }
}

impl<'a> WriteLab for CudaLab<'a, '_> {
    type Buf = DeviceBuffer<'a>;

    fn alloc(&self, side: Side, words: usize, value: u32) -> Result<Self::Buf, CudaError> {
        DeviceBuffer::words(self.side(side).0, words, value)
    }

    fn fill(&self, by: Side, buf: &Self::Buf, seed: u32) -> Result<(), CudaError> {
        let (gpu, module, stream) = self.side(by);
        fill_words(gpu, module, stream, buf.ptr(), buf.bytes() as u64 / 4, seed)?;
        stream.synchronize()
    }

    fn copy(&self, by: Side, to: &Self::Buf, from: &Self::Buf) -> Result<(), CudaError> {
        let stream = &self.side(by).2;
        stream.copy_peer(to, from, from.bytes())?;
        stream.synchronize()
    }

    fn set_all(&self, buf: &Self::Buf, value: u32) -> Result<(), CudaError> {
        buf.fill_u32(value)
    }

    fn set_word(&self, buf: &Self::Buf, i: u64, value: u32) -> Result<(), CudaError> {
        buf.set_word(i as usize, value)
    }

    fn check(&self, on: Side, buf: &Self::Buf, seed: u32) -> Result<WriteCheck, CudaError> {
        let (gpu, module, stream) = self.side(on);
        check_on(gpu, module, stream, buf, seed)
    }
}

/// Checks `src` → `dst` with `words` 32-bit words; peer access src→dst must be enabled.
pub fn verify_pair(
    src: (&Gpu, &Module<'_>),
    dst: (&Gpu, &Module<'_>),
    words: usize,
    inject: &Injection,
) -> Result<VerifyResult, CudaError> {
    let lab = CudaLab::new(src, dst)?;
    let (kernel_write, ce_copy) = check_writes(&lab, words, inject)?;
    Ok(VerifyResult {
        src: src.0.bus_id,
        dst: dst.0.bus_id,
        words: words as u64,
        kernel_write,
        ce_copy,
        injected: (!inject.is_empty()).then(|| inject.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Two GPUs' memory in plain vectors; each check is logged with the GPU it ran on
    /// and the GPU that owns the buffer it read.
    #[derive(Default)]
    struct Sim {
        bufs: RefCell<Vec<(Side, Vec<u32>)>>,
        checks: RefCell<Vec<(Side, Side)>>,
    }

    impl WriteLab for Sim {
        type Buf = usize;
        fn alloc(&self, side: Side, words: usize, value: u32) -> Result<usize, CudaError> {
            let mut b = self.bufs.borrow_mut();
            b.push((side, vec![value; words]));
            Ok(b.len() - 1)
        }
        fn fill(&self, _by: Side, buf: &usize, seed: u32) -> Result<(), CudaError> {
            for (i, w) in self.bufs.borrow_mut()[*buf].1.iter_mut().enumerate() {
                *w = crate::kernels::pattern(i as u64, seed);
            }
            Ok(())
        }
        fn copy(&self, _by: Side, to: &usize, from: &usize) -> Result<(), CudaError> {
            let data = self.bufs.borrow()[*from].1.clone();
            self.bufs.borrow_mut()[*to].1 = data;
            Ok(())
        }
        fn set_all(&self, buf: &usize, value: u32) -> Result<(), CudaError> {
            self.bufs.borrow_mut()[*buf].1.fill(value);
            Ok(())
        }
        fn set_word(&self, buf: &usize, i: u64, value: u32) -> Result<(), CudaError> {
            self.bufs.borrow_mut()[*buf].1[i as usize] = value;
            Ok(())
        }
        fn check(&self, on: Side, buf: &usize, seed: u32) -> Result<WriteCheck, CudaError> {
            let (owner, data) = &self.bufs.borrow()[*buf];
            self.checks.borrow_mut().push((on, *owner));
            let bad: Vec<u64> = (0..data.len() as u64)
                .filter(|&i| data[i as usize] != crate::kernels::pattern(i, seed))
                .collect();
            Ok(WriteCheck {
                bad_words: bad.len() as u64,
                first_bad: bad.first().copied(),
            })
        }
    }

    #[test]
    fn the_check_reads_the_destinations_memory_on_the_destination() {
        let sim = Sim::default();
        let (k, c) = check_writes(&sim, 4096, &Injection::default()).unwrap();
        assert!(k.ok() && c.ok());
        assert_eq!(*sim.checks.borrow(), [(Side::Dst, Side::Dst); 2]);
    }

    #[test]
    fn an_injected_destination_word_is_found_by_name_and_a_source_word_is_not() {
        let sim = Sim::default();
        let inject = Injection::parse(&["dst:1027,src:12".into()]).unwrap();
        let (k, c) = check_writes(&sim, 4096, &inject).unwrap();
        let exactly = WriteCheck {
            bad_words: 1,
            first_bad: Some(1027),
        };
        assert_eq!((k, c), (exactly.clone(), exactly));
        assert_eq!(*sim.checks.borrow(), [(Side::Dst, Side::Dst); 2]);
        // only the source corrupted: the destination holds every word
        let sim = Sim::default();
        let inject = Injection::parse(&["src:12".into()]).unwrap();
        let (k, c) = check_writes(&sim, 4096, &inject).unwrap();
        assert!(k.ok() && c.ok());
    }

    #[test]
    fn injections_parse_and_name_their_mistakes() {
        let i = Injection::parse(&["dst:5".into(), "src:7,dst:9".into()]).unwrap();
        assert_eq!(
            (i.dst_words.clone(), i.src_words.clone()),
            (vec![5, 9], vec![7])
        );
        assert_eq!(i.out_of_range(9), Some(9));
        assert_eq!(i.out_of_range(10), None);
        for bad in ["dst5", "dst:x", "mid:3"] {
            let e = Injection::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
