//! `nccl-topo`: the NCCL topology file against the GPUs the guest sees.

use std::path::Path;

use vfio_p2p_agent::cli::{Format, SysfsArgs};
use vfio_p2p_agent::sysfs::GuestSysfs;
use vfio_p2p_agent::{nccl_topo, render};

use super::{emit, nccl_topo_env, CannotRun};

pub(super) fn run(f: Format, file: Option<&Path>, sysfs: &SysfsArgs) -> Result<u8, CannotRun> {
    let path = match file {
        Some(p) => p.to_path_buf(),
        None => nccl_topo_env().ok_or_else(|| {
            anyhow::anyhow!(
                "no file given and NCCL_TOPO_FILE is not set: name the NCCL topology \
                 file (vfio-p2p-agent nccl-topo FILE)"
            )
        })?,
    };
    let guest = GuestSysfs::read(&sysfs.sysfs_root, &[]);
    let scan = guest.gpus?;
    let check = nccl_topo::check_file(&path, &scan, &guest.nics).map_err(anyhow::Error::msg)?;
    emit(f, &check, render::nccl_topo)?;
    Ok(u8::from(!check.ok()))
}
