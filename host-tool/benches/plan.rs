//! Planning speed where the pair count is largest: N GPUs flat on root buses (a big flat
//! VM), 32 per host bridge, and the 64-GPU generated server. Prints the median of 5 runs
//! of `plan` (model built once); issue 15 asks for 1,000 flat GPUs in well under a second.
//!
//! `cargo bench -p vfio-p2p --bench plan`

use std::time::{Duration, Instant};

use pci_config::Bdf;
use vfio_p2p::decide::plan::{plan, PlanOptions};
use vfio_p2p::model::Topology;
use vfio_p2p::synth::tree::{server, ServerSpec};
use vfio_p2p::synth::{Attach, EndpointSpec, HostBuilder};

/// `n` H100s, 32 per root bus, with no bridges above them.
fn flat(n: usize) -> Topology {
    let mut b = HostBuilder::new("bench flat");
    b.numa_node(0, "0-31");
    let gpu = EndpointSpec::gpu(0x10de, 0x2330, 128);
    for i in 0..n {
        let hb = b.host_bridge(0, u8::try_from(i / 32).expect("at most 256 root buses"));
        b.endpoint(Attach::HostBridge(hb), 0, &gpu, Some(0));
    }
    Topology::from_record(&b.build())
}

fn median_of_5(topo: &Topology) -> (Duration, usize) {
    let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
    let mut times = Vec::new();
    let mut pairs = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let p = plan(topo, &gpus, &PlanOptions::default()).expect("a plan");
        times.push(start.elapsed());
        pairs = p.pairs.len();
    }
    times.sort();
    (times[2], pairs)
}

fn main() {
    for n in [250, 500, 1000] {
        let (t, pairs) = median_of_5(&flat(n));
        println!(
            "plan: {n} flat GPUs, {pairs} pairs: median {:.1} ms",
            t.as_secs_f64() * 1e3
        );
    }
    let server = Topology::from_record(&server(&ServerSpec::uniform(2, 4, 2, 4)));
    let (t, pairs) = median_of_5(&server);
    println!(
        "plan: 64-GPU server, {pairs} pairs: median {:.1} ms",
        t.as_secs_f64() * 1e3
    );
}
