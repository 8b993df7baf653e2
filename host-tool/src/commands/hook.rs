//! `vfio-p2p hook install` and `vfio-p2p hook run` (what libvirt calls).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::change::ChangeRoot;
use crate::context::{Context, Needs};
use vfio_p2p_bind::partition_activation::guest::{self as guest_fabric, FabricStep};
use vfio_p2p_bind::partition_activation::{
    activate, deactivate, forget_stale, ActivationError, ActivationRecord,
};
use vfio_p2p_bind::{
    self, writer, BindOptions, BindState, SessionOptions, SysfsWriter, UnbindSelection,
};
use vfio_p2p_config::host::{
    FabricManagerSource, HookPolicy, HostConfig, HOST_CONFIG_PATH, LEGACY_HOOK_CONFIG_PATH,
};
use vfio_p2p_decide::check::{domain_checks, reserved_hostdevs, CheckResult};
use vfio_p2p_model::{ResetPolicy, Topology};
use vfio_p2p_read::domain_xml::read_domain_xml_stream;
use vfio_p2p_read::fm_api::FmSession;
use vfio_p2p_read::ReadError;

/// Where libvirt (≥ 6.5) runs every executable as a `qemu` hook, below `--prefix`.
pub const HOOK_DIR: &str = "etc/libvirt/hooks/qemu.d";
pub const HOOK_NAME: &str = "vfio-p2p";
/// Where `hook install --qemu-wrapper` links the wrapper by default (below `--prefix`).
pub const QEMU_WRAPPER_PATH: &str = "/usr/local/libexec/vfio-p2p/qemu-system-x86_64";
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub action: HookAction,
}

#[derive(Debug, Subcommand)]
pub enum HookAction {
    /// Write the executable /etc/libvirt/hooks/qemu.d/vfio-p2p that runs this binary.
    /// libvirt reads hooks when it starts: restart libvirtd (or virtqemud) afterwards.
    Install {
        /// Install below this directory instead of /.
        #[arg(long, value_name = "DIR", default_value = "/")]
        prefix: PathBuf,
        /// The host root the installed hook works on, written into the hook script (tests
        /// and labs use a directory; hosts keep /).
        #[arg(long, value_name = "DIR", default_value = "/")]
        sysfs_root: PathBuf,
        /// Not for install: a hook works on a real host. (Shadows the global option.)
        #[arg(long, hide = true)]
        example: Option<String>,
        /// Also link this binary as a `qemu-system-x86_64` that adds the planned cliques
        /// (`qemu-wrap`), at PATH below --prefix (default /usr/local/libexec/vfio-p2p/qemu-system-x86_64);
        /// use it as a domain's <emulator>, or see docs/integrations.md for every domain.
        #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = QEMU_WRAPPER_PATH)]
        qemu_wrapper: Option<PathBuf>,
    },
    /// What libvirt runs: GUEST OPERATION SUB-OPERATION EXTRA, with the domain XML on stdin.
    /// `prepare begin` binds the guest's managed='no' hostdevs and checks its cliques
    /// and reserved devices (policy: `hook_policy` etc. in /etc/vfio-p2p/host.yaml);
    /// `release end` restores them; anything else does nothing.
    Run {
        /// Check and print the bindings prepare (or release) would change, without changing
        /// them; works on `--example` hosts too. Give it before GUEST.
        #[arg(long)]
        dry_run: bool,
        /// As libvirt passes them: the guest's name, the operation (prepare, start, started,
        /// stopped, release, …), the sub-operation (begin, end or -) and an extra argument (-).
        #[arg(
            value_name = "GUEST OPERATION SUBOP EXTRA",
            trailing_var_arg = true,
            allow_hyphen_values = true,
            num_args = 0..
        )]
        args: Vec<String>,
    },
}

