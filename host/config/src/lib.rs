//! Files the operator writes: parsed (syntax, unknown keys, types) then validated (meaning).

#![forbid(unsafe_code)]

pub mod host;
pub mod vm;
pub mod vm_boot;
pub mod vm_devices;

use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::de::DeserializeOwned;
use serde_saphyr::{Location, Spanned};

use pci_config::PathKind;
use vfio_p2p_files::{read_input_file, InputFileError};

/// Why a config file could not be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Missing, unreadable, not a regular file (a FIFO never blocks) or over
    /// [`MAX_CONFIG_BYTES`]; it names the file.
    #[error(transparent)]
    Read(#[from] InputFileError),
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{legacy}: the hook's own config is no longer read; move `policy: warn|deny` into {host} as `hook_policy: warn|deny` (and `p2p_level:` as it is), then delete {legacy}")]
    LegacyHookConfig { legacy: PathBuf, host: PathBuf },
}

impl ConfigError {
    /// A value at `at` in `path` that is wrong, with what to write instead.
    pub fn invalid(path: &Path, at: &Location, message: String) -> Self {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line: at.line(),
            column: at.column(),
            message,
        }
    }
}

/// The most a host.yaml or vm.yaml may hold: a host's policy or one VM's definition is a
/// few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads `path` whole (a regular file, at most [`MAX_CONFIG_BYTES`]), naming it in errors.
fn read_file(path: &Path) -> Result<String, ConfigError> {
    let bytes = read_input_file(path, MAX_CONFIG_BYTES, "config file")?;
    String::from_utf8(bytes).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: format!("not UTF-8 at byte {}", e.utf8_error().valid_up_to()),
    })
}

/// Deserializes YAML `text` (syntax, unknown keys, types) with the error at its line
/// and column; `path` only names the file.
fn parse_yaml<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, ConfigError> {
    serde_saphyr::from_str(text).map_err(|e| match e.location() {
        // the bare message: the parser's own rendering adds "error: line L column C" and a
        // snippet headed `<input>`, where ours names the file, line and column once
        Some(at) => ConfigError::invalid(path, &at, yaml_message(&e)),
        None => ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
    })
}

/// The parser's message without location or snippet, control characters as spaces.
fn yaml_message(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::MessageFormatter as _;
    let message = serde_saphyr::DefaultMessageFormatter.format_message(e.without_snippet());
    message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A value that failed validation: where it is and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub at: Location,
    pub message: String,
}

impl FieldError {
    fn new(at: &Location, message: String) -> Self {
        FieldError { at: *at, message }
    }
}

/// A list of BDFs under `key`, each parsed and listed once.
pub fn bdf_list(key: &str, items: &[Spanned<String>]) -> Result<Vec<Bdf>, FieldError> {
    let mut list = Vec::with_capacity(items.len());
    for item in items {
        let bdf: Bdf = item
            .value
            .parse()
            .map_err(|e| FieldError::new(&item.referenced, format!("{key}: {e}")))?;
        if list.contains(&bdf) {
            return Err(FieldError::new(
                &item.referenced,
                format!("{key}: {bdf} is listed twice"),
            ));
        }
        list.push(bdf);
    }
    Ok(list)
}

/// A `p2p_level` value: pix, pxb, phb, node or sys.
pub fn p2p_level(level: &Spanned<String>) -> Result<PathKind, FieldError> {
    match level.value.parse() {
        Err(e) => Err(FieldError::new(
            &level.referenced,
            format!("p2p_level: {e}"),
        )),
        Ok(PathKind::X) => Err(FieldError::new(
            &level.referenced,
            "p2p_level: 'x' means a GPU with itself; use pix, pxb, phb, node or sys".into(),
        )),
        Ok(kind) => Ok(kind),
    }
}

/// The one VM-name rule: vm.yaml's `name:`, `gen --name` (every target, `gen proxmox`
/// too), `place`'s VM names and the collector's store all take it.
///
/// libvirt itself refuses little in a domain name (a `/`, a newline) and shortens long
/// names for its own paths; this rule is stricter because the name goes unescaped into
/// what we write and store: QEMU's `-name`, libvirt's `<name>`, Proxmox and Cloud
/// Hypervisor lines, and file names (`NAME.yaml`, the collector's `plans/NAME.json` and
/// `records/NAME/`). Letters, digits, `-`, `_` and `.` need no quoting in any of them; no
/// leading `-` (an option) or `.` (a hidden or parent file); 64 bytes leave room in every
/// path component. The hook takes libvirt's names as they are: it never writes them into
/// a path (the bind record holds the guest's name as JSON text).
pub fn is_valid_vm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with(['-', '.'])
}

/// [`is_valid_vm_name`] as an error to print, the same for vm.yaml's `name:` and
/// `gen --name`: the name shown escaped (a newline stays visible) and cut short.
pub fn vm_name_error(name: &str) -> Option<String> {
    if is_valid_vm_name(name) {
        return None;
    }
    let shown: String = name.chars().take(70).collect();
    let more = if shown.len() < name.len() { "…" } else { "" };
    Some(format!(
        "name {:?}{more}: use 1-64 letters, digits, '-', '_' or '.', not starting with '-' or '.'",
        shown
    ))
}

/// A path written into a VMM's configuration (`ovmf_code`, `ovmf_vars`): absolute, and no
/// control character (a newline would start a new config line or argument).
pub fn config_path_error(key: &str, path: &Path) -> Option<String> {
    let text = path.to_string_lossy();
    if !path.is_absolute() {
        return Some(format!("{key}: {text:?} must be an absolute path"));
    }
    text.chars().any(char::is_control).then(|| {
        format!("{key}: {text:?} has a control character (a newline, a tab…); give the file's path")
    })
}
