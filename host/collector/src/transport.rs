//! Where reports come from: a [`Listener`] yields connections with the peer's CID as the
//! host assigned it. [`VsockListener`] is the real one (AF_VSOCK through libc),
//! [`UnixCidListener`] serves Cloud Hypervisor's hybrid vsock;
//! [`ChannelListener`] hands over Unix socket pairs with a CID chosen by the caller, so
//! the collector's limits are tested without vsock.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Receiver;
use std::sync::Mutex;
use std::time::Duration;

use vfio_p2p_read::guest_report::ReportStream;

/// A source of connections, each with the sender's CID. `Ok(None)`: the listener is closed.
pub trait Listener {
    type Stream: ReportStream + Send + 'static;
    fn accept(&self) -> io::Result<Option<(Self::Stream, u32)>>;
}

/// A listening AF_VSOCK stream socket.
pub struct VsockListener {
    fd: OwnedFd,
}

/// One accepted AF_VSOCK connection.
pub struct VsockStream {
    fd: OwnedFd,
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl VsockListener {
    /// Listens on `port` for any CID (needs the `vhost_vsock` module on the host).
    pub fn bind(port: u32) -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let raw = check(unsafe {
            libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_vm is plain data; all-zero is a valid value before the fields are set.
        let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_port = port;
        addr.svm_cid = libc::VMADDR_CID_ANY;
        let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_vm of `len` bytes that outlives the call.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_vm).cast(),
                len,
            )
        })?;
        // SAFETY: listen(2) on a descriptor we own.
        check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
        Ok(VsockListener { fd })
    }

    /// Takes a listening vsock socket handed over by systemd (socket activation).
    ///
    /// # Safety
    /// `fd` must be an open listening AF_VSOCK socket that nothing else owns.
    pub unsafe fn from_raw(fd: RawFd) -> Self {
        VsockListener {
            // SAFETY: the caller guarantees ownership (see above).
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        }
    }
}

impl Listener for VsockListener {
    type Stream = VsockStream;

    fn accept(&self) -> io::Result<Option<(VsockStream, u32)>> {
        loop {
            // SAFETY: plain data, filled in by accept4(2).
            let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
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
                    return Ok(Some((VsockStream { fd }, addr.svm_cid)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
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

impl ReportStream for VsockStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        let t = t.unwrap_or_default();
        let tv = libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            // at least 1 µs: a zero timeval would mean "no timeout"
            tv_usec: (t.subsec_micros().max(u32::from(t.is_zero()))) as libc::suseconds_t,
        };
        // SAFETY: `tv` is a valid timeval for SO_RCVTIMEO and outlives the call.
        check(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })
        .map(drop)
    }
}

/// A Unix socket standing for one VM's vsock: Cloud Hypervisor's hybrid vsock hands a
/// guest's connection to CID 2 port P to the host as a connection on `SOCKET_P`, so every
/// connection here comes from the one VM whose socket it is, with that VM's CID.
pub struct UnixCidListener {
    listener: std::os::unix::net::UnixListener,
    cid: u32,
}

impl UnixCidListener {
    /// Listens at `path` (a stale socket file there is replaced) for the VM with `cid`.
    pub fn bind(path: &std::path::Path, cid: u32) -> io::Result<Self> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }) {
            std::fs::remove_file(path)?;
        }
        Ok(UnixCidListener {
            listener: std::os::unix::net::UnixListener::bind(path)?,
            cid,
        })
    }
}

impl Listener for UnixCidListener {
    type Stream = UnixStream;

    fn accept(&self) -> io::Result<Option<(UnixStream, u32)>> {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => return Ok(Some((s, self.cid))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Connections handed in by the caller with the CID to attribute them to: the collector's
/// tests (and benchmarks) on Unix socket pairs. Closed when every sender is dropped.
pub struct ChannelListener {
    rx: Mutex<Receiver<(UnixStream, u32)>>,
}

impl ChannelListener {
    pub fn new(rx: Receiver<(UnixStream, u32)>) -> Self {
        ChannelListener { rx: Mutex::new(rx) }
    }
}

impl Listener for ChannelListener {
    type Stream = UnixStream;

    fn accept(&self) -> io::Result<Option<(UnixStream, u32)>> {
        Ok(self.rx.lock().expect("not poisoned").recv().ok())
    }
}
