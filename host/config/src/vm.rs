//! `vm.yaml`: the VM description `vfio-p2p gen` turns into a VMM configuration.
//!
//! Two steps, like Cloud Hypervisor's config: [`VmConfigFile`] is what serde reads
//! (unknown keys and wrongly typed values are errors with line and column), and
//! [`VmConfig::validate`] checks the meaning (names, sizes, paths), again pointing at
//! the offending line.

use std::fmt;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use pci_config::Bdf;
use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};

use super::vm_boot::{self, Boot, BootKeys, Firmware};
use super::vm_devices::{self, ConsoleKind, DiskFile, GuestDevices, NetworkFile};
use super::ConfigError;
use pci_config::PathKind;
use vfio_p2p_model::NicRef;

/// How the guest's PCIe tree is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestTopology {
    /// Reproduce the host's NUMA nodes, root ports and switches.
    #[default]
    Mirror,
    /// Each GPU on its own root port on the root bus.
    Flat,
}

impl fmt::Display for GuestTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GuestTopology::Mirror => "mirror",
            GuestTopology::Flat => "flat",
        })
    }
}

/// How QEMU reaches the host IOMMU for the VM's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IommuBackend {
    /// VFIO groups and the type1 container (`/dev/vfio/vfio`, `/dev/vfio/N`).
    #[default]
    Legacy,
    /// `/dev/iommu` and the VFIO device cdevs (`/dev/vfio/devices/vfioN`).
    Iommufd,
    /// iommufd where the host offers it and P2P still works through it, else legacy.
    Auto,
}

impl fmt::Display for IommuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IommuBackend::Legacy => "legacy",
            IommuBackend::Iommufd => "iommufd",
            IommuBackend::Auto => "auto",
        })
    }
}

/// How the guest's verdict reaches the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// The verdict stays in the guest.
    #[default]
    None,
    /// The agent sends its report over virtio-vsock to `vfio-p2p collect` (docs/fleet.md).
    Vsock,
}

/// The VM's vsock device and the port its agent reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VsockReport {
    /// The guest's CID: unique on the host, 3 or more.
    pub cid: u32,
    pub port: u32,
}

