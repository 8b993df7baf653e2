//! NVIDIA Fabric Manager's view of an NVSwitch board, as the readers make it: its
//! partitions (`read::fm_capture`, FM's live API, the embedded examples' tables) and
//! its config file (`read::fm_config`), and on NVLink-5 boards the NVLink Subnet Manager
//! beside it (`read::host_probe::nvlsm`).
//!
//! FM names a GPU by its *physical id* (the baseboard module id NVML reports as
//! `nvmlDeviceGetModuleId`) and, when FM can see it, its PCI address.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

/// `FM_MAX_FABRIC_PARTITIONS`: the most partitions FM lists (its SDK's array size).
pub const MAX_PARTITIONS: usize = 64;

/// One GPU of a partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionGpu {
    /// FM's physical id: the baseboard module id (1-based on HGX boards).
    pub module_id: u32,
    /// The GPU's PCI address on the host, when known (FM lists it; an embedded table
    /// maps module ids to the example's addresses).
    #[serde(default)]
    pub bdf: Option<Bdf>,
    /// NVLinks of this GPU that FM found trained / the most it can have.
    #[serde(default)]
    pub nvlinks_available: u32,
    #[serde(default)]
    pub nvlinks_max: u32,
}

/// One of FM's predefined partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPartition {
    pub id: u32,
    pub gpus: Vec<PartitionGpu>,
    /// Activated (for some VM) right now.
    #[serde(default)]
    pub active: bool,
}

/// Everything FM says about the board, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricState {
    /// FM's version, when the source tells it.
    #[serde(default)]
    pub fm_version: Option<String>,
    /// The partitions FM supports on this board as it is now.
    pub partitions: Vec<FabricPartition>,
    /// Partition ids FM lists as unsupported (a GPU or NVSwitch missing or degraded).
    #[serde(default)]
    pub unsupported: Vec<u32>,
    /// GPUs (by PCI address) with NVLinks FM could not train.
    #[serde(default)]
    pub nvlink_failed_gpus: Vec<Bdf>,
}

impl FabricPartition {
    /// The partition's GPUs by PCI address, sorted; `None` when FM did not tell one.
    pub fn bdfs(&self) -> Option<Vec<Bdf>> {
        let mut all: Vec<Bdf> = self.gpus.iter().map(|g| g.bdf).collect::<Option<_>>()?;
        all.sort_unstable();
        Some(all)
    }

    /// Module ids, sorted, as FM's tables write them (`1, 3`).
    pub fn module_list(&self) -> String {
        let mut ids: Vec<u32> = self.gpus.iter().map(|g| g.module_id).collect();
        ids.sort_unstable();
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl FabricState {
    /// The partition whose GPUs are exactly `gpus` (any order).
    pub fn partition_of(&self, gpus: &[Bdf]) -> Option<&FabricPartition> {
        let mut want = gpus.to_vec();
        want.sort_unstable();
        want.dedup();
        self.partitions
            .iter()
            .find(|p| p.bdfs().is_some_and(|b| b == want))
    }

    /// Gives every GPU FM listed without a PCI address (H100 and later boards) the one
    /// host.yaml's `fabric_manager: modules:` maps its module id to.
    pub fn apply_module_addresses(&mut self, modules: &std::collections::BTreeMap<u32, Bdf>) {
        for g in self.partitions.iter_mut().flat_map(|p| &mut p.gpus) {
            if g.bdf.is_none() {
                g.bdf = modules.get(&g.module_id).copied();
            }
        }
    }

    /// Whether FM's answer can be trusted, whatever its source (live API, `fmpm -l`
    /// capture, vfio-p2p's JSON, an example's table): partition ids unique and within FM's
    /// limit, each module once per partition, and one PCI address per module id and one
    /// module id per PCI address across all partitions. `Err` says what is wrong, to be
    /// prefixed with the source.
    pub fn check(&self) -> Result<(), String> {
        use std::collections::{btree_map::Entry, BTreeMap, BTreeSet};
        if self.partitions.len() > MAX_PARTITIONS {
            return Err(format!(
                "{} partitions, more than Fabric Manager's {MAX_PARTITIONS} (FM_MAX_FABRIC_PARTITIONS): not a Fabric Manager partition list",
                self.partitions.len()
            ));
        }
        let mut ids = BTreeSet::new();
        let mut module_of: BTreeMap<Bdf, u32> = BTreeMap::new();
        let mut bdf_of: BTreeMap<u32, Bdf> = BTreeMap::new();
        for p in &self.partitions {
            if !ids.insert(p.id) {
                return Err(format!(
                    "partition {} is listed twice: FM's partition ids are unique",
                    p.id
                ));
            }
            let mut modules = BTreeSet::new();
            for g in &p.gpus {
                if !modules.insert(g.module_id) {
                    return Err(format!(
                        "partition {}: module {} is listed twice",
                        p.id, g.module_id
                    ));
                }
                let Some(bdf) = g.bdf else { continue };
                match module_of.entry(bdf) {
                    Entry::Occupied(e) if *e.get() != g.module_id => {
                        return Err(format!(
                            "{bdf} is listed as module {} and as module {} (partition {}): one GPU has one module id",
                            e.get(),
                            g.module_id,
                            p.id
                        ));
                    }
                    e => {
                        e.or_insert(g.module_id);
                    }
                }
                match bdf_of.entry(g.module_id) {
                    Entry::Occupied(e) if *e.get() != bdf => {
                        return Err(format!(
                            "module {} is listed at {} and at {bdf} (partition {}): one module id has one PCI address",
                            g.module_id,
                            e.get(),
                            p.id
                        ));
                    }
                    e => {
                        e.or_insert(bdf);
                    }
                }
            }
        }
        Ok(())
    }

    /// A GPU's module id, from any partition that lists it.
    pub fn module_id(&self, bdf: &Bdf) -> Option<u32> {
        self.partitions
            .iter()
            .flat_map(|p| &p.gpus)
            .find(|g| g.bdf.as_ref() == Some(bdf))
            .map(|g| g.module_id)
    }
}

/// host.yaml's `fabric_manager: modules:` (module id → PCI address) against the host's
/// NVIDIA GPUs: every address must be one of them, or FM's partition would reach (and
/// `fabric activate` reset) another device.
pub fn check_module_map(
    modules: &std::collections::BTreeMap<u32, Bdf>,
    nvidia_gpus: &[Bdf],
) -> Result<(), String> {
    match modules.iter().find(|(_, b)| !nvidia_gpus.contains(b)) {
        Some((m, b)) => Err(format!(
            "fabric_manager.modules maps module {m} to {b}, which is no NVIDIA GPU on this host: give each module id its GPU's address (`vfio-p2p topo` lists the GPUs)"
        )),
        None => Ok(()),
    }
}

/// Fabric Manager's config file on the host, as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FmConfigFile {
    /// Not looked at (an embedded example, a snapshot file): why.
    NotProbed(String),
    /// No `fabricmanager.cfg`: FM is not installed on this host.
    Absent,
    /// `FABRIC_MODE=` as written (`None`: missing, FM's default 0, bare metal).
    Present {
        path: String,
        fabric_mode: Option<u8>,
    },
    /// The last `FABRIC_MODE=` line (the one FM uses) holds no mode FM knows (0, 1, 2):
    /// what it holds, in words.
    Invalid { path: String, message: String },
}

/// The NVLink Subnet Manager (NVLSM) beside Fabric Manager on an NVLink-5 board
/// (`read::host_probe::nvlsm`), as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlsmProbe {
    /// Not looked at (an example, a snapshot, no NVLink-5 GPU on the host): why.
    NotProbed(String),
    Probed(NvlsmFacts),
}

