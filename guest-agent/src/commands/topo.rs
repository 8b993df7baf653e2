//! `topo`: each pair's path label in the guest against the host's.
use vfio_p2p_agent::cli::{ExpectArgs, Format, SysfsArgs};
use vfio_p2p_agent::{fabric, guest_topo, render};

use super::{emit, open_nvml, optional_expectation, read_sysfs, topo_report, CannotRun};

/// `topo`: each pair's path label in the guest against the host's (no CUDA needed); with
/// no expectation, the guest's own view (labels, NVML's labels, module ids and fabric).
pub(super) fn run(f: Format, sysfs: &SysfsArgs, expect: &ExpectArgs) -> Result<u8, CannotRun> {
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let guest = read_sysfs(&sysfs.sysfs_root, expectation.as_ref());
    let Some((e, source)) = expectation else {
        let scan = guest.gpus?;
        let bdfs: Vec<_> = scan.gpus.iter().map(|g| g.bdf).collect();
        let nvml = open_nvml();
        let mut pairs = guest_topo::guest_view(&guest.places, &bdfs);
        if let Some(n) = &nvml {
            pairs.add_nvml(|a, b| n.common_ancestor(a, b));
        }
        let view = render::GuestView {
            pairs,
            fabric: nvml
                .as_ref()
                .map(|n| fabric::judge(&fabric::read(n, &bdfs), None)),
            expectation: None,
            an_expectation_adds: render::EXPECTATION_ADDS.into(),
        };
        emit(f, &view, render::guest_view)?;
        return Ok(0);
    };
    let r = topo_report(&guest.places, &e, open_nvml().as_ref());
    emit(f, &r, |r| render::topo(r, &source.display().to_string()))?;
    Ok(u8::from(r.mismatches() > 0))
}
