//! What Incus says: an instance's expanded configuration (`incus config show --expanded`),
//! read into the same [`DomainFacts`] a libvirt domain gives so `check` judges both alike,
//! and the API extensions of the server at hand (`incus query /1.0`).
//!
//! The format, as Incus writes it (YAML of `api.Instance`; `internal/server/device/gpu_physical.go`
//! and `driver_qemu.go` of lxc/incus for what the keys do in a VM):
//! - `config:` string keys: `raw.qemu` (extra QEMU arguments, split like a shell line),
//!   `raw.qemu.conf` (overrides of the QEMU config file Incus writes, `[device "ID"]` sections);
//! - `devices:` name → keys; `type: gpu` (`gputype: physical`, the default) with `pci:` is
//!   passed with `vfio-pci` as QEMU device `dev-incus_NAME`, with `nvidia.clique:` (API
//!   extension `gpu_physical_clique`) its GPUDirect clique; `type: pci` with `address:` is
//!   any other PCI device (a NIC, a VF).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use pci_config::Bdf;
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::proxmox_conf::split_shell_words;
use super::qemu_argv::read_qemu_argv;
use crate::outside_call::{run_program, PROGRAM_DEADLINE};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_files::read_input_file;
use vfio_p2p_model::domain::{
    CliqueSetting, CliqueSource, DomainFacts, HiddenHypervisor, Hole64, PciHostdev,
};

/// The most an instance's expanded config holds here (Incus keeps a few KiB per instance).
pub const MAX_INCUS_CONFIG_BYTES: u64 = 1 << 20;

/// The device key that sets a physical GPU's clique (`emit::incus` writes the same; the
/// round trip `gen incus` → `check --incus-config` ties them).
pub const CLIQUE_KEY: &str = "nvidia.clique";
/// Incus names the QEMU device of instance device NAME `dev-incus_NAME`.
pub const QEMU_DEVICE_PREFIX: &str = "dev-incus_";

/// An Incus file that could not be read, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncusError {
    pub source_name: String,
    /// 1-based line, when the problem is on one.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for IncusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.source_name, self.message),
            None => write!(f, "{}: {}", self.source_name, self.message),
        }
    }
}

impl std::error::Error for IncusError {}

/// The instance as domain facts (aliases are Incus's QEMU device ids) and what it writes
/// in a way this check cannot follow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncusConfig {
    pub facts: DomainFacts,
    pub warnings: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct ExpandedFile {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, Spanned<Scalar>>,
    #[serde(default)]
    devices: BTreeMap<String, BTreeMap<String, Spanned<Scalar>>>,
}

/// A YAML scalar taken as the text Incus stores (every config value is a string there).
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            S(String),
            I(i64),
            B(bool),
        }
        Ok(Scalar(match Any::deserialize(d)? {
            Any::S(s) => s,
            Any::I(i) => i.to_string(),
            Any::B(b) => b.to_string(),
        }))
    }
}

