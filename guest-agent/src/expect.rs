//! The host's expectation for this VM compared with what the guest sees.
//!
//! The host tool writes the expectation, and hands it in through QEMU fw_cfg or as a file
//! (read by `sysfs::expectation`). Its format and version rule are the
//! `vfio-p2p-contract` crate's, shared with the host.

use std::path::Path;

use pci_config::Bdf;
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::{Expectation, PciId};

use crate::sysfs::gpus::Scan;
use crate::sysfs::numa::NumaScan;

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
    /// The NVSwitch fabric (module ids, FM registration) against the planned partition,
    /// when the expectation plans one (`expect`; `report` has it at its top level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::fabric::FabricReport>,
    /// The expectation plans a fabric but NVML is not there to check it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_unchecked: Option<String>,
    /// The guest's NUMA nodes against the plan, when the expectation has a `numa` block
    /// (Grace: GPU memory nodes and their generic initiators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<crate::guest_numa::NumaReport>,
}

impl ExpectReport {
    pub fn mismatches(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| !matches!(g.status, GpuStatus::Ok | GpuStatus::Unchecked))
            .count()
            + self.fabric.as_ref().map_or(0, |f| f.mismatches())
            + self.numa.as_ref().map_or(0, |n| n.mismatches())
    }

    pub fn unchecked(&self) -> usize {
        self.gpus
            .iter()
            .filter(|g| g.status == GpuStatus::Unchecked)
            .count()
            + usize::from(self.fabric_unchecked.is_some())
    }
}

fn clique_text(c: Option<u8>) -> String {
    c.map_or_else(|| "no clique capability".into(), |c| format!("clique {c}"))
}

/// Whether the scan's ID text `found` is `want`.
fn same_id(found: &str, want: PciId) -> bool {
    PciId::parse(found) == Some(want)
}

/// Compares the expectation with a scan: each GPU at its guest address, with its
/// IDs, and with exactly the expected clique (`null`: no capability); and, when the
/// expectation plans NUMA nodes, the guest's nodes (`numa`, read with the scan).
pub fn compare(expect: &Expectation, source: &Path, scan: &Scan, numa: &NumaScan) -> ExpectReport {
    let numa = expect
        .numa
        .as_ref()
        .map(|plan| crate::guest_numa::judge(plan, &expect.gpus, numa.clone()));
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
            if !same_id(&g.vendor, e.vendor) || !same_id(&g.device, e.device) {
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
        fabric: None,
        fabric_unchecked: None,
        numa,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_compare_as_numbers() {
        assert!(same_id("0x10DE", PciId(0x10de)));
        assert!(same_id("10de", PciId(0x10de)));
        assert!(!same_id("0x2335", PciId(0x2330)));
        assert!(!same_id("", PciId(0)));
    }
}
