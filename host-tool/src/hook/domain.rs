//! What the hook needs from a libvirt domain XML: the PCI hostdevs (address, managed,
//! alias), the clique each alias gets (`<qemu:override>` or `<qemu:commandline>
//! -set device.ALIAS.x-nv-gpudirect-clique=N`), and whether the hypervisor is hidden.

use std::collections::BTreeMap;

use pci_config::Bdf;
use xmltree::{Element, XMLNode};

pub use crate::emit::libvirt::{CLIQUE_PROPERTY, QEMU_NS};

/// One `<hostdev mode='subsystem' type='pci'>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciHostdev {
    pub bdf: Bdf,
    /// `managed='yes'`: libvirt binds it itself; absent means no.
    pub managed: bool,
    pub alias: Option<String>,
}

/// A clique setting as written in the XML (the value is checked later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliqueSetting {
    pub value: String,
    /// `qemu:override` or `qemu:commandline`.
    pub source: &'static str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainFacts {
    pub name: Option<String>,
    pub hostdevs: Vec<PciHostdev>,
    /// Alias → clique settings (more than one is a mistake too).
    pub cliques: BTreeMap<String, Vec<CliqueSetting>>,
    /// Why the guest will not see the hypervisor, if it will not.
    pub hidden_hypervisor: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error("the domain XML on stdin is not XML: {0}")]
    Xml(String),
    #[error("the domain XML's root element is <{0}>, expected <domain>")]
    NotDomain(String),
    #[error("hostdev {what}: {message}")]
    Hostdev { what: String, message: String },
}

fn children<'a>(e: &'a Element, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
    e.children
        .iter()
        .filter_map(XMLNode::as_element)
        .filter(move |c| c.name == name)
}

fn qemu_children<'a>(e: &'a Element, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
    children(e, name).filter(|c| c.namespace.as_deref() == Some(QEMU_NS))
}

/// A `domain`/`bus`/`slot`/`function` attribute: hex with `0x`, or decimal.
fn address_field(addr: &Element, name: &str) -> Result<u32, String> {
    let v = addr
        .attributes
        .get(name)
        .ok_or_else(|| format!("<address> has no {name}"))?;
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => v.parse(),
    };
    parsed.map_err(|_| format!("<address {name}='{v}'> is not a number"))
}

fn hostdev(h: &Element) -> Result<Option<PciHostdev>, DomainError> {
    let attr = |n: &str| h.attributes.get(n).map(String::as_str);
    if attr("mode").unwrap_or("subsystem") != "subsystem" || attr("type") != Some("pci") {
        return Ok(None);
    }
    let alias = children(h, "alias")
        .next()
        .and_then(|a| a.attributes.get("name").cloned());
    let err = |message: String| DomainError::Hostdev {
        what: alias.clone().unwrap_or_else(|| "without alias".into()),
        message,
    };
    let addr = children(h, "source")
        .next()
        .and_then(|s| children(s, "address").next())
        .ok_or_else(|| err("no <source><address/> with the host PCI address".into()))?;
    let field = |n: &str| address_field(addr, n).map_err(&err);
    let (domain, bus, slot, function) = (
        field("domain")?,
        field("bus")?,
        field("slot")?,
        field("function")?,
    );
    let text = format!("{domain:04x}:{bus:02x}:{slot:02x}.{function:x}");
    let bdf: Bdf = text
        .parse()
        .map_err(|e: pci_config::BdfError| err(e.to_string()))?;
    Ok(Some(PciHostdev {
        bdf,
        managed: attr("managed") == Some("yes"),
        alias,
    }))
}

