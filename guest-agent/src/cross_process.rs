//! `cross-process`: peer access between processes, as NCCL uses it (one process per GPU,
//! memory shared through CUDA IPC). Per ordered pair and handle kind, two child
//! processes of this binary: the **owner** on the destination GPU allocates memory, fills
//! it with a poison word and hands it over a Unix socket (a POSIX file descriptor from
//! `cuMemExportToShareableHandle` passed with `SCM_RIGHTS`, or the 64-byte legacy
//! `cuIpcGetMemHandle`); the **writer** on the source GPU imports it, writes a pattern
//! into it with a kernel (timed: GB/s) and says so; the owner then checks every word on
//! the destination GPU, as `verify` does, and prints the result as JSON.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::verify::{check_words, fill_words, WriteCheck};
use vfio_p2p_cuda_driver::ipc::{ipc_handle, IpcOpened, MappedMemory, IPC_HANDLE_BYTES};
use vfio_p2p_cuda_driver::{DeviceBuffer, Event, Gpu, Module, Stream};

/// How the memory crosses the process boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandleKind {
    /// `cuMemExportToShareableHandle` → POSIX file descriptor (NCCL's `P2P/CUMEM`).
    PosixFd,
    /// `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` (`cudaIpc*MemHandle`, NCCL's `P2P/IPC`).
    Legacy,
}

impl HandleKind {
    pub const ALL: [HandleKind; 2] = [HandleKind::PosixFd, HandleKind::Legacy];

    pub fn name(self) -> &'static str {
        match self {
            HandleKind::PosixFd => "posix-fd",
            HandleKind::Legacy => "legacy",
        }
    }

    pub fn parse(s: &str) -> Option<HandleKind> {
        HandleKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// What the owner sends the writer (the descriptor, for `PosixFd`, rides along).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    pub kind: HandleKind,
    pub bytes: u64,
    pub words: u64,
    pub seed: u32,
    /// The legacy handle, hex.
    #[serde(default)]
    pub ipc_handle: Option<String>,
}

/// What the writer answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Written {
    /// Milliseconds the writing kernel took (CUDA events on the writer's stream).
    pub ms: Option<f64>,
    pub error: Option<String>,
}

/// One ordered pair, one handle kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossProcessResult {
    pub src: Bdf,
    pub dst: Bdf,
    pub kind: HandleKind,
    pub words: u64,
    /// Checked on the destination GPU; `None` when it never got that far.
    pub write: Option<WriteCheck>,
    /// Writing kernel through the imported mapping (GB/s, 10^9 bytes).
    pub write_gbps: Option<f64>,
    pub error: Option<String>,
    /// Owner and writer on one GPU (`--same-gpu`): a check of CUDA IPC between two
    /// processes (handle export/import, descriptor passing), never of P2P.
    #[serde(default)]
    pub same_gpu: bool,
}

impl CrossProcessResult {
    /// A pair not yet run: no write, no figure, no error.
    pub fn new(src: Bdf, dst: Bdf, kind: HandleKind, words: u64) -> Self {
        CrossProcessResult {
            src,
            dst,
            kind,
            words,
            write: None,
            write_gbps: None,
            error: None,
            same_gpu: src == dst,
        }
    }

    /// The writes arrived and were checked (for a same-GPU pair: IPC works, not P2P).
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.write.as_ref().is_some_and(WriteCheck::ok)
    }
}

/// The ordered pairs `cross-process` runs: every pair of two different GPUs (P2P), or,
/// with `same_gpu`, each GPU with itself (IPC between two processes on one GPU, not P2P).
pub fn pairs_to_check(gpus: &[Bdf], same_gpu: bool) -> Result<Vec<(Bdf, Bdf)>, String> {
    if gpus.is_empty() {
        return Err("CUDA sees no GPU".into());
    }
    if same_gpu {
        return Ok(gpus.iter().map(|&g| (g, g)).collect());
    }
    if gpus.len() < 2 {
        return Err(format!(
            "P2P needs at least two GPUs; CUDA sees {} (--same-gpu checks IPC between two \
             processes on one GPU, which is not P2P)",
            gpus.len()
        ));
    }
    Ok(gpus
        .iter()
        .flat_map(|&src| {
            gpus.iter()
                .filter(move |&&d| d != src)
                .map(move |&d| (src, d))
        })
        .collect())
}

