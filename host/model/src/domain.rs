//! What a libvirt domain XML says that matters here, as read by `read::domain_xml`,
//! `read::proxmox_conf` and `read::incus`: the PCI hostdevs, the cliques already set, every way the hypervisor is hidden, the 64-bit
//! MMIO hole, and the byte positions `libvirt patch` edits at (it never re-serializes).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use pci_config::Bdf;

/// The namespace of libvirt's QEMU passthrough elements (`qemu:commandline`, `qemu:override`).
pub const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

/// One `<hostdev mode='subsystem' type='pci'>` with a `<source><address>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciHostdev {
    /// The host address, read as libvirt reads it.
    pub bdf: Bdf,
    /// `managed='yes'`: libvirt binds it itself; absent means no.
    pub managed: bool,
    /// `<alias name='…'/>`: the name and the element's byte range.
    pub alias: Option<(Range<usize>, String)>,
    /// Where `</hostdev>` starts.
    pub end_tag: usize,
}

impl PciHostdev {
    pub fn alias_name(&self) -> Option<&str> {
        self.alias.as_ref().map(|(_, n)| n.as_str())
    }
}

/// Where a clique value was set in the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliqueSource {
    /// `<qemu:override><qemu:device alias=…><qemu:frontend><qemu:property …/>`.
    Override,
    /// `<qemu:commandline>` `-set device.ALIAS.x-nv-gpudirect-clique=N`.
    Commandline,
    /// Another VM definition's key (Incus's `nvidia.clique`, `raw.qemu`, `raw.qemu.conf`).
    ConfigKey(&'static str),
}

impl fmt::Display for CliqueSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CliqueSource::Override => "qemu:override",
            CliqueSource::Commandline => "qemu:commandline",
            CliqueSource::ConfigKey(k) => k,
        })
    }
}

/// A clique setting as written (the value is judged later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliqueSetting {
    pub value: String,
    pub source: CliqueSource,
}

/// One way a domain hides the hypervisor from the guest (the NVIDIA driver then ignores
/// the clique capability).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HiddenHypervisor {
    /// `<features><kvm><hidden state='on'/>`.
    KvmHidden,
    /// `<cpu><feature policy='disable|forbid' name='hypervisor'/>`.
    CpuFeatureDisabled { policy: String },
    /// `<qemu:commandline>` passes `-cpu …,kvm=off`.
    QemuCpuKvmOff { cpu: String },
    /// Another VM definition's way (a Proxmox `cpu: hidden=1`), as the reader words it.
    Described(String),
}

impl fmt::Display for HiddenHypervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HiddenHypervisor::KvmHidden => f.write_str("<features><kvm><hidden state='on'/>"),
            HiddenHypervisor::CpuFeatureDisabled { policy } => {
                write!(f, "<cpu><feature policy='{policy}' name='hypervisor'/>")
            }
            HiddenHypervisor::QemuCpuKvmOff { cpu } => {
                write!(f, "<qemu:commandline> passes -cpu {cpu}")
            }
            HiddenHypervisor::Described(how) => f.write_str(how),
        }
    }
}

/// The 64-bit PCI hole the domain asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hole64 {
    pub bytes: u64,
    /// `<pcihole64>` or the `<qemu:arg>` that set it.
    pub source: String,
}

/// One `<qemu:device>` of `<qemu:override>`: positions for the patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideDevice {
    /// Where `</qemu:device>` starts.
    pub end_tag: usize,
    /// Where `</qemu:frontend>` starts, if there is one.
    pub frontend_end_tag: Option<usize>,
    /// The clique property's element range and value.
    pub property: Option<(Range<usize>, String)>,
}

/// Byte positions in the document that `libvirt patch` inserts at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainPositions {
    /// The closing `>` of the `<domain …>` start tag.
    pub domain_tag_close: usize,
    /// Where `</domain>` starts.
    pub domain_end_tag: usize,
    /// Where `</qemu:override>` starts.
    pub override_end_tag: Option<usize>,
    /// Where `</qemu:commandline>` starts.
    pub commandline_end_tag: Option<usize>,
    /// Alias → its `<qemu:device>` in `<qemu:override>`.
    pub override_devices: BTreeMap<String, OverrideDevice>,
    /// Each `<qemu:arg>` element's range, in the order of `DomainFacts::commandline_args`.
    pub commandline_arg_spans: Vec<Range<usize>>,
    /// The root PCI controller (`<controller type='pci' index='0'>`): its start tag's range,
    /// and whether that tag is the whole element (`<controller …/>`).
    pub root_controller: Option<(Range<usize>, bool)>,
    /// `<pcihole64 …>` and its text: from the start tag to where `</pcihole64>` starts.
    pub hole64_element: Option<Range<usize>>,
    /// The index in `DomainFacts::commandline_args` of the `pci-hole64-size=` argument that
    /// set `DomainFacts::hole64`.
    pub hole64_arg: Option<usize>,
    /// The index in `DomainFacts::commandline_args` of the `highmem-mmio-size=` argument
    /// that set `DomainFacts::highmem_mmio`.
    pub highmem_mmio_arg: Option<usize>,
    /// Where `</devices>` starts.
    pub devices_end_tag: Option<usize>,
}

/// Everything the tool uses from a domain XML.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainFacts {
    /// Where the XML came from (a path or `<stdin>`), for messages.
    pub source_name: String,
    pub name: Option<String>,
    /// `<os><type machine='…'>` (`pc-q35-7.2`, `q35`, `pc-i440fx-…`, `virt`).
    pub machine: Option<String>,
    /// `<os><type arch='…'>` (`x86_64`, `aarch64`), where the domain names it.
    pub arch: Option<String>,
    pub emulator: Option<String>,
    pub hostdevs: Vec<PciHostdev>,
    /// Alias → clique settings (more than one is a mistake too).
    pub cliques: BTreeMap<String, Vec<CliqueSetting>>,
    pub hidden_hypervisor: Vec<HiddenHypervisor>,
    pub hole64: Option<Hole64>,
    /// Arm `virt`'s high PCIe MMIO window, `highmem-mmio-size=` in `<qemu:commandline>`
    /// (libvirt has no element for it).
    pub highmem_mmio: Option<Hole64>,
    /// `xmlns:qemu` is declared on `<domain>` (with the right URI: a wrong one is an error).
    pub has_qemu_ns: bool,
    /// `<qemu:commandline>` arguments, in order.
    pub commandline_args: Vec<String>,
    pub positions: DomainPositions,
}

impl DomainFacts {
    /// The domain is QEMU's Arm `virt` machine (a Grace guest:
    /// `<type arch='aarch64' machine='virt'>`), as [`crate::vmm::is_arm_virt`] says.
    pub fn is_arm_virt(&self) -> bool {
        (self.machine.as_deref()).is_some_and(|m| crate::vmm::is_arm_virt(self.arch.as_deref(), m))
    }

    /// The window the GPUs' 64-bit BARs go in, where the domain sets it: on Arm `virt` the
    /// high PCIe window (`highmem-mmio-size`), elsewhere the 64-bit PCI hole.
    pub fn mmio_window(&self) -> Option<&Hole64> {
        match self.is_arm_virt() {
            true => self.highmem_mmio.as_ref(),
            false => self.hole64.as_ref(),
        }
    }
}
