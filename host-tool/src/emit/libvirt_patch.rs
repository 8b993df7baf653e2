//! `vfio-p2p libvirt patch`: adds the clique settings to an existing domain XML.
//!
//! The file is edited as text at positions found with quick-xml's reader, never
//! re-serialized, so everything not touched (comments, attribute quoting, whitespace,
//! element order) stays byte-for-byte. Patching twice changes nothing.

use std::collections::BTreeMap;
use std::ops::Range;

use pci_config::Bdf;

use super::libvirt::{clique_property, override_devices, set_args, LibvirtVersion, QEMU_NS};
use crate::model::domain::{DomainFacts, OverrideDevice};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("{source_name}: the domain hides the hypervisor from the guest ({how}), so the NVIDIA driver ignores the clique; remove that setting first")]
    HypervisorHidden { source_name: String, how: String },
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

/// Text insertions and replacements, by byte range of the original document.
struct Edits<'a> {
    xml: &'a str,
    s: &'a DomainFacts,
    edits: Vec<(Range<usize>, String)>,
    warnings: Vec<String>,
    need_ns: bool,
}

/// Applies cliques (per hostdev host address) to `xml`, which `read::domain_xml` read as
/// `s`; refuses a domain that hides the hypervisor (the clique would be ignored).
pub fn apply(
    xml: &str,
    s: &DomainFacts,
    cliques: &BTreeMap<Bdf, Option<u8>>,
    version: LibvirtVersion,
) -> Result<Patched, PatchError> {
    if !s.hidden_hypervisor.is_empty() {
        let how: Vec<String> = s.hidden_hypervisor.iter().map(|h| h.to_string()).collect();
        return Err(PatchError::HypervisorHidden {
            source_name: s.source_name.clone(),
            how: how.join("; "),
        });
    }
    let mut e = Edits {
        xml,
        s,
        edits: Vec::new(),
        warnings: Vec::new(),
        need_ns: false,
    };
    let (aliases, entries) = e.hostdev_aliases(cliques);
    if version.has_override() {
        e.override_entries(&entries);
    } else {
        e.commandline_entries(&entries, version);
    }
    if e.need_ns && !s.has_qemu_ns {
        let pos = s.positions.domain_tag_close;
        e.edits.push((pos..pos, format!(" xmlns:qemu='{QEMU_NS}'")));
    }
    Ok(Patched {
        xml: e.apply_all(),
        aliases,
        warnings: e.warnings,
    })
}