/// Reads `path` (a regular file, at most [`MAX_INCUS_CONFIG_BYTES`]).
pub fn read_incus_config_file(path: &Path) -> Result<IncusConfig, IncusError> {
    let name = path.display().to_string();
    let bytes = read_input_file(path, MAX_INCUS_CONFIG_BYTES, "Incus instance config")
        .map_err(|e| whole(&name, e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        whole(
            &name,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })?;
    parse_incus_config(&text, &name)
}

fn whole(name: &str, message: String) -> IncusError {
    IncusError {
        source_name: name.to_string(),
        line: None,
        message,
    }
}

/// Parses `incus config show --expanded` output; `name` is used in messages.
pub fn parse_incus_config(text: &str, name: &str) -> Result<IncusConfig, IncusError> {
    let file: ExpandedFile = serde_saphyr::from_str(text).map_err(|e| IncusError {
        source_name: name.to_string(),
        line: e.location().map(|l| l.line() as usize),
        message: format!("not an Incus instance config (`incus config show --expanded`): {e}"),
    })?;
    let at = |s: &Spanned<Scalar>, message: String| IncusError {
        source_name: name.to_string(),
        line: Some(s.referenced.line() as usize),
        message,
    };
    let mut conf = IncusConfig {
        facts: DomainFacts {
            source_name: name.to_string(),
            name: file.name.clone(),
            ..DomainFacts::default()
        },
        ..IncusConfig::default()
    };
    if let Some(raw) = file.config.get("raw.qemu") {
        raw_qemu(&raw.value.0, &mut conf.facts).map_err(|m| at(raw, m))?;
    }
    if let Some(raw) = file.config.get("raw.qemu.conf") {
        raw_qemu_conf(&raw.value.0, &mut conf.facts);
    }
    for (dev, keys) in &file.devices {
        device(dev, keys, &mut conf).map_err(|(s, m)| at(s, m))?;
    }
    Ok(conf)
}

type DeviceError<'a> = (&'a Spanned<Scalar>, String);

/// One entry of `devices:`.
fn device<'a>(
    dev: &str,
    keys: &'a BTreeMap<String, Spanned<Scalar>>,
    conf: &mut IncusConfig,
) -> Result<(), DeviceError<'a>> {
    let get = |k: &str| keys.get(k).map(|s| s.value.0.as_str());
    let address_key = match (get("type"), get("gputype").unwrap_or("physical")) {
        (Some("gpu"), "physical") => "pci",
        (Some("gpu"), other) => {
            conf.warnings.push(format!(
                "device {dev}: gputype={other} is not a whole GPU passed with vfio-pci; this check does not follow it"
            ));
            return Ok(());
        }
        (Some("pci"), _) => "address",
        _ => return Ok(()),
    };
    let alias = format!("{QEMU_DEVICE_PREFIX}{dev}");
    let Some(addr) = keys.get(address_key) else {
        if address_key == "pci" {
            conf.warnings.push(format!(
                "device {dev}: a GPU chosen by vendorid/productid/id, which this check cannot resolve: give it `pci: DDDD:BB:DD.F` to have it checked"
            ));
        }
        return Ok(());
    };
    let bdf: Bdf = addr.value.0.parse().map_err(|e| {
        (
            addr,
            format!(
                "devices.{dev}.{address_key}: `{}` is not a PCI address (DDDD:BB:DD.F): {e}",
                addr.value.0
            ),
        )
    })?;
    conf.facts.hostdevs.push(PciHostdev {
        bdf,
        managed: true,
        alias: Some((0..0, alias.clone())),
        end_tag: 0,
    });
    if let Some(k) = keys.get(CLIQUE_KEY) {
        conf.facts
            .cliques
            .entry(alias)
            .or_default()
            .push(CliqueSetting {
                value: k.value.0.clone(),
                source: CliqueSource::ConfigKey(CLIQUE_KEY),
            });
    }
    Ok(())
}

/// `raw.qemu`: `-set device.ID.x-nv-gpudirect-clique=K`, `-cpu …,kvm=off`, `pci-hole64-size=`.
fn raw_qemu(value: &str, facts: &mut DomainFacts) -> Result<(), String> {
    let words = split_shell_words(value).map_err(|m| format!("raw.qemu: {m}"))?;
    let argv = read_qemu_argv(&words);
    for h in argv.hidden_hypervisor() {
        facts
            .hidden_hypervisor
            .push(HiddenHypervisor::Described(format!("raw.qemu: {h}")));
    }
    if let Some((_, bytes)) = argv.hole64 {
        facts.hole64 = Some(Hole64 {
            bytes,
            source: "raw.qemu: pci-hole64-size".into(),
        });
    }
    for (id, value) in argv.set_cliques {
        facts.cliques.entry(id).or_default().push(CliqueSetting {
            value,
            source: CliqueSource::ConfigKey("raw.qemu"),
        });
    }
    facts.commandline_args = words;
    Ok(())
}

