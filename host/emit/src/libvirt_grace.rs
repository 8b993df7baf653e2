//! libvirt domain XML for an aarch64 guest ([`ArmVirt`]): `arch='aarch64'`, machine
//! `virt`, AAVMF, GICv3. A Grace guest has the CPU cells and each GPU's memory-0 cells with
//! the host's distances, huge pages, its SMMUv3s, the GPUs on root ports; an Arm host's
//! guest of PCIe GPUs has the x86 guest's cells and PCIe tree, and no SMMU.
//!
//! What libvirt has no element for goes in `<qemu:commandline>`, with a comment saying so:
//! the high MMIO window (`-machine highmem-mmio-size=`, merged with libvirt's own
//! `-machine`) and, before [`ACPI_NODESET_SINCE`], the `acpi-generic-initiator` objects
//! (from then on each GPU's hostdev carries `<acpi nodeset='…'/>` and libvirt writes them).
//! The per-bus vSMMU (`gen qemu` gives one per physical SMMU) is not written here: libvirt's
//! form for it and its first version are not checked, so the machine gets one.

use std::fmt::Write;

use quick_xml::escape::escape;

use super::libvirt::{
    clique_entries, controller_index, hostdev_aliases, iommufd_override_devices, override_devices,
    set_args, write_bridges, write_console, write_disks_and_nic, write_hostdevs, write_numa_tune,
    write_vsock,
};
use super::qemu_grace::{generic_initiators, ArmVirt};
use super::vm::{cpulist, VmDefinition, AAVMF_VARS, IOMMUFD_OBJECT_ID};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_decide::grace_guest::SmmuForm;
use vfio_p2p_model::domain::QEMU_NS;
use vfio_p2p_model::vmm::{LibvirtVersion, ACPI_NODESET_SINCE};

/// The domain XML of an aarch64 guest.
pub fn domain(vm: &VmDefinition, arm: ArmVirt, version: LibvirtVersion) -> String {
    let grace = arm.grace();
    let mut x = String::new();
    let w = &mut x;
    let _ = writeln!(w, "<domain type='kvm' xmlns:qemu='{QEMU_NS}'>");
    write_machine(w, vm, arm);
    write_numa_tune(w, vm);
    write_cpu(w, vm, arm);
    let _ = writeln!(w, "  <devices>");
    let _ = writeln!(w, "    <controller type='usb' model='none'/>");
    let _ = writeln!(
        w,
        "    <controller type='pci' index='0' model='pcie-root'/>"
    );
    write_bridges(w, vm);
    let native_iommufd = vm.iommu_backend == IommuBackend::Iommufd && version.has_iommufd();
    for d in vm.layout.passed() {
        let acpi = grace
            .iter()
            .flat_map(|g| &g.gpus)
            .find(|n| n.gpu == d.id && version.has_acpi_nodeset())
            .map(|n| {
                let ids: Vec<u32> = n.nodes.iter().map(|n| n.id).collect();
                format!("<acpi nodeset='{}'/>", crate::node_ranges::node_list(&ids))
            });
        let bus = controller_index(vm, &d.parent);
        write_hostdevs(w, d, bus, native_iommufd, acpi.as_deref());
    }
    match grace.map(|g| (g.smmu_form, &g.smmus)) {
        None => {}
        Some((SmmuForm::MachineWide, _)) => {
            let _ = writeln!(w, "    <iommu model='smmuv3'/>");
        }
        // one per physical SMMU, on its expander bus (libvirt >= 11.10: pciBus is the
        // controller's index)
        Some((SmmuForm::PerPhysical, smmus)) => {
            for s in smmus {
                let _ = writeln!(
                    w,
                    "    <iommu model='smmuv3'>\n      <driver pciBus='{}'/>\n    </iommu>",
                    controller_index(vm, &s.primary_bus)
                );
            }
        }
    }
    write_vsock(w, vm);
    write_disks_and_nic(w, vm);
    // virt's serial port is a PL011: the guest's ttyAMA0
    write_console(
        w,
        vm,
        "<target type='system-serial' port='0'>\n        <model name='pl011'/>\n      </target>",
    );
    let _ = writeln!(w, "    <memballoon model='none'/>");
    let _ = writeln!(w, "  </devices>");
    write_qemu_elements(w, vm, arm, version);
    let _ = writeln!(w, "</domain>");
    x
}

/// Name, memory (huge pages for the CPU cells), vCPUs, aarch64 virt with AAVMF, GICv3.
fn write_machine(w: &mut String, vm: &VmDefinition, arm: ArmVirt) {
    let c = vm.config;
    let _ = writeln!(w, "  <name>{}</name>", escape(c.name.as_str()));
    let _ = writeln!(w, "  <memory unit='MiB'>{}</memory>", c.memory_mib);
    if let Some(kib) = arm.hugepage_kib() {
        let ids: Vec<u32> = vm.layout.numa_nodes.iter().map(|n| n.id).collect();
        let _ = writeln!(
            w,
            "  <memoryBacking>\n    <hugepages>\n      <page size='{kib}' unit='KiB' nodeset='{}'/>\n    </hugepages>\n  </memoryBacking>",
            crate::node_ranges::node_list(&ids)
        );
    }
    let _ = writeln!(w, "  <vcpu placement='static'>{}</vcpu>", c.vcpus);
    let _ = writeln!(w, "  <os>");
    let _ = writeln!(w, "    <type arch='aarch64' machine='virt'>hvm</type>");
    let _ = writeln!(
        w,
        "    <loader readonly='yes' type='pflash'>{}</loader>",
        escape(vm.aarch64_firmware().as_str())
    );
    let vars = c
        .ovmf_vars
        .as_ref()
        .map_or(AAVMF_VARS.to_string(), |p| p.display().to_string());
    let _ = writeln!(w, "    <nvram template='{}'/>", escape(vars.as_str()));
    let _ = writeln!(w, "  </os>");
    let _ = writeln!(
        w,
        "  <features>\n    <acpi/>\n    <gic version='3'/>\n  </features>"
    );
}

