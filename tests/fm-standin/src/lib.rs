//! A stand-in for NVIDIA Fabric Manager's client library, `libnvfm.so.1`, for tests on hosts
//! without NVSwitches: the same C entry points and struct layouts (from FM's published SDK
//! headers and user guide, "Fabric Manager SDK"), answering from a partition state machine
//! kept in the JSON file `$VFIO_P2P_FM_STANDIN` names. Point `VFIO_P2P_FM_LIBRARY` at the
//! built `libvfio_p2p_fm_standin.so` and vfio-p2p talks to it as to FM.
//!
//! The file is read at every call and written back after every change, so the state lives
//! across processes (the libvirt hook is one process per operation):
//!
//! ```json
//! { "running": true,                 // false: fmConnect fails as when FM is down
//!   "awaiting_resync": false,        // true: FM restarted, every call but
//!                                    //   fmSetActivatedFabricPartitions is FM_ST_NOT_CONFIGURED
//!   "connection_lost_after": null,   // N: the (N+1)-th call after fmConnect of a process
//!                                    //   and every later one is FM_ST_CONNECTION_NOT_VALID
//!   "partitions": [ { "id": 1, "active": false,
//!                     "gpus": [ { "module_id": 1, "pci": "00000000:13:00.0",
//!                                 "links": 18, "max_links": 18 } ] } ],
//!   "unsupported": [ { "id": 9, "module_ids": [1, 2] } ],
//!   "nvlink_failed_gpus": [ { "pci": "00000000:14:00.0", "ports": [3] } ],
//!   "fail_activate": { "1": "nvlink_error" },   // in_use, not_supported, nvlink_error,
//!   "fail_deactivate": {},                      //   not_ready, generic, connection_lost
//!   "observe": { "file": "/x/state.json", "text": "0000:0a:00.0" },  // each call appends
//!                                    //   "WHAT: present|absent" (text in file) to "observations"
//!   "hang": ["activate"],            // these calls never return (connect, get_supported,
//!                                    //   get_unsupported, get_nvlink_failed, activate,
//!                                    //   deactivate, set_activated): logged as "… (hangs)"
//!   "calls": [] }                    // appended: what was called, in order
//! ```
//!
//! FM's rules it plays: activating an active partition is `FM_ST_IN_USE`, one that shares a
//! GPU with an active partition `FM_ST_RESOURCE_IN_USE`, an unknown id `FM_ST_BADPARAM`;
//! deactivating an inactive one `FM_ST_UNINITIALIZED` (the header's "not activated").

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "VFIO_P2P_FM_STANDIN";

const ST_SUCCESS: c_int = 0;
const ST_BADPARAM: c_int = -1;
const ST_GENERIC_ERROR: c_int = -2;
const ST_NOT_SUPPORTED: c_int = -3;
const ST_UNINITIALIZED: c_int = -4;
const ST_VERSION_MISMATCH: c_int = -6;
const ST_IN_USE: c_int = -7;
const ST_NOT_CONFIGURED: c_int = -8;
const ST_CONNECTION_NOT_VALID: c_int = -9;
const ST_NVLINK_ERROR: c_int = -10;
const ST_RESOURCE_IN_USE: c_int = -12;
const ST_NOT_READY: c_int = -22;

const MAX_STR: usize = 256;
const UUID_LEN: usize = 80;
const PCI_ID_LEN: usize = 32;
const MAX_GPUS: usize = 16;
const MAX_SWITCHES: usize = 12;
const MAX_PARTITIONS: usize = 64;
const MAX_PORTS: usize = 64;

#[repr(C)]
pub struct ConnectParams {
    version: c_uint,
    address: [c_char; MAX_STR],
    timeout_ms: c_uint,
    is_unix_socket: c_uint,
}

#[repr(C)]
struct GpuInfo {
    physical_id: c_uint,
    uuid: [c_char; UUID_LEN],
    pci_bus_id: [c_char; PCI_ID_LEN],
    links_available: c_uint,
    links_max: c_uint,
    line_rate_mbps: c_uint,
}

