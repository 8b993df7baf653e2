//! vfio-p2p-agent: runs inside a guest (or on bare metal, for a baseline) and checks,
//! per GPU pair, that the hypervisor gave the expected P2P clique, that the driver
//! enables peer access, that writes really land in the peer's memory, and how fast
//! the path is.
//!
//! Every `unsafe` of the agent is in its FFI crates (`vfio-p2p-cuda-driver`,
//! `vfio-p2p-nvml`, `vfio-p2p-fd-passing`); this crate has none.

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod cross_gpu;
pub mod cross_process;
pub mod expect;
pub mod fabric;
pub mod guest_numa;
pub mod guest_topo;
pub mod kernels;
pub mod link_verdict;
pub mod measure;
pub mod nccl_allreduce;
pub mod nccl_topo;
pub mod peers;
pub mod render;
pub mod report;
pub mod schedule;
pub mod send;
pub mod setup_probe;
pub mod stats;
pub mod sysfs;
pub mod verify;

pub use cli::command;
