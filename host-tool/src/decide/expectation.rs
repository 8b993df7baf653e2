//! What the guest should see: the expectation handed to the guest agent through fw_cfg
//! (`opt/vfio-p2p/expect.json`), which it compares against its own scan.
//!
//! Format (version 1), one JSON object:
//! `{"version":1,"vm":NAME,"gpus":[{"host_bdf","guest_bdf","clique":N|null,"vendor":"0x10de","device":"0x2330"}],
//!   "pairs":[{"a":GUEST_BDF,"b":GUEST_BDF,"verdict":"p2p"|"no-p2p","path":"PIX"...,"nvlink":N|null}]}`.
//! `path` is the host's PCIe path label (`nvidia-smi topo -m` without NVLink); `verdict` is
//! `p2p` when the two GPUs share a clique or are joined by NVLink.

use serde::Serialize;

use super::guest_layout::GuestLayout;
use crate::model::Topology;

/// The fw_cfg file name the guest agent reads (below `/sys/firmware/qemu_fw_cfg/by_name/`).
pub const FW_CFG_NAME: &str = "opt/vfio-p2p/expect.json";
pub const EXPECTATION_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expectation {
    pub version: u32,
    pub vm: String,
    pub gpus: Vec<ExpectedGpu>,
    pub pairs: Vec<ExpectedPair>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedGpu {
    pub host_bdf: String,
    pub guest_bdf: String,
    pub clique: Option<u8>,
    pub vendor: String,
    pub device: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    P2p,
    NoP2p,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedPair {
    pub a: String,
    pub b: String,
    pub verdict: Verdict,
    pub path: String,
    pub nvlink: Option<u8>,
}

impl Expectation {
    pub fn new(vm: &str, topo: &Topology, layout: &GuestLayout) -> Self {
        let gpus = layout
            .gpus
            .iter()
            .map(|g| ExpectedGpu {
                host_bdf: g.host.to_string(),
                guest_bdf: g.guest.to_string(),
                clique: g.clique,
                vendor: format!("{:#06x}", g.vendor),
                device: format!("{:#06x}", g.device),
            })
            .collect();
        let mut pairs = Vec::new();
        for (i, a) in layout.gpus.iter().enumerate() {
            for b in &layout.gpus[i + 1..] {
                let path = topo.path(&a.host, &b.host);
                let same_clique = a.clique.is_some() && a.clique == b.clique;
                pairs.push(ExpectedPair {
                    a: a.guest.to_string(),
                    b: b.guest.to_string(),
                    verdict: if same_clique || path.nvlink.is_some() {
                        Verdict::P2p
                    } else {
                        Verdict::NoP2p
                    },
                    path: path.kind.label().to_string(),
                    nvlink: path.nvlink,
                });
            }
        }
        Expectation {
            version: EXPECTATION_VERSION,
            vm: vm.to_string(),
            gpus,
            pairs,
        }
    }

    /// Compact JSON, as written to the fw_cfg file.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serializes")
    }
}
