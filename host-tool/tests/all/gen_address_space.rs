//! gen's address-space decision end to end: every VMM target refuses a RAM whose window
//! no longer fits the host's physical address width (exit 2, vm.yaml's memory_mib line and
//! the largest RAM that fits), and takes the largest; a snapshot keeps the host's width.

use std::path::Path;

/// hgx-h100: 46 bits, eight H100s (a 2080 GiB window) fit up to 61438 GiB of RAM.
const LARGEST_MIB: u64 = 61438 << 10;

fn gen(host: &[&str], target: &str, config: &Path) -> std::process::Output {
    // Cloud Hypervisor boots what vm.yaml names (the other targets refuse kernel:)
    let ch = config.with_extension("ch.yaml");
    if target == "cloud-hypervisor" {
        let yaml = std::fs::read_to_string(config).unwrap();
        std::fs::write(&ch, yaml + "kernel: /boot/vmlinuz\n").unwrap();
    }
    crate::cli::vfio_p2p()
        .args(host)
        .args(["gen", target, "--config"])
        .arg(if target == "cloud-hypervisor" {
            &ch
        } else {
            config
        })
        .output()
        .unwrap()
}

fn vm_yaml(dir: &Path, memory_mib: u64) -> std::path::PathBuf {
    let p = dir.join(format!("vm-{memory_mib}.yaml"));
    std::fs::write(
        &p,
        format!("name: big\nmemory_mib: {memory_mib}\nconsole: none\n"),
    )
    .unwrap();
    p
}

#[test]
fn every_target_refuses_ram_past_the_hosts_width_and_takes_the_largest() {
    let dir = tempfile::tempdir().unwrap();
    let (fits, too_big) = (
        vm_yaml(dir.path(), LARGEST_MIB),
        vm_yaml(dir.path(), LARGEST_MIB + 1024),
    );
    let example = ["--example", "hgx-h100"];
    for target in ["qemu", "libvirt", "cloud-hypervisor", "proxmox", "incus"] {
        let ok = gen(&example, target, &fits);
        assert!(
            ok.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let refused = gen(&example, target, &too_big);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{target}: {err}");
        assert!(refused.stdout.is_empty(), "{target}");
        let file = match target {
            "cloud-hypervisor" => too_big.with_extension("ch.yaml"),
            _ => too_big.clone(),
        };
        let at = format!("{}:2:13: memory_mib: ", file.display());
        assert!(err.contains(&at), "{target}: {err}");
        assert!(
            err.contains("46-bit physical address space")
                && err.contains("at most 61438 GiB of RAM for this VM (memory_mib: 62912512)"),
            "{target}: {err}"
        );
    }
}

#[test]
fn a_snapshot_keeps_the_hosts_width() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let out = crate::cli::vfio_p2p()
        .args(["--example", "hgx-h100", "snapshot", "-o"])
        .arg(&snap)
        .output()
        .unwrap();
    assert!(out.status.success());
    let root = ["--sysfs-root", snap.to_str().unwrap()];
    let too_big = vm_yaml(dir.path(), LARGEST_MIB + 1024);
    assert_eq!(gen(&root, "qemu", &too_big).status.code(), Some(2));
    assert!(gen(&root, "qemu", &vm_yaml(dir.path(), LARGEST_MIB))
        .status
        .success());
}

fn stderr(host: &[&str], target: &str) -> String {
    crate::cli::succeeded(crate::cli::vfio_p2p().args(host).args(["gen", target])).1
}

/// A window ending above 1 TiB: where the host's width is unknown (flat-vm, a VM's capture)
/// gen says it cannot check; where it is known it says nothing; Incus is told what loses it.
#[test]
fn a_window_above_one_tib_is_warned_of_where_nothing_can_refuse_it() {
    let unknown = "does not say its physical address width";
    assert!(stderr(&["--example", "flat-vm"], "qemu").contains(unknown));
    assert!(!stderr(&["--example", "hgx-h100"], "qemu").contains(unknown));
    let incus = stderr(&["--example", "hgx-h100"], "incus");
    assert!(
        incus.contains("migration.stateful=true gets kvm64")
            && incus.contains("limits.memory.hotplug"),
        "{incus}"
    );
    // two GPUs of dual-socket-pcie with 16 GiB of RAM end below 1 TiB: no warning
    let small = crate::cli::vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "gen",
            "incus",
            "--gpus",
            "05:00.0",
        ])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&small.stderr).contains("migration.stateful"));
}
