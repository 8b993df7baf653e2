//! Reads one guest's report off a connection: bounded in bytes and in time, then parsed
//! with the strict schema of [`vfio_p2p_contract::GuestReport`]. A guest is not trusted:
//! a slow or silent sender gets at most `deadline`, a talkative one `max_bytes`.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use vfio_p2p_contract::{GuestReport, GuestReportError};

/// A connection the collector can put a read deadline on.
pub trait ReportStream: Read {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
}

impl ReportStream for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
}

/// Why a connection did not give a report.
#[derive(Debug, thiserror::Error)]
pub enum ReadReportError {
    #[error("sent more than {0} bytes")]
    TooLarge(usize),
    #[error("did not finish within {0:?}")]
    Deadline(Duration),
    #[error("connection failed: {0}")]
    Io(io::Error),
    #[error("{0}")]
    Invalid(#[from] GuestReportError),
}

/// Reads until the sender closes its side, at most `max_bytes`, all within `deadline`.
pub fn read_report(
    s: &mut impl ReportStream,
    max_bytes: usize,
    deadline: Duration,
) -> Result<GuestReport, ReadReportError> {
    let bytes = read_bounded(s, max_bytes, deadline)?;
    Ok(GuestReport::from_json(&bytes)?)
}

fn read_bounded(
    s: &mut impl ReportStream,
    max_bytes: usize,
    deadline: Duration,
) -> Result<Vec<u8>, ReadReportError> {
    let end = Instant::now() + deadline;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadReportError::Deadline(deadline));
        }
        s.set_read_timeout(Some(left))
            .map_err(ReadReportError::Io)?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReadReportError::Deadline(deadline))
            }
            Err(e) => return Err(ReadReportError::Io(e)),
        };
        if n == 0 {
            return Ok(buf);
        }
        if buf.len() + n > max_bytes {
            return Err(ReadReportError::TooLarge(max_bytes));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
