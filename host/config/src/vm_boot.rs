//! vm.yaml's keys for starting the guest as generated: a kernel booted directly
//! (`kernel:`, `initramfs:`, `cmdline:`; Cloud Hypervisor), this VM's copy of OVMF's
//! variable store (`ovmf_vars_copy:`; QEMU writes the VM's UEFI variables there, never into
//! the template `ovmf_vars:`), and QEMU as a service (`daemonize:`, `qmp_socket:`). What a
//! VMM makes of them is decided at gen (`decide::vm_boot`); here only their meaning.

use std::path::PathBuf;

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::vm_devices::ConsoleKind;
use super::FieldError;

/// Firmware the guest boots with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// SeaBIOS (QEMU's default).
    #[default]
    Bios,
    /// OVMF: the 64-bit MMIO size is also handed to it through fw_cfg.
    Uefi,
}

/// A kernel the VMM loads itself, without firmware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectKernel {
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub cmdline: Option<String>,
}

/// QEMU detached from the terminal, managed through its QMP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuService {
    pub qmp_socket: PathBuf,
    /// `-daemonize` with `-pidfile`.
    pub daemonize: bool,
}

/// How the guest boots and runs, with the vm.yaml lines a refusal names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boot {
    pub kernel: Option<DirectKernel>,
    pub kernel_at: Option<Location>,
    /// Where `firmware:` is written.
    pub firmware_at: Option<Location>,
    /// Where `ovmf_code:` is written: `None` means gen's default, QEMU's OVMF build.
    pub ovmf_code_at: Option<Location>,
    pub ovmf_vars_at: Option<Location>,
    pub ovmf_vars_copy: Option<PathBuf>,
    pub qemu_service: Option<QemuService>,
    /// Where `qmp_socket:` (else `daemonize:`) is written.
    pub qemu_service_at: Option<Location>,
}

/// The keys as read (each optional).
pub struct BootKeys<'a> {
    pub firmware: Option<&'a Spanned<Firmware>>,
    pub ovmf_code: Option<&'a Spanned<PathBuf>>,
    pub ovmf_vars: Option<&'a Spanned<PathBuf>>,
    pub ovmf_vars_copy: Option<Spanned<PathBuf>>,
    pub kernel: Option<Spanned<PathBuf>>,
    pub initramfs: Option<Spanned<PathBuf>>,
    pub cmdline: Option<Spanned<String>>,
    pub daemonize: Option<Spanned<bool>>,
    pub qmp_socket: Option<Spanned<PathBuf>>,
    pub console: Option<&'a Spanned<ConsoleKind>>,
}

fn err(at: Location, message: String) -> FieldError {
    FieldError { at, message }
}

fn path(key: &str, p: Option<Spanned<PathBuf>>) -> Result<Option<Spanned<PathBuf>>, FieldError> {
    match p {
        Some(p) => match super::config_path_error(key, &p.value) {
            Some(e) => Err(err(p.referenced, e)),
            None => Ok(Some(p)),
        },
        None => Ok(None),
    }
}

/// Validates the keys: a kernel's parts only with `kernel:` and not beside UEFI firmware,
/// a vars copy only beside its template, `daemonize:` only with a QMP socket and a console
/// that is not the terminal (QEMU: "cannot use stdio with -daemonize", chardev/char-stdio.c).
pub fn boot(k: BootKeys) -> Result<Boot, FieldError> {
    let uefi = k.firmware.is_some_and(|f| f.value == Firmware::Uefi);
    let kernel = path("kernel", k.kernel)?;
    let initramfs = path("initramfs", k.initramfs)?;
    let vars_copy = path("ovmf_vars_copy", k.ovmf_vars_copy)?;
    let qmp_socket = path("qmp_socket", k.qmp_socket)?;
    let kernel_at = kernel.as_ref().map(|p| p.referenced);
    if kernel.is_none() {
        if let Some(i) = &initramfs {
            return Err(err(
                i.referenced,
                "initramfs: goes with kernel:; add kernel: PATH or remove it".into(),
            ));
        }
        if let Some(c) = &k.cmdline {
            return Err(err(
                c.referenced,
                "cmdline: goes with kernel:; add kernel: PATH or remove it".into(),
            ));
        }
    }
    if let (Some(at), true) = (kernel_at, uefi) {
        return Err(err(
            at,
            "kernel: boots the guest without firmware, firmware: uefi with it: keep one of them"
                .into(),
        ));
    }
    if let Some(c) = &vars_copy {
        match k.ovmf_vars {
            None => {
                return Err(err(c.referenced, "ovmf_vars_copy: is this VM's copy of the template ovmf_vars: names; add ovmf_vars: (e.g. /usr/share/OVMF/OVMF_VARS_4M.fd)".into()))
            }
            Some(t) if t.value == c.value => {
                return Err(err(c.referenced, "ovmf_vars_copy: is the template itself: the VM would write its variables into it; give a path of this VM's own".into()))
            }
            Some(_) => {}
        }
    }
    let daemonize = k.daemonize.as_ref().is_some_and(|d| d.value);
    if let Some(d) = k.daemonize.as_ref().filter(|d| d.value) {
        if qmp_socket.is_none() {
            return Err(err(
                d.referenced,
                "daemonize: true needs qmp_socket: PATH, the way to manage the detached QEMU"
                    .into(),
            ));
        }
        if k.console.is_none_or(|c| c.value == ConsoleKind::Serial) {
            return Err(err(d.referenced, "daemonize: true detaches QEMU from the terminal the serial console would use (QEMU: cannot use stdio with -daemonize): set console: socket or none".into()));
        }
    }
    Ok(Boot {
        kernel: kernel.map(|p| DirectKernel {
            kernel: p.value,
            initramfs: initramfs.map(|i| i.value),
            cmdline: k.cmdline.map(|c| c.value),
        }),
        kernel_at,
        firmware_at: k.firmware.map(|f| f.referenced),
        ovmf_code_at: k.ovmf_code.map(|p| p.referenced),
        ovmf_vars_at: k.ovmf_vars.map(|p| p.referenced),
        ovmf_vars_copy: vars_copy.map(|p| p.value),
        qemu_service_at: qmp_socket
            .as_ref()
            .map(|q| q.referenced)
            .or(k.daemonize.as_ref().map(|d| d.referenced)),
        qemu_service: qmp_socket.map(|q| QemuService {
            qmp_socket: q.value,
            daemonize,
        }),
    })
}
