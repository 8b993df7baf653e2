//! bash, zsh and fish completions (`clap_complete`) rendered from a binary's real clap
//! definition, with what clap_complete leaves out or gets wrong put right:
//!
//! - hidden subcommands (the agent's `cross-process-child`, which only the agent starts) are
//!   dropped: clap_complete offers every subcommand, hidden or not;
//! - bash below the top level: for a binary name with a hyphen, the generated script's
//!   dispatch (`vfio__p2p__subcmd__gen`) never matches its case arms
//!   (`vfio__subcmd__p2p__subcmd__gen`), so nothing below the top level completed; the arms
//!   are renamed to what the dispatch uses, and every dispatch target is checked to have one;
//! - fish: a value after a top-level option (`vfio-p2p --example <TAB>`) fell back to file
//!   names, since the "no subcommand yet" test failed on the option still missing its value;
//!   and positional arguments' values (`vfio-p2p gen <TAB>`: qemu, libvirt, …) were not offered.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Command;
use clap_complete::Shell;

/// Writes `DIR/{NAME.bash,_NAME,NAME.fish}`.
pub fn write(command: &Command, dir: &Path) -> Result<()> {
    let mut visible = without_hidden(command);
    let name = command.get_name().to_string();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut visible, &name, &mut text);
        let mut text = String::from_utf8(text).context("clap_complete wrote non-UTF-8")?;
        match shell {
            Shell::Bash => text = bash_arms_match_dispatch(&text, &name)?,
            Shell::Fish => {
                text = fish_option_values_before_the_subcommand(&text, &name)?;
                fish_positional_values(&visible, &name, &mut Vec::new(), &mut text);
            }
            _ => {}
        }
        let file = dir.join(match shell {
            Shell::Bash => format!("{name}.bash"),
            Shell::Zsh => format!("_{name}"),
            _ => format!("{name}.fish"),
        });
        fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}

/// `command` without its hidden subcommands, at every level. clap has no way to remove a
/// subcommand, so each level is rebuilt: the same name, texts, version, arguments and settings
/// that the completions render, and the visible subcommands.
fn without_hidden(command: &Command) -> Command {
    let mut out = Command::new(command.get_name().to_string())
        .args(command.get_arguments().cloned())
        .subcommands(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(without_hidden),
        )
        .visible_aliases(command.get_visible_aliases().map(str::to_string))
        .disable_help_subcommand(command.is_disable_help_subcommand_set())
        .disable_help_flag(command.is_disable_help_flag_set())
        .disable_version_flag(command.is_disable_version_flag_set())
        .subcommand_required(command.is_subcommand_required_set())
        .args_conflicts_with_subcommands(command.is_args_conflicts_with_subcommands_set());
    if let Some(about) = command.get_about() {
        out = out.about(about.clone());
    }
    if let Some(about) = command.get_long_about() {
        out = out.long_about(about.clone());
    }
    if let Some(version) = command.get_version() {
        out = out.version(version.to_string());
    }
    if let Some(name) = command.get_bin_name() {
        out = out.bin_name(name.to_string());
    }
    out
}

/// Renames the case arms of clap_complete's bash script to the names its dispatch gives
/// `cmd`, and fails when a dispatch target still has no arm (a completion that would fall
/// back to file names).
fn bash_arms_match_dispatch(script: &str, bin: &str) -> Result<String> {
    let dispatch = bin.replace('-', "__");
    let arms = bin.replace('-', "__subcmd__");
    let fixed = if dispatch == arms {
        script.to_string()
    } else {
        script.replace(&arms, &dispatch)
    };
    let arm_names: Vec<&str> = fixed
        .lines()
        .filter_map(|l| l.trim().strip_suffix(')'))
        .collect();
    for line in fixed.lines() {
        let Some(target) = line.trim().strip_prefix("cmd=\"") else {
            continue;
        };
        let target = target.trim_end_matches('"');
        if !target.is_empty() && !arm_names.contains(&target) {
            bail!("the bash completion of {bin} dispatches to {target}, which has no case arm");
        }
    }
    Ok(fixed)
}

/// In `__fish_NAME_needs_command`, an argparse failure (a top-level option whose value is
/// being typed) means no subcommand yet, so the top-level options' values complete.
fn fish_option_values_before_the_subcommand(script: &str, bin: &str) -> Result<String> {
    let function = format!("function __fish_{}_needs_command\n", bin.replace('-', "_"));
    let Some(start) = script.find(&function) else {
        bail!("the fish completion of {bin} has no `{}`", function.trim());
    };
    let end = start + script[start..].find("\nend\n").unwrap_or(0);
    let body = &script[start..end];
    let old = "\n    or return\n";
    if !body.contains(old) {
        bail!("the fish completion of {bin}: `{}` changed; look again at what it does when argparse fails", function.trim());
    }
    let body = body.replace(old, "\n    or return 0\n");
    Ok(format!("{}{body}{}", &script[..start], &script[end..]))
}

/// Appends fish completions for the values of positional arguments (clap_complete writes
/// none), under the conditions clap_complete uses for the options of the same subcommand.
fn fish_positional_values(command: &Command, bin: &str, path: &mut Vec<String>, out: &mut String) {
    let function = bin.replace('-', "_");
    let condition = match &path[..] {
        [] => format!("__fish_{function}_needs_command"),
        [sub] => format!("__fish_{function}_using_subcommand {sub}"),
        [sub, nested] => {
            format!("__fish_{function}_using_subcommand {sub}; and __fish_seen_subcommand_from {nested}")
        }
        _ => return,
    };
    for arg in command.get_positionals().filter(|a| !a.is_hide_set()) {
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_string())
            .collect();
        if values.is_empty() {
            continue;
        }
        let values = values.join(" ");
        out.push_str(&format!(
            "complete -c {bin} -n \"{condition}; and not __fish_seen_subcommand_from {values}\" -f -a \"{values}\"\n"
        ));
    }
    for sub in command.get_subcommands() {
        path.push(sub.get_name().to_string());
        fish_positional_values(sub, bin, path, out);
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bash_dispatch_target_has_an_arm() {
        for command in [vfio_p2p::command(), vfio_p2p_agent::command()] {
            let mut text = Vec::new();
            let name = command.get_name().to_string();
            clap_complete::generate(Shell::Bash, &mut command.clone(), &name, &mut text);
            let fixed = bash_arms_match_dispatch(&String::from_utf8(text).unwrap(), &name);
            assert!(fixed.is_ok(), "{name}: {fixed:?}");
            assert!(fixed.unwrap().contains("__subcmd__gen)") || name.ends_with("agent"));
        }
    }

    #[test]
    fn a_script_whose_dispatch_misses_its_arms_is_refused() {
        let script = "case \"${cmd},${i}\" in\n    x,gen)\n        cmd=\"x__subcmd__gen\"\n        ;;\nesac\ncase \"${cmd}\" in\n    x)\n    ;;\nesac\n";
        let err = bash_arms_match_dispatch(script, "x").unwrap_err();
        assert!(err.to_string().contains("x__subcmd__gen"), "{err}");
    }

    #[test]
    fn hidden_subcommands_are_left_out() {
        let agent = without_hidden(&vfio_p2p_agent::command());
        let names: Vec<&str> = agent.get_subcommands().map(|s| s.get_name()).collect();
        assert!(names.contains(&"cross-process"), "{names:?}");
        assert!(!names.contains(&"cross-process-child"), "{names:?}");
    }
}
