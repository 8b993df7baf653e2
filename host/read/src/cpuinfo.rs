//! `/proc/cpuinfo`: the CPU's architecture, vendor, family and model, which NCCL's
//! topology file carries on every `<cpu>` node (NCCL 2.28.9 refuses a file without
//! `arch`: "Attribute arch of node cpu not found"). Facts as the kernel prints them;
//! `emit::nccl` turns them into NCCL's numbers.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use vfio_p2p_model::{CpuArch, CpuIdentity};

/// The first processor block is all that is read: a 512-CPU host prints about 800 kB.
const READ_LIMIT: u64 = 64 << 10;

/// The CPU described by cpuinfo text, or `None` when no architecture can be told.
pub fn parse(text: &str) -> Option<CpuIdentity> {
    let mut vendor = None;
    let mut family = None;
    let mut model = None;
    let mut phys_bits = None;
    let mut x86 = false;
    let mut arm = false;
    let mut power = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            // End of the first processor block.
            if x86 || arm || power {
                break;
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "vendor_id" => {
                x86 = true;
                vendor = (!value.is_empty()).then(|| value.to_string());
            }
            "cpu family" => family = value.parse().ok(),
            "model" => model = value.parse().ok(),
            "CPU implementer" => arm = true,
            "address sizes" => {
                phys_bits = value
                    .split_once(" bits physical")
                    .and_then(|(n, _)| n.trim().parse().ok())
            }
            "cpu" if value.starts_with("POWER") => power = true,
            _ => {}
        }
    }
    let arch = if x86 {
        CpuArch::X86_64
    } else if arm {
        CpuArch::Arm64
    } else if power {
        CpuArch::Ppc64
    } else {
        return None;
    };
    if arch != CpuArch::X86_64 {
        (family, model) = (None, None);
    }
    Some(CpuIdentity {
        arch,
        vendor,
        family,
        model,
        phys_bits,
    })
}

/// Reads `path` (a `proc/cpuinfo`): `Ok(None)` when it does not exist, an error naming
/// it when it cannot be read or says nothing of the architecture. Regular files only,
/// opened without blocking, at most the first 64 kB.
pub fn read(path: &Path) -> Result<Option<CpuIdentity>, String> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(format!(
                "{} is not a regular file; give a copy of /proc/cpuinfo",
                path.display()
            ))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    let mut bytes = Vec::new();
    file.take(READ_LIMIT)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&String::from_utf8_lossy(&bytes))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{}: no vendor_id, CPU implementer or POWER cpu line in the first processor \
                 block; give a copy of /proc/cpuinfo",
                path.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTEL: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: INTEL(R) XEON(R) PLATINUM 8568Y+\naddress sizes\t: 46 bits physical, 57 bits virtual\n\nprocessor\t: 1\nvendor_id\t: Other\n";
    const AMD: &str =
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n";
    const ARM: &str =
        "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n";
    const POWER: &str = "processor\t: 0\ncpu\t\t: POWER9, altivec supported\n";

    #[test]
    fn first_block_of_each_architecture() {
        let i = parse(INTEL).unwrap();
        assert_eq!(
            i,
            CpuIdentity {
                arch: CpuArch::X86_64,
                vendor: Some("GenuineIntel".into()),
                family: Some(6),
                model: Some(207),
                phys_bits: Some(46),
            }
        );
        let a = parse(AMD).unwrap();
        assert_eq!((a.family, a.model, a.phys_bits), (Some(25), Some(17), None));
        assert_eq!(parse(ARM).unwrap().arch, CpuArch::Arm64);
        assert_eq!(parse(ARM).unwrap().vendor, None);
        assert_eq!(parse(POWER).unwrap().arch, CpuArch::Ppc64);
        assert_eq!(parse("nonsense\n\n:::\n"), None);
    }

    #[test]
    fn files_missing_unreadable_or_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("none")), Ok(None));
        let empty = dir.path().join("cpuinfo");
        std::fs::write(&empty, "").unwrap();
        assert!(read(&empty).unwrap_err().contains("cpuinfo"));
        assert!(read(dir.path()).unwrap_err().contains("not a regular file"));
        std::fs::write(&empty, INTEL).unwrap();
        assert_eq!(read(&empty).unwrap().unwrap().model, Some(207));
    }
}
