//! `cross-process` with one child process per GPU, as NCCL runs (one rank per GPU): each
//! child opens only its GPU's context and is the **owner** of one buffer per handle kind,
//! with a slot for every other GPU, and the **writer** into every other GPU's buffers.
//! The handles cross once per (owner, writer) pair: a writer connects to the owner's
//! socket, gets every kind's handle in one message (the POSIX descriptor rides along
//! with `SCM_RIGHTS`), imports each once, writes its slot by a kernel (once to warm up,
//! once timed) and answers. Writers go round the GPUs in a rotation (at step k child i
//! writes to GPU i + k), so each owner mostly has one writer at a time. Once every writer
//! has answered, the owner checks each slot on its own GPU, word by word, as `verify` does.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::cross_process::{
    connect, finish, hex, print_json, receive, send, unhex, CrossProcessResult, HandleKind, Held,
};
use crate::verify::{check_words, fill_words, WriteCheck};
use vfio_p2p_cuda_driver::ipc::{ipc_handle, IpcOpened, MappedMemory, IPC_HANDLE_BYTES};
use vfio_p2p_cuda_driver::{DeviceBuffer, Event, Gpu, Module, Stream};

/// The pattern seed of writer `w` and kind `k`; the owner poisons with its complement.
fn seed(writer: usize, kind: HandleKind) -> u32 {
    0x5eed_0200 + 2 * writer as u32 + u32::from(kind == HandleKind::Legacy)
}

/// The slot of writer `w` in owner `o`'s buffer (every GPU but the owner, in order).
pub fn slot(w: usize, o: usize) -> usize {
    if w < o {
        w
    } else {
        w - 1
    }
}

/// One kind's handle, as the owner offers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KindOffer {
    kind: HandleKind,
    /// The whole buffer (all slots), as allocated.
    bytes: u64,
    /// The legacy handle, hex.
    ipc_handle: Option<String>,
}

/// One writer's answer for one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct KindWritten {
    kind: HandleKind,
    ms: Option<f64>,
    error: Option<String>,
}

/// What a child prints: its checks as owner (by writer) and its writes (by owner).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildOutput {
    pub checks: Vec<(Bdf, HandleKind, Result<WriteCheck, String>)>,
    pub writes: Vec<(Bdf, HandleKind, Result<f64, String>)>,
}

/// The socket owner `i` listens on.
fn socket_of(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("gpu-{i}.sock"))
}

/// The owner's buffers, one per kind, each with a slot of `words` words per writer.
struct Owned<'g> {
    held: Vec<(HandleKind, Held<'g>, Option<OwnedFd>, KindOffer)>,
}

fn own<'g>(
    gpu: &'g Gpu,
    module: &Module<'_>,
    kinds: &[HandleKind],
    (words, slots): (usize, usize),
) -> Result<Owned<'g>, String> {
    let e = |e: vfio_p2p_cuda_driver::CudaError| e.to_string();
    let stream = Stream::new(gpu).map_err(e)?;
    let bytes = words * slots * 4;
    let mut held = Vec::new();
    for &kind in kinds {
        let (h, fd, offer) = match kind {
            HandleKind::PosixFd => {
                let mem = MappedMemory::new_exportable(gpu, bytes).map_err(e)?;
                let fd = mem.export_fd().map_err(e)?;
                let offer = KindOffer {
                    kind,
                    bytes: mem.bytes() as u64,
                    ipc_handle: None,
                };
                (Held::Mapped(mem), Some(fd), offer)
            }
            HandleKind::Legacy => {
                let buf = DeviceBuffer::new(gpu, bytes).map_err(e)?;
                let h = ipc_handle(gpu, buf.ptr()).map_err(e)?;
                let offer = KindOffer {
                    kind,
                    bytes: bytes as u64,
                    ipc_handle: Some(hex(&h)),
                };
                (Held::Allocated(buf), None, offer)
            }
        };
        let poison = !seed(usize::MAX >> 1, kind);
        fill_words(
            gpu,
            module,
            &stream,
            h.ptr(),
            (words * slots) as u64,
            poison,
        )
        .map_err(e)?;
        held.push((kind, h, fd, offer));
    }
    stream.synchronize().map_err(e)?;
    Ok(Owned { held })
}

