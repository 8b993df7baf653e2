//! `nccl-topo [FILE]`: the NCCL topology file this guest hands NCCL (`NCCL_TOPO_FILE`)
//! against the GPUs the guest sees (the sysfs scan), and what NCCL would get wrong.
//!
//! NCCL 2.28.9 reads the file in src/graph/topo.cc: `ncclTopoAddCpu` needs `arch` on
//! every `<cpu>`, `ncclTopoAddPci` keys GPUs by `busid`, `ncclTopoAddNvLinks` adds
//! `count` × the per-link bandwidth from each `<nvlink>` to the GPU named by `target`
//! (tclass 0x03…) or to one NVSwitch node (tclass 0x0680…), without checking the count
//! against the hardware. A NIC is a `<pci>` of class 0x02… holding `<nic><net name>`
//! (xml.cc `ncclTopoFillNet`); `ncclTopoPopulateNics` keeps a `<net>` only when the
//! network plugin reports a device of that `name`, so a NIC of the file that this guest
//! lacks at that address, or names otherwise, is dropped and placed from sysfs instead.

use std::collections::BTreeMap;
use std::path::Path;

use pci_config::Bdf;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::nvidia_parts::gpu_part;

use crate::sysfs::gpus::{NetFunction, Scan};

/// NCCL topology files are a few kB; more is not one.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// One `<nvlink>` element as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileNvlink {
    pub target: String,
    pub count: u32,
    pub tclass: String,
}

/// A GPU `<pci>` node of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileGpu {
    pub busid: String,
    pub device: Option<String>,
    /// Whether the guest has an NVIDIA GPU at that address.
    pub in_guest: bool,
    pub nvlinks: Vec<FileNvlink>,
}

/// A NIC `<pci>` node of the file with its `<net>` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileNic {
    pub busid: String,
    pub device: Option<String>,
    pub nets: Vec<String>,
    /// Whether the guest has a network function at that address.
    pub in_guest: bool,
}

/// The file checked against the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclTopoCheck {
    pub file: String,
    pub gpus: Vec<FileGpu>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<FileNic>,
    /// Each mismatch, with what NCCL would do because of it.
    pub problems: Vec<String>,
}

