//! `host.yaml`: host-wide policy shared by every VM on the host.
//!
//! Parsed like `vm.yaml`: [`HostConfigFile`] is what serde reads (unknown keys and
//! wrong types are errors with line and column), [`HostConfig::validate`] checks the
//! meaning and points at the offending line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::ConfigError;
use pci_config::PathKind;
use vfio_p2p_files::InputFileError;
use vfio_p2p_model::ResetPolicy;

/// What the libvirt hook does when a VM's preflight check fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookPolicy {
    /// Log the failure and let the VM start (P2P may be off inside it).
    #[default]
    Warn,
    /// Refuse to start the VM.
    Deny,
}

/// Where NVLink connections between GPUs come from (PCI config space does not show them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkSourceKind {
    /// Treat every GPU pair as PCIe only.
    None,
    /// NVSwitches on the PCI tree: all NVIDIA SXM GPUs are one NVLink fabric.
    Nvswitch,
    /// A saved `nvidia-smi topo -m` (taken before the GPUs went to vfio-pci).
    NvidiaSmi,
}

/// How the board's NVSwitch fabric reaches VMs (NVIDIA Fabric Manager's two models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricMode {
    /// Fabric Manager reachable (live or a capture named in `fabric_manager`): shared
    /// NVSwitch; otherwise none.
    #[default]
    Auto,
    /// FM runs on the host (or a service VM, `FABRIC_MODE=1`), NVSwitches stay on the
    /// host, and a VM's GPUs must form one of FM's partitions, activated before it starts.
    SharedNvswitch,
    /// The NVSwitches go into the VM with their baseboard's GPUs; FM runs in the guest.
    FullPassthrough,
    /// No NVSwitch fabric management (PCIe or direct NVLink only).
    None,
}

/// Where Fabric Manager is reached; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricManagerFile {
    /// FM's address: `127.0.0.1:6666` (FM's default TCP port) or `unix:/PATH` (its Unix socket).
    #[serde(default)]
    pub address: Option<Spanned<String>>,
    /// A capture of FM's partition list (`fmpm -l` output or vfio-p2p's JSON), for hosts
    /// where FM runs in a service VM; relative to this file.
    #[serde(default)]
    pub partitions: Option<Spanned<PathBuf>>,
    /// FM's module ids (physical ids) → the GPUs' PCI addresses, for boards whose FM lists
    /// partitions without addresses (H100 and later): `{1: "0000:18:00.0", …}`.
    #[serde(default)]
    pub modules: Option<BTreeMap<u32, Spanned<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvlinkFile {
    pub source: Spanned<NvlinkSourceKind>,
    /// The `nvidia-smi topo -m` output, for `source: nvidia-smi`; relative to this file.
    #[serde(default)]
    pub file: Option<Spanned<PathBuf>>,
}

/// The file as written; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfigFile {
    /// Worst host path that still gets a P2P clique: pix, pxb, phb, node or sys.
    #[serde(default)]
    pub p2p_level: Option<Spanned<String>>,
    #[serde(default)]
    pub hook_policy: HookPolicy,
    /// Devices the host keeps for itself: never placed, never bound to vfio-pci.
    #[serde(default)]
    pub reserved: Vec<Spanned<String>>,
    #[serde(default)]
    pub nvlink: Option<NvlinkFile>,
    #[serde(default)]
    pub fabric: FabricMode,
    #[serde(default)]
    pub fabric_manager: Option<FabricManagerFile>,
    /// How GPUs are reset between tenants: auto, flr or bus.
    #[serde(default)]
    pub reset: ResetPolicy,
}

/// Where NVLink facts come from, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvlinkSource {
    None,
    Nvswitch,
    NvidiaSmi(PathBuf),
}

/// A validated host policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    pub p2p_level: PathKind,
    pub hook_policy: HookPolicy,
    pub reserved: Vec<Bdf>,
    pub nvlink: NvlinkSource,
    pub fabric: FabricMode,
    pub fabric_manager: FabricManagerSource,
    /// `fabric_manager: modules:`: FM's module ids → PCI addresses, given to the GPUs FM's
    /// partition list (live or captured) leaves without one.
    pub fabric_modules: BTreeMap<u32, Bdf>,
    pub reset: ResetPolicy,
}

/// Fabric Manager's default TCP endpoint (FM's `FM_CMD_BIND_INTERFACE`/`FM_CMD_PORT_NUMBER`).
pub const DEFAULT_FM_ADDRESS: &str = "127.0.0.1:6666";

/// Where FM's partitions come from, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricManagerSource {
    /// FM's API at this address (`HOST:PORT` or `unix:/PATH`).
    Live(String),
    /// A saved partition list.
    Capture(PathBuf),
}

