//! Writes a [`HostRecord`] back out as a sysfs tree that [`crate::read_host`]
//! reads identically: the `vfio-p2p snapshot` output and the test fixture builder.
//!
//! Everything the reader keeps is written in the kernel's own text format, with
//! real relative symlinks (`bus/pci/devices/BDF`, `iommu_group`, `driver`), so a
//! snapshot taken on one machine can be analysed on another with `--sysfs-root DIR`.
//! Writes go only below the target directory, which must be empty or absent.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use vfio_p2p_model::CpuArch;
use vfio_p2p_model::CpuIdentity;
use vfio_p2p_model::DeviceRecord;
use vfio_p2p_model::HostRecord;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{path} is not empty; pass a new or empty directory so that nothing is overwritten")]
    NotEmpty { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `host` as a sysfs tree below `dir` (created if absent; refused if not empty).
/// On failure, whatever was written below `dir` is removed again.
pub fn write_sysfs_tree(host: &HostRecord, dir: &Path) -> Result<(), SnapshotError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(SnapshotError::NotEmpty { path: dir.into() });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(io_err(dir))?
        }
        Err(e) => return Err(io_err(dir)(e)),
    }
    let written = TreeWriter { root: dir }.write(host);
    if written.is_err() {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    written
}

struct TreeWriter<'a> {
    root: &'a Path,
}

impl TreeWriter<'_> {
    fn write(&self, host: &HostRecord) -> Result<(), SnapshotError> {
        self.mkdir("sys/bus/pci/devices")?;
        self.mkdir("sys/kernel/iommu_groups")?;
        for d in &host.devices {
            self.device(d)?;
            if let Some(names) = host.nic_names.get(&d.bdf) {
                let dir = format!("sys/{}", Self::device_path(d));
                for n in &names.net {
                    self.mkdir(&format!("{dir}/net/{n}"))?;
                }
                for n in &names.rdma {
                    self.mkdir(&format!("{dir}/infiniband/{n}"))?;
                }
            }
        }
        for (node, cpulist) in &host.numa_nodes {
            self.file(
                &format!("sys/devices/system/node/node{node}/cpulist"),
                format!("{cpulist}\n").as_bytes(),
            )?;
        }
        for (node, row) in &host.numa_distances {
            let text: Vec<String> = row.iter().map(u32::to_string).collect();
            self.file(
                &format!("sys/devices/system/node/node{node}/distance"),
                format!("{}\n", text.join(" ")).as_bytes(),
            )?;
        }
        for kib in &host.hugepage_sizes_kib {
            self.mkdir(&format!("sys/kernel/mm/hugepages/hugepages-{kib}kB"))?;
        }
        for d in &host.devices {
            if let Some(unit) = host.iommu_units.get(&d.bdf) {
                // sys/devices/<bridges…>/BDF/iommu → the IOMMU's class entry
                let rel = Self::device_path(d);
                let up = "../".repeat(rel.matches('/').count() + 1);
                self.mkdir(&format!("sys/class/iommu/{unit}"))?;
                self.link(
                    &format!("{up}class/iommu/{unit}"),
                    &format!("sys/{rel}/iommu"),
                )?;
            }
        }
        if let Some(cmdline) = &host.kernel_cmdline {
            self.file("proc/cmdline", format!("{cmdline}\n").as_bytes())?;
        }
        if let Some(cpu) = &host.cpu {
            self.file("proc/cpuinfo", cpuinfo_text(cpu).as_bytes())?;
        }
        Ok(())
    }

    /// `devices/pciDDDD:BB/<bridges…>/BDF`, relative to `sys/`.
    fn device_path(d: &DeviceRecord) -> String {
        let mut p = format!("devices/{}", d.host_bridge);
        for a in &d.ancestors {
            let _ = write!(p, "/{a}");
        }
        let _ = write!(p, "/{}", d.bdf);
        p
    }

    fn device(&self, d: &DeviceRecord) -> Result<(), SnapshotError> {
        let rel = Self::device_path(d);
        let dir = format!("sys/{rel}");
        self.mkdir(&dir)?;
        // From the device directory, this many `..` lead back to `sys/`.
        let up = "../".repeat(rel.matches('/').count() + 1);
        let attr = |name: &str, text: String| self.file(&format!("{dir}/{name}"), text.as_bytes());
        attr("vendor", format!("{:#06x}\n", d.vendor))?;
        attr("device", format!("{:#06x}\n", d.device))?;
        attr("class", format!("{:#08x}\n", d.class))?;
        if let Some(v) = d.subsystem_vendor {
            attr("subsystem_vendor", format!("{v:#06x}\n"))?;
        }
        if let Some(v) = d.subsystem_device {
            attr("subsystem_device", format!("{v:#06x}\n"))?;
        }
        if !d.config.is_empty() {
            self.file(&format!("{dir}/config"), &d.config)?;
        }
        let numa = d.numa_node.map_or(-1, i64::from);
        attr("numa_node", format!("{numa}\n"))?;
        if let Some(c) = &d.local_cpulist {
            attr("local_cpulist", format!("{c}\n"))?;
        }
        let over = d.driver_override.as_deref().unwrap_or("(null)");
        attr("driver_override", format!("{over}\n"))?;
        if !d.resources.is_empty() {
            let mut text = String::new();
            for r in &d.resources {
                let _ = writeln!(
                    text,
                    "0x{:016x} 0x{:016x} 0x{:016x}",
                    r.start, r.end, r.flags
                );
            }
            attr("resource", text)?;
        }
        let link = [
            ("current_link_speed", d.current_link_speed.clone()),
            (
                "current_link_width",
                d.current_link_width.map(|w| w.to_string()),
            ),
            ("max_link_speed", d.max_link_speed.clone()),
            ("max_link_width", d.max_link_width.map(|w| w.to_string())),
        ];
        for (name, value) in link {
            if let Some(v) = value {
                attr(name, format!("{v}\n"))?;
            }
        }
        if let Some(m) = &d.reset_method {
            attr("reset_method", format!("{}\n", m.join(" ")))?;
        }
        if let Some(drv) = &d.driver {
            self.mkdir(&format!("sys/bus/pci/drivers/{drv}"))?;
            self.link(
                &format!("{up}bus/pci/drivers/{drv}"),
                &format!("{dir}/driver"),
            )?;
        }
        if let Some(g) = d.iommu_group {
            self.mkdir(&format!("sys/kernel/iommu_groups/{g}/devices"))?;
            self.link(
                &format!("{up}kernel/iommu_groups/{g}"),
                &format!("{dir}/iommu_group"),
            )?;
            self.link(
                &format!("../../../../{rel}"),
                &format!("sys/kernel/iommu_groups/{g}/devices/{}", d.bdf),
            )?;
        }
        self.link(
            &format!("../../../{rel}"),
            &format!("sys/bus/pci/devices/{}", d.bdf),
        )
    }

    fn mkdir(&self, rel: &str) -> Result<(), SnapshotError> {
        let p = self.root.join(rel);
        fs::create_dir_all(&p).map_err(io_err(&p))
    }

    fn file(&self, rel: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
        let p = self.root.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        fs::write(&p, bytes).map_err(io_err(&p))
    }

    fn link(&self, target: &str, rel: &str) -> Result<(), SnapshotError> {
        let p = self.root.join(rel);
        symlink(target, &p).map_err(io_err(&p))
    }
}

