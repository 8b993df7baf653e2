//! `nccl`: an NCCL all-reduce across the guest's GPUs, one process per GPU as real jobs
//! run, through the NCCL library found at run time ([`vfio_p2p_cuda_driver::nccl`]). Copy tests
//! do not prove collectives work: each rank checks the sum element by element, and the
//! bus bandwidth is reported as nccl-tests computes it (`doc/PERFORMANCE.md` of
//! NVIDIA/nccl-tests: all-reduce bus bandwidth = algorithm bandwidth × 2(n−1)/n, the
//! rate each link carries). It runs once with NCCL's own topology detection and once
//! with a topology file (`NCCL_TOPO_FILE`), so a file that misleads NCCL shows as a
//! slower or failing run, and the verdict names why.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::cross_process::{finish, print_json};
use vfio_p2p_cuda_driver::nccl::{Nccl, UniqueId};
use vfio_p2p_cuda_driver::{self as cuda, DeviceBuffer, Event, Gpu, Stream};

/// A run with the topology file below this share of the bus bandwidth NCCL reached by
/// its own detection is slow: the two runs of one process agree within a few percent
/// (2 × H200, issue 42), a misleading file costs far more.
pub const FILE_SLOWER_THAN: f64 = 0.80;

/// Timed all-reduces of each run, after one warm-up (nccl-tests' default is 20).
pub const ITERS: u32 = 20;

/// The value rank `r` contributes at element `i`: small integers, so every sum is
/// exact in f32 and a single wrong element shows.
pub fn contribution(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 13) % 251) as f32
}

/// The expected sum at element `i` over `nranks` ranks.
pub fn expected(nranks: usize, i: usize) -> f32 {
    (0..nranks).map(|r| contribution(r, i)).sum()
}

/// What one rank found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: usize,
    pub gpu: Bdf,
    /// Milliseconds per all-reduce (the mean of the timed ones).
    pub ms_per_op: Option<f64>,
    /// Elements checked, and those that were not the expected sum.
    pub checked: u64,
    pub wrong: u64,
    /// The first wrong element: (index, got, expected).
    pub first_wrong: Option<(u64, f32, f32)>,
    pub error: Option<String>,
}

/// One run: all ranks under one topology setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclRun {
    /// `auto` (NCCL's own detection) or the topology file given.
    pub topology: String,
    pub ranks: Vec<RankResult>,
    pub bytes: u64,
    /// Of the slowest rank (GB/s, 10^9 bytes).
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    pub ok: bool,
    pub verdict: String,
}

/// The whole stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclReport {
    pub library: String,
    /// `ncclGetVersion`, e.g. 22809; absent when the library is not there.
    pub version: Option<i32>,
    /// Why the stage did not run (no library), if it did not.
    pub skipped: Option<String>,
    pub runs: Vec<NcclRun>,
    pub ok: bool,
}

/// One rank, in its own process: `gpu`, rank `rank` of `nranks`, `bytes` per buffer.
pub fn run_rank(
    lib: &Path,
    (rank, nranks, id): (usize, usize, &str),
    gpu: Bdf,
    bytes: usize,
) -> RankResult {
    let mut r = RankResult {
        rank,
        gpu,
        ms_per_op: None,
        checked: 0,
        wrong: 0,
        first_wrong: None,
        error: None,
    };
    if let Err(e) = rank_work(lib, (rank, nranks, id), gpu, bytes, &mut r) {
        r.error = Some(e);
    }
    r
}

