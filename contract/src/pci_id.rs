//! A PCI vendor or device ID, written `0x10de` on the wire.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 16-bit PCI ID; serialized as `"0x10de"`, read with or without `0x`, any case.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PciId(pub u16);

impl PciId {
    /// Parses `0x10de`, `0X10DE` or `10de` (surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<PciId> {
        let t = s.trim();
        let digits = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u16::from_str_radix(digits, 16).ok().map(PciId)
    }
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

impl fmt::Debug for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<u16> for PciId {
    fn from(v: u16) -> Self {
        PciId(v)
    }
}

impl Serialize for PciId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        PciId::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("'{s}' is not a PCI ID: expected hex, e.g. 0x10de"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_spellings() {
        for s in ["0x10de", "0X10DE", "10de", " 0x10de "] {
            assert_eq!(PciId::parse(s), Some(PciId(0x10de)), "{s}");
        }
        assert_eq!(PciId(0x2330).to_string(), "0x2330");
        assert_eq!(PciId(0x10).to_string(), "0x0010");
    }

    #[test]
    fn rejects_junk() {
        for s in ["", "0x", "0x10de0", "nvidia", "-1", "0x+1", "0x 1"] {
            assert_eq!(PciId::parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn serde_round_trip() {
        let j = serde_json::to_string(&PciId(0x10de)).unwrap();
        assert_eq!(j, "\"0x10de\"");
        assert_eq!(serde_json::from_str::<PciId>(&j).unwrap(), PciId(0x10de));
        assert!(serde_json::from_str::<PciId>("4318").is_err());
    }
}
