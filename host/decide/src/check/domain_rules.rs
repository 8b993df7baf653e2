//! Checks of a libvirt domain against this host, as the hook runs them before a guest
//! starts: hostdevs the host keeps, a hidden hypervisor, and the cliques set in the domain
//! against the plan for its GPUs.

use std::collections::BTreeMap;

use pci_config::clique::MAX_CLIQUE;
use pci_config::Bdf;

use super::report::{result, CheckResult, Status};
use crate::clique_plan::pair_route::PairRoute;
use crate::clique_plan::{plan, CliquePlan, PlanOptions};
use pci_config::PathKind;
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_model::domain::DomainFacts;
use vfio_p2p_model::Topology;

/// The fix for a defined domain whose cliques are missing or wrong, with its name
/// (`DOMAIN` where the XML has none).
pub fn patch_fix(facts: &DomainFacts) -> String {
    let name = facts.name.as_deref().unwrap_or("DOMAIN");
    let quoted = if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.+:@".contains(c))
    {
        name.to_string()
    } else {
        format!("'{}'", name.replace('\'', r"'\''"))
    };
    let file = format!("/tmp/{}.xml", name.replace(['/', '\'', ' '], "_"));
    format!(
        "run `virsh dumpxml --inactive {quoted} | vfio-p2p libvirt patch - -o {file} && virsh define {file}`"
    )
}

fn fail(
    check: &'static str,
    subject: Option<String>,
    saw: String,
    fix: Option<String>,
) -> CheckResult {
    result(check, subject, Status::Fail, saw, fix)
}

/// Hostdevs that would take a device the host keeps (`reserved` in host.yaml): the device
/// itself, or another member of its IOMMU group, since VFIO hands a group over whole.
/// Always fatal, whatever `hook_policy` says: starting would unbind a device the host uses.
pub fn reserved_hostdevs(
    topo: &Topology,
    facts: &DomainFacts,
    reserved: &[Bdf],
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for h in &facts.hostdevs {
        let subject = Some(h.bdf.to_string());
        if reserved.contains(&h.bdf) {
            out.push(fail(
                "host-reserved",
                subject,
                format!("{} is reserved for the host (host.yaml `reserved:`)", h.bdf),
                Some("remove the hostdev or take it out of `reserved`".into()),
            ));
        } else if let Some(r) = topo
            .group_members(&h.bdf)
            .into_iter()
            .find(|m| reserved.contains(m))
        {
            out.push(fail(
                "host-reserved",
                subject,
                format!(
                    "{} shares its IOMMU group with {r}, which is reserved for the host (host.yaml `reserved:`) and would go to vfio-pci with it",
                    h.bdf
                ),
                Some("use a device of another group".into()),
            ));
        }
    }
    out
}

/// Everything in the domain that breaks the host's policy or will keep P2P from working in
/// the guest (empty: all good).
pub fn domain_checks(
    topo: &Topology,
    facts: &DomainFacts,
    p2p_level: PathKind,
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let gpus = gpu_hostdevs(topo, facts, &mut out);
    if gpus.is_empty() {
        return out;
    }
    out.extend(hidden_hypervisor(facts));
    let options = PlanOptions {
        p2p_level,
        ..PlanOptions::default()
    };
    out.extend(gpu_cliques(topo, facts, &gpus, &options, &patch_fix(facts)));
    out
}

/// The cliques a VM definition sets (facts from a libvirt domain or another stack's
/// config, read into the same form) against the plan for its GPUs; `fix` tells how that
/// stack's definition gets the planned cliques. A hidden hypervisor is `check`'s own.
/// `options` are the plan's (`--p2p-level`, `--allow-untranslated-p2p`), as `gen` had them.
pub fn clique_checks(
    topo: &Topology,
    facts: &DomainFacts,
    options: &PlanOptions,
    fix: &str,
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let gpus = gpu_hostdevs(topo, facts, &mut out);
    if !gpus.is_empty() {
        out.extend(gpu_cliques(topo, facts, &gpus, options, fix));
    }
    out
}

