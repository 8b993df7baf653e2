//! What the guest agent sends back to the host over virtio-vsock (`report --send`), and
//! where it sends it.
//!
//! The host is the reader and does not trust the guest: the document has a strict schema
//! (unknown fields refused), bounded sizes ([`MAX_GUEST_REPORT_BYTES`], string and list
//! limits checked by [`GuestReport::from_json`]), and the `vm` name in it is only what the
//! guest claims: the host files a report under the domain that owns the sender's CID.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

/// The host's address on virtio-vsock (`VMADDR_CID_HOST`).
pub const HOST_CID: u32 = 2;

/// The vsock port `gen` puts in the expectation when `vm.yaml` says `verify: vsock` and
/// names no port.
pub const DEFAULT_REPORT_PORT: u32 = 7389;

/// The largest report the host reads; the connection is dropped beyond it. A 16-GPU VM
/// with every ordered pair measured is about 40 KiB.
pub const MAX_GUEST_REPORT_BYTES: usize = 256 << 10;

/// The report format written by this build, and the only one the host reads.
pub const GUEST_REPORT_VERSION: u32 = 1;

/// Most GPUs in one report (and so at most `MAX_GPUS × (MAX_GPUS - 1)` ordered pairs).
pub const MAX_GPUS: usize = 64;

/// Longest string field (names, versions, boot id, labels).
pub const MAX_STRING: usize = 128;

/// Where the agent sends its report: part of the [`crate::Expectation`] (`report`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportChannel {
    /// The host's vsock port (the host's CID is always [`HOST_CID`]).
    pub vsock_port: u32,
}

/// The guest agent's findings, as sent to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestReport {
    pub version: u32,
    /// The VM name the guest read in its expectation: a claim, never used to file the report.
    pub vm: String,
    /// `/proc/sys/kernel/random/boot_id`: one record per domain and boot.
    pub boot_id: String,
    pub agent_version: String,
    /// `true` when CUDA ran (peers, writes, bandwidth); `false` for a sysfs-only scan.
    pub measured: bool,
    /// The agent's own exit status (0 as expected, 1 mismatch, 2 could not run).
    pub agent_exit: u8,
    pub gpus: Vec<ReportedGpu>,
    /// Ordered pairs; empty when nothing was measured.
    #[serde(default)]
    pub pairs: Vec<ReportedPair>,
    /// The agent's NVSwitch fabric check (module ids, FM registration against the planned
    /// partition), when its expectation plans a fabric; absent otherwise (and from agents
    /// before it: the field is additive, the version stays 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<ReportedFabric>,
}

/// Most fabric problems one report carries, and the longest of them.
pub const MAX_FABRIC_PROBLEMS: usize = 2 * MAX_GPUS;
pub const MAX_PROBLEM_TEXT: usize = 512;

/// The guest's fabric check as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedFabric {
    /// `false`: the guest could not check it (no NVML).
    pub checked: bool,
    /// What differs from the plan, one sentence each; empty: as planned.
    #[serde(default)]
    pub problems: Vec<String>,
}

/// One NVIDIA GPU the guest found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedGpu {
    pub guest_bdf: Bdf,
    /// The clique its capability carries; `null` when it has none or it was unreadable.
    pub clique: Option<u8>,
    /// The capability could be read (root); `false`: the clique is unknown.
    pub clique_readable: bool,
}

/// One ordered pair as measured in the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedPair {
    pub src: Bdf,
    pub dst: Bdf,
    /// The driver enabled peer access src → dst.
    pub peer_access: bool,
    /// Every written word arrived on `dst`; `null` when not checked.
    pub writes_ok: Option<bool>,
    /// Active NVLinks src → dst as NVML reports them (0: PCIe); `null` without NVML.
    pub nvlinks: Option<u32>,
    /// Copy-engine bandwidth src → dst, GB/s (median).
    pub bandwidth_gbps: Option<f64>,
    /// One-way latency src → dst, µs (median).
    pub latency_us: Option<f64>,
}

