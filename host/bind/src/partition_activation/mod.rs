//! Activating and deactivating Fabric Manager partitions, recorded, over a writer trait so
//! that the hook's transaction can be simulated and failures injected ([`SimFabric`];
//! the real writer is [`FmSession`]; the stand-in library plays FM for whole runs).
//!
//! Activation follows FM's hypervisor sequence for shared NVSwitch: the GPUs are already on
//! vfio-pci (bound by the caller), each is reset through its sysfs `reset` attribute, then
//! `fmActivateFabricPartition`, and the guest starts with no further reset. Deactivation
//! comes after the guest stopped, before its GPUs go back to their host driver.

pub mod guest;
pub mod state;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use pci_config::Bdf;
use serde::Serialize;

use crate::{BindLock, LockError, SysfsWrite, SysfsWriter};
pub use state::{ActivationRecord, ActivePartition, RecordError};
use vfio_p2p_fm_ffi::{FmCall, FmError, FmFailure};
use vfio_p2p_read::binding::{device_dir, read_binding, Binding};
use vfio_p2p_read::fm_api::FmSession;

/// What changes FM's partitions. Implemented by [`FmSession`] and [`SimFabric`].
pub trait PartitionWriter {
    fn activate(&mut self, id: u32) -> Result<(), FmError>;
    fn deactivate(&mut self, id: u32) -> Result<(), FmError>;
    fn set_activated(&mut self, ids: &[u32]) -> Result<(), FmError>;
}

impl PartitionWriter for FmSession {
    fn activate(&mut self, id: u32) -> Result<(), FmError> {
        FmSession::activate(self, id)
    }
    fn deactivate(&mut self, id: u32) -> Result<(), FmError> {
        FmSession::deactivate(self, id)
    }
    fn set_activated(&mut self, ids: &[u32]) -> Result<(), FmError> {
        FmSession::set_activated(self, ids)
    }
}

/// FM in memory, for unit tests: active partitions, a log, and one injected failure.
#[derive(Debug, Default)]
pub struct SimFabric {
    pub active: BTreeSet<u32>,
    pub log: Vec<String>,
    /// The call that fails, and FM's code for it.
    pub fail: Option<(FmCall, i32)>,
}

impl SimFabric {
    fn answer(&mut self, call: FmCall) -> Result<(), FmError> {
        self.log.push(call.to_string());
        match self.fail {
            Some((c, code)) if c == call => Err(FmError::Call {
                call,
                code,
                address: "sim".into(),
            }),
            _ => Ok(()),
        }
    }
}

