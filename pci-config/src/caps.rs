use std::collections::HashSet;

use crate::config::{ConfigSpace, CONFIG_SPACE_LEGACY};

pub const CAP_ID_PM: u8 = 0x01;
pub const CAP_ID_MSI: u8 = 0x05;
pub const CAP_ID_VENDOR: u8 = 0x09;
pub const CAP_ID_PCIE: u8 = 0x10;
pub const CAP_ID_MSIX: u8 = 0x11;
pub const EXT_CAP_ID_AER: u16 = 0x0001;
pub const EXT_CAP_ID_ACS: u16 = 0x000d;
pub const EXT_CAP_ID_ATS: u16 = 0x000f;

/// Why a capability walk stopped early. The capabilities found before are still valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error(
        "capability pointer {offset:#x} is outside the {len}-byte config space (truncated dump?)"
    )]
    OutOfBounds { offset: usize, len: usize },
    #[error("capability pointer {offset:#x} is invalid (below the header or misaligned)")]
    BadPointer { offset: usize },
    #[error("capability list loops back to {offset:#x}")]
    Loop { offset: usize },
}

fn collect_checked<T>(
    walk: impl Iterator<Item = Result<T, WalkError>>,
) -> (Vec<T>, Option<WalkError>) {
    let mut caps = Vec::new();
    for c in walk {
        match c {
            Ok(c) => caps.push(c),
            Err(e) => return (caps, Some(e)),
        }
    }
    (caps, None)
}

/// One entry of the standard capability list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    pub offset: u8,
    pub id: u8,
    pub next: u8,
}

/// The capability walks start from a config space; they live here, beside the walks, so that
/// `config` (bytes and header fields) needs nothing of `caps`.
impl<'a> ConfigSpace<'a> {
    /// Walk of the standard capability list.
    pub fn capabilities(&self) -> CapWalk<'a> {
        CapWalk::new(*self)
    }

    /// Walk of the PCIe extended capability list (empty when the dump has no extended space).
    pub fn extended_capabilities(&self) -> ExtCapWalk<'a> {
        ExtCapWalk::new(*self)
    }
}

/// Iterator over the standard capability list, bounded and loop-proof.
///
/// Yields `Ok` entries until the list ends, then at most one `Err` if it ended badly.
pub struct CapWalk<'a> {
    config: ConfigSpace<'a>,
    next: usize,
    seen: HashSet<usize>,
    done: bool,
}

impl<'a> CapWalk<'a> {
    pub(crate) fn new(config: ConfigSpace<'a>) -> Self {
        let start = match config.has_capability_list() {
            Ok(true) => config.u8_at(0x34).map(usize::from),
            // 64-byte dumps still carry the pointer; an absent list is simply empty.
            _ => None,
        };
        CapWalk {
            config,
            next: start.unwrap_or(0),
            seen: HashSet::new(),
            done: false,
        }
    }

    /// All capabilities found, and the reason the walk stopped early, if any.
    pub fn collect_checked(self) -> (Vec<Capability>, Option<WalkError>) {
        collect_checked(self)
    }
}

impl Iterator for CapWalk<'_> {
    type Item = Result<Capability, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        // The low two bits of a capability pointer are reserved (PCI 3.0 §6.7).
        let offset = self.next & !3;
        if offset == 0 {
            self.done = true;
            return None;
        }
        let fail = |s: &mut Self, e| {
            s.done = true;
            Some(Err(e))
        };
        if !(0x40..CONFIG_SPACE_LEGACY).contains(&offset) {
            return fail(self, WalkError::BadPointer { offset });
        }
        if !self.seen.insert(offset) {
            return fail(self, WalkError::Loop { offset });
        }
        let (Some(id), Some(next)) = (self.config.u8_at(offset), self.config.u8_at(offset + 1))
        else {
            return fail(
                self,
                WalkError::OutOfBounds {
                    offset,
                    len: self.config.len(),
                },
            );
        };
        self.next = next as usize;
        Some(Ok(Capability {
            offset: offset as u8,
            id,
            next,
        }))
    }
}

/// One entry of the PCIe extended capability list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtCapability {
    pub offset: u16,
    pub id: u16,
    pub version: u8,
    pub next: u16,
}

/// Iterator over the extended capability list (from 0x100), bounded and loop-proof.
pub struct ExtCapWalk<'a> {
    config: ConfigSpace<'a>,
    next: usize,
    seen: HashSet<usize>,
    done: bool,
}

impl<'a> ExtCapWalk<'a> {
    pub(crate) fn new(config: ConfigSpace<'a>) -> Self {
        let done = !config.has_extended_space();
        ExtCapWalk {
            config,
            next: 0x100,
            seen: HashSet::new(),
            done,
        }
    }

    pub fn collect_checked(self) -> (Vec<ExtCapability>, Option<WalkError>) {
        collect_checked(self)
    }
}

