//! The libvirt version a domain is written for, and the forms an older libvirt gets
//! instead of the elements it lacks (each said as a warning; the emitter writes them).

use super::{Said, Say};
use crate::grace_guest::{highmem_mmio_size, HIGHMEM_MMIO_DEFAULT};
use crate::mmio;
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_model::domain::DomainFacts;
use vfio_p2p_model::vmm::{
    LibvirtVersion, ACPI_NODESET_SINCE, IOMMUFD_SINCE, MAXPHYSADDR_SINCE, OVERRIDE_SINCE,
};
use vfio_p2p_model::Device;

/// The host's width for libvirt before `<maxphysaddr>`: a global property of the CPU type
/// libvirt's host-passthrough starts (`-cpu host`), which is how QEMU applies `-cpu` options.
pub const HOST_PHYS_BITS_GLOBAL: &str = "host-x86_64-cpu.host-phys-bits=on";

/// The window `libvirt patch` gives an existing domain for its GPUs' 64-bit BARs, in the
/// form its machine takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchWindow {
    /// The machine's default window holds the BARs: nothing to write.
    DefaultFits,
    /// q35/i440fx: a 64-bit PCI hole of at least these bytes (`<pcihole64>`, or the
    /// domain's own `pci-hole64-size=`).
    PciHole64(u64),
    /// Arm `virt`: a high PCIe window of these bytes, a power of two above virt's 512 GiB
    /// default (`-machine highmem-mmio-size=` in `<qemu:commandline>`: libvirt has no
    /// element for it, and `<pcihole64>` is q35's and i440fx's only).
    HighmemMmio(u64),
}

/// The window `domain`'s GPU hostdevs (`gpus`) need, as the domain's machine sets it: on Arm
/// `virt` what a Grace guest gets from `gen` ([`highmem_mmio_size`]), elsewhere the 64-bit
/// hole [`mmio::hole64_size`] sizes; none where the machine's default already holds them.
pub fn patch_window(domain: &DomainFacts, gpus: &[&Device]) -> PatchWindow {
    let need = mmio::hole64_size(gpus);
    if domain.is_arm_virt() {
        let size = highmem_mmio_size(need);
        match size > HIGHMEM_MMIO_DEFAULT {
            true => PatchWindow::HighmemMmio(size),
            false => PatchWindow::DefaultFits,
        }
    } else if need > mmio::HEADROOM {
        PatchWindow::PciHole64(need)
    } else {
        PatchWindow::DefaultFits
    }
}

/// The version an x86 domain is written for (an unknown one: the oldest with
/// `<qemu:override>`), with a warning for each form it gets instead of an element.
pub fn version(
    probed: &Result<LibvirtVersion, String>,
    backend: IommuBackend,
    say: Say,
) -> LibvirtVersion {
    version_with(probed, backend, true, say)
}

/// The version an aarch64 domain of PCIe GPUs is written for: as an x86 one's, less the
/// guest's physical width (`<maxphysaddr>` and its older form are x86's).
pub fn arm_version(
    probed: &Result<LibvirtVersion, String>,
    backend: IommuBackend,
    say: Say,
) -> LibvirtVersion {
    version_with(probed, backend, false, say)
}

fn version_with(
    probed: &Result<LibvirtVersion, String>,
    backend: IommuBackend,
    maxphysaddr: bool,
    say: Say,
) -> LibvirtVersion {
    let version = match probed {
        Ok(v) => *v,
        Err(why) => {
            let v = OVERRIDE_SINCE;
            say(Said::Warning(unknown_version_warning(
                why,
                v,
                backend,
                maxphysaddr,
            )));
            return v;
        }
    };
    if !version.has_override() {
        say(Said::Warning(set_form_warning(version)));
    }
    if maxphysaddr && !version.has_maxphysaddr() {
        say(Said::Warning(maxphysaddr_form_warning(version)));
    }
    if backend == IommuBackend::Iommufd && !version.has_iommufd() {
        say(Said::Warning(iommufd_form_warning(version)));
    }
    version
}

/// The version a Grace domain is written for, with the generic initiators' form.
pub fn grace_version(probed: &Result<LibvirtVersion, String>, say: Say) -> LibvirtVersion {
    let version = match probed {
        Ok(v) => *v,
        Err(why) => {
            say(Said::Warning(format!(
                "{why}: libvirt's version is unknown; the Grace domain is written for libvirt {OVERRIDE_SINCE}; pass --libvirt-version X.Y to write for the libvirt that will run it"
            )));
            OVERRIDE_SINCE
        }
    };
    if !version.has_acpi_nodeset() {
        say(Said::Warning(acpi_form_warning(version)));
    }
    version
}

