//! The guest's sysfs, the one module of the agent that reads it.

pub mod gpus;
