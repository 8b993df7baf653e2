//! Every command the tool prints as a fix (in backquotes: `vfio-p2p …`) must run as
//! printed. Collects them from check, plan and place on every example and runs each one
//! against the same example (bind/unbind as a dry run, which is what a reader would try
//! first on an example).

use std::collections::BTreeSet;

const EXAMPLES: [&str; 4] = ["hgx-h100", "dual-socket-pcie", "lab", "flat-vm"];

fn run(example: &str, args: &[&str]) -> std::process::Output {
    crate::cli::vfio_p2p()
        .args(["--example", example])
        .args(args)
        .output()
        .unwrap()
}

/// The backquoted `vfio-p2p …` commands in `text`, without the program name.
fn fixes_in(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|c| c.strip_prefix("vfio-p2p "))
        .map(str::to_string)
        .collect()
}

fn outputs(example: &str) -> Vec<String> {
    let first_gpu = {
        let out = run(example, &["topo", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["gpus"][0]["bdf"].as_str().unwrap().to_string()
    };
    let mut runs: Vec<Vec<&str>> = vec![
        vec!["check", "--format", "json"],
        vec!["check"],
        vec!["plan"],
        vec!["plan", "--format", "json"],
        vec!["place", "--shape", "1x2"],
        vec!["place", "--shape", "9x9"],
        // Error paths print fixes too.
        vec!["plan", "--gpus", "0000:ff:1f.7"],
        vec!["check", "--gpus", "0000:ff:1f.7"],
        vec!["place", "--vm", "a=1", "--taken", "0000:ff:1f.7"],
    ];
    runs.push(vec!["check", "--gpus", &first_gpu]);
    runs.iter()
        .map(|args| {
            let out = run(example, args);
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr)
        })
        .collect()
}

#[test]
fn every_printed_fix_runs_as_printed() {
    let mut tried = BTreeSet::new();
    for example in EXAMPLES {
        let fixes: BTreeSet<String> = outputs(example).iter().flat_map(|t| fixes_in(t)).collect();
        for fix in fixes {
            assert!(
                !fix.contains(['"', '\'', '\\']),
                "{fix}: quoting not expected"
            );
            let mut args: Vec<&str> = fix.split_whitespace().collect();
            if matches!(args[0], "bind" | "unbind") {
                args.push("--dry-run");
            }
            let out = run(example, &args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let code = out.status.code().unwrap();
            // check and place report with exit 1/2; a usage error prints `error:`.
            assert!(
                !stderr.contains("error:") && !stderr.contains("Usage:") && code <= 2,
                "`vfio-p2p {fix}` printed on {example} does not run (exit {code}): {stderr}"
            );
            tried.insert(args[0].to_string());
        }
    }
    // The test is only as good as what it found: the bind fix and the check fix at least.
    for must in ["bind", "check", "topo"] {
        assert!(
            tried.contains(must),
            "no `vfio-p2p {must}` fix found; tried {tried:?}"
        );
    }
}

#[test]
fn fixes_are_found_in_text() {
    assert_eq!(
        fixes_in("x (`vfio-p2p bind 0000:05:00.0 0000:05:00.1`) and `lspci -D`"),
        ["bind 0000:05:00.0 0000:05:00.1"]
    );
}
