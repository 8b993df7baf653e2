//! Placement speed on a generated 64-GPU server: 2 sockets × 4 host bridges × 2 leaf
//! switches × 4 GPUs, 16 VMs of 4 GPUs, from topology to assignment.
//!
//! `cargo bench -p vfio-p2p --bench place` prints the median and worst of 21 runs; the
//! target is under 100 ms. Then `place --with-nics` on the same server with 2 NICs per
//! leaf switch (64 GPUs, 32 NICs): the NIC per placed GPU, timed apart. Last, placement
//! on Fabric Manager's partitions of the HGX 8-GPU board (`--example hgx-h100`), for the
//! shapes that use each partition size. Then issue 28's scale cases: 125x8 on 1,000 and
//! 500x8 on 4,000 GPUs flat on root buses (the dump `tests/hostile/flat_host.py` writes;
//! target < 2 s), and 8x1 and 2x4 on the HGX board without Fabric Manager.
//!
//! Then issue 39's: 125x8, 250x8 and 500x8 on 1,000, 2,000 and 4,000 GPUs behind 8-GPU
//! switches (21 switches per host bridge, each host bridge in its PCI domain: `switched`),
//! and 1250x8 on 10,000 flat GPUs over two PCI domains, with the process's peak memory so
//! far (target < 10 s and < 1 GB).
//!
//! Recorded on the shared 2-core machine (release): before (b8b0356) flat 125x8 on 1,000
//! 9.95 s (36.5 s when loaded), 500x8 on 4,000 killed at 60 s, hgx 8x1 0.020 ms, 2x4
//! 0.026 ms; after: 125x8 on 1,000 13.5 ms, 500x8 on 4,000 215 ms, hgx 8x1 0.010 ms, 2x4
//! 0.017 ms (same placements: unit goldens, `tests/place.rs`, the property tests).
//! Issue 39 (before: the release figures, 125x8 on 1,000 switched 54 s, 250x8 on
//! 2,000 459 s, 500x8 on 4,000 > 600 s, 1250x8 on 10,000 flat over domains > 120 s);
//! after (host bridge first, seed cache): 0.51 s / 24 MB, 0.81 s / 44 MB, 1.73 s / 85 MB,
//! 1.32 s / 85 MB (same sets as every seed: `scoped_search_matches_every_seed_*`).

use std::time::{Duration, Instant};

use vfio_p2p_decide::nic_affinity::NicPool;
use vfio_p2p_decide::placement::host::PlacementHost;
use vfio_p2p_decide::placement::request::PlacementOptions;
use vfio_p2p_decide::placement::shape;
use vfio_p2p_model::Topology;
use vfio_p2p_read::synth::tree::{server, server_with_nics, switched, ServerSpec};

