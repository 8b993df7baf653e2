//! Emit stage: turns decided data into text. Never reads sysfs.

pub mod check;
pub mod data;
pub mod plan;
pub mod topo_report;
