//! AF_VSOCK stream sockets, the one place vfio-p2p calls the socket API for them: the
//! guest agent's `--send` connects ([`VsockStream::connect`]) to the host's collector,
//! which listens ([`VsockListener`]) and reads each connection with the sender's CID.
//!
//! Small on purpose (rust-vmm style): owned descriptors, `io::Result` everywhere, a
//! `// SAFETY:` line on every `unsafe` (the workspace denies an undocumented one).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`, sd-daemon.h).
const SD_LISTEN_FDS_START: RawFd = 3;

/// The host's CID as a guest addresses it (`VMADDR_CID_HOST`).
pub const HOST_CID: u32 = libc::VMADDR_CID_HOST;

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A fresh AF_VSOCK stream socket (close-on-exec).
fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let raw =
        check(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn address(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all-zero is valid before the fields are set.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = cid;
    addr.svm_port = port;
    addr
}

const ADDRESS_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

/// `SO_SNDTIMEO` / `SO_RCVTIMEO` on `fd`; `None` waits for ever.
fn set_timeout(fd: &OwnedFd, option: libc::c_int, t: Option<Duration>) -> io::Result<()> {
    let tv = match t {
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        Some(t) => libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            // at least 1 µs: a zero timeval would mean "no timeout"
            tv_usec: t.subsec_micros().max(u32::from(t.is_zero())) as libc::suseconds_t,
        },
    };
    // SAFETY: `tv` is a valid timeval for SO_SNDTIMEO/SO_RCVTIMEO and outlives the call.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A listening AF_VSOCK stream socket.
#[derive(Debug)]
pub struct VsockListener {
    fd: OwnedFd,
}

impl VsockListener {
    /// Listens on `port` for any CID (on a host, needs the `vhost_vsock` module).
    pub fn bind(port: u32) -> io::Result<Self> {
        let fd = socket()?;
        let addr = address(libc::VMADDR_CID_ANY, port);
        // SAFETY: `addr` is a valid sockaddr_vm of ADDRESS_LEN bytes that outlives the call.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast(),
                ADDRESS_LEN,
            )
        })?;
        // SAFETY: listen(2) on a descriptor we own.
        check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
        Ok(VsockListener { fd })
    }

    /// The listening socket systemd handed this process (socket activation, sd_listen_fds(3):
    /// `LISTEN_PID` is this process, `LISTEN_FDS` at least 1, the first at fd 3), taken
    /// once: a later call, or a process systemd did not start so, gets `None`.
    pub fn from_systemd() -> Option<VsockListener> {
        static TAKEN: AtomicBool = AtomicBool::new(false);
        let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
        let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
        if pid != std::process::id() || fds < 1 || TAKEN.swap(true, Ordering::SeqCst) {
            return None;
        }
        // SAFETY: systemd passed fd 3 as this process's first listening socket (LISTEN_PID
        // is us), and TAKEN makes this its one owner.
        Some(unsafe { VsockListener::from_raw(SD_LISTEN_FDS_START) })
    }

    /// Takes a listening vsock socket handed over by systemd (socket activation).
    ///
    /// # Safety
    /// `fd` must be an open listening AF_VSOCK socket that nothing else owns.
    unsafe fn from_raw(fd: RawFd) -> Self {
        VsockListener {
            // SAFETY: the caller guarantees ownership (see above).
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }
    }

    /// The next connection and the CID of the VM that made it (the host's word for it,
    /// not the guest's); interrupted waits are retried.
    pub fn accept(&self) -> io::Result<(VsockStream, u32)> {
        loop {
            // SAFETY: plain data, filled in by accept4(2).
            let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
            let mut len = ADDRESS_LEN;
            // SAFETY: `addr`/`len` are valid for writes and sized for a sockaddr_vm.
            let r = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    (&mut addr as *mut libc::sockaddr_vm).cast(),
                    &mut len,
                    libc::SOCK_CLOEXEC,
                )
            };
            match check(r) {
                Ok(fd) => {
                    // SAFETY: accept4 returned a new descriptor that nothing else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    return Ok((VsockStream { fd }, addr.svm_cid));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// One AF_VSOCK stream connection.
#[derive(Debug)]
pub struct VsockStream {
    fd: OwnedFd,
}

impl VsockStream {
    /// Connects to `port` of `cid`; `send_timeout` bounds each write (`SO_SNDTIMEO`).
    pub fn connect(cid: u32, port: u32, send_timeout: Option<Duration>) -> io::Result<Self> {
        let fd = socket()?;
        set_timeout(&fd, libc::SO_SNDTIMEO, send_timeout)?;
        let addr = address(cid, port);
        // SAFETY: `addr` is a valid sockaddr_vm of ADDRESS_LEN bytes that outlives the call.
        check(unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast(),
                ADDRESS_LEN,
            )
        })?;
        Ok(VsockStream { fd })
    }

    /// Bounds each read (`SO_RCVTIMEO`); `None` waits for ever.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        set_timeout(&self.fd, libc::SO_RCVTIMEO, t)
    }

    /// Tells the peer nothing more will be written (its reads then end).
    pub fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: shutdown(2) on a descriptor we own.
        check(unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) }).map(drop)
    }
}

impl Read for VsockStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

impl Write for VsockStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of reads.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for VsockStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
