//! `scan`: the NVIDIA GPUs sysfs shows, their clique capability and links.

use vfio_p2p_agent::cli::{Format, SysfsArgs};
use vfio_p2p_agent::render;
use vfio_p2p_agent::sysfs::{expectation, GuestSysfs};

use super::{emit, CannotRun};

pub(super) fn run(f: Format, s: &SysfsArgs) -> Result<u8, CannotRun> {
    let scan = GuestSysfs::read(&s.sysfs_root, &[]).gpus?;
    emit(f, &scan, render::scan)?;
    if f == Format::Table && !expectation::in_firmware(&s.sysfs_root) {
        super::write_stdout(&render::no_expectation_note());
    }
    Ok(0)
}
