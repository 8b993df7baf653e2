//! The record of what `bind` changed, under `RUN/vfio-p2p/state.json`, so `unbind` can
//! restore exactly that. Written atomically (temporary file, fsync, rename).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use vfio_p2p_files::{read_input_file, InputFileError};
use vfio_p2p_read::Binding;

/// The directory below the sysfs root that holds the record and the lock.
pub const STATE_DIR: &str = "run/vfio-p2p";
const STATE_FILE: &str = "state.json";

/// What one device looked like before `bind` moved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecordEntry {
    pub original: Binding,
    /// The named device it was bound for (itself, or the GPU whose function or group member it is).
    pub bound_with: Bdf,
    /// The libvirt guest whose `prepare` hook bound it, if a hook did.
    #[serde(default)]
    pub guest: Option<String>,
    /// The `reset_method` bind set (host.yaml `reset:`) and the one it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<ResetChange>,
}

/// A GPU's `reset_method`: what it is set to, and what it was (what a rollback and
/// `unbind` write back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetChange {
    pub set: String,
    pub was: Vec<String>,
}

/// Every device `bind` moved and has not yet restored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindState {
    pub devices: BTreeMap<Bdf, DeviceRecordEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a vfio-p2p bind record ({message}); inspect it, restore the devices it lists by hand (driver_override, drivers_probe) and delete it")]
    Corrupt { path: PathBuf, message: String },
    /// Unreadable, not a regular file or over [`MAX_STATE_BYTES`]; it names the file.
    #[error(transparent)]
    Input(#[from] InputFileError),
}

/// The most a bind record may hold: a few hundred bytes per device bound.
pub const MAX_STATE_BYTES: u64 = 16 << 20;

pub fn state_dir(root: &Path) -> PathBuf {
    root.join(STATE_DIR)
}

pub fn state_path(root: &Path) -> PathBuf {
    state_dir(root).join(STATE_FILE)
}

impl BindState {
    /// The record below `root`; empty when there is none yet.
    pub fn load(root: &Path) -> Result<BindState, StateError> {
        let path = state_path(root);
        match read_input_file(&path, MAX_STATE_BYTES, "bind record") {
            Ok(t) => serde_json::from_slice(&t).map_err(|e| StateError::Corrupt {
                path,
                message: e.to_string(),
            }),
            Err(InputFileError::Read { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                Ok(BindState::default())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces the record atomically: a reader sees the old or the new one, never half.
    pub fn save(&self, root: &Path) -> Result<(), StateError> {
        let dir = state_dir(root);
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { path, source }
        };
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let path = state_path(root);
        let tmp = dir.join(format!(".{STATE_FILE}.{}", std::process::id()));
        let text = serde_json::to_string_pretty(self).expect("the record serializes") + "\n";
        let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(text.as_bytes()).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(BindState::load(dir.path()).unwrap(), BindState::default());
        let gpu: Bdf = "0000:41:00.0".parse().unwrap();
        let mut s = BindState::default();
        s.devices.insert(
            gpu,
            DeviceRecordEntry {
                original: Binding {
                    driver: Some("nvidia".into()),
                    driver_override: None,
                },
                bound_with: gpu,
                guest: Some("vm1".into()),
                reset: Some(ResetChange {
                    set: "bus".into(),
                    was: vec!["flr".into(), "bus".into()],
                }),
            },
        );
        s.save(dir.path()).unwrap();
        assert_eq!(BindState::load(dir.path()).unwrap(), s);
        fs::write(state_path(dir.path()), "{\"devices\": 3}").unwrap();
        let e = BindState::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("state.json: not a vfio-p2p bind record"), "{e}");
    }
}