fn main() {
    let spec = ServerSpec::uniform(2, 4, 2, 4);
    let topo = Topology::from_record(&server(&spec));
    let requests = shape(16, 4);
    let options = PlacementOptions::default();
    let mut times: Vec<Duration> = Vec::new();
    let mut last = None;
    for _ in 0..21 {
        let start = Instant::now();
        let host = PlacementHost::new(&topo, &options).expect("generated host is consistent");
        let p = host.place(&requests, None);
        times.push(start.elapsed());
        last = Some(p);
    }
    times.sort();
    let p = last.expect("ran at least once");
    let mut worst: Vec<String> = p.vms.iter().map(|v| v.worst_path.label()).collect();
    worst.dedup();
    println!(
        "place: {} GPUs, {} VMs x 4 -> {} placed, {} unplaced, worst paths {:?}",
        spec.gpu_count(),
        requests.len(),
        p.vms.len(),
        p.unplaced.len(),
        worst
    );
    println!(
        "place: median {:.2} ms, worst {:.2} ms over {} runs (target < 100 ms)",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times.len()
    );
    nic_affinity(&spec);
    fm_partitions();
    for (gpus, count) in [(1000, 125), (4000, 500)] {
        let topo = flat(gpus);
        let start = Instant::now();
        let host = PlacementHost::new(&topo, &options).expect("flat host is consistent");
        let p = host.place(&shape(count, 8), None);
        println!(
            "place {count}x8 on {gpus} flat GPUs: {} placed in {:.1} ms (target < 2 s)",
            p.vms.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    for switches in [125, 250, 500] {
        let topo = Topology::from_record(&switched(switches, 21, 8, 2));
        timed_place(
            &format!("{switches}x8 on {} switched GPUs", switches * 8),
            &topo,
            switches,
        );
    }
    timed_place("1250x8 on 10,000 flat GPUs, 2 domains", &flat(10_000), 1250);
    let mut hgx =
        Topology::from_record(&vfio_p2p_read::synth::example("hgx-h100").expect("example"));
    vfio_p2p_decide::nvlink::apply_nvswitch_fabric(&mut hgx);
    for (count, size) in [(8, 1), (2, 4)] {
        let mut times: Vec<Duration> = Vec::new();
        for _ in 0..21 {
            let start = Instant::now();
            let host = PlacementHost::new(&hgx, &options).expect("consistent");
            let p = host.place(&shape(count, size), None);
            assert!(p.unplaced.is_empty(), "{count}x{size} fits the board");
            times.push(start.elapsed());
        }
        times.sort();
        println!(
            "place {count}x{size} on hgx-h100 (NVSwitch, no FM): median {:.3} ms, worst {:.3} ms over {} runs",
            times[times.len() / 2].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3,
            times.len()
        );
    }
}

/// Places `count` VMs of 8 GPUs on `topo`: seconds, and the process's peak memory so far.
fn timed_place(what: &str, topo: &Topology, count: usize) {
    let start = Instant::now();
    let host = PlacementHost::new(topo, &PlacementOptions::default()).expect("consistent");
    let p = host.place(&shape(count, 8), None);
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or("?".to_string(), |kib| format!("{:.0} MB", kib / 1024.0));
    println!(
        "place {what}: {} placed, {} unplaced in {:.2} s, peak memory {peak} (target < 10 s, < 1 GB)",
        p.vms.len(),
        p.unplaced.len(),
        start.elapsed().as_secs_f64()
    );
}

/// `n` H100s on root buses, 32 per bus and 255 buses per PCI domain (one host bridge
/// each), one IOMMU group each: the flat dump `tests/hostile/flat_host.py` writes, read
/// by the same reader.
fn flat(n: usize) -> Topology {
    let mut config = [0u8; 256];
    config[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
    config[0x0a..0x0c].copy_from_slice(&[0x02, 0x03]);
    let config: String = config.iter().map(|b| format!("{b:02x}")).collect();
    let mut dump = serde_json::Map::new();
    for i in 0..n {
        let (domain, slot) = (i / (32 * 255), i % (32 * 255));
        let bdf = format!("{domain:04x}:{:02x}:{:02x}.0", 1 + slot / 32, slot % 32);
        dump.insert(
            bdf.clone(),
            serde_json::json!({
                "path": format!("/sys/devices/pci{domain:04x}:00/{bdf}"),
                "vendor": "0x10de", "device": "0x2330", "class": "0x030200",
                "numa_node": "0", "iommu_group": i.to_string(),
                "resource": "0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
                "config": config,
            }),
        );
    }
    let text = serde_json::Value::Object(dump).to_string();
    Topology::from_record(&vfio_p2p_read::flat_json::parse(&text, "bench flat").expect("dump"))
}

/// `place` on FM's 15 partitions of the HGX 8-GPU board: 1x8, 2x4, 4x2 and 8x1.
fn fm_partitions() {
    let mut topo =
        Topology::from_record(&vfio_p2p_read::synth::example("hgx-h100").expect("example"));
    vfio_p2p_decide::nvlink::apply_nvswitch_fabric(&mut topo);
    let gpus: Vec<_> = topo.gpus().map(|g| g.bdf).collect();
    let state = vfio_p2p_read::synth::example_fabric("hgx-h100", &gpus).expect("hgx table");
    let host = PlacementHost::new(&topo, &PlacementOptions::default()).expect("consistent");
    for (count, size) in [(1, 8), (2, 4), (4, 2), (8, 1)] {
        let requests = shape(count, size);
        let mut times: Vec<Duration> = Vec::new();
        let mut placed = 0;
        for _ in 0..21 {
            let start = Instant::now();
            let p = vfio_p2p_decide::fabric::place_on_partitions(
                &host,
                &state,
                &requests,
                &Default::default(),
            );
            times.push(start.elapsed());
            placed = p.vms.len();
        }
        times.sort();
        println!(
            "place on FM partitions {count}x{size}: {placed} placed; median {:.3} ms, worst {:.3} ms over {} runs",
            times[times.len() / 2].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3,
            times.len()
        );
    }
}

/// Placement plus a NIC per GPU on the server with 2 NICs per leaf switch.
fn nic_affinity(spec: &ServerSpec) {
    let topo = Topology::from_record(&server_with_nics(spec, 2));
    let host = PlacementHost::new(&topo, &PlacementOptions::default()).expect("consistent");
    let p = host.place(&shape(16, 4), None);
    let mut times: Vec<Duration> = Vec::new();
    let mut given = 0;
    for _ in 0..21 {
        let start = Instant::now();
        let mut pool = NicPool::new(&topo, &Default::default());
        given = p
            .vms
            .iter()
            .flat_map(|vm| &vm.gpus)
            .filter(|g| pool.choose(**g).nic.is_some())
            .count();
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "place --with-nics: {} GPUs placed, {given} got a PIX/PXB NIC of {} NICs; median {:.3} ms, worst {:.3} ms over {} runs",
        p.vms.iter().map(|v| v.gpus.len()).sum::<usize>(),
        topo.devices.values().filter(|d| d.vendor == 0x15b3).count(),
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times.len()
    );
}