impl PartitionWriter for SimFabric {
    fn activate(&mut self, id: u32) -> Result<(), FmError> {
        self.answer(FmCall::Activate(id))?;
        if !self.active.insert(id) {
            return Err(FmError::Call {
                call: FmCall::Activate(id),
                code: vfio_p2p_fm_ffi::abi::IN_USE,
                address: "sim".into(),
            });
        }
        Ok(())
    }
    fn deactivate(&mut self, id: u32) -> Result<(), FmError> {
        self.answer(FmCall::Deactivate(id))?;
        if !self.active.remove(&id) {
            return Err(FmError::Call {
                call: FmCall::Deactivate(id),
                code: vfio_p2p_fm_ffi::abi::UNINITIALIZED,
                address: "sim".into(),
            });
        }
        Ok(())
    }
    fn set_activated(&mut self, ids: &[u32]) -> Result<(), FmError> {
        self.answer(FmCall::SetActivated)?;
        self.active = ids.iter().copied().collect();
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{0}")]
    Fm(#[from] FmError),
    #[error("resetting {bdf} before activating partition {id} (FM wants the partition's GPUs reset): writing /{file}: {source}; check `lspci -vvs {bdf}` and that no process holds the device")]
    Reset {
        bdf: Bdf,
        id: u32,
        file: String,
        source: std::io::Error,
    },
    #[error("partition {id} is active for {holder} in vfio-p2p's record; stop that VM first (`vfio-p2p fabric list`)")]
    HeldByOther { id: u32, holder: String },
    #[error("{failed}; and undoing it failed too: {undo} — partition {id} may be left active: `vfio-p2p fabric deactivate {id}` once FM answers")]
    UndoFailed {
        id: u32,
        failed: Box<ActivationError>,
        undo: FmError,
    },
}

impl ActivationError {
    /// FM's kind of failure, when FM is what failed.
    pub fn fm_failure(&self) -> Option<FmFailure> {
        match self {
            ActivationError::Fm(e) => Some(e.failure()),
            _ => None,
        }
    }
}

/// What an activation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ActivationReport {
    pub partition: u32,
    /// The resets written, in order.
    pub resets: Vec<SysfsWrite>,
    /// GPUs without a `reset` attribute (no reset method the kernel knows): not reset.
    pub not_resettable: Vec<Bdf>,
    /// The partition was already active for this guest (a repeated prepare): nothing done.
    pub already_active: bool,
    /// GPUs reset while still bound to a host driver other than vfio-pci (a `managed='yes'`
    /// domain, whose GPUs libvirt binds after the hook; `fabric activate`), and the driver.
    pub reset_on_host_driver: Vec<(Bdf, String)>,
}

/// Drops partition `id` from the record when it is recorded for `guest` though FM's live
/// list has it inactive (FM restarted, or was down when the guest stopped): the record is
/// stale, and the partition is to be activated again. Says whether it dropped one.
pub fn forget_stale(
    root: &Path,
    id: u32,
    guest: &str,
    lock_timeout: Duration,
) -> Result<bool, ActivationError> {
    let _lock = BindLock::acquire(root, lock_timeout)?;
    let mut record = ActivationRecord::load(root)?;
    let ours = record
        .partitions
        .get(&id)
        .is_some_and(|p| p.guest.as_deref() == Some(guest));
    if !ours {
        return Ok(false);
    }
    record.partitions.remove(&id);
    record.save(root)?;
    Ok(true)
}

/// The sysfs write that resets `bdf` (the kernel picks FLR, PM or bus reset).
pub fn reset_write(bdf: Bdf) -> SysfsWrite {
    SysfsWrite {
        file: device_dir(bdf).join("reset"),
        value: "1".into(),
    }
}

/// Who a record entry belongs to, in words.
fn holder(p: &ActivePartition) -> String {
    match &p.guest {
        Some(g) => format!("guest {g}"),
        None => "an operator (`vfio-p2p fabric activate`)".into(),
    }
}

/// Resets `gpus`, activates partition `id` and records it for `guest`, under the bind lock.
/// FM's refusal leaves nothing to undo; a record that cannot be written deactivates again.
pub fn activate<S: SysfsWriter, P: PartitionWriter>(
    root: &Path,
    sysfs: &mut S,
    fm: &mut P,
    id: u32,
    gpus: &[Bdf],
    guest: Option<&str>,
    lock_timeout: Duration,
) -> Result<ActivationReport, ActivationError> {
    let _lock = BindLock::acquire(root, lock_timeout)?;
    let mut record = ActivationRecord::load(root)?;
    let mut report = ActivationReport {
        partition: id,
        ..ActivationReport::default()
    };
    if let Some(held) = record.partitions.get(&id) {
        if guest.is_some() && held.guest.as_deref() == guest {
            report.already_active = true;
            return Ok(report);
        }
        return Err(ActivationError::HeldByOther {
            id,
            holder: holder(held),
        });
    }
    for &bdf in gpus {
        let w = reset_write(bdf);
        if !root.join(&w.file).exists() {
            report.not_resettable.push(bdf);
            continue;
        }
        if let Ok(Binding {
            driver: Some(d), ..
        }) = read_binding(root, bdf)
        {
            if d != "vfio-pci" {
                report.reset_on_host_driver.push((bdf, d));
            }
        }
        sysfs
            .write(root, &w.file, &w.value)
            .map_err(|source| ActivationError::Reset {
                bdf,
                id,
                file: w.file.display().to_string(),
                source,
            })?;
        report.resets.push(w);
    }
    fm.activate(id)?;
    record.partitions.insert(
        id,
        ActivePartition {
            guest: guest.map(str::to_string),
            gpus: gpus.to_vec(),
        },
    );
    if let Err(e) = record.save(root) {
        let failed = Box::new(ActivationError::Record(e));
        return Err(match fm.deactivate(id) {
            Ok(()) => *failed,
            Err(undo) => ActivationError::UndoFailed { id, failed, undo },
        });
    }
    Ok(report)
}

/// What a deactivation found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deactivated {
    pub partition: u32,
    /// FM already had it inactive (say, FM restarted): only the record was cleared.
    pub was_inactive: bool,
}

/// Deactivates partitions `ids` and drops them from the record. Every id is tried; FM's
/// "not active" counts as done. The first other failure is returned after the rest ran,
/// its partition staying recorded.
pub fn deactivate<P: PartitionWriter>(
    root: &Path,
    fm: &mut P,
    ids: &[u32],
    lock_timeout: Duration,
) -> Result<Vec<Deactivated>, ActivationError> {
    let _lock = BindLock::acquire(root, lock_timeout)?;
    let mut record = ActivationRecord::load(root)?;
    let mut done = Vec::new();
    let mut first_error = None;
    for &id in ids {
        let was_inactive = match fm.deactivate(id) {
            Ok(()) => false,
            Err(e) if e.failure() == FmFailure::NotActive => true,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        record.partitions.remove(&id);
        done.push(Deactivated {
            partition: id,
            was_inactive,
        });
    }
    record.save(root)?;
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(done),
    }
}

/// Tells a restarted FM which partitions are active: every recorded one (none is a valid
/// answer: FM waits for the call either way).
pub fn resync<P: PartitionWriter>(
    root: &Path,
    fm: &mut P,
    lock_timeout: Duration,
) -> Result<Vec<u32>, ActivationError> {
    let _lock = BindLock::acquire(root, lock_timeout)?;
    let ids: Vec<u32> = ActivationRecord::load(root)?
        .partitions
        .keys()
        .copied()
        .collect();
    fm.set_activated(&ids)?;
    Ok(ids)
}

#[cfg(test)]
mod tests;