impl NcclTopoCheck {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What the parser collects before judging.
#[derive(Default)]
struct Parsed {
    cpus: Vec<(String, Option<String>)>,
    gpus: Vec<FileGpu>,
    nics: Vec<FileNic>,
}

/// The GPU and NIC `<pci>` nodes an open element sits in (their indexes), innermost:
/// each open element carries its own, so a deep file costs one step per element.
#[derive(Clone, Copy, Default)]
struct Inside {
    gpu: Option<usize>,
    nic: Option<usize>,
}

/// Nesting deeper than this is no NCCL topology file (NCCL's own are 5 levels deep); the
/// domain reader refuses the same depth.
const MAX_DEPTH: usize = 256;

fn attr(e: &BytesStart, name: &str) -> Option<String> {
    e.try_get_attribute(name).ok().flatten().and_then(|a| {
        a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .ok()
            .map(|v| v.into_owned())
    })
}

fn is_gpu_pci(e: &BytesStart) -> bool {
    attr(e, "class").is_some_and(|c| c.to_ascii_lowercase().starts_with("0x03"))
}

fn is_nic_pci(e: &BytesStart) -> bool {
    attr(e, "class").is_some_and(|c| c.to_ascii_lowercase().starts_with("0x02"))
}

fn parse(text: &str) -> Result<Parsed, String> {
    let mut r = Reader::from_str(text);
    let mut p = Parsed::default();
    // Per open element: the GPU and NIC `<pci>` nodes it is in.
    let mut open: Vec<Inside> = Vec::new();
    let mut saw_system = false;
    loop {
        let (e, empty) = match r.read_event() {
            Ok(Event::Start(e)) => (e, false),
            Ok(Event::Empty(e)) => (e, true),
            Ok(Event::End(_)) => {
                open.pop();
                continue;
            }
            Ok(Event::Eof) => break,
            Ok(_) => continue,
            Err(e) => return Err(format!("not XML at byte {}: {e}", r.error_position())),
        };
        let here = open.last().copied().unwrap_or_default();
        let mut this = here;
        match e.name().into_inner() {
            "system" => saw_system = true,
            "cpu" => p.cpus.push((
                attr(&e, "numaid").unwrap_or_else(|| "?".into()),
                attr(&e, "arch"),
            )),
            "pci" if is_gpu_pci(&e) => {
                p.gpus.push(FileGpu {
                    busid: attr(&e, "busid").unwrap_or_default(),
                    device: attr(&e, "device"),
                    in_guest: false,
                    nvlinks: Vec::new(),
                });
                this.gpu = Some(p.gpus.len() - 1);
            }
            "pci" if is_nic_pci(&e) => {
                p.nics.push(FileNic {
                    busid: attr(&e, "busid").unwrap_or_default(),
                    device: attr(&e, "device"),
                    nets: Vec::new(),
                    in_guest: false,
                });
                this.nic = Some(p.nics.len() - 1);
            }
            // a `<net>` outside a NIC's `<pci>` is a virtual NIC NCCL attaches to a CPU
            "net" => {
                if let Some(n) = here.nic {
                    p.nics[n].nets.push(attr(&e, "name").unwrap_or_default());
                }
            }
            "nvlink" => {
                let Some(g) = here.gpu else {
                    return Err("an <nvlink> outside a GPU's <pci> node".into());
                };
                let count = attr(&e, "count").unwrap_or_default();
                p.gpus[g].nvlinks.push(FileNvlink {
                    target: attr(&e, "target").unwrap_or_default(),
                    count: count
                        .parse()
                        .map_err(|_| format!("<nvlink count={count:?}> is not a number"))?,
                    tclass: attr(&e, "tclass").unwrap_or_default(),
                });
            }
            _ => {}
        }
        if !empty {
            if open.len() >= MAX_DEPTH {
                return Err(format!(
                    "elements nested deeper than {MAX_DEPTH} levels at byte {}: not an NCCL topology file",
                    r.buffer_position()
                ));
            }
            open.push(this);
        }
    }
    if !saw_system {
        return Err("no <system> element: not an NCCL topology file".into());
    }
    Ok(p)
}

/// NCCL's name for the architecture this agent runs on.
fn this_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        a => a,
    }
}

/// Checks the NCCL topology text `text` (from `file`) against the guest's `scan` and its
/// network functions `nics`.
pub fn check_text(
    text: &str,
    file: &str,
    scan: &Scan,
    nics: &BTreeMap<Bdf, NetFunction>,
) -> Result<NcclTopoCheck, String> {
    let mut p = parse(text).map_err(|e| format!("{file}: {e}"))?;
    let mut problems = Vec::new();
    for (numa, arch) in &p.cpus {
        match arch {
            None => problems.push(format!(
                "<cpu numaid=\"{numa}\"> has no arch: NCCL 2.28.9 stops with \"Attribute arch of \
                 node cpu not found\" unless its own detection fills it; regenerate the file \
                 (vfio-p2p gen nccl)"
            )),
            Some(a) if a != this_arch() => problems.push(format!(
                "<cpu numaid=\"{numa}\"> says arch {a}, this guest is {}: NCCL tunes for the \
                 wrong CPU",
                this_arch()
            )),
            Some(_) => {}
        }
    }
    let seen: BTreeMap<Bdf, &str> = scan
        .gpus
        .iter()
        .map(|g| (g.bdf, g.device.as_str()))
        .collect();
    let mut in_file = BTreeMap::new();
    for g in &mut p.gpus {
        let Ok(bdf) = g.busid.parse::<Bdf>() else {
            problems.push(format!(
                "GPU busid {:?} is not a PCI address: NCCL cannot place it",
                g.busid
            ));
            continue;
        };
        if in_file.insert(bdf, g.device.clone()).is_some() {
            problems.push(format!("GPU {bdf} is in the file twice"));
        }
        g.in_guest = seen.contains_key(&bdf);
        match seen.get(&bdf) {
            None => problems.push(format!(
                "GPU {bdf} is in the file but not in this guest: NCCL cannot match it to a \
                 device (init fails, or its links are lost); the file was made for another \
                 VM or guest layout"
            )),
            Some(dev) if g.device.as_deref().is_some_and(|d| !same_id(d, dev)) => {
                problems.push(format!(
                    "GPU {bdf} is device {} in the file but {dev} here: NCCL uses the file's \
                     NVLinks for a different part",
                    g.device.as_deref().unwrap_or("?")
                ))
            }
            Some(_) => {}
        }
    }
    for bdf in seen.keys().filter(|b| !in_file.contains_key(*b)) {
        problems.push(format!(
            "GPU {bdf} is in this guest but not in the file: NCCL detects it alone, with no \
             NVLink from the file, and takes the guest's PCIe path to the others (often \
             PHB in a VM: no P2P)"
        ));
    }
    for g in &p.gpus {
        nvlink_problems(g, &in_file, &seen, &mut problems);
    }
    for n in &mut p.nics {
        nic_problems(n, nics, &mut problems);
    }
    Ok(NcclTopoCheck {
        file: file.to_string(),
        gpus: p.gpus,
        nics: p.nics,
        problems,
    })
}

