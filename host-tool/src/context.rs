//! What the data commands start from, built once per run (as ripgrep builds its `HiArgs`
//! from the parsed flags): the host config, the host's typed topology with its NVLink
//! source applied, and the options planning reads. Commands build a [`Context`] and never
//! import each other; the flags that several commands share are defined here.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::config::host::{FabricManagerSource, FabricMode, HostConfig, NvlinkSource};
use crate::decide;
use crate::decide::plan::{plan, Plan, PlanOptions};
use crate::emit::libvirt::{self, LibvirtVersion};
use crate::model::fabric::{Fabric, FabricModel, FabricState};
use crate::model::{PathKind, Topology};
use crate::read::{fm_capture, nvidia_smi, read_host, HostRecord};
use crate::synth;

/// `--host-config`: the host policy that `topo`, `place`, `plan`, `check`, `gen` and
/// `libvirt patch` read.
#[derive(Debug, Clone, Args)]
pub struct HostConfigArgs {
    /// Host policy (p2p level, reserved devices, NVLink source); see
    /// /usr/share/doc/vfio-p2p/examples/README.md (configs/README.md in the source).
    #[arg(long, value_name = "FILE")]
    pub host_config: Option<PathBuf>,
}

impl HostConfigArgs {
    /// The file given, else the defaults.
    pub fn load(&self) -> anyhow::Result<HostConfig> {
        Ok(match &self.host_config {
            Some(path) => HostConfig::load(path)?,
            None => HostConfig::default(),
        })
    }
}

/// The planning options `plan`, `check`, `gen` and `libvirt patch` share.
#[derive(Debug, Clone, Args)]
pub struct PlanOptionArgs {
    /// Worst host path allowed inside a clique: pix, pxb (NCCL's default), phb, node, sys
    /// (default: the VM config's where `gen` has one, else the host config's `p2p_level`, else pxb).
    #[arg(long, value_name = "LEVEL")]
    pub p2p_level: Option<PathKind>,
    /// `nvidia-smi topo -m` output captured on this host, with the GPU index → PCI address
    /// map (`nvidia-smi --query-gpu=index,pci.bus_id --format=csv` or plain `nvidia-smi`)
    /// in the same or another file; repeat for several files.
    #[arg(long, value_name = "FILE")]
    pub nvlink: Vec<PathBuf>,
    /// Put GPUs whose switch routes P2P untranslated (ACS RR/CR cleared) into cliques anyway.
    #[arg(long)]
    pub allow_untranslated_p2p: bool,
    #[command(flatten)]
    pub host: HostConfigArgs,
}

/// Which GPUs and how far P2P may reach; shared by `gen` and `libvirt patch`.
#[derive(Debug, Clone, Args)]
pub struct PlanningArgs {
    /// The VM's GPUs (default: the config's `gpus`, else every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub options: PlanOptionArgs,
}

/// The host facts the global options point at (a sysfs root or an embedded example).
pub fn load_host(global: &GlobalArgs) -> anyhow::Result<HostRecord> {
    match &global.example {
        Some(name) => synth::example(name).map_err(anyhow::Error::msg),
        // Every ReadError names the file or directory it concerns: no context to add.
        None => Ok(read_host(&global.sysfs_root)?),
    }
}

/// The sysfs root a changing command (bind, unbind, hook) works on: never a snapshot
/// file; an embedded example only for a dry run, which then reads a temporary sysfs tree
/// written from the example (removed again on drop).
#[derive(Debug)]
pub struct ChangeRoot {
    path: PathBuf,
    temporary: bool,
}

