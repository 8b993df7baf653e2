//! What `dist` can build (`--only` names them) and the step lines it prints while it does.

use std::time::Instant;

use crate::{CrossTarget, AGENT_TARGETS, HOST_ARM64};

/// One shipped package: a .deb (and, for the agent, its tarball).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Package {
    HostAmd64,
    HostArm64,
    AgentAmd64,
    AgentArm64,
}

impl Package {
    /// Everything a release ships, in the order `dist` builds it.
    pub const ALL: [Package; 4] = [
        Package::HostAmd64,
        Package::HostArm64,
        Package::AgentAmd64,
        Package::AgentArm64,
    ];

    /// The name `--only` takes.
    pub fn name(self) -> &'static str {
        match self {
            Package::HostAmd64 => "vfio-p2p-amd64",
            Package::HostArm64 => "vfio-p2p-arm64",
            Package::AgentAmd64 => "vfio-p2p-agent-amd64",
            Package::AgentArm64 => "vfio-p2p-agent-arm64",
        }
    }

    /// What building it means, for the step line.
    pub fn what(self) -> &'static str {
        match self {
            Package::HostAmd64 => "host tool, cargo build --release, cargo-deb",
            Package::HostArm64 => "host tool for Grace, cargo zigbuild, cargo-deb",
            Package::AgentAmd64 | Package::AgentArm64 => {
                "guest agent for glibc 2.17, cargo zigbuild, cargo-deb, tarball"
            }
        }
    }

    /// The target `cargo zigbuild` builds it for; `None`: a plain build for this machine.
    pub fn cross_target(self) -> Option<&'static CrossTarget> {
        match self {
            Package::HostAmd64 => None,
            Package::HostArm64 => Some(&HOST_ARM64),
            Package::AgentAmd64 => Some(&AGENT_TARGETS[0]),
            Package::AgentArm64 => Some(&AGENT_TARGETS[1]),
        }
    }

    /// `--only`'s list: names separated by commas, each known, none twice; built in
    /// [`Package::ALL`]'s order whatever the order given.
    pub fn parse_list(list: &str) -> Result<Vec<Package>, String> {
        let mut chosen = Vec::new();
        for name in list.split(',').map(str::trim) {
            let Some(p) = Package::ALL.into_iter().find(|p| p.name() == name) else {
                let known: Vec<&str> = Package::ALL.iter().map(|p| p.name()).collect();
                return Err(format!(
                    "--only: no package '{name}'; the packages are {}",
                    known.join(", ")
                ));
            };
            if chosen.contains(&p) {
                return Err(format!("--only: '{name}' is named twice"));
            }
            chosen.push(p);
        }
        Ok(Package::ALL
            .into_iter()
            .filter(|p| chosen.contains(p))
            .collect())
    }
}

/// `dist [N/M m:ss] WHAT` lines on stderr, so a cold run (cargo-deb and zig installed,
/// several release builds) says where it is from its first second.
pub struct Progress {
    start: Instant,
    step: usize,
    steps: usize,
}

impl Progress {
    /// Steps: the tools, one per package, the checksums.
    pub fn new(packages: &[Package]) -> Self {
        Progress {
            start: Instant::now(),
            step: 0,
            steps: packages.len() + 2,
        }
    }

    pub fn step(&mut self, what: &str) {
        self.step += 1;
        eprintln!(
            "dist [{}/{} {}] {what}",
            self.step,
            self.steps,
            self.elapsed()
        );
    }

    /// Time since the start, `m:ss`.
    pub fn elapsed(&self) -> String {
        let s = self.start.elapsed().as_secs();
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_takes_known_names_once_in_build_order() {
        assert_eq!(
            Package::parse_list("vfio-p2p-agent-arm64,vfio-p2p-amd64").unwrap(),
            [Package::HostAmd64, Package::AgentArm64]
        );
        let e = Package::parse_list("vfio-p2p").unwrap_err();
        assert!(
            e.contains("no package 'vfio-p2p'") && e.contains("vfio-p2p-amd64, vfio-p2p-arm64"),
            "{e}"
        );
        let e = Package::parse_list("vfio-p2p-amd64,vfio-p2p-amd64").unwrap_err();
        assert!(e.contains("named twice"), "{e}");
    }

    #[test]
    fn the_host_package_alone_needs_no_cross_tools() {
        assert!(Package::HostAmd64.cross_target().is_none());
        for p in [Package::HostArm64, Package::AgentAmd64, Package::AgentArm64] {
            assert!(p.cross_target().is_some(), "{p:?}");
        }
    }
}
