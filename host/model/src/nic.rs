//! A NIC as an operator names it (vm.yaml `nics:`, `gen --nics`): by PCI address, or by
//! the name its host driver gives it, resolved against what sysfs says.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use pci_config::Bdf;

use super::{DeviceKind, Topology};

/// Longest RDMA device name the kernel allows (`IB_DEVICE_NAME_MAX` is 64 with the NUL);
/// interface names are shorter still (`IFNAMSIZ`, 16).
const MAX_NAME: usize = 63;

/// A NIC (or SR-IOV VF) to pass with the GPUs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NicRef {
    /// Its PCI address, in any form `Bdf` takes.
    Bdf(Bdf),
    /// A network interface (`ens1f0np0`) or RDMA device (`mlx5_0`) of the host.
    Name(String),
}

impl FromStr for NicRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(bdf) = s.parse() {
            return Ok(NicRef::Bdf(bdf));
        }
        let name_like = !s.is_empty()
            && s.len() <= MAX_NAME
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_graphic() && !matches!(c, '/' | ':' | ','));
        if name_like {
            Ok(NicRef::Name(s.to_string()))
        } else {
            Err(format!(
                "'{s}' is neither a PCI address (0000:1a:00.0) nor an interface or RDMA device name (ens1f0np0, mlx5_0)"
            ))
        }
    }
}

impl fmt::Display for NicRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicRef::Bdf(b) => write!(f, "{b}"),
            NicRef::Name(n) => f.write_str(n),
        }
    }
}

impl Topology {
    /// The host network function `nic` names; an error says what is wrong and the fix.
    pub fn resolve_nic(&self, nic: &NicRef) -> Result<Bdf, String> {
        self.resolve_nics(std::slice::from_ref(nic)).map(|v| v[0])
    }

    /// Every NIC of `nics`, resolved and once each, in the order given (names looked up
    /// in one index of the host's interface and RDMA names).
    pub fn resolve_nics(&self, nics: &[NicRef]) -> Result<Vec<Bdf>, String> {
        let by_name: BTreeMap<&str, Bdf> = self
            .nic_names
            .iter()
            .flat_map(|(bdf, n)| n.net.iter().chain(&n.rdma).map(move |x| (x.as_str(), *bdf)))
            .collect();
        let mut seen = BTreeSet::new();
        let mut out: Vec<Bdf> = Vec::with_capacity(nics.len());
        for n in nics {
            let bdf = match n {
                NicRef::Bdf(b) => self.check_nic(b)?,
                NicRef::Name(name) => *by_name.get(name.as_str()).ok_or_else(|| {
                    format!(
                        "no network interface or RDMA device '{name}' on {} (sysfs net/ and infiniband/ of its NICs); \
                         a NIC already bound to vfio-pci has neither: name it by PCI address",
                        self.source
                    )
                })?,
            };
            if seen.insert(bdf) {
                out.push(bdf);
            }
        }
        Ok(out)
    }

    /// `b` if it is a network function of this host.
    fn check_nic(&self, b: &Bdf) -> Result<Bdf, String> {
        match self.device(b) {
            Some(d) if d.kind == DeviceKind::Nic => Ok(*b),
            Some(_) => Err(format!(
                "{b} is not a network device (PCI class 02); `vfio-p2p topo` lists the NICs"
            )),
            None => Err(format!(
                "no device {b} on {}; `vfio-p2p topo` lists the NICs",
                self.source
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_addresses_and_names() {
        assert_eq!(
            "1a:00.1".parse::<NicRef>().unwrap(),
            NicRef::Bdf("0000:1a:00.1".parse().unwrap())
        );
        assert_eq!(
            "mlx5_0".parse::<NicRef>().unwrap(),
            NicRef::Name("mlx5_0".into())
        );
        assert!("".parse::<NicRef>().is_err());
        assert!("a/b".parse::<NicRef>().is_err());
        assert!("1a:00.9".parse::<NicRef>().is_err());
        assert!("eth 0".parse::<NicRef>().is_err());
    }

    proptest! {
        /// Any text parses or is refused, never panics; what parses prints back to
        /// something that parses to the same.
        #[test]
        fn parse_never_panics_and_round_trips(s in "\\PC{0,80}") {
            if let Ok(n) = s.parse::<NicRef>() {
                prop_assert_eq!(n.to_string().parse::<NicRef>().unwrap(), n);
            }
        }
    }
}
