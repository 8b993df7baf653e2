//! `vfio-p2p place`: chooses GPUs for many VMs and plans each VM's cliques.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use pci_config::Bdf;
use serde::Serialize;

use crate::cli::GlobalArgs;
use crate::context::{Context, HostConfigArgs, Needs};
use pci_config::PathKind;
use vfio_p2p_decide::clique_plan;
use vfio_p2p_decide::nic_affinity::{NicChoice, NicPool};
use vfio_p2p_decide::placement::{
    self, PlacedVm, PlacementHost, PlacementOptions, UnplacedVm, VmRequest, WorstPath,
};
use vfio_p2p_emit::data::DataFormat;
use vfio_p2p_model::Topology;

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

/// One placed VM with its clique plan.
#[derive(Debug, Serialize)]
struct VmReport {
    #[serde(flatten)]
    vm: PlacedVm,
    /// Clique ID per GPU (`null`: no PCIe P2P clique, e.g. NVLink-only or alone).
    cliques: BTreeMap<Bdf, Option<u8>>,
    pairs: Vec<PairReport>,
    warnings: Vec<String>,
    /// Why no clique plan could be made (the placement still stands).
    plan_error: Option<String>,
    /// With `--with-nics`: the NIC each GPU got, or why none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nics: Vec<NicChoice>,
    /// On a board under Fabric Manager: the partition the VM's GPUs are.
    #[serde(skip_serializing_if = "Option::is_none")]
    fm_partition: Option<u32>,
}

#[derive(Debug, Serialize)]
struct PairReport {
    a: Bdf,
    b: Bdf,
    path: String,
    verdict: clique_plan::PairRoute,
    clique: Option<u8>,
}

#[derive(Debug, Serialize)]
struct PlaceReport {
    p2p_level: PathKind,
    vms: Vec<VmReport>,
    unplaced: Vec<UnplacedVm>,
    free: Vec<Bdf>,
    /// For `--shape`: the largest shape that fits, when the requested one does not.
    largest_shape: Option<String>,
    /// Files written by `--write-configs`.
    configs_written: Vec<PathBuf>,
}

fn plan_vm(topo: &Topology, vm: PlacedVm, p2p_level: PathKind) -> VmReport {
    let options = clique_plan::PlanOptions {
        p2p_level,
        ..clique_plan::PlanOptions::default()
    };
    match clique_plan::plan(topo, &vm.gpus, &options) {
        Ok(p) => VmReport {
            cliques: p.assignments.clone(),
            pairs: p
                .pairs
                .iter()
                .map(|pair| PairReport {
                    a: pair.a,
                    b: pair.b,
                    path: pair
                        .nvlink
                        .map_or(pair.path.label().to_string(), |n| format!("NV{n}")),
                    verdict: pair.verdict,
                    clique: pair.clique,
                })
                .collect(),
            warnings: p.warnings,
            plan_error: None,
            nics: Vec::new(),
            fm_partition: None,
            vm,
        },
        Err(e) => VmReport {
            cliques: vm.gpus.iter().map(|g| (*g, None)).collect(),
            pairs: Vec::new(),
            warnings: Vec::new(),
            plan_error: Some(e.to_string()),
            nics: Vec::new(),
            fm_partition: None,
            vm,
        },
    }
}

