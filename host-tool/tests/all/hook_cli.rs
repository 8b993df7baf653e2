//! `vfio-p2p hook`: domain XMLs on stdin (right ones and ones with the usual mistakes),
//! checked for exit codes and messages, on the `dual-socket-pcie` example host written
//! as a sysfs tree (socket 0: GPUs 07, 08, 0a, 0b under one switch tree; socket 1: 87…).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use predicates::prelude::*;
use vfio_p2p_bind::sim::write_tree;
use vfio_p2p_read::synth::example;

fn host_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tree(&example("dual-socket-pcie").unwrap(), dir.path()).unwrap();
    dir
}

/// Writes `ROOT/etc/vfio-p2p/host.yaml`, where the hook reads its policy.
fn set_policy(root: &Path, yaml: &str) {
    fs::create_dir_all(root.join("etc/vfio-p2p")).unwrap();
    fs::write(root.join("etc/vfio-p2p/host.yaml"), yaml).unwrap();
}

struct Gpu<'a> {
    bus: u8,
    alias: &'a str,
    clique: Option<u8>,
    managed: bool,
}

fn gpu(bus: u8, alias: &str, clique: Option<u8>) -> Gpu<'_> {
    Gpu {
        bus,
        alias,
        clique,
        managed: true,
    }
}

/// A domain with these GPUs as hostdevs, cliques in `<qemu:override>`; `extra` goes
/// right after `<name>` (features, commandline).
fn domain(gpus: &[Gpu], extra: &str) -> String {
    let mut x = String::from(
        "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n  <name>vm1</name>\n",
    );
    x.push_str(extra);
    x.push_str("  <devices>\n");
    for g in gpus {
        x.push_str(&format!(
            "    <hostdev mode='subsystem' type='pci' managed='{}'>\n      <driver name='vfio'/>\n      <source><address domain='0x0000' bus='{:#04x}' slot='0x00' function='0x0'/></source>\n      <alias name='{}'/>\n    </hostdev>\n",
            if g.managed { "yes" } else { "no" },
            g.bus,
            g.alias
        ));
    }
    x.push_str("  </devices>\n  <qemu:override>\n");
    for g in gpus {
        if let Some(c) = g.clique {
            x.push_str(&format!(
                "    <qemu:device alias='{}'><qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='{c}'/></qemu:frontend></qemu:device>\n",
                g.alias
            ));
        }
    }
    x.push_str("  </qemu:override>\n</domain>\n");
    x
}

fn hook(root: &Path, op: &str, sub: &str, xml: &str) -> assert_cmd::assert::Assert {
    crate::cli::vfio_p2p()
        .arg("--sysfs-root")
        .arg(root)
        .args(["hook", "run", "vm1", op, sub, "-"])
        .env_remove("VFIO_P2P_FAIL_AFTER")
        .write_stdin(xml)
        .assert()
}

#[test]
fn other_operations_do_nothing_and_print_nothing() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    for (op, sub) in [
        ("start", "begin"),
        ("started", "begin"),
        ("stopped", "end"),
        ("migrate", "begin"),
        ("restore", "begin"),
        ("prepare", "end"),
    ] {
        hook(t.path(), op, sub, "not even XML")
            .success()
            .stdout("")
            .stderr("");
    }
}

#[test]
fn a_correct_domain_starts_quietly_and_fast() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    let xml = domain(
        &[
            gpu(0x05, "ua-gpu0", Some(0)),
            gpu(0x09, "ua-gpu1", Some(0)),
            gpu(0x85, "ua-gpu2", Some(1)),
            gpu(0x86, "ua-gpu3", Some(1)),
        ],
        "",
    );
    let start = Instant::now();
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stdout("")
        .stderr("");
    eprintln!("prepare begin took {:?}", start.elapsed());
}

#[test]
fn a_missing_clique_warns_by_default_and_denies_on_request() {
    let t = host_tree();
    let xml = domain(
        &[gpu(0x05, "ua-gpu0", Some(0)), gpu(0x06, "ua-gpu1", None)],
        "",
    );
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stdout("")
        .stderr(predicate::str::contains(
            "warning: hook: vm1: 0000:06:00.0 has no x-nv-gpudirect-clique but reaches 0000:05:00.0 over PCIe P2P (plan: clique 0)",
        ))
        .stderr(predicate::str::contains("vfio-p2p libvirt patch"));
    set_policy(t.path(), "hook_policy: deny\n");
    let out = hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stdout("")
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert_eq!(
        err.lines().count(),
        1,
        "one line for libvirt's error: {err}"
    );
    assert!(
        err.starts_with("vfio-p2p hook: vm1: 0000:06:00.0 has no x-nv-gpudirect-clique"),
        "{err}"
    );
}

