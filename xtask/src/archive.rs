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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_in_sha256sum_format_without_themselves() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("b.tar.gz"), "abc").unwrap();
        fs::write(dir.path().join("a.deb"), "").unwrap();
        fs::write(dir.path().join("SHA256SUMS"), "stale").unwrap();
        sha256sums(dir.path()).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("SHA256SUMS")).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a.deb\n\
             ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  b.tar.gz\n"
        );
    }

    #[test]
    fn tarball_holds_one_directory_with_an_executable_agent() {
        let dir = tempfile::tempdir().unwrap();
        let (release, gen) = (dir.path().join("release"), dir.path().join("gen"));
        for d in [release.clone(), gen.join("man"), gen.join("completions")] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(release.join("vfio-p2p-agent"), "ELF").unwrap();
        fs::write(gen.join("man/vfio-p2p-agent.1.gz"), "page").unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let out = dir.path().join("a.tar.gz");
        agent_tarball(root, &release, &gen, &out, "agent-1").unwrap();
        let mut tar =
            tar::Archive::new(flate2::read::GzDecoder::new(fs::File::open(&out).unwrap()));
        let entries: Vec<(String, u32)> = tar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(entries[0], ("agent-1/vfio-p2p-agent".to_string(), 0o755));
        assert!(entries.contains(&("agent-1/man/vfio-p2p-agent.1.gz".to_string(), 0o644)));
        assert!(entries.iter().all(|(p, _)| p.starts_with("agent-1/")));
    }
}
