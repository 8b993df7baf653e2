//! Where each passed-through GPU sits in the guest's PCIe tree, shared by every emitter.
//!
//! `mirror` reproduces the host: one PCIe expander bus (`pxb-pcie`) per host root complex
//! holding a chosen GPU, on the guest NUMA node of the complex's host node (so two GPUs on
//! different complexes of one socket read NODE in the guest as on the host, not PHB),
//! one root port per host root port, an emulated switch (`x3130-upstream` +
//! `xio3130-downstream`) per host switch, keeping only the branches that lead to the
//! chosen GPUs. `flat` gives each GPU its own root port on the root bus. Where the guest
//! cannot hold one expander per complex (more than [`MAX_EXPANDERS`]), complexes beyond
//! that share their NUMA node's first expander; `guest_paths` names the pairs whose label
//! then differs.
//!
//! Guest bus numbers are computed the way SeaBIOS and OVMF number a q35 machine and
//! Linux keeps them: `pcie.0` is bus 0 and its bridges get secondary buses depth-first
//! in (slot, function) order; each expander bus starts its own range at `bus_nr`.
//! This assumes no other bridge sits on `pcie.0` below slot [`ROOT_PORT_FIRST_SLOT`]
//! (QEMU's default devices are not bridges; the generated libvirt domain adds none).

mod devices;
mod expanders;
mod types;

pub use devices::guest_rdma_names;
pub use expanders::MAX_EXPANDERS;
pub use types::*;

use std::collections::{BTreeMap, BTreeSet};

use pci_config::Bdf;

use devices::{chosen_gpus, chosen_nics, other_functions};
use expanders::{expander_assignment, root_node};
use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_model::{BridgeRole, Device, HostBridgeId, Topology};

/// What a guest tree node mirrors; used while building.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum NodeKey {
    /// The expander of a host root complex.
    Expander(HostBridgeId),
    /// A host bridge on the GPU's path.
    HostBridge(Bdf),
    /// A root port made up for a GPU that has none (flat layout, or a host root-bus GPU).
    PortFor(Bdf),
}

struct Node {
    key: NodeKey,
    kind: GuestBridgeKind,
    children: Vec<NodeKey>,
    /// The passed devices (first functions) plugged into this bridge's bus.
    devices: Vec<Bdf>,
}

/// Decides the guest tree for `gpus` with the given clique per GPU (no NICs).
pub fn decide(
    topo: &Topology,
    gpus: &[Bdf],
    cliques: &BTreeMap<Bdf, Option<u8>>,
    opts: LayoutOptions,
) -> Result<GuestLayout, LayoutError> {
    decide_with_nics(topo, gpus, &[], cliques, opts)
}

/// Decides the guest tree for `gpus` (with the given clique per GPU) and the NICs passed
/// with them: the host devices, the guest NUMA nodes, the tree of bridges (a NIC below
/// the same mirrored switch, port or expander as on the host), its slots and bus numbers,
/// then each device's place in it.
pub fn decide_with_nics(
    topo: &Topology,
    gpus: &[Bdf],
    nics: &[Bdf],
    cliques: &BTreeMap<Bdf, Option<u8>>,
    opts: LayoutOptions,
) -> Result<GuestLayout, LayoutError> {
    let chosen = chosen_gpus(topo, gpus)?;
    let chosen_nics = chosen_nics(topo, nics, &chosen)?;
    let mut all: Vec<&Device> = chosen.clone();
    all.extend(chosen_nics.iter().map(|(first, _)| *first));
    let mirror = opts.topology == GuestTopology::Mirror;
    let numa_nodes = guest_numa_nodes(topo, &all, mirror, opts.guest_numa)?;
    let expanders = if mirror {
        expander_assignment(topo, &all)?
    } else {
        BTreeMap::new()
    };
    let tree = Tree::build(topo, &all, &expanders, &numa_nodes);
    let mut builder = LayoutBuilder {
        nodes: &tree.nodes,
        bridges: Vec::new(),
        ids: BTreeMap::new(),
        next_chassis: 1,
        counts: BTreeMap::new(),
    };
    builder.place_roots(&tree.roots)?;
    let gpus_out = chosen
        .iter()
        .enumerate()
        .map(|(i, gpu)| {
            let id = format!("gpu{i}");
            let others = other_functions(topo, gpu);
            let clique = cliques.get(&gpu.bdf).copied().flatten();
            builder.guest_device(gpu, id, &others, clique)
        })
        .collect();
    // NVSwitches (a full-passthrough VM's) ride with the NICs, numbered on their own.
    let (mut nic_n, mut switch_n) = (0, 0);
    let nics_out = chosen_nics
        .iter()
        .map(|(nic, others)| {
            let id = if nic.kind == vfio_p2p_model::DeviceKind::NvSwitch {
                switch_n += 1;
                format!("nvswitch{}", switch_n - 1)
            } else {
                nic_n += 1;
                format!("nic{}", nic_n - 1)
            };
            builder.guest_device(nic, id, others, None)
        })
        .collect();
    builder.reject_shared_ports()?;
    Ok(GuestLayout {
        topology: opts.topology,
        numa_nodes,
        bridges: builder.bridges,
        gpus: gpus_out,
        nics: nics_out,
        as_is: false,
    })
}

