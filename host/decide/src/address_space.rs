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

use serde::Serialize;

const GIB: u64 = 1 << 30;

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

/// RAM ends 2 GiB above its size on q35 (2 GiB below 4 GiB, the rest from 4 GiB).
fn ram_end(ram: u64) -> u64 {
    ram.max(3 * GIB) + 2 * GIB
}

/// The plan for `ram` bytes of RAM and a `window`-byte 64-bit window on a host whose CPU
/// has `host_bits` physical address bits, with the guest given the host's width.
pub fn plan(ram: u64, window: u64, host_bits: u8) -> AddressPlan {
    let bits = host_bits.min(OVMF_MAX_PHYS_BITS);
    let space = 1u64 << bits;
    let eighth = space >> 3;
    let end = align_up(ram_end(ram), GIB);
    let window = align_up(window.max(GIB), GIB);
    let align = pow2_floor(window);
    let classic_base = align_up(end, align);
    // the highest RAM whose classic base is at most `top` (whole GiB; 0 when none)
    let ram_below = |top: Option<u64>| {
        top.map(|t| t / align * align)
            .filter(|b| *b >= 5 * GIB)
            .map_or(0, |b| (b - 2 * GIB) / GIB * GIB)
    };
    let largest_classic = ram_below(space.checked_sub(window));
    let largest_ram = match window < eighth {
        true => largest_classic.max(ram_below(Some(space - eighth - 1))),
        false => largest_classic,
    };
    // OVMF's condition for the dynamic window: smaller than 1/8, and 1/8 above the classic
    // base still below the top
    if window < eighth && classic_base + eighth < space {
        return AddressPlan {
            phys_bits: bits,
            placement: Placement::Dynamic,
            ram_end: end,
            window_base: space - eighth,
            window_size: eighth,
            fits: true,
            largest_ram,
        };
    }
    AddressPlan {
        phys_bits: bits,
        placement: Placement::Classic,
        ram_end: end,
        window_base: classic_base,
        window_size: window,
        fits: classic_base.checked_add(window).is_some_and(|e| e <= space),
        largest_ram,
    }
}

/// Whether QEMU's default 40-bit guest keeps the window: the naive layout (no
/// `host-phys-bits`), where OVMF places it above RAM and the guest addresses 1 TiB.
pub fn fits_qemu_default(ram: u64, window: u64) -> bool {
    let window = align_up(window.max(GIB), GIB);
    let base = align_up(align_up(ram_end(ram), GIB), pow2_floor(window));
    base + window <= 1u64 << QEMU_DEFAULT_PHYS_BITS
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
) -> Result<GuestAddressSpace, DoesNotFit> {
    let needed = (MIN_GUEST_PHYS_BITS..=OVMF_MAX_PHYS_BITS)
        .find(|&b| plan(ram, window, b).fits)
        .unwrap_or(OVMF_MAX_PHYS_BITS);
    let Some(host_bits) = host_bits else {
        return Ok(GuestAddressSpace {
            plan: None,
            max_phys_bits: needed,
            fits_qemu_default: fits_qemu_default(ram, window),
        });
    };
    let p = plan(ram, window, host_bits);
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
        fits_qemu_default: fits_qemu_default(ram, window),
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
        let p = plan(2 * TIB, 2080 * GIB, 46);
        assert_eq!(p.placement, Placement::Dynamic);
        assert_eq!((p.window_base, p.window_size), (56 * TIB, 8 * TIB));
        assert!(p.fits);
        assert_eq!(p.largest_ram, 60 * TIB - 2 * GIB);
        assert_eq!(plan(55 * TIB, 2080 * GIB, 46).placement, Placement::Classic);
        assert!(plan(60 * TIB - 2 * GIB, 2080 * GIB, 46).fits);
        assert!(!plan(60 * TIB, 2080 * GIB, 46).fits);
        // and a host CPU wider than OVMF's 46 bits changes nothing
        assert_eq!(plan(2 * TIB, 2080 * GIB, 52), p);
    }

    /// A 39-bit host (512 GiB): a 2080 GiB window cannot fit at all.
    #[test]
    fn a_window_wider_than_the_space_fits_no_ram() {
        let p = plan(64 * GIB, 2080 * GIB, 39);
        assert_eq!(p.placement, Placement::Classic);
        assert!(!p.fits);
        assert_eq!(p.largest_ram, 0);
    }

    /// 42 bits (4 TiB): a 1056 GiB window (4 H100s) is classic, aligned to 1 TiB above RAM.
    #[test]
    fn classic_window_is_aligned_above_ram_and_refused_past_the_top() {
        let p = plan(512 * GIB, 1056 * GIB, 42);
        assert_eq!(p.placement, Placement::Classic);
        assert_eq!(p.window_base, TIB);
        assert!(p.fits);
        // the highest 1 TiB-aligned base leaving 1056 GiB below 4 TiB is 2 TiB
        assert_eq!(p.largest_ram, 2 * TIB - 2 * GIB);
        assert!(!plan(2 * TIB, 1056 * GIB, 42).fits);
        assert!(plan(2 * TIB - 2 * GIB, 1056 * GIB, 42).fits);
    }

    /// QEMU's default 40 bits lose a window that ends above 1 TiB; the host's width keeps it.
    #[test]
    fn the_naive_layout_loses_what_ours_keeps() {
        assert!(fits_qemu_default(64 * GIB, 288 * GIB));
        assert!(!fits_qemu_default(768 * GIB, 288 * GIB));
        assert!(plan(768 * GIB, 288 * GIB, 46).fits);
    }

    /// gen's decision: refused exactly past the largest RAM the plan names (41 bits, two
    /// H100s' 544 GiB window), with that RAM in the message; Cloud Hypervisor gets the
    /// narrowest width from 40 up that holds RAM and window; an unknown width refuses nothing.
    #[test]
    fn gen_refuses_past_the_largest_ram_and_sizes_cloud_hypervisor() {
        let largest = plan(64 * GIB, 544 * GIB, 41).largest_ram;
        assert_eq!(largest, 1022 * GIB);
        let ok = for_vm(largest, 544 * GIB, Some(41)).unwrap();
        assert_eq!((ok.max_phys_bits, ok.plan.unwrap().phys_bits), (41, 41));
        let e = for_vm(largest + GIB, 544 * GIB, Some(41)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("at most 1022 GiB of RAM for this VM (memory_mib: 1046528)"),
            "{text}"
        );
        assert!(
            text.contains("41-bit physical address space (2048 GiB"),
            "{text}"
        );
        assert!(for_vm(64 * GIB, 2080 * GIB, Some(39))
            .unwrap_err()
            .to_string()
            .contains("fewer GPUs in this VM"));
        assert_eq!(
            for_vm(16 * GIB, 416 * GIB, Some(52)).unwrap().max_phys_bits,
            40
        );
        assert_eq!(
            for_vm(768 * GIB, 288 * GIB, Some(46))
                .unwrap()
                .max_phys_bits,
            41
        );
        let unknown = for_vm(60 * TIB, 2080 * GIB, None).unwrap();
        assert_eq!((unknown.plan, unknown.max_phys_bits), (None, 46));
    }
}
