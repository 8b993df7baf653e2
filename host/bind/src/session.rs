//! One `bind` or `unbind` from start to end, under the lock: plan, record, write (or,
//! dry-run, say what would be written), update the record. Shared by the CLI commands
//! and the libvirt hook. `bind` plans on the topology it is given (the caller read the
//! host once, with host.yaml's NVLink source, and checked the guest on that same
//! topology); under the lock it makes sure no planned device's binding changed since.

use std::path::Path;
use std::time::Duration;

use pci_config::Bdf;
use serde::Serialize;

use super::apply::{
    reset_write, writes_for, SysfsWrite, SysfsWriter, Transaction, TransactionError,
};
use super::bind_plan::{
    is_vfio_driver, plan_bind, plan_unbind, BindOptions, BindPlan, BindPlanError, PlannedDevice,
    Reason, Target, NVGRACE_GPU_VFIO_PCI, NVGRACE_GPU_VFIO_PCI_MODULE, VFIO_PCI,
};
use super::lock::{BindLock, LockError};
use super::memory_offline::{wait_gpu_memory_offline, OfflineError};
use super::state::{BindState, DeviceRecordEntry, StateError};
use vfio_p2p_model::Topology;
use vfio_p2p_read::binding::driver_registered;
use vfio_p2p_read::{devices_use, read_binding, read_host, Binding, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("reading the host: {0}")]
    Read(#[from] ReadError),
    #[error(transparent)]
    Plan(#[from] BindPlanError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Transaction(#[from] Box<TransactionError>),
    #[error("{bdf}: its binding changed since the host was read ({read} then, {now} now), by another bind, unbind or hook; run again")]
    Changed { bdf: Bdf, read: String, now: String },
    #[error("the {driver} driver is not loaded ({path} is absent): {fix}")]
    NoVfioPci {
        driver: String,
        path: String,
        fix: String,
    },
    #[error(transparent)]
    MemoryOnline(#[from] OfflineError),
}

/// Which devices `unbind` restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnbindSelection {
    Devices(Vec<Bdf>),
    /// Every device in the record.
    All,
    /// Every recorded device a libvirt guest's `prepare` hook bound.
    Guest(String),
}

/// Common settings of a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub dry_run: bool,
    pub lock_timeout: Duration,
    /// The libvirt guest a hook acts for (recorded with what it binds).
    pub guest: Option<String>,
    /// How long `bind` waits for a Grace GPU's memory to go offline before it gives up
    /// and changes nothing ([`crate::GPU_MEMORY_OFFLINE_WAIT`] unless a test says less).
    pub memory_offline_wait: Duration,
}

/// What happened (or, dry-run, would happen) to one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    pub bdf: Bdf,
    #[serde(flatten)]
    pub reason: Reason,
    pub before: Binding,
    /// The binding read back after the writes; absent on a dry run.
    pub after: Option<Binding>,
    pub writes: Vec<SysfsWrite>,
    /// `/dev/vfio/N` of its IOMMU group, once on vfio-pci.
    pub vfio_group: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionReport {
    pub dry_run: bool,
    pub devices: Vec<DeviceReport>,
    /// What the reader warned about these devices (or about no device in particular):
    /// `bind` prints them; the hook has printed its own read warnings already.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_warnings: Vec<String>,
}

/// `unbind`'s read of the host, under the lock: what `bind` changed is read as it is now.
fn load_topology(root: &Path) -> Result<Topology, ReadError> {
    Ok(Topology::from_record(&read_host(root)?))
}

fn lock(root: &Path, opts: &SessionOptions) -> Result<Option<BindLock>, LockError> {
    if opts.dry_run {
        return Ok(None);
    }
    BindLock::acquire(root, opts.lock_timeout).map(Some)
}

