//! NVIDIA parts known without a capture: NVSwitch chips by PCI device ID, and the SXM
//! GPUs that carry NVLink with how many links each has and on which boards. Shared: the
//! host tool plans and writes NCCL files with it, the agent checks NCCL files with it.
//!
//! Sources: pci.ids (github.com/pciutils/pciids, 2026-08-22) for the GPU names; the
//! NVSwitch driver's own ID lists (NVIDIA/open-gpu-kernel-modules,
//! src/common/nvswitch/kernel/nvswitch.c: `nvswitch_lr10_device_ids`,
//! `nvswitch_ls10_device_ids`); NVIDIA's product pages for NVLink bandwidth (NVLink 2/3/4
//! at 25/50/50 GB/s per link and direction pair, NVLink 5 at 100 GB/s: V100 300 GB/s = 6,
//! A100 600 GB/s = 12, A800/H800 400 GB/s = 8, H100/H200/H20 900 GB/s = 18, Blackwell
//! 1.8 TB/s = 18). Where no public figure gives the count, [`GpuPart::links`] is `None` and
//! the tools say so instead of guessing.

/// NVSwitch generations, by PCI device ID (vendor 0x10de).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvSwitchGen {
    /// First generation (DGX-2 / HGX-2, V100 SXM3): 0x1ac2 as DGX-2 hosts list it
    /// (issue #17; not in pci.ids).
    Sv10,
    /// LR10, second generation (HGX A100): 0x1ae8, 0x1af0–0x1aff.
    Lr10,
    /// LS10, third generation (HGX H100/H200): management endpoints 0x22a0–0x22a7.
    Ls10,
}

impl NvSwitchGen {
    pub fn name(self) -> &'static str {
        match self {
            NvSwitchGen::Sv10 => "NVSwitch gen 1 (DGX-2)",
            NvSwitchGen::Lr10 => "NVSwitch LR10 (A100)",
            NvSwitchGen::Ls10 => "NVSwitch LS10 (H100/H200)",
        }
    }
}

/// The NVSwitch endpoint an NVIDIA device ID is, if any.
pub fn nvswitch_gen(device: u16) -> Option<NvSwitchGen> {
    match device {
        0x1ac2 => Some(NvSwitchGen::Sv10),
        0x1ae8 | 0x1af0..=0x1aff => Some(NvSwitchGen::Lr10),
        0x22a0..=0x22a7 => Some(NvSwitchGen::Ls10),
        _ => None,
    }
}

/// LS10's PCI-PCI bridge functions (Laguna switch function 0, 0x22a8–0x22ab): the
/// PCIe switch in front of an LS10 endpoint, not a GPU path of its own.
pub fn is_nvswitch_bridge(device: u16) -> bool {
    (0x22a8..=0x22ab).contains(&device)
}

/// Boards an SXM part is built into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boards {
    /// NVLinks go to NVSwitches only (DGX-2, HGX 8-GPU Blackwell, NVL72 racks).
    NvSwitch,
    /// NVLinks go GPU to GPU only (DGX-1's hybrid cube mesh).
    Direct,
    /// 8-GPU boards with NVSwitches and 4-GPU boards wired GPU to GPU (HGX A100/H100/H200).
    Either,
}

/// An NVLink-carrying NVIDIA GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPart {
    pub device: u16,
    pub name: &'static str,
    /// NVLinks per GPU; `None` where no public figure says.
    pub links: Option<u8>,
    pub boards: Boards,
}

const fn part(device: u16, name: &'static str, links: Option<u8>, boards: Boards) -> GpuPart {
    GpuPart {
        device,
        name,
        links,
        boards,
    }
}

use Boards::{Direct, Either, NvSwitch};

/// SXM parts by device ID (sorted).
const GPU_PARTS: &[GpuPart] = &[
    part(0x1db1, "V100-SXM2-16GB", Some(6), Direct),
    part(0x1db5, "V100-SXM2-32GB", Some(6), Direct),
    part(0x1db8, "V100-SXM3-32GB", Some(6), NvSwitch),
    part(0x1df5, "V100-SXM2-16GB", Some(6), Direct),
    part(0x20b0, "A100-SXM4-40GB", Some(12), Either),
    part(0x20b2, "A100-SXM4-80GB", Some(12), Either),
    part(0x20b3, "A100-SXM-64GB", Some(12), Either),
    part(0x20bd, "A800-SXM4-40GB", Some(8), Either),
    part(0x20f3, "A800-SXM4-80GB", Some(8), Either),
    part(0x230c, "H20-NVL16", None, NvSwitch),
    part(0x230e, "H20-NVL16", None, NvSwitch),
    part(0x2324, "H800-SXM5", Some(8), Either),
    part(0x2329, "H20", Some(18), Either),
    part(0x232c, "H20-HBM3e", None, Either),
    part(0x2330, "H100-SXM5-80GB", Some(18), Either),
    part(0x2335, "H200-SXM-141GB", Some(18), Either),
    part(0x2337, "H100-SXM5-64GB", Some(18), Either),
    part(0x2338, "H100-SXM5-96GB", Some(18), Either),
    part(0x2339, "H100-SXM5-94GB", Some(18), Either),
    part(0x2901, "B200", Some(18), NvSwitch),
    part(0x2909, "HGX-B200-168GB", Some(18), NvSwitch),
    part(0x2920, "B100", Some(18), NvSwitch),
    part(0x2941, "GB200", Some(18), NvSwitch),
    part(0x29bc, "B100", Some(18), NvSwitch),
    part(0x3182, "B300-SXM6", Some(18), NvSwitch),
    part(0x31c2, "GB300", Some(18), NvSwitch),
    part(0x31c3, "GB300", Some(18), NvSwitch),
];