fn rank_work(
    lib: &Path,
    (rank, nranks, id): (usize, usize, &str),
    gpu: Bdf,
    bytes: usize,
    r: &mut RankResult,
) -> Result<(), String> {
    let id = UniqueId::from_hex(id).ok_or("--id: 256 hex digits expected")?;
    let s = |e: cuda::CudaError| e.to_string();
    cuda::init().map_err(s)?;
    let gpu = Gpu::open_at(gpu).map_err(s)?;
    gpu.bind().map_err(s)?;
    let nccl = Nccl::open(lib).map_err(|e| e.to_string())?;
    let count = bytes / 4;
    let send = DeviceBuffer::new(&gpu, count * 4).map_err(s)?;
    let recv = DeviceBuffer::new(&gpu, count * 4).map_err(s)?;
    let mine: Vec<f32> = (0..count).map(|i| contribution(rank, i)).collect();
    send.upload(&mine).map_err(s)?;
    recv.fill_u32(0).map_err(s)?;
    let stream = Stream::new(&gpu).map_err(s)?;
    gpu.bind().map_err(s)?;
    let comm = nccl.comm_init_rank(nranks as i32, id, rank as i32)?;
    comm.all_reduce_sum_f32(&send, &recv, count, &stream)?;
    stream.synchronize().map_err(s)?;
    let (start, end) = (Event::new(&gpu).map_err(s)?, Event::new(&gpu).map_err(s)?);
    start.record(&stream).map_err(s)?;
    for _ in 0..ITERS {
        comm.all_reduce_sum_f32(&send, &recv, count, &stream)?;
    }
    end.record(&stream).map_err(s)?;
    end.synchronize().map_err(s)?;
    r.ms_per_op = Some(end.since(&start).map_err(s)? / f64::from(ITERS));
    let mut got = vec![0f32; count];
    recv.download(&mut got).map_err(s)?;
    let (wrong, first) = check_sums(&got, nranks);
    r.checked = count as u64;
    r.wrong = wrong;
    r.first_wrong = first;
    drop(comm);
    Ok(())
}

/// Wrong elements of `got` against the expected sums, and the first of them.
pub fn check_sums(got: &[f32], nranks: usize) -> (u64, Option<(u64, f32, f32)>) {
    let mut wrong = 0;
    let mut first = None;
    for (i, &g) in got.iter().enumerate() {
        let want = expected(nranks, i);
        if g != want {
            wrong += 1;
            first.get_or_insert((i as u64, g, want));
        }
    }
    (wrong, first)
}

/// Starts a rank per GPU of `gpus` under `topology` (a file, or `None` for NCCL's own
/// detection) and judges the run. `exe` is this program, `id` the bootstrap id.
pub fn run_all(
    exe: &Path,
    lib: &Path,
    (gpus, id): (&[Bdf], &UniqueId),
    topology: Option<&Path>,
    (bytes, limit): (usize, Duration),
) -> NcclRun {
    let until = Instant::now() + limit;
    let hex = id.to_hex();
    let spawned: Vec<_> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut c = std::process::Command::new(exe);
            c.args(["nccl-rank", "--rank", &i.to_string()])
                .args(["--nranks", &gpus.len().to_string(), "--id", &hex])
                .args(["--gpu", &g.to_string(), "--bytes", &bytes.to_string()])
                .arg("--nccl-lib")
                .arg(lib)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit());
            match topology {
                Some(f) => c.env("NCCL_TOPO_FILE", f),
                None => c.env_remove("NCCL_TOPO_FILE"),
            };
            c.spawn()
                .map_err(|e| format!("starting {}: {e}", exe.display()))
        })
        .collect();
    let ranks = spawned
        .into_iter()
        .zip(gpus)
        .enumerate()
        .map(|(i, (c, &g))| {
            c.and_then(|c| finish(c, until))
                .and_then(|t| answer(&t))
                .unwrap_or_else(|e| RankResult {
                    rank: i,
                    gpu: g,
                    ms_per_op: None,
                    checked: 0,
                    wrong: 0,
                    first_wrong: None,
                    error: Some(e),
                })
        })
        .collect();
    let topology = topology.map_or_else(|| "auto".to_string(), |f| f.display().to_string());
    judge_run(topology, ranks, bytes as u64)
}

/// A rank's answer: the last line of its output that is a JSON object. NCCL writes its
/// own messages (`NCCL_DEBUG`) to the same stdout: those go on to stderr.
pub fn answer(out: &str) -> Result<RankResult, String> {
    let mut last = None;
    for line in out.lines() {
        if line.starts_with('{') {
            last = Some(line);
        } else if !line.trim().is_empty() {
            eprintln!("{line}");
        }
    }
    let line = last.ok_or("no answer on its output")?;
    serde_json::from_str(line).map_err(|e| format!("its answer: {e}"))
}

