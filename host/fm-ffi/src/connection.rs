//! One connection to Fabric Manager through its client library, made and used on one
//! thread (`vfio_p2p_read::fm_api::FmSession`'s worker, which waits for each call at most
//! its deadline): `fmLibInit` + `fmConnect`; dropping it disconnects and shuts the library
//! down.

use std::ffi::{c_int, c_uint, c_void};

use libloading::Library;
use vfio_p2p_load_failure::LoadFailure;

use crate::abi::{self, FmReturn, FM_ST_SUCCESS};
use crate::{FmCall, FmError, FmGpu, FmPartition, FmUnsupported, CONNECT_TIMEOUT};

/// Where FM listens, as `fmConnect` wants it: text and whether it is a Unix socket.
fn connect_target(address: &str) -> (String, bool) {
    match address.strip_prefix("unix:") {
        Some(path) => (path.to_string(), true),
        None => (address.to_string(), false),
    }
}

type NoArgs = unsafe extern "C" fn() -> FmReturn;
type Connect = unsafe extern "C" fn(*mut abi::ConnectParams, *mut *mut c_void) -> FmReturn;
type WithHandle = unsafe extern "C" fn(*mut c_void) -> FmReturn;
type WithId = unsafe extern "C" fn(*mut c_void, c_uint) -> FmReturn;
type WithStruct<T> = unsafe extern "C" fn(*mut c_void, *mut T) -> FmReturn;

/// A connection to Fabric Manager.
pub struct Connection {
    lib: Library,
    library: String,
    address: String,
    handle: *mut c_void,
    /// fmLibInit succeeded: fmLibShutdown is owed.
    initialized: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("library", &self.library)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Why `library` did not load, with dlerror's reason (`vfio_p2p_load_failure`, the rule the
/// agent's libraries follow too): absent (dlopen's "cannot open shared object file" for the
/// library itself) is [`FmError::NoLibrary`], a host without FM; anything else — a
/// dependency missing, another architecture, a truncated file — is [`FmError::Unloadable`].
fn load_error(library: &str, e: &libloading::Error, env: &'static str) -> FmError {
    match LoadFailure::new(library, e) {
        LoadFailure::Absent { library, reason } => FmError::NoLibrary {
            library,
            message: reason,
            env,
        },
        LoadFailure::Unloadable { library, reason } => FmError::Unloadable {
            library,
            message: reason,
            env,
        },
    }
}

impl Connection {
    /// Loads the client library `library` and initializes it (`fmLibInit`), to talk to FM
    /// at `address` (`HOST:PORT` or `unix:/PATH`).
    pub fn init(library: String, env: &'static str, address: &str) -> Result<Connection, FmError> {
        // SAFETY: loading FM's client library runs no initializer with preconditions; its
        // documented first call is fmLibInit, made next.
        let lib = unsafe { Library::new(&library) }.map_err(|e| load_error(&library, &e, env))?;
        let mut session = Connection {
            lib,
            library,
            address: address.to_string(),
            handle: std::ptr::null_mut(),
            initialized: false,
        };
        let init: NoArgs = session.symbol(b"fmLibInit\0", "fmLibInit")?;
        // SAFETY: fmLibInit takes no arguments (nv_fm_agent.h).
        let rc = unsafe { init() };
        session.check(FmCall::LibInit, rc)?;
        session.initialized = true;
        Ok(session)
    }

    /// `fmConnect`.
    pub fn connect(&mut self) -> Result<(), FmError> {
        let connect: Connect = self.symbol(b"fmConnect\0", "fmConnect")?;
        let mut params = abi::zeroed_box::<abi::ConnectParams>();
        params.version = abi::param_version::<abi::ConnectParams>(1);
        let (target, unix) = connect_target(&self.address);
        let room = abi::MAX_STR_LENGTH - 1; // keep the terminating NUL
        if target.len() > room || target.contains('\0') {
            return Err(FmError::NotMade {
                call: FmCall::Connect,
                address: self.address.clone(),
                why: format!("the address is {} bytes or holds a NUL; fmConnect takes at most {room} (FM_MAX_STR_LENGTH with its NUL): give a shorter HOST:PORT or unix:/PATH", target.len()),
            });
        }
        for (d, b) in params.address_info.iter_mut().zip(target.bytes()) {
            *d = b as std::ffi::c_char;
        }
        params.timeout_ms = CONNECT_TIMEOUT.as_millis() as c_uint;
        params.address_is_unix_socket = unix as c_uint;
        let mut handle = std::ptr::null_mut();
        // SAFETY: params is a valid fmConnectParams_v1 with its version set; handle is a
        // valid out pointer. Both outlive the call.
        let rc = unsafe { connect(&mut *params, &mut handle) };
        if rc != FM_ST_SUCCESS {
            return Err(self.error(FmCall::Connect, rc));
        }
        self.handle = handle;
        Ok(())
    }

