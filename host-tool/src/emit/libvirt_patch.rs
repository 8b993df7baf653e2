//! `vfio-p2p libvirt patch`: adds the clique settings to an existing domain XML.
//!
//! The file is edited as text at positions found with quick-xml's reader, never
//! re-serialized, so everything not touched (comments, attribute quoting, whitespace,
//! element order) stays byte-for-byte. Patching twice changes nothing.

use std::collections::BTreeMap;

use pci_config::Bdf;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::libvirt::{
    clique_property, override_devices, set_args, LibvirtVersion, CLIQUE_PROPERTY, QEMU_NS,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("{source_name}: not well-formed XML at byte {position}: {message}")]
    Xml {
        source_name: String,
        position: u64,
        message: String,
    },
    #[error("{0}: no <domain> element")]
    NoDomain(String),
    #[error("{0}: the domain hides the hypervisor from the guest (<kvm><hidden state='on'/> or CPU feature 'hypervisor' disabled), so the NVIDIA driver ignores the clique; remove that setting first")]
    HypervisorHidden(String),
    #[error("{source_name}: xmlns:qemu is bound to '{uri}', not {QEMU_NS}; fix the namespace declaration")]
    QemuNamespace { source_name: String, uri: String },
    #[error("{source_name}: hostdev {bdf} has a malformed <source><address>: {message}")]
    Address {
        source_name: String,
        bdf: String,
        message: String,
    },
}

/// An `<alias>` element's byte range and name.
type Alias = (std::ops::Range<usize>, String);

/// A `<hostdev mode='subsystem' type='pci'>` found in the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostdev {
    pub host: Bdf,
    /// The alias element's byte range and name, if present.
    pub alias: Option<(std::ops::Range<usize>, String)>,
    /// Where `</hostdev>` starts.
    pub end_tag: usize,
}

/// One `<qemu:device>` of `<qemu:override>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct OverrideDevice {
    end_tag: usize,
    frontend_end_tag: Option<usize>,
    /// The clique property's element range and value.
    property: Option<(std::ops::Range<usize>, String)>,
}

/// What the patch needs to know about a domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainScan {
    pub hostdevs: Vec<Hostdev>,
    /// Position of the domain start tag's closing `>`.
    domain_tag_close: usize,
    has_qemu_ns: bool,
    domain_end_tag: usize,
    override_end_tag: Option<usize>,
    override_devices: BTreeMap<String, OverrideDevice>,
    commandline_end_tag: Option<usize>,
    commandline_args: Vec<String>,
}

fn attr(e: &BytesStart, name: &str) -> Option<String> {
    e.try_get_attribute(name).ok().flatten().and_then(|a| {
        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .ok()
            .map(|v| v.into_owned())
    })
}

fn parse_hex<T: TryFrom<u32>>(s: &str) -> Option<T> {
    let v = u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()?;
    T::try_from(v).ok()
}

