//! `vfio-p2p libvirt patch`: adds the clique settings to an existing domain XML.
//!
//! The file is edited as text at positions found with quick-xml's reader, never
//! re-serialized, so everything not touched (comments, attribute quoting, whitespace,
//! element order) stays byte-for-byte. Patching twice changes nothing.
//!
//! A setting already in the domain, in any form the patch writes (a clique in
//! `<qemu:override>` or as `-set` in `<qemu:commandline>`; the 64-bit hole as `<pcihole64>` or
//! a `pci-hole64-size=` argument; an Arm `virt` machine's high PCIe window as a
//! `highmem-mmio-size=` argument), is replaced where it is, never added a second time; a
//! clique set twice keeps one setting.

use std::collections::BTreeMap;
use std::ops::Range;

use pci_config::Bdf;

use super::libvirt::{clique_property, override_devices, set_args};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_decide::vm::libvirt::PatchWindow;
use vfio_p2p_model::domain::QEMU_NS;
use vfio_p2p_model::domain::{DomainFacts, OverrideDevice};
use vfio_p2p_model::vmm::LibvirtVersion;

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

/// `range` grown to the whole lines it stands on (with their newline) when nothing else
/// stands on them, so that removing an element leaves no blank line.
fn whole_lines(xml: &str, range: Range<usize>) -> Range<usize> {
    let start = xml[..range.start].trim_end_matches([' ', '\t']).len();
    let after = &xml[range.end..];
    let end = range.end + (after.len() - after.trim_start_matches([' ', '\t']).len());
    let line_start = start == 0 || xml.as_bytes()[start - 1] == b'\n';
    if line_start && xml[end..].starts_with('\n') {
        start..end + 1
    } else {
        range
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
    /// `<qemu:commandline>` children to add (`<qemu:arg …/>`, a comment), in order.
    new_args: Vec<String>,
}

/// Applies cliques (per hostdev host address) and the MMIO window the GPUs need (`window`,
/// decided for the domain's machine) to `xml`, which `read::domain_xml` read as `s`;
/// refuses a domain that hides the hypervisor (the clique would be ignored).
pub fn apply(
    xml: &str,
    s: &DomainFacts,
    cliques: &BTreeMap<Bdf, Option<u8>>,
    window: PatchWindow,
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
        new_args: Vec::new(),
    };
    let (aliases, entries) = e.hostdev_aliases(cliques);
    let (overrides, sets) = e.existing_cliques(&entries, version);
    e.override_entries(&overrides);
    e.commandline_entries(&sets, version);
    match window {
        PatchWindow::DefaultFits => {}
        PatchWindow::PciHole64(need) => e.hole64(need),
        PatchWindow::HighmemMmio(size) => e.highmem_mmio(size),
    }
    e.write_commandline();
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

    /// Replaces the cliques the domain sets already, where they are set, and removes a
    /// second setting of the same alias; returns the entries still to write, as
    /// `<qemu:override>` (libvirt ≥ 8.2) or as `-set` arguments.
    #[allow(clippy::type_complexity)]
    fn existing_cliques(
        &mut self,
        entries: &[(String, u8)],
        version: LibvirtVersion,
    ) -> (Vec<(String, u8)>, Vec<(String, u8)>) {
        let (mut overrides, mut sets) = (Vec::new(), Vec::new());
        for (alias, c) in entries {
            let set_at = self.set_arg_indices(alias);
            let device = self.s.positions.override_devices.get(alias);
            let has_property = device.is_some_and(|d| d.property.is_some());
            // The form kept: the one this libvirt takes, when the domain has it; else the one
            // the domain has; else the one this libvirt takes, written new.
            let keep_override = has_property && (version.has_override() || set_at.is_empty());
            if keep_override || (set_at.is_empty() && version.has_override()) {
                overrides.push((alias.clone(), *c));
                for &i in &set_at {
                    self.remove_set_pair(i);
                }
            } else if let Some((&first, rest)) = set_at.split_first() {
                self.replace_arg(first + 1, &set_args(&[(alias.clone(), *c)])[1]);
                for &i in rest {
                    self.remove_set_pair(i);
                }
                if let Some((range, _)) = device.and_then(|d| d.property.as_ref()) {
                    let range = whole_lines(self.xml, range.clone());
                    self.edits.push((range, String::new()));
                }
            } else {
                sets.push((alias.clone(), *c));
            }
        }
        (overrides, sets)
    }

    /// Indices of the `-set` arguments that set `alias`'s clique.
    fn set_arg_indices(&self, alias: &str) -> Vec<usize> {
        let args = &self.s.commandline_args;
        let prefix = format!("device.{alias}.{CLIQUE_PROPERTY}=");
        (0..args.len().saturating_sub(1))
            .filter(|&i| args[i] == "-set" && args[i + 1].starts_with(&prefix))
            .collect()
    }

    /// Replaces the `<qemu:arg>` at index `i` by one with `value`.
    fn replace_arg(&mut self, i: usize, value: &str) {
        if let Some(span) = self.s.positions.commandline_arg_spans.get(i) {
            if self.s.commandline_args[i] != value {
                self.edits
                    .push((span.clone(), format!("<qemu:arg value='{value}'/>")));
            }
        }
    }

    /// Removes the `-set` at index `i` and its value, with the lines they stood on.
    fn remove_set_pair(&mut self, i: usize) {
        let s = self.s;
        for span in &s.positions.commandline_arg_spans[i..=i + 1] {
            let range = whole_lines(self.xml, span.clone());
            self.edits.push((range, String::new()));
        }
    }

    /// The 64-bit MMIO window: a smaller one the domain sets is raised where it is set
    /// (`<pcihole64>` or a `pci-hole64-size=` argument); with none, `<pcihole64>` goes into
    /// the root PCI controller.
    fn hole64(&mut self, need: u64) {
        if self.s.hole64.as_ref().is_some_and(|h| h.bytes >= need) {
            return;
        }
        let kib = need.div_ceil(1024);
        let gib = need.div_ceil(1 << 30);
        let element = format!("<pcihole64 unit='KiB'>{kib}</pcihole64>");
        let positions = &self.s.positions;
        let arg = positions.hole64_arg;
        let said = match (&self.s.hole64, &positions.hole64_element, arg) {
            (Some(h), Some(range), _) if h.source == "<pcihole64>" => {
                self.edits
                    .push((range.clone(), format!("<pcihole64 unit='KiB'>{kib}")));
                format!("<pcihole64> raised to {gib} GiB")
            }
            (Some(_), _, Some(i)) => {
                let old = &self.s.commandline_args[i];
                let at = old.find("pci-hole64-size=").unwrap_or(0);
                let value = format!("{}pci-hole64-size={gib}G", &old[..at]);
                self.replace_arg(i, &value);
                format!("<qemu:arg value='{value}'/> (was '{old}')")
            }
            (_, _, _) => match positions.root_controller.clone() {
                Some((tag, false)) => {
                    let base = indent_at(self.xml, tag.start);
                    self.insert(tag.end, format!("\n{base}  {element}"));
                    format!("{element} in the root PCI controller")
                }
                Some((tag, true)) => {
                    let base = indent_at(self.xml, tag.start);
                    let close = tag.end - 2..tag.end;
                    self.edits
                        .push((close, format!(">\n{base}  {element}\n{base}</controller>")));
                    format!("{element} in the root PCI controller")
                }
                None => {
                    // libvirt adds the root controller itself when a domain is defined without
                    // one: pcie-root on a q35 machine, pci-root on i440fx.
                    let q35 = self.s.machine.as_deref().is_none_or(|m| m.contains("q35"));
                    let model = if q35 { "pcie-root" } else { "pci-root" };
                    let Some(end) = positions.devices_end_tag else {
                        self.warnings.push(format!(
                            "the GPUs' BARs need a {gib} GiB 64-bit MMIO window and the domain has no <devices> \
                             to hold its root PCI controller: add <controller type='pci' index='0' model='{model}'>{element}</controller>"
                        ));
                        return;
                    };
                    let outer = indent_at(self.xml, end);
                    let base = format!("{outer}  ");
                    self.insert(
                        end,
                        format!(
                            "  <controller type='pci' index='0' model='{model}'>\n{base}  {element}\n{base}</controller>\n{outer}"
                        ),
                    );
                    format!("{element} in a new root PCI controller ({model})")
                }
            },
        };
        self.warnings
            .push(format!("64-bit MMIO window for the GPUs' BARs: {said}"));
    }

    /// Arm `virt`'s high PCIe window (`size` bytes, a power of two): a smaller
    /// `highmem-mmio-size=` the domain sets is raised in its argument; with none,
    /// `-machine highmem-mmio-size=` goes into `<qemu:commandline>` as `gen libvirt` writes it
    /// for a Grace guest (QEMU merges it with libvirt's own `-machine`).
    fn highmem_mmio(&mut self, size: u64) {
        let gib = size >> 30;
        let value = format!("highmem-mmio-size={gib}G");
        let said = match (&self.s.highmem_mmio, self.s.positions.highmem_mmio_arg) {
            (Some(h), _) if h.bytes >= size => return,
            (Some(_), Some(i)) => {
                let old = &self.s.commandline_args[i];
                let at = old.find("highmem-mmio-size=").unwrap_or(0);
                let end = old[at..].find(',').map_or(old.len(), |n| at + n);
                let new = format!("{}{value}{}", &old[..at], &old[end..]);
                self.replace_arg(i, &new);
                format!("<qemu:arg value='{new}'/> (was '{old}')")
            }
            _ => {
                self.need_ns = true;
                self.new_args.extend([
                    "<!-- libvirt has no element for virt's highmem-mmio-size -->".to_string(),
                    "<qemu:arg value='-machine'/>".to_string(),
                    format!("<qemu:arg value='{value}'/>"),
                ]);
                format!("-machine {value} in <qemu:commandline> (QEMU >= 10.0)")
            }
        };
        self.warnings.push(format!(
            "high PCIe MMIO window of the Arm virt machine for the GPUs' BARs: {said}"
        ));
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
        let args = set_args(entries);
        if args.is_empty() {
            return;
        }
        self.warnings
            .push(vfio_p2p_decide::vm::libvirt::set_form_warning(version));
        self.need_ns = true;
        (self.new_args).extend(args.iter().map(|a| format!("<qemu:arg value='{a}'/>")));
    }

    /// The `<qemu:commandline>` children to add, at the end of the domain's (or in a new one).
    fn write_commandline(&mut self) {
        if self.new_args.is_empty() {
            return;
        }
        let args = std::mem::take(&mut self.new_args);
        let lines =
            |base: &str| -> String { args.iter().map(|a| format!("{base}{a}\n")).collect() };
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
