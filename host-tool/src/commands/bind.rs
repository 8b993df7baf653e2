//! `vfio-p2p bind` and `vfio-p2p unbind`: move GPUs to vfio-pci and back.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::change::ChangeRoot;
use vfio_p2p_bind::{writer, BindOptions, SessionOptions, SessionReport, UnbindSelection};
use vfio_p2p_emit::data::DataFormat;

#[derive(Debug, Args)]
#[command(after_help = "\
Each device goes the kernel's way: driver_override = vfio-pci, driver/unbind, drivers_probe. \
Each GPU's reset_method is set as host.yaml's `reset:` says (auto: left to the kernel; flr; \
bus: only when everything on its bus goes with it). \
If any write fails, every device already changed goes back to its driver, driver_override and \
reset_method. What was changed is recorded in /run/vfio-p2p/state.json for `unbind`.

Test hook: VFIO_P2P_FAIL_AFTER=N makes the N-th sysfs write fail (rollback tests on a real kernel).")]
pub struct BindArgs {
    /// The devices to bind (GPUs), separated by spaces or commas; their other functions come along.
    #[arg(required = true, value_name = "BDF", value_delimiter = ',')]
    pub devices: Vec<Bdf>,
    /// Also bind the other devices of their IOMMU groups (bridges are never touched).
    #[arg(long)]
    pub whole_group: bool,
    /// Bind GPUs the host is using (open device files, attached display).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub common: ChangeArgs,
}

#[derive(Debug, Args)]
#[group(id = "what", required = true, multiple = false, args = ["devices", "all"])]
pub struct UnbindArgs {
    /// The devices to restore (with whatever was bound together with them), separated by
    /// spaces or commas.
    #[arg(value_name = "BDF", value_delimiter = ',')]
    pub devices: Vec<Bdf>,
    /// Restore every device `bind` recorded.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub common: ChangeArgs,
}

/// Options every command that changes bindings takes.
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// Print the sysfs writes instead of doing them.
    #[arg(long)]
    pub dry_run: bool,
    /// Seconds to wait for another bind/unbind/hook to finish.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub lock_timeout: u64,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

impl ChangeArgs {
    fn session(&self, guest: Option<String>) -> SessionOptions {
        SessionOptions {
            dry_run: self.dry_run,
            lock_timeout: Duration::from_secs(self.lock_timeout),
            guest,
            memory_offline_wait: vfio_p2p_bind::GPU_MEMORY_OFFLINE_WAIT,
        }
    }
}

pub fn run_bind(global: &GlobalArgs, args: BindArgs) -> anyhow::Result<ExitCode> {
    let root = ChangeRoot::of(global, args.common.dry_run)?;
    let opts = BindOptions {
        whole_group: args.whole_group,
        force: args.force,
        reset: root.host_config()?.reset,
        reset_only: false,
    };
    // Binding needs the devices and their groups only: no NVLink or FM.
    let topo = root.devices()?;
    let report = vfio_p2p_bind::bind(
        root.path(),
        &topo,
        &mut writer()?,
        &args.devices,
        &opts,
        &args.common.session(None),
    )?;
    for w in &report.read_warnings {
        tracing::warn!("{w}");
    }
    print_report(&report, args.common.format)
}

pub fn run_unbind(global: &GlobalArgs, args: UnbindArgs) -> anyhow::Result<ExitCode> {
    let root = ChangeRoot::of(global, args.common.dry_run)?;
    let selection = if args.all {
        UnbindSelection::All
    } else {
        UnbindSelection::Devices(args.devices)
    };
    let report = vfio_p2p_bind::unbind(
        root.path(),
        &mut writer()?,
        &selection,
        &args.common.session(None),
    )?;
    print_report(&report, args.common.format)
}

fn print_report(report: &SessionReport, format: DataFormat) -> anyhow::Result<ExitCode> {
    match vfio_p2p_emit::data::to_text(report, format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", vfio_p2p_bind::text::report_text(report)),
    }
    Ok(ExitCode::SUCCESS)
}
