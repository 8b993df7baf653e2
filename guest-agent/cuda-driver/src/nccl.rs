//! NCCL, opened at run time like libcuda (`libnccl.so.2`, or the path
//! `VFIO_P2P_NCCL_LIB` / `nccl --nccl-lib` names): the few calls of one all-reduce.
//!
//! Signatures and constants from NCCL's `src/nccl.h.in` (NVIDIA/nccl v2.28):
//! `ncclUniqueId` is 128 bytes passed by value to `ncclCommInitRank`, `ncclFloat32` is
//! 7 and `ncclSum` 0, `ncclSuccess` 0.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use libloading::Library;
use vfio_p2p_load_failure::{reason, LoadFailure};

use super::memory::DeviceBuffer;
use super::stream::Stream;

type NcclResult = c_int;
type NcclComm = *mut c_void;
const NCCL_SUCCESS: NcclResult = 0;
/// `ncclFloat32`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;
/// The library's name in the dynamic linker's search path.
pub const DEFAULT_LIB: &str = "libnccl.so.2";
/// The environment variable that names another library.
pub const LIB_ENV: &str = "VFIO_P2P_NCCL_LIB";

/// `ncclUniqueId`: the bootstrap address rank 0 hands every rank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

impl UniqueId {
    pub fn to_hex(&self) -> String {
        self.internal.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Option<UniqueId> {
        if s.len() != 256 {
            return None;
        }
        let mut internal = [0u8; 128];
        for (i, b) in internal.iter_mut().enumerate() {
            *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(UniqueId { internal })
    }
}

/// The NCCL library, loaded.
pub struct Nccl {
    lib: Library,
    pub path: PathBuf,
}

/// One rank's communicator; destroyed on drop.
pub struct Comm<'n> {
    nccl: &'n Nccl,
    raw: NcclComm,
}

/// The library `explicit` names, else `VFIO_P2P_NCCL_LIB`, else [`DEFAULT_LIB`].
pub fn library_path(explicit: Option<&Path>) -> PathBuf {
    explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(LIB_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LIB))
}

/// Why the library did not load.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Not there: the stage is skipped.
    #[error("{0}")]
    Absent(String),
    /// There but unloadable: dlerror's reason and the fix.
    #[error("{0}")]
    Unloadable(LoadFailure),
}

impl Nccl {
    /// Loads the library at `path`, or says why not.
    pub fn open(path: &Path) -> Result<Nccl, OpenError> {
        if path.components().count() > 1 && !path.exists() {
            return Err(OpenError::Absent(format!(
                "{} does not exist",
                path.display()
            )));
        }
        // SAFETY: loading NCCL runs its static initialisers, which have no preconditions
        // (it is loaded so by every framework that uses it).
        let lib = unsafe { Library::new(path) }.map_err(|e| {
            match LoadFailure::new(&path.display().to_string(), &e) {
                f if f.is_absent() => OpenError::Absent(format!(
                    "{} is not in the dynamic linker's search path: install NCCL, or name \
                     the library with --nccl-lib or {LIB_ENV}",
                    path.display()
                )),
                f => OpenError::Unloadable(f),
            }
        })?;
        Ok(Nccl {
            lib,
            path: path.to_path_buf(),
        })
    }

    fn call<F: Copy>(&self, name: &[u8]) -> Result<F, String> {
        // SAFETY: each caller names a symbol with the signature F as in nccl.h; the
        // pointer is only used while `self.lib` is loaded.
        unsafe { self.lib.get::<F>(name).map(|s| *s) }.map_err(|e| {
            format!(
                "{} has no {}: {}",
                self.path.display(),
                String::from_utf8_lossy(name),
                reason(&e)
            )
        })
    }