/// One guest NUMA node per host node of the GPUs' root complexes (mirror layout with
/// guest NUMA).
fn guest_numa_nodes(
    topo: &Topology,
    chosen: &[&Device],
    mirror: bool,
    guest_numa: bool,
) -> Result<Vec<GuestNumaNode>, LayoutError> {
    if !mirror || !guest_numa {
        return Ok(Vec::new());
    }
    let host_nodes: BTreeSet<u32> = chosen.iter().filter_map(|d| root_node(topo, d)).collect();
    Ok(host_nodes
        .into_iter()
        .enumerate()
        .map(|(i, h)| GuestNumaNode {
            id: i as u32,
            host_node: h,
            host_cpus: topo.numa_nodes.get(&h).filter(|c| !c.is_empty()).cloned(),
        })
        .collect())
}

/// The guest's bridges before placement: what each mirrors, its children and GPUs.
struct Tree {
    nodes: BTreeMap<NodeKey, Node>,
    roots: Vec<NodeKey>,
}

impl Tree {
    fn build(
        topo: &Topology,
        chosen: &[&Device],
        expanders: &BTreeMap<HostBridgeId, (HostBridgeId, Option<u32>)>,
        numa: &[GuestNumaNode],
    ) -> Tree {
        let mut tree = Tree {
            nodes: BTreeMap::new(),
            roots: Vec::new(),
        };
        let mirror = !expanders.is_empty();
        for dev in chosen {
            let expander = expanders
                .get(&dev.host_bridge)
                .map(|&(hb, node)| tree.expander(hb, node, numa));
            let chain = if mirror {
                mirrored_chain(topo, dev)
            } else {
                None
            };
            let parent = tree.chain(expander, chain, dev.bdf);
            if let Some(p) = tree.nodes.get_mut(&parent) {
                p.devices.push(dev.bdf);
            }
        }
        for n in tree.nodes.values_mut() {
            n.children.sort();
        }
        tree.roots.sort();
        tree
    }

    /// Adds `key` below `parent` (a root when `None`) unless it is there already.
    fn add(&mut self, key: NodeKey, kind: GuestBridgeKind, parent: Option<NodeKey>) {
        if self.nodes.contains_key(&key) {
            return;
        }
        let node = Node {
            key,
            kind,
            children: Vec::new(),
            devices: Vec::new(),
        };
        self.nodes.insert(key, node);
        match parent.and_then(|p| self.nodes.get_mut(&p)) {
            Some(pn) => pn.children.push(key),
            None => self.roots.push(key),
        }
    }

    /// The expander for host root complex `hb` on host NUMA node `host_node`.
    fn expander(
        &mut self,
        hb: HostBridgeId,
        host_node: Option<u32>,
        numa: &[GuestNumaNode],
    ) -> NodeKey {
        let key = NodeKey::Expander(hb);
        let numa_node = numa
            .iter()
            .find(|n| Some(n.host_node) == host_node)
            .map(|n| n.id);
        let kind = GuestBridgeKind::Expander {
            host_bridge: hb,
            host_node,
            numa_node,
        };
        self.add(key, kind, None);
        key
    }

    /// The bridges between `top` and the GPU `gpu`: the mirrored host chain, else a made-up
    /// root port; returns the GPU's parent.
    fn chain(
        &mut self,
        top: Option<NodeKey>,
        chain: Option<Vec<(Bdf, GuestBridgeKind)>>,
        gpu: Bdf,
    ) -> NodeKey {
        let made_up = || {
            let port = GuestBridgeKind::RootPort {
                chassis: 0,
                port: 0,
            };
            vec![(NodeKey::PortFor(gpu), port)]
        };
        let links = match chain {
            Some(chain) => chain
                .into_iter()
                .map(|(bdf, kind)| (NodeKey::HostBridge(bdf), kind))
                .collect(),
            None => made_up(),
        };
        let mut parent = top;
        for (key, kind) in links {
            self.add(key, kind, parent);
            parent = Some(key);
        }
        parent.expect("a chain has at least one bridge")
    }
}

