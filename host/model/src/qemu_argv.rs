//! A QEMU command line's `vfio-pci` devices and the cliques already set on them, as
//! `read::qemu_argv` reads them; `qemu-wrap` decides on them and `emit::qemu_argv_patch` edits them.

use pci_config::Bdf;

/// How a `-device` argument is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSyntax {
    /// `{"driver":"vfio-pci",…}` (QEMU ≥ 6.0; what libvirt ≥ 7.9 writes).
    Json,
    /// `vfio-pci,host=…,id=…` (QemuOpts; `,,` is a literal comma).
    KeyValue,
}

/// The device types that are QEMU's vfio-pci (`vfio-pci-nohotplug` is its subclass with
/// the same properties, `x-nv-gpudirect-clique` among them).
pub const VFIO_PCI_DRIVERS: [&str; 2] = ["vfio-pci", "vfio-pci-nohotplug"];

/// Where a device's clique comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliqueSource {
    /// The device's own property.
    Device,
    /// `-set device.ID.x-nv-gpudirect-clique=K`.
    Set,
    /// `-global DRIVER.x-nv-gpudirect-clique=K` (the default of every such device).
    Global,
}

/// One `vfio-pci` device of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioDevice {
    /// Index in the argv (program excluded) of the `-device` value.
    pub arg_index: usize,
    pub syntax: DeviceSyntax,
    /// `vfio-pci` or `vfio-pci-nohotplug`.
    pub driver: String,
    pub id: Option<String>,
    /// `host=` or the address ending `sysfsdev=`; `None` when neither names one.
    pub host: Option<Bdf>,
    /// The clique value already set, in the device, through `-set` or `-global`.
    pub clique: Option<String>,
    /// Where `clique` comes from.
    pub clique_source: Option<CliqueSource>,
}

/// What `qemu-wrap` needs from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuArgvFacts {
    pub vfio: Vec<VfioDevice>,
    /// `-device` values that are not readable (bad JSON): named in the log, left alone.
    pub unreadable: Vec<String>,
}
