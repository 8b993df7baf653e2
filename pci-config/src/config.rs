/// What an unprivileged reader of sysfs `config` gets.
pub const CONFIG_SPACE_UNPRIVILEGED: usize = 64;
/// Conventional PCI config space.
pub const CONFIG_SPACE_LEGACY: usize = 256;
/// PCIe extended config space.
pub const CONFIG_SPACE_EXTENDED: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("config space is {len} bytes, too short to read {what} at offset {offset:#x}")]
    Truncated {
        what: &'static str,
        offset: usize,
        len: usize,
    },
}

/// Layout of the config header (offset 0x0e, low 7 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderType {
    /// Type 0: an endpoint (GPU, NIC, NVSwitch, …).
    Endpoint,
    /// Type 1: a PCI-to-PCI bridge (root port, switch port).
    Bridge,
    /// Type 2: CardBus bridge.
    CardBus,
    Unknown(u8),
}

/// A read-only view over a config space dump of any length.
///
/// Accessors return `None` (or an error) for registers beyond the dump's end:
/// non-root sysfs readers only get the first 64 bytes.
#[derive(Clone, Copy)]
pub struct ConfigSpace<'a> {
    bytes: &'a [u8],
}

impl<'a> ConfigSpace<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        // Never look past 4 KiB, whatever the caller hands in.
        let end = bytes.len().min(CONFIG_SPACE_EXTENDED);
        ConfigSpace {
            bytes: &bytes[..end],
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Whether the capability list (at 0x40 and above) is readable at all.
    pub fn has_device_specific_area(&self) -> bool {
        self.bytes.len() > CONFIG_SPACE_UNPRIVILEGED
    }

    /// Whether the PCIe extended space (0x100 and above) is present in the dump.
    pub fn has_extended_space(&self) -> bool {
        self.bytes.len() >= CONFIG_SPACE_EXTENDED
    }

    pub fn u8_at(&self, offset: usize) -> Option<u8> {
        self.bytes.get(offset).copied()
    }

    pub fn u16_at(&self, offset: usize) -> Option<u16> {
        let b = self.bytes.get(offset..offset.checked_add(2)?)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32_at(&self, offset: usize) -> Option<u32> {
        let b = self.bytes.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn need<T>(&self, v: Option<T>, what: &'static str, offset: usize) -> Result<T, ConfigError> {
        v.ok_or(ConfigError::Truncated {
            what,
            offset,
            len: self.bytes.len(),
        })
    }

    pub fn vendor_id(&self) -> Result<u16, ConfigError> {
        self.need(self.u16_at(0x00), "vendor ID", 0x00)
    }

    pub fn device_id(&self) -> Result<u16, ConfigError> {
        self.need(self.u16_at(0x02), "device ID", 0x02)
    }

    /// Class code as sysfs prints it: base class, subclass, prog-if (`0x030200`).
    pub fn class_code(&self) -> Result<u32, ConfigError> {
        let raw = self.need(self.u32_at(0x08), "class code", 0x08)?;
        Ok(raw >> 8)
    }

    pub fn header_type(&self) -> Result<HeaderType, ConfigError> {
        let raw = self.need(self.u8_at(0x0e), "header type", 0x0e)?;
        Ok(match raw & 0x7f {
            0 => HeaderType::Endpoint,
            1 => HeaderType::Bridge,
            2 => HeaderType::CardBus,
            other => HeaderType::Unknown(other),
        })
    }

    pub fn is_multifunction(&self) -> Result<bool, ConfigError> {
        Ok(self.need(self.u8_at(0x0e), "header type", 0x0e)? & 0x80 != 0)
    }

    /// Status register bit 4: the device implements a capability list.
    pub fn has_capability_list(&self) -> Result<bool, ConfigError> {
        Ok(self.need(self.u16_at(0x06), "status", 0x06)? & 0x10 != 0)
    }

    /// Secondary and subordinate bus numbers of a type-1 header.
    pub fn bridge_buses(&self) -> Option<(u8, u8)> {
        match self.header_type() {
            Ok(HeaderType::Bridge) => Some((self.u8_at(0x19)?, self.u8_at(0x1a)?)),
            _ => None,
        }
    }
}

impl std::fmt::Debug for ConfigSpace<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace")
            .field("len", &self.bytes.len())
            .finish()
    }
}