/// The file as written. Every field is optional except `name`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfigFile {
    /// VM name: domain name in libvirt, `-name` in QEMU, `vm` in the guest expectation.
    pub name: Spanned<String>,
    /// GPUs to pass through (host BDFs); `--gpus` replaces the list.
    #[serde(default)]
    pub gpus: Vec<Spanned<String>>,
    /// NICs or SR-IOV VFs to pass with the GPUs: host BDFs, interface names (`ens1f0np0`)
    /// or RDMA device names (`mlx5_0`); `--nics` replaces the list.
    #[serde(default)]
    pub nics: Vec<Spanned<String>>,
    /// Worst host path that still gets a P2P clique: pix, pxb, phb, node or sys.
    #[serde(default)]
    pub p2p_level: Option<Spanned<String>>,
    /// mirror (default) or flat; x86 guests only (a Grace guest's tree follows its SMMUs).
    #[serde(default)]
    pub guest_topology: Option<Spanned<GuestTopology>>,
    /// legacy (default), iommufd or auto; `--iommu-backend` overrides it.
    #[serde(default)]
    pub iommu_backend: Option<Spanned<IommuBackend>>,
    /// Guest memory in MiB.
    #[serde(default)]
    pub memory_mib: Option<Spanned<u64>>,
    #[serde(default)]
    pub vcpus: Option<Spanned<u32>>,
    /// One guest NUMA node per host NUMA node holding a GPU (mirror layout only); x86
    /// guests only (a Grace guest's nodes follow its GPUs' C2C memory).
    #[serde(default)]
    pub guest_numa: Option<Spanned<bool>>,
    #[serde(default)]
    pub firmware: Option<Spanned<Firmware>>,
    /// OVMF code image (UEFI only).
    #[serde(default)]
    pub ovmf_code: Option<Spanned<PathBuf>>,
    /// OVMF variable store template (UEFI only).
    #[serde(default)]
    pub ovmf_vars: Option<Spanned<PathBuf>>,
    /// `vsock`: give the VM a vsock device and have the agent report to the host.
    #[serde(default)]
    pub verify: Option<Spanned<Verify>>,
    /// The guest CID of that vsock device (needs `verify: vsock`).
    #[serde(default)]
    pub vsock_cid: Option<Spanned<u32>>,
    /// The host port the agent reports to (default 7389).
    #[serde(default)]
    pub report_port: Option<Spanned<u32>>,
    /// Disk images, the first one boots.
    #[serde(default)]
    pub disks: Vec<DiskFile>,
    /// The VM's virtio-net NIC: `mode: user` or `bridge: NAME` (default: none).
    #[serde(default)]
    pub network: Option<Spanned<NetworkFile>>,
    /// serial (default), socket or none.
    #[serde(default)]
    pub console: Option<Spanned<ConsoleKind>>,
    /// The UNIX socket of `console: socket`.
    #[serde(default)]
    pub console_socket: Option<Spanned<PathBuf>>,
    /// This VM's copy of `ovmf_vars`, which QEMU writes (`vm_boot`).
    #[serde(default)]
    pub ovmf_vars_copy: Option<Spanned<PathBuf>>,
    /// A kernel booted directly (Cloud Hypervisor `--kernel`), its initramfs and command line.
    #[serde(default)]
    pub kernel: Option<Spanned<PathBuf>>,
    #[serde(default)]
    pub initramfs: Option<Spanned<PathBuf>>,
    #[serde(default)]
    pub cmdline: Option<Spanned<String>>,
    /// QEMU detached (`-daemonize -pidfile`), managed through `qmp_socket`.
    #[serde(default)]
    pub daemonize: Option<Spanned<bool>>,
    /// QEMU's QMP socket (`-qmp unix:PATH,server=on,wait=off`).
    #[serde(default)]
    pub qmp_socket: Option<Spanned<PathBuf>>,
}

/// A validated VM description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    pub name: String,
    pub gpus: Vec<Bdf>,
    /// NICs to pass with the GPUs, as named (resolved against the host by `gen`).
    pub nics: Vec<NicRef>,
    pub p2p_level: Option<PathKind>,
    pub guest_topology: GuestTopology,
    /// Where vm.yaml sets `guest_topology` (a Grace guest says it does not apply there).
    pub guest_topology_at: Option<Location>,
    pub iommu_backend: IommuBackend,
    pub memory_mib: u64,
    /// Where vm.yaml sets `memory_mib` (for gen's refusal of a RAM that does not fit).
    pub memory_at: Option<Location>,
    pub vcpus: u32,
    pub guest_numa: bool,
    /// Where vm.yaml sets `guest_numa` (a Grace guest says it does not apply there).
    pub guest_numa_at: Option<Location>,
    pub firmware: Firmware,
    pub ovmf_code: PathBuf,
    pub ovmf_vars: Option<PathBuf>,
    /// Set by `verify: vsock`.
    pub report: Option<VsockReport>,
    /// Disks, NIC and serial console (`disks:`, `network:`, `console:`).
    pub devices: GuestDevices,
    /// A direct kernel, the vars copy, QEMU as a service (`vm_boot`).
    pub boot: Boot,
}