/// The run's bandwidths (of its slowest rank) and whether every rank summed right.
pub fn judge_run(topology: String, ranks: Vec<RankResult>, bytes: u64) -> NcclRun {
    let n = ranks.len().max(1) as f64;
    let slowest = ranks
        .iter()
        .map(|r| r.ms_per_op)
        .try_fold(0f64, |m, x| x.map(|x| m.max(x)));
    let algbw = slowest
        .filter(|&ms| ms > 0.0)
        .map(|ms| bytes as f64 / (ms * 1e-3) / 1e9);
    let busbw = algbw.map(|a| a * 2.0 * (n - 1.0) / n);
    let failed: Vec<String> = ranks
        .iter()
        .filter_map(|r| {
            if let Some(e) = &r.error {
                return Some(format!("rank {} on {}: {e}", r.rank, r.gpu));
            }
            r.first_wrong.map(|(i, got, want)| {
                format!(
                    "WRONG SUM on {}: {} of {} elements (first at {i}: {got}, expected {want})",
                    r.gpu, r.wrong, r.checked
                )
            })
        })
        .collect();
    let ok = failed.is_empty();
    let verdict = if ok {
        format!(
            "all-reduce OK on {} GPUs: every element of every rank summed right, bus \
             bandwidth {:.1} GB/s",
            ranks.len(),
            busbw.unwrap_or(0.0)
        )
    } else {
        format!("all-reduce FAILED: {}", failed.join("; "))
    };
    NcclRun {
        topology,
        ranks,
        bytes,
        algbw_gbps: algbw,
        busbw_gbps: busbw,
        ok,
        verdict,
    }
}

/// The file run against NCCL's own: a file run at less than [`FILE_SLOWER_THAN`] of the
/// auto run's bus bandwidth fails, with `why` (what the file gets wrong) named.
pub fn judge_file_run(file: &mut NcclRun, auto: &NcclRun, why: &[String]) {
    let (Some(f), Some(a)) = (file.busbw_gbps, auto.busbw_gbps) else {
        return;
    };
    if !file.ok || a <= 0.0 {
        return;
    }
    let ratio = f / a;
    if ratio < FILE_SLOWER_THAN {
        file.ok = false;
        let cause = if why.is_empty() {
            "the file misleads NCCL's topology search".to_string()
        } else {
            why.join("; ")
        };
        file.verdict = format!(
            "SLOW with the topology file: bus bandwidth {f:.1} GB/s, {ratio:.2}× NCCL's own \
             detection ({a:.1} GB/s; threshold {FILE_SLOWER_THAN:.2}×): {cause}"
        );
    } else {
        file.verdict.push_str(&format!(
            ", {ratio:.2}× NCCL's own detection (threshold {FILE_SLOWER_THAN:.2}×)"
        ));
    }
}

/// The run's bus bandwidth against what the weakest link between its GPUs carries one
/// way (`link`): below [`crate::link_verdict::NCCL_BUSBW_PASS`] of it is slow.
pub fn judge_against_link(run: &mut NcclRun, link: &crate::link_verdict::LinkExpectation) {
    use crate::link_verdict::NCCL_BUSBW_PASS;
    let Some(bus) = run.busbw_gbps else {
        return;
    };
    let ratio = bus / link.uni_gbps;
    if ratio < NCCL_BUSBW_PASS {
        run.ok = false;
        run.verdict.push_str(&format!(
            "; SLOW against the link: {bus:.1} GB/s is {ratio:.2}× of {} ({:.0} GB/s one \
             way; needs {NCCL_BUSBW_PASS:.2}×)",
            link.link, link.uni_gbps
        ));
    } else {
        run.verdict.push_str(&format!(
            "; link {}: {ratio:.2}× of {:.0} GB/s (needs {NCCL_BUSBW_PASS:.2}×)",
            link.link, link.uni_gbps
        ));
    }
}

/// Where the library is, for the report.
pub fn describe_lib(lib: &Path) -> String {
    lib.display().to_string()
}

/// The stage, skipped with the reason when the library cannot be loaded.
pub fn skipped(lib: &Path, why: String) -> NcclReport {
    NcclReport {
        library: describe_lib(lib),
        version: None,
        skipped: Some(format!("NCCL stage skipped: {why}")),
        runs: Vec::new(),
        ok: true,
    }
}

/// The topology file a run uses: the flag, else `NCCL_TOPO_FILE`.
pub fn topology_file(explicit: Option<&Path>) -> Option<PathBuf> {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("NCCL_TOPO_FILE").map(PathBuf::from))
}

/// Prints a rank's result as the parent reads it.
pub fn print_rank(r: &RankResult) -> std::io::Result<()> {
    print_json(r)
}

