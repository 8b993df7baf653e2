//! Why a library opened at run time did not load: the guest agent's (libcuda, NVML, NCCL)
//! and the host's (Fabric Manager's client, `vfio-p2p-fm-ffi`), one rule for both.
//!
//! `libloading::Error`'s own text is only "dlopen failed"; dlerror's reason (glibc's
//! `_dl_signal_error` text: `NAME: cannot open shared object file: No such file or
//! directory`, `invalid ELF header`, `wrong ELF class: ELFCLASS32`, a dependency's name, …)
//! is its `source()`. This crate reads it; the `dlopen` itself, and its `unsafe`, stay in
//! the FFI crates (`vfio-p2p-cuda-driver`, `vfio-p2p-nvml`, `vfio-p2p-fm-ffi`).
#![forbid(unsafe_code)]

use std::fmt;

/// A library that did not load: not there at all, or there but unloadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadFailure {
    /// The dynamic linker found no file of that name (the library is not installed).
    Absent { library: String, reason: String },
    /// The file is there (or the name resolved) but cannot be loaded: dlerror's reason.
    Unloadable { library: String, reason: String },
}

/// dlerror's text for a failed `dlopen`/`dlsym`, else libloading's own.
pub fn reason(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

impl LoadFailure {
    /// Why loading `library` (the name or path given to `dlopen`) failed with `e`.
    pub fn new(library: &str, e: &libloading::Error) -> LoadFailure {
        LoadFailure::from_reason(library, reason(e))
    }

    /// Absent only when the reason is about `library` itself: a missing dependency names
    /// the dependency and is [`LoadFailure::Unloadable`].
    pub fn from_reason(library: &str, reason: String) -> LoadFailure {
        let absent =
            format!("{library}: cannot open shared object file: No such file or directory");
        let library = library.to_string();
        match reason == absent {
            true => LoadFailure::Absent { library, reason },
            false => LoadFailure::Unloadable { library, reason },
        }
    }

    pub fn is_absent(&self) -> bool {
        matches!(self, LoadFailure::Absent { .. })
    }

    /// What to do about it, from dlerror's reason.
    pub fn fix(&self) -> &'static str {
        let (library, reason) = match self {
            LoadFailure::Absent { .. } => return "install it, or name its path",
            LoadFailure::Unloadable { library, reason } => (library, reason.as_str()),
        };
        let about_itself = reason.starts_with(&format!("{library}:"));
        if reason.contains("Permission denied") {
            "it, or a library it needs, cannot be read: check the file's permissions"
        } else if reason.contains("cannot open shared object file") && !about_itself {
            "a library it needs is missing: install the package that provides it, or add \
             its directory to LD_LIBRARY_PATH"
        } else if reason.contains("wrong ELF class") {
            "it is built for another word size (32 against 64 bits): install the build for \
             this machine"
        } else if reason.contains("invalid ELF header") || reason.contains("file too short") {
            "it is not a shared library (damaged, truncated, or a text file): reinstall it"
        } else if reason.contains("undefined symbol") || reason.contains("version `") {
            "it was built against another version of a library it needs: install matching \
             versions"
        } else {
            "reinstall it"
        }
    }
}

impl fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadFailure::Absent { library, .. } => write!(f, "{library} is not installed"),
            LoadFailure::Unloadable { library, reason } => {
                write!(f, "{library} cannot be loaded: {reason}: {}", self.fix())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_library_itself_missing_is_absent() {
        let lib = "/opt/nccl/libnccl.so.2";
        let absent = LoadFailure::from_reason(
            lib,
            format!("{lib}: cannot open shared object file: No such file or directory"),
        );
        assert!(absent.is_absent());
        let dependency = LoadFailure::from_reason(
            lib,
            "libcudart.so.12: cannot open shared object file: No such file or directory".into(),
        );
        assert!(!dependency.is_absent());
        let text = dependency.to_string();
        assert!(
            text.starts_with(&format!("{lib} cannot be loaded: libcudart.so.12: ")),
            "{text}"
        );
        assert!(text.contains("a library it needs is missing"), "{text}");
        assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
    }

    #[test]
    fn each_reason_gets_its_fix() {
        let fix = |reason: &str| LoadFailure::from_reason("libx.so.2", reason.into()).fix();
        let class = "libx.so.2: wrong ELF class: ELFCLASS32";
        assert!(fix(class).contains("word size"));
        assert!(fix("libx.so.2: invalid ELF header").contains("not a shared library"));
        assert!(fix("libx.so.2: file too short").contains("not a shared library"));
        assert!(fix("libx.so.2: undefined symbol: ncclFoo").contains("another version"));
        let unreadable = "libx.so.2: cannot open shared object file: Permission denied";
        assert!(fix(unreadable).contains("permissions"));
        assert_eq!(fix("something else"), "reinstall it");
    }
}
