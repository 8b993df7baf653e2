use std::fmt;

use crate::caps::CAP_ID_PCIE;
use crate::config::ConfigSpace;

/// Device/port type from the PCIe Capabilities register (bits 7:4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PciePortType {
    Endpoint,
    LegacyEndpoint,
    RootPort,
    UpstreamPort,
    DownstreamPort,
    PcieToPciBridge,
    PciToPcieBridge,
    RcIntegratedEndpoint,
    RcEventCollector,
    Reserved(u8),
}

impl PciePortType {
    fn from_bits(v: u8) -> Self {
        match v {
            0x0 => Self::Endpoint,
            0x1 => Self::LegacyEndpoint,
            0x4 => Self::RootPort,
            0x5 => Self::UpstreamPort,
            0x6 => Self::DownstreamPort,
            0x7 => Self::PcieToPciBridge,
            0x8 => Self::PciToPcieBridge,
            0x9 => Self::RcIntegratedEndpoint,
            0xa => Self::RcEventCollector,
            other => Self::Reserved(other),
        }
    }
}

/// PCIe link speed as encoded in Link Capabilities / Link Status (bits 3:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkSpeed(pub u8);

impl LinkSpeed {
    /// Transfer rate in GT/s, if the encoding is known.
    pub fn gts(&self) -> Option<f32> {
        Some(match self.0 {
            1 => 2.5,
            2 => 5.0,
            3 => 8.0,
            4 => 16.0,
            5 => 32.0,
            6 => 64.0,
            _ => return None,
        })
    }

    /// PCIe generation (1..=6).
    pub fn generation(&self) -> Option<u8> {
        (1..=6).contains(&self.0).then_some(self.0)
    }

    /// Parses sysfs `current_link_speed` text, e.g. `"16.0 GT/s PCIe"` or `"2.5 GT/s"`.
    pub fn from_sysfs(text: &str) -> Option<LinkSpeed> {
        let gts: f32 = text.split_whitespace().next()?.parse().ok()?;
        (1..=6u8)
            .map(LinkSpeed)
            .find(|s| s.gts().is_some_and(|g| (g - gts).abs() < 0.01))
    }
}

impl fmt::Display for LinkSpeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.gts() {
            Some(g) => write!(f, "{g} GT/s"),
            None => write!(f, "unknown ({})", self.0),
        }
    }
}

impl serde::Serialize for LinkSpeed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.gts() {
            Some(g) => s.serialize_f32(g),
            None => s.serialize_none(),
        }
    }
}

/// The decoded parts of the PCI Express capability (ID 0x10) that topology needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PcieCapability {
    pub offset: u8,
    pub version: u8,
    pub port_type: PciePortType,
    /// Link Capabilities: maximum speed and width (absent when beyond the dump).
    pub max_speed: Option<LinkSpeed>,
    pub max_width: Option<u8>,
    /// Link Status: negotiated speed and width.
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
}

impl ConfigSpace<'_> {
    pub fn pcie(&self) -> Option<PcieCapability> {
        let cap = self.find_capability(CAP_ID_PCIE)?;
        let base = cap.offset as usize;
        let caps = self.u16_at(base + 2)?;
        let link_cap = self.u32_at(base + 0x0c);
        let link_status = self.u16_at(base + 0x12);
        let speed = |v: u32| Some(LinkSpeed((v & 0xf) as u8)).filter(|s| s.0 != 0);
        let width = |v: u32| Some(((v >> 4) & 0x3f) as u8).filter(|w| *w != 0);
        Some(PcieCapability {
            offset: cap.offset,
            version: (caps & 0xf) as u8,
            port_type: PciePortType::from_bits(((caps >> 4) & 0xf) as u8),
            max_speed: link_cap.and_then(speed),
            max_width: link_cap.and_then(width),
            current_speed: link_status.map(u32::from).and_then(speed),
            current_width: link_status.map(u32::from).and_then(width),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_root_port() {
        let mut b = vec![0u8; 256];
        b[0x06] = 0x10;
        b[0x34] = 0x40;
        b[0x40] = 0x10;
        b[0x42] = 0x42; // version 2, root port
        b[0x4c..0x50].copy_from_slice(&(0x4u32 | (16 << 4)).to_le_bytes());
        b[0x52..0x54].copy_from_slice(&(0x3u16 | (8 << 4)).to_le_bytes());
        let p = ConfigSpace::new(&b).pcie().unwrap();
        assert_eq!(p.port_type, PciePortType::RootPort);
        assert_eq!(p.max_speed, Some(LinkSpeed(4)));
        assert_eq!(p.max_width, Some(16));
        assert_eq!(p.current_speed.unwrap().to_string(), "8 GT/s");
        assert_eq!(p.current_width, Some(8));
    }

    #[test]
    fn sysfs_speed() {
        assert_eq!(LinkSpeed::from_sysfs("16.0 GT/s PCIe"), Some(LinkSpeed(4)));
        assert_eq!(LinkSpeed::from_sysfs("2.5 GT/s"), Some(LinkSpeed(1)));
        assert_eq!(LinkSpeed::from_sysfs("Unknown"), None);
    }
}
