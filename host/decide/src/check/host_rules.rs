//! Checks of the host: IOMMU, vfio-pci, VFIO groups, KVM, reset.

use pci_config::Bdf;

use super::facts::StartBinding;
use super::report::{result, CheckResult, Status};
use vfio_p2p_model::host_facts::HostFacts;
use vfio_p2p_model::host_facts::ModuleState;
use vfio_p2p_model::host_facts::NodeProbe;
use vfio_p2p_model::{Device, Topology};

pub(super) fn check_iommu(topo: &Topology) -> Vec<CheckResult> {
    let cmdline = topo.kernel_cmdline.as_deref().unwrap_or("");
    let has = |k: &str| {
        cmdline
            .split_whitespace()
            .any(|t| t == k || t.starts_with(&format!("{k}=")))
    };
    let mut notes = Vec::new();
    for k in ["intel_iommu", "amd_iommu", "iommu"] {
        if let Some(t) = cmdline
            .split_whitespace()
            .find(|t| t.starts_with(&format!("{k}=")))
        {
            notes.push(t.to_string());
        }
    }
    let flags = if notes.is_empty() {
        "no IOMMU options on the kernel command line".to_string()
    } else {
        format!("kernel command line: {}", notes.join(" "))
    };
    let pt = if cmdline.split_whitespace().any(|t| t == "iommu=pt") {
        " (iommu=pt: host devices bypass translation, pass-through devices are still translated)"
    } else {
        ""
    };
    let intel = topo
        .devices
        .values()
        .any(|d| d.vendor == 0x8086 && d.bridge_role().is_some());
    if topo.iommu_groups.is_empty() {
        // The kernel documents no `amd_iommu=on`: the AMD IOMMU is used whenever the
        // firmware reports it (ACPI IVRS); `amd_iommu=off` or `iommu=off` would turn it off.
        let off = cmdline
            .split_whitespace()
            .filter(|t| matches!(*t, "intel_iommu=off" | "amd_iommu=off" | "iommu=off"))
            .collect::<Vec<_>>();
        let remove = match off.is_empty() {
            true => String::new(),
            false => format!("remove {} from the kernel command line; ", off.join(" ")),
        };
        let fix = if intel || has("intel_iommu") {
            format!("{remove}enable VT-d in the firmware and boot with intel_iommu=on (iommu=pt is the usual choice beside it)")
        } else {
            format!("{remove}enable the IOMMU (AMD-Vi) in the firmware: Linux uses it whenever the firmware reports it, no amd_iommu= option is needed; iommu=pt is the usual choice on a host that passes devices through")
        };
        return vec![result(
            "iommu",
            None,
            Status::Fail,
            format!("no IOMMU groups under /sys/kernel/iommu_groups; {flags}"),
            Some(fix),
        )];
    }
    let off = cmdline
        .split_whitespace()
        .find(|t| *t == "intel_iommu=off" || *t == "amd_iommu=off" || *t == "iommu=off");
    let status = if off.is_some() {
        Status::Warn
    } else {
        Status::Pass
    };
    vec![result(
        "iommu",
        None,
        status,
        format!("{} IOMMU groups; {flags}{pt}", topo.iommu_groups.len()),
        off.map(|o| format!("remove {o} from the kernel command line")),
    )]
}

pub(super) fn check_vfio_module(m: &ModuleState) -> CheckResult {
    let (status, saw, fix) = match m {
        ModuleState::Loaded => (Status::Pass, "vfio_pci is loaded".to_string(), None),
        ModuleState::BuiltIn => (Status::Pass, "vfio_pci is built into the kernel".to_string(), None),
        ModuleState::Available(p) => (
            Status::Pass,
            format!("vfio-pci is not loaded but available ({p}); binding loads it"),
            None,
        ),
        ModuleState::Missing(w) => (
            Status::Fail,
            format!("no vfio-pci module: {w}"),
            Some("install the kernel's extra modules (e.g. linux-modules-extra-$(uname -r)) or a kernel with CONFIG_VFIO_PCI".to_string()),
        ),
        ModuleState::Unknown(why) => not_probed(why),
    };
    result("vfio-pci-module", None, status, saw, fix)
}

