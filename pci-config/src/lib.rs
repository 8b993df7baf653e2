//! PCI configuration space, as both sides of vfio-p2p need it.
//!
//! * [`Bdf`]: strict `DDDD:BB:DD.F` addresses, safe to use in sysfs paths.
//! * [`ConfigSpace`]: a read-only view over a config dump (64, 256 or 4096 bytes)
//!   with bounded, loop-proof walks of the standard and extended capability lists.
//! * Decoders for what P2P planning needs: the PCIe capability (port type, link),
//!   ACS, ATS, vendor-specific capabilities.
//! * [`clique`]: the NVIDIA GPUDirect P2P clique capability, encode and decode.
//! * [`path`]: the `nvidia-smi topo -m` label (PIX/PXB/PHB/NODE/SYS) of the path
//!   between two devices, one implementation for the host, its guest layouts and the agent.
//!
//! Nothing here panics on malformed input: a truncated or malicious config space
//! gives errors or partial results, never an out-of-bounds read or an endless loop.

#![forbid(unsafe_code)]

mod acs;
mod bdf;
mod caps;
pub mod clique;
mod config;
mod hex;
pub mod path;
mod pcie;

pub use acs::{AcsCapability, AcsFlags};
pub use bdf::{Bdf, BdfError};
pub use caps::{
    AtsCapability, CapWalk, Capability, ExtCapWalk, ExtCapability, WalkError, CAP_ID_MSI,
    CAP_ID_MSIX, CAP_ID_PCIE, CAP_ID_PM, CAP_ID_VENDOR, EXT_CAP_ID_ACS, EXT_CAP_ID_AER,
    EXT_CAP_ID_ATS,
};
pub use clique::{CliqueCap, CliqueError};
pub use config::{
    ConfigError, ConfigSpace, HeaderType, CONFIG_SPACE_EXTENDED, CONFIG_SPACE_LEGACY,
    CONFIG_SPACE_UNPRIVILEGED,
};
pub use hex::{parse_hex_dump, HexError};
pub use path::{
    classify, path_label, DevicePath, DevicePlace, PathBridge, PathClass, PathKind, RootComplex,
};
pub use pcie::{LinkSpeed, PcieCapability, PciePortType};
