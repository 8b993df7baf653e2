//! QEMU command line for an aarch64 guest ([`ArmVirt`]): `qemu-system-aarch64 -machine
//! virt`, AAVMF, GICv3. A Grace guest has the CPU nodes and each GPU's generic-initiator
//! nodes with the host's distances, per physical SMMU a `pxb-pcie` with its `arm-smmuv3`
//! (or one machine-wide SMMUv3 for an older QEMU), per GPU a root port, its `vfio-pci`
//! and one `acpi-generic-initiator` per node; an Arm host's guest of PCIe GPUs has the x86
//! guest's NUMA nodes and PCIe tree, and none of those Grace pieces. Everything here was
//! decided in `vfio_p2p_decide::grace_guest` and `vfio_p2p_decide::arm_pcie_guest`.
//!
//! Not written, because only NVIDIA's QEMU fork or real Grace hardware has them:
//! `arm-smmuv3,accel=on` (QEMU >= 11.0, nested translation on the host SMMU), the
//! Tegra241 CMDQV (`cmdqv=on`) and EGM (docs/gen.md, "Grace hosts").

use serde_json::json;

use super::qemu::{bridge_device, gpu_devices, guest_io, DeviceJson};
use super::vm::{cpulist, VmDefinition, IOMMUFD_OBJECT_ID};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_decide::arm_pcie_guest::ArmPcieGuest;
use vfio_p2p_decide::grace_guest::{GraceGuest, SmmuForm};

pub const QEMU_AARCH64_BINARY: &str = "qemu-system-aarch64";

/// The aarch64 `virt` guest being written, as decided.
#[derive(Debug, Clone, Copy)]
pub enum ArmVirt<'a> {
    /// A Grace host's: GPU NUMA nodes, vSMMUs, huge pages.
    Grace(&'a GraceGuest),
    /// An Arm host's with PCIe GPUs: the x86 guest's tree, no SMMU, no GPU nodes.
    Pcie(&'a ArmPcieGuest),
}

impl<'a> ArmVirt<'a> {
    pub fn grace(self) -> Option<&'a GraceGuest> {
        match self {
            ArmVirt::Grace(g) => Some(g),
            ArmVirt::Pcie(_) => None,
        }
    }

    /// `highmem-mmio-size`, bytes, where decided.
    pub fn highmem_mmio_size(self) -> Option<u64> {
        match self {
            ArmVirt::Grace(g) => g.highmem_mmio_size,
            ArmVirt::Pcie(p) => p.highmem_mmio_size,
        }
    }

    /// The huge page size backing guest RAM, KiB, where decided (Grace only).
    pub fn hugepage_kib(self) -> Option<u64> {
        self.grace().and_then(|g| g.hugepage_kib)
    }
}

/// `-machine virt,…`: KVM, GICv3, the SMMU form, the high MMIO window.
fn machine(arm: ArmVirt) -> String {
    let mut m = String::from("virt,accel=kvm,gic-version=3");
    if arm.grace().map(|g| g.smmu_form) == Some(SmmuForm::MachineWide) {
        m.push_str(",iommu=smmuv3");
    }
    if let Some(size) = arm.highmem_mmio_size() {
        m.push_str(&format!(",highmem-mmio-size={}G", size >> 30));
    }
    m
}

/// The memory backend of CPU node `id`: huge pages where decided, bound to its host node.
pub fn memory_backend(arm: ArmVirt, id: u32, mib: u64, host_node: u32) -> String {
    match arm.hugepage_kib() {
        Some(kib) => format!(
            "memory-backend-memfd,id=mem{id},size={mib}M,hugetlb=on,hugetlbsize={}M,host-nodes={host_node},policy=bind",
            kib / 1024
        ),
        None => format!(
            "memory-backend-ram,id=mem{id},size={mib}M,host-nodes={host_node},policy=bind"
        ),
    }
}

