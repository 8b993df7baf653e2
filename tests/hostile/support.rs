//! The hostile-input suite's common part, included by `host-tool/tests/all/hostile.rs` and
//! `guest-agent/tests/hostile.rs` (`#[path]`): a seeded random source, the mutations
//! (truncations, random bytes, special files, deep and huge inputs) and the check every
//! run must pass: it ends within [`LIMIT`], neither panics nor aborts nor dies of a
//! signal, and either succeeds or prints an error that names its input.
//!
//! `VFIO_P2P_HOSTILE_SEED=N` replays a run (every failure prints its seed);
//! `VFIO_P2P_SOAK=N` runs N times as many random cases.

#![allow(dead_code)] // each suite uses its own part

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use assert_cmd::Command;

/// How long one run may take before it counts as a hang (it is killed then): a guard
/// against hangs, not a speed test (runs take well under a second; 10 s was missed once
/// at load 16 on a 2-core machine, while the inputs that hang never end).
pub const LIMIT: Duration = Duration::from_secs(30);

/// xorshift64*: small, and the same sequence everywhere for one seed.
pub struct Rng(u64);

impl Rng {
    /// From `VFIO_P2P_HOSTILE_SEED`, else from the clock (printed, so a failure can be replayed).
    pub fn from_env(suite: &str) -> Rng {
        let seed = std::env::var("VFIO_P2P_HOSTILE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{suite}: VFIO_P2P_HOSTILE_SEED={seed}");
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// How many random cases a suite runs: `base`, times `VFIO_P2P_SOAK` when set.
pub fn iterations(base: usize) -> usize {
    let soak: usize = std::env::var("VFIO_P2P_SOAK")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    base * soak.max(1)
}

/// One change to a file's content.
#[derive(Debug, Clone, Copy)]
pub enum Mutation {
    /// Cut at a random length.
    Truncate,
    /// A few bytes set to random values.
    Flip,
    /// Random bytes inserted at a random place.
    Splice,
    /// The whole content replaced by random bytes.
    Random,
}

pub const MUTATIONS: &[Mutation] = &[
    Mutation::Truncate,
    Mutation::Flip,
    Mutation::Splice,
    Mutation::Random,
];

pub fn mutate(rng: &mut Rng, m: Mutation, bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    match m {
        Mutation::Truncate => out.truncate(rng.below(bytes.len() + 1)),
        Mutation::Flip => {
            for _ in 0..=rng.below(8) {
                if !out.is_empty() {
                    let at = rng.below(out.len());
                    out[at] = rng.next() as u8;
                }
            }
        }
        Mutation::Splice => {
            let at = rng.below(out.len() + 1);
            let n = rng.below(64) + 1;
            let junk = rng.bytes(n);
            out.splice(at..at, junk);
        }
        Mutation::Random => {
            let n = rng.below(4096) + 1;
            out = rng.bytes(n);
        }
    }
    out
}

/// A path that is not a regular file of sensible size.
#[derive(Debug, Clone, Copy)]
pub enum Special {
    /// A FIFO with no writer: opening or reading it blocks a careless reader forever.
    Fifo,
    /// A symlink to `/dev/zero`: endless.
    DevZero,
    Directory,
    /// A symlink to itself.
    SelfLoop,
    /// A symlink to nothing.
    Dangling,
    /// A sparse regular file of 1 GiB.
    Sparse,
    /// An empty regular file.
    Empty,
}

pub const SPECIALS: &[Special] = &[
    Special::Fifo,
    Special::DevZero,
    Special::Directory,
    Special::SelfLoop,
    Special::Dangling,
    Special::Sparse,
    Special::Empty,
];

/// Replaces whatever is at `path` with `kind`.
pub fn make_special(path: &Path, kind: Special) {
    if let Ok(m) = fs::symlink_metadata(path) {
        if m.is_dir() {
            fs::remove_dir_all(path).unwrap();
        } else {
            fs::remove_file(path).unwrap();
        }
    }
    match kind {
        Special::Fifo => {
            let c = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: `c` is a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        }
        Special::DevZero => symlink("/dev/zero", path).unwrap(),
        Special::Directory => fs::create_dir(path).unwrap(),
        Special::SelfLoop => symlink(path.file_name().unwrap(), path).unwrap(),
        Special::Dangling => symlink("does-not-exist", path).unwrap(),
        Special::Sparse => fs::File::create(path).unwrap().set_len(1 << 30).unwrap(),
        Special::Empty => fs::write(path, b"").unwrap(),
    }
}

/// Writes `bytes` at `path`, replacing a symlink or special file there.
pub fn replace(path: &Path, bytes: &[u8]) {
    if fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        make_special(path, Special::Empty);
    }
    fs::write(path, bytes).unwrap();
}

/// Mutates the file at `path`: a special file one time in three, else a [`Mutation`] of
/// its content; says which.
pub fn mutate_file(rng: &mut Rng, path: &Path) -> String {
    if rng.below(3) == 0 {
        let kind = *rng.pick(SPECIALS);
        make_special(path, kind);
        format!("{kind:?}")
    } else {
        let m = *rng.pick(MUTATIONS);
        let old = fs::read(path).unwrap_or_default();
        replace(path, &mutate(rng, m, &old));
        format!("{m:?}")
    }
}

/// `depth` nested copies of `open`/`close` around nothing.
pub fn nested(open: &str, close: &str, depth: usize) -> String {
    let mut s = open.repeat(depth);
    s.push_str(&close.repeat(depth));
    s
}

/// What one run did.
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (with `stdin` when given) under [`LIMIT`] and checks it: no hang, no panic
/// or abort, no signal, and an error (a line with `error:` or `cannot run:`) naming one
/// of `names`.
/// `case` says what was done, for the failure message (with the seed printed earlier).
pub fn run_checked(
    mut cmd: Command,
    stdin: Option<Vec<u8>>,
    case: &str,
    names: &[&str],
) -> Outcome {
    cmd.timeout(LIMIT);
    if let Some(input) = stdin {
        cmd.write_stdin(input);
    }
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{case}: cannot run: {e}"));
    let took = started.elapsed();
    let o = Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let tail = |s: &str| s.chars().take(2000).collect::<String>();
    assert!(
        took < LIMIT,
        "{case}: still running after {LIMIT:?} (killed)\nstderr: {}",
        tail(&o.stderr)
    );
    assert!(
        out.status.signal().is_none() && !matches!(o.code, Some(101) | Some(134)),
        "{case}: ended by {:?} (panic, abort or signal)\nstderr: {}",
        out.status,
        tail(&o.stderr)
    );
    assert!(
        !o.stderr.contains("panicked") && !o.stderr.contains("has overflowed its stack"),
        "{case}: {}",
        tail(&o.stderr)
    );
    if o.code != Some(0) {
        let errors = o
            .stderr
            .lines()
            .filter(|l| l.contains("error:") || l.contains("cannot run:"));
        for line in errors {
            assert!(
                names.iter().any(|n| line.contains(n)),
                "{case}: exit {:?}, the error names none of {names:?}:\n{line}",
                o.code
            );
        }
    }
    o
}

/// Copies the tree at `from` to `to`, symlinks as symlinks.
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().unwrap();
        if t.is_symlink() {
            symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if t.is_dir() {
            copy_tree(&src, &dst);
        } else {
            fs::copy(&src, &dst).unwrap();
        }
    }
}
