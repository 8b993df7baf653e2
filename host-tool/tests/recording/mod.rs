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
