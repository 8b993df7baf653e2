//! Grace GPUs in bind and unbind (#38): they go to nvgrace_gpu_vfio_pci, not vfio-pci, and
//! only once the GPU memory `nvidia` onlined is offline ("System RAM (NVIDIA)" gone from
//! `/proc/iomem`); a wait that times out changes nothing and names the GPU and the fix; a
//! failed write rolls back to `nvidia`. On the `gh200` example written as a simulated sysfs
//! with a `proc/iomem` below the root.

use std::path::Path;
use std::time::Duration;

use pci_config::Bdf;

use super::apply::{FailAt, SysfsWriter};
use super::bind_plan::{vfio_driver_for, BindOptions, NVGRACE_GPU_VFIO_PCI, VFIO_PCI};
use super::memory_offline::OfflineError;
use super::session::{bind, unbind, SessionError, SessionOptions, SessionReport, UnbindSelection};
use super::sim::{write_tree, SimKernel};
use super::state::BindState;
use vfio_p2p_model::{HostRecord, Topology};
use vfio_p2p_read::binding::read_binding;
use vfio_p2p_read::read_host;
use vfio_p2p_read::synth::{example, Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

const GPU: &str = "0009:01:00.0";
const ONLINE: &str = "80000000-fffbffff : System RAM\n\
                      400000000000-40177fffffff : System RAM (NVIDIA)\n";
const OFFLINE: &str = "80000000-fffbffff : System RAM\n";

struct Grace {
    dir: tempfile::TempDir,
    host: HostRecord,
}

fn gpu() -> Bdf {
    GPU.parse().unwrap()
}

/// The gh200 example as a sysfs tree, its `proc/iomem` as given.
fn grace(iomem: &str) -> Grace {
    let host = example("gh200").unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_tree(&host, dir.path()).unwrap();
    set_iomem(dir.path(), iomem);
    Grace { dir, host }
}

fn set_iomem(root: &Path, text: &str) {
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::write(root.join("proc/iomem"), text).unwrap();
}

impl Grace {
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn topo(&self) -> Topology {
        Topology::from_record(&read_host(self.root()).unwrap())
    }
    fn driver(&self) -> Option<String> {
        read_binding(self.root(), gpu()).unwrap().driver
    }
    /// `bind` of the GPU through `k`, waiting at most `wait` for its memory to go offline.
    fn bind_gpu<W: SysfsWriter>(
        &self,
        k: &mut W,
        wait: Duration,
    ) -> Result<SessionReport, SessionError> {
        let topo = self.topo();
        bind(
            self.root(),
            &topo,
            k,
            &[gpu()],
            &BindOptions::default(),
            &opts(wait),
        )
    }
}

fn opts(wait: Duration) -> SessionOptions {
    SessionOptions {
        dry_run: false,
        lock_timeout: Duration::ZERO,
        guest: None,
        memory_offline_wait: wait,
    }
}

#[test]
fn grace_ids_get_the_variant_driver_and_others_vfio_pci() {
    for id in [0x2342, 0x2345, 0x2348, 0x2941, 0x31c2] {
        let mut b = HostBuilder::new("one gpu");
        let hb = b.host_bridge(9, 0);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let g = b.endpoint(
            Attach::Below(rp),
            0,
            &EndpointSpec::gpu(0x10de, id, 80),
            None,
        );
        let topo = Topology::from_record(&b.build());
        assert_eq!(vfio_driver_for(&topo, &g), NVGRACE_GPU_VFIO_PCI, "{id:#x}");
    }
    for (vendor, id) in [(0x10de, 0x2330), (0x1234, 0x2342)] {
        let mut b = HostBuilder::new("one gpu");
        let hb = b.host_bridge(9, 0);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let g = b.endpoint(
            Attach::Below(rp),
            0,
            &EndpointSpec::gpu(vendor, id, 80),
            None,
        );
        let topo = Topology::from_record(&b.build());
        assert_eq!(vfio_driver_for(&topo, &g), VFIO_PCI, "{vendor:#x}:{id:#x}");
    }
}

#[test]
fn a_grace_gpu_goes_to_nvgrace_and_unbind_brings_nvidia_back() {
    let g = grace(OFFLINE);
    assert_eq!(g.driver().as_deref(), Some("nvidia"));
    let mut k = SimKernel::new(&g.host);
    let o = opts(Duration::ZERO);
    let r = g.bind_gpu(&mut k, Duration::ZERO).unwrap();
    let b = read_binding(g.root(), gpu()).unwrap();
    assert_eq!(b.driver.as_deref(), Some(NVGRACE_GPU_VFIO_PCI));
    assert_eq!(b.driver_override.as_deref(), Some(NVGRACE_GPU_VFIO_PCI));
    let shown: Vec<String> = r.devices[0].writes.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        shown[0],
        format!("echo {NVGRACE_GPU_VFIO_PCI} > /sys/bus/pci/devices/{GPU}/driver_override")
    );
    assert!(r.devices[0].vfio_group.is_some(), "{r:?}");
    unbind(g.root(), &mut k, &UnbindSelection::All, &o).unwrap();
    let b = read_binding(g.root(), gpu()).unwrap();
    assert_eq!(
        (b.driver.as_deref(), b.driver_override),
        (Some("nvidia"), None)
    );
}

