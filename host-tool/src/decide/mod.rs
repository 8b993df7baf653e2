//! Decide stage: guest layouts, expectations and sizes derived from the topology.

pub mod expectation;
pub mod guest_layout;
pub mod mmio;
