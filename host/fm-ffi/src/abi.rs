//! The C ABI of Fabric Manager's client library as its SDK documents it (`nv_fm_types.h`,
//! FM user guide "Fabric Manager SDK"): return codes, array limits and struct layouts,
//! written from those facts. Every struct carries a version made by FM's rule: its size in
//! the low 24 bits, the version number above them.

use std::ffi::{c_char, c_int, c_uint};

/// `fmReturn_t`.
pub type FmReturn = c_int;
pub const FM_ST_SUCCESS: FmReturn = 0;

/// The name and meaning of each `FM_ST_*` code (0 to -29).
pub fn code_name(code: FmReturn) -> &'static str {
    const NAMES: [&str; 30] = [
        "FM_ST_SUCCESS",
        "FM_ST_BADPARAM",
        "FM_ST_GENERIC_ERROR",
        "FM_ST_NOT_SUPPORTED",
        "FM_ST_UNINITIALIZED",
        "FM_ST_TIMEOUT",
        "FM_ST_VERSION_MISMATCH",
        "FM_ST_IN_USE",
        "FM_ST_NOT_CONFIGURED",
        "FM_ST_CONNECTION_NOT_VALID",
        "FM_ST_NVLINK_ERROR",
        "FM_ST_RESOURCE_BAD",
        "FM_ST_RESOURCE_IN_USE",
        "FM_ST_RESOURCE_NOT_IN_USE",
        "FM_ST_RESOURCE_EXHAUSTED",
        "FM_ST_RESOURCE_NOT_READY",
        "FM_ST_PARTITION_EXISTS",
        "FM_ST_PARTITION_ID_IN_USE",
        "FM_ST_PARTITION_ID_NOT_IN_USE",
        "FM_ST_PARTITION_NAME_IN_USE",
        "FM_ST_PARTITION_NAME_NOT_IN_USE",
        "FM_ST_PARTITION_ID_NAME_MISMATCH",
        "FM_ST_NOT_READY",
        "FM_ST_RESOURCE_USED_IN_THIS_PARTITION",
        "FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION",
        "FM_ST_PARTITION_MISWIRED_TRUNKS",
        "FM_ST_PARTITION_INSUFFICIENT_TRUNKS",
        "FM_ST_PARTITION_MISSING_SWITCHES",
        "FM_ST_PARTITION_NETWORK_CONFIG_ERROR",
        "FM_ST_PARTITION_ROUTE_PROGRAMMING_ERROR",
    ];
    usize::try_from(-i64::from(code))
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("an unknown FM_ST code")
}

pub const BADPARAM: FmReturn = -1;
pub const NOT_SUPPORTED: FmReturn = -3;
pub const UNINITIALIZED: FmReturn = -4;
pub const TIMEOUT: FmReturn = -5;
pub const VERSION_MISMATCH: FmReturn = -6;
pub const IN_USE: FmReturn = -7;
pub const NOT_CONFIGURED: FmReturn = -8;
pub const CONNECTION_NOT_VALID: FmReturn = -9;
pub const NVLINK_ERROR: FmReturn = -10;
pub const RESOURCE_IN_USE: FmReturn = -12;
pub const PARTITION_ID_NOT_IN_USE: FmReturn = -18;
pub const NOT_READY: FmReturn = -22;
pub const RESOURCE_USED_IN_ANOTHER_PARTITION: FmReturn = -24;

/// `FM_MAX_STR_LENGTH`.
pub const MAX_STR_LENGTH: usize = 256;
/// `FM_UUID_BUFFER_SIZE`.
pub const UUID_BUFFER_SIZE: usize = 80;
/// `FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
pub const PCI_BUS_ID_BUFFER_SIZE: usize = 32;
/// `FM_MAX_NUM_GPUS`.
pub const MAX_NUM_GPUS: usize = 16;
/// `FM_MAX_NUM_NVSWITCHES`.
pub const MAX_NUM_NVSWITCHES: usize = 12;
/// `FM_MAX_FABRIC_PARTITIONS`.
pub const MAX_FABRIC_PARTITIONS: usize = 64;
/// `FM_MAX_NUM_NVLINK_PORTS`.
pub const MAX_NUM_NVLINK_PORTS: usize = 64;

/// `MAKE_FM_PARAM_VERSION(T, v)`.
pub const fn param_version<T>(v: u32) -> c_uint {
    std::mem::size_of::<T>() as u32 | (v << 24)
}

/// `fmConnectParams_v1`: every FM release accepts it (v2 only adds an address type).
#[repr(C)]
pub struct ConnectParams {
    pub version: c_uint,
    pub address_info: [c_char; MAX_STR_LENGTH],
    pub timeout_ms: c_uint,
    pub address_is_unix_socket: c_uint,
}

/// `fmFabricPartitionGpuInfo_t`.
#[repr(C)]
pub struct PartitionGpuInfo {
    pub physical_id: c_uint,
    pub uuid: [c_char; UUID_BUFFER_SIZE],
    pub pci_bus_id: [c_char; PCI_BUS_ID_BUFFER_SIZE],
    pub num_nvlinks_available: c_uint,
    pub max_num_nvlinks: c_uint,
    pub nvlink_line_rate_mbps: c_uint,
}

