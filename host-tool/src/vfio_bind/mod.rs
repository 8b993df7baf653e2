//! Moving devices between host drivers and vfio-pci: the only code that writes sysfs.
//!
//! [`plan`] decides from the topology what moves; [`apply`] writes, transactionally;
//! [`state`] records what was moved so it can be restored exactly; [`lock`] keeps
//! concurrent runs apart; [`sim`] plays the kernel for tests.

pub mod apply;
pub mod lock;
pub mod plan;
pub mod session;
pub mod sim;
pub mod state;

pub use apply::{
    FailAt, FileWriter, Moved, SysfsWrite, SysfsWriter, Transaction, TransactionError,
};
pub use lock::{BindLock, LockError};
pub use plan::{
    plan_bind, plan_unbind, BindOptions, Plan, PlanError, PlannedDevice, Reason, Target, VFIO_PCI,
};
pub use session::{
    bind, unbind, DeviceReport, SessionError, SessionOptions, SessionReport, UnbindSelection,
};
pub use state::{BindState, DeviceRecordEntry, StateError};
