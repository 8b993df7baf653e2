use std::cell::Cell;
use std::ffi::c_char;

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdevice_attribute};
use pci_config::Bdf;

use super::driver::{c_buf_to_string, check, CudaError};

thread_local! {
    /// The context this thread last made current through [`Gpu::bind`].
    static CURRENT: Cell<CUcontext> = const { Cell::new(std::ptr::null_mut()) };
}

/// One GPU and its primary context, identified by its PCI address.
///
/// CUDA ordinals depend on `CUDA_VISIBLE_DEVICES` and enumeration order; the PCI
/// address is what the host and `scan` talk about, so everything is keyed by it.
pub struct Gpu {
    pub ordinal: i32,
    pub bus_id: Bdf,
    pub name: String,
    pub uuid: String,
    pub sm_count: u32,
    pub(crate) dev: CUdevice,
    pub(crate) ctx: CUcontext,
}

// SAFETY: the CUDA driver API is thread-safe and a primary context may be current on
// several threads at once; a Gpu's handles are only read after `open`, and `bind` keeps
// its record of the current context per thread. The agent's threads measure disjoint
// GPU pairs, each with its own streams and events.
unsafe impl Send for Gpu {}
// SAFETY: as for Send: nothing in a Gpu changes after `open`.
unsafe impl Sync for Gpu {}

/// Parses what `cuDeviceGetPCIBusId` prints (`0000:06:00.0`, or with an 8-digit domain
/// `00000000:06:00.0`, upper case) into a [`Bdf`].
pub fn parse_bus_id(s: &str) -> Option<Bdf> {
    let s = s.trim().to_ascii_lowercase();
    let (domain, rest) = s.split_once(':')?;
    let domain = match domain.len() {
        8 if domain.starts_with("0000") => &domain[4..],
        _ => domain,
    };
    format!("{domain}:{rest}").parse().ok()
}

/// How many GPUs the driver sees.
fn device_count() -> Result<i32, CudaError> {
    let mut n = 0;
    check(
        // SAFETY: n is a valid out pointer; the driver is initialised by cuda::init.
        unsafe { sys::cuDeviceGetCount(&mut n) },
        "cuDeviceGetCount",
        &"-",
    )?;
    Ok(n)
}

impl Gpu {
    /// Every GPU the driver sees, sorted by PCI address; their contexts are created a
    /// thread per GPU (retaining a primary context is most of the setup of a GPU).
    pub fn all() -> Result<Vec<Gpu>, CudaError> {
        let n = device_count()?;
        let mut gpus = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n).map(|i| s.spawn(move || Gpu::open(i))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<Result<Vec<_>, _>>()
        })?;
        gpus.sort_by_key(|g| g.bus_id);
        Ok(gpus)
    }

    /// The PCI addresses of every GPU the driver sees, sorted; no context is created.
    pub fn bus_ids() -> Result<Vec<Bdf>, CudaError> {
        let n = device_count()?;
        let mut out = Vec::new();
        for ordinal in 0..n {
            out.push(Self::bus_id_of(ordinal)?.1);
        }
        out.sort();
        Ok(out)
    }

    /// The device handle and PCI address of CUDA ordinal `ordinal`.
    fn bus_id_of(ordinal: i32) -> Result<(CUdevice, Bdf), CudaError> {
        let at = format!("#{ordinal}");
        let mut dev: CUdevice = 0;
        check(
            // SAFETY: dev is a valid out pointer and ordinal < cuDeviceGetCount.
            unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
            "cuDeviceGet",
            &at,
        )?;
        let mut buf = [0 as c_char; 64];
        check(
            // SAFETY: buf has the length passed.
            unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) },
            "cuDeviceGetPCIBusId",
            &at,
        )?;
        let raw = c_buf_to_string(&buf);
        let bus_id = parse_bus_id(&raw).ok_or_else(|| CudaError::Call {
            what: "cuDeviceGetPCIBusId",
            gpu: at.clone(),
            error: format!("unparsable PCI bus id {raw:?}"),
        })?;
        Ok((dev, bus_id))
    }

    /// The GPU at `bdf` alone: only its context is created (a child of `cross-process`
    /// needs no other), though every GPU stays visible for CUDA IPC.
    pub fn open_at(bdf: Bdf) -> Result<Gpu, CudaError> {
        let n = device_count()?;
        for ordinal in 0..n {
            if Self::bus_id_of(ordinal)?.1 == bdf {
                return Gpu::open(ordinal);
            }
        }
        Err(CudaError::Call {
            what: "cuDeviceGetPCIBusId",
            gpu: bdf.to_string(),
            error: "CUDA does not see this GPU".into(),
        })
    }

    fn open(ordinal: i32) -> Result<Gpu, CudaError> {
        let (dev, bus_id) = Self::bus_id_of(ordinal)?;
        let at = bus_id.to_string();
        let mut name = [0 as c_char; 128];
        check(
            // SAFETY: name has the length passed.
            unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) },
            "cuDeviceGetName",
            &at,
        )?;
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        check(
            // SAFETY: uuid is a valid out pointer.
            unsafe { sys::cuDeviceGetUuid(&mut uuid, dev) },
            "cuDeviceGetUuid",
            &at,
        )?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: ctx is a valid out pointer; released in Drop.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
            &at,
        )?;
        let mut gpu = Gpu {
            ordinal,
            bus_id,
            name: c_buf_to_string(&name),
            uuid: format_uuid(&uuid.bytes),
            sm_count: 0,
            dev,
            ctx,
        };
        gpu.sm_count =
            gpu.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        Ok(gpu)
    }

    pub fn attribute(&self, attr: CUdevice_attribute) -> Result<i32, CudaError> {
        let mut v = 0;
        check(
            // SAFETY: v is a valid out pointer, dev a valid device.
            unsafe { sys::cuDeviceGetAttribute(&mut v, attr, self.dev) },
            "cuDeviceGetAttribute",
            &self.bus_id,
        )?;
        Ok(v)
    }

    /// Makes this GPU's primary context current on the calling thread.
    ///
    /// Remembers the last context set, so the calls in timed loops (one per 4-byte
    /// copy) cost nothing when it is already current; only this module sets contexts.
    pub fn bind(&self) -> Result<(), CudaError> {
        if CURRENT.with(Cell::get) == self.ctx {
            return Ok(());
        }
        check(
            // SAFETY: ctx is a retained primary context, alive as long as self.
            unsafe { sys::cuCtxSetCurrent(self.ctx) },
            "cuCtxSetCurrent",
            &self.bus_id,
        )?;
        CURRENT.with(|c| c.set(self.ctx));
        Ok(())
    }

    /// Waits for all work of this GPU's context.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: a context is current.
        check(
            unsafe { sys::cuCtxSynchronize() },
            "cuCtxSynchronize",
            &self.bus_id,
        )
    }
}

