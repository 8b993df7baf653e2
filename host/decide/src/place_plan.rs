//! `place` as one decision: the VMs carved out of the host (on a board under Fabric Manager,
//! whole partitions), each with its clique plan, its FM partition and, when asked, its NICs;
//! for `--shape`, the largest shape that fits when the asked one does not. The command reads
//! the host and writes files; `emit::place_report` renders what this returns.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pci_config::{Bdf, PathKind};
use serde::Serialize;

use crate::clique_plan::pair_route::PairRoute;
use crate::clique_plan::{self, PlanOptions};
use crate::fabric::{largest_partition_shape, place_on_partitions};
use crate::nic_affinity::{NicChoice, NicPool};
use crate::placement;
use crate::placement::host::PlacementHost;
use crate::placement::request::{PlacedVm, PlacementOptions, UnplacedVm, VmRequest};
use vfio_p2p_model::fabric_state::FabricState;
use vfio_p2p_model::Topology;

/// One placed VM with its clique plan.
#[derive(Debug, Serialize)]
pub struct VmPlacePlan {
    #[serde(flatten)]
    pub vm: PlacedVm,
    /// Clique ID per GPU (`null`: no PCIe P2P clique, e.g. NVLink-only or alone).
    pub cliques: BTreeMap<Bdf, Option<u8>>,
    pub pairs: Vec<PlacedPair>,
    pub warnings: Vec<String>,
    /// Why no clique plan could be made (the placement still stands).
    pub plan_error: Option<String>,
    /// With `--with-nics`: the NIC each GPU got, or why none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicChoice>,
    /// On a board under Fabric Manager: the partition the VM's GPUs are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fm_partition: Option<u32>,
}

/// One GPU pair of a placed VM: its path label and the plan's verdict.
#[derive(Debug, Serialize)]
pub struct PlacedPair {
    pub a: Bdf,
    pub b: Bdf,
    pub path: String,
    pub verdict: PairRoute,
    pub clique: Option<u8>,
}

/// Everything `place` reports.
#[derive(Debug, Serialize)]
pub struct PlaceReport {
    pub p2p_level: PathKind,
    pub vms: Vec<VmPlacePlan>,
    pub unplaced: Vec<UnplacedVm>,
    pub free: Vec<Bdf>,
    /// For `--shape`: the largest shape that fits, when the requested one does not.
    pub largest_shape: Option<String>,
    /// Files written by `--write-configs` (the command fills it in).
    pub configs_written: Vec<PathBuf>,
}

/// What `place` is asked: the VMs, the `--shape` they came from, the host policy.
pub struct PlaceRequest<'a> {
    pub requests: &'a [VmRequest],
    pub shape: Option<(usize, usize)>,
    pub options: &'a PlacementOptions,
    pub p2p_level: PathKind,
    pub with_nics: bool,
}

/// Places the VMs (whole FM partitions where `partitions` are known) and plans each.
pub fn place(
    topo: &Topology,
    host: &PlacementHost,
    partitions: Option<&FabricState>,
    ask: &PlaceRequest,
) -> PlaceReport {
    let taken = &ask.options.unavailable;
    let placed = match partitions {
        Some(state) => place_on_partitions(host, state, ask.requests, taken),
        None => host.place(ask.requests, ask.options.max_path),
    };
    let largest_shape = match ask.shape {
        Some((count, gpus)) if !placed.unplaced.is_empty() => {
            largest_fit(host, partitions, (count, gpus), ask.options)
                .map(|(c, g)| format!("{c}x{g}"))
        }
        _ => None,
    };
    let mut vms: Vec<VmPlacePlan> = placed
        .vms
        .into_iter()
        .map(|vm| VmPlacePlan {
            fm_partition: partitions
                .and_then(|s| s.partition_of(&vm.gpus))
                .map(|p| p.id),
            ..plan_vm(topo, vm, ask.p2p_level)
        })
        .collect();
    if ask.with_nics {
        let mut pool = NicPool::new(topo, taken);
        for vm in &mut vms {
            vm.nics = vm.vm.gpus.iter().map(|g| pool.choose(*g)).collect();
        }
    }
    PlaceReport {
        p2p_level: ask.p2p_level,
        vms,
        unplaced: placed.unplaced,
        free: placed.free,
        largest_shape,
        configs_written: Vec::new(),
    }
}

/// The one "what would fit" rule for `--shape COUNTxGPUS`: whole FM partitions where the
/// board has them, else the placement's own search.
fn largest_fit(
    host: &PlacementHost,
    partitions: Option<&FabricState>,
    (count, gpus): (usize, usize),
    options: &PlacementOptions,
) -> Option<(usize, usize)> {
    match partitions {
        Some(state) => largest_partition_shape(host, state, count, gpus, &options.unavailable),
        None => placement::largest_shape(host, count, gpus, options.max_path),
    }
}

/// The clique plan of one placed VM; a VM that cannot be planned keeps its placement with
/// the reason.
fn plan_vm(topo: &Topology, vm: PlacedVm, p2p_level: PathKind) -> VmPlacePlan {
    let options = PlanOptions {
        p2p_level,
        ..PlanOptions::default()
    };
    let (cliques, pairs, warnings, plan_error) = match clique_plan::plan(topo, &vm.gpus, &options) {
        Ok(p) => {
            let pairs = p
                .pairs
                .iter()
                .map(|pair| PlacedPair {
                    a: pair.a,
                    b: pair.b,
                    path: pair
                        .nvlink
                        .map_or(pair.path.label().to_string(), |n| format!("NV{n}")),
                    verdict: pair.verdict,
                    clique: pair.clique,
                })
                .collect();
            (p.assignments.clone(), pairs, p.warnings, None)
        }
        Err(e) => (
            vm.gpus.iter().map(|g| (*g, None)).collect(),
            Vec::new(),
            Vec::new(),
            Some(e.to_string()),
        ),
    };
    VmPlacePlan {
        cliques,
        pairs,
        warnings,
        plan_error,
        nics: Vec::new(),
        fm_partition: None,
        vm,
    }
}
