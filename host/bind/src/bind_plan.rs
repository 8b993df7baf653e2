//! What `bind` and `unbind` will change, decided from the [`Topology`] alone: which
//! devices move, to what, and why (named, another function of a named GPU, a member of
//! its IOMMU group). Refusals happen here, before anything is written.

use std::collections::{BTreeMap, BTreeSet};

use pci_config::Bdf;
use serde::Serialize;

use super::state::{BindState, ResetChange};
use vfio_p2p_decide::reset::{choose, ResetChoice, ResetError};
use vfio_p2p_model::{ResetPolicy, Topology};
use vfio_p2p_read::{Binding, DeviceUse};

/// The driver `bind` moves devices to.
pub const VFIO_PCI: &str = "vfio-pci";

/// The vfio-pci variant driver that NVIDIA Grace GPUs (GPU memory coherent with the CPU
/// over NVLink-C2C) need: Linux's drivers/vfio/pci/nvgrace-gpu/main.c, module
/// `nvgrace-gpu-vfio-pci`, registered under its `KBUILD_MODNAME`.
pub const NVGRACE_GPU_VFIO_PCI: &str = "nvgrace_gpu_vfio_pci";
/// The module that registers [`NVGRACE_GPU_VFIO_PCI`].
pub const NVGRACE_GPU_VFIO_PCI_MODULE: &str = "nvgrace-gpu-vfio-pci";

/// NVIDIA device ids in that driver's id table (`nvgrace_gpu_vfio_pci_table`): GH200
/// 0x2342 (120 GB), 0x2345 (480 GB), 0x2348; GB200 0x2941; GB300 0x31c2.
pub const GRACE_GPU_IDS: [u16; 5] = [0x2342, 0x2345, 0x2348, 0x2941, 0x31c2];

/// The driver a device goes to: Grace GPUs to [`NVGRACE_GPU_VFIO_PCI`], all else to vfio-pci.
pub fn vfio_driver_for(topo: &Topology, bdf: &Bdf) -> &'static str {
    match topo.device(bdf) {
        Some(d) if d.vendor == 0x10de && GRACE_GPU_IDS.contains(&d.device) => NVGRACE_GPU_VFIO_PCI,
        _ => VFIO_PCI,
    }
}

/// Whether `driver` is one that hands the device to a VM (vfio-pci or its Grace variant).
pub fn is_vfio_driver(driver: Option<&str>) -> bool {
    matches!(driver, Some(VFIO_PCI | NVGRACE_GPU_VFIO_PCI))
}

/// Where a device should end up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "to")]
pub enum Target {
    /// Bound to vfio-pci with `driver_override` = vfio-pci.
    Vfio,
    /// Bound to a vfio-pci variant driver (a Grace GPU: [`NVGRACE_GPU_VFIO_PCI`]) with
    /// `driver_override` naming it.
    VfioVariant { driver: String },
    /// Exactly this driver (or none) and `driver_override`: a recorded original.
    Exactly(Binding),
    /// `driver_override` cleared and the kernel's own choice of driver (`drivers_probe`).
    HostDefault,
}

impl Target {
    /// The VFIO driver the target binds to (`None`: it leaves VFIO).
    pub fn vfio_driver(&self) -> Option<&str> {
        match self {
            Target::Vfio => Some(VFIO_PCI),
            Target::VfioVariant { driver } => Some(driver),
            Target::Exactly(_) | Target::HostDefault => None,
        }
    }

    /// Where `bdf` goes to be given to a VM: vfio-pci or, for a Grace GPU, its variant.
    pub fn vfio_for(topo: &Topology, bdf: &Bdf) -> Target {
        match vfio_driver_for(topo, bdf) {
            VFIO_PCI => Target::Vfio,
            d => Target::VfioVariant {
                driver: d.to_string(),
            },
        }
    }
}

/// Why a device is in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason", content = "of")]
pub enum Reason {
    Named,
    /// Another function of a named device (a GPU's audio function).
    OtherFunction(Bdf),
    /// In the IOMMU group of a named device (`--whole-group`).
    GroupMember(Bdf),
    /// Bound together with a named device by an earlier `bind` (recorded).
    BoundWith(Bdf),
}

/// One device the plan covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedDevice {
    pub bdf: Bdf,
    #[serde(flatten)]
    pub reason: Reason,
    pub before: Binding,
    pub target: Target,
    /// Nothing to do: already where the target says.
    pub unchanged: bool,
    pub iommu_group: Option<u32>,
    /// Its `reset_method` change (host.yaml `reset:`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<ResetChange>,
}

