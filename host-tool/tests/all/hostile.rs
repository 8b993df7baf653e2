//! Issue 15: hostile and broken input never crashes, hangs or silently misreads. Each
//! reader of the host tool (sysfs tree, flat JSON, domain XML, host.yaml and vm.yaml,
//! nvidia-smi capture) gets generated mutations (truncations, random bytes, special files,
//! deep and huge inputs) and the real binary must end within the limit, without a panic,
//! abort or signal, with a result or an error naming the input (`tests/hostile/support.rs`).
//! Then the reproducers, each as the regression test of its fix.
//!
//! Replay: `VFIO_P2P_HOSTILE_SEED=N`; longer: `VFIO_P2P_SOAK=N` (N times the cases).

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use support::{
    copy_tree, iterations, make_special, mutate, mutate_file, nested, replace, run_checked, Rng,
    Special, MUTATIONS, SPECIALS,
};
use vfio_p2p_read::snapshot::write_sysfs_tree;
use vfio_p2p_read::synth::example;

/// The lab example's first GPU, below switch downstream port [`LAB_PORT`].
const LAB_GPU: &str = "0000:03:00.0";
const LAB_PORT: &str = "0000:02:00.0";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn tool() -> Command {
    crate::cli::vfio_p2p()
}

/// `vfio-p2p --sysfs-root ROOT ARGS…`.
fn on_root(root: &Path, args: &[&str]) -> Command {
    let mut c = tool();
    c.arg("--sysfs-root").arg(root).args(args);
    c
}

fn lab_tree(dir: &Path) {
    write_sysfs_tree(&example("lab").unwrap(), dir).unwrap();
}

fn device_dir(root: &Path, bdf: &str) -> PathBuf {
    fs::canonicalize(root.join("sys/bus/pci/devices").join(bdf)).unwrap()
}

const SYSFS_FILES: &[&str] = &[
    "config",
    "class",
    "vendor",
    "device",
    "numa_node",
    "local_cpulist",
    "resource",
    "driver_override",
    "driver",
    "iommu_group",
];

