//! VMM versions (QEMU, libvirt) and what each can do, as `read::vmm` reads them.

pub use crate::read::vmm_version::*;
