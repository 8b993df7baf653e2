//! Collector throughput: N guests (each its own CID and plan, 8 GPUs, every ordered pair
//! measured) send one report each at once, over Unix socket pairs standing in for vsock;
//! every report is read, judged, stored atomically (fsync) and the Prometheus textfile
//! rewritten. Then the same with half the guests hostile (garbage, oversized, silent: each
//! silent one holds a worker for the 200 ms deadline).
//!
//! `cargo bench -p vfio-p2p --bench collect` prints reports per second and the wall time.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vfio_p2p_collector::store::Store;
use vfio_p2p_collector::transport::ChannelListener;
use vfio_p2p_collector::{serve, Collector, Limits};
use vfio_p2p_contract::{
    Expectation, ExpectedGpu, ExpectedPair, GuestReport, PciId, ReportedGpu, ReportedPair, Verdict,
};
use vfio_p2p_decide::fleet_verdict::{BandwidthFloors, DomainPlan};

const GPUS: u8 = 8;

fn bdf(i: u8) -> pci_config::Bdf {
    format!("0000:{:02x}:00.0", 0x20 + i).parse().unwrap()
}

fn plan(domain: &str, cid: u32) -> DomainPlan {
    let mut e = Expectation::new(domain);
    for i in 0..GPUS {
        e.gpus.push(ExpectedGpu {
            host_bdf: bdf(i),
            guest_bdf: bdf(i),
            clique: Some(0),
            vendor: PciId(0x10de),
            device: PciId(0x2330),
            module_id: None,
            numa_nodes: Vec::new(),
        });
        for j in i + 1..GPUS {
            e.pairs.push(ExpectedPair {
                a: bdf(i),
                b: bdf(j),
                verdict: Verdict::P2p,
                path: "NV18".into(),
                nvlink: Some(18),
                guest_path: None,
            });
        }
    }
    DomainPlan {
        domain: domain.into(),
        cid,
        expectation: e,
    }
}

fn report(vm: &str) -> Vec<u8> {
    let mut pairs = Vec::new();
    for i in 0..GPUS {
        for j in 0..GPUS {
            if i != j {
                pairs.push(ReportedPair {
                    src: bdf(i),
                    dst: bdf(j),
                    peer_access: true,
                    writes_ok: Some(true),
                    nvlinks: Some(18),
                    bandwidth_gbps: Some(394.5),
                    latency_us: Some(0.665),
                });
            }
        }
    }
    GuestReport {
        version: 1,
        vm: vm.into(),
        boot_id: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
        agent_version: "0.1.0".into(),
        measured: true,
        agent_exit: 0,
        gpus: (0..GPUS)
            .map(|i| ReportedGpu {
                guest_bdf: bdf(i),
                clique: Some(0),
                clique_readable: true,
            })
            .collect(),
        pairs,
        fabric: None,
    }
    .to_json()
    .into_bytes()
}

fn run(n: u32, hostile: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    for i in 0..n {
        store.put_plan(&plan(&format!("vm{i}"), 100 + i)).unwrap();
    }
    let limits = Limits {
        queue: n as usize * 2,
        deadline: Duration::from_millis(200),
        min_interval: Duration::ZERO,
        ..Limits::default()
    };
    let mut c = Collector::new(store, limits, BandwidthFloors::default());
    c.textfile = Some(dir.path().join("metrics/vfio_p2p.prom"));
    let c = Arc::new(c);
    let (tx, rx) = channel();
    let server = {
        let c = c.clone();
        thread::spawn(move || serve(&ChannelListener::new(rx), c, |_| {}).unwrap())
    };
    let bytes = report("x").len();
    let start = Instant::now();
    let mut senders = Vec::new();
    let mut silent = Vec::new();
    for i in 0..n {
        let (mut guest, host) = UnixStream::pair().unwrap();
        tx.send((host, 100 + i)).unwrap();
        let body = if hostile && i % 2 == 1 {
            match i % 6 {
                1 => b"garbage".to_vec(),
                3 => vec![b' '; 1 << 20],
                _ => {
                    silent.push(guest);
                    continue;
                }
            }
        } else {
            report(&format!("vm{i}"))
        };
        senders.push(thread::spawn(move || {
            let _ = guest.write_all(&body);
        }));
    }
    for s in senders {
        s.join().unwrap();
    }
    drop(tx);
    server.join().unwrap();
    let took = start.elapsed();
    drop(silent);
    let stored = c.counters.stored.load(std::sync::atomic::Ordering::Relaxed);
    let refused = c
        .counters
        .refused
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "collect: {n} guests{} ({bytes} B reports, 8 GPUs, 56 pairs): {stored} stored, {refused} refused in {:.2} s, {:.0} stored reports/s",
        if hostile { ", every other one hostile" } else { "" },
        took.as_secs_f64(),
        stored as f64 / took.as_secs_f64()
    );
}

fn main() {
    for n in [100, 1000] {
        run(n, false);
    }
    run(1000, true);
}
