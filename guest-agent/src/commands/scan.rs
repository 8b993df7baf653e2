//! `scan`: the NVIDIA GPUs sysfs shows, their clique capability and links.

use vfio_p2p_agent::cli::{Format, SysfsArgs};
use vfio_p2p_agent::{render, sysfs::gpus};

use super::{emit, CannotRun};

pub(super) fn run(f: Format, s: &SysfsArgs) -> Result<u8, CannotRun> {
    let scan = gpus::scan(&s.sysfs_root)?;
    emit(f, &scan, render::scan)?;
    if f == Format::Table
        && !s
            .sysfs_root
            .join(vfio_p2p_contract::FW_CFG_SYSFS_PATH)
            .exists()
    {
        super::write_stdout(&render::no_expectation_note());
    }
    Ok(0)
}
