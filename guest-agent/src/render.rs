//! Human-readable tables of each command's result.

use comfy_table::{Cell, Table};

use crate::bench::PairBench;
use crate::expect::{ExpectReport, GpuStatus};
use crate::fabric::FabricReport;
use crate::guest_topo::TopoReport;
use crate::measure::SimulatedRun;
use crate::nccl_topo::NcclTopoCheck;
use crate::peers::PeerCheck;
use crate::report::Report;
use crate::schedule::RoundRecord;
use crate::stats::Stat;
use crate::sysfs::gpus::Scan;
use crate::verify::VerifyResult;

fn table(header: &[&str]) -> Table {
    vfio_p2p_style::table(header.iter().map(Cell::new).collect::<Vec<_>>())
}

/// A line of prose wrapped to the output width (as the tables are), with its newline.
fn fit(text: &str) -> String {
    let mut s = vfio_p2p_style::wrap(text, vfio_p2p_style::output_width());
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), T::to_string)
}

pub fn scan(s: &Scan) -> String {
    let mut t = table(&[
        "GPU", "IDs", "driver", "clique", "cap", "linked", "link", "problem",
    ]);
    for g in &s.gpus {
        let (clique, cap, linked) = if g.caps_readable {
            (
                g.clique.map_or_else(|| "none".into(), |c| c.to_string()),
                opt(&g.cap_offset),
                g.cap_linked
                    .map_or("-", |l| if l { "yes" } else { "NO" })
                    .to_string(),
            )
        } else {
            ("?".into(), "?".into(), "?".into())
        };
        let link = match (&g.link_speed, g.link_width) {
            (Some(s), Some(w)) => format!("{s} x{w}"),
            (Some(s), None) => s.clone(),
            _ => "-".into(),
        };
        t.add_row(vec![
            g.bdf.to_string(),
            format!("{}:{}", g.vendor, g.device),
            opt(&g.driver),
            clique,
            cap,
            linked,
            link,
            opt(&g.problem),
        ]);
    }
    let mut out = if s.gpus.is_empty() {
        format!("no NVIDIA GPU under {}\n", s.sysfs_root)
    } else {
        format!("{t}\n")
    };
    for w in &s.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    if let Some(n) = &s.note {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

pub fn expect(e: &ExpectReport) -> String {
    let mut t = table(&["guest", "host", "expected", "found", "status"]);
    let c = |c: Option<u8>| c.map_or_else(|| "none".into(), |c| c.to_string());
    for g in &e.gpus {
        let status = match g.status {
            GpuStatus::Ok => "ok",
            GpuStatus::Missing => "MISSING",
            GpuStatus::WrongDevice => "WRONG DEVICE",
            GpuStatus::WrongClique => "WRONG CLIQUE",
            GpuStatus::Unchecked => "unchecked",
        };
        let found = if g.status == GpuStatus::Unchecked {
            "?".into()
        } else {
            c(g.found_clique)
        };
        t.add_row(vec![
            g.guest_bdf.to_string(),
            g.host_bdf.to_string(),
            c(g.expected_clique),
            found,
            status.into(),
        ]);
    }
    let mut out = format!("VM {} (expectation from {})\n{t}\n", e.vm, e.source);
    for g in e.gpus.iter().filter(|g| g.status != GpuStatus::Ok) {
        out.push_str(&format!("{}\n", g.message));
    }
    if let Some(f) = &e.fabric {
        out.push_str(&fabric(f));
    }
    if let Some(why) = &e.fabric_unchecked {
        out.push_str(&fit(&format!("fabric not checked: {why}")));
    }
    if let Some(n) = &e.numa {
        if n.problems.is_empty() {
            out.push_str(&format!("NUMA: {} nodes as planned\n", n.planned_nodes));
        }
        for p in &n.problems {
            out.push_str(&fit(&format!("NUMA: {p}")));
        }
    }
    for b in &e.unexpected {
        out.push_str(&format!("note: GPU {b} is not in the host's expectation\n"));
    }
    out
}

/// What an expectation adds to `scan` and `topo`, in words.
pub const EXPECTATION_ADDS: &str = "the host's plan for this VM: the clique each GPU must carry \
    (`expect`), the host's PCIe label of each pair to compare with the guest's (`topo`), \
    which pairs must have P2P and over how many NVLinks (`report`), and on an NVSwitch board \
    the Fabric Manager partition, its module ids and FM version. The host writes it to QEMU's \
    fw_cfg (`vfio-p2p gen`); or give a copy with --expect FILE";

/// `scan`'s closing note when the host's expectation is not there.
pub fn no_expectation_note() -> String {
    fit(&format!(
        "note: no expectation from the host (fw_cfg opt/vfio-p2p/expect.json); one would add {EXPECTATION_ADDS}"
    ))
}

/// `topo` with no expectation: the guest's own view.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GuestView {
    /// Every pair of GPUs with its guest (sysfs) and NVML label.
    pub pairs: TopoReport,
    /// Module ids and fabric registration (NVML), nothing judged.
    pub fabric: Option<FabricReport>,
    /// Always `null` here: no expectation was found.
    pub expectation: Option<String>,
    pub an_expectation_adds: String,
}

pub fn guest_view(v: &GuestView) -> String {
    let mut tb = table(&["GPU", "GPU", "guest", "NVML"]);
    for p in &v.pairs.pairs {
        tb.add_row(vec![
            p.a.to_string(),
            p.b.to_string(),
            opt(&p.guest),
            opt(&p.nvml),
        ]);
    }
    let mut out =
        format!("PCIe path labels in this guest (no expectation: nothing compared)\n{tb}\n");
    for w in &v.pairs.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    match &v.fabric {
        Some(f) => out.push_str(&fabric(f)),
        None => out.push_str("NVML not loaded: module ids and fabric state unknown\n"),
    }
    out.push_str(&fit(&format!(
        "an expectation would add {}",
        v.an_expectation_adds
    )));
    out
}

/// Each GPU's module id and fabric registration, against the plan when there is one.
pub fn fabric(f: &FabricReport) -> String {
    let mut t = table(&[
        "GPU", "module", "planned", "fabric", "status", "clique", "check",
    ]);
    for g in &f.gpus {
        let found = &g.found;
        t.add_row(vec![
            found.bdf.to_string(),
            found
                .module_id
                .map_or_else(|| "?".into(), |m| m.to_string()),
            opt(&g.expected_module_id),
            found
                .state
                .map_or_else(|| "?".into(), crate::fabric::state_name),
            found.status.map_or_else(
                || "-".into(),
                |s| {
                    if s == 0 {
                        "success".into()
                    } else {
                        format!("error {s}")
                    }
                },
            ),
            opt(&found.clique_id),
            if g.ok { "ok" } else { "DIFFERS" }.into(),
        ]);
    }
    let plan = match &f.planned {
        Some(p) => format!(
            "{}{}{}",
            p.model,
            p.partition_id
                .map_or_else(String::new, |id| format!(", FM partition {id}")),
            p.fm_version
                .as_deref()
                .map_or_else(String::new, |v| format!(", FM {v}"))
        ),
        None if f.gpus.iter().any(|g| g.expected_module_id.is_some()) => "module ids only".into(),
        None => "none planned".into(),
    };
    let mut out = format!(
        "NVSwitch fabric (NVML; driver {}; plan: {plan})\n{t}\n",
        f.driver_version.as_deref().unwrap_or("?")
    );
    for p in &f.problems {
        out.push_str(&fit(p));
    }
    out
}

/// Path labels per pair: the host's, the guest's (sysfs), NVML's, and what differs.
pub fn topo(t: &TopoReport, source: &str) -> String {
    let mut tb = table(&["GPU", "GPU", "host", "guest", "NVML", "status"]);
    for p in &t.pairs {
        tb.add_row(vec![
            p.a.to_string(),
            p.b.to_string(),
            p.host.clone(),
            opt(&p.guest),
            opt(&p.nvml),
            match (p.as_expected, &p.difference) {
                (true, None) => "ok",
                (true, Some(_)) => "not compared",
                (false, _) => "DIFFERS",
            }
            .into(),
        ]);
    }
    let mut out =
        format!("PCIe path labels, guest against host (host labels from {source})\n{tb}\n");
    for p in t.pairs.iter().filter(|p| !p.as_expected) {
        let why = p.difference.as_deref().unwrap_or("");
        out.push_str(&format!(
            "{} {}: {} in the guest, {} on the host: {why}\n",
            p.a,
            p.b,
            p.guest.as_deref().unwrap_or("-"),
            p.host
        ));
    }
    for w in &t.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

pub fn peers(pairs: &[PeerCheck]) -> String {
    let mut t = table(&[
        "src → dst",
        "can access",
        "rank",
        "atomics",
        "enabled",
        "link",
    ]);
    for p in pairs {
        let yn = |b: bool| if b { "yes" } else { "no" }.to_string();
        let enabled = match (&p.enable_error, p.enabled) {
            (Some(e), _) => format!("FAILED: {e}"),
            (None, e) => yn(e),
        };
        t.add_row(vec![
            format!("{} → {}", p.src, p.dst),
            yn(p.can_access),
            p.performance_rank.to_string(),
            yn(p.native_atomics),
            enabled,
            p.link
                .as_ref()
                .map_or_else(|| "? (no NVML)".into(), |l| l.label.clone()),
        ]);
    }
    format!("{t}\n")
}

pub fn verify(results: &[VerifyResult]) -> String {
    let mut t = table(&[
        "src → dst",
        "words",
        "kernel write",
        "copy engine",
        "checked on",
    ]);
    for v in results {
        let w = |c: &crate::verify::WriteCheck| {
            if c.ok() {
                "ok".to_string()
            } else {
                format!("{} BAD (first {})", c.bad_words, c.first_bad.unwrap_or(0))
            }
        };
        t.add_row(vec![
            format!("{} → {}", v.src, v.dst),
            v.words.to_string(),
            w(&v.kernel_write),
            w(&v.ce_copy),
            v.dst.to_string(),
        ]);
    }
    format!("{t}\n")
}

fn stat(s: &Stat, digits: usize) -> String {
    format!("{:.*} ±{:.0}%", digits, s.median, s.spread_pct / 2.0)
}

fn range(s: &Stat, digits: usize) -> String {
    format!("{:.*}–{:.*}", digits, s.min, digits, s.max)
}

/// The flag places' fastest–slowest (the other places' of an earlier agent's report).
fn places_range(b: &PairBench) -> String {
    match (&b.one_way_placements, &b.pingpong_position_spread) {
        (Some(d), _) => range(&d.stat(), 3),
        (None, Some(p)) => range(&p.one_way_latency_us, 3),
        (None, None) => "-".into(),
    }
}

/// The 4-byte copy: its modes with their stream counts, or the one stream's figure.
fn copy_modes(b: &PairBench) -> String {
    if b.memcpy_modes.len() < 2 {
        return stat(&b.memcpy_latency_us, 2);
    }
    b.memcpy_modes
        .iter()
        .map(|m| format!("{:.2} ×{}", m.us, m.count))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn bench(results: &[PairBench]) -> String {
    let header = [
        "src → dst",
        "one-way µs",
        "flag places µs",
        "remote read µs",
        "local read µs",
        "memcpy 4B µs",
        "CE GB/s",
        "CE both ways GB/s",
        "SM copy GB/s",
        "disabled GB/s",
        "disabled 4B µs",
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|b| {
            vec![
                format!("{}\n→ {}", b.src, b.dst),
                b.one_way_latency_us
                    .as_ref()
                    .map_or_else(|| "-".into(), |s| stat(s, 3)),
                places_range(b),
                stat(&b.remote_read_latency_us, 3),
                stat(&b.local_read_latency_us, 3),
                copy_modes(b),
                stat(&b.ce_bandwidth_gbps, 1),
                stat(&b.ce_bidir_bandwidth_gbps, 1),
                stat(&b.sm_copy_bandwidth_gbps, 1),
                stat(&b.disabled_bandwidth_gbps, 1),
                stat(&b.disabled_memcpy_latency_us, 2),
            ]
        })
        .collect();
    // No number or address is ever broken: columns that do not fit side by side go into a
    // second table below, with the pair repeated.
    let t = vfio_p2p_style::stacked_table(&header, &rows, 1);
    let plan = results.first().map(|b| b.plan);
    let samples = match plan {
        Some(p) if p.target_spread_permille > 0 && p.min_samples < p.samples => format!(
            "{}–{} samples each (stopping once within {:.1} %)",
            p.min_samples,
            p.samples,
            f64::from(p.target_spread_permille) / 10.0
        ),
        _ => format!("{} samples each", plan.map_or(0, |p| p.samples)),
    };
    // What the report holds, not what this build measures: a report of an earlier agent
    // (`report --from`) took each place's median or fastest pass, its min the fastest place.
    let places = results.first().and_then(|b| b.one_way_placements.as_ref());
    let figure = places.map_or("mean", |d| d.figure.as_str());
    let min = match places.and_then(|d| d.fastest_pass_us) {
        Some(_) => "the fastest pass at any place – the slowest place",
        None => "the fastest–slowest place",
    };
    let note = match plan {
        Some(p) if p.pingpong_rounds_per_place > 0 => format!(
            "median of {samples}, ± half the spread; one-way: median over {} flag places \
             (the same in every process; each place the {figure} of its {} passes), flag \
             places: {min}; memcpy 4B: each mode over {} streams, ×streams; GB/s = 10^9 bytes/s",
            p.pingpong_positions, p.pingpong_rounds_per_place, p.memcpy_streams
        ),
        _ => format!(
            "median of {samples} ({} for the one-way latency, its flags placed like \
             the reference probe's), ± half the spread; other flag places: fastest–slowest of \
             one round at each of {}; GB/s = 10^9 bytes/s",
            plan.map_or(0, |p| p.pingpong_samples),
            plan.map_or(0, |p| p.pingpong_positions)
        ),
    };
    format!("{t}\n{}", fit(&note))
}

pub fn report(r: &Report) -> String {
    let mut out = String::new();
    let where_ = if r.host.virtual_machine {
        "in a VM"
    } else {
        "on bare metal"
    };
    out.push_str(&format!(
        "vfio-p2p-agent {} {where_}, CUDA driver {}.{}, NVML {}{}\n",
        r.agent_version,
        r.host.cuda_driver_version / 1000,
        r.host.cuda_driver_version % 1000 / 10,
        if r.host.nvml { "present" } else { "absent" },
        if r.quick { ", quick run" } else { "" }
    ));
    if let Some(s) = &r.scan {
        out.push_str(&scan(s));
    }
    if let Some(e) = &r.expect {
        out.push_str(&expect(e));
    }
    if let Some(t) = &r.topo {
        out.push_str(&topo(t, "the host's expectation"));
    }
    if let Some(f) = &r.fabric {
        out.push_str(&fabric(f));
    }
    let peers_: Vec<_> = r.pairs.iter().map(|p| p.peer.clone()).collect();
    out.push_str(&peers(&peers_));
    let v: Vec<_> = r.pairs.iter().filter_map(|p| p.verify.clone()).collect();
    if !v.is_empty() {
        out.push_str(&verify(&v));
    }
    let b: Vec<_> = r.pairs.iter().filter_map(|p| p.bench.clone()).collect();
    if !b.is_empty() {
        out.push_str(&bench(&b));
    }
    if let Some(c) = &r.nccl_topo {
        out.push_str(&nccl_topo(c));
    }
    if let Some(x) = &r.cross_process {
        out.push_str(&cross_process(x));
    }
    if let Some(p) = &r.phases {
        out.push_str(&fit(&format!("time: {}", p.line())));
        if p.verbose {
            out.push_str(&measure_times(&b));
        }
    }
    if let Some(rs) = &r.rounds {
        out.push_str(&rounds(rs));
    }
    if let Some(e) = &r.schedule {
        out.push_str(&fit(&format!(
            "on this fabric 8 GPUs go {}: {} round(s) of {} pair(s), estimated {:.1} s \
             ({:.2} s setup per GPU, {:.2} s per pair and direction as measured here)",
            e.fabric.describe(),
            e.rounds,
            e.pairs_per_round,
            e.total_s,
            e.setup_s_per_gpu,
            e.pair_s
        )));
    }
    for p in &r.pairs {
        out.push_str(&fit(&format!("{} → {}: {}", p.src, p.dst, p.summary)));
    }
    out.push_str(&format!("took {:.1} s\n", r.elapsed_s));
    out
}

pub fn nccl_topo(c: &NcclTopoCheck) -> String {
    let mut t = table(&["GPU in the NCCL file", "device", "in this guest", "NVLinks"]);
    for g in &c.gpus {
        let links = if g.nvlinks.is_empty() {
            "-".to_string()
        } else {
            g.nvlinks
                .iter()
                .map(|l| {
                    let to = if l.tclass.to_ascii_lowercase().starts_with("0x068") {
                        "NVSwitch fabric".to_string()
                    } else {
                        l.target.clone()
                    };
                    format!("{} to {to}", l.count)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        t.add_row(vec![
            g.busid.clone(),
            opt(&g.device),
            if g.in_guest { "yes" } else { "NO" }.to_string(),
            links,
        ]);
    }
    let mut out = fit(&format!("NCCL topology file {}:", c.file));
    out.push_str(&format!("{t}\n"));
    if !c.nics.is_empty() {
        let mut n = table(&["NIC in the NCCL file", "device", "in this guest", "net"]);
        for nic in &c.nics {
            n.add_row(vec![
                nic.busid.clone(),
                opt(&nic.device),
                if nic.in_guest { "yes" } else { "NO" }.to_string(),
                nic.nets.join(", "),
            ]);
        }
        out.push_str(&format!("{n}\n"));
    }
    if c.ok() {
        out.push_str(&fit(if c.nics.is_empty() {
            "every GPU and NVLink in it matches this guest"
        } else {
            "every GPU, NVLink and NIC in it matches this guest"
        }));
    }
    for p in &c.problems {
        out.push_str(&fit(&format!("problem: {p}")));
    }
    out
}

pub fn cross_process(results: &[crate::cross_process::CrossProcessResult]) -> String {
    let mut t = table(&[
        "src → dst",
        "handle",
        "words",
        "one-way writes",
        "write GB/s",
    ]);
    for r in results {
        let writes = match (&r.write, &r.error) {
            (_, Some(e)) => format!("FAILED: {e}"),
            (Some(c), None) if c.ok() => "ok, checked on dst".to_string(),
            (Some(c), None) => format!("{} BAD (first {})", c.bad_words, c.first_bad.unwrap_or(0)),
            (None, None) => "-".to_string(),
        };
        let path = if r.same_gpu {
            format!("{} → same GPU", r.src)
        } else {
            format!("{} → {}", r.src, r.dst)
        };
        t.add_row(vec![
            path,
            r.kind.name().to_string(),
            r.words.to_string(),
            writes,
            r.write_gbps
                .map_or_else(|| "-".into(), |g| format!("{g:.1}")),
        ]);
    }
    let mut out = format!("{t}\n");
    if results.iter().any(|r| r.same_gpu) {
        out.push_str(
            "same GPU: owner and writer are two processes on one GPU; this checks CUDA IPC \
             (handle export/import, descriptor passing), not P2P\n",
        );
    }
    out
}

/// `-v`: each pair's measurements with the seconds each took, a line per pair.
fn measure_times(benches: &[PairBench]) -> String {
    benches
        .iter()
        .filter(|b| !b.measure_s.is_empty())
        .map(|b| {
            let laps: Vec<String> = b
                .measure_s
                .iter()
                .map(|(n, s)| format!("{n} {s:.2} s"))
                .collect();
            fit(&format!("{} → {}: {}", b.src, b.dst, laps.join(", ")))
        })
        .collect()
}

fn how(concurrent: bool) -> &'static str {
    if concurrent {
        "at once"
    } else {
        "one pair at a time"
    }
}

/// The rounds of disjoint pairs as they ran, a line each: the pairs, at once or one at a
/// time and why, the round's wall time per pass.
pub fn rounds(rounds: &[RoundRecord]) -> String {
    let mut out = String::new();
    for (k, r) in rounds.iter().enumerate() {
        let pairs: Vec<String> = r.pairs.iter().map(|(a, b)| format!("{a} ↔ {b}")).collect();
        let verify = r
            .verify_s
            .map(|v| format!("verify {v:.2} s, "))
            .unwrap_or_default();
        out.push_str(&fit(&format!(
            "round {}: {}: {} ({}); {verify}bench {:.2} s",
            k + 1,
            pairs.join(", "),
            how(r.concurrent),
            r.why,
            r.bench_s
        )));
    }
    out
}

/// `bench --simulate N`: a row per simulated pair (both ways), the round's wall time
/// beside each pair's own.
pub fn simulated(s: &SimulatedRun) -> String {
    let mut t = table(&[
        "round",
        "simulated pair",
        "GPUs",
        "how",
        "round s",
        "pair s",
        "CE GB/s →, ←",
        "one-way µs",
    ]);
    let mut benches = s.pairs.iter();
    for (k, (r, virt)) in s.rounds.iter().zip(&s.schedule).enumerate() {
        for (i, ((a, b), (va, vb))) in r.pairs.iter().zip(virt).enumerate() {
            let (there, back) = (benches.next(), benches.next());
            let ce = |x: Option<&PairBench>| {
                x.map_or("-".into(), |b| format!("{:.1}", b.ce_bandwidth_gbps.median))
            };
            let one_way = there
                .and_then(|b| b.one_way_latency_us.as_ref())
                .map_or("-".into(), |l| format!("{:.3}", l.median));
            t.add_row(vec![
                (k + 1).to_string(),
                format!("{va} ↔ {vb}"),
                format!("{a}\n↔ {b}"),
                how(r.concurrent).to_string(),
                format!("{:.3}", r.bench_s),
                format!("{:.3}", r.pair_bench_s.get(i).copied().unwrap_or(0.0)),
                format!("{}, {}", ce(there), ce(back)),
                one_way,
            ]);
        }
    }
    let mut out = format!("{t}\n");
    if let Some(r) = s.rounds.first() {
        out.push_str(&fit(&r.why));
    }
    if let Some(p) = &s.phases {
        out.push_str(&fit(&format!("time: {}", p.line())));
    }
    let serial: f64 = s.rounds.iter().flat_map(|r| &r.pair_bench_s).sum();
    let wall: f64 = s.rounds.iter().map(|r| r.bench_s).sum();
    out.push_str(&fit(&format!(
        "{} GPUs simulated on {}: {} round(s), {wall:.2} s of rounds (the pairs' own times add up \
         to {serial:.2} s); took {:.2} s",
        s.simulated_gpus,
        s.gpus
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        s.rounds.len(),
        s.elapsed_s
    )));
    out
}
