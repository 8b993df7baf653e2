//! The one reader of libvirt domain XML (`check --domain-xml`, the hook's stdin, `libvirt
//! patch`): a single pass of quick-xml's pull reader that keeps byte positions, so the patch
//! can edit the text in place. It never recurses, so nesting depth costs no stack; it refuses
//! what libvirt's own parser (libxml2 with default options) refuses: more than 256 levels, a
//! DOCTYPE (so no entities), NUL, a second root element.

use std::path::Path;

use pci_config::Bdf;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use vfio_p2p_contract::CLIQUE_PROPERTY;

use super::qemu_argv::read_qemu_argv;
use vfio_p2p_files::{read_input_file, read_input_stream};
use vfio_p2p_model::domain::{
    CliqueSetting, CliqueSource, DomainFacts, HiddenHypervisor, Hole64, OverrideDevice, PciHostdev,
    QEMU_NS,
};

/// The most a domain XML may hold; real ones are a few KiB.
pub const MAX_DOMAIN_XML_BYTES: u64 = 4 << 20;
/// libxml2's nesting limit without XML_PARSE_HUGE, which libvirt does not set.
pub const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {message}")]
pub struct DomainXmlError {
    pub source_name: String,
    pub message: String,
}

/// Reads and scans the domain XML file `path`.
pub fn read_domain_xml_file(path: &Path) -> Result<DomainFacts, DomainXmlError> {
    let name = path.display().to_string();
    let bytes =
        read_input_file(path, MAX_DOMAIN_XML_BYTES, "domain XML").map_err(|e| DomainXmlError {
            source_name: name.clone(),
            message: e.to_string(),
        })?;
    parse_domain_xml_bytes(&bytes, &name)
}

/// Reads and scans a domain XML from a stream (the hook's stdin, `libvirt patch -`).
pub fn read_domain_xml_stream(
    stream: impl std::io::Read,
    name: &str,
) -> Result<DomainFacts, DomainXmlError> {
    let bytes =
        read_input_stream(stream, MAX_DOMAIN_XML_BYTES, "domain XML", name).map_err(|e| {
            DomainXmlError {
                source_name: name.to_string(),
                message: e.to_string(),
            }
        })?;
    parse_domain_xml_bytes(&bytes, name)
}

/// Scans bytes that should be a UTF-8 domain XML.
pub fn parse_domain_xml_bytes(bytes: &[u8], name: &str) -> Result<DomainFacts, DomainXmlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| DomainXmlError {
        source_name: name.to_string(),
        message: format!(
            "not UTF-8 at byte {} (libvirt writes domain XML in UTF-8)",
            e.valid_up_to()
        ),
    })?;
    parse_domain_xml(text, name)
}

/// Scans a domain XML's text; `name` (a path or `<stdin>`) goes into errors and facts.
pub fn parse_domain_xml(xml: &str, name: &str) -> Result<DomainFacts, DomainXmlError> {
    let err = |message: String| DomainXmlError {
        source_name: name.to_string(),
        message,
    };
    if let Some(at) = xml.find('\0') {
        return Err(err(format!("NUL character at byte {at}: not XML")));
    }
    let mut scanner = Scanner::new(name);
    let mut reader = Reader::from_str(xml);
    loop {
        let start = reader.buffer_position() as usize;
        let event = reader.read_event().map_err(|e| {
            err(format!(
                "not well-formed XML at byte {}: {e}",
                reader.error_position()
            ))
        })?;
        let end = reader.buffer_position() as usize;
        if !scanner.event(event, start..end).map_err(err)? {
            break;
        }
    }
    scanner.finish().map_err(err)
}

/// A hostdev being read, until its end tag.
#[derive(Default)]
struct HostdevDraft {
    bdf: Option<Bdf>,
    managed: bool,
    alias: Option<(std::ops::Range<usize>, String)>,
}

/// Which element's text is being collected.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TextOf {
    Name,
    Emulator,
    /// `<pcihole64>` with its unit's shift.
    Hole64(u32),
}

struct Scanner {
    facts: DomainFacts,
    stack: Vec<String>,
    domain_closed: bool,
    domain_seen: bool,
    hostdev: Option<HostdevDraft>,
    device: Option<(String, OverrideDevice)>,
    text_of: Option<TextOf>,
    text: String,
}

fn attr(e: &BytesStart, name: &str) -> Result<Option<String>, String> {
    match e.try_get_attribute(name) {
        Ok(None) => Ok(None),
        Ok(Some(a)) => a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map(|v| Some(v.into_owned()))
            .map_err(|x| format!("attribute {name}: {x}")),
        Err(x) => Err(format!("attribute {name}: {x}")),
    }
}