/// `-numa dist` values for every pair once (QEMU fills in the other direction).
pub fn distance_options(g: &GraceGuest) -> Vec<String> {
    if !g.distances_from_host {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (a, row) in g.distances.iter().enumerate() {
        for (b, d) in row.iter().enumerate().skip(a + 1) {
            out.push(format!("dist,src={a},dst={b},val={d}"));
        }
    }
    out
}

/// The `-object acpi-generic-initiator` values: each GPU tied to each of its nodes.
pub fn generic_initiators(g: &GraceGuest) -> Vec<String> {
    g.gpus
        .iter()
        .flat_map(|gpu| {
            gpu.nodes.iter().enumerate().map(move |(j, n)| {
                format!(
                    "acpi-generic-initiator,id={}-gi{j},pci-dev={},node={}",
                    gpu.gpu, gpu.gpu, n.id
                )
            })
        })
        .collect()
}

/// The whole command line, program first.
pub fn argv(vm: &VmDefinition, arm: ArmVirt) -> Vec<String> {
    let grace = arm.grace();
    let c = vm.config;
    let mut a: Vec<String> = vec![QEMU_AARCH64_BINARY.into()];
    let mut opt = |k: &str, v: String| {
        a.push(k.into());
        a.push(v);
    };
    opt("-name", format!("{},debug-threads=on", c.name));
    opt("-machine", machine(arm));
    opt("-cpu", "host".into());
    opt("-smp", c.vcpus.to_string());
    opt("-m", format!("{}M", c.memory_mib));
    for (i, node) in vm.layout.numa_nodes.iter().enumerate() {
        let (cpus, mem) = vm.numa_share(i);
        opt("-object", memory_backend(arm, node.id, mem, node.host_node));
        let mut numa = format!("node,nodeid={},memdev=mem{}", node.id, node.id);
        if !cpus.is_empty() {
            numa.push_str(&format!(",cpus={}", cpulist(&cpus)));
        }
        opt("-numa", numa);
    }
    // the GPUs' nodes: no CPUs, no memory (the GPU's memory comes through its BAR)
    for n in grace
        .iter()
        .flat_map(|g| g.gpus.iter().flat_map(|gpu| &gpu.nodes))
    {
        opt("-numa", format!("node,nodeid={}", n.id));
    }
    for d in grace.map(distance_options).unwrap_or_default() {
        opt("-numa", d);
    }
    let firmware = vm.aarch64_firmware().replace(',', ",,");
    opt(
        "-drive",
        format!("if=pflash,format=raw,unit=0,readonly=on,file={firmware}"),
    );
    if let Some(vars) = &c.ovmf_vars {
        let vars = vars.display().to_string().replace(',', ",,");
        opt("-drive", format!("if=pflash,format=raw,unit=1,file={vars}"));
    }
    let iommufd = (vm.iommu_backend == IommuBackend::Iommufd).then_some(IOMMUFD_OBJECT_ID);
    if let Some(id) = iommufd {
        opt("-object", format!("iommufd,id={id}"));
    }
    for b in &vm.layout.bridges {
        opt("-device", bridge_device(b).to_string());
        let smmus = grace.map_or(&[][..], |g| &g.smmus);
        if let Some(s) = smmus.iter().find(|s| s.primary_bus == b.id) {
            let mut m = DeviceJson::default();
            m.insert("driver", json!("arm-smmuv3"));
            m.insert("primary-bus", json!(s.primary_bus));
            m.insert("id", json!(s.id));
            opt("-device", m.to_string());
        }
    }
    for d in vm.layout.passed() {
        for dev in gpu_devices(d, iommufd) {
            opt("-device", dev.to_string());
        }
    }
    for gi in grace.map(generic_initiators).unwrap_or_default() {
        opt("-object", gi);
    }
    for (k, v) in guest_io(vm) {
        opt(k, v);
    }
    opt("-fw_cfg", vm.fw_cfg_expectation());
    if let Some(r) = c.report {
        opt(
            "-device",
            format!("vhost-vsock-pci,guest-cid={},id=vsock0", r.cid),
        );
    }
    a
}
