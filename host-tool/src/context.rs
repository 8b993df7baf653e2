//! What every command starts from, built once per run (as ripgrep builds its `HiArgs`
//! from the parsed flags): where the host comes from ([`HostSource`]), the host config,
//! the host's typed topology with its NVLink source applied, Fabric Manager's partitions,
//! the probes the command needs, and the options planning reads. Commands build a
//! [`Context`] and never import each other; the flags that several commands share are
//! defined here.

pub mod change;
pub mod source;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use pci_config::PathKind;
use source::{HostConfigFrom, HostSource};
use vfio_p2p_config::host::{FabricManagerSource, FabricMode, HostConfig, NvlinkSource};
use vfio_p2p_decide::clique_plan::{CliquePlan, PlanOptions};
use vfio_p2p_fm_ffi::{FmError, FmFailure};
use vfio_p2p_model::fabric::{Fabric, FabricModel};
use vfio_p2p_model::fabric_state::{check_module_map, FabricState, FmConfigFile, NvlsmProbe};
use vfio_p2p_model::host_facts::{HostFacts, IommuFacts};
use vfio_p2p_model::vmm::{LibvirtVersion, QemuVersion, OVERRIDE_SINCE};
use vfio_p2p_model::{HostRecord, Topology};
use vfio_p2p_read::fabric_manager::{fabric_state, read_fabric_manager};
use vfio_p2p_read::fm_api::FmSession;
use vfio_p2p_read::synth;
use vfio_p2p_read::{fm_capture, host_probe, nvidia_smi, vmm};

/// `--host-config`: the host policy that `topo`, `place`, `plan`, `check`, `gen` and
/// `libvirt patch` read.
#[derive(Debug, Clone, Args)]
pub struct HostConfigArgs {
    /// Host policy (p2p level, reserved devices, NVLink source); see
    /// /usr/share/doc/vfio-p2p/examples/README.md (configs/README.md in the source).
    #[arg(long, value_name = "FILE")]
    pub host_config: Option<PathBuf>,
}

/// The planning options `plan`, `check`, `gen` and `libvirt patch` share.
#[derive(Debug, Clone, Args)]
pub struct PlanOptionArgs {
    /// Worst host path allowed inside a clique: pix, pxb (NCCL's default), phb, node, sys
    /// (default: the VM config's where `gen` has one, else the host config's `p2p_level`, else pxb).
    #[arg(long, value_name = "LEVEL", value_parser = crate::cli::path_level(), ignore_case = true, hide_possible_values = true)]
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

/// What a command asks the build step to probe besides the host, host.yaml, the NVLink
/// source and Fabric Manager, which every context has: only what the command uses, so
/// `topo` never runs `virsh`.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// `nvidia-smi topo -m` captures from the command line (`--nvlink`), which replace
    /// host.yaml's NVLink source.
    pub nvlink: Vec<PathBuf>,
    /// Ask this QEMU binary its `--version`.
    pub qemu_version: Option<PathBuf>,
    /// The libvirt version to target: `Some(None)` asks libvirt (`virsh --version`),
    /// `Some(Some(v))` is a version given on the command line, which is not asked.
    pub libvirt_version: Option<Option<LibvirtVersion>>,
    /// Probe the host's iommufd support (`/dev/iommu`, VFIO cdevs, the kernel).
    pub iommufd: bool,
    /// Read Fabric Manager's config file (where the board has a fabric model).
    pub fm_config: bool,
}

impl Needs {
    /// The host, host.yaml, NVLink (from these captures, if any) and Fabric Manager only.
    pub fn nvlink(files: &[PathBuf]) -> Needs {
        Needs {
            nvlink: files.to_vec(),
            ..Needs::default()
        }
    }
}

/// What the probes a command asked for answered (`None`: not asked).
#[derive(Debug, Default)]
pub struct Probes {
    /// `--version` of [`Needs::qemu_version`], or why it could not be read.
    pub qemu_version: Option<Result<QemuVersion, String>>,
    /// libvirt's version, or why `virsh --version` could not be read.
    pub libvirt_version: Option<Result<LibvirtVersion, String>>,
    pub iommu: Option<IommuFacts>,
    pub fm_config: Option<FmConfigFile>,
    /// NVLSM beside Fabric Manager, asked with `fm_config` (where an NVLink-5 GPU is).
    pub nvlsm: Option<NvlsmProbe>,
}