impl Iterator for ExtCapWalk<'_> {
    type Item = Result<ExtCapability, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let offset = self.next & !3;
        if offset == 0 {
            self.done = true;
            return None;
        }
        self.done = true;
        if offset < 0x100 {
            return Some(Err(WalkError::BadPointer { offset }));
        }
        if !self.seen.insert(offset) {
            return Some(Err(WalkError::Loop { offset }));
        }
        let Some(header) = self.config.u32_at(offset) else {
            return Some(Err(WalkError::OutOfBounds {
                offset,
                len: self.config.len(),
            }));
        };
        // An all-zero (or all-ones, device gone) header at 0x100 means "no extended caps".
        if offset == 0x100 && (header == 0 || header == u32::MAX) {
            return None;
        }
        let next = (header >> 20) as u16;
        self.next = next as usize;
        self.done = false;
        Some(Ok(ExtCapability {
            offset: offset as u16,
            id: (header & 0xffff) as u16,
            version: ((header >> 16) & 0xf) as u8,
            next,
        }))
    }
}

/// The ATS extended capability (PCIe base spec §10.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AtsCapability {
    pub offset: u16,
    /// Control register bit 15.
    pub enabled: bool,
}

impl ConfigSpace<'_> {
    /// First standard capability with this ID.
    pub fn find_capability(&self, id: u8) -> Option<Capability> {
        self.capabilities()
            .filter_map(Result::ok)
            .find(|c| c.id == id)
    }

    /// First extended capability with this ID.
    pub fn find_extended_capability(&self, id: u16) -> Option<ExtCapability> {
        self.extended_capabilities()
            .filter_map(Result::ok)
            .find(|c| c.id == id)
    }

    /// Whether a standard capability starts exactly at `offset`
    /// (how QEMU decides whether 0xC8 or 0xD4 is free for the clique).
    pub fn capability_starts_at(&self, offset: u8) -> bool {
        self.capabilities()
            .filter_map(Result::ok)
            .any(|c| c.offset == offset)
    }

    pub fn ats(&self) -> Option<AtsCapability> {
        let c = self.find_extended_capability(EXT_CAP_ID_ATS)?;
        let ctl = self.u16_at(c.offset as usize + 6)?;
        Some(AtsCapability {
            offset: c.offset,
            enabled: ctl & 0x8000 != 0,
        })
    }

    /// Vendor-specific capabilities (ID 0x09) with their length byte.
    pub fn vendor_capabilities(&self) -> Vec<(Capability, u8)> {
        self.capabilities()
            .filter_map(Result::ok)
            .filter(|c| c.id == CAP_ID_VENDOR)
            .map(|c| (c, self.u8_at(c.offset as usize + 2).unwrap_or(0)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_caps(chain: &[(u8, u8, u8)], len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[0x06] = 0x10;
        b[0x34] = chain.first().map(|c| c.0).unwrap_or(0);
        for &(off, id, next) in chain {
            b[off as usize] = id;
            b[off as usize + 1] = next;
        }
        b
    }

    #[test]
    fn walks_a_chain() {
        let b = with_caps(
            &[(0x40, 0x01, 0x60), (0x60, 0x10, 0xc8), (0xc8, 0x09, 0)],
            256,
        );
        let (caps, err) = ConfigSpace::new(&b).capabilities().collect_checked();
        assert_eq!(err, None);
        assert_eq!(
            caps.iter().map(|c| c.offset).collect::<Vec<_>>(),
            [0x40, 0x60, 0xc8]
        );
        assert!(ConfigSpace::new(&b).capability_starts_at(0xc8));
        assert!(!ConfigSpace::new(&b).capability_starts_at(0xd4));
    }

    #[test]
    fn detects_loop() {
        let b = with_caps(&[(0x40, 0x01, 0x60), (0x60, 0x10, 0x40)], 256);
        let (caps, err) = ConfigSpace::new(&b).capabilities().collect_checked();
        assert_eq!(caps.len(), 2);
        assert_eq!(err, Some(WalkError::Loop { offset: 0x40 }));
    }

    #[test]
    fn truncated_dump() {
        let b = with_caps(&[(0x40, 0x01, 0x60)], 256);
        let (caps, err) = ConfigSpace::new(&b[..64]).capabilities().collect_checked();
        assert!(caps.is_empty());
        assert_eq!(
            err,
            Some(WalkError::OutOfBounds {
                offset: 0x40,
                len: 64
            })
        );
    }

    #[test]
    fn bad_pointer_into_header() {
        let b = with_caps(&[(0x40, 0x01, 0x10)], 256);
        let (_, err) = ConfigSpace::new(&b).capabilities().collect_checked();
        assert_eq!(err, Some(WalkError::BadPointer { offset: 0x10 }));
    }

    #[test]
    fn extended_loop_and_end() {
        let mut b = vec![0u8; 4096];
        b[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        b[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16) | (0x100 << 20)).to_le_bytes());
        let (caps, err) = ConfigSpace::new(&b)
            .extended_capabilities()
            .collect_checked();
        assert_eq!(caps.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 0xd]);
        assert_eq!(err, Some(WalkError::Loop { offset: 0x100 }));
        assert_eq!(
            ConfigSpace::new(&b[..256]).extended_capabilities().count(),
            0
        );
    }
}