/// `--vsock` (vm.yaml `verify: vsock`): the VM's vsock device needs vhost_vsock on the host.
pub fn check_vsock_module(m: &ModuleState) -> CheckResult {
    let (status, saw, fix) = match m {
        ModuleState::Loaded => (Status::Pass, "vhost_vsock is loaded".to_string(), None),
        ModuleState::BuiltIn => (Status::Pass, "vhost_vsock is built into the kernel".to_string(), None),
        ModuleState::Available(p) => (
            Status::Pass,
            format!("vhost_vsock is not loaded but available ({p}); the VMM opening /dev/vhost-vsock loads it"),
            None,
        ),
        ModuleState::Missing(w) => (
            Status::Fail,
            format!("no vhost_vsock module: {w}; the VM's vsock device (verify: vsock) cannot start"),
            Some("install the kernel's modules (vhost_vsock, CONFIG_VHOST_VSOCK) or leave verify: vsock out of vm.yaml".to_string()),
        ),
        ModuleState::Unknown(why) => not_probed(why),
    };
    result("vhost-vsock-module", None, status, saw, fix)
}

/// The outcome of a check whose probe could not run: there is no live host (an embedded
/// example, a snapshot file), so skipped, not a warning about the host.
fn not_probed(why: &str) -> (Status, String, Option<String>) {
    (
        Status::Skip,
        format!("not probed: {why}"),
        Some("run `vfio-p2p check` on the host itself (--sysfs-root /)".into()),
    )
}