#[test]
fn a_clique_across_sockets_is_denied() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    let xml = domain(
        &[gpu(0x05, "ua-gpu0", Some(0)), gpu(0x85, "ua-gpu1", Some(0))],
        "",
    );
    hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stderr(predicate::str::contains(
            "0000:05:00.0 and 0000:85:00.0 share clique 0 but their host path is SYS",
        ))
        .stderr(predicate::str::contains("put them in different cliques"));
    // Allowed when the operator raises the level (and the path then is what they accept).
    set_policy(t.path(), "hook_policy: deny\np2p_level: sys\n");
    hook(t.path(), "prepare", "begin", &xml).success();
}

#[test]
fn a_hidden_hypervisor_is_denied() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    let gpus = [gpu(0x05, "ua-gpu0", Some(0)), gpu(0x06, "ua-gpu1", Some(0))];
    hook(
        t.path(),
        "prepare",
        "begin",
        &domain(
            &gpus,
            "  <features><kvm><hidden state='on'/></kvm></features>\n",
        ),
    )
    .code(1)
    .stderr(predicate::str::contains(
        "<features><kvm><hidden state='on'/>: the hypervisor is hidden",
    ));
    let cmdline = "  <qemu:commandline><qemu:arg value='-cpu'/><qemu:arg value='host,kvm=off'/></qemu:commandline>\n";
    hook(t.path(), "prepare", "begin", &domain(&gpus, cmdline))
        .code(1)
        .stderr(predicate::str::contains("-cpu host,kvm=off"));
}

#[test]
fn commandline_cliques_and_bad_values_are_read() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    let set = "  <qemu:commandline><qemu:arg value='-set'/><qemu:arg value='device.ua-gpu1.x-nv-gpudirect-clique=0'/></qemu:commandline>\n";
    let gpus = [gpu(0x05, "ua-gpu0", Some(0)), gpu(0x06, "ua-gpu1", None)];
    hook(t.path(), "prepare", "begin", &domain(&gpus, set))
        .success()
        .stderr("");
    let gpus = [
        gpu(0x05, "ua-gpu0", Some(0)),
        gpu(0x06, "ua-gpu1", Some(16)),
    ];
    hook(t.path(), "prepare", "begin", &domain(&gpus, ""))
        .code(1)
        .stderr(predicate::str::contains(
            "has x-nv-gpudirect-clique='16'; a clique ID is 0..=15",
        ));
}

#[test]
fn bad_input_is_a_clear_error() {
    let t = host_tree();
    hook(t.path(), "prepare", "begin", "<domain")
        .success()
        .stderr(predicate::str::contains(
            "warning: hook: vm1: the domain XML on stdin: not well-formed XML",
        ));
    set_policy(t.path(), "hook_policy: deny\n");
    hook(t.path(), "prepare", "begin", "<domain").code(1);
    set_policy(t.path(), "hook_policy: deny\nmode: strict\n");
    hook(
        t.path(),
        "prepare",
        "begin",
        &domain(&[gpu(0x05, "a", None)], ""),
    )
    .code(2)
    .stderr(predicate::str::contains("etc/vfio-p2p/host.yaml:2:"))
    .stderr(predicate::str::contains("mode"));
}

/// Input the hook cannot read: under `warn` the guest starts with a warning, under `deny`
/// it is refused; never a crash (deep nesting used to overflow the stack, non-UTF-8 stdin
/// used to exit 2 under `warn`).
#[test]
fn unreadable_domains_warn_or_refuse_by_policy() {
    let t = host_tree();
    let deep = format!(
        "<domain><devices>{}{}</devices></domain>",
        "<a>".repeat(20_000),
        "</a>".repeat(20_000)
    );
    let cases: [(&[u8], &str); 3] = [
        (deep.as_bytes(), "nested deeper than 256 levels"),
        (b"<domain><name>vm\xff</name></domain>", "not UTF-8"),
        (b"<domain/><domain/>", "second root element"),
    ];
    for (input, why) in cases {
        let run = || {
            crate::cli::vfio_p2p()
                .arg("--sysfs-root")
                .arg(t.path())
                .args(["hook", "run", "vm1", "prepare", "begin", "-"])
                .write_stdin(input.to_vec())
                .assert()
        };
        set_policy(t.path(), "hook_policy: warn\n");
        run()
            .success()
            .stderr(predicate::str::contains("warning:"))
            .stderr(predicate::str::contains(why))
            .stderr(predicate::str::contains("hook_policy: warn"));
        set_policy(t.path(), "hook_policy: deny\n");
        run()
            .code(1)
            .stderr(predicate::str::contains(why))
            .stderr(predicate::str::contains("hook_policy: deny"));
    }
}

