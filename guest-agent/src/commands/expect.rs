//! `expect`: the GPUs and cliques against the host's expectation.

use vfio_p2p_agent::cli::{ExpectArgs, Format, SendArgs, SysfsArgs};
use vfio_p2p_agent::sysfs::{expectation, GuestSysfs};
use vfio_p2p_agent::{expect, fabric, render, send};
use vfio_p2p_nvml::Nvml;

use super::{deliver, emit, CannotRun};

/// `expect`: the GPUs and cliques against the host's expectation.
pub(super) fn run(
    f: Format,
    sysfs: &SysfsArgs,
    expect: &ExpectArgs,
    send: &SendArgs,
) -> Result<u8, CannotRun> {
    let guest = GuestSysfs::read(&sysfs.sysfs_root, &[]);
    let scan = guest.gpus?;
    let (e, source) = expectation::load(expect.expect.as_deref(), &sysfs.sysfs_root)?;
    let mut r = expect::compare(&e, &source, &scan, &guest.numa);
    if fabric::planned(&e) {
        match Nvml::open() {
            Ok(nvml) => {
                let bdfs: Vec<_> = scan.gpus.iter().map(|g| g.bdf).collect();
                r.fabric = Some(fabric::judge(&fabric::read(&nvml, &bdfs), Some(&e)));
            }
            Err(why) => {
                let plans = "the expectation plans an NVSwitch fabric (module ids, FM partition)";
                r.fabric_unchecked = Some(match why.is_absent() {
                    true => format!(
                        "{plans} but NVML (libnvidia-ml.so.1) cannot be loaded: install the \
                         NVIDIA driver in the guest"
                    ),
                    false => format!("{plans} but {why}"),
                })
            }
        }
    }
    emit(f, &r, render::expect)?;
    let code = match (r.mismatches(), r.unchecked()) {
        (0, 0) => 0,
        (0, _) => 2,
        _ => 1,
    };
    let fabric = send::fabric_result(r.fabric.as_ref(), r.fabric_unchecked.as_ref());
    deliver(
        f,
        send.send,
        Some(&e),
        send::from_scan(&scan, &e.vm, code, fabric),
    )?;
    if r.mismatches() > 0 {
        Ok(1)
    } else if let Some(why) = &r.fabric_unchecked {
        Err(CannotRun(anyhow::anyhow!("{why}")))
    } else if r.unchecked() > 0 {
        let unread: Vec<String> = scan
            .gpus
            .iter()
            .filter(|g| !g.caps_readable)
            .map(|g| g.bdf.to_string())
            .collect();
        Err(CannotRun(anyhow::anyhow!(
            "the clique of {} GPU(s) ({}) could not be read: only the first 64 bytes of their \
             config space are readable; run as root",
            r.unchecked(),
            unread.join(", ")
        )))
    } else {
        Ok(0)
    }
}
