//! vfio-p2p host tool.
//!
//! Data flows one way: [`read`] (sysfs, snapshots) → [`model`] (typed topology)
//! → decide (paths, cliques, checks) → [`emit`] (reports and VMM configs).
//! Emitters never read sysfs. [`commands`] wires the stages to the CLI, each command
//! starting from one [`context::Context`]. docs/architecture.md maps it all.

pub mod cli;
pub mod collector;
pub mod commands;
pub mod config;
pub mod context;
pub mod decide;
pub mod emit;
pub mod fm_api;
pub mod host_probe;
pub mod logging;
pub mod model;
pub mod partition_activation;
pub mod read;
pub mod snapshot;
pub mod synth;
pub mod vfio_bind;

pub use cli::command;
