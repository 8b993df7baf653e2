//! The README's tour and workflow table say what the commands print and take.

const README: &str = include_str!("../../../README.md");

fn vfio_p2p(args: &[&str]) -> String {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", "200")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The tour's code block: its command and the lines it shows (`...` marks elisions).
fn tour() -> (String, Vec<&'static str>) {
    let start = README
        .find("## `vfio-p2p topo`: a tour")
        .expect("tour section");
    let block = README[start..]
        .split("```")
        .nth(1)
        .expect("tour code block");
    let mut lines = block.lines().filter(|l| !l.trim().is_empty());
    let command = lines.next().unwrap().trim_start_matches("$ ").to_string();
    (command, lines.collect())
}

#[test]
fn the_tour_shows_what_topo_prints() {
    let (command, shown) = tour();
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let out = vfio_p2p(&args);
    for line in shown {
        let pieces: Vec<&str> = line
            .split("...")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let found = out.lines().any(|o| {
            let mut rest = o;
            pieces.iter().all(|p| match rest.find(p) {
                Some(at) => {
                    rest = &rest[at + p.len()..];
                    true
                }
                None => false,
            })
        });
        assert!(
            found || pieces.is_empty(),
            "README tour line not in the output: {line:?}"
        );
    }
}

#[test]
fn the_workflow_table_names_real_flags() {
    let start = README
        .find("## The workflow, command by command")
        .expect("workflow");
    let table = &README[start..];
    let mut checked = 0;
    for row in table
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("`vfio-p2p "))
    {
        let cell = row.split('`').nth(1).unwrap();
        let words: Vec<&str> = cell.split_whitespace().collect();
        let sub: Vec<&str> = words[1..]
            .iter()
            .take_while(|w| {
                !w.starts_with('-') && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            })
            .copied()
            .collect();
        let mut help_args = sub.clone();
        help_args.push("--help");
        let help = vfio_p2p(&help_args);
        checked += 1;
        for flag in words
            .iter()
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
        {
            if let Some(flag) = flag
                .strip_prefix("--")
                .map(|f| f.split(['=', ' ']).next().unwrap())
            {
                assert!(
                    help.contains(&format!("--{flag}")),
                    "`{cell}`: --{flag} is not in `{}`",
                    help_args.join(" ")
                );
            }
        }
    }
    assert!(checked >= 6, "only {checked} workflow rows found");
}
