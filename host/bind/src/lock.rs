//! One change at a time: an exclusive `flock` on `RUN/vfio-p2p/lock`, waited for up to
//! a timeout. The kernel drops it when the process dies, so a crash never leaves it held.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::state::state_dir;

/// Held while it lives.
#[derive(Debug)]
pub struct BindLock {
    _lock: Flock<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: another vfio-p2p bind/unbind/hook is running (still held after {waited:?}); wait for it, or raise --lock-timeout")]
    Busy { path: PathBuf, waited: Duration },
}

impl BindLock {
    /// Takes the lock below `root`, polling until `timeout`.
    pub fn acquire(root: &std::path::Path, timeout: Duration) -> Result<BindLock, LockError> {
        let dir = state_dir(root);
        fs::create_dir_all(&dir).map_err(|source| LockError::Io {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join("lock");
        let start = Instant::now();
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| LockError::Io {
                path: path.clone(),
                source,
            })?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(BindLock { _lock: lock }),
                Err((f, Errno::EWOULDBLOCK)) => {
                    if start.elapsed() >= timeout {
                        return Err(LockError::Busy {
                            path,
                            waited: timeout,
                        });
                    }
                    file = f;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((_, e)) => {
                    return Err(LockError::Io {
                        path,
                        source: io::Error::from(e),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_then_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let held = BindLock::acquire(dir.path(), Duration::ZERO).unwrap();
        let e = BindLock::acquire(dir.path(), Duration::ZERO).unwrap_err();
        assert!(matches!(e, LockError::Busy { .. }), "{e}");
        assert!(e.to_string().contains("another vfio-p2p"), "{e}");
        drop(held);
        BindLock::acquire(dir.path(), Duration::ZERO).unwrap();
    }
}