/// The SXM part an NVIDIA GPU device ID is, if known (binary search: sorted table).
pub fn gpu_part(device: u16) -> Option<&'static GpuPart> {
    GPU_PARTS
        .binary_search_by_key(&device, |p| p.device)
        .ok()
        .map(|i| &GPU_PARTS[i])
}

/// The GPUs of Grace superchips, joined to their Grace CPU by NVLink-C2C rather than by
/// PCIe alone (their memory is the CPU's too, onlined as NUMA nodes without CPUs). Names
/// and IDs from pci.ids: 2342 `GH100 [GH200 120GB / 480GB]`, 2348 `GH100 [GH200 144G
/// HBM3e]`, 2941 `GB100 [HGX GB200]`, 31c2/31c3 `GB110 [GB300]`.
pub fn c2c_superchip(device: u16) -> Option<&'static str> {
    match device {
        0x2342 | 0x2348 => Some("GH200"),
        0x2941 => Some("GB200"),
        0x31c2 | 0x31c3 => Some("GB300"),
        _ => None,
    }
}

/// The 8-GPU board (HGX or DGX) an NVLink-5 GPU sits on, where the fourth-generation
/// NVSwitches are no PCI devices of the host but sit behind the baseboard's ConnectX-7
/// bridge, and the NVLink Subnet Manager (NVLSM) must run beside Fabric Manager (NVIDIA's
/// Fabric Manager user guide, "Systems Using Fourth Generation NVSwitches" and "NVIDIA HGX
/// B200/B300 GPU Baseboard"). IDs from pci.ids: 2901 `GB100 [B200]`, 2909 `GB100 [HGX
/// B200 168GB]`, 2920 `GB100 [TS4 / B100]`, 29bc `GB102 [B100]` (also the guide's lspci
/// sample of that baseboard), 3182 `GB110 [B300 SXM6 AC]`. Grace-Blackwell trays (2941,
/// 31c2, 31c3) are not on the list: their NVLink switches are trays of their own, whose
/// NVOS runs NVLSM, not the compute tray.
pub fn nvlink5_hgx_board(device: u16) -> Option<&'static str> {
    match device {
        0x2901 | 0x2909 => Some("HGX B200"),
        0x2920 | 0x29bc => Some("HGX B100"),
        0x3182 => Some("HGX B300"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        assert!(GPU_PARTS.windows(2).all(|w| w[0].device < w[1].device));
    }

    #[test]
    fn link_counts_of_every_datacenter_generation() {
        for (id, links) in [
            (0x1db8, Some(6)),  // V100 SXM3 (DGX-2)
            (0x1db1, Some(6)),  // V100 SXM2
            (0x20f3, Some(8)),  // A800
            (0x2329, Some(18)), // H20
            (0x230c, None),     // H20 NVL16: not certain
            (0x2901, Some(18)), // B200
            (0x29bc, Some(18)), // B100
            (0x2941, Some(18)), // GB200
            (0x3182, Some(18)), // B300
            (0x31c2, Some(18)), // GB300
            (0x2335, Some(18)), // H200
        ] {
            assert_eq!(gpu_part(id).map(|p| p.links), Some(links), "{id:#06x}");
        }
        // A100 PCIe 80GB is not an SXM part (pci.ids: 20b5 GA100 [A100 PCIe 80GB]).
        assert_eq!(gpu_part(0x20b5), None);
        assert_eq!(gpu_part(0x1db8).unwrap().boards, Boards::NvSwitch);
        assert_eq!(gpu_part(0x1db1).unwrap().boards, Boards::Direct);
    }

    #[test]
    fn nvswitch_ids_of_every_generation() {
        assert_eq!(nvswitch_gen(0x1ac2), Some(NvSwitchGen::Sv10));
        assert_eq!(nvswitch_gen(0x1ae8), Some(NvSwitchGen::Lr10));
        for id in 0x1af0..=0x1aff {
            assert_eq!(nvswitch_gen(id), Some(NvSwitchGen::Lr10), "{id:#x}");
        }
        for id in 0x22a0..=0x22a7 {
            assert_eq!(nvswitch_gen(id), Some(NvSwitchGen::Ls10), "{id:#x}");
        }
        for id in 0x22a8..=0x22ab {
            assert_eq!(nvswitch_gen(id), None, "{id:#x}");
            assert!(is_nvswitch_bridge(id));
        }
        assert_eq!(nvswitch_gen(0x1aef), None);
        assert_eq!(nvswitch_gen(0x22ac), None);
        assert!(!is_nvswitch_bridge(0x22ac));
    }

    #[test]
    fn nvlink5_boards_are_hgx_blackwell_not_grace_trays_or_hopper() {
        for id in [0x2901, 0x2909, 0x2920, 0x29bc, 0x3182] {
            assert!(nvlink5_hgx_board(id).is_some(), "{id:#x}");
        }
        // GB200/GB300 trays (NVLSM on the switch trays), H200, B200's neighbours in pci.ids
        for id in [0x2941, 0x31c2, 0x31c3, 0x2335, 0x2900, 0x3180] {
            assert_eq!(nvlink5_hgx_board(id), None, "{id:#x}");
        }
    }
}
