//! A saved list of Fabric Manager's partitions (`fabric_manager.partitions` in
//! host.yaml), for hosts where FM runs in a service VM and the host cannot ask it:
//!
//! - `fmpm -l` output of NVIDIA's Fabric-Manager-Client (github.com/NVIDIA/Fabric-Manager-Client,
//!   `fmpm.cpp` `listPartitions`): JSON with `partitionInfo[]`, each with `partitionId`,
//!   `isActive` (0/1), `numGpus` and `gpuInfo[]` (`physicalId` = the module id, `pciBusId`
//!   `DDDDDDDD:BB:DD.F`, `numNvLinksAvailable`, `maxNumNvLinks`, `uuid`, `nvlinkLineRateMBps`).
//!   FM in a service VM cannot resolve the host's PCI addresses and prints
//!   `00000000:00:00.0`: such a GPU has no address here.
//! - vfio-p2p's own JSON form of [`FabricState`] (what `topo --format json` prints under
//!   `fabric.state`), which may also carry `unsupported`, `nvlink_failed_gpus` and `fm_version`.

use std::path::Path;

use pci_config::Bdf;
use serde::Deserialize;

use vfio_p2p_files::{read_input_file, InputFileError};
use vfio_p2p_model::fabric_state::{FabricPartition, FabricState, PartitionGpu};