pub fn run(global: &GlobalArgs, args: HookArgs) -> anyhow::Result<ExitCode> {
    match args.action {
        HookAction::Install {
            prefix,
            sysfs_root,
            example,
            qemu_wrapper,
        } => {
            anyhow::ensure!(
                example.is_none() && global.example.is_none(),
                "hook install writes a hook for this host; --example does not apply"
            );
            if let Some(path) = &qemu_wrapper {
                wrapper_name(path)?; // before anything is written
            }
            let code = install(&sysfs_root, &prefix)?;
            if let Some(path) = qemu_wrapper {
                install_qemu_wrapper(&prefix, &path)?;
            }
            Ok(code)
        }
        HookAction::Run { dry_run, args } => match args.as_slice() {
            [guest, op, sub, ..] => match (op.as_str(), sub.as_str()) {
                ("prepare", "begin") => prepare(global, guest, dry_run),
                ("release", "end") => release(global, guest, dry_run),
                _ => Ok(ExitCode::SUCCESS),
            },
            _ => anyhow::bail!(
                "hook run needs GUEST OPERATION SUB-OPERATION [EXTRA] (as libvirt passes them), got {args:?}"
            ),
        },
    }
}

/// `'text'` for sh, whatever the text holds.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The hook script: execs this binary (absolute path) with `hook run "$@"`.
pub fn hook_script(binary: &Path, sysfs_root: &Path) -> String {
    let root_arg = if sysfs_root == Path::new("/") {
        String::new()
    } else {
        format!(
            " --sysfs-root {}",
            shell_quote(&sysfs_root.display().to_string())
        )
    };
    format!(
        "#!/bin/sh\n\
         # libvirt qemu hook written by `vfio-p2p hook install`: before a guest starts, binds its\n\
         # managed='no' GPUs to vfio-pci and checks its P2P cliques (policy: /{HOST_CONFIG_PATH});\n\
         # after it stops, gives them back. libvirt reads hooks at start-up: restart libvirtd.\n\
         exec {}{root_arg} hook run \"$@\"\n",
        shell_quote(&binary.display().to_string())
    )
}

/// Why `binary` looks like a build output rather than an installed program.
fn build_directory(binary: &Path) -> Option<&'static str> {
    let text = binary.display().to_string();
    let target = std::env::var("CARGO_TARGET_DIR")
        .ok()
        .filter(|d| !d.is_empty());
    if target.is_some_and(|d| text.starts_with(&d)) {
        return Some("inside CARGO_TARGET_DIR");
    }
    ["/target/debug/", "/target/release/"]
        .iter()
        .any(|t| text.contains(t))
        .then_some("inside a cargo target directory")
}

fn install(sysfs_root: &Path, prefix: &Path) -> anyhow::Result<ExitCode> {
    let binary = std::env::current_exe()
        .and_then(fs::canonicalize)
        .context("finding this binary's absolute path")?;
    let dir = prefix.join(HOOK_DIR);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(HOOK_NAME);
    let tmp = dir.join(format!(".{HOOK_NAME}.{}", std::process::id()));
    // libvirt runs the hook from its own working directory: only absolute paths hold.
    let root = fs::canonicalize(sysfs_root)
        .with_context(|| format!("resolving --sysfs-root {}", sysfs_root.display()))?;
    fs::write(&tmp, hook_script(&binary, &root))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", tmp.display()))?;
    fs::rename(&tmp, &path).with_context(|| format!("installing {}", path.display()))?;
    println!(
        "installed {}, which runs {}",
        path.display(),
        binary.display()
    );
    if let Some(why) = build_directory(&binary) {
        println!(
            "warning: {} is {why}: the hook stops working when it is rebuilt, moved or cleaned; install the package (/usr/bin/vfio-p2p) or `cargo install --locked --path host-tool`, then run `hook install` from there",
            binary.display()
        );
    }
    println!(
        "policy: {} (hook_policy: warn|deny, p2p_level, reserved, nvlink; see /usr/share/doc/vfio-p2p/examples/README.md); defaults when absent",
        root.join(HOST_CONFIG_PATH).display()
    );
    let legacy = root.join(LEGACY_HOOK_CONFIG_PATH);
    if legacy.exists() {
        println!(
            "warning: {} is no longer read and makes the hook refuse every start: move `policy:` into host.yaml as `hook_policy:`, then delete it",
            legacy.display()
        );
    }
    println!(
        "restart libvirt so it picks the hook up: systemctl restart libvirtd (or virtqemud on modular daemons)"
    );
    Ok(ExitCode::SUCCESS)
}

