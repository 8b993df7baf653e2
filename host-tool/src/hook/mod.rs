//! The libvirt `qemu` hook: before a guest starts, bind its `managed='no'` GPUs and check
//! its cliques against the host; after it stops, give the GPUs back. Never calls libvirt.

pub mod check;
pub mod domain;
