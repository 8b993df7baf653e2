//! Checks of the VM's configuration: the MMIO window, where the clique capability goes,
//! a hidden hypervisor, and the plan's verdicts.

use pci_config::clique::{placement, PlacementRefused, Placer, OFFSET_FALLBACK, OFFSET_PRIMARY};

use super::facts::{ConfigSyntax, Vmm, VmmFacts};
use super::report::{result, CheckResult, Status};
use crate::clique_offset::qemu_placer;
use crate::clique_plan::pair_route::PairRoute;
use crate::clique_plan::{CliquePlan, PlanError};
use crate::grace_guest::HIGHMEM_MMIO_DEFAULT;
use crate::mmio;
use vfio_p2p_model::Device;

const GIB: u64 = 1 << 30;

/// The GPUs' 64-bit BARs against the VM's window; `arm_host`: an aarch64 host, whose VMs
/// are `virt` machines, so where no VM definition is given the fix is virt's window.
pub(super) fn check_bars(gpus: &[&Device], vmm: &VmmFacts, arm_host: bool) -> CheckResult {
    let need = mmio::hole64_size(gpus);
    let total: u64 = gpus.iter().map(|d| d.bar64_total()).sum();
    let saw = format!(
        "{} GPU(s) with {:.1} GiB of 64-bit BARs need a {} GiB 64-bit MMIO window",
        gpus.len(),
        total as f64 / GIB as f64,
        need / GIB
    );
    let settings = if vmm.arm_virt || (arm_host && vmm.vm_config.is_none()) {
        virt_window_fix(need, &vmm.syntax)
    } else {
        hole64_fix(need, &vmm.syntax)
    };
    // Arm virt's high PCIe window has a size without being set (hw/arm/virt.c)
    let virt_default = (
        HIGHMEM_MMIO_DEFAULT,
        "Arm virt's default high PCIe window".to_string(),
    );
    let window = match (&vmm.hole64, vmm.arm_virt) {
        (None, true) if vmm.vm_config.is_some() => Some(&virt_default),
        (window, _) => window.as_ref(),
    };
    match window {
        Some((have, src)) if *have >= need => result(
            "mmio-window",
            None,
            Status::Pass,
            format!("{saw}; {src} sets {} GiB", have / GIB),
            None,
        ),
        Some((have, src)) => result(
            "mmio-window",
            None,
            Status::Fail,
            format!("{saw}; {src} sets only {} GiB", have / GIB),
            Some(settings),
        ),
        None if need <= mmio::HEADROOM => result(
            "mmio-window",
            None,
            Status::Pass,
            format!("{saw}: QEMU's default fits"),
            None,
        ),
        None => match &vmm.vm_config {
            Some(given) => result(
                "mmio-window",
                None,
                Status::Fail,
                format!(
                    "{saw}; {given} sets no 64-bit MMIO hole, and QEMU's default ({} GiB) is too small for these BARs",
                    mmio::HEADROOM / GIB
                ),
                Some(settings),
            ),
            None => result(
                "mmio-window",
                None,
                Status::Warn,
                format!("{saw}; the VM's window is not known here (pass --domain-xml or --qemu-args)"),
                Some(settings),
            ),
        },
    }
}

/// How to give an Arm `virt` VM a high PCIe window of at least `need` bytes (a power of
/// two: QEMU >= 10.0's `highmem-mmio-size`), in the language of its definition.
pub(super) fn virt_window_fix(need: u64, syntax: &ConfigSyntax) -> String {
    let size = crate::grace_guest::highmem_mmio_size(need) / GIB;
    match syntax {
        ConfigSyntax::Libvirt(_) => format!(
            "`<qemu:arg value='-machine'/><qemu:arg value='highmem-mmio-size={size}G'/>` in the domain's `<qemu:commandline>` (libvirt has no element for it; QEMU >= 10.0)"
        ),
        _ => format!("QEMU >= 10.0: `-machine virt,highmem-mmio-size={size}G`"),
    }
}

/// How to give the VM a `need`-byte 64-bit MMIO window, in the language of its definition.
fn hole64_fix(need: u64, syntax: &ConfigSyntax) -> String {
    let (qemu, ovmf) = (mmio::qemu_hole64_arg(need), mmio::ovmf_fw_cfg_arg(need));
    match syntax {
        ConfigSyntax::Qemu => format!("QEMU: `{qemu}`; OVMF: `{ovmf}`"),
        ConfigSyntax::Libvirt(file) => format!(
            "`<pcihole64 unit='KiB'>{}</pcihole64>` in the domain's `<controller type='pci' index='0'>` \
             (`vfio-p2p libvirt patch {file} -o {file}` writes it); with OVMF also \
             `<qemu:arg value='-fw_cfg'/><qemu:arg value='name=opt/ovmf/X-PciMmio64Mb,string={}'/>` in `<qemu:commandline>`",
            need.div_ceil(1024),
            mmio::ovmf_mmio64_mb(need)
        ),
        ConfigSyntax::Proxmox => format!(
            "add `{qemu}` to the VM config's `args:` line (with `bios: ovmf` also `{ovmf}`), then qm stop and qm start"
        ),
    }
}

