//! The structure rules of docs/architecture.md that the compiler does not check: the host
//! crates depend on each other only down the flow (read → model → decide → emit; within
//! the crates, the compiler enforces it), commands do not import each other, and functions
//! and files stay short. Test modules (`#[cfg(test)]` onwards) may use anything.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Production code of every file below `src/`, keyed by its path relative to `src/`.
fn production() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            // A module's tests in their own file (`mod tests;` → `tests.rs`) are all test code.
            let code = if p.ends_with("tests.rs") {
                String::new()
            } else {
                text.split("#[cfg(test)]").next().unwrap().to_string()
            };
            let rel = p.strip_prefix(&src).unwrap().display().to_string();
            (rel, code)
        })
        .collect()
}

#[test]
fn commands_do_not_import_each_other() {
    let mut broken = Vec::new();
    for (rel, code) in production() {
        if !rel.starts_with("commands/") || rel == "commands/mod.rs" {
            continue;
        }
        for line in code.lines() {
            if line.contains("super::") || line.contains("crate::commands") {
                broken.push(format!("{rel}: {}", line.trim()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Production lines (comments left out) of `files` that contain `needle`, as `file: line`.
fn lines_with(files: &[(String, String)], needle: &str) -> Vec<String> {
    files
        .iter()
        .flat_map(|(rel, code)| {
            code.lines()
                .filter(|l| !l.trim_start().starts_with("//") && l.contains(needle))
                .map(move |l| format!("{rel}: {}", l.trim()))
        })
        .collect()
}

/// Fabric Manager is opened in one place, the context's `open_fabric_manager`, which the
/// context build, `fabric` and the hook's release all go through (docs/architecture.md,
/// "Layering rules").
#[test]
fn fabric_manager_is_opened_in_one_place() {
    let opened = lines_with(&workspace_production(), "FmSession::open(");
    assert_eq!(
        opened,
        ["host-tool/src/context.rs: FmSession::open(address)"],
        "FmSession::open outside context::open_fabric_manager: reach FM through the context"
    );
}

/// Commands get the host, host.yaml and Fabric Manager from `context` (`Context`, or
/// `context::change::ChangeRoot` for the commands that change the host), never from a
/// reader of their own. (`HostSource::read` is private to the context: the compiler keeps
/// that one.)
#[test]
fn commands_reach_the_host_through_the_context() {
    let commands: Vec<(String, String)> = production()
        .into_iter()
        .filter(|(rel, _)| rel.starts_with("commands/"))
        .collect();
    let readers = [
        "FmSession::open",
        "HostConfig::load",
        "read_host",
        "flat_json::",
        "synth::example(",
        "fm_capture::",
    ];
    let broken: Vec<String> = readers
        .iter()
        .flat_map(|r| lines_with(&commands, r))
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The host crates and what each may depend on, in the order data flows (read → model →
/// decide → emit). The compiler keeps imports inside these edges; this keeps the edges.
const HOST_CRATES: &[(&str, &[&str])] = &[
    ("files", &[]),
    ("model", &[]),
    ("config", &["files", "model"]),
    ("fm-ffi", &[]),
    ("vfio-ioctl", &[]),
    ("process-exit", &[]),
    ("read", &["files", "model", "fm-ffi", "vfio-ioctl"]),
    ("decide", &["config", "model"]),
    ("emit", &["config", "decide", "model"]),
    ("bind", &["decide", "files", "model", "read", "fm-ffi"]),
    (
        "collector",
        &["config", "decide", "emit", "files", "model", "read"],
    ),
];

/// The `vfio-p2p-*` crates named in the `[dependencies]` of a Cargo.toml, short names.
fn host_dependencies(manifest: &str) -> Vec<String> {
    let mut section = "";
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]" {
            let name = line.split(['.', ' ', '=']).next().unwrap_or("");
            if let Some(short) = name.strip_prefix("vfio-p2p-") {
                found.push(short.to_string());
            }
        }
    }
    found
}

#[test]
fn host_crates_depend_down_the_flow() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host");
    let mut broken = Vec::new();
    for (name, allowed) in HOST_CRATES {
        let manifest = fs::read_to_string(host.join(name).join("Cargo.toml")).unwrap();
        for dep in host_dependencies(&manifest) {
            let shared = ["contract", "style", "vsock", "load-failure"].contains(&dep.as_str());
            if !shared && !allowed.contains(&dep.as_str()) {
                broken.push(format!("host/{name} depends on vfio-p2p-{dep}"));
            }
        }
    }
    let mut dirs: Vec<String> = fs::read_dir(&host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut known: Vec<String> = HOST_CRATES.iter().map(|(n, _)| n.to_string()).collect();
    known.sort();
    assert_eq!(dirs, known, "a host crate without its place in HOST_CRATES");
    assert!(
        broken.is_empty(),
        "dependencies against the flow:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_dependency_reader_sees_dependencies() {
    let manifest =
        "[package]\nname = \"vfio-p2p-emit\"\n[dependencies]\nvfio-p2p-model.workspace = true\n\
                    vfio-p2p-decide = { path = \"../decide\" }\nserde.workspace = true\n\
                    [dev-dependencies]\nvfio-p2p-read.workspace = true\n";
    assert_eq!(host_dependencies(manifest), ["model", "decide"]);
}

/// Production code of every crate in the workspace (test modules cut off, as above),
/// keyed by its path relative to the workspace root.
fn workspace_production() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    let crates = fs::read_dir(root)
        .unwrap()
        .chain(fs::read_dir(root.join("host")).unwrap())
        .chain(fs::read_dir(root.join("guest-agent")).unwrap());
    for krate in crates {
        let src = krate.unwrap().path().join("src");
        if src.join("lib.rs").is_file() || src.join("main.rs").is_file() {
            sources(&src, &mut files);
        }
    }
    files.sort();
    files
        .into_iter()
        .filter(|p| !p.ends_with("tests.rs"))
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            (p.strip_prefix(root).unwrap().display().to_string(), code)
        })
        .collect()
}

/// `(name, lines)` of every `fn` with a body in `code`, by brace counting on the
/// text with string and char literals and comments blanked out.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<String> = code.lines().map(without_literals).collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let (mut depth, mut opened) = (0i64, false);
        for (i, l) in lines[start..].iter().enumerate() {
            if !opened && l.contains(';') && !l.contains('{') {
                break; // a declaration without a body (trait item, extern)
            }
            depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
            opened |= l.contains('{');
            if opened && depth <= 0 {
                found.push((name.clone(), i + 1));
                break;
            }
        }
    }
    found
}

fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let qualifiers = ["pub", "const", "async", "unsafe", "extern", "\"C\""];
    if !words[..at]
        .iter()
        .all(|w| qualifiers.contains(w) || w.starts_with("pub("))
    {
        return None;
    }
    let name: String = words
        .get(at + 1)?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    Some(name)
}

