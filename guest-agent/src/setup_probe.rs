//! `setup-probe` (hidden; for `bench/`): where the CUDA setup of `report` goes, as a
//! timeline. cuInit, then each GPU's primary context (a thread per GPU, or one after the
//! other), NVML's start, then each GPU's kernels (JIT), every step with its start and
//! end since the process began, so a bench script can compare ideas side by side (a
//! thread per GPU against one after the other, `CUDA_MODULE_LOADING`, NVML beside or
//! not, one process per GPU, the driver kept warm by another process).

use std::time::{Duration, Instant};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use vfio_p2p_cuda_driver::{self as cuda, CudaError, Gpu, Module};
use vfio_p2p_nvml::Nvml;

/// One step: when it began and ended, seconds since the probe started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub start_s: f64,
    pub end_s: f64,
}

impl Span {
    fn since(t0: Instant, start: Instant) -> Span {
        Span {
            start_s: (start - t0).as_secs_f64(),
            end_s: t0.elapsed().as_secs_f64(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetupTimeline {
    /// `threads`: a thread per GPU; `serial`: one after the other.
    pub mode: String,
    /// `CUDA_MODULE_LOADING` as the driver saw it (unset: null).
    pub module_loading: Option<String>,
    pub cuinit: Span,
    /// NVML's `nvmlInit`, beside the contexts (threads) or before them (serial).
    pub nvml: Option<Span>,
    /// Each GPU's primary context (`cuDevicePrimaryCtxRetain` and its first use).
    pub contexts: Vec<(Bdf, Span)>,
    /// Each GPU's kernels JIT-compiled (`cuModuleLoadDataEx`).
    pub modules: Vec<(Bdf, Span)>,
    /// The contexts' span: first start to last end.
    pub contexts_s: f64,
    pub modules_s: f64,
    pub total_s: f64,
    /// `--ctx-create`: each GPU's plain context (`cuCtxCreate`), created and destroyed
    /// one after the other before the primary ones: (GPU, create s, destroy s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plain_contexts: Vec<(Bdf, f64, f64)>,
}

/// Runs the setup of `only` (one GPU) or every GPU, `threads` or one after the other,
/// then holds the contexts for `hold` (a process that keeps the driver warm).
pub fn run(
    (threads, plain): (bool, bool),
    only: Option<Bdf>,
    hold: Duration,
) -> Result<SetupTimeline, CudaError> {
    let t0 = Instant::now();
    let s = Instant::now();
    cuda::init()?;
    let cuinit = Span::since(t0, s);
    let bdfs = match only {
        Some(b) => vec![b],
        None => Gpu::bus_ids()?,
    };
    let mut plain_contexts = Vec::new();
    if plain {
        for &b in &bdfs {
            let (create, destroy) = cuda::time_plain_context(b)?;
            plain_contexts.push((b, create, destroy));
        }
    }
    let open = |b: Bdf| {
        let s = Instant::now();
        Gpu::open_at(b).map(|g| (g, Span::since(t0, s)))
    };
    let nvml_open = || {
        let s = Instant::now();
        Nvml::open().ok().map(|n| (n, Span::since(t0, s)))
    };
    let (opened, nvml) = if threads {
        std::thread::scope(|sc| {
            let n = sc.spawn(nvml_open);
            let hs: Vec<_> = bdfs.iter().map(|&b| sc.spawn(move || open(b))).collect();
            let gpus: Vec<_> = hs
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect();
            (gpus, n.join().expect("no panic"))
        })
    } else {
        let n = nvml_open();
        (bdfs.iter().map(|&b| open(b)).collect(), n)
    };
    let opened = opened.into_iter().collect::<Result<Vec<_>, _>>()?;
    let gpus: Vec<&Gpu> = opened.iter().map(|(g, _)| g).collect();
    fn load(g: &Gpu, t0: Instant) -> Result<(Module<'_>, Span), CudaError> {
        let s = Instant::now();
        crate::kernels::load(g).map(|m| (m, Span::since(t0, s)))
    }
    let modules: Vec<_> = if threads {
        std::thread::scope(|sc| {
            let hs: Vec<_> = gpus
                .iter()
                .map(|&g| sc.spawn(move || load(g, t0)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        })
    } else {
        gpus.iter().map(|&g| load(g, t0)).collect()
    };
    let modules = modules.into_iter().collect::<Result<Vec<_>, _>>()?;
    let total_s = t0.elapsed().as_secs_f64();
    let width = |spans: &mut dyn Iterator<Item = Span>| {
        let v: Vec<Span> = spans.collect();
        let lo = v.iter().map(|s| s.start_s).fold(f64::INFINITY, f64::min);
        let hi = v.iter().map(|s| s.end_s).fold(0.0, f64::max);
        (hi - lo).max(0.0)
    };
    let timeline = SetupTimeline {
        mode: if threads { "threads" } else { "serial" }.into(),
        module_loading: std::env::var("CUDA_MODULE_LOADING").ok(),
        cuinit,
        nvml: nvml.as_ref().map(|(_, s)| *s),
        contexts_s: width(&mut opened.iter().map(|(_, s)| *s)),
        contexts: opened.iter().map(|(g, s)| (g.bus_id, *s)).collect(),
        modules_s: width(&mut modules.iter().map(|(_, s)| *s)),
        modules: modules
            .iter()
            .zip(&gpus)
            .map(|((_, s), g)| (g.bus_id, *s))
            .collect(),
        total_s,
        plain_contexts,
    };
    std::thread::sleep(hold);
    Ok(timeline)
}
