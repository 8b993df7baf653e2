//! The host↔guest contract of vfio-p2p, defined once for both binaries.
//!
//! The host tool (`vfio-p2p gen`) writes an [`Expectation`] for each VM: which GPU sits
//! at which guest address with which clique, and which pairs should reach each other
//! over P2P. QEMU hands it to the guest through fw_cfg as [`FW_CFG_NAME`]; the guest
//! agent reads it at [`FW_CFG_SYSFS_PATH`] (or from `--expect FILE`) and compares it
//! with its own scan. The clique itself travels as the vfio-pci property
//! [`CLIQUE_PROPERTY`].
//!
//! # Wire format (version 1)
//!
//! One JSON object, compact, optionally followed by NUL padding (fw_cfg):
//!
//! ```json
//! {"version":1,"vm":"vm0",
//!  "gpus":[{"host_bdf":"0000:41:00.0","guest_bdf":"0000:06:00.0","clique":0,
//!           "vendor":"0x10de","device":"0x2330"}],
//!  "pairs":[{"a":"0000:06:00.0","b":"0000:07:00.0","verdict":"p2p","path":"PIX","nvlink":null,
//!            "guest_path":"PIX"}]}
//! ```
//!
//! `path` is the host's label of the pair (`nvidia-smi topo -m` without NVLink);
//! `guest_path` (optional) the label the host's guest tree should give it in the guest.
//!
//! # Version rule
//!
//! * A new field that an older reader may safely ignore is added **without** a version
//!   change: give it `#[serde(default)]` (and `skip_serializing_if` when it has an
//!   "absent" value), so an older host's document still reads. Readers ignore unknown
//!   fields, so an older agent still reads a newer host's document.
//! * Anything an older reader would misread (a field removed, renamed, retyped, or given
//!   a new meaning) bumps [`EXPECTATION_VERSION`]; readers refuse other versions with an
//!   error naming both.
//!
//! `tests/compat.rs` pins both directions.

#![forbid(unsafe_code)]

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

mod guest_report;
pub mod nvidia_parts;
mod pci_id;
pub mod prometheus;

pub use guest_report::{
    GuestReport, GuestReportError, ReportChannel, ReportedFabric, ReportedGpu, ReportedPair,
    DEFAULT_REPORT_PORT, GUEST_REPORT_VERSION, HOST_CID, MAX_FABRIC_PROBLEMS,
    MAX_GUEST_REPORT_BYTES, MAX_PROBLEM_TEXT,
};
pub use pci_id::PciId;

macro_rules! fw_cfg_name {
    () => {
        "opt/vfio-p2p/expect.json"
    };
}

/// The fw_cfg file name the host gives QEMU (`-fw_cfg name=…`).
pub const FW_CFG_NAME: &str = fw_cfg_name!();

/// Where the guest's `qemu_fw_cfg` module shows that file, relative to the sysfs root
/// (the parent of `sys/`).
pub const FW_CFG_SYSFS_PATH: &str =
    concat!("sys/firmware/qemu_fw_cfg/by_name/", fw_cfg_name!(), "/raw");

/// The vfio-pci device property (patched QEMU) that makes the GPU carry a clique.
pub const CLIQUE_PROPERTY: &str = "x-nv-gpudirect-clique";

/// The format version written by this build, and the only one it reads.
pub const EXPECTATION_VERSION: u32 = 1;

/// The largest expectation a reader needs to take in. A 64-GPU VM with every pair is
/// about 250 KiB; anything beyond this is not an expectation.
pub const MAX_EXPECTATION_BYTES: u64 = 4 << 20;

/// What the host expects the guest to see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    pub version: u32,
    /// The VM's name on the host.
    pub vm: String,
    pub gpus: Vec<ExpectedGpu>,
    /// Unordered GPU pairs (guest addresses); optional in the document.
    #[serde(default)]
    pub pairs: Vec<ExpectedPair>,
    /// Where the agent sends its report (`report --send`); absent: it does not send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<ReportChannel>,
    /// The NVSwitch fabric the VM's GPUs were planned on (a Fabric Manager partition);
    /// absent: no fabric (PCIe or direct NVLink only), and the agent checks none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<ExpectedFabric>,
    /// The guest's NUMA nodes as the host built them where GPU memory is a NUMA node
    /// (Grace: CPU nodes first, then each GPU's memory node and its generic-initiator
    /// companions); absent elsewhere, and the agent checks no nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<ExpectedNuma>,
}

