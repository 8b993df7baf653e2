//! vm.yaml's disk images, looked at once before `gen` writes a VM that boots from them.

use std::path::Path;

/// Why `path` cannot be a VM's disk here, or `None` when it can (a file or a block device).
pub fn unusable(path: &Path) -> Option<&'static str> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist"),
        Err(_) => Some("cannot be read (permissions?)"),
        Ok(m) if m.is_dir() => Some("is a directory"),
        Ok(_) => None,
    }
}
