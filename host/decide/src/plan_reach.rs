//! What makes clique planning near-linear: below PIX, "within the level" is an equivalence
//! on GPUs. Two GPUs are within NODE when their root complexes share a NUMA node, within
//! PHB when they share the root complex, within PXB when they also share the first bridge
//! below it (the root port: `pci_config::classify` needs a common bridge). So each GPU
//! gets a key per level and the GPUs of one key are the pairs within it; only PIX, which
//! is not transitive, compares pairs, and only inside one PXB key (one switch tree).

use std::collections::HashMap;
use std::hash::Hash;

use pci_config::Bdf;

use pci_config::PathKind;
use vfio_p2p_model::Topology;

/// The class of GPUs that reach each other within a level (PXB and coarser).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Everything (SYS).
    All,
    /// One NUMA node (`None`: unknown, which `classify` takes as one node too).
    Numa(Option<u32>),
    /// One root complex (host bridge): domain and bus.
    Root(u16, u8),
    /// One switch tree: the root complex and the first bridge below it.
    Tree(u16, u8, Bdf),
    /// No peer within the level (a GPU right on a root bus has no PXB peer).
    Alone(Bdf),
}

/// The key of `gpu` at `level` (for PIX: its PXB key, inside which pairs are compared).
pub fn reach(topo: &Topology, gpu: &Bdf, level: PathKind) -> Reach {
    let hb = topo.device(gpu).map(|d| d.host_bridge);
    let (domain, bus) = hb.map_or((u16::MAX, u8::MAX), |h| (h.domain, h.bus));
    match level {
        PathKind::Sys => Reach::All,
        PathKind::Node => Reach::Numa(hb.and_then(|h| topo.host_bridge_numa(h))),
        PathKind::Phb => Reach::Root(domain, bus),
        PathKind::Pxb | PathKind::Pix => match topo.chain(gpu).first() {
            Some(top) => Reach::Tree(domain, bus, *top),
            None => Reach::Alone(*gpu),
        },
        PathKind::X => Reach::Alone(*gpu),
    }
}

/// `items` split by `key`, each class in first-seen order and the classes in the order of
/// their first member.
pub fn classes<T: Copy, K: Eq + Hash>(items: &[T], key: impl Fn(&T) -> K) -> Vec<Vec<T>> {
    let mut index: HashMap<K, usize> = HashMap::new();
    let mut out: Vec<Vec<T>> = Vec::new();
    for it in items {
        let i = *index.entry(key(it)).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[i].push(*it);
    }
    out
}

/// The clique groups of `eligible` (BDF order) at `level`: each GPU joins the first group
/// all of whose members it reaches within the level, else opens one. For PXB and coarser
/// the groups are the level's classes; for PIX the greedy runs inside each switch tree.
pub fn groups(topo: &Topology, eligible: &[Bdf], level: PathKind) -> Vec<Vec<Bdf>> {
    let classes = classes(eligible, |g| reach(topo, g, level));
    if level != PathKind::Pix {
        return classes;
    }
    let mut out: Vec<Vec<Bdf>> = Vec::new();
    for class in classes {
        let mut here: Vec<Vec<Bdf>> = Vec::new();
        for g in class {
            match here
                .iter_mut()
                .find(|m| m.iter().all(|x| topo.path(x, &g).kind <= PathKind::Pix))
            {
                Some(m) => m.push(g),
                None => here.push(vec![g]),
            }
        }
        out.extend(here);
    }
    // the greedy over all GPUs opens groups in the order of their first member
    out.sort_by_key(|g| g[0]);
    out
}

