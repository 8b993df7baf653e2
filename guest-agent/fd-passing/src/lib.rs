//! One message and at most one file descriptor over a Unix stream socket (`SCM_RIGHTS`,
//! unix(7)): the agent's `cross-process` owner hands the descriptor of CUDA memory
//! (`cuMemExportToShareableHandle`) to the writer this way. std has no stable API for
//! ancillary data (`SocketAncillary` is unstable), so the one `unsafe` that takes
//! ownership of a received descriptor lives here.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Sends `bytes` in one `sendmsg`, with `fd` attached when given.
pub fn send(sock: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg: Vec<ControlMessage<'_>> = if fds.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    let iov = [IoSlice::new(bytes)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(std::io::Error::from)?;
    Ok(())
}

/// Receives one message into `buf` with one `recvmsg`: its length and the first
/// descriptor that came with it (received close-on-exec; any further one is closed).
pub fn receive(sock: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fd = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: SCM_RIGHTS gave this process a new descriptor nothing owns.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    Ok((msg.bytes, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_descriptor_crosses_with_its_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"through the socket").unwrap();
        send(&a, b"hello", Some(std::os::fd::AsFd::as_fd(&file))).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = receive(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let mut got = std::fs::File::from(fd.expect("a descriptor came with the message"));
        got.rewind().unwrap();
        let mut text = String::new();
        got.read_to_string(&mut text).unwrap();
        assert_eq!(text, "through the socket");
    }

    #[test]
    fn a_message_without_a_descriptor_has_none() {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, b"bare", None).unwrap();
        let mut buf = [0u8; 16];
        let (n, fd) = receive(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"bare");
        assert!(fd.is_none());
    }
}
