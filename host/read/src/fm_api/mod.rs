//! NVIDIA Fabric Manager's C API, through its client library loaded at run time like
//! libcuda: `libnvfm.so.1` (package nvidia-fabricmanager-dev), or the library
//! `VFIO_P2P_FM_LIBRARY` names (the tests' stand-in, `tests/fm-standin`).
//!
//! An [`FmSession`] is one `fmLibInit` + `fmConnect`; dropping it disconnects and shuts the
//! library down. Its calls return plain Rust values; `read::fabric_manager` turns the
//! partition lists into the model, `partition_activation` drives activate/deactivate.
//!
//! FM's library may block in any call (FM hung, its socket stalled): the connection lives on
//! a worker thread ([`crate::outside_call::Worker`]) and each call is waited for at most
//! [`CALL_DEADLINE`]. A call past it is [`FmError::Deadline`] (an unreachable FM to the
//! callers' policies); the thread stays blocked, abandoned, and every later call of the
//! session fails at once.

pub mod abi;
mod connection;
pub mod error;

use std::time::Duration;

pub use error::{FmCall, FmError, FmFailure};

use crate::outside_call::{Stuck, Worker};
use connection::Connection;

/// The environment variable naming another client library (tests use the stand-in).
pub const LIBRARY_ENV: &str = "VFIO_P2P_FM_LIBRARY";
/// FM's client library, as nvidia-fabricmanager-dev installs it.
pub const DEFAULT_LIBRARY: &str = "libnvfm.so.1";
/// How long `fmConnect` may try: the hook runs while libvirt waits.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any one FM call is waited for (above `fmConnect`'s own timeout). A hook facing
/// an FM that does not answer returns this long after the call that blocked.
pub const CALL_DEADLINE: Duration = Duration::from_secs(6);

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

/// A connection to Fabric Manager, its calls bounded by [`CALL_DEADLINE`].
pub struct FmSession {
    worker: Worker<Connection>,
    address: String,
}

impl std::fmt::Debug for FmSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FmSession")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl FmSession {
    /// The library to load: `VFIO_P2P_FM_LIBRARY`, else libnvfm.so.1.
    pub fn library_name() -> (String, &'static str) {
        match std::env::var(LIBRARY_ENV) {
            Ok(v) if !v.is_empty() => (v, " (named by VFIO_P2P_FM_LIBRARY)"),
            _ => (DEFAULT_LIBRARY.to_string(), ""),
        }
    }

    /// Loads the client library, initializes it and connects to FM at `address`
    /// (`HOST:PORT` or `unix:/PATH`), each step bounded by [`CALL_DEADLINE`].
    pub fn open(address: &str) -> Result<FmSession, FmError> {
        let worker =
            Worker::start("fabric-manager", CALL_DEADLINE).map_err(|e| FmError::NoLibrary {
                library: Self::library_name().0,
                message: format!("no thread to call it on: {e}"),
                env: "",
            })?;
        let session = FmSession {
            worker,
            address: address.to_string(),
        };
        let (library, env) = Self::library_name();
        let at = address.to_string();
        session.on_slot(FmCall::LibInit, move |slot| {
            *slot = Some(Connection::init(library, env, &at)?);
            Ok(())
        })?;
        session.on_slot(FmCall::Connect, |slot| match slot {
            Some(c) => c.connect(),
            None => Err(FmError::Call {
                call: FmCall::Connect,
                code: abi::UNINITIALIZED,
                address: String::new(),
            }),
        })?;
        Ok(session)
    }

    /// The address this session talks to, as host.yaml gave it.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Runs `f` on the worker's connection slot, waiting at most the deadline.
    fn on_slot<R: Send + 'static>(
        &self,
        call: FmCall,
        f: impl FnOnce(&mut Option<Connection>) -> Result<R, FmError> + Send + 'static,
    ) -> Result<R, FmError> {
        self.worker.call(f).unwrap_or_else(|stuck| {
            Err(FmError::Deadline {
                call,
                address: self.address.clone(),
                after: self.worker.deadline(),
                earlier: stuck == Stuck::Earlier,
            })
        })
    }

    /// Runs `f` on the open connection.
    fn on<R: Send + 'static>(
        &self,
        call: FmCall,
        f: impl FnOnce(&Connection) -> Result<R, FmError> + Send + 'static,
    ) -> Result<R, FmError> {
        let address = self.address.clone();
        self.on_slot(call, move |slot| match slot {
            Some(c) => f(c),
            None => Err(FmError::Call {
                call,
                code: abi::UNINITIALIZED,
                address,
            }),
        })
    }

    /// `fmGetSupportedFabricPartitions`.
    pub fn supported_partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        self.on(FmCall::GetSupported, Connection::supported_partitions)
    }

    /// `fmGetUnsupportedFabricPartitions`.
    pub fn unsupported_partitions(&self) -> Result<Vec<FmUnsupported>, FmError> {
        self.on(FmCall::GetUnsupported, Connection::unsupported_partitions)
    }

    /// `fmGetNvlinkFailedDevices`: the PCI bus ids of GPUs with failed NVLinks.
    pub fn nvlink_failed_gpus(&self) -> Result<Vec<String>, FmError> {
        self.on(FmCall::GetNvlinkFailed, Connection::nvlink_failed_gpus)
    }

    /// `fmActivateFabricPartition`.
    pub fn activate(&self, id: u32) -> Result<(), FmError> {
        self.on(FmCall::Activate(id), move |c| c.activate(id))
    }

    /// `fmDeactivateFabricPartition`.
    pub fn deactivate(&self, id: u32) -> Result<(), FmError> {
        self.on(FmCall::Deactivate(id), move |c| c.deactivate(id))
    }

    /// `fmSetActivatedFabricPartitions`: after an FM restart, the partitions still active
    /// (possibly none: FM wants the call then too).
    pub fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        let ids = ids.to_vec();
        self.on(FmCall::SetActivated, move |c| c.set_activated(&ids))
    }
}

impl Drop for FmSession {
    /// Disconnects and shuts the library down on the worker, waiting at most the deadline;
    /// after a blocked call nothing is asked of the library again.
    fn drop(&mut self) {
        if !self.worker.is_blocked() {
            let _ = self.worker.call(|slot| drop(slot.take()));
        }
    }
}