impl LayoutBuilder<'_> {
    /// Slots on the root bus: root ports first (from ROOT_PORT_FIRST_SLOT, numbered from
    /// bus 1), then expanders, each with its own range of EXPANDER_BUS_STRIDE buses.
    fn place_roots(&mut self, roots: &[NodeKey]) -> Result<(), LayoutError> {
        let (expanders, root_ports): (Vec<NodeKey>, Vec<NodeKey>) = roots
            .iter()
            .partition(|k| matches!(k, NodeKey::Expander(_)));
        let max_ports = usize::from(ROOT_BUS_LAST_SLOT - ROOT_PORT_FIRST_SLOT + 1);
        if root_ports.len() > max_ports {
            return Err(LayoutError::RootBusFull {
                count: root_ports.len(),
                max: max_ports,
            });
        }
        let mut bus = 0u16;
        for (i, key) in root_ports.iter().enumerate() {
            self.place(*key, ROOT_BUS, ROOT_PORT_FIRST_SLOT + i as u8, &mut bus)?;
        }
        let mut range_start = EXPANDER_BUS_STRIDE;
        for (i, key) in expanders.iter().enumerate() {
            if bus >= u16::from(range_start) {
                return Err(LayoutError::BusRangeFull {
                    bridge: ROOT_BUS.to_string(),
                    needed: usize::from(bus) + 1,
                    available: usize::from(range_start) - 1,
                });
            }
            let mut exp_bus = u16::from(range_start) - 1;
            self.place(*key, ROOT_BUS, EXPANDER_FIRST_SLOT + i as u8, &mut exp_bus)?;
            let used = usize::from(exp_bus - u16::from(range_start)) + 1;
            if used > usize::from(EXPANDER_BUS_STRIDE) {
                return Err(LayoutError::BusRangeFull {
                    bridge: self.ids[key].clone(),
                    needed: used,
                    available: usize::from(EXPANDER_BUS_STRIDE),
                });
            }
            bus = exp_bus;
            range_start = range_start.saturating_add(EXPANDER_BUS_STRIDE);
        }
        Ok(())
    }

    /// A passed device's guest address, parent bridge and NUMA node, with its other
    /// functions (`others`) at the same guest slot.
    fn guest_device(
        &self,
        dev: &Device,
        id: String,
        others: &[&Device],
        clique: Option<u8>,
    ) -> GuestDevice {
        let parent_node = self
            .nodes
            .values()
            .find(|n| n.devices.contains(&dev.bdf))
            .expect("every chosen device was attached to a node above");
        let parent = self.ids[&parent_node.key].clone();
        let parent_bridge = self
            .bridges
            .iter()
            .find(|b| b.id == parent)
            .expect("ids and bridges are built together");
        let slot = parent_node
            .devices
            .iter()
            .position(|b| *b == dev.bdf)
            .and_then(|p| u8::try_from(p).ok())
            .unwrap_or(0);
        let guest = Bdf::new(0, parent_bridge.bus, slot, dev.bdf.function);
        let numa_node = self.expander_of(&parent).and_then(|e| match &e.kind {
            GuestBridgeKind::Expander { numa_node, .. } => *numa_node,
            _ => None,
        });
        let other_functions = others
            .iter()
            .map(|d| GuestFunction {
                host: d.bdf,
                guest: guest.with_function(d.bdf.function),
                id: format!("{id}-fn{}", d.bdf.function),
            })
            .collect();
        GuestDevice {
            host: dev.bdf,
            guest,
            id,
            parent,
            clique,
            vendor: dev.vendor,
            device: dev.device,
            class: dev.class,
            numa_node,
            host_numa_node: dev.numa_node,
            other_functions,
        }
    }

    /// Several GPUs below one port need distinct slots; a PCIe port has only device 0,
    /// so the host can't have that either: reject a tree that would need it.
    fn reject_shared_ports(&self) -> Result<(), LayoutError> {
        for n in self.nodes.values() {
            let port = matches!(
                n.kind,
                GuestBridgeKind::RootPort { .. } | GuestBridgeKind::SwitchDownstream { .. }
            );
            if port && n.devices.len() > 1 {
                return Err(LayoutError::BusFull(self.ids[&n.key].clone()));
            }
        }
        Ok(())
    }
}

