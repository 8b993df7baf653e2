//! The host's expectation for this VM, and its comparison with what the guest sees.
//!
//! The host tool writes the expectation (see guest-agent/README.md for the format)
//! and hands it in through QEMU fw_cfg as `opt/vfio-p2p/expect.json`, or as a file.

use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::sysfs_scan::Scan;

/// Where the `qemu_fw_cfg` module shows the blob, under the sysfs root.
pub const FW_CFG_PATH: &str = "sys/firmware/qemu_fw_cfg/by_name/opt/vfio-p2p/expect.json/raw";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    #[error("cannot read the expectation {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("expectation {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "expectation {path} has format version {found}, this agent reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
}

/// The expectation document (format version 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    pub version: u32,
    /// Name of the VM on the host.
    pub vm: String,
    pub gpus: Vec<ExpectedGpu>,
    #[serde(default)]
    pub pairs: Vec<ExpectedPair>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedGpu {
    pub host_bdf: Bdf,
    /// The address the guest sees the GPU at.
    pub guest_bdf: Bdf,
    /// The clique the hypervisor was told to emulate; `null`: no capability at all.
    pub clique: Option<u8>,
    pub vendor: String,
    pub device: String,
}

/// Whether P2P should work between two GPUs (guest addresses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedPair {
    pub a: Bdf,
    pub b: Bdf,
    pub verdict: Verdict,
    /// Host path label (`nvidia-smi topo -m` style: PIX, PXB, PHB, NODE, SYS, NV#).
    pub path: String,
    /// Number of NVLinks between them on the host, `null` when none.
    pub nvlink: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    #[serde(rename = "p2p")]
    P2p,
    #[serde(rename = "no-p2p")]
    NoP2p,
}

impl Expectation {
    /// Reads `file`, or the fw_cfg blob under `sysfs_root` when no file is given.
    pub fn load(
        file: Option<&Path>,
        sysfs_root: &Path,
    ) -> Result<(Expectation, PathBuf), ExpectError> {
        let path = match file {
            Some(f) => f.to_path_buf(),
            None => sysfs_root.join(FW_CFG_PATH),
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ExpectError::Read {
            path: path.clone(),
            source,
        })?;
        let e = Self::parse(&text).map_err(|source| ExpectError::Parse {
            path: path.clone(),
            source,
        })?;
        if e.version != FORMAT_VERSION {
            return Err(ExpectError::Version {
                path,
                found: e.version,
            });
        }
        Ok((e, path))
    }

    pub fn parse(text: &str) -> Result<Expectation, serde_json::Error> {
        // fw_cfg blobs may carry trailing NUL padding.
        serde_json::from_str(text.trim_end_matches('\0'))
    }

    /// The expected verdict for a pair, in either order.
    pub fn pair(&self, a: Bdf, b: Bdf) -> Option<&ExpectedPair> {
        self.pairs
            .iter()
            .find(|p| (p.a == a && p.b == b) || (p.a == b && p.b == a))
    }
}

/// Outcome of one expected GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuStatus {
    Ok,
    Missing,
    WrongDevice,
    WrongClique,
    /// Config space not readable (not root): clique unknown.
    Unchecked,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCheck {
    pub guest_bdf: Bdf,
    pub host_bdf: Bdf,
    pub status: GpuStatus,
    pub expected_clique: Option<u8>,
    pub found_clique: Option<u8>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectReport {
    pub vm: String,
    pub source: String,
    pub gpus: Vec<GpuCheck>,
    /// NVIDIA GPUs present that the host did not announce.
    pub unexpected: Vec<Bdf>,
}

impl ExpectReport {
    pub fn mismatches(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| !matches!(g.status, GpuStatus::Ok | GpuStatus::Unchecked))
            .count()
    }

    pub fn unchecked(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| g.status == GpuStatus::Unchecked)
            .count()
    }
}

fn clique_text(c: Option<u8>) -> String {
    c.map_or_else(|| "no clique capability".into(), |c| format!("clique {c}"))
}

fn same_id(a: &str, b: &str) -> bool {
    let norm = |s: &str| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
    norm(a).is_some() && norm(a) == norm(b)
}

