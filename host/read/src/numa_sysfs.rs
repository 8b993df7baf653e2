//! What `sys/devices/system/node` and `sys/kernel/mm/hugepages` say beyond the CPU lists
//! (`sysfs::read_host` reads those): each node's distances and the huge page sizes.
//!
//! A Grace host shows its GPU memory as NUMA nodes without CPUs, each GPU with a memory
//! node and its generic-initiator companions; their distances (`nodeN/distance`, the ACPI
//! SLIT as Linux prints it: one row per node, one column per online node in node order) are
//! what a guest's `-numa dist` repeats.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use vfio_p2p_files::read_attribute_text;
use vfio_p2p_model::ReadWarning;

/// Each `sys/devices/system/node/nodeN` directory below `root`, with its N (none when the
/// kernel shows no NUMA nodes).
pub(crate) fn node_dirs(root: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(nodes) = fs::read_dir(root.join("sys/devices/system/node")) else {
        return Vec::new();
    };
    nodes
        .flatten()
        .filter_map(|n| {
            let name = n.file_name().to_string_lossy().into_owned();
            let id = name.strip_prefix("node")?.parse::<u32>().ok()?;
            Some((id, n.path()))
        })
        .collect()
}

/// Node → its distance row, for every `nodeN` with a readable `distance`; a row that is
/// not a list of numbers is left out with a warning naming the file.
pub fn read_numa_distances(
    root: &Path,
    warnings: &mut Vec<ReadWarning>,
) -> BTreeMap<u32, Vec<u32>> {
    let mut out = BTreeMap::new();
    for (id, dir) in node_dirs(root) {
        let path = dir.join("distance");
        let Ok(text) = read_attribute_text(&path, "NUMA node distances") else {
            continue;
        };
        match parse_distance_row(&text) {
            Some(row) => {
                out.insert(id, row);
            }
            None => warnings.push(ReadWarning {
                device: None,
                file: Some(path.display().to_string()),
                message: format!("not a list of distances: '{}'", text.trim()),
            }),
        }
    }
    out
}

/// `10 20 40` → [10, 20, 40]; `None` for anything else (an empty file included).
pub fn parse_distance_row(text: &str) -> Option<Vec<u32>> {
    let row: Option<Vec<u32>> = text.split_whitespace().map(|w| w.parse().ok()).collect();
    row.filter(|r| !r.is_empty())
}

/// The huge page sizes the kernel offers, KiB, ascending: the `hugepages-<N>kB`
/// directories of `sys/kernel/mm/hugepages` (empty where there is none).
pub fn read_hugepage_sizes(root: &Path) -> Vec<u64> {
    let Ok(entries) = fs::read_dir(root.join("sys/kernel/mm/hugepages")) else {
        return Vec::new();
    };
    let mut sizes: Vec<u64> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_rows() {
        assert_eq!(parse_distance_row("10 20 40\n"), Some(vec![10, 20, 40]));
        assert_eq!(parse_distance_row("\n"), None);
        assert_eq!(parse_distance_row("10 x"), None);
    }

    #[test]
    fn distances_and_hugepages_from_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("sys/devices/system/node");
        for (n, row) in [(0, "10 80\n"), (1, "80 10\n"), (2, "garbage\n")] {
            fs::create_dir_all(node.join(format!("node{n}"))).unwrap();
            fs::write(node.join(format!("node{n}/distance")), row).unwrap();
        }
        for s in [
            "hugepages-524288kB",
            "hugepages-2048kB",
            "hugepages-16777216kB",
        ] {
            fs::create_dir_all(dir.path().join("sys/kernel/mm/hugepages").join(s)).unwrap();
        }
        let mut warnings = Vec::new();
        let d = read_numa_distances(dir.path(), &mut warnings);
        assert_eq!(d.get(&0), Some(&vec![10, 80]));
        assert_eq!(d.get(&1), Some(&vec![80, 10]));
        assert!(!d.contains_key(&2));
        assert!(warnings[0]
            .file
            .as_deref()
            .unwrap()
            .ends_with("node2/distance"));
        assert_eq!(read_hugepage_sizes(dir.path()), [2048, 524288, 16777216]);
    }
}
