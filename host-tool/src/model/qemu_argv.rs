//! A QEMU command line's `vfio-pci` devices as `read::qemu_argv` reads them; emit uses
//! them from here (the read stage defines them, as it does a domain's facts).

pub use crate::read::qemu_argv::{DeviceSyntax, QemuArgvFacts, VfioDevice};