/// Compares the expectation with a scan: each GPU at its guest address, with its
/// IDs, and with exactly the expected clique (`null`: no capability).
pub fn compare(expect: &Expectation, source: &Path, scan: &Scan) -> ExpectReport {
    let gpus = expect
        .gpus
        .iter()
        .map(|e| {
            let check = |status, found_clique, message: String| GpuCheck {
                guest_bdf: e.guest_bdf,
                host_bdf: e.host_bdf,
                status,
                expected_clique: e.clique,
                found_clique,
                message,
            };
            let Some(g) = scan.gpu(e.guest_bdf) else {
                return check(
                    GpuStatus::Missing,
                    None,
                    format!(
                        "GPU {} (host {}) is not at {} in this guest",
                        e.device, e.host_bdf, e.guest_bdf
                    ),
                );
            };
            if !same_id(&g.vendor, &e.vendor) || !same_id(&g.device, &e.device) {
                return check(
                    GpuStatus::WrongDevice,
                    g.clique,
                    format!(
                        "{} is {}:{}, expected {}:{} (host {})",
                        e.guest_bdf, g.vendor, g.device, e.vendor, e.device, e.host_bdf
                    ),
                );
            }
            if !g.caps_readable {
                return check(
                    GpuStatus::Unchecked,
                    None,
                    format!(
                        "{}: config space beyond 64 bytes is not readable (run as root); expected {}",
                        e.guest_bdf,
                        clique_text(e.clique)
                    ),
                );
            }
            if g.clique != e.clique {
                let mut msg = format!(
                    "{} (host {}): expected {}, found {}",
                    e.guest_bdf,
                    e.host_bdf,
                    clique_text(e.clique),
                    clique_text(g.clique)
                );
                if let Some(p) = &g.problem {
                    msg.push_str(&format!(" ({p})"));
                }
                return check(GpuStatus::WrongClique, g.clique, msg);
            }
            check(
                GpuStatus::Ok,
                g.clique,
                format!("{} (host {}): {} as expected", e.guest_bdf, e.host_bdf, clique_text(g.clique)),
            )
        })
        .collect();
    let unexpected = scan
        .gpus
        .iter()
        .map(|g| g.bdf)
        .filter(|b| !expect.gpus.iter().any(|e| e.guest_bdf == *b))
        .collect();
    ExpectReport {
        vm: expect.vm.clone(),
        source: source.display().to_string(),
        gpus,
        unexpected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documented_example() {
        let e = Expectation::parse(
            r#"{"version":1,"vm":"vm0","gpus":[{"host_bdf":"0000:41:00.0","guest_bdf":"0000:06:00.0","clique":0,"vendor":"0x10de","device":"0x2330"},
                {"host_bdf":"0000:42:00.0","guest_bdf":"0000:07:00.0","clique":null,"vendor":"0x10de","device":"0x2330"}],
               "pairs":[{"a":"0000:06:00.0","b":"0000:07:00.0","verdict":"no-p2p","path":"PIX","nvlink":null}]}"#,
        )
        .unwrap();
        assert_eq!(e.gpus[0].clique, Some(0));
        assert_eq!(e.gpus[1].clique, None);
        let b = |s: &str| s.parse::<Bdf>().unwrap();
        assert_eq!(
            e.pair(b("0000:07:00.0"), b("0000:06:00.0"))
                .unwrap()
                .verdict,
            Verdict::NoP2p
        );
        assert!(
            Expectation::parse(r#"{"version":1,"vm":"x","gpus":[{"host_bdf":"../x"}]}"#).is_err()
        );
    }

    #[test]
    fn trailing_nuls_of_fw_cfg_are_ignored() {
        let e = Expectation::parse("{\"version\":1,\"vm\":\"v\",\"gpus\":[]}\0\0").unwrap();
        assert!(e.pairs.is_empty());
    }

    #[test]
    fn ids_compare_as_numbers() {
        assert!(same_id("0x10de", "0x10DE"));
        assert!(same_id("10de", "0x10de"));
        assert!(!same_id("0x2330", "0x2335"));
        assert!(!same_id("", ""));
    }
}