/// NCCL's default: P2P inside one switch tree, never through the CPU.
pub const DEFAULT_P2P_LEVEL: PathKind = PathKind::Pxb;

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            p2p_level: DEFAULT_P2P_LEVEL,
            hook_policy: HookPolicy::Warn,
            reserved: Vec::new(),
            nvlink: NvlinkSource::Nvswitch,
            fabric: FabricMode::Auto,
            fabric_manager: FabricManagerSource::Live(DEFAULT_FM_ADDRESS.into()),
            fabric_modules: BTreeMap::new(),
            reset: ResetPolicy::Auto,
        }
    }
}

/// Where the hook (and anything else given the host root) finds the host policy,
/// below the root (`--sysfs-root`) so that tests can use a temporary directory.
pub const HOST_CONFIG_PATH: &str = "etc/vfio-p2p/host.yaml";
/// The hook's former config (`policy:`, `p2p_level:`), folded into host.yaml.
pub const LEGACY_HOOK_CONFIG_PATH: &str = "etc/vfio-p2p/hook.yaml";

impl HostConfig {
    pub fn load(path: &Path) -> Result<HostConfig, ConfigError> {
        Self::parse(&super::read_file(path)?, path)
    }

    /// `ROOT/etc/vfio-p2p/host.yaml`, or the defaults when it does not exist. A left-over
    /// `hook.yaml` is an error rather than ignored: its policy would silently stop applying.
    pub fn load_below(root: &Path) -> Result<HostConfig, ConfigError> {
        let path = root.join(HOST_CONFIG_PATH);
        let legacy = root.join(LEGACY_HOOK_CONFIG_PATH);
        if legacy.exists() {
            return Err(ConfigError::LegacyHookConfig { legacy, host: path });
        }
        match Self::load(&path) {
            Err(ConfigError::Read(InputFileError::Read { err, .. }))
                if err.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(HostConfig::default())
            }
            loaded => loaded,
        }
    }

    /// Parses and validates `text`; `path` names the file in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<HostConfig, ConfigError> {
        Self::validate(super::parse_yaml(text, path)?, path)
    }

    pub fn validate(mut file: HostConfigFile, path: &Path) -> Result<HostConfig, ConfigError> {
        let invalid = |at: &Location, message: String| ConfigError::invalid(path, at, message);
        let field = |e: super::FieldError| invalid(&e.at, e.message);
        let p2p_level = match &file.p2p_level {
            Some(l) => super::p2p_level(l).map_err(field)?,
            None => DEFAULT_P2P_LEVEL,
        };
        let reserved = super::bdf_list("reserved", &file.reserved).map_err(field)?;
        let nvlink = match file.nvlink {
            None => NvlinkSource::Nvswitch,
            Some(n) => match (n.source.value, n.file) {
                (NvlinkSourceKind::NvidiaSmi, Some(f)) => {
                    let dir = path.parent().unwrap_or(Path::new(""));
                    NvlinkSource::NvidiaSmi(dir.join(f.value))
                }
                (NvlinkSourceKind::NvidiaSmi, None) => {
                    return Err(invalid(
                        &n.source.referenced,
                        "nvlink: 'source: nvidia-smi' needs 'file:' naming saved `nvidia-smi topo -m` output".into(),
                    ))
                }
                (_, Some(f)) => {
                    return Err(invalid(
                        &f.referenced,
                        "nvlink: 'file' is only read with 'source: nvidia-smi'; remove it".into(),
                    ))
                }
                (NvlinkSourceKind::None, None) => NvlinkSource::None,
                (NvlinkSourceKind::Nvswitch, None) => NvlinkSource::Nvswitch,
            },
        };
        let modules = file
            .fabric_manager
            .as_mut()
            .and_then(|fm| fm.modules.take())
            .unwrap_or_default();
        let (ids, addresses): (Vec<u32>, Vec<Spanned<String>>) = modules.into_iter().unzip();
        let addresses = super::bdf_list("fabric_manager: modules", &addresses).map_err(field)?;
        let fabric_modules = ids.into_iter().zip(addresses).collect();
        let fabric_manager = fabric_manager_source(file.fabric_manager, path)?;
        Ok(HostConfig {
            p2p_level,
            hook_policy: file.hook_policy,
            reserved,
            nvlink,
            fabric: file.fabric,
            fabric_manager,
            fabric_modules,
            reset: file.reset,
        })
    }
}

