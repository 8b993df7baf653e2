//! What the real-tool tests share: finding the tools, running vfio-p2p, libvirt's schema
//! and argv generator, and the examples' NUMA nodes mapped onto this machine's.

use std::io::Write;
use std::path::Path;
use std::process::{Command as Process, Output, Stdio};

/// Whether `tool` can run; panics when it can't and skipping wasn't asked for.
pub fn have(tool: &str) -> bool {
    let found = Process::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var("VFIO_P2P_SKIP_REAL_TOOLS").as_deref() == Ok("1") {
            eprintln!("!!!!!!!! SKIPPING real-tool test: {tool} is not installed (VFIO_P2P_SKIP_REAL_TOOLS=1) !!!!!!!!");
            return false;
        }
        panic!("{tool} is not installed: apt-get install libvirt-clients libvirt-daemon-driver-qemu libxml2-utils qemu-system-x86 (or set VFIO_P2P_SKIP_REAL_TOOLS=1 to skip)");
    }
    true
}

pub fn vfio_p2p(args: &[&str], stdin: Option<&str>) -> String {
    let mut c = crate::cli::vfio_p2p();
    c.args(args);
    if let Some(s) = stdin {
        c.write_stdin(s);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "vfio-p2p {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn validate(path: &Path) {
    let out = Process::new("virt-xml-validate")
        .arg(path)
        .arg("domain")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "virt-xml-validate {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The QEMU argv libvirt makes of `xml`, run as an unprivileged user with a session daemon.
pub fn domxml_to_native(xml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    // Session mode as nobody: TCG domain, a CPU model TCG has.
    let xml = xml
        .replacen("<domain type='kvm'", "<domain type='qemu'", 1)
        .replacen("<domain type=\"kvm\"", "<domain type=\"qemu\"", 1)
        .replace("mode='host-passthrough'", "mode='maximum'");
    let file = dir.path().join("domain.xml");
    std::fs::write(&file, xml).unwrap();
    let run_as_root = is_root();
    let mut cmd = if run_as_root {
        let mut c = Process::new("runuser");
        c.args(["-u", "nobody", "--", "virsh"]);
        c
    } else {
        Process::new("virsh")
    };
    let perms = |p: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    perms(dir.path(), 0o777);
    perms(&file, 0o644);
    let d = dir.path().display().to_string();
    let out = cmd
        .args([
            "-c",
            "qemu:///session",
            "domxml-to-native",
            "--format",
            "qemu-argv",
            "--xml",
        ])
        .arg(&file)
        .env("HOME", &d)
        .env("XDG_CONFIG_HOME", format!("{d}/config"))
        .env("XDG_CACHE_HOME", format!("{d}/cache"))
        .env("XDG_DATA_HOME", format!("{d}/data"))
        .env("XDG_RUNTIME_DIR", format!("{d}/run"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "virsh domxml-to-native: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn is_root() -> bool {
    Process::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The NUMA nodes of the machine running the test.
pub fn nodes_here() -> Vec<u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// `text` with the host NUMA nodes this machine lacks (in `nodeset='…'` and
/// `host-nodes=…`) replaced by its first node: the examples are two-socket hosts, the
/// test machine may have one node, and libvirt and QEMU refuse a node that is not there.
pub fn on_this_machines_nodes(text: &str) -> String {
    let here = nodes_here();
    let map = |list: &str| {
        let mut out: Vec<u32> = list
            .split(',')
            .filter_map(|n| n.parse().ok())
            .map(|n| if here.contains(&n) { n } else { here[0] })
            .collect();
        out.dedup();
        out.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    };
    let mut out = String::new();
    let mut rest = text;
    loop {
        let next = ["nodeset='", "host-nodes="]
            .iter()
            .filter_map(|k| rest.find(k).map(|i| (i + k.len(), *k)))
            .min();
        let Some((start, key)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = if key == "nodeset='" {
            rest.find('\'').unwrap_or(rest.len())
        } else {
            rest.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len())
        };
        out.push_str(&map(&rest[..end]));
        rest = &rest[end..];
    }
}

/// `qemu-system-x86_64 FIRST… ARGS…` under `timeout SECS`, with `stdin` written to it (QMP
/// commands or monitor keys) and its output collected.
pub fn qemu_fed(secs: u32, first: &[&str], args: &[String], stdin: &[u8]) -> Output {
    let mut child = Process::new("timeout")
        .arg(secs.to_string())
        .arg("qemu-system-x86_64")
        .args(first)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}