/// `fmFabricPartitionInfo_t`.
#[repr(C)]
pub struct PartitionInfo {
    pub partition_id: c_uint,
    pub is_active: c_uint,
    pub num_gpus: c_uint,
    pub gpu_info: [PartitionGpuInfo; MAX_NUM_GPUS],
}

/// `fmFabricPartitionList_v2`, whose version number is 1.
#[repr(C)]
pub struct PartitionList {
    pub version: c_uint,
    pub num_partitions: c_uint,
    pub max_num_partitions: c_uint,
    pub partition_info: [PartitionInfo; MAX_FABRIC_PARTITIONS],
}

/// `fmActivatedFabricPartitionList_v1`.
#[repr(C)]
pub struct ActivatedPartitionList {
    pub version: c_uint,
    pub num_partitions: c_uint,
    pub partition_ids: [c_uint; MAX_FABRIC_PARTITIONS],
}

/// `fmNvlinkFailedDeviceInfo_t`.
#[repr(C)]
pub struct NvlinkFailedDeviceInfo {
    pub uuid: [c_char; UUID_BUFFER_SIZE],
    pub pci_bus_id: [c_char; PCI_BUS_ID_BUFFER_SIZE],
    pub num_ports: c_uint,
    pub port_num: [c_uint; MAX_NUM_NVLINK_PORTS],
}

/// `fmNvlinkFailedDevices_v1`.
#[repr(C)]
pub struct NvlinkFailedDevices {
    pub version: c_uint,
    pub num_gpus: c_uint,
    pub num_switches: c_uint,
    pub gpu_info: [NvlinkFailedDeviceInfo; MAX_NUM_GPUS],
    pub switch_info: [NvlinkFailedDeviceInfo; MAX_NUM_NVSWITCHES],
}

/// `fmUnsupportedFabricPartitionInfo_t`.
#[repr(C)]
pub struct UnsupportedPartitionInfo {
    pub partition_id: c_uint,
    pub num_gpus: c_uint,
    pub gpu_physical_ids: [c_uint; MAX_NUM_GPUS],
}

/// `fmUnsupportedFabricPartitionList_v1`.
#[repr(C)]
pub struct UnsupportedPartitionList {
    pub version: c_uint,
    pub num_partitions: c_uint,
    pub partition_info: [UnsupportedPartitionInfo; MAX_FABRIC_PARTITIONS],
}

/// A zeroed `T` in a box (the partition list is 129 KiB: too big for a hook's stack to
/// take lightly). All these structs are plain integers and char arrays: zero is valid.
pub fn zeroed_box<T: Plain>() -> Box<T> {
    // SAFETY: `T: Plain` only for the repr(C) integer/char-array structs above, for which
    // the all-zero bit pattern is a valid value.
    unsafe { Box::new(std::mem::zeroed()) }
}

/// Structs made only of integers and integer arrays.
pub trait Plain {}
impl Plain for ConnectParams {}
impl Plain for PartitionList {}
impl Plain for ActivatedPartitionList {}
impl Plain for NvlinkFailedDevices {}
impl Plain for UnsupportedPartitionList {}

/// A NUL-terminated C string field as text (up to its first NUL or its end).
pub fn field_text(field: &[c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

// The sizes the SDK's layouts give (all members 4-byte aligned: no padding); a field out of
// place changes the size and FM answers FM_ST_VERSION_MISMATCH, so pin them here.
const _: () = assert!(std::mem::size_of::<ConnectParams>() == 4 + 256 + 4 + 4);
const _: () = assert!(std::mem::size_of::<PartitionGpuInfo>() == 4 + 80 + 32 + 3 * 4);
const _: () = assert!(std::mem::size_of::<PartitionInfo>() == 12 + 16 * 128);
const _: () = assert!(std::mem::size_of::<PartitionList>() == 12 + 64 * 2060);
const _: () = assert!(std::mem::size_of::<ActivatedPartitionList>() == 8 + 64 * 4);
const _: () = assert!(std::mem::size_of::<NvlinkFailedDeviceInfo>() == 80 + 32 + 4 + 64 * 4);
const _: () = assert!(std::mem::size_of::<NvlinkFailedDevices>() == 12 + 28 * 372);
const _: () = assert!(std::mem::size_of::<UnsupportedPartitionList>() == 8 + 64 * 72);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_the_sdk_rule() {
        // MAKE_FM_PARAM_VERSION(fmFabricPartitionList_v2, 1) = sizeof | 1 << 24
        assert_eq!(param_version::<PartitionList>(1), 131_852 | 0x0100_0000);
        assert_eq!(param_version::<ConnectParams>(1), 268 | 0x0100_0000);
    }

    #[test]
    fn codes_have_their_names() {
        assert_eq!(code_name(0), "FM_ST_SUCCESS");
        assert_eq!(
            code_name(CONNECTION_NOT_VALID),
            "FM_ST_CONNECTION_NOT_VALID"
        );
        assert_eq!(code_name(NVLINK_ERROR), "FM_ST_NVLINK_ERROR");
        assert_eq!(code_name(-29), "FM_ST_PARTITION_ROUTE_PROGRAMMING_ERROR");
        assert_eq!(code_name(-30), "an unknown FM_ST code");
        assert_eq!(code_name(5), "an unknown FM_ST code");
    }
}