/// Reads the positions the patch needs; refuses domains that hide the hypervisor.
pub fn scan(xml: &str, source_name: &str) -> Result<DomainScan, PatchError> {
    let mut r = Reader::from_str(xml);
    let mut scan = DomainScan::default();
    let mut stack: Vec<String> = Vec::new();
    let mut found_domain = false;
    let mut cur_hostdev: Option<(Option<Bdf>, Option<Alias>)> = None;
    let mut cur_device: Option<(String, OverrideDevice)> = None;
    loop {
        let start = r.buffer_position() as usize;
        let ev = r.read_event().map_err(|e| PatchError::Xml {
            source_name: source_name.to_string(),
            position: r.error_position(),
            message: e.to_string(),
        })?;
        let end = r.buffer_position() as usize;
        let (e, empty) = match &ev {
            Event::Start(e) => (Some(e), false),
            Event::Empty(e) => (Some(e), true),
            Event::End(e) => {
                let name = e.name().as_ref().to_string();
                match (name.as_str(), stack.len()) {
                    ("hostdev", _) => {
                        if let Some((Some(host), alias)) = cur_hostdev.take() {
                            scan.hostdevs.push(Hostdev {
                                host,
                                alias,
                                end_tag: start,
                            });
                        }
                    }
                    ("domain", 1) => scan.domain_end_tag = start,
                    ("qemu:override", 2) => scan.override_end_tag = Some(start),
                    ("qemu:commandline", 2) => scan.commandline_end_tag = Some(start),
                    ("qemu:device", _) => {
                        if let Some((alias, mut d)) = cur_device.take() {
                            d.end_tag = start;
                            scan.override_devices.insert(alias, d);
                        }
                    }
                    ("qemu:frontend", _) => {
                        if let Some((_, d)) = cur_device.as_mut() {
                            d.frontend_end_tag = Some(start);
                        }
                    }
                    _ => {}
                }
                stack.pop();
                continue;
            }
            Event::Eof => break,
            _ => continue,
        };
        let Some(e) = e else { continue };
        let name = e.name().as_ref().to_string();
        let parent = stack.last().map(String::as_str);
        match (name.as_str(), parent) {
            ("domain", None) => {
                found_domain = true;
                // The closing `>` of the start tag (`/>` never happens for a real domain).
                scan.domain_tag_close = end - 1;
                if let Some(uri) = attr(e, "xmlns:qemu") {
                    if uri != QEMU_NS {
                        return Err(PatchError::QemuNamespace {
                            source_name: source_name.to_string(),
                            uri,
                        });
                    }
                    scan.has_qemu_ns = true;
                }
            }
            ("hidden", Some("kvm")) if attr(e, "state").as_deref() == Some("on") => {
                return Err(PatchError::HypervisorHidden(source_name.to_string()))
            }
            ("feature", Some("cpu"))
                if attr(e, "name").as_deref() == Some("hypervisor")
                    && matches!(attr(e, "policy").as_deref(), Some("disable" | "forbid")) =>
            {
                return Err(PatchError::HypervisorHidden(source_name.to_string()))
            }
            ("hostdev", _)
                if attr(e, "mode").as_deref() == Some("subsystem")
                    && attr(e, "type").as_deref() == Some("pci")
                    && !empty =>
            {
                cur_hostdev = Some((None, None));
            }
            ("address", Some("source"))
                if stack.iter().rev().nth(1).map(String::as_str) == Some("hostdev") =>
            {
                if let Some(h) = cur_hostdev.as_mut() {
                    let field = |n: &str| attr(e, n).unwrap_or_default();
                    let text = format!(
                        "{}:{}:{}.{}",
                        field("domain"),
                        field("bus"),
                        field("slot"),
                        field("function")
                    );
                    let bdf = (|| {
                        Some(Bdf::new(
                            parse_hex(&attr(e, "domain").unwrap_or_else(|| "0".into()))?,
                            parse_hex(&field("bus"))?,
                            parse_hex(&field("slot"))?,
                            parse_hex(&attr(e, "function").unwrap_or_else(|| "0".into()))?,
                        ))
                    })()
                    .filter(|b| b.device <= 0x1f && b.function <= 7)
                    .ok_or_else(|| PatchError::Address {
                        source_name: source_name.to_string(),
                        bdf: text,
                        message: "domain, bus, slot and function must be hex numbers".into(),
                    })?;
                    h.0 = Some(bdf);
                }
            }
            ("alias", Some("hostdev")) => {
                if let Some(h) = cur_hostdev.as_mut() {
                    let range = start..end;
                    h.1 = Some((range, attr(e, "name").unwrap_or_default()));
                }
            }
            ("qemu:device", Some("qemu:override")) => {
                let d = OverrideDevice {
                    end_tag: start,
                    ..Default::default()
                };
                if empty {
                    // `<qemu:device alias='x'/>` holds nothing: handled like a missing one.
                } else {
                    cur_device = Some((attr(e, "alias").unwrap_or_default(), d));
                }
            }
            ("qemu:property", Some("qemu:frontend")) => {
                if let Some((_, d)) = cur_device.as_mut() {
                    if attr(e, "name").as_deref() == Some(CLIQUE_PROPERTY) {
                        d.property = Some((start..end, attr(e, "value").unwrap_or_default()));
                    }
                }
            }
            ("qemu:arg", Some("qemu:commandline")) => {
                scan.commandline_args
                    .push(attr(e, "value").unwrap_or_default());
            }
            _ => {}
        }
        if !empty {
            stack.push(name);
        }
    }
    if !found_domain {
        return Err(PatchError::NoDomain(source_name.to_string()));
    }
    Ok(scan)
}

/// The indentation of the line holding position `pos`.
fn indent_at(xml: &str, pos: usize) -> &str {
    let line_start = xml[..pos].rfind('\n').map_or(0, |i| i + 1);
    let ws = &xml[line_start..pos];
    if ws.chars().all(|c| c == ' ' || c == '\t') {
        ws
    } else {
        ""
    }
}

/// The user alias the patch gives a hostdev without one.
pub fn alias_for_host(bdf: &Bdf) -> String {
    format!(
        "ua-gpu-{:04x}-{:02x}-{:02x}-{:x}",
        bdf.domain, bdf.bus, bdf.device, bdf.function
    )
}

/// The result of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patched {
    pub xml: String,
    /// Hostdev alias per host BDF, as now in the domain.
    pub aliases: BTreeMap<Bdf, String>,
    pub warnings: Vec<String>,
}

