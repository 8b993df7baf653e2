//! Whether the guest's RAM and its 64-bit PCI MMIO window fit its physical address space,
//! as QEMU (q35) and OVMF lay them out, and the largest RAM that does.
//!
//! The facts, from edk2's OvmfPkg/Library/PlatformInitLib/MemDetect.c (tianocore/edk2 at
//! 0d5afd18) and QEMU's q35 machine:
//! - q35 keeps 2 GiB of RAM below 4 GiB once the guest has 2.75 GiB or more, the rest from
//!   4 GiB up: RAM ends at `RAM + 2 GiB`.
//! - OVMF reads the CPU's physical address width (CPUID 0x80000008) and trusts it when it
//!   is 41 bits or more (QEMU answers 40 whatever the host has unless `host-phys-bits=on`
//!   or `phys-bits=` is given: "for historical reasons qemu returns phys-bits=40 by
//!   default"); it uses at most 46 bits.
//! - With the width known, a window smaller than 1/8 of the address space is replaced by
//!   one of exactly 1/8 at the top ("dynamic mmio window"); otherwise ("classic") the
//!   window starts above RAM, aligned to 1 GiB and then to its size rounded down to a
//!   power of two.
//! - With the width not trusted, OVMF takes the smallest width that holds RAM and window,
//!   but the guest's CPUID still says 40 bits: a window ending above 1 TiB is outside what
//!   the guest kernel can address, and the devices in it are lost.
//! - On an AMD vCPU (`-cpu host` on an AMD host), q35 since QEMU 7.1 moves the RAM above
//!   4 GiB to start at 1 TiB when its layout (RAM, then QEMU's 64-bit hole) would reach the
//!   HyperTransport range below 1 TiB (hw/i386/pc.c, `AMD_HT_START` 0xfd00000000); QEMU then
//!   refuses to start when that layout passes the guest's width ("phys-bits too low"). Seen
//!   in the lab: at 40 bits QEMU 7.2 refused from 979 GiB on an AMD vCPU.

use serde::Serialize;
use vfio_p2p_model::CpuIdentity;

const GIB: u64 = 1 << 30;
/// Where the HyperTransport range starts on AMD hosts: RAM must not reach it.
const AMD_HT_START: u64 = 0xfd_0000_0000;
/// Where q35 puts the RAM above 4 GiB on an AMD vCPU whose layout would reach it.
const AMD_ABOVE_1TIB: u64 = 1 << 40;

/// The guest CPU's vendor, which moves q35's RAM on AMD (`-cpu host`: the host's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestVendor {
    Amd,
    Other,
}

impl GuestVendor {
    /// The host CPU's vendor, given to the guest by `-cpu host`; unknown counts as other.
    pub fn of(cpu: Option<&CpuIdentity>) -> GuestVendor {
        match cpu.and_then(|c| c.vendor.as_deref()) {
            Some("AuthenticAMD") | Some("HygonGenuine") => GuestVendor::Amd,
            _ => GuestVendor::Other,
        }
    }
}

/// QEMU's guest address width without `host-phys-bits=on` or `phys-bits=`.
pub const QEMU_DEFAULT_PHYS_BITS: u8 = 40;
/// The most OVMF uses (it avoids 5-level paging).
pub const OVMF_MAX_PHYS_BITS: u8 = 46;

/// Where OVMF puts the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// 1/8 of the address space, at its top.
    Dynamic,
    /// Above RAM, naturally aligned.
    Classic,
}

/// The guest's address space for one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AddressPlan {
    /// The guest's physical address bits (the host's: `host-phys-bits=on`).
    pub phys_bits: u8,
    pub placement: Placement,
    pub ram_end: u64,
    pub window_base: u64,
    pub window_size: u64,
    /// Whether RAM and window fit below `2^phys_bits`.
    pub fits: bool,
    /// The largest RAM (whole GiB) that fits with this window; 0 when the window alone
    /// does not.
    pub largest_ram: u64,
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// The largest power of two ≤ `v` (`v` > 0).
fn pow2_floor(v: u64) -> u64 {
    1 << (63 - v.leading_zeros())
}

/// Where q35's RAM ends: 2 GiB of it below 4 GiB, the rest from 4 GiB, or from 1 TiB on an
/// AMD vCPU whose RAM and QEMU's 64-bit hole (`window`, as gen sizes it) would reach the
/// HyperTransport range.
fn ram_end(ram: u64, window: u64, vendor: GuestVendor) -> u64 {
    let above_4g = ram.max(3 * GIB) - 2 * GIB;
    let end = 4 * GIB + above_4g;
    match vendor {
        GuestVendor::Amd if align_up(end, GIB) + window > AMD_HT_START => AMD_ABOVE_1TIB + above_4g,
        _ => end,
    }
}