/// A NIC of the file against the guest's network function at its address.
fn nic_problems(n: &mut FileNic, nics: &BTreeMap<Bdf, NetFunction>, problems: &mut Vec<String>) {
    let Ok(bdf) = n.busid.parse::<Bdf>() else {
        problems.push(format!(
            "NIC busid {:?} is not a PCI address: NCCL cannot place it",
            n.busid
        ));
        return;
    };
    let Some(here) = nics.get(&bdf) else {
        problems.push(format!(
            "NIC {bdf} is in the file but this guest has no network device there: NCCL drops its <net> {} and GPUDirect RDMA goes through whichever NIC it finds; the file was made for another VM or guest layout",
            n.nets.join(", ")
        ));
        return;
    };
    n.in_guest = true;
    if let Some(d) = n.device.as_deref() {
        if !same_id(d, &format!("{:x}", here.device)) {
            problems.push(format!(
                "NIC {bdf} is device {d} in the file but {:#06x} here",
                here.device
            ));
        }
    }
    let names: Vec<&String> = here.rdma.iter().chain(&here.net).collect();
    for name in n.nets.iter().filter(|x| !names.contains(x)) {
        problems.push(format!(
            "NIC {bdf}'s <net name=\"{name}\"> is not what this guest calls it ({}): NCCL trims that entry and places the NIC from sysfs itself; regenerate the file or rename it",
            if names.is_empty() {
                "no RDMA device or interface: is its driver loaded?".to_string()
            } else {
                names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            }
        ));
    }
}

/// `0x2335` and `2335` are the same ID.
fn same_id(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.trim()
            .trim_start_matches("0x")
            .trim_start_matches("0X")
            .to_ascii_lowercase()
    };
    norm(a) == norm(b)
}

fn nvlink_problems(
    g: &FileGpu,
    in_file: &BTreeMap<Bdf, Option<String>>,
    seen: &BTreeMap<Bdf, &str>,
    problems: &mut Vec<String>,
) {
    let total: u32 = g.nvlinks.iter().map(|l| l.count).sum();
    let device = seen
        .iter()
        .find(|(b, _)| b.to_string() == g.busid)
        .map(|(_, d)| *d)
        .or(g.device.as_deref());
    let part = device
        .and_then(|d| u16::from_str_radix(d.trim_start_matches("0x"), 16).ok())
        .and_then(gpu_part);
    if let Some(links) = part.and_then(|p| p.links) {
        if total > u32::from(links) {
            problems.push(format!(
                "GPU {} has {total} NVLinks in the file, the {} has {links}: NCCL assumes \
                 {:.1}× the NVLink bandwidth there is and plans its channels for it",
                g.busid,
                part.map_or("?", |p| p.name),
                f64::from(total) / f64::from(links)
            ));
        }
    }
    for l in &g.nvlinks {
        if !l.tclass.to_ascii_lowercase().starts_with("0x03") {
            continue;
        }
        let target = l.target.parse::<Bdf>().ok();
        if !target.is_some_and(|t| in_file.contains_key(&t) && seen.contains_key(&t)) {
            problems.push(format!(
                "GPU {} has an NVLink to {}, which is not a GPU of this guest and the file: \
                 NCCL drops that link",
                g.busid, l.target
            ));
        }
    }
}

