//! vfio-p2p host tool: the command line over the host crates.
//!
//! Data flows one way, and the crates enforce it: `vfio_p2p_read` (sysfs, snapshots,
//! captures, VM definitions, probes) → `vfio_p2p_model` (typed topology and facts) →
//! `vfio_p2p_decide` (paths, cliques, checks; pure) → `vfio_p2p_emit` (reports and VMM
//! configs). [`commands`] wires the stages to the CLI, each command starting from one
//! [`context::Context`]. docs/architecture.md maps it all.

#![forbid(unsafe_code)]

pub mod cli;
pub mod commands;
pub mod context;
pub mod logging;

pub use commands::command;
