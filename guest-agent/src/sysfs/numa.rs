//! The guest's NUMA nodes as Linux shows them under `sys/devices/system/node/`
//! (drivers/base/node.c): `nodeN/` for every online node, with `cpulist`, `meminfo`
//! (`Node N MemTotal: … kB`) and `distance` (the SLIT row), and `has_generic_initiator`,
//! the nodes SRAT gave a generic initiator (drivers/acpi/numa/srat.c). `guest_numa` judges
//! them against the host's plan.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Node files are a few hundred bytes; more is not a node file.
const NODE_FILE_LIMIT: u64 = 64 * 1024;

/// One online NUMA node as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeScan {
    pub id: u32,
    /// `cpulist` as the kernel wrote it, trimmed (empty: no CPU).
    pub cpulist: String,
    /// `MemTotal` of `meminfo` in KiB (`None`: unreadable).
    pub mem_total_kib: Option<u64>,
    /// The `distance` row (`None`: unreadable).
    pub distances: Option<Vec<u32>>,
}

/// The guest's NUMA nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaScan {
    pub nodes: Vec<NodeScan>,
    /// `has_generic_initiator` (`None`: the kernel has no such file, older than 5.10).
    pub generic_initiators: Option<Vec<u32>>,
}

impl NumaScan {
    pub fn node(&self, id: u32) -> Option<&NodeScan> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

fn read_text(path: &Path) -> Option<String> {
    let bytes = super::read_regular_file(path, NODE_FILE_LIMIT).ok()?;
    Some(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// A kernel node or CPU list (`0-1,4`), `None` when it is not one.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// `Node N MemTotal:   123 kB` → 123.
fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let (_, rest) = l.split_once("MemTotal:")?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

/// Reads `root/sys/devices/system/node`: every `nodeN` directory and `has_generic_initiator`.
pub fn scan(root: &Path) -> NumaScan {
    let dir = root.join("sys/devices/system/node");
    let mut nodes: Vec<NodeScan> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            let p = entry.path();
            Some(NodeScan {
                id,
                cpulist: read_text(&p.join("cpulist")).unwrap_or_default(),
                mem_total_kib: read_text(&p.join("meminfo")).and_then(|m| mem_total_kib(&m)),
                distances: read_text(&p.join("distance"))
                    .and_then(|d| d.split_whitespace().map(|x| x.parse().ok()).collect()),
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    let generic_initiators =
        read_text(&dir.join("has_generic_initiator")).and_then(|t| parse_list(&t));
    NumaScan {
        nodes,
        generic_initiators,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_meminfo_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_list("2-4,7"), Some(vec![2, 3, 4, 7]));
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(parse_list("4-2"), None);
        assert_eq!(parse_list("x"), None);
        let m = "Node 2 MemTotal:              0 kB\nNode 2 MemFree:  0 kB\n";
        assert_eq!(mem_total_kib(m), Some(0));
        assert_eq!(mem_total_kib("Node 0 MemTotal:  524288 kB"), Some(524288));
        assert_eq!(mem_total_kib("Node 0 MemFree: 1 kB"), None);
    }
}
