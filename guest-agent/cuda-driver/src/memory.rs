use cudarc::driver::sys::{self, CUdeviceptr};

use super::driver::{check, CudaError};
use super::gpu::Gpu;

/// Device memory on one GPU, freed on drop.
pub struct DeviceBuffer<'g> {
    gpu: &'g Gpu,
    ptr: CUdeviceptr,
    bytes: usize,
}

impl<'g> DeviceBuffer<'g> {
    pub fn new(gpu: &'g Gpu, bytes: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        let mut ptr = 0;
        check(
            // SAFETY: ptr is a valid out pointer; the GPU's context is current.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) },
            "cuMemAlloc",
            &gpu.bus_id,
        )?;
        Ok(DeviceBuffer { gpu, ptr, bytes })
    }

    /// A buffer of `u32` words, all set to `value`.
    pub fn words(gpu: &'g Gpu, n: usize, value: u32) -> Result<Self, CudaError> {
        let b = Self::new(gpu, n * 4)?;
        b.fill_u32(value)?;
        Ok(b)
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Sets every 32-bit word, and waits: a memset of device memory may still be
    /// running when cuMemsetD32 returns, and the agent's streams do not wait for it.
    pub fn fill_u32(&self, value: u32) -> Result<(), CudaError> {
        self.gpu.bind()?;
        check(
            // SAFETY: the range is this allocation.
            unsafe { sys::cuMemsetD32_v2(self.ptr, value, self.bytes / 4) },
            "cuMemsetD32",
            &self.gpu.bus_id,
        )?;
        self.gpu.synchronize()
    }

    /// Sets 32-bit word `i` to `value`, and waits.
    pub fn set_word(&self, i: usize, value: u32) -> Result<(), CudaError> {
        assert!((i + 1) * 4 <= self.bytes, "word {i} beyond the buffer");
        self.gpu.bind()?;
        check(
            // SAFETY: the one word lies within this allocation (asserted above).
            unsafe { sys::cuMemsetD32_v2(self.ptr + 4 * i as u64, value, 1) },
            "cuMemsetD32",
            &self.gpu.bus_id,
        )?;
        self.gpu.synchronize()
    }

    /// Copies `data` in, and waits (the DMA from the staging buffer may outlive the call).
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<(), CudaError> {
        assert!(std::mem::size_of_val(data) <= self.bytes);
        self.gpu.bind()?;
        check(
            // SAFETY: the source is a live slice of the size passed, within this allocation.
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), std::mem::size_of_val(data))
            },
            "cuMemcpyHtoD",
            &self.gpu.bus_id,
        )?;
        self.gpu.synchronize()
    }

    pub fn download<T: Copy>(&self, out: &mut [T]) -> Result<(), CudaError> {
        assert!(std::mem::size_of_val(out) <= self.bytes);
        self.gpu.bind()?;
        // SAFETY: the destination is a live mutable slice of the size passed; any bit
        // pattern is valid for the plain integer types this is used with.
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    out.as_mut_ptr().cast(),
                    self.ptr,
                    std::mem::size_of_val(out),
                )
            },
            "cuMemcpyDtoH",
            &self.gpu.bus_id,
        )
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: ptr came from cuMemAlloc in this context and is freed once; the
            // driver synchronises on free, so no queued work still uses it.
            unsafe {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}
