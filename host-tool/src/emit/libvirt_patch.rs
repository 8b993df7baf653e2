//! `vfio-p2p libvirt patch`: adds the clique settings to an existing domain XML.
//!
//! The file is edited as text at positions found with quick-xml's reader, never
//! re-serialized, so everything not touched (comments, attribute quoting, whitespace,
//! element order) stays byte-for-byte. Patching twice changes nothing.

use std::collections::BTreeMap;

use pci_config::Bdf;

use super::libvirt::{clique_property, override_devices, set_args, LibvirtVersion, QEMU_NS};
use crate::model::domain::DomainFacts;

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
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut aliases = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut entries: Vec<(String, u8)> = Vec::new();
    for h in &s.hostdevs {
        let Some(clique) = cliques.get(&h.bdf) else {
            continue;
        };
        let alias = match &h.alias {
            Some((_, name)) if name.starts_with("ua-") => name.clone(),
            Some((range, name)) => {
                let new = alias_for_host(&h.bdf);
                warnings.push(format!(
                    "hostdev {}: alias '{name}' is not a user alias (ua-…); replaced by '{new}'",
                    h.bdf
                ));
                edits.push((range.clone(), format!("<alias name='{new}'/>")));
                new
            }
            None => {
                let new = alias_for_host(&h.bdf);
                let base = indent_at(xml, h.end_tag);
                edits.push((
                    h.end_tag..h.end_tag,
                    format!("  <alias name='{new}'/>\n{base}"),
                ));
                new
            }
        };
        aliases.insert(h.bdf, alias.clone());
        if let Some(c) = clique {
            entries.push((alias, *c));
        }
    }
    let mut need_ns = false;
    if version.has_override() {
        let mut new_devices = Vec::new();
        for (alias, c) in &entries {
            match s.positions.override_devices.get(alias) {
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
            match s.positions.override_end_tag {
                Some(pos) => {
                    let base = indent_at(xml, pos);
                    let block = override_devices(&new_devices, &format!("{base}  "));
                    edits.push((pos..pos, format!("{}{base}", block.trim_start())));
                }
                None => {
                    let base = format!("{}  ", indent_at(xml, s.positions.domain_end_tag));
                    let block = override_devices(&new_devices, &format!("{base}  "));
                    edits.push((
                        s.positions.domain_end_tag..s.positions.domain_end_tag,
                        // The end tag's own indentation is already in front of the insertion point.
                        format!(
                            "  <qemu:override>\n{block}{base}</qemu:override>\n{}",
                            indent_at(xml, s.positions.domain_end_tag)
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
            match s.positions.commandline_end_tag {
                Some(pos) => {
                    let base = indent_at(xml, pos);
                    let block = lines(&format!("{base}  "));
                    edits.push((pos..pos, format!("{}{base}", block.trim_start())));
                }
                None => {
                    let outer = indent_at(xml, s.positions.domain_end_tag);
                    let base = format!("{outer}  ");
                    let block = lines(&format!("{base}  "));
                    edits.push((
                        s.positions.domain_end_tag..s.positions.domain_end_tag,
                        format!("  <qemu:commandline>\n{block}{base}</qemu:commandline>\n{outer}"),
                    ));
                }
            }
        }
    }
    if need_ns && !s.has_qemu_ns {
        let pos = s.positions.domain_tag_close;
        edits.push((pos..pos, format!(" xmlns:qemu='{QEMU_NS}'")));
    }
    edits.sort_by_key(|(r, _)| (r.start, r.end));
    let mut out = xml.to_string();
    for (range, text) in edits.into_iter().rev() {
        out.replace_range(range, &text);
    }
    Ok(Patched {
        xml: out,
        aliases,
        warnings,
    })
}
