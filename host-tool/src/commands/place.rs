//! `vfio-p2p place`: chooses GPUs for many VMs and plans each VM's cliques.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{Context, HostConfigArgs, Needs};
use pci_config::PathKind;
use vfio_p2p_config::vm::VmConfig;
use vfio_p2p_decide::place_plan::{self, PlaceRequest, VmPlacePlan};
use vfio_p2p_decide::placement;
use vfio_p2p_decide::placement::host::PlacementHost;
use vfio_p2p_decide::placement::request::{self, PlacementOptions, VmRequest};
use vfio_p2p_decide::vm::spec::{VmFlags, VmSpec};
use vfio_p2p_decide::vm::{self, Host, VmTarget};
use vfio_p2p_emit::data::DataFormat;
use vfio_p2p_emit::place_report;

#[derive(Debug, Args)]
#[command(
    after_help = "Exits 2 when some VM could not be placed (the report says why and what would fit)."
)]
#[group(id = "vms", required = true, multiple = false, args = ["shape", "vm"])]
pub struct PlaceArgs {
    /// COUNTxGPUS identical VMs named vm0, vm1… (e.g. 2x4).
    #[arg(long, value_name = "COUNTxGPUS", value_parser = parse_shape)]
    pub shape: Option<(usize, usize)>,
    /// One VM as NAME=COUNT: its name and how many GPUs it gets, e.g. train=4 (repeat for more).
    #[arg(long, value_name = "NAME=COUNT", value_parser = parse_vm)]
    pub vm: Vec<VmRequest>,
    #[command(flatten)]
    pub host: HostConfigArgs,
    /// Devices already given to running VMs; their IOMMU groups are not used.
    #[arg(long, value_name = "BDF", num_args = 1..)]
    pub taken: Vec<Bdf>,
    /// Refuse VMs whose worst PCIe path between GPUs is worse than this (pix, pxb, phb, node, sys).
    #[arg(long, value_name = "LEVEL", value_parser = crate::cli::path_level(), ignore_case = true, hide_possible_values = true)]
    pub max_path: Option<PathKind>,
    /// Give each placed GPU the free NIC nearest to it when that is PIX or PXB (GPUDirect
    /// RDMA); say per GPU which NIC it got, or that the host has none such.
    #[arg(long)]
    pub with_nics: bool,
    /// Write one vm.yaml per placed VM (NAME.yaml) into this directory, for `vfio-p2p gen`.
    #[arg(long, value_name = "DIR")]
    pub write_configs: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("'{s}' is not a shape; write COUNTxGPUS, e.g. 2x4");
    let (c, g) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (c, g) = (c.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?);
    if c == 0 || g == 0 {
        return Err(format!(
            "'{s}': both the VM count and GPUs per VM must be at least 1"
        ));
    }
    Ok((c, g))
}

fn parse_vm(s: &str) -> Result<VmRequest, String> {
    let (name, gpus) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not NAME=GPUS, e.g. train0=4"))?;
    let gpus = gpus
        .parse()
        .map_err(|_| format!("'{s}': GPUS must be a number, e.g. {name}=4"))?;
    Ok(VmRequest {
        name: name.to_string(),
        gpus,
    })
}

/// What `gen --config` makes of each file: parsed and applied as gen does, its cliques
/// planned by the VM pipeline's first stage (`decide::vm::cliques`); a file whose cliques
/// are not the ones it says is refused before anything is written.
fn as_gen_reads(
    host: &Host,
    files: &[(PathBuf, String)],
    vms: &[VmPlacePlan],
) -> anyhow::Result<()> {
    for ((path, text), vm) in files.iter().zip(vms) {
        if vm.plan_error.is_some() {
            continue; // written without cliques; gen says why
        }
        let config = VmConfig::parse(text, path)?;
        let spec = VmSpec::apply(config, VmFlags::new(VmTarget::Qemu))?;
        let (gpus, options) = (spec.gpus(host.topo), spec.plan_options(host.config));
        // gen says the plan's warnings; place has said them in its report
        let planned = vm::cliques(host, "", &gpus, &options, &mut |_| {})?;
        anyhow::ensure!(
            planned.assignments == vm.cliques,
            "{}: gen would plan the cliques {:?}, not the {:?} place planned (nothing was written)",
            path.display(),
            planned.assignments,
            vm.cliques
        );
    }
    Ok(())
}

