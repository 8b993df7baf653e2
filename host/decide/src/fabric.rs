//! Planning on an NVSwitch board under NVIDIA Fabric Manager (FM).
//!
//! In the shared NVSwitch model NVLink works in a VM only when its GPUs are exactly one
//! of FM's predefined partitions and that partition is activated for it; FM refuses any
//! other set. So on such a board `place` hands out whole partitions, and a hand-picked
//! GPU set (`plan`/`check`/`gen --gpus`) that is not one is warned about, naming the
//! partitions that would do. A partition is usable when it is not active (another VM
//! has it), FM does not list it as unsupported, none of its GPUs has NVLinks FM could
//! not train, every GPU has a host address and none is taken or reserved. The libvirt
//! hook asks the same question of a starting VM ([`partition_for`]) and activates the
//! partition it names.

use std::collections::BTreeSet;
use std::fmt;

use pci_config::Bdf;

use super::placement::host::PlacementHost;
use super::placement::request::{Placement, UnplacedVm, VmRequest};
use vfio_p2p_config::host::FabricMode;
use vfio_p2p_contract::nvidia_parts::nvlink5_hgx_board;
use vfio_p2p_model::fabric::FabricModel;
use vfio_p2p_model::fabric_state::FabricPartition;
use vfio_p2p_model::fabric_state::FabricState;
use vfio_p2p_model::{Topology, VENDOR_NVIDIA};

/// A board whose NVLink fabric Fabric Manager runs, which `fabric: auto` asks FM about:
/// NVSwitches on the PCI tree (HGX A100/H100/H200), or the GPUs of an NVLink-5 board,
/// whose NVSwitches sit behind the baseboard's ConnectX-7 bridge and are no PCI devices
/// of the host (HGX B100/B200/B300).
pub fn fm_board(topo: &Topology) -> bool {
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    topo.nvswitches().next().is_some() || nvlink5_board(topo, &gpus).is_some()
}

/// The model planning follows: `fabric:` as configured, `auto` meaning shared NVSwitch
/// when FM's partitions are known, else none.
pub fn resolve_model(mode: FabricMode, partitions_known: bool) -> Option<FabricModel> {
    match mode {
        FabricMode::Auto if partitions_known => Some(FabricModel::SharedNvswitch),
        FabricMode::Auto | FabricMode::None => None,
        FabricMode::SharedNvswitch => Some(FabricModel::SharedNvswitch),
        FabricMode::FullPassthrough => Some(FabricModel::FullPassthrough),
    }
}

/// Why a partition cannot be given to a new VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    Active,
    Unsupported,
    NvlinkFailed(Bdf),
    NoAddress(u32),
    Taken(Bdf),
    /// A GPU of it is in this other, active partition.
    InActive(Bdf, u32),
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unusable::Active => f.write_str("active for another VM"),
            Unusable::Unsupported => f.write_str("listed by FM as unsupported"),
            Unusable::NvlinkFailed(b) => write!(f, "{b} has NVLinks FM could not train"),
            Unusable::NoAddress(m) => write!(f, "module {m} has no PCI address on this host"),
            Unusable::Taken(b) => write!(f, "{b} is taken or reserved"),
            Unusable::InActive(b, id) => write!(f, "{b} is in active partition {id}"),
        }
    }
}

/// Whether `p` can go to a new VM, given the devices already taken or reserved.
pub fn usable(
    state: &FabricState,
    p: &FabricPartition,
    taken: &BTreeSet<Bdf>,
) -> Result<(), Unusable> {
    if p.active {
        return Err(Unusable::Active);
    }
    if state.unsupported.contains(&p.id) {
        return Err(Unusable::Unsupported);
    }
    for g in &p.gpus {
        let Some(b) = g.bdf else {
            return Err(Unusable::NoAddress(g.module_id));
        };
        if state.nvlink_failed_gpus.contains(&b) {
            return Err(Unusable::NvlinkFailed(b));
        }
        if taken.contains(&b) {
            return Err(Unusable::Taken(b));
        }
        if let Some(q) = state
            .partitions
            .iter()
            .find(|q| q.active && q.gpus.iter().any(|h| h.bdf == Some(b)))
        {
            return Err(Unusable::InActive(b, q.id));
        }
    }
    Ok(())
}

