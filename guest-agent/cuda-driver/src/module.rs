use std::ffi::{c_char, c_uint, c_void, CString};

use cudarc::driver::sys::{self, CUfunction, CUjit_option, CUmodule};

use super::driver::{c_buf_to_string, check, describe, CudaError};
use super::gpu::Gpu;
use super::stream::Stream;

/// Type of one kernel parameter, as declared in the PTX (`.param .u32` / `.param .u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    U32,
    U64,
}

/// One kernel of a PTX module: its entry name and its parameter list, which every
/// launch is checked against.
pub trait KernelEntry: Copy {
    /// Entry name in the PTX.
    fn name(self) -> &'static str;
    /// Parameter list, in the PTX's order.
    fn params(self) -> &'static [ParamType];
}

/// One kernel argument, typed like the PTX parameter it fills.
#[derive(Debug, Clone, Copy)]
pub enum Param {
    U32(u32),
    U64(u64),
}

impl Param {
    fn ty(&self) -> ParamType {
        match self {
            Param::U32(_) => ParamType::U32,
            Param::U64(_) => ParamType::U64,
        }
    }

    fn as_arg(&self) -> *mut c_void {
        match self {
            Param::U32(v) => v as *const u32 as *mut c_void,
            Param::U64(v) => v as *const u64 as *mut c_void,
        }
    }
}

/// A PTX module, JIT-compiled for one GPU, with the functions of its kernels.
pub struct Module<'g> {
    gpu: &'g Gpu,
    raw: CUmodule,
    functions: Vec<(&'static str, CUfunction)>,
}

// SAFETY: a loaded module and its functions may be used from any thread on which their
// context is current (`launch` binds it first); nothing in a Module changes after `load`.
unsafe impl Send for Module<'_> {}
// SAFETY: as for Send; cuLaunchKernel may be called on one function from several threads.
unsafe impl Sync for Module<'_> {}

impl<'g> Module<'g> {
    /// JIT-compiles `ptx` with the driver, keeping its error log for the message, and
    /// looks up each of `kernels`.
    ///
    /// # Panics
    /// When `ptx` or a kernel name holds a NUL byte (the agent's PTX is checked by a test).
    pub fn load(gpu: &'g Gpu, ptx: &str, kernels: &[impl KernelEntry]) -> Result<Self, CudaError> {
        gpu.bind()?;
        let image = CString::new(ptx).expect("PTX has no NUL");
        let mut log = vec![0 as c_char; 8192];
        let mut options = [
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values = [log.as_mut_ptr().cast::<c_void>(), log.len() as *mut c_void];
        let mut raw = std::ptr::null_mut();
        // SAFETY: image is NUL-terminated PTX; options and values have the same length
        // passed; the log buffer outlives the call and its size is the one announced.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(CudaError::Jit {
                gpu: gpu.bus_id.to_string(),
                error: describe(r),
                log: c_buf_to_string(&log),
            });
        }
        let mut module = Module {
            gpu,
            raw,
            functions: Vec::new(),
        };
        for &k in kernels {
            let name = CString::new(k.name()).expect("kernel names have no NUL");
            let mut f = std::ptr::null_mut();
            check(
                // SAFETY: module is loaded, name is NUL-terminated, f a valid out pointer.
                unsafe { sys::cuModuleGetFunction(&mut f, module.raw, name.as_ptr()) },
                "cuModuleGetFunction",
                &gpu.bus_id,
            )?;
            module.functions.push((k.name(), f));
        }
        Ok(module)
    }

    /// Launches `kernel` on `stream` with a 1-D grid.
    pub fn launch(
        &self,
        kernel: impl KernelEntry,
        grid: u32,
        block: u32,
        stream: &Stream<'_>,
        params: &[Param],
    ) -> Result<(), CudaError> {
        let want = kernel.params();
        if params.len() != want.len() || params.iter().zip(want).any(|(p, w)| p.ty() != *w) {
            return Err(CudaError::Launch {
                kernel: kernel.name(),
                why: format!("arguments {params:?} do not match the PTX parameters {want:?}"),
            });
        }
        if !std::ptr::eq(stream.gpu(), self.gpu) {
            return Err(CudaError::Launch {
                kernel: kernel.name(),
                why: "stream belongs to another GPU than the module".into(),
            });
        }
        let f = self
            .functions
            .iter()
            .find(|(name, _)| *name == kernel.name())
            .map(|(_, f)| *f)
            .ok_or_else(|| CudaError::Launch {
                kernel: kernel.name(),
                why: "the module was loaded without this kernel".into(),
            })?;
        self.gpu.bind()?;
        let mut args: Vec<*mut c_void> = params.iter().map(Param::as_arg).collect();
        // SAFETY: f belongs to this module's context, which is the stream's; args holds
        // one pointer per PTX parameter to a value of exactly its type (checked above),
        // alive until cuLaunchKernel returns (it copies them). Pointer arguments are
        // device addresses the caller allocated for the kernel's use.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream.raw,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
            &self.gpu.bus_id,
        )
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: raw is a loaded module, unloaded once, after its users.
            unsafe {
                sys::cuModuleUnload(self.raw);
            }
        }
    }
}