fn fabric_manager_source(
    file: Option<FabricManagerFile>,
    path: &Path,
) -> Result<FabricManagerSource, ConfigError> {
    let Some(fm) = file else {
        return Ok(FabricManagerSource::Live(DEFAULT_FM_ADDRESS.into()));
    };
    match (fm.address, fm.partitions) {
        (Some(a), Some(_)) => Err(ConfigError::invalid(
            path,
            &a.referenced,
            "fabric_manager: give 'address' (FM's API) or 'partitions' (a saved list), not both"
                .into(),
        )),
        (_, Some(p)) => {
            let dir = path.parent().unwrap_or(Path::new(""));
            Ok(FabricManagerSource::Capture(dir.join(p.value)))
        }
        (Some(a), None) => {
            let valid = match a.value.strip_prefix("unix:") {
                Some(socket) => socket.starts_with('/'),
                None => a
                    .value
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
            };
            let target = a.value.strip_prefix("unix:").unwrap_or(&a.value);
            if valid && target.len() > MAX_FM_ADDRESS {
                Err(ConfigError::invalid(
                    path,
                    &a.referenced,
                    format!(
                        "fabric_manager: address is {} bytes; Fabric Manager's fmConnect takes at most {MAX_FM_ADDRESS} (FM_MAX_STR_LENGTH, NUL included), and a UNIX socket path at most 107: give a shorter path",
                        target.len()
                    ),
                ))
            } else if valid {
                Ok(FabricManagerSource::Live(a.value))
            } else {
                Err(ConfigError::invalid(
                    path,
                    &a.referenced,
                    format!(
                        "fabric_manager: address {:?} is neither HOST:PORT (FM's default is {DEFAULT_FM_ADDRESS}) nor unix:/PATH",
                        a.value
                    ),
                ))
            }
        }
        (None, None) => Ok(FabricManagerSource::Live(DEFAULT_FM_ADDRESS.into())),
    }
}