/// `1 (modules 1, 3: 0000:9d:00.0 0000:9e:00.0)`: a partition as messages name it.
pub fn describe(p: &FabricPartition) -> String {
    let bdfs = p.bdfs().map_or_else(
        || "addresses unknown".into(),
        |b| b.iter().map(Bdf::to_string).collect::<Vec<_>>().join(" "),
    );
    format!("{} (modules {}: {bdfs})", p.id, p.module_list())
}

/// Why a VM's GPUs cannot get one of FM's partitions: what was seen, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFinding {
    pub saw: String,
    pub fix: String,
}

impl fmt::Display for PartitionFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.saw, self.fix)
    }
}

fn bdf_list(bdfs: &[Bdf]) -> String {
    bdfs.iter()
        .map(Bdf::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

const FIX_LIST: &str = "`vfio-p2p fabric list` shows FM's partitions";

/// The partition whose GPUs are exactly `gpus` (any order), which FM supports now and
/// whose GPUs have no failed NVLinks; else the finding, naming the partitions that hold
/// them all and those of their size that a new VM could get (none of `taken`). Whether
/// the partition is active already is not judged here: planning calls that "active for
/// another VM" ([`gpu_set_warning`]), the hook's activation asks its record who holds it.
pub fn partition_for<'a>(
    state: &'a FabricState,
    gpus: &[Bdf],
    taken: &BTreeSet<Bdf>,
) -> Result<&'a FabricPartition, PartitionFinding> {
    let mut wanted = gpus.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    if !state
        .partitions
        .iter()
        .any(|p| p.gpus.iter().any(|g| g.bdf.is_some()))
    {
        return Err(PartitionFinding {
            saw: format!(
                "Fabric Manager lists its {} partitions without PCI addresses (H100 and later boards do), so GPUs {} cannot be matched to one",
                state.partitions.len(),
                bdf_list(&wanted)
            ),
            fix: "map FM's module ids to PCI addresses in host.yaml's `fabric_manager: modules:` (docs/fabric.md says how), or activate the VM's partition by hand before it starts (`vfio-p2p fabric activate ID`)".into(),
        });
    }
    let failed: Vec<Bdf> = wanted
        .iter()
        .copied()
        .filter(|b| state.nvlink_failed_gpus.contains(b))
        .collect();
    if !failed.is_empty() {
        return Err(PartitionFinding {
            saw: format!("Fabric Manager lists failed NVLinks on {}", bdf_list(&failed)),
            fix: "see /var/log/fabricmanager.log; give the VM GPUs without failed links, or repair and restart FM".into(),
        });
    }
    let Some(p) = state.partition_of(&wanted) else {
        return Err(not_a_partition(state, &wanted, taken));
    };
    if state.unsupported.contains(&p.id) {
        return Err(PartitionFinding {
            saw: format!(
                "GPUs {} are Fabric Manager partition {}, which FM lists as unsupported now (a GPU or NVSwitch missing or degraded)",
                bdf_list(&wanted),
                p.id
            ),
            fix: format!("see /var/log/fabricmanager.log; {FIX_LIST} that are supported"),
        });
    }
    Ok(p)
}

fn not_a_partition(state: &FabricState, wanted: &[Bdf], taken: &BTreeSet<Bdf>) -> PartitionFinding {
    let holding: Vec<String> = state
        .partitions
        .iter()
        .filter(|p| !state.unsupported.contains(&p.id))
        .filter(|p| {
            wanted
                .iter()
                .all(|w| p.gpus.iter().any(|g| g.bdf == Some(*w)))
        })
        .map(describe)
        .collect();
    let holding = if holding.is_empty() {
        "no partition holds them all".to_string()
    } else {
        format!("partitions holding them all: {}", holding.join("; "))
    };
    let fits: Vec<String> = state
        .partitions
        .iter()
        .filter(|p| p.gpus.len() == wanted.len() && usable(state, p, taken).is_ok())
        .map(describe)
        .collect();
    let offer = if fits.is_empty() {
        format!("FM offers no usable partition of {} GPUs", wanted.len())
    } else {
        format!(
            "partitions of {} GPUs that would: {}",
            wanted.len(),
            fits.join("; ")
        )
    };
    PartitionFinding {
        saw: format!(
            "GPUs {} are not one of Fabric Manager's partitions ({holding}): FM gives NVLink only to a whole partition, so this VM would get no NVLink",
            bdf_list(wanted)
        ),
        fix: format!("give the VM exactly one partition's GPUs ({offer})"),
    }
}

