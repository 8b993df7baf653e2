//! A Proxmox VE VM configuration (`/etc/pve/qemu-server/VMID.conf`), read into the same
//! [`DomainFacts`] a libvirt domain gives, so `check` judges both alike.
//!
//! The format, as Proxmox documents it (pve-docs `qm.conf(5)`: "Configuration File Format",
//! "Snapshots"; qemu-server `PVE/QemuServer/PCI.pm` for `hostpci[n]`):
//! - one `OPTION: value` per line; blank lines and lines starting with `#` are ignored
//!   (`#` lines hold the VM's description);
//! - the current configuration comes first; `[name]` starts a snapshot's copy (and
//!   `[PENDING]`, `[special:cloudinit]` other sections), which do not describe the running VM;
//! - `hostpci[n]: [host=]HOSTPCIID[;HOSTPCIID2…][,pcie=<1|0>][,x-vga=<1|0>][,rombar=…]…`, n in
//!   0..=15, HOSTPCIID `[DDDD:]BB:DD[.F]`; the QEMU device is `hostpciN` for one function and
//!   `hostpciN.J` for several (an id without `.F` is every function of the slot);
//!   `x-vga=1` makes qemu-server pass `kvm=off`;
//! - `cpu: TYPE[,hidden=<1|0>][,flags=…]`: `hidden=1` hides the hypervisor;
//! - `args: …` extra QEMU arguments, split like a shell command line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use pci_config::Bdf;

use super::qemu_argv::set_clique;
use super::vmm::{hidden_in_qemu_args, hole64_in_qemu_args};
use vfio_p2p_files::read_input_file;
use vfio_p2p_model::domain::{
    CliqueSetting, CliqueSource, DomainFacts, HiddenHypervisor, Hole64, PciHostdev,
};

/// pmxcfs, which holds /etc/pve, refuses files over 1 MiB.
pub const MAX_PROXMOX_CONF_BYTES: u64 = 1 << 20;

/// A Proxmox VM config that could not be read, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxmoxConfError {
    pub source_name: String,
    /// 1-based line, when the problem is on one.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ProxmoxConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.source_name, self.message),
            None => write!(f, "{}: {}", self.source_name, self.message),
        }
    }
}

impl std::error::Error for ProxmoxConfError {}

/// What the config says, as domain facts (aliases are qemu-server's device ids), and what
/// it writes in a way that loses the clique although Proxmox accepts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxmoxConf {
    pub facts: DomainFacts,
    pub warnings: Vec<String>,
    /// The `machine:` line, if any.
    pub machine: Option<String>,
}

/// Reads `path` (a regular file, at most [`MAX_PROXMOX_CONF_BYTES`]).
pub fn read_proxmox_conf_file(path: &Path) -> Result<ProxmoxConf, ProxmoxConfError> {
    let name = path.display().to_string();
    let err = |line, message| ProxmoxConfError {
        source_name: name.clone(),
        line,
        message,
    };
    let bytes = read_input_file(path, MAX_PROXMOX_CONF_BYTES, "Proxmox VM config")
        .map_err(|e| err(None, e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        err(
            None,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })?;
    parse_proxmox_conf(&text, &name)
}

/// Parses the text of a VM config; `name` is used in messages.
pub fn parse_proxmox_conf(text: &str, name: &str) -> Result<ProxmoxConf, ProxmoxConfError> {
    let err = |line: usize, message: String| ProxmoxConfError {
        source_name: name.to_string(),
        line: Some(line),
        message,
    };
    let mut conf = ProxmoxConf {
        facts: DomainFacts {
            source_name: name.to_string(),
            ..DomainFacts::default()
        },
        ..ProxmoxConf::default()
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut pcie_entries = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            break; // a snapshot or pending section: not the VM as it starts
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(err(n, format!("expected `OPTION: value`, got `{line}`")));
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(err(n, format!("`{key}` is not an option name")));
        }
        if let Some(first) = seen.insert(key.to_string(), n) {
            return Err(err(
                n,
                format!("`{key}` is set twice (first on line {first}); qemu-server keeps only one"),
            ));
        }
        match key {
            "name" => conf.facts.name = Some(value.to_string()),
            "machine" => conf.machine = Some(value.to_string()),
            "cpu" => cpu_line(value, &mut conf.facts),
            "args" => args_line(value, &mut conf.facts).map_err(|m| err(n, m))?,
            k if k.starts_with("hostpci") => {
                let index = hostpci_index(k).map_err(|m| err(n, m))?;
                if hostpci_line(index, value, &mut conf).map_err(|m| err(n, m))? {
                    pcie_entries.push(k.to_string());
                }
            }
            _ => {}
        }
    }
    let q35 = conf.machine.as_deref().is_some_and(|m| m.contains("q35"));
    if !pcie_entries.is_empty() && !q35 {
        conf.warnings.push(format!(
            "{name}: {} set pcie=1 but the machine is not q35 (qemu-server refuses to start it): add `machine: q35`",
            pcie_entries.join(", ")
        ));
    }
    Ok(conf)
}

