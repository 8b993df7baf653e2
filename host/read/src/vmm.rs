//! What the VMM stack says about itself: `qemu-system-x86_64 --version`, `virsh --version`
//! (what a QEMU command line asks for is `read::qemu_argv`'s).

use std::path::Path;
use std::process::Command;

use crate::outside_call::{run_program, MAX_PROGRAM_OUTPUT, PROGRAM_DEADLINE};

use vfio_p2p_model::vmm::{LibvirtVersion, QemuVersion};

/// Parses `QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7)`.
pub fn parse_qemu_version(text: &str) -> Option<QemuVersion> {
    let rest = text.split("version").nth(1)?;
    let v = rest.split_whitespace().next()?;
    let mut nums = v.split('.').map(|n| {
        n.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
    });
    Some(QemuVersion {
        major: nums.next()?.ok()?,
        minor: nums.next()?.ok()?,
        micro: nums.next().and_then(Result::ok).unwrap_or(0),
        clique_backport: text.contains("+vfiop2p"),
    })
}

/// Runs `PATH --version` and parses it.
pub fn qemu_version_of(path: &Path) -> Result<QemuVersion, String> {
    let shown = format!("`{} --version`", path.display());
    let out = run_program(
        Command::new(path).arg("--version"),
        &shown,
        PROGRAM_DEADLINE,
        MAX_PROGRAM_OUTPUT,
    )
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_qemu_version(&text).ok_or_else(|| {
        format!(
            "{} --version printed no 'version X.Y.Z': {}",
            path.display(),
            text.lines().next().unwrap_or("")
        )
    })
}

/// The installed libvirt's version (`virsh --version`, else `libvirtd --version`); `Err`
/// says why none could be read.
pub fn installed_libvirt_version() -> Result<LibvirtVersion, String> {
    for tool in ["virsh", "libvirtd"] {
        let shown = format!("`{tool} --version`");
        let run = |c: &mut Command| run_program(c, &shown, PROGRAM_DEADLINE, MAX_PROGRAM_OUTPUT);
        if let Ok(out) = run(Command::new(tool).arg("--version")) {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(v) = text
                .split_whitespace()
                .rev()
                .find_map(|w| w.parse::<LibvirtVersion>().ok())
            {
                return Ok(v);
            }
        }
    }
    Err("neither `virsh --version` nor `libvirtd --version` ran and printed a version".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_version_strings() {
        let v = |s| parse_qemu_version(s);
        assert_eq!(
            v("QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7+deb12u6)\nCopyright (c) 2003-2022"),
            Some(QemuVersion { major: 7, minor: 2, micro: 0, clique_backport: false })
        );
        let patched =
            v("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+vfiop2p1)").unwrap();
        assert!(patched.clique_backport && patched.has_clique_fallback());
        assert!(!v("QEMU emulator version 8.0.5")
            .unwrap()
            .has_clique_fallback());
        // Ask the model, as the decision does: 8.1.0 itself has the 0xD4 fallback.
        assert!(v("QEMU emulator version 8.1.0")
            .unwrap()
            .has_clique_fallback());
        assert!(!v("QEMU emulator version 8.0.5")
            .unwrap()
            .has_clique_fallback());
        assert_eq!(v("QEMU emulator version 9.2").map(|q| q.micro), Some(0));
        assert_eq!(v("cloud-hypervisor v39.0"), None);
    }
}
