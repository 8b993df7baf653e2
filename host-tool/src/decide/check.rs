//! Host preflight: everything that will stop pass-through or P2P from working, with
//! the fix. Pure: the live probes (VFIO and KVM ioctls, files under `/dev`, the QEMU
//! binary) are gathered into [`HostFacts`] and [`VmmFacts`] by the command first.

use std::collections::BTreeMap;
use std::fmt;

use pci_config::clique::{OFFSET_FALLBACK, OFFSET_PRIMARY};
use pci_config::Bdf;
use serde::Serialize;

use crate::decide::mmio;
use crate::decide::plan::{Plan, PlanError, Verdict};
use crate::model::{Device, Topology};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        })
    }
}

/// One check's outcome: what it looked at, what it saw, and the fix when not passing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub check: &'static str,
    /// The GPU or group it concerns, if any.
    pub subject: Option<String>,
    pub status: Status,
    pub saw: String,
    pub fix: Option<String>,
}

/// All checks, with the process exit code they imply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub checks: Vec<CheckResult>,
    pub status: Status,
}

impl CheckReport {
    fn new(checks: Vec<CheckResult>) -> Self {
        let status = checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Pass);
        CheckReport { checks, status }
    }

    /// 0 when everything passes, 1 with warnings, 2 with failures.
    pub fn exit_code(&self) -> u8 {
        match self.status {
            Status::Pass => 0,
            Status::Warn => 1,
            Status::Fail => 2,
        }
    }
}

/// A probe that could not run, and why (a snapshot has no `/dev`, an example no host).
pub type NotProbed = String;

/// Where the vfio-pci driver is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleState {
    Loaded,
    BuiltIn,
    /// Not loaded, but its module file is listed in `modules.dep` (path given).
    Available(String),
    /// Looked in these places and found nothing.
    Missing(String),
    Unknown(NotProbed),
}

/// Result of opening a device node and asking it something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeProbe<T> {
    Ok(T),
    /// The node does not exist (path given).
    Absent(String),
    /// It exists but the open or ioctl failed (path and error).
    Error(String),
    Unknown(NotProbed),
}

/// What the live host showed, gathered by `host_probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub vfio_pci: ModuleState,
    /// `/dev/vfio/vfio`: the VFIO API version.
    pub vfio_container: NodeProbe<i32>,
    /// `/dev/vfio/N` per IOMMU group of a selected GPU: viable?
    pub groups: BTreeMap<u32, NodeProbe<bool>>,
    /// KVM: its API version once a VM accepted a KVM-VFIO device; `Error` names the failing step.
    pub kvm: NodeProbe<i32>,
    /// `--deep`: per GPU, what opening it through VFIO showed (`Ok(resettable)`).
    pub deep: BTreeMap<Bdf, NodeProbe<bool>>,
}

/// Which VMM will run the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Vmm {
    #[default]
    Qemu,
    CloudHypervisor,
}

/// A QEMU version, from `qemu-system-x86_64 --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// Built with our `qemu-patches/` backport (local version suffix `+vfiop2p`),
    /// so it falls back to 0xD4 whatever its version number says.
    pub clique_backport: bool,
}

impl fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if self.clique_backport {
            f.write_str(" with the vfio-p2p clique backport")?;
        }
        Ok(())
    }
}

impl QemuVersion {
    /// First QEMU with the 0xD4 fallback for GPUs that have a capability at 0xC8.
    pub const CLIQUE_FALLBACK: QemuVersion = QemuVersion {
        major: 8,
        minor: 1,
        micro: 0,
        clique_backport: false,
    };

    /// Whether this QEMU places the clique at 0xD4 when 0xC8 is taken.
    pub fn has_clique_fallback(&self) -> bool {
        self.clique_backport || *self >= Self::CLIQUE_FALLBACK
    }

    /// Parses `QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7)`.
    pub fn parse(text: &str) -> Option<QemuVersion> {
        let rest = text.split("version").nth(1)?;
        let v = rest.split_whitespace().next()?;
        let mut nums = v.split('.').map(|n| {
            n.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse::<u32>()
        });
        Some(QemuVersion {
            major: nums.next()?.ok()?,
            minor: nums.next()?.ok()?,
            micro: nums.next().and_then(Result::ok).unwrap_or(0),
            clique_backport: text.contains("+vfiop2p"),
        })
    }
}

/// What the VM will be started with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmmFacts {
    pub vmm: Vmm,
    /// `--qemu PATH`: its `--version` line, parsed (`Err` carries what was wrong).
    pub qemu_version: Option<Result<QemuVersion, String>>,
    /// Where the hypervisor is hidden from the guest (`kvm=off`, `<hidden state='on'/>`).
    pub hidden_hypervisor: Vec<String>,
    /// The 64-bit MMIO window configured, and where it was found.
    pub hole64: Option<(u64, String)>,
}

/// Where the hypervisor is hidden in a QEMU command line: `kvm=off` in `-cpu`.
pub fn hidden_in_qemu_args(args: &str) -> Vec<String> {
    let toks: Vec<&str> = args.split_whitespace().collect();
    toks.iter()
        .enumerate()
        .filter(|(i, t)| {
            t.split(',').any(|o| o == "kvm=off")
                && i.checked_sub(1)
                    .and_then(|p| toks.get(p))
                    .is_some_and(|p| *p == "-cpu" || *p == "--cpu")
        })
        .map(|(_, t)| format!("QEMU argument -cpu {t}"))
        .collect()
}

