//! The agent tarballs and `SHA256SUMS`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

/// `NAME.tar.gz` holding `NAME/`: the agent binary, its README and licences, man pages and
/// completions, for guests without dpkg. Entries are sorted, owned by root and dated 0,
/// so the same build gives the same bytes.
pub fn agent_tarball(
    root: &Path,
    release: &Path,
    gen: &Path,
    out: &Path,
    name: &str,
) -> Result<()> {
    let mut entries: Vec<(PathBuf, String, u32)> = vec![
        (
            release.join("vfio-p2p-agent"),
            "vfio-p2p-agent".into(),
            0o755,
        ),
        (
            root.join("guest-agent/README.md"),
            "README.md".into(),
            0o644,
        ),
        (root.join("LICENSE-APACHE"), "LICENSE-APACHE".into(), 0o644),
        (root.join("LICENSE-BSD"), "LICENSE-BSD".into(), 0o644),
    ];
    for sub in ["man", "completions"] {
        for file in sorted_files(&gen.join(sub))? {
            let file_name = file
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            entries.push((file, format!("{sub}/{file_name}"), 0o644));
        }
    }
    let gz = GzBuilder::new()
        .mtime(0)
        .write(fs::File::create(out)?, Compression::best());
    let mut tar = tar::Builder::new(gz);
    for (source, inside, mode) in &entries {
        let bytes = fs::read(source).with_context(|| format!("reading {}", source.display()))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_cksum();
        tar.append_data(&mut header, format!("{name}/{inside}"), bytes.as_slice())?;
    }
    tar.into_inner()?.finish()?;
    Ok(())
}

/// The regular files directly in `dir`, by name.
pub fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `SHA256SUMS` over every other file in `dist`, in `sha256sum -c`'s format.
pub fn sha256sums(dist: &Path) -> Result<()> {
    let mut sums = String::new();
    for file in sorted_files(dist)? {
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if name == "SHA256SUMS" {
            continue;
        }
        let digest = Sha256::digest(fs::read(&file)?);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        sums.push_str(&format!("{hex}  {name}\n"));
    }
    fs::File::create(dist.join("SHA256SUMS"))?.write_all(sums.as_bytes())?;
    Ok(())
}