#[test]
fn bind_waits_until_the_gpu_memory_is_offline() {
    let g = grace(ONLINE);
    let root = g.root().to_path_buf();
    let offline = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        set_iomem(&root, OFFLINE);
    });
    let mut k = SimKernel::new(&g.host);
    let t = std::time::Instant::now();
    g.bind_gpu(&mut k, Duration::from_secs(20)).unwrap();
    let took = t.elapsed();
    offline.join().unwrap();
    // a bind that does not wait is done long before the memory goes offline
    assert!(
        took >= Duration::from_millis(1500),
        "did not wait: {took:?}"
    );
    assert_eq!(g.driver().as_deref(), Some(NVGRACE_GPU_VFIO_PCI));
}

#[test]
fn memory_still_online_changes_nothing_and_names_the_gpu_and_the_fix() {
    let g = grace(ONLINE);
    let mut k = SimKernel::new(&g.host);
    let before = read_binding(g.root(), gpu()).unwrap();
    let e = g.bind_gpu(&mut k, Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            e,
            SessionError::MemoryOnline(OfflineError::StillOnline { .. })
        ),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.starts_with(GPU), "{text}");
    assert!(text.contains("400000000000-40177fffffff"), "{text}");
    assert!(
        text.contains("nothing was changed") && text.contains("offline"),
        "{text}"
    );
    assert!(k.log.is_empty(), "wrote {:?}", k.log);
    assert_eq!(read_binding(g.root(), gpu()).unwrap(), before);
    assert!(BindState::load(g.root()).unwrap().devices.is_empty());
}

#[test]
fn a_failed_write_puts_the_grace_gpu_back_on_nvidia() {
    let g = grace(OFFLINE);
    let before = read_binding(g.root(), gpu()).unwrap();
    // 1: driver_override, 2: driver/unbind, 3: drivers_probe
    for n in 1..=3 {
        let mut k = FailAt::new(SimKernel::new(&g.host), n);
        let e = g.bind_gpu(&mut k, Duration::ZERO);
        assert!(e.is_err(), "write {n} did not fail the bind");
        assert_eq!(
            read_binding(g.root(), gpu()).unwrap(),
            before,
            "after write {n}"
        );
    }
}

#[test]
fn without_the_variant_driver_bind_names_its_module() {
    let g = grace(OFFLINE);
    std::fs::remove_dir_all(
        g.root()
            .join("sys/bus/pci/drivers")
            .join(NVGRACE_GPU_VFIO_PCI),
    )
    .unwrap();
    let mut k = SimKernel::new(&g.host);
    let e = g.bind_gpu(&mut k, Duration::ZERO).unwrap_err().to_string();
    assert!(
        e.contains("nvgrace_gpu_vfio_pci driver is not loaded")
            && e.contains("modprobe nvgrace-gpu-vfio-pci"),
        "{e}"
    );
    assert!(k.log.is_empty());
}
