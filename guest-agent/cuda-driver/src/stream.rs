use cudarc::driver::sys::{self, CUevent, CUstream};

use super::driver::{check, CudaError};
use super::gpu::Gpu;

/// A non-blocking stream on one GPU.
pub struct Stream<'g> {
    gpu: &'g Gpu,
    pub(crate) raw: CUstream,
}

impl<'g> Stream<'g> {
    pub fn new(gpu: &'g Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let mut raw = std::ptr::null_mut();
        check(
            // SAFETY: raw is a valid out pointer; the GPU's context is current.
            unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
            &gpu.bus_id,
        )?;
        Ok(Stream { gpu, raw })
    }

    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: raw is a live stream.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
            &self.gpu.bus_id,
        )
    }

    /// Makes later work on this stream wait for `event` (possibly of another GPU).
    pub fn wait(&self, event: &Event<'_>) -> Result<(), CudaError> {
        // SAFETY: both handles are live.
        check(
            unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) },
            "cuStreamWaitEvent",
            &self.gpu.bus_id,
        )
    }

    /// `cuMemcpyPeerAsync` of `bytes` from `src` (on its GPU) to `dst` (on its GPU).
    pub fn copy_peer(
        &self,
        dst: &super::DeviceBuffer<'_>,
        src: &super::DeviceBuffer<'_>,
        bytes: usize,
    ) -> Result<(), CudaError> {
        assert!(bytes <= dst.bytes() && bytes <= src.bytes());
        self.gpu.bind()?;
        // SAFETY: both ranges lie within live allocations of the contexts passed.
        check(
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst.ptr(),
                    dst.gpu().ctx,
                    src.ptr(),
                    src.gpu().ctx,
                    bytes,
                    self.raw,
                )
            },
            "cuMemcpyPeerAsync",
            &self.gpu.bus_id,
        )
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: raw is a live stream destroyed once; queued work still completes.
        unsafe {
            sys::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// A timing event.
pub struct Event<'g> {
    gpu: &'g Gpu,
    raw: CUevent,
}

impl<'g> Event<'g> {
    pub fn new(gpu: &'g Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let mut raw = std::ptr::null_mut();
        check(
            // SAFETY: raw is a valid out pointer; the GPU's context is current.
            unsafe { sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DEFAULT as u32) },
            "cuEventCreate",
            &gpu.bus_id,
        )?;
        Ok(Event { gpu, raw })
    }

    pub fn record(&self, stream: &Stream<'_>) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: both handles are live and belong to the same context.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw) },
            "cuEventRecord",
            &self.gpu.bus_id,
        )
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: raw is a live event.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
            &self.gpu.bus_id,
        )
    }

    /// Milliseconds from `start` to this event (both completed).
    pub fn since(&self, start: &Event<'_>) -> Result<f64, CudaError> {
        let mut ms = 0f32;
        check(
            // SAFETY: both events are live and recorded; ms is a valid out pointer.
            unsafe { sys::cuEventElapsedTime(&mut ms, start.raw, self.raw) },
            "cuEventElapsedTime",
            &self.gpu.bus_id,
        )?;
        Ok(ms as f64)
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: raw is a live event destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}
