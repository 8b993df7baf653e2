//! What went wrong talking to Fabric Manager, in words an operator acts on: FM's return
//! code named, what it means for the call that got it, and the fix.

use std::fmt;

use crate::abi::{self, FmReturn};

/// The FM call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FmCall {
    LibInit,
    Connect,
    GetSupported,
    GetUnsupported,
    GetNvlinkFailed,
    Activate(u32),
    Deactivate(u32),
    SetActivated,
}

impl fmt::Display for FmCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FmCall::LibInit => write!(f, "fmLibInit"),
            FmCall::Connect => write!(f, "fmConnect"),
            FmCall::GetSupported => write!(f, "fmGetSupportedFabricPartitions"),
            FmCall::GetUnsupported => write!(f, "fmGetUnsupportedFabricPartitions"),
            FmCall::GetNvlinkFailed => write!(f, "fmGetNvlinkFailedDevices"),
            FmCall::Activate(id) => write!(f, "fmActivateFabricPartition({id})"),
            FmCall::Deactivate(id) => write!(f, "fmDeactivateFabricPartition({id})"),
            FmCall::SetActivated => write!(f, "fmSetActivatedFabricPartitions"),
        }
    }
}

/// The kinds of failure callers decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FmFailure {
    /// No FM here: its client library is not installed.
    NoLibrary,
    /// FM is not running or not listening where host.yaml says (or went away mid-way).
    Unreachable,
    /// The partition (or one of its GPUs) is active already.
    InUse,
    /// The partition is not active (deactivate).
    NotActive,
    /// Anything else FM refused.
    Refused,
}

#[derive(Debug, thiserror::Error)]
pub enum FmError {
    #[error("Fabric Manager's client library {library} cannot be loaded ({message}): install nvidia-fabricmanager-dev (libnvfm.so.1) of the driver's version{env}")]
    NoLibrary {
        library: String,
        message: String,
        env: &'static str,
    },
    #[error("Fabric Manager's client library {library} is there but does not load ({message}): reinstall nvidia-fabricmanager-dev of the driver's version (and what it depends on){env}")]
    Unloadable {
        library: String,
        message: String,
        env: &'static str,
    },
    #[error("{library}: {symbol} missing ({message}): not Fabric Manager's client library, or too old; install nvidia-fabricmanager-dev of the driver's version")]
    Symbol {
        library: String,
        symbol: &'static str,
        message: String,
    },
    #[error("{}", call_text(.call, *.code, .address))]
    Call {
        call: FmCall,
        code: FmReturn,
        address: String,
    },
    #[error("Fabric Manager at {address}: {}", deadline_text(.call, .after, *.earlier))]
    Deadline {
        call: FmCall,
        address: String,
        after: std::time::Duration,
        /// An earlier call is what blocked: this one was not made.
        earlier: bool,
    },
    /// The call was not made: what vfio-p2p would send exceeds what FM's SDK takes.
    #[error("Fabric Manager at {address}: {call} not made: {why}")]
    NotMade {
        call: FmCall,
        address: String,
        why: String,
    },
    #[error("Fabric Manager at {address} answered {call} with {count} entries, more than the {max} its SDK allows: not a Fabric Manager this tool understands")]
    BadAnswer {
        call: FmCall,
        address: String,
        count: u32,
        max: usize,
    },
}

impl FmError {
    pub fn failure(&self) -> FmFailure {
        match self {
            FmError::NoLibrary { .. } => FmFailure::NoLibrary,
            FmError::Deadline { .. } | FmError::Unloadable { .. } => FmFailure::Unreachable,
            FmError::Symbol { .. } | FmError::BadAnswer { .. } | FmError::NotMade { .. } => {
                FmFailure::Refused
            }
            FmError::Call { call, code, .. } => match (*code, call) {
                (abi::CONNECTION_NOT_VALID | abi::TIMEOUT, _) => FmFailure::Unreachable,
                (
                    abi::IN_USE | abi::RESOURCE_IN_USE | abi::RESOURCE_USED_IN_ANOTHER_PARTITION,
                    FmCall::Activate(_),
                ) => FmFailure::InUse,
                (abi::UNINITIALIZED | abi::PARTITION_ID_NOT_IN_USE, FmCall::Deactivate(_)) => {
                    FmFailure::NotActive
                }
                _ => FmFailure::Refused,
            },
        }
    }
}

/// A call FM's library did not return from in time, and the fix.
fn deadline_text(call: &FmCall, after: &std::time::Duration, earlier: bool) -> String {
    let s = after.as_secs_f64();
    let what = if earlier {
        format!("{call} not made: an earlier call did not return within {s} s")
    } else {
        format!("{call} did not return within {s} s")
    };
    format!("{what} (Fabric Manager hangs, or its socket stalls); check `systemctl status nvidia-fabricmanager` and /var/log/fabricmanager.log, restart it if it hangs, then retry")
}

/// What FM's answer means for this call, then the fix.
fn call_text(call: &FmCall, code: FmReturn, address: &str) -> String {
    let name = abi::code_name(code);
    let (words, fix) = meaning(call, code);
    format!("Fabric Manager at {address}: {call} failed with {name} ({code}): {words}; {fix}")
}