#[test]
fn a_left_over_hook_yaml_is_refused_with_the_move_to_make() {
    let t = host_tree();
    fs::create_dir_all(t.path().join("etc/vfio-p2p")).unwrap();
    fs::write(t.path().join("etc/vfio-p2p/hook.yaml"), "policy: deny\n").unwrap();
    let xml = domain(&[gpu(0x05, "ua-gpu0", Some(0))], "");
    // With or without a host.yaml beside it: its policy would silently stop applying.
    for host_yaml in [None, Some("hook_policy: warn\n")] {
        if let Some(y) = host_yaml {
            set_policy(t.path(), y);
        }
        hook(t.path(), "prepare", "begin", &xml)
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(
                "hook.yaml: the hook's own config is no longer read",
            ))
            .stderr(predicate::str::contains(
                "etc/vfio-p2p/host.yaml as `hook_policy: warn|deny`",
            ));
    }
    // Operations that read no policy are not blocked by it.
    hook(t.path(), "release", "end", "").success().stderr("");
}

#[test]
fn a_reserved_gpu_or_its_group_is_always_refused() {
    let t = host_tree();
    let xml = domain(
        &[gpu(0x05, "ua-gpu0", Some(0)), gpu(0x06, "ua-gpu1", Some(0))],
        "",
    );
    // Even under `warn`: the start would take a device away from the host.
    set_policy(t.path(), "hook_policy: warn\nreserved: [0000:06:00.0]\n");
    let reason = "0000:06:00.0 is reserved for the host (host.yaml `reserved:`)";
    let out = hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("vfio-p2p hook: vm1: {reason}")),
        "{err}"
    );
    // The GPU's audio function is in its IOMMU group: passing the GPU would take it too.
    set_policy(t.path(), "hook_policy: deny\nreserved: [0000:06:00.1]\n");
    hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stderr(predicate::str::contains(
            "0000:06:00.0 shares its IOMMU group with 0000:06:00.1, which is reserved for the host",
        ));
    // A reserved device the domain does not ask for changes nothing.
    set_policy(t.path(), "hook_policy: deny\nreserved: [0000:85:00.0]\n");
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stderr("");
}

#[test]
fn nvlink_from_the_host_config_lets_a_clique_cross_sockets() {
    let t = host_tree();
    let xml = domain(
        &[gpu(0x05, "ua-gpu0", Some(0)), gpu(0x85, "ua-gpu1", Some(0))],
        "",
    );
    set_policy(t.path(), "hook_policy: deny\n");
    hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stderr(predicate::str::contains("their host path is SYS"));
    // Saved `nvidia-smi topo -m` (relative to host.yaml) with the index → address map.
    fs::write(
        t.path().join("etc/vfio-p2p/topo-m.txt"),
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n\
         GPU0\t X \tNV12\t0-15\t0\n\
         GPU1\tNV12\t X \t16-31\t1\n\n\
         index, pci.bus_id\n0, 00000000:05:00.0\n1, 00000000:85:00.0\n",
    )
    .unwrap();
    set_policy(
        t.path(),
        "hook_policy: deny\nnvlink:\n  source: nvidia-smi\n  file: topo-m.txt\n",
    );
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stdout("")
        .stderr("");
    // A missing capture: under deny a refusal naming it, not a silent PCIe-only check;
    // under warn a warning naming it, and the guest starts.
    fs::remove_file(t.path().join("etc/vfio-p2p/topo-m.txt")).unwrap();
    hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stderr(predicate::str::contains("nvlink.file"))
        .stderr(predicate::str::contains("topo-m.txt"))
        .stderr(predicate::str::contains("(hook_policy: deny)"));
    set_policy(
        t.path(),
        "hook_policy: warn\nnvlink:\n  source: nvidia-smi\n  file: topo-m.txt\n",
    );
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stderr(predicate::str::contains("warning:"))
        .stderr(predicate::str::contains("topo-m.txt"))
        .stderr(predicate::str::contains("(hook_policy: warn)"));
}