/// Reads and checks `path`: a regular file, opened without blocking (a FIFO never hangs
/// the agent), at most 4 MiB, against the scan and the guest's network functions `nics`.
pub fn check_file(
    path: &Path,
    scan: &Scan,
    nics: &BTreeMap<Bdf, NetFunction>,
) -> Result<NcclTopoCheck, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let shown = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(shown)?;
    if !file.metadata().map_err(shown)?.is_file() {
        return Err(format!(
            "{} is not a regular file; give the NCCL topology file",
            path.display()
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(shown)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} is larger than {MAX_FILE_BYTES} bytes, which no NCCL topology file is",
            path.display()
        ));
    }
    let text =
        String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    check_text(&text, &path.display().to_string(), scan, nics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(gpus: &[(&str, &str)]) -> Scan {
        let mut s: Scan = serde_json::from_value(serde_json::json!({
            "sysfs_root": "/", "gpus": [], "note": null, "warnings": []
        }))
        .unwrap();
        for (bdf, device) in gpus {
            s.gpus.push(
                serde_json::from_value(serde_json::json!({
                    "bdf": bdf, "vendor": "0x10de", "device": device, "class": "0x030200",
                    "driver": "nvidia", "config_bytes": 4096, "caps_readable": true,
                    "clique": null, "cap_offset": null, "cap_linked": null, "problem": null,
                    "link_speed": null, "link_width": null, "max_link_speed": null,
                    "max_link_width": null, "numa_node": null
                }))
                .unwrap(),
            );
        }
        s
    }

    const GOOD: &str = r#"<system version="1">
  <cpu numaid="0" affinity="ffffffff" arch="ARCH" vendor="GenuineIntel" familyid="6" modelid="207">
    <pci busid="0000:00:06.0" class="0x030200" vendor="0x10de" device="0x2335">
      <gpu><nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>
    </pci>
    <pci busid="0000:00:07.0" class="0x030200" vendor="0x10de" device="0x2335">
      <gpu><nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>
    </pci>
  </cpu>
</system>"#;

    fn good() -> String {
        GOOD.replace("ARCH", this_arch())
    }

    #[test]
    fn a_matching_file_has_no_problems() {
        let s = scan(&[("0000:00:06.0", "0x2335"), ("0000:00:07.0", "0x2335")]);
        let c = check_text(&good(), "f.xml", &s, &BTreeMap::new()).unwrap();
        assert_eq!(c.problems, Vec::<String>::new());
        assert_eq!(c.gpus.len(), 2);
        assert!(c
            .gpus
            .iter()
            .all(|g| g.in_guest && g.nvlinks[0].count == 18));
    }

    #[test]
    fn each_mismatch_says_what_nccl_would_do() {
        let s = scan(&[("0000:00:06.0", "0x2335"), ("0000:00:08.0", "0x2335")]);
        let text = good()
            .replace(&format!(" arch=\"{}\"", this_arch()), "")
            .replace(
                r#"<nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>
    </pci>
    <pci busid="0000:00:07.0""#,
                r#"<nvlink target="0000:00:07.0" count="126" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="0000:00:07.0""#,
            );
        let c = check_text(&text, "f.xml", &s, &BTreeMap::new()).unwrap();
        let all = c.problems.join("\n");
        assert!(all.contains("has no arch"), "{all}");
        assert!(
            all.contains("0000:00:07.0 is in the file but not in this guest"),
            "{all}"
        );
        assert!(
            all.contains("0000:00:08.0 is in this guest but not in the file"),
            "{all}"
        );
        assert!(
            all.contains("126 NVLinks in the file, the H200-SXM-141GB has 18"),
            "{all}"
        );
        assert!(all.contains("7.0× the NVLink bandwidth"), "{all}");
        assert!(all.contains("NCCL drops that link"), "{all}");
        assert_eq!(c.problems.len(), 5, "{all}");
    }

    #[test]
    fn not_a_topology_file() {
        let s = scan(&[]);
        assert!(check_text("<domain/>", "d.xml", &s, &BTreeMap::new())
            .unwrap_err()
            .contains("d.xml: no <system>"));
        assert!(check_text("<system><pci", "x.xml", &s, &BTreeMap::new())
            .unwrap_err()
            .contains("not XML"));
        assert!(check_text(
            r#"<system><pci busid="0000:00:06.0" class="0x030200"><gpu><nvlink count="x"/></gpu></pci></system>"#,
            "n.xml",
            &s,
            &BTreeMap::new()
        )
        .unwrap_err()
        .contains("not a number"));
    }

    const WITH_NIC: &str = r#"<system version="1">
  <cpu numaid="0" arch="ARCH">
    <pci busid="0000:21:00.0" class="0x060400">
      <pci busid="0000:23:00.0" class="0x030200" vendor="0x10de" device="0x2330"/>
      <pci busid="0000:25:00.0" class="0x020000" vendor="0x15b3" device="0x1021">
        <nic>
          <net name="mlx5_0" dev="0"/>
        </nic>
      </pci>
    </pci>
    <nic>
      <net name="eth0" dev="1"/>
    </nic>
  </cpu>
</system>"#;

    fn cx7(rdma: &[&str]) -> NetFunction {
        NetFunction {
            vendor: 0x15b3,
            device: 0x1021,
            rdma: rdma.iter().map(|s| s.to_string()).collect(),
            net: vec!["ibp37s0".into()],
        }
    }

    /// A NIC of the file the guest has at that address under that name: no problem; the
    /// virtual NIC outside any `<pci>` (as in NCCL's own dump) is not a NIC of the file.
    #[test]
    fn a_nic_the_guest_has_is_no_problem() {
        let s = scan(&[("0000:23:00.0", "0x2330")]);
        let text = WITH_NIC.replace("ARCH", this_arch());
        let nics = BTreeMap::from([("0000:25:00.0".parse().unwrap(), cx7(&["mlx5_0"]))]);
        let c = check_text(&text, "f.xml", &s, &nics).unwrap();
        assert_eq!(c.problems, Vec::<String>::new());
        assert_eq!(c.nics.len(), 1);
        assert!(c.nics[0].in_guest);
        assert_eq!(c.nics[0].nets, ["mlx5_0"]);
    }

    /// A NIC the guest does not have at that address is a finding; so is one it names
    /// otherwise, and one of another device ID.
    #[test]
    fn a_nic_missing_or_named_otherwise_is_a_finding() {
        let s = scan(&[("0000:23:00.0", "0x2330")]);
        let text = WITH_NIC.replace("ARCH", this_arch());
        let elsewhere = BTreeMap::from([("0000:26:00.0".parse().unwrap(), cx7(&["mlx5_0"]))]);
        let c = check_text(&text, "f.xml", &s, &elsewhere).unwrap();
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(c.problems[0].starts_with(
            "NIC 0000:25:00.0 is in the file but this guest has no network device there"
        ));
        assert!(!c.nics[0].in_guest);
        let renamed = BTreeMap::from([("0000:25:00.0".parse().unwrap(), cx7(&["mlx5_3"]))]);
        let c = check_text(&text, "f.xml", &s, &renamed).unwrap();
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
        assert!(c.problems[0]
            .contains("<net name=\"mlx5_0\"> is not what this guest calls it (mlx5_3, ibp37s0)"));
        let mut other = cx7(&["mlx5_0"]);
        other.device = 0x101d;
        let c = check_text(
            &text,
            "f.xml",
            &s,
            &BTreeMap::from([("0000:25:00.0".parse().unwrap(), other)]),
        )
        .unwrap();
        assert!(
            c.problems[0].contains("is device 0x1021 in the file but 0x101d here"),
            "{:?}",
            c.problems
        );
    }
}