fn hostpci_index(key: &str) -> Result<usize, String> {
    match key["hostpci".len()..].parse::<usize>() {
        Ok(i) if i < 16 => Ok(i),
        _ => Err(format!(
            "`{key}` is not hostpci0..hostpci15 (Proxmox passes at most 16 devices)"
        )),
    }
}

/// One `hostpciN:` entry; returns whether it asks for `pcie=1`.
fn hostpci_line(index: usize, value: &str, conf: &mut ProxmoxConf) -> Result<bool, String> {
    let mut host = None;
    let mut pcie = false;
    for (i, item) in value.split(',').enumerate() {
        match item.split_once('=') {
            None if i == 0 => host = Some(item.trim()),
            Some(("host", v)) => host = Some(v.trim()),
            Some(("pcie", v)) => pcie = proxmox_bool(v) == Some(true),
            Some(("x-vga", v)) if proxmox_bool(v) == Some(true) => conf
                .facts
                .hidden_hypervisor
                .push(HiddenHypervisor::Described(format!(
                    "hostpci{index}: x-vga={} (qemu-server then passes -cpu …,kvm=off)",
                    v.trim()
                ))),
            Some(("mapping", m)) => conf.warnings.push(format!(
                "hostpci{index}: mapping={m} names a cluster resource mapping, which this check cannot resolve: give its host address instead to have it checked"
            )),
            _ => {}
        }
    }
    let Some(host) = host else {
        return Ok(pcie);
    };
    let ids: Vec<&str> = host.split(';').collect();
    for (j, id) in ids.iter().enumerate() {
        let whole_slot = !id.contains('.');
        let text = if whole_slot {
            format!("{id}.0")
        } else {
            id.to_string()
        };
        let bdf: Bdf = text.parse().map_err(|e| {
            format!("hostpci{index}: `{id}` is not a PCI address ([DDDD:]BB:DD.F): {e}")
        })?;
        let alias = if ids.len() == 1 && !whole_slot {
            format!("hostpci{index}")
        } else {
            format!("hostpci{index}.{j}")
        };
        if whole_slot {
            conf.warnings.push(format!(
                "hostpci{index}: `{id}` has no function, so qemu-server passes every function of the slot and the device id depends on how many there are: write `{id}.0` (`vfio-p2p gen proxmox` does)"
            ));
        }
        conf.facts.hostdevs.push(PciHostdev {
            bdf,
            managed: true,
            alias: Some((0..0, alias)),
            end_tag: 0,
        });
    }
    Ok(pcie)
}

fn cpu_line(value: &str, facts: &mut DomainFacts) {
    let hidden = value.split(',').find_map(|o| {
        let (k, v) = o.split_once('=')?;
        (k.trim() == "hidden" && proxmox_bool(v) == Some(true)).then(|| v.trim())
    });
    if let Some(v) = hidden {
        facts
            .hidden_hypervisor
            .push(HiddenHypervisor::Described(format!(
                "cpu: {value} (hidden={v})"
            )));
    }
}

/// A boolean as Proxmox's schema takes it: 1/on/yes/true or 0/off/no/false, in any case.
fn proxmox_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Some(true),
        "0" | "off" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// `args:`: cliques set with `-set device.ID.x-nv-gpudirect-clique=K`, `-cpu …,kvm=off`,
/// `pci-hole64-size=`.
fn args_line(value: &str, facts: &mut DomainFacts) -> Result<(), String> {
    let words = split_shell_words(value).map_err(|m| format!("args: {m}"))?;
    let joined = words.join(" ");
    for h in hidden_in_qemu_args(&joined) {
        facts
            .hidden_hypervisor
            .push(HiddenHypervisor::Described(format!("args: {h}")));
    }
    if let Some(bytes) = hole64_in_qemu_args(&joined) {
        facts.hole64 = Some(Hole64 {
            bytes,
            source: "args: pci-hole64-size".into(),
        });
    }
    for pair in words.windows(2) {
        let [opt, target] = pair else { continue };
        if opt != "-set" {
            continue;
        }
        if let Some((id, value)) = set_clique(target) {
            facts.cliques.entry(id).or_default().push(CliqueSetting {
                value,
                source: CliqueSource::Commandline,
            });
        }
    }
    facts.commandline_args = words;
    Ok(())
}

