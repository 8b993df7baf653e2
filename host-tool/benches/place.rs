//! Placement speed on a generated 64-GPU server: 2 sockets × 4 host bridges × 2 leaf
//! switches × 4 GPUs, 16 VMs of 4 GPUs, from topology to assignment.
//!
//! `cargo bench -p vfio-p2p --bench place` prints the median and worst of 21 runs; the
//! target is under 100 ms.

use std::time::{Duration, Instant};

use vfio_p2p::decide::placement::{shape, PlacementHost, PlacementOptions};
use vfio_p2p::model::Topology;
use vfio_p2p::synth::tree::{server, ServerSpec};

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
}