/// The longest address `fmConnect` takes: `FM_MAX_STR_LENGTH` (256) with its NUL.
const MAX_FM_ADDRESS: usize = 255;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fm_address_too_long_for_fm_connect_is_refused_as_such() {
        let long = format!("fabric_manager:\n  address: unix:/{}\n", "s".repeat(299));
        let e = parse(&long).unwrap_err().to_string();
        assert!(
            e.contains("address is 300 bytes; Fabric Manager's fmConnect takes at most 255"),
            "{e}"
        );
        let fits = format!("fabric_manager:\n  address: unix:/{}\n", "s".repeat(100));
        assert!(parse(&fits).is_ok());
    }

    fn parse(text: &str) -> Result<HostConfig, ConfigError> {
        HostConfig::parse(text, Path::new("/etc/vfio-p2p/host.yaml"))
    }

    #[test]
    fn full_file() {
        let c = parse(
            "p2p_level: phb\nhook_policy: deny\nreserved: [0000:01:00.0]\n\
             nvlink:\n  source: nvidia-smi\n  file: topo-m.txt\n",
        )
        .unwrap();
        assert_eq!(c.p2p_level, PathKind::Phb);
        assert_eq!(c.hook_policy, HookPolicy::Deny);
        assert_eq!(c.reserved, vec!["0000:01:00.0".parse::<Bdf>().unwrap()]);
        assert_eq!(
            c.nvlink,
            NvlinkSource::NvidiaSmi(PathBuf::from("/etc/vfio-p2p/topo-m.txt"))
        );
    }

    #[test]
    fn empty_file_is_the_default_policy() {
        assert_eq!(parse("{}\n").unwrap(), HostConfig::default());
    }

    fn error_at(text: &str) -> (u64, u64, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                line,
                column,
                message,
                ..
            }) => (line, column, message),
            other => panic!("expected an error with a location, got {other:?}"),
        }
    }

    #[test]
    fn unknown_key_is_an_error_with_its_line() {
        let (line, _, message) = error_at("p2p_level: pxb\nreserve: [0000:01:00.0]\n");
        assert_eq!(line, 2);
        assert!(message.contains("reserve"), "{message}");
    }

    #[test]
    fn bad_values_point_at_their_line_and_column() {
        let (line, column, message) = error_at("hook_policy: warn\np2p_level: nvlink\n");
        assert_eq!((line, column), (2, 12));
        assert!(message.contains("not a path level"), "{message}");
        let (line, _, message) = error_at("reserved:\n  - 0000:01:00.0\n  - 41:00\n");
        assert_eq!(line, 3);
        assert!(message.starts_with("reserved:"), "{message}");
        let (line, _, _) = error_at("hook_policy: maybe\n");
        assert_eq!(line, 1);
        let (line, _, message) = error_at("nvlink:\n  source: nvidia-smi\n");
        assert_eq!(line, 2);
        assert!(message.contains("needs 'file:'"), "{message}");
        let (line, _, _) = error_at("nvlink:\n  source: nvswitch\n  links: 18\n");
        assert_eq!(line, 3);
        let (line, column, message) = error_at("hook_policy: warn\nreset: sbr\n");
        assert_eq!((line, column), (2, 8));
        assert!(
            message.contains("auto") && message.contains("bus"),
            "{message}"
        );
    }

    #[test]
    fn reset_policies() {
        assert_eq!(parse("{}\n").unwrap().reset, ResetPolicy::Auto);
        assert_eq!(parse("reset: flr\n").unwrap().reset, ResetPolicy::Flr);
        assert_eq!(parse("reset: bus\n").unwrap().reset, ResetPolicy::Bus);
    }

    #[test]
    fn below_a_root_defaults_when_absent_and_refuses_a_left_over_hook_yaml() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(
            HostConfig::load_below(root.path()).unwrap(),
            HostConfig::default()
        );
        let dir = root.path().join("etc/vfio-p2p");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("host.yaml"), "# all commented out\n\n").unwrap();
        assert_eq!(
            HostConfig::load_below(root.path()).unwrap(),
            HostConfig::default()
        );
        std::fs::write(dir.join("host.yaml"), "hook_policy: deny\n").unwrap();
        let c = HostConfig::load_below(root.path()).unwrap();
        assert_eq!(c.hook_policy, HookPolicy::Deny);
        std::fs::write(dir.join("hook.yaml"), "policy: deny\n").unwrap();
        let e = HostConfig::load_below(root.path()).unwrap_err();
        assert!(matches!(e, ConfigError::LegacyHookConfig { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("hook.yaml") && e.contains("as `hook_policy:"),
            "{e}"
        );
    }

    #[test]
    fn fabric_mode_and_fabric_manager_source() {
        let c = parse("").unwrap();
        assert_eq!(c.fabric, FabricMode::Auto);
        assert_eq!(
            c.fabric_manager,
            FabricManagerSource::Live(DEFAULT_FM_ADDRESS.into())
        );
        let c = parse("fabric: shared-nvswitch\nfabric_manager:\n  partitions: fm.txt\n").unwrap();
        assert_eq!(c.fabric, FabricMode::SharedNvswitch);
        assert_eq!(
            c.fabric_manager,
            FabricManagerSource::Capture("/etc/vfio-p2p/fm.txt".into())
        );
        let c = parse("fabric_manager:\n  address: unix:/run/fm.sock\n").unwrap();
        assert_eq!(
            c.fabric_manager,
            FabricManagerSource::Live("unix:/run/fm.sock".into())
        );
        assert_eq!(
            parse("fabric: full-passthrough\n").unwrap().fabric,
            FabricMode::FullPassthrough
        );
        let (line, _, message) = error_at("fabric: none\nfabric_manager:\n  address: localhost\n");
        assert_eq!(line, 3);
        assert!(message.contains("HOST:PORT"), "{message}");
        let (line, _, message) =
            error_at("fabric_manager:\n  address: 127.0.0.1:6666\n  partitions: x\n");
        assert_eq!(line, 2);
        assert!(message.contains("not both"), "{message}");
        let (line, _, _) = error_at("fabric: shared\n");
        assert_eq!(line, 1);
    }

    #[test]
    fn fabric_manager_modules_map_module_ids_to_addresses() {
        let c =
            parse("fabric_manager:\n  modules: {1: \"0000:18:00.0\", 3: 0000:9d:00.0}\n").unwrap();
        let b = |s: &str| s.parse::<Bdf>().unwrap();
        assert_eq!(
            c.fabric_modules,
            BTreeMap::from([(1, b("0000:18:00.0")), (3, b("0000:9d:00.0"))])
        );
        assert_eq!(
            c.fabric_manager,
            FabricManagerSource::Live(DEFAULT_FM_ADDRESS.into())
        );
        let (line, column, message) =
            error_at("fabric_manager:\n  modules:\n    1: 0000:18:00.0\n    2: 18:00\n");
        assert_eq!((line, column), (4, 8));
        assert!(message.contains("fabric_manager: modules"), "{message}");
        let (line, _, message) =
            error_at("fabric_manager:\n  modules:\n    1: 0000:18:00.0\n    2: 0000:18:00.0\n");
        assert_eq!(line, 4);
        assert!(message.contains("listed twice"), "{message}");
        let (line, _, _) = error_at("fabric_manager:\n  modules:\n    one: 0000:18:00.0\n");
        assert_eq!(line, 3);
    }
}
