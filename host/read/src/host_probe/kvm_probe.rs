//! Whether KVM is usable and can create the KVM-VFIO device that VFIO pass-through needs.

use std::path::Path;

use kvm_bindings::{kvm_create_device, kvm_device_type_KVM_DEV_TYPE_VFIO};
use kvm_ioctls::Kvm;

/// How far the KVM probe got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmProbe {
    /// `/dev/kvm` opened, a VM was created and it accepted a KVM-VFIO device.
    Usable { api_version: i32 },
    /// A step failed: which one and the error.
    Failed { step: &'static str, error: String },
}

/// Opens `kvm_path`, creates a VM and a KVM-VFIO device in it; all are closed on return.
pub fn probe(kvm_path: &Path) -> KvmProbe {
    let fail = |step, e: kvm_ioctls::Error| KvmProbe::Failed {
        step,
        error: e.to_string(),
    };
    let Some(path) = kvm_path
        .to_str()
        .and_then(|p| std::ffi::CString::new(p).ok())
    else {
        return KvmProbe::Failed {
            step: "open",
            error: format!("{} is not a usable path", kvm_path.display()),
        };
    };
    let kvm = match Kvm::new_with_path(&path) {
        Ok(k) => k,
        Err(e) => return fail("open", e),
    };
    let api_version = kvm.get_api_version();
    let vm = match kvm.create_vm() {
        Ok(v) => v,
        Err(e) => return fail("create a VM", e),
    };
    let mut dev = kvm_create_device {
        type_: kvm_device_type_KVM_DEV_TYPE_VFIO,
        fd: 0,
        flags: 0,
    };
    match vm.create_device(&mut dev) {
        Ok(_) => KvmProbe::Usable { api_version },
        Err(e) => fail("create the KVM-VFIO device", e),
    }
}