    fn symbol<T: Copy>(&self, name: &'static [u8], shown: &'static str) -> Result<T, FmError> {
        // SAFETY: T is the function type nv_fm_agent.h declares for `name`; the library
        // stays loaded as long as `self`, and the pointer is only called through `self`.
        unsafe { self.lib.get::<T>(name) }
            .map(|s| *s)
            .map_err(|e| FmError::Symbol {
                library: self.library.clone(),
                symbol: shown,
                message: e.to_string(),
            })
    }

    fn error(&self, call: FmCall, code: FmReturn) -> FmError {
        FmError::Call {
            call,
            code,
            address: self.address.clone(),
        }
    }

    fn check(&self, call: FmCall, rc: FmReturn) -> Result<(), FmError> {
        if rc == FM_ST_SUCCESS {
            Ok(())
        } else {
            Err(self.error(call, rc))
        }
    }

    /// Calls `name(handle, &mut s)` on a zeroed, versioned `T`.
    fn query<T: abi::Plain>(
        &self,
        call: FmCall,
        name: &'static [u8],
        shown: &'static str,
        set_version: impl FnOnce(&mut T),
    ) -> Result<Box<T>, FmError> {
        let f: WithStruct<T> = self.symbol(name, shown)?;
        let mut s = abi::zeroed_box::<T>();
        set_version(&mut s);
        // SAFETY: the handle came from fmConnect; s is a valid, versioned T of the layout the
        // SDK gives for this call, alive for the call.
        let rc = unsafe { f(self.handle, &mut *s) };
        self.check(call, rc)?;
        Ok(s)
    }

    fn bounded(&self, call: FmCall, count: c_uint, max: usize) -> Result<usize, FmError> {
        if count as usize > max {
            return Err(FmError::BadAnswer {
                call,
                address: self.address.clone(),
                count,
                max,
            });
        }
        Ok(count as usize)
    }

    /// `fmGetSupportedFabricPartitions`.
    pub fn supported_partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        let call = FmCall::GetSupported;
        let list = self.query::<abi::PartitionList>(
            call,
            b"fmGetSupportedFabricPartitions\0",
            "fmGetSupportedFabricPartitions",
            |l| l.version = abi::param_version::<abi::PartitionList>(1),
        )?;
        let n = self.bounded(call, list.num_partitions, abi::MAX_FABRIC_PARTITIONS)?;
        let mut out = Vec::with_capacity(n);
        for p in &list.partition_info[..n] {
            let g = self.bounded(call, p.num_gpus, abi::MAX_NUM_GPUS)?;
            out.push(FmPartition {
                id: p.partition_id,
                active: p.is_active != 0,
                gpus: p.gpu_info[..g]
                    .iter()
                    .map(|g| FmGpu {
                        physical_id: g.physical_id,
                        pci_bus_id: abi::field_text(&g.pci_bus_id),
                        nvlinks_available: g.num_nvlinks_available,
                        nvlinks_max: g.max_num_nvlinks,
                    })
                    .collect(),
            });
        }
        Ok(out)
    }

    /// `fmGetUnsupportedFabricPartitions`.
    pub fn unsupported_partitions(&self) -> Result<Vec<FmUnsupported>, FmError> {
        let call = FmCall::GetUnsupported;
        let list = self.query::<abi::UnsupportedPartitionList>(
            call,
            b"fmGetUnsupportedFabricPartitions\0",
            "fmGetUnsupportedFabricPartitions",
            |l| l.version = abi::param_version::<abi::UnsupportedPartitionList>(1),
        )?;
        let n = self.bounded(call, list.num_partitions, abi::MAX_FABRIC_PARTITIONS)?;
        let mut out = Vec::with_capacity(n);
        for p in &list.partition_info[..n] {
            let g = self.bounded(call, p.num_gpus, abi::MAX_NUM_GPUS)?;
            out.push(FmUnsupported {
                id: p.partition_id,
                physical_ids: p.gpu_physical_ids[..g].to_vec(),
            });
        }
        Ok(out)
    }

    /// `fmGetNvlinkFailedDevices`: the PCI bus ids of GPUs with failed NVLinks.
    pub fn nvlink_failed_gpus(&self) -> Result<Vec<String>, FmError> {
        let call = FmCall::GetNvlinkFailed;
        let list = self.query::<abi::NvlinkFailedDevices>(
            call,
            b"fmGetNvlinkFailedDevices\0",
            "fmGetNvlinkFailedDevices",
            |l| l.version = abi::param_version::<abi::NvlinkFailedDevices>(1),
        )?;
        let n = self.bounded(call, list.num_gpus, abi::MAX_NUM_GPUS)?;
        self.bounded(call, list.num_switches, abi::MAX_NUM_NVSWITCHES)?;
        Ok(list.gpu_info[..n]
            .iter()
            .map(|d| abi::field_text(&d.pci_bus_id))
            .collect())
    }

