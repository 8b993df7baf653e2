//! NVML, opened at run time when present, to tell NVLink from PCIe paths.
//!
//! CUDA says whether peers can talk, not over what; NVML knows the links. It is
//! optional: without libnvidia-ml the link kind is reported as unknown.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use libloading::{Library, Symbol};
use pci_config::Bdf;
use serde::{Deserialize, Serialize};
use vfio_p2p_load_failure::{reason, LoadFailure};

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;
const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_P2P_CAPS_INDEX_NVLINK`.
const P2P_CAPS_NVLINK: c_int = 2;
/// `NVML_P2P_STATUS_OK`.
const P2P_STATUS_OK: c_int = 0;
/// More than any GPU has (`NVML_NVLINK_MAX_LINKS` is 18 today); unused indices error out.
const MAX_LINKS: c_uint = 32;

/// `nvmlPciInfo_t` (v3 layout, as `nvmlDeviceGetNvLinkRemotePciInfo_v2` fills it).
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlGpuFabricInfo_t`: the GPU's registration with the NVSwitch fabric.
#[repr(C)]
struct GpuFabricInfo {
    cluster_uuid: [u8; 16],
    /// An `nvmlReturn_t`: the probe's error, meaningful once `state` is completed.
    status: c_int,
    clique_id: c_uint,
    /// `nvmlGpuFabricState_t` (an unsigned char).
    state: u8,
}

/// What NVML says of one GPU's place on the NVSwitch fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    /// `NVML_GPU_FABRIC_STATE_*`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The registration's `nvmlReturn_t` (0: success).
    pub status: i32,
    pub clique_id: u32,
    /// The cluster's UUID, hex (all zeros outside a multi-node cluster).
    pub cluster_uuid: String,
}

/// How two GPUs are connected, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Active NVLinks from one GPU to the other (0: none, the path is PCIe).
    pub nvlinks: u32,
    /// `nvidia-smi topo -m` style label of the PCIe path: PIX, PXB, PHB, NODE, SYS,
    /// or `NV#` for NVLink.
    pub label: String,
}

pub struct Nvml {
    lib: Library,
}

/// NVML's library as the NVIDIA driver installs it.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// Why NVML is not available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The library is not installed (NVML is optional: the caller may stay silent).
    Absent,
    /// The library is there but does not load: dlerror's reason and the fix.
    Unloadable(LoadFailure),
    /// The library loaded but NVML did not start (`nvmlInit_v2` missing or failed).
    NotStarted(String),
}

impl Unavailable {
    pub fn is_absent(&self) -> bool {
        matches!(self, Unavailable::Absent)
    }
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Absent => write!(f, "NVML ({LIBRARY}) is not installed"),
            Unavailable::Unloadable(why) => write!(f, "NVML: {why}"),
            Unavailable::NotStarted(why) => write!(f, "NVML ({LIBRARY}) did not start: {why}"),
        }
    }
}

impl Nvml {
    /// Opens and initialises NVML, or says why not.
    pub fn open() -> Result<Nvml, Unavailable> {
        Nvml::open_library(LIBRARY)
    }

    fn open_library(library: &str) -> Result<Nvml, Unavailable> {
        // SAFETY: loading the NVIDIA management library runs no initialiser with
        // preconditions; nvmlInit_v2 is its documented first call.
        let lib =
            unsafe { Library::new(library) }.map_err(|e| match LoadFailure::new(library, &e) {
                f if f.is_absent() => Unavailable::Absent,
                f => Unavailable::Unloadable(f),
            })?;
        // SAFETY: nvmlInit_v2 takes no arguments (nvml.h).
        let rc = unsafe {
            let init: Symbol<unsafe extern "C" fn() -> NvmlReturn> =
                lib.get(b"nvmlInit_v2").map_err(|e| {
                    Unavailable::NotStarted(format!("{library} has no nvmlInit_v2: {}", reason(&e)))
                })?;
            init()
        };
        if rc != NVML_SUCCESS {
            return Err(Unavailable::NotStarted(format!(
                "nvmlInit_v2: {}",
                error_text(&lib, rc)
            )));
        }
        Ok(Nvml { lib })
    }

