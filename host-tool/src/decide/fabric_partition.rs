//! Which Fabric Manager partition a VM gets: the one whose GPUs are exactly the VM's GPUs,
//! matched by PCI address from FM's partition list. Anything else is a finding the hook
//! applies its policy to (shared NVSwitch: FM refuses NVLink to GPUs it has not
//! partitioned together).

use pci_config::Bdf;

use crate::model::fabric::{FabricPartition, FabricState};

/// Why no partition can be activated for the VM: what was seen, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFinding {
    pub saw: String,
    pub fix: String,
}

impl std::fmt::Display for PartitionFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.saw, self.fix)
    }
}

fn list(bdfs: &[Bdf]) -> String {
    bdfs.iter()
        .map(Bdf::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn addresses(p: &FabricPartition) -> Option<Vec<Bdf>> {
    let mut v: Vec<Bdf> = p.gpus.iter().map(|g| g.bdf).collect::<Option<_>>()?;
    v.sort();
    Some(v)
}

const FIX_LIST: &str = "`vfio-p2p fabric list` shows FM's partitions";

/// The partition holding exactly `gpus` (in any order), usable now.
pub fn partition_for<'a>(
    state: &'a FabricState,
    gpus: &[Bdf],
) -> Result<&'a FabricPartition, PartitionFinding> {
    let mut wanted = gpus.to_vec();
    wanted.sort();
    wanted.dedup();
    if !state
        .partitions
        .iter()
        .any(|p| p.gpus.iter().any(|g| g.bdf.is_some()))
    {
        return Err(PartitionFinding {
            saw: format!(
                "Fabric Manager lists its {} partitions without PCI addresses (H100 and later boards do), so GPUs {} cannot be matched to one",
                state.partitions.len(),
                list(&wanted)
            ),
            fix: format!("activate the VM's partition by hand before it starts (`vfio-p2p fabric activate ID`; {FIX_LIST} by module id)"),
        });
    }
    let failed: Vec<Bdf> = wanted
        .iter()
        .copied()
        .filter(|b| state.nvlink_failed_gpus.contains(b))
        .collect();
    if !failed.is_empty() {
        return Err(PartitionFinding {
            saw: format!("Fabric Manager lists failed NVLinks on {}", list(&failed)),
            fix: "see /var/log/fabricmanager.log; give the VM GPUs without failed links, or repair and restart FM".into(),
        });
    }
    let Some(p) = state
        .partitions
        .iter()
        .find(|p| addresses(p).as_deref() == Some(&wanted[..]))
    else {
        return Err(not_a_partition(state, &wanted));
    };
    if state.unsupported.contains(&p.id) {
        return Err(PartitionFinding {
            saw: format!(
                "GPUs {} are Fabric Manager's partition {}, which FM lists as unsupported now (a GPU or NVSwitch missing or degraded)",
                list(&wanted),
                p.id
            ),
            fix: format!("see /var/log/fabricmanager.log; {FIX_LIST} that are supported"),
        });
    }
    Ok(p)
}

fn not_a_partition(state: &FabricState, wanted: &[Bdf]) -> PartitionFinding {
    let holding: Vec<String> = state
        .partitions
        .iter()
        .filter(|p| !state.unsupported.contains(&p.id))
        .filter(|p| {
            wanted
                .iter()
                .all(|w| p.gpus.iter().any(|g| g.bdf == Some(*w)))
        })
        .map(|p| {
            let a = addresses(p).map_or_else(|| "?".into(), |a| list(&a));
            format!("{} ({a})", p.id)
        })
        .collect();
    let hint = if holding.is_empty() {
        "no partition holds them all".to_string()
    } else {
        format!("partitions holding them all: {}", holding.join("; "))
    };
    PartitionFinding {
        saw: format!(
            "GPUs {} are not one of Fabric Manager's partitions ({hint}): FM gives NVLink only to a whole partition",
            list(wanted)
        ),
        fix: format!("give the VM exactly one partition's GPUs; {FIX_LIST}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fabric::PartitionGpu;

    fn b(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    fn partition(id: u32, gpus: &[&str]) -> FabricPartition {
        FabricPartition {
            id,
            active: false,
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, g)| PartitionGpu {
                    module_id: i as u32 + 1,
                    bdf: Some(b(g)),
                    nvlinks_available: 18,
                    nvlinks_max: 18,
                })
                .collect(),
        }
    }

    fn board() -> FabricState {
        FabricState {
            partitions: vec![
                partition(
                    0,
                    &[
                        "0000:13:00.0",
                        "0000:14:00.0",
                        "0000:15:00.0",
                        "0000:21:00.0",
                    ],
                ),
                partition(1, &["0000:13:00.0", "0000:14:00.0"]),
                partition(2, &["0000:15:00.0", "0000:21:00.0"]),
            ],
            ..FabricState::default()
        }
    }

    #[test]
    fn the_exact_gpu_set_is_the_partition_in_any_order() {
        let s = board();
        let p = partition_for(&s, &[b("0000:14:00.0"), b("0000:13:00.0")]).unwrap();
        assert_eq!(p.id, 1);
        let all = [
            b("0000:21:00.0"),
            b("0000:13:00.0"),
            b("0000:15:00.0"),
            b("0000:14:00.0"),
        ];
        assert_eq!(partition_for(&s, &all).unwrap().id, 0);
    }

    #[test]
    fn a_subset_or_a_spread_set_is_no_partition_and_names_those_that_hold_it() {
        let s = board();
        let e = partition_for(&s, &[b("0000:13:00.0")]).unwrap_err();
        assert!(
            e.saw.contains("partitions holding them all: 0 (") && e.saw.contains("; 1 ("),
            "{e}"
        );
        let e = partition_for(&s, &[b("0000:13:00.0"), b("0000:15:00.0")]).unwrap_err();
        assert!(e.saw.contains("partitions holding them all: 0 ("), "{e}");
        assert!(!e.saw.contains("; 1 ("), "{e}");
        let e = partition_for(&s, &[b("0000:81:00.0")]).unwrap_err();
        assert!(e.saw.contains("no partition holds them all"), "{e}");
    }

    #[test]
    fn unsupported_partitions_and_failed_links_are_findings() {
        let mut s = board();
        s.unsupported = vec![1];
        let e = partition_for(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
        assert!(
            e.saw.contains("partition 1, which FM lists as unsupported"),
            "{e}"
        );
        let mut s = board();
        s.nvlink_failed_gpus = vec![b("0000:14:00.0")];
        let e = partition_for(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
        assert!(e.saw.contains("failed NVLinks on 0000:14:00.0"), "{e}");
    }

    #[test]
    fn partitions_without_addresses_cannot_be_matched() {
        let mut s = board();
        for p in &mut s.partitions {
            for g in &mut p.gpus {
                g.bdf = None;
            }
        }
        let e = partition_for(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
        assert!(e.saw.contains("without PCI addresses"), "{e}");
        assert!(e.fix.contains("fabric activate"), "{e}");
    }
}