/// Reads the facts from a domain XML.
pub fn parse(xml: &str) -> Result<DomainFacts, DomainError> {
    let root = Element::parse(xml.as_bytes()).map_err(|e| DomainError::Xml(e.to_string()))?;
    if root.name != "domain" {
        return Err(DomainError::NotDomain(root.name));
    }
    let mut facts = DomainFacts {
        name: children(&root, "name")
            .next()
            .and_then(|n| n.get_text())
            .map(|t| t.trim().to_string()),
        ..Default::default()
    };
    for devices in children(&root, "devices") {
        for h in children(devices, "hostdev") {
            facts.hostdevs.extend(hostdev(h)?);
        }
    }
    for ov in qemu_children(&root, "override") {
        for dev in qemu_children(ov, "device") {
            let Some(alias) = dev.attributes.get("alias") else {
                continue;
            };
            for fe in qemu_children(dev, "frontend") {
                for p in qemu_children(fe, "property") {
                    if p.attributes.get("name").map(String::as_str) == Some(CLIQUE_PROPERTY) {
                        facts
                            .cliques
                            .entry(alias.clone())
                            .or_default()
                            .push(CliqueSetting {
                                value: p.attributes.get("value").cloned().unwrap_or_default(),
                                source: "qemu:override",
                            });
                    }
                }
            }
        }
    }
    for cl in qemu_children(&root, "commandline") {
        let args: Vec<&str> = qemu_children(cl, "arg")
            .filter_map(|a| a.attributes.get("value").map(String::as_str))
            .collect();
        for (i, a) in args.iter().enumerate() {
            let next = args.get(i + 1).copied().unwrap_or("");
            if *a == "-set" {
                let prop = next.strip_prefix("device.").and_then(|r| r.split_once('='));
                if let Some((path, value)) = prop {
                    if let Some(alias) = path.strip_suffix(&format!(".{CLIQUE_PROPERTY}")) {
                        facts
                            .cliques
                            .entry(alias.to_string())
                            .or_default()
                            .push(CliqueSetting {
                                value: value.to_string(),
                                source: "qemu:commandline",
                            });
                    }
                }
            }
            if *a == "-cpu" && next.split(',').any(|o| o == "kvm=off") {
                facts.hidden_hypervisor = Some(format!("<qemu:commandline> passes -cpu {next}"));
            }
        }
    }
    let hidden = children(&root, "features")
        .flat_map(|f| children(f, "kvm"))
        .flat_map(|k| children(k, "hidden"))
        .any(|h| h.attributes.get("state").map(String::as_str) == Some("on"));
    if hidden {
        facts.hidden_hypervisor = Some("<features><kvm><hidden state='on'/> is set".into());
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>vm1</name>
  <features><kvm><hidden state='on'/></kvm></features>
  <devices>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>
      <alias name='ua-gpu0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x42' slot='0x00' function='0x0'/></source>
      <alias name='ua-gpu1'/>
    </hostdev>
    <hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/></source></hostdev>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-set'/><qemu:arg value='device.ua-gpu1.x-nv-gpudirect-clique=3'/>
  </qemu:commandline>
  <qemu:override>
    <qemu:device alias='ua-gpu0'>
      <qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='2'/></qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>"#;

    #[test]
    fn reads_hostdevs_cliques_and_hidden_state() {
        let f = parse(XML).unwrap();
        assert_eq!(f.name.as_deref(), Some("vm1"));
        assert_eq!(f.hostdevs.len(), 2);
        assert_eq!(f.hostdevs[0].bdf.to_string(), "0000:41:00.0");
        assert!(!f.hostdevs[0].managed);
        assert!(f.hostdevs[1].managed);
        assert_eq!(f.cliques["ua-gpu0"][0].value, "2");
        assert_eq!(f.cliques["ua-gpu0"][0].source, "qemu:override");
        assert_eq!(f.cliques["ua-gpu1"][0].value, "3");
        assert!(f.hidden_hypervisor.is_some());
    }

    #[test]
    fn rejects_bad_addresses_and_non_domains() {
        let bad = XML.replace(
            "slot='0x00' function='0x0'/></source>\n      <alias name='ua-gpu0'/>",
            "slot='0x20' function='0x0'/></source>\n      <alias name='ua-gpu0'/>",
        );
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.starts_with("hostdev ua-gpu0:"), "{e}");
        assert!(parse("<network/>")
            .unwrap_err()
            .to_string()
            .contains("<network>"));
        assert!(parse("<domain").is_err());
    }
}
