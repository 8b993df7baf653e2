//! The collector against hostile and plentiful guests, without vsock: Unix socket pairs
//! handed in with the CID the host would have seen (`ChannelListener`).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use vfio_p2p_collector::store::Store;
use vfio_p2p_collector::transport::ChannelListener;
use vfio_p2p_collector::{serve, Collector, Handled, Limits};
use vfio_p2p_contract::{
    Expectation, ExpectedFabric, ExpectedGpu, ExpectedPair, GuestReport, PciId, ReportedFabric,
    ReportedGpu, ReportedPair, Verdict,
};
use vfio_p2p_decide::fleet_verdict::{judge, BandwidthFloors, DomainPlan, Outcome};

const BOOT: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn bdf(s: &str) -> pci_config::Bdf {
    s.parse().unwrap()
}

fn expectation(vm: &str, nvlink: Option<u8>) -> Expectation {
    let mut e = Expectation::new(vm);
    for (host, guest) in [
        ("0000:41:00.0", "0000:06:00.0"),
        ("0000:42:00.0", "0000:07:00.0"),
    ] {
        e.gpus.push(ExpectedGpu {
            host_bdf: bdf(host),
            guest_bdf: bdf(guest),
            clique: Some(0),
            vendor: PciId(0x10de),
            device: PciId(0x2330),
            module_id: None,
            numa_nodes: Vec::new(),
        });
    }
    e.pairs.push(ExpectedPair {
        a: bdf("0000:06:00.0"),
        b: bdf("0000:07:00.0"),
        verdict: Verdict::P2p,
        path: "PIX".into(),
        nvlink,
        guest_path: None,
    });
    e
}

fn plan(domain: &str, cid: u32) -> DomainPlan {
    DomainPlan {
        domain: domain.into(),
        cid,
        expectation: expectation(domain, None),
    }
}

/// What a healthy guest of `vm` sends: both GPUs in clique 0, P2P both ways at `gbps`.
fn report(vm: &str, gbps: f64) -> GuestReport {
    let gpu = |b| ReportedGpu {
        guest_bdf: bdf(b),
        clique: Some(0),
        clique_readable: true,
    };
    let pair = |s, d| ReportedPair {
        src: bdf(s),
        dst: bdf(d),
        peer_access: true,
        writes_ok: Some(true),
        nvlinks: None,
        bandwidth_gbps: Some(gbps),
        latency_us: Some(1.5),
    };
    GuestReport {
        version: 1,
        vm: vm.into(),
        boot_id: BOOT.into(),
        agent_version: "0.1.0".into(),
        measured: true,
        agent_exit: 0,
        gpus: vec![gpu("0000:06:00.0"), gpu("0000:07:00.0")],
        pairs: vec![
            pair("0000:06:00.0", "0000:07:00.0"),
            pair("0000:07:00.0", "0000:06:00.0"),
        ],
        fabric: None,
    }
}

struct Harness {
    dir: tempfile::TempDir,
    tx: Option<Sender<(UnixStream, u32)>>,
    server: Option<thread::JoinHandle<()>>,
    handled: Arc<Mutex<Vec<Handled>>>,
}

impl Harness {
    fn new(plans: &[DomainPlan], limits: Limits) -> Self {
        Self::with_textfile(plans, limits, false, |_| {})
    }

    /// With `textfile`, the collector keeps `DIR/metrics/vfio_p2p.prom`; `before` fills the
    /// store before the collector starts.
    fn with_textfile(
        plans: &[DomainPlan],
        limits: Limits,
        textfile: bool,
        before: impl FnOnce(&Store),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        before(&store);
        for p in plans {
            store.put_plan(p).unwrap();
        }
        let (tx, rx) = channel();
        let handled = Arc::new(Mutex::new(Vec::new()));
        let h = handled.clone();
        let mut collector = Collector::new(store, limits, BandwidthFloors::default());
        if textfile {
            collector.textfile = Some(dir.path().join("metrics/vfio_p2p.prom"));
        }
        let collector = Arc::new(collector);
        let server = thread::spawn(move || {
            let l = ChannelListener::new(rx);
            serve(&l, collector, move |x| h.lock().unwrap().push(x.clone())).unwrap();
        });
        Harness {
            dir,
            tx: Some(tx),
            server: Some(server),
            handled,
        }
    }