#[test]
fn unmanaged_hostdevs_are_bound_and_released() {
    let t = host_tree();
    let mut g = gpu(0x05, "ua-gpu0", None);
    g.managed = false;
    // Plain files do not rebind, so the bind fails its read-back, is rolled back, and the
    // start is refused whatever the policy (the VM could not use the device).
    hook(t.path(), "prepare", "begin", &domain(&[g], ""))
        .code(1)
        .stderr(predicate::str::contains(
            "vfio-p2p hook: vm1: binding its managed='no' hostdevs: 0000:05:00.0: after writing /sys/bus/pci/drivers_probe",
        ));
    // Already on vfio-pci: nothing to write, nothing recorded, release restores nothing.
    let dev = t.path().join("sys/bus/pci/devices/0000:05:00.0");
    fs::remove_file(dev.join("driver")).unwrap();
    std::os::unix::fs::symlink(
        t.path().join("sys/bus/pci/drivers/vfio-pci"),
        dev.join("driver"),
    )
    .unwrap();
    let dev1 = t.path().join("sys/bus/pci/devices/0000:05:00.1");
    fs::remove_file(dev1.join("driver")).unwrap();
    std::os::unix::fs::symlink(
        t.path().join("sys/bus/pci/drivers/vfio-pci"),
        dev1.join("driver"),
    )
    .unwrap();
    let mut g = gpu(0x05, "ua-gpu0", None);
    g.managed = false;
    hook(t.path(), "prepare", "begin", &domain(&[g], ""))
        .success()
        .stderr("");
    hook(t.path(), "release", "end", "")
        .success()
        .stdout("")
        .stderr("");
    assert!(fs::read_link(dev.join("driver"))
        .unwrap()
        .ends_with("vfio-pci"));
}

#[test]
fn install_writes_an_executable_that_runs_this_binary() {
    let t = tempfile::tempdir().unwrap();
    crate::cli::vfio_p2p()
        .args(["hook", "install", "--prefix"])
        .arg(t.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("restart libvirtd"))
        .stdout(predicate::str::contains(
            "etc/vfio-p2p/host.yaml (hook_policy",
        ));
    let script = t.path().join("etc/libvirt/hooks/qemu.d/vfio-p2p");
    let text = fs::read_to_string(&script).unwrap();
    let bin = fs::canonicalize(crate::cli::bin()).unwrap();
    assert!(
        text.contains(&format!("exec '{}' hook run \"$@\"", bin.display())),
        "{text}"
    );
    assert_eq!(
        fs::metadata(&script).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // A left-over hook.yaml below the root is pointed out at install time.
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("etc/vfio-p2p")).unwrap();
    fs::write(root.path().join("etc/vfio-p2p/hook.yaml"), "policy: deny\n").unwrap();
    crate::cli::vfio_p2p()
        .arg("--sysfs-root")
        .arg(root.path())
        .args(["hook", "install", "--prefix"])
        .arg(root.path())
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "hook.yaml is no longer read and makes the hook refuse every start",
        ));
    // libvirt's way of calling it: a non-prepare operation exits 0 silently.
    std::process::Command::new(&script)
        .args(["vm1", "started", "begin", "-"])
        .output()
        .map(|o| {
            assert!(o.status.success());
            assert!(o.stdout.is_empty() && o.stderr.is_empty());
        })
        .unwrap();
}

