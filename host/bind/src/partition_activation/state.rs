//! The record of the Fabric Manager partitions vfio-p2p activated and not yet deactivated,
//! `RUN/vfio-p2p/fabric.json`, beside the bind record: per partition, the guest whose
//! `prepare` activated it (none for `vfio-p2p fabric activate`) and its GPUs. It lives in
//! /run like the bindings it goes with: a reboot ends both, an FM restart ends neither, and
//! `vfio-p2p fabric resync` re-sends it to a restarted FM.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::state::state_dir;
use vfio_p2p_files::write_atomic;
use vfio_p2p_files::{read_input_file, InputFileError};

const RECORD_FILE: &str = "fabric.json";
/// A few hundred bytes per partition; FM has at most 64.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// One active partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivePartition {
    /// The libvirt guest whose prepare hook activated it.
    #[serde(default)]
    pub guest: Option<String>,
    /// Its GPUs, as FM listed them when it was activated.
    pub gpus: Vec<Bdf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationRecord {
    /// Partition id → who holds it.
    pub partitions: BTreeMap<u32, ActivePartition>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a vfio-p2p partition record ({message}); `vfio-p2p fabric list` shows what FM has active: fix or delete the file, then `vfio-p2p fabric resync`")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Input(#[from] InputFileError),
}

pub fn record_path(root: &Path) -> PathBuf {
    state_dir(root).join(RECORD_FILE)
}

impl ActivationRecord {
    /// The record below `root`; empty when there is none.
    pub fn load(root: &Path) -> Result<ActivationRecord, RecordError> {
        let path = record_path(root);
        match read_input_file(&path, MAX_RECORD_BYTES, "partition record") {
            Ok(t) => serde_json::from_slice(&t).map_err(|e| RecordError::Corrupt {
                path,
                message: e.to_string(),
            }),
            Err(InputFileError::Read { err, .. }) if err.kind() == io::ErrorKind::NotFound => {
                Ok(ActivationRecord::default())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces the record atomically.
    pub fn save(&self, root: &Path) -> Result<(), RecordError> {
        let dir = state_dir(root);
        let io_err = |path: PathBuf| move |source| RecordError::Io { path, source };
        std::fs::create_dir_all(&dir).map_err(io_err(dir.clone()))?;
        let path = record_path(root);
        let text = serde_json::to_string_pretty(self).expect("the record serializes") + "\n";
        write_atomic(&path, text.as_bytes()).map_err(io_err(path))
    }

    /// The partitions `guest` holds.
    pub fn of_guest(&self, guest: &str) -> Vec<u32> {
        self.partitions
            .iter()
            .filter(|(_, p)| p.guest.as_deref() == Some(guest))
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ActivationRecord::load(dir.path()).unwrap(),
            ActivationRecord::default()
        );
        let mut r = ActivationRecord::default();
        r.partitions.insert(
            3,
            ActivePartition {
                guest: Some("vm1".into()),
                gpus: vec!["0000:13:00.0".parse().unwrap()],
            },
        );
        r.save(dir.path()).unwrap();
        assert_eq!(ActivationRecord::load(dir.path()).unwrap(), r);
        assert_eq!(r.of_guest("vm1"), vec![3]);
        assert!(r.of_guest("vm2").is_empty());
        std::fs::write(record_path(dir.path()), "{\"partitions\": 3}").unwrap();
        let e = ActivationRecord::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("fabric.json: not a vfio-p2p partition record"),
            "{e}"
        );
    }
}
