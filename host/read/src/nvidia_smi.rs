//! `nvidia-smi` text captured on the host before its GPUs went to vfio-pci (`--nvlink FILE`,
//! host.yaml `nvlink: {source: nvidia-smi, file: …}`): which GPUs are NVLink peers.
//!
//! # Accepted text
//! One or more files, read together, holding:
//! * the matrix of `nvidia-smi topo -m`: a header line naming `GPU0 GPU1 …` (NIC and
//!   affinity columns are ignored) and one row per GPU (`GPU<i>` then a cell per column);
//!   `NV<n>` cells are NVLink with `n` bonded links, every other cell is PCIe. The matrix
//!   must be symmetric in its NVLink cells;
//! * the GPU index → PCI address map, either as the output of
//!   `nvidia-smi --query-gpu=index,pci.bus_id --format=csv[,noheader]` (lines `0, 00000000:18:00.0`),
//!   or as the Bus-Id column of plain `nvidia-smi` (lines `|   0  NVIDIA H100 …  | 00000000:18:00.0 Off |`).
//!   The same index may appear more than once only with the same address, and no two
//!   indices may share an address.
//!
//! Both are needed: GPU indices depend on the driver, so they are never guessed from BDF order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pci_config::Bdf;

use vfio_p2p_files::{read_input_file, InputFileError};
use vfio_p2p_model::NvlinkMap;