/// Makes sure `driver` (vfio-pci or the Grace variant) is registered: `modprobe` of its
/// module on the live host (`root` is `/`), a clear error anywhere else.
fn ensure_driver(root: &Path, driver: &str) -> Result<(), SessionError> {
    if driver_registered(root, driver) {
        return Ok(());
    }
    let module = match driver {
        NVGRACE_GPU_VFIO_PCI => NVGRACE_GPU_VFIO_PCI_MODULE,
        d => d,
    };
    let path = root
        .join("sys/bus/pci/drivers")
        .join(driver)
        .display()
        .to_string();
    let missing = |fix: String| SessionError::NoVfioPci {
        driver: driver.to_string(),
        path: path.clone(),
        fix,
    };
    if root != Path::new("/") {
        return Err(missing(format!(
            "load it on that host (modprobe {module}); bind loads it itself only on the live root /"
        )));
    }
    let status = std::process::Command::new("modprobe").arg(module).status();
    if driver_registered(root, driver) {
        return Ok(());
    }
    let install = match driver {
        VFIO_PCI => "install the kernel's vfio-pci module (linux-modules-extra on Ubuntu)".to_string(),
        _ => format!(
            "install a kernel with {module} (CONFIG_NVGRACE_GPU_VFIO_PCI; its id table must list the GPU)"
        ),
    };
    Err(missing(match status {
        Ok(s) => format!("`modprobe {module}` exited with {s}; {install} and check dmesg"),
        Err(e) => format!("running modprobe failed ({e}); install kmod, or load {module} by hand"),
    }))
}

/// `/dev/vfio/N` of a device on vfio-pci, when it exists below `root`.
fn vfio_group(root: &Path, group: Option<u32>, on_vfio: bool) -> Option<String> {
    let path = format!("/dev/vfio/{}", group?);
    (on_vfio && root.join(&path[1..]).exists()).then_some(path)
}

/// Makes sure each planned device is still bound as `topo` read it (the host was read
/// before the lock was taken).
fn unchanged_since_read(root: &Path, plan: &BindPlan) -> Result<(), SessionError> {
    let show = |b: &Binding| match (&b.driver, &b.driver_override) {
        (Some(d), Some(o)) => format!("{d}, driver_override {o}"),
        (Some(d), None) => d.clone(),
        (None, Some(o)) => format!("no driver, driver_override {o}"),
        (None, None) => "no driver".into(),
    };
    for d in &plan.devices {
        let now = read_binding(root, d.bdf)?;
        if now != d.before {
            return Err(SessionError::Changed {
                bdf: d.bdf,
                read: show(&d.before),
                now: show(&now),
            });
        }
    }
    Ok(())
}

/// Binds `named` (and their other functions, and with `whole_group` their groups) to
/// vfio-pci, planned on `topo`, the host below `root` as the caller read it.
pub fn bind<W: SysfsWriter>(
    root: &Path,
    topo: &Topology,
    writer: &mut W,
    named: &[Bdf],
    bind_opts: &BindOptions,
    opts: &SessionOptions,
) -> Result<SessionReport, SessionError> {
    let _lock = lock(root, opts)?;
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    let usage = devices_use(root, &gpus);
    let plan = plan_bind(topo, named, &usage, bind_opts)?;
    let read_warnings = reads_about(topo, &plan);
    let moves: Vec<(Bdf, Target)> = plan.changes().map(|d| (d.bdf, d.target.clone())).collect();
    let resets = plan.resets();
    if opts.dry_run {
        return Ok(SessionReport {
            read_warnings,
            ..dry_run_report(&plan)
        });
    }
    unchanged_since_read(root, &plan)?;
    let drivers: std::collections::BTreeSet<&str> =
        moves.iter().filter_map(|(_, t)| t.vfio_driver()).collect();
    for d in drivers {
        ensure_driver(root, d)?;
    }
    // Grace: the GPU memory the host driver onlined must be gone before the GPU moves;
    // waited for before anything is written, so a timeout leaves the host as it was
    let grace: Vec<Bdf> = moves
        .iter()
        .filter(|(_, t)| t.vfio_driver() == Some(NVGRACE_GPU_VFIO_PCI))
        .map(|(b, _)| *b)
        .collect();
    if !grace.is_empty() {
        wait_gpu_memory_offline(root, &grace, opts.memory_offline_wait)?;
    }
    let mut state = BindState::load(root)?;
    let before_record = state.clone();
    for d in plan
        .devices
        .iter()
        .filter(|d| !d.unchanged || d.reset.is_some())
    {
        let bound_with = match d.reason {
            Reason::Named => d.bdf,
            Reason::OtherFunction(b) | Reason::GroupMember(b) | Reason::BoundWith(b) => b,
        };
        state.devices.insert(
            d.bdf,
            DeviceRecordEntry {
                original: d.before.clone(),
                bound_with,
                guest: opts.guest.clone(),
                reset: d.reset.clone(),
            },
        );
    }
    // Recorded before writing, so a crash half-way still leaves what unbind needs.
    state.save(root)?;
    let moved = match Transaction::new(root, writer).run_with_resets(&moves, &resets) {
        Ok(m) => m,
        Err(e) => {
            // Devices the rollback could not restore keep their record, for unbind.
            let mut kept = before_record;
            for f in &e.rollback_failures {
                if let Some(r) = state.devices.get(&f.bdf()) {
                    kept.devices.insert(f.bdf(), r.clone());
                }
            }
            kept.save(root)?;
            return Err(e.into());
        }
    };
    Ok(SessionReport {
        read_warnings,
        ..report(root, &plan.devices, moved)
    })
}