impl Edits<'_> {
    fn insert(&mut self, pos: usize, text: String) {
        self.edits.push((pos..pos, text));
    }

    /// Gives every hostdev that gets a clique a user alias (`ua-…`, which `qemu:override`
    /// needs); returns the aliases and the (alias, clique) entries to write.
    fn hostdev_aliases(
        &mut self,
        cliques: &BTreeMap<Bdf, Option<u8>>,
    ) -> (BTreeMap<Bdf, String>, Vec<(String, u8)>) {
        let mut aliases = BTreeMap::new();
        let mut entries = Vec::new();
        for h in &self.s.hostdevs {
            let Some(clique) = cliques.get(&h.bdf) else {
                continue;
            };
            let alias = match &h.alias {
                Some((_, name)) if name.starts_with("ua-") => name.clone(),
                Some((range, name)) => {
                    let new = alias_for_host(&h.bdf);
                    self.warnings.push(format!(
                        "hostdev {}: alias '{name}' is not a user alias (ua-…); replaced by '{new}'",
                        h.bdf
                    ));
                    self.edits
                        .push((range.clone(), format!("<alias name='{new}'/>")));
                    new
                }
                None => {
                    let new = alias_for_host(&h.bdf);
                    let base = indent_at(self.xml, h.end_tag);
                    self.insert(h.end_tag, format!("  <alias name='{new}'/>\n{base}"));
                    new
                }
            };
            aliases.insert(h.bdf, alias.clone());
            if let Some(c) = clique {
                entries.push((alias, *c));
            }
        }
        (aliases, entries)
    }

    /// libvirt ≥ 8.2: one `<qemu:device>` per alias in `<qemu:override>`, editing what is there.
    fn override_entries(&mut self, entries: &[(String, u8)]) {
        let mut new_devices = Vec::new();
        for (alias, c) in entries {
            match self.s.positions.override_devices.get(alias) {
                Some(d) => self.override_device(d, *c),
                None => new_devices.push((alias.clone(), *c)),
            }
        }
        if !new_devices.is_empty() {
            self.need_ns = true;
            self.new_override_devices(&new_devices);
        }
    }

    /// An existing `<qemu:device>`: set, replace or add the property.
    fn override_device(&mut self, d: &OverrideDevice, c: u8) {
        let xml = self.xml;
        match (&d.property, d.frontend_end_tag) {
            (Some((_, v)), _) if v == &c.to_string() => {}
            (Some((range, _)), _) => self.edits.push((range.clone(), clique_property(c))),
            (None, Some(fe)) => {
                let base = indent_at(xml, fe);
                self.insert(fe, format!("  {}\n{base}", clique_property(c)));
            }
            (None, None) => {
                let base = indent_at(xml, d.end_tag);
                self.insert(
                    d.end_tag,
                    format!(
                        "  <qemu:frontend>\n{base}    {}\n{base}  </qemu:frontend>\n{base}",
                        clique_property(c)
                    ),
                );
            }
        }
    }

    /// `<qemu:device>` elements for aliases the override does not have yet.
    fn new_override_devices(&mut self, devices: &[(String, u8)]) {
        let xml = self.xml;
        let positions = &self.s.positions;
        match positions.override_end_tag {
            Some(pos) => {
                let base = indent_at(xml, pos);
                let block = override_devices(devices, &format!("{base}  "));
                self.insert(pos, format!("{}{base}", block.trim_start()));
            }
            None => {
                let end = positions.domain_end_tag;
                let base = format!("{}  ", indent_at(xml, end));
                let block = override_devices(devices, &format!("{base}  "));
                // The end tag's own indentation is already in front of the insertion point.
                self.insert(
                    end,
                    format!(
                        "  <qemu:override>\n{block}{base}</qemu:override>\n{}",
                        indent_at(xml, end)
                    ),
                );
            }
        }
    }

    /// libvirt < 8.2: `-set device.ALIAS.x-nv-gpudirect-clique=N` in `<qemu:commandline>`.
    fn commandline_entries(&mut self, entries: &[(String, u8)], version: LibvirtVersion) {
        let args: Vec<String> = set_args(entries)
            .chunks(2)
            .filter(|pair| !self.s.commandline_args.contains(&pair[1]))
            .flat_map(|pair| pair.to_vec())
            .collect();
        if args.is_empty() {
            return;
        }
        self.warnings
            .push(super::libvirt::set_form_warning(version));
        self.need_ns = true;
        let lines = |base: &str| -> String {
            args.iter()
                .map(|a| format!("{base}<qemu:arg value='{a}'/>\n"))
                .collect()
        };
        let xml = self.xml;
        match self.s.positions.commandline_end_tag {
            Some(pos) => {
                let base = indent_at(xml, pos);
                let block = lines(&format!("{base}  "));
                self.insert(pos, format!("{}{base}", block.trim_start()));
            }
            None => {
                let end = self.s.positions.domain_end_tag;
                let outer = indent_at(xml, end);
                let base = format!("{outer}  ");
                let block = lines(&format!("{base}  "));
                self.insert(
                    end,
                    format!("  <qemu:commandline>\n{block}{base}</qemu:commandline>\n{outer}"),
                );
            }
        }
    }

    /// The document with every edit made, last position first so earlier ranges stay valid.
    fn apply_all(&mut self) -> String {
        self.edits.sort_by_key(|(r, _)| (r.start, r.end));
        let mut out = self.xml.to_string();
        for (range, text) in std::mem::take(&mut self.edits).into_iter().rev() {
            out.replace_range(range, &text);
        }
        out
    }
}
