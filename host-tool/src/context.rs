//! What the data commands start from, built once per run (as ripgrep builds its `HiArgs`
//! from the parsed flags): the host config, the host's typed topology with its NVLink
//! source applied, and the options planning reads. Commands build a [`Context`] and never
//! import each other; the flags that several commands share are defined here.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use pci_config::PathKind;
use vfio_p2p_config::host::{FabricManagerSource, FabricMode, HostConfig, NvlinkSource};
use vfio_p2p_decide::clique_plan::{plan, CliquePlan, PlanOptions};
use vfio_p2p_model::fabric::{Fabric, FabricModel};
use vfio_p2p_model::fabric_state::FabricState;
use vfio_p2p_model::vmm::LibvirtVersion;
use vfio_p2p_model::HostRecord;
use vfio_p2p_model::Topology;
use vfio_p2p_read::fabric_manager::read_fabric_manager;
use vfio_p2p_read::fm_api::{FmFailure, FmSession};
use vfio_p2p_read::synth;
use vfio_p2p_read::{fm_capture, nvidia_smi, read_host};

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
            vfio_p2p_bind::sim::write_tree(&host, &root.path).with_context(|| {
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
#[derive(Debug)]
pub struct Context {
    pub host: HostConfig,
    pub topo: Topology,
    /// Fabric Manager's partitions and the model planning follows, read once.
    pub fabric: Fabric,
    /// The connection to FM the partitions were read over (FM's live API), kept for the
    /// hook's activation: FM is asked once, before anything changes.
    pub fm: Option<FmSession>,
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

    /// The hook's [`Context::build`]: the host's warnings without the fabric's, which the
    /// hook words itself, for a VM that has GPUs (`FabricStep`).
    pub fn build_for_hook(
        record: &HostRecord,
        host: HostConfig,
    ) -> anyhow::Result<(Context, Vec<String>)> {
        Context::read(record, host, &[], None)
    }

    /// [`Context::build`] for a host that may be the embedded example `example`.
    fn assemble(
        record: &HostRecord,
        host: HostConfig,
        nvlink: &[PathBuf],
        example: Option<&str>,
    ) -> anyhow::Result<(Context, Vec<String>)> {
        let (context, mut warnings) = Context::read(record, host, nvlink, example)?;
        warnings.extend(fabric_notes(&context.topo, &context.host, &context.fabric));
        Ok((context, warnings))
    }

    /// The context and the host's warnings (the fabric's are [`fabric_notes`]).
    fn read(
        record: &HostRecord,
        host: HostConfig,
        nvlink: &[PathBuf],
        example: Option<&str>,
    ) -> anyhow::Result<(Context, Vec<String>)> {
        let mut topo = Topology::from_record(record);
        let mut warnings: Vec<String> = topo.warnings.iter().map(ToString::to_string).collect();
        warnings.extend(apply_nvlink_source(&mut topo, &host, nvlink)?);
        let (fabric, fm) = load_fabric(&topo, &host, example)?;
        let context = Context {
            host,
            topo,
            fabric,
            fm,
        };
        Ok((context, warnings))
    }

    /// Warns when `gpus` are not a Fabric Manager partition a VM could be given (shared
    /// NVSwitch with FM's partitions known); the host config's reserved devices are not
    /// offered.
    pub fn warn_fabric(&self, gpus: &[Bdf]) {
        let Some(state) = self.fabric.partitions() else {
            return;
        };
        let reserved = self.host.reserved.iter().copied().collect();
        if let Some(w) = vfio_p2p_decide::fabric::gpu_set_warning(state, gpus, &reserved) {
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
    pub fn plan(&self, gpus: &[Bdf], options: &PlanOptions) -> anyhow::Result<CliquePlan> {
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
        NvlinkSource::Nvswitch => Ok(vfio_p2p_decide::nvlink::apply_nvswitch_fabric(topo)),
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
/// FM's live API ([`live_fabric`]); nothing under `fabric: none` or `full-passthrough`
/// (FM runs in the VM), nor with `auto` on a host without NVSwitches. host.yaml's
/// `fabric_manager: modules:` gives FM's module ids their PCI addresses.
fn load_fabric(
    topo: &Topology,
    host: &HostConfig,
    example: Option<&str>,
) -> anyhow::Result<(Fabric, Option<FmSession>)> {
    let mut live = LiveFabric::default();
    if host.fabric == FabricMode::None {
        live.source = "fabric: none in the host config".to_string();
    } else if let Some(name) = example {
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        live.state = vfio_p2p_read::synth::example_fabric(name, &gpus);
        live.source = match live.state {
            Some(_) => format!("example {name}: its board's Fabric Manager partition table"),
            None => format!("example {name} has no NVSwitch board"),
        };
    } else {
        live = match &host.fabric_manager {
            FabricManagerSource::Capture(path) => LiveFabric {
                state: Some(
                    fm_capture::read(path)
                        .context("loading the host config's fabric_manager.partitions")?,
                ),
                source: path.display().to_string(),
                ..LiveFabric::default()
            },
            FabricManagerSource::Live(_) if host.fabric == FabricMode::FullPassthrough => {
                LiveFabric::not_asked("fabric: full-passthrough: Fabric Manager runs in the VM")
            }
            FabricManagerSource::Live(_)
                if host.fabric == FabricMode::Auto && topo.nvswitches().next().is_none() =>
            {
                LiveFabric::not_asked("no NVSwitch on this host")
            }
            FabricManagerSource::Live(address) => {
                live_fabric(address, host.fabric == FabricMode::SharedNvswitch)
            }
        };
        if let Some(state) = &mut live.state {
            state.apply_module_addresses(&host.fabric_modules);
        }
    }
    let model = vfio_p2p_decide::fabric::resolve_model(host.fabric, live.state.is_some());
    let fabric = Fabric {
        model,
        state: live.state,
        source: live.source,
        unreachable: live.unreachable,
    };
    Ok((fabric, live.session))
}

/// What asking FM's live API gave.
#[derive(Default)]
struct LiveFabric {
    state: Option<FabricState>,
    source: String,
    unreachable: Option<String>,
    session: Option<FmSession>,
}

impl LiveFabric {
    fn not_asked(why: &str) -> LiveFabric {
        LiveFabric {
            source: why.to_string(),
            ..LiveFabric::default()
        }
    }
}

/// The one call site of Fabric Manager's live API (`fmGetSupportedFabricPartitions`,
/// `fmGetUnsupportedFabricPartitions`, `fmGetNvlinkFailedDevices` through libnvfm.so.1,
/// `read::fabric_manager`). Under `auto` (`explicit` false) a host without FM's library
/// is a host without Fabric Manager: nothing is said. Otherwise a failure is
/// `unreachable`: a warning for planning, the hook's policy for a VM with GPUs.
fn live_fabric(address: &str, explicit: bool) -> LiveFabric {
    let session = match FmSession::open(address) {
        Ok(s) => s,
        Err(e) if !explicit && e.failure() == FmFailure::NoLibrary => {
            return LiveFabric::not_asked(&format!("Fabric Manager not installed ({e})"));
        }
        Err(e) => return LiveFabric::unreachable(e.to_string()),
    };
    match read_fabric_manager(&session) {
        Ok(report) => LiveFabric {
            state: Some(FabricState::from(&report)),
            source: format!("Fabric Manager at {address}"),
            unreachable: None,
            session: Some(session),
        },
        Err(e) => LiveFabric::unreachable(e.to_string()),
    }
}

impl LiveFabric {
    fn unreachable(why: String) -> LiveFabric {
        LiveFabric {
            source: why.clone(),
            unreachable: Some(why),
            ..LiveFabric::default()
        }
    }
}

/// What the run should hear about the fabric: partitions that planning cannot follow
/// because FM did not answer.
fn fabric_notes(topo: &Topology, host: &HostConfig, fabric: &Fabric) -> Vec<String> {
    let nvswitches = topo.nvswitches().next().is_some();
    match (fabric.model, &fabric.state) {
        (Some(FabricModel::SharedNvswitch), None) => vec![format!(
            "fabric: shared-nvswitch, but Fabric Manager's partitions are unknown, so GPU sets are not checked against them: {}",
            fabric.source
        )],
        (None, None)
            if nvswitches && host.fabric == FabricMode::Auto && fabric.unreachable.is_some() =>
        {
            vec![format!(
                "NVSwitches on this host, but Fabric Manager's partitions are unknown, so GPU sets are not checked against them: {}",
                fabric.source
            )]
        }
        _ => Vec::new(),
    }
}

/// The libvirt version to target: the flag, else what `virsh --version` says.
pub fn libvirt_version(flag: Option<LibvirtVersion>) -> LibvirtVersion {
    if let Some(v) = flag {
        return v;
    }
    vfio_p2p_read::vmm::installed_libvirt_version().unwrap_or_else(|why| {
        tracing::warn!("{why}");
        vfio_p2p_model::vmm::OVERRIDE_SINCE
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
        // The same board as a real root without FM's library: under `auto` a host without
        // Fabric Manager, nothing said; under shared-nvswitch FM's absence is a warning.
        let hgx = synth::example("hgx-h100").unwrap();
        let (c, notes) = Context::build(&hgx, HostConfig::default(), &[]).unwrap();
        assert_eq!((c.fabric.model, c.fabric.state.is_none()), (None, true));
        assert!(c.fabric.unreachable.is_none() && c.fm.is_none());
        assert!(
            c.fabric.source.contains("not installed"),
            "{}",
            c.fabric.source
        );
        assert!(
            notes.iter().all(|n| !n.contains("Fabric Manager")),
            "{notes:?}"
        );
        let shared = HostConfig {
            fabric: FabricMode::SharedNvswitch,
            ..HostConfig::default()
        };
        let (c, notes) = Context::build(&hgx, shared, &[]).unwrap();
        assert!(c.fabric.unreachable.is_some(), "{:?}", c.fabric);
        assert!(
            notes
                .iter()
                .any(|n| n.contains("fabric: shared-nvswitch, but") && n.contains("libnvfm.so.1")),
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
        let (c, _) = Context::build(&hgx, capture.clone(), &[]).unwrap();
        assert_eq!(c.fabric.model, Some(FabricModel::SharedNvswitch));
        assert!(c.fabric.state.unwrap().partitions[3].active);
        // A capture without addresses (FM in a service VM, FM on H100) gets host.yaml's
        // modules: NVIDIA's published partition 13 is module 7 alone, at 00000000:00:00.0.
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("fmpm-l.json");
        let partition = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/fabric/fmpm-l-nvidia-example-partition.json"
        ))
        .unwrap();
        std::fs::write(
            &bare,
            format!("{{\"numPartitions\": 1, \"partitionInfo\": [{partition}]}}"),
        )
        .unwrap();
        let gpu: Bdf = "0000:18:00.0".parse().unwrap();
        let mapped = HostConfig {
            fabric_manager: FabricManagerSource::Capture(bare),
            fabric_modules: [(7, gpu)].into(),
            ..capture
        };
        let (c, _) = Context::build(&hgx, mapped, &[]).unwrap();
        let state = c.fabric.state.unwrap();
        assert_eq!(state.partitions[0].gpus[0].bdf, Some(gpu));
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