/// How many of the pairs of `members` (one clique) take each PCIe path of PHB and worse;
/// the pairs within one switch tree (PIX/PXB) are listed, not counted.
pub fn far_pairs_by_path(topo: &Topology, members: &[Bdf]) -> Vec<(PathKind, usize)> {
    let pairs = |level: PathKind| -> usize {
        classes(members, |g| reach(topo, g, level))
            .iter()
            .map(|c| c.len() * (c.len() - 1) / 2)
            .sum()
    };
    let (sys, node, phb, pxb) = (
        pairs(PathKind::Sys),
        pairs(PathKind::Node),
        pairs(PathKind::Phb),
        pairs(PathKind::Pxb),
    );
    [
        (PathKind::Phb, phb - pxb),
        (PathKind::Node, node - phb),
        (PathKind::Sys, sys - node),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// How many selected peers each GPU reaches over NVLink (from the host's NVLink map).
pub fn nvlink_degrees(topo: &Topology, selected: &[Bdf]) -> HashMap<Bdf, usize> {
    let chosen: std::collections::HashSet<&Bdf> = selected.iter().collect();
    let mut degree: HashMap<Bdf, usize> = HashMap::new();
    for (a, b) in topo.nvlinks.keys() {
        if a != b && chosen.contains(a) && chosen.contains(b) {
            *degree.entry(*a).or_default() += 1;
            *degree.entry(*b).or_default() += 1;
        }
    }
    degree
}

/// The groups as `[A B] [C D]`, at most 20 groups of at most 16 GPUs named (a hostile
/// host needs thousands): the rest counted.
pub fn groups_text(groups: &[Vec<Bdf>]) -> String {
    let one = |g: &Vec<Bdf>| {
        let mut names: Vec<String> = g.iter().take(16).map(Bdf::to_string).collect();
        if g.len() > 16 {
            names.push(format!("and {} more", g.len() - 16));
        }
        format!("[{}]", names.join(" "))
    };
    let mut text: Vec<String> = groups.iter().take(20).map(one).collect();
    if groups.len() > 20 {
        text.push(format!("and {} more groups", groups.len() - 20));
    }
    text.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vfio_p2p_read::synth::tree::{server, LeafSpec, ServerSpec};
    use vfio_p2p_read::synth::{Attach, EndpointSpec};

    /// The rule as it was, pair by pair: each GPU joins the first group all of whose
    /// members it reaches within `level`.
    fn naive_groups(topo: &Topology, eligible: &[Bdf], level: PathKind) -> Vec<Vec<Bdf>> {
        let mut groups: Vec<Vec<Bdf>> = Vec::new();
        for g in eligible {
            match groups
                .iter_mut()
                .find(|m| m.iter().all(|x| topo.path(x, g).kind <= level))
            {
                Some(m) => m.push(*g),
                None => groups.push(vec![*g]),
            }
        }
        groups
    }

    fn spec() -> impl Strategy<Value = ServerSpec> {
        let leaf = (1u8..=3, proptest::bool::weighted(0.3))
            .prop_map(|(gpus, shared_group)| LeafSpec { gpus, shared_group });
        let bridge = proptest::collection::vec(leaf, 1..=3);
        let socket = proptest::collection::vec(bridge, 1..=2);
        proptest::collection::vec(socket, 1..=2).prop_map(|sockets| ServerSpec { sockets })
    }

    /// The server with `flat` more GPUs right on a root bus of its own (no bridge above),
    /// and two more below two root ports of that host bridge.
    fn host(spec: &ServerSpec, flat: usize) -> Topology {
        let mut record = server(spec);
        if flat > 0 {
            let mut b = vfio_p2p_read::synth::HostBuilder::new("flat");
            b.numa_node(0, "0-15");
            let hb = b.host_bridge(1, 0);
            let gpu = EndpointSpec::gpu(0x10de, 0x2330, 48);
            for _ in 0..flat {
                b.endpoint(Attach::HostBridge(hb), 0, &gpu, Some(0));
            }
            // two root ports of one host bridge: PHB between their GPUs, not PXB
            for _ in 0..2 {
                let rp = b.root_port(hb, Some(0), Some(vfio_p2p_read::synth::ACS_ISOLATING));
                b.endpoint(Attach::Below(rp), 0, &gpu, None);
            }
            record.devices.extend(b.build().devices);
        }
        Topology::from_record(&record)
    }

    proptest! {
        /// The classes (and PIX's greedy inside a switch tree) are the pair-by-pair
        /// greedy's groups, at every level, for any selection; and the far pairs of a
        /// group are counted by their true path.
        #[test]
        fn classes_are_the_pairwise_greedy(
            spec in spec(),
            flat in 0usize..4,
            keep in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let t = host(&spec, flat);
            let chosen: Vec<Bdf> = t
                .gpus()
                .map(|d| d.bdf)
                .zip(keep.iter().cycle())
                .filter(|(_, k)| **k)
                .map(|(b, _)| b)
                .collect();
            for level in [PathKind::Pix, PathKind::Pxb, PathKind::Phb, PathKind::Node, PathKind::Sys] {
                prop_assert_eq!(groups(&t, &chosen, level), naive_groups(&t, &chosen, level), "{}", level);
            }
            let mut brute: std::collections::BTreeMap<PathKind, usize> = Default::default();
            for (i, a) in chosen.iter().enumerate() {
                for b in &chosen[i + 1..] {
                    let k = t.path(a, b).kind;
                    if k >= PathKind::Phb {
                        *brute.entry(k).or_default() += 1;
                    }
                }
            }
            let counted: std::collections::BTreeMap<PathKind, usize> =
                far_pairs_by_path(&t, &chosen).into_iter().collect();
            prop_assert_eq!(counted, brute);
        }
    }
}
