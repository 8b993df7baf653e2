//! The README's test command on a fresh machine (issue 29): `tests/setup` installs what is
//! missing (one list, shared with `.ci/run`), and `tests/run` runs every test binary and ends
//! non-zero after its summary. Run with stand-ins for dpkg, apt-get, id and cargo on PATH, so
//! that nothing is installed or built.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A directory of stand-ins: `dpkg -s P` succeeds for the packages in `$INSTALLED` (or all
/// with `INSTALLED=all`); `apt-get` and `cargo` log their arguments; `id -u` prints `$UID_IS`.
struct Stubs {
    dir: tempfile::TempDir,
}

impl Stubs {
    fn new() -> Stubs {
        let dir = tempfile::tempdir().unwrap();
        let stubs = [
            (
                "dpkg",
                r#"[ "$1" = -s ] || exit 2
[ "$INSTALLED" = all ] && exit 0
case " $INSTALLED " in *" $2 "*) exit 0 ;; esac
exit 1"#,
            ),
            ("apt-get", r#"echo "apt-get $*" >> "$STUB_LOG""#),
            ("id", r#"echo "${UID_IS:-0}""#),
            (
                "cargo",
                r#"echo "cargo $*" >> "$STUB_LOG"
echo "test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out"
echo "test a::b ... FAILED"
echo "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
echo "error: 1 target failed:"
exit 101"#,
            ),
        ];
        for (name, body) in stubs {
            let path = dir.path().join(name);
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        Stubs { dir }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn run(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(root().join(script));
        cmd.args(args)
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.dir.path().display()),
            )
            .env("STUB_LOG", self.dir.path().join("log"))
            .env_remove("VFIO_P2P_DIST");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn listed(env: &[(&str, &str)]) -> Vec<String> {
    let out = Stubs::new().run("tests/setup", &["--list"], env);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn setup_lists_what_every_test_drives() {
    let all = listed(&[]);
    for p in [
        "qemu-system-x86",
        "libvirt-clients",
        "libxml2-utils",
        "graphviz",
        "zsh",
        "fish",
        "mmdebstrap",
        "lintian",
    ] {
        assert!(all.iter().any(|l| l == p), "{p} not in {all:?}");
    }
    let no_dist = listed(&[("VFIO_P2P_DIST", "0")]);
    assert!(!no_dist.iter().any(|l| l == "lintian"), "{no_dist:?}");
    assert!(no_dist.iter().any(|l| l == "graphviz"), "{no_dist:?}");
}

#[test]
fn setup_as_root_installs_only_what_is_missing() {
    let stubs = Stubs::new();
    let installed = listed(&[])
        .into_iter()
        .filter(|p| p != "graphviz" && p != "fish")
        .collect::<Vec<_>>()
        .join(" ");
    let out = stubs.run("tests/setup", &[], &[("INSTALLED", &installed)]);
    assert!(out.status.success(), "{}", text(&out));
    let log = stubs.log();
    let calls: Vec<&str> = log.lines().collect();
    assert_eq!(
        calls,
        [
            "apt-get update -q",
            "apt-get install -y -q --no-install-recommends --allow-downgrades graphviz fish"
        ],
        "{}",
        text(&out)
    );
}

#[test]
fn setup_takes_bookworms_qemu_utils_with_qemu() {
    let stubs = Stubs::new();
    let out = stubs.run("tests/setup", &[], &[("INSTALLED", "")]);
    assert!(out.status.success(), "{}", text(&out));
    let log = stubs.log();
    let install = log.lines().find(|l| l.contains("install")).unwrap();
    let words: Vec<&str> = install.split(' ').collect();
    assert!(words.contains(&"qemu-utils/bookworm"), "{install}");
    assert!(!words.contains(&"qemu-utils"), "{install}");
    assert!(words.contains(&"qemu-system-x86"), "{install}");
}

#[test]
fn setup_with_nothing_missing_calls_no_apt() {
    let stubs = Stubs::new();
    let out = stubs.run("tests/setup", &[], &[("INSTALLED", "all")]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stubs.log(), "");
    assert!(text(&out).contains("are installed"), "{}", text(&out));
}

#[test]
fn setup_as_a_user_names_the_command_and_installs_nothing() {
    let stubs = Stubs::new();
    let out = stubs.run(
        "tests/setup",
        &[],
        &[("INSTALLED", "all-but-graphviz"), ("UID_IS", "1000")],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stubs.log(), "");
    let said = text(&out);
    assert!(
        said.contains("as root: apt-get update && apt-get install") && said.contains("graphviz"),
        "{said}"
    );
}

/// tests/run: every test binary runs (`--no-fail-fast`), the summary counts them all, and a
/// failure still ends the run non-zero.
#[test]
fn tests_run_runs_every_binary_and_fails_after_its_summary() {
    let stubs = Stubs::new();
    let out = stubs.run(
        "tests/run",
        &[],
        &[
            ("INSTALLED", "all"),
            ("VFIO_P2P_DIST", "0"),
            ("VFIO_P2P_STACKS", "none"),
            ("VFIO_P2P_LAB", "0"),
        ],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let cargo = stubs.log();
    assert!(
        cargo.contains("cargo test --no-fail-fast --workspace"),
        "{cargo}"
    );
    assert!(
        said.contains("summary: 7 passed, 1 failed, 1 ignored"),
        "{said}"
    );
    assert!(said.contains("    test a::b ... FAILED"), "{said}");
    // the later stages still ran (and said so) before the failure ended the run
    assert!(said.contains("lab: skipped (VFIO_P2P_LAB=0)"), "{said}");
    assert!(
        said.contains("setup: all "),
        "tests/run calls tests/setup: {said}"
    );
}

/// tests/hostile/reproduce.sh runs the binaries of `$CARGO_TARGET_DIR/release` when no
/// directory is given (it ran target/release's, stale or missing, whatever cargo built).
#[test]
fn reproduce_sh_runs_the_binaries_of_cargo_target_dir() {
    let target = tempfile::tempdir().unwrap();
    let release = target.path().join("release");
    fs::create_dir_all(&release).unwrap();
    let log = target.path().join("ran");
    for bin in ["vfio-p2p", "vfio-p2p-agent"] {
        let path = release.join(bin);
        // a stand-in: logs its arguments; `snapshot -o DIR` makes DIR
        fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{bin} $*\" >> {}\nif [ \"$3\" = snapshot ]; then mkdir -p \"$5\"; fi\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(root().join("tests/hostile/reproduce.sh"))
        .env("CARGO_TARGET_DIR", target.path())
        .env("HOSTILE_LIMIT", "5")
        .output()
        .unwrap();
    // some cases pass arguments that are not UTF-8 (issue 28), which the stand-in logs as is
    let ran = String::from_utf8_lossy(&fs::read(&log).unwrap_or_default()).into_owned();
    assert!(
        ran.lines()
            .any(|l| l.starts_with("vfio-p2p --example lab snapshot")),
        "{ran}\n{}",
        text(&out)
    );
    assert!(
        ran.lines().any(|l| l.starts_with("vfio-p2p-agent ")),
        "{ran}"
    );
}