fn numa_text(nodes: &[u32]) -> String {
    if nodes.is_empty() {
        return "unknown".into();
    }
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The `vm.yaml` of a placed VM, in `gen`'s schema (`config::vm`).
fn vm_config_text(vm: &VmReport, p2p_level: PathKind) -> String {
    let mut t = format!(
        "# Written by `vfio-p2p place`: worst GPU path {}, NUMA node(s) {}.\n",
        vm.vm.worst_path,
        numa_text(&vm.vm.numa_nodes)
    );
    let no_clique = match vm.vm.worst_path {
        WorstPath::NvLink(_) => "no clique (NVLink)",
        _ => "no clique",
    };
    if let Some(id) = vm.fm_partition {
        t += &format!("# Fabric Manager partition {id}: activate it before the VM starts.\n");
    }
    t += &format!("name: {}\ngpus:\n", vm.vm.name);
    for g in &vm.vm.gpus {
        let clique = vm.cliques.get(g).copied().flatten();
        t += &match clique {
            Some(c) => format!("  - {g}  # clique {c}\n"),
            None => format!("  - {g}  # {no_clique}\n"),
        };
    }
    let nics: Vec<&NicChoice> = vm.nics.iter().filter(|c| c.nic.is_some()).collect();
    if !nics.is_empty() {
        t += "nics:\n";
        for c in nics {
            let (nic, path) = (c.nic.unwrap_or(c.gpu), c.path.unwrap_or(PathKind::X));
            t += &format!("  - {nic}  # {path} to {}\n", c.gpu);
        }
    }
    t += &format!("p2p_level: {}\n", p2p_level.label().to_ascii_lowercase());
    t
}

/// Writes every file or none: all are checked first, then written via temporary names.
fn write_configs(
    dir: &Path,
    vms: &[VmReport],
    p2p_level: PathKind,
) -> anyhow::Result<Vec<PathBuf>> {
    let files: Vec<(PathBuf, String)> = vms
        .iter()
        .map(|vm| {
            (
                dir.join(format!("{}.yaml", vm.vm.name)),
                vm_config_text(vm, p2p_level),
            )
        })
        .collect();
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

fn print_table(r: &PlaceReport) {
    let fm = r.vms.iter().any(|vm| vm.fm_partition.is_some());
    let mut header = vec![
        "VM",
        "GPUs",
        "worst path",
        "NUMA",
        "IOMMU groups",
        "cliques",
    ];
    if fm {
        header.push("FM partition");
    }
    let mut t = vfio_p2p_style::table(header);
    for vm in &r.vms {
        let cliques: Vec<String> = vm
            .vm
            .gpus
            .iter()
            .map(|g| {
                vm.cliques
                    .get(g)
                    .copied()
                    .flatten()
                    .map_or("-".into(), |c| c.to_string())
            })
            .collect();
        let mut row = vec![
            vm.vm.name.clone(),
            vm.vm
                .gpus
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            format!("{} (PCIe {})", vm.vm.worst_path, vm.vm.worst_pcie_path),
            numa_text(&vm.vm.numa_nodes),
            vm.vm.iommu_groups.len().to_string(),
            cliques.join(" "),
        ];
        if fm {
            row.push(vm.fm_partition.map_or("-".into(), |p| p.to_string()));
        }
        t.add_row(row);
    }
    // nothing placed: no table of no rows, the reasons below say it all
    if !r.vms.is_empty() {
        println!("{t}");
    }
    let width = vfio_p2p_style::output_width();
    for vm in &r.vms {
        if let Some(e) = &vm.plan_error {
            print!(
                "{}",
                vfio_p2p_style::wrap(
                    &format!("warning: {}: no clique plan: {e}", vm.vm.name),
                    width
                )
            );
        }
        for w in &vm.warnings {
            print!(
                "{}",
                vfio_p2p_style::wrap(&format!("warning: {}: {w}", vm.vm.name), width)
            );
        }
    }
    for vm in &r.vms {
        for c in &vm.nics {
            print!(
                "{}",
                vfio_p2p_style::wrap(&format!("{}: {c}", vm.vm.name), width)
            );
        }
    }
    for u in &r.unplaced {
        let mut line = format!("{} ({} GPUs): not placed: {}", u.name, u.gpus, u.reason);
        if let Some(w) = u.best_worst_path {
            line += &format!("; accepting worst path {w} would place it (--max-path)");
        }
        line += &format!("; the most it could get now is {} GPUs", u.largest_fit);
        print!("{}", vfio_p2p_style::wrap(&line, width));
    }
    if let Some(s) = &r.largest_shape {
        println!("largest shape that fits: {s}");
    }
    let free: Vec<String> = r.free.iter().map(|b| b.to_string()).collect();
    println!(
        "free GPUs: {}",
        if free.is_empty() {
            "none".into()
        } else {
            free.join(" ")
        }
    );
    for p in &r.configs_written {
        println!("wrote {}", p.display());
    }
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
    placement::validate_requests(&requests)?;
    let placement_host = PlacementHost::new(&topo, &options)
        .with_context(|| "checking --taken and the host config's reserved devices".to_string())?;
    // On a board under Fabric Manager (shared NVSwitch), VMs get whole FM partitions.
    let partitions = fabric.partitions();
    let placed = match partitions {
        Some(state) => vfio_p2p_decide::fabric::place_on_partitions(
            &placement_host,
            state,
            &requests,
            &options.unavailable,
        ),
        None => placement_host.place(&requests, options.max_path),
    };
    let largest_shape = match args.shape {
        Some((count, gpus)) if !placed.unplaced.is_empty() => match partitions {
            Some(state) => vfio_p2p_decide::fabric::largest_partition_shape(
                &placement_host,
                state,
                count,
                gpus,
                &options.unavailable,
            ),
            None => placement::largest_shape(&placement_host, count, gpus, options.max_path),
        }
        .map(|(c, g)| format!("{c}x{g}")),
        _ => None,
    };
    let mut vms: Vec<VmReport> = placed
        .vms
        .into_iter()
        .map(|vm| {
            let id = partitions
                .and_then(|s| s.partition_of(&vm.gpus))
                .map(|p| p.id);
            VmReport {
                fm_partition: id,
                ..plan_vm(&topo, vm, host.p2p_level)
            }
        })
        .collect();
    if args.with_nics {
        let mut pool = NicPool::new(&topo, &options.unavailable);
        for vm in &mut vms {
            vm.nics = vm.vm.gpus.iter().map(|g| pool.choose(*g)).collect();
        }
    }
    let configs_written = match &args.write_configs {
        Some(dir) => write_configs(dir, &vms, host.p2p_level)?,
        None => Vec::new(),
    };
    let report = PlaceReport {
        p2p_level: host.p2p_level,
        vms,
        unplaced: placed.unplaced,
        free: placed.free,
        largest_shape,
        configs_written,
    };
    match vfio_p2p_emit::data::to_text(&report, args.format)? {
        Some(t) => print!("{t}"),
        None => print_table(&report),
    }
    Ok(if report.unplaced.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
