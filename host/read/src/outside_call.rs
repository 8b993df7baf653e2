//! Calls to the outside world that may never come back, each given a deadline and its output
//! read bounded: programs (`incus query`, `virsh --version`, `qemu --version`) through
//! [`run_program`], and a library whose calls may block forever (Fabric Manager's
//! `libnvfm.so.1`) through a [`Worker`] thread that the caller stops waiting for.
//!
//! A blocked call is abandoned, never joined: the worker thread stays blocked in the library
//! and the process exits without it (returning from `main` ends every thread). Nothing the
//! caller holds — the bind lock, the records — is held by the worker, so a deadline that
//! passes releases them as any other error does.

use std::io::Read;
use std::marker::PhantomData;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long a program the tool runs to ask about the host may take.
pub const PROGRAM_DEADLINE: Duration = Duration::from_secs(10);
/// How much of each of its output streams is kept (the rest is read and dropped).
pub const MAX_PROGRAM_OUTPUT: usize = 4 << 20;

/// What a program printed, each stream cut at [`MAX_PROGRAM_OUTPUT`].
#[derive(Debug)]
pub struct ProgramOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// A stream was longer than the limit and was cut.
    pub cut: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("could not run {shown}: {source}")]
    Spawn {
        shown: String,
        source: std::io::Error,
    },
    #[error("{shown} did not finish within {} s and was killed", .after.as_secs_f64())]
    Deadline { shown: String, after: Duration },
}

/// Reads `stream` to its end keeping at most `max` bytes; says whether it was cut.
fn read_bounded(mut stream: impl Read, max: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 64 << 10];
    let mut cut = false;
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        cut |= n > room;
    }
    (kept, cut)
}

/// Reads a child's stream on its own thread; the answer arrives on the returned channel.
fn spawn_reader(
    stream: Option<impl Read + Send + 'static>,
    max: usize,
) -> mpsc::Receiver<(Vec<u8>, bool)> {
    let (tx, rx) = mpsc::channel();
    if let Some(stream) = stream {
        let _ = thread::Builder::new()
            .name("program-output".into())
            .spawn(move || {
                let _ = tx.send(read_bounded(stream, max));
            });
    }
    rx
}

/// Runs `command` (stdin closed) until it exits or `deadline` passes (then it is killed),
/// keeping at most `max_output` bytes of each stream. `shown` names it in errors.
pub fn run_program(
    command: &mut Command,
    shown: &str,
    deadline: Duration,
    max_output: usize,
) -> Result<ProgramOutput, ProgramError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ProgramError::Spawn {
            shown: shown.to_string(),
            source,
        })?;
    let out = spawn_reader(child.stdout.take(), max_output);
    let err = spawn_reader(child.stderr.take(), max_output);
    let until = Instant::now() + deadline;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProgramError::Deadline {
                    shown: shown.to_string(),
                    after: deadline,
                });
            }
        }
    };
    // A grandchild may still hold the pipes open: wait for the rest only until the deadline.
    let left = until.saturating_duration_since(Instant::now()) + Duration::from_millis(100);
    let (stdout, cut_out) = out.recv_timeout(left).unwrap_or_default();
    let left = until.saturating_duration_since(Instant::now()) + Duration::from_millis(100);
    let (stderr, cut_err) = err.recv_timeout(left).unwrap_or_default();
    Ok(ProgramOutput {
        status,
        stdout,
        stderr,
        cut: cut_out || cut_err,
    })
}

/// Set once any worker of this process was abandoned in a call.
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Whether a call of this process was abandoned, its thread still blocked inside a library.
/// Such a process must end by `_exit` once its output is flushed: a normal exit runs the
/// library's exit handlers and destructors, which may wait for a lock the blocked thread
/// holds — and the process would never end.
pub fn a_call_was_abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

/// A call on a [`Worker`] that did not come back in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stuck {
    /// This call passed the deadline; the worker is abandoned.
    ThisCall,
    /// An earlier call is still blocked: this one was not made.
    Earlier,
}

type Job<S> = Box<dyn FnOnce(&mut Option<S>) + Send>;

/// One thread that owns state `S` (made and used only there: `S` need not be `Send`) and
/// runs calls on it one at a time; [`Worker::call`] waits for each at most the deadline.
pub struct Worker<S> {
    jobs: Option<mpsc::Sender<Job<S>>>,
    deadline: Duration,
    blocked: std::cell::Cell<bool>,
    _state: PhantomData<fn() -> S>,
}

impl<S: 'static> Worker<S> {
    /// Starts the thread, `name`d; its state starts as `None`.
    pub fn start(name: &str, deadline: Duration) -> std::io::Result<Worker<S>> {
        let (tx, rx) = mpsc::channel::<Job<S>>();
        thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut state = None;
                for job in rx {
                    job(&mut state);
                }
            })?;
        Ok(Worker {
            jobs: Some(tx),
            deadline,
            blocked: std::cell::Cell::new(false),
            _state: PhantomData,
        })
    }

    /// The deadline each call gets.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Runs `f` on the worker's state and waits for its answer at most the deadline. After
    /// one call passed it, every later call is `Err(Stuck::Earlier)` at once.
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Option<S>) -> R + Send + 'static,
    ) -> Result<R, Stuck> {
        if self.blocked.get() {
            return Err(Stuck::Earlier);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = self.jobs.as_ref().map(|jobs| {
            jobs.send(Box::new(move |s: &mut Option<S>| {
                let _ = tx.send(f(s));
            }))
        });
        if !matches!(sent, Some(Ok(()))) {
            self.blocked.set(true);
            return Err(Stuck::Earlier);
        }
        rx.recv_timeout(self.deadline).map_err(|_| {
            self.blocked.set(true);
            ABANDONED.store(true, Ordering::SeqCst);
            Stuck::ThisCall
        })
    }

    /// Whether a call passed the deadline (the thread is abandoned).
    pub fn is_blocked(&self) -> bool {
        self.blocked.get()
    }
}

impl<S> Drop for Worker<S> {
    /// Ends the thread once its queue is done; a blocked thread is left where it is.
    fn drop(&mut self) {
        self.jobs.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_past_its_deadline_is_killed_and_named() {
        let t = Instant::now();
        let e = run_program(
            Command::new("sleep").arg("30"),
            "`sleep 30`",
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            e.to_string(),
            "`sleep 30` did not finish within 0.3 s and was killed"
        );
    }

    #[test]
    fn output_past_the_limit_is_read_and_dropped() {
        let out = run_program(
            Command::new("sh").args(["-c", "head -c 3000000 /dev/zero >&2; echo hi"]),
            "sh",
            Duration::from_secs(20),
            1000,
        )
        .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr.len(), 1000);
        assert!(out.cut);
    }

    #[test]
    fn a_blocked_call_is_abandoned_and_later_ones_are_not_made() {
        let w = Worker::<u32>::start("test-worker", Duration::from_millis(200)).unwrap();
        assert_eq!(w.call(|s| *s.insert(7)), Ok(7));
        assert_eq!(w.call(|s| s.map(|v| v + 1)), Ok(Some(8)));
        let t = Instant::now();
        assert_eq!(
            w.call(|_| thread::sleep(Duration::from_secs(3600))),
            Err(Stuck::ThisCall)
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(w.is_blocked());
        assert_eq!(w.call(|s| *s), Err(Stuck::Earlier));
    }
}
