//! Which GPUs are NVLink peers: from NVSwitches on the host's PCI tree, or from
//! `nvidia-smi` text captured on the host before its GPUs went to vfio-pci.
//!
//! NVLink peers do P2P without the clique capability (the driver prefers NVLink and,
//! on NVSwitch boards, refuses PCIe fallback), so the planner needs to know them.
//!
//! # Accepted `--nvlink` text
//! One or more files, read together, holding:
//! * the matrix of `nvidia-smi topo -m`: a header line naming `GPU0 GPU1 …` (NIC and
//!   affinity columns are ignored) and one row per GPU (`GPU<i>` then a cell per column);
//!   `NV<n>` cells are NVLink with `n` bonded links, every other cell is PCIe;
//! * the GPU index → PCI address map, either as the output of
//!   `nvidia-smi --query-gpu=index,pci.bus_id --format=csv[,noheader]` (lines `0, 00000000:18:00.0`),
//!   or as the Bus-Id column of plain `nvidia-smi` (lines `|   0  NVIDIA H100 …  | 00000000:18:00.0 Off |`).
//!
//! Both are needed: GPU indices depend on the driver, so they are never guessed from BDF order.

use std::collections::BTreeMap;

use pci_config::Bdf;

use crate::model::Topology;

/// Bonded NVLinks between two GPUs of an NVSwitch board, by PCI device ID (SXM parts).
const LINKS_BY_DEVICE: &[(u16, u8, &str)] = &[
    (0x20b0, 12, "A100-SXM4-40GB"),
    (0x20b2, 12, "A100-SXM4-80GB"),
    (0x20b5, 12, "A100-SXM4-80GB"),
    (0x2324, 8, "H800-SXM5"),
    (0x2330, 18, "H100-SXM5-80GB"),
    (0x2335, 18, "H200-SXM-141GB"),
];

/// NVLink count per GPU pair of an NVSwitch board for GPU device `device`, if known.
pub fn nvswitch_links(device: u16) -> Option<u8> {
    LINKS_BY_DEVICE
        .iter()
        .find(|(d, _, _)| *d == device)
        .map(|(_, n, _)| *n)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvlinkError {
    #[error("{source_name}: no `nvidia-smi topo -m` matrix found (a header line `GPU0 GPU1 …` and rows `GPU<i> …`); capture it with `nvidia-smi topo -m > FILE` while the nvidia driver is bound")]
    NoMatrix { source_name: String },
    #[error("{source_name}: no GPU index → PCI address map found; add the output of `nvidia-smi --query-gpu=index,pci.bus_id --format=csv` (same file or another --nvlink file)")]
    NoBusIds { source_name: String },
    #[error("{source_name}: line {line}: {message}")]
    Syntax {
        source_name: String,
        line: usize,
        message: String,
    },
    #[error("{source_name}: GPU{index} appears in the topo matrix but not in the index → PCI address map")]
    UnmappedIndex { source_name: String, index: usize },
    #[error("{source_name}: names GPU {bdf}, which is not a GPU on this host; was the file captured on another machine?")]
    NotOnHost { source_name: String, bdf: Bdf },
}

/// NVLink pairs read from `nvidia-smi` text, by PCI address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvlinkMap {
    pub links: Vec<(Bdf, Bdf, u8)>,
}

/// Strips terminal escape sequences (`nvidia-smi` underlines the header on a tty).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `00000000:18:00.0` (nvidia-smi's 8-digit domain) or `0000:18:00.0` → [`Bdf`].
fn parse_bus_id(text: &str) -> Option<Bdf> {
    let t = text.trim();
    let (domain, rest) = t.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let domain = u16::try_from(domain).ok()?;
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
        .parse()
        .ok()
}

fn gpu_index(token: &str) -> Option<usize> {
    token.strip_prefix("GPU")?.parse().ok()
}

