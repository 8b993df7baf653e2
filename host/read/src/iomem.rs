//! `/proc/iomem`: the GPU memory a Grace host's `nvidia` driver onlined. The driver adds it
//! as driver-managed memory, which the kernel names "System RAM (<driver>)"
//! (`add_memory_driver_managed()`, mm/memory_hotplug.c); before the GPU goes to
//! nvgrace_gpu_vfio_pci that memory must be offline, its ranges gone from the file.

use std::path::Path;

use vfio_p2p_files::read_input_file;
use vfio_p2p_model::host_facts::NodeProbe;

/// The resource name of the GPU memory `nvidia` onlined.
pub const NVIDIA_SYSTEM_RAM: &str = "System RAM (NVIDIA)";

/// `/proc/iomem` is a few KiB; more is not that file.
const MAX_IOMEM_BYTES: u64 = 4 << 20;

/// The "System RAM (NVIDIA)" ranges of `ROOT/proc/iomem`.
pub fn nvidia_system_ram(root: &Path) -> NodeProbe<Vec<(u64, u64)>> {
    let path = root.join("proc/iomem");
    if !path.exists() {
        return NodeProbe::Absent(path.display().to_string());
    }
    match read_input_file(&path, MAX_IOMEM_BYTES, "/proc/iomem") {
        Ok(bytes) => NodeProbe::Ok(ranges_named(
            &String::from_utf8_lossy(&bytes),
            NVIDIA_SYSTEM_RAM,
        )),
        Err(e) => NodeProbe::Error(format!("{}: {e}", path.display())),
    }
}

/// The ranges of the resources called `name`, at any depth (`start-end : name` lines;
/// an unprivileged read shows zeros, still one range per resource).
pub fn ranges_named(text: &str, name: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let (range, n) = l.trim().split_once(" : ")?;
            if n.trim() != name {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_ram_is_found_and_other_ram_is_not() {
        let text = "80000000-fffbffff : System RAM\n  80010000-8158ffff : Kernel code\n\
                    400000000000-40177fffffff : System RAM (NVIDIA)\n";
        assert_eq!(
            ranges_named(text, NVIDIA_SYSTEM_RAM),
            [(0x4000_0000_0000, 0x4017_7fff_ffff)]
        );
        assert!(ranges_named("80000000-fffbffff : System RAM\n", NVIDIA_SYSTEM_RAM).is_empty());
    }

    #[test]
    fn a_root_without_iomem_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            nvidia_system_ram(dir.path()),
            NodeProbe::Absent(_)
        ));
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/iomem"), "0-0 : System RAM (NVIDIA)\n").unwrap();
        assert_eq!(nvidia_system_ram(dir.path()), NodeProbe::Ok(vec![(0, 0)]));
    }
}