/// An address attribute as libvirt reads it (`virXMLPropUInt(…, 0, …)` in
/// src/conf/device_conf.c: strtoul base 0, so `0x` is hex, a leading `0` octal, else
/// decimal); a missing attribute is 0, as libvirt zeroes the address first.
fn libvirt_uint(v: Option<&str>) -> Option<u32> {
    let Some(t) = v.map(str::trim) else {
        return Some(0);
    };
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u32::from_str_radix(h, 16).ok()
    } else if t.len() > 1 && t.starts_with('0') {
        u32::from_str_radix(&t[1..], 8).ok()
    } else {
        t.parse().ok()
    }
}

fn source_address(e: &BytesStart) -> Result<Bdf, String> {
    let field = |n: &str, max: u32| -> Result<u32, String> {
        let v = attr(e, n)?;
        libvirt_uint(v.as_deref())
            .filter(|x| *x <= max)
            .ok_or_else(|| {
                format!(
                    "<address {n}='{}'> is not a number up to {max:#x} (libvirt reads 0x… as hex, 0… as octal, else decimal)",
                    v.unwrap_or_default()
                )
            })
    };
    Ok(Bdf::new(
        field("domain", 0xffff)? as u16,
        field("bus", 0xff)? as u8,
        field("slot", 0x1f)? as u8,
        field("function", 7)? as u8,
    ))
}

/// `<pcihole64 unit=…>`: libvirt's scaled integer units (KiB when absent).
fn unit_shift(unit: Option<&str>) -> Result<u32, String> {
    Ok(match unit.unwrap_or("KiB") {
        "b" | "bytes" => 0,
        "k" | "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        u => {
            return Err(format!(
                "<pcihole64 unit='{u}'> is not a unit libvirt knows"
            ))
        }
    })
}

impl Scanner {
    fn new(name: &str) -> Self {
        Scanner {
            facts: DomainFacts {
                source_name: name.to_string(),
                ..DomainFacts::default()
            },
            stack: Vec::new(),
            domain_closed: false,
            domain_seen: false,
            hostdev: None,
            device: None,
            text_of: None,
            text: String::new(),
        }
    }

    /// Handles one event at `span`; `false` at the end of the document.
    fn event(&mut self, event: Event, span: std::ops::Range<usize>) -> Result<bool, String> {
        match event {
            Event::Start(e) => self.start(&e, span, false)?,
            Event::Empty(e) => self.start(&e, span, true)?,
            Event::End(e) => {
                let name = e.name().as_ref().to_string();
                self.end(&name, span.start)?;
            }
            Event::Text(t) if self.text_of.is_some() => {
                self.text
                    .push_str(&t.xml_content(quick_xml::XmlVersion::Implicit1_0));
            }
            Event::GeneralRef(r) if self.text_of.is_some() => {
                let c = r
                    .resolve_char_ref()
                    .map_err(|e| format!("character reference: {e}"))?;
                match c {
                    Some(c) => self.text.push(c),
                    None => self
                        .text
                        .push_str(predefined_entity(&r.clone().into_inner())?),
                }
            }
            Event::CData(t) if self.text_of.is_some() => {
                self.text.push_str(&t.into_inner());
            }
            Event::DocType(_) => {
                return Err(
                    "has a DOCTYPE; libvirt never writes one and entities are not accepted here"
                        .into(),
                )
            }
            Event::Eof => return Ok(false),
            _ => {}
        }
        Ok(true)
    }

    fn start(
        &mut self,
        e: &BytesStart,
        span: std::ops::Range<usize>,
        empty: bool,
    ) -> Result<(), String> {
        let name = e.name().as_ref().to_string();
        if self.stack.is_empty() {
            self.root(&name, span.end)?;
            self.domain_attrs(e)?;
            // `<domain/>`: the root is already closed.
            self.domain_closed |= empty;
        } else if self.stack.len() >= MAX_DEPTH {
            return Err(format!(
                "elements nested deeper than {MAX_DEPTH} levels, which libvirt refuses too"
            ));
        }
        self.element(&name, e, span, empty)?;
        if !empty {
            self.stack.push(name);
        }
        Ok(())
    }

    fn root(&mut self, name: &str, tag_end: usize) -> Result<(), String> {
        if self.domain_closed {
            return Err(format!("a second root element <{name}> after </domain>"));
        }
        if name != "domain" {
            return Err(format!("root element is <{name}>, expected <domain>"));
        }
        self.domain_seen = true;
        self.facts.positions.domain_tag_close = tag_end - 1;
        Ok(())
    }

