//! Where a run's host facts come from, decided once from the global options
//! (`--sysfs-root`, `--example`): the one place that tells a live root from a snapshot
//! file from an embedded example. Readers and probes ask the [`HostSource`], never the
//! options again.

use std::path::{Path, PathBuf};

use crate::cli::GlobalArgs;
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::ConfigError;
use vfio_p2p_model::HostRecord;
use vfio_p2p_read::{flat_json, read_host, synth};

/// The host a run reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    /// A directory read as `ROOT/sys`, `ROOT/proc`, `ROOT/dev`, `ROOT/etc`: the live host
    /// (`/`), or a `vfio-p2p snapshot` directory or test tree below another path. Both are
    /// read and probed alike (a snapshot simply has no `/dev` nodes), which is what lets a
    /// directory stand in for a host in tests and labs.
    Root(PathBuf),
    /// A flat sysfs JSON dump (`--sysfs-root FILE`): devices only, nothing to probe.
    FlatJson(PathBuf),
    /// A topology embedded in the binary (`--example NAME`): nothing to probe.
    Example(String),
}

/// Where host.yaml comes from (docs/architecture.md, "Inputs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostConfigFrom {
    /// `--host-config FILE` when given, else the built-in defaults: the data commands
    /// (`topo`, `place`, `plan`, `check`, `gen`, `libvirt patch`, `kubevirt`) plan with
    /// the policy they are shown, never with a file they were not pointed at.
    FlagOrDefaults,
    /// `--host-config FILE` when given, else the host's own `ROOT/etc/vfio-p2p/host.yaml`
    /// (defaults when absent): what libvirt, QEMU and FM run on the host — the hook,
    /// `qemu-wrap`, `fabric` — follows the installed policy.
    FlagOrInstalled,
}

impl HostSource {
    /// The one decision: `--example` names an embedded host, a `--sysfs-root` that is a
    /// file is a flat JSON dump, anything else a root directory.
    pub fn of(global: &GlobalArgs) -> HostSource {
        match &global.example {
            Some(name) => HostSource::Example(name.clone()),
            None if global.sysfs_root.is_file() => HostSource::FlatJson(global.sysfs_root.clone()),
            None => HostSource::Root(global.sysfs_root.clone()),
        }
    }

    /// Reads the host's devices: the one call of a host reader per run, made by the
    /// context (commands get the host from it, never from the source).
    pub(super) fn read(&self) -> anyhow::Result<HostRecord> {
        // Every ReadError names the file or directory it concerns: no context to add.
        match self {
            HostSource::Root(root) => Ok(read_host(root)?),
            HostSource::FlatJson(file) => Ok(flat_json::read_file(file)?),
            HostSource::Example(name) => synth::example(name).map_err(anyhow::Error::msg),
        }
    }

    /// The directory probes (`/dev`, kernel config, FM's config file, iommufd) run below,
    /// or why there is none, in the words probes report.
    pub fn probe_root(&self) -> Result<&Path, &'static str> {
        match self {
            HostSource::Root(root) => Ok(root),
            HostSource::FlatJson(_) => Err("a snapshot file has no /dev"),
            HostSource::Example(_) => Err("an embedded example has no live host"),
        }
    }

    /// The embedded example's name, if this is one.
    pub fn example(&self) -> Option<&str> {
        match self {
            HostSource::Example(name) => Some(name),
            _ => None,
        }
    }

    /// The root the host's installed files (host.yaml) are below: the root directory, else
    /// `/` (a snapshot file or an example runs on this machine's policy).
    pub fn config_root(&self) -> &Path {
        match self {
            HostSource::Root(root) => root,
            _ => Path::new("/"),
        }
    }

    /// host.yaml as `from` says (the one place the policy is applied).
    pub fn host_config(
        &self,
        flag: Option<&Path>,
        from: HostConfigFrom,
    ) -> Result<HostConfig, ConfigError> {
        match (flag, from) {
            (Some(path), _) => HostConfig::load(path),
            (None, HostConfigFrom::FlagOrDefaults) => Ok(HostConfig::default()),
            (None, HostConfigFrom::FlagOrInstalled) => HostConfig::load_below(self.config_root()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(root: &Path, example: Option<&str>) -> GlobalArgs {
        GlobalArgs {
            sysfs_root: root.into(),
            example: example.map(Into::into),
            verbose: 0,
        }
    }

    #[test]
    fn the_source_is_decided_from_the_options_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("host.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(
            HostSource::of(&global(dir.path(), None)),
            HostSource::Root(dir.path().into())
        );
        assert_eq!(
            HostSource::of(&global(&file, None)),
            HostSource::FlatJson(file.clone())
        );
        let example = HostSource::of(&global(Path::new("/"), Some("lab")));
        assert_eq!(example.example(), Some("lab"));
        assert!(example.probe_root().is_err());
        assert_eq!(example.config_root(), Path::new("/"));
        assert!(HostSource::FlatJson(file).probe_root().is_err());
    }

    #[test]
    fn host_yaml_is_the_flag_else_defaults_or_the_installed_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/vfio-p2p")).unwrap();
        std::fs::write(
            dir.path().join(vfio_p2p_config::host::HOST_CONFIG_PATH),
            "p2p_level: sys\n",
        )
        .unwrap();
        let source = HostSource::Root(dir.path().into());
        let installed = source
            .host_config(None, HostConfigFrom::FlagOrInstalled)
            .unwrap();
        let defaults = source
            .host_config(None, HostConfigFrom::FlagOrDefaults)
            .unwrap();
        assert_eq!(installed.p2p_level, pci_config::PathKind::Sys);
        assert_eq!(defaults.p2p_level, HostConfig::default().p2p_level);
        assert_ne!(installed.p2p_level, defaults.p2p_level);
    }
}
