//! The shipped completions complete (issue 29): `cargo xtask man DIR` renders them as `dist`
//! does, then each shell's own completion runs on a typed line — bash's function with
//! COMP_WORDS/COMP_CWORD, zsh's in an interactive shell on a pseudo-terminal (TAB), fish's
//! `complete -C` — and must offer subcommands, options, `--format` values and example names,
//! and never the agent's internal `cross-process-child`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The rendered completions, once per test binary.
fn rendered() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("man")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

fn completions(bin: &str) -> PathBuf {
    rendered().join(bin).join("completions")
}

/// The shell, or a failure that says how to get it (tests/setup installs zsh and fish).
fn shell(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "{name} is not installed: tests/setup (as root) installs it, or apt-get install {name}"
    );
    let mut cmd = Command::new("timeout");
    cmd.args(["60", name]);
    cmd
}

fn run(mut cmd: Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What each shell offers after each line: one list of candidates per line.
fn bash(bin: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let script = completions(bin).join(format!("{bin}.bash"));
    let function = format!("_{}", bin.replace('-', "__"));
    let mut program = format!("source {}\n", script.display());
    program.push_str(
        "t() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); \
         FN \"$1\" \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"; \
         echo ==; printf '%s\\n' \"${COMPREPLY[@]}\"; }\n"
            .replace("FN", &function)
            .as_str(),
    );
    for line in lines {
        // the words as bash splits them, with an empty last word after a trailing space
        let mut words: Vec<String> = line.split_whitespace().map(|w| format!("'{w}'")).collect();
        if line.ends_with(' ') {
            words.push("''".into());
        }
        program.push_str(&format!("t {}\n", words.join(" ")));
    }
    let mut cmd = shell("bash");
    cmd.args(["--norc", "-c", &program]);
    blocks(&run(cmd))
}

fn zsh(bin: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let mut got = zsh_session(bin, lines);
    // A line the pseudo-terminal session answered with nothing is typed again in a session of
    // its own, twice at most: on a loaded machine (load ~15) one such answer was seen once
    // (`bench --format`), and a completion that is really missing stays empty every time.
    for (i, line) in lines.iter().enumerate() {
        for _ in 0..2 {
            if got.get(i).is_some_and(|b| b.is_empty()) {
                got[i] = zsh_session(bin, &[line]).pop().unwrap_or_default();
            }
        }
    }
    got
}

fn zsh_session(bin: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = shell("zsh");
    cmd.arg("-f")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/complete.zsh"))
        .arg(completions(bin))
        .arg(out.path())
        .args(lines);
    run(cmd);
    blocks(&std::fs::read_to_string(out.path()).unwrap())
}

fn fish(bin: &str, lines: &[&str]) -> Vec<Vec<String>> {
    let script = completions(bin).join(format!("{bin}.fish"));
    let mut program = format!("source {}\n", script.display());
    for line in lines {
        program.push_str(&format!("echo ==; complete -C '{line}'\n"));
    }
    let mut cmd = shell("fish");
    cmd.args(["-N", "-c", &program]);
    // fish prints `candidate<TAB>description`
    blocks(&run(cmd))
        .into_iter()
        .map(|b| {
            b.into_iter()
                .map(|c| c.split('\t').next().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Splits the output at `==` lines (zsh's are `== LINE`).
fn blocks(text: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for line in text.lines() {
        if line == "==" || line.starts_with("== ") {
            out.push(Vec::new());
        } else if let Some(block) = out.last_mut() {
            if !line.is_empty() {
                block.push(line.to_string());
            }
        }
    }
    out
}

/// (typed line, candidates that must be offered, candidates that must not)
type Case = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

const HOST: &[Case] = &[
    ("vfio-p2p ", &["topo", "gen", "libvirt", "qemu-wrap"], &[]),
    (
        "vfio-p2p gen ",
        &["qemu", "libvirt", "cloud-hypervisor", "nccl", "proxmox"],
        &["vfio-p2p.bash"],
    ),
    (
        "vfio-p2p gen --format ",
        &["argv", "shell", "json"],
        &["qemu"],
    ),
    (
        "vfio-p2p --example ",
        &["hgx-h100", "dual-socket-pcie", "lab", "flat-vm", "list"],
        &["vfio-p2p.bash"],
    ),
    ("vfio-p2p gen qemu --example h", &["hgx-h100"], &["lab"]),
    ("vfio-p2p topo --fo", &["--format"], &["--gpus"]),
    ("vfio-p2p hook ", &["install", "run"], &[]),
];

const AGENT: &[Case] = &[
    (
        "vfio-p2p-agent ",
        &["scan", "bench", "cross-process", "report"],
        &["cross-process-child"],
    ),
    (
        "vfio-p2p-agent bench --format ",
        &["table", "json", "prometheus"],
        &[],
    ),
    ("vfio-p2p-agent bench --si", &["--simulate"], &[]),
];

type Shell = fn(&str, &[&str]) -> Vec<Vec<String>>;

fn check(name: &str, shell: Shell) {
    let mut failures = Vec::new();
    for (bin, cases) in [("vfio-p2p", HOST), ("vfio-p2p-agent", AGENT)] {
        let lines: Vec<&str> = cases.iter().map(|c| c.0).collect();
        let got = shell(bin, &lines);
        assert_eq!(got.len(), cases.len(), "{name} {bin}: {got:?}");
        for ((line, want, unwanted), offered) in cases.iter().zip(&got) {
            let missing: Vec<_> = want
                .iter()
                .filter(|w| !offered.iter().any(|o| o == *w))
                .collect();
            let extra: Vec<_> = unwanted
                .iter()
                .filter(|u| offered.iter().any(|o| o == *u))
                .collect();
            if !missing.is_empty() || !extra.is_empty() {
                failures.push(format!(
                    "{name}: `{line}<TAB>` offers {offered:?}: missing {missing:?}, should not offer {extra:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bash_completes_below_the_top_level() {
    check("bash", bash);
}

#[test]
fn zsh_completes_below_the_top_level() {
    check("zsh", zsh);
}

#[test]
fn fish_completes_below_the_top_level() {
    check("fish", fish);
}
