//! The NVIDIA GPUDirect P2P clique capability.
//!
//! An 8-byte vendor-specific capability that a hypervisor emulates in a passed-through
//! GPU's config space to tell the guest driver which GPUs may do PCIe P2P:
//!
//! ```text
//! +0 0x09  +1 next  +2 0x08 (len)  +3..+5 'P' '2' 'P'  +6 clique<<3 | version  +7 0x00
//! ```
//!
//! As dwords: DW0 = `0x5008_0009 | next << 8`, DW1 = `0x0000_5032 | clique << 19`;
//! the clique ID is DW1 bits 22:19 (0..=15), the version bits 18:16 (must be 0).

use crate::caps::{Capability, CAP_ID_VENDOR};
use crate::config::ConfigSpace;

/// Offset the NVIDIA driver reserves for the capability.
pub const OFFSET_PRIMARY: u8 = 0xc8;
/// Fallback used by QEMU ≥ 8.1 when 0xC8 is taken, and always by Cloud Hypervisor.
pub const OFFSET_FALLBACK: u8 = 0xd4;
/// Length of the capability, also its length byte.
pub const LEN: u8 = 8;
/// Highest clique ID that fits in four bits.
pub const MAX_CLIQUE: u8 = 15;
const SIGNATURE: [u8; 3] = *b"P2P";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliqueError {
    #[error("clique ID {0} is out of range (0..=15)")]
    OutOfRange(u8),
    #[error("capability at {offset:#x} is not the P2P clique capability: {why}")]
    NotClique { offset: u8, why: &'static str },
    #[error("P2P clique capability at {offset:#x} has version {version}, only 0 is defined")]
    Version { offset: u8, version: u8 },
}

/// A decoded clique capability and where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CliqueCap {
    pub offset: u8,
    pub clique: u8,
}

/// The 8 bytes of the capability for `clique`, linking to `next`.
pub fn encode(clique: u8, next: u8) -> Result<[u8; 8], CliqueError> {
    if clique > MAX_CLIQUE {
        return Err(CliqueError::OutOfRange(clique));
    }
    Ok([
        CAP_ID_VENDOR,
        next,
        LEN,
        SIGNATURE[0],
        SIGNATURE[1],
        SIGNATURE[2],
        clique << 3,
        0,
    ])
}

/// Decodes the capability starting at `offset` of `config`.
pub fn decode_at(config: &ConfigSpace<'_>, offset: u8) -> Result<CliqueCap, CliqueError> {
    let not = |why| CliqueError::NotClique { offset, why };
    let o = offset as usize;
    let b = config
        .bytes()
        .get(o..o + LEN as usize)
        .ok_or(not("beyond the end of the dump"))?;
    if b[0] != CAP_ID_VENDOR {
        return Err(not("capability ID is not 0x09 (vendor-specific)"));
    }
    if b[2] != LEN {
        return Err(not("length byte is not 8"));
    }
    if b[3..6] != SIGNATURE {
        return Err(not("signature is not 'P2P'"));
    }
    let version = b[6] & 0x7;
    if version != 0 {
        return Err(CliqueError::Version { offset, version });
    }
    Ok(CliqueCap {
        offset,
        clique: (b[6] >> 3) & 0xf,
    })
}

/// Finds the clique capability the way the guest driver does: by walking the
/// capability list, so it is found at any offset as long as it is linked.
pub fn find(config: &ConfigSpace<'_>) -> Option<CliqueCap> {
    config
        .capabilities()
        .filter_map(Result::ok)
        .filter(|c: &Capability| c.id == CAP_ID_VENDOR)
        .find_map(|c| decode_at(config, c.offset).ok())
}

/// Where a hypervisor that prefers 0xC8 and falls back to 0xD4 (QEMU ≥ 8.1) would
/// place the capability, or `None` when both offsets are taken.
pub fn placement_with_fallback(config: &ConfigSpace<'_>) -> Option<u8> {
    [OFFSET_PRIMARY, OFFSET_FALLBACK]
        .into_iter()
        .find(|o| !config.capability_starts_at(*o))
}

/// How a hypervisor places the capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placer {
    /// Always at this offset, checking nothing: Cloud Hypervisor at 0xD4, QEMU < 8.1 at 0xC8.
    Fixed(u8),
    /// 0xC8, else 0xD4 (QEMU ≥ 8.1, QEMU 7.2 with the backport).
    WithFallback,
}

impl Placer {
    /// Cloud Hypervisor writes the capability at 0xD4 whatever is there.
    pub const CLOUD_HYPERVISOR: Placer = Placer::Fixed(OFFSET_FALLBACK);
}

