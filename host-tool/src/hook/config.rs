//! `/etc/vfio-p2p/hook.yaml`: what the hook does about a domain that will not get P2P.
//!
//! ```yaml
//! policy: deny      # warn (default): log and start; deny: refuse to start the VM
//! p2p_level: pxb    # worst host path two GPUs of one clique may have (as `plan --p2p-level`)
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::PathKind;

/// Below the root (`--sysfs-root`), so tests can use a temporary directory.
pub const CONFIG_PATH: &str = "etc/vfio-p2p/hook.yaml";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    Warn,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    #[serde(default)]
    pub policy: Policy,
    #[serde(default = "default_level", with = "level")]
    pub p2p_level: PathKind,
}

fn default_level() -> PathKind {
    PathKind::Pxb
}

mod level {
    use serde::{Deserialize, Deserializer};

    use crate::model::PathKind;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathKind, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e| serde::de::Error::custom(format!("p2p_level: {e}")))
    }
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            policy: Policy::Warn,
            p2p_level: default_level(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {message}; valid keys: policy (warn|deny), p2p_level (pix|pxb|phb|node|sys)")]
    Invalid { path: PathBuf, message: String },
}

impl HookConfig {
    /// The config below `root`; the defaults when the file does not exist.
    pub fn load(root: &Path) -> Result<HookConfig, ConfigError> {
        let path = root.join(CONFIG_PATH);
        match fs::read_to_string(&path) {
            Ok(t) if t.trim().is_empty() => Ok(HookConfig::default()),
            Ok(t) => serde_saphyr::from_str(&t).map_err(|e| ConfigError::Invalid {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HookConfig::default()),
            Err(source) => Err(ConfigError::Io { path, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: Option<&str>) -> Result<HookConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        if let Some(t) = text {
            fs::create_dir_all(dir.path().join("etc/vfio-p2p")).unwrap();
            fs::write(dir.path().join(CONFIG_PATH), t).unwrap();
        }
        HookConfig::load(dir.path())
    }

    #[test]
    fn defaults_parses_and_rejects_unknown_keys() {
        assert_eq!(load(None).unwrap(), HookConfig::default());
        let c = load(Some("policy: deny\np2p_level: phb\n")).unwrap();
        assert_eq!(c.policy, Policy::Deny);
        assert_eq!(c.p2p_level, PathKind::Phb);
        let e = load(Some("policy: deny\npolcy: warn\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hook.yaml") && e.contains("polcy"), "{e}");
        assert!(load(Some("policy: block\n")).is_err());
        assert!(load(Some("p2p_level: far\n")).is_err());
    }
}
