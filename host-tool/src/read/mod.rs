//! Read stage: turns a host's sysfs (live, a snapshot directory, or a flat JSON
//! dump) into a [`HostRecord`]. Nothing else in the crate reads sysfs.

pub mod attr;
pub mod binding;
pub mod flat_json;
pub mod record;
pub mod sysfs;

pub use binding::{devices_use, read_binding, Binding, DeviceUse, HostUser};
pub use record::{DeviceRecord, HostBridgeId, HostRecord, ReadWarning, Resource};
pub use sysfs::{read_host, ReadError};