/// The host's bridges above `gpu` that the guest reproduces, when they form a valid
/// PCIe chain (root port, then upstream/downstream pairs); `None` when the GPU needs a
/// made-up root port (it sits on a root bus, or below a legacy bridge).
fn mirrored_chain(topo: &Topology, gpu: &Device) -> Option<Vec<(Bdf, GuestBridgeKind)>> {
    let ancestors = topo.ancestors(&gpu.bdf);
    if ancestors.is_empty() {
        return None;
    }
    let mut chain = Vec::new();
    let mut expect_root = true;
    for d in ancestors {
        let role = d.bridge_role()?;
        let kind = match (role, expect_root) {
            (BridgeRole::RootPort, true) => GuestBridgeKind::RootPort {
                chassis: 0,
                port: 0,
            },
            (BridgeRole::UpstreamPort, false) => GuestBridgeKind::SwitchUpstream,
            (BridgeRole::DownstreamPort, false) => GuestBridgeKind::SwitchDownstream {
                chassis: 0,
                port: 0,
            },
            _ => return None,
        };
        expect_root = false;
        chain.push((d.bdf, kind));
    }
    // A switch's upstream port must be followed by a downstream port before the GPU.
    matches!(
        chain.last().map(|(_, k)| k),
        Some(GuestBridgeKind::RootPort { .. }) | Some(GuestBridgeKind::SwitchDownstream { .. })
    )
    .then_some(chain)
}

struct LayoutBuilder<'a> {
    nodes: &'a BTreeMap<NodeKey, Node>,
    bridges: Vec<GuestBridge>,
    ids: BTreeMap<NodeKey, String>,
    next_chassis: u8,
    counts: BTreeMap<&'static str, usize>,
}

