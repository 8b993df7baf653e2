//! Read stage: turns a host's sysfs (live, a snapshot directory, or a flat JSON
//! dump) into a [`vfio_p2p_model::HostRecord`], and `nvidia-smi` captures into an
//! [`vfio_p2p_model::NvlinkMap`], libvirt domain XML into [`vfio_p2p_model::domain::DomainFacts`]
//! (`domain_xml`), and what QEMU and libvirt say of themselves into versions (`vmm`).
//! Nothing else in the crate reads these inputs.

#![forbid(unsafe_code)]

pub mod attr;
pub mod binding;
pub mod cpuinfo;
mod device_record;
pub mod disk_image;
pub mod domain_xml;
pub mod fabric_manager;
pub mod flat_json;
pub mod fm_api;
pub mod fm_capture;
pub mod fm_config;
pub mod guest_report;
pub mod host_probe;
pub mod incus;
pub mod iomem;
pub mod iommu_unit;
pub mod kubevirt_vmi;
pub mod numa_sysfs;
pub mod nvidia_smi;
pub mod outside_call;
pub mod proxmox_conf;
pub mod qemu_argv;
pub mod snapshot;
pub mod synth;
pub mod sysfs;
pub mod vmm;

pub use binding::{devices_use, read_binding, Binding, DeviceUse, HostUser};
pub use sysfs::{read_host, ReadError};