#[test]
fn sysfs_tree_mutations() {
    let mut rng = Rng::from_env("sysfs tree");
    let t = tempfile::tempdir().unwrap();
    let template = t.path().join("template");
    lab_tree(&template);
    let mut devices: Vec<String> = fs::read_dir(template.join("sys/bus/pci/devices"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    devices.sort();
    for i in 0..iterations(8) {
        let root = t.path().join(format!("root{i}"));
        copy_tree(&template, &root);
        let bdf = rng.pick(&devices).clone();
        let file = *rng.pick(SYSFS_FILES);
        let what = mutate_file(&mut rng, &device_dir(&root, &bdf).join(file));
        let case = format!("sysfs tree: {bdf}/{file} {what}");
        let shown = root.display().to_string();
        let out = root.join("snapshot");
        let names = [shown.as_str(), bdf.as_str(), LAB_GPU];
        for args in [
            &["topo"][..],
            &["plan"],
            &["check"],
            &["bind", "--dry-run", LAB_GPU],
            &["snapshot", "-o", out.to_str().unwrap()],
        ] {
            run_checked(
                on_root(&root, args),
                None,
                &format!("{case}: {args:?}"),
                &names,
            );
        }
    }
}

/// A random JSON value of a kind sysfs never shows.
fn hostile_value(rng: &mut Rng) -> serde_json::Value {
    let deep: serde_json::Value =
        serde_json::from_str(&nested("[", "]", 100)).expect("100 levels parse");
    let choices = [
        serde_json::json!(u64::MAX),
        serde_json::json!(-1),
        serde_json::json!(4_294_967_301u64),
        serde_json::json!(1e308),
        serde_json::json!(""),
        serde_json::json!("\u{0}"),
        serde_json::json!("x".repeat(100_000)),
        serde_json::json!("0x10de\n0x10de"),
        serde_json::json!({}),
        serde_json::Value::Null,
        serde_json::json!(true),
        deep,
    ];
    rng.pick(&choices).clone()
}

#[test]
fn flat_json_mutations() {
    let mut rng = Rng::from_env("flat JSON");
    let base = fs::read(fixture("sysfs/h200x2-vm-sysfs.json")).unwrap();
    let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&base).unwrap();
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("host.json");
    let shown = file.display().to_string();
    let run = |case: &str| {
        for args in [&["topo"][..], &["plan"]] {
            run_checked(on_root(&file, args), None, case, &[&shown]);
        }
    };
    for _ in 0..iterations(10) {
        let m = *rng.pick(MUTATIONS);
        replace(&file, &mutate(&mut rng, m, &base));
        run(&format!("flat JSON: {m:?}"));
        let mut edited = parsed.clone();
        let bdf = rng
            .pick(&parsed.keys().cloned().collect::<Vec<_>>())
            .clone();
        let attrs = edited[&bdf].as_object_mut().unwrap();
        let key = rng.pick(&attrs.keys().cloned().collect::<Vec<_>>()).clone();
        let value = hostile_value(&mut rng);
        attrs.insert(key.clone(), value);
        replace(&file, &serde_json::to_vec(&edited).unwrap());
        run(&format!("flat JSON: {bdf} {key:?} set to a hostile value"));
    }
    replace(&file, nested("[", "]", 100_000).as_bytes());
    run("flat JSON: 100,000 nested arrays");
    replace(&file, nested("{\"a\":", "}", 100_000).as_bytes());
    run("flat JSON: 100,000 nested objects");
    for kind in [Special::Fifo, Special::DevZero, Special::Empty] {
        make_special(&file, kind);
        run(&format!("flat JSON: {kind:?}"));
    }
    // Over the 64 MiB a dump may hold (sparse: nothing is written).
    make_special(&file, Special::Empty);
    fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    let o = run_checked(
        on_root(&file, &["topo"]),
        None,
        "flat JSON: 64 MiB + 1",
        &[&shown],
    );
    assert!(o.stderr.contains("larger than"), "{}", o.stderr);
}

/// Whole domains no reader may choke on, each with what it is.
fn hostile_domains() -> Vec<(&'static str, Vec<u8>)> {
    let deep = |n| {
        format!(
            "<domain><name>vm</name><devices>{}</devices></domain>",
            nested("<a>", "</a>", n)
        )
    };
    let laughs = (1..10).fold(String::from("<!ENTITY l0 \"lol\">"), |acc, i| {
        acc + &format!("<!ENTITY l{i} \"{}\">", format!("&l{};", i - 1).repeat(10))
    });
    vec![
        ("10,000 nested elements", deep(10_000).into_bytes()),
        ("20,000 nested elements", deep(20_000).into_bytes()),
        (
            "an external entity (XXE)",
            b"<!DOCTYPE d [<!ENTITY x SYSTEM \"file:///etc/shadow\">]><domain><name>&x;</name></domain>".to_vec(),
        ),
        (
            "entity expansion",
            format!("<!DOCTYPE d [{laughs}]><domain><name>&l9;</name></domain>").into_bytes(),
        ),
        ("a NUL in <name>", b"<domain><name>v\0m</name></domain>".to_vec()),
        (
            "two roots",
            b"<domain><name>a</name></domain><domain><name>b</name></domain>".to_vec(),
        ),
        ("not UTF-8", b"<domain><name>vm\xff</name></domain>".to_vec()),
        (
            "5 MiB of comment",
            format!("<domain><!--{}--></domain>", "x".repeat(5 << 20)).into_bytes(),
        ),
        ("empty", Vec::new()),
    ]
}

/// `check --domain-xml`, `libvirt patch` and the hook on one domain file. The hook under
/// the default `hook_policy: warn` lets the guest start (exit 0) on unreadable XML; exit 1
/// only for a refusal that names the guest.
fn domain_readers(file: &Path, xml: &[u8], case: &str) {
    let shown = file.display().to_string();
    let example = |args: &[&str]| {
        let mut c = tool();
        c.args(["--example", "dual-socket-pcie"]).args(args);
        c
    };
    let f = file.to_str().unwrap();
    run_checked(
        example(&["check", "--domain-xml", f]),
        None,
        case,
        &[&shown],
    );
    run_checked(
        example(&["libvirt", "patch", f, "--libvirt-version", "9.0"]),
        None,
        case,
        &[&shown],
    );
    let hook = example(&["hook", "run", "--dry-run", "vm", "prepare", "begin", "-"]);
    let o = run_checked(
        hook,
        Some(xml.to_vec()),
        &format!("{case} (hook)"),
        &["stdin"],
    );
    assert!(
        o.code == Some(0) || (o.code == Some(1) && o.stderr.starts_with("vfio-p2p hook: vm: ")),
        "{case} (hook): exit {:?}\n{}",
        o.code,
        o.stderr
    );
}

#[test]
fn domain_xml_mutations() {
    let mut rng = Rng::from_env("domain XML");
    let base = fs::read(fixture("libvirt/existing-domain.xml")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("domain.xml");
    for _ in 0..iterations(10) {
        let m = *rng.pick(MUTATIONS);
        let xml = mutate(&mut rng, m, &base);
        replace(&file, &xml);
        domain_readers(&file, &xml, &format!("domain XML: {m:?}"));
    }
    for (what, xml) in hostile_domains() {
        replace(&file, &xml);
        domain_readers(&file, &xml, &format!("domain XML: {what}"));
    }
    for kind in SPECIALS {
        make_special(&file, *kind);
        let shown = file.display().to_string();
        let f = file.to_str().unwrap();
        let case = format!("domain XML: {kind:?}");
        let mut check = tool();
        check.args(["--example", "dual-socket-pcie", "check", "--domain-xml", f]);
        run_checked(check, None, &case, &[&shown]);
        let mut patch = tool();
        patch.args(["--example", "dual-socket-pcie", "libvirt", "patch", f]);
        run_checked(patch, None, &case, &[&shown]);
    }
}

/// host.yaml: an alias bomb, deep nesting, a huge file, garbage.
fn hostile_yaml() -> Vec<(&'static str, Vec<u8>)> {
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        bomb += &format!("a{i}: &a{i} [{refs}]\n");
    }
    vec![
        ("an alias bomb", bomb.into_bytes()),
        (
            "100,000 nested lists",
            format!("p2p_level: {}", nested("[", "]", 100_000)).into_bytes(),
        ),
        (
            "100,000 nested maps",
            nested("{a: ", "}", 100_000).into_bytes(),
        ),
        (
            "2 MiB",
            format!("# {}\nhook_policy: warn\n", "x".repeat(2 << 20)).into_bytes(),
        ),
        ("a NUL", b"hook_policy: w\0arn\n".to_vec()),
        ("not UTF-8", b"hook_policy: \xff\n".to_vec()),
        ("a tab indent", b"reserved:\n\t- 0000:05:00.0\n".to_vec()),
    ]
}

/// host.yaml as `--host-config` of plan and below the hook's root; vm.yaml as gen's config.
fn yaml_readers(root: &Path, bytes: &[u8], case: &str) {
    let host_yaml = root.join("etc/vfio-p2p/host.yaml");
    replace(&host_yaml, bytes);
    let shown = host_yaml.display().to_string();
    let mut plan = tool();
    plan.args(["--example", "lab", "plan", "--host-config"])
        .arg(&host_yaml);
    run_checked(plan, None, case, &[&shown]);
    let hook = on_root(
        root,
        &["hook", "run", "--dry-run", "vm", "prepare", "begin", "-"],
    );
    let domain = fs::read(fixture("libvirt/existing-domain.xml")).unwrap();
    let o = run_checked(hook, Some(domain), &format!("{case} (hook)"), &[&shown]);
    if o.code == Some(2) {
        assert!(o.stderr.contains(&shown), "{case} (hook): {}", o.stderr);
    }
    let vm_yaml = root.join("vm.yaml");
    replace(&vm_yaml, bytes);
    let shown = vm_yaml.display().to_string();
    let mut gen = tool();
    gen.args(["--example", "dual-socket-pcie", "gen", "qemu", "--config"])
        .arg(&vm_yaml);
    run_checked(gen, None, &format!("{case} (vm.yaml)"), &[&shown]);
}

#[test]
fn yaml_mutations() {
    let mut rng = Rng::from_env("YAML");
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    lab_tree(&root);
    fs::create_dir_all(root.join("etc/vfio-p2p")).unwrap();
    let bases = [
        fs::read(fixture("../../configs/host.yaml")).unwrap(),
        fs::read(fixture("../../configs/vm.yaml")).unwrap(),
    ];
    for _ in 0..iterations(6) {
        let m = *rng.pick(MUTATIONS);
        let base = rng.pick(&bases).clone();
        let yaml = mutate(&mut rng, m, &base);
        yaml_readers(&root, &yaml, &format!("YAML: {m:?}"));
    }
    for (what, yaml) in hostile_yaml() {
        yaml_readers(&root, &yaml, &format!("YAML: {what}"));
    }
    let host_yaml = root.join("etc/vfio-p2p/host.yaml");
    for kind in SPECIALS {
        make_special(&host_yaml, *kind);
        let shown = host_yaml.display().to_string();
        let mut plan = tool();
        plan.args(["--example", "lab", "plan", "--host-config"])
            .arg(&host_yaml);
        run_checked(plan, None, &format!("host.yaml: {kind:?}"), &[&shown]);
    }
}

#[test]
fn nvidia_smi_capture_mutations() {
    let mut rng = Rng::from_env("nvidia-smi capture");
    let base = fs::read(fixture("nvidia-smi/h200x2-topo-m.txt")).unwrap();
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("topo-m.txt");
    let shown = file.display().to_string();
    let run = |case: &str| {
        let mut c = tool();
        c.args(["--example", "flat-vm", "plan", "--nvlink"])
            .arg(&file);
        run_checked(c, None, case, &[&shown])
    };
    for _ in 0..iterations(12) {
        let m = *rng.pick(MUTATIONS);
        replace(&file, &mutate(&mut rng, m, &base));
        run(&format!("nvidia-smi capture: {m:?}"));
    }
    let text = String::from_utf8(base).unwrap();
    let wide = format!(
        "{}\n{}",
        (0..5000)
            .map(|i| format!("GPU{i}"))
            .collect::<Vec<_>>()
            .join("\t"),
        text
    );
    replace(&file, wide.as_bytes());
    run("nvidia-smi capture: 5,000 columns");
    replace(&file, "NV18 ".repeat(1 << 20).as_bytes());
    run("nvidia-smi capture: 5 MiB");
    for kind in SPECIALS {
        make_special(&file, *kind);
        run(&format!("nvidia-smi capture: {kind:?}"));
    }
}

// ---- the reproducers of issue 15, one regression test each where the fix is here ----

/// #4: a FIFO as a device's `config` or `numa_node` hung every reader of the tree.
#[test]
fn fifos_in_the_tree_are_warnings_not_hangs() {
    for file in ["config", "numa_node"] {
        let t = tempfile::tempdir().unwrap();
        lab_tree(t.path());
        let path = device_dir(t.path(), LAB_GPU).join(file);
        make_special(&path, Special::Fifo);
        // (bind prints no read warnings: it only must not hang.)
        let bind = on_root(t.path(), &["bind", "--dry-run", LAB_GPU]);
        run_checked(bind, None, &format!("FIFO {file}: bind"), &[LAB_GPU]);
        for args in [&["topo"][..], &["plan"], &["check"]] {
            let case = format!("FIFO {file}: {args:?}");
            let o = run_checked(on_root(t.path(), args), None, &case, &[LAB_GPU]);
            let shown = path.display().to_string();
            assert!(
                o.stderr.contains(&shown) && o.stderr.contains("not a regular file"),
                "{case}: {}",
                o.stderr
            );
        }
    }
}

/// #7: an extended capability list at 0x100 pointing at itself on a switch port is a
/// corrupt list (named, with the offset), and the port's ACS is unknown, not absent.
#[test]
fn a_capability_loop_on_a_switch_port_is_reported_and_acs_unknown() {
    let t = tempfile::tempdir().unwrap();
    lab_tree(t.path());
    let config = device_dir(t.path(), LAB_PORT).join("config");
    let mut bytes = fs::read(&config).unwrap();
    // AER, version 1, next = 0x100: itself.
    bytes[0x100..0x104].copy_from_slice(&(0x0001u32 | 1 << 16 | 0x100 << 20).to_le_bytes());
    fs::write(&config, &bytes).unwrap();
    let o = run_checked(
        on_root(t.path(), &["plan", "--details"]),
        None,
        "extended capability loop",
        &[LAB_PORT],
    );
    let both = format!("{}{}", o.stdout, o.stderr);
    assert!(
        both.contains(&format!("{LAB_PORT}: corrupt capability list"))
            && both.contains("loops back to 0x100"),
        "{both}"
    );
    assert!(both.contains(&format!("{LAB_PORT} ACS unknown")), "{both}");
    assert!(!both.contains(&format!("{LAB_PORT} no ACS")), "{both}");
    let o = run_checked(on_root(t.path(), &["check"]), None, "check", &[LAB_PORT]);
    assert!(
        o.stderr.contains("corrupt capability list")
            || o.stdout.contains("corrupt capability list")
    );
}

/// #8: a GPU directory that is a `..` symlink: skipped with a warning naming the link,
/// and bind says the device is not there (it used to call the GPU "a PCI bridge").
#[test]
fn a_gpu_link_to_dot_dot_is_skipped_and_bind_says_so() {
    let t = tempfile::tempdir().unwrap();
    lab_tree(t.path());
    let link = t.path().join("sys/bus/pci/devices").join(LAB_GPU);
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("..", &link).unwrap();
    let o = run_checked(
        on_root(t.path(), &["bind", "--dry-run", LAB_GPU]),
        None,
        "GPU link to ..",
        &[LAB_GPU],
    );
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(!o.stderr.contains("bridge"), "{}", o.stderr);
    assert!(o.stderr.contains("no such PCI device"), "{}", o.stderr);
    assert!(o.stderr.contains("does not end in"), "{}", o.stderr);
}

/// #5: every capped read names the file that was too big.
#[test]
fn oversized_inputs_name_their_file() {
    let t = tempfile::tempdir().unwrap();
    let big = t.path().join("big.txt");
    fs::File::create(&big).unwrap().set_len(8 << 20).unwrap();
    let shown = big.display().to_string();
    let b = big.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &["--example", "flat-vm", "plan", "--nvlink", b],
        &["--example", "lab", "plan", "--host-config", b],
        &["--example", "lab", "check", "--domain-xml", b],
        &[
            "--example",
            "dual-socket-pcie",
            "gen",
            "qemu",
            "--config",
            b,
        ],
    ];
    for args in cases {
        let mut c = tool();
        c.args(args);
        let o = run_checked(c, None, &format!("{args:?}"), &[&shown]);
        assert_eq!(o.code, Some(2), "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains(&shown) && o.stderr.contains("larger than"),
            "{args:?}: {}",
            o.stderr
        );
    }
}