pub(super) fn check_clique_placement(gpu: &Device, vmm: &VmmFacts) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    if !gpu.config_complete() {
        return result(
            "clique-placement",
            subject,
            Status::Warn,
            "capabilities unknown: only 64 bytes of config space are readable".into(),
            Some("run `vfio-p2p check` as root".into()),
        );
    }
    let cfg = gpu.config();
    let c8 = cfg.capability_starts_at(OFFSET_PRIMARY);
    let d4 = cfg.capability_starts_at(OFFSET_FALLBACK);
    let taken = |b: bool| if b { "taken" } else { "free" };
    let saw = format!("0xC8 {}, 0xD4 {}", taken(c8), taken(d4));
    let backport = "use QEMU ≥ 8.1, or QEMU 7.2 with our backport (qemu-patches/qemu-7.2/)";
    // The one placement rule (pci_config::clique::placement): where this VMM puts it.
    let qemu = placement(&cfg, Placer::WithFallback);
    match vmm.vmm {
        Vmm::CloudHypervisor => match placement(&cfg, Placer::CLOUD_HYPERVISOR) {
            Err(_) => result(
                "clique-placement",
                subject,
                Status::Fail,
                format!("{saw}; Cloud Hypervisor always writes the clique at 0xD4 and would overlay a capability"),
                Some("use QEMU ≥ 8.1 for this GPU".into()),
            ),
            Ok(_) => result("clique-placement", subject, Status::Pass, format!("{saw}; Cloud Hypervisor uses 0xD4"), None),
        },
        Vmm::Qemu if qemu == Err(PlacementRefused::NoRoom) => result(
            "clique-placement",
            subject,
            Status::Fail,
            format!("{saw}; no offset left for the clique capability"),
            Some("no QEMU can place the clique on this GPU".into()),
        ),
        Vmm::Qemu if qemu == Ok(OFFSET_PRIMARY) => result("clique-placement", subject, Status::Pass, format!("{saw}; QEMU places the clique at 0xC8"), None),
        Vmm::Qemu => match &vmm.qemu_version {
            Some(Ok(v)) if placement(&cfg, qemu_placer(v)).is_ok() => result(
                "clique-placement",
                subject,
                Status::Pass,
                format!("{saw}; QEMU {v} falls back to 0xD4"),
                None,
            ),
            Some(Ok(v)) => result(
                "clique-placement",
                subject,
                Status::Fail,
                format!("{saw}; QEMU {v} (< 8.1) always uses 0xC8 and fails to start the VM"),
                Some(backport.into()),
            ),
            Some(Err(e)) => result(
                "clique-placement",
                subject,
                Status::Warn,
                format!("{saw}; QEMU version unknown: {e}"),
                Some(format!("QEMU < 8.1 cannot start this VM: {backport}")),
            ),
            None => result(
                "clique-placement",
                subject,
                Status::Warn,
                format!("{saw}; QEMU < 8.1 cannot place the clique here (pass --qemu PATH to check the version)"),
                Some(backport.into()),
            ),
        },
    }
}

pub(super) fn check_hidden(vmm: &VmmFacts) -> CheckResult {
    if vmm.hidden_hypervisor.is_empty() {
        return result(
            "hypervisor-visible",
            None,
            Status::Pass,
            "the hypervisor is not hidden from the guest (in what was given)".into(),
            None,
        );
    }
    result(
        "hypervisor-visible",
        None,
        Status::Fail,
        format!(
            "hidden hypervisor: {}; the NVIDIA driver then ignores the clique capability and P2P stays off",
            vmm.hidden_hypervisor.join("; ")
        ),
        Some("remove kvm=off / <kvm><hidden state='on'/></kvm> (current NVIDIA drivers no longer need it)".into()),
    )
}

pub(super) fn check_plan(plan: &Result<CliquePlan, PlanError>) -> CheckResult {
    match plan {
        Err(e) => result(
            "p2p-plan",
            None,
            Status::Fail,
            e.to_string(),
            Some("as the message says; `vfio-p2p plan` explains every pair".into()),
        ),
        Ok(p) => {
            let routed = p
                .pairs
                .iter()
                .filter(|x| x.clique.is_some() && x.verdict == PairRoute::IommuRouted)
                .count();
            let saw = format!(
                "{} clique(s) for {} GPU(s); {} clique pair(s) IOMMU-routed{}",
                p.cliques.len(),
                p.assignments.len(),
                routed,
                if p.warnings.is_empty() {
                    String::new()
                } else {
                    format!("; {}", p.warnings.join("; "))
                }
            );
            let serious = p.pairs.iter().any(|x| {
                x.clique.is_some()
                    && matches!(
                        x.verdict,
                        PairRoute::Untranslated
                            | PairRoute::AcsUnknown
                            | PairRoute::CrossSocket
                            | PairRoute::CrossHostBridge
                            | PairRoute::RootComplex
                    )
            });
            if serious {
                result(
                    "p2p-plan",
                    None,
                    Status::Warn,
                    saw,
                    Some("see `vfio-p2p plan` for each pair".into()),
                )
            } else {
                result("p2p-plan", None, Status::Pass, saw, None)
            }
        }
    }
}
