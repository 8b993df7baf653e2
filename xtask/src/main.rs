//! `cargo xtask dist`: everything a release ships, written to `$CARGO_TARGET_DIR/dist`
//! (default `target/dist`):
//!
//! - `vfio-p2p_<version>_amd64.deb`: the host tool, its man pages and completions, example
//!   configs, the collector's systemd units (cargo-deb, `host-tool/Cargo.toml`);
//! - `vfio-p2p_<version>_arm64.deb`: the same for Grace hosts (GH200, GB200 trays), built by
//!   `cargo zigbuild` like the agent (the `arm64` variant of the host tool's package);
//! - `vfio-p2p-agent_<version>_{amd64,arm64}.deb` and
//!   `vfio-p2p-agent-<version>-{x86_64,aarch64}-linux.tar.gz`: the guest agent built by
//!   `cargo zigbuild` against glibc 2.17, so it starts on any guest of the last ten years;
//! - `SHA256SUMS`.
//!
//! Missing tools (cargo-deb, zig and cargo-zigbuild, the Rust targets) are installed first,
//! each with the command that does it printed.

#![forbid(unsafe_code)]

mod archive;
mod completions;
mod man_sections;
mod manpages;
mod package;
mod tools;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use package::{Package, Progress};
use tools::Cargo;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The minimum glibc of the cross-built binaries: what RHEL/CentOS 7 ship, older than any
/// guest image still in use (and than any Grace host's distribution).
const CROSS_GLIBC: &str = "2.17";

/// An architecture cross-built by `cargo zigbuild` (the agent for guests, the host tool for Grace).
pub struct CrossTarget {
    /// Rust target triple (without the glibc suffix).
    pub triple: &'static str,
    /// Debian's name for the architecture.
    pub deb_arch: &'static str,
    /// The name in the tarball (`uname -m`).
    pub uname: &'static str,
}

/// The host tool's arm64 build: Grace hosts (GH200, GB200 NVL trays) are aarch64.
pub const HOST_ARM64: CrossTarget = CrossTarget {
    triple: "aarch64-unknown-linux-gnu",
    deb_arch: "arm64",
    uname: "aarch64",
};

pub const AGENT_TARGETS: [CrossTarget; 2] = [
    CrossTarget {
        triple: "x86_64-unknown-linux-gnu",
        deb_arch: "amd64",
        uname: "x86_64",
    },
    CrossTarget {
        triple: "aarch64-unknown-linux-gnu",
        deb_arch: "arm64",
        uname: "aarch64",
    },
];