/// Links this binary as `path` (below `prefix`): started under a `qemu-system-*` name it
/// is `qemu-wrap`, which runs the real QEMU (`path.real`, else /usr/bin/NAME).
fn install_qemu_wrapper(prefix: &Path, path: &Path) -> anyhow::Result<()> {
    let name = wrapper_name(path)?;
    let binary = std::env::current_exe()
        .and_then(fs::canonicalize)
        .context("finding this binary's absolute path")?;
    let target = prefix.join(path.strip_prefix("/").unwrap_or(path));
    if let Some(dir) = target.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = target.with_file_name(format!(".{name}.{}", std::process::id()));
    std::os::unix::fs::symlink(&binary, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    fs::rename(&tmp, &target).with_context(|| format!("installing {}", target.display()))?;
    println!(
        "installed {} -> {}: a QEMU that adds the planned cliques, then runs {}.real if present, else /usr/bin/{name}",
        target.display(),
        binary.display(),
        path.display()
    );
    println!(
        "use it as <emulator>{}</emulator>, or for every guest see docs/integrations.md (dpkg-divert)",
        path.display()
    );
    Ok(())
}

/// The wrapper's file name: `qemu-system-*`, the name that makes the binary act as qemu-wrap.
fn wrapper_name(path: &Path) -> anyhow::Result<&str> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    anyhow::ensure!(
        name.starts_with("qemu-system-"),
        "--qemu-wrapper {}: the wrapper must be named qemu-system-* (that name makes the binary act as qemu-wrap)",
        path.display()
    );
    Ok(name)
}

/// One line on stderr (libvirt shows it in the start error), then the exit code.
fn refuse(guest: &str, reason: &str) -> anyhow::Result<ExitCode> {
    eprintln!("vfio-p2p hook: {guest}: {reason}");
    Ok(ExitCode::from(1))
}

fn session(guest: &str, dry_run: bool) -> SessionOptions {
    SessionOptions {
        dry_run,
        lock_timeout: LOCK_TIMEOUT,
        guest: Some(guest.to_string()),
        memory_offline_wait: vfio_p2p_bind::GPU_MEMORY_OFFLINE_WAIT,
    }
}

/// One finding as the hook prints it: what it saw, then the fix.
fn finding_line(c: &CheckResult) -> String {
    match &c.fix {
        Some(fix) => format!("{}; {fix}", c.saw),
        None => c.saw.clone(),
    }
}

