//! `reset_method` in bind and unbind (host.yaml `reset:`): set inside the transaction,
//! recorded, restored by a rollback and by unbind, refused before any write when the
//! kernel does not offer it or a bus reset would reach another tenant's device.

use std::path::Path;
use std::time::Duration;

use pci_config::Bdf;

use super::apply::FailAt;
use super::bind_plan::BindOptions;
use super::session::{bind, unbind, SessionOptions, UnbindSelection};
use super::sim::{write_tree, SimKernel};
use super::state::BindState;
use super::state::ResetChange;
use vfio_p2p_model::{HostRecord, ResetPolicy, Topology};
use vfio_p2p_read::binding::{device_dir, read_binding, read_reset_method};
use vfio_p2p_read::read_host;
use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

/// GPU A alone below its root port; GPU B on a root port's bus shared with a NIC.
struct Host {
    dir: tempfile::TempDir,
    host: HostRecord,
    a: Bdf,
    b: Bdf,
    nic: Bdf,
}

fn host() -> Host {
    let mut builder = HostBuilder::new("reset bind host");
    let hb = builder.host_bridge(0, 0x40);
    let gpu = EndpointSpec::gpu(0x10de, 0x2330, 80);
    let rp = builder.root_port(hb, Some(0), Some(ACS_ISOLATING));
    let a = builder.endpoint(Attach::Below(rp), 0, &gpu, None);
    let rp2 = builder.root_port(hb, Some(0), Some(ACS_ISOLATING));
    let b = builder.endpoint(Attach::Below(rp2), 0, &gpu, None);
    let nic_spec = EndpointSpec::nic(0x15b3, 0x1021);
    let nic = builder.endpoint(Attach::Below(rp2), 0, &nic_spec, None);
    let host = builder.build();
    let dir = tempfile::tempdir().unwrap();
    write_tree(&host, dir.path()).unwrap();
    Host {
        dir,
        host,
        a,
        b,
        nic,
    }
}

impl Host {
    fn root(&self) -> &Path {
        self.dir.path()
    }
    /// The topology `bind`'s caller reads: the tree as it is now.
    fn topo(&self) -> Topology {
        Topology::from_record(&read_host(self.root()).unwrap())
    }
    fn methods(&self, bdf: Bdf) -> String {
        read_reset_method(self.root(), bdf).unwrap().join(" ")
    }
}

fn opts() -> SessionOptions {
    SessionOptions {
        dry_run: false,
        lock_timeout: Duration::ZERO,
        guest: None,
        memory_offline_wait: Duration::ZERO,
    }
}

fn policy(reset: ResetPolicy) -> BindOptions {
    BindOptions {
        reset,
        ..BindOptions::default()
    }
}

#[test]
fn bind_sets_and_records_the_bus_reset_and_unbind_restores_it() {
    let h = host();
    assert_eq!(h.methods(h.a), "flr bus");
    let mut k = SimKernel::new(&h.host);
    let r = bind(
        h.root(),
        &h.topo(),
        &mut k,
        &[h.a],
        &policy(ResetPolicy::Bus),
        &opts(),
    )
    .unwrap();
    assert_eq!(h.methods(h.a), "bus");
    let shown: Vec<String> = r.devices[0].writes.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        shown.last().unwrap(),
        &format!("echo bus > /sys/bus/pci/devices/{}/reset_method", h.a)
    );
    let record = BindState::load(h.root()).unwrap();
    assert_eq!(
        record.devices[&h.a].reset,
        Some(ResetChange {
            set: "bus".into(),
            was: vec!["flr".into(), "bus".into()]
        })
    );
    unbind(
        h.root(),
        &mut k,
        &UnbindSelection::Devices(vec![h.a]),
        &opts(),
    )
    .unwrap();
    assert_eq!(h.methods(h.a), "flr bus");
    assert!(BindState::load(h.root()).unwrap().devices.is_empty());
}

#[test]
fn a_failure_at_any_write_restores_the_reset_method_too() {
    let total = {
        let h = host();
        let mut k = SimKernel::new(&h.host);
        bind(
            h.root(),
            &h.topo(),
            &mut k,
            &[h.a, h.b],
            &policy(ResetPolicy::Flr),
            &opts(),
        )
        .unwrap();
        k.log.len()
    };
    assert_eq!(
        total, 8,
        "2 GPUs × (override, unbind, probe), then 2 reset_methods"
    );
    for n in 1..=total {
        let h = host();
        let before = [h.a, h.b].map(|g| read_binding(h.root(), g).unwrap());
        let mut k = FailAt::new(SimKernel::new(&h.host), n);
        let e = bind(
            h.root(),
            &h.topo(),
            &mut k,
            &[h.a, h.b],
            &policy(ResetPolicy::Flr),
            &opts(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("injected failure"), "write {n}: {e}");
        assert!(!e.contains("ROLLBACK INCOMPLETE"), "write {n}: {e}");
        for g in [h.a, h.b] {
            assert_eq!(h.methods(g), "flr bus", "{g} after a failure at write {n}");
        }
        assert_eq!(
            [h.a, h.b].map(|g| read_binding(h.root(), g).unwrap()),
            before
        );
        assert!(BindState::load(h.root()).unwrap().devices.is_empty());
    }
}

#[test]
fn refused_before_any_write() {
    let h = host();
    let mut k = SimKernel::new(&h.host);
    // a bus reset of B would reset the NIC, which stays on the host
    let e = bind(
        h.root(),
        &h.topo(),
        &mut k,
        &[h.b],
        &policy(ResetPolicy::Bus),
        &opts(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains(&format!("also reset {}", h.nic)),
        "{e}"
    );
    // with the NIC in the same VM it goes
    assert!(k.log.is_empty());
    let bus = policy(ResetPolicy::Bus);
    bind(h.root(), &h.topo(), &mut k, &[h.b, h.nic], &bus, &opts()).unwrap();
    assert_eq!(h.methods(h.b), "bus");
    // a method the kernel does not list for the device
    std::fs::write(
        h.root().join(device_dir(h.a)).join("reset_method"),
        "pm bus\n",
    )
    .unwrap();
    let mut k = SimKernel::new(&h.host);
    let e = bind(
        h.root(),
        &h.topo(),
        &mut k,
        &[h.a],
        &policy(ResetPolicy::Flr),
        &opts(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("no flr reset for it (reset_method: pm bus)"),
        "{e}"
    );
    assert!(k.log.is_empty());
}
