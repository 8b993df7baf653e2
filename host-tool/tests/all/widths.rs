//! Output fits the width it is given (issue 29): the `topo` matrix, stacked into blocks
//! when its columns cannot stand side by side, never cut; `--help` wrapped to the terminal.

use std::collections::BTreeMap;

fn vfio_p2p(columns: usize, args: &[&str]) -> String {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", columns.to_string())
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The matrix's cells as (row, column) → label, read back from its blocks.
fn matrix_cells(text: &str) -> BTreeMap<(String, String), String> {
    let matrix = text.split("\nLegend:").next().unwrap();
    let mut cells = BTreeMap::new();
    for block in matrix.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let header: Vec<&str> = lines
            .next()
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect();
        for line in lines {
            let mut tokens = line.split_whitespace();
            let row = tokens.next().unwrap().to_string();
            for (column, value) in header.iter().zip(tokens) {
                let old = cells.insert((row.clone(), column.to_string()), value.to_string());
                assert!(old.is_none(), "{row}/{column} twice:\n{text}");
            }
        }
    }
    cells
}

#[test]
fn the_topo_matrix_fits_80_and_120_columns_and_keeps_every_label() {
    let wide = vfio_p2p(300, &["--example", "hgx-h100", "topo"]);
    let all = matrix_cells(&wide);
    // 16 rows × 16 columns of labels, and two affinities for each of the 8 GPUs
    assert_eq!(all.len(), 16 * 16 + 8 * 2, "{wide}");
    for columns in [80, 120] {
        let text = vfio_p2p(columns, &["--example", "hgx-h100", "topo"]);
        let matrix = text.split("\nLegend:").next().unwrap();
        let widest = matrix.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= columns, "{widest} > {columns}:\n{matrix}");
        assert_eq!(matrix_cells(&text), all, "{columns} columns:\n{matrix}");
        let legend = text.split("\nLegend:").nth(1).unwrap();
        let legend = legend.split("\nNIC Legend:").next().unwrap();
        assert!(
            legend.lines().all(|l| l.chars().count() <= columns),
            "{legend}"
        );
    }
}

#[test]
fn help_is_wrapped_to_the_terminal() {
    for columns in [80usize, 90] {
        for args in [&["--help"][..], &["gen", "--help"], &["check", "--help"]] {
            let text = vfio_p2p(columns, args);
            let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
            assert!(widest <= columns, "{args:?} at {columns}: {widest}\n{text}");
        }
    }
}
