//! The tools `dist` drives, and installing the missing ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::CrossTarget;

/// `cargo` run in the workspace root with one target directory, so that cargo-deb and
/// cargo-zigbuild find what the other built, and with the tools' virtual environment (zig,
/// cargo-zigbuild) first in `PATH` when `dist` made one.
pub struct Cargo {
    root: PathBuf,
    target: PathBuf,
}

impl Cargo {
    pub fn new(root: &Path, target: &Path) -> Self {
        Cargo {
            root: root.to_path_buf(),
            target: target.to_path_buf(),
        }
    }

    /// Where `dist` installs zig and cargo-zigbuild when the machine has neither: a Python
    /// virtual environment (Debian's own Python refuses `pip install` outside one).
    fn venv(&self) -> PathBuf {
        self.target.join("dist-tools/venv")
    }

    /// A program run with the venv's `bin/` first in `PATH`.
    fn program(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let bin = self.venv().join("bin");
        if bin.is_dir() {
            let mut paths = vec![bin];
            paths.extend(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ));
            if let Ok(path) = std::env::join_paths(paths) {
                c.env("PATH", path);
            }
        }
        c
    }

    fn command(&self, args: &[&str]) -> Command {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = self.program(&cargo);
        c.args(args)
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", &self.target);
        c
    }

    /// Runs `cargo ARGS`, echoing the command line; a failure names it.
    pub fn run(&self, args: &[&str]) -> Result<()> {
        run(self.command(args), &format!("cargo {}", args.join(" ")))
    }

    /// `cargo ARGS` with extra environment variables.
    pub fn run_with_env(&self, env: &[(&str, &str)], args: &[&str]) -> Result<()> {
        let mut command = self.command(args);
        command.envs(env.iter().copied());
        run(command, &format!("cargo {}", args.join(" ")))
    }

    /// Whether `cargo ARGS` runs and succeeds (a subcommand is installed).
    fn works(&self, args: &[&str]) -> bool {
        quietly_succeeds(&mut self.command(args))
    }
}

fn run(mut command: Command, shown: &str) -> Result<()> {
    eprintln!("+ {shown}");
    let status = command
        .status()
        .with_context(|| format!("starting `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

fn quietly_succeeds(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn python() -> &'static str {
    if quietly_succeeds(Command::new("python3").arg("--version")) {
        "python3"
    } else {
        "python"
    }
}

/// Installs what `dist` needs and this machine lacks: cargo-deb (crates.io) always; for
/// `targets` (the cross builds) zig and cargo-zigbuild (the Python package index, into
/// `target/dist-tools/venv`) and the Rust targets (rustup).
pub fn ensure(cargo: &Cargo, targets: &[&CrossTarget]) -> Result<()> {
    if !cargo.works(&["deb", "--version"]) {
        run(
            cargo.command(&["install", "--locked", "cargo-deb"]),
            "cargo install --locked cargo-deb",
        )?;
    }
    if targets.is_empty() {
        return Ok(());
    }
    // cargo-zigbuild runs `zig`, or `python3 -m ziglang` (the Python package's zig)
    let zig = quietly_succeeds(cargo.program("zig").arg("version"))
        || quietly_succeeds(cargo.program(python()).args(["-m", "ziglang", "version"]));
    if !zig || !cargo.works(&["zigbuild", "--help"]) {
        let venv = cargo.venv();
        let mut make = Command::new(python());
        make.arg("-m").arg("venv").arg(&venv);
        run(make, &format!("{} -m venv {}", python(), venv.display()))?;
        let pip = venv.join("bin/pip");
        let mut install = Command::new(&pip);
        install.args([
            "install",
            "--progress-bar",
            "off",
            "ziglang",
            "cargo-zigbuild",
        ]);
        run(
            install,
            &format!("{} install ziglang cargo-zigbuild", pip.display()),
        )?;
    }
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running `rustup target list --installed` (the agent is cross-built through rustup's targets)")?;
    let installed = String::from_utf8_lossy(&installed.stdout);
    for t in targets {
        if !installed.lines().any(|l| l.trim() == t.triple) {
            let mut add = Command::new("rustup");
            add.args(["target", "add", t.triple]);
            run(add, &format!("rustup target add {}", t.triple))?;
        }
    }
    Ok(())
}
