//! A gate in pinned host memory that streams of several GPUs wait on
//! (`cuStreamWaitValue32`), opened by the host once their work is queued: the streams
//! start together instead of one after an event of another GPU.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUdeviceptr};

use super::driver::{check, CudaError};
use super::gpu::Gpu;
use super::stream::Stream;

/// One 32-bit word of pinned, device-mapped host memory: 0 closed, 1 open.
pub struct HostGate {
    host: *mut u32,
    device: CUdeviceptr,
}

impl HostGate {
    /// A closed gate, mapped for every context (`gpu`'s is current for the mapping).
    pub fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        check(
            // SAFETY: host is a valid out pointer; a context is current.
            unsafe { sys::cuMemHostAlloc(&mut host, 4, flags) },
            "cuMemHostAlloc",
            &gpu.bus_id,
        )?;
        let mut gate = HostGate {
            host: host.cast(),
            device: 0,
        };
        gate.close();
        check(
            // SAFETY: host was allocated with CU_MEMHOSTALLOC_DEVICEMAP just above.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut gate.device, host, 0) },
            "cuMemHostGetDevicePointer",
            &gpu.bus_id,
        )?;
        Ok(gate)
    }

    pub fn close(&self) {
        // SAFETY: host is a live 4-byte pinned allocation; the GPUs only read it.
        unsafe { std::ptr::write_volatile(self.host, 0) }
    }

    pub fn open(&self) {
        // SAFETY: as in close.
        unsafe { std::ptr::write_volatile(self.host, 1) }
    }

    /// Makes later work on `stream` wait until the gate is open.
    pub fn hold(&self, stream: &Stream<'_>) -> Result<(), CudaError> {
        let gpu = stream.gpu();
        gpu.bind()?;
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: device maps a live pinned word for every context (PORTABLE); the
        // stream is live.
        check(
            unsafe { sys::cuStreamWaitValue32_v2(stream.raw, self.device, 1, geq) },
            "cuStreamWaitValue32",
            &gpu.bus_id,
        )
    }
}

impl Drop for HostGate {
    fn drop(&mut self) {
        // Open first: no stream may stay blocked on freed memory.
        self.open();
        // SAFETY: host came from cuMemHostAlloc and is freed once; cuMemFreeHost waits
        // for the work that uses it.
        unsafe {
            sys::cuMemFreeHost(self.host.cast());
        }
    }
}

// SAFETY: the word is only written through volatile stores of whole u32s, and the
// allocation lives until drop; moving the handle between threads is sound.
unsafe impl Send for HostGate {}