/// Applies cliques (per hostdev host address) to `xml`, which `scan` produced `s` from.
pub fn apply(
    xml: &str,
    s: &DomainScan,
    cliques: &BTreeMap<Bdf, Option<u8>>,
    version: LibvirtVersion,
) -> Patched {
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut aliases = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut entries: Vec<(String, u8)> = Vec::new();
    for h in &s.hostdevs {
        let Some(clique) = cliques.get(&h.host) else {
            continue;
        };
        let alias = match &h.alias {
            Some((_, name)) if name.starts_with("ua-") => name.clone(),
            Some((range, name)) => {
                let new = alias_for_host(&h.host);
                warnings.push(format!(
                    "hostdev {}: alias '{name}' is not a user alias (ua-…); replaced by '{new}'",
                    h.host
                ));
                edits.push((range.clone(), format!("<alias name='{new}'/>")));
                new
            }
            None => {
                let new = alias_for_host(&h.host);
                let base = indent_at(xml, h.end_tag);
                edits.push((
                    h.end_tag..h.end_tag,
                    format!("  <alias name='{new}'/>\n{base}"),
                ));
                new
            }
        };
        aliases.insert(h.host, alias.clone());
        if let Some(c) = clique {
            entries.push((alias, *c));
        }
    }
    let mut need_ns = false;
    if version.has_override() {
        let mut new_devices = Vec::new();
        for (alias, c) in &entries {
            match s.override_devices.get(alias) {
                Some(d) => match (&d.property, d.frontend_end_tag) {
                    (Some((_, v)), _) if v == &c.to_string() => {}
                    (Some((range, _)), _) => edits.push((range.clone(), clique_property(*c))),
                    (None, Some(fe)) => {
                        let base = indent_at(xml, fe);
                        edits.push((fe..fe, format!("  {}\n{base}", clique_property(*c))));
                    }
                    (None, None) => {
                        let base = indent_at(xml, d.end_tag);
                        edits.push((
                            d.end_tag..d.end_tag,
                            format!(
                                "  <qemu:frontend>\n{base}    {}\n{base}  </qemu:frontend>\n{base}",
                                clique_property(*c)
                            ),
                        ));
                    }
                },
                None => new_devices.push((alias.clone(), *c)),
            }
        }
        if !new_devices.is_empty() {
            need_ns = true;
            match s.override_end_tag {
                Some(pos) => {
                    let base = indent_at(xml, pos);
                    let block = override_devices(&new_devices, &format!("{base}  "));
                    edits.push((pos..pos, format!("{}{base}", block.trim_start())));
                }
                None => {
                    let base = format!("{}  ", indent_at(xml, s.domain_end_tag));
                    let block = override_devices(&new_devices, &format!("{base}  "));
                    edits.push((
                        s.domain_end_tag..s.domain_end_tag,
                        // The end tag's own indentation is already in front of the insertion point.
                        format!(
                            "  <qemu:override>\n{block}{base}</qemu:override>\n{}",
                            indent_at(xml, s.domain_end_tag)
                        ),
                    ));
                }
            }
        }
    } else {
        let args: Vec<String> = set_args(&entries)
            .chunks(2)
            .filter(|pair| !s.commandline_args.contains(&pair[1]))
            .flat_map(|pair| pair.to_vec())
            .collect();
        if !args.is_empty() {
            warnings.push(super::libvirt::set_form_warning(version));
            need_ns = true;
            let lines = |base: &str| -> String {
                args.iter()
                    .map(|a| format!("{base}<qemu:arg value='{a}'/>\n"))
                    .collect()
            };
            match s.commandline_end_tag {
                Some(pos) => {
                    let base = indent_at(xml, pos);
                    let block = lines(&format!("{base}  "));
                    edits.push((pos..pos, format!("{}{base}", block.trim_start())));
                }
                None => {
                    let outer = indent_at(xml, s.domain_end_tag);
                    let base = format!("{outer}  ");
                    let block = lines(&format!("{base}  "));
                    edits.push((
                        s.domain_end_tag..s.domain_end_tag,
                        format!("  <qemu:commandline>\n{block}{base}</qemu:commandline>\n{outer}"),
                    ));
                }
            }
        }
    }
    if need_ns && !s.has_qemu_ns {
        let pos = s.domain_tag_close;
        edits.push((pos..pos, format!(" xmlns:qemu='{QEMU_NS}'")));
    }
    edits.sort_by_key(|(r, _)| (r.start, r.end));
    let mut out = xml.to_string();
    for (range, text) in edits.into_iter().rev() {
        out.replace_range(range, &text);
    }
    Patched {
        xml: out,
        aliases,
        warnings,
    }
}
