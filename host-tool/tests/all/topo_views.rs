//! `topo`'s tree at 80 columns and its Graphviz (issue 40): the PCIe tree was 84–119
//! wide, and hgx-h100's graph was a band of 28 NVLink labels without the NICs.

fn topo(columns: &str, args: &[&str]) -> String {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", columns)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_pcie_tree_fits_80_columns_and_keeps_every_field() {
    for example in ["hgx-h100", "dual-socket-pcie", "lab", "flat-vm"] {
        let narrow = topo("80", &["--example", example, "topo"]);
        let tree_of = |text: &str| {
            let start = text
                .find("host bridge, ")
                .map(|i| text[..i].rfind('\n').map_or(0, |n| n + 1));
            let tree = &text[start.unwrap_or(0)..];
            tree.split("\nFabric Manager partitions")
                .next()
                .unwrap()
                .to_string()
        };
        let tree = tree_of(&narrow);
        let widest = tree.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(widest <= 80, "{example}: {widest} columns:\n{tree}");
        // the same fields as at 300 columns, only wrapped
        let wide = tree_of(&topo("300", &["--example", example, "topo"]));
        let fields = |t: &str| -> Vec<String> {
            t.split(|c: char| c.is_whitespace() || "│├└─".contains(c))
                .filter(|w| !w.is_empty())
                .map(String::from)
                .collect()
        };
        assert_eq!(fields(&tree), fields(&wide), "{example}");
    }
}

#[test]
fn every_line_of_topo_fits_80_columns() {
    for example in ["hgx-h100", "dual-socket-pcie", "lab", "flat-vm"] {
        let text = topo("80", &["--example", example, "topo"]);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{example}: {line}");
        }
    }
}

#[test]
fn hgx_h100_draws_its_nvswitch_fabric_once_and_its_nics() {
    let dot = topo("80", &["--example", "hgx-h100", "topo", "--format", "dot"]);
    // one node for the fabric, an edge from each of the 8 GPUs, no label per pair
    assert_eq!(dot.matches("NVLink NV18").count(), 1, "{dot}");
    assert_eq!(dot.matches("-> \"nvlink0\"").count(), 8, "{dot}");
    assert!(!dot.contains("xlabel=\"NV18\""), "{dot}");
    let nics = dot.lines().filter(|l| l.contains("[label=\"NIC ")).count();
    assert_eq!(nics, 8, "{dot}");
    // a PCIe-only host keeps its labelled switch edges
    let lab = topo("80", &["--example", "lab", "topo", "--format", "dot"]);
    assert!(lab.contains("xlabel=\"PIX\""), "{lab}");
}