/// The most a capture may hold; `nvidia-smi topo -m` of a 64-GPU host is about 40 KiB.
pub const MAX_CAPTURE_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum NvidiaSmiError {
    /// Missing, not a regular file (a FIFO never blocks), or over [`MAX_CAPTURE_BYTES`].
    #[error(transparent)]
    Input(#[from] InputFileError),
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
    #[error("{source_name}: the topo matrix is not symmetric: {cells}; capture it again with `nvidia-smi topo -m`")]
    Asymmetric { source_name: String, cells: String },
    #[error("{source_name}: GPU{index} appears in the topo matrix but not in the index → PCI address map")]
    UnmappedIndex { source_name: String, index: usize },
    #[error("{source_name}: GPU index {index} is mapped twice, to {first} and to {second}; keep the map of one capture")]
    DuplicateIndex {
        source_name: String,
        index: usize,
        first: Bdf,
        second: Bdf,
    },
    #[error("{source_name}: GPU{first} and GPU{second} are both mapped to {bdf}; each GPU has its own address, so the map is from different captures")]
    SharedAddress {
        source_name: String,
        bdf: Bdf,
        first: usize,
        second: usize,
    },
}

/// Reads `files` together (each at most [`MAX_CAPTURE_BYTES`], regular files only).
pub fn read_captures(files: &[PathBuf]) -> Result<NvlinkMap, NvidiaSmiError> {
    let mut text = String::new();
    for f in files {
        text += &read_capture(f)?;
        text.push('\n');
    }
    let names = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    parse(&text, &names)
}

fn read_capture(path: &Path) -> Result<String, NvidiaSmiError> {
    let bytes = read_input_file(path, MAX_CAPTURE_BYTES, "nvidia-smi capture")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
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
    text.trim().parse().ok()
}

fn gpu_index(token: &str) -> Option<usize> {
    token.strip_prefix("GPU")?.parse().ok()
}

/// One matrix cell between two GPUs: the NVLink count, `None` for a PCIe label.
type Cells = BTreeMap<(usize, usize), Option<u8>>;

/// Parses the matrix and the index map out of `text` (`source_name` names it in errors).
pub fn parse(text: &str, source_name: &str) -> Result<NvlinkMap, NvidiaSmiError> {
    let lines: Vec<String> = text.lines().map(strip_ansi).collect();
    let cells = parse_matrix(&lines, source_name)?;
    check_symmetric(&cells, source_name)?;
    let ids = parse_index_map(&lines, source_name)?;
    if ids.is_empty() {
        return Err(NvidiaSmiError::NoBusIds {
            source_name: source_name.to_string(),
        });
    }
    let bdf_of = |index: usize| {
        ids.get(&index)
            .copied()
            .ok_or_else(|| NvidiaSmiError::UnmappedIndex {
                source_name: source_name.to_string(),
                index,
            })
    };
    let mut map = NvlinkMap {
        source_name: source_name.to_string(),
        links: Vec::new(),
    };
    for (&(a, b), n) in &cells {
        if let (true, Some(n)) = (a < b, n) {
            map.links.push((bdf_of(a)?, bdf_of(b)?, *n));
        }
    }
    Ok(map)
}

/// The `topo -m` matrix: every GPU × GPU cell off the diagonal.
fn parse_matrix(lines: &[String], source_name: &str) -> Result<Cells, NvidiaSmiError> {
    let syntax = |line: usize, message: String| NvidiaSmiError::Syntax {
        source_name: source_name.to_string(),
        line: line + 1,
        message,
    };
    let no_matrix = || NvidiaSmiError::NoMatrix {
        source_name: source_name.to_string(),
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
        .ok_or_else(no_matrix)?;
    let mut cells = Cells::new();
    let mut rows_seen: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, l) in lines.iter().enumerate().skip(header_at + 1) {
        let toks: Vec<&str> = l.split_whitespace().collect();
        let Some(row) = toks.first().and_then(|t| gpu_index(t)) else {
            if toks.first().is_some_and(|t| t.starts_with("NIC")) || toks.is_empty() {
                continue;
            }
            break;
        };
        if let Some(first) = rows_seen.insert(row, i + 1) {
            return Err(syntax(
                i,
                format!("row GPU{row} appears twice (first on line {first})"),
            ));
        }
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
        for (col, cell) in columns.iter().zip(&toks[1..]) {
            let Some(col) = *col else { continue };
            if col == row {
                continue;
            }
            let links = match cell.strip_prefix("NV") {
                Some(n) => Some(
                    n.parse::<u8>()
                        .map_err(|_| syntax(i, format!("cell '{cell}' is not NV<count>")))?,
                ),
                None => None,
            };
            cells.insert((row, col), links);
        }
    }
    if rows_seen.is_empty() {
        return Err(no_matrix());
    }
    Ok(cells)
}

fn cell_text(links: Option<u8>) -> String {
    links.map_or_else(|| "not NVLink".to_string(), |n| format!("NV{n}"))
}

/// Row i, column j must say what row j, column i says (where both rows are given).
fn check_symmetric(cells: &Cells, source_name: &str) -> Result<(), NvidiaSmiError> {
    let odd: Vec<String> = cells
        .iter()
        .filter(|((a, b), _)| a < b)
        .filter_map(|(&(a, b), &ab)| {
            let ba = *cells.get(&(b, a))?;
            (ab != ba).then(|| {
                format!(
                    "GPU{a}/GPU{b} is {} but GPU{b}/GPU{a} is {}",
                    cell_text(ab),
                    cell_text(ba)
                )
            })
        })
        .collect();
    if odd.is_empty() {
        return Ok(());
    }
    let mut text = odd.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    if odd.len() > 4 {
        text.push_str(&format!(" and {} more", odd.len() - 4));
    }
    Err(NvidiaSmiError::Asymmetric {
        source_name: source_name.to_string(),
        cells: text,
    })
}

/// One GPU index → address line, from `--query-gpu` CSV (`order`: the index and bus-id
/// columns) or from the `nvidia-smi` table.
fn index_line(l: &str, order: &mut (usize, usize)) -> Option<(usize, Bdf)> {
    let fields: Vec<&str> = l.split(',').map(str::trim).collect();
    if fields.len() >= 2 {
        if let (Some(i), Some(b)) = (
            fields.iter().position(|f| *f == "index"),
            fields.iter().position(|f| *f == "pci.bus_id"),
        ) {
            *order = (i, b);
            return None;
        }
        if let (Some(index), Some(bdf)) = (
            fields.get(order.0).and_then(|f| f.parse::<usize>().ok()),
            fields.get(order.1).and_then(|f| parse_bus_id(f)),
        ) {
            return Some((index, bdf));
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
        return index.zip(bdf);
    }
    None
}

/// GPU index → BDF; an index given twice must name the same address, and no two
/// indices may share one.
fn parse_index_map(
    lines: &[String],
    source_name: &str,
) -> Result<BTreeMap<usize, Bdf>, NvidiaSmiError> {
    let mut ids: BTreeMap<usize, Bdf> = BTreeMap::new();
    let mut by_address: BTreeMap<Bdf, usize> = BTreeMap::new();
    // CSV: the header (if any) gives the column order; default index, pci.bus_id.
    let mut order = (0usize, 1usize);
    for l in lines {
        let Some((index, bdf)) = index_line(l, &mut order) else {
            continue;
        };
        match ids.insert(index, bdf) {
            Some(first) if first != bdf => {
                return Err(NvidiaSmiError::DuplicateIndex {
                    source_name: source_name.to_string(),
                    index,
                    first,
                    second: bdf,
                })
            }
            _ => {}
        }
        match by_address.insert(bdf, index) {
            Some(first) if first != index => {
                return Err(NvidiaSmiError::SharedAddress {
                    source_name: source_name.to_string(),
                    bdf,
                    first,
                    second: index,
                })
            }
            _ => {}
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let m = parse(&text, "t").unwrap();
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
        let a = parse(&format!("{SMI_TABLE}{TOPO_M}"), "t").unwrap();
        let noheader: String = QUERY_CSV
            .lines()
            .skip(1)
            .map(|l| format!("{l}\n"))
            .collect();
        let b = parse(&format!("{TOPO_M}{noheader}"), "t").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.links.len(), 2);
    }

    #[test]
    fn errors_name_the_file_and_the_fix() {
        let e = parse(TOPO_M, "topo.txt").unwrap_err();
        assert!(matches!(e, NvidiaSmiError::NoBusIds { .. }));
        assert!(e.to_string().contains("--query-gpu=index,pci.bus_id"));
        let e = parse(QUERY_CSV, "ids.csv").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("ids.csv: no `nvidia-smi topo -m` matrix"));
        let partial: String = QUERY_CSV
            .lines()
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse(&format!("{TOPO_M}{partial}"), "t").unwrap_err();
        assert!(
            matches!(e, NvidiaSmiError::UnmappedIndex { index: 2, .. }),
            "{e}"
        );
        let bad = TOPO_M.replace("NV4\t X", "NVx\t X");
        let e = parse(&format!("{bad}{QUERY_CSV}"), "t").unwrap_err();
        assert!(matches!(e, NvidiaSmiError::Syntax { .. }), "{e}");
    }

    /// Captured on the 2 × H200 VM (`nvidia-smi topo -m` then `--query-gpu` CSV, tty escapes kept).
    #[test]
    fn real_h200_capture() {
        let text = include_str!("../../../tests/fixtures/nvidia-smi/h200x2-topo-m.txt");
        let m = parse(text, "h200x2-topo-m.txt").unwrap();
        assert_eq!(m.links, [(bdf("0000:00:06.0"), bdf("0000:00:07.0"), 18)]);
    }

    #[test]
    fn an_asymmetric_matrix_names_the_cells() {
        let bad = TOPO_M.replace("GPU1\tNV18\t X", "GPU1\tSYS\t X");
        let e = parse(&format!("{bad}{QUERY_CSV}"), "topo.txt").unwrap_err();
        assert_eq!(
            e.to_string(),
            "topo.txt: the topo matrix is not symmetric: GPU0/GPU1 is NV18 but GPU1/GPU0 is not NVLink; \
             capture it again with `nvidia-smi topo -m`"
        );
        let bad = TOPO_M.replace("GPU3\tSYS\tSYS\tNV4", "GPU3\tSYS\tSYS\tNV6");
        let e = parse(&format!("{bad}{QUERY_CSV}"), "t").unwrap_err();
        assert!(
            e.to_string()
                .contains("GPU2/GPU3 is NV4 but GPU3/GPU2 is NV6"),
            "{e}"
        );
    }

    #[test]
    fn two_indices_on_one_address_are_refused() {
        let csv = QUERY_CSV.replace("1, 00000000:2A:00.0", "1, 00000000:18:00.0");
        let e = parse(&format!("{TOPO_M}{csv}"), "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t: GPU0 and GPU1 are both mapped to 0000:18:00.0; each GPU has its own address, \
             so the map is from different captures"
        );
    }

    #[test]
    fn a_duplicated_index_is_called_duplicated() {
        let csv = QUERY_CSV.replace("1, 00000000:2A:00.0", "0, 00000000:2A:00.0");
        let e = parse(&format!("{TOPO_M}{csv}"), "t").unwrap_err();
        assert!(
            matches!(e, NvidiaSmiError::DuplicateIndex { index: 0, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("mapped twice"), "{e}");
        // The same map twice (a CSV and the plain table in one file) is fine.
        let both = parse(&format!("{TOPO_M}{QUERY_CSV}{SMI_TABLE}"), "t").unwrap();
        assert_eq!(both.links.len(), 2);
        // A matrix row twice is a syntax error, not a silent overwrite.
        let twice = TOPO_M.replace(
            "GPU3\tSYS",
            "GPU2\tPXB\tSYS\t X \tNV4\tSYS\t56-111\t1\t\tN/A\nGPU3\tSYS",
        );
        let e = parse(&format!("{twice}{QUERY_CSV}"), "t").unwrap_err();
        assert!(e.to_string().contains("row GPU2 appears twice"), "{e}");
    }

    #[test]
    fn captures_are_read_capped_and_from_regular_files_only() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("topo.txt");
        std::fs::write(&f, format!("{TOPO_M}{QUERY_CSV}")).unwrap();
        assert_eq!(
            read_captures(std::slice::from_ref(&f)).unwrap().links.len(),
            2
        );
        let big = std::fs::File::create(&f).unwrap();
        big.set_len(MAX_CAPTURE_BYTES + 1).unwrap();
        let e = read_captures(std::slice::from_ref(&f)).unwrap_err();
        assert!(
            matches!(e, NvidiaSmiError::Input(InputFileError::TooLarge { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("topo.txt"), "{e}");
        let e = read_captures(&[PathBuf::from("/dev/zero")]).unwrap_err();
        assert!(
            matches!(e, NvidiaSmiError::Input(InputFileError::NotAFile { .. })),
            "{e}"
        );
        // A FIFO with no writer: refused at once, not waited on.
        let fifo = t.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = read_captures(&[fifo]).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = read_captures(&[t.path().join("missing")]).unwrap_err();
        assert_eq!(e.to_string().matches("No such file").count(), 1, "{e}");
    }
}
