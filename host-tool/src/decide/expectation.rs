//! What the guest should see: the expectation handed to the guest agent through fw_cfg
//! (`vfio_p2p_contract::FW_CFG_NAME`), built from the plan's guest layout. The format and
//! its version rule live in the `vfio-p2p-contract` crate, shared with the agent.
//!
//! `path` is the host's PCIe path label (`nvidia-smi topo -m` without NVLink), `guest_path`
//! the label the emitted guest tree gives the pair (`guest_paths`); `verdict` is
//! `p2p` when the two GPUs share a clique or are joined by NVLink.

use vfio_p2p_contract::{ExpectedGpu, ExpectedPair, Verdict};

pub use vfio_p2p_contract::Expectation;

use super::guest_layout::GuestLayout;
use super::guest_paths;
use crate::model::Topology;

/// The expectation for VM `vm` laid out as `layout` on `topo`.
pub fn for_layout(vm: &str, topo: &Topology, layout: &GuestLayout) -> Expectation {
    let mut e = Expectation::new(vm);
    e.gpus = layout
        .gpus
        .iter()
        .map(|g| ExpectedGpu {
            host_bdf: g.host,
            guest_bdf: g.guest,
            clique: g.clique,
            vendor: g.vendor.into(),
            device: g.device.into(),
            module_id: None,
        })
        .collect();
    for (i, j, guest) in guest_paths::guest_labels(topo, layout) {
        let (a, b) = (&layout.gpus[i], &layout.gpus[j]);
        {
            let path = topo.path(&a.host, &b.host);
            let same_clique = a.clique.is_some() && a.clique == b.clique;
            e.pairs.push(ExpectedPair {
                a: a.guest,
                b: b.guest,
                verdict: if same_clique || path.nvlink.is_some() {
                    Verdict::P2p
                } else {
                    Verdict::NoP2p
                },
                path: path.kind.label().to_string(),
                nvlink: path.nvlink,
                guest_path: Some(guest.kind.label().to_string()),
            });
        }
    }
    e
}