/// The owner's side: offers its buffers to each of `writers` writers connecting at
/// `listener`, waits for every answer, then checks each writer's slot.
fn serve(
    (gpu, module): (&Gpu, &Module<'_>),
    owned: &Owned<'_>,
    listener: &UnixListener,
    (me, gpus, words): (usize, &[Bdf], usize),
    until: Instant,
) -> Vec<(Bdf, HandleKind, Result<WriteCheck, String>)> {
    let writers = gpus.len() - 1;
    let offers: Vec<KindOffer> = owned.held.iter().map(|h| h.3.clone()).collect();
    let mut conns: Vec<UnixStream> = Vec::new();
    let mut failed = None;
    for _ in 0..writers {
        let sent = listener
            .accept()
            .map_err(|e| format!("accepting a writer: {e}"))
            .and_then(|(sock, _)| {
                let fd = owned.held.iter().find_map(|h| h.2.as_ref());
                send(&sock, &offers, fd).map_err(|e| format!("sending the handles: {e}"))?;
                Ok(sock)
            });
        match sent {
            Ok(s) => conns.push(s),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // Each writer names itself in its answer: (its index, each kind's outcome).
    let mut answers: Vec<(usize, Vec<KindWritten>)> = Vec::new();
    for sock in &conns {
        let left = until.saturating_duration_since(Instant::now());
        let _ = sock.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match receive::<(usize, Vec<KindWritten>)>(sock) {
            Ok((a, _)) => answers.push(a),
            Err(e) => {
                failed.get_or_insert(format!("waiting for a writer's answer: {e}"));
            }
        }
    }
    let stream = Stream::new(gpu).map_err(|e| e.to_string());
    let mut out = Vec::new();
    for (w, &src) in gpus.iter().enumerate().filter(|&(w, _)| w != me) {
        for (kind, held, ..) in &owned.held {
            let answer = answers
                .iter()
                .find(|a| a.0 == w)
                .and_then(|a| a.1.iter().find(|k| k.kind == *kind));
            let result = match (answer, &stream, &failed) {
                (Some(KindWritten { error: Some(e), .. }), ..) => {
                    Err(format!("the writer on {src} failed: {e}"))
                }
                (Some(_), Ok(stream), _) => {
                    let ptr = held.ptr() + (slot(w, me) * words * 4) as u64;
                    check_words(gpu, module, stream, ptr, words as u64, seed(w, *kind))
                        .map_err(|e| e.to_string())
                }
                (Some(_), Err(e), _) => Err(e.clone()),
                (None, _, Some(e)) => Err(e.clone()),
                (None, ..) => Err(format!("the writer on {src} never answered")),
            };
            out.push((src, *kind, result));
        }
    }
    out
}

/// The writer's side towards owner `o`: imports every kind's buffer once, writes slot
/// `slot(me, o)` (warm-up, then timed) and answers.
fn write_to(
    (gpu, module): (&Gpu, &Module<'_>),
    (me, o): (usize, usize),
    dir: &Path,
    (words, until): (usize, Instant),
) -> Result<Vec<KindWritten>, String> {
    let left = until.saturating_duration_since(Instant::now());
    let sock = connect(&socket_of(dir, o), left).map_err(|e| format!("connecting: {e}"))?;
    let (offers, mut fd): (Vec<KindOffer>, Option<OwnedFd>) =
        receive(&sock).map_err(|e| format!("receiving the handles: {e}"))?;
    let mut held = Vec::new();
    let mut written = Vec::new();
    for offer in &offers {
        let r = import(gpu, offer, &mut fd).and_then(|h| {
            let ptr = h.ptr() + (slot(me, o) * words * 4) as u64;
            let ms = timed_fill(gpu, module, ptr, words as u64, seed(me, offer.kind));
            held.push(h);
            ms
        });
        written.push(KindWritten {
            kind: offer.kind,
            ms: r.as_ref().ok().copied(),
            error: r.err(),
        });
    }
    send(&sock, &(me, written.clone()), None).map_err(|e| format!("answering: {e}"))?;
    // The imports stay mapped until the owner has read the answer; dropped here.
    drop(held);
    Ok(written)
}

fn import<'g>(
    gpu: &'g Gpu,
    offer: &KindOffer,
    fd: &mut Option<OwnedFd>,
) -> Result<Held<'g>, String> {
    let e = |e: vfio_p2p_cuda_driver::CudaError| e.to_string();
    match offer.kind {
        HandleKind::PosixFd => {
            let fd = fd.take().ok_or("no file descriptor came with the offer")?;
            Ok(Held::Mapped(
                MappedMemory::import_fd(gpu, &fd, offer.bytes as usize).map_err(e)?,
            ))
        }
        HandleKind::Legacy => {
            let h = offer
                .ipc_handle
                .as_deref()
                .and_then(unhex::<IPC_HANDLE_BYTES>)
                .ok_or("no valid legacy IPC handle in the offer")?;
            Ok(Held::Opened(IpcOpened::open(gpu, &h).map_err(e)?))
        }
    }
}

/// Writes the pattern of `seed` at `ptr` twice, the second time between events: its ms.
fn timed_fill(
    gpu: &Gpu,
    module: &Module<'_>,
    ptr: u64,
    words: u64,
    seed: u32,
) -> Result<f64, String> {
    let e = |e: vfio_p2p_cuda_driver::CudaError| e.to_string();
    let stream = Stream::new(gpu).map_err(e)?;
    fill_words(gpu, module, &stream, ptr, words, seed).map_err(e)?;
    let (start, end) = (Event::new(gpu).map_err(e)?, Event::new(gpu).map_err(e)?);
    start.record(&stream).map_err(e)?;
    fill_words(gpu, module, &stream, ptr, words, seed).map_err(e)?;
    end.record(&stream).map_err(e)?;
    end.synchronize().map_err(e)?;
    end.since(&start).map_err(e)
}

/// One child: GPU `gpus[me]` as owner and writer for every other GPU of `gpus`.
pub fn run_child(
    me: usize,
    gpus: &[Bdf],
    kinds: &[HandleKind],
    (mib, dir, limit): (usize, &Path, Duration),
) -> Result<(), String> {
    let until = Instant::now() + limit;
    // Listen first: the other children may connect while this one sets up.
    let listener = UnixListener::bind(socket_of(dir, me)).map_err(|e| format!("listening: {e}"))?;
    vfio_p2p_cuda_driver::init().map_err(|e| e.to_string())?;
    let bdf = *gpus.get(me).ok_or("no such GPU index")?;
    let gpu = Gpu::open_at(bdf).map_err(|e| e.to_string())?;
    let module = crate::kernels::load(&gpu).map_err(|e| e.to_string())?;
    let words = (mib << 20) / 4;
    let owned = own(&gpu, &module, kinds, (words, gpus.len() - 1))?;
    let n = gpus.len();
    let (checks, writes) = std::thread::scope(|s| {
        let owner = s.spawn(|| serve((&gpu, &module), &owned, &listener, (me, gpus, words), until));
        let mut writes = Vec::new();
        for k in 1..n {
            let o = (me + k) % n;
            match write_to((&gpu, &module), (me, o), dir, (words, until)) {
                Ok(ws) => writes.extend(ws.into_iter().map(|w| {
                    let r = match (w.ms, w.error) {
                        (Some(ms), None) => Ok(ms),
                        (_, e) => Err(e.unwrap_or_else(|| "no time".into())),
                    };
                    (gpus[o], w.kind, r)
                })),
                Err(e) => writes.extend(kinds.iter().map(|&k| (gpus[o], k, Err(e.clone())))),
            }
        }
        let checks = owner
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (checks, writes)
    });
    print_json(&ChildOutput { checks, writes }).map_err(|e| format!("writing the result: {e}"))
}

/// Every ordered pair of `gpus` with every kind of `kinds`, by one child of this binary
/// (`exe`) per GPU, all at most `limit`.
pub fn run_all(
    exe: &Path,
    gpus: &[Bdf],
    kinds: &[HandleKind],
    mib: usize,
    limit: Duration,
) -> Vec<CrossProcessResult> {
    let words = (mib << 20) as u64 / 4;
    let dir = std::env::temp_dir().join(format!("vfio-p2p-xgpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let made = std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()));
    let list = |v: Vec<String>| v.join(",");
    let gpu_list = list(gpus.iter().map(Bdf::to_string).collect());
    let kind_list = list(kinds.iter().map(|k| k.name().to_string()).collect());
    let until = Instant::now() + limit;
    let children: Vec<Result<String, String>> = match &made {
        Err(e) => gpus.iter().map(|_| Err(e.clone())).collect(),
        Ok(()) => {
            let spawned: Vec<_> = (0..gpus.len())
                .map(|i| {
                    std::process::Command::new(exe)
                        .args(["cross-process-gpu", "--index", &i.to_string()])
                        .args(["--gpus", &gpu_list, "--kinds", &kind_list])
                        .args(["--mib", &mib.to_string(), "--limit-s"])
                        .arg(limit.as_secs().to_string())
                        .arg("--dir")
                        .arg(&dir)
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .map_err(|e| format!("starting {}: {e}", exe.display()))
                })
                .collect();
            spawned
                .into_iter()
                .map(|c| c.and_then(|c| finish(c, until + Duration::from_secs(2))))
                .collect()
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    let outputs: Vec<Result<ChildOutput, String>> = children
        .into_iter()
        .zip(gpus)
        .map(|(c, g)| {
            c.and_then(|t| serde_json::from_str(t.trim()).map_err(|e| format!("its answer: {e}")))
                .map_err(|e| format!("the child on {g}: {e}"))
        })
        .collect();
    let mut results = Vec::new();
    for (s, &src) in gpus.iter().enumerate() {
        for (d, &dst) in gpus.iter().enumerate().filter(|&(d, _)| d != s) {
            for &kind in kinds {
                results.push(combine((src, dst, kind), (&outputs[s], &outputs[d]), words));
            }
        }
    }
    results
}

/// One pair's result from the writer's child output and the owner's.
fn combine(
    (src, dst, kind): (Bdf, Bdf, HandleKind),
    (writer, owner): (&Result<ChildOutput, String>, &Result<ChildOutput, String>),
    words: u64,
) -> CrossProcessResult {
    let mut r = CrossProcessResult::new(src, dst, kind, words);
    match writer {
        Ok(w) => match w.writes.iter().find(|x| x.0 == dst && x.1 == kind) {
            Some((_, _, Ok(ms))) => r.write_gbps = Some((words * 4) as f64 / (ms * 1e-3) / 1e9),
            Some((_, _, Err(e))) => r.error = Some(format!("writer on {src}: {e}")),
            None => r.error = Some(format!("writer on {src}: no write to {dst}")),
        },
        Err(e) => r.error = Some(e.clone()),
    }
    match owner {
        Ok(o) => match o.checks.iter().find(|x| x.0 == src && x.1 == kind) {
            Some((_, _, Ok(c))) => r.write = Some(c.clone()),
            Some((_, _, Err(e))) => {
                r.error.get_or_insert(format!("owner on {dst}: {e}"));
            }
            None => {
                r.error
                    .get_or_insert(format!("owner on {dst}: no check of {src}"));
            }
        },
        Err(e) => {
            r.error.get_or_insert(e.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_writer_has_its_own_slot_in_every_owner() {
        for n in 2..9 {
            for o in 0..n {
                let mut slots: Vec<usize> =
                    (0..n).filter(|&w| w != o).map(|w| slot(w, o)).collect();
                slots.sort_unstable();
                assert_eq!(slots, (0..n - 1).collect::<Vec<_>>());
            }
        }
        // seeds differ by writer and kind, so a slot written by the wrong writer is caught
        let seeds: std::collections::BTreeSet<u32> = (0..8)
            .flat_map(|w| HandleKind::ALL.map(|k| seed(w, k)))
            .collect();
        assert_eq!(seeds.len(), 16);
    }

    #[test]
    fn a_pair_is_judged_on_its_owners_check_and_timed_by_its_writer() {
        let [a, b]: [Bdf; 2] = ["0000:00:06.0", "0000:00:07.0"].map(|s| s.parse().unwrap());
        let k = HandleKind::PosixFd;
        let ok = WriteCheck {
            bad_words: 0,
            first_bad: None,
        };
        let lost = WriteCheck {
            bad_words: 3,
            first_bad: Some(9),
        };
        let child_a = Ok(ChildOutput {
            checks: vec![(b, k, Ok(lost.clone()))],
            writes: vec![(b, k, Ok(0.2))],
        });
        let child_b = Ok(ChildOutput {
            checks: vec![(a, k, Ok(ok.clone()))],
            writes: vec![(a, k, Err("cuMemMap failed".into()))],
        });
        let words = 16 << 20;
        let ab = combine((a, b, k), (&child_a, &child_b), words);
        assert!(
            ab.ok() && (ab.write_gbps.unwrap() - 335.544_32).abs() < 1e-3,
            "{ab:?}"
        );
        let ba = combine((b, a, k), (&child_b, &child_a), words);
        assert!(!ba.ok());
        assert!(ba
            .error
            .as_deref()
            .unwrap()
            .contains("writer on 0000:00:07.0: cuMemMap"));
        // the owner's check decides: lost words with a writer that said it wrote
        let child_b2 = Ok(ChildOutput {
            checks: vec![],
            writes: vec![(a, k, Ok(0.2))],
        });
        let ba = combine((b, a, k), (&child_b2, &child_a), words);
        assert_eq!((ba.ok(), ba.write), (false, Some(lost.clone())));
        // an owner with two writers: each pair gets its own writer's slot check
        let c: Bdf = "0000:00:08.0".parse().unwrap();
        let child_c = Ok(ChildOutput {
            checks: vec![(a, k, Ok(ok.clone())), (b, k, Ok(lost.clone()))],
            writes: vec![],
        });
        let writer = |to: Bdf| {
            Ok(ChildOutput {
                checks: vec![],
                writes: vec![(to, k, Ok(0.2))],
            })
        };
        assert!(combine((a, c, k), (&writer(c), &child_c), words).ok());
        let bc = combine((b, c, k), (&writer(c), &child_c), words);
        assert_eq!(bc.write, Some(lost.clone()));
        let gone: Result<ChildOutput, String> = Err("the child on 0000:00:07.0: killed".into());
        let ab = combine((a, b, k), (&child_a, &gone), words);
        assert!(ab.error.as_deref().unwrap().contains("killed"), "{ab:?}");
    }
}