/// Parses the matrix and the index map out of `text` (`source_name` names it in errors).
pub fn parse_nvidia_smi(text: &str, source_name: &str) -> Result<NvlinkMap, NvlinkError> {
    let lines: Vec<String> = text.lines().map(strip_ansi).collect();
    let syntax = |line: usize, message: String| NvlinkError::Syntax {
        source_name: source_name.to_string(),
        line: line + 1,
        message,
    };
    // Matrix header: first line whose first token is GPU0.
    let (header_at, columns) = lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| {
            let toks: Vec<&str> = l.split_whitespace().collect();
            (toks.first() == Some(&"GPU0")).then(|| {
                let cols: Vec<Option<usize>> = toks
                    .iter()
                    .take_while(|t| t.starts_with("GPU") || t.starts_with("NIC"))
                    .map(|t| gpu_index(t))
                    .collect();
                (i, cols)
            })
        })
        .ok_or_else(|| NvlinkError::NoMatrix {
            source_name: source_name.to_string(),
        })?;
    let mut cells: BTreeMap<(usize, usize), u8> = BTreeMap::new();
    let mut rows = 0;
    for (i, l) in lines.iter().enumerate().skip(header_at + 1) {
        let toks: Vec<&str> = l.split_whitespace().collect();
        let Some(row) = toks.first().and_then(|t| gpu_index(t)) else {
            if toks.first().is_some_and(|t| t.starts_with("NIC")) || toks.is_empty() {
                continue;
            }
            break;
        };
        if toks.len() < columns.len() + 1 {
            return Err(syntax(
                i,
                format!(
                    "row GPU{row} has {} cells, the header has {} columns",
                    toks.len() - 1,
                    columns.len()
                ),
            ));
        }
        rows += 1;
        for (col, cell) in columns.iter().zip(&toks[1..]) {
            let Some(col) = col else { continue };
            if let Some(n) = cell.strip_prefix("NV") {
                let n: u8 = n
                    .parse()
                    .map_err(|_| syntax(i, format!("cell '{cell}' is not NV<count>")))?;
                cells.insert((row.min(*col), row.max(*col)), n);
            }
        }
    }
    if rows == 0 {
        return Err(NvlinkError::NoMatrix {
            source_name: source_name.to_string(),
        });
    }
    let ids = parse_index_map(&lines);
    if ids.is_empty() {
        return Err(NvlinkError::NoBusIds {
            source_name: source_name.to_string(),
        });
    }
    let bdf_of = |index: usize| {
        ids.get(&index)
            .copied()
            .ok_or_else(|| NvlinkError::UnmappedIndex {
                source_name: source_name.to_string(),
                index,
            })
    };
    let mut map = NvlinkMap::default();
    for ((a, b), n) in cells {
        map.links.push((bdf_of(a)?, bdf_of(b)?, n));
    }
    Ok(map)
}

/// GPU index → BDF from `--query-gpu=index,pci.bus_id` CSV or the `nvidia-smi` table.
fn parse_index_map(lines: &[String]) -> BTreeMap<usize, Bdf> {
    let mut ids = BTreeMap::new();
    // CSV: the header (if any) gives the column order; default index, pci.bus_id.
    let mut order = (0usize, 1usize);
    for l in lines {
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        if fields.len() >= 2 {
            if let (Some(i), Some(b)) = (
                fields.iter().position(|f| *f == "index"),
                fields.iter().position(|f| *f == "pci.bus_id"),
            ) {
                order = (i, b);
                continue;
            }
            if let (Some(index), Some(bdf)) = (
                fields.get(order.0).and_then(|f| f.parse::<usize>().ok()),
                fields.get(order.1).and_then(|f| parse_bus_id(f)),
            ) {
                ids.insert(index, bdf);
                continue;
            }
        }
        // nvidia-smi table: "|   0  NVIDIA H100 80GB HBM3   On  |   00000000:18:00.0 Off |  0 |"
        let parts: Vec<&str> = l.split('|').map(str::trim).collect();
        if parts.len() >= 3 && parts[0].is_empty() {
            let index = parts[1]
                .split_whitespace()
                .next()
                .and_then(|t| t.parse::<usize>().ok());
            let bdf = parts[2].split_whitespace().next().and_then(parse_bus_id);
            if let (Some(index), Some(bdf)) = (index, bdf) {
                ids.insert(index, bdf);
            }
        }
    }
    ids
}

/// Records `map` into `topo`, checking that every GPU it names is on this host.
pub fn apply(topo: &mut Topology, map: &NvlinkMap, source_name: &str) -> Result<(), NvlinkError> {
    for &(a, b, n) in &map.links {
        for bdf in [a, b] {
            if !topo.device(&bdf).is_some_and(|d| d.is_gpu()) {
                return Err(NvlinkError::NotOnHost {
                    source_name: source_name.to_string(),
                    bdf,
                });
            }
        }
        topo.set_nvlink(a, b, n);
    }
    Ok(())
}

