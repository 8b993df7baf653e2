//! The state directory (default `/var/lib/vfio-p2p`):
//!
//! ```text
//! plans/DOMAIN.json                 what `gen --state-dir` planned: CID and expectation
//! records/DOMAIN/BOOT_ID.json       one judged report per domain and boot (history)
//! records/DOMAIN/latest.json        the newest of them
//! ```
//!
//! Every file is written atomically (temporary file, fsync, rename, fsync of the directory),
//! so a reader sees the old or the new record, never half of one.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context as _};

use vfio_p2p_decide::fleet_verdict::{DomainPlan, Record};
use vfio_p2p_files::{read_input_file, write_atomic, InputFileError};

/// The default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/vfio-p2p";

/// Boots kept per domain; older records are removed when a new boot is stored.
pub const HISTORY_PER_DOMAIN: usize = 32;

/// The most a stored plan or record holds: a record is one guest report (at most
/// `MAX_GUEST_REPORT_BYTES`, 256 KiB) pretty-printed with its plan and verdict.
pub const MAX_STATE_FILE_BYTES: u64 = 8 << 20;

pub struct Store {
    root: PathBuf,
}

/// A domain name usable as a file name: what libvirt allows minus `/`, no leading dot.
pub fn valid_domain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
}

/// A boot id as the guest sends it (Linux writes a UUID): hex digits and dashes only.
pub fn valid_boot_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn plans_dir(&self) -> PathBuf {
        self.root.join("plans")
    }

    fn domain_dir(&self, domain: &str) -> PathBuf {
        self.root.join("records").join(domain)
    }

    /// Stores the plan of one domain (from `gen --state-dir`), replacing an earlier one.
    pub fn put_plan(&self, plan: &DomainPlan) -> anyhow::Result<PathBuf> {
        if !valid_domain(&plan.domain) {
            bail!(
                "'{}' cannot be a domain name in {} (letters, digits, . _ - + only)",
                plan.domain,
                self.root.display()
            );
        }
        let dir = self.plans_dir();
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{}.json", plan.domain));
        let json = serde_json::to_vec_pretty(plan).expect("plain data serializes");
        write_atomic(&path, &json).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Every stored plan by CID, and what is wrong with the others: an unreadable file, or
    /// a CID two domains claim (neither gets it), leaves the other domains served.
    pub fn plans_by_cid(&self) -> anyhow::Result<(HashMap<u32, DomainPlan>, Vec<String>)> {
        let dir = self.plans_dir();
        let mut out: HashMap<u32, DomainPlan> = HashMap::new();
        let mut problems = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((out, problems)),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut taken: HashMap<u32, String> = HashMap::new();
        for entry in entries {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if !name.ends_with(".json") || name.starts_with('.') {
                continue;
            }
            let plan = match read_plan(&path) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("{e:#}"));
                    continue;
                }
            };
            if let Some(other) = taken.get(&plan.cid) {
                problems.push(format!(
                    "CID {} is given to both '{other}' and '{}' in {}: neither is served until each VM has its own vsock CID",
                    plan.cid,
                    plan.domain,
                    dir.display()
                ));
                out.remove(&plan.cid);
                continue;
            }
            taken.insert(plan.cid, plan.domain.clone());
            out.insert(plan.cid, plan);
        }
        Ok((out, problems))
    }

    /// When the plans last changed (to reload them only then).
    pub fn plans_stamp(&self) -> Option<SystemTime> {
        fs::metadata(self.plans_dir())
            .and_then(|m| m.modified())
            .ok()
    }

    /// Stores `r` as its boot's record and as the domain's latest; prunes old boots.
    pub fn put_record(&self, r: &Record) -> anyhow::Result<()> {
        if !valid_domain(&r.domain) || !valid_boot_id(&r.boot_id) || r.boot_id == "latest" {
            bail!(
                "refusing to store a record named {}/{}",
                r.domain,
                r.boot_id
            );
        }
        let dir = self.domain_dir(&r.domain);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_vec_pretty(r).expect("plain data serializes");
        for name in [format!("{}.json", r.boot_id), "latest.json".to_string()] {
            let path = dir.join(name);
            write_atomic(&path, &json).with_context(|| format!("writing {}", path.display()))?;
        }
        self.prune(&dir)
    }

    fn prune(&self, dir: &Path) -> anyhow::Result<()> {
        let mut boots: Vec<(SystemTime, PathBuf)> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| is_boot_record(p))
            .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
            .collect();
        if boots.len() > HISTORY_PER_DOMAIN {
            boots.sort();
            for (_, p) in &boots[..boots.len() - HISTORY_PER_DOMAIN] {
                let _ = fs::remove_file(p);
            }
        }
        Ok(())
    }

    /// The latest record of every domain, by domain name.
    pub fn latest_records(&self) -> anyhow::Result<Vec<Record>> {
        let dir = self.root.join("records");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path().join("latest.json");
            if let Some(r) = read_record(&path)? {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.domain.cmp(&b.domain));
        Ok(out)
    }

    /// The latest record of `domain`, if any.
    pub fn latest(&self, domain: &str) -> anyhow::Result<Option<Record>> {
        read_record(&self.domain_dir(domain).join("latest.json"))
    }

    /// Every stored boot of `domain`, oldest first.
    /// Every record of `domain`, oldest first: none for a domain `gen --state-dir` registered
    /// whose guest has not reported yet; an error naming the state directory for a domain
    /// it has never heard of.
    pub fn history(&self, domain: &str) -> anyhow::Result<Vec<Record>> {
        let dir = self.domain_dir(domain);
        if !dir.exists() {
            let plan = self.plans_dir().join(format!("{domain}.json"));
            if valid_domain(domain) && plan.is_file() {
                return Ok(Vec::new());
            }
            bail!(
                "no domain '{domain}' in {}: no report and no plan (`gen --state-dir` registers one); \
                 `vfio-p2p verdicts --state-dir {}` lists the domains with reports",
                self.root.display(),
                self.root.display()
            );
        }
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if is_boot_record(&path) {
                out.extend(read_record(&path)?);
            }
        }
        out.sort_by_key(|r| r.received_at);
        Ok(out)
    }
}

/// `BOOT_ID.json`: not `latest.json`, not a temporary file.
fn is_boot_record(p: &Path) -> bool {
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    name.ends_with(".json") && name != "latest.json" && !name.starts_with('.')
}

fn read_plan(path: &Path) -> anyhow::Result<DomainPlan> {
    // like every file the tools read: regular files only, without blocking, bounded
    let bytes = read_input_file(path, MAX_STATE_FILE_BYTES, "stored plan")?;
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a plan written by vfio-p2p gen --state-dir",
            path.display()
        )
    })
}

fn read_record(path: &Path) -> anyhow::Result<Option<Record>> {
    match read_input_file(path, MAX_STATE_FILE_BYTES, "stored record") {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} is not a vfio-p2p record", path.display())),
        Err(InputFileError::Read { err, .. }) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}