/// The stage as a table: a row per run, then each run's verdict.
pub fn table(r: &NcclReport) -> String {
    let wrap = |t: &str| {
        let mut s = vfio_p2p_style::wrap(t, vfio_p2p_style::output_width());
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s
    };
    if let Some(why) = &r.skipped {
        return wrap(why);
    }
    let version = r.version.map_or("?".into(), |v| {
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    });
    let mut out = wrap(&format!(
        "NCCL {version} ({}), all-reduce of f32 sums:",
        r.library
    ));
    let mut t = vfio_p2p_style::table(vec![
        "topology", "GPUs", "MiB", "alg GB/s", "bus GB/s", "result",
    ]);
    let num = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    for run in &r.runs {
        t.add_row(vec![
            run.topology.clone(),
            run.ranks.len().to_string(),
            (run.bytes >> 20).to_string(),
            num(run.algbw_gbps),
            num(run.busbw_gbps),
            if run.ok { "ok" } else { "FAILED" }.to_string(),
        ]);
    }
    out.push_str(&format!("{t}\n"));
    for run in &r.runs {
        out.push_str(&wrap(&format!("{}: {}", run.topology, run.verdict)));
    }
    out
}

/// What a topology file gets wrong that can slow NCCL down: a GPU given fewer NVLinks
/// than NVML sees active (`active`, by GPU). NCCL takes the file's count without
/// checking it against the hardware (src/graph/topo.cc, `ncclTopoAddNvLinks`), so it
/// plans its channels for a fraction of the bandwidth there is.
pub fn fewer_nvlinks_than_active(
    check: &crate::nccl_topo::NcclTopoCheck,
    active: &[(Bdf, u32)],
) -> Vec<String> {
    let mut why = Vec::new();
    for g in &check.gpus {
        let in_file: u32 = g.nvlinks.iter().map(|l| l.count).sum();
        let seen = active.iter().find(|(b, _)| b.to_string() == g.busid);
        if let Some(&(_, links)) = seen {
            if in_file < links {
                why.push(format!(
                    "the file gives GPU {} {in_file} NVLink{}, NVML sees {links} active: NCCL \
                     plans for {in_file}/{links} of the NVLink bandwidth there is",
                    g.busid,
                    if in_file == 1 { "" } else { "s" }
                ));
            }
        }
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(i: usize, ms: Option<f64>) -> RankResult {
        RankResult {
            rank: i,
            gpu: format!("0000:00:0{}.0", 6 + i).parse().unwrap(),
            ms_per_op: ms,
            checked: 1000,
            wrong: 0,
            first_wrong: None,
            error: None,
        }
    }

    /// NCCL's own lines (NCCL_DEBUG=INFO on the rank's stdout) do not hide the answer.
    #[test]
    fn the_answer_is_the_last_json_line_among_nccl_messages() {
        let r = rank(1, Some(1.5));
        let out = format!(
            "vm:1:1 [0] NCCL INFO Channel 00/24 : 0 1\n{}\nvm:1:1 [0] NCCL INFO comm destroyed\n",
            serde_json::to_string(&r).unwrap()
        );
        assert_eq!(answer(&out).unwrap(), r);
        assert!(answer("NCCL WARN nothing\n")
            .unwrap_err()
            .contains("no answer"));
    }

    #[test]
    fn sums_are_exact_and_one_wrong_element_shows() {
        let n = 4;
        let mut got: Vec<f32> = (0..10_000).map(|i| expected(n, i)).collect();
        assert_eq!(check_sums(&got, n), (0, None));
        got[4711] += 1.0;
        let (wrong, first) = check_sums(&got, n);
        assert_eq!(wrong, 1);
        assert_eq!(first.unwrap().0, 4711);
    }

    /// Bus bandwidth as nccl-tests computes it, from the slowest rank.
    #[test]
    fn bus_bandwidth_is_of_the_slowest_rank_times_2_n_minus_1_over_n() {
        let bytes = 256u64 << 20;
        let run = judge_run(
            "auto".into(),
            vec![rank(0, Some(1.0)), rank(1, Some(2.0))],
            bytes,
        );
        assert!(run.ok, "{}", run.verdict);
        let alg = bytes as f64 / 2e-3 / 1e9;
        assert!((run.algbw_gbps.unwrap() - alg).abs() < 1e-9);
        // n = 2: 2(n-1)/n = 1.
        assert!((run.busbw_gbps.unwrap() - alg).abs() < 1e-9);
        let four = judge_run(
            "auto".into(),
            (0..4).map(|i| rank(i, Some(2.0))).collect(),
            bytes,
        );
        assert!((four.busbw_gbps.unwrap() - alg * 1.5).abs() < 1e-9);
    }

    #[test]
    fn a_wrong_sum_or_a_rank_error_fails_the_run_naming_it() {
        let mut bad = rank(1, Some(1.0));
        bad.wrong = 3;
        bad.first_wrong = Some((7, 1.0, 2.0));
        let run = judge_run("auto".into(), vec![rank(0, Some(1.0)), bad], 1 << 20);
        assert!(!run.ok);
        assert!(
            run.verdict.contains("WRONG SUM on 0000:00:07.0: 3 of 1000"),
            "{}",
            run.verdict
        );
        let mut err = rank(0, None);
        err.error = Some("ncclCommInitRank: NCCL error 2".into());
        let run = judge_run("auto".into(), vec![err, rank(1, Some(1.0))], 1 << 20);
        assert!(!run.ok && run.busbw_gbps.is_none());
        assert!(run.verdict.contains("ncclCommInitRank"), "{}", run.verdict);
    }

    #[test]
    fn a_file_run_below_the_threshold_fails_with_the_reason() {
        let auto = judge_run(
            "auto".into(),
            vec![rank(0, Some(1.0)), rank(1, Some(1.0))],
            1 << 28,
        );
        let mut same = judge_run(
            "f.xml".into(),
            vec![rank(0, Some(1.1)), rank(1, Some(1.1))],
            1 << 28,
        );
        judge_file_run(&mut same, &auto, &[]);
        assert!(same.ok, "{}", same.verdict);
        assert!(
            same.verdict.contains("0.91× NCCL's own"),
            "{}",
            same.verdict
        );
        let mut slow = judge_run(
            "f.xml".into(),
            vec![rank(0, Some(4.0)), rank(1, Some(4.0))],
            1 << 28,
        );
        judge_file_run(&mut slow, &auto, &["the file gives GPU x 1 NVLink".into()]);
        assert!(!slow.ok);
        assert!(
            slow.verdict.starts_with("SLOW with the topology file"),
            "{}",
            slow.verdict
        );
        assert!(slow.verdict.contains("0.25×") && slow.verdict.contains("1 NVLink"));
    }

    /// The recorded 2 × H200 run (299.5 GB/s) passes against NV18; the wrong file's
    /// 27.1 GB/s is slow against it too.
    #[test]
    fn bus_bandwidth_is_judged_against_the_link() {
        let link = crate::link_verdict::nvlink_expectation(18, 0x2335).unwrap();
        let ms = |gbps: f64| (256u64 << 20) as f64 / (gbps * 1e9) * 1e3;
        let mut good = judge_run(
            "auto".into(),
            vec![rank(0, Some(ms(299.5))), rank(1, Some(ms(299.5)))],
            256 << 20,
        );
        judge_against_link(&mut good, &link);
        assert!(good.ok, "{}", good.verdict);
        assert!(
            good.verdict.contains("0.67× of 450 GB/s"),
            "{}",
            good.verdict
        );
        let mut slow = judge_run(
            "f".into(),
            vec![rank(0, Some(ms(27.1))), rank(1, Some(ms(27.1)))],
            256 << 20,
        );
        judge_against_link(&mut slow, &link);
        assert!(!slow.ok);
        assert!(
            slow.verdict
                .contains("SLOW against the link: 27.1 GB/s is 0.06×"),
            "{}",
            slow.verdict
        );
    }

    #[test]
    fn a_file_with_fewer_nvlinks_than_active_is_named() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/nccl/h200x2-topo.xml"
        ))
        .unwrap();
        let scan = crate::sysfs::gpus::Scan {
            sysfs_root: "/".into(),
            gpus: Vec::new(),
            note: None,
            warnings: Vec::new(),
        };
        let wrong = text.replace("count=\"18\"", "count=\"1\"");
        let nics = Default::default();
        let good = crate::nccl_topo::check_text(&text, "good.xml", &scan, &nics).unwrap();
        let bad = crate::nccl_topo::check_text(&wrong, "bad.xml", &scan, &nics).unwrap();
        let active = [
            ("0000:00:06.0".parse().unwrap(), 18),
            ("0000:00:07.0".parse().unwrap(), 18),
        ];
        assert!(fewer_nvlinks_than_active(&good, &active).is_empty());
        let why = fewer_nvlinks_than_active(&bad, &active);
        assert_eq!(why.len(), 2);
        assert!(
            why[0].contains("GPU 0000:00:06.0 1 NVLink, NVML sees 18"),
            "{}",
            why[0]
        );
    }
}