/// #6 and the hook's contract (docs/bind-and-hook.md): a FIFO as the GPU's config is a
/// warning naming the file under both policies, never a hang; the NVLink capture host.yaml
/// names being `/dev/zero` is a warning and the guest starts under `warn`, a refusal under
/// `deny`, both naming the file.
#[test]
fn the_hook_on_unreadable_inputs_follows_its_contract() {
    let t = tempfile::tempdir().unwrap();
    lab_tree(t.path());
    fs::create_dir_all(t.path().join("etc/vfio-p2p")).unwrap();
    let domain = format!(
        "<domain type='kvm'><name>vm</name><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
         <source><address domain='0x0000' bus='0x{}' slot='0x00' function='0x0'/></source>\
         </hostdev></devices></domain>",
        &LAB_GPU[5..7]
    );
    let hook = |yaml: &str| {
        fs::write(t.path().join("etc/vfio-p2p/host.yaml"), yaml).unwrap();
        let c = on_root(t.path(), &["hook", "run", "vm", "prepare", "begin", "-"]);
        run_checked(
            c,
            Some(domain.clone().into_bytes()),
            yaml,
            &["vm", "/dev/zero"],
        )
    };
    let zero = "nvlink: {source: nvidia-smi, file: /dev/zero}\n";
    for (policy, code) in [("warn", 0), ("deny", 1)] {
        let o = hook(&format!("hook_policy: {policy}\n{zero}"));
        assert_eq!(o.code, Some(code), "{}", o.stderr);
        assert!(o.stderr.contains("/dev/zero"), "{}", o.stderr);
        assert!(
            o.stderr.contains(&format!("(hook_policy: {policy})")),
            "{}",
            o.stderr
        );
    }
    make_special(&device_dir(t.path(), LAB_GPU).join("config"), Special::Fifo);
    for policy in ["warn", "deny"] {
        let o = hook(&format!("hook_policy: {policy}\n"));
        assert!(o.stderr.contains("not a regular file"), "{}", o.stderr);
        assert!(o.code == Some(0) || o.code == Some(1), "{}", o.stderr);
    }
}