#[repr(C)]
struct PartitionInfo {
    id: c_uint,
    is_active: c_uint,
    num_gpus: c_uint,
    gpus: [GpuInfo; MAX_GPUS],
}

#[repr(C)]
pub struct PartitionList {
    version: c_uint,
    num_partitions: c_uint,
    max_partitions: c_uint,
    partitions: [PartitionInfo; MAX_PARTITIONS],
}

#[repr(C)]
pub struct ActivatedList {
    version: c_uint,
    num_partitions: c_uint,
    ids: [c_uint; MAX_PARTITIONS],
}

#[repr(C)]
struct FailedDevice {
    uuid: [c_char; UUID_LEN],
    pci_bus_id: [c_char; PCI_ID_LEN],
    num_ports: c_uint,
    ports: [c_uint; MAX_PORTS],
}

#[repr(C)]
pub struct FailedDevices {
    version: c_uint,
    num_gpus: c_uint,
    num_switches: c_uint,
    gpus: [FailedDevice; MAX_GPUS],
    switches: [FailedDevice; MAX_SWITCHES],
}

#[repr(C)]
struct UnsupportedInfo {
    id: c_uint,
    num_gpus: c_uint,
    physical_ids: [c_uint; MAX_GPUS],
}

#[repr(C)]
pub struct UnsupportedList {
    version: c_uint,
    num_partitions: c_uint,
    partitions: [UnsupportedInfo; MAX_PARTITIONS],
}