/// With NVSwitches on the PCI tree, all NVIDIA GPUs of known SXM parts are NVLink peers
/// (one board-wide fabric). Records them and returns warnings for GPUs it cannot place.
pub fn apply_nvswitch_fabric(topo: &mut Topology) -> Vec<String> {
    if topo.nvswitches().next().is_none() {
        return vec![];
    }
    let mut warnings = Vec::new();
    let mut known = Vec::new();
    for g in topo.gpus().filter(|d| d.is_nvidia_gpu()) {
        match nvswitch_links(g.device) {
            Some(n) => known.push((g.bdf, n)),
            None => warnings.push(format!(
                "{}: NVSwitches are present but the NVLink count of GPU device {:#06x} is unknown; \
                 not treated as an NVLink peer (pass --nvlink with `nvidia-smi topo -m` output)",
                g.bdf, g.device
            )),
        }
    }
    for (i, (a, n)) in known.iter().enumerate() {
        for (b, m) in &known[i + 1..] {
            topo.set_nvlink(*a, *b, (*n).min(*m));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth;

    const TOPO_M: &str = "\
\u{1b}[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\u{1b}[0m
GPU0\t X \tNV18\tPXB\tSYS\tPIX\t0-55,112-167\t0\t\tN/A
GPU1\tNV18\t X \tSYS\tSYS\tSYS\t0-55,112-167\t0\t\tN/A
GPU2\tPXB\tSYS\t X \tNV4\tSYS\t56-111\t1\t\tN/A
GPU3\tSYS\tSYS\tNV4\t X \tSYS\t56-111\t1\t\tN/A
NIC0\tPIX\tSYS\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
";

    const QUERY_CSV: &str = "\
index, pci.bus_id
0, 00000000:18:00.0
1, 00000000:2A:00.0
2, 00000000:9A:00.0
3, 00000000:AB:00.0
";

    const SMI_TABLE: &str = "\
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
| N/A   33C    P0             71W /  700W |       1MiB /  81559MiB |      0%      Default |
|   1  NVIDIA H100 80GB HBM3          On  |   00000000:2A:00.0 Off |                    0 |
|   2  NVIDIA H100 80GB HBM3          On  |   00000000:9A:00.0 Off |                    0 |
|   3  NVIDIA H100 80GB HBM3          On  |   00000000:AB:00.0 Off |                    0 |
";

    fn bdf(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    #[test]
    fn matrix_with_query_csv() {
        let text = format!("{TOPO_M}\n{QUERY_CSV}");
        let m = parse_nvidia_smi(&text, "t").unwrap();
        assert_eq!(
            m.links,
            [
                (bdf("0000:18:00.0"), bdf("0000:2a:00.0"), 18),
                (bdf("0000:9a:00.0"), bdf("0000:ab:00.0"), 4)
            ]
        );
    }

    #[test]
    fn matrix_with_bus_id_table_and_noheader_csv() {
        let a = parse_nvidia_smi(&format!("{SMI_TABLE}{TOPO_M}"), "t").unwrap();
        let noheader: String = QUERY_CSV
            .lines()
            .skip(1)
            .map(|l| format!("{l}\n"))
            .collect();
        let b = parse_nvidia_smi(&format!("{TOPO_M}{noheader}"), "t").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.links.len(), 2);
    }

    #[test]
    fn errors_name_the_file_and_the_fix() {
        let e = parse_nvidia_smi(TOPO_M, "topo.txt").unwrap_err();
        assert!(matches!(e, NvlinkError::NoBusIds { .. }));
        assert!(e.to_string().contains("--query-gpu=index,pci.bus_id"));
        let e = parse_nvidia_smi(QUERY_CSV, "ids.csv").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("ids.csv: no `nvidia-smi topo -m` matrix"));
        let partial: String = QUERY_CSV
            .lines()
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse_nvidia_smi(&format!("{TOPO_M}{partial}"), "t").unwrap_err();
        assert!(
            matches!(e, NvlinkError::UnmappedIndex { index: 2, .. }),
            "{e}"
        );
        let bad = TOPO_M.replace("NV4\t X", "NVx\t X");
        let e = parse_nvidia_smi(&format!("{bad}{QUERY_CSV}"), "t").unwrap_err();
        assert!(matches!(e, NvlinkError::Syntax { .. }), "{e}");
    }

    /// Captured on the 2 × H200 VM (`nvidia-smi topo -m` then `--query-gpu` CSV, tty escapes kept).
    #[test]
    fn real_h200_capture() {
        let text = include_str!("../../../tests/fixtures/nvidia-smi/h200x2-topo-m.txt");
        let m = parse_nvidia_smi(text, "h200x2-topo-m.txt").unwrap();
        assert_eq!(m.links, [(bdf("0000:00:06.0"), bdf("0000:00:07.0"), 18)]);
        let mut topo = Topology::from_record(&synth::example("flat-vm").unwrap());
        apply(&mut topo, &m, "h200x2-topo-m.txt").unwrap();
        assert_eq!(
            topo.path(&bdf("0000:00:06.0"), &bdf("0000:00:07.0"))
                .label(),
            "NV18"
        );
    }

    #[test]
    fn nvswitch_board_makes_all_h100_peers() {
        let mut topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let warnings = apply_nvswitch_fabric(&mut topo);
        assert!(warnings.is_empty());
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        assert_eq!(topo.nvlinks.len(), 8 * 7 / 2);
        assert_eq!(topo.path(&gpus[0], &gpus[7]).label(), "NV18");
    }

    #[test]
    fn unknown_gpu_on_nvswitch_board_is_said() {
        let mut host = synth::example("hgx-h100").unwrap();
        for d in host.devices.iter_mut().filter(|d| d.device == 0x2330) {
            d.device = 0x9999;
        }
        let mut topo = Topology::from_record(&host);
        let warnings = apply_nvswitch_fabric(&mut topo);
        assert_eq!(warnings.len(), 8);
        assert!(warnings[0].contains("0x9999"));
        assert!(topo.nvlinks.is_empty());
    }

    #[test]
    fn apply_rejects_foreign_gpus() {
        let mut topo = Topology::from_record(&synth::example("dual-socket-pcie").unwrap());
        let m = parse_nvidia_smi(&format!("{TOPO_M}{QUERY_CSV}"), "t").unwrap();
        let e = apply(&mut topo, &m, "t").unwrap_err();
        assert!(e.to_string().contains("captured on another machine"), "{e}");
    }
}
