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
    let path = path.display().to_string();
    Ok(match parse_fabric_mode(&String::from_utf8_lossy(&bytes)) {
        Ok(fabric_mode) => FmConfig::Present { path, fabric_mode },
        Err(message) => FmConfig::Invalid { path, message },
    })
}

/// The value of the last `FABRIC_MODE=` line, comments (`#`) aside: `Ok(None)` when there is
/// none (FM's default, 0), `Err` when the last one is not 0, 1 or 2 written plainly (FM
/// takes the last line; a quoted or other value is no mode, whatever an earlier line says).
pub fn parse_fabric_mode(text: &str) -> Result<Option<u8>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let last = lines
        .iter()
        .enumerate()
        .rev()
        .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or_default().trim()))
        .filter_map(|(i, l)| Some((i, l.strip_prefix("FABRIC_MODE")?)))
        .find_map(|(i, rest)| Some((i, rest.trim_start().strip_prefix('=')?.trim())));
    let Some((line, value)) = last else {
        return Ok(None);
    };
    match value {
        "0" | "1" | "2" => Ok(value.parse().ok()),
        _ => Err(format!(
            "line {line}: FABRIC_MODE={value} is no mode Fabric Manager knows (0 bare metal, 1 shared NVSwitch, 2 vGPU; written plainly, unquoted)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_mode_is_the_last_uncommented_value() {
        let cfg =
            "# FABRIC_MODE=2\nLOG_LEVEL=4\nFABRIC_MODE=0\nFABRIC_MODE = 1 # shared NVSwitch\n";
        assert_eq!(parse_fabric_mode(cfg), Ok(Some(1)));
        assert_eq!(parse_fabric_mode("FABRIC_MODE_RESTART=1\n"), Ok(None));
        // The last line is FM's, valid or not: an earlier valid one does not stand in.
        let e = parse_fabric_mode("FABRIC_MODE=1\nFABRIC_MODE=x\n").unwrap_err();
        assert!(e.starts_with("line 2: FABRIC_MODE=x is no mode"), "{e}");
        assert!(parse_fabric_mode("FABRIC_MODE=9\n").is_err());
        assert!(parse_fabric_mode("FABRIC_MODE=\"1\"\n").is_err());
        assert!(parse_fabric_mode("FABRIC_MODE=\n").is_err());
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
