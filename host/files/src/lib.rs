//! Files as every stage touches them. Reading a whole input file that a user names
//! (`--domain-xml`, `libvirt patch FILE`, the hook's stdin): regular files only, opened
//! without blocking (a FIFO never hangs a reader), and never more than the format can hold.
//! Writing a state file ([`write_atomic`]): a reader sees the old or the new file, never half.

#![forbid(unsafe_code)]

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum InputFileError {
    #[error("cannot read {what} {path}: {err}")]
    Read {
        what: &'static str,
        path: String,
        err: std::io::Error,
    },
    #[error("{what} {path} is not a regular file; give the path of a file")]
    NotAFile { what: &'static str, path: String },
    #[error("{what} {path} is larger than {limit} bytes, which no {what} is")]
    TooLarge {
        what: &'static str,
        path: String,
        limit: u64,
    },
}

/// Reads at most `limit` bytes of the regular file `path`; `what` names the input in errors.
pub fn read_input_file(
    path: &Path,
    limit: u64,
    what: &'static str,
) -> Result<Vec<u8>, InputFileError> {
    let shown = path.display().to_string();
    let read_err = |err| InputFileError::Read {
        what,
        path: shown.clone(),
        err,
    };
    // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(InputFileError::NotAFile { what, path: shown });
    }
    read_capped(file, limit).map_err(|e| match e {
        Capped::TooLarge => InputFileError::TooLarge {
            what,
            path: shown.clone(),
            limit,
        },
        Capped::Io(err) => read_err(err),
    })
}

/// The most a sysfs or procfs attribute holds: one page.
pub const MAX_ATTRIBUTE_BYTES: u64 = 4096;

/// A small text file of sysfs or procfs (an attribute, `proc/cmdline`, a process's
/// `comm`), read as [`read_input_file`] reads: regular files only, without blocking, at
/// most [`MAX_ATTRIBUTE_BYTES`]; bytes that are not UTF-8 are replaced.
pub fn read_attribute_text(path: &Path, what: &'static str) -> Result<String, InputFileError> {
    let bytes = read_input_file(path, MAX_ATTRIBUTE_BYTES, what)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads at most `limit` bytes of a stream (stdin): more is an error naming `what`.
pub fn read_input_stream(
    stream: impl Read,
    limit: u64,
    what: &'static str,
    name: &str,
) -> Result<Vec<u8>, InputFileError> {
    read_capped(stream, limit).map_err(|e| match e {
        Capped::TooLarge => InputFileError::TooLarge {
            what,
            path: name.to_string(),
            limit,
        },
        Capped::Io(err) => InputFileError::Read {
            what,
            path: name.to_string(),
            err,
        },
    })
}

enum Capped {
    TooLarge,
    Io(std::io::Error),
}

fn read_capped(stream: impl Read, limit: u64) -> Result<Vec<u8>, Capped> {
    let mut bytes = Vec::new();
    stream
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(Capped::Io)?;
    if bytes.len() as u64 > limit {
        return Err(Capped::TooLarge);
    }
    Ok(bytes)
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically: temporary file beside it, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp-{}-{seq}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_fifos_devices_and_oversized_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_input_file(&fifo, 10, "domain XML")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a regular file") && e.contains("fifo"),
            "{e}"
        );
        let e = read_input_file(Path::new("/dev/zero"), 10, "domain XML")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        let e = read_input_file(&big, 10, "domain XML")
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than 10 bytes"), "{e}");
        std::fs::write(&big, b"0123456789").unwrap();
        assert_eq!(read_input_file(&big, 10, "domain XML").unwrap().len(), 10);
        let e = read_input_stream(std::io::repeat(0), 10, "domain XML", "<stdin>")
            .unwrap_err()
            .to_string();
        assert!(e.contains("<stdin>"), "{e}");
    }
}
