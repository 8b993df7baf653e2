//! Compares a domain's cliques with the plan for its GPUs on this host: what the
//! hook warns about or denies.

use std::collections::BTreeMap;

use pci_config::clique::MAX_CLIQUE;
use pci_config::Bdf;

use super::domain::{DomainFacts, CLIQUE_PROPERTY};
use crate::config::host::HostConfig;
use crate::decide::plan::{plan, PlanOptions, Verdict};
use crate::model::Topology;

/// Hostdevs that would take a device the host keeps (`reserved` in host.yaml): the device
/// itself, or another member of its IOMMU group, since VFIO hands a group over whole.
/// Always fatal, whatever `hook_policy` says: starting would unbind a device the host uses.
pub fn reserved_findings(topo: &Topology, facts: &DomainFacts, reserved: &[Bdf]) -> Vec<String> {
    let mut out = Vec::new();
    for h in &facts.hostdevs {
        if reserved.contains(&h.bdf) {
            out.push(format!(
                "{} is reserved for the host (host.yaml `reserved:`); remove the hostdev or take it out of `reserved`",
                h.bdf
            ));
        } else if let Some(r) = topo
            .group_members(&h.bdf)
            .into_iter()
            .find(|m| reserved.contains(m))
        {
            out.push(format!(
                "{} shares its IOMMU group with {r}, which is reserved for the host (host.yaml `reserved:`) and would go to vfio-pci with it; use a device of another group",
                h.bdf
            ));
        }
    }
    out
}

/// Reads the hostdevs of `facts` on `topo` and says everything that breaks the host's
/// policy or will keep P2P from working in the guest, one sentence each (empty: all good).
pub fn findings(topo: &Topology, facts: &DomainFacts, host: &HostConfig) -> Vec<String> {
    let p2p_level = host.p2p_level;
    let mut out = Vec::new();
    let mut gpus: BTreeMap<Bdf, Option<&str>> = BTreeMap::new();
    for h in &facts.hostdevs {
        match topo.device(&h.bdf) {
            None => out.push(format!(
                "hostdev {} is not a PCI device on this host",
                h.bdf
            )),
            Some(d) if d.is_nvidia_gpu() => {
                gpus.insert(h.bdf, h.alias.as_deref());
            }
            Some(_) => {}
        }
    }
    if gpus.is_empty() {
        return out;
    }
    if let Some(why) = &facts.hidden_hypervisor {
        out.push(format!(
            "{why}: the hypervisor is hidden from the guest, so the NVIDIA driver ignores the clique and P2P stays off; remove it"
        ));
    }
    // The clique each GPU has in the XML (through its alias).
    let mut has: BTreeMap<Bdf, u8> = BTreeMap::new();
    for (bdf, alias) in &gpus {
        let Some(settings) = alias.and_then(|a| facts.cliques.get(a)) else {
            continue;
        };
        let alias = alias.unwrap_or_default();
        if settings.len() > 1 {
            let srcs: Vec<&str> = settings.iter().map(|s| s.source).collect();
            out.push(format!(
                "{bdf} (alias {alias}) sets {CLIQUE_PROPERTY} {} times ({}); keep one",
                settings.len(),
                srcs.join(", ")
            ));
        }
        match settings[0].value.parse::<u8>() {
            Ok(v) if v <= MAX_CLIQUE => {
                has.insert(*bdf, v);
            }
            _ => out.push(format!(
                "{bdf} (alias {alias}) has {CLIQUE_PROPERTY}='{}'; a clique ID is 0..={MAX_CLIQUE}",
                settings[0].value
            )),
        }
    }
    let selected: Vec<Bdf> = gpus.keys().copied().collect();
    let options = PlanOptions {
        p2p_level,
        ..PlanOptions::default()
    };
    let planned = match plan(topo, &selected, &options) {
        Ok(p) => p,
        Err(e) => {
            out.push(format!("planning the cliques of these GPUs failed: {e}"));
            return out;
        }
    };
    for (bdf, alias) in &gpus {
        if let (Some(want), None) = (planned.clique_of(bdf), has.get(bdf)) {
            let peers: Vec<String> = planned
                .cliques
                .iter()
                .filter(|c| c.id == want)
                .flat_map(|c| c.gpus.iter().filter(|g| *g != bdf).map(Bdf::to_string))
                .collect();
            let fix = match alias {
                Some(a) => format!("add <qemu:override><qemu:device alias='{a}'> with property {CLIQUE_PROPERTY}"),
                None => format!("give the hostdev an <alias name='ua-…'/> and set {CLIQUE_PROPERTY} on it with <qemu:override>"),
            };
            out.push(format!(
                "{bdf} has no {CLIQUE_PROPERTY} but reaches {} over PCIe P2P (plan: clique {want}): P2P will be off in the guest; {fix}",
                peers.join(", ")
            ));
        }
    }
    let mut by_clique: BTreeMap<u8, Vec<Bdf>> = BTreeMap::new();
    for (bdf, c) in &has {
        by_clique.entry(*c).or_default().push(*bdf);
    }
    for (c, members) in &by_clique {
        for (i, a) in members.iter().enumerate() {
            for b in &members[i + 1..] {
                let Some(p) = planned.pair(a, b) else {
                    continue;
                };
                let ok = p.nvlink.is_some()
                    || (p.path <= p2p_level && p.verdict != Verdict::Untranslated);
                if !ok {
                    out.push(format!(
                        "{a} and {b} share clique {c} but their host path is {} ({}): {}; put them in different cliques",
                        p.path.label(),
                        p.verdict,
                        p.explanation
                    ));
                }
            }
        }
    }
    out
}
