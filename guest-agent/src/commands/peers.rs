//! `peers`: peer access between every ordered pair, as the driver reports it.

use serde::Serialize;

use vfio_p2p_agent::cli::{ExpectArgs, Format, SysfsArgs};
use vfio_p2p_agent::peers::{self, GpuInfo, PeerCheck};
use vfio_p2p_agent::render;

use super::{
    emit, in_vm, open_gpus, open_nvml, optional_expectation, pair_exit, pair_reports,
    print_summaries, CannotRun,
};

/// `peers`: peer access between every ordered pair, as the driver reports it.
pub(super) fn run(f: Format, sysfs: &SysfsArgs, expect: &ExpectArgs) -> Result<u8, CannotRun> {
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let gpus = open_gpus()?;
    let nvml = open_nvml();
    let pairs = peers::probe(&gpus, nvml.as_ref())?;
    let reports = pair_reports(&pairs, expectation.as_ref(), in_vm());
    #[derive(Serialize)]
    struct Out<'a> {
        gpus: Vec<GpuInfo>,
        pairs: &'a [PeerCheck],
    }
    let out = Out {
        gpus: gpus.iter().map(GpuInfo::from).collect(),
        pairs: &pairs,
    };
    emit(f, &out, |o| render::peers(o.pairs))?;
    if f == Format::Table {
        print_summaries(&reports);
    }
    Ok(pair_exit(&reports))
}
