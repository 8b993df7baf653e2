//! `verify`: one-way writes across every pair, checked on the destination.

use vfio_p2p_agent::cli::{ExpectArgs, Format, SysfsArgs};
use vfio_p2p_agent::verify::Injection;
use vfio_p2p_agent::{measure, peers, render};

use super::{
    emit, in_vm, judge_all, load_modules, open_gpus, open_nvml, optional_expectation, pair_exit,
    pair_reports, print_summaries, read_sysfs, CannotRun,
};

/// `verify`: one-way writes across every pair, checked on the destination.
pub(super) fn run(
    f: Format,
    sysfs: &SysfsArgs,
    expect: &ExpectArgs,
    (mib, inject): (usize, &Injection),
) -> Result<u8, CannotRun> {
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let guest = read_sysfs(&sysfs.sysfs_root, expectation.as_ref());
    let gpus = open_gpus()?;
    let modules = load_modules(&gpus)?;
    let nvml = open_nvml();
    let pairs = peers::probe(&gpus, nvml.as_ref())?;
    let mut reports = pair_reports(&pairs, expectation.as_ref(), in_vm());
    let words = mib * (1 << 20) / 4;
    let rounds = measure::plan_rounds(&gpus, &reports, guest.gpus.as_ref().ok());
    measure::verify_by_rounds(&gpus, &modules, &mut reports, (words, inject), &rounds)?;
    let results: Vec<_> = reports.iter().filter_map(|r| r.verify.clone()).collect();
    judge_all(&mut reports, in_vm());
    emit(f, &results, |r| render::verify(r))?;
    if f == Format::Table {
        print_summaries(&reports);
    }
    Ok(pair_exit(&reports))
}