/// `raw.qemu.conf`: `x-nv-gpudirect-clique = "K"` in a `[device "ID"]` section.
fn raw_qemu_conf(value: &str, facts: &mut DomainFacts) {
    let mut section: Option<String> = None;
    for line in value.lines().map(str::trim) {
        if let Some(head) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = head
                .trim()
                .strip_prefix("device")
                .map(|id| id.trim().trim_matches('"').to_string());
            continue;
        }
        let (Some(id), Some((k, v))) = (&section, line.split_once('=')) else {
            continue;
        };
        if k.trim() == CLIQUE_PROPERTY {
            facts
                .cliques
                .entry(id.clone())
                .or_default()
                .push(CliqueSetting {
                    value: v.trim().trim_matches('"').to_string(),
                    source: CliqueSource::ConfigKey("raw.qemu.conf"),
                });
        }
    }
}

/// What the server says of itself (`incus query /1.0`): its version and API extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncusServer {
    pub server_version: Option<String>,
    pub api_extensions: Vec<String>,
}

impl IncusServer {
    pub fn has(&self, extension: &str) -> bool {
        self.api_extensions.iter().any(|e| e == extension)
    }
}

#[derive(Debug, Deserialize)]
struct ServerFile {
    #[serde(default)]
    api_extensions: Vec<String>,
    #[serde(default)]
    api_extensions_count: Option<u64>,
    #[serde(default)]
    environment: Option<ServerEnvironment>,
}

#[derive(Debug, Deserialize)]
struct ServerEnvironment {
    #[serde(default)]
    server_version: Option<String>,
}

/// Parses what `incus query /1.0` prints (JSON) or an `incus info` that lists the API
/// extensions (YAML); `name` is used in messages.
pub fn parse_incus_server(text: &str, name: &str) -> Result<IncusServer, IncusError> {
    let file: ServerFile = serde_saphyr::from_str(text).map_err(|e| IncusError {
        source_name: name.to_string(),
        line: e.location().map(|l| l.line() as usize),
        message: format!("not the output of `incus query /1.0`: {e}"),
    })?;
    if file.api_extensions.is_empty() {
        let why = match file.api_extensions_count {
            Some(n) => format!(
                "lists no API extensions, only their count ({n}), as `incus info` of Incus 7 does"
            ),
            None => "has no `api_extensions` list".to_string(),
        };
        return Err(whole(
            name,
            format!("{why}: give the output of `incus query /1.0`"),
        ));
    }
    Ok(IncusServer {
        server_version: file.environment.and_then(|e| e.server_version),
        api_extensions: file.api_extensions,
    })
}

/// Reads a saved `incus query /1.0` output.
pub fn read_incus_server_file(path: &Path) -> Result<IncusServer, IncusError> {
    let name = path.display().to_string();
    let bytes = read_input_file(path, MAX_INCUS_CONFIG_BYTES, "`incus query /1.0` output")
        .map_err(|e| whole(&name, e.to_string()))?;
    parse_incus_server(&String::from_utf8_lossy(&bytes), &name)
}

/// Runs `incus query /1.0` and parses it; `Err` says why the server could not be asked.
pub fn incus_server_of(program: &Path) -> Result<IncusServer, String> {
    let shown = format!("`{} query /1.0`", program.display());
    let out = run_program(
        std::process::Command::new(program).args(["query", "/1.0"]),
        &shown,
        PROGRAM_DEADLINE,
        MAX_INCUS_CONFIG_BYTES as usize,
    )
    .map_err(|e| e.to_string())?;
    if out.cut {
        return Err(format!(
            "{shown} printed more than {MAX_INCUS_CONFIG_BYTES} bytes: not the answer of an Incus server"
        ));
    }
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{shown} failed: {}",
            err.lines().next().unwrap_or("")
        ));
    }
    parse_incus_server(&String::from_utf8_lossy(&out.stdout), &shown).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