/// `gen libvirt` for the dual-socket example (the host the tree was written from).
fn generated(gpus: &str, libvirt_version: &str) -> String {
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "gen",
            "libvirt",
            "--gpus",
            gpus,
        ])
        .args(["--libvirt-version", libvirt_version])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn generated_domains_pass_and_broken_ones_are_caught() {
    let t = host_tree();
    set_policy(t.path(), "hook_policy: deny\n");
    let gpus = "0000:05:00.0,0000:09:00.0,0000:85:00.0";
    for version in ["9.0", "8.0"] {
        let xml = generated(gpus, version);
        hook(t.path(), "prepare", "begin", &xml)
            .success()
            .stdout("")
            .stderr("");
    }
    let xml = generated(gpus, "9.0");
    let dropped = xml.replace(
        "<qemu:device alias='ua-gpu1'>",
        "<qemu:device alias='ua-gone'>",
    );
    hook(t.path(), "prepare", "begin", &dropped)
        .code(1)
        .stderr(predicate::str::contains(
            "0000:09:00.0 has no x-nv-gpudirect-clique",
        ));
    let hidden = xml.replace(
        "<features>",
        "<features>\n    <kvm><hidden state='on'/></kvm>",
    );
    hook(t.path(), "prepare", "begin", &hidden)
        .code(1)
        .stderr(predicate::str::contains("the hypervisor is hidden"));
    // The far-socket GPU dragged into the others' clique (old -set form).
    let xml = generated(gpus, "8.0");
    let joined = xml.replace(
        "<qemu:arg value='-set'/>\n    <qemu:arg value='device.ua-gpu1.x-nv-gpudirect-clique=0'/>",
        "<qemu:arg value='-set'/>\n    <qemu:arg value='device.ua-gpu1.x-nv-gpudirect-clique=0'/>\n    <qemu:arg value='-set'/>\n    <qemu:arg value='device.ua-gpu2.x-nv-gpudirect-clique=0'/>",
    );
    assert_ne!(joined, xml);
    hook(t.path(), "prepare", "begin", &joined)
        .code(1)
        .stderr(predicate::str::contains(
            "0000:05:00.0 and 0000:85:00.0 share clique 0 but their host path is SYS",
        ));
}

#[test]
fn release_gives_back_only_what_prepare_recorded_for_that_guest() {
    let t = host_tree();
    let gpu = "0000:05:00.0";
    let dev = t.path().join("sys/bus/pci/devices").join(gpu);
    fs::remove_file(dev.join("driver")).unwrap();
    std::os::unix::fs::symlink(
        t.path().join("sys/bus/pci/drivers/vfio-pci"),
        dev.join("driver"),
    )
    .unwrap();
    fs::write(dev.join("driver_override"), "vfio-pci\n").unwrap();
    fs::create_dir_all(t.path().join("run/vfio-p2p")).unwrap();
    fs::write(
        t.path().join("run/vfio-p2p/state.json"),
        format!(r#"{{"devices": {{"{gpu}": {{"original": {{"driver": "nvidia", "driver_override": null}}, "bound_with": "{gpu}", "guest": "vm1"}}}}}}"#),
    )
    .unwrap();
    let other = |guest: &str| {
        crate::cli::vfio_p2p()
            .arg("--sysfs-root")
            .arg(t.path())
            .args(["hook", "run", guest, "release", "end", "-"])
            .assert()
    };
    other("vm2").success().stdout("").stderr("");
    // vm1's device is restored the kernel's way; plain files do not rebind, so the
    // read-back fails, the device goes back to vfio-pci and stays recorded.
    other("vm1")
        .code(1)
        .stderr(predicate::str::contains(format!(
            "vfio-p2p hook: vm1: giving back the devices prepare bound: {gpu}: after writing /sys/bus/pci/drivers/nvidia/bind"
        )));
    assert_eq!(
        fs::read_to_string(dev.join("driver_override")).unwrap(),
        "vfio-pci"
    );
    assert!(fs::read_to_string(t.path().join("run/vfio-p2p/state.json"))
        .unwrap()
        .contains("vm1"));
}

/// `hook run --dry-run` checks a domain against an example host and shows what prepare
/// would bind, changing nothing.
#[test]
fn a_dry_run_of_the_hook_works_on_an_example() {
    let mut a = gpu(0x05, "ua-gpu0", Some(0));
    a.managed = false;
    let b = gpu(0x06, "ua-gpu1", Some(0));
    let xml = domain(&[a, b], "");
    crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "hook", "run", "--dry-run"])
        .args(["vm1", "prepare", "begin", "-"])
        .write_stdin(xml.clone())
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "0000:05:00.0  nvidia → (dry run)  (named)",
        ))
        .stdout(predicate::str::contains(
            "echo vfio-pci > /sys/bus/pci/devices/0000:05:00.0/driver_override",
        ))
        .stdout(predicate::str::contains("0000:06:00.0").not());
    crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "hook", "run", "--dry-run"])
        .args(["vm1", "release", "end", "-"])
        .assert()
        .success();
    // Without --dry-run an example is refused, as for bind.
    crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "hook", "run"])
        .args(["vm1", "prepare", "begin", "-"])
        .write_stdin(xml)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--dry-run"));
}

