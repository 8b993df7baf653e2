//! Decide stage: pure decisions over a [`Topology`](vfio_p2p_model::Topology) and
//! facts gathered by the commands. Nothing here reads sysfs or opens devices, so every
//! decision is testable on synthetic hosts.

#![forbid(unsafe_code)]

pub mod address_space;
pub mod arm_pcie_guest;
pub mod check;
pub mod clique_offset;
pub mod clique_plan;
pub mod cloud_hypervisor;
pub mod expectation;
pub mod fabric;
pub mod fleet_verdict;
pub mod grace_guest;
pub mod guest_layout;
pub mod guest_paths;
pub mod iommu_backend;
pub mod mmio;
pub mod nic_affinity;
pub mod nvlink;
pub mod pair_links;
pub mod place_plan;
pub mod placement;
pub mod plan_reach;
pub mod proxmox;
pub mod reset;
pub mod vm;
pub mod vm_boot;
pub mod vm_refusal;