impl ChangeRoot {
    pub fn new(global: &GlobalArgs, dry_run: bool) -> anyhow::Result<ChangeRoot> {
        if let Some(name) = &global.example {
            anyhow::ensure!(
                dry_run,
                "--example is a made-up host: bind/unbind/hook can only show what they would do \
                 there (--dry-run); pass a real sysfs root (--sysfs-root) to change bindings"
            );
            let host = synth::example(name).map_err(anyhow::Error::msg)?;
            let path = std::env::temp_dir().join(format!(
                "vfio-p2p-example-{name}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            let root = ChangeRoot {
                path,
                temporary: true,
            };
            crate::vfio_bind::sim::write_tree(&host, &root.path).with_context(|| {
                format!(
                    "writing example {name} as a sysfs tree in {}",
                    root.path.display()
                )
            })?;
            return Ok(root);
        }
        anyhow::ensure!(
            !global.sysfs_root.is_file(),
            "{}: a snapshot file cannot be changed; pass a sysfs root directory (--sysfs-root)",
            global.sysfs_root.display()
        );
        Ok(ChangeRoot {
            path: global.sysfs_root.clone(),
            temporary: false,
        })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ChangeRoot {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A command's starting point.
#[derive(Debug, Clone)]
pub struct Context {
    pub host: HostConfig,
    pub topo: Topology,
    /// Fabric Manager's partitions and the model planning follows, read once.
    pub fabric: Fabric,
}

impl Context {
    /// The host config of `--host-config`, the host of `--sysfs-root`/`--example`, and its
    /// NVLink from `nvlink` files when there are any, else from the host config's source.
    /// Warnings about the host are logged once, here.
    pub fn load(
        global: &GlobalArgs,
        host: &HostConfigArgs,
        nvlink: &[PathBuf],
    ) -> anyhow::Result<Context> {
        let config = host.load()?;
        let (mut context, warnings) = Context::assemble(
            &load_host(global)?,
            config,
            nvlink,
            global.example.as_deref(),
        )?;
        // An example recorded with its `nvidia-smi topo -m` capture shows its NVLink too.
        let capture = global
            .example
            .as_deref()
            .and_then(synth::example_nvlink_capture);
        if let (Some((text, name)), true) = (capture, nvlink.is_empty()) {
            context.topo.add_nvlinks(&nvidia_smi::parse(text, name)?)?;
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(context)
    }

    /// [`Context::load`] from parts already read (the hook reads below its own root);
    /// returns the warnings instead of logging them.
    pub fn build(
        record: &HostRecord,
        host: HostConfig,
        nvlink: &[PathBuf],
    ) -> anyhow::Result<(Context, Vec<String>)> {
        Context::assemble(record, host, nvlink, None)
    }

    /// [`Context::build`] for a host that may be the embedded example `example`.
    fn assemble(
        record: &HostRecord,
        host: HostConfig,
        nvlink: &[PathBuf],
        example: Option<&str>,
    ) -> anyhow::Result<(Context, Vec<String>)> {
        let mut topo = Topology::from_record(record);
        let mut warnings: Vec<String> = topo.warnings.iter().map(ToString::to_string).collect();
        warnings.extend(apply_nvlink_source(&mut topo, &host, nvlink)?);
        let fabric = load_fabric(&topo, &host, example)?;
        warnings.extend(fabric_notes(&topo, &host, &fabric));
        Ok((Context { host, topo, fabric }, warnings))
    }

    /// Warns when `gpus` are not a Fabric Manager partition a VM could be given (shared
    /// NVSwitch with FM's partitions known); the host config's reserved devices are not
    /// offered.
    pub fn warn_fabric(&self, gpus: &[Bdf]) {
        let Some(state) = self.fabric.partitions() else {
            return;
        };
        let reserved = self.host.reserved.iter().copied().collect();
        if let Some(w) = decide::fabric::gpu_set_warning(state, gpus, &reserved) {
            tracing::warn!("{w}");
        }
    }

    /// `requested`, or every GPU of the host when none is.
    pub fn gpus(&self, requested: &[Bdf]) -> Vec<Bdf> {
        if requested.is_empty() {
            self.topo.gpus().map(|d| d.bdf).collect()
        } else {
            requested.to_vec()
        }
    }

    /// Fails with what to do when the host has no GPU at all (rather than asking for `--gpus`).
    pub fn require_gpus(&self, command: &str) -> anyhow::Result<()> {
        if self.topo.gpus().next().is_none() {
            anyhow::bail!(
                "no GPUs on this host ({}): nothing to {command}; `vfio-p2p topo` shows what was read, and `vfio-p2p --example hgx-h100 {command}` shows the command on an embedded 8-GPU host",
                self.topo.source
            );
        }
        Ok(())
    }

    /// The flags over the VM config's level (`gen`) over the host config's policy.
    pub fn plan_options(&self, args: &PlanOptionArgs, vm_level: Option<PathKind>) -> PlanOptions {
        PlanOptions {
            p2p_level: args.p2p_level.or(vm_level).unwrap_or(self.host.p2p_level),
            allow_untranslated_p2p: args.allow_untranslated_p2p,
        }
    }

    /// Plans cliques for `gpus`, logging the plan's warnings.
    pub fn plan(&self, gpus: &[Bdf], options: &PlanOptions) -> anyhow::Result<Plan> {
        self.warn_fabric(gpus);
        let p = plan(&self.topo, gpus, options)
            .with_context(|| format!("planning cliques on {}", self.topo.source))?;
        for w in &p.warnings {
            tracing::warn!("{w}");
        }
        Ok(p)
    }
}

/// Records NVLink from the capture files when there are any, else from the host
/// config's source (an NVSwitch fabric by default); returns warnings.
fn apply_nvlink_source(
    topo: &mut Topology,
    host: &HostConfig,
    files: &[PathBuf],
) -> anyhow::Result<Vec<String>> {
    if !files.is_empty() {
        topo.add_nvlinks(&nvidia_smi::read_captures(files)?)?;
        return Ok(Vec::new());
    }
    match &host.nvlink {
        NvlinkSource::Nvswitch => Ok(decide::nvlink::apply_nvswitch_fabric(topo)),
        NvlinkSource::None => Ok(Vec::new()),
        NvlinkSource::NvidiaSmi(file) => {
            let map = nvidia_smi::read_captures(std::slice::from_ref(file))
                .context("loading the host config's nvlink.file")?;
            topo.add_nvlinks(&map)
                .context("loading the host config's nvlink.file")?;
            Ok(Vec::new())
        }
    }
}

/// Fabric Manager's partitions, read once: an embedded example's table under
/// `--example`, else the capture host.yaml names (`fabric_manager.partitions`), else
/// FM's live API ([`live_fabric`]); nothing under `fabric: none`, nor with `auto` on a
/// host without NVSwitches.
fn load_fabric(
    topo: &Topology,
    host: &HostConfig,
    example: Option<&str>,
) -> anyhow::Result<Fabric> {
    let (state, source) = if host.fabric == FabricMode::None {
        (None, "fabric: none in the host config".to_string())
    } else if let Some(name) = example {
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        match crate::synth::example_fabric(name, &gpus) {
            Some(s) => (
                Some(s),
                format!("example {name}: its board's Fabric Manager partition table"),
            ),
            None => (None, format!("example {name} has no NVSwitch board")),
        }
    } else {
        match &host.fabric_manager {
            FabricManagerSource::Capture(path) => (
                Some(
                    fm_capture::read(path)
                        .context("loading the host config's fabric_manager.partitions")?,
                ),
                path.display().to_string(),
            ),
            FabricManagerSource::Live(_)
                if host.fabric == FabricMode::Auto && topo.nvswitches().next().is_none() =>
            {
                (None, "no NVSwitch on this host".to_string())
            }
            FabricManagerSource::Live(address) => live_fabric(address),
        }
    };
    let model = decide::fabric::resolve_model(host.fabric, state.is_some());
    Ok(Fabric {
        model,
        state,
        source,
    })
}

/// The one call site of Fabric Manager's live API (`fmGetSupportedFabricPartitions`,
/// `fmGetUnsupportedFabricPartitions`, `fmGetNvlinkFailedDevices` through libnvfm.so.1):
/// this build has no FM client, so FM is not consulted and its partitions are not read.
fn live_fabric(address: &str) -> (Option<FabricState>, String) {
    (
        None,
        format!(
            "Fabric Manager at {address} was not consulted: this build has no FM client; \
             save `fmpm -l` output and name it in the host config's fabric_manager.partitions"
        ),
    )
}

/// What the run should hear about the fabric: partitions that planning cannot follow.
fn fabric_notes(topo: &Topology, host: &HostConfig, fabric: &Fabric) -> Vec<String> {
    let nvswitches = topo.nvswitches().next().is_some();
    match (fabric.model, &fabric.state) {
        (Some(FabricModel::SharedNvswitch), None) => vec![format!(
            "fabric: shared-nvswitch, but Fabric Manager's partitions are unknown, so GPU sets are not checked against them. {}",
            fabric.source
        )],
        (None, None) if nvswitches && host.fabric == FabricMode::Auto => vec![format!(
            "NVSwitches on this host, but Fabric Manager's partitions are unknown, so GPU sets are not checked against them. {}",
            fabric.source
        )],
        _ => Vec::new(),
    }
}

/// The libvirt version to target: the flag, else what `virsh --version` says.
pub fn libvirt_version(flag: Option<LibvirtVersion>) -> LibvirtVersion {
    if let Some(v) = flag {
        return v;
    }
    crate::read::vmm::installed_libvirt_version().unwrap_or_else(|why| {
        tracing::warn!("{why}");
        libvirt::OVERRIDE_SINCE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global(example: &str) -> GlobalArgs {
        GlobalArgs {
            sysfs_root: "/".into(),
            example: Some(example.into()),
            verbose: 0,
        }
    }

    #[test]
    fn the_nvswitch_default_applies_once_and_a_capture_replaces_it() {
        let none = HostConfigArgs { host_config: None };
        let c = Context::load(&global("hgx-h100"), &none, &[]).unwrap();
        assert_eq!(c.topo.nvlinks.len(), 8 * 7 / 2);

        let config = HostConfig {
            nvlink: NvlinkSource::None,
            ..HostConfig::default()
        };
        let record = synth::example("hgx-h100").unwrap();
        let (c, _) = Context::build(&record, config, &[]).unwrap();
        assert!(c.topo.nvlinks.is_empty());

        let capture = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/nvidia-smi/h200x2-topo-m.txt"
        ));
        let c = Context::load(&global("flat-vm"), &none, std::slice::from_ref(&capture)).unwrap();
        assert_eq!(c.topo.nvlinks.len(), 1);
        let e = Context::load(&global("hgx-h100"), &none, &[capture]).unwrap_err();
        assert!(
            format!("{e:#}").contains("captured on another machine"),
            "{e:#}"
        );
    }

    #[test]
    fn options_take_the_flag_over_the_vm_over_the_host() {
        let c = Context::load(
            &global("dual-socket-pcie"),
            &HostConfigArgs { host_config: None },
            &[],
        )
        .unwrap();
        let mut args = PlanOptionArgs {
            p2p_level: None,
            nvlink: vec![],
            allow_untranslated_p2p: false,
            host: HostConfigArgs { host_config: None },
        };
        assert_eq!(c.plan_options(&args, None).p2p_level, c.host.p2p_level);
        assert_eq!(
            c.plan_options(&args, Some(PathKind::Sys)).p2p_level,
            PathKind::Sys
        );
        args.p2p_level = Some(PathKind::Pix);
        assert_eq!(
            c.plan_options(&args, Some(PathKind::Sys)).p2p_level,
            PathKind::Pix
        );
        assert_eq!(c.gpus(&[]).len(), 8);
    }
    #[test]
    fn the_fabric_is_read_once_from_the_example_a_capture_or_not_at_all() {
        let none = HostConfigArgs { host_config: None };
        let c = Context::load(&global("hgx-h100"), &none, &[]).unwrap();
        assert_eq!(c.fabric.model, Some(FabricModel::SharedNvswitch));
        assert_eq!(c.fabric.state.as_ref().unwrap().partitions.len(), 15);
        // The same board as a real root: FM's live API is not consulted, and that is said.
        let hgx = synth::example("hgx-h100").unwrap();
        let (c, notes) = Context::build(&hgx, HostConfig::default(), &[]).unwrap();
        assert_eq!((c.fabric.model, c.fabric.state.is_none()), (None, true));
        assert!(
            c.fabric.source.contains("was not consulted"),
            "{}",
            c.fabric.source
        );
        assert!(
            notes.iter().any(|n| n.contains("NVSwitches on this host")),
            "{notes:?}"
        );
        // No NVSwitch, fabric auto: FM is not asked and nothing is said.
        let pcie = synth::example("dual-socket-pcie").unwrap();
        let (c, notes) = Context::build(&pcie, HostConfig::default(), &[]).unwrap();
        assert_eq!(c.fabric.source, "no NVSwitch on this host");
        assert!(
            notes.iter().all(|n| !n.contains("Fabric Manager")),
            "{notes:?}"
        );
        // A capture named in the host config is what the real root follows.
        let capture = HostConfig {
            fabric_manager: FabricManagerSource::Capture(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../tests/fixtures/fabric/fmpm-l-hgx-h100.json"
                )
                .into(),
            ),
            ..HostConfig::default()
        };
        let (c, _) = Context::build(&hgx, capture, &[]).unwrap();
        assert_eq!(c.fabric.model, Some(FabricModel::SharedNvswitch));
        assert!(c.fabric.state.unwrap().partitions[3].active);
        // fabric: none reads nothing, even on the example.
        let off = HostConfig {
            fabric: FabricMode::None,
            ..HostConfig::default()
        };
        let (c, notes) = Context::assemble(&hgx, off, &[], Some("hgx-h100")).unwrap();
        assert_eq!((c.fabric.model, c.fabric.state), (None, None));
        assert!(
            notes.iter().all(|n| !n.contains("Fabric Manager")),
            "{notes:?}"
        );
    }
}
