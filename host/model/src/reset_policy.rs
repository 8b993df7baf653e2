//! How a GPU passed to a VM is reset between tenants (host.yaml `reset:`): parsed by
//! config, decided on by decide::reset, applied by bind.

use serde::{Deserialize, Serialize};

/// How a GPU passed to a VM is reset between tenants: the kernel's `reset_method` that
/// `bind` (and the hook) sets for it, and `unbind` restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetPolicy {
    /// The kernel's own order (FLR first where the device has it); nothing is written.
    #[default]
    Auto,
    /// Function-level reset only.
    Flr,
    /// Secondary bus reset only: what confidential-computing GPUs need (an FLR leaves
    /// state behind), allowed only when everything on the bus goes to the same VM.
    Bus,
}

impl ResetPolicy {
    /// The word in host.yaml and in the kernel's `reset_method`.
    pub fn name(self) -> &'static str {
        match self {
            ResetPolicy::Auto => "auto",
            ResetPolicy::Flr => "flr",
            ResetPolicy::Bus => "bus",
        }
    }
}