/// What the reader warned about the devices of this plan, or about no device in particular.
fn reads_about(topo: &Topology, plan: &BindPlan) -> Vec<String> {
    let planned: std::collections::BTreeSet<Bdf> = plan.devices.iter().map(|d| d.bdf).collect();
    topo.warnings
        .iter()
        .filter(|w| w.device.is_none_or(|b| planned.contains(&b)))
        .map(ToString::to_string)
        .collect()
}

/// What a plan would write, without writing.
fn dry_run_report(plan: &BindPlan) -> SessionReport {
    SessionReport {
        dry_run: true,
        read_warnings: Vec::new(),
        devices: plan
            .devices
            .iter()
            .map(|d| DeviceReport {
                bdf: d.bdf,
                reason: d.reason,
                before: d.before.clone(),
                after: None,
                writes: match d.unchanged {
                    true => Vec::new(),
                    false => writes_for(d.bdf, &d.before, &d.target),
                }
                .into_iter()
                .chain(d.reset.iter().map(|r| reset_write(d.bdf, &r.set)))
                .collect(),
                vfio_group: d
                    .iommu_group
                    .filter(|_| d.target.vfio_driver().is_some())
                    .map(|g| format!("/dev/vfio/{g}")),
            })
            .collect(),
    }
}

fn report(
    root: &Path,
    planned: &[PlannedDevice],
    moved: Vec<super::apply::Moved>,
) -> SessionReport {
    SessionReport {
        dry_run: false,
        read_warnings: Vec::new(),
        devices: planned
            .iter()
            .map(|d| {
                // its driver move and its reset_method write, in order
                let ms: Vec<&super::apply::Moved> =
                    moved.iter().filter(|m| m.bdf == d.bdf).collect();
                let after = ms
                    .last()
                    .map(|m| m.after.clone())
                    .unwrap_or_else(|| d.before.clone());
                let on_vfio = is_vfio_driver(after.driver.as_deref());
                DeviceReport {
                    bdf: d.bdf,
                    reason: d.reason,
                    before: d.before.clone(),
                    vfio_group: vfio_group(root, d.iommu_group, on_vfio),
                    after: Some(after),
                    writes: ms.iter().flat_map(|m| m.writes.clone()).collect(),
                }
            })
            .collect(),
    }
}

