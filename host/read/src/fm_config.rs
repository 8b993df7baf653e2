//! Fabric Manager's own config file, `/usr/share/nvidia/nvswitch/fabricmanager.cfg`
//! (under the sysfs root given): whether FM is installed, and its `FABRIC_MODE=`
//! (0 bare metal, 1 shared NVSwitch, 2 vGPU; NVIDIA's libvirt-hooks README sets
//! `FABRIC_MODE=1` for shared NVSwitch partitions).

use std::path::Path;

use vfio_p2p_files::{read_input_file, InputFileError};
use vfio_p2p_model::fabric_state::FmConfigFile as FmConfig;

/// Where FM's package puts its config, relative to the root.
pub const FM_CONFIG_PATH: &str = "usr/share/nvidia/nvswitch/fabricmanager.cfg";

/// FM's config files are a few kB.
const MAX_CONFIG_BYTES: u64 = 256 << 10;

/// Reads `<root>/usr/share/nvidia/nvswitch/fabricmanager.cfg`.
pub fn read(root: &Path) -> Result<FmConfig, InputFileError> {
    let path = root.join(FM_CONFIG_PATH);
    if !path.exists() {
        return Ok(FmConfig::Absent);
    }
    let bytes = read_input_file(&path, MAX_CONFIG_BYTES, "Fabric Manager config")?;
    Ok(FmConfig::Present {
        path: path.display().to_string(),
        fabric_mode: parse_fabric_mode(&String::from_utf8_lossy(&bytes)),
    })
}

/// The last `FABRIC_MODE=N` line, comments (`#`) aside.
pub fn parse_fabric_mode(text: &str) -> Option<u8> {
    text.lines()
        .rev()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| l.strip_prefix("FABRIC_MODE"))
        .filter_map(|rest| rest.trim_start().strip_prefix('='))
        .find_map(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_mode_is_the_last_uncommented_value() {
        let cfg =
            "# FABRIC_MODE=2\nLOG_LEVEL=4\nFABRIC_MODE=0\nFABRIC_MODE = 1 # shared NVSwitch\n";
        assert_eq!(parse_fabric_mode(cfg), Some(1));
        assert_eq!(parse_fabric_mode("FABRIC_MODE_RESTART=1\n"), None);
        assert_eq!(parse_fabric_mode("FABRIC_MODE=x\n"), None);
    }

    #[test]
    fn the_file_under_the_root_is_read() {
        let root = std::env::temp_dir().join(format!("fm-config-{}", std::process::id()));
        assert_eq!(read(&root).unwrap(), FmConfig::Absent);
        let path = root.join(FM_CONFIG_PATH);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "FABRIC_MODE=1\n").unwrap();
        assert!(matches!(
            read(&root).unwrap(),
            FmConfig::Present {
                fabric_mode: Some(1),
                ..
            }
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
