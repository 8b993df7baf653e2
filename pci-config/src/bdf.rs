use std::fmt;
use std::str::FromStr;

/// A PCI function address, `DDDD:BB:DD.F`.
///
/// Parsing takes the three forms tools print: `0000:41:00.0` (sysfs, libvirt),
/// `41:00.0` (lspci, domain 0) and `00000000:41:00.0` (nvidia-smi's 8-digit domain, which
/// must fit 16 bits); otherwise it is strict (hex digits only, two of bus, two of device
/// ≤ 0x1f, one function digit ≤ 7). `Display` always prints the first form, so a `Bdf`
/// is always a safe single path component: nothing like `../` can get through.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BdfError {
    #[error("'{0}' is not a PCI address: expected DDDD:BB:DD.F in hex, e.g. 0000:41:00.0 (or lspci's 41:00.0)")]
    Syntax(String),
    #[error("'{0}': device number {1:#x} is above 0x1f")]
    Device(String, u8),
    #[error("'{0}': function number {1} is above 7")]
    Function(String, u8),
}

impl Bdf {
    pub const fn new(domain: u16, bus: u8, device: u8, function: u8) -> Self {
        Bdf {
            domain,
            bus,
            device,
            function,
        }
    }

    /// The same slot's function `f` (a GPU's audio function, say).
    pub fn with_function(self, function: u8) -> Self {
        Bdf { function, ..self }
    }

    /// Whether `other` is another function of the same physical device.
    pub fn same_slot(&self, other: &Bdf) -> bool {
        self.domain == other.domain && self.bus == other.bus && self.device == other.device
    }
}

fn hex_field(s: &str, len: usize) -> Option<u32> {
    if s.len() != len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl FromStr for Bdf {
    type Err = BdfError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || BdfError::Syntax(s.to_string());
        let (domain, rest) = match s.matches(':').count() {
            1 => ("0000", s),
            2 => s.split_once(':').ok_or_else(syntax)?,
            _ => return Err(syntax()),
        };
        let (bus, rest) = rest.split_once(':').ok_or_else(syntax)?;
        let (device, function) = rest.split_once('.').ok_or_else(syntax)?;
        let domain = hex_field(domain, 4)
            .or_else(|| hex_field(domain, 8))
            .and_then(|d| u16::try_from(d).ok())
            .ok_or_else(syntax)?;
        let bus = hex_field(bus, 2).ok_or_else(syntax)? as u8;
        let device = hex_field(device, 2).ok_or_else(syntax)? as u8;
        let function = hex_field(function, 1).ok_or_else(syntax)? as u8;
        if device > 0x1f {
            return Err(BdfError::Device(s.to_string(), device));
        }
        if function > 7 {
            return Err(BdfError::Function(s.to_string(), function));
        }
        Ok(Bdf {
            domain,
            bus,
            device,
            function,
        })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Debug for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for Bdf {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Bdf {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        let b: Bdf = "0000:41:00.0".parse().unwrap();
        assert_eq!(b, Bdf::new(0, 0x41, 0, 0));
        assert_eq!(b.to_string(), "0000:41:00.0");
        let b: Bdf = "ABCD:FF:1F.7".parse().unwrap();
        assert_eq!(b.to_string(), "abcd:ff:1f.7");
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            ":41:00.0",
            "41:00",
            "0:41:00.0",
            "000:41:00.0",
            "0000000:41:00.0",
            "000000000:41:00.0",
            "00010000:41:00.0",
            "0000:0000:41:00.0",
            "41:00.0:0",
            "1:00.0",
            "0000:41:00",
            "0000:41:00.8",
            "0000:41:20.0",
            "0000:141:00.0",
            "00000:41:00.0",
            "0000:4g:00.0",
            "../../etc",
            "0000:41:00.0/",
            "0000:41:00.0 ",
            " 0000:41:00.0",
            "0000:41:0.0",
            "0000:41:00.00",
            "+000:41:00.0",
            "0000:-1:00.0",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(
            "0000:00:20.0".parse::<Bdf>(),
            Err(BdfError::Device("0000:00:20.0".into(), 0x20))
        );
    }

    #[test]
    fn takes_lspci_and_nvidia_smi_forms() {
        let want = Bdf::new(0, 0x07, 0, 0);
        for form in [
            "0000:07:00.0",
            "07:00.0",
            "00000000:07:00.0",
            "00000000:07:00.0",
        ] {
            assert_eq!(form.parse::<Bdf>(), Ok(want), "{form}");
        }
        assert_eq!(
            "0000000A:1F:00.0".parse::<Bdf>().unwrap().to_string(),
            "000a:1f:00.0"
        );
        assert_eq!(
            "ff:1f.7".parse::<Bdf>().unwrap().to_string(),
            "0000:ff:1f.7"
        );
        assert_eq!(
            "07:20.0".parse::<Bdf>(),
            Err(BdfError::Device("07:20.0".into(), 0x20))
        );
    }

    #[test]
    fn orders_like_lspci() {
        let mut v: Vec<Bdf> = [
            "0000:81:00.0",
            "0000:03:00.1",
            "0000:03:00.0",
            "0001:00:00.0",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        v.sort();
        let s: Vec<String> = v.iter().map(|b| b.to_string()).collect();
        assert_eq!(
            s,
            [
                "0000:03:00.0",
                "0000:03:00.1",
                "0000:81:00.0",
                "0001:00:00.0"
            ]
        );
    }

    #[test]
    fn serde_round_trip() {
        let b: Bdf = "0000:07:00.0".parse().unwrap();
        let j = serde_json::to_string(&b).unwrap();
        assert_eq!(j, "\"0000:07:00.0\"");
        assert_eq!(serde_json::from_str::<Bdf>(&j).unwrap(), b);
        assert!(serde_json::from_str::<Bdf>("\"../x\"").is_err());
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(d: u16, b: u8, dev in 0u8..32, f in 0u8..8) {
            let bdf = Bdf::new(d, b, dev, f);
            prop_assert_eq!(bdf.to_string().parse::<Bdf>().unwrap(), bdf);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,20}") {
            if let Ok(b) = s.parse::<Bdf>() {
                prop_assert!(!b.to_string().contains('/'));
                prop_assert_eq!(b.to_string().parse::<Bdf>().unwrap(), b);
            }
        }

        #[test]
        fn every_form_normalises(d: u16, b: u8, dev in 0u8..32, f in 0u8..8) {
            let bdf = Bdf::new(d, b, dev, f);
            let long = format!("{:08X}:{:02X}:{:02x}.{}", d, b, dev, f);
            prop_assert_eq!(long.parse::<Bdf>().unwrap(), bdf);
            let short = format!("{b:02x}:{dev:02x}.{f}");
            prop_assert_eq!(short.parse::<Bdf>().unwrap(), Bdf::new(0, b, dev, f));
        }
    }
}