impl LayoutBuilder<'_> {
    fn next_id(&mut self, prefix: &'static str) -> String {
        let n = self.counts.entry(prefix).or_insert(0);
        let id = format!("{prefix}{n}");
        *n += 1;
        id
    }

    /// Places `key` at `slot` of `parent`, numbers its bus (depth-first from `*bus`),
    /// then its children.
    fn place(
        &mut self,
        key: NodeKey,
        parent: &str,
        slot: u8,
        bus: &mut u16,
    ) -> Result<(), LayoutError> {
        let node = &self.nodes[&key];
        *bus += 1;
        let bus_nr = u8::try_from(*bus).map_err(|_| LayoutError::BusRangeFull {
            bridge: parent.to_string(),
            needed: usize::from(*bus),
            available: 255,
        })?;
        let kind = match node.kind {
            GuestBridgeKind::RootPort { .. } | GuestBridgeKind::SwitchDownstream { .. } => {
                let chassis = self.next_chassis;
                self.next_chassis = self.next_chassis.wrapping_add(1);
                if matches!(node.kind, GuestBridgeKind::RootPort { .. }) {
                    GuestBridgeKind::RootPort {
                        chassis,
                        port: chassis,
                    }
                } else {
                    GuestBridgeKind::SwitchDownstream {
                        chassis,
                        port: slot,
                    }
                }
            }
            ref k => k.clone(),
        };
        let prefix = match kind {
            GuestBridgeKind::Expander { .. } => "pxb",
            GuestBridgeKind::RootPort { .. } => "rp",
            GuestBridgeKind::SwitchUpstream => "us",
            GuestBridgeKind::SwitchDownstream { .. } => "ds",
        };
        let id = self.next_id(prefix);
        self.ids.insert(key, id.clone());
        self.bridges.push(GuestBridge {
            id: id.clone(),
            kind,
            parent: parent.to_string(),
            slot,
            bus: bus_nr,
            host: match key {
                NodeKey::HostBridge(b) => Some(b),
                _ => None,
            },
        });
        let children = node.children.clone();
        if children.len() > 32 {
            return Err(LayoutError::BusFull(id));
        }
        for (i, child) in children.into_iter().enumerate() {
            self.place(child, &id, i as u8, bus)?;
        }
        Ok(())
    }

    fn expander_of(&self, id: &str) -> Option<&GuestBridge> {
        let mut cur = self.bridges.iter().find(|b| b.id == id);
        while let Some(b) = cur {
            if matches!(b.kind, GuestBridgeKind::Expander { .. }) {
                return Some(b);
            }
            cur = self.bridges.iter().find(|x| x.id == b.parent);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_read::synth;

    fn layout(example: &str, topology: GuestTopology) -> GuestLayout {
        let topo = Topology::from_record(&synth::example(example).unwrap());
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        let cliques = gpus.iter().map(|g| (*g, Some(0))).collect();
        decide(
            &topo,
            &gpus,
            &cliques,
            LayoutOptions {
                topology,
                guest_numa: true,
            },
        )
        .unwrap()
    }

    /// Bus numbers as SeaBIOS assigned them to this layout in QEMU 7.2 (`info pci`
    /// after firmware, checked by hand): depth-first from each expander's bus_nr.
    #[test]
    fn mirror_numbers_buses_like_seabios() {
        let l = layout("dual-socket-pcie", GuestTopology::Mirror);
        let bus = |id: &str| l.bridge(id).unwrap().bus;
        assert_eq!(
            (bus("pxb0"), bus("rp0"), bus("us0"), bus("ds0")),
            (32, 33, 34, 35)
        );
        assert_eq!(
            (bus("us1"), bus("ds1"), bus("ds2"), bus("ds3")),
            (36, 37, 38, 39)
        );
        assert_eq!((bus("pxb1"), bus("rp1"), bus("ds11")), (64, 65, 74));
        let guest: Vec<String> = l.gpus.iter().map(|g| g.guest.to_string()).collect();
        assert_eq!(guest[0], "0000:25:00.0");
        assert_eq!(guest[4], "0000:45:00.0");
        assert_eq!(l.numa_nodes.len(), 2);
        assert_eq!(l.gpus[4].numa_node, Some(1));
        assert_eq!(
            l.gpus[0].other_functions[0].guest.to_string(),
            "0000:25:00.1"
        );
    }

    #[test]
    fn flat_gives_each_gpu_a_root_port_on_pcie0() {
        let l = layout("hgx-h100", GuestTopology::Flat);
        assert_eq!(l.bridges.len(), 8);
        assert!(l.numa_nodes.is_empty());
        for (i, b) in l.bridges.iter().enumerate() {
            assert_eq!(b.parent, ROOT_BUS);
            assert_eq!(b.slot, ROOT_PORT_FIRST_SLOT + i as u8);
            assert_eq!(b.bus, i as u8 + 1);
        }
        assert_eq!(l.gpus[7].guest.to_string(), "0000:08:00.0");
    }

    #[test]
    fn root_bus_gpus_get_made_up_ports_in_mirror() {
        // The VM's own root bus is a root complex too: one expander, a made-up port per GPU.
        let l = layout("flat-vm", GuestTopology::Mirror);
        assert_eq!(l.bridges.len(), 3);
        assert!(l.bridges.iter().all(|b| b.host.is_none()));
        assert_eq!(l.bridges[0].id, "pxb0");
        assert_eq!(l.gpus[1].guest.to_string(), "0000:22:00.0");
    }

    /// hgx-h100: four root complexes, two per socket: four expanders, two per guest node.
    #[test]
    fn mirror_gives_each_root_complex_its_expander() {
        let l = layout("hgx-h100", GuestTopology::Mirror);
        let expanders: Vec<(String, Option<u32>)> = l
            .bridges
            .iter()
            .filter_map(|b| match &b.kind {
                GuestBridgeKind::Expander {
                    host_bridge,
                    numa_node,
                    ..
                } => Some((host_bridge.to_string(), *numa_node)),
                _ => None,
            })
            .collect();
        let want = [
            ("pci0000:15", 0),
            ("pci0000:37", 0),
            ("pci0000:9a", 1),
            ("pci0000:b8", 1),
        ];
        assert_eq!(
            expanders,
            want.map(|(h, n)| (h.to_string(), Some(n))).to_vec()
        );
    }

    #[test]
    fn rejects_non_gpus_and_empty_lists() {
        let topo = Topology::from_record(&synth::example("flat-vm").unwrap());
        let opts = LayoutOptions {
            topology: GuestTopology::Mirror,
            guest_numa: false,
        };
        let none = BTreeMap::new();
        assert_eq!(decide(&topo, &[], &none, opts), Err(LayoutError::NoGpus));
        let bogus = Bdf::new(0, 0x99, 0, 0);
        assert_eq!(
            decide(&topo, &[bogus], &none, opts),
            Err(LayoutError::NotAGpu(bogus))
        );
    }
}