/// Why a placer cannot place the capability on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementRefused {
    /// The placer's only offset starts a capability it would overlay.
    Taken(u8),
    /// Both 0xC8 and 0xD4 start a capability.
    NoRoom,
}

/// Where `placer` puts the capability on the device of `config`: the one decision that
/// `check` and the VMM configurations take.
pub fn placement(config: &ConfigSpace<'_>, placer: Placer) -> Result<u8, PlacementRefused> {
    match placer {
        Placer::Fixed(at) if config.capability_starts_at(at) => Err(PlacementRefused::Taken(at)),
        Placer::Fixed(at) => Ok(at),
        Placer::WithFallback => placement_with_fallback(config).ok_or(PlacementRefused::NoRoom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_reference_dwords() {
        let b = encode(0, 0).unwrap();
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 0x5008_0009);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 0x0000_5032);
        let b = encode(5, 0).unwrap();
        assert_eq!(
            u32::from_le_bytes(b[4..8].try_into().unwrap()),
            0x0000_5032 | 5 << 19
        );
        assert_eq!(encode(16, 0), Err(CliqueError::OutOfRange(16)));
    }

    /// Level-B config space from the lab example: PCIe cap at 0x80 linking to the clique at 0xC8.
    #[test]
    fn finds_in_lab_dump() {
        let mut b = vec![0u8; 256];
        b[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
        b[0x06] = 0x10;
        b[0x34] = 0x80;
        b[0x80..0x84].copy_from_slice(&[0x10, 0xc8, 0x02, 0x00]);
        b[0xc8..0xd0].copy_from_slice(&[0x09, 0x00, 0x08, 0x50, 0x32, 0x50, 0x08, 0x00]);
        let c = ConfigSpace::new(&b);
        assert_eq!(
            find(&c),
            Some(CliqueCap {
                offset: 0xc8,
                clique: 1
            })
        );
        assert_eq!(placement_with_fallback(&c), Some(0xd4));
        assert_eq!(placement(&c, Placer::WithFallback), Ok(0xd4));
        assert_eq!(placement(&c, Placer::CLOUD_HYPERVISOR), Ok(0xd4));
        assert_eq!(
            placement(&c, Placer::Fixed(OFFSET_PRIMARY)),
            Err(PlacementRefused::Taken(0xc8))
        );
    }

    #[test]
    fn unlinked_capability_is_not_found() {
        let mut b = vec![0u8; 256];
        b[0x06] = 0x10;
        b[0x34] = 0x40;
        b[0x40] = 0x01;
        b[0xc8..0xd0].copy_from_slice(&encode(3, 0).unwrap());
        let c = ConfigSpace::new(&b);
        assert_eq!(find(&c), None);
        assert_eq!(decode_at(&c, 0xc8).unwrap().clique, 3);
        assert_eq!(placement_with_fallback(&c), Some(0xc8));
    }

    #[test]
    fn version_must_be_zero() {
        let mut b = vec![0u8; 256];
        let mut cap = encode(2, 0).unwrap();
        cap[6] |= 1;
        b[0xc8..0xd0].copy_from_slice(&cap);
        assert_eq!(
            decode_at(&ConfigSpace::new(&b), 0xc8),
            Err(CliqueError::Version {
                offset: 0xc8,
                version: 1
            })
        );
    }

    proptest! {
        #[test]
        fn round_trip(clique in 0u8..=15, next: u8, at in prop::sample::select(vec![0x40u8, 0xc8, 0xd4, 0xf8])) {
            let mut b = vec![0u8; 256];
            b[0x06] = 0x10;
            b[0x34] = at;
            let next = if next < 0x40 { 0 } else { next & !3 };
            b[at as usize..at as usize + 8].copy_from_slice(&encode(clique, next).unwrap());
            let c = ConfigSpace::new(&b);
            prop_assert_eq!(decode_at(&c, at).unwrap(), CliqueCap { offset: at, clique });
            prop_assert_eq!(find(&c).map(|f| f.clique), Some(clique));
        }

        #[test]
        fn random_config_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4200)) {
            let c = ConfigSpace::new(&bytes);
            let _ = c.capabilities().count();
            let _ = c.extended_capabilities().count();
            let _ = (c.pcie(), c.acs(), c.ats(), find(&c), c.vendor_capabilities(), c.header_type(), c.bridge_buses());
            prop_assert!(c.capabilities().count() <= 49);
            prop_assert!(c.extended_capabilities().count() <= 961);
        }
    }
}