/// Everything the caller asked for, in BDF order of the named devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BindPlan {
    pub devices: Vec<PlannedDevice>,
}

impl BindPlan {
    pub fn changes(&self) -> impl Iterator<Item = &PlannedDevice> {
        self.devices.iter().filter(|d| !d.unchanged)
    }

    /// The `reset_method` writes, in BDF order.
    pub fn resets(&self) -> Vec<(Bdf, ResetChange)> {
        self.devices
            .iter()
            .filter_map(|d| Some((d.bdf, d.reset.clone()?)))
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct BindOptions {
    pub whole_group: bool,
    /// Bind GPUs the host is using (processes, display).
    pub force: bool,
    /// How the bound GPUs are reset between tenants (host.yaml `reset:`).
    pub reset: ResetPolicy,
    /// Leave the drivers as they are and only set the reset methods (the hook, for the
    /// hostdevs libvirt binds itself: managed='yes').
    pub reset_only: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BindPlanError {
    #[error(
        "{0}: no such PCI device on this host{1}; list the devices with `vfio-p2p topo` or `lspci -D`"
    )]
    UnknownDevice(Bdf, String),
    #[error("{0} is a PCI bridge; bind never touches bridges: name the devices below it instead")]
    Bridge(Bdf),
    #[error("{0} has no IOMMU group, so vfio-pci cannot take it: turn the IOMMU on (Intel: VT-d in the firmware and intel_iommu=on; AMD: the IOMMU in the firmware) and reboot")]
    NoIommuGroup(Bdf),
    #[error("IOMMU group {group} of {named} also holds {others}, which a VM must get together with it: name them too, or pass --whole-group")]
    GroupShared {
        group: u32,
        named: Bdf,
        others: String,
    },
    #[error("{bdf} is in use on the host: {uses}; stop them (or move the display) first, or pass --force")]
    InUse { bdf: Bdf, uses: String },
    #[error(transparent)]
    Reset(#[from] ResetError),
}

fn driver_text(b: &Binding) -> String {
    b.driver.clone().unwrap_or_else(|| "no driver".into())
}

fn is_bridge(topo: &Topology, bdf: &Bdf) -> bool {
    topo.device(bdf).is_some_and(|d| d.bridge_role().is_some())
}

/// ` (why the reader skipped it)` when it saw the device and skipped it (a link that
/// leads elsewhere, unreadable IDs), else nothing.
fn why_skipped(topo: &Topology, bdf: &Bdf) -> String {
    let seen: Vec<String> = topo
        .warnings
        .iter()
        .filter(|w| w.device == Some(*bdf))
        .map(ToString::to_string)
        .collect();
    match seen.is_empty() {
        true => String::new(),
        false => format!(" ({})", seen.join("; ")),
    }
}

/// A named device must exist and must not be a bridge.
fn check_named(topo: &Topology, bdf: &Bdf) -> Result<(), BindPlanError> {
    match topo.device(bdf) {
        None => Err(BindPlanError::UnknownDevice(*bdf, why_skipped(topo, bdf))),
        Some(d) if d.bridge_role().is_some() => Err(BindPlanError::Bridge(*bdf)),
        Some(_) => Ok(()),
    }
}

fn binding_of(topo: &Topology, bdf: &Bdf) -> Binding {
    topo.device(bdf)
        .map(|d| Binding {
            driver: d.driver.clone(),
            driver_override: d.driver_override.clone(),
        })
        .unwrap_or_default()
}

/// Plans `bind`: each named device, its other functions, and (with `--whole-group`) the
/// rest of its IOMMU group, bridges excepted. `usage` says how the host uses each GPU
/// (read by the caller); GPUs in use are refused unless `force`.
pub fn plan_bind(
    topo: &Topology,
    named: &[Bdf],
    usage: &BTreeMap<Bdf, DeviceUse>,
    opts: &BindOptions,
) -> Result<BindPlan, BindPlanError> {
    let mut chosen: BTreeMap<Bdf, Reason> = BTreeMap::new();
    for bdf in named {
        check_named(topo, bdf)?;
        chosen.insert(*bdf, Reason::Named);
    }
    for bdf in named {
        for f in topo.sibling_functions(bdf) {
            if f.bridge_role().is_none() {
                chosen.entry(f.bdf).or_insert(Reason::OtherFunction(*bdf));
            }
        }
    }
    for bdf in named {
        if topo.device(bdf).and_then(|d| d.iommu_group).is_none() {
            return Err(BindPlanError::NoIommuGroup(*bdf));
        }
        let outside: Vec<Bdf> = topo
            .group_members(bdf)
            .into_iter()
            .filter(|m| !chosen.contains_key(m) && !is_bridge(topo, m))
            .collect();
        if outside.is_empty() {
            continue;
        }
        if opts.whole_group {
            for m in outside {
                chosen.insert(m, Reason::GroupMember(*bdf));
            }
        } else {
            return Err(BindPlanError::GroupShared {
                group: topo.device(bdf).and_then(|d| d.iommu_group).unwrap_or(0),
                named: *bdf,
                others: outside
                    .iter()
                    .map(|m| format!("{m} ({})", driver_text(&binding_of(topo, m))))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    if !opts.force {
        for (bdf, u) in usage {
            if chosen.contains_key(bdf) && u.in_use() {
                let mut uses: Vec<String> = u
                    .processes
                    .iter()
                    .map(|p| format!("{} (pid {}) holds {}", p.command, p.pid, p.file))
                    .collect();
                uses.extend(u.display.clone());
                return Err(BindPlanError::InUse {
                    bdf: *bdf,
                    uses: uses.join(", "),
                });
            }
        }
    }
    let vm: BTreeSet<Bdf> = chosen.keys().copied().collect();
    let mut devices = Vec::new();
    for (bdf, reason) in chosen {
        let before = binding_of(topo, &bdf);
        let target = Target::vfio_for(topo, &bdf);
        devices.push(PlannedDevice {
            bdf,
            reason,
            unchanged: opts.reset_only || before.driver.as_deref() == target.vfio_driver(),
            before,
            target,
            iommu_group: topo.device(&bdf).and_then(|d| d.iommu_group),
            reset: reset_change(topo, &bdf, opts.reset, &vm)?,
        });
    }
    Ok(BindPlan { devices })
}

/// A GPU's `reset_method` change under `policy`; none for other devices, for `auto`, or
/// when it already is exactly that method.
fn reset_change(
    topo: &Topology,
    bdf: &Bdf,
    policy: ResetPolicy,
    vm: &BTreeSet<Bdf>,
) -> Result<Option<ResetChange>, BindPlanError> {
    if !topo.device(bdf).is_some_and(|d| d.is_gpu()) {
        return Ok(None);
    }
    let ResetChoice::Only(method) = choose(topo, bdf, policy, vm)? else {
        return Ok(None);
    };
    let was = topo
        .device(bdf)
        .and_then(|d| d.reset_methods.clone())
        .unwrap_or_default();
    Ok((was != [method]).then(|| ResetChange {
        set: method.to_string(),
        was,
    }))
}

/// Plans `unbind`: each named device (or, with `all`, every recorded one) back to what
/// the record says; devices `bind` did not record go to the host's default driver.
/// Devices recorded as bound together with a named one go too.
pub fn plan_unbind(
    topo: &Topology,
    named: &[Bdf],
    all: bool,
    state: &BindState,
) -> Result<BindPlan, BindPlanError> {
    let mut chosen: BTreeMap<Bdf, Reason> = BTreeMap::new();
    if all {
        for (bdf, r) in &state.devices {
            let reason = if r.bound_with == *bdf {
                Reason::Named
            } else {
                Reason::BoundWith(r.bound_with)
            };
            chosen.insert(*bdf, reason);
        }
    }
    let named_set: BTreeSet<Bdf> = named.iter().copied().collect();
    for bdf in named {
        check_named(topo, bdf)?;
        chosen.insert(*bdf, Reason::Named);
    }
    for (bdf, r) in &state.devices {
        if named_set.contains(&r.bound_with) {
            chosen
                .entry(*bdf)
                .or_insert(Reason::BoundWith(r.bound_with));
        }
    }
    Ok(BindPlan {
        devices: chosen
            .into_iter()
            .filter(|(bdf, _)| topo.device(bdf).is_some())
            .map(|(bdf, reason)| {
                let before = binding_of(topo, &bdf);
                let (target, unchanged) = match state.devices.get(&bdf) {
                    Some(r) => (Target::Exactly(r.original.clone()), before == r.original),
                    None => (
                        Target::HostDefault,
                        !is_vfio_driver(before.driver.as_deref())
                            && !is_vfio_driver(before.driver_override.as_deref()),
                    ),
                };
                // the reset method bind set goes back to what it was
                let reset = state
                    .devices
                    .get(&bdf)
                    .and_then(|r| r.reset.as_ref())
                    .map(|r| ResetChange {
                        set: r.was.join(" "),
                        was: vec![r.set.clone()],
                    });
                PlannedDevice {
                    bdf,
                    reason,
                    before,
                    target,
                    unchanged,
                    iommu_group: topo.device(&bdf).and_then(|d| d.iommu_group),
                    reset,
                }
            })
            .collect(),
    })
}
