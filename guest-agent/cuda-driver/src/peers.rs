//! What the driver says about each ordered GPU pair, and switching peer access.

use cudarc::driver::sys::{self, CUdevice_P2PAttribute, CUresult};

use super::driver::{check, describe, CudaError};
use super::gpu::Gpu;

/// The driver's view of `src` accessing `dst`'s memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAttributes {
    /// `cuDeviceCanAccessPeer`.
    pub can_access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better; 0 on NVLink).
    pub performance_rank: i32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access_supported: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: bool,
}

pub fn attributes(src: &Gpu, dst: &Gpu) -> Result<PeerAttributes, CudaError> {
    let mut can = 0;
    check(
        // SAFETY: can is a valid out pointer, both devices valid.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, src.dev, dst.dev) },
        "cuDeviceCanAccessPeer",
        &src.bus_id,
    )?;
    let attr = |a: CUdevice_P2PAttribute| -> Result<i32, CudaError> {
        let mut v = 0;
        check(
            // SAFETY: v is a valid out pointer, both devices valid.
            unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, src.dev, dst.dev) },
            "cuDeviceGetP2PAttribute",
            &src.bus_id,
        )?;
        Ok(v)
    };
    Ok(PeerAttributes {
        can_access: can != 0,
        performance_rank: attr(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        access_supported: attr(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?
            != 0,
        native_atomics: attr(
            CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
        )? != 0,
    })
}

/// Lets kernels and copies of `src` reach `dst`'s memory. Already enabled is fine.
///
/// Returns the driver's refusal as text (it is a finding, not an internal error).
pub fn enable(src: &Gpu, dst: &Gpu) -> Result<Result<(), String>, CudaError> {
    src.bind()?;
    // SAFETY: src's context is current, dst.ctx is a live primary context.
    let r = unsafe { sys::cuCtxEnablePeerAccess(dst.ctx, 0) };
    Ok(match r {
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        other => Err(describe(other)),
    })
}

/// Withdraws `src`'s access to `dst`'s memory (copies then go through the host).
pub fn disable(src: &Gpu, dst: &Gpu) -> Result<(), CudaError> {
    src.bind()?;
    // SAFETY: src's context is current, dst.ctx is a live primary context.
    let r = unsafe { sys::cuCtxDisablePeerAccess(dst.ctx) };
    if r == CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED {
        return Ok(());
    }
    check(r, "cuCtxDisablePeerAccess", &src.bus_id)
}
