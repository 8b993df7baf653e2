//! QEMU's per-VM copy of the OVMF vars template (vm.yaml `ovmf_vars_copy:`), made by `gen qemu`
//! on the host that runs the VM, never over an existing copy.

use std::path::Path;

use anyhow::Context as _;

use vfio_p2p_config::vm::VmConfig;
use vfio_p2p_emit::qemu;

/// QEMU's copy of the OVMF vars template, made last (a refusal leaves the host as it was).
/// `on_this_host`: the VM runs here (gen reads the live `/`); else the command is said.
pub fn make(config: &VmConfig, on_this_host: bool) -> anyhow::Result<()> {
    let (Some(template), Some(copy)) = (&config.ovmf_vars, &config.boot.ovmf_vars_copy) else {
        return Ok(());
    };
    if copy.exists() {
        return Ok(());
    }
    let make = format!(
        "install -m 600 {} {}",
        qemu::shell_quote(&template.display().to_string()),
        qemu::shell_quote(&copy.display().to_string())
    );
    if !on_this_host {
        tracing::warn!("ovmf_vars_copy: {} must exist on the machine that runs the VM (generating from an example or snapshot): `{make}` there", copy.display());
        return Ok(());
    }
    copy_vars_template(template, copy)
        .with_context(|| format!("making this VM's OVMF vars (ovmf_vars_copy:): {make}"))
}

/// Copies the OVMF vars template to a new file only the VMM's user reads (never over an
/// existing copy: it holds the VM's variables).
fn copy_vars_template(template: &Path, copy: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let bytes =
        std::fs::read(template).with_context(|| format!("reading {}", template.display()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(copy)
        .with_context(|| format!("creating {}", copy.display()))?;
    f.write_all(&bytes)
        .with_context(|| format!("writing {}", copy.display()))?;
    tracing::info!("copied {} to {}", template.display(), copy.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::copy_vars_template;

    #[test]
    fn the_vars_copy_is_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let t = tempfile::tempdir().unwrap();
        let (template, copy) = (t.path().join("VARS.fd"), t.path().join("a_VARS.fd"));
        std::fs::write(&template, b"template").unwrap();
        copy_vars_template(&template, &copy).unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"template");
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // the VM's variables are never overwritten
        std::fs::write(&copy, b"the VM's variables").unwrap();
        assert!(copy_vars_template(&template, &copy).is_err());
        assert_eq!(std::fs::read(&copy).unwrap(), b"the VM's variables");
    }
}
