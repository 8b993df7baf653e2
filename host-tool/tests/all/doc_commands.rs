//! Every command README.md and docs/*.md show that can run on any machine (those on an
//! embedded `--example`) runs, and prints what the docs show after it (issue 29). A shown
//! line must be in the output, `...` standing for anything; a line of `...` alone for lines
//! left out. The output may be in the command's own block (after `$ command`) or in the
//! next block, introduced by "prints (on `--example NAME`…)".

const DOCS: &[(&str, &str)] = &[
    ("README.md", include_str!("../../../README.md")),
    ("docs/gen.md", include_str!("../../../docs/gen.md")),
    (
        "docs/integrations.md",
        include_str!("../../../docs/integrations.md"),
    ),
    (
        "docs/bind-and-hook.md",
        include_str!("../../../docs/bind-and-hook.md"),
    ),
    ("docs/fleet.md", include_str!("../../../docs/fleet.md")),
    (
        "docs/architecture.md",
        include_str!("../../../docs/architecture.md"),
    ),
];

/// A documented command: where, its arguments after `vfio-p2p`, the lines shown for it.
struct Shown {
    at: String,
    args: Vec<String>,
    output: Vec<String>,
}

/// The arguments of `line` when it is a vfio-p2p command (`$ ` prompt, `cargo run … --`
/// and `[optional]` parts dropped), else None.
fn command(line: &str) -> Option<Vec<String>> {
    let line = line.trim().trim_start_matches("$ ");
    let rest = line
        .strip_prefix("vfio-p2p ")
        .or_else(|| line.strip_prefix("cargo run --release -p vfio-p2p -- "))?;
    let mut args = Vec::new();
    let mut depth = 0;
    for word in rest.split_whitespace() {
        if word == "#" || word.starts_with('#') && depth == 0 {
            break;
        }
        depth += word.matches('[').count();
        if depth == 0 {
            args.push(word.to_string());
        }
        depth -= word.matches(']').count().min(depth);
    }
    Some(args)
}

/// Fenced blocks of `text` with the prose before each.
fn blocks(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut block: Option<Vec<String>> = None;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            match block.take() {
                Some(b) => {
                    out.push((std::mem::take(&mut prose), b));
                }
                None => block = Some(Vec::new()),
            }
        } else if let Some(b) = block.as_mut() {
            b.push(line.to_string());
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    out
}

fn shown_commands() -> Vec<Shown> {
    let mut found = Vec::new();
    for (file, text) in DOCS {
        let blocks = blocks(text);
        for (i, (_, lines)) in blocks.iter().enumerate() {
            let mut current: Option<Shown> = None;
            for (n, line) in lines.iter().enumerate() {
                if let Some(args) = command(line) {
                    found.extend(current.take());
                    current = Some(Shown {
                        at: format!("{file}, block {} line {}", i + 1, n + 1),
                        args,
                        output: Vec::new(),
                    });
                } else if let Some(c) = current.as_mut() {
                    // only after a `$ command`: other lines of a command block are more commands
                    if lines.iter().any(|l| l.starts_with("$ ")) {
                        c.output.push(line.clone());
                    }
                }
            }
            if let Some(mut c) = current.take() {
                // "prints (on `--example NAME`…):" before the next block: that block is its output
                if let Some((prose, next)) = blocks.get(i + 1) {
                    let intro = prose.trim_end();
                    if let Some(at) = intro.rfind("prints (on `--example ") {
                        if intro.ends_with(':') && c.output.is_empty() {
                            let name = intro[at + 22..].split('`').next().unwrap();
                            c.args
                                .splice(0..0, ["--example".to_string(), name.to_string()]);
                            c.output = next.clone();
                        }
                    }
                }
                found.push(c);
            }
        }
    }
    found
}

/// Whether `shown` is a line of `output`, `...` standing for anything.
fn has_line(output: &str, shown: &str) -> bool {
    let pieces: Vec<&str> = shown
        .split("...")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    pieces.is_empty()
        || output.lines().any(|o| {
            let mut rest = o;
            pieces.iter().all(|p| match rest.find(p) {
                Some(at) => {
                    rest = &rest[at + p.len()..];
                    true
                }
                None => false,
            })
        })
}

#[test]
fn documented_example_commands_print_what_the_docs_show() {
    let mut ran = 0;
    let mut compared = 0;
    let mut failures = Vec::new();
    for c in shown_commands() {
        if !c.args.iter().any(|a| a == "--example") {
            continue; // needs a real host
        }
        // a wide terminal, as the docs' blocks are
        let out = crate::cli::vfio_p2p()
            .env("COLUMNS", "200")
            .args(&c.args)
            .output()
            .unwrap();
        ran += 1;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            failures.push(format!(
                "{}: vfio-p2p {} failed: {}",
                c.at,
                c.args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        compared += usize::from(!c.output.is_empty());
        for line in &c.output {
            if !has_line(&stdout, line) {
                failures.push(format!(
                    "{}: vfio-p2p {} does not print {line:?}",
                    c.at,
                    c.args.join(" ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // README's install block and tour, its cargo run line, integrations' Proxmox lines
    assert!(ran >= 4 && compared >= 2, "ran {ran}, compared {compared}");
}

/// Golden files the docs point at exist where they say (`…/snapshots/NAME-*.snap`).
#[test]
fn documented_snapshot_paths_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for (file, text) in DOCS {
        for span in text.split('`').skip(1).step_by(2) {
            if !span.contains("snapshots/") || span.contains(' ') {
                continue;
            }
            let (dir, pattern) = span.rsplit_once('/').unwrap();
            let (prefix, suffix) = pattern.split_once('*').unwrap_or((pattern, ""));
            let found = std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(prefix) && name.ends_with(suffix)
                })
            });
            assert!(found, "{file}: `{span}` names no file");
            checked += 1;
        }
    }
    assert!(checked >= 1);
}
