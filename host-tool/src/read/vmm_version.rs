//! Versions of the VMM stack (QEMU, libvirt) and what each can do, as read by `read::vmm`.

use std::fmt;
use std::str::FromStr;

/// A QEMU version, from `qemu-system-x86_64 --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// Built with our `qemu-patches/` backport (local version suffix `+vfiop2p`),
    /// so it falls back to 0xD4 whatever its version number says.
    pub clique_backport: bool,
}

impl fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if self.clique_backport {
            f.write_str(" with the vfio-p2p clique backport")?;
        }
        Ok(())
    }
}

impl QemuVersion {
    /// First QEMU with the 0xD4 fallback for GPUs that have a capability at 0xC8.
    pub const CLIQUE_FALLBACK: QemuVersion = QemuVersion {
        major: 8,
        minor: 1,
        micro: 0,
        clique_backport: false,
    };

    /// Whether this QEMU places the clique at 0xD4 when 0xC8 is taken.
    pub fn has_clique_fallback(&self) -> bool {
        self.clique_backport || *self >= Self::CLIQUE_FALLBACK
    }
}

/// A libvirt version, `major.minor[.micro]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibvirtVersion {
    pub major: u32,
    pub minor: u32,
}

/// The first libvirt with `<qemu:override>`.
pub const OVERRIDE_SINCE: LibvirtVersion = LibvirtVersion { major: 8, minor: 2 };

impl FromStr for LibvirtVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{s}' is not a libvirt version; give MAJOR.MINOR, e.g. 9.0");
        let mut parts = s.trim().split('.');
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        match parts.next() {
            Some(p) if p.parse::<u32>().is_err() => return Err(bad()),
            _ => {}
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(LibvirtVersion { major, minor })
    }
}

impl fmt::Display for LibvirtVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl LibvirtVersion {
    pub fn has_override(&self) -> bool {
        *self >= OVERRIDE_SINCE
    }
}
