//! `gen nccl` against NCCL 2.28.9's own topology dump (`NCCL_TOPO_DUMP_FILE`) of the
//! same two H200s (tests/fixtures/nccl/h200x2-nccl-dump.xml, written by NCCL in the VM
//! whose sysfs and `nvidia-smi topo -m` are the flat-vm example), element by element and
//! attribute by attribute.

use std::collections::BTreeMap;

use quick_xml::events::Event;
use quick_xml::Reader;

/// An element: its path of `name[key]` steps, its attributes in order.
type Elements = BTreeMap<String, Vec<(String, String)>>;

/// The attribute that tells siblings of one name apart.
fn key_attr(name: &str) -> Option<&'static str> {
    match name {
        "cpu" => Some("numaid"),
        "pci" => Some("busid"),
        "nvlink" => Some("target"),
        "net" => Some("name"),
        _ => None,
    }
}

fn elements(xml: &str) -> Elements {
    let mut r = Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut out = Elements::new();
    loop {
        let (e, empty) = match r.read_event().unwrap() {
            Event::Start(e) => (e, false),
            Event::Empty(e) => (e, true),
            Event::End(_) => {
                path.pop();
                continue;
            }
            Event::Eof => break,
            _ => continue,
        };
        let name = e.name().into_inner().to_string();
        let attrs: Vec<(String, String)> = e
            .attributes()
            .map(|a| {
                let a = a.unwrap();
                (
                    a.key.into_inner().to_string(),
                    a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                        .unwrap()
                        .into_owned(),
                )
            })
            .collect();
        let key = key_attr(&name)
            .and_then(|k| attrs.iter().find(|(n, _)| n == k))
            .map(|(_, v)| format!("[{v}]"))
            .unwrap_or_default();
        path.push(format!("{name}{key}"));
        assert!(
            out.insert(path.join("/"), attrs).is_none(),
            "{} twice",
            path.join("/")
        );
        if empty {
            path.pop();
        }
    }
    out
}

/// What NCCL writes on every run and a file made before the run cannot know: its hash of
/// the running host, the GPU's device index, compute capability, rank and GPUDirect RDMA
/// support, and the network it found.
fn runtime_only(path: &str, attr: &str) -> bool {
    (path.ends_with("/gpu") && ["dev", "sm", "rank", "gdr"].contains(&attr))
        || (path.starts_with("system/cpu") && !path.contains("/pci") && attr == "host_hash")
        || path.contains("/nic")
}

/// `vfio-p2p ARGS`'s output, which must succeed.
fn vfio_p2p(args: &[&str]) -> String {
    crate::cli::succeeded(crate::cli::vfio_p2p().args(args)).0
}

fn ours() -> String {
    vfio_p2p(&["--example", "flat-vm", "gen", "nccl", "--as-is"])
}

#[test]
fn gen_nccl_matches_nccls_own_dump_attribute_by_attribute() {
    let dump = elements(include_str!(
        "../../../tests/fixtures/nccl/h200x2-nccl-dump.xml"
    ));
    let ours = elements(&ours());
    let mut differences = Vec::new();
    for (path, want) in &dump {
        let got = ours.get(path);
        if got.is_none() && !runtime_only(path, "") {
            differences.push(format!("{path}: missing"));
        }
        let got = got.cloned().unwrap_or_default();
        let kept: Vec<&(String, String)> = want
            .iter()
            .filter(|(a, _)| !runtime_only(path, a))
            .collect();
        let got_ref: Vec<&(String, String)> = got.iter().collect();
        if got.is_empty() && kept.is_empty() {
            continue;
        }
        if got_ref != kept {
            differences.push(format!("{path}: NCCL {kept:?}, ours {got_ref:?}"));
        }
    }
    for path in ours.keys().filter(|p| !dump.contains_key(*p)) {
        differences.push(format!("{path}: not in NCCL's dump"));
    }
    assert!(differences.is_empty(), "{differences:#?}");
}

#[test]
fn the_comparison_sees_a_difference() {
    // The check above is not vacuous: a changed count and a missing arch are found.
    let dump = include_str!("../../../tests/fixtures/nccl/h200x2-nccl-dump.xml");
    let a = elements(dump);
    let b = elements(&dump.replace("count=\"18\"", "count=\"126\""));
    assert_ne!(a, b);
    let c = elements(&dump.replace(" arch=\"x86_64\"", ""));
    assert_ne!(a["system/cpu[0]"], c["system/cpu[0]"]);
}