/// `pci-hole64-size=SIZE` in a QEMU command line, in bytes.
pub fn hole64_in_qemu_args(args: &str) -> Option<u64> {
    args.split([' ', ',']).find_map(|t| {
        let v = t.split_once("pci-hole64-size=")?.1;
        parse_size(v)
    })
}

/// QEMU size syntax: a number with an optional K/M/G/T suffix (binary units).
fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, shift) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct DomainXmlError {
    pub file: String,
    pub message: String,
}

/// Hidden-hypervisor settings and the 64-bit MMIO window in a libvirt domain XML.
pub fn inspect_domain_xml(
    text: &str,
    file: &str,
) -> Result<(Vec<String>, Option<u64>), DomainXmlError> {
    let root = xmltree::Element::parse(text.as_bytes()).map_err(|e| DomainXmlError {
        file: file.to_string(),
        message: format!("not a libvirt domain XML: {e}"),
    })?;
    if root.name != "domain" {
        return Err(DomainXmlError {
            file: file.to_string(),
            message: format!("root element is <{}>, expected <domain>", root.name),
        });
    }
    let mut hidden = Vec::new();
    let on = |e: &xmltree::Element| e.attributes.get("state").map(String::as_str) == Some("on");
    if let Some(h) = root
        .get_child("features")
        .and_then(|f| f.get_child("kvm"))
        .and_then(|k| k.get_child("hidden"))
    {
        if on(h) {
            hidden.push(format!("{file}: <features><kvm><hidden state='on'/>"));
        }
    }
    let mut hole64 = None;
    let mut stack = vec![&root];
    while let Some(e) = stack.pop() {
        if e.name == "arg" {
            if let Some(v) = e.attributes.get("value") {
                if v.split(',').any(|o| o == "kvm=off") {
                    hidden.push(format!("{file}: <qemu:arg value='{v}'/>"));
                }
                hole64 = hole64.or(hole64_in_qemu_args(v));
            }
        }
        if e.name == "pcihole64" {
            let unit = e
                .attributes
                .get("unit")
                .map(String::as_str)
                .unwrap_or("KiB");
            let shift = match unit {
                "b" | "bytes" => 0,
                "KiB" | "k" | "K" => 10,
                "MiB" | "M" => 20,
                "GiB" | "G" => 30,
                "TiB" | "T" => 40,
                _ => 10,
            };
            if let Some(n) = e.get_text().and_then(|t| t.trim().parse::<u64>().ok()) {
                hole64 = Some(n << shift);
            }
        }
        stack.extend(e.children.iter().filter_map(|c| c.as_element()));
    }
    Ok((hidden, hole64))
}

fn result(
    check: &'static str,
    subject: Option<String>,
    status: Status,
    saw: String,
    fix: Option<String>,
) -> CheckResult {
    CheckResult {
        check,
        subject,
        status,
        saw,
        fix,
    }
}

const GIB: u64 = 1 << 30;

/// Runs every check for `gpus` on `topo` with the probed facts and the plan's outcome.
pub fn run_checks(
    topo: &Topology,
    gpus: &[Bdf],
    host: &HostFacts,
    vmm: &VmmFacts,
    plan: &Result<Plan, PlanError>,
) -> CheckReport {
    let mut out = Vec::new();
    out.extend(check_iommu(topo));
    out.push(check_vfio_module(&host.vfio_pci));
    out.push(check_container(&host.vfio_container));
    let selected: Vec<&Device> = gpus.iter().filter_map(|b| topo.device(b)).collect();
    for g in &selected {
        out.push(check_group_members(topo, g, gpus));
        out.push(check_group_viable(g, host));
        if let Some(d) = host.deep.get(&g.bdf) {
            out.push(check_deep(g, d));
        }
    }
    out.push(check_kvm(&host.kvm));
    for g in &selected {
        out.push(check_reset(topo, g));
    }
    out.push(check_bars(&selected, vmm));
    let assigned = |g: &Device| match plan {
        Ok(p) => p.clique_of(&g.bdf).is_some(),
        Err(_) => g.is_nvidia_gpu(),
    };
    for g in selected.iter().filter(|g| assigned(g)) {
        out.push(check_clique_placement(g, vmm));
    }
    out.push(check_hidden(vmm));
    out.push(check_plan(plan));
    CheckReport::new(out)
}