    fn with_id(
        &self,
        call: FmCall,
        name: &'static [u8],
        shown: &'static str,
        id: u32,
    ) -> Result<(), FmError> {
        let f: WithId = self.symbol(name, shown)?;
        // SAFETY: the handle came from fmConnect; the id is a plain integer.
        let rc = unsafe { f(self.handle, id) };
        self.check(call, rc)
    }

    /// `fmActivateFabricPartition`.
    pub fn activate(&self, id: u32) -> Result<(), FmError> {
        self.with_id(
            FmCall::Activate(id),
            b"fmActivateFabricPartition\0",
            "fmActivateFabricPartition",
            id,
        )
    }

    /// `fmDeactivateFabricPartition`.
    pub fn deactivate(&self, id: u32) -> Result<(), FmError> {
        self.with_id(
            FmCall::Deactivate(id),
            b"fmDeactivateFabricPartition\0",
            "fmDeactivateFabricPartition",
            id,
        )
    }

    /// `fmSetActivatedFabricPartitions`: after an FM restart, the partitions still active
    /// (possibly none: FM wants the call then too).
    pub fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        let call = FmCall::SetActivated;
        if ids.len() > abi::MAX_FABRIC_PARTITIONS {
            return Err(FmError::NotMade {
                call,
                address: self.address.clone(),
                why: format!(
                    "vfio-p2p's partition record lists {} active partitions, more than the {} FM has and this call takes (FM_MAX_FABRIC_PARTITIONS): the record (fabric.json under /run/vfio-p2p) is not one vfio-p2p wrote; compare it with `vfio-p2p fabric list` and remove the partitions FM does not list",
                    ids.len(),
                    abi::MAX_FABRIC_PARTITIONS
                ),
            });
        }
        let f: WithStruct<abi::ActivatedPartitionList> = self.symbol(
            b"fmSetActivatedFabricPartitions\0",
            "fmSetActivatedFabricPartitions",
        )?;
        let mut list = abi::zeroed_box::<abi::ActivatedPartitionList>();
        list.version = abi::param_version::<abi::ActivatedPartitionList>(1);
        list.num_partitions = ids.len() as c_uint;
        list.partition_ids[..ids.len()].copy_from_slice(ids);
        // SAFETY: the handle came from fmConnect; list is a valid, versioned
        // fmActivatedFabricPartitionList_v1 alive for the call.
        let rc = unsafe { f(self.handle, &mut *list) };
        self.check(call, rc)
    }
}

impl Drop for Connection {
    /// fmDisconnect when connected, then fmLibShutdown when initialized.
    fn drop(&mut self) {
        if !self.handle.is_null() {
            if let Ok(f) = self.symbol::<WithHandle>(b"fmDisconnect\0", "fmDisconnect") {
                // SAFETY: the handle came from fmConnect and is not used after this.
                let _ = unsafe { f(self.handle) };
            }
            self.handle = std::ptr::null_mut();
        }
        if self.initialized {
            if let Ok(f) = self.symbol::<NoArgs>(b"fmLibShutdown\0", "fmLibShutdown") {
                // SAFETY: fmLibShutdown takes no arguments; fmLibInit succeeded.
                let _: c_int = unsafe { f() };
            }
            self.initialized = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FmFailure;

    #[test]
    fn an_absent_library_is_no_fm_and_a_broken_one_says_dlerrors_reason() {
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join("libnvfm.so.1");
        std::fs::write(&junk, "not an ELF").unwrap();
        let load = |p: &str| {
            // SAFETY: the file is no ELF library (nothing to run) or absent.
            let e = unsafe { Library::new(p) }.unwrap_err();
            load_error(p, &e, "")
        };
        let broken = load(&junk.display().to_string());
        assert_eq!(broken.failure(), FmFailure::Unreachable);
        assert!(broken.to_string().contains("file too short"), "{broken}");
        let absent = load("/nonexistent/libnvfm.so.1");
        assert_eq!(absent.failure(), FmFailure::NoLibrary);
        assert!(
            absent.to_string().contains("No such file or directory"),
            "{absent}"
        );
    }

    #[test]
    fn addresses_become_fm_connect_targets() {
        assert_eq!(
            connect_target("127.0.0.1:6666"),
            ("127.0.0.1:6666".to_string(), false)
        );
        assert_eq!(
            connect_target("unix:/run/nvidia-fabricmanager/fm.sock"),
            ("/run/nvidia-fabricmanager/fm.sock".to_string(), true)
        );
    }
}
