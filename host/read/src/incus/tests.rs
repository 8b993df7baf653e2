use super::*;

const EXPANDED: &str = r#"architecture: x86_64
config:
  limits.cpu: "8"
  raw.qemu: -global q35-pcihost.pci-hole64-size=544G
  raw.qemu.conf: |-
    [device "dev-incus_gpu2"]
    x-nv-gpudirect-clique = "1"
devices:
  gpu0:
    gputype: physical
    nvidia.clique: "0"
    pci: "0000:05:00.0"
    type: gpu
  gpu1:
    nvidia.clique: 0
    pci: 0000:06:00.0
    type: gpu
  gpu2:
    pci: "0000:09:00.0"
    type: gpu
  nic0:
    address: "0000:0b:00.0"
    type: pci
  root:
    path: /
    pool: default
    type: disk
ephemeral: false
name: train0
profiles:
- default
stateful: false
"#;

#[test]
fn expanded_config_gives_hostdevs_and_cliques_by_qemu_id() {
    let c = parse_incus_config(EXPANDED, "i.yaml").unwrap();
    let f = &c.facts;
    assert_eq!(f.name.as_deref(), Some("train0"));
    let ids: Vec<_> = f.hostdevs.iter().map(|h| h.alias_name().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "dev-incus_gpu0",
            "dev-incus_gpu1",
            "dev-incus_gpu2",
            "dev-incus_nic0"
        ]
    );
    assert_eq!(f.hostdevs[3].bdf.to_string(), "0000:0b:00.0");
    assert_eq!(f.cliques["dev-incus_gpu0"][0].value, "0");
    assert_eq!(
        f.cliques["dev-incus_gpu0"][0].source.to_string(),
        "nvidia.clique"
    );
    // an unquoted number is the same string to Incus
    assert_eq!(f.cliques["dev-incus_gpu1"][0].value, "0");
    assert_eq!(
        f.cliques["dev-incus_gpu2"][0].source.to_string(),
        "raw.qemu.conf"
    );
    assert_eq!(f.cliques["dev-incus_gpu2"][0].value, "1");
    assert_eq!(f.hole64.as_ref().unwrap().bytes, 544 << 30);
    assert!(f.hidden_hypervisor.is_empty() && c.warnings.is_empty());
}

#[test]
fn hidden_hypervisor_in_raw_qemu() {
    let text = "config:\n  raw.qemu: \"-cpu host,kvm=off\"\ndevices: {}\n";
    let c = parse_incus_config(text, "i.yaml").unwrap();
    assert_eq!(c.facts.hidden_hypervisor.len(), 1, "{:?}", c.facts);
}

#[test]
fn bad_address_names_file_and_line() {
    let text = "config: {}\ndevices:\n  gpu0:\n    type: gpu\n    pci: \"05:00\"\n";
    let e = parse_incus_config(text, "i.yaml").unwrap_err();
    assert_eq!(e.line, Some(5), "{e}");
    assert!(
        e.to_string()
            .starts_with("i.yaml:5: devices.gpu0.pci: `05:00`"),
        "{e}"
    );
}

#[test]
fn not_yaml_names_the_line() {
    let e = parse_incus_config("config: {}\ndevices: [\n", "i.yaml").unwrap_err();
    assert!(e.to_string().starts_with("i.yaml:"), "{e}");
    assert!(
        e.to_string().contains("incus config show --expanded"),
        "{e}"
    );
}

#[test]
fn gpu_by_vendor_and_other_gputypes_are_warned_not_checked() {
    let text = "devices:\n  a:\n    type: gpu\n    vendorid: 10de\n  b:\n    type: gpu\n    gputype: mig\n    pci: 0000:05:00.0\n";
    let c = parse_incus_config(text, "i.yaml").unwrap();
    assert!(c.facts.hostdevs.is_empty());
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
}

#[test]
fn server_extensions_from_query_and_count_only_info() {
    let q = r#"{"api_extensions":["gpu_mig","gpu_physical_clique"],"environment":{"server_version":"7.0.2"}}"#;
    let s = parse_incus_server(q, "q.json").unwrap();
    assert!(s.has("gpu_physical_clique") && !s.has("nope"));
    assert_eq!(s.server_version.as_deref(), Some("7.0.2"));
    let info = "config: {}\napi_extensions_count: 562\napi_status: stable\n";
    let e = parse_incus_server(info, "info.yaml").unwrap_err();
    assert!(
        e.to_string().contains("only their count (562)")
            && e.to_string().contains("incus query /1.0"),
        "{e}"
    );
}
