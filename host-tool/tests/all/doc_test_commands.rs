//! The `cargo test -p CRATE --lib FILTER` lines the docs give as proof run tests of that
//! crate (issue 40: docs/integrations.md's `-p vfio-p2p --lib proxmox_conf` ran none, the
//! parser's tests being in vfio-p2p-read): FILTER is a source file or module of CRATE.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace member whose package is `name`.
fn member_dir(name: &str) -> Option<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.strip_suffix("\","))
        .map(|m| root().join(m))
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|t| t.contains(&format!("name = \"{name}\"")))
        })
}

/// Whether some `.rs` file under `dir` is named `module` or declares it or a test of it.
fn has_module(dir: &Path, module: &str) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            return has_module(&p, module);
        }
        p.file_stem().is_some_and(|s| s == module)
            || std::fs::read_to_string(&p).is_ok_and(|t| {
                t.contains(&format!("mod {module}")) || t.contains(&format!("fn {module}"))
            })
    })
}

#[test]
fn the_docs_cargo_test_filters_name_modules_of_their_crate() {
    let mut docs = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap().flatten() {
        docs.push(entry.path());
    }
    let mut seen = 0;
    for doc in docs
        .iter()
        .filter(|d| d.extension().is_some_and(|e| e == "md"))
    {
        let text = std::fs::read_to_string(doc).unwrap();
        for command in text.split('`').filter(|c| c.starts_with("cargo test -p ")) {
            let words: Vec<&str> = command.split_whitespace().collect();
            let Some(lib) = words.iter().position(|w| *w == "--lib") else {
                continue;
            };
            let (krate, filter) = (words[3], words.get(lib + 1).copied().unwrap_or(""));
            let dir = member_dir(krate)
                .unwrap_or_else(|| panic!("{}: `{command}`: no crate {krate}", doc.display()));
            let module = filter.split("::").next().unwrap();
            assert!(
                !module.is_empty() && has_module(&dir.join("src"), module),
                "{}: `{command}` runs no test: {krate} has no module {module}",
                doc.display()
            );
            seen += 1;
        }
    }
    assert!(seen > 0, "no `cargo test -p … --lib …` in the docs");
}

/// The README's `cargo fmt`/`cargo clippy` are `.ci/run`'s own lines (issue 40: it showed
/// `cargo clippy -D warnings`, which cargo rejects: the lint flag goes after `--`).
#[test]
fn the_readmes_fmt_and_clippy_are_what_ci_runs() {
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let shown: Vec<&str> = readme
        .split('`')
        .filter(|c| c.starts_with("cargo fmt") || c.starts_with("cargo clippy"))
        .collect();
    assert!(shown.len() >= 2, "{shown:?}");
    for command in shown {
        assert!(
            ci.lines().map(str::trim).any(|l| l == command
                // `.ci/run` times its steps: `step NAME COMMAND`
                || l.strip_prefix("step ").and_then(|l| l.split_once(' ')).is_some_and(|(_, c)| c == command)),
            "README's `{command}` is not in .ci/run"
        );
    }
}

/// docs/gen.md's argv excerpt is a contiguous run of what the command prints (issue 40:
/// a `-device` line was missing between `-netdev` and the NIC's JSON).
#[test]
fn the_gen_md_argv_excerpt_is_what_gen_prints() {
    let doc = std::fs::read_to_string(root().join("docs/gen.md")).unwrap();
    let prompt = "$ vfio-p2p --example flat-vm gen qemu --config configs/vm.yaml";
    let block = doc.split(prompt).nth(1).expect("the excerpt");
    let (command, rest) = block.split_once('\n').unwrap();
    let excerpt: Vec<&str> = rest
        .split("```")
        .next()
        .unwrap()
        .lines()
        .filter(|l| *l != "...")
        .collect();
    let out = crate::cli::vfio_p2p()
        .current_dir(root())
        .args([
            "--example",
            "flat-vm",
            "gen",
            "qemu",
            "--config",
            "configs/vm.yaml",
        ])
        .args(command.split_whitespace())
        .output()
        .unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines
            .windows(excerpt.len())
            .any(|w| w == excerpt.as_slice()),
        "docs/gen.md's excerpt {excerpt:#?} is not a run of:\n{printed}"
    );
}