/// FM's version rule: the struct's size in the low 24 bits, the version number above.
const fn version<T>(v: u32) -> c_uint {
    std::mem::size_of::<T>() as u32 | (v << 24)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Gpu {
    module_id: u32,
    #[serde(default)]
    pci: String,
    #[serde(default)]
    links: u32,
    #[serde(default)]
    max_links: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Partition {
    id: u32,
    #[serde(default)]
    active: bool,
    gpus: Vec<Gpu>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Unsupported {
    id: u32,
    module_ids: Vec<u32>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Failed {
    pci: String,
    ports: Vec<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    #[serde(default = "yes")]
    running: bool,
    #[serde(default)]
    awaiting_resync: bool,
    #[serde(default)]
    connection_lost_after: Option<u32>,
    #[serde(default)]
    partitions: Vec<Partition>,
    #[serde(default)]
    unsupported: Vec<Unsupported>,
    #[serde(default)]
    nvlink_failed_gpus: Vec<Failed>,
    #[serde(default)]
    fail_activate: BTreeMap<String, String>,
    #[serde(default)]
    fail_deactivate: BTreeMap<String, String>,
    #[serde(default)]
    hang: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observe: Option<Observe>,
    #[serde(default)]
    observations: Vec<String>,
    #[serde(default)]
    calls: Vec<String>,
}

/// A file whose content the tests want seen at each call (what the caller did before it).
#[derive(Debug, Serialize, Deserialize)]
struct Observe {
    file: String,
    text: String,
}

/// The library's own lock, held by a hung call for good. Like a C++ library's static
/// destructors, an exit handler (registered by `fmLibInit`) takes it: a process that exits
/// normally while a call hangs never ends, so callers must leave by `_exit`.
static LIBRARY_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

extern "C" fn take_library_lock_at_exit() {
    let _held = LIBRARY_LOCK.lock();
}

/// A call `hang` names: logged, then blocked for good, as a hung FM's library blocks.
fn hang_if_asked(state: &mut State, what: &str) {
    let name = what.split(' ').next().unwrap_or_default();
    if state.hang.iter().any(|h| h == name) {
        state.calls.push(format!("{what} (hangs)"));
        save(state);
        let _held = LIBRARY_LOCK.lock();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

fn yes() -> bool {
    true
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static CONNECTED: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU32 = AtomicU32::new(0);
static HANDLE: u8 = 0;

fn path() -> Option<String> {
    std::env::var(STATE_ENV).ok()
}

fn load() -> Option<State> {
    let text = std::fs::read_to_string(path()?).ok()?;
    match serde_json::from_str(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("fm-standin: {STATE_ENV}: {e}");
            None
        }
    }
}

fn save(state: &State) {
    if let Some(p) = path() {
        let text = serde_json::to_string_pretty(state).expect("the state serializes");
        let tmp = format!("{p}.tmp");
        if std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &p))
            .is_err()
        {
            eprintln!("fm-standin: cannot write {p}");
        }
    }
}

fn code_of(name: &str) -> c_int {
    match name {
        "in_use" => ST_IN_USE,
        "not_supported" => ST_NOT_SUPPORTED,
        "nvlink_error" => ST_NVLINK_ERROR,
        "not_ready" => ST_NOT_READY,
        "connection_lost" => ST_CONNECTION_NOT_VALID,
        _ => ST_GENERIC_ERROR,
    }
}

/// One API call on a connection: the common checks, then `f` on the loaded state; the call
/// is logged as `what` (with its result when it failed) and the state written back.
fn call(handle: *mut c_void, what: String, f: impl FnOnce(&mut State) -> c_int) -> c_int {
    if !INITIALIZED.load(Ordering::SeqCst) {
        return ST_UNINITIALIZED;
    }
    if handle.is_null() || !CONNECTED.load(Ordering::SeqCst) {
        return ST_BADPARAM;
    }
    let Some(mut state) = load() else {
        return ST_GENERIC_ERROR;
    };
    hang_if_asked(&mut state, &what);
    if let Some(o) = &state.observe {
        let seen = std::fs::read_to_string(&o.file).is_ok_and(|t| t.contains(&o.text));
        let seen = if seen { "present" } else { "absent" };
        state.observations.push(format!("{what}: {seen}"));
    }
    let n = CALLS.fetch_add(1, Ordering::SeqCst);
    let rc = if state.connection_lost_after.is_some_and(|after| n >= after) || !state.running {
        ST_CONNECTION_NOT_VALID
    } else if state.awaiting_resync
        && what != "set_activated"
        && !what.starts_with("set_activated ")
    {
        ST_NOT_CONFIGURED
    } else {
        f(&mut state)
    };
    state.calls.push(if rc == ST_SUCCESS {
        what
    } else {
        format!("{what} -> {rc}")
    });
    save(&state);
    rc
}

/// Copies `s` into a C char array, NUL-terminated, cut to fit.
fn put_str(dst: &mut [c_char], s: &str) {
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

#[no_mangle]
pub extern "C" fn fmLibInit() -> c_int {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: atexit stores a plain `extern "C" fn()` with no captured state; it is
    // registered once.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(take_library_lock_at_exit);
    });
    if INITIALIZED.swap(true, Ordering::SeqCst) {
        ST_IN_USE
    } else {
        ST_SUCCESS
    }
}

#[no_mangle]
pub extern "C" fn fmLibShutdown() -> c_int {
    CONNECTED.store(false, Ordering::SeqCst);
    if INITIALIZED.swap(false, Ordering::SeqCst) {
        ST_SUCCESS
    } else {
        ST_UNINITIALIZED
    }
}

/// # Safety
/// `params` and `handle` are null or valid for reads / writes, as FM's `fmConnect` requires.
#[no_mangle]
pub unsafe extern "C" fn fmConnect(params: *mut ConnectParams, handle: *mut *mut c_void) -> c_int {
    if !INITIALIZED.load(Ordering::SeqCst) {
        return ST_UNINITIALIZED;
    }
    if params.is_null() || handle.is_null() {
        return ST_BADPARAM;
    }
    // SAFETY: checked non-null; the caller passes a valid fmConnectParams_v1.
    let p = unsafe { &*params };
    if p.version != version::<ConnectParams>(1) {
        return ST_VERSION_MISMATCH;
    }
    // SAFETY: `address` is a NUL-terminated array inside the struct (its last byte is 0
    // or the scan stops at the first 0 the caller wrote).
    let address = unsafe { CStr::from_ptr(p.address.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let Some(mut state) = load() else {
        return ST_GENERIC_ERROR;
    };
    let kind = if p.is_unix_socket == 1 { "unix" } else { "tcp" };
    hang_if_asked(&mut state, &format!("connect {kind} {address}"));
    let rc = if state.running {
        ST_SUCCESS
    } else {
        ST_CONNECTION_NOT_VALID
    };
    state
        .calls
        .push(format!("connect {kind} {address} -> {rc}"));
    save(&state);
    if rc == ST_SUCCESS {
        CONNECTED.store(true, Ordering::SeqCst);
        CALLS.store(0, Ordering::SeqCst);
        // SAFETY: checked non-null; the caller's handle slot.
        unsafe { *handle = std::ptr::addr_of!(HANDLE) as *mut c_void };
    }
    rc
}

#[no_mangle]
pub extern "C" fn fmDisconnect(handle: *mut c_void) -> c_int {
    if handle.is_null() {
        return ST_BADPARAM;
    }
    CONNECTED.store(false, Ordering::SeqCst);
    ST_SUCCESS
}

/// # Safety
/// `list` is null or points to a writable `fmFabricPartitionList_t`.
#[no_mangle]
pub unsafe extern "C" fn fmGetSupportedFabricPartitions(
    handle: *mut c_void,
    list: *mut PartitionList,
) -> c_int {
    if list.is_null() {
        return ST_BADPARAM;
    }
    // SAFETY: checked non-null; the caller's struct.
    let list = unsafe { &mut *list };
    if list.version != version::<PartitionList>(1) {
        return ST_VERSION_MISMATCH;
    }
    call(handle, "get_supported".into(), |s| {
        list.num_partitions = s.partitions.len().min(MAX_PARTITIONS) as c_uint;
        list.max_partitions = MAX_PARTITIONS as c_uint;
        for (dst, p) in list.partitions.iter_mut().zip(&s.partitions) {
            dst.id = p.id;
            dst.is_active = p.active as c_uint;
            dst.num_gpus = p.gpus.len().min(MAX_GPUS) as c_uint;
            for (g, src) in dst.gpus.iter_mut().zip(&p.gpus) {
                g.physical_id = src.module_id;
                put_str(&mut g.pci_bus_id, &src.pci);
                g.links_available = src.links;
                g.links_max = src.max_links;
            }
        }
        ST_SUCCESS
    })
}

/// # Safety
/// `list` is null or points to a writable `fmUnsupportedFabricPartitionList_t`.
#[no_mangle]
pub unsafe extern "C" fn fmGetUnsupportedFabricPartitions(
    handle: *mut c_void,
    list: *mut UnsupportedList,
) -> c_int {
    if list.is_null() {
        return ST_BADPARAM;
    }
    // SAFETY: checked non-null; the caller's struct.
    let list = unsafe { &mut *list };
    if list.version != version::<UnsupportedList>(1) {
        return ST_VERSION_MISMATCH;
    }
    call(handle, "get_unsupported".into(), |s| {
        list.num_partitions = s.unsupported.len().min(MAX_PARTITIONS) as c_uint;
        for (dst, u) in list.partitions.iter_mut().zip(&s.unsupported) {
            dst.id = u.id;
            dst.num_gpus = u.module_ids.len().min(MAX_GPUS) as c_uint;
            for (d, m) in dst.physical_ids.iter_mut().zip(&u.module_ids) {
                *d = *m;
            }
        }
        ST_SUCCESS
    })
}

/// # Safety
/// `list` is null or points to a writable `fmNvlinkFailedDevices_t`.
#[no_mangle]
pub unsafe extern "C" fn fmGetNvlinkFailedDevices(
    handle: *mut c_void,
    list: *mut FailedDevices,
) -> c_int {
    if list.is_null() {
        return ST_BADPARAM;
    }
    // SAFETY: checked non-null; the caller's struct.
    let list = unsafe { &mut *list };
    if list.version != version::<FailedDevices>(1) {
        return ST_VERSION_MISMATCH;
    }
    call(handle, "get_nvlink_failed".into(), |s| {
        list.num_gpus = s.nvlink_failed_gpus.len().min(MAX_GPUS) as c_uint;
        list.num_switches = 0;
        for (dst, f) in list.gpus.iter_mut().zip(&s.nvlink_failed_gpus) {
            put_str(&mut dst.pci_bus_id, &f.pci);
            dst.num_ports = f.ports.len().min(MAX_PORTS) as c_uint;
            for (d, p) in dst.ports.iter_mut().zip(&f.ports) {
                *d = *p;
            }
        }
        ST_SUCCESS
    })
}

fn modules(p: &Partition) -> Vec<u32> {
    p.gpus.iter().map(|g| g.module_id).collect()
}

#[no_mangle]
pub extern "C" fn fmActivateFabricPartition(handle: *mut c_void, id: c_uint) -> c_int {
    call(handle, format!("activate {id}"), |s| {
        if let Some(f) = s.fail_activate.get(&id.to_string()) {
            return code_of(f);
        }
        let Some(p) = s.partitions.iter().find(|p| p.id == id) else {
            return ST_BADPARAM;
        };
        if s.unsupported.iter().any(|u| u.id == id) {
            return ST_NOT_SUPPORTED;
        }
        if p.active {
            return ST_IN_USE;
        }
        let wanted = modules(p);
        let busy = s
            .partitions
            .iter()
            .filter(|o| o.active)
            .any(|o| modules(o).iter().any(|m| wanted.contains(m)));
        if busy {
            return ST_RESOURCE_IN_USE;
        }
        if let Some(p) = s.partitions.iter_mut().find(|p| p.id == id) {
            p.active = true;
        }
        ST_SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn fmDeactivateFabricPartition(handle: *mut c_void, id: c_uint) -> c_int {
    call(handle, format!("deactivate {id}"), |s| {
        if let Some(f) = s.fail_deactivate.get(&id.to_string()) {
            return code_of(f);
        }
        match s.partitions.iter_mut().find(|p| p.id == id) {
            None => ST_BADPARAM,
            Some(p) if !p.active => ST_UNINITIALIZED,
            Some(p) => {
                p.active = false;
                ST_SUCCESS
            }
        }
    })
}

/// # Safety
/// `list` is null or points to a readable `fmActivatedFabricPartitionList_t`.
#[no_mangle]
pub unsafe extern "C" fn fmSetActivatedFabricPartitions(
    handle: *mut c_void,
    list: *mut ActivatedList,
) -> c_int {
    if list.is_null() {
        return ST_BADPARAM;
    }
    // SAFETY: checked non-null; the caller's struct.
    let list = unsafe { &*list };
    if list.version != version::<ActivatedList>(1) || list.num_partitions as usize > MAX_PARTITIONS
    {
        return ST_BADPARAM;
    }
    let ids: Vec<u32> = list.ids[..list.num_partitions as usize].to_vec();
    let shown: Vec<String> = ids.iter().map(u32::to_string).collect();
    call(
        handle,
        format!("set_activated [{}]", shown.join(",")),
        |s| {
            if ids
                .iter()
                .any(|id| !s.partitions.iter().any(|p| p.id == *id))
            {
                return ST_BADPARAM;
            }
            for p in &mut s.partitions {
                p.active = ids.contains(&p.id);
            }
            s.awaiting_resync = false;
            ST_SUCCESS
        },
    )
}

// The sizes FM's headers give these structs (sum of their members; no padding: all 4-byte).
const _: () = assert!(std::mem::size_of::<ConnectParams>() == 268);
const _: () = assert!(std::mem::size_of::<PartitionList>() == 12 + 64 * (12 + 16 * 128));
const _: () = assert!(std::mem::size_of::<ActivatedList>() == 8 + 64 * 4);
const _: () = assert!(std::mem::size_of::<FailedDevices>() == 12 + 28 * 372);
const _: () = assert!(std::mem::size_of::<UnsupportedList>() == 8 + 64 * 72);
