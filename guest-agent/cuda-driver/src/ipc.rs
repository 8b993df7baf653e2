//! Device memory shared between processes, the two ways NCCL and training jobs share it:
//! a virtual-memory-management allocation exported as a POSIX file descriptor
//! (`cuMemCreate` + `cuMemExportToShareableHandle`; NCCL's `P2P/CUMEM`), and the legacy
//! `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` (NCCL's `P2P/IPC`, `cudaIpc*MemHandle`).

use std::os::fd::{FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUdeviceptr, CUipcMemHandle, CUipcMem_flags, CUmemAccessDesc, CUmemAccess_flags,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};

use super::driver::{check, CudaError};
use super::gpu::Gpu;

/// Bytes of a legacy IPC handle.
pub const IPC_HANDLE_BYTES: usize = 64;

fn device_location(gpu: &Gpu) -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: gpu.ordinal,
    }
}

fn fd_prop(gpu: &Gpu) -> CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (null metadata, no flags).
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = device_location(gpu);
    prop
}

/// `bytes` rounded up to the allocation granularity of `gpu`.
fn granular(gpu: &Gpu, bytes: usize) -> Result<usize, CudaError> {
    let prop = fd_prop(gpu);
    let mut g = 0usize;
    check(
        // SAFETY: g and prop are valid for the call.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        "cuMemGetAllocationGranularity",
        &gpu.bus_id,
    )?;
    Ok(bytes.div_ceil(g.max(1)) * g.max(1))
}

/// A VMM allocation mapped into this process with read-write access for `gpu`.
pub struct MappedMemory<'g> {
    gpu: &'g Gpu,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    bytes: usize,
    mapped: bool,
}

impl<'g> MappedMemory<'g> {
    /// Maps `handle` (owned from here on) at a new address, readable and writable by `gpu`.
    fn map(
        gpu: &'g Gpu,
        handle: CUmemGenericAllocationHandle,
        bytes: usize,
    ) -> Result<Self, CudaError> {
        let mut ptr = 0;
        // SAFETY: ptr is a valid out pointer; the range is reserved for this mapping alone.
        let reserved = check(
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0) },
            "cuMemAddressReserve",
            &gpu.bus_id,
        );
        if let Err(e) = reserved {
            // SAFETY: the handle is ours and mapped nowhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let mut m = MappedMemory {
            gpu,
            handle,
            ptr,
            bytes,
            mapped: false,
        };
        check(
            // SAFETY: the range was just reserved with this size; the handle is at least that large.
            unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) },
            "cuMemMap",
            &gpu.bus_id,
        )?;
        m.mapped = true;
        let desc = CUmemAccessDesc {
            location: device_location(gpu),
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        check(
            // SAFETY: the range is mapped; desc is one valid descriptor.
            unsafe { sys::cuMemSetAccess(ptr, bytes, &desc, 1) },
            "cuMemSetAccess",
            &gpu.bus_id,
        )?;
        Ok(m)
    }

    /// New memory of at least `bytes` on `gpu`, exportable as a POSIX file descriptor.
    pub fn new_exportable(gpu: &'g Gpu, bytes: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        let bytes = granular(gpu, bytes)?;
        let prop = fd_prop(gpu);
        let mut handle = 0;
        check(
            // SAFETY: handle is a valid out pointer, prop a valid property set.
            unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) },
            "cuMemCreate",
            &gpu.bus_id,
        )?;
        Self::map(gpu, handle, bytes)
    }

    /// A file descriptor another process can import this memory from.
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        let mut fd: libc::c_int = -1;
        check(
            // SAFETY: for POSIX_FILE_DESCRIPTOR the out parameter is an int.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut libc::c_int).cast(),
                    self.handle,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            "cuMemExportToShareableHandle",
            &self.gpu.bus_id,
        )?;
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports memory of `bytes` exported by another process as `fd`, mapped for `gpu`.
    pub fn import_fd(gpu: &'g Gpu, fd: &OwnedFd, bytes: usize) -> Result<Self, CudaError> {
        use std::os::fd::AsRawFd;
        gpu.bind()?;
        let mut handle = 0;
        check(
            // SAFETY: for POSIX_FILE_DESCRIPTOR the OS handle is the descriptor's value passed
            // as a pointer-sized integer; fd stays open during the call.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as isize as *mut libc::c_void,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
            &gpu.bus_id,
        )?;
        Self::map(gpu, handle, bytes)
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for MappedMemory<'_> {
    fn drop(&mut self) {
        if self.gpu.bind().is_err() {
            return;
        }
        // SAFETY: the range and handle are this mapping's; nothing uses them any more.
        unsafe {
            if self.mapped {
                sys::cuMemUnmap(self.ptr, self.bytes);
            }
            sys::cuMemAddressFree(self.ptr, self.bytes);
            sys::cuMemRelease(self.handle);
        }
    }
}

/// The legacy IPC handle of `ptr` (an allocation of `cuMemAlloc` on `gpu`).
pub fn ipc_handle(gpu: &Gpu, ptr: CUdeviceptr) -> Result<[u8; IPC_HANDLE_BYTES], CudaError> {
    gpu.bind()?;
    // SAFETY: an all-zero handle is a valid out buffer.
    let mut h: CUipcMemHandle = unsafe { std::mem::zeroed() };
    check(
        // SAFETY: h is a valid out pointer and ptr a live allocation of this context.
        unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) },
        "cuIpcGetMemHandle",
        &gpu.bus_id,
    )?;
    Ok(h.reserved.map(|c| c as u8))
}

/// Another process's memory opened through its legacy IPC handle, closed on drop.
pub struct IpcOpened<'g> {
    gpu: &'g Gpu,
    ptr: CUdeviceptr,
}

impl<'g> IpcOpened<'g> {
    pub fn open(gpu: &'g Gpu, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: an all-zero handle is valid to fill.
        let mut h: CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as libc::c_char;
        }
        let mut ptr = 0;
        check(
            // SAFETY: ptr is a valid out pointer; h came from cuIpcGetMemHandle in the owner.
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    h,
                    CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            },
            "cuIpcOpenMemHandle",
            &gpu.bus_id,
        )?;
        Ok(IpcOpened { gpu, ptr })
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

impl Drop for IpcOpened<'_> {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: ptr was opened by cuIpcOpenMemHandle in this context.
            unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