    /// A connection from `cid`; the test writes the guest's side.
    fn connect(&self, cid: u32) -> UnixStream {
        let (guest, host) = UnixStream::pair().unwrap();
        self.tx.as_ref().unwrap().send((host, cid)).unwrap();
        guest
    }

    fn send(&self, cid: u32, bytes: &[u8]) {
        let mut g = self.connect(cid);
        // the collector may hang up first (oversized): that is its right
        let _ = g.write_all(bytes);
    }

    /// Waits until `n` connections have been handled (10 s at most), so that a test's next
    /// connection is not raced against the last one on a loaded machine.
    fn wait_handled(&self, n: usize) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while self.handled.lock().unwrap().len() < n && std::time::Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Closes the listener, waits for every worker, returns the outcomes.
    fn finish(&mut self) -> Vec<Handled> {
        self.tx.take();
        self.server.take().unwrap().join().unwrap();
        self.handled.lock().unwrap().clone()
    }

    fn store(&self) -> Store {
        Store::new(self.dir.path())
    }
}

fn quick_limits() -> Limits {
    Limits {
        deadline: Duration::from_millis(400),
        min_interval: Duration::ZERO,
        ..Limits::default()
    }
}

#[test]
fn a_matching_report_passes_and_a_wrong_clique_fails() {
    let mut h = Harness::new(&[plan("good", 10), plan("bad", 11)], quick_limits());
    h.send(10, report("good", 24.0).to_json().as_bytes());
    let mut wrong = report("bad", 24.0);
    wrong.gpus[1].clique = Some(1);
    h.send(11, wrong.to_json().as_bytes());
    let out = h.finish();
    assert_eq!(out.len(), 2, "{out:?}");
    let good = h.store().latest("good").unwrap().unwrap();
    assert_eq!(good.verdict, Outcome::Pass, "{:?}", good.problems);
    assert_eq!((good.cid, good.boot_id.as_str()), (10, BOOT));
    let bad = h.store().latest("bad").unwrap().unwrap();
    assert_eq!(bad.verdict, Outcome::Fail);
    assert_eq!(
        bad.problems,
        ["GPU 0000:07:00.0: clique 1 where the plan has 0"]
    );
}

#[test]
fn a_vm_on_an_fm_partition_passes_only_with_a_clean_fabric_check_in_its_report() {
    let on_fabric = |domain: &str, cid| {
        let mut p = plan(domain, cid);
        p.expectation.fabric = Some(ExpectedFabric {
            model: "shared-nvswitch".into(),
            partition_id: Some(1),
            fm_version: None,
        });
        p
    };
    let plans = [
        on_fabric("clean", 20),
        on_fabric("failed", 21),
        on_fabric("silent", 22),
        on_fabric("unchecked", 23),
    ];
    let mut h = Harness::new(&plans, quick_limits());
    let with = |vm: &str, fabric| GuestReport {
        fabric,
        ..report(vm, 24.0)
    };
    let checked = |problems: &[&str]| {
        Some(ReportedFabric {
            checked: true,
            problems: problems.iter().map(|p| p.to_string()).collect(),
        })
    };
    h.send(20, with("clean", checked(&[])).to_json().as_bytes());
    let failed = checked(&["GPU 0000:06:00.0 is not registered with the fabric"]);
    h.send(21, with("failed", failed).to_json().as_bytes());
    h.send(22, with("silent", None).to_json().as_bytes());
    let unchecked = Some(ReportedFabric {
        checked: false,
        problems: vec!["NVML cannot be loaded".into()],
    });
    h.send(23, with("unchecked", unchecked).to_json().as_bytes());
    h.finish();
    let verdict = |d: &str| h.store().latest(d).unwrap().unwrap();
    assert_eq!(verdict("clean").verdict, Outcome::Pass);
    let failed = verdict("failed");
    assert_eq!(failed.verdict, Outcome::Fail);
    assert_eq!(
        failed.problems,
        ["fabric: GPU 0000:06:00.0 is not registered with the fabric"]
    );
    assert_eq!(verdict("silent").verdict, Outcome::Fail);
    assert_eq!(
        verdict("unchecked").problems,
        ["fabric not checked in the guest: NVML cannot be loaded"]
    );
}

