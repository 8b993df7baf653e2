//! Whether the VM's RAM and 64-bit MMIO window fit the guest's physical address space
//! (`crate::address_space`): the host's width given to the guest, OVMF's placement, and
//! what QEMU's default 40 bits would do.

use super::facts::VmmFacts;
use super::report::{result, CheckResult, Status};
use crate::address_space::{
    fits_qemu_default, plan, refusal_fix, GuestVendor, Placement, QEMU_DEFAULT_PHYS_BITS,
};
use crate::mmio;
use vfio_p2p_model::{Device, Topology};

const GIB: u64 = 1 << 30;

/// How each VMM gives the guest the host's physical address width.
pub const HOST_BITS_FIX: &str = "QEMU: `-cpu host,host-phys-bits=on`; libvirt: \
    `<cpu mode='host-passthrough'><maxphysaddr mode='passthrough'/></cpu>`; Proxmox: \
    `cpu: host,phys-bits=host`; Cloud Hypervisor: `--cpus max_phys_bits=N` at least the bits below";

/// The `address-space` row, when the VM's RAM is known (`--memory-gib`).
pub(super) fn check_address_space(
    topo: &Topology,
    gpus: &[&Device],
    vmm: &VmmFacts,
) -> Option<CheckResult> {
    let ram = vmm.ram?;
    let window = mmio::hole64_size(gpus);
    let Some(bits) = topo.cpu.as_ref().and_then(|c| c.phys_bits) else {
        return Some(result(
            "address-space",
            None,
            Status::Warn,
            format!("{} GiB RAM and a {} GiB 64-bit window; the host's physical address width is unknown (no `address sizes` in /proc/cpuinfo)", ram / GIB, window / GIB),
            Some("run check on the host itself (an arm64 or captured host does not say)".into()),
        ));
    };
    let vendor = GuestVendor::of(topo.cpu.as_ref());
    let p = plan(ram, window, bits, vendor);
    let placed = match p.placement {
        Placement::Dynamic => "OVMF's dynamic window, the top eighth",
        Placement::Classic => "above RAM",
    };
    let saw = format!(
        "{} GiB RAM (ends at {} GiB) and a {} GiB window {placed} at {}–{} GiB, in {} bits ({} GiB; host {bits}); the largest RAM that fits: {} GiB",
        ram / GIB,
        p.ram_end / GIB,
        window / GIB,
        p.window_base / GIB,
        (p.window_base + p.window_size) / GIB,
        p.phys_bits,
        (1u64 << p.phys_bits) / GIB,
        p.largest_ram / GIB
    );
    Some(if !p.fits {
        result(
            "address-space",
            None,
            Status::Fail,
            format!("{saw}: it does not fit"),
            Some(refusal_fix(&p)),
        )
    } else if !fits_qemu_default(ram, window, vendor) {
        result(
            "address-space",
            None,
            Status::Warn,
            format!("{saw}; a named CPU model's {QEMU_DEFAULT_PHYS_BITS} bits (QEMU's default without host-phys-bits; libvirt's host-model) would leave the window above what the guest addresses: QEMU 7.1+ refuses to start, older ones lose its GPUs"),
            Some(format!("give the guest the host's width: {HOST_BITS_FIX}")),
        )
    } else {
        result("address-space", None, Status::Pass, saw, None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_read::synth;

    fn host(bits: Option<u8>) -> Topology {
        let mut h = synth::example("hgx-h100").unwrap();
        if let Some(c) = h.cpu.as_mut() {
            c.phys_bits = bits;
        }
        Topology::from_record(&h)
    }

    fn vm(ram_gib: u64) -> VmmFacts {
        VmmFacts {
            ram: Some(ram_gib * GIB),
            ..VmmFacts::default()
        }
    }

    /// One H100 (a 288 GiB window): 64 GiB of RAM fits even QEMU's default 40 bits, 768
    /// GiB fits 46 bits but not 40; 39 bits hold no such window; two H100s (544 GiB) on 41
    /// bits are refused past 1022 GiB of RAM.
    #[test]
    fn fits_warns_for_the_default_and_refuses_with_the_largest_ram() {
        let t = host(Some(46));
        let gpus: Vec<&Device> = t.gpus().take(1).collect();
        let r = check_address_space(&t, &gpus, &vm(64)).unwrap();
        assert_eq!(r.status, Status::Pass, "{}", r.saw);
        let r = check_address_space(&t, &gpus, &vm(768)).unwrap();
        assert_eq!(r.status, Status::Warn, "{}", r.saw);
        assert!(r.fix.unwrap().contains("host-phys-bits=on"));
        let t = host(Some(39));
        let gpus: Vec<&Device> = t.gpus().take(1).collect();
        let r = check_address_space(&t, &gpus, &vm(64)).unwrap();
        assert_eq!(r.status, Status::Fail, "{}", r.saw);
        assert_eq!(
            r.fix.as_deref(),
            Some("fewer GPUs in this VM: their window alone exceeds the address space")
        );
        let t = host(Some(41));
        let gpus: Vec<&Device> = t.gpus().take(2).collect();
        let r = check_address_space(&t, &gpus, &vm(1600)).unwrap();
        assert_eq!(r.status, Status::Fail, "{}", r.saw);
        assert!(r.fix.unwrap().starts_with("at most 1022 GiB of RAM"));
        assert!(check_address_space(&t, &gpus, &VmmFacts::default()).is_none());
    }
}
