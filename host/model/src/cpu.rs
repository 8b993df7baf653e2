//! The CPU as `read::cpuinfo` reads it from `/proc/cpuinfo`: its architecture, vendor,
//! family and model, which NCCL's topology file carries on every `<cpu>` node.

use serde::{Deserialize, Serialize};

/// CPU architecture, named as NCCL's `arch` attribute names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuArch {
    #[serde(rename = "x86_64")]
    X86_64,
    #[serde(rename = "arm64")]
    Arm64,
    #[serde(rename = "ppc64")]
    Ppc64,
}

impl CpuArch {
    /// NCCL's spelling (`kvDictCpuArch` in src/graph/topo.cc).
    pub fn nccl_name(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "x86_64",
            CpuArch::Arm64 => "arm64",
            CpuArch::Ppc64 => "ppc64",
        }
    }
}

/// The CPU as `/proc/cpuinfo` describes its first processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIdentity {
    pub arch: CpuArch,
    /// `vendor_id` (x86 only): `GenuineIntel`, `AuthenticAMD`, …
    #[serde(default)]
    pub vendor: Option<String>,
    /// `cpu family` as Linux prints it (base family, plus the extended family when the
    /// base is 0xf).
    #[serde(default)]
    pub family: Option<u32>,
    /// `model` as Linux prints it (base model plus extended model << 4 from family 6 on).
    #[serde(default)]
    pub model: Option<u32>,
    /// The physical address width, from `address sizes : 46 bits physical, …` (x86; arm64
    /// kernels print no such line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_bits: Option<u8>,
}