#[test]
fn hgx_h100_has_one_switch_link_per_gpu() {
    let xml = vfio_p2p(&["--example", "hgx-h100", "gen", "nccl"]);
    let e = elements(&xml);
    let gpus: Vec<&String> = e.keys().filter(|p| p.ends_with("/gpu")).collect();
    assert_eq!(gpus.len(), 8);
    for g in gpus {
        let links: Vec<_> = e
            .iter()
            .filter(|(p, _)| p.starts_with(g.as_str()) && p.contains("/nvlink"))
            .collect();
        assert_eq!(links.len(), 1, "{g}: {links:?}");
        let attrs = links[0].1;
        assert_eq!(
            attrs,
            &[
                ("target".to_string(), "fffffff:ff:ff.0".to_string()),
                ("count".to_string(), "18".to_string()),
                ("tclass".to_string(), "0x068000".to_string())
            ]
        );
    }
}

#[test]
fn gpu_to_gpu_links_name_the_peer_and_its_class() {
    // The same two H200s wired GPU to GPU with 6 links (as on a 4-GPU HGX board): one
    // element per peer, at the peer's address with the peer's class.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    let capture = std::fs::read_to_string(format!("{root}/nvidia-smi/h200x2-topo-m.txt"))
        .unwrap()
        .replace("NV18", "NV6");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topo-m.txt");
    std::fs::write(&path, capture).unwrap();
    let sysfs = format!("{root}/sysfs/h200x2-vm-sysfs.json");
    let path = path.to_str().unwrap();
    let e = elements(&vfio_p2p(&[
        "--sysfs-root",
        &sysfs,
        "gen",
        "nccl",
        "--as-is",
        "--nvlink",
        path,
    ]));
    let link = &e["system/cpu[0]/pci[0000:00:06.0]/gpu/nvlink[0000:00:07.0]"];
    assert_eq!(link[1], ("count".to_string(), "6".to_string()));
    assert_eq!(link[2], ("tclass".to_string(), "0x030200".to_string()));
    assert_eq!(e.keys().filter(|p| p.contains("/nvlink")).count(), 2);
}

/// NICs passed with the GPUs (`--nics`) are in the file as NCCL 2.28.9 writes a NIC
/// (xml.cc `ncclTopoFillNet`, `ncclTopoGetXmlFromSys`): a `<pci>` at the guest address
/// gen gave it, inside the same guest switch as the GPUs it is PIX to on the host, holding
/// `<nic><net name dev/>`; what only the running NIC knows (speed, port, guid, maxconn,
/// gdr, latency) is left for NCCL to fill.
#[test]
fn nics_sit_in_their_gpus_switch_as_nccl_writes_them() {
    let xml = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "gen",
        "nccl",
        "--gpus",
        "0000:18:00.0,0000:19:00.0,0000:9d:00.0",
        "--nics",
        "mlx5_0,ibp27s0,0000:9f:00.0",
    ]);
    let e = elements(&xml);
    let nets: Vec<(&String, &Vec<(String, String)>)> = e
        .iter()
        .filter(|(p, _)| p.ends_with("]") && p.contains("/net["))
        .collect();
    assert_eq!(nets.len(), 3, "{xml}");
    for (path, attrs) in &nets {
        let names: Vec<&str> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["name", "dev"], "{path}");
        // system/cpu[N]/pci[switch]/pci[nic]/nic/net[..]
        let steps: Vec<&str> = path.split('/').collect();
        assert_eq!(steps.len(), 6, "{path}");
        let nic_pci = &e[&steps[..4].join("/")];
        let keys: Vec<&str> = nic_pci.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "busid",
                "class",
                "vendor",
                "device",
                "subsystem_vendor",
                "subsystem_device",
                "link_speed",
                "link_width"
            ]
        );
        assert_eq!(nic_pci[1].1, "0x020000");
        // a GPU sits in the same switch
        let switch = steps[..3].join("/");
        assert!(
            e.iter().any(|(p, a)| p.starts_with(&switch)
                && p.matches('/').count() == 3
                && a.iter().any(|(k, v)| k == "class" && v == "0x030200")),
            "{switch}: no GPU beside the NIC\n{xml}"
        );
    }
    let names: Vec<&str> = nets.iter().map(|(_, a)| a[0].1.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1", "mlx5_2"]);
}
