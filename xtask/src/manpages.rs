//! Man pages (one per command and subcommand, `clap_mangen`) and bash/zsh/fish completions
//! (`completions`), rendered from a binary's real clap definition.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use flate2::{Compression, GzBuilder};

use crate::man_sections;

/// Writes `DIR/man/NAME[-SUB…].1.gz` and `DIR/completions/{NAME.bash,_NAME,NAME.fish}`.
pub fn write(command: clap::Command, dir: &Path) -> Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        if d.exists() {
            fs::remove_dir_all(d)?;
        }
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    clap_mangen::generate_to(command.clone(), &man)
        .with_context(|| format!("writing man pages into {}", man.display()))?;
    // the top page also gets EXAMPLES, EXIT STATUS, ENVIRONMENT and FILES
    let name = command.get_name();
    let top = man.join(format!("{name}.1"));
    let page = fs::read_to_string(&top).with_context(|| format!("reading {}", top.display()))?;
    fs::write(
        &top,
        man_sections::insert(&page, &man_sections::for_binary(name)),
    )?;
    gzip_all(&man)?;
    crate::completions::write(&command, &completions)
}

/// Replaces every file in `dir` by its gzip, as Debian policy wants man pages: best
/// compression and no timestamp, so the same input gives the same bytes.
fn gzip_all(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let text = fs::read(&path)?;
        let mut gz_name = path.file_name().unwrap_or_default().to_os_string();
        gz_name.push(".gz");
        let out = fs::File::create(path.with_file_name(gz_name))?;
        let mut gz = GzBuilder::new().mtime(0).write(out, Compression::best());
        gz.write_all(&text)?;
        gz.finish()?;
        fs::remove_file(&path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::GzDecoder::new(fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn a_page_per_subcommand_and_three_completions() {
        let dir = tempfile::tempdir().unwrap();
        write(vfio_p2p::command(), dir.path()).unwrap();
        let page = gunzip(&dir.path().join("man/vfio-p2p-hook-install.1.gz"));
        assert!(page.contains(".TH vfio-p2p-hook-install 1"), "{page}");
        assert!(page.contains("prefix"), "{page}");
        let top = gunzip(&dir.path().join("man/vfio-p2p.1.gz"));
        assert!(top.contains("vfio\\-p2p\\-topo(1)"), "{top}");
        for section in ["EXAMPLES", "EXIT STATUS", "ENVIRONMENT", "FILES"] {
            assert!(
                top.contains(&format!(".SH \"{section}\"")),
                "{section}: {top}"
            );
        }
        for file in [
            "/etc/vfio\\-p2p/host.yaml",
            "/etc/libvirt/hooks/qemu.d/vfio\\-p2p",
            "/var/lib/vfio\\-p2p",
            "VFIO_P2P_LOG",
        ] {
            assert!(top.contains(file), "{file}: {top}");
        }
        for file in ["vfio-p2p.bash", "_vfio-p2p", "vfio-p2p.fish"] {
            let text = fs::read_to_string(dir.path().join("completions").join(file)).unwrap();
            assert!(text.contains("snapshot"), "{file}: {text}");
        }
        // the same definition gives the same bytes (gzip without a timestamp)
        let again = tempfile::tempdir().unwrap();
        write(vfio_p2p::command(), again.path()).unwrap();
        assert_eq!(
            fs::read(dir.path().join("man/vfio-p2p.1.gz")).unwrap(),
            fs::read(again.path().join("man/vfio-p2p.1.gz")).unwrap()
        );
    }

    #[test]
    fn the_agent_has_its_pages() {
        let dir = tempfile::tempdir().unwrap();
        write(vfio_p2p_agent::command(), dir.path()).unwrap();
        let page = gunzip(&dir.path().join("man/vfio-p2p-agent-scan.1.gz"));
        assert!(page.contains("sysfs\\-root"), "{page}");
        let top = gunzip(&dir.path().join("man/vfio-p2p-agent.1.gz"));
        for section in ["EXAMPLES", "EXIT STATUS", "ENVIRONMENT", "FILES"] {
            assert!(
                top.contains(&format!(".SH \"{section}\"")),
                "{section}: {top}"
            );
        }
        assert!(
            top.contains("qemu_fw_cfg/by_name/opt/vfio\\-p2p/expect.json"),
            "{top}"
        );
        assert!(dir.path().join("completions/_vfio-p2p-agent").is_file());
    }
}
