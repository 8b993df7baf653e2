//! Moving devices between host drivers and vfio-pci: the only code that writes sysfs.
//!
//! [`plan`] decides from the topology what moves; [`apply`] writes, transactionally;
//! [`state`] records what was moved so it can be restored exactly; [`lock`] keeps
//! concurrent runs apart; [`sim`] plays the kernel for tests.

#![forbid(unsafe_code)]

pub mod apply;
pub mod bind_plan;
pub mod lock;
pub mod memory_offline;
pub mod partition_activation;
pub mod session;
pub mod sim;
pub mod state;
pub mod text;

pub use apply::{
    FailAt, FileWriter, Moved, SysfsWrite, SysfsWriter, Transaction, TransactionError,
};
pub use bind_plan::{
    is_vfio_driver, plan_bind, plan_unbind, vfio_driver_for, BindOptions, BindPlan, BindPlanError,
    PlannedDevice, Reason, Target, GRACE_GPU_IDS, NVGRACE_GPU_VFIO_PCI,
    NVGRACE_GPU_VFIO_PCI_MODULE, VFIO_PCI,
};
pub use lock::{BindLock, LockError};
pub use memory_offline::{OfflineError, GPU_MEMORY_OFFLINE_WAIT};
pub use session::{
    bind, unbind, DeviceReport, SessionError, SessionOptions, SessionReport, UnbindSelection,
};
pub use state::{BindState, DeviceRecordEntry, StateError};

/// Environment variable of the failure-injection test hook (see [`writer`]).
pub const FAIL_AFTER_ENV: &str = "VFIO_P2P_FAIL_AFTER";

/// The real writer; with `VFIO_P2P_FAIL_AFTER=N` (a test hook for rollback on a real
/// kernel) its N-th write fails.
pub fn writer() -> anyhow::Result<Box<dyn SysfsWriter>> {
    use anyhow::Context as _;
    match std::env::var(FAIL_AFTER_ENV) {
        Ok(v) => {
            let n: usize =
                v.trim().parse().ok().filter(|n| *n > 0).with_context(|| {
                    format!("{FAIL_AFTER_ENV}={v:?}: expected a write number ≥ 1")
                })?;
            tracing::warn!("{FAIL_AFTER_ENV}={n}: sysfs write {n} will fail (test hook)");
            Ok(Box::new(FailAt::new(FileWriter, n)))
        }
        Err(_) => Ok(Box::new(FileWriter)),
    }
}

impl SysfsWriter for Box<dyn SysfsWriter> {
    fn write(
        &mut self,
        root: &std::path::Path,
        file: &std::path::Path,
        value: &str,
    ) -> std::io::Result<()> {
        (**self).write(root, file, value)
    }
}

#[cfg(test)]
mod grace_tests;
#[cfg(test)]
mod reset_tests;
