//! The host tool's integration tests, one test binary (one link on a 2-core machine):
//! each module is what was a file of its own. `fabric_rollback` keeps its own binary: it
//! sets process environment (the Fabric Manager library to load) that the others must
//! not inherit.

mod arm_pcie_recorded;
mod cli;
#[path = "../fm_standin/mod.rs"]
mod fm_standin;
#[path = "../recording/mod.rs"]
mod recording;
#[path = "../../../tests/hostile/support.rs"]
mod support;

mod bind_cli;
mod closed_pipe;
mod cloud_hypervisor_real;
mod collector;
mod colour;
mod completion_values;
mod contract_round_trip;
mod doc_commands;
mod doc_test_commands;
mod fabric;
mod fabric_hook;
mod first_run;
mod fresh_host;
mod gen_address_space;
mod gen_arm_pcie;
mod gen_boot;
mod gen_golden;
mod gen_grace;
mod gen_guest_io;
mod gen_vsock;
mod grace_lab;
mod grace_libvirt;
mod guest_io_real;
mod help_and_addresses;
mod hook_cli;
mod hostile;
mod hostile_reproducers;
mod import_circles;
mod incus;
mod installed_tools;
mod kubevirt;
mod lab_script;
mod libvirt_patch;
mod nccl_dump;
mod nics;
mod nvlsm;
mod place;
mod plan_check;
mod printed_fixes;
mod proxmox_real;
mod qemu_wrap;
mod read_failures;
mod readme;
mod real_tools;
mod structure;
mod topo;
mod topo_views;
mod versions;
mod widths;