#[test]
fn bandwidth_under_the_floor_of_the_link_type_fails() {
    let floors = BandwidthFloors::default();
    let mut nv = plan("nv", 3);
    nv.expectation = expectation("nv", Some(18));
    // 10 GB/s: enough for PCIe, not for NVLink
    let r = report("nv", 10.0);
    assert_eq!(judge(&plan("nv", 3), &r, floors, 0).verdict, Outcome::Pass);
    let v = judge(&nv, &r, floors, 0);
    assert_eq!(v.verdict, Outcome::Fail);
    assert!(
        v.problems[0].contains("under the Nvlink floor of 20.0 GB/s"),
        "{:?}",
        v.problems
    );
    let mut lost = report("nv", 300.0);
    lost.pairs[0].writes_ok = Some(false);
    assert!(judge(&nv, &lost, floors, 0).problems[0].contains("writes were lost"));
}

#[test]
fn a_spoofed_domain_name_is_filed_under_the_cid_and_fails() {
    let mut h = Harness::new(&[plan("victim", 20), plan("attacker", 21)], quick_limits());
    h.send(20, report("victim", 24.0).to_json().as_bytes());
    h.wait_handled(1);
    h.send(21, report("victim", 0.0).to_json().as_bytes());
    h.finish();
    let victim = h.store().latest("victim").unwrap().unwrap();
    assert_eq!((victim.verdict, victim.cid), (Outcome::Pass, 20));
    let attacker = h.store().latest("attacker").unwrap().unwrap();
    assert_eq!(attacker.verdict, Outcome::Fail);
    assert!(
        attacker.problems[0].contains("claims to be 'victim', but CID 21 belongs to 'attacker'"),
        "{:?}",
        attacker.problems
    );
}

