//! A session with NVIDIA Fabric Manager: one [`Connection`] of the FFI crate
//! `vfio-p2p-fm-ffi` (`fmLibInit` + `fmConnect`; dropping the session disconnects and shuts
//! the library down), its calls returning plain Rust values; `read::fabric_manager` turns
//! the partition lists into the model, `partition_activation` drives activate/deactivate.
//!
//! FM's library may block in any call (FM hung, its socket stalled): the connection lives on
//! a worker thread ([`crate::outside_call::Worker`]) and each call is waited for at most
//! [`CALL_DEADLINE`]. A call past it is [`FmError::Deadline`] (an unreachable FM to the
//! callers' policies); the thread stays blocked, abandoned, and every later call of the
//! session fails at once.

use std::time::Duration;

use vfio_p2p_fm_ffi::{abi, library_name, Connection, FmCall, FmError, FmPartition, FmUnsupported};

use crate::outside_call::{Stuck, Worker};

/// How long any one FM call is waited for (above `fmConnect`'s own timeout,
/// `vfio_p2p_fm_ffi::CONNECT_TIMEOUT`). A hook facing an FM that does not answer returns
/// this long after the call that blocked.
pub const CALL_DEADLINE: Duration = Duration::from_secs(6);

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
    /// Loads the client library, initializes it and connects to FM at `address`
    /// (`HOST:PORT` or `unix:/PATH`), each step bounded by [`CALL_DEADLINE`].
    pub fn open(address: &str) -> Result<FmSession, FmError> {
        let worker =
            Worker::start("fabric-manager", CALL_DEADLINE).map_err(|e| FmError::NoLibrary {
                library: library_name().0,
                message: format!("no thread to call it on: {e}"),
                env: "",
            })?;
        let session = FmSession {
            worker,
            address: address.to_string(),
        };
        let (library, env) = library_name();
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