/// A line with its comment, string and char literals removed (enough for brace counting).
fn without_literals(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A char literal ('{', '\''), or a lifetime ('a), which is kept.
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    for s in chars.by_ref() {
                        if s == '\'' {
                            break;
                        }
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn functions_and_files_stay_short() {
    const MAX_FN: usize = 120;
    const MAX_FILE: usize = 700;
    let mut broken = Vec::new();
    for (rel, code) in workspace_production() {
        let lines = code.lines().count();
        if lines > MAX_FILE {
            broken.push(format!(
                "{rel}: {lines} lines of production code (at most {MAX_FILE})"
            ));
        }
        for (name, len) in function_lengths(&code) {
            if len > MAX_FN {
                broken.push(format!("{rel}: fn {name} is {len} lines (at most {MAX_FN}): split it at its named steps"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_length_checker_counts_bodies() {
    let code = "pub fn a() {\n    let s = \"}}}\";\n    let c = '{';\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    // }\n    v\n}\ntrait T {\n    fn decl(&self);\n}\n";
    assert_eq!(
        function_lengths(code),
        [("a".to_string(), 4), ("b".to_string(), 4)]
    );
    let production = workspace_production();
    assert!(production
        .iter()
        .any(|(rel, _)| rel == "guest-agent/src/main.rs"));
    assert!(production
        .iter()
        .any(|(rel, _)| rel == "host/decide/src/clique_plan.rs"));
}

/// The integration tests link as one binary (`tests/all/main.rs`): a file in `tests/all/`
/// that main.rs does not name would never run, and a new file in `tests/` would link a
/// binary of its own.
#[test]
fn integration_tests_are_modules_of_one_binary() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = fs::read_to_string(tests.join("all/main.rs")).unwrap();
    let mut broken = Vec::new();
    for e in fs::read_dir(tests.join("all")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module != "main" && !main.lines().any(|l| l == format!("mod {module};")) {
            broken.push(format!(
                "tests/all/{name}: add `mod {module};` to tests/all/main.rs"
            ));
        }
    }
    for e in fs::read_dir(&tests).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        // fabric_rollback sets process environment the other tests must not inherit
        if name.ends_with(".rs") && name != "fabric_rollback.rs" {
            broken.push(format!("tests/{name}: move it to tests/all/ as a module"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The workspace's members, as the root Cargo.toml lists them (`"pci-config"`, `"host/read"`, …).
fn workspace_members() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let list = manifest
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("Cargo.toml has a members list");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The crate table of docs/architecture.md: the first cell of each row, `` `host/read/` ``.
fn documented_crates(doc: &str) -> Vec<String> {
    let table = doc
        .split("## The crates")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/architecture.md has a crate table");
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter_map(|cell| cell.strip_suffix('/'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_architecture_doc_lists_every_workspace_crate() {
    let doc = include_str!("../../../docs/architecture.md");
    let documented = documented_crates(doc);
    let members = workspace_members();
    assert!(members.len() > 10, "{members:?}");
    for m in &members {
        assert!(
            documented.contains(m),
            "docs/architecture.md's crate table has no row for `{m}/`"
        );
    }
    for d in &documented {
        assert!(
            members.contains(d),
            "docs/architecture.md lists `{d}/`, which is not a workspace member"
        );
    }
}

/// The crate roots that may hold `unsafe`, and why: the FFI crates, each small and with a
/// safe API (docs/architecture.md, "Layering rules").
const UNSAFE_ALLOWED: &[(&str, &str)] = &[
    ("vsock/src/lib.rs", "AF_VSOCK sockets"),
    ("host/fm-ffi/src/lib.rs", "Fabric Manager's client library"),
    ("host/vfio-ioctl/src/lib.rs", "the VFIO ioctls"),
    (
        "host/process-exit/src/lib.rs",
        "SIGPIPE's default, and _exit past a call abandoned in FM's library",
    ),
    (
        "tests/fm-standin/src/lib.rs",
        "a C library standing in for FM's",
    ),
    (
        "guest-agent/cuda-driver/src/lib.rs",
        "the CUDA driver API and NCCL",
    ),
    ("guest-agent/nvml/src/lib.rs", "NVML"),
    (
        "guest-agent/fd-passing/src/lib.rs",
        "SCM_RIGHTS descriptor passing",
    ),
];

/// Every crate root of the workspace (`src/lib.rs`, `src/main.rs`) that is not one of
/// [`UNSAFE_ALLOWED`] forbids `unsafe`.
#[test]
fn only_the_ffi_crates_allow_unsafe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut broken = Vec::new();
    let mut roots = 0;
    for member in workspace_members() {
        for file in ["src/lib.rs", "src/main.rs"] {
            let rel = format!("{member}/{file}");
            let Ok(text) = fs::read_to_string(root.join(&rel)) else {
                continue;
            };
            roots += 1;
            let allowed = UNSAFE_ALLOWED.iter().any(|(r, _)| rel.starts_with(r));
            if !allowed && !text.contains("#![forbid(unsafe_code)]") {
                broken.push(format!(
                    "{rel}: add #![forbid(unsafe_code)], or move its unsafe into an FFI crate"
                ));
            }
        }
    }
    assert!(roots > 15, "{roots} crate roots");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