/// What to say when `gpus` are not a partition FM would activate for a new VM
/// ([`partition_for`], and the partition not active nor any of its GPUs taken); `None`
/// when they are one.
pub fn gpu_set_warning(state: &FabricState, gpus: &[Bdf], taken: &BTreeSet<Bdf>) -> Option<String> {
    // The VM's own GPUs are not "taken" from itself.
    let others: BTreeSet<Bdf> = taken
        .iter()
        .filter(|b| !gpus.contains(b))
        .copied()
        .collect();
    let p = match partition_for(state, gpus, taken) {
        Ok(p) => p,
        Err(finding) => return Some(finding.to_string()),
    };
    usable(state, p, &others).err().map(|why| {
        format!(
            "GPUs {} are Fabric Manager partition {} but it is {why}: FM will not activate it, and the VM gets no NVLink",
            bdf_list(&p.bdfs().unwrap_or_default()),
            describe(p)
        )
    })
}

/// Places `requests` on FM's partitions: each VM gets one usable partition of exactly its
/// size, largest VMs first; among fitting partitions the one with the best worst path,
/// then on the fewest NUMA nodes, then breaking the fewest larger partitions still whole
/// (keeping them for VMs to come), then the lowest PCI address (as `place` goes in BDF
/// order everywhere), then the lowest id.
pub fn place_on_partitions(
    host: &PlacementHost,
    state: &FabricState,
    requests: &[VmRequest],
    taken: &BTreeSet<Bdf>,
) -> Placement {
    // GPUs of active partitions belong to running VMs.
    let mut used: BTreeSet<Bdf> = state
        .partitions
        .iter()
        .filter(|p| p.active)
        .flat_map(|p| p.gpus.iter().filter_map(|g| g.bdf))
        .collect();
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|i| (std::cmp::Reverse(requests[*i].gpus), *i));
    let mut placed = std::collections::BTreeMap::new();
    let mut unplaced = std::collections::BTreeMap::new();
    for i in order {
        let r = &requests[i];
        let blocked: BTreeSet<Bdf> = taken.union(&used).copied().collect();
        let free_whole = |q: &FabricPartition| usable(state, q, &blocked).is_ok();
        let best = state
            .partitions
            .iter()
            .filter(|p| p.gpus.len() == r.gpus && free_whole(p))
            .filter_map(|p| {
                let vm = host.evaluate(&r.name, &p.bdfs()?)?;
                let broken = state
                    .partitions
                    .iter()
                    .filter(|q| q.gpus.len() > r.gpus && free_whole(q))
                    .filter(|q| q.gpus.iter().any(|g| p.gpus.iter().any(|h| h.bdf == g.bdf)))
                    .count();
                Some((
                    (
                        vm.worst_path,
                        vm.numa_nodes.len(),
                        broken,
                        vm.gpus.first().copied(),
                        p.id,
                    ),
                    vm,
                ))
            })
            .min_by(|a, b| a.0.cmp(&b.0));
        match best {
            Some((_, vm)) => {
                used.extend(&vm.gpus);
                placed.insert(i, vm);
            }
            None => {
                unplaced.insert(i, unplaced_vm(host, state, r, &blocked));
            }
        }
    }
    Placement {
        vms: placed.into_values().collect(),
        unplaced: unplaced.into_values().collect(),
        free: host.free_gpus_without(&used),
    }
}