    fn check(&self, r: NcclResult, what: &str) -> Result<(), String> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        let text = self
            .call::<unsafe extern "C" fn(NcclResult) -> *const c_char>(b"ncclGetErrorString\0")
            .ok()
            // SAFETY: ncclGetErrorString returns a static NUL-terminated string or null.
            .map(|f| unsafe { f(r) })
            .filter(|p| !p.is_null())
            // SAFETY: non-null, NUL-terminated, static in the library.
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        Err(format!("{what}: NCCL error {r} ({text})"))
    }

    /// `ncclGetVersion`: e.g. 22809 for 2.28.9.
    pub fn version(&self) -> Result<i32, String> {
        let f = self.call::<unsafe extern "C" fn(*mut c_int) -> NcclResult>(b"ncclGetVersion\0")?;
        let mut v = 0;
        // SAFETY: v is a valid out pointer.
        self.check(unsafe { f(&mut v) }, "ncclGetVersion")?;
        Ok(v)
    }

    /// `ncclGetUniqueId`: starts the bootstrap root in this process.
    pub fn unique_id(&self) -> Result<UniqueId, String> {
        let f =
            self.call::<unsafe extern "C" fn(*mut UniqueId) -> NcclResult>(b"ncclGetUniqueId\0")?;
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: id is a valid out pointer of the struct's size.
        self.check(unsafe { f(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `ncclCommInitRank` on the GPU whose context is current on this thread.
    pub fn comm_init_rank(&self, nranks: i32, id: UniqueId, rank: i32) -> Result<Comm<'_>, String> {
        type Init = unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int) -> NcclResult;
        let f = self.call::<Init>(b"ncclCommInitRank\0")?;
        let mut raw: NcclComm = std::ptr::null_mut();
        // SAFETY: raw is a valid out pointer; id is passed by value as nccl.h declares.
        self.check(unsafe { f(&mut raw, nranks, id, rank) }, "ncclCommInitRank")?;
        Ok(Comm { nccl: self, raw })
    }
}

impl Comm<'_> {
    /// Queues a sum of `count` f32 of `send` into `recv` over every rank on `stream`.
    pub fn all_reduce_sum_f32(
        &self,
        send: &DeviceBuffer<'_>,
        recv: &DeviceBuffer<'_>,
        count: usize,
        stream: &Stream<'_>,
    ) -> Result<(), String> {
        assert!(count * 4 <= send.bytes() && count * 4 <= recv.bytes());
        type AllReduce = unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            c_int,
            NcclComm,
            *mut c_void,
        ) -> NcclResult;
        let f = self.nccl.call::<AllReduce>(b"ncclAllReduce\0")?;
        // SAFETY: both buffers hold `count` f32 (asserted); comm and stream are live
        // handles of this GPU.
        let r = unsafe {
            f(
                send.ptr() as *const c_void,
                recv.ptr() as *mut c_void,
                count,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.raw,
                stream.raw.cast(),
            )
        };
        self.nccl.check(r, "ncclAllReduce")
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        if let Ok(f) = self
            .nccl
            .call::<unsafe extern "C" fn(NcclComm) -> NcclResult>(b"ncclCommDestroy\0")
        {
            // SAFETY: raw came from ncclCommInitRank and is destroyed once.
            unsafe { f(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_through_hex() {
        let mut id = UniqueId { internal: [0; 128] };
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let back = UniqueId::from_hex(&id.to_hex()).unwrap();
        assert_eq!(back.internal, id.internal);
        assert!(UniqueId::from_hex("00").is_none());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_none());
    }

    #[test]
    fn an_absent_library_is_an_error_naming_it() {
        let e = Nccl::open(Path::new("/nonexistent/libnccl.so.2"))
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Absent(_)), "{e}");
        assert_eq!(e.to_string(), "/nonexistent/libnccl.so.2 does not exist");
        let e = Nccl::open(Path::new("libvfio-p2p-no-such-nccl.so.2"))
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Absent(_)), "{e}");
        assert!(e.to_string().contains("--nccl-lib"), "{e}");
        assert_eq!(
            library_path(Some(Path::new("/x/libnccl.so"))),
            PathBuf::from("/x/libnccl.so")
        );
    }

    #[test]
    fn a_broken_library_says_dlerrors_reason_and_the_fix() {
        let d = tempfile::tempdir().unwrap();
        let junk = d.path().join("libnccl.so.2");
        std::fs::write(&junk, "not an ELF\n".repeat(10)).unwrap();
        let e = Nccl::open(&junk).err().unwrap();
        let text = e.to_string();
        assert!(matches!(e, OpenError::Unloadable(_)), "{text}");
        assert!(text.starts_with(&junk.display().to_string()), "{text}");
        assert!(text.contains("invalid ELF header"), "{text}");
        assert!(text.contains("not a shared library"), "{text}");
    }

    /// A real shared object whose dependency is gone: dlerror names the dependency, not
    /// the library, and the fix says a library it needs is missing. Builds both with `cc`,
    /// the C compiler (and Rust's linker) every build machine of this crate has.
    #[test]
    fn a_library_whose_dependency_is_missing_says_which() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("x.c");
        std::fs::write(&c, "int vfio_p2p_x(void) { return 1; }\n").unwrap();
        let dep = d.path().join("libvfio-p2p-gone.so");
        let lib = d.path().join("libnccl.so.2");
        let cc = |args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new("cc").args(args).output();
            let out = out.expect("cc (the C compiler) runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        cc(&[
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            "-o".as_ref(),
            dep.as_os_str(),
            c.as_os_str(),
        ]);
        let libdir = d.path().as_os_str();
        let (dash_l, no_as_needed) = ("-L".as_ref(), "-Wl,--no-as-needed".as_ref());
        let needs = "-lvfio-p2p-gone".as_ref();
        let (o, shared, fpic) = ("-o".as_ref(), "-shared".as_ref(), "-fPIC".as_ref());
        cc(&[
            shared,
            fpic,
            o,
            lib.as_os_str(),
            c.as_os_str(),
            dash_l,
            libdir,
            no_as_needed,
            needs,
        ]);
        std::fs::remove_file(&dep).unwrap();
        let e = Nccl::open(&lib).err().unwrap();
        let text = e.to_string();
        assert!(matches!(e, OpenError::Unloadable(_)), "{text}");
        assert!(text.starts_with(&lib.display().to_string()), "{text}");
        let why = "libvfio-p2p-gone.so: cannot open shared object file: No such file or directory";
        assert!(text.contains(why), "{text}");
        assert!(text.contains("a library it needs is missing"), "{text}");
    }
}