const LIST: &str = "`vfio-p2p fabric list` shows FM's partitions and which are active";

fn meaning(call: &FmCall, code: FmReturn) -> (String, String) {
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    match (code, call) {
        (abi::CONNECTION_NOT_VALID, FmCall::Connect) => s(
            "Fabric Manager is not running or not listening there",
            "start it with `systemctl start nvidia-fabricmanager` (FABRIC_MODE=1 for shared NVSwitch), or point `fabric_manager: address:` in /etc/vfio-p2p/host.yaml at it",
        ),
        (abi::CONNECTION_NOT_VALID, _) => s(
            "the connection to Fabric Manager was lost",
            "check `systemctl status nvidia-fabricmanager`; once it runs again, `vfio-p2p fabric resync` tells it which partitions are active",
        ),
        (abi::TIMEOUT, _) => s(
            "Fabric Manager did not answer in time",
            "check `systemctl status nvidia-fabricmanager` and its log /var/log/fabricmanager.log, then retry",
        ),
        (abi::IN_USE | abi::RESOURCE_IN_USE | abi::RESOURCE_USED_IN_ANOTHER_PARTITION, FmCall::Activate(_)) => (
            "the partition, or a GPU of it, is already active for another VM".into(),
            format!("{LIST}; stop the VM that holds it, or `vfio-p2p fabric deactivate ID` a partition no VM uses"),
        ),
        (abi::UNINITIALIZED | abi::PARTITION_ID_NOT_IN_USE, FmCall::Deactivate(_)) => (
            "the partition is not active".into(),
            format!("nothing to deactivate; {LIST}"),
        ),
        (abi::UNINITIALIZED, _) => s(
            "the FM client library was not initialized",
            "a bug in vfio-p2p: please report it",
        ),
        (abi::NOT_SUPPORTED, _) => (
            "Fabric Manager does not support this here: it is not in shared NVSwitch mode, or the partition is unsupported on this board now".into(),
            format!("set FABRIC_MODE=1 in /usr/share/nvidia/nvswitch/fabricmanager.cfg and restart FM; {LIST}"),
        ),
        (abi::NVLINK_ERROR, _) => s(
            "NVLink training failed for the partition's GPUs",
            "reset its GPUs (they stay on vfio-pci, no VM running) and retry; if it fails again see /var/log/fabricmanager.log and `nvidia-smi -q` on the host, and use another partition",
        ),
        (abi::NOT_CONFIGURED | abi::NOT_READY, _) => s(
            "Fabric Manager is still initializing (or restarted and waits for the active partitions)",
            "wait for it (`journalctl -u nvidia-fabricmanager`); after an FM restart run `vfio-p2p fabric resync`",
        ),
        (abi::VERSION_MISMATCH, _) => s(
            "the client library and Fabric Manager speak different API versions",
            "install nvidia-fabricmanager-dev of the same version as nvidia-fabricmanager and the driver",
        ),
        (abi::BADPARAM, FmCall::Activate(_) | FmCall::Deactivate(_)) => (
            "Fabric Manager knows no such partition".into(),
            LIST.to_string(),
        ),
        (abi::BADPARAM, FmCall::Connect) => s(
            "the address is not one FM accepts",
            "give `fabric_manager: address:` as HOST:PORT or unix:/PATH in /etc/vfio-p2p/host.yaml",
        ),
        _ => s(
            "Fabric Manager refused the request",
            "see /var/log/fabricmanager.log and `systemctl status nvidia-fabricmanager`",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(call: FmCall, code: FmReturn) -> FmError {
        FmError::Call {
            call,
            code,
            address: "127.0.0.1:6666".into(),
        }
    }

    #[test]
    fn each_code_gets_its_words_and_fix() {
        let e = call(FmCall::Connect, abi::CONNECTION_NOT_VALID);
        assert_eq!(e.failure(), FmFailure::Unreachable);
        let t = e.to_string();
        assert!(t.contains("FM_ST_CONNECTION_NOT_VALID (-9)"), "{t}");
        assert!(t.contains("systemctl start nvidia-fabricmanager"), "{t}");
        let t = call(FmCall::GetSupported, abi::CONNECTION_NOT_VALID).to_string();
        assert!(t.contains("lost") && t.contains("fabric resync"), "{t}");
        let e = call(FmCall::Activate(3), abi::IN_USE);
        assert_eq!(e.failure(), FmFailure::InUse);
        assert!(e.to_string().contains("already active"), "{e}");
        let e = call(FmCall::Activate(3), abi::NVLINK_ERROR);
        assert_eq!(e.failure(), FmFailure::Refused);
        assert!(e.to_string().contains("NVLink training failed"), "{e}");
        let e = call(FmCall::Activate(3), abi::NOT_SUPPORTED);
        assert!(e.to_string().contains("FABRIC_MODE=1"), "{e}");
        let e = call(FmCall::Deactivate(3), abi::UNINITIALIZED);
        assert_eq!(e.failure(), FmFailure::NotActive);
        // UNINITIALIZED means "not active" only for deactivate
        assert_eq!(
            call(FmCall::Activate(3), abi::UNINITIALIZED).failure(),
            FmFailure::Refused
        );
    }
}
