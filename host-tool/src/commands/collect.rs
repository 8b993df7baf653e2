//! `vfio-p2p collect`: the host collector (see docs/fleet.md), and `collect --wait DOMAIN`
//! for provisioning pipelines, which waits for the domain's next judged record.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::Args;
use vfio_p2p_vsock::VsockListener;

use crate::cli::GlobalArgs;
use vfio_p2p_collector::store::{Store, DEFAULT_STATE_DIR};
use vfio_p2p_collector::transport::UnixCidListener;
use vfio_p2p_collector::{serve, Collector, Handled, Limits};
use vfio_p2p_decide::fleet_verdict::{BandwidthFloors, Outcome};

/// Exit status of `--wait` when no record came in time.
pub const EXIT_TIMEOUT: u8 = 3;

#[derive(Debug, Args)]
pub struct CollectArgs {
    /// Where plans (from `gen --state-dir`) and records live.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The vsock port to listen on (ignored under systemd socket activation).
    #[arg(long, default_value_t = vfio_p2p_contract::DEFAULT_REPORT_PORT)]
    pub port: u32,
    /// Do not listen: wait for DOMAIN's next record and exit 0 PASS, 1 FAIL, 3 timeout.
    #[arg(long, value_name = "DOMAIN")]
    pub wait: Option<String>,
    /// Seconds `--wait` waits.
    #[arg(long, value_name = "S", default_value_t = 600, requires = "wait")]
    pub timeout: u64,
    /// `--wait` takes records received at or after this Unix time (default: now).
    #[arg(long, value_name = "UNIX_TIME", requires = "wait")]
    pub since: Option<u64>,
    /// Serve Cloud Hypervisor VMs' hybrid vsock instead of AF_VSOCK: PATH is the VM's
    /// `--vsock socket=` path with `_PORT` appended, CID its vsock CID (repeatable).
    #[arg(long, value_name = "PATH=CID", value_parser = unix_socket_arg)]
    pub unix_socket: Vec<(PathBuf, u32)>,
    /// After each record, write every domain's verdicts here (Prometheus text, atomically).
    #[arg(long, value_name = "FILE")]
    pub textfile: Option<PathBuf>,
    /// Lowest copy-engine bandwidth over NVLink, GB/s.
    #[arg(long, value_name = "GBPS", default_value_t = BandwidthFloors::default().nvlink_gbps)]
    pub floor_nvlink: f64,
    /// Lowest copy-engine bandwidth over PCIe, GB/s.
    #[arg(long, value_name = "GBPS", default_value_t = BandwidthFloors::default().pcie_gbps)]
    pub floor_pcie: f64,
    /// Largest report read, in bytes.
    #[arg(long, default_value_t = Limits::default().max_bytes)]
    pub max_bytes: usize,
    /// Seconds a guest has to send its whole report.
    #[arg(long, value_name = "S", default_value_t = Limits::default().deadline.as_secs())]
    pub deadline: u64,
    /// Reports read at once.
    #[arg(long, default_value_t = Limits::default().workers)]
    pub workers: usize,
    /// Seconds between two reports of one guest; sooner ones are dropped.
    #[arg(long, value_name = "S", default_value_t = Limits::default().min_interval.as_secs())]
    pub min_interval: u64,
}

pub fn run(_global: &GlobalArgs, a: CollectArgs) -> anyhow::Result<ExitCode> {
    let store = Store::new(&a.state_dir);
    if let Some(domain) = &a.wait {
        return wait(&store, domain, a.since, Duration::from_secs(a.timeout));
    }
    let limits = Limits {
        max_bytes: a.max_bytes,
        deadline: Duration::from_secs(a.deadline.max(1)),
        workers: a.workers.max(1),
        queue: Limits::default().queue,
        min_interval: Duration::from_secs(a.min_interval),
    };
    let floors = BandwidthFloors {
        nvlink_gbps: a.floor_nvlink,
        pcie_gbps: a.floor_pcie,
    };
    let (plans, problems) = store.plans_by_cid()?;
    for p in problems {
        tracing::warn!("{p}");
    }
    let mut collector = Collector::new(store, limits, floors);
    collector.textfile = a.textfile;
    let collector = Arc::new(collector);
    if !a.unix_socket.is_empty() {
        return serve_unix(&a.unix_socket, collector, plans.len(), &a.state_dir);
    }
    let listener = match VsockListener::from_systemd() {
        Some(listener) => listener,
        None => VsockListener::bind(a.port).with_context(|| {
            format!(
                "listening on vsock port {} (load the vhost_vsock module: modprobe vhost_vsock)",
                a.port
            )
        })?,
    };
    eprintln!(
        "vfio-p2p: collecting reports for {} planned domain(s) into {}",
        plans.len(),
        a.state_dir.display()
    );
    serve(&listener, collector, said).context("accepting vsock connections")?;
    Ok(ExitCode::SUCCESS)
}

/// Says each stored verdict (refusals are logged as warnings by the collector).
fn said(h: &Handled) {
    if let Handled::Stored { domain, pass } = h {
        eprintln!(
            "vfio-p2p: stored {} for {domain}",
            if *pass { "PASS" } else { "FAIL" }
        );
    }
}

fn unix_socket_arg(s: &str) -> Result<(PathBuf, u32), String> {
    let (path, cid) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("'{s}': give PATH=CID, e.g. /run/vfio-p2p/vsock/vm0.sock_7389=3"))?;
    let cid = cid
        .parse()
        .map_err(|_| format!("'{cid}' in '{s}' is not a CID"))?;
    Ok((PathBuf::from(path), cid))
}

/// One thread per Cloud Hypervisor socket, all judging into one state directory.
fn serve_unix(
    sockets: &[(PathBuf, u32)],
    collector: Arc<Collector>,
    planned: usize,
    state_dir: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let mut threads = Vec::new();
    for (path, cid) in sockets {
        let l = UnixCidListener::bind(path, *cid)
            .with_context(|| format!("listening on {} for CID {cid}", path.display()))?;
        let (c, p) = (collector.clone(), path.clone());
        threads.push(std::thread::spawn(move || {
            serve(&l, c, said).with_context(|| format!("accepting on {}", p.display()))
        }));
    }
    eprintln!(
        "vfio-p2p: collecting reports for {planned} planned domain(s) from {} socket(s) into {}",
        sockets.len(),
        state_dir.display()
    );
    for t in threads {
        t.join().expect("a listener thread does not panic")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn wait(
    store: &Store,
    domain: &str,
    since: Option<u64>,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let since = since.unwrap_or(now);
    let end = Instant::now() + timeout;
    loop {
        if let Some(r) = store.latest(domain)? {
            if r.received_at >= since {
                print!(
                    "{}",
                    vfio_p2p_emit::verdicts::table(std::slice::from_ref(&r))
                );
                for p in &r.problems {
                    println!("{p}");
                }
                return Ok(ExitCode::from(u8::from(r.verdict == Outcome::Fail)));
            }
        }
        if Instant::now() >= end {
            eprintln!(
                "vfio-p2p: no report from {domain} within {}s (is the agent run with report --send, and `vfio-p2p collect` running?)",
                timeout.as_secs()
            );
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