/// More than FM's 64 partitions of 16 GPUs each take as `fmpm -l` prints them.
const MAX_CAPTURE_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FmCaptureError {
    #[error(transparent)]
    File(#[from] InputFileError),
    #[error("{path}:{line}:{column}: {message}")]
    At {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
}

/// `fmpm -l`'s JSON, as `listPartitions` writes it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FmpmList {
    partition_info: Vec<FmpmPartition>,
    #[serde(default)]
    num_partitions: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FmpmPartition {
    partition_id: u32,
    is_active: u32,
    num_gpus: u32,
    gpu_info: Vec<FmpmGpu>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FmpmGpu {
    physical_id: u32,
    pci_bus_id: String,
    num_nv_links_available: u32,
    max_num_nv_links: u32,
}

/// Reads the capture at `path` (at most 1 MiB, a regular file).
pub fn read(path: &Path) -> Result<FabricState, FmCaptureError> {
    let bytes = read_input_file(path, MAX_CAPTURE_BYTES, "Fabric Manager partition list")?;
    parse(
        &String::from_utf8_lossy(&bytes),
        &path.display().to_string(),
    )
}

/// Parses `fmpm -l` output or vfio-p2p's JSON; `name` is the file for errors.
pub fn parse(text: &str, name: &str) -> Result<FabricState, FmCaptureError> {
    let at = |line: usize, column: usize, message: String| FmCaptureError::At {
        path: name.to_string(),
        line,
        column,
        message,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with("Failed") {
        return Err(at(
            1,
            1,
            format!(
                "this is fmpm's error message, not a partition list ({}); capture `fmpm -l` again once Fabric Manager runs in FABRIC_MODE=1",
                trimmed.lines().next().unwrap_or_default()
            ),
        ));
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        at(
            e.line(),
            e.column(),
            format!("not JSON: {e}; give `fmpm -l` output or vfio-p2p's fabric JSON"),
        )
    })?;
    if value.get("partitionInfo").is_some() {
        let list: FmpmList = serde_json::from_value(value).map_err(|e| {
            at(
                1,
                1,
                format!("not `fmpm -l` output as Fabric-Manager-Client prints it: {e}"),
            )
        })?;
        from_fmpm(list, text).map_err(|(line, message)| at(line, 1, message))
    } else if value.get("partitions").is_some() {
        let state: FabricState = serde_json::from_value(value)
            .map_err(|e| at(1, 1, format!("not vfio-p2p's fabric JSON: {e}")))?;
        check_ids(&state.partitions, text, "\"id\"").map_err(|(line, m)| at(line, 1, m))?;
        Ok(state)
    } else {
        Err(at(
            1,
            1,
            "neither `fmpm -l` output (no \"partitionInfo\") nor vfio-p2p's fabric JSON (no \"partitions\")".into(),
        ))
    }
}

/// The line of the `n`th (0-based) occurrence of `key` in `text`: where a partition's
/// error is shown (JSON values carry no positions).
fn line_of(text: &str, key: &str, n: usize) -> usize {
    text.match_indices(key)
        .nth(n)
        .map_or(1, |(i, _)| text[..i].matches('\n').count() + 1)
}

fn from_fmpm(list: FmpmList, text: &str) -> Result<FabricState, (usize, String)> {
    if let Some(n) = list.num_partitions {
        if n as usize != list.partition_info.len() {
            return Err((
                line_of(text, "\"numPartitions\"", 0),
                format!(
                    "numPartitions says {n} but {} partitions follow: the capture is cut short; capture `fmpm -l` again",
                    list.partition_info.len()
                ),
            ));
        }
    }
    let mut partitions = Vec::with_capacity(list.partition_info.len());
    for (i, p) in list.partition_info.into_iter().enumerate() {
        let line = line_of(text, "\"partitionId\"", i);
        if p.num_gpus as usize != p.gpu_info.len() {
            return Err((
                line,
                format!(
                    "partition {}: numGpus says {} but {} GPUs are listed; capture `fmpm -l` again",
                    p.partition_id,
                    p.num_gpus,
                    p.gpu_info.len()
                ),
            ));
        }
        let mut gpus = Vec::with_capacity(p.gpu_info.len());
        for g in p.gpu_info {
            let bdf: Bdf = g.pci_bus_id.parse().map_err(|e| {
                (
                    line,
                    format!("partition {}: GPU {}: {e}", p.partition_id, g.physical_id),
                )
            })?;
            gpus.push(PartitionGpu {
                module_id: g.physical_id,
                // FM in a service VM prints zeros for addresses it cannot see.
                bdf: (bdf != Bdf::new(0, 0, 0, 0)).then_some(bdf),
                nvlinks_available: g.num_nv_links_available,
                nvlinks_max: g.max_num_nv_links,
            });
        }
        partitions.push(FabricPartition {
            id: p.partition_id,
            gpus,
            active: p.is_active != 0,
        });
    }
    check_ids(&partitions, text, "\"partitionId\"")?;
    Ok(FabricState {
        fm_version: None,
        partitions,
        unsupported: Vec::new(),
        nvlink_failed_gpus: Vec::new(),
    })
}

/// Partition ids are unique, and so is each GPU within its partition.
fn check_ids(partitions: &[FabricPartition], text: &str, key: &str) -> Result<(), (usize, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in partitions.iter().enumerate() {
        let line = line_of(text, key, i);
        if !seen.insert(p.id) {
            return Err((
                line,
                format!("partition {} is listed twice; keep one", p.id),
            ));
        }
        let mut modules = std::collections::BTreeSet::new();
        if let Some(g) = p.gpus.iter().find(|g| !modules.insert(g.module_id)) {
            return Err((
                line,
                format!("partition {}: module {} is listed twice", p.id, g.module_id),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/../../tests/fixtures/fabric/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    /// NVIDIA's published example (one partition as `fmpm -l` prints it), inside the
    /// envelope `listPartitions` writes around every list.
    #[test]
    fn nvidias_published_partition_reads() {
        let partition = fixture("fmpm-l-nvidia-example-partition.json");
        let text = format!(
            "{{\n   \"maxNumPartitions\" : 15,\n   \"numPartitions\" : 1,\n   \"partitionInfo\" : [\n{partition}\n   ],\n   \"version\" : 16909068\n}}\n"
        );
        let s = parse(&text, "fmpm-l.json").unwrap();
        assert_eq!(s.partitions.len(), 1);
        let p = &s.partitions[0];
        assert_eq!((p.id, p.active), (13, true));
        assert_eq!(p.gpus[0].module_id, 7);
        // FM in a service VM: no host address.
        assert_eq!(p.gpus[0].bdf, None);
        assert_eq!((p.gpus[0].nvlinks_available, p.gpus[0].nvlinks_max), (0, 0));
    }

    #[test]
    fn the_hgx_capture_reads_with_addresses() {
        let s = read(Path::new(&format!(
            "{}/../../tests/fixtures/fabric/fmpm-l-hgx-h100.json",
            env!("CARGO_MANIFEST_DIR")
        )))
        .unwrap();
        assert_eq!(s.partitions.len(), 15);
        let p1 = &s.partitions[1];
        assert_eq!(p1.module_list(), "1, 2, 3, 4");
        assert_eq!(p1.gpus[0].bdf, Some("0000:9d:00.0".parse().unwrap()));
        assert!(s.partitions[3].active);
        assert!(!s.partitions[0].active);
    }

    #[test]
    fn our_json_round_trips() {
        let s = read(Path::new(&format!(
            "{}/../../tests/fixtures/fabric/fmpm-l-hgx-h100.json",
            env!("CARGO_MANIFEST_DIR")
        )))
        .unwrap();
        let text = serde_json::to_string_pretty(&s).unwrap();
        assert_eq!(parse(&text, "x.json").unwrap(), s);
        // Written by hand: links and activity may be left out.
        let short = r#"{"fm_version": "580.159.04", "unsupported": [2], "partitions": [
            {"id": 3, "gpus": [{"module_id": 1, "bdf": "0000:9d:00.0"}, {"module_id": 3}]}]}"#;
        let s = parse(short, "fm.json").unwrap();
        assert_eq!(s.fm_version.as_deref(), Some("580.159.04"));
        assert_eq!(
            (s.partitions[0].active, s.partitions[0].gpus[1].bdf),
            (false, None)
        );
        let typo = r#"{"partitions": [{"id": 3, "gpus": [], "actve": true}]}"#;
        let e = parse(typo, "fm.json").unwrap_err().to_string();
        assert!(e.contains("actve"), "{e}");
    }

    #[test]
    fn errors_name_the_file_line_and_fix() {
        let e = parse("{\n  \"partitionInfo\": [\n", "fm.json")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("fm.json:3:"), "{e}");
        let cut = "{\n\"numPartitions\" : 2,\n\"partitionInfo\" : []\n}";
        let e = parse(cut, "fm.json").unwrap_err().to_string();
        assert!(
            e.starts_with("fm.json:2:1:") && e.contains("cut short"),
            "{e}"
        );
        let bad = "{\"partitionInfo\" : [\n{\"partitionId\" : 4, \"isActive\" : 0, \"numGpus\" : 2, \"gpuInfo\" : [\n{\"physicalId\" : 1, \"pciBusId\" : \"00000000:3B:00.0\", \"numNvLinksAvailable\" : 18, \"maxNumNvLinks\" : 18}]}]}";
        let e = parse(bad, "fm.json").unwrap_err().to_string();
        assert!(
            e.starts_with("fm.json:2:1:") && e.contains("numGpus says 2"),
            "{e}"
        );
        let e = parse("Failed to connect to Fabric Manager instance.\n", "fm.txt")
            .unwrap_err()
            .to_string();
        assert!(e.contains("capture `fmpm -l` again"), "{e}");
        let e = parse("{\"version\": 1}", "fm.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("neither"), "{e}");
        let twice = "{\"partitions\": [\n{\"id\": 1, \"gpus\": [], \"active\": false},\n{\"id\": 1, \"gpus\": [], \"active\": false}]}";
        let e = parse(twice, "fm.json").unwrap_err().to_string();
        assert!(e.starts_with("fm.json:3:1:") && e.contains("twice"), "{e}");
    }

    #[test]
    fn a_fifo_or_huge_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("fm-capture-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.json");
        std::fs::write(&big, vec![b' '; (MAX_CAPTURE_BYTES + 1) as usize]).unwrap();
        let e = read(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = read(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