/// The largest message either side sends.
const MAX_MESSAGE: usize = 4096;

/// Sends `msg` as one datagram-like message, with `fd` attached when given.
pub fn send(sock: &UnixStream, msg: &impl Serialize, fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_MESSAGE {
        return Err(std::io::Error::other("message too large"));
    }
    vfio_p2p_fd_passing::send(sock, &body, fd.map(|f| f.as_fd()))
}

/// Receives one message sent by [`send`], and the descriptor that came with it.
pub fn receive<T: for<'de> Deserialize<'de>>(
    sock: &UnixStream,
) -> std::io::Result<(T, Option<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, fd) = vfio_p2p_fd_passing::receive(sock, &mut buf)?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the other process closed the socket",
        ));
    }
    let value = serde_json::from_slice(&buf[..n])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((value, fd))
}

/// `bytes` as lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of `hex`, exactly `N` of them.
pub fn unhex<const N: usize>(hex: &str) -> Option<[u8; N]> {
    if hex.len() != 2 * N || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Connects to `path`, waiting until the owner listens there (at most `limit`).
pub fn connect(path: &Path, limit: Duration) -> std::io::Result<UnixStream> {
    let until = Instant::now() + limit;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= until => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Waits for `child` at most until `until`, killing it after; its stdout.
pub fn finish(mut child: std::process::Child, until: Instant) -> Result<String, String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut o) = child.stdout.take() {
                    let _ = o.read_to_string(&mut out);
                }
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return if status.success() {
                    Ok(out)
                } else {
                    Err(format!("exited {status}: {}", err.trim()))
                };
            }
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("did not finish in time (killed)".into());
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Writes `value` as one JSON line to stdout (what the parent reads from a child).
pub fn print_json(value: &impl Serialize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    out.write_all(b"\n")
}

/// Memory one side holds for the check, freed (unmapped, closed) on drop.
pub(crate) enum Held<'g> {
    Mapped(MappedMemory<'g>),
    Allocated(DeviceBuffer<'g>),
    Opened(IpcOpened<'g>),
}

impl Held<'_> {
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Held::Mapped(m) => m.ptr(),
            Held::Allocated(b) => b.ptr(),
            Held::Opened(o) => o.ptr(),
        }
    }
}

/// Seed of the pattern the writer writes; the owner poisons with its complement first.
const SEED: u32 = 0x5eed_0100;

fn io<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The owner's side, on `gpu` (the destination): offers `words` words of its memory to
/// the writer connecting at `socket`, then checks them.
pub fn run_owner(
    gpu: &Gpu,
    module: &Module<'_>,
    kind: HandleKind,
    socket: &Path,
    words: usize,
) -> Result<WriteCheck, String> {
    let listener = UnixListener::bind(socket).map_err(io("listening on the socket"))?;
    let stream = Stream::new(gpu).map_err(|e| e.to_string())?;
    let n = words as u64;
    let poison =
        |ptr| fill_words(gpu, module, &stream, ptr, n, !SEED).and_then(|_| stream.synchronize());
    let mut offer = Offer {
        kind,
        bytes: words as u64 * 4,
        words: n,
        seed: SEED,
        ipc_handle: None,
    };
    let (held, fd) = match kind {
        HandleKind::PosixFd => {
            let mem = MappedMemory::new_exportable(gpu, words * 4).map_err(|e| e.to_string())?;
            let fd = mem.export_fd().map_err(|e| e.to_string())?;
            offer.bytes = mem.bytes() as u64;
            (Held::Mapped(mem), Some(fd))
        }
        HandleKind::Legacy => {
            let buf = DeviceBuffer::new(gpu, words * 4).map_err(|e| e.to_string())?;
            let h = ipc_handle(gpu, buf.ptr()).map_err(|e| e.to_string())?;
            offer.ipc_handle = Some(hex(&h));
            (Held::Allocated(buf), None)
        }
    };
    let ptr = held.ptr();
    poison(ptr).map_err(|e| e.to_string())?;
    let (sock, _) = listener.accept().map_err(io("accepting the writer"))?;
    send(&sock, &offer, fd.as_ref()).map_err(io("sending the handle"))?;
    let (written, _): (Written, _) = receive(&sock).map_err(io("waiting for the writer"))?;
    if let Some(e) = written.error {
        return Err(format!("the writer failed: {e}"));
    }
    check_words(gpu, module, &stream, ptr, n, SEED).map_err(|e| e.to_string())
}

