//! What Proxmox VE's qemu-server cannot take from a VM definition, decided before
//! `gen proxmox` renders it (`emit::proxmox` only writes lines).

use crate::guest_layout::GuestLayout;
use crate::vm_refusal::Refusal;
use vfio_p2p_config::vm::VmConfig;

/// qemu-server accepts `hostpci0` … `hostpci15`.
pub const MAX_HOSTPCI: usize = 16;

/// Why Proxmox cannot run the VM.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("{functions} GPU and NIC functions do not fit Proxmox's {MAX_HOSTPCI} hostpci entries (hostpci0..hostpci15): give the VM fewer GPUs or NICs")]
    TooManyFunctions { functions: usize },
    #[error("Proxmox cannot take a disk path with ',' or '=': {path}; rename the file or link it from a path without them")]
    DiskPath { path: String },
}

/// Refuses what qemu-server cannot take: more passed functions (each GPU and NIC, with their
/// other functions) than hostpci entries, then a disk path with `,` or `=` (qemu-server
/// splits its drive options at them); the first found.
pub fn refusal(config: &VmConfig, layout: &GuestLayout) -> Result<(), Refusal<Unsupported>> {
    let functions: usize = layout.passed().map(|g| 1 + g.other_functions.len()).sum();
    if functions > MAX_HOSTPCI {
        let why = Unsupported::TooManyFunctions { functions };
        return Err(Refusal { at: None, why });
    }
    for disk in &config.devices.disks {
        let path = disk.path.display().to_string();
        if path.contains(',') || path.contains('=') {
            return Err(Refusal {
                at: disk.at,
                why: Unsupported::DiskPath { path },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::guest_layout::{decide_with_nics, LayoutOptions};
    use pci_config::Bdf;
    use vfio_p2p_config::vm::GuestTopology;
    use vfio_p2p_model::Topology;
    use vfio_p2p_read::synth;

    /// `example`'s first `n` GPUs (each with its other functions), flat.
    fn layout(example: &str, n: usize) -> GuestLayout {
        let topo = Topology::from_record(&synth::example(example).unwrap());
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).take(n).collect();
        let cliques: BTreeMap<Bdf, Option<u8>> = gpus.iter().map(|g| (*g, None)).collect();
        let opts = LayoutOptions {
            topology: GuestTopology::Flat,
            guest_numa: false,
        };
        decide_with_nics(&topo, &gpus, &[], &cliques, opts).unwrap()
    }

    fn refused(yaml: &str, l: &GuestLayout) -> Result<(), (Option<u64>, String)> {
        let c = VmConfig::parse(yaml, Path::new("vm.yaml")).unwrap();
        refusal(&c, l).map_err(|r| (r.at.map(|a| a.line()), r.why.to_string()))
    }

    /// dual-socket-pcie's 4 GPUs each bring an audio function (8 passed functions); padded
    /// with copies of one audio function to 16 (Proxmox's most hostpci entries) it passes, to
    /// 17 it is refused; a disk path with `,` or `=` is refused at its line.
    #[test]
    fn refuses_past_16_functions_and_disk_paths_qemu_server_splits() {
        let padded = |to: usize| {
            let mut l = layout("dual-socket-pcie", 4);
            let audio = l.gpus[0].other_functions[0].clone();
            let have: usize = l.passed().map(|g| 1 + g.other_functions.len()).sum();
            l.gpus[0]
                .other_functions
                .extend(std::iter::repeat_n(audio, to - have));
            l
        };
        assert_eq!(refused("name: a\n", &padded(MAX_HOSTPCI)), Ok(()));
        let (at, why) = refused("name: a\n", &padded(MAX_HOSTPCI + 1)).unwrap_err();
        assert_eq!(at, None);
        assert!(
            why.starts_with("17 GPU and NIC functions do not fit Proxmox's 16 hostpci entries"),
            "{why}"
        );
        let one = layout("dual-socket-pcie", 1);
        for path in ["/i/a,b.raw", "/i/a=b.raw"] {
            let yaml = format!("name: a\ndisks:\n  - path: /i/ok.raw\n  - path: {path}\n");
            let (at, why) = refused(&yaml, &one).unwrap_err();
            assert_eq!(at, Some(4), "{why}");
            assert!(why.contains(&format!("',' or '=': {path}")), "{why}");
        }
        assert_eq!(
            refused("name: a\ndisks:\n  - path: /i/a.raw\n", &one),
            Ok(())
        );
    }
}