pub const DEFAULT_NAME: &str = "vm0";
pub const DEFAULT_MEMORY_MIB: u64 = 16 * 1024;
pub const DEFAULT_VCPUS: u32 = 8;
/// Debian/Ubuntu's OVMF code image (package `ovmf`).
pub const DEFAULT_OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// Guest memory floor: below this no GPU driver loads.
const MIN_MEMORY_MIB: u64 = 512;
/// The most memory a VM may be given: 64 TiB (its bytes, and the MMIO window above them,
/// stay far from overflowing 64 bits).
const MAX_MEMORY_MIB: u64 = 64 << 20;

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            name: DEFAULT_NAME.to_string(),
            gpus: Vec::new(),
            nics: Vec::new(),
            p2p_level: None,
            guest_topology: GuestTopology::Mirror,
            guest_topology_at: None,
            iommu_backend: IommuBackend::Legacy,
            memory_mib: DEFAULT_MEMORY_MIB,
            memory_at: None,
            vcpus: DEFAULT_VCPUS,
            guest_numa: true,
            guest_numa_at: None,
            firmware: Firmware::Bios,
            ovmf_code: PathBuf::from(DEFAULT_OVMF_CODE),
            ovmf_vars: None,
            report: None,
            devices: GuestDevices::default(),
            boot: Boot::default(),
        }
    }
}

impl VmConfig {
    pub fn load(path: &Path) -> Result<VmConfig, ConfigError> {
        Self::parse(&super::read_file(path)?, path)
    }

    /// Parses and validates `text`; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<VmConfig, ConfigError> {
        Self::validate(super::parse_yaml(text, path)?, path)
    }

    pub fn validate(file: VmConfigFile, path: &Path) -> Result<VmConfig, ConfigError> {
        let invalid = |at: &Location, message: String| ConfigError::invalid(path, at, message);
        let name = file.name.value.clone();
        if let Some(e) = super::vm_name_error(&name) {
            return Err(invalid(&file.name.referenced, e));
        }
        let field = |e: super::FieldError| invalid(&e.at, e.message);
        let gpus = super::bdf_list("gpus", &file.gpus).map_err(field)?;
        let nics = nic_list(&file.nics).map_err(field)?;
        let p2p_level = match &file.p2p_level {
            Some(l) => Some(super::p2p_level(l).map_err(field)?),
            None => None,
        };
        let memory_mib = match &file.memory_mib {
            Some(m) if m.value < MIN_MEMORY_MIB => {
                return Err(invalid(
                    &m.referenced,
                    format!(
                        "memory_mib: {} MiB is too little; give at least {MIN_MEMORY_MIB}",
                        m.value
                    ),
                ))
            }
            Some(m) if m.value > MAX_MEMORY_MIB => {
                return Err(invalid(
                    &m.referenced,
                    format!(
                        "memory_mib: {} MiB is more than any host has; give at most {MAX_MEMORY_MIB} (64 TiB)",
                        m.value
                    ),
                ))
            }
            Some(m) => m.value,
            None => DEFAULT_MEMORY_MIB,
        };
        let vcpus = match &file.vcpus {
            Some(v) if v.value == 0 || v.value > 1024 => {
                return Err(invalid(
                    &v.referenced,
                    format!("vcpus: {} is out of range; give 1 to 1024", v.value),
                ))
            }
            Some(v) => v.value,
            None => DEFAULT_VCPUS,
        };
        let firmware = file.firmware.as_ref().map(|f| f.value).unwrap_or_default();
        let check_path = |p: &Option<Spanned<PathBuf>>, key: &str| -> Result<(), ConfigError> {
            match p {
                Some(p) if firmware != Firmware::Uefi => Err(invalid(
                    &p.referenced,
                    format!("{key} is only used with 'firmware: uefi'; remove it or set firmware"),
                )),
                Some(p) => match super::config_path_error(key, &p.value) {
                    Some(e) => Err(invalid(&p.referenced, e)),
                    None => Ok(()),
                },
                None => Ok(()),
            }
        };
        check_path(&file.ovmf_code, "ovmf_code")?;
        check_path(&file.ovmf_vars, "ovmf_vars")?;
        check_path(&file.ovmf_vars_copy, "ovmf_vars_copy")?;
        let report = vsock_report(&file, path)?;
        let boot = vm_boot::boot(BootKeys {
            firmware: file.firmware.as_ref(),
            ovmf_code: file.ovmf_code.as_ref(),
            ovmf_vars: file.ovmf_vars.as_ref(),
            ovmf_vars_copy: file.ovmf_vars_copy,
            kernel: file.kernel,
            initramfs: file.initramfs,
            cmdline: file.cmdline,
            daemonize: file.daemonize,
            qmp_socket: file.qmp_socket,
            console: file.console.as_ref(),
        })
        .map_err(field)?;
        let devices =
            vm_devices::devices(file.disks, file.network, file.console, file.console_socket)
                .map_err(field)?;
        Ok(VmConfig {
            name,
            gpus,
            nics,
            p2p_level,
            guest_topology: file
                .guest_topology
                .as_ref()
                .map(|t| t.value)
                .unwrap_or_default(),
            guest_topology_at: file.guest_topology.map(|t| t.referenced),
            iommu_backend: file.iommu_backend.map(|b| b.value).unwrap_or_default(),
            memory_mib,
            memory_at: file.memory_mib.as_ref().map(|m| m.referenced),
            vcpus,
            guest_numa: file.guest_numa.as_ref().is_none_or(|n| n.value),
            guest_numa_at: file.guest_numa.map(|n| n.referenced),
            firmware,
            ovmf_code: file
                .ovmf_code
                .map(|p| p.value)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OVMF_CODE)),
            ovmf_vars: file.ovmf_vars.map(|p| p.value),
            report,
            devices,
            boot,
        })
    }
}