    fn domain_attrs(&mut self, e: &BytesStart) -> Result<(), String> {
        if let Some(uri) = attr(e, "xmlns:qemu")? {
            if uri != QEMU_NS {
                return Err(format!(
                    "xmlns:qemu is bound to '{uri}', not {QEMU_NS}; fix the namespace declaration"
                ));
            }
            self.facts.has_qemu_ns = true;
        }
        Ok(())
    }

    fn parent(&self) -> Option<&str> {
        self.stack.last().map(String::as_str)
    }

    fn grandparent(&self) -> Option<&str> {
        self.stack.iter().rev().nth(1).map(String::as_str)
    }

    fn element(
        &mut self,
        name: &str,
        e: &BytesStart,
        span: std::ops::Range<usize>,
        empty: bool,
    ) -> Result<(), String> {
        match (name, self.parent()) {
            ("name", Some("domain")) => self.collect_text(TextOf::Name),
            ("emulator", Some("devices")) => self.collect_text(TextOf::Emulator),
            ("type", Some("os")) => {
                self.facts.machine = attr(e, "machine")?;
                self.facts.arch = attr(e, "arch")?;
            }
            ("pcihole64", _) => {
                let shift = unit_shift(attr(e, "unit")?.as_deref())?;
                self.collect_text(TextOf::Hole64(shift));
                self.facts.positions.hole64_element = Some(span.start..span.end);
            }
            ("controller", Some("devices"))
                if attr(e, "type")?.as_deref() == Some("pci")
                    && attr(e, "index")?.as_deref() == Some("0") =>
            {
                self.facts.positions.root_controller = Some((span, empty));
            }
            ("hidden", Some("kvm")) if attr(e, "state")?.as_deref() == Some("on") => {
                self.facts
                    .hidden_hypervisor
                    .push(HiddenHypervisor::KvmHidden);
            }
            ("feature", Some("cpu")) => self.cpu_feature(e)?,
            ("hostdev", _) => self.hostdev_start(e, empty)?,
            ("address", Some("source")) if self.grandparent() == Some("hostdev") => {
                if let Some(h) = self.hostdev.as_mut() {
                    let alias = h.alias.as_ref().map(|(_, n)| n.clone());
                    let bdf = source_address(e).map_err(|m| match alias {
                        Some(a) => format!("hostdev {a}: {m}"),
                        None => format!("hostdev: {m}"),
                    })?;
                    h.bdf = Some(bdf);
                }
            }
            ("alias", Some("hostdev")) => {
                if let Some(h) = self.hostdev.as_mut() {
                    h.alias = Some((span, attr(e, "name")?.unwrap_or_default()));
                }
            }
            ("qemu:device", Some("qemu:override")) if !empty => {
                let device = OverrideDevice {
                    end_tag: span.start,
                    ..OverrideDevice::default()
                };
                self.device = Some((attr(e, "alias")?.unwrap_or_default(), device));
            }
            ("qemu:property", Some("qemu:frontend")) => self.override_property(e, span)?,
            ("qemu:arg", Some("qemu:commandline")) => {
                let value = attr(e, "value")?.unwrap_or_default();
                self.facts.commandline_args.push(value);
                self.facts.positions.commandline_arg_spans.push(span);
            }
            _ => {}
        }
        Ok(())
    }

    fn collect_text(&mut self, of: TextOf) {
        self.text_of = Some(of);
        self.text.clear();
    }

    fn cpu_feature(&mut self, e: &BytesStart) -> Result<(), String> {
        if attr(e, "name")?.as_deref() != Some("hypervisor") {
            return Ok(());
        }
        if let Some(policy @ ("disable" | "forbid")) = attr(e, "policy")?.as_deref() {
            self.facts
                .hidden_hypervisor
                .push(HiddenHypervisor::CpuFeatureDisabled {
                    policy: policy.to_string(),
                });
        }
        Ok(())
    }

    fn hostdev_start(&mut self, e: &BytesStart, empty: bool) -> Result<(), String> {
        // libvirt's default mode is 'subsystem'.
        let subsystem = attr(e, "mode")?.as_deref().unwrap_or("subsystem") == "subsystem";
        if subsystem && attr(e, "type")?.as_deref() == Some("pci") && !empty {
            self.hostdev = Some(HostdevDraft {
                managed: attr(e, "managed")?.as_deref() == Some("yes"),
                ..HostdevDraft::default()
            });
        }
        Ok(())
    }

    fn override_property(
        &mut self,
        e: &BytesStart,
        span: std::ops::Range<usize>,
    ) -> Result<(), String> {
        if attr(e, "name")?.as_deref() != Some(CLIQUE_PROPERTY) {
            return Ok(());
        }
        let value = attr(e, "value")?.unwrap_or_default();
        if let Some((alias, d)) = self.device.as_mut() {
            d.property = Some((span, value.clone()));
            self.facts
                .cliques
                .entry(alias.clone())
                .or_default()
                .push(CliqueSetting {
                    value,
                    source: CliqueSource::Override,
                });
        }
        Ok(())
    }