/// The guest NUMA topology a Grace VM was given (#38).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedNuma {
    /// How many nodes the guest has, `0..nodes` (CPU nodes first).
    pub nodes: u32,
    /// `distances[i][j]`: the SLIT distance from guest node `i` to `j`, as
    /// `/sys/devices/system/node/nodeI/distance` lists it; `nodes` rows of `nodes`.
    pub distances: Vec<Vec<u32>>,
}

/// The Fabric Manager partition a VM was given (shared-NVSwitch model) or the
/// full-passthrough baseboard, as the host planned it. The agent compares it with
/// NVML's fabric info (state, status) and each GPU's module id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedFabric {
    /// `shared-nvswitch` or `full-passthrough`.
    pub model: String,
    /// FM's partition id; `null` under full passthrough (FM runs in the guest).
    pub partition_id: Option<u32>,
    /// The Fabric Manager version on the host (the guest driver must be the same
    /// version); `null` when the host could not tell.
    pub fm_version: Option<String>,
}

/// One passed-through GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedGpu {
    pub host_bdf: Bdf,
    /// The address the guest sees the GPU at.
    pub guest_bdf: Bdf,
    /// The clique the hypervisor was told to emulate, 0..=15; `null`: no capability.
    pub clique: Option<u8>,
    pub vendor: PciId,
    pub device: PciId,
    /// The GPU's physical module id on its baseboard (NVML's `nvmlDeviceGetModuleId`,
    /// FM's physical id), when the host planned on a fabric; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_id: Option<u32>,
    /// The guest NUMA nodes tied to this GPU by `acpi-generic-initiator` (Grace: its
    /// memory node and companions, each without CPUs and memory), in guest node ids;
    /// empty where GPUs are not NUMA nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<u32>,
}

/// Whether P2P should work between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    P2p,
    NoP2p,
}

/// One pair of GPUs, by guest address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedPair {
    pub a: Bdf,
    pub b: Bdf,
    pub verdict: Verdict,
    /// The host's path label, `nvidia-smi topo -m` style (PIX, PXB, PHB, NODE, SYS).
    pub path: String,
    /// The number of NVLinks between the two on the host; `null` when none.
    pub nvlink: Option<u8>,
    /// The label the host predicts the guest will see for this pair, from the guest
    /// tree it emitted; equal to `path` unless the host warned that it could not mirror
    /// the pair. Absent in documents from hosts before it (an additive field: version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_path: Option<String>,
}

/// Why a document is not a usable expectation.
#[derive(Debug, thiserror::Error)]
pub enum ExpectationError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("format version {found}; this build reads version {EXPECTATION_VERSION}")]
    Version { found: u32 },
    #[error("{what} {bdf} is listed twice; each GPU and pair appears once")]
    Duplicate { what: &'static str, bdf: String },
    #[error("numa: {0}")]
    Numa(String),
}

impl Expectation {
    /// An empty expectation of the current version.
    pub fn new(vm: impl Into<String>) -> Self {
        Expectation {
            version: EXPECTATION_VERSION,
            vm: vm.into(),
            gpus: Vec::new(),
            pairs: Vec::new(),
            report: None,
            fabric: None,
            numa: None,
        }
    }

