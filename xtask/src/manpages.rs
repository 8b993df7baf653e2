//! Man pages (one per command and subcommand, `clap_mangen`) and bash/zsh/fish completions
//! (`clap_complete`), rendered from a binary's real clap definition.

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap_complete::Shell;
use flate2::{Compression, GzBuilder};

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
    let name = command.get_name().to_string();
    clap_mangen::generate_to(command.clone(), &man)
        .with_context(|| format!("writing man pages into {}", man.display()))?;
    gzip_all(&man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut command.clone(), &name, &completions).with_context(
            || format!("writing {shell} completions into {}", completions.display()),
        )?;
    }
    Ok(())
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