/// An input the hook cannot read: under `warn` a warning and the guest starts, under
/// `deny` a refusal (docs/bind-and-hook.md, "What the hook does with bad input").
fn unreadable(guest: &str, policy: HookPolicy, what: &str) -> anyhow::Result<ExitCode> {
    match policy {
        HookPolicy::Deny => refuse(guest, &format!("{what} (hook_policy: deny)")),
        HookPolicy::Warn => {
            tracing::warn!("hook: {guest}: {what}; nothing checked or bound (hook_policy: warn)");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Binds the domain's managed='no' hostdevs; the managed='yes' ones (libvirt binds those
/// itself) only get their reset method; both as host.yaml's `reset:` says.
fn bind_hostdevs<W: SysfsWriter>(
    root: &Path,
    topo: &Topology,
    sysfs: &mut W,
    guest: &str,
    dry_run: bool,
    [unmanaged, managed]: [&Vec<Bdf>; 2],
    reset: ResetPolicy,
) -> Result<(), String> {
    let steps = [
        (unmanaged, false, "binding its managed='no' hostdevs"),
        (managed, true, "setting its hostdevs' reset_method"),
    ];
    for (devices, reset_only, what) in steps {
        if devices.is_empty() || reset_only && reset == ResetPolicy::Auto {
            continue;
        }
        let opts = BindOptions {
            reset,
            reset_only,
            force: reset_only,
            ..BindOptions::default()
        };
        match vfio_p2p_bind::bind(root, topo, sysfs, devices, &opts, &session(guest, dry_run)) {
            Ok(report) if dry_run => print!("{}", vfio_p2p_bind::text::report_text(&report)),
            Ok(_) => {}
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
    Ok(())
}

fn prepare(global: &GlobalArgs, guest: &str, dry_run: bool) -> anyhow::Result<ExitCode> {
    let change = ChangeRoot::of(global, dry_run)?;
    let root = change.path();
    let config = change.host_config()?;
    let facts = match read_domain_xml_stream(std::io::stdin().lock(), "the domain XML on stdin") {
        Ok(f) => f,
        Err(e) => return unreadable(guest, config.hook_policy, &e.to_string()),
    };
    if facts.hostdevs.is_empty() {
        dry_run_says(dry_run, guest, "no PCI hostdev, nothing to check or bind");
        return Ok(ExitCode::SUCCESS);
    }
    let policy = config.hook_policy;
    // The host is read once, here, with the NVLink capture host.yaml names: the checks
    // and the bind below see the same host. Under `warn` an unreadable host or capture is
    // a warning like any other unreadable input, and the guest starts.
    let Context {
        topo,
        host: config,
        fabric,
        fm,
        warnings: notes,
        ..
    } = match Context::build(change.source(), config, &Needs::default()) {
        Ok(built) => built,
        Err(e) if e.is::<ReadError>() => {
            return unreadable(guest, policy, &format!("reading the host: {e}"));
        }
        Err(e) => return unreadable(guest, policy, &format!("{e:#}")),
    };
    let taken_from_host = reserved_hostdevs(&topo, &facts, &config.reserved);
    if !taken_from_host.is_empty() {
        let lines: Vec<String> = taken_from_host.iter().map(finding_line).collect();
        return refuse(guest, &lines.join("; "));
    }
    let problems: Vec<String> = domain_checks(&topo, &facts, config.p2p_level)
        .iter()
        .map(finding_line)
        .collect();
    if config.hook_policy == HookPolicy::Deny && !problems.is_empty() {
        return refuse(guest, &problems.join("; "));
    }
    // Fabric Manager was asked once, in the context build, before anything changes
    // (docs/fabric.md).
    let hostdevs: Vec<_> = facts.hostdevs.iter().map(|h| h.bdf).collect();
    let reserved = config.reserved.iter().copied().collect();
    let fabric = guest_fabric::plan_for_guest(&fabric, fm, &topo, &hostdevs, &reserved);
    let mut warnings: Vec<String> = problems.iter().chain(&notes).cloned().collect();
    if let FabricStep::Finding(f) = &fabric {
        if policy == HookPolicy::Deny {
            return refuse(guest, &format!("{f} (hook_policy: deny)"));
        }
        warnings.push(format!(
            "{f}; the guest starts without NVLink (hook_policy: warn)"
        ));
    }
    let unmanaged: Vec<_> = facts
        .hostdevs
        .iter()
        .filter(|h| !h.managed)
        .map(|h| h.bdf)
        .collect();
    let mut sysfs = writer()?;
    let managed: Vec<Bdf> = hostdevs
        .iter()
        .filter(|b| !unmanaged.contains(b))
        .copied()
        .collect();
    if let Err(why) = bind_hostdevs(
        root,
        &topo,
        &mut sysfs,
        guest,
        dry_run,
        [&unmanaged, &managed],
        config.reset,
    ) {
        return refuse(guest, &why);
    }
    let activates = matches!(fabric, FabricStep::Activate { .. });
    if let FabricStep::Activate {
        mut session,
        partition,
        gpus,
        live_active,
    } = fabric
    {
        let step = ActivateStep {
            root,
            guest,
            partition,
            gpus: &gpus,
            policy,
            dry_run,
            live_active,
        };
        if let Err(refusal) = step.run(&mut sysfs, &mut session, &mut warnings) {
            return refuse(guest, &refusal);
        }
    }
    for p in &warnings {
        tracing::warn!("hook: {guest}: {p}");
    }
    if problems.is_empty() && notes.is_empty() && unmanaged.is_empty() && !activates {
        dry_run_says(dry_run, guest, "all well: the cliques are as planned, and every hostdev is managed='yes' (nothing to bind)");
    }
    Ok(ExitCode::SUCCESS)
}

/// prepare's activation of the VM's Fabric Manager partition, after the bind.
struct ActivateStep<'a> {
    root: &'a Path,
    guest: &'a str,
    partition: u32,
    gpus: &'a [Bdf],
    policy: HookPolicy,
    dry_run: bool,
    /// FM's live list has the partition active.
    live_active: bool,
}

impl ActivateStep<'_> {
    /// A record entry for this guest that FM's live list contradicts (FM restarted, or was
    /// down when the guest stopped) is dropped, said, and the partition activated again.
    fn forget_stale_record(&self, warnings: &mut Vec<String>) -> Result<(), String> {
        let id = self.partition;
        if self.live_active || self.dry_run {
            return Ok(());
        }
        match forget_stale(self.root, id, self.guest, LOCK_TIMEOUT) {
            Ok(true) => warnings.push(format!("partition {id} was recorded active for {}, but Fabric Manager lists it inactive (FM restarted, or was down when the guest stopped): the record was stale; activating it again", self.guest)),
            Ok(false) => {}
            Err(e) if self.policy == HookPolicy::Deny => {
                return Err(format!("partition {id}: cannot confirm vfio-p2p's record against Fabric Manager: {e} (hook_policy: deny)"));
            }
            Err(e) => warnings.push(format!("partition {id}: cannot confirm vfio-p2p's record against Fabric Manager: {e}")),
        }
        Ok(())
    }

    /// Under `deny` a failure rolls the bind back and is the refusal (`Err`); under `warn`
    /// it is a warning and the guest starts without NVLink.
    fn run(
        &self,
        sysfs: &mut Box<dyn SysfsWriter>,
        fm: &mut FmSession,
        warnings: &mut Vec<String>,
    ) -> Result<(), String> {
        let (id, list) = (self.partition, bdf_list(self.gpus));
        if self.dry_run {
            println!("would reset {list} and activate Fabric Manager partition {id}");
            return Ok(());
        }
        self.forget_stale_record(warnings)?;
        let opts = session(self.guest, false);
        let done = match self.policy {
            HookPolicy::Deny => guest_fabric::activate_or_roll_back(
                self.root, sysfs, fm, id, self.gpus, self.guest, &opts,
            )
            .map_err(|e| {
                format!("activating Fabric Manager partition {id}: {e} (hook_policy: deny)")
            })?,
            HookPolicy::Warn => {
                match activate(
                    self.root,
                    sysfs,
                    fm,
                    id,
                    self.gpus,
                    Some(self.guest),
                    LOCK_TIMEOUT,
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        warnings.push(format!("activating Fabric Manager partition {id}: {e}; the guest starts without NVLink (hook_policy: warn)"));
                        return Ok(());
                    }
                }
            }
        };
        for (bdf, driver) in &done.reset_on_host_driver {
            warnings.push(format!("{bdf} was reset for partition {id} while still on its host driver {driver} (a managed='yes' hostdev: libvirt binds it to vfio-pci after the hook); make the GPUs managed='no' so that the hook binds them first, as FM's sequence wants"));
        }
        if !done.not_resettable.is_empty() {
            warnings.push(format!(
                "{} have no reset method (no sysfs `reset`): activated partition {id} without the reset FM's sequence asks for",
                bdf_list(&done.not_resettable)
            ));
        }
        Ok(())
    }
}

fn bdf_list(bdfs: &[Bdf]) -> String {
    bdfs.iter()
        .map(Bdf::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Under --dry-run, what the hook found when it has nothing else to print (the run itself
/// stays silent: libvirt logs what a hook prints).
fn dry_run_says(dry_run: bool, guest: &str, what: &str) {
    if dry_run {
        println!("{guest}: {what}; the guest would start");
    }
}

fn release(global: &GlobalArgs, guest: &str, dry_run: bool) -> anyhow::Result<ExitCode> {
    let change = ChangeRoot::of(global, dry_run)?;
    let root = change.path();
    // Most guests had nothing bound by prepare: answer without the lock or reading the host.
    // (The record is replaced atomically, so reading it unlocked sees a whole one.)
    let recorded = BindState::load(root)?;
    let partitions = ActivationRecord::load(root)?.of_guest(guest);
    if !partitions.is_empty() {
        // After the guest stopped and before its GPUs go back to the host (FM's sequence).
        if let Some(w) = deactivate_for(&change, &partitions, dry_run) {
            tracing::warn!("hook: {guest}: {w}");
        }
    }
    if !recorded
        .devices
        .values()
        .any(|r| r.guest.as_deref() == Some(guest))
    {
        if dry_run {
            println!("{guest}: prepare bound nothing for it: nothing to give back");
        }
        return Ok(ExitCode::SUCCESS);
    }
    match vfio_p2p_bind::unbind(
        root,
        &mut writer()?,
        &UnbindSelection::Guest(guest.to_string()),
        &session(guest, dry_run),
    ) {
        Ok(report) => {
            if dry_run {
                print!("{}", vfio_p2p_bind::text::report_text(&report));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => refuse(
            guest,
            &format!("giving back the devices prepare bound: {e}"),
        ),
    }
}

/// Deactivates the partitions a guest held; what went wrong, as a warning (release goes on
/// giving the GPUs back either way: the guest is gone).
fn deactivate_for(change: &ChangeRoot, ids: &[u32], dry_run: bool) -> Option<String> {
    let shown: Vec<String> = ids.iter().map(u32::to_string).collect();
    let shown = shown.join(", ");
    if dry_run {
        println!("would deactivate Fabric Manager partition {shown}");
        return None;
    }
    let fix = format!("`vfio-p2p fabric deactivate {shown}` once Fabric Manager answers");
    let address = match change.host_config() {
        Ok(HostConfig {
            fabric_manager: FabricManagerSource::Live(a),
            ..
        }) => a,
        Ok(_) => return Some(format!("partition {shown} is recorded active but host.yaml no longer names Fabric Manager's address; {fix}")),
        Err(e) => return Some(format!("{e}; partition {shown} left active: {fix}")),
    };
    let result = change
        .fabric_manager(&address)
        .map_err(ActivationError::from)
        .and_then(|mut fm| deactivate(change.path(), &mut fm, ids, LOCK_TIMEOUT));
    match result {
        Ok(_) => None,
        Err(e) => Some(format!(
            "deactivating Fabric Manager partition {shown}: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_directory_binary_is_noticed() {
        assert!(build_directory(Path::new("/src/vfio-p2p/target/release/vfio-p2p")).is_some());
        assert!(build_directory(Path::new("/usr/bin/vfio-p2p")).is_none());
    }

    #[test]
    fn script_quotes_its_paths() {
        let s = hook_script(Path::new("/opt/it's/vfio-p2p"), Path::new("/tmp/root"));
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(
            s.contains(r"exec '/opt/it'\''s/vfio-p2p' --sysfs-root '/tmp/root' hook run "),
            "{s}"
        );
        assert!(hook_script(Path::new("/usr/bin/vfio-p2p"), Path::new("/"))
            .contains("exec '/usr/bin/vfio-p2p' hook run \"$@\"\n"));
    }
}