    /// Compact JSON, as written to the fw_cfg file.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serializes")
    }

    /// Reads a document: trailing NULs (fw_cfg padding) are ignored, unknown fields
    /// too (see the version rule), and any version but [`EXPECTATION_VERSION`] is refused.
    pub fn from_json(text: &str) -> Result<Self, ExpectationError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let text = text.trim_end_matches('\0');
        let Versioned { version } = serde_json::from_str(text)?;
        if version != EXPECTATION_VERSION {
            return Err(ExpectationError::Version { found: version });
        }
        let e: Expectation = serde_json::from_str(text)?;
        e.refuse_duplicates()?;
        e.refuse_inconsistent_numa()?;
        Ok(e)
    }

    /// One entry per guest GPU and per unordered pair: a document listing one twice (or
    /// 100,000 times) is not one the host wrote.
    fn refuse_duplicates(&self) -> Result<(), ExpectationError> {
        let mut gpus = std::collections::BTreeSet::new();
        for g in &self.gpus {
            if !gpus.insert(g.guest_bdf) {
                return Err(ExpectationError::Duplicate {
                    what: "GPU",
                    bdf: g.guest_bdf.to_string(),
                });
            }
        }
        let mut pairs = std::collections::BTreeSet::new();
        for p in &self.pairs {
            if !pairs.insert((p.a.min(p.b), p.a.max(p.b))) {
                return Err(ExpectationError::Duplicate {
                    what: "pair",
                    bdf: format!("{} {}", p.a, p.b),
                });
            }
        }
        Ok(())
    }

    /// The NUMA block is a square matrix of `nodes` rows, and every GPU's node is one
    /// of them and belongs to that GPU alone; GPU nodes without a NUMA block are refused.
    fn refuse_inconsistent_numa(&self) -> Result<(), ExpectationError> {
        let nodes = match &self.numa {
            Some(n) => n.nodes,
            None if self.gpus.iter().all(|g| g.numa_nodes.is_empty()) => return Ok(()),
            None => {
                return Err(ExpectationError::Numa(
                    "GPUs name nodes but no node table is given".into(),
                ))
            }
        };
        let numa = self.numa.as_ref().expect("matched above");
        if numa.distances.len() != nodes as usize
            || numa.distances.iter().any(|row| row.len() != nodes as usize)
        {
            return Err(ExpectationError::Numa(format!(
                "distances is not {nodes} rows of {nodes}"
            )));
        }
        let mut owner = std::collections::BTreeMap::new();
        for g in &self.gpus {
            for &n in &g.numa_nodes {
                if n >= nodes {
                    return Err(ExpectationError::Numa(format!(
                        "GPU {} names node {n}; the guest has nodes 0..{nodes}",
                        g.guest_bdf
                    )));
                }
                if let Some(other) = owner.insert(n, g.guest_bdf) {
                    return Err(ExpectationError::Numa(format!(
                        "node {n} is given to both {other} and {}",
                        g.guest_bdf
                    )));
                }
            }
        }
        Ok(())
    }

    /// The pair of `a` and `b`, in either order.
    pub fn pair(&self, a: Bdf, b: Bdf) -> Option<&ExpectedPair> {
        self.pairs
            .iter()
            .find(|p| (p.a == a && p.b == b) || (p.a == b && p.b == a))
    }

    /// The GPU the guest should see at `guest`.
    pub fn gpu_at(&self, guest: Bdf) -> Option<&ExpectedGpu> {
        self.gpus.iter().find(|g| g.guest_bdf == guest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicated_entries_are_refused() {
        let mut e = Expectation::new("vm");
        let g = ExpectedGpu {
            host_bdf: "0000:41:00.0".parse().unwrap(),
            guest_bdf: "0000:01:00.0".parse().unwrap(),
            clique: None,
            vendor: PciId(0x10de),
            device: PciId(0x2330),
            module_id: None,
            numa_nodes: Vec::new(),
        };
        e.gpus = vec![g.clone(), g];
        let err = Expectation::from_json(&e.to_json())
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU 0000:01:00.0 is listed twice"), "{err}");
    }

    #[test]
    fn fw_cfg_path_is_below_by_name() {
        assert_eq!(
            FW_CFG_SYSFS_PATH,
            "sys/firmware/qemu_fw_cfg/by_name/opt/vfio-p2p/expect.json/raw"
        );
    }

    #[test]
    fn a_newer_version_is_refused_before_its_fields_are_read() {
        let e = Expectation::from_json(r#"{"version":2,"gpus":"whatever"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "format version 2; this build reads version 1"
        );
    }

    #[test]
    fn bad_addresses_are_refused() {
        let e = Expectation::from_json(
            r#"{"version":1,"vm":"x","gpus":[{"host_bdf":"../x","guest_bdf":"0000:06:00.0",
                "clique":null,"vendor":"0x10de","device":"0x2330"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("'../x' is not a PCI address"), "{e}");
    }
}