/// A command's starting point: every input a command decides from, read once, before
/// any decision (ripgrep's `HiArgs`).
///
/// There is one way to build it, [`Context::build`]: the [`HostSource`] decided once from
/// the global options, host.yaml as [`HostConfigFrom`] says (`--host-config`, else the
/// defaults for data commands, the installed file for what runs on the host), and the
/// probes the command [`Needs`]. The build never prints: what reading said is returned in
/// [`Context::warnings`] and [`Context::fabric_notes`], and each command says it in its own
/// voice ([`Context::load`] logs both as `warning:` lines; the hook words its own).
#[derive(Debug)]
pub struct Context {
    pub source: HostSource,
    pub host: HostConfig,
    pub topo: Topology,
    /// Fabric Manager's partitions and the model planning follows, read once.
    pub fabric: Fabric,
    /// The connection to FM the partitions were read over (FM's live API), kept for the
    /// hook's activation: FM is asked once, before anything changes.
    pub fm: Option<FmSession>,
    pub probes: Probes,
    /// What the host's reader and its NVLink source warned about.
    pub warnings: Vec<String>,
    /// Partitions that planning cannot follow because FM did not answer.
    pub fabric_notes: Vec<String>,
}

impl Context {
    /// A data command's context: the host of `--sysfs-root`/`--example`, the host config
    /// of `--host-config` (else the defaults), the probes `needs` names; warnings logged
    /// once, here.
    pub fn load(
        global: &GlobalArgs,
        host: &HostConfigArgs,
        needs: &Needs,
    ) -> anyhow::Result<Context> {
        Context::load_from(HostSource::of(global), host, needs)
    }

    /// [`Context::load`] from a [`HostSource`] the command decided already (`gen` asks it
    /// whether the VM runs on the host read).
    pub fn load_from(
        source: HostSource,
        host: &HostConfigArgs,
        needs: &Needs,
    ) -> anyhow::Result<Context> {
        let config =
            source.host_config(host.host_config.as_deref(), HostConfigFrom::FlagOrDefaults)?;
        let context = Context::build(source, config, needs)?;
        for w in context.warnings.iter().chain(&context.fabric_notes) {
            tracing::warn!("{w}");
        }
        Ok(context)
    }

    /// The one build: reads the host once, applies its NVLink source (the command line's
    /// captures, else host.yaml's, plus an example's recorded capture), reads Fabric
    /// Manager, then runs the probes `needs` asks for.
    pub fn build(source: HostSource, host: HostConfig, needs: &Needs) -> anyhow::Result<Context> {
        let record = source.read()?;
        let mut topo = Topology::from_record(&record);
        let mut warnings: Vec<String> = topo.warnings.iter().map(ToString::to_string).collect();
        warnings.extend(apply_nvlink_source(&mut topo, &host, &needs.nvlink)?);
        let (fabric, fm) = load_fabric(&topo, &host, source.example())?;
        // An example recorded with its `nvidia-smi topo -m` capture shows its NVLink too.
        let capture = source.example().and_then(synth::example_nvlink_capture);
        if let (Some((text, name)), true) = (capture, needs.nvlink.is_empty()) {
            topo.add_nvlinks(&nvidia_smi::parse(text, name)?)?;
        }
        let fabric_notes = fabric_notes(&topo, &host, &fabric);
        let probes = probe(&source, &topo, &fabric, needs)?;
        Ok(Context {
            source,
            host,
            topo,
            fabric,
            fm,
            probes,
            warnings,
            fabric_notes,
        })
    }

    /// The host's devices as read, nothing typed or planned: `snapshot`, which writes them
    /// out again as a tree `--sysfs-root` reads back.
    pub fn read_record(global: &GlobalArgs) -> anyhow::Result<HostRecord> {
        HostSource::of(global).read()
    }

    /// What /dev says about the IOMMU groups of `devices` (and KVM, VFIO): probed below a
    /// root, "not probed" for an example or a snapshot file. The one probe keyed on the
    /// command's selection of devices (`check` runs it before anything is decided).
    pub fn probe_host(&self, devices: &[Bdf], deep: bool) -> HostFacts {
        match self.source.probe_root() {
            Ok(root) => host_probe::gather(root, &self.topo, devices, deep),
            Err(why) => host_probe::not_probed(why, &self.topo, devices),
        }
    }

    /// Where vhost_vsock is (`check --vsock`): probed below a root, "not probed" for an
    /// example or a snapshot file.
    pub fn probe_vsock_module(&self) -> vfio_p2p_model::host_facts::ModuleState {
        use vfio_p2p_model::host_facts::ModuleState;
        match self.source.probe_root() {
            Ok(root) => host_probe::vhost_vsock_module(root),
            Err(why) => ModuleState::Unknown(why.to_string()),
        }
    }