/// What the host shows of NVLSM and Fabric Manager: installed files, ib_umad, the
/// running daemons.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NvlsmFacts {
    /// NVLSM's binary, where installed.
    pub nvlsm_binary: Option<String>,
    /// Fabric Manager's binary, where installed.
    pub fm_binary: Option<String>,
    /// `/sys/class/infiniband_mad` exists: `ib_umad` is loaded, without which NVLSM
    /// cannot send its management datagrams.
    pub umad: bool,
    /// The running `nvlsm`, if any.
    pub nvlsm: Option<Daemon>,
    /// The running `nv-fabricmanager`, if any.
    pub fm: Option<Daemon>,
}

/// A running daemon, from `/proc/PID/cmdline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Daemon {
    pub pid: u32,
    /// The management port GUID on its command line (`-g`, `--guid`,
    /// `--fm-sm-mgmt-port-guid`): the ConnectX-7 bridge port FM and NVLSM must share.
    pub port_guid: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(module_id: u32, bus: u8) -> PartitionGpu {
        PartitionGpu {
            module_id,
            bdf: Some(Bdf::new(0, bus, 0, 0)),
            nvlinks_available: 18,
            nvlinks_max: 18,
        }
    }

    fn state(partitions: &[(u32, Vec<PartitionGpu>)]) -> FabricState {
        FabricState {
            partitions: partitions
                .iter()
                .map(|(id, gpus)| FabricPartition {
                    id: *id,
                    gpus: gpus.clone(),
                    active: false,
                })
                .collect(),
            ..FabricState::default()
        }
    }

    #[test]
    fn every_source_is_checked_for_what_fm_never_says() {
        let good = state(&[(0, vec![gpu(1, 5), gpu(2, 6)]), (1, vec![gpu(1, 5)])]);
        assert_eq!(good.check(), Ok(()));
        let twice = state(&[(1, vec![gpu(1, 5)]), (1, vec![gpu(2, 6)])]);
        assert!(twice
            .check()
            .unwrap_err()
            .contains("partition 1 is listed twice"));
        let two_ids = state(&[(0, vec![gpu(1, 5), gpu(2, 6)]), (1, vec![gpu(3, 5)])]);
        assert_eq!(
            two_ids.check().unwrap_err(),
            "0000:05:00.0 is listed as module 1 and as module 3 (partition 1): one GPU has one module id"
        );
        let two_addresses = state(&[(0, vec![gpu(1, 5)]), (1, vec![gpu(1, 6)])]);
        assert!(two_addresses
            .check()
            .unwrap_err()
            .contains("module 1 is listed at 0000:05:00.0 and at 0000:06:00.0"));
        let module_twice = state(&[(0, vec![gpu(1, 5), gpu(1, 5)])]);
        assert!(module_twice.check().is_err());
        let many: Vec<(u32, Vec<PartitionGpu>)> = (0..65).map(|i| (i, vec![])).collect();
        assert!(state(&many).check().unwrap_err().contains("65 partitions"));
        let limit: Vec<(u32, Vec<PartitionGpu>)> = (0..64).map(|i| (i, vec![])).collect();
        assert_eq!(state(&limit).check(), Ok(()));
        let gpus = [Bdf::new(0, 5, 0, 0)];
        assert_eq!(check_module_map(&[(1, gpus[0])].into(), &gpus), Ok(()));
        let nic = Bdf::new(0, 0x31, 0, 0);
        assert!(check_module_map(&[(1, gpus[0]), (2, nic)].into(), &gpus)
            .unwrap_err()
            .starts_with(
                "fabric_manager.modules maps module 2 to 0000:31:00.0, which is no NVIDIA GPU"
            ));
    }
}
