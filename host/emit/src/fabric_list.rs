//! Fabric Manager's partitions as tables: `vfio-p2p fabric list` (with who holds the active
//! ones) and `topo`'s fabric section.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use pci_config::Bdf;
use serde::Serialize;

use vfio_p2p_model::fabric::Fabric;
use vfio_p2p_model::fabric_state::FabricState;
use vfio_p2p_model::fabric_state::PartitionGpu;

/// Who holds an active partition, from vfio-p2p's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "by", content = "guest")]
pub enum Holder {
    /// Activated by this guest's prepare hook.
    Guest(String),
    /// Activated with `vfio-p2p fabric activate`.
    Operator,
}

/// One partition as listed.
#[derive(Debug, Clone, Serialize)]
pub struct ListedPartition {
    pub id: u32,
    pub active: bool,
    pub unsupported: bool,
    /// From vfio-p2p's record; None for an active partition someone else activated.
    pub held_by: Option<Holder>,
    pub gpus: Vec<PartitionGpu>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FabricListing {
    pub fm_address: String,
    pub partitions: Vec<ListedPartition>,
    pub nvlink_failed_gpus: Vec<Bdf>,
    /// Recorded active by vfio-p2p but not active in FM (FM restarted: `fabric resync`).
    pub recorded_not_active: Vec<u32>,
}

impl FabricListing {
    pub fn new(fm_address: &str, state: &FabricState, held: &BTreeMap<u32, Holder>) -> Self {
        let partitions: Vec<ListedPartition> = state
            .partitions
            .iter()
            .map(|p| ListedPartition {
                id: p.id,
                active: p.active,
                unsupported: state.unsupported.contains(&p.id),
                held_by: held.get(&p.id).cloned(),
                gpus: p.gpus.clone(),
            })
            .collect();
        let recorded_not_active = held
            .keys()
            .copied()
            .filter(|id| !partitions.iter().any(|p| p.id == *id && p.active))
            .collect();
        FabricListing {
            fm_address: fm_address.to_string(),
            partitions,
            nvlink_failed_gpus: state.nvlink_failed_gpus.clone(),
            recorded_not_active,
        }
    }
}

fn state_text(p: &ListedPartition) -> String {
    let base = match (p.unsupported, p.active) {
        (true, _) => "unsupported",
        (false, true) => "active",
        (false, false) => "inactive",
    };
    match (&p.held_by, p.active) {
        (Some(Holder::Guest(g)), true) => format!("{base} (guest {g})"),
        (Some(Holder::Operator), true) => format!("{base} (operator)"),
        (None, true) => format!("{base} (not by vfio-p2p)"),
        _ => base.to_string(),
    }
}

/// The table, then the notes an operator acts on.
pub fn table(l: &FabricListing) -> String {
    let mut t = vfio_p2p_style::table(vec![
        "partition",
        "GPUs",
        "module ids",
        "PCI addresses",
        "NVLinks",
        "state",
    ]);
    for p in &l.partitions {
        let modules: Vec<String> = p.gpus.iter().map(|g| g.module_id.to_string()).collect();
        let addrs: Vec<String> = p
            .gpus
            .iter()
            .map(|g| g.bdf.map_or_else(|| "-".into(), |b| b.to_string()))
            .collect();
        let links: Vec<String> = p
            .gpus
            .iter()
            .map(|g| format!("{}/{}", g.nvlinks_available, g.nvlinks_max))
            .collect();
        let mut links = links;
        links.dedup();
        t.add_row(vec![
            p.id.to_string(),
            p.gpus.len().to_string(),
            modules.join(", "),
            addrs.join(", "),
            links.join(", "),
            state_text(p),
        ]);
    }
    let mut out = format!("Fabric Manager at {}\n{t}\n", l.fm_address);
    if !l.nvlink_failed_gpus.is_empty() {
        let list: Vec<String> = l.nvlink_failed_gpus.iter().map(Bdf::to_string).collect();
        out.push_str(&format!(
            "warning: GPUs with failed NVLinks: {}\n",
            list.join(", ")
        ));
    }
    if !l.recorded_not_active.is_empty() {
        let list: Vec<String> = l.recorded_not_active.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "warning: partition {} recorded active by vfio-p2p but not active in Fabric Manager (restarted?): run `vfio-p2p fabric resync`\n",
            list.join(", ")
        ));
    }
    out
}

/// `topo`'s fabric section: each GPU's module id, then FM's partitions as a table.
pub fn topo_section(gpus: &[(usize, Bdf)], fabric: &Fabric) -> String {
    let Some(state) = &fabric.state else {
        return String::new();
    };
    let model = fabric.model.map_or("none", |m| m.name());
    let heading = format!(
        "Fabric Manager partitions ({}; fabric model {model}):",
        fabric.source
    );
    let width = vfio_p2p_style::output_width();
    let mut out = format!("\n{}\n\n", vfio_p2p_style::wrap(&heading, width).trim_end());
    let gpu_name = |b: &Bdf| {
        gpus.iter()
            .find(|(_, bdf)| bdf == b)
            .map_or(b.to_string(), |(index, _)| format!("GPU{index}"))
    };
    let mut modules = vfio_p2p_style::table(vec!["GPU", "PCI address", "module"]);
    for (index, bdf) in gpus {
        let id = state.module_id(bdf).map_or("-".into(), |m| m.to_string());
        modules.add_row([format!("GPU{index}"), bdf.to_string(), id]);
    }
    let _ = writeln!(out, "{modules}\n");
    let mut t = vfio_p2p_style::table(vec!["partition", "GPUs", "modules", "NVLinks/GPU", "state"]);
    for p in &state.partitions {
        let gpus = p
            .gpus
            .iter()
            .map(|g| g.bdf.as_ref().map_or("?".into(), gpu_name))
            .collect::<Vec<_>>()
            .join(" ");
        let links = p
            .gpus
            .iter()
            .map(|g| g.nvlinks_available)
            .min()
            .unwrap_or(0);
        let max = p.gpus.iter().map(|g| g.nvlinks_max).max().unwrap_or(0);
        let state_word = if state.unsupported.contains(&p.id) {
            "unsupported"
        } else if p.active {
            "active"
        } else {
            "free"
        };
        t.add_row([
            p.id.to_string(),
            gpus,
            p.module_list(),
            format!("{links}/{max}"),
            state_word.to_string(),
        ]);
    }
    let _ = writeln!(out, "{t}");
    out
}