/// The writer's side, on `gpu` (the source): imports the owner's memory, writes the
/// pattern into it by a kernel (once to warm up, once timed) and says so. The time (ms).
pub fn run_writer(gpu: &Gpu, module: &Module<'_>, socket: &Path) -> Result<f64, String> {
    let sock = connect(socket, Duration::from_secs(30)).map_err(io("connecting to the owner"))?;
    let (offer, fd): (Offer, _) = receive(&sock).map_err(io("receiving the handle"))?;
    let result = write_into(gpu, module, &offer, fd);
    let answer = match &result {
        Ok(ms) => Written {
            ms: Some(*ms),
            error: None,
        },
        Err(e) => Written {
            ms: None,
            error: Some(e.clone()),
        },
    };
    send(&sock, &answer, None).map_err(io("answering the owner"))?;
    result
}

fn write_into(
    gpu: &Gpu,
    module: &Module<'_>,
    offer: &Offer,
    fd: Option<OwnedFd>,
) -> Result<f64, String> {
    let e = |e: vfio_p2p_cuda_driver::CudaError| e.to_string();
    let held = match offer.kind {
        HandleKind::PosixFd => {
            let fd = fd.ok_or("no file descriptor came with the offer")?;
            let mem = MappedMemory::import_fd(gpu, &fd, offer.bytes as usize).map_err(e)?;
            Held::Mapped(mem)
        }
        HandleKind::Legacy => {
            let h = offer
                .ipc_handle
                .as_deref()
                .and_then(unhex::<IPC_HANDLE_BYTES>)
                .ok_or("no valid legacy IPC handle in the offer")?;
            let opened = IpcOpened::open(gpu, &h).map_err(e)?;
            Held::Opened(opened)
        }
    };
    let ptr = held.ptr();
    let stream = Stream::new(gpu).map_err(e)?;
    fill_words(gpu, module, &stream, ptr, offer.words, offer.seed).map_err(e)?;
    let (start, end) = (Event::new(gpu).map_err(e)?, Event::new(gpu).map_err(e)?);
    start.record(&stream).map_err(e)?;
    fill_words(gpu, module, &stream, ptr, offer.words, offer.seed).map_err(e)?;
    end.record(&stream).map_err(e)?;
    end.synchronize().map_err(e)?;
    end.since(&start).map_err(e)
}

/// One child of `cross-process` on GPU `gpu`: the owner prints its check (JSON), the
/// writer its time (ms), on stdout.
pub fn run_child(
    role: &str,
    gpu: Bdf,
    kind: &str,
    mib: usize,
    socket: &Path,
) -> Result<(), String> {
    let kind = HandleKind::parse(kind).ok_or_else(|| format!("no handle kind {kind:?}"))?;
    let gpus = crate::peers::open_gpus().map_err(|e| e.to_string())?;
    let g = gpus
        .iter()
        .find(|g| g.bus_id == gpu)
        .ok_or_else(|| format!("CUDA does not see GPU {gpu}"))?;
    let module = crate::kernels::load(g).map_err(|e| e.to_string())?;
    if role == "owner" {
        let check = run_owner(g, &module, kind, socket, (mib << 20) / 4)?;
        print_json(&check).map_err(io("writing the result"))
    } else {
        let ms = run_writer(g, &module, socket)?;
        println!("{ms}");
        Ok(())
    }
}

/// Every pair of `pairs` (from [`pairs_to_check`]) with every kind of `kinds`, one at a
/// time, through children of this binary (`exe`), each at most 60 s.
pub fn run_all(
    exe: &Path,
    pairs: &[(Bdf, Bdf)],
    kinds: &[HandleKind],
    mib: usize,
) -> Vec<CrossProcessResult> {
    let mut results = Vec::new();
    for &pair in pairs {
        for &kind in kinds {
            results.push(run_pair(exe, pair, kind, mib, Duration::from_secs(60)));
        }
    }
    results
}