/// Why an older libvirt gets iommufd through `<qemu:commandline>`; printed as a warning.
pub fn iommufd_form_warning(version: LibvirtVersion) -> String {
    format!(
        "libvirt {version} has no iommufd backend for host devices (<driver iommufd='yes'/> needs {IOMMUFD_SINCE}): \
         using <qemu:commandline> -object iommufd and an iommufd property per hostdev; libvirt still sets up the VFIO \
         group, and QEMU must be allowed to open /dev/iommu and /dev/vfio/devices/* (qemu.conf cgroup_device_acl, \
         namespaces = []); upgrade libvirt"
    )
}

/// Why an older libvirt gets the host's width through `<qemu:commandline>`; a warning.
pub fn maxphysaddr_form_warning(version: LibvirtVersion) -> String {
    format!(
        "libvirt {version} has no <maxphysaddr> (needs {MAXPHYSADDR_SINCE}): using <qemu:commandline> \
         -global {HOST_PHYS_BITS_GLOBAL} to give the guest the host's physical address width; upgrade libvirt"
    )
}

/// Why an older libvirt gets the `-set` form; printed as a warning.
pub fn set_form_warning(version: LibvirtVersion) -> String {
    format!(
        "libvirt {version} has no <qemu:override> (needs {OVERRIDE_SINCE}): using <qemu:commandline> -set, \
         which QEMU rejects once libvirt passes -device as JSON (QEMU >= 6.2); upgrade libvirt"
    )
}

/// What gen writes when libvirt's version is unknown: for `assumed`, with the forms that
/// version takes instead of newer elements named, and how to write for the real one.
pub fn unknown_version_warning(
    why: &str,
    assumed: LibvirtVersion,
    backend: IommuBackend,
    maxphysaddr: bool,
) -> String {
    let mut older = Vec::new();
    if maxphysaddr && !assumed.has_maxphysaddr() {
        older.push(format!(
            "the host's address width as -global {HOST_PHYS_BITS_GLOBAL}"
        ));
    }
    if backend == IommuBackend::Iommufd && !assumed.has_iommufd() {
        older.push("iommufd as -object iommufd".into());
    }
    let forms = match older.is_empty() {
        true => String::new(),
        false => format!(", so <qemu:commandline> carries {}", older.join(" and ")),
    };
    format!(
        "{why}: libvirt's version is unknown; the domain is written for libvirt {assumed} (the oldest with <qemu:override>){forms}; pass --libvirt-version X.Y to write for the libvirt that will run it"
    )
}

/// Why an older libvirt gets the generic initiators through `<qemu:commandline>`.
pub fn acpi_form_warning(version: LibvirtVersion) -> String {
    format!(
        "libvirt {version} is not known to write acpi-generic-initiator from a hostdev's <acpi nodeset> (checked from {ACPI_NODESET_SINCE}): \
         the GPUs' generic initiators go in <qemu:commandline>, naming each hostdev's alias"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::Topology;
    use vfio_p2p_read::synth;

    fn window_on(example: &str, arch: &str, machine: &str) -> PatchWindow {
        let topo = Topology::from_record(&synth::example(example).unwrap());
        let domain = DomainFacts {
            arch: Some(arch.into()),
            machine: Some(machine.into()),
            ..DomainFacts::default()
        };
        patch_window(&domain, &topo.gpus().collect::<Vec<_>>())
    }

    #[test]
    fn an_arm_virt_domain_gets_the_high_window_never_the_64_bit_hole() {
        // four GB200 GPUs: beyond virt's 512 GiB, as gen's power of two
        let gb200 = window_on("gb200", "aarch64", "virt");
        assert_eq!(gb200, PatchWindow::HighmemMmio(4096 << 30));
        // one GH200 GPU fits the default window
        assert_eq!(
            window_on("gh200", "aarch64", "virt"),
            PatchWindow::DefaultFits
        );
        // eight H100: 8 × 256 GiB slots + 32 GiB in q35's hole
        let q35 = window_on("hgx-h100", "x86_64", "pc-q35-7.2");
        assert_eq!(q35, PatchWindow::PciHole64((2048 + 32) << 30));
    }
}
