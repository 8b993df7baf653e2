//! Blackwell's boot stall: QEMU before 10.1 mmaps a GPU's huge VRAM BAR into its own
//! address space, and the host kernel builds page tables for all of it while the guest
//! boots (minutes for a B200; Cloud Hypervisor measured the same page-table growth with
//! H200s and added `x_exclude_mmap_bars`, cloud-hypervisor PR #7991). QEMU 10.1 maps it
//! without the stall; older ones boot at once with `x-no-mmap=on` on the GPU's vfio-pci
//! device, at the cost of trapped BAR accesses.

use super::facts::{Vmm, VmmFacts};
use super::report::{result, CheckResult, Status};

const GIB: u64 = 1 << 30;
use vfio_p2p_model::Device;

/// A BAR this large stalls the boot: Blackwell's 180–192 GB of HBM round up to a 256 GiB
/// BAR (Hopper's 80–141 GB fit 128 GiB and boot in seconds).
pub const STALLING_BAR: u64 = 256 * GIB;

/// One `bar-mmap` row per GPU with a stalling BAR when the QEMU given is older than 10.1;
/// nothing when the QEMU version is not known or the VMM is not QEMU.
pub(super) fn check_bar_mmap(gpus: &[&Device], vmm: &VmmFacts) -> Vec<CheckResult> {
    let Some(Ok(v)) = &vmm.qemu_version else {
        return Vec::new();
    };
    if vmm.vmm != Vmm::Qemu || (v.major, v.minor) >= (10, 1) {
        return Vec::new();
    }
    gpus.iter()
        .filter_map(|g| {
            let largest = g.bars.iter().map(|b| b.size).max()?;
            (largest >= STALLING_BAR).then(|| {
                result(
                    "bar-mmap",
                    Some(g.bdf.to_string()),
                    Status::Warn,
                    format!(
                        "a {} GiB BAR and QEMU {v}: QEMU before 10.1 stalls the guest's boot for minutes mapping it",
                        largest / GIB
                    ),
                    Some(format!(
                        "use QEMU ≥ 10.1, or add `x-no-mmap=on` to {}'s vfio-pci device (its BAR accesses are then trapped)",
                        g.bdf
                    )),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::Topology;
    use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    fn gpu_with_bar(gib: u64) -> Topology {
        let mut b = HostBuilder::new("bar host");
        let hb = b.host_bridge(0, 0x40);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        // B200 (10de:2901)
        b.endpoint(
            Attach::Below(rp),
            0,
            &EndpointSpec::gpu(0x10de, 0x2901, gib),
            None,
        );
        Topology::from_record(&b.build())
    }

    fn qemu(version: &str) -> VmmFacts {
        VmmFacts {
            qemu_version: Some(
                vfio_p2p_read::vmm::parse_qemu_version(version)
                    .ok_or_else(|| "unparsed".to_string()),
            ),
            ..VmmFacts::default()
        }
    }

    #[test]
    fn a_b200_bar_warns_before_qemu_10_1_only() {
        let t = gpu_with_bar(256);
        let gpus: Vec<&Device> = t.gpus().collect();
        let r = check_bar_mmap(&gpus, &qemu("QEMU emulator version 10.0.3"));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].status, Status::Warn);
        assert!(
            r[0].fix.as_ref().unwrap().contains("x-no-mmap=on"),
            "{:?}",
            r[0].fix
        );
        assert!(check_bar_mmap(&gpus, &qemu("QEMU emulator version 10.1.0")).is_empty());
        // Hopper's 128 GiB BAR boots in seconds
        let t = gpu_with_bar(128);
        let gpus: Vec<&Device> = t.gpus().collect();
        assert!(check_bar_mmap(&gpus, &qemu("QEMU emulator version 8.2.2")).is_empty());
    }
}
