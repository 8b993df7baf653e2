//! NVIDIA Fabric Manager's C API, through its client library loaded at run time like
//! libcuda: `libnvfm.so.1` (package nvidia-fabricmanager-dev), or the library
//! `VFIO_P2P_FM_LIBRARY` names (the tests' stand-in, `tests/fm-standin`).
//!
//! The one place the host side calls FM's library: its C ABI ([`abi`]), one
//! [`Connection`] (`fmLibInit` + `fmConnect`; dropped, it disconnects and shuts the library
//! down) whose calls return plain Rust values, and what went wrong in an operator's words
//! ([`FmError`]). Every `unsafe` has its `// SAFETY:` line; the API is safe.
//!
//! A `Connection` is not `Send`: it is made and used on one thread.
//! `vfio_p2p_read::fm_api::FmSession` keeps it on a worker thread and waits for each call
//! at most a deadline, as FM's library may block in any call.

pub mod abi;
mod connection;
pub mod error;

use std::time::Duration;

pub use connection::Connection;
pub use error::{FmCall, FmError, FmFailure};

/// The environment variable naming another client library (tests use the stand-in).
pub const LIBRARY_ENV: &str = "VFIO_P2P_FM_LIBRARY";
/// FM's client library, as nvidia-fabricmanager-dev installs it.
pub const DEFAULT_LIBRARY: &str = "libnvfm.so.1";
/// How long `fmConnect` may try: the hook runs while libvirt waits.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The library to load: `VFIO_P2P_FM_LIBRARY`, else libnvfm.so.1, and how to say where
/// the name came from.
pub fn library_name() -> (String, &'static str) {
    match std::env::var(LIBRARY_ENV) {
        Ok(v) if !v.is_empty() => (v, " (named by VFIO_P2P_FM_LIBRARY)"),
        _ => (DEFAULT_LIBRARY.to_string(), ""),
    }
}

/// One GPU of a partition as FM lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmGpu {
    pub physical_id: u32,
    /// FM's PCI bus id text (`00000000:13:00.0`); empty where FM leaves it out (H100 on).
    pub pci_bus_id: String,
    pub nvlinks_available: u32,
    pub nvlinks_max: u32,
}

/// One supported partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmPartition {
    pub id: u32,
    pub active: bool,
    pub gpus: Vec<FmGpu>,
}

/// One unsupported partition: its id and its GPUs' physical ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmUnsupported {
    pub id: u32,
    pub physical_ids: Vec<u32>,
}