/// Resets every GPU's primary context, a thread per GPU (what the driver does at the
/// process's end, but side by side): for a process that ends right after. Nothing of
/// these GPUs may be used afterwards.
pub fn reset_contexts(gpus: &[Gpu]) {
    std::thread::scope(|s| {
        for g in gpus {
            // SAFETY: dev is a valid device; the caller ends the process without using
            // any handle of this context again (process::exit runs no destructors).
            s.spawn(move || unsafe { sys::cuDevicePrimaryCtxReset_v2(g.dev) });
        }
    });
}

/// Seconds to create and destroy a plain context (`cuCtxCreate`, not the primary one) on
/// the GPU at `bdf` (`setup-probe --ctx-create`): whether the primary context costs more.
pub fn time_plain_context(bdf: Bdf) -> Result<(f64, f64), CudaError> {
    let n = device_count()?;
    for ordinal in 0..n {
        let (dev, b) = Gpu::bus_id_of(ordinal)?;
        if b != bdf {
            continue;
        }
        let at = bdf.to_string();
        let t = std::time::Instant::now();
        let mut ctx: CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: ctx is a valid out pointer, dev a valid device; destroyed below.
            unsafe { sys::cuCtxCreate_v2(&mut ctx, 0, dev) },
            "cuCtxCreate",
            &at,
        )?;
        let created = t.elapsed().as_secs_f64();
        // SAFETY: ctx was created above and is not used again.
        check(unsafe { sys::cuCtxDestroy_v2(ctx) }, "cuCtxDestroy", &at)?;
        return Ok((created, t.elapsed().as_secs_f64() - created));
    }
    Err(CudaError::Call {
        what: "cuDeviceGetPCIBusId",
        gpu: bdf.to_string(),
        error: "CUDA does not see this GPU".into(),
    })
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if CURRENT.with(Cell::get) == self.ctx {
            CURRENT.with(|c| c.set(std::ptr::null_mut()));
        }
        // SAFETY: balances the retain in open(); nothing of this GPU is used afterwards
        // (buffers, streams and modules borrow the Gpu and are dropped first).
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
fn format_uuid(b: &[c_char; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{:02x}", *x as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_forms() {
        let want: Bdf = "0000:00:06.0".parse().unwrap();
        assert_eq!(parse_bus_id("0000:00:06.0"), Some(want));
        assert_eq!(parse_bus_id("00000000:00:06.0"), Some(want));
        assert_eq!(
            parse_bus_id("00000000:C1:00.0").unwrap().to_string(),
            "0000:c1:00.0"
        );
        assert_eq!(parse_bus_id("GPU-1234"), None);
    }

    #[test]
    fn uuid_like_nvidia_smi() {
        let b: [c_char; 16] = std::array::from_fn(|i| i as c_char);
        assert_eq!(format_uuid(&b), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}