pub(super) fn check_container(p: &NodeProbe<i32>) -> CheckResult {
    let (status, saw, fix) = match p {
        NodeProbe::Ok(v) => (Status::Pass, format!("/dev/vfio/vfio opens, VFIO API version {v}"), None),
        NodeProbe::Absent(path) => (
            Status::Fail,
            format!("{path} does not exist"),
            Some("load the vfio module (`modprobe vfio-pci`); in a container, pass /dev/vfio through".into()),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e.clone(),
            Some("run as root or give this user access to /dev/vfio/vfio".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("vfio-container", None, status, saw, fix)
}

/// Drivers that may hold a device in a VFIO group without breaking viability.
const GROUP_SAFE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

/// What the starter will bind, said in the saw column: a member still on its driver is
/// no problem when the VM's starter binds it (nothing on the host may hold it then).
fn bound_at_start_note(start: &StartBinding, pending: &[(Bdf, String)]) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let holders = if pending.iter().any(|(_, drv)| drv == "nvidia") {
        "; nothing on the host may hold the GPU then (nvidia-persistenced, a CUDA process)"
    } else {
        ""
    };
    format!(
        "; not yet bound: {} binds {} to vfio-pci when the VM starts{holders}",
        start.by,
        pending
            .iter()
            .map(|(m, _)| m.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(super) fn check_group_members(
    topo: &Topology,
    gpu: &Device,
    gpus: &[Bdf],
    start: &StartBinding,
) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let Some(group) = gpu.iommu_group else {
        return result(
            "iommu-group",
            subject,
            Status::Fail,
            "in no IOMMU group".into(),
            Some("enable the IOMMU (see the iommu check)".into()),
        );
    };
    let members = topo.group_members(&gpu.bdf);
    let mut bad = Vec::new();
    let mut pending = Vec::new();
    let mut foreign = Vec::new();
    let mut listed = Vec::new();
    // What `bind` takes: never a bridge.
    let mut bindable = Vec::new();
    for m in &members {
        let d = topo.device(m);
        let driver = d.and_then(|d| d.driver.clone());
        listed.push(format!(
            "{m} ({})",
            driver.as_deref().unwrap_or("no driver")
        ));
        if let Some(drv) = &driver {
            if start.binds(m) {
                pending.push((*m, drv.clone()));
            } else if !GROUP_SAFE_DRIVERS.contains(&drv.as_str()) {
                bad.push(format!("{m} bound to {drv}"));
            }
        }
        let is_bridge = d.is_some_and(|d| d.bridge_role().is_some());
        let ours = gpus.contains(m) || gpus.iter().any(|g| g.same_slot(m));
        if !is_bridge {
            bindable.push(m.to_string());
        }
        if !ours && !is_bridge {
            foreign.push(m.to_string());
        }
    }
    // a member already on vfio-pci needs no binding: only the others are pending
    pending.retain(|(_, drv)| drv != "vfio-pci");
    let saw = format!("group {group}: {}", listed.join(", "));
    if !bad.is_empty() {
        return result(
            "iommu-group",
            subject,
            Status::Fail,
            format!("{saw}; not usable while {}", bad.join(", ")),
            Some(format!(
                "bind every member to vfio-pci or unbind it (`vfio-p2p bind {}`){}",
                bindable.join(" "),
                if foreign.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} share the group, so they go to the same VM or stay unbound — or fix ACS so the group splits",
                        foreign.join(", ")
                    )
                }
            )),
        );
    }
    let saw = format!("{saw}{}", bound_at_start_note(start, &pending));
    if !foreign.is_empty() {
        return result(
            "iommu-group",
            subject,
            Status::Warn,
            format!("{saw}; {} are not selected GPUs or their functions", foreign.join(", ")),
            Some("pass them to the same VM or leave them unbound; to split the group, enable ACS on the ports above".into()),
        );
    }
    result("iommu-group", subject, Status::Pass, saw, None)
}

/// Whether the group becomes viable when the VM starts: the device is one the starter
/// binds, and so is every member held by a host driver.
fn viable_at_start(topo: &Topology, dev: &Device, start: &StartBinding) -> bool {
    start.binds(&dev.bdf)
        && topo.group_members(&dev.bdf).iter().all(|m| {
            let driver = topo.device(m).and_then(|d| d.driver.as_deref());
            start.binds(m) || driver.is_none_or(|d| GROUP_SAFE_DRIVERS.contains(&d))
        })
}

pub(super) fn check_group_viable(
    topo: &Topology,
    gpu: &Device,
    host: &HostFacts,
    start: &StartBinding,
) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let Some(group) = gpu.iommu_group else {
        return result(
            "vfio-group",
            subject,
            Status::Fail,
            "in no IOMMU group".into(),
            Some("enable the IOMMU".into()),
        );
    };
    let probe = host
        .groups
        .get(&group)
        .cloned()
        .unwrap_or_else(|| NodeProbe::Unknown(format!("group {group} was not probed")));
    let at_start = viable_at_start(topo, gpu, start);
    let (status, saw, fix) = match probe {
        NodeProbe::Ok(true) => (
            Status::Pass,
            format!("/dev/vfio/{group} is viable (VFIO_GROUP_GET_STATUS)"),
            None,
        ),
        NodeProbe::Ok(false) if at_start => (
            Status::Pass,
            format!("/dev/vfio/{group} is not viable yet: {} binds the group's members to vfio-pci when the VM starts", start.by),
            None,
        ),
        NodeProbe::Ok(false) => (
            Status::Fail,
            format!("/dev/vfio/{group} is not viable: a group member is bound to a host driver"),
            Some(
                "bind every group member to vfio-pci or unbind it (see the iommu-group check)"
                    .into(),
            ),
        ),
        NodeProbe::Absent(p) if at_start => (
            Status::Pass,
            format!("{p} does not exist yet: {} binds the GPU to vfio-pci when the VM starts", start.by),
            None,
        ),
        NodeProbe::Absent(p) => (
            Status::Fail,
            format!("{p} does not exist: the GPU is not bound to vfio-pci"),
            Some(format!("`vfio-p2p bind {}`", gpu.bdf)),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e,
            Some("run as root; a running VM holding the group also makes it busy".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(&why),
    };
    result("vfio-group", subject, status, saw, fix)
}

pub(super) fn check_deep(gpu: &Device, probe: &NodeProbe<bool>) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let (status, saw, fix) = match probe {
        NodeProbe::Ok(true) => (
            Status::Pass,
            "opened through VFIO (this reset it); VFIO reports it resettable".into(),
            None,
        ),
        NodeProbe::Ok(false) => (
            Status::Warn,
            "opened through VFIO (this reset it); VFIO reports no reset for it".into(),
            Some("the device keeps state between VMs; check its reset_method".into()),
        ),
        NodeProbe::Absent(p) => (
            Status::Fail,
            format!("{p} does not exist"),
            Some(format!("`vfio-p2p bind {}`", gpu.bdf)),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            format!("opening through VFIO failed: {e}"),
            Some("make sure no VM holds the group, then retry".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("vfio-device-open", subject, status, saw, fix)
}

pub(super) fn check_kvm(p: &NodeProbe<i32>) -> CheckResult {
    let (status, saw, fix) = match p {
        NodeProbe::Ok(v) => (Status::Pass, format!("KVM API {v}: created a VM and a KVM-VFIO device"), None),
        NodeProbe::Absent(path) => (
            Status::Fail,
            format!("{path} does not exist"),
            Some("enable virtualization (VT-x/AMD-V) in the firmware and load kvm_intel or kvm_amd".into()),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e.clone(),
            Some("run as root or add this user to the kvm group; the KVM-VFIO device needs CONFIG_KVM_VFIO".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("kvm", None, status, saw, fix)
}

pub(super) fn check_reset(topo: &Topology, gpu: &Device) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let siblings: Vec<String> = topo
        .sibling_functions(&gpu.bdf)
        .iter()
        .map(|d| d.bdf.to_string())
        .collect();
    let together = if siblings.is_empty() {
        String::new()
    } else {
        format!(
            "; reset together with its other functions {}",
            siblings.join(", ")
        )
    };
    match &gpu.reset_methods {
        None => result(
            "reset",
            subject,
            Status::Warn,
            format!("reset_method unreadable{together}"),
            Some("run on a kernel ≥ 5.15 (sysfs reset_method) as root to see how it resets".into()),
        ),
        Some(m) if m.is_empty() => result(
            "reset",
            subject,
            Status::Fail,
            format!("no reset method{together}"),
            Some("the GPU keeps state between VMs; enable a reset method (`echo flr > /sys/bus/pci/devices/BDF/reset_method`) if the device supports one".into()),
        ),
        Some(m) if m.iter().any(|x| x == "flr" || x == "pm" || x == "device_specific") => result(
            "reset",
            subject,
            Status::Pass,
            format!("reset_method {}{together}", m.join(" ")),
            None,
        ),
        Some(m) => {
            // The bind's rule (`reset::bus_reset_reaches`): everything below the parent
            // bridge, not only its direct children.
            let bus_mates: Vec<String> = crate::reset::bus_reset_reaches(topo, &gpu.bdf)
                .into_iter()
                .filter(|d| *d != gpu.bdf && !d.same_slot(&gpu.bdf))
                .map(|d| d.to_string())
                .collect();
            let mates = if bus_mates.is_empty() {
                String::new()
            } else {
                format!("; a bus reset also resets {}", bus_mates.join(", "))
            };
            result(
                "reset",
                subject,
                Status::Warn,
                format!("reset_method {} (no function-level reset){together}{mates}", m.join(" ")),
                Some("everything on the bus is reset with it: pass those devices to the same VM".into()),
            )
        }
    }
}
