//! The VFIO ioctls `check` needs: API version, group viability, and (only with
//! `--deep`) opening a device, which resets it. The one place the host side calls them:
//! each `unsafe` ioctl has its `// SAFETY:` line, and the functions are safe to call
//! (`vfio_p2p_read::host_probe` calls them; every other host crate forbids `unsafe`).
//!
//! Request numbers come from the `_IO(VFIO_TYPE, VFIO_BASE + n)` definitions of
//! `include/uapi/linux/vfio.h`; the tests pin them to the kernel's values.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_BASE,
    VFIO_DEVICE_FLAGS_RESET, VFIO_GROUP_FLAGS_VIABLE, VFIO_TYPE,
};

nix::ioctl_none_bad!(
    vfio_get_api_version,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE)
);
nix::ioctl_write_int_bad!(
    vfio_check_extension,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 1)
);
nix::ioctl_write_int_bad!(
    vfio_set_iommu,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 2)
);
nix::ioctl_readwrite_bad!(
    vfio_group_get_status,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 3),
    vfio_group_status
);
nix::ioctl_write_ptr_bad!(
    vfio_group_set_container,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 4),
    libc::c_int
);
nix::ioctl_write_ptr_bad!(
    vfio_group_get_device_fd,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 6),
    libc::c_char
);
nix::ioctl_readwrite_bad!(
    vfio_device_get_info,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 7),
    vfio_device_info
);

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Opens the container (`/dev/vfio/vfio`) and returns its API version
/// (`VFIO_API_VERSION`, 0, on every kernel so far).
pub fn container_api_version(container: &Path) -> io::Result<i32> {
    let f = open_rw(container)?;
    // SAFETY: VFIO_GET_API_VERSION takes no argument and only returns an int; `f` is
    // an open file that outlives the call.
    Ok(unsafe { vfio_get_api_version(f.as_raw_fd()) }?)
}

/// Whether the group is viable: every device in it is bound to a VFIO driver or to
/// none. Opens only the group file, never a device, so nothing is reset.
pub fn group_viable(group: &Path) -> io::Result<bool> {
    let f = open_rw(group)?;
    let mut status = vfio_group_status {
        argsz: std::mem::size_of::<vfio_group_status>() as u32,
        flags: 0,
    };
    // SAFETY: the kernel writes at most `argsz` bytes into `status`, a properly sized
    // and aligned `vfio_group_status` living on this stack frame; `f` is open.
    unsafe { vfio_group_get_status(f.as_raw_fd(), &mut status) }?;
    Ok(status.flags & VFIO_GROUP_FLAGS_VIABLE != 0)
}

/// What opening a device through VFIO showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    pub resettable: bool,
    pub regions: u32,
    pub irqs: u32,
}

/// Attaches the group to a fresh type-1 container, opens `device` (which resets it)
/// and reads its info. Everything is closed again before returning.
pub fn open_device(container: &Path, group: &Path, device: &str) -> io::Result<DeviceInfo> {
    let c = open_rw(container)?;
    let g = open_rw(group)?;
    let api = container_api_version(container)?;
    if api != VFIO_API_VERSION as i32 {
        return Err(io::Error::other(format!(
            "VFIO API version {api}, expected {VFIO_API_VERSION}"
        )));
    }
    // SAFETY: VFIO_CHECK_EXTENSION takes an integer by value; `c` is open.
    if unsafe { vfio_check_extension(c.as_raw_fd(), VFIO_TYPE1v2_IOMMU as libc::c_int) }? != 1 {
        return Err(io::Error::other("the container lacks the type-1 v2 IOMMU"));
    }
    let cfd: libc::c_int = c.as_raw_fd();
    // SAFETY: the kernel reads one int (the container fd) from `&cfd`, valid for the call.
    unsafe { vfio_group_set_container(g.as_raw_fd(), &cfd) }?;
    // SAFETY: VFIO_SET_IOMMU takes an integer by value; `c` is open.
    unsafe { vfio_set_iommu(c.as_raw_fd(), VFIO_TYPE1v2_IOMMU as libc::c_int) }?;
    let name = CString::new(device).map_err(io::Error::other)?;
    // SAFETY: the kernel reads a NUL-terminated string from `name`, alive for the call;
    // on success it returns a new fd that we own.
    let fd = unsafe { vfio_group_get_device_fd(g.as_raw_fd(), name.as_ptr()) }?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    let dev = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut info = vfio_device_info {
        argsz: std::mem::size_of::<vfio_device_info>() as u32,
        ..Default::default()
    };
    // SAFETY: the kernel writes at most `argsz` bytes into `info`, a properly sized
    // `vfio_device_info` on this stack frame; `dev` is open.
    unsafe { vfio_device_get_info(dev.as_raw_fd(), &mut info) }?;
    Ok(DeviceInfo {
        resettable: info.flags & VFIO_DEVICE_FLAGS_RESET != 0,
        regions: info.num_regions,
        irqs: info.num_irqs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_IO(';', 100 + n)` as the kernel computes it (`VFIO_GET_API_VERSION` is 0x3b64).
    #[test]
    fn request_numbers_match_the_kernel() {
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE), 0x3b64);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 1), 0x3b65);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 2), 0x3b66);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 3), 0x3b67);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 4), 0x3b68);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 6), 0x3b6a);
        assert_eq!(nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 7), 0x3b6b);
        assert_eq!(std::mem::size_of::<vfio_group_status>(), 8);
    }

    #[test]
    fn absent_nodes_are_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let e = group_viable(&dir.path().join("dev/vfio/7")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = container_api_version(&dir.path().join("dev/vfio/vfio")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_regular_file_is_not_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("3");
        std::fs::write(&p, b"").unwrap();
        // ENOTTY: the ioctl is not understood by a regular file.
        assert!(group_viable(&p).is_err());
    }
}
