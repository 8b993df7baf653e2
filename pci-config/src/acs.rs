use std::fmt;

use crate::caps::EXT_CAP_ID_ACS;
use crate::config::ConfigSpace;

/// ACS capability or control bits (PCIe base spec §7.7.8).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AcsFlags(pub u16);

impl AcsFlags {
    /// Source Validation.
    pub const SV: u16 = 1 << 0;
    /// Translation Blocking.
    pub const TB: u16 = 1 << 1;
    /// P2P Request Redirect: peer requests go up to the root complex (and IOMMU).
    pub const RR: u16 = 1 << 2;
    /// P2P Completion Redirect.
    pub const CR: u16 = 1 << 3;
    /// Upstream Forwarding.
    pub const UF: u16 = 1 << 4;
    /// P2P Egress Control.
    pub const EC: u16 = 1 << 5;
    /// Direct Translated P2P: ATS-translated requests may go peer to peer directly.
    pub const DT: u16 = 1 << 6;

    const NAMES: [(&'static str, u16); 7] = [
        ("SV", Self::SV),
        ("TB", Self::TB),
        ("RR", Self::RR),
        ("CR", Self::CR),
        ("UF", Self::UF),
        ("EC", Self::EC),
        ("DT", Self::DT),
    ];

    pub fn has(&self, bit: u16) -> bool {
        self.0 & bit == bit
    }

    /// Names of the set bits, e.g. `["SV", "RR", "CR", "UF"]`.
    pub fn names(&self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(_, b)| self.has(*b))
            .map(|(n, _)| *n)
            .collect()
    }
}

/// `lspci` style: `SV+ TB- RR+ CR+ UF+ EC- DT-`.
impl fmt::Display for AcsFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, b)) in Self::NAMES.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{n}{}", if self.has(*b) { '+' } else { '-' })?;
        }
        Ok(())
    }
}

impl fmt::Debug for AcsFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AcsFlags({self})")
    }
}

impl serde::Serialize for AcsFlags {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.names())
    }
}

/// The ACS extended capability of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AcsCapability {
    pub offset: u16,
    pub capability: AcsFlags,
    pub control: AcsFlags,
}

impl AcsCapability {
    /// Peer requests and completions are redirected upstream (to the IOMMU).
    pub fn redirects_p2p(&self) -> bool {
        self.control.has(AcsFlags::RR) && self.control.has(AcsFlags::CR)
    }
}

impl ConfigSpace<'_> {
    pub fn acs(&self) -> Option<AcsCapability> {
        let c = self.find_extended_capability(EXT_CAP_ID_ACS)?;
        let base = c.offset as usize;
        Some(AcsCapability {
            offset: c.offset,
            capability: AcsFlags(self.u16_at(base + 4)?),
            control: AcsFlags(self.u16_at(base + 6)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU 7.2 `pcie-root-port`, as read in the lab: ACS at 0x148, cap 0x005f, ctl 0x001d.
    #[test]
    fn qemu_root_port_acs() {
        let mut b = vec![0u8; 4096];
        b[0x100..0x104].copy_from_slice(&(0x0001u32 | (2 << 16) | (0x148 << 20)).to_le_bytes());
        b[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        b[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        b[0x14e..0x150].copy_from_slice(&0x001du16.to_le_bytes());
        let acs = ConfigSpace::new(&b).acs().unwrap();
        assert_eq!(acs.offset, 0x148);
        assert_eq!(acs.capability.to_string(), "SV+ TB+ RR+ CR+ UF+ EC- DT+");
        assert_eq!(acs.control.to_string(), "SV+ TB- RR+ CR+ UF+ EC- DT-");
        assert!(acs.redirects_p2p());
        assert_eq!(acs.control.names(), ["SV", "RR", "CR", "UF"]);
    }
}