fn gpu_cliques(
    topo: &Topology,
    facts: &DomainFacts,
    gpus: &BTreeMap<Bdf, Option<&str>>,
    options: &PlanOptions,
    fix: &str,
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let has = cliques_set(facts, gpus, fix, &mut out);
    let selected: Vec<Bdf> = gpus.keys().copied().collect();
    let planned = match plan(topo, &selected, options) {
        Ok(p) => p,
        Err(e) => {
            out.push(fail(
                "p2p-plan",
                None,
                format!("planning the cliques of these GPUs failed: {e}"),
                None,
            ));
            return out;
        }
    };
    out.extend(missing_cliques(&planned, gpus, &has, fix));
    out.extend(split_cliques(&planned, &has, fix));
    out.extend(wrong_cliques(&planned, &has, options, fix));
    out
}

/// GPUs the plan puts in one clique that the domain gives different cliques: the driver
/// then keeps P2P off between them, as surely as if the clique were missing.
fn split_cliques(planned: &CliquePlan, has: &BTreeMap<Bdf, u8>, fix: &str) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for c in &planned.cliques {
        let mut given: BTreeMap<u8, Vec<String>> = BTreeMap::new();
        for g in &c.gpus {
            if let Some(k) = has.get(g) {
                given.entry(*k).or_default().push(g.to_string());
            }
        }
        if given.len() < 2 {
            continue;
        }
        let split: Vec<String> = given
            .iter()
            .map(|(k, gpus)| format!("{} in clique {k}", gpus.join(", ")))
            .collect();
        out.push(fail(
            "clique-split",
            Some(c.gpus.iter().map(Bdf::to_string).collect::<Vec<_>>().join(" ")),
            format!(
                "the plan puts these GPUs in one clique ({}), but the domain has {}: P2P will be off between them in the guest",
                c.id,
                split.join("; ")
            ),
            Some(fix.into()),
        ));
    }
    out
}

/// The domain's hostdevs that are GPUs here, with their aliases.
fn gpu_hostdevs<'a>(
    topo: &Topology,
    facts: &'a DomainFacts,
    out: &mut Vec<CheckResult>,
) -> BTreeMap<Bdf, Option<&'a str>> {
    let mut gpus = BTreeMap::new();
    for h in &facts.hostdevs {
        match topo.device(&h.bdf) {
            None => out.push(fail(
                "hostdev",
                Some(h.bdf.to_string()),
                format!("hostdev {} is not a PCI device on this host", h.bdf),
                Some("fix the hostdev's <source><address> (`vfio-p2p topo` lists the GPUs)".into()),
            )),
            Some(d) if d.is_nvidia_gpu() => {
                gpus.insert(h.bdf, h.alias_name());
            }
            Some(_) => {}
        }
    }
    gpus
}

fn hidden_hypervisor(facts: &DomainFacts) -> Option<CheckResult> {
    if facts.hidden_hypervisor.is_empty() {
        return None;
    }
    let how: Vec<String> = facts
        .hidden_hypervisor
        .iter()
        .map(|h| h.to_string())
        .collect();
    Some(fail(
        "hypervisor-visible",
        None,
        format!(
            "{}: the hypervisor is hidden from the guest, so the NVIDIA driver ignores the clique and P2P stays off",
            how.join("; ")
        ),
        Some("remove it (current NVIDIA drivers no longer need it)".into()),
    ))
}

