//! Emit stage: turns decided data into text. Never reads sysfs.

#![forbid(unsafe_code)]

pub mod check;
pub mod cloud_hypervisor;
pub mod data;
pub mod fabric_list;
pub mod incus;
pub mod libvirt;
pub mod libvirt_grace;
pub mod libvirt_patch;
pub mod nccl;
pub mod node_ranges;
pub mod place_report;
pub mod plan_table;
pub mod proxmox;
pub mod qemu;
pub mod qemu_argv_patch;
pub mod qemu_grace;
pub mod topo_dot;
pub mod topo_report;
pub mod verdicts;
pub mod vm;
pub mod vm_text;
