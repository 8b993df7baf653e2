//! NVIDIA Fabric Manager's view of an NVSwitch board: its partitions, made by the FM
//! readers (live API or a capture) and the embedded examples' partition tables (their
//! types are `model::fabric_state`), and what a run knows of the fabric.
//! Consumed by planning (`place`, `plan`, `check`), the hook's activation and the
//! expectation.

use serde::Serialize;

use crate::fabric_state::FabricState;

/// NVIDIA Fabric Manager's two virtualization models that vfio-p2p plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricModel {
    /// NVSwitches stay with FM on the host (or a service VM); a VM's GPUs are one of
    /// FM's partitions, activated before it starts.
    SharedNvswitch,
    /// The NVSwitches go into the VM with the whole baseboard; FM runs in the guest.
    FullPassthrough,
}

impl FabricModel {
    /// `shared-nvswitch` / `full-passthrough`: the host config's words.
    pub fn name(self) -> &'static str {
        match self {
            FabricModel::SharedNvswitch => "shared-nvswitch",
            FabricModel::FullPassthrough => "full-passthrough",
        }
    }
}

/// What this run knows of the board's fabric, settled once when the context is built.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Fabric {
    /// The model planning follows (`fabric:` with `auto` resolved); `None`: no fabric
    /// management (PCIe, direct NVLink, or FM not known).
    pub model: Option<FabricModel>,
    /// FM's partitions, when they were read (FM's live API, a capture, an embedded
    /// example's table), with host.yaml's module addresses applied.
    pub state: Option<FabricState>,
    /// Where `state` came from, or why FM was not read.
    pub source: String,
    /// FM was to be asked on this host (shared NVSwitch) and did not answer: why, with
    /// the fix. Planning warns; the hook applies its policy to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
}

impl Fabric {
    /// FM's partitions when planning must follow them (shared NVSwitch, partitions known).
    pub fn partitions(&self) -> Option<&FabricState> {
        match self.model {
            Some(FabricModel::SharedNvswitch) => self.state.as_ref(),
            _ => None,
        }
    }
}