    /// The libvirt version to target: the flag, else what `virsh --version` said (logged
    /// with -v); `Err` says why it is unknown (the caller assumes one and says which).
    pub fn libvirt_version(&self) -> Result<LibvirtVersion, &str> {
        match &self.probes.libvirt_version {
            Some(Ok(v)) => Ok(*v).inspect(|v| tracing::info!("targeting libvirt {v}")),
            Some(Err(why)) => Err(why),
            None => Ok(OVERRIDE_SINCE),
        }
    }

    /// Warns when `gpus` are not a Fabric Manager partition a VM could be given (shared
    /// NVSwitch with FM's partitions known); the host config's reserved devices are not
    /// offered.
    pub fn warn_fabric(&self, gpus: &[Bdf]) {
        self.warn_fabric_as("", gpus);
    }

    fn warn_fabric_as(&self, who: &str, gpus: &[Bdf]) {
        let Some(state) = self.fabric.partitions() else {
            return;
        };
        let reserved = self.host.reserved.iter().copied().collect();
        if let Some(w) = vfio_p2p_decide::fabric::gpu_set_warning(state, gpus, &reserved) {
            tracing::warn!("{who}{w}");
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
        self.plan_as("", gpus, options)
    }

    /// [`Context::plan`] for a log other programs write too (QEMU's, a sidecar's): each
    /// warning after `who` (`qemu-wrap: `), `warning: qemu-wrap: …` as the docs show.
    pub fn plan_as(&self, who: &str, gpus: &[Bdf], o: &PlanOptions) -> anyhow::Result<CliquePlan> {
        let host = vfio_p2p_decide::vm::Host {
            topo: &self.topo,
            fabric: &self.fabric,
            config: &self.host,
        };
        vfio_p2p_decide::vm::cliques(&host, who, gpus, o, &mut crate::logging::say)
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
                if host.fabric == FabricMode::Auto && !vfio_p2p_decide::fabric::fm_board(topo) =>
            {
                LiveFabric::not_asked("no NVSwitch on this host")
            }
            FabricManagerSource::Live(address) => {
                live_fabric(address, host.fabric == FabricMode::SharedNvswitch)
            }
        };
        if let Some(state) = &mut live.state {
            state.apply_module_addresses(&host.fabric_modules);
            let gpus: Vec<Bdf> = topo
                .gpus()
                .filter(|g| g.is_nvidia_gpu())
                .map(|g| g.bdf)
                .collect();
            let checked =
                check_module_map(&host.fabric_modules, &gpus).and_then(|()| state.check());
            if let Err(e) = checked {
                let why = format!("{}: {e}", live.source);
                // FM's live answer is then as good as none (the policy decides); a file's
                // or an example's is an error in it.
                anyhow::ensure!(live.session.is_some(), "{why}");
                live = LiveFabric::unreachable(why);
            }
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
    let session = match open_fabric_manager(address) {
        Ok(s) => s,
        Err(e) if !explicit && e.failure() == FmFailure::NoLibrary => {
            return LiveFabric::not_asked(&format!("Fabric Manager not installed ({e})"));
        }
        Err(e) => return LiveFabric::unreachable(e.to_string()),
    };
    let source = format!("Fabric Manager at {address}");
    let state = read_fabric_manager(&session)
        .map_err(|e| e.to_string())
        .and_then(|report| {
            fabric_state(&report).map_err(|e| {
                format!("{source} answered a partition list it cannot have: {e}; check /var/log/fabricmanager.log and restart it")
            })
        });
    match state {
        Ok(state) => LiveFabric {
            state: Some(state),
            source,
            unreachable: None,
            session: Some(session),
        },
        Err(e) => LiveFabric::unreachable(e),
    }
}

/// The one place Fabric Manager is opened (`structure::fabric_manager_is_opened_in_one_place`):
/// the build's read above, `fabric` and the hook's release through
/// [`change::ChangeRoot::fabric_manager`]. Every call runs on the session's worker thread,
/// waited for at most `fm_api::CALL_DEADLINE`; a call abandoned there makes `main` end the
/// process with `_exit`.
fn open_fabric_manager(address: &str) -> Result<FmSession, FmError> {
    FmSession::open(address)
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
    let nvswitches = vfio_p2p_decide::fabric::fm_board(topo);
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

/// The probes `needs` asks for, run once, before anything is decided: QEMU's and
/// libvirt's versions, iommufd below the root, Fabric Manager's config file (only where
/// the board has a fabric model).
fn probe(
    source: &HostSource,
    topo: &Topology,
    fabric: &Fabric,
    needs: &Needs,
) -> anyhow::Result<Probes> {
    let fm_config = match (needs.fm_config, source.probe_root()) {
        (false, _) => None,
        (true, _) if fabric.model.is_none() => {
            Some(FmConfigFile::NotProbed("no fabric model".into()))
        }
        (true, Err(_)) if source.example().is_some() => Some(FmConfigFile::NotProbed(
            "an embedded example has no files".into(),
        )),
        (true, Err(_)) => Some(FmConfigFile::NotProbed(
            "a snapshot file has no FM config".into(),
        )),
        (true, Ok(root)) => Some(vfio_p2p_read::fm_config::read(root)?),
    };
    Ok(Probes {
        qemu_version: needs.qemu_version.as_deref().map(|q| {
            vmm::qemu_version_of(q).inspect(|v| tracing::info!("{}: QEMU {v}", q.display()))
        }),
        libvirt_version: needs
            .libvirt_version
            .map(|flag| flag.map_or_else(vmm::installed_libvirt_version, Ok)),
        iommu: needs.iommufd.then(|| match source.probe_root() {
            Ok(root) => host_probe::iommufd::probe(root),
            Err(_) => IommuFacts::not_probed("no live host (an example or a snapshot)"),
        }),
        fm_config,
        nvlsm: needs.fm_config.then(|| nvlsm_probe(source, topo)),
    })
}

/// NVLSM beside FM, probed where an NVLink-5 board's GPU is on the host.
fn nvlsm_probe(source: &HostSource, topo: &Topology) -> NvlsmProbe {
    let all: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    match source.probe_root() {
        _ if vfio_p2p_decide::fabric::nvlink5_board(topo, &all).is_none() => {
            NvlsmProbe::NotProbed("no NVLink-5 GPU".into())
        }
        Ok(root) => NvlsmProbe::Probed(host_probe::nvlsm::probe(root)),
        Err(why) => NvlsmProbe::NotProbed(why.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(record: &str, host: HostConfig) -> anyhow::Result<Context> {
        // A real root's reading of the example's board: not the example's FM table.
        let dir = tempfile::tempdir().unwrap();
        vfio_p2p_read::snapshot::write_sysfs_tree(&synth::example(record).unwrap(), dir.path())
            .unwrap();
        Context::build(HostSource::Root(dir.path().into()), host, &Needs::default())
    }

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
        let c = Context::load(&global("hgx-h100"), &none, &Needs::default()).unwrap();
        assert_eq!(c.topo.nvlinks.len(), 8 * 7 / 2);

        let config = HostConfig {
            nvlink: NvlinkSource::None,
            ..HostConfig::default()
        };
        let c = build("hgx-h100", config).unwrap();
        assert!(c.topo.nvlinks.is_empty());

        let capture = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/nvidia-smi/h200x2-topo-m.txt"
        ));
        let c = Context::load(
            &global("flat-vm"),
            &none,
            &Needs::nvlink(std::slice::from_ref(&capture)),
        )
        .unwrap();
        assert_eq!(c.topo.nvlinks.len(), 1);
        let e = Context::load(&global("hgx-h100"), &none, &Needs::nvlink(&[capture])).unwrap_err();
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
            &Needs::default(),
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
        let c = Context::load(&global("hgx-h100"), &none, &Needs::default()).unwrap();
        assert_eq!(c.fabric.model, Some(FabricModel::SharedNvswitch));
        assert_eq!(c.fabric.state.as_ref().unwrap().partitions.len(), 15);
        // The same board as a real root without FM's library: under `auto` a host without
        // Fabric Manager, nothing said; under shared-nvswitch FM's absence is a warning.
        let c = build("hgx-h100", HostConfig::default()).unwrap();
        let notes = c.fabric_notes.clone();
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
        let c = build("hgx-h100", shared).unwrap();
        let notes = c.fabric_notes;
        assert!(c.fabric.unreachable.is_some(), "{:?}", c.fabric);
        assert!(
            notes
                .iter()
                .any(|n| n.contains("fabric: shared-nvswitch, but") && n.contains("libnvfm.so.1")),
            "{notes:?}"
        );
        // No NVSwitch, fabric auto: FM is not asked and nothing is said.
        let c = build("dual-socket-pcie", HostConfig::default()).unwrap();
        let notes = c.fabric_notes;
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
        let c = build("hgx-h100", capture.clone()).unwrap();
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
        let c = build("hgx-h100", mapped).unwrap();
        let state = c.fabric.state.unwrap();
        assert_eq!(state.partitions[0].gpus[0].bdf, Some(gpu));
        // fabric: none reads nothing, even on the example.
        let off = HostConfig {
            fabric: FabricMode::None,
            ..HostConfig::default()
        };
        let example = HostSource::Example("hgx-h100".into());
        let c = Context::build(example, off, &Needs::default()).unwrap();
        let notes = c.fabric_notes;
        assert_eq!((c.fabric.model, c.fabric.state), (None, None));
        assert!(
            notes.iter().all(|n| !n.contains("Fabric Manager")),
            "{notes:?}"
        );
    }
}