fn check_iommu(topo: &Topology) -> Vec<CheckResult> {
    let cmdline = topo.kernel_cmdline.as_deref().unwrap_or("");
    let has = |k: &str| {
        cmdline
            .split_whitespace()
            .any(|t| t == k || t.starts_with(&format!("{k}=")))
    };
    let mut notes = Vec::new();
    for k in ["intel_iommu", "amd_iommu", "iommu"] {
        if let Some(t) = cmdline
            .split_whitespace()
            .find(|t| t.starts_with(&format!("{k}=")))
        {
            notes.push(t.to_string());
        }
    }
    let flags = if notes.is_empty() {
        "no IOMMU options on the kernel command line".to_string()
    } else {
        format!("kernel command line: {}", notes.join(" "))
    };
    let pt = if cmdline.split_whitespace().any(|t| t == "iommu=pt") {
        " (iommu=pt: host devices bypass translation, pass-through devices are still translated)"
    } else {
        ""
    };
    let intel = topo
        .devices
        .values()
        .any(|d| d.vendor == 0x8086 && d.bridge_role().is_some());
    if topo.iommu_groups.is_empty() {
        let fix = if intel || has("intel_iommu") {
            "enable VT-d in the firmware and boot with intel_iommu=on"
        } else {
            "enable AMD-Vi/IOMMU in the firmware and boot with amd_iommu=on (or iommu=on)"
        };
        return vec![result(
            "iommu",
            None,
            Status::Fail,
            format!("no IOMMU groups under /sys/kernel/iommu_groups; {flags}"),
            Some(fix.into()),
        )];
    }
    let off = cmdline
        .split_whitespace()
        .find(|t| *t == "intel_iommu=off" || *t == "amd_iommu=off" || *t == "iommu=off");
    let status = if off.is_some() {
        Status::Warn
    } else {
        Status::Pass
    };
    vec![result(
        "iommu",
        None,
        status,
        format!("{} IOMMU groups; {flags}{pt}", topo.iommu_groups.len()),
        off.map(|o| format!("remove {o} from the kernel command line")),
    )]
}

fn check_vfio_module(m: &ModuleState) -> CheckResult {
    let (status, saw, fix) = match m {
        ModuleState::Loaded => (Status::Pass, "vfio_pci is loaded".to_string(), None),
        ModuleState::BuiltIn => (Status::Pass, "vfio_pci is built into the kernel".to_string(), None),
        ModuleState::Available(p) => (
            Status::Pass,
            format!("vfio-pci is not loaded but available ({p}); binding loads it"),
            None,
        ),
        ModuleState::Missing(w) => (
            Status::Fail,
            format!("no vfio-pci module: {w}"),
            Some("install the kernel's extra modules (e.g. linux-modules-extra-$(uname -r)) or a kernel with CONFIG_VFIO_PCI".to_string()),
        ),
        ModuleState::Unknown(why) => (Status::Warn, format!("not probed: {why}"), Some("run `vfio-p2p check` on the host itself".to_string())),
    };
    result("vfio-pci-module", None, status, saw, fix)
}

/// The outcome of a check whose probe could not run.
fn not_probed(why: &str) -> (Status, String, Option<String>) {
    (
        Status::Warn,
        format!("not probed: {why}"),
        Some("run `vfio-p2p check` on the host itself (--sysfs-root /)".into()),
    )
}

fn check_container(p: &NodeProbe<i32>) -> CheckResult {
    let (status, saw, fix) = match p {
        NodeProbe::Ok(v) => (Status::Pass, format!("/dev/vfio/vfio opens, VFIO API version {v}"), None),
        NodeProbe::Absent(path) => (
            Status::Fail,
            format!("{path} does not exist"),
            Some("load the vfio module (`modprobe vfio-pci`); in a container, pass /dev/vfio through".into()),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e.clone(),
            Some("run as root or give this user access to /dev/vfio/vfio".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("vfio-container", None, status, saw, fix)
}

/// Drivers that may hold a device in a VFIO group without breaking viability.
const GROUP_SAFE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

fn check_group_members(topo: &Topology, gpu: &Device, gpus: &[Bdf]) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let Some(group) = gpu.iommu_group else {
        return result(
            "iommu-group",
            subject,
            Status::Fail,
            "in no IOMMU group".into(),
            Some("enable the IOMMU (see the iommu check)".into()),
        );
    };
    let members = topo.group_members(&gpu.bdf);
    let mut bad = Vec::new();
    let mut foreign = Vec::new();
    let mut listed = Vec::new();
    // What `bind` takes: never a bridge.
    let mut bindable = Vec::new();
    for m in &members {
        let d = topo.device(m);
        let driver = d.and_then(|d| d.driver.clone());
        listed.push(format!(
            "{m} ({})",
            driver.as_deref().unwrap_or("no driver")
        ));
        if let Some(drv) = &driver {
            if !GROUP_SAFE_DRIVERS.contains(&drv.as_str()) {
                bad.push(format!("{m} bound to {drv}"));
            }
        }
        let is_bridge = d.is_some_and(|d| d.bridge_role().is_some());
        let ours = gpus.contains(m) || gpus.iter().any(|g| g.same_slot(m));
        if !is_bridge {
            bindable.push(m.to_string());
        }
        if !ours && !is_bridge {
            foreign.push(m.to_string());
        }
    }
    let saw = format!("group {group}: {}", listed.join(", "));
    if !bad.is_empty() {
        return result(
            "iommu-group",
            subject,
            Status::Fail,
            format!("{saw}; not usable while {}", bad.join(", ")),
            Some(format!(
                "bind every member to vfio-pci or unbind it (`vfio-p2p bind {}`){}",
                bindable.join(" "),
                if foreign.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} share the group, so they go to the same VM or stay unbound — or fix ACS so the group splits",
                        foreign.join(", ")
                    )
                }
            )),
        );
    }
    if !foreign.is_empty() {
        return result(
            "iommu-group",
            subject,
            Status::Warn,
            format!("{saw}; {} are not selected GPUs or their functions", foreign.join(", ")),
            Some("pass them to the same VM or leave them unbound; to split the group, enable ACS on the ports above".into()),
        );
    }
    result("iommu-group", subject, Status::Pass, saw, None)
}

