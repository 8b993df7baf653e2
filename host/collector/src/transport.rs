//! Where reports come from: a [`Listener`] yields connections with the peer's CID as the
//! host assigned it. [`VsockListener`] is the real one (AF_VSOCK, the `vfio-p2p-vsock`
//! crate the guest agent sends with too),
//! [`UnixCidListener`] serves Cloud Hypervisor's hybrid vsock;
//! [`ChannelListener`] hands over Unix socket pairs with a CID chosen by the caller, so
//! the collector's limits are tested without vsock.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::Receiver;
use std::sync::Mutex;

use vfio_p2p_read::guest_report::ReportStream;
use vfio_p2p_vsock::{VsockListener, VsockStream};

/// A source of connections, each with the sender's CID. `Ok(None)`: the listener is closed.
pub trait Listener {
    type Stream: ReportStream + Send + 'static;
    fn accept(&self) -> io::Result<Option<(Self::Stream, u32)>>;
}

impl Listener for VsockListener {
    type Stream = VsockStream;

    fn accept(&self) -> io::Result<Option<(VsockStream, u32)>> {
        VsockListener::accept(self).map(Some)
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