    fn device(&self, bdf: Bdf) -> Option<NvmlDevice> {
        let id = CString::new(bdf.to_string()).ok()?;
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: symbol signature as in nvml.h; id is NUL-terminated, dev a valid out pointer.
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn> =
                self.lib.get(b"nvmlDeviceGetHandleByPciBusId_v2").ok()?;
            (f(id.as_ptr(), &mut dev) == NVML_SUCCESS).then_some(dev)
        }
    }

    /// The link between `a` and `b`, or `None` when NVML does not know the GPUs.
    pub fn link(&self, a: Bdf, b: Bdf) -> Option<Link> {
        let (da, db) = (self.device(a)?, self.device(b)?);
        let mut nvlinks = 0;
        // SAFETY: signatures as in nvml.h; out pointers are valid locals, da/db handles from NVML.
        unsafe {
            let state: Symbol<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> NvmlReturn> =
                self.lib.get(b"nvmlDeviceGetNvLinkState").ok()?;
            let remote: Symbol<
                unsafe extern "C" fn(NvmlDevice, c_uint, *mut PciInfo) -> NvmlReturn,
            > = self.lib.get(b"nvmlDeviceGetNvLinkRemotePciInfo_v2").ok()?;
            let mut active_links = 0;
            for link in 0..MAX_LINKS {
                let mut active = 0;
                if state(da, link, &mut active) != NVML_SUCCESS || active == 0 {
                    continue;
                }
                active_links += 1;
                let mut pci: PciInfo = std::mem::zeroed();
                if remote(da, link, &mut pci) == NVML_SUCCESS
                    && pci.domain == b.domain as c_uint
                    && pci.bus == b.bus as c_uint
                    && pci.device == b.device as c_uint
                {
                    nvlinks += 1;
                }
            }
            if nvlinks == 0 {
                // Behind NVSwitches the links end at a switch, not at the peer (whose
                // address the guest may not see either); NVLink P2P then uses all of
                // them, which is how `nvidia-smi topo -m` counts them too.
                let p2p: Symbol<
                    unsafe extern "C" fn(NvmlDevice, NvmlDevice, c_int, *mut c_int) -> NvmlReturn,
                > = self.lib.get(b"nvmlDeviceGetP2PStatus").ok()?;
                let mut status = -1;
                if p2p(da, db, P2P_CAPS_NVLINK, &mut status) == NVML_SUCCESS
                    && status == P2P_STATUS_OK
                {
                    return Some(Link {
                        nvlinks: active_links,
                        label: format!("NV{active_links}"),
                    });
                }
            }
            if nvlinks > 0 {
                return Some(Link {
                    nvlinks,
                    label: format!("NV{nvlinks}"),
                });
            }
        }
        let label = self.common_ancestor(a, b).unwrap_or_else(|| "PCIe".into());
        Some(Link { nvlinks: 0, label })
    }

    /// The text NVML gives a return code.
    fn error_text(&self, r: NvmlReturn) -> String {
        error_text(&self.lib, r)
    }

    /// The GPU's physical module id on its baseboard (`nvmlDeviceGetModuleId`).
    pub fn module_id(&self, bdf: Bdf) -> Result<u32, String> {
        let dev = self
            .device(bdf)
            .ok_or_else(|| format!("NVML does not know GPU {bdf}"))?;
        let mut id: c_uint = 0;
        // SAFETY: signature as in nvml.h; id is a valid out pointer, dev an NVML handle.
        let r = unsafe {
            let f: Symbol<unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn> = self
                .lib
                .get(b"nvmlDeviceGetModuleId")
                .map_err(|_| "this NVML has no nvmlDeviceGetModuleId (driver before R525)")?;
            f(dev, &mut id)
        };
        if r == NVML_SUCCESS {
            Ok(id)
        } else {
            Err(self.error_text(r))
        }
    }

    /// The GPU's fabric registration (`nvmlDeviceGetGpuFabricInfo`).
    pub fn fabric_info(&self, bdf: Bdf) -> Result<FabricInfo, String> {
        let dev = self
            .device(bdf)
            .ok_or_else(|| format!("NVML does not know GPU {bdf}"))?;
        // SAFETY: an all-zero GpuFabricInfo is a valid value of the plain C struct.
        let mut info: GpuFabricInfo = unsafe { std::mem::zeroed() };
        // SAFETY: signature as in nvml.h; info is a valid out pointer of the v1 layout.
        let r = unsafe {
            let f: Symbol<unsafe extern "C" fn(NvmlDevice, *mut GpuFabricInfo) -> NvmlReturn> =
                self.lib.get(b"nvmlDeviceGetGpuFabricInfo").map_err(|_| {
                    "this NVML has no nvmlDeviceGetGpuFabricInfo (driver before R525)"
                })?;
            f(dev, &mut info)
        };
        if r != NVML_SUCCESS {
            return Err(self.error_text(r));
        }
        Ok(FabricInfo {
            state: info.state,
            status: info.status,
            clique_id: info.clique_id,
            cluster_uuid: info
                .cluster_uuid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
    }

    /// The driver's version as NVML prints it (`580.159.04`).
    pub fn driver_version(&self) -> Option<String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: signature as in nvml.h; buf has the length passed.
        unsafe {
            let f: Symbol<unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn> =
                self.lib.get(b"nvmlSystemGetDriverVersion").ok()?;
            if f(buf.as_mut_ptr(), buf.len() as c_uint) != NVML_SUCCESS {
                return None;
            }
        }
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// NVML's PCIe label of the pair (its common ancestor: PIX, PXB, PHB, NODE, SYS),
    /// or `None` when NVML does not know the GPUs or the answer.
    pub fn common_ancestor(&self, a: Bdf, b: Bdf) -> Option<String> {
        let (da, db) = (self.device(a)?, self.device(b)?);
        // SAFETY: signature as in nvml.h; level is a valid out pointer, da/db NVML handles.
        unsafe {
            let ancestor: Symbol<
                unsafe extern "C" fn(NvmlDevice, NvmlDevice, *mut c_int) -> NvmlReturn,
            > = self.lib.get(b"nvmlDeviceGetTopologyCommonAncestor").ok()?;
            let mut level = -1;
            (ancestor(da, db, &mut level) == NVML_SUCCESS).then(|| topology_label(level))
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balances nvmlInit_v2 in open().
        unsafe {
            if let Ok(f) = self
                .lib
                .get::<unsafe extern "C" fn() -> NvmlReturn>(b"nvmlShutdown")
            {
                f();
            }
        }
    }
}

/// The text NVML's library `lib` gives a return code.
fn error_text(lib: &Library, r: NvmlReturn) -> String {
    // SAFETY: signature as in nvml.h; the string returned is static in the library.
    let text = unsafe {
        lib.get::<unsafe extern "C" fn(NvmlReturn) -> *const c_char>(b"nvmlErrorString")
            .ok()
            .map(|f| f(r))
            .filter(|p| !p.is_null())
            .map(|p| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    match text {
        Some(t) => format!("NVML error {r} ({t})"),
        None => format!("NVML error {r}"),
    }
}

/// `nvmlGpuTopologyLevel_t` to the labels of `nvidia-smi topo -m`.
fn topology_label(level: c_int) -> String {
    match level {
        0 | 10 => "PIX",
        20 => "PXB",
        30 => "PHB",
        40 => "NODE",
        50 => "SYS",
        _ => "PCIe",
    }
    .into()
}

impl Link {
    pub fn is_nvlink(&self) -> bool {
        self.label.starts_with("NV")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_info_layout_matches_nvml_h() {
        assert_eq!(std::mem::size_of::<PciInfo>(), 16 + 5 * 4 + 32);
        assert_eq!(std::mem::offset_of!(PciInfo, bus_id), 36);
    }

    #[test]
    fn fabric_info_layout_matches_nvml_h() {
        // unsigned char[16], nvmlReturn_t, unsigned int, unsigned char; padded to 4.
        assert_eq!(std::mem::size_of::<GpuFabricInfo>(), 28);
        assert_eq!(std::mem::offset_of!(GpuFabricInfo, status), 16);
        assert_eq!(std::mem::offset_of!(GpuFabricInfo, clique_id), 20);
        assert_eq!(std::mem::offset_of!(GpuFabricInfo, state), 24);
    }

    #[test]
    fn labels() {
        assert_eq!(topology_label(10), "PIX");
        assert_eq!(topology_label(30), "PHB");
        assert_eq!(topology_label(50), "SYS");
        assert!(Link {
            nvlinks: 18,
            label: "NV18".into()
        }
        .is_nvlink());
        assert!(!Link {
            nvlinks: 0,
            label: "PHB".into()
        }
        .is_nvlink());
    }

    #[test]
    fn an_absent_library_is_absent_and_a_broken_one_says_dlerrors_reason() {
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join(LIBRARY);
        std::fs::write(&junk, "not an ELF").unwrap();
        let broken = Nvml::open_library(&junk.display().to_string())
            .err()
            .unwrap();
        assert!(!broken.is_absent(), "{broken}");
        let text = broken.to_string();
        assert!(text.contains(&junk.display().to_string()), "{text}");
        assert!(text.contains("file too short"), "{text}");
        let absent = Nvml::open_library("/nonexistent/libnvidia-ml.so.1")
            .err()
            .unwrap();
        assert_eq!(absent, Unavailable::Absent);
        assert_eq!(
            absent.to_string(),
            "NVML (libnvidia-ml.so.1) is not installed"
        );
    }
}
