//! The libvirt version a domain is written for, and the forms an older libvirt gets
//! instead of the elements it lacks (each said as a warning; the emitter writes them).

use super::{Said, Say};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_model::vmm::{
    LibvirtVersion, ACPI_NODESET_SINCE, IOMMUFD_SINCE, MAXPHYSADDR_SINCE, OVERRIDE_SINCE,
};

/// The host's width for libvirt before `<maxphysaddr>`: a global property of the CPU type
/// libvirt's host-passthrough starts (`-cpu host`), which is how QEMU applies `-cpu` options.
pub const HOST_PHYS_BITS_GLOBAL: &str = "host-x86_64-cpu.host-phys-bits=on";

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
