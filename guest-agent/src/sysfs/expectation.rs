//! The host's expectation for this VM: the file `--expect` names, or the blob QEMU's fw_cfg
//! shows below the sysfs root (`vfio_p2p_contract::FW_CFG_SYSFS_PATH`, the guest's
//! `qemu_fw_cfg` driver), read bounded and without blocking.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use vfio_p2p_contract::{
    Expectation, ExpectationError, FW_CFG_SYSFS_PATH as FW_CFG_PATH, MAX_EXPECTATION_BYTES,
};

/// Whether the host's expectation is in QEMU's fw_cfg below `root`.
pub fn in_firmware(root: &Path) -> bool {
    root.join(FW_CFG_PATH).exists()
}

#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    #[error("cannot read the expectation {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no expectation at {path}: the host writes it to QEMU's fw_cfg (`vfio-p2p gen`); load the guest driver with `modprobe qemu_fw_cfg`, or give a copy with --expect FILE")]
    NoFwCfg { path: PathBuf },
    #[error("expectation {path} is not a regular file; give the path of a file")]
    NotAFile { path: PathBuf },
    #[error("expectation {path} is larger than {MAX_EXPECTATION_BYTES} bytes: not an expectation")]
    TooLarge { path: PathBuf },
    #[error("expectation {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: ExpectationError,
    },
}

/// Reads `file`, or the fw_cfg blob under `sysfs_root` when no file is given.
pub fn load(file: Option<&Path>, sysfs_root: &Path) -> Result<(Expectation, PathBuf), ExpectError> {
    let file_arg = file;
    let path = match file {
        Some(f) => f.to_path_buf(),
        None => sysfs_root.join(FW_CFG_PATH),
    };
    let read = |source| ExpectError::Read {
        path: path.clone(),
        source,
    };
    // O_NONBLOCK: a FIFO given as the file must not hang the agent.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path);
    let file = match file {
        Err(e) if file_arg.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExpectError::NoFwCfg { path });
        }
        other => other.map_err(read)?,
    };
    if !file.metadata().map_err(read)?.is_file() {
        return Err(ExpectError::NotAFile { path });
    }
    let mut text = String::new();
    file.take(MAX_EXPECTATION_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read)?;
    if text.len() as u64 > MAX_EXPECTATION_BYTES {
        return Err(ExpectError::TooLarge { path });
    }
    let e = Expectation::from_json(&text).map_err(|source| ExpectError::Parse {
        path: path.clone(),
        source,
    })?;
    Ok((e, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_names_the_file_and_caps_its_size() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("e.json");
        std::fs::write(&f, "{\"version\":1,\"vm\":\"v\",\"gpus\":[]}\0\0").unwrap();
        assert!(load(Some(&f), t.path()).unwrap().0.pairs.is_empty());
        std::fs::write(&f, "{\"version\":3,\"vm\":\"v\",\"gpus\":[]}").unwrap();
        let e = load(Some(&f), t.path()).unwrap_err().to_string();
        assert!(
            e.contains("e.json") && e.contains("format version 3"),
            "{e}"
        );
        let big = std::fs::File::create(&f).unwrap();
        big.set_len(MAX_EXPECTATION_BYTES + 10).unwrap();
        let e = load(Some(&f), t.path()).unwrap_err().to_string();
        assert!(e.contains("e.json") && e.contains("larger than"), "{e}");
    }
}
