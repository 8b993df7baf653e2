//! Benchmark (not a test): `topo` on a generated host with 64 GPUs and over 1,000
//! PCI devices, written as a sysfs tree. Times read + model + matrix (the work of
//! `vfio-p2p topo`), the whole binary, and `lspci -tv` on the same tree.
//!
//! Then (issue 28) 10,000 GPUs flat on root buses, 32 per host bridge: model, report
//! (the matrix is left out past 256) and table, once each (target < 5 s).
//!
//! Run: `cargo bench -p vfio-p2p --bench topo`

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use vfio_p2p_emit::topo_report::{render_table, HostTopoReport};
use vfio_p2p_model::HostRecord;
use vfio_p2p_model::Topology;
use vfio_p2p_read::read_host;
use vfio_p2p_read::snapshot::write_sysfs_tree;
use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

const RUNS: usize = 15;

/// 8 host bridges (one PCI domain each, 4 per NUMA node); per host bridge two root
/// ports with a 4-port switch of GPUs (with their audio functions) and two root ports
/// with a 24-port switch of NVMe drives: 64 GPUs, 1,024 devices.
fn big_host() -> HostRecord {
    let mut b = HostBuilder::new("generated 64-GPU host");
    b.numa_node(0, "0-63").numa_node(1, "64-127");
    let gpu = EndpointSpec::gpu(0x10de, 0x2330, 80);
    let audio = EndpointSpec {
        class: 0x040300,
        bars: vec![(16 << 10, false)],
        driver: Some("snd_hda_intel".into()),
        ..gpu.clone()
    };
    let nvme = EndpointSpec {
        vendor: 0x144d,
        device: 0xa80a,
        class: 0x010802,
        bars: vec![(16 << 10, false)],
        driver: Some("nvme".into()),
        link: (4, 4),
        msix_at_c8: false,
        acs: None,
    };
    for domain in 0..8u16 {
        let numa = u32::from(domain / 4);
        let hb = b.host_bridge(domain, 0);
        for _ in 0..2 {
            let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
            let (_, ports) = b.switch(rp, 4, Some(ACS_ISOLATING));
            for p in ports {
                b.endpoint(Attach::Below(p), 0, &gpu, None);
                b.endpoint(Attach::Below(p), 1, &audio, None);
            }
        }
        for _ in 0..2 {
            let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
            let (_, ports) = b.switch(rp, 24, Some(ACS_ISOLATING));
            for p in ports {
                b.endpoint(Attach::Below(p), 0, &nvme, None);
            }
        }
    }
    b.build()
}

fn stats(mut times: Vec<Duration>) -> String {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "min {:7.2} ms  median {:7.2} ms  max {:7.2} ms",
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1])
    )
}

fn time<T>(mut f: impl FnMut() -> T) -> Vec<Duration> {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect()
}

/// User + system CPU time of this process so far (all threads): on a loaded shared
/// machine wall time mostly measures the wait for a core, CPU time the work.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we pass, which is zero-initialised and ours.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn run_quiet(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

fn main() {
    let host = big_host();
    let gpus = Topology::from_record(&host).gpus().count();
    println!(
        "generated host: {} PCI devices, {gpus} GPUs, {} host bridges",
        host.devices.len(),
        8
    );
    // sysfs lives in memory (kernfs); a tmpfs tree compares like with like.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("tempdir");
    // TOPO_BENCH_TREE=DIR writes the tree there and keeps it, for hyperfine or strace.
    let kept = std::env::var_os("TOPO_BENCH_TREE").map(std::path::PathBuf::from);
    let root = kept.as_deref().unwrap_or(dir.path());
    println!("tree in {}", root.display());
    let t = Instant::now();
    write_sysfs_tree(&host, root).expect("writing the sysfs tree");
    println!(
        "write sysfs tree:        {:.1} ms (once)",
        t.elapsed().as_secs_f64() * 1e3
    );

    let read = time(|| read_host(root).expect("read"));
    let record = read_host(root).expect("read");
    assert_eq!(
        record.devices, host.devices,
        "the tree reads back as written"
    );
    let model = time(|| Topology::from_record(&record));
    let topo = Topology::from_record(&record);
    let matrix = time(|| HostTopoReport::new(&topo));
    let cpu_before = cpu_time();
    let all = time(|| {
        let topo = Topology::from_record(&read_host(root).expect("read"));
        let report = HostTopoReport::new(&topo);
        render_table(&topo, &report).len()
    });
    let cpu_per_run = (cpu_time() - cpu_before) / RUNS as u32;
    println!("read_host:               {}", stats(read));
    println!("model:                   {}", stats(model));
    println!("matrix + report:         {}", stats(matrix));
    println!("read+model+matrix+table: {}", stats(all));
    println!(
        "  CPU time per run (user+sys, all threads): {:.2} ms",
        cpu_per_run.as_secs_f64() * 1e3
    );

    let exe = Path::new(env!("CARGO_BIN_EXE_vfio-p2p"));
    let binary = time(|| run_quiet(Command::new(exe).arg("--sysfs-root").arg(root).arg("topo")));
    println!("vfio-p2p topo (process): {}", stats(binary));

    let sysfs = root.join("sys/bus/pci");
    let mut lspci = Command::new("lspci");
    lspci
        .args(["-tv", "-A", "linux-sysfs", "-O"])
        .arg(format!("sysfs.path={}", sysfs.display()));
    if run_quiet(&mut lspci) {
        println!(
            "lspci -tv (same tree):   {}",
            stats(time(|| run_quiet(&mut lspci)))
        );
    } else {
        println!("lspci -tv: not available or failed on this tree; skipped");
    }
    flat_10k();
}

/// 10,000 GPUs on root buses (the issue 28 dump: 160 s, then an abort at 4 GB).
fn flat_10k() {
    let mut b = HostBuilder::new("flat 10,000");
    b.numa_node(0, "0-31");
    let gpu = EndpointSpec::gpu(0x10de, 0x2330, 128);
    for i in 0..10_000usize {
        let hb = b.host_bridge(
            u16::try_from(i / 4096).expect("domains"),
            ((i / 32) % 128) as u8,
        );
        b.endpoint(Attach::HostBridge(hb), 0, &gpu, Some(0));
    }
    let record = b.build();
    let t = Instant::now();
    let topo = Topology::from_record(&record);
    let model = t.elapsed();
    let t = Instant::now();
    let report = HostTopoReport::new(&topo);
    let text = render_table(&topo, &report);
    println!(
        "10,000 flat GPUs: model {:.0} ms, report + table {:.0} ms ({} bytes of table; matrix left out: {})",
        model.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3,
        text.len(),
        report.matrix_left_out.is_some()
    );
}