/// Why bytes from a guest are not a report.
#[derive(Debug, thiserror::Error)]
pub enum GuestReportError {
    #[error("not a report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("report format version {found}; this host reads version {GUEST_REPORT_VERSION}")]
    Version { found: u32 },
    #[error("report field {field} is over its limit of {limit}")]
    TooLarge { field: &'static str, limit: usize },
    #[error("report field {field} is not a finite, non-negative number")]
    BadNumber { field: &'static str },
}

impl GuestReport {
    /// Compact JSON, as sent.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serializes")
    }

    /// Reads and bounds a report; the caller has already limited the byte count.
    pub fn from_json(bytes: &[u8]) -> Result<Self, GuestReportError> {
        let r: GuestReport = serde_json::from_slice(bytes)?;
        if r.version != GUEST_REPORT_VERSION {
            return Err(GuestReportError::Version { found: r.version });
        }
        r.check_bounds()?;
        Ok(r)
    }

    fn check_bounds(&self) -> Result<(), GuestReportError> {
        let long = |field, s: &str| {
            (s.len() > MAX_STRING).then_some(GuestReportError::TooLarge {
                field,
                limit: MAX_STRING,
            })
        };
        for (field, s) in [
            ("vm", &self.vm),
            ("boot_id", &self.boot_id),
            ("agent_version", &self.agent_version),
        ] {
            if let Some(e) = long(field, s) {
                return Err(e);
            }
        }
        if self.gpus.len() > MAX_GPUS {
            return Err(GuestReportError::TooLarge {
                field: "gpus",
                limit: MAX_GPUS,
            });
        }
        if let Some(f) = &self.fabric {
            if f.problems.len() > MAX_FABRIC_PROBLEMS {
                return Err(GuestReportError::TooLarge {
                    field: "fabric.problems",
                    limit: MAX_FABRIC_PROBLEMS,
                });
            }
            if f.problems.iter().any(|p| p.len() > MAX_PROBLEM_TEXT) {
                return Err(GuestReportError::TooLarge {
                    field: "fabric.problems",
                    limit: MAX_PROBLEM_TEXT,
                });
            }
        }
        let max_pairs = MAX_GPUS * (MAX_GPUS - 1);
        if self.pairs.len() > max_pairs {
            return Err(GuestReportError::TooLarge {
                field: "pairs",
                limit: max_pairs,
            });
        }
        let sane = |v: Option<f64>| v.is_none_or(|v| v.is_finite() && v >= 0.0);
        for p in &self.pairs {
            if !sane(p.bandwidth_gbps) {
                return Err(GuestReportError::BadNumber {
                    field: "bandwidth_gbps",
                });
            }
            if !sane(p.latency_us) {
                return Err(GuestReportError::BadNumber {
                    field: "latency_us",
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GuestReport {
        GuestReport {
            version: 1,
            vm: "vm0".into(),
            boot_id: "b".into(),
            agent_version: "0.1.0".into(),
            measured: false,
            agent_exit: 0,
            gpus: vec![ReportedGpu {
                guest_bdf: "0000:06:00.0".parse().unwrap(),
                clique: Some(0),
                clique_readable: true,
            }],
            pairs: vec![],
            fabric: None,
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(GuestReport::from_json(r.to_json().as_bytes()).unwrap(), r);
        assert!(
            !r.to_json().contains("fabric"),
            "absent stays absent (v1 bytes)"
        );
        let mut r = sample();
        r.fabric = Some(ReportedFabric {
            checked: true,
            problems: vec!["GPU 0000:06:00.0: module 3 where the plan has 1".into()],
        });
        assert_eq!(GuestReport::from_json(r.to_json().as_bytes()).unwrap(), r);
        r.fabric.as_mut().unwrap().problems = vec![String::new(); MAX_FABRIC_PROBLEMS + 1];
        assert!(GuestReport::from_json(r.to_json().as_bytes()).is_err());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut v: serde_json::Value = serde_json::from_str(&sample().to_json()).unwrap();
        v["domain"] = "other".into();
        let e = GuestReport::from_json(v.to_string().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("unknown field `domain`"), "{e}");
    }

    #[test]
    fn long_strings_and_bad_numbers_are_refused() {
        let mut r = sample();
        r.vm = "x".repeat(MAX_STRING + 1);
        let e = GuestReport::from_json(r.to_json().as_bytes()).unwrap_err();
        assert_eq!(e.to_string(), "report field vm is over its limit of 128");
        let mut r = sample();
        r.pairs.push(ReportedPair {
            src: "0000:06:00.0".parse().unwrap(),
            dst: "0000:07:00.0".parse().unwrap(),
            peer_access: true,
            writes_ok: None,
            nvlinks: None,
            bandwidth_gbps: Some(-1.0),
            latency_us: None,
        });
        let e = GuestReport::from_json(r.to_json().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("bandwidth_gbps"), "{e}");
    }

    #[test]
    fn other_versions_are_refused() {
        let mut r = sample();
        r.version = 2;
        let e = GuestReport::from_json(r.to_json().as_bytes()).unwrap_err();
        assert!(e.to_string().contains("version 2"), "{e}");
    }
}
