//! Read stage: turns a host's sysfs (live, a snapshot directory, or a flat JSON
//! dump) into a [`HostRecord`], and `nvidia-smi` captures into an
//! [`nvidia_smi::NvlinkMap`], libvirt domain XML into [`crate::model::domain::DomainFacts`]
//! (`domain_xml`), and what QEMU and libvirt say of themselves into versions (`vmm`).
//! Nothing else in the crate reads these inputs.

pub mod attr;
pub mod binding;
pub mod cpuinfo;
pub mod disk_image;
pub mod domain_facts;
pub mod domain_xml;
pub mod fabric_facts;
pub mod fabric_manager;
pub mod flat_json;
pub mod fm_capture;
pub mod fm_config;
pub mod guest_report;
pub mod incus;
pub mod input_file;
pub mod kubevirt_vmi;
pub mod nvidia_smi;
pub mod proxmox_conf;
pub mod qemu_argv;
pub mod record;
pub mod sysfs;
pub mod vmm;
pub mod vmm_version;

pub use binding::{devices_use, read_binding, Binding, DeviceUse, HostUser};
pub use record::{DeviceRecord, HostBridgeId, HostRecord, ReadWarning, Resource};
pub use sysfs::{read_host, ReadError};