/// Writes every file or none: all are checked first, then written via temporary names.
fn write_configs(dir: &Path, host: &Host, vms: &[VmPlacePlan]) -> anyhow::Result<Vec<PathBuf>> {
    let files: Vec<(PathBuf, String)> = vms
        .iter()
        .map(|vm| {
            (
                dir.join(format!("{}.yaml", vm.vm.name)),
                place_report::vm_config_text(vm, host.config.p2p_level),
            )
        })
        .collect();
    as_gen_reads(host, &files, vms)?;
    if let Some((path, _)) = files.iter().find(|(p, _)| p.exists()) {
        bail!(
            "{} already exists; remove it or write to another directory (nothing was written)",
            path.display()
        );
    }
    // Created like `snapshot -o DIR` does, once nothing stands in the way.
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating --write-configs {}", dir.display()))?;
    let mut staged = Vec::new();
    for (path, text) in &files {
        let tmp = path.with_extension("yaml.tmp");
        if let Err(e) = std::fs::write(&tmp, text) {
            for t in &staged {
                let _ = std::fs::remove_file(t);
            }
            return Err(e).with_context(|| format!("writing {}", tmp.display()));
        }
        staged.push(tmp);
    }
    for ((path, _), tmp) in files.iter().zip(&staged) {
        std::fs::rename(tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    }
    Ok(files.into_iter().map(|(p, _)| p).collect())
}

pub fn run(global: &GlobalArgs, args: PlaceArgs) -> anyhow::Result<ExitCode> {
    let Context {
        host, topo, fabric, ..
    } = Context::load(global, &args.host, &Needs::default())?;
    let host_gpus = topo.gpus().count();
    let requests = match args.shape {
        Some((count, gpus)) => {
            // Refused before anything is allocated: 1x4294967296 used to abort allocating 34 GB.
            anyhow::ensure!(
                count <= host_gpus && gpus <= host_gpus,
                "--shape {count}x{gpus} asks for more than this host's {host_gpus} GPUs can hold (at most {host_gpus} VMs, each at most {host_gpus} GPUs); `vfio-p2p topo` lists them"
            );
            placement::shape(count, gpus)
        }
        None => args.vm.clone(),
    };
    if let Some(r) = requests.iter().find(|r| r.gpus > host_gpus) {
        anyhow::bail!(
            "--vm {}={} asks for more GPUs than this host has ({host_gpus}); `vfio-p2p topo` lists them",
            r.name,
            r.gpus
        );
    }
    let options = PlacementOptions {
        unavailable: args.taken.iter().chain(&host.reserved).copied().collect(),
        max_path: args.max_path,
    };
    request::validate_requests(&requests)?;
    let placement_host = PlacementHost::new(&topo, &options)
        .with_context(|| "checking --taken and the host config's reserved devices".to_string())?;
    let ask = PlaceRequest {
        requests: &requests,
        shape: args.shape,
        options: &options,
        p2p_level: host.p2p_level,
        with_nics: args.with_nics,
    };
    let mut report = place_plan::place(&topo, &placement_host, fabric.partitions(), &ask);
    if let Some(dir) = &args.write_configs {
        let host = Host {
            topo: &topo,
            fabric: &fabric,
            config: &host,
        };
        report.configs_written = write_configs(dir, &host, &report.vms)?;
    }
    match vfio_p2p_emit::data::to_text(&report, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", place_report::render_table(&report)),
    }
    Ok(if report.unplaced.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
