use std::ffi::CStr;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUresult};
use vfio_p2p_load_failure::LoadFailure;

/// A failed driver call, with what was being done and on which GPU.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("the CUDA driver library (libcuda.so.1) cannot be loaded: is the NVIDIA driver installed in this guest?")]
    NoDriver,
    /// libcuda is there but cannot be loaded (a library it needs, another architecture's
    /// build, a damaged file): dlerror's reason and the fix.
    #[error("the CUDA driver library: {0}")]
    Unloadable(LoadFailure),
    #[error("cuInit failed: {0}")]
    Init(String),
    #[error("{what} on GPU {gpu}: {error}")]
    Call {
        what: &'static str,
        gpu: String,
        error: String,
    },
    #[error("JIT of the kernel PTX failed on GPU {gpu}: {error}; log: {log}")]
    Jit {
        gpu: String,
        error: String,
        log: String,
    },
    #[error("kernel {kernel}: {why}")]
    Launch { kernel: &'static str, why: String },
}

/// Name and text of a driver error, e.g. `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (peer access is not supported between these two devices)`.
pub(crate) fn describe(r: CUresult) -> String {
    let e = DriverError(r);
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{r:?}"));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Turns a `CUresult` into a [`CudaError::Call`] naming the call and GPU.
pub(crate) fn check(
    r: CUresult,
    what: &'static str,
    gpu: &dyn std::fmt::Display,
) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Call {
            what,
            gpu: gpu.to_string(),
            error: describe(r),
        })
    }
}

/// Asks the driver for one hardware work queue per context (`CUDA_DEVICE_MAX_CONNECTIONS=1`)
/// unless the environment already names a number. A context then opens in half the time
/// and ends sooner (2 × H100: the contexts 0.10 s instead of 0.20 s, the process's end
/// 0.12 s instead of 0.17 s; the H100 bench runs, `tests/fixtures/agent/h100-nvswitch`). Only for work that never has two
/// streams of one context wait on each other: every ordered pair of the agent uses one
/// stream on each of two GPUs (`bench --simulate`, whose pairs share a GPU, must not).
/// Call before [`init`], while the process has one thread.
pub fn prefer_one_work_queue() {
    if std::env::var_os(MAX_CONNECTIONS).is_none() {
        std::env::set_var(MAX_CONNECTIONS, "1");
    }
}

const MAX_CONNECTIONS: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Loads libcuda and initialises the driver.
///
/// cudarc panics on the first call into a library it cannot load, so this checks
/// for the library first and turns its absence into [`CudaError::NoDriver`], a library
/// that is there but does not load into [`CudaError::Unloadable`] with dlerror's reason.
pub fn init() -> Result<(), CudaError> {
    // SAFETY: is_culib_present only tries to dlopen the library names and drops them.
    if !unsafe { sys::is_culib_present() } {
        return Err(load_error(DRIVER_LIB));
    }
    // SAFETY: the library is present; cuInit has no pointer arguments.
    let r = unsafe { sys::cuInit(0) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(CudaError::Init(describe(r)));
    }
    Ok(())
}

/// The driver library's name as the NVIDIA driver installs it (one of cudarc's candidates).
const DRIVER_LIB: &str = "libcuda.so.1";

/// Why `library` does not load: [`CudaError::NoDriver`] when it is not there.
fn load_error(library: &str) -> CudaError {
    // SAFETY: only reached when dlopen of every candidate failed; a library that does load
    // now runs the driver's initialisers, which have no preconditions, and is dropped.
    match unsafe { libloading::Library::new(library) } {
        Ok(_) => CudaError::NoDriver,
        Err(e) => match LoadFailure::new(library, &e) {
            f if f.is_absent() => CudaError::NoDriver,
            f => CudaError::Unloadable(f),
        },
    }
}

/// Driver API version (e.g. 13000 for CUDA 13.0). Needs [`init`] first.
pub fn driver_version() -> Result<i32, CudaError> {
    let mut v = 0;
    check(
        // SAFETY: v is a valid out pointer.
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
        &"-",
    )?;
    Ok(v)
}

/// Copies a NUL-terminated C string the driver wrote into `buf`.
pub(crate) fn c_buf_to_string(buf: &[std::ffi::c_char]) -> String {
    // SAFETY: c_char and u8 have the same size and alignment.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) };
    CStr::from_bytes_until_nul(bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_driver_says_so_and_a_broken_one_says_dlerrors_reason() {
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join("libcuda.so.1");
        std::fs::write(&junk, "not an ELF").unwrap();
        let broken = load_error(&junk.display().to_string()).to_string();
        assert!(broken.contains(&junk.display().to_string()), "{broken}");
        assert!(broken.contains("file too short"), "{broken}");
        assert!(broken.contains("reinstall it"), "{broken}");
        let absent = load_error("/nonexistent/libcuda.so.1");
        assert!(matches!(absent, CudaError::NoDriver), "{absent}");
        assert!(absent
            .to_string()
            .contains("is the NVIDIA driver installed"));
    }
}