const USAGE: &str = "usage: cargo xtask dist [--only PACKAGE[,PACKAGE...]] | cargo xtask man DIR

  dist     build the .deb packages, agent tarballs and SHA256SUMS into $CARGO_TARGET_DIR/dist
           (cleared first: it holds what this run built); each step is printed with its time
  --only   just these packages: vfio-p2p-amd64 (the host .deb; needs only cargo-deb),
           vfio-p2p-arm64, vfio-p2p-agent-amd64, vfio-p2p-agent-arm64 (an agent's .deb and tarball)
  man DIR  write both binaries' man pages and completions into DIR/vfio-p2p and DIR/vfio-p2p-agent";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["dist"] => dist(&Package::ALL),
        ["dist", "--only", list] => match Package::parse_list(list) {
            Ok(packages) => dist(&packages),
            Err(e) => {
                eprintln!("xtask: error: {e}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        ["man", dir] => man(Path::new(dir)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// `$CARGO_TARGET_DIR` as cargo reads it (relative to the current directory), else `target/`.
fn target_dir(root: &Path) -> Result<PathBuf> {
    Ok(match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::env::current_dir()?.join(dir),
        None => root.join("target"),
    })
}

/// The host tool's clap definition as the man pages and completions show it: `--example`
/// with the embedded examples' names (the binary takes any name and lists them on a wrong one).
fn host_command() -> clap::Command {
    let mut names: Vec<&str> = vfio_p2p_read::synth::EXAMPLES
        .iter()
        .map(|(n, _)| *n)
        .collect();
    names.push("list");
    vfio_p2p::command().mut_arg("example", |a| {
        a.value_parser(clap::builder::PossibleValuesParser::new(names))
    })
}

/// `cargo xtask man DIR`: what `dist` puts in the packages, for a look or a test.
fn man(dir: &Path) -> Result<()> {
    manpages::write(host_command(), &dir.join("vfio-p2p"))?;
    manpages::write(vfio_p2p_agent::command(), &dir.join("vfio-p2p-agent"))
}

fn dist(packages: &[Package]) -> Result<()> {
    let root = workspace_root();
    let target = target_dir(&root)?;
    let dist = target.join("dist");
    let cargo = Cargo::new(&root, &target);
    let mut progress = Progress::new(packages);
    let cross: Vec<&CrossTarget> = packages.iter().filter_map(|p| p.cross_target()).collect();
    progress.step("the tools (cargo-deb; zig, cargo-zigbuild and Rust targets for cross builds)");
    tools::ensure(&cargo, &cross)?;
    if dist.exists() {
        fs::remove_dir_all(&dist).with_context(|| format!("clearing {}", dist.display()))?;
    }
    fs::create_dir_all(&dist)?;
    for &package in packages {
        progress.step(&format!("{} ({})", package.name(), package.what()));
        match package {
            Package::HostAmd64 => host_native(&cargo, &target, &dist)?,
            Package::HostArm64 => host_cross(&cargo, &target, &dist, &HOST_ARM64)?,
            Package::AgentAmd64 => agent(&cargo, &root, &target, &dist, &AGENT_TARGETS[0])?,
            Package::AgentArm64 => agent(&cargo, &root, &target, &dist, &AGENT_TARGETS[1])?,
        }
    }
    progress.step("SHA256SUMS");
    archive::sha256sums(&dist)?;
    println!("dist: {} ({})", dist.display(), progress.elapsed());
    for entry in archive::sorted_files(&dist)? {
        let len = fs::metadata(&entry)?.len();
        println!(
            "  {:>10}  {}",
            len,
            entry.file_name().unwrap_or_default().to_string_lossy()
        );
    }
    Ok(())
}

/// The host package for this machine's architecture (amd64).
fn host_native(cargo: &Cargo, target: &Path, dist: &Path) -> Result<()> {
    // cargo-deb takes its assets from `target/release/...`, which it maps to the real
    // target directory (and to `target/<triple>/release` with --target): the generated
    // man pages and completions go there, next to the binary they describe.
    manpages::write(host_command(), &target.join("release/gen/vfio-p2p"))?;
    let host_deb = dist.join(format!("vfio-p2p_{VERSION}_amd64.deb"));
    // Built as the README's `cargo run --release -p vfio-p2p` builds it: cargo-deb would build
    // the whole workspace (its assets under target/release are globs), whose unified features
    // (clap's, nix's, rustix's) differ from the host tool's own, and `cargo run` would then
    // compile those crates again.
    cargo.run(&["build", "--release", "--locked", "-p", "vfio-p2p"])?;
    cargo.run(&[
        "deb",
        "--no-build",
        "-p",
        "vfio-p2p",
        "-o",
        path_str(&host_deb)?,
    ])
}

/// The agent for T: its .deb and its tarball.
fn agent(cargo: &Cargo, root: &Path, target: &Path, dist: &Path, t: &CrossTarget) -> Result<()> {
    let release = target.join(t.triple).join("release");
    let gen = release.join("gen/vfio-p2p-agent");
    manpages::write(vfio_p2p_agent::command(), &gen)?;
    zigbuild(cargo, "vfio-p2p-agent", t)?;
    let deb = dist.join(format!("vfio-p2p-agent_{VERSION}_{}.deb", t.deb_arch));
    cargo.run(&[
        "deb",
        "-p",
        "vfio-p2p-agent",
        "--no-build",
        "--no-strip",
        "--target",
        t.triple,
        "-o",
        path_str(&deb)?,
    ])?;
    let name = format!("vfio-p2p-agent-{VERSION}-{}-linux", t.uname);
    archive::agent_tarball(
        root,
        &release,
        &gen,
        &dist.join(format!("{name}.tar.gz")),
        &name,
    )
}

/// `cargo zigbuild` of PACKAGE for T against glibc [`CROSS_GLIBC`], stripped by the linker
/// (zig's), so that no cross binutils are needed.
fn zigbuild(cargo: &Cargo, package: &str, t: &CrossTarget) -> Result<()> {
    let zig_target = format!("{}.{CROSS_GLIBC}", t.triple);
    cargo.run_with_env(
        &[("CARGO_PROFILE_RELEASE_STRIP", "symbols")],
        &[
            "zigbuild",
            "--release",
            "--locked",
            "-p",
            package,
            "--target",
            &zig_target,
        ],
    )
}

/// The host package for another architecture: the binary cross-built like the agent, its man
/// pages and completions where cargo-deb looks with `--target`, the package from the variant
/// named after the Debian architecture (its own Depends, as dpkg-shlibdeps cannot read a
/// foreign binary).
fn host_cross(cargo: &Cargo, target: &Path, dist: &Path, t: &CrossTarget) -> Result<()> {
    let release = target.join(t.triple).join("release");
    manpages::write(host_command(), &release.join("gen/vfio-p2p"))?;
    zigbuild(cargo, "vfio-p2p", t)?;
    let deb = dist.join(format!("vfio-p2p_{VERSION}_{}.deb", t.deb_arch));
    cargo.run(&[
        "deb",
        "-p",
        "vfio-p2p",
        "--no-build",
        "--no-strip",
        "--target",
        t.triple,
        "--variant",
        t.deb_arch,
        "-o",
        path_str(&deb)?,
    ])
}

fn path_str(path: &Path) -> Result<&str> {
    match path.to_str() {
        Some(s) => Ok(s),
        None => bail!(
            "{} is not UTF-8; set CARGO_TARGET_DIR to a UTF-8 path",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    /// The packages' Version is the workspace version with cargo-deb's `-1`; a changelog
    /// whose newest entry says otherwise is what lintian calls a version mismatch.
    #[test]
    fn changelog_names_this_version() {
        let changelog = super::workspace_root().join("packaging/debian/changelog");
        let text = std::fs::read_to_string(&changelog).unwrap();
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("vfio-p2p ({}-1) ", super::VERSION)),
            "{}: the newest entry is `{first}`; add one for {}-1",
            changelog.display(),
            super::VERSION
        );
    }
}