/// Splits like a POSIX shell (what qemu-server does with `args:`): blanks separate words,
/// `'…'` is literal, `"…"` and bare text take `\` escapes.
pub fn split_shell_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => w.push(ch),
                        None => return Err("a ' quote is not closed".into()),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(ch @ ('"' | '\\' | '$' | '`')) => w.push(ch),
                            Some(ch) => {
                                w.push('\\');
                                w.push(ch);
                            }
                            None => return Err("a \" quote is not closed".into()),
                        },
                        Some(ch) => w.push(ch),
                        None => return Err("a \" quote is not closed".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(ch) => cur.get_or_insert_with(String::new).push(ch),
                None => return Err("it ends with a lone \\".into()),
            },
            ch => cur.get_or_insert_with(String::new).push(ch),
        }
    }
    words.extend(cur);
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written from qm.conf(5)'s examples: a description comment, a snapshot section
    /// repeating options, hostpci entries in each documented form, quoted `args:`.
    const CONF: &str = "\
#GPU%20training%20VM
#second description line
boot: order=scsi0;net0
cores: 16
cpu: host
machine: q35
memory: 65536
name: train0
hostpci0: 0000:05:00.0,pcie=1
hostpci1: host=06:00.0,pcie=1,rombar=0
hostpci2: 0000:09:00,pcie=1
hostpci3: 0a:00.0;0a:00.1,pcie=1
args: -set device.hostpci0.x-nv-gpudirect-clique=0 -set 'device.hostpci1.x-nv-gpudirect-clique=0' -smbios \"type=0,vendor=FOO BAR\" -global q35-pcihost.pci-hole64-size=512G
parent: before-upgrade

[before-upgrade]
cpu: host,hidden=1
hostpci0: 0000:05:00.0,x-vga=1
snaptime: 1457170803
";

    #[test]
    fn documented_syntax() {
        let c = parse_proxmox_conf(CONF, "100.conf").unwrap();
        let f = &c.facts;
        assert_eq!(f.name.as_deref(), Some("train0"));
        let hostdevs: Vec<(String, &str)> = f
            .hostdevs
            .iter()
            .map(|h| (h.bdf.to_string(), h.alias_name().unwrap()))
            .collect();
        assert_eq!(
            hostdevs,
            [
                ("0000:05:00.0".to_string(), "hostpci0"),
                ("0000:06:00.0".into(), "hostpci1"),
                ("0000:09:00.0".into(), "hostpci2.0"),
                ("0000:0a:00.0".into(), "hostpci3.0"),
                ("0000:0a:00.1".into(), "hostpci3.1"),
            ]
        );
        assert_eq!(f.cliques.len(), 2);
        assert_eq!(f.cliques["hostpci1"][0].value, "0");
        assert_eq!(f.hole64.as_ref().map(|h| h.bytes), Some(512 << 30));
        // the snapshot's hidden=1 and x-vga=1 are not the VM's
        assert!(f.hidden_hypervisor.is_empty(), "{:?}", f.hidden_hypervisor);
        assert!(f
            .commandline_args
            .contains(&"type=0,vendor=FOO BAR".to_string()));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("hostpci2") && c.warnings[0].contains("09:00.0"));
    }

    #[test]
    fn hidden_hypervisor_forms() {
        let c = parse_proxmox_conf(
            "cpu: host,hidden=1\nhostpci0: 05:00.0,x-vga=1\nargs: -cpu host,kvm=off\n",
            "x.conf",
        )
        .unwrap();
        assert_eq!(c.facts.hidden_hypervisor.len(), 3);
        assert!(c.warnings.is_empty());
        let c = parse_proxmox_conf("hostpci0: 05:00.0,pcie=1\n", "x.conf").unwrap();
        assert!(c.warnings[0].contains("machine: q35"));
    }

    /// Issue 28: Proxmox's booleans are 1/on/yes/true in any case, for every flag read.
    #[test]
    fn every_proxmox_boolean_spelling() {
        for yes in ["1", "on", "yes", "true", "YES", "True", "On"] {
            let c = parse_proxmox_conf(
                &format!("cpu: host,hidden={yes}\nhostpci0: 05:00.0,x-vga={yes},pcie={yes}\n"),
                "x.conf",
            )
            .unwrap();
            assert_eq!(c.facts.hidden_hypervisor.len(), 2, "{yes}");
            assert!(
                c.warnings.len() == 1 && c.warnings[0].contains("machine: q35"),
                "{yes}: pcie read as on: {:?}",
                c.warnings
            );
        }
        for no in ["0", "off", "no", "false", "NO", "False"] {
            let c = parse_proxmox_conf(
                &format!("cpu: host,hidden={no}\nhostpci0: 05:00.0,x-vga={no}\n"),
                "x.conf",
            )
            .unwrap();
            assert!(c.facts.hidden_hypervisor.is_empty(), "{no}");
        }
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = |t| parse_proxmox_conf(t, "101.conf").unwrap_err().to_string();
        assert_eq!(
            e("name: a\nhostpci16: 05:00.0\n"),
            "101.conf:2: `hostpci16` is not hostpci0..hostpci15 (Proxmox passes at most 16 devices)"
        );
        assert!(e("memory 4096\n").starts_with("101.conf:1: expected `OPTION: value`"));
        assert!(e("hostpci0: zz:00.0\n").starts_with("101.conf:1: hostpci0: `zz:00.0`"));
        assert!(e("args: -name 'x\n").contains("101.conf:1: args: a ' quote is not closed"));
        assert!(e("cores: 1\ncores: 2\n")
            .contains("101.conf:2: `cores` is set twice (first on line 1)"));
    }

    #[test]
    fn shell_words() {
        assert_eq!(
            split_shell_words(r#"-a 'b c' "d\"e" f\ g ''"#).unwrap(),
            ["-a", "b c", "d\"e", "f g", ""]
        );
    }
}