#[test]
fn unknown_cids_garbage_oversized_and_bad_boot_ids_store_nothing() {
    let limits = Limits {
        max_bytes: 4096,
        ..quick_limits()
    };
    let mut h = Harness::new(&[plan("vm", 30)], limits);
    h.send(99, report("vm", 24.0).to_json().as_bytes());
    h.send(30, b"\x00\xffnot json at all");
    let mut v: serde_json::Value = serde_json::from_str(&report("vm", 24.0).to_json()).unwrap();
    v["domain"] = "vm".into();
    h.send(30, v.to_string().as_bytes());
    h.send(30, &vec![b' '; 1 << 20]);
    let mut escape = report("vm", 24.0);
    escape.boot_id = "../../plans/vm".into();
    h.send(30, escape.to_json().as_bytes());
    let out = h.finish();
    assert!(out.contains(&Handled::UnknownCid(99)), "{out:?}");
    let reasons: Vec<String> = out
        .iter()
        .filter_map(|x| match x {
            Handled::Refused { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{out:?}");
    assert!(
        reasons.iter().any(|r| r.contains("not a report")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("unknown field `domain`")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r == "sent more than 4096 bytes"),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("is not a boot id")),
        "{reasons:?}"
    );
    assert!(h.store().latest_records().unwrap().is_empty());
    assert!(h.dir.path().join("plans/vm.json").exists());
}

#[test]
fn a_slow_loris_is_cut_off_while_others_are_served() {
    let limits = Limits {
        workers: 2,
        queue: 4,
        ..quick_limits()
    };
    let mut h = Harness::new(&[plan("slow", 40), plan("fast", 41)], limits);
    // dribbles a byte every 100 ms and never closes: each read succeeds, the deadline does not
    let mut slow = h.connect(40);
    let dribbler = thread::spawn(move || {
        for _ in 0..20 {
            if slow.write_all(b" ").is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    // a silent one holds the other worker
    let _silent = h.connect(40);
    h.send(41, report("fast", 24.0).to_json().as_bytes());
    let out = h.finish();
    dribbler.join().unwrap();
    assert!(
        out.contains(&Handled::Stored {
            domain: "fast".into(),
            pass: true
        }),
        "{out:?}"
    );
    let late = out
        .iter()
        .filter(|x| matches!(x, Handled::Refused { cid: 40, reason } if reason == "did not finish within 400ms"))
        .count();
    assert_eq!(late, 2, "{out:?}");
}

#[test]
fn a_guest_that_sends_again_too_soon_is_dropped() {
    let limits = Limits {
        min_interval: Duration::from_secs(60),
        ..quick_limits()
    };
    let mut h = Harness::new(&[plan("vm", 50)], limits);
    h.send(50, report("vm", 24.0).to_json().as_bytes());
    h.wait_handled(1);
    h.send(50, report("vm", 0.0).to_json().as_bytes());
    let out = h.finish();
    assert_eq!(out[1], Handled::RateLimited(50), "{out:?}");
    assert_eq!(
        h.store().latest("vm").unwrap().unwrap().verdict,
        Outcome::Pass
    );
}

#[test]
fn a_full_queue_closes_new_connections_instead_of_blocking() {
    let limits = Limits {
        workers: 1,
        queue: 1,
        ..quick_limits()
    };
    let mut h = Harness::new(&[plan("vm", 60)], limits);
    let held: Vec<UnixStream> = (0..5).map(|_| h.connect(60)).collect();
    let out = h.finish();
    drop(held);
    assert!(
        out.iter()
            .filter(|x| matches!(x, Handled::Busy(60)))
            .count()
            >= 3,
        "{out:?}"
    );
}

#[test]
fn many_guests_at_once_each_get_their_own_record() {
    let n = 200u32;
    let plans: Vec<DomainPlan> = (0..n).map(|i| plan(&format!("vm{i}"), 100 + i)).collect();
    let limits = Limits {
        queue: n as usize,
        ..quick_limits()
    };
    let mut h = Harness::new(&plans, limits);
    let senders: Vec<_> = (0..n)
        .map(|i| {
            let mut g = h.connect(100 + i);
            thread::spawn(move || {
                g.write_all(report(&format!("vm{i}"), 24.0).to_json().as_bytes())
                    .unwrap();
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let out = h.finish();
    let stored = out
        .iter()
        .filter(|x| matches!(x, Handled::Stored { pass: true, .. }))
        .count();
    assert_eq!(stored, n as usize, "{out:?}");
    let records = h.store().latest_records().unwrap();
    assert_eq!(records.len(), stored);
    assert!(records
        .iter()
        .all(|r| r.cid == 100 + r.domain[2..].parse::<u32>().unwrap()));
}

fn store_with_verdicts() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let floors = BandwidthFloors::default();
    store
        .put_record(&judge(
            &plan("good", 1),
            &report("good", 24.0),
            floors,
            1_700_000_000,
        ))
        .unwrap();
    let mut wrong = report("bad", 24.0);
    wrong.pairs[1].peer_access = false;
    store
        .put_record(&judge(&plan("bad", 2), &wrong, floors, 1_700_000_001))
        .unwrap();
    dir
}

#[test]
fn verdicts_prints_prometheus_text_per_domain_and_pair() {
    let dir = store_with_verdicts();
    let out = crate::cli::vfio_p2p()
        .args(["verdicts", "--format", "prometheus", "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "# TYPE vfio_p2p_verdict_pass gauge",
        "vfio_p2p_verdict_pass{domain=\"bad\"} 0",
        "vfio_p2p_verdict_pass{domain=\"good\"} 1",
        "vfio_p2p_pair_p2p_ok{domain=\"bad\",src=\"0000:07:00.0\",dst=\"0000:06:00.0\",link=\"pcie\"} 0",
        "vfio_p2p_pair_bandwidth_bytes_per_second{domain=\"good\",src=\"0000:06:00.0\",dst=\"0000:07:00.0\",link=\"pcie\"} 24000000000",
        "vfio_p2p_pair_latency_seconds{domain=\"good\",src=\"0000:06:00.0\",dst=\"0000:07:00.0\",link=\"pcie\"} 0.0000015",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    let table = crate::cli::vfio_p2p()
        .env("COLUMNS", "200")
        .args(["verdicts", "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("0000:07:00.0 → 0000:06:00.0: no peer access"),
        "{table}"
    );
}

/// A store with one sysfs-only report (`expect --send`: cliques read, nothing measured)
/// beside the measured ones.
fn store_with_an_unmeasured_report() -> tempfile::TempDir {
    let dir = store_with_verdicts();
    let mut sysfs_only = report("sysfs", 0.0);
    sysfs_only.measured = false;
    sysfs_only.pairs.clear();
    let record = judge(
        &plan("sysfs", 3),
        &sysfs_only,
        BandwidthFloors::default(),
        1_700_000_002,
    );
    Store::new(dir.path()).put_record(&record).unwrap();
    dir
}

fn verdicts(dir: &tempfile::TempDir, format: &str) -> String {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", "200")
        .args(["verdicts", "--format", format, "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_table_says_not_measured_for_pairs_a_report_did_not_measure() {
    let dir = store_with_an_unmeasured_report();
    let table = verdicts(&dir, "table");
    let row = |domain: &str| {
        table
            .lines()
            .find(|l| l.contains(&format!(" {domain} ")))
            .unwrap_or_else(|| panic!("{domain}: {table}"))
            .to_string()
    };
    // GPUs ok, then pairs ok
    assert!(row("sysfs").contains(" 2/2 ") && row("sysfs").contains(" not measured "));
    assert_eq!(row("sysfs").matches("2/2").count(), 1, "{table}");
    assert_eq!(row("good").matches(" 2/2 ").count(), 2, "{table}");
    assert!(row("bad").contains(" 1/2 "), "{table}");
    // received times are UTC dates, not Unix seconds
    assert!(row("good").contains("2023-11-14 22:13:20Z"), "{table}");
    assert!(!table.contains("1700000000"), "{table}");
}

#[test]
fn json_claims_nothing_for_pairs_a_report_did_not_measure() {
    let dir = store_with_an_unmeasured_report();
    let records: Vec<serde_json::Value> = serde_json::from_str(&verdicts(&dir, "json")).unwrap();
    let pairs_of = |domain: &str| {
        records.iter().find(|r| r["domain"] == domain).unwrap()["pairs"]
            .as_array()
            .unwrap()
            .clone()
    };
    let unmeasured = pairs_of("sysfs");
    assert_eq!(unmeasured.len(), 2);
    assert!(
        unmeasured.iter().all(|p| p["ok"].is_null()),
        "{unmeasured:?}"
    );
    assert!(pairs_of("good").iter().all(|p| p["ok"] == true));
    assert_eq!(
        pairs_of("bad").iter().filter(|p| p["ok"] == false).count(),
        1
    );
}

#[test]
fn prometheus_leaves_out_pairs_a_report_did_not_measure() {
    let dir = store_with_an_unmeasured_report();
    let text = verdicts(&dir, "prometheus");
    assert!(
        text.lines()
            .any(|l| l == "vfio_p2p_verdict_pass{domain=\"sysfs\"} 1"),
        "{text}"
    );
    let sysfs_pairs: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("vfio_p2p_pair") && l.contains("domain=\"sysfs\""))
        .collect();
    assert!(sysfs_pairs.is_empty(), "{sysfs_pairs:?}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("vfio_p2p_pair_verdict_pass{domain=\"good\""))
            .count(),
        2
    );
}

#[test]
fn collect_wait_exits_by_the_verdict_or_on_timeout() {
    let dir = store_with_verdicts();
    let wait = |domain: &str, since: &str| {
        crate::cli::vfio_p2p()
            .args([
                "collect",
                "--wait",
                domain,
                "--timeout",
                "1",
                "--since",
                since,
            ])
            .arg("--state-dir")
            .arg(dir.path())
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(wait("good", "0"), Some(0));
    assert_eq!(wait("bad", "0"), Some(1));
    // a record older than --since does not count
    assert_eq!(wait("good", "1800000000"), Some(3));
    assert_eq!(wait("never", "0"), Some(3));
}

#[test]
fn a_broken_plan_or_a_shared_cid_leaves_the_other_domains_served() {
    let mut h = Harness::new(&[plan("ok", 70), plan("one", 71)], quick_limits());
    let plans = h.dir.path().join("plans");
    std::fs::write(plans.join("half.json"), "{\"domain\":").unwrap();
    std::fs::write(
        plans.join("two.json"),
        serde_json::to_string(&plan("two", 71)).unwrap(),
    )
    .unwrap();
    h.send(70, report("ok", 24.0).to_json().as_bytes());
    h.wait_handled(1);
    h.send(71, report("one", 24.0).to_json().as_bytes());
    let out = h.finish();
    assert_eq!(
        out,
        [
            Handled::Stored {
                domain: "ok".into(),
                pass: true
            },
            Handled::UnknownCid(71)
        ]
    );
    let (_, problems) = h.store().plans_by_cid().unwrap();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems
        .iter()
        .any(|p| p.contains("half.json is not a plan")));
    assert!(problems
        .iter()
        .any(|p| p.contains("CID 71 is given to both")));
}

#[test]
fn collect_serves_a_cloud_hypervisor_socket_with_its_cid() {
    let dir = tempfile::tempdir().unwrap();
    Store::new(dir.path()).put_plan(&plan("ch-vm", 5)).unwrap();
    let sock = dir.path().join("ch-vm.sock_7389");
    let mut child = std::process::Command::new(crate::cli::bin())
        .arg("collect")
        .arg("--state-dir")
        .arg(dir.path())
        .arg("--unix-socket")
        .arg(format!("{}=5", sock.display()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut connected = None;
    for _ in 0..100 {
        if let Ok(s) = UnixStream::connect(&sock) {
            connected = Some(s);
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let mut s = connected.expect("collect listens on the socket");
    // the body claims another name: the socket's CID decides
    s.write_all(report("someone-else", 24.0).to_json().as_bytes())
        .unwrap();
    drop(s);
    let store = Store::new(dir.path());
    let mut record = None;
    for _ in 0..100 {
        record = store.latest("ch-vm").unwrap();
        if record.is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let r = record.expect("a record for ch-vm");
    assert_eq!((r.cid, r.verdict), (5, Outcome::Fail));
    assert!(
        r.problems[0].contains("claims to be 'someone-else'"),
        "{:?}",
        r.problems
    );
}

#[test]
fn the_textfile_holds_every_domain_including_those_stored_before_the_start() {
    let floors = BandwidthFloors::default();
    let old = judge(&plan("old", 81), &report("old", 1.0), floors, 1);
    let plans = [plan("new", 80), plan("old", 81)];
    let mut h = Harness::with_textfile(&plans, quick_limits(), true, |s| {
        s.put_record(&old).unwrap()
    });
    h.send(80, report("new", 24.0).to_json().as_bytes());
    h.finish();
    let text = std::fs::read_to_string(h.dir.path().join("metrics/vfio_p2p.prom")).unwrap();
    assert!(
        text.contains("vfio_p2p_verdict_pass{domain=\"new\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("vfio_p2p_verdict_pass{domain=\"old\"} 0\n"),
        "{text}"
    );
}

/// Issue 28: a report that lists one GPU twice (clique 0 and clique 5) or one pair twice
/// fails, whichever entry comes first.
#[test]
fn a_report_listing_a_gpu_or_a_pair_twice_fails() {
    let floors = BandwidthFloors::default();
    let mut twice = report("vm", 24.0);
    let mut again = twice.gpus[0].clone();
    again.clique = Some(5);
    twice.gpus.push(again);
    let r = judge(&plan("vm", 3), &twice, floors, 1);
    assert_eq!(r.verdict, Outcome::Fail);
    assert_eq!(
        r.problems,
        ["GPU 0000:06:00.0 is listed 2 times in the report (cliques 0, 5): a report lists each GPU once"]
    );
    let mut twice = report("vm", 24.0);
    twice.pairs.push(twice.pairs[0].clone());
    let r = judge(&plan("vm", 3), &twice, floors, 1);
    assert_eq!(r.verdict, Outcome::Fail, "{:?}", r.problems);
}

/// Issue 28: every file of the state directory is read bounded and without blocking: a
/// FIFO or /dev/zero among the plans leaves the others served (and `collect` listening),
/// and at a domain's `latest.json` `verdicts` and `collect --wait` end with an error that
/// names it instead of hanging or exhausting memory.
#[test]
fn special_files_in_the_state_directory_never_block_or_exhaust() {
    use std::os::unix::fs::symlink;
    let dir = store_with_verdicts();
    let store = Store::new(dir.path());
    store.put_plan(&plan("good", 1)).unwrap();
    let plans = dir.path().join("plans");
    nix::unistd::mkfifo(
        &plans.join("fifo.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    symlink("/dev/zero", plans.join("zero.json")).unwrap();
    let (served, problems) = store.plans_by_cid().unwrap();
    assert!(served.contains_key(&1), "{problems:?}");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems.iter().all(|p| p.contains("not a regular file")),
        "{problems:?}"
    );
    let latest = dir.path().join("records/good/latest.json");
    for special in ["fifo", "zero"] {
        std::fs::remove_file(&latest).unwrap();
        if special == "fifo" {
            nix::unistd::mkfifo(&latest, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        } else {
            symlink("/dev/zero", &latest).unwrap();
        }
        for args in [
            &["verdicts"][..],
            &[
                "collect",
                "--wait",
                "good",
                "--timeout",
                "2",
                "--since",
                "0",
            ],
        ] {
            let out = crate::cli::vfio_p2p()
                .args(args)
                .arg("--state-dir")
                .arg(dir.path())
                .timeout(Duration::from_secs(20))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{special} {args:?}: {err}");
            assert!(
                err.contains("latest.json is not a regular file"),
                "{special} {args:?}: {err}"
            );
        }
    }
}

/// Issue 27: the store files plans under the one VM-name rule that vm.yaml and
/// `gen --name` take (so every plan gen registers is storable, and nothing else is).
#[test]
fn the_store_takes_the_vm_names_gen_takes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path());
    let longest = "v".repeat(64);
    let too_long = "v".repeat(65);
    for (name, ok) in [
        ("vm-1.a_b", true),
        (longest.as_str(), true),
        ("vm+1", false),
        (too_long.as_str(), false),
        ("-vm", false),
        (".vm", false),
        ("../vm", false),
    ] {
        let stored = store.put_plan(&plan(name, 3));
        assert_eq!(stored.is_ok(), ok, "{name}: {stored:?}");
        assert_eq!(
            vfio_p2p_config::vm_name_error(name).is_none(),
            ok,
            "vm.yaml and gen --name take {name} as the store does"
        );
    }
}
