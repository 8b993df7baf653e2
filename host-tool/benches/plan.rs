//! Planning speed where the pair count is largest: N GPUs flat on root buses (a big flat
//! VM), 32 per host bridge, the 64-GPU generated server, and a 4,000-GPU switch tree at
//! the default level and at `sys` (one clique of everything). Prints the median of 5 runs
//! of `plan` (model built once); issue 15 asks for 1,000 flat GPUs in well under a second,
//! issue 28 for 4,000 in under 2 s (`tests/hostile/scale.sh` times the binary and its memory).
//!
//! `cargo bench -p vfio-p2p --bench plan`

use std::time::{Duration, Instant};

use pci_config::Bdf;
use pci_config::PathKind;
use vfio_p2p_decide::clique_plan::{plan, PlanOptions};
use vfio_p2p_model::Topology;
use vfio_p2p_read::synth::tree::{server, ServerSpec};
use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

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

/// `n` GPUs (a multiple of 32) in switch trees: per PCI domain one host bridge, a root
/// port, a switch of 4 leaf switches with 8 GPUs each; domains alternate NUMA nodes.
fn tree(n: usize) -> Topology {
    let mut b = HostBuilder::new("bench tree");
    b.numa_node(0, "0-31").numa_node(1, "32-63");
    let gpu = EndpointSpec::gpu(0x10de, 0x2330, 128);
    for d in 0..n / 32 {
        let hb = b.host_bridge(u16::try_from(d).expect("domains"), 0);
        let rp = b.root_port(hb, Some((d % 2) as u32), Some(ACS_ISOLATING));
        let (_, leaves) = b.switch(rp, 4, Some(ACS_ISOLATING));
        for leaf in leaves {
            let (_, ports) = b.switch(leaf, 8, Some(ACS_ISOLATING));
            for p in ports {
                b.endpoint(Attach::Below(p), 0, &gpu, None);
            }
        }
    }
    Topology::from_record(&b.build())
}

fn median_of_5(topo: &Topology) -> (Duration, usize) {
    let (t, pairs) = median_at(topo, PathKind::Pxb);
    (t, pairs.expect("a plan"))
}

/// The median of 5 plans of every GPU at `level`: its time and the pairs listed, or the
/// error (a 4,000-GPU tree needs 125 cliques at PXB: that refusal is timed too).
fn median_at(topo: &Topology, level: PathKind) -> (Duration, Result<usize, String>) {
    let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
    let mut times = Vec::new();
    let mut pairs = Err(String::new());
    for _ in 0..5 {
        let start = Instant::now();
        let options = PlanOptions {
            p2p_level: level,
            ..PlanOptions::default()
        };
        let p = plan(topo, &gpus, &options);
        times.push(start.elapsed());
        pairs = p.map(|p| p.pairs.len()).map_err(|e| {
            let text = e.to_string();
            format!("{}… ({} bytes)", &text[..text.len().min(60)], text.len())
        });
    }
    times.sort();
    (times[2], pairs)
}

fn main() {
    for n in [250, 1000, 4000] {
        let (t, pairs) = median_of_5(&flat(n));
        println!(
            "plan: {n} flat GPUs, {pairs} pairs listed: median {:.1} ms",
            t.as_secs_f64() * 1e3
        );
    }
    let server = Topology::from_record(&server(&ServerSpec::uniform(2, 4, 2, 4)));
    let (t, pairs) = median_of_5(&server);
    println!(
        "plan: 64-GPU server, {pairs} pairs: median {:.1} ms",
        t.as_secs_f64() * 1e3
    );
    let big = tree(4000);
    for level in [PathKind::Pxb, PathKind::Node, PathKind::Sys] {
        let (t, pairs) = median_at(&big, level);
        let what = match pairs {
            Ok(n) => format!("{n} pairs listed"),
            Err(e) => format!("refused: {e}"),
        };
        println!(
            "plan: 4,000-GPU switch tree at {level}, {what}: median {:.1} ms",
            t.as_secs_f64() * 1e3
        );
    }
}