/// The `nics:` list: each a BDF or a host name for one, none twice.
fn nic_list(items: &[Spanned<String>]) -> Result<Vec<NicRef>, super::FieldError> {
    let mut list: Vec<NicRef> = Vec::with_capacity(items.len());
    for item in items {
        let nic: NicRef = item
            .value
            .parse()
            .map_err(|e| super::FieldError::new(&item.referenced, format!("nics: {e}")))?;
        if list.contains(&nic) {
            return Err(super::FieldError::new(
                &item.referenced,
                format!("nics: {nic} is listed twice"),
            ));
        }
        list.push(nic);
    }
    Ok(list)
}

/// `verify`, `vsock_cid` and `report_port` together: a CID of 3 or more (0-2 are the
/// hypervisor, loopback and host; `u32::MAX` means any), only with `verify: vsock`.
fn vsock_report(file: &VmConfigFile, path: &Path) -> Result<Option<VsockReport>, ConfigError> {
    let invalid = |at: &Location, message: String| ConfigError::invalid(path, at, message);
    let vsock = file.verify.as_ref().filter(|v| v.value == Verify::Vsock);
    let Some(v) = vsock else {
        if let Some(c) = &file.vsock_cid {
            return Err(invalid(
                &c.referenced,
                "vsock_cid is only used with 'verify: vsock'; remove it or set verify".into(),
            ));
        }
        if let Some(p) = &file.report_port {
            return Err(invalid(
                &p.referenced,
                "report_port is only used with 'verify: vsock'; remove it or set verify".into(),
            ));
        }
        return Ok(None);
    };
    let cid = match &file.vsock_cid {
        None => {
            return Err(invalid(
                &v.referenced,
                "verify: vsock needs vsock_cid: N (3 or more, unique among this host's VMs)".into(),
            ))
        }
        Some(c) if c.value < 3 || c.value == u32::MAX => {
            return Err(invalid(
                &c.referenced,
                format!(
                    "vsock_cid: {} is reserved; give 3 to 4294967294, unique among this host's VMs",
                    c.value
                ),
            ))
        }
        Some(c) => c.value,
    };
    let port = match &file.report_port {
        Some(p) if p.value == u32::MAX => {
            return Err(invalid(
                &p.referenced,
                "report_port: 4294967295 means any port; give a real one".into(),
            ))
        }
        Some(p) => p.value,
        None => vfio_p2p_contract::DEFAULT_REPORT_PORT,
    };
    Ok(Some(VsockReport { cid, port }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<VmConfig, ConfigError> {
        VmConfig::parse(text, Path::new("vm.yaml"))
    }

    #[test]
    fn full_file() {
        let c = parse(
            "name: train-01\ngpus: [0000:41:00.0, 0000:42:00.0]\np2p_level: pxb\nguest_topology: flat\n\
             memory_mib: 65536\nvcpus: 32\nguest_numa: false\nfirmware: uefi\novmf_code: /opt/OVMF_CODE.fd\n",
        )
        .unwrap();
        assert_eq!(c.name, "train-01");
        assert_eq!(c.gpus.len(), 2);
        assert_eq!(c.p2p_level, Some(PathKind::Pxb));
        assert_eq!(c.guest_topology, GuestTopology::Flat);
        assert_eq!((c.memory_mib, c.vcpus, c.guest_numa), (65536, 32, false));
        // where the layout keys were set, for the warning where they do not apply
        let at = |l: Option<Location>| l.map(|l| (l.line(), l.column()));
        assert_eq!(at(c.guest_topology_at), Some((4, 17)));
        assert_eq!(at(c.guest_numa_at), Some((7, 13)));
        assert_eq!(c.firmware, Firmware::Uefi);
        assert_eq!(c.ovmf_code, PathBuf::from("/opt/OVMF_CODE.fd"));
    }

    #[test]
    fn verify_vsock_needs_a_cid_and_only_then_takes_one() {
        let c = parse("name: vm1\nverify: vsock\nvsock_cid: 42\n").unwrap();
        assert_eq!(
            c.report,
            Some(VsockReport {
                cid: 42,
                port: 7389
            })
        );
        let c = parse("name: vm1\nverify: vsock\nvsock_cid: 42\nreport_port: 900\n").unwrap();
        assert_eq!(c.report, Some(VsockReport { cid: 42, port: 900 }));
        let e = parse("name: vm1\nverify: vsock\n").unwrap_err().to_string();
        assert!(e.contains("verify: vsock needs vsock_cid"), "{e}");
        assert!(e.contains("line 2") || e.contains(":2:"), "{e}");
        let e = parse("name: vm1\nverify: vsock\nvsock_cid: 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("vsock_cid: 2 is reserved"), "{e}");
        assert!(e.contains("line 3") || e.contains(":3:"), "{e}");
        let e = parse("name: vm1\nvsock_cid: 5\n").unwrap_err().to_string();
        assert!(e.contains("only used with 'verify: vsock'"), "{e}");
        let e = parse("name: vm1\nverify: tcp\n").unwrap_err().to_string();
        assert!(e.contains("tcp"), "{e}");
        assert_eq!(parse("name: vm1\nverify: none\n").unwrap().report, None);
    }

    #[test]
    fn iommu_backend_reads_and_a_typo_names_its_line() {
        assert_eq!(
            parse("name: a\n").unwrap().iommu_backend,
            IommuBackend::Legacy
        );
        let c = parse("name: a\niommu_backend: iommufd\n").unwrap();
        assert_eq!(c.iommu_backend, IommuBackend::Iommufd);
        let c = parse("name: a\niommu_backend: auto\n").unwrap();
        assert_eq!(c.iommu_backend, IommuBackend::Auto);
        let e = parse("name: a\niommu_backend: iommu-fd\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("iommu-fd"), "{e}");
        assert!(e.contains("line 2") || e.contains(":2:"), "{e}");
        assert!(e.contains("legacy") && e.contains("iommufd"), "{e}");
    }

    #[test]
    fn defaults() {
        let c = parse("name: vm1\n").unwrap();
        assert_eq!(
            c,
            VmConfig {
                name: "vm1".into(),
                ..VmConfig::default()
            }
        );
        assert_eq!((c.guest_topology_at, c.guest_numa_at), (None, None));
    }

    #[test]
    fn unknown_key_names_line_and_column() {
        let e = parse("name: vm1\nmemroy_mib: 4096\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("memroy_mib"), "{e}");
        assert!(e.contains("line 2") || e.contains(":2:"), "{e}");
    }

    #[test]
    fn bad_enum_value_names_line() {
        let e = parse("name: vm1\nguest_topology: tree\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tree"), "{e}");
        assert!(e.contains("line 2") || e.contains(":2:"), "{e}");
    }

    #[test]
    fn wrong_type_names_line() {
        let e = parse("name: vm1\nvcpus: many\n").unwrap_err().to_string();
        assert!(e.contains("line 2") || e.contains(":2:"), "{e}");
    }

    #[test]
    fn bad_bdf_points_at_the_entry() {
        let c = parse("name: vm1\nnics: [mlx5_0, 0000:1a:00.0]\n").unwrap();
        assert_eq!(c.nics[0], NicRef::Name("mlx5_0".into()));
        let e = parse("name: vm1\nnics:\n  - mlx5_0\n  - a/b\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("vm.yaml:4:5: nics: 'a/b' is neither"), "{e}");
        let e = parse("name: vm1\nnics: [mlx5_0, mlx5_0]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nics: mlx5_0 is listed twice"), "{e}");
        let e = parse("name: vm1\ngpus:\n  - 0000:41:00.0\n  - 41:00.\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("vm.yaml:4:5: gpus: '41:00.' is not a PCI address"),
            "{e}"
        );
        // lspci's form is the same GPU.
        let e = parse("name: vm1\ngpus:\n  - 0000:41:00.0\n  - 41:00.0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("0000:41:00.0 is listed twice"), "{e}");
    }

    #[test]
    fn semantic_errors_carry_position() {
        let cases = [
            ("name: 'bad name'\n", "vm.yaml:1:7: name \"bad name\""),
            (
                "name: a\nvcpus: 0\n",
                "vm.yaml:2:8: vcpus: 0 is out of range",
            ),
            (
                "name: a\nmemory_mib: 16\n",
                "vm.yaml:2:13: memory_mib: 16 MiB",
            ),
            (
                "name: a\np2p_level: bus\n",
                "vm.yaml:2:12: p2p_level: 'bus'",
            ),
            (
                "name: a\novmf_code: /x.fd\n",
                "vm.yaml:2:12: ovmf_code is only used",
            ),
            (
                "name: a\nfirmware: uefi\novmf_code: x.fd\n",
                "vm.yaml:3:12: ovmf_code: \"x.fd\" must be",
            ),
            // issue 28: a newline in a path would start a new argument or config line,
            // and a memory size past any host overflowed into `-m 18446744073709551615M`
            (
                "name: a\nfirmware: uefi\novmf_code: \"/x\\n.fd\"\n",
                "vm.yaml:3:12: ovmf_code: \"/x\\n.fd\" has a control character",
            ),
            (
                "name: a\nfirmware: uefi\novmf_vars: \"/v\\t.fd\"\n",
                "vm.yaml:3:12: ovmf_vars: \"/v\\t.fd\" has a control character",
            ),
            (
                "name: a\nmemory_mib: 18446744073709551615\n",
                "vm.yaml:2:13: memory_mib: 18446744073709551615 MiB is more than any host has",
            ),
            (
                "name: \"a\\nargs: -x\"\n",
                "vm.yaml:1:7: name \"a\\nargs: -x\": use 1-64",
            ),
            (
                "name: a\ngpus: [0000:01:00.0, 0000:01:00.0]\n",
                "vm.yaml:2:22: gpus: 0000:01:00.0 is listed twice",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: got {e}");
        }
    }

    #[test]
    fn examples_in_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            // host.yaml is the host policy (config::host), not a VM.
            if path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("host.yaml") {
                VmConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 2, "expected example configs in {}", dir.display());
    }
}