/// Restores devices: recorded ones exactly as they were, others to the host's default driver.
pub fn unbind<W: SysfsWriter>(
    root: &Path,
    writer: &mut W,
    selection: &UnbindSelection,
    opts: &SessionOptions,
) -> Result<SessionReport, SessionError> {
    let _lock = lock(root, opts)?;
    let topo = load_topology(root)?;
    let mut state = BindState::load(root)?;
    let plan = match selection {
        UnbindSelection::Devices(named) => plan_unbind(&topo, named, false, &state)?,
        UnbindSelection::All => plan_unbind(&topo, &[], true, &state)?,
        UnbindSelection::Guest(guest) => {
            let only = BindState {
                devices: state
                    .devices
                    .iter()
                    .filter(|(_, r)| r.guest.as_deref() == Some(guest.as_str()))
                    .map(|(b, r)| (*b, r.clone()))
                    .collect(),
            };
            plan_unbind(&topo, &[], true, &only)?
        }
    };
    if opts.dry_run {
        return Ok(dry_run_report(&plan));
    }
    let moves: Vec<(Bdf, Target)> = plan.changes().map(|d| (d.bdf, d.target.clone())).collect();
    let moved = Transaction::new(root, writer).run_with_resets(&moves, &plan.resets())?;
    for d in &plan.devices {
        state.devices.remove(&d.bdf);
    }
    state.save(root)?;
    Ok(report(root, &plan.devices, moved))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::apply::FailAt;
    use crate::sim::{write_tree, SimKernel};
    use vfio_p2p_model::HostRecord;
    use vfio_p2p_read::read_binding;
    use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    /// GPU A (+ audio function) and GPU B below an isolating switch; GPU C sharing a
    /// non-isolating switch (one IOMMU group) with a NIC.
    struct Fixture {
        dir: tempfile::TempDir,
        host: HostRecord,
        gpu_a: Bdf,
        audio_a: Bdf,
        gpu_b: Bdf,
        gpu_c: Bdf,
        nic_c: Bdf,
    }

    fn fixture() -> Fixture {
        let mut b = HostBuilder::new("bind test host");
        let hb = b.host_bridge(0, 0x40);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let (_, dsps) = b.switch(rp, 2, Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(0x10de, 0x2330, 80);
        let mut audio = EndpointSpec::gpu(0x10de, 0x22e8, 0);
        audio.class = 0x040300;
        audio.bars = vec![(16 << 10, false)];
        audio.driver = Some("snd_hda_intel".into());
        let gpu_a = b.endpoint(Attach::Below(dsps[0]), 0, &gpu, None);
        let audio_a = b.endpoint(Attach::Below(dsps[0]), 1, &audio, None);
        let gpu_b = b.endpoint(Attach::Below(dsps[1]), 0, &gpu, None);
        let rp2 = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let (_, dsps2) = b.switch(rp2, 2, None);
        let gpu_c = b.endpoint(Attach::Below(dsps2[0]), 0, &gpu, None);
        let nic_c = b.endpoint(
            Attach::Below(dsps2[1]),
            0,
            &EndpointSpec::nic(0x15b3, 0x1021),
            None,
        );
        let mut host = b.build();
        // One IOMMU group for GPU C and the NIC, as on a host whose switch lacks ACS.
        let group_c = host
            .devices
            .iter()
            .find(|d| d.bdf == gpu_c)
            .and_then(|d| d.iommu_group);
        for d in host.devices.iter_mut().filter(|d| d.bdf == nic_c) {
            d.iommu_group = group_c;
        }
        let dir = tempfile::tempdir().unwrap();
        write_tree(&host, dir.path()).unwrap();
        Fixture {
            dir,
            host,
            gpu_a,
            audio_a,
            gpu_b,
            gpu_c,
            nic_c,
        }
    }

    impl Fixture {
        fn root(&self) -> &Path {
            self.dir.path()
        }
        fn bindings(&self) -> BTreeMap<Bdf, Binding> {
            self.host
                .devices
                .iter()
                .map(|d| (d.bdf, read_binding(self.root(), d.bdf).unwrap()))
                .collect()
        }
        fn driver(&self, bdf: Bdf) -> Option<String> {
            read_binding(self.root(), bdf).unwrap().driver
        }
    }

    /// `bind` without flags, as the CLI runs it by default.
    fn bind_plain<W: SysfsWriter>(
        root: &Path,
        w: &mut W,
        named: &[Bdf],
    ) -> Result<SessionReport, SessionError> {
        bind(
            root,
            &read_topo(root),
            w,
            named,
            &BindOptions::default(),
            &opts(),
        )
    }

    /// The host below `root` as the hook and the CLI read it before binding.
    fn read_topo(root: &Path) -> Topology {
        Topology::from_record(&read_host(root).unwrap())
    }

    #[test]
    fn a_binding_changed_since_the_read_is_refused_before_anything_is_written() {
        let f = fixture();
        let stale = read_topo(f.root());
        let mut k = SimKernel::new(&f.host);
        bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap();
        unbind(f.root(), &mut k, &UnbindSelection::All, &opts()).unwrap();
        let other = f.root().join(device_path(f.gpu_a)).join("driver_override");
        fs::write(&other, "vfio-pci\n").unwrap();
        let writes = k.log.len();
        let e = bind(
            f.root(),
            &stale,
            &mut k,
            &[f.gpu_a],
            &BindOptions::default(),
            &opts(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("its binding changed since the host was read"),
            "{e}"
        );
        assert_eq!(k.log.len(), writes);
        assert!(BindState::load(f.root()).unwrap().devices.is_empty());
    }

    fn opts() -> SessionOptions {
        SessionOptions {
            dry_run: false,
            lock_timeout: Duration::ZERO,
            guest: None,
            memory_offline_wait: Duration::ZERO,
        }
    }

    #[test]
    fn binds_a_gpu_with_its_audio_function_and_restores_exactly() {
        let f = fixture();
        let original = f.bindings();
        let mut k = SimKernel::new(&f.host);
        let r = bind_plain(f.root(), &mut k, &[f.gpu_a]).unwrap();
        assert_eq!(r.devices.len(), 2);
        assert_eq!(r.devices[1].reason, Reason::OtherFunction(f.gpu_a));
        assert_eq!(f.driver(f.gpu_a).as_deref(), Some(VFIO_PCI));
        assert_eq!(f.driver(f.audio_a).as_deref(), Some(VFIO_PCI));
        let group = r.devices[0].vfio_group.clone().expect("a /dev/vfio group");
        assert!(f.root().join(&group[1..]).exists());
        let state = BindState::load(f.root()).unwrap();
        assert_eq!(state.devices[&f.audio_a].bound_with, f.gpu_a);
        assert_eq!(
            state.devices[&f.audio_a].original.driver.as_deref(),
            Some("snd_hda_intel")
        );
        // Every write the kernel's way, and none to a bridge.
        assert!(k.log.iter().all(|(file, _)| !file
            .to_string_lossy()
            .contains(&f.host.devices[0].bdf.to_string())));

        unbind(
            f.root(),
            &mut k,
            &UnbindSelection::Devices(vec![f.gpu_a]),
            &opts(),
        )
        .unwrap();
        assert_eq!(f.bindings(), original);
        assert!(BindState::load(f.root()).unwrap().devices.is_empty());
        assert!(!f.root().join(&group[1..]).exists());
    }

    #[test]
    fn a_failure_at_any_write_rolls_everything_back() {
        let total = {
            let f = fixture();
            let mut k = SimKernel::new(&f.host);
            bind_plain(f.root(), &mut k, &[f.gpu_a, f.gpu_b]).unwrap();
            k.log.len()
        };
        assert_eq!(total, 9, "3 devices × (override, unbind, probe)");
        for n in 1..=total {
            let f = fixture();
            let original = f.bindings();
            let mut k = FailAt::new(SimKernel::new(&f.host), n);
            let e = bind_plain(f.root(), &mut k, &[f.gpu_a, f.gpu_b])
                .unwrap_err()
                .to_string();
            let failed_dev = [f.gpu_a, f.audio_a, f.gpu_b][(n - 1) / 3];
            assert!(e.starts_with(&failed_dev.to_string()), "write {n}: {e}");
            assert!(e.contains("injected failure"), "write {n}: {e}");
            assert!(!e.contains("ROLLBACK INCOMPLETE"), "write {n}: {e}");
            assert_eq!(f.bindings(), original, "after a failure at write {n}");
            assert!(BindState::load(f.root()).unwrap().devices.is_empty());
            assert!(!f
                .root()
                .join("dev/vfio")
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some()));
            // Rollback goes newest device first.
            let rolled: Vec<String> = k.inner.log[n - 1..]
                .iter()
                .map(
                    |(file, value)| match file.to_string_lossy().split('/').nth(4) {
                        Some(dev) if dev.parse::<Bdf>().is_ok() => dev.to_string(),
                        _ => value.clone(),
                    },
                )
                .collect();
            let mut order = rolled.clone();
            order.dedup();
            let mut sorted = order.clone();
            sorted.sort();
            sorted.reverse();
            assert_eq!(order, sorted, "write {n}: rollback order {rolled:?}");
        }
    }

    #[test]
    fn a_failed_rollback_is_reported_and_stays_recorded_for_unbind() {
        let f = fixture();
        let original = f.bindings();
        // Write 4 (the audio function's override) fails, then the 5th write that reaches
        // the kernel (restoring the GPU: its unbind from vfio-pci) fails too.
        let mut k = FailAt::new(FailAt::new(SimKernel::new(&f.host), 5), 4);
        let e = bind_plain(f.root(), &mut k, &[f.gpu_a])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("{}: writing", f.audio_a)), "{e}");
        assert!(e.contains(&format!("ROLLBACK INCOMPLETE, restore these by hand (driver_override, driver/unbind, drivers_probe): {}: writing", f.gpu_a)), "{e}");
        let state = BindState::load(f.root()).unwrap();
        let kept: Vec<Bdf> = state.devices.keys().copied().collect();
        assert_eq!(kept, [f.gpu_a]);
        let mut k = SimKernel::new(&f.host);
        unbind(f.root(), &mut k, &UnbindSelection::All, &opts()).unwrap();
        assert_eq!(f.bindings(), original);
    }

    #[test]
    fn refuses_a_shared_group_unless_whole_group() {
        let f = fixture();
        let mut k = SimKernel::new(&f.host);
        let e = bind_plain(f.root(), &mut k, &[f.gpu_c]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(&format!("{} (mlx5_core)", f.nic_c)), "{text}");
        assert!(text.contains("--whole-group"), "{text}");
        assert!(k.log.is_empty());
        let whole = BindOptions {
            whole_group: true,
            ..Default::default()
        };
        let r = bind(
            f.root(),
            &read_topo(f.root()),
            &mut k,
            &[f.gpu_c],
            &whole,
            &opts(),
        )
        .unwrap();
        assert_eq!(r.devices.len(), 2);
        assert_eq!(f.driver(f.nic_c).as_deref(), Some(VFIO_PCI));
        for (file, _) in &k.log {
            let dev = file.to_string_lossy();
            assert!(
                !f.host
                    .devices
                    .iter()
                    .filter(|d| d.class >> 8 == 0x0604)
                    .any(|d| dev.contains(&d.bdf.to_string())),
                "wrote to a bridge: {dev}"
            );
        }
    }

    #[test]
    fn refuses_bridges_and_unknown_devices() {
        let f = fixture();
        let mut k = SimKernel::new(&f.host);
        let bridge = f.host.devices[0].bdf;
        let e = bind_plain(f.root(), &mut k, &[bridge]).unwrap_err();
        assert!(e.to_string().contains("is a PCI bridge"), "{e}");
        let nowhere: Bdf = "0000:ee:00.0".parse().unwrap();
        let e = bind_plain(f.root(), &mut k, &[nowhere]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("0000:ee:00.0: no such PCI device"),
            "{e}"
        );
        assert!(k.log.is_empty());
    }

    #[test]
    fn refuses_a_gpu_in_use_unless_forced() {
        let f = fixture();
        let proc_dir = f.root().join("proc/4242");
        fs::create_dir_all(proc_dir.join("fd")).unwrap();
        fs::write(proc_dir.join("comm"), "python3\n").unwrap();
        symlink("/dev/nvidia1", proc_dir.join("fd/7")).unwrap();
        let info = f
            .root()
            .join(format!("proc/driver/nvidia/gpus/{}", f.gpu_a));
        fs::create_dir_all(&info).unwrap();
        fs::write(
            info.join("information"),
            "Model: H100\nDevice Minor: \t 1\n",
        )
        .unwrap();
        let info_b = f
            .root()
            .join(format!("proc/driver/nvidia/gpus/{}", f.gpu_b));
        fs::create_dir_all(&info_b).unwrap();
        fs::write(info_b.join("information"), "Device Minor: 0\n").unwrap();
        let mut k = SimKernel::new(&f.host);
        bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap();
        let e = bind_plain(f.root(), &mut k, &[f.gpu_a]).unwrap_err();
        assert!(
            e.to_string()
                .contains("python3 (pid 4242) holds /dev/nvidia1"),
            "{e}"
        );
        assert_eq!(f.driver(f.gpu_a).as_deref(), Some("nvidia"));
        let force = BindOptions {
            force: true,
            ..Default::default()
        };
        bind(
            f.root(),
            &read_topo(f.root()),
            &mut k,
            &[f.gpu_a],
            &force,
            &opts(),
        )
        .unwrap();
        assert_eq!(f.driver(f.gpu_a).as_deref(), Some(VFIO_PCI));
    }

    #[test]
    fn refuses_the_console_gpu() {
        let f = fixture();
        fs::write(f.root().join(device_path(f.gpu_b)).join("boot_vga"), "1\n").unwrap();
        let conn = f
            .root()
            .join(device_path(f.gpu_a))
            .join("drm/card1/card1-DP-1");
        fs::create_dir_all(&conn).unwrap();
        fs::write(conn.join("status"), "connected\n").unwrap();
        let mut k = SimKernel::new(&f.host);
        let e = bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap_err();
        assert!(e.to_string().contains("boot_vga = 1"), "{e}");
        let e = bind_plain(f.root(), &mut k, &[f.gpu_a]).unwrap_err();
        assert!(e.to_string().contains("card1-DP-1 is connected"), "{e}");
    }

    fn device_path(bdf: Bdf) -> std::path::PathBuf {
        vfio_p2p_read::binding::device_dir(bdf)
    }

    #[test]
    fn dry_run_writes_nothing_and_lists_the_steps() {
        let f = fixture();
        let original = f.bindings();
        let mut k = SimKernel::new(&f.host);
        let dry = SessionOptions {
            dry_run: true,
            ..opts()
        };
        let r = bind(
            f.root(),
            &read_topo(f.root()),
            &mut k,
            &[f.gpu_a],
            &BindOptions::default(),
            &dry,
        )
        .unwrap();
        assert!(k.log.is_empty());
        assert_eq!(f.bindings(), original);
        let steps: Vec<String> = r.devices[0]
            .writes
            .iter()
            .map(ToString::to_string)
            .collect();
        let dev = format!("/sys/bus/pci/devices/{}", f.gpu_a);
        assert_eq!(
            steps,
            [
                format!("echo vfio-pci > {dev}/driver_override"),
                format!("echo {} > {dev}/driver/unbind", f.gpu_a),
                format!("echo {} > /sys/bus/pci/drivers_probe", f.gpu_a),
            ]
        );
        assert!(!f.root().join("run/vfio-p2p/lock").exists());
    }

    #[test]
    fn unbind_of_an_unrecorded_device_restores_the_host_default() {
        let f = fixture();
        let mut k = SimKernel::new(&f.host);
        bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap();
        fs::remove_file(crate::state::state_path(f.root())).unwrap();
        let r = unbind(
            f.root(),
            &mut k,
            &UnbindSelection::Devices(vec![f.gpu_b]),
            &opts(),
        )
        .unwrap();
        assert_eq!(
            r.devices[0].after,
            Some(Binding {
                driver: Some("nvidia".into()),
                driver_override: None
            })
        );
    }

    #[test]
    fn unbind_restores_an_original_override_and_a_driverless_device() {
        let f = fixture();
        let a = f.root().join(device_path(f.gpu_a));
        fs::write(a.join("driver_override"), "nvidia\n").unwrap();
        fs::remove_file(f.root().join(device_path(f.gpu_b)).join("driver")).unwrap();
        let original = f.bindings();
        let mut k = SimKernel::new(&f.host);
        bind_plain(f.root(), &mut k, &[f.gpu_a, f.gpu_b]).unwrap();
        assert_eq!(f.driver(f.gpu_b).as_deref(), Some(VFIO_PCI));
        unbind(f.root(), &mut k, &UnbindSelection::All, &opts()).unwrap();
        assert_eq!(f.bindings(), original);
    }

    #[test]
    fn guest_release_restores_only_what_its_hook_bound() {
        let f = fixture();
        let mut k = SimKernel::new(&f.host);
        let vm1 = SessionOptions {
            guest: Some("vm1".into()),
            ..opts()
        };
        bind(
            f.root(),
            &read_topo(f.root()),
            &mut k,
            &[f.gpu_a],
            &BindOptions::default(),
            &vm1,
        )
        .unwrap();
        bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap();
        unbind(
            f.root(),
            &mut k,
            &UnbindSelection::Guest("vm1".into()),
            &opts(),
        )
        .unwrap();
        assert_eq!(f.driver(f.gpu_a).as_deref(), Some("nvidia"));
        assert_eq!(f.driver(f.gpu_b).as_deref(), Some(VFIO_PCI));
        let left: Vec<Bdf> = BindState::load(f.root())
            .unwrap()
            .devices
            .into_keys()
            .collect();
        assert_eq!(left, [f.gpu_b]);
    }

    #[test]
    fn needs_vfio_pci_loaded_below_a_non_live_root() {
        let f = fixture();
        fs::remove_dir_all(f.root().join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        let mut k = SimKernel::new(&f.host);
        let e = bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap_err();
        assert!(
            e.to_string().contains("vfio-pci driver is not loaded"),
            "{e}"
        );
        assert!(k.log.is_empty());
        assert!(BindState::load(f.root()).unwrap().devices.is_empty());
    }

    #[test]
    fn a_held_lock_is_a_clear_error() {
        let f = fixture();
        let _held = BindLock::acquire(f.root(), Duration::ZERO).unwrap();
        let mut k = SimKernel::new(&f.host);
        let e = bind_plain(f.root(), &mut k, &[f.gpu_b]).unwrap_err();
        assert!(
            e.to_string()
                .contains("another vfio-p2p bind/unbind/hook is running"),
            "{e}"
        );
    }
}