/// Runs the owner and writer children of this binary (`exe`) for `src` → `dst` and
/// `kind`, each at most `limit`.
pub fn run_pair(
    exe: &Path,
    (src, dst): (Bdf, Bdf),
    kind: HandleKind,
    mib: usize,
    limit: Duration,
) -> CrossProcessResult {
    let words = (mib << 20) as u64 / 4;
    let mut r = CrossProcessResult::new(src, dst, kind, words);
    let dir = std::env::temp_dir().join(format!(
        "vfio-p2p-xproc-{}-{src}-{dst}-{}",
        std::process::id(),
        kind.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir(&dir) {
        r.error = Some(format!("{}: {e}", dir.display()));
        return r;
    }
    let socket = dir.join("socket");
    let child = |role: &str, gpu: Bdf| {
        std::process::Command::new(exe)
            .args(["cross-process-child", role, "--gpu", &gpu.to_string()])
            .args(["--kind", kind.name(), "--mib", &mib.to_string(), "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))
    };
    let until = Instant::now() + limit;
    let outcome = child("owner", dst).map(|owner| {
        let w = child("writer", src).and_then(|w| finish(w, until));
        (finish(owner, until), w)
    });
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Err(e) => r.error = Some(e),
        Ok((o, w)) => {
            let ms = w.as_ref().ok().and_then(|t| t.trim().parse::<f64>().ok());
            r.write_gbps = ms.map(|ms| (words * 4) as f64 / (ms * 1e-3) / 1e9);
            match o.map(|t| serde_json::from_str::<WriteCheck>(t.trim())) {
                Ok(Ok(c)) => r.write = Some(c),
                Ok(Err(e)) => r.error = Some(format!("the owner's answer: {e}")),
                Err(e) => r.error = Some(format!("owner on {dst}: {e}")),
            }
            if let Err(e) = w {
                r.error.get_or_insert(format!("writer on {src}: {e}"));
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_kinds_by_name() {
        for k in HandleKind::ALL {
            assert_eq!(HandleKind::parse(k.name()), Some(k));
        }
        assert_eq!(HandleKind::parse("cuda"), None);
    }

    #[test]
    fn pairs_are_distinct_gpus_unless_same_gpu_is_asked() {
        let [a, b]: [Bdf; 2] = ["0000:00:06.0", "0000:00:07.0"].map(|s| s.parse().unwrap());
        assert_eq!(pairs_to_check(&[a, b], false).unwrap(), [(a, b), (b, a)]);
        assert_eq!(pairs_to_check(&[a, b], true).unwrap(), [(a, a), (b, b)]);
        assert_eq!(pairs_to_check(&[a], true).unwrap(), [(a, a)]);
        let one = pairs_to_check(&[a], false).unwrap_err();
        assert!(
            one.contains("CUDA sees 1") && one.contains("--same-gpu"),
            "{one}"
        );
        for same in [false, true] {
            assert_eq!(pairs_to_check(&[], same).unwrap_err(), "CUDA sees no GPU");
        }
    }

    #[test]
    fn same_gpu_is_a_flag_of_cross_process() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["vfio-p2p-agent", "cross-process"], args].concat());
            match cli.map(|c| c.command) {
                Ok(Command::CrossProcess {
                    handle,
                    mib,
                    same_gpu,
                }) => Ok((handle, mib, same_gpu)),
                Ok(_) => panic!("not cross-process"),
                Err(e) => Err(e.kind()),
            }
        };
        assert_eq!(parse(&[]), Ok(("both".into(), 64, false)));
        assert_eq!(
            parse(&["--same-gpu", "--handle", "posix-fd", "--mib", "8"]),
            Ok(("posix-fd".into(), 8, true))
        );
        assert_eq!(
            parse(&["--same-gpu=yes"]),
            Err(clap::error::ErrorKind::TooManyValues)
        );
    }

    #[test]
    fn hex_round_trip() {
        let h: [u8; 64] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(unhex::<64>(&hex(&h)), Some(h));
        assert_eq!(unhex::<2>("abc"), None);
        assert_eq!(unhex::<2>("zzzz"), None);
    }

    #[test]
    fn an_offer_and_its_descriptor_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared");
        std::fs::write(&path, b"one page of device memory").unwrap();
        let file: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let offer = Offer {
            kind: HandleKind::PosixFd,
            bytes: 2 << 20,
            words: 1 << 19,
            seed: 0x5eed_0003,
            ipc_handle: None,
        };
        send(&a, &offer, Some(&file)).unwrap();
        let (got, fd): (Offer, _) = receive(&b).unwrap();
        assert_eq!(got, offer);
        // The descriptor received is another one for the same open file.
        let mut text = String::new();
        std::fs::File::from(fd.unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "one page of device memory");
        // A message without a descriptor, the other way.
        let done = Written {
            ms: Some(1.5),
            error: None,
        };
        send(&b, &done, None).unwrap();
        let (back, fd): (Written, _) = receive(&a).unwrap();
        assert_eq!((back, fd.is_none()), (done, true));
        drop(b);
        assert!(receive::<Written>(&a).is_err());
    }

    /// A stand-in for this binary: its children answer as the real ones do.
    fn stand_in(dir: &Path, owner: &str, writer: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let exe = dir.join("agent");
        std::fs::write(
            &exe,
            format!("#!/bin/sh\ncase \"$2\" in owner) {owner} ;; writer) {writer} ;; esac\n"),
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    #[test]
    fn a_pair_is_run_by_two_children_and_judged_on_the_owners_check() {
        let dir = tempfile::tempdir().unwrap();
        let pair: (Bdf, Bdf) = (
            "0000:00:06.0".parse().unwrap(),
            "0000:00:07.0".parse().unwrap(),
        );
        let limit = Duration::from_secs(10);
        // 64 MiB written in 0.2 ms: 335.5 GB/s.
        let exe = stand_in(
            dir.path(),
            r#"echo '{"bad_words":0,"first_bad":null}'"#,
            "echo 0.2",
        );
        let r = run_pair(&exe, pair, HandleKind::PosixFd, 64, limit);
        assert!(r.ok() && !r.same_gpu, "{r:?}");
        assert_eq!(r.words, 16 << 20);
        // Owner and writer on one GPU: the same children, marked as not P2P.
        let same = run_pair(&exe, (pair.0, pair.0), HandleKind::Legacy, 64, limit);
        assert!(same.ok() && same.same_gpu, "{same:?}");
        let table = crate::render::cross_process(&[r.clone(), same]);
        assert!(table.contains("0000:00:06.0 → same GPU"), "{table}");
        assert!(table.contains("0000:00:06.0 → 0000:00:07.0"), "{table}");
        assert!(
            table.contains("checks CUDA IPC") && table.contains("not P2P"),
            "{table}"
        );
        assert!(!crate::render::cross_process(std::slice::from_ref(&r)).contains("not P2P"));
        assert!((r.write_gbps.unwrap() - 335.544_32).abs() < 1e-3, "{r:?}");
        // Lost writes, a failing writer, a failing owner.
        let exe = stand_in(
            dir.path(),
            r#"echo '{"bad_words":5,"first_bad":2}'"#,
            "echo 0.2",
        );
        let r = run_pair(&exe, pair, HandleKind::Legacy, 64, limit);
        assert!(!r.ok() && r.error.is_none() && r.write.unwrap().bad_words == 5);
        let exe = stand_in(
            dir.path(),
            r#"echo '{"bad_words":0,"first_bad":null}'"#,
            "echo 'cuIpcOpenMemHandle failed' >&2; exit 2",
        );
        let r = run_pair(&exe, pair, HandleKind::Legacy, 64, limit);
        assert!(
            r.error
                .as_deref()
                .unwrap()
                .contains("writer on 0000:00:06.0"),
            "{r:?}"
        );
        assert!(
            r.error
                .as_deref()
                .unwrap()
                .contains("cuIpcOpenMemHandle failed"),
            "{r:?}"
        );
        let exe = stand_in(dir.path(), "exit 2", "echo 0.2");
        let r = run_pair(&exe, pair, HandleKind::PosixFd, 64, limit);
        assert!(
            r.error
                .as_deref()
                .unwrap()
                .contains("owner on 0000:00:07.0"),
            "{r:?}"
        );
    }

    #[test]
    fn a_child_that_hangs_is_killed_and_said() {
        let child = std::process::Command::new("sleep")
            .arg("5")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let e = finish(child, Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("killed"), "{e}");
        let child = std::process::Command::new("sh")
            .args(["-c", "echo out; echo why >&2; exit 3"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let e = finish(child, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("why") && e.contains('3'), "{e}");
    }
}
