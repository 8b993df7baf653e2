//! The door of the commands that change the host (`bind`, `unbind`, the hook, `fabric`):
//! the root they change, and what they read below it — host.yaml as installed, the
//! devices, Fabric Manager — each read only when the command asks, through the same
//! readers as [`super::Context::build`] (the hook's prepare builds a whole `Context` on
//! this root).

use std::path::{Path, PathBuf};

use super::source::{HostConfigFrom, HostSource};
use crate::cli::GlobalArgs;
use vfio_p2p_bind::sim::SimRoot;
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::ConfigError;
use vfio_p2p_fm_ffi::FmError;
use vfio_p2p_model::Topology;
use vfio_p2p_read::fm_api::FmSession;

/// The sysfs root a changing command (bind, unbind, hook, fabric) works on: never a
/// snapshot file; an embedded example only for a dry run, which then works on the
/// simulated tree of [`SimRoot`] (removed again on drop).
#[derive(Debug)]
pub struct ChangeRoot {
    path: PathBuf,
    _sim: Option<SimRoot>,
}

impl ChangeRoot {
    /// The root of the global options (`--sysfs-root`, `--example` for a dry run).
    pub fn of(global: &GlobalArgs, dry_run: bool) -> anyhow::Result<ChangeRoot> {
        ChangeRoot::new(&HostSource::of(global), dry_run)
    }

    fn new(source: &HostSource, dry_run: bool) -> anyhow::Result<ChangeRoot> {
        match source {
            HostSource::Example(name) => {
                anyhow::ensure!(
                    dry_run,
                    "--example is a made-up host: bind/unbind/hook can only show what they would do \
                     there (--dry-run); pass a real sysfs root (--sysfs-root) to change bindings"
                );
                let sim = SimRoot::of_example(name)?;
                Ok(ChangeRoot {
                    path: sim.path().to_path_buf(),
                    _sim: Some(sim),
                })
            }
            HostSource::FlatJson(file) => anyhow::bail!(
                "{}: a snapshot file cannot be changed; pass a sysfs root directory (--sysfs-root)",
                file.display()
            ),
            HostSource::Root(root) => Ok(ChangeRoot {
                path: root.clone(),
                _sim: None,
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root as the host source the change reads (the simulated tree for an example).
    pub fn source(&self) -> HostSource {
        HostSource::Root(self.path.clone())
    }

    /// host.yaml as installed below the root (defaults when absent): what runs on the
    /// host follows the installed policy.
    pub fn host_config(&self) -> Result<HostConfig, ConfigError> {
        self.source()
            .host_config(None, HostConfigFrom::FlagOrInstalled)
    }

    /// The devices and their groups, typed; no NVLink source or Fabric Manager, which
    /// binding does not use.
    pub fn devices(&self) -> anyhow::Result<Topology> {
        Ok(Topology::from_record(&self.source().read()?))
    }

    /// A connection to Fabric Manager at `address` (`fabric`, the hook's release), opened
    /// where the context build opens it.
    pub fn fabric_manager(&self, address: &str) -> Result<FmSession, FmError> {
        super::open_fabric_manager(address)
    }
}