/// host-passthrough with one cell per CPU node, then each GPU's memory-0 cells (Grace);
/// every cell with its distances where they are the host's (Grace). No cells, no `<numa>`.
fn write_cpu(w: &mut String, vm: &VmDefinition, arm: ArmVirt) {
    let grace = arm.grace();
    if vm.layout.numa_nodes.is_empty() && grace.is_none() {
        let _ = writeln!(w, "  <cpu mode='host-passthrough'/>");
        return;
    }
    let _ = writeln!(w, "  <cpu mode='host-passthrough'>\n    <numa>");
    let from_host = grace.is_some_and(|g| g.distances_from_host);
    let distances = |w: &mut String, id: u32| {
        let Some(row) = grace
            .and_then(|g| g.distances.get(id as usize))
            .filter(|_| from_host)
        else {
            return;
        };
        let _ = writeln!(w, "        <distances>");
        for (j, d) in row.iter().enumerate() {
            let _ = writeln!(w, "          <sibling id='{j}' value='{d}'/>");
        }
        let _ = writeln!(w, "        </distances>");
    };
    let close = if from_host { ">" } else { "/>" };
    for (i, n) in vm.layout.numa_nodes.iter().enumerate() {
        let (cpus, mem) = vm.numa_share(i);
        let _ = writeln!(
            w,
            "      <cell id='{}' cpus='{}' memory='{mem}' unit='MiB'{close}",
            n.id,
            cpulist(&cpus)
        );
        distances(w, n.id);
        if from_host {
            let _ = writeln!(w, "      </cell>");
        }
    }
    for n in grace
        .iter()
        .flat_map(|g| g.gpus.iter().flat_map(|gpu| &gpu.nodes))
    {
        let _ = writeln!(w, "      <cell id='{}' memory='0' unit='KiB'{close}", n.id);
        distances(w, n.id);
        if from_host {
            let _ = writeln!(w, "      </cell>");
        }
    }
    let _ = writeln!(w, "    </numa>\n  </cpu>");
}

/// fw_cfg's expectation, the window and (older libvirt) the generic initiators in
/// `<qemu:commandline>`; the cliques (and iommufd before libvirt has it) as for x86.
fn write_qemu_elements(w: &mut String, vm: &VmDefinition, arm: ArmVirt, version: LibvirtVersion) {
    let cliques = clique_entries(&vm.layout.gpus);
    let iommufd_aliases = if vm.iommu_backend == IommuBackend::Iommufd && !version.has_iommufd() {
        hostdev_aliases(vm.layout.passed())
    } else {
        Vec::new()
    };
    let _ = writeln!(w, "  <qemu:commandline>");
    let arg = |w: &mut String, a: &str| {
        let _ = writeln!(w, "    <qemu:arg value='{}'/>", escape(a));
    };
    arg(w, "-fw_cfg");
    arg(w, &vm.fw_cfg_expectation());
    if let Some(size) = arm.highmem_mmio_size() {
        let _ = writeln!(
            w,
            "    <!-- libvirt has no element for virt's highmem-mmio-size -->"
        );
        arg(w, "-machine");
        arg(w, &format!("highmem-mmio-size={}G", size >> 30));
    }
    if let Some(g) = arm.grace().filter(|_| !version.has_acpi_nodeset()) {
        let _ = writeln!(w, "    <!-- libvirt {version} has no element for acpi-generic-initiator (<acpi nodeset> on the hostdev from {ACPI_NODESET_SINCE}) -->");
        for gi in generic_initiators(g) {
            arg(w, "-object");
            // the GPU's QEMU id under libvirt is its hostdev alias
            arg(w, &gi.replace("pci-dev=", "pci-dev=ua-"));
        }
    }
    if !iommufd_aliases.is_empty() {
        arg(w, "-object");
        arg(w, &format!("iommufd,id={IOMMUFD_OBJECT_ID}"));
    }
    if !version.has_override() {
        for a in set_args(&cliques) {
            arg(w, &a);
        }
        for a in &iommufd_aliases {
            arg(w, "-set");
            arg(w, &format!("device.{a}.iommufd={IOMMUFD_OBJECT_ID}"));
        }
    }
    let _ = writeln!(w, "  </qemu:commandline>");
    if version.has_override() && (!cliques.is_empty() || !iommufd_aliases.is_empty()) {
        let _ = writeln!(w, "  <qemu:override>");
        if iommufd_aliases.is_empty() {
            w.push_str(&override_devices(&cliques, "    "));
        } else {
            w.push_str(&iommufd_override_devices(&iommufd_aliases, &cliques));
        }
        let _ = writeln!(w, "  </qemu:override>");
    }
}