/// The clique each GPU has in the domain (through its alias); bad values are findings.
fn cliques_set(
    facts: &DomainFacts,
    gpus: &BTreeMap<Bdf, Option<&str>>,
    fix: &str,
    out: &mut Vec<CheckResult>,
) -> BTreeMap<Bdf, u8> {
    let mut has = BTreeMap::new();
    for (bdf, alias) in gpus {
        let Some(settings) = alias.and_then(|a| facts.cliques.get(a)) else {
            continue;
        };
        let alias = alias.unwrap_or_default();
        let subject = Some(bdf.to_string());
        if settings.len() > 1 {
            let srcs: Vec<String> = settings
                .iter()
                .map(|s| format!("{} in {}", s.value, s.source))
                .collect();
            let conflict = settings.iter().any(|s| s.value != settings[0].value);
            out.push(fail(
                "clique-setting",
                subject.clone(),
                format!(
                    "{bdf} (alias {alias}) sets {CLIQUE_PROPERTY} {} times{} ({}); QEMU takes one of them",
                    settings.len(),
                    if conflict { ", to different cliques" } else { "" },
                    srcs.join(", ")
                ),
                Some(format!("keep one: {fix}")),
            ));
        }
        match settings[0].value.parse::<u8>() {
            Ok(v) if v <= MAX_CLIQUE => {
                has.insert(*bdf, v);
            }
            _ => out.push(fail(
                "clique-setting",
                subject,
                format!("{bdf} (alias {alias}) has {CLIQUE_PROPERTY}='{}'; a clique ID is 0..={MAX_CLIQUE}", settings[0].value),
                Some(fix.into()),
            )),
        }
    }
    has
}

/// GPUs the plan gives a clique that the domain does not set.
fn missing_cliques(
    planned: &CliquePlan,
    gpus: &BTreeMap<Bdf, Option<&str>>,
    has: &BTreeMap<Bdf, u8>,
    fix: &str,
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for bdf in gpus.keys() {
        let (Some(want), None) = (planned.clique_of(bdf), has.get(bdf)) else {
            continue;
        };
        let peers: Vec<String> = planned
            .cliques
            .iter()
            .filter(|c| c.id == want)
            .flat_map(|c| c.gpus.iter().filter(|g| *g != bdf).map(Bdf::to_string))
            .collect();
        out.push(fail(
            "clique-missing",
            Some(bdf.to_string()),
            format!(
                "{bdf} has no {CLIQUE_PROPERTY} but reaches {} over PCIe P2P (plan: clique {want}): P2P will be off in the guest",
                peers.join(", ")
            ),
            Some(fix.into()),
        ));
    }
    out
}

/// GPUs that share a clique in the domain although their host path does not allow it.
fn wrong_cliques(
    planned: &CliquePlan,
    has: &BTreeMap<Bdf, u8>,
    options: &PlanOptions,
    fix: &str,
) -> Vec<CheckResult> {
    let mut by_clique: BTreeMap<u8, Vec<Bdf>> = BTreeMap::new();
    for (bdf, c) in has {
        by_clique.entry(*c).or_default().push(*bdf);
    }
    let mut out = Vec::new();
    for (c, members) in &by_clique {
        for (i, a) in members.iter().enumerate() {
            for b in &members[i + 1..] {
                let Some(p) = planned.pair(a, b) else {
                    continue;
                };
                let ok = p.nvlink.is_some()
                    || (p.path <= options.p2p_level
                        && (p.verdict != PairRoute::Untranslated
                            || options.allow_untranslated_p2p));
                if !ok {
                    out.push(fail(
                        "clique-path",
                        Some(format!("{a} {b}")),
                        format!(
                            "{a} and {b} share clique {c} but their host path is {} ({}): {}",
                            p.path.label(),
                            p.verdict,
                            p.explanation
                        ),
                        Some(format!("put them in different cliques: {fix}")),
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook's fix names the domain it is about and reads its persistent definition.
    #[test]
    fn the_patch_fix_runs_as_printed() {
        let named = |name: Option<&str>| DomainFacts {
            name: name.map(str::to_string),
            ..DomainFacts::default()
        };
        assert_eq!(
            patch_fix(&named(Some("train-01"))),
            "run `virsh dumpxml --inactive train-01 | vfio-p2p libvirt patch - -o /tmp/train-01.xml && virsh define /tmp/train-01.xml`"
        );
        let odd = patch_fix(&named(Some("it's a VM")));
        assert!(
            odd.contains(r"dumpxml --inactive 'it'\''s a VM' |")
                && odd.contains("/tmp/it_s_a_VM.xml"),
            "{odd}"
        );
        assert!(!patch_fix(&named(None)).contains('…'));
    }
}
