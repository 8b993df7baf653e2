//! `place`'s output: the table with its notes, and the `vm.yaml` of each placed VM
//! (`--write-configs`), from `decide::place_plan`.

use std::fmt::Write as _;

use pci_config::PathKind;
use vfio_p2p_decide::nic_affinity::NicChoice;
use vfio_p2p_decide::place_plan::{PlaceReport, VmPlacePlan};
use vfio_p2p_decide::placement::request::WorstPath;

fn numa_text(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        return "unknown".into();
    }
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The `vm.yaml` of a placed VM, in `gen`'s schema (`config::vm`).
pub fn vm_config_text(vm: &VmPlacePlan, p2p_level: PathKind) -> String {
    let mut t = format!(
        "# Written by `vfio-p2p place`: worst GPU path {}, NUMA node(s) {}.\n",
        vm.vm.worst_path,
        numa_text(&vm.vm.numa_nodes)
    );
    let no_clique = match vm.vm.worst_path {
        WorstPath::NvLink(_) => "no clique (NVLink)",
        _ => "no clique",
    };
    if let Some(id) = vm.fm_partition {
        t += &format!("# Fabric Manager partition {id}: activate it before the VM starts.\n");
    }
    t += &format!("name: {}\ngpus:\n", vm.vm.name);
    for g in &vm.vm.gpus {
        let clique = vm.cliques.get(g).copied().flatten();
        t += &match clique {
            Some(c) => format!("  - {g}  # clique {c}\n"),
            None => format!("  - {g}  # {no_clique}\n"),
        };
    }
    let nics: Vec<&NicChoice> = vm.nics.iter().filter(|c| c.nic.is_some()).collect();
    if !nics.is_empty() {
        t += "nics:\n";
        for c in nics {
            let (nic, path) = (c.nic.unwrap_or(c.gpu), c.path.unwrap_or(PathKind::X));
            t += &format!("  - {nic}  # {path} to {}\n", c.gpu);
        }
    }
    t += &format!("p2p_level: {}\n", p2p_level.label().to_ascii_lowercase());
    t
}

/// The placed VMs' table (none when nothing was placed: the reasons below say it all).
fn vm_table(r: &PlaceReport) -> String {
    let fm = r.vms.iter().any(|vm| vm.fm_partition.is_some());
    let mut header = vec![
        "VM",
        "GPUs",
        "worst path",
        "NUMA",
        "IOMMU groups",
        "cliques",
    ];
    if fm {
        header.push("FM partition");
    }
    let mut t = vfio_p2p_style::table(header);
    for vm in &r.vms {
        let cliques: Vec<String> = vm
            .vm
            .gpus
            .iter()
            .map(|g| {
                vm.cliques
                    .get(g)
                    .copied()
                    .flatten()
                    .map_or("-".into(), |c| c.to_string())
            })
            .collect();
        let mut row = vec![
            vm.vm.name.clone(),
            vm.vm
                .gpus
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            format!("{} (PCIe {})", vm.vm.worst_path, vm.vm.worst_pcie_path),
            numa_text(&vm.vm.numa_nodes),
            vm.vm.iommu_groups.len().to_string(),
            cliques.join(" "),
        ];
        if fm {
            row.push(vm.fm_partition.map_or("-".into(), |p| p.to_string()));
        }
        t.add_row(row);
    }
    match r.vms.is_empty() {
        true => String::new(),
        false => format!("{t}\n"),
    }
}

/// The notes after the table: plan warnings, NIC choices, unplaced VMs and what would fit,
/// free GPUs, files written.
fn notes(r: &PlaceReport) -> String {
    let width = vfio_p2p_style::output_width();
    let wrap = |line: String| vfio_p2p_style::wrap(&line, width);
    let mut out = String::new();
    for vm in &r.vms {
        if let Some(e) = &vm.plan_error {
            out += &wrap(format!("warning: {}: no clique plan: {e}", vm.vm.name));
        }
        for w in &vm.warnings {
            out += &wrap(format!("warning: {}: {w}", vm.vm.name));
        }
    }
    for vm in &r.vms {
        for c in &vm.nics {
            out += &wrap(format!("{}: {c}", vm.vm.name));
        }
    }
    for u in &r.unplaced {
        let mut line = format!("{} ({} GPUs): not placed: {}", u.name, u.gpus, u.reason);
        if let Some(w) = u.best_worst_path {
            line += &format!("; accepting worst path {w} would place it (--max-path)");
        }
        line += &format!("; the most it could get now is {} GPUs", u.largest_fit);
        out += &wrap(line);
    }
    if let Some(s) = &r.largest_shape {
        let _ = writeln!(out, "largest shape that fits: {s}");
    }
    let free: Vec<String> = r.free.iter().map(|b| b.to_string()).collect();
    let free = match free.is_empty() {
        true => "none".to_string(),
        false => free.join(" "),
    };
    let _ = writeln!(out, "free GPUs: {free}");
    for p in &r.configs_written {
        let _ = writeln!(out, "wrote {}", p.display());
    }
    out
}

/// `place`'s table and notes.
pub fn render_table(r: &PlaceReport) -> String {
    vm_table(r) + &notes(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_decide::place_plan::{place, PlaceRequest};
    use vfio_p2p_decide::placement;
    use vfio_p2p_decide::placement::host::PlacementHost;
    use vfio_p2p_decide::placement::request::PlacementOptions;
    use vfio_p2p_model::Topology;

    fn report(shape: (usize, usize)) -> PlaceReport {
        let topo =
            Topology::from_record(&vfio_p2p_read::synth::example("dual-socket-pcie").unwrap());
        let options = PlacementOptions::default();
        let host = PlacementHost::new(&topo, &options).unwrap();
        let requests = placement::shape(shape.0, shape.1);
        let ask = PlaceRequest {
            requests: &requests,
            shape: Some(shape),
            options: &options,
            p2p_level: PathKind::Phb,
            with_nics: false,
        };
        place(&topo, &host, None, &ask)
    }

    #[test]
    fn a_placed_vm_yaml_names_its_gpus_cliques_and_level() {
        let r = report((2, 4));
        let text = vm_config_text(&r.vms[0], PathKind::Phb);
        assert!(
            text.starts_with("# Written by `vfio-p2p place`: worst GPU path"),
            "{text}"
        );
        assert!(
            text.contains("name: vm0\ngpus:\n  - 0000:05:00.0  # clique "),
            "{text}"
        );
        assert!(text.ends_with("p2p_level: phb\n"), "{text}");
        // what vm.yaml's reader takes: four GPUs, the level
        assert_eq!(text.matches("\n  - 0000:").count(), 4);
    }

    #[test]
    fn nothing_placed_prints_no_table_and_says_what_fits() {
        let r = report((3, 4));
        assert_eq!(r.vms.len(), 2);
        let text = render_table(&r);
        assert!(text.contains("vm2 (4 GPUs): not placed:"), "{text}");
        assert!(text.contains("largest shape that fits: 2x4"), "{text}");
        let none = report((1, 9));
        let text = render_table(&none);
        assert!(!text.contains("worst path"), "a table of no rows: {text}");
        assert!(text.ends_with("free GPUs: 0000:05:00.0 0000:06:00.0 0000:09:00.0 0000:0a:00.0 0000:85:00.0 0000:86:00.0 0000:89:00.0 0000:8a:00.0\n"), "{text}");
    }
}