fn check_group_viable(gpu: &Device, host: &HostFacts) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let Some(group) = gpu.iommu_group else {
        return result(
            "vfio-group",
            subject,
            Status::Fail,
            "in no IOMMU group".into(),
            Some("enable the IOMMU".into()),
        );
    };
    let probe = host
        .groups
        .get(&group)
        .cloned()
        .unwrap_or_else(|| NodeProbe::Unknown(format!("group {group} was not probed")));
    let (status, saw, fix) = match probe {
        NodeProbe::Ok(true) => (
            Status::Pass,
            format!("/dev/vfio/{group} is viable (VFIO_GROUP_GET_STATUS)"),
            None,
        ),
        NodeProbe::Ok(false) => (
            Status::Fail,
            format!("/dev/vfio/{group} is not viable: a group member is bound to a host driver"),
            Some(
                "bind every group member to vfio-pci or unbind it (see the iommu-group check)"
                    .into(),
            ),
        ),
        NodeProbe::Absent(p) => (
            Status::Fail,
            format!("{p} does not exist: the GPU is not bound to vfio-pci"),
            Some(format!("`vfio-p2p bind {}`", gpu.bdf)),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e,
            Some("run as root; a running VM holding the group also makes it busy".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(&why),
    };
    result("vfio-group", subject, status, saw, fix)
}

fn check_deep(gpu: &Device, probe: &NodeProbe<bool>) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let (status, saw, fix) = match probe {
        NodeProbe::Ok(true) => (
            Status::Pass,
            "opened through VFIO (this reset it); VFIO reports it resettable".into(),
            None,
        ),
        NodeProbe::Ok(false) => (
            Status::Warn,
            "opened through VFIO (this reset it); VFIO reports no reset for it".into(),
            Some("the device keeps state between VMs; check its reset_method".into()),
        ),
        NodeProbe::Absent(p) => (
            Status::Fail,
            format!("{p} does not exist"),
            Some(format!("`vfio-p2p bind {}`", gpu.bdf)),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            format!("opening through VFIO failed: {e}"),
            Some("make sure no VM holds the group, then retry".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("vfio-device-open", subject, status, saw, fix)
}

fn check_kvm(p: &NodeProbe<i32>) -> CheckResult {
    let (status, saw, fix) = match p {
        NodeProbe::Ok(v) => (Status::Pass, format!("KVM API {v}: created a VM and a KVM-VFIO device"), None),
        NodeProbe::Absent(path) => (
            Status::Fail,
            format!("{path} does not exist"),
            Some("enable virtualization (VT-x/AMD-V) in the firmware and load kvm_intel or kvm_amd".into()),
        ),
        NodeProbe::Error(e) => (
            Status::Fail,
            e.clone(),
            Some("run as root or add this user to the kvm group; the KVM-VFIO device needs CONFIG_KVM_VFIO".into()),
        ),
        NodeProbe::Unknown(why) => not_probed(why),
    };
    result("kvm", None, status, saw, fix)
}

fn check_reset(topo: &Topology, gpu: &Device) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    let siblings: Vec<String> = topo
        .sibling_functions(&gpu.bdf)
        .iter()
        .map(|d| d.bdf.to_string())
        .collect();
    let together = if siblings.is_empty() {
        String::new()
    } else {
        format!(
            "; reset together with its other functions {}",
            siblings.join(", ")
        )
    };
    match &gpu.reset_methods {
        None => result(
            "reset",
            subject,
            Status::Warn,
            format!("reset_method unreadable{together}"),
            Some("run on a kernel ≥ 5.15 (sysfs reset_method) as root to see how it resets".into()),
        ),
        Some(m) if m.is_empty() => result(
            "reset",
            subject,
            Status::Fail,
            format!("no reset method{together}"),
            Some("the GPU keeps state between VMs; enable a reset method (`echo flr > /sys/bus/pci/devices/BDF/reset_method`) if the device supports one".into()),
        ),
        Some(m) if m.iter().any(|x| x == "flr" || x == "pm" || x == "device_specific") => result(
            "reset",
            subject,
            Status::Pass,
            format!("reset_method {}{together}", m.join(" ")),
            None,
        ),
        Some(m) => {
            let bus_mates: Vec<String> = gpu
                .parent
                .map(|p| {
                    topo.devices
                        .values()
                        .filter(|d| d.parent == Some(p) && d.bdf != gpu.bdf && !d.bdf.same_slot(&gpu.bdf))
                        .map(|d| d.bdf.to_string())
                        .collect()
                })
                .unwrap_or_default();
            let mates = if bus_mates.is_empty() {
                String::new()
            } else {
                format!("; a bus reset also resets {}", bus_mates.join(", "))
            };
            result(
                "reset",
                subject,
                Status::Warn,
                format!("reset_method {} (no function-level reset){together}{mates}", m.join(" ")),
                Some("everything on the bus is reset with it: pass those devices to the same VM".into()),
            )
        }
    }
}

fn check_bars(gpus: &[&Device], vmm: &VmmFacts) -> CheckResult {
    let need = mmio::hole64_size(gpus);
    let total: u64 = gpus.iter().map(|d| d.bar64_total()).sum();
    let saw = format!(
        "{} GPU(s) with {:.1} GiB of 64-bit BARs need a {} GiB 64-bit MMIO window",
        gpus.len(),
        total as f64 / GIB as f64,
        need / GIB
    );
    let settings = format!(
        "QEMU: `{}`; OVMF: `{}`",
        mmio::qemu_hole64_arg(need),
        mmio::ovmf_fw_cfg_arg(need)
    );
    match &vmm.hole64 {
        Some((have, src)) if *have >= need => result(
            "mmio-window",
            None,
            Status::Pass,
            format!("{saw}; {src} sets {} GiB", have / GIB),
            None,
        ),
        Some((have, src)) => result(
            "mmio-window",
            None,
            Status::Fail,
            format!("{saw}; {src} sets only {} GiB", have / GIB),
            Some(settings),
        ),
        None if need <= mmio::HEADROOM => result(
            "mmio-window",
            None,
            Status::Pass,
            format!("{saw}: QEMU's default fits"),
            None,
        ),
        None => result(
            "mmio-window",
            None,
            Status::Warn,
            format!("{saw}; the VM's window is not known here (pass --domain-xml or --qemu-args)"),
            Some(settings),
        ),
    }
}

fn check_clique_placement(gpu: &Device, vmm: &VmmFacts) -> CheckResult {
    let subject = Some(gpu.bdf.to_string());
    if !gpu.config_complete() {
        return result(
            "clique-placement",
            subject,
            Status::Warn,
            "capabilities unknown: only 64 bytes of config space are readable".into(),
            Some("run `vfio-p2p check` as root".into()),
        );
    }
    let cfg = gpu.config();
    let c8 = cfg.capability_starts_at(OFFSET_PRIMARY);
    let d4 = cfg.capability_starts_at(OFFSET_FALLBACK);
    let taken = |b: bool| if b { "taken" } else { "free" };
    let saw = format!("0xC8 {}, 0xD4 {}", taken(c8), taken(d4));
    let backport = "use QEMU ≥ 8.1, or QEMU 7.2 with our backport (qemu-patches/qemu-7.2/)";
    match vmm.vmm {
        Vmm::CloudHypervisor if d4 => result(
            "clique-placement",
            subject,
            Status::Fail,
            format!("{saw}; Cloud Hypervisor always writes the clique at 0xD4 and would overlay a capability"),
            Some("use QEMU ≥ 8.1 for this GPU".into()),
        ),
        Vmm::CloudHypervisor => result("clique-placement", subject, Status::Pass, format!("{saw}; Cloud Hypervisor uses 0xD4"), None),
        Vmm::Qemu if c8 && d4 => result(
            "clique-placement",
            subject,
            Status::Fail,
            format!("{saw}; no offset left for the clique capability"),
            Some("no QEMU can place the clique on this GPU".into()),
        ),
        Vmm::Qemu if !c8 => result("clique-placement", subject, Status::Pass, format!("{saw}; QEMU places the clique at 0xC8"), None),
        Vmm::Qemu => match &vmm.qemu_version {
            Some(Ok(v)) if v.has_clique_fallback() => result(
                "clique-placement",
                subject,
                Status::Pass,
                format!("{saw}; QEMU {v} falls back to 0xD4"),
                None,
            ),
            Some(Ok(v)) => result(
                "clique-placement",
                subject,
                Status::Fail,
                format!("{saw}; QEMU {v} (< 8.1) always uses 0xC8 and fails to start the VM"),
                Some(backport.into()),
            ),
            Some(Err(e)) => result(
                "clique-placement",
                subject,
                Status::Warn,
                format!("{saw}; QEMU version unknown: {e}"),
                Some(format!("QEMU < 8.1 cannot start this VM: {backport}")),
            ),
            None => result(
                "clique-placement",
                subject,
                Status::Warn,
                format!("{saw}; QEMU < 8.1 cannot place the clique here (pass --qemu PATH to check the version)"),
                Some(backport.into()),
            ),
        },
    }
}

fn check_hidden(vmm: &VmmFacts) -> CheckResult {
    if vmm.hidden_hypervisor.is_empty() {
        return result(
            "hypervisor-visible",
            None,
            Status::Pass,
            "the hypervisor is not hidden from the guest (in what was given)".into(),
            None,
        );
    }
    result(
        "hypervisor-visible",
        None,
        Status::Fail,
        format!(
            "hidden hypervisor: {}; the NVIDIA driver then ignores the clique capability and P2P stays off",
            vmm.hidden_hypervisor.join("; ")
        ),
        Some("remove kvm=off / <kvm><hidden state='on'/></kvm> (current NVIDIA drivers no longer need it)".into()),
    )
}

fn check_plan(plan: &Result<Plan, PlanError>) -> CheckResult {
    match plan {
        Err(e) => result(
            "p2p-plan",
            None,
            Status::Fail,
            e.to_string(),
            Some("as the message says; `vfio-p2p plan` explains every pair".into()),
        ),
        Ok(p) => {
            let routed = p
                .pairs
                .iter()
                .filter(|x| x.clique.is_some() && x.verdict == Verdict::IommuRouted)
                .count();
            let saw = format!(
                "{} clique(s) for {} GPU(s); {} clique pair(s) IOMMU-routed{}",
                p.cliques.len(),
                p.assignments.len(),
                routed,
                if p.warnings.is_empty() {
                    String::new()
                } else {
                    format!("; {}", p.warnings.join("; "))
                }
            );
            let serious = p.pairs.iter().any(|x| {
                x.clique.is_some()
                    && matches!(
                        x.verdict,
                        Verdict::Untranslated
                            | Verdict::AcsUnknown
                            | Verdict::CrossSocket
                            | Verdict::CrossHostBridge
                            | Verdict::RootComplex
                    )
            });
            if serious {
                result(
                    "p2p-plan",
                    None,
                    Status::Warn,
                    saw,
                    Some("see `vfio-p2p plan` for each pair".into()),
                )
            } else {
                result("p2p-plan", None, Status::Pass, saw, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::{plan, PlanOptions};
    use crate::read::HostRecord;
    use crate::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    const A100: (u16, u16) = (0x10de, 0x20b2);

    fn live_ok(topo: &Topology, gpus: &[Bdf]) -> HostFacts {
        HostFacts {
            vfio_pci: ModuleState::Loaded,
            vfio_container: NodeProbe::Ok(0),
            groups: gpus
                .iter()
                .filter_map(|g| topo.device(g).and_then(|d| d.iommu_group))
                .map(|g| (g, NodeProbe::Ok(true)))
                .collect(),
            kvm: NodeProbe::Ok(12),
            deep: BTreeMap::new(),
        }
    }

    /// One switch with two GPUs bound to vfio-pci (A100-like: MSI-X at 0xC8 when `msix`),
    /// and a NIC on a third port whose ACS is `nic_port_acs`.
    fn host(msix: bool, nic_port_acs: Option<u16>) -> HostRecord {
        let mut b = HostBuilder::new("test check");
        b.numa_node(0, "0-7");
        b.kernel_cmdline("root=/dev/sda intel_iommu=on iommu=pt");
        let hb = b.host_bridge(0, 0);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let (_, dsps) = b.switch(rp, 2, Some(ACS_ISOLATING));
        let mut gpu = EndpointSpec::gpu(A100.0, A100.1, 64).with_driver(Some("vfio-pci"));
        gpu.msix_at_c8 = msix;
        for d in &dsps {
            b.endpoint(Attach::Below(*d), 0, &gpu, None);
        }
        let rp2 = b.root_port(hb, Some(0), nic_port_acs);
        let (_, nic_ports) = b.switch(rp2, 2, nic_port_acs);
        b.endpoint(Attach::Below(nic_ports[0]), 0, &gpu, None);
        b.endpoint(
            Attach::Below(nic_ports[1]),
            0,
            &EndpointSpec::nic(0x15b3, 0x1021),
            None,
        );
        b.build()
    }

    fn run(topo: &Topology, gpus: &[Bdf], host: &HostFacts, vmm: &VmmFacts) -> CheckReport {
        let p = plan(topo, gpus, &PlanOptions::default());
        run_checks(topo, gpus, host, vmm, &p)
    }

    fn find<'a>(r: &'a CheckReport, check: &str, subject: Option<&Bdf>) -> &'a CheckResult {
        r.checks
            .iter()
            .find(|c| c.check == check && c.subject == subject.map(Bdf::to_string))
            .unwrap_or_else(|| panic!("no {check} check in {:#?}", r.checks))
    }

    fn gpus(t: &Topology) -> Vec<Bdf> {
        t.gpus().map(|d| d.bdf).collect()
    }

    fn qemu(version: &str) -> VmmFacts {
        VmmFacts {
            qemu_version: Some(QemuVersion::parse(version).ok_or("unparsed".to_string())),
            hole64: Some((1 << 40, "test".into())),
            ..VmmFacts::default()
        }
    }

    #[test]
    fn healthy_host_passes_everything() {
        let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
        let g = &gpus(&t)[..2];
        let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
        let not_pass: Vec<_> = r
            .checks
            .iter()
            .filter(|c| c.status != Status::Pass)
            .collect();
        assert!(not_pass.is_empty(), "{not_pass:#?}");
        assert_eq!(r.exit_code(), 0);
    }

    #[test]
    fn msix_at_c8_needs_qemu_8_1() {
        let t = Topology::from_record(&host(true, Some(ACS_ISOLATING)));
        let g = &gpus(&t)[..2];
        let facts = live_ok(&t, g);
        let old = run(
            &t,
            g,
            &facts,
            &qemu("QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7+deb12u6)"),
        );
        let c = find(&old, "clique-placement", Some(&g[0]));
        assert_eq!(c.status, Status::Fail);
        assert!(c.saw.contains("0xC8 taken"), "{}", c.saw);
        assert!(c.fix.as_ref().unwrap().contains("qemu-patches/qemu-7.2/"));
        assert_eq!(old.exit_code(), 2);
        let new = run(
            &t,
            g,
            &facts,
            &qemu("QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)"),
        );
        let c = find(&new, "clique-placement", Some(&g[0]));
        assert_eq!(c.status, Status::Pass);
        assert!(c.saw.contains("falls back to 0xD4"));
        let backport = run(
            &t,
            g,
            &facts,
            &qemu("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+vfiop2p1)"),
        );
        let c = find(&backport, "clique-placement", Some(&g[0]));
        assert_eq!(c.status, Status::Pass, "{}", c.saw);
        assert!(c.saw.contains("backport"), "{}", c.saw);
        let ch = VmmFacts {
            vmm: Vmm::CloudHypervisor,
            ..qemu("")
        };
        let r = run(&t, g, &facts, &ch);
        assert_eq!(
            find(&r, "clique-placement", Some(&g[0])).status,
            Status::Pass
        );
        let unknown = run(&t, g, &facts, &VmmFacts::default());
        assert_eq!(
            find(&unknown, "clique-placement", Some(&g[0])).status,
            Status::Warn
        );
    }

    #[test]
    fn cloud_hypervisor_fails_when_d4_is_taken() {
        let mut rec = host(false, Some(ACS_ISOLATING));
        let gpu = rec
            .devices
            .iter_mut()
            .find(|d| d.class >> 16 == 0x03)
            .unwrap();
        // Link a capability at 0xD4 after PCIe (0x40).
        gpu.config[0x41] = 0xd4;
        gpu.config[0xd4] = pci_config::CAP_ID_MSI;
        gpu.config[0xd5] = 0;
        let t = Topology::from_record(&rec);
        let g = &gpus(&t)[..2];
        let ch = VmmFacts {
            vmm: Vmm::CloudHypervisor,
            ..qemu("")
        };
        let r = run(&t, g, &live_ok(&t, g), &ch);
        let c = find(&r, "clique-placement", Some(&g[0]));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.saw.contains("0xD4 taken"));
    }

    #[test]
    fn gpu_sharing_its_group_with_a_nic() {
        // No ACS on the second switch: GPU and NIC end up in one group.
        let t = Topology::from_record(&host(false, None));
        let all = gpus(&t);
        let gpu = all[2];
        let members = t.group_members(&gpu);
        let nic = *members
            .iter()
            .find(|m| t.device(m).unwrap().kind == crate::model::DeviceKind::Nic)
            .unwrap();
        let r = run(
            &t,
            &[gpu],
            &live_ok(&t, &[gpu]),
            &qemu("QEMU emulator version 8.2.2"),
        );
        let c = find(&r, "iommu-group", Some(&gpu));
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.saw.contains(&format!("{nic} bound to mlx5_core")),
            "{}",
            c.saw
        );
        assert!(c.fix.as_ref().unwrap().contains("same VM"));
    }

    #[test]
    fn group_with_unbound_foreign_member_warns() {
        let mut rec = host(false, None);
        for d in rec.devices.iter_mut().filter(|d| d.class >> 16 == 0x02) {
            d.driver = None;
        }
        let t = Topology::from_record(&rec);
        let gpu = gpus(&t)[2];
        let r = run(
            &t,
            &[gpu],
            &live_ok(&t, &[gpu]),
            &qemu("QEMU emulator version 8.2.2"),
        );
        assert_eq!(find(&r, "iommu-group", Some(&gpu)).status, Status::Warn);
    }

    #[test]
    fn probe_outcomes() {
        let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
        let g = &gpus(&t)[..2];
        let mut facts = live_ok(&t, g);
        facts.vfio_container = NodeProbe::Absent("/x/dev/vfio/vfio".into());
        let group = t.device(&g[0]).unwrap().iommu_group.unwrap();
        facts.groups.insert(group, NodeProbe::Ok(false));
        facts.kvm = NodeProbe::Error("/dev/kvm: create the KVM-VFIO device: No such device".into());
        facts.vfio_pci = ModuleState::Missing("nowhere".into());
        facts.deep.insert(g[1], NodeProbe::Ok(false));
        let r = run(&t, g, &facts, &qemu("QEMU emulator version 8.2.2"));
        let c = find(&r, "vfio-container", None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.saw.contains("/x/dev/vfio/vfio does not exist"));
        assert_eq!(find(&r, "vfio-group", Some(&g[0])).status, Status::Fail);
        assert_eq!(find(&r, "vfio-group", Some(&g[1])).status, Status::Pass);
        assert_eq!(find(&r, "kvm", None).status, Status::Fail);
        assert_eq!(find(&r, "vfio-pci-module", None).status, Status::Fail);
        assert_eq!(
            find(&r, "vfio-device-open", Some(&g[1])).status,
            Status::Warn
        );
    }

    #[test]
    fn no_iommu_fails_with_the_vendor_fix() {
        let mut rec = host(false, Some(ACS_ISOLATING));
        rec.kernel_cmdline = Some("root=/dev/sda".into());
        for d in &mut rec.devices {
            d.iommu_group = None;
        }
        let t = Topology::from_record(&rec);
        let g = &gpus(&t)[..2];
        let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
        let c = find(&r, "iommu", None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.as_ref().unwrap().contains("intel_iommu=on"));
        assert_eq!(find(&r, "iommu-group", Some(&g[0])).status, Status::Fail);
    }

    #[test]
    fn hidden_hypervisor_fails() {
        assert_eq!(
            hidden_in_qemu_args("-machine q35 -cpu host,kvm=off,hv_vendor_id=x -m 8G"),
            ["QEMU argument -cpu host,kvm=off,hv_vendor_id=x"]
        );
        assert!(hidden_in_qemu_args("-cpu host -name kvm=off").is_empty());
        let xml = "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\
            <features><kvm><hidden state='on'/></kvm></features>\
            <devices><controller type='pci' model='pcie-root'><pcihole64 unit='GiB'>512</pcihole64></controller></devices>\
            </domain>";
        let (hidden, hole) = inspect_domain_xml(xml, "vm.xml").unwrap();
        assert_eq!(hidden, ["vm.xml: <features><kvm><hidden state='on'/>"]);
        assert_eq!(hole, Some(512 << 30));
        let visible = xml.replace("state='on'", "state='off'");
        assert!(inspect_domain_xml(&visible, "vm.xml").unwrap().0.is_empty());
        let e = inspect_domain_xml("<vm/>", "vm.xml").unwrap_err();
        assert!(e.to_string().starts_with("vm.xml: root element is <vm>"));

        let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
        let g = &gpus(&t)[..2];
        let vmm = VmmFacts {
            hidden_hypervisor: hidden,
            ..qemu("QEMU emulator version 8.2.2")
        };
        let r = run(&t, g, &live_ok(&t, g), &vmm);
        assert_eq!(find(&r, "hypervisor-visible", None).status, Status::Fail);
    }

    #[test]
    fn mmio_window_against_configuration() {
        let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
        let g = &gpus(&t)[..2];
        let need = mmio::hole64_size(&g.iter().map(|b| t.device(b).unwrap()).collect::<Vec<_>>());
        assert_eq!(need, 2 * 128 * GIB + mmio::HEADROOM);
        let small = VmmFacts {
            hole64: hole64_in_qemu_args("-global q35-pcihost.pci-hole64-size=64G")
                .map(|h| (h, "--qemu-args".into())),
            ..VmmFacts::default()
        };
        let r = run(&t, g, &live_ok(&t, g), &small);
        let c = find(&r, "mmio-window", None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.as_ref().unwrap().contains("pci-hole64-size=288G"));
        assert!(c
            .fix
            .as_ref()
            .unwrap()
            .contains("X-PciMmio64Mb,string=294912"));
        let r = run(&t, g, &live_ok(&t, g), &VmmFacts::default());
        assert_eq!(find(&r, "mmio-window", None).status, Status::Warn);
    }

    #[test]
    fn reset_methods() {
        let mut rec = host(false, Some(ACS_ISOLATING));
        let g0 = rec
            .devices
            .iter()
            .find(|d| d.class >> 16 == 0x03)
            .unwrap()
            .bdf;
        for d in rec.devices.iter_mut().filter(|d| d.bdf == g0) {
            d.reset_method = Some(vec!["bus".into()]);
        }
        let t = Topology::from_record(&rec);
        let g = &gpus(&t)[..2];
        let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
        let c = find(&r, "reset", Some(&g[0]));
        assert_eq!(c.status, Status::Warn);
        assert!(c.saw.contains("no function-level reset"));
        assert_eq!(find(&r, "reset", Some(&g[1])).status, Status::Pass);
    }

    #[test]
    fn non_root_view_warns_instead_of_guessing() {
        let t = Topology::from_record(&host(true, Some(ACS_ISOLATING)).unprivileged_view());
        let g = &gpus(&t)[..2];
        let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 7.2.0"));
        let c = find(&r, "clique-placement", Some(&g[0]));
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.as_ref().unwrap().contains("as root"));
        assert_eq!(find(&r, "p2p-plan", None).status, Status::Warn);
        assert_eq!(r.exit_code(), 1);
    }

    #[test]
    fn untranslated_plan_fails() {
        let mut b = HostBuilder::new("rr cleared");
        let hb = b.host_bridge(0, 0);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let (_, dsps) = b.switch(rp, 2, Some(pci_config::AcsFlags::SV));
        let gpu = EndpointSpec::gpu(A100.0, A100.1, 64).with_driver(Some("vfio-pci"));
        for d in dsps {
            b.endpoint(Attach::Below(d), 0, &gpu, None);
        }
        let t = Topology::from_record(&b.build());
        let g = gpus(&t);
        let r = run(
            &t,
            &g,
            &live_ok(&t, &g),
            &qemu("QEMU emulator version 8.2.2"),
        );
        let c = find(&r, "p2p-plan", None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.saw.contains("untranslated"), "{}", c.saw);
    }

    #[test]
    fn qemu_version_strings() {
        let v = |s| QemuVersion::parse(s);
        assert_eq!(
            v("QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7+deb12u6)\nCopyright (c) 2003-2022"),
            Some(QemuVersion { major: 7, minor: 2, micro: 0, clique_backport: false })
        );
        let patched =
            v("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+vfiop2p1)").unwrap();
        assert!(patched.clique_backport && patched.has_clique_fallback());
        assert!(!v("QEMU emulator version 8.0.5")
            .unwrap()
            .has_clique_fallback());
        assert!(v("QEMU emulator version 8.1.0").unwrap() >= QemuVersion::CLIQUE_FALLBACK);
        assert!(v("QEMU emulator version 8.0.5").unwrap() < QemuVersion::CLIQUE_FALLBACK);
        assert_eq!(v("QEMU emulator version 9.2").map(|q| q.micro), Some(0));
        assert_eq!(v("cloud-hypervisor v39.0"), None);
    }
}
