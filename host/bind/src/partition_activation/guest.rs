//! The libvirt hook's fabric step for one guest: decided before anything changes (is FM in
//! charge here, which partition is the VM's), then done after the bind (reset, activate,
//! record), and undone with the bind when it fails under `hook_policy: deny`.

use std::collections::BTreeSet;
use std::path::Path;

use pci_config::Bdf;

use super::{activate, ActivationError, ActivationReport, PartitionWriter};
use crate::{SessionError, SessionOptions, SessionReport, SysfsWriter, UnbindSelection};
use vfio_p2p_decide::fabric::partition_for;
use vfio_p2p_model::fabric::Fabric;
use vfio_p2p_model::Topology;
use vfio_p2p_read::fm_api::FmSession;

/// What the hook does about the fabric for this guest.
pub enum FabricStep {
    /// Nothing: no shared NVSwitch fabric here, or no GPU in the VM.
    Nothing,
    /// Activate `partition` (exactly the VM's `gpus`) over `session` after the bind.
    Activate {
        session: FmSession,
        partition: u32,
        gpus: Vec<Bdf>,
        /// FM's live list has it active already (checked against the record: a record
        /// FM contradicts is stale, [`super::forget_stale`]).
        live_active: bool,
    },
    /// The VM cannot get NVLink: the hook's policy decides (warn: start without it).
    Finding(String),
}

/// Decides the fabric step for a VM whose passed-through devices are `hostdevs`, from
/// what the context read of FM (once, over `fm`): the VM's GPUs must be exactly one of
/// FM's partitions ([`partition_for`]). FM was asked when it applies here
/// (`shared-nvswitch`, or `auto` with NVSwitches on the PCI tree and FM's library
/// installed) through its API; a capture means FM runs elsewhere (a service VM) and
/// activates there.
pub fn plan_for_guest(
    fabric: &Fabric,
    fm: Option<FmSession>,
    topo: &Topology,
    hostdevs: &[Bdf],
    reserved: &BTreeSet<Bdf>,
) -> FabricStep {
    let mut gpus: Vec<Bdf> = hostdevs
        .iter()
        .copied()
        .filter(|b| topo.device(b).is_some_and(|d| d.is_nvidia_gpu()))
        .collect();
    gpus.sort();
    gpus.dedup();
    if gpus.is_empty() {
        return FabricStep::Nothing;
    }
    if let Some(why) = &fabric.unreachable {
        return FabricStep::Finding(why.clone());
    }
    let (Some(session), Some(state)) = (fm, &fabric.state) else {
        return FabricStep::Nothing;
    };
    match partition_for(state, &gpus, reserved) {
        Ok(p) => FabricStep::Activate {
            partition: p.id,
            live_active: p.active,
            gpus,
            session,
        },
        Err(f) => FabricStep::Finding(f.to_string()),
    }
}

/// A failed activation under `deny`, and how giving the GPUs back went.
#[derive(Debug, thiserror::Error)]
#[error("{failed}; {}", rollback_text(.rolled_back))]
pub struct GuestActivationError {
    pub failed: ActivationError,
    pub rolled_back: Result<SessionReport, SessionError>,
}

fn rollback_text(r: &Result<SessionReport, SessionError>) -> String {
    match r {
        Ok(rep) if rep.devices.is_empty() => "nothing was bound for it".into(),
        Ok(rep) => {
            let list: Vec<String> = rep.devices.iter().map(|d| d.bdf.to_string()).collect();
            format!("rolled back: {} given back to their host drivers", list.join(", "))
        }
        Err(e) => format!("ROLLBACK INCOMPLETE, giving back the devices prepare bound failed: {e}; `vfio-p2p unbind --all` restores them"),
    }
}

/// Activates `partition` for `guest`; when that fails, every device prepare bound for the
/// guest goes back to its host driver, so the host is as it was before prepare.
pub fn activate_or_roll_back<S: SysfsWriter, P: PartitionWriter>(
    root: &Path,
    sysfs: &mut S,
    fm: &mut P,
    partition: u32,
    gpus: &[Bdf],
    guest: &str,
    opts: &SessionOptions,
) -> Result<ActivationReport, Box<GuestActivationError>> {
    match activate(
        root,
        sysfs,
        fm,
        partition,
        gpus,
        Some(guest),
        opts.lock_timeout,
    ) {
        Ok(r) => Ok(r),
        Err(failed) => {
            let rolled_back =
                crate::unbind(root, sysfs, &UnbindSelection::Guest(guest.into()), opts);
            Err(Box::new(GuestActivationError {
                failed,
                rolled_back,
            }))
        }
    }
}