/// Where RAM ends and the window goes for `ram` bytes of RAM and a `window`-byte window
/// (whole GiB) in `bits` bits, and whether they fit.
fn layout(
    ram: u64,
    window: u64,
    bits: u8,
    vendor: GuestVendor,
) -> (Placement, u64, u64, u64, bool) {
    let space = 1u64 << bits;
    let eighth = space >> 3;
    let end = align_up(ram_end(ram, window, vendor), GIB);
    let (classic_base, classic_fits) = classic(end, window, space);
    // OVMF's condition for the dynamic window: smaller than 1/8, and 1/8 above the classic
    // base still below the top
    if window < eighth && classic_base + eighth < space {
        return (Placement::Dynamic, end, space - eighth, eighth, true);
    }
    (Placement::Classic, end, classic_base, window, classic_fits)
}

/// OVMF's classic window above RAM ending at `end`: its base (aligned to the window rounded
/// down to a power of two) and whether it ends within `space`.
fn classic(end: u64, window: u64, space: u64) -> (u64, bool) {
    let base = align_up(end, pow2_floor(window));
    (base, base.checked_add(window).is_some_and(|e| e <= space))
}

/// The largest RAM (whole GiB, at least 3) that fits; 0 when none does. RAM's end only grows
/// with RAM, so whether it fits only turns from yes to no: a bisection.
fn largest_fitting_ram(window: u64, bits: u8, vendor: GuestVendor) -> u64 {
    let fits = |gib: u64| layout(gib * GIB, window, bits, vendor).4;
    if !fits(3) {
        return 0;
    }
    let (mut lo, mut hi) = (3, 1u64 << (bits - 30));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid
        } else {
            hi = mid
        }
    }
    lo * GIB
}

/// The plan for `ram` bytes of RAM and a `window`-byte 64-bit window on a host whose CPU
/// has `host_bits` physical address bits, with the guest given the host's width and CPU.
pub fn plan(ram: u64, window: u64, host_bits: u8, vendor: GuestVendor) -> AddressPlan {
    let bits = host_bits.min(OVMF_MAX_PHYS_BITS);
    let window = align_up(window.max(GIB), GIB);
    let (placement, ram_end, window_base, window_size, fits) = layout(ram, window, bits, vendor);
    AddressPlan {
        phys_bits: bits,
        placement,
        ram_end,
        window_base,
        window_size,
        fits,
        largest_ram: largest_fitting_ram(window, bits, vendor),
    }
}

/// Whether QEMU's default 40-bit guest keeps the window: the naive layout (no
/// `host-phys-bits`), where OVMF places it above RAM and the guest addresses 1 TiB.
pub fn fits_qemu_default(ram: u64, window: u64, vendor: GuestVendor) -> bool {
    let window = align_up(window.max(GIB), GIB);
    let end = align_up(ram_end(ram, window, vendor), GIB);
    classic(end, window, 1u64 << QEMU_DEFAULT_PHYS_BITS).1
}

/// The fix for a VM whose RAM and window do not fit: the largest RAM that does, or fewer
/// GPUs when the window alone is too wide.
pub fn refusal_fix(p: &AddressPlan) -> String {
    match p.largest_ram {
        0 => "fewer GPUs in this VM: their window alone exceeds the address space".to_string(),
        l => format!(
            "at most {} GiB of RAM for this VM (memory_mib: {}), or fewer GPUs",
            l / GIB,
            l >> 20
        ),
    }
}

/// The narrowest width Cloud Hypervisor is given: QEMU's long-standing default.
const MIN_GUEST_PHYS_BITS: u8 = QEMU_DEFAULT_PHYS_BITS;

/// The address space decided for one VM, which every emitter renders: the guest gets the
/// host's width (QEMU `host-phys-bits=on`, libvirt `<maxphysaddr mode='passthrough'/>`,
/// Proxmox `phys-bits=host`), and Cloud Hypervisor a fixed width that holds RAM and window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestAddressSpace {
    /// The plan on the host's width; `None` where the host's width is unknown (an example
    /// or a snapshot without `address sizes`), which nothing can then be refused on.
    pub plan: Option<AddressPlan>,
    /// Cloud Hypervisor's `--cpus max_phys_bits`: the narrowest width from 40 up in which RAM
    /// and window fit (CH gives the guest the smaller of it and the host's).
    pub max_phys_bits: u8,
    /// Whether QEMU's default 40 bits would keep the window too ([`fits_qemu_default`]).
    pub fits_qemu_default: bool,
}