    fn end(&mut self, name: &str, at: usize) -> Result<(), String> {
        self.finish_text()?;
        match (name, self.stack.len()) {
            ("hostdev", _) => self.hostdev_end(at)?,
            ("domain", 1) => {
                self.facts.positions.domain_end_tag = at;
                self.domain_closed = true;
            }
            ("pcihole64", _) => {
                if let Some(r) = self.facts.positions.hole64_element.as_mut() {
                    r.end = at;
                }
            }
            ("devices", 2) => self.facts.positions.devices_end_tag = Some(at),
            ("qemu:override", 2) => self.facts.positions.override_end_tag = Some(at),
            ("qemu:commandline", 2) => self.facts.positions.commandline_end_tag = Some(at),
            ("qemu:device", _) => {
                if let Some((alias, mut d)) = self.device.take() {
                    d.end_tag = at;
                    self.facts.positions.override_devices.insert(alias, d);
                }
            }
            ("qemu:frontend", _) => {
                if let Some((_, d)) = self.device.as_mut() {
                    d.frontend_end_tag = Some(at);
                }
            }
            _ => {}
        }
        self.stack.pop();
        Ok(())
    }

    fn hostdev_end(&mut self, at: usize) -> Result<(), String> {
        let Some(h) = self.hostdev.take() else {
            return Ok(());
        };
        let Some(bdf) = h.bdf else {
            let what = h
                .alias
                .map(|(_, n)| n)
                .unwrap_or_else(|| "without alias".into());
            return Err(format!(
                "hostdev {what}: no <source><address/> with the host PCI address"
            ));
        };
        self.facts.hostdevs.push(PciHostdev {
            bdf,
            managed: h.managed,
            alias: h.alias,
            end_tag: at,
        });
        Ok(())
    }

    fn finish_text(&mut self) -> Result<(), String> {
        let Some(of) = self.text_of.take() else {
            return Ok(());
        };
        let text = std::mem::take(&mut self.text);
        let text = text.trim();
        match of {
            TextOf::Name => self.facts.name = Some(text.to_string()),
            TextOf::Emulator => self.facts.emulator = Some(text.to_string()),
            TextOf::Hole64(shift) => {
                let bytes = text
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(1 << shift))
                    .ok_or_else(|| format!("<pcihole64>{text}</pcihole64> is not a size"))?;
                self.facts.hole64 = Some(Hole64 {
                    bytes,
                    source: "<pcihole64>".into(),
                });
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<DomainFacts, String> {
        if let Some(open) = self.stack.last() {
            return Err(format!("ends inside <{open}> (truncated?)"));
        }
        if !self.domain_seen {
            return Err("no <domain> element".into());
        }
        self.commandline_facts();
        Ok(self.facts)
    }

    /// Cliques (`-set device.ALIAS.x-nv-gpudirect-clique=N`), `-cpu …,kvm=off`,
    /// `pci-hole64-size=` and `highmem-mmio-size=` in `<qemu:commandline>` (the QEMU-argv
    /// reader's).
    fn commandline_facts(&mut self) {
        let argv = read_qemu_argv(&self.facts.commandline_args);
        for (alias, value) in argv.set_cliques {
            self.facts
                .cliques
                .entry(alias)
                .or_default()
                .push(CliqueSetting {
                    value,
                    source: CliqueSource::Commandline,
                });
        }
        for cpu in argv.hidden_cpu {
            self.facts
                .hidden_hypervisor
                .push(HiddenHypervisor::QemuCpuKvmOff { cpu });
        }
        if let (None, Some((i, bytes))) = (&self.facts.hole64, argv.hole64) {
            let arg = &self.facts.commandline_args[i];
            self.facts.hole64 = Some(Hole64 {
                bytes,
                source: format!("<qemu:arg value='{arg}'/>"),
            });
            self.facts.positions.hole64_arg = Some(i);
        }
        if let Some((i, bytes)) = argv.highmem_mmio {
            let arg = &self.facts.commandline_args[i];
            self.facts.highmem_mmio = Some(Hole64 {
                bytes,
                source: format!("<qemu:arg value='{arg}'/>"),
            });
            self.facts.positions.highmem_mmio_arg = Some(i);
        }
    }
}

/// XML's five predefined entities; anything else would need a DOCTYPE, which is refused.
fn predefined_entity(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "lt" => "<",
        "gt" => ">",
        "amp" => "&",
        "apos" => "'",
        "quot" => "\"",
        other => return Err(format!("unknown entity &{other};")),
    })
}

#[cfg(test)]
mod tests;
