//! Emit stage: turns decided data into text. Never reads sysfs.

pub mod data;
pub mod plan;
