//! Unix-socket I/O under one shared deadline: connect, write and every read
//! get a socket timeout recomputed from what is left of the budget, and
//! responses are capped, so a wedged, slow or chatty peer ends in an error,
//! never a hang.

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
use nix::sys::time::TimeVal;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest HTTP response accepted from the agent.
pub const MAX_RESPONSE: usize = 64 * 1024;
/// Largest OVSDB reply: one Port and one Interface row per peer chassis
/// (a few hundred bytes each), so thousands of tunnels fit.
pub const MAX_OVSDB_REPLY: usize = 16 * 1024 * 1024;

/// One budget for all I/O of an evaluation.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    end: Instant,
    total: Duration,
}

impl Deadline {
    pub fn after(total: Duration) -> Deadline {
        Deadline {
            end: Instant::now() + total,
            total,
        }
    }

    /// What is left, or None once the budget is spent.
    pub fn remaining(&self) -> Option<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    pub fn total(&self) -> Duration {
        self.total
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("socket {0} absent")]
    Absent(String),
    #[error("connect {path}: {err}")]
    Connect { path: String, err: std::io::Error },
    #[error("no answer within {}ms", .0.as_millis())]
    Timeout(Duration),
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    #[error("connection closed before a complete response")]
    Truncated,
    #[error("malformed response: {0}")]
    Protocol(#[from] Malformed),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What makes a peer's response one that can never be valid (the agent's
/// HTTP, OVSDB's JSON-RPC). Offending lines are kept shortened.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("no end of headers")]
    NoHeaderEnd,
    #[error("not an HTTP/1.x response")]
    NotHttp,
    #[error("headers are not UTF-8")]
    HeadersNotUtf8,
    #[error("status line {0:?}")]
    StatusLine(String),
    #[error("header line {0:?}")]
    HeaderLine(String),
    #[error("Content-Length {0:?}")]
    ContentLength(String),
    #[error("truncated chunked body")]
    TruncatedChunks,
    #[error("body shorter than Content-Length")]
    ShortBody,
    #[error("chunk size {0:?}")]
    ChunkSize(String),
    #[error("chunk not followed by CRLF")]
    ChunkEnd,
    #[error("not JSON-RPC: {0}")]
    NotJsonRpc(#[from] serde_json::Error),
}

impl IoError {
    fn from_io(e: std::io::Error, dl: &Deadline) -> IoError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => IoError::Timeout(dl.total()),
            _ => IoError::Io(e),
        }
    }
}

fn left(dl: &Deadline) -> Result<Duration, IoError> {
    dl.remaining().ok_or(IoError::Timeout(dl.total()))
}

fn timeval(d: Duration) -> TimeVal {
    // A zero timeout means "forever" to the kernel: never set one.
    let d = d.max(Duration::from_millis(1));
    TimeVal::new(
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        i64::from(d.subsec_micros()),
    )
}

/// Connect to a unix stream socket. The send timeout is set before connect so
/// even a peer with a full accept backlog cannot stall us past the deadline.
pub fn connect(path: &Path, dl: &Deadline) -> Result<UnixStream, IoError> {
    let shown = path.display().to_string();
    let conn_err = |err: std::io::Error| -> IoError {
        match err.kind() {
            ErrorKind::NotFound => IoError::Absent(shown.clone()),
            ErrorKind::WouldBlock | ErrorKind::TimedOut => IoError::Timeout(dl.total()),
            _ => IoError::Connect {
                path: shown.clone(),
                err,
            },
        }
    };
    let addr = UnixAddr::new(path).map_err(|e| conn_err(e.into()))?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| conn_err(e.into()))?;
    socket::setsockopt(&fd, sockopt::SendTimeout, &timeval(left(dl)?))
        .map_err(|e| conn_err(e.into()))?;
    loop {
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(conn_err(e.into())),
        }
    }
    Ok(UnixStream::from(fd))
}

pub fn write_all(s: &mut UnixStream, mut bytes: &[u8], dl: &Deadline) -> Result<(), IoError> {
    while !bytes.is_empty() {
        s.set_write_timeout(Some(left(dl)?.max(Duration::from_millis(1))))?;
        match s.write(bytes) {
            Ok(0) => return Err(IoError::Truncated),
            Ok(n) => bytes = bytes.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(IoError::from_io(e, dl)),
        }
    }
    Ok(())
}

/// Read until `complete` says the bytes so far hold a whole response (returns
/// Some), or EOF. At most `max` bytes are ever buffered.
pub fn read_until<T>(
    s: &mut UnixStream,
    dl: &Deadline,
    max: usize,
    mut complete: impl FnMut(&[u8], bool) -> Result<Option<T>, IoError>,
) -> Result<T, IoError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        s.set_read_timeout(Some(left(dl)?.max(Duration::from_millis(1))))?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(IoError::from_io(e, dl)),
        };
        let eof = n == 0;
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if buf.len() > max {
            return Err(IoError::TooLarge(max));
        }
        if let Some(done) = complete(&buf, eof)? {
            return Ok(done);
        }
        if eof {
            return Err(IoError::Truncated);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn absent_socket_and_hung_peer() {
        let tmp = tempfile::Builder::new().prefix("pg-io-").tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let path = dir.join("s.sock");
        let dl = Deadline::after(Duration::from_millis(100));
        assert!(matches!(connect(&path, &dl), Err(IoError::Absent(_))));

        let _listener = UnixListener::bind(&path).unwrap(); // never accepts or answers
        let start = Instant::now();
        let mut s = connect(&path, &dl).unwrap();
        let r: Result<(), _> = read_until(&mut s, &dl, MAX_RESPONSE, |_, _| Ok(None));
        assert!(matches!(r, Err(IoError::Timeout(_))), "{r:?}");
        assert!(start.elapsed() < Duration::from_millis(400));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_peer_that_dribbles_is_cut_at_the_deadline() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            for _ in 0..40 {
                if b.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let dl = Deadline::after(Duration::from_millis(150));
        let start = Instant::now();
        let r: Result<(), _> = read_until(&mut a, &dl, MAX_RESPONSE, |_, _| Ok(None));
        assert!(matches!(r, Err(IoError::Timeout(_))), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
        drop(a);
        t.join().unwrap();
    }

    #[test]
    fn caps_response_size() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let junk = vec![b'x'; MAX_RESPONSE + 10];
            let _ = b.write_all(&junk);
        });
        let dl = Deadline::after(Duration::from_secs(2));
        let r: Result<(), _> = read_until(&mut a, &dl, MAX_RESPONSE, |_, _| Ok(None));
        assert!(matches!(r, Err(IoError::TooLarge(_))), "{r:?}");
        drop(a);
        t.join().unwrap();
    }
}
