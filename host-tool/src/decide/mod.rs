//! Decide stage: plans and verdicts computed from the model, never from sysfs.

pub mod placement;
