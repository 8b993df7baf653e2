//! What a real program printed, recorded under `tests/fixtures/DIR/` by that folder's
//! `record` script: its files and its transcript (`$ command` lines, each followed by what
//! the command printed).

/// `tests/fixtures/DIR/NAME`, whole.
pub fn fixture(dir: &str, name: &str) -> String {
    let path = format!(
        "{}/../tests/fixtures/{dir}/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The block of `tests/fixtures/DIR/transcript.txt` after the line starting with `$ CMD`,
/// up to the next `$ ` line.
pub fn block(dir: &str, cmd: &str) -> String {
    let t = fixture(dir, "transcript.txt");
    let start = t
        .find(&format!("$ {cmd}"))
        .unwrap_or_else(|| panic!("{cmd}: not in {dir}'s transcript"));
    let rest = &t[start..];
    let body = &rest[rest.find('\n').unwrap() + 1..];
    body[..body.find("\n$ ").unwrap_or(body.len())].to_string()
}

/// A lab boot kept under `tests/fixtures/DIR/` (`expect.json`, `wrong.json`, `console.txt`):
/// the agent's `expect` passed every GPU of the right expectation and none of the wrong one
/// (every clique moved by one), with the exit codes level B printed.
pub fn assert_agent_verdicts(dir: &str) {
    let statuses = |name: &str| -> Vec<String> {
        let report: serde_json::Value = serde_json::from_str(&fixture(dir, name)).unwrap();
        report["gpus"]
            .as_array()
            .unwrap_or_else(|| panic!("{dir}/{name}: no gpus"))
            .iter()
            .map(|g| g["status"].as_str().unwrap().to_string())
            .collect()
    };
    let right = statuses("expect.json");
    assert!(
        !right.is_empty() && right.iter().all(|s| s == "ok"),
        "{right:?}"
    );
    let wrong = statuses("wrong.json");
    assert!(
        !wrong.is_empty() && wrong.iter().all(|s| s != "ok"),
        "{wrong:?}"
    );
    let console = fixture(dir, "console.txt");
    assert!(console.contains("LAB-B-EXPECT-END rc=0"), "{console}");
    assert!(console.contains("LAB-B-WRONG-END rc=1"), "{console}");
}

/// The agent's scan (`scan`) of a lab boot saw the GPU passed from `host` at `guest` with the
/// `planned` clique (JSON null: none), its capability at `offset` when it has one.
pub fn assert_scan_found(
    scan: &serde_json::Value,
    host: &str,
    guest: &str,
    planned: &serde_json::Value,
    offset: &str,
) {
    let seen = scan["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["bdf"] == guest)
        .unwrap_or_else(|| panic!("{guest} ({host}) not in the agent's scan"));
    assert_eq!(&seen["clique"], planned, "{host} at {guest}");
    let offset = if planned.is_null() {
        serde_json::Value::Null
    } else {
        offset.into()
    };
    assert_eq!(seen["cap_offset"], offset, "{host} at {guest}");
}