/// RAM and window do not fit the host's width: the refusal `gen` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} GiB of RAM and the {} GiB 64-bit MMIO window the GPUs' BARs need do not fit the guest's {}-bit physical address space ({} GiB; the host CPU has {host_bits} bits): {}", .ram / GIB, .window / GIB, .plan.phys_bits, (1u64 << .plan.phys_bits) / GIB, refusal_fix(.plan))]
pub struct DoesNotFit {
    pub ram: u64,
    pub window: u64,
    pub host_bits: u8,
    pub plan: AddressPlan,
}

/// The address space of a VM with `ram` bytes of RAM and a `window`-byte 64-bit window on a
/// host whose CPU has `host_bits` physical address bits (`None`: unknown), or the refusal.
pub fn for_vm(
    ram: u64,
    window: u64,
    host_bits: Option<u8>,
    vendor: GuestVendor,
) -> Result<GuestAddressSpace, DoesNotFit> {
    // Cloud Hypervisor keeps its RAM above 4 GiB in one piece, whatever the vendor
    let needed = (MIN_GUEST_PHYS_BITS..=OVMF_MAX_PHYS_BITS)
        .find(|&b| plan(ram, window, b, GuestVendor::Other).fits)
        .unwrap_or(OVMF_MAX_PHYS_BITS);
    let Some(host_bits) = host_bits else {
        return Ok(GuestAddressSpace {
            plan: None,
            max_phys_bits: needed,
            fits_qemu_default: fits_qemu_default(ram, window, vendor),
        });
    };
    let p = plan(ram, window, host_bits, vendor);
    if !p.fits {
        return Err(DoesNotFit {
            ram,
            window,
            host_bits,
            plan: p,
        });
    }
    Ok(GuestAddressSpace {
        max_phys_bits: needed.min(p.phys_bits),
        plan: Some(p),
        fits_qemu_default: fits_qemu_default(ram, window, vendor),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIB: u64 = 1 << 40;

    /// 8 H100s (2080 GiB window) on a 46-bit host: the window is under 1/8 of 64 TiB,
    /// so OVMF puts 8 TiB at the top; past 54 TiB of RAM it goes classic, above RAM,
    /// 2 TiB-aligned, which holds up to 60 TiB − 2 GiB.
    #[test]
    fn a_46_bit_host_takes_the_dynamic_window() {
        let p = plan(2 * TIB, 2080 * GIB, 46, GuestVendor::Other);
        assert_eq!(p.placement, Placement::Dynamic);
        assert_eq!((p.window_base, p.window_size), (56 * TIB, 8 * TIB));
        assert!(p.fits);
        assert_eq!(p.largest_ram, 60 * TIB - 2 * GIB);
        assert_eq!(
            plan(55 * TIB, 2080 * GIB, 46, GuestVendor::Other).placement,
            Placement::Classic
        );
        assert!(plan(60 * TIB - 2 * GIB, 2080 * GIB, 46, GuestVendor::Other).fits);
        assert!(!plan(60 * TIB, 2080 * GIB, 46, GuestVendor::Other).fits);
        // and a host CPU wider than OVMF's 46 bits changes nothing
        assert_eq!(plan(2 * TIB, 2080 * GIB, 52, GuestVendor::Other), p);
    }

    /// A 39-bit host (512 GiB): a 2080 GiB window cannot fit at all.
    #[test]
    fn a_window_wider_than_the_space_fits_no_ram() {
        let p = plan(64 * GIB, 2080 * GIB, 39, GuestVendor::Other);
        assert_eq!(p.placement, Placement::Classic);
        assert!(!p.fits);
        assert_eq!(p.largest_ram, 0);
    }

    /// 42 bits (4 TiB): a 1056 GiB window (4 H100s) is classic, aligned to 1 TiB above RAM.
    #[test]
    fn classic_window_is_aligned_above_ram_and_refused_past_the_top() {
        let p = plan(512 * GIB, 1056 * GIB, 42, GuestVendor::Other);
        assert_eq!(p.placement, Placement::Classic);
        assert_eq!(p.window_base, TIB);
        assert!(p.fits);
        // the highest 1 TiB-aligned base leaving 1056 GiB below 4 TiB is 2 TiB
        assert_eq!(p.largest_ram, 2 * TIB - 2 * GIB);
        assert!(!plan(2 * TIB, 1056 * GIB, 42, GuestVendor::Other).fits);
        assert!(plan(2 * TIB - 2 * GIB, 1056 * GIB, 42, GuestVendor::Other).fits);
    }

    /// QEMU's default 40 bits lose a window that ends above 1 TiB; the host's width keeps it.
    #[test]
    fn the_naive_layout_loses_what_ours_keeps() {
        assert!(fits_qemu_default(64 * GIB, 288 * GIB, GuestVendor::Other));
        assert!(!fits_qemu_default(768 * GIB, 288 * GIB, GuestVendor::Other));
        assert!(plan(768 * GIB, 288 * GIB, 46, GuestVendor::Other).fits);
    }

    /// gen's decision: refused exactly past the largest RAM the plan names (41 bits, two
    /// H100s' 544 GiB window), with that RAM in the message; Cloud Hypervisor gets the
    /// narrowest width from 40 up that holds RAM and window; an unknown width refuses nothing.
    #[test]
    fn gen_refuses_past_the_largest_ram_and_sizes_cloud_hypervisor() {
        let largest = plan(64 * GIB, 544 * GIB, 41, GuestVendor::Other).largest_ram;
        assert_eq!(largest, 1022 * GIB);
        let ok = for_vm(largest, 544 * GIB, Some(41), GuestVendor::Other).unwrap();
        assert_eq!((ok.max_phys_bits, ok.plan.unwrap().phys_bits), (41, 41));
        let e = for_vm(largest + GIB, 544 * GIB, Some(41), GuestVendor::Other).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("at most 1022 GiB of RAM for this VM (memory_mib: 1046528)"),
            "{text}"
        );
        assert!(
            text.contains("41-bit physical address space (2048 GiB"),
            "{text}"
        );
        assert!(for_vm(64 * GIB, 2080 * GIB, Some(39), GuestVendor::Other)
            .unwrap_err()
            .to_string()
            .contains("fewer GPUs in this VM"));
        assert_eq!(
            for_vm(16 * GIB, 416 * GIB, Some(52), GuestVendor::Other)
                .unwrap()
                .max_phys_bits,
            40
        );
        assert_eq!(
            for_vm(768 * GIB, 288 * GIB, Some(46), GuestVendor::Other)
                .unwrap()
                .max_phys_bits,
            41
        );
        let unknown = for_vm(60 * TIB, 2080 * GIB, None, GuestVendor::Other).unwrap();
        assert_eq!((unknown.plan, unknown.max_phys_bits), (None, 46));
    }

    /// QEMU 7.2 on an AMD vCPU at 40 bits (the lab, stage address-space): RAM moves to 1 TiB
    /// once RAM and the hole reach 1012 GiB, and then nothing fits; Intel keeps RAM at 4 GiB.
    /// A 32 GiB hole (QEMU's default, one small BAR): QEMU refused from 979 GiB.
    #[test]
    fn an_amd_guest_moves_ram_above_1_tib_at_the_hypertransport_range() {
        let amd = GuestVendor::Amd;
        assert_eq!(plan(978 * GIB, 32 * GIB, 40, amd).ram_end, 980 * GIB);
        assert!(plan(978 * GIB, 32 * GIB, 40, amd).fits);
        let moved = plan(979 * GIB, 32 * GIB, 40, amd);
        assert_eq!(moved.ram_end, TIB + 977 * GIB);
        assert!(!moved.fits);
        assert_eq!(moved.largest_ram, 978 * GIB);
        assert!(plan(979 * GIB, 32 * GIB, 40, GuestVendor::Other).fits);
        assert!(plan(979 * GIB, 32 * GIB, 40, GuestVendor::Other).largest_ram > 978 * GIB);
        // wide enough, the moved RAM fits: 2000 GiB at 46 bits ends at 1 TiB + 1998 GiB
        let wide = plan(2000 * GIB, 32 * GIB, 46, amd);
        assert_eq!(wide.ram_end, TIB + 1998 * GIB);
        assert!(wide.fits);
        assert!(!fits_qemu_default(979 * GIB, 32 * GIB, amd));
        assert!(fits_qemu_default(979 * GIB, 32 * GIB, GuestVendor::Other));
    }

    #[test]
    fn the_vendor_is_the_hosts() {
        let cpu = |v: &str| CpuIdentity {
            arch: vfio_p2p_model::CpuArch::X86_64,
            vendor: Some(v.into()),
            family: None,
            model: None,
            phys_bits: None,
        };
        assert_eq!(
            GuestVendor::of(Some(&cpu("AuthenticAMD"))),
            GuestVendor::Amd
        );
        assert_eq!(
            GuestVendor::of(Some(&cpu("GenuineIntel"))),
            GuestVendor::Other
        );
        assert_eq!(GuestVendor::of(None), GuestVendor::Other);
    }
}