/// Issue 28: two GPUs the plan puts in one clique, given cliques 0 and 1 (P2P off between
/// them in the guest), are a finding: a warning under warn, a refusal under deny, and a
/// failed check of `check --domain-xml`.
#[test]
fn gpus_of_one_planned_clique_split_across_cliques_are_a_finding() {
    let t = host_tree();
    let xml = domain(
        &[gpu(0x05, "ua-gpu0", Some(0)), gpu(0x06, "ua-gpu1", Some(1))],
        "",
    );
    let said = "the plan puts these GPUs in one clique (0), but the domain has 0000:05:00.0 in clique 0; 0000:06:00.0 in clique 1: P2P will be off between them in the guest";
    hook(t.path(), "prepare", "begin", &xml)
        .success()
        .stdout("")
        .stderr(predicate::str::contains(format!(
            "warning: hook: vm1: {said}"
        )));
    set_policy(t.path(), "hook_policy: deny\n");
    hook(t.path(), "prepare", "begin", &xml)
        .code(1)
        .stderr(predicate::str::contains(said));
    let file = t.path().join("vm1.xml");
    fs::write(&file, &xml).unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "check", "--domain-xml"])
        .arg(&file)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let split: Vec<&serde_json::Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "clique-split")
        .collect();
    assert_eq!(split.len(), 1, "{report:#}");
    assert_eq!(split[0]["status"], "fail");
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 27: one `prepare` reads the host once — the checks and the bind of its
/// managed='no' hostdevs see the same host (with host.yaml's NVLink source). `-vv` logs
/// every read of the host ("reading the host below ROOT"); a second read is a failure.
#[test]
fn prepare_reads_the_host_once() {
    let reads = |root: &Path, dry_run: bool, xml: &str| -> usize {
        let mut c = crate::cli::vfio_p2p();
        c.arg("-vv").arg("--sysfs-root").arg(root);
        c.args(["hook", "run"]);
        if dry_run {
            c.arg("--dry-run");
        }
        let out = c
            .args(["vm1", "prepare", "begin", "-"])
            .env_remove("VFIO_P2P_FAIL_AFTER")
            .env_remove("VFIO_P2P_LOG")
            .write_stdin(xml.to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        stderr.matches("reading the host below").count()
    };
    let t = host_tree();
    let mut g = gpu(0x05, "ua-gpu0", None);
    g.managed = false;
    let xml = domain(&[g, gpu(0x06, "ua-gpu1", None)], "");
    // A dry run plans the bind (writes listed), a real run binds what is already on
    // vfio-pci (nothing to write): both after checking the domain.
    assert_eq!(reads(t.path(), true, &xml), 1, "dry run");
    for f in ["0000:05:00.0", "0000:05:00.1"] {
        let dev = t.path().join("sys/bus/pci/devices").join(f);
        fs::remove_file(dev.join("driver")).unwrap();
        std::os::unix::fs::symlink(
            t.path().join("sys/bus/pci/drivers/vfio-pci"),
            dev.join("driver"),
        )
        .unwrap();
    }
    assert_eq!(reads(t.path(), false, &xml), 1, "prepare with a bind");
}

/// Grace (#38): the hook binds a GH200's `managed='no'` hostdev to nvgrace_gpu_vfio_pci,
/// not vfio-pci, once `/proc/iomem` shows its memory offline. On plain files nothing rebinds,
/// so the read-back names the driver it expected and the rollback leaves `nvidia`.
#[test]
fn a_grace_gpu_is_bound_to_the_nvgrace_variant_driver() {
    let t = tempfile::tempdir().unwrap();
    write_tree(&example("gh200").unwrap(), t.path()).unwrap();
    fs::create_dir_all(t.path().join("proc")).unwrap();
    fs::write(
        t.path().join("proc/iomem"),
        "80000000-fffbffff : System RAM\n",
    )
    .unwrap();
    let xml = "<domain type='kvm'>\n  <name>vm1</name>\n  <devices>\n    <hostdev mode='subsystem' type='pci' managed='no'>\n      <driver name='vfio'/>\n      <source><address domain='0x0009' bus='0x01' slot='0x00' function='0x0'/></source>\n    </hostdev>\n  </devices>\n</domain>\n";
    hook(t.path(), "prepare", "begin", xml)
        .code(1)
        .stderr(predicate::str::contains(
            "binding its managed='no' hostdevs: 0009:01:00.0: after writing /sys/bus/pci/drivers_probe",
        ))
        .stderr(predicate::str::contains("expected it bound to nvgrace_gpu_vfio_pci"));
    let dev = t.path().join("sys/bus/pci/devices/0009:01:00.0");
    assert!(fs::read_link(dev.join("driver"))
        .unwrap()
        .ends_with("nvidia"));
}