/// #8: a flat dump's out-of-range `numa_node` is a warning naming the device and field.
#[test]
fn a_flat_dump_warning_names_the_device() {
    let t = tempfile::tempdir().unwrap();
    let dump = t.path().join("host.json");
    let mut parsed: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&fs::read(fixture("sysfs/h200x2-vm-sysfs.json")).unwrap()).unwrap();
    let first = parsed.keys().next().unwrap().clone();
    parsed[&first]["numa_node"] = serde_json::json!("4294967295");
    fs::write(&dump, serde_json::to_vec(&parsed).unwrap()).unwrap();
    let o = run_checked(on_root(&dump, &["topo"]), None, "numa_node", &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!(
            "warning: {first} numa_node: unexpected content \"4294967295\""
        )),
        "{}",
        o.stderr
    );
}

/// #9: error texts never repeat themselves (they said the dump's path twice, or
/// "Not a directory (os error 20)" twice).
#[test]
fn errors_say_their_cause_once() {
    let t = tempfile::tempdir().unwrap();
    let dump = t.path().join("host.json");
    let mut parsed: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&fs::read(fixture("sysfs/h200x2-vm-sysfs.json")).unwrap()).unwrap();
    let first = parsed.keys().next().unwrap().clone();
    parsed[&first]["iommu_group"] = serde_json::json!("4294967301");
    fs::write(&dump, serde_json::to_vec(&parsed).unwrap()).unwrap();
    let not_a_dir = t.path().join("host.json/x");
    for (root, cause) in [(&dump, "4294967301"), (&not_a_dir, "Not a directory")] {
        let o = run_checked(
            on_root(root, &["topo"]),
            None,
            "repeat",
            &[&dump.display().to_string()],
        );
        assert_eq!(o.code, Some(2), "{}", o.stderr);
        let shown = dump.display().to_string();
        assert_eq!(o.stderr.matches(shown.as_str()).count(), 1, "{}", o.stderr);
        assert_eq!(o.stderr.matches(cause).count(), 1, "{}", o.stderr);
    }
}