/// The lines of `/proc/cpuinfo` that `read::cpuinfo` keeps, in the kernel's format (the
/// first processor only: a snapshot keeps what the reader keeps).
fn cpuinfo_text(cpu: &CpuIdentity) -> String {
    let mut t = String::from("processor\t: 0\n");
    match cpu.arch {
        CpuArch::X86_64 => {
            let _ = writeln!(t, "vendor_id\t: {}", cpu.vendor.as_deref().unwrap_or(""));
            if let Some(f) = cpu.family {
                let _ = writeln!(t, "cpu family\t: {f}");
            }
            if let Some(m) = cpu.model {
                let _ = writeln!(t, "model\t\t: {m}");
            }
            if let Some(b) = cpu.phys_bits {
                // the reader keeps the physical bits only; the virtual ones are not known here
                let _ = writeln!(t, "address sizes\t: {b} bits physical");
            }
        }
        CpuArch::Arm64 => t.push_str("CPU implementer\t: (not kept)\n"),
        CpuArch::Ppc64 => t.push_str("cpu\t\t: POWER (model not kept)\n"),
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_host;
    use crate::synth;

    /// Writes `host`, reads it back and checks it is the same, device by device.
    fn assert_round_trip(host: &HostRecord, what: &str) -> HostRecord {
        let dir = tempfile::tempdir().unwrap();
        write_sysfs_tree(host, dir.path()).unwrap();
        let back = read_host(dir.path()).unwrap();
        assert_eq!(back.devices.len(), host.devices.len(), "{what}");
        for (a, b) in host.devices.iter().zip(&back.devices) {
            assert_eq!(a, b, "{what}: device {}", a.bdf);
        }
        assert_eq!(back.numa_nodes, host.numa_nodes, "{what}");
        assert_eq!(back.kernel_cmdline, host.kernel_cmdline, "{what}");
        assert_eq!(back.cpu, host.cpu, "{what}");
        assert_eq!(back.numa_distances, host.numa_distances, "{what}");
        assert_eq!(back.iommu_units, host.iommu_units, "{what}");
        assert_eq!(back.hugepage_sizes_kib, host.hugepage_sizes_kib, "{what}");
        back
    }

    #[test]
    fn examples_round_trip_through_a_sysfs_tree() {
        for (name, _) in synth::EXAMPLES {
            let host = synth::example(name).unwrap();
            let back = assert_round_trip(&host, name);
            assert_eq!(back.warnings, [], "{name}");
            let back = assert_round_trip(&host.unprivileged_view(), name);
            let notes: Vec<_> = back.warnings.iter().map(|w| w.to_string()).collect();
            assert_eq!(notes.len(), 1, "{name}: {notes:?}");
            assert!(notes[0].contains("only the first 64 bytes"), "{notes:?}");
        }
    }

    #[test]
    fn refuses_a_non_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep"), "x").unwrap();
        let host = synth::example("hgx-h100").unwrap();
        let err = write_sysfs_tree(&host, dir.path()).unwrap_err();
        assert!(matches!(err, SnapshotError::NotEmpty { .. }), "{err}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