fn unplaced_vm(
    host: &PlacementHost,
    state: &FabricState,
    r: &VmRequest,
    blocked: &BTreeSet<Bdf>,
) -> UnplacedVm {
    let fitting = |q: &FabricPartition| {
        usable(state, q, blocked).is_ok()
            && q.bdfs().is_some_and(|b| host.evaluate("", &b).is_some())
    };
    let sizes: BTreeSet<usize> = state.partitions.iter().map(|p| p.gpus.len()).collect();
    let reason = if sizes.is_empty() {
        "Fabric Manager lists no partitions (none is supported on this board as it is now)"
            .to_string()
    } else if !sizes.contains(&r.gpus) {
        format!(
            "Fabric Manager has no partition of {} GPUs (its partitions have {} GPUs)",
            r.gpus,
            sizes
                .iter()
                .rev()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        let why: Vec<String> = state
            .partitions
            .iter()
            .filter(|p| p.gpus.len() == r.gpus)
            .map(|p| match usable(state, p, blocked) {
                Err(e) => format!("{}: {e}", p.id),
                Ok(()) => match p
                    .gpus
                    .iter()
                    .filter_map(|g| g.bdf)
                    .find(|b| !host.has_gpu(b))
                {
                    Some(b) => format!("{}: its GPU {b} is not a GPU of this host", p.id),
                    None => format!("{}: its IOMMU groups hold other devices", p.id),
                },
            })
            .collect();
        format!(
            "no free Fabric Manager partition of {} GPUs ({})",
            r.gpus,
            why.join("; ")
        )
    };
    UnplacedVm {
        name: r.name.clone(),
        gpus: r.gpus,
        reason,
        best_worst_path: None,
        largest_fit: state
            .partitions
            .iter()
            .filter(|p| p.gpus.len() <= r.gpus && fitting(p))
            .map(|p| p.gpus.len())
            .max()
            .unwrap_or(0),
    }
}

/// When a `count × gpus` shape does not fit FM's partitions: the largest `count × g`
/// that does, then the largest `c × gpus`.
pub fn largest_partition_shape(
    host: &PlacementHost,
    state: &FabricState,
    count: usize,
    gpus: usize,
    taken: &BTreeSet<Bdf>,
) -> Option<(usize, usize)> {
    let fits = |c: usize, g: usize| {
        place_on_partitions(host, state, &super::placement::shape(c, g), taken)
            .unplaced
            .is_empty()
    };
    let narrower = (1..gpus).rev().find(|g| fits(count, *g));
    let fewer = (1..count).rev().find(|c| fits(*c, gpus));
    match (narrower, fewer) {
        (Some(g), Some(c)) if c * gpus > count * g => Some((c, gpus)),
        (Some(g), _) => Some((count, g)),
        (None, Some(c)) => Some((c, gpus)),
        (None, None) => None,
    }
}

/// Under full passthrough: whether `gpus` are the whole baseboard (every NVIDIA GPU of
/// the host), the only VM that may take the NVSwitches.
pub fn takes_whole_baseboard(topo: &Topology, gpus: &[Bdf]) -> bool {
    let board: BTreeSet<Bdf> = topo
        .gpus()
        .filter(|g| g.is_nvidia_gpu())
        .map(|g| g.bdf)
        .collect();
    !board.is_empty() && board.iter().all(|b| gpus.contains(b))
}

/// The NVSwitch functions a full-passthrough VM of `gpus` takes with them: every
/// NVSwitch of the host when the VM has the whole baseboard, else none.
pub fn passthrough_nvswitches(
    topo: &Topology,
    model: Option<FabricModel>,
    gpus: &[Bdf],
) -> Vec<Bdf> {
    if model != Some(FabricModel::FullPassthrough) || !takes_whole_baseboard(topo, gpus) {
        return Vec::new();
    }
    topo.nvswitches().map(|d| d.bdf).collect()
}

/// The NVLink-5 board the VM's GPUs are on, if any.
pub fn nvlink5_board(topo: &Topology, gpus: &[Bdf]) -> Option<&'static str> {
    gpus.iter()
        .filter_map(|b| topo.device(b))
        .filter(|d| d.vendor == VENDOR_NVIDIA)
        .find_map(|d| nvlink5_hgx_board(d.device))
}

#[cfg(test)]
#[path = "fabric_tests.rs"]
mod tests;
