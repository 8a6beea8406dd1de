//! inotify, signalfd and poll for `--watch`, over `nix` (no `unsafe` here).

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify as NixInotify};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

pub use nix::sys::inotify::WatchDescriptor;

pub struct Inotify {
    inner: NixInotify,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub wd: WatchDescriptor,
    /// `IN_*` bits.
    pub mask: u32,
    pub name: String,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        let inner = NixInotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        Ok(Inotify { inner })
    }

    /// Watch `dir` for the `IN_*` bits in `mask`; returns the watch descriptor.
    pub fn add(&self, dir: &Path, mask: u32) -> io::Result<WatchDescriptor> {
        Ok(self
            .inner
            .add_watch(dir, AddWatchFlags::from_bits_truncate(mask))?)
    }

    /// Every queued event (none when nothing is queued).
    pub fn read(&self) -> io::Result<Vec<Event>> {
        let mut events = Vec::new();
        loop {
            match self.inner.read_events() {
                Ok(batch) if batch.is_empty() => return Ok(events),
                Ok(batch) => events.extend(batch.into_iter().map(|e| {
                    Event {
                        wd: e.wd,
                        mask: e.mask.bits(),
                        name: e
                            .name
                            .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
                            .unwrap_or_default(),
                    }
                })),
                Err(nix::errno::Errno::EAGAIN) => return Ok(events),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// SIGTERM/SIGINT/SIGHUP delivered as readable data instead of handlers.
/// Blocks those signals for the calling thread (call before any thread starts).
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    pub fn new() -> io::Result<Signals> {
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            set.add(s);
        }
        set.thread_block()?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        Ok(Signals { fd })
    }

    /// The next pending signal number, if any.
    pub fn read(&self) -> io::Result<Option<i32>> {
        match self.fd.read_signal() {
            Ok(info) => Ok(info.map(|i| i.ssi_signo as i32)),
            Err(nix::errno::Errno::EINTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout` passes; returns which are
/// readable (EINTR counts as a timeout).
pub fn poll_readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Duration,
) -> io::Result<[bool; N]> {
    let mut pfds = fds.map(|fd| PollFd::new(fd, PollFlags::POLLIN));
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match nix::poll::poll(&mut pfds, ms) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok([false; N]),
        Err(e) => return Err(e.into()),
    }
    let ready = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
    Ok(pfds.map(|p| p.revents().is_some_and(|r| r.intersects(ready))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn inotify_sees_a_rename() {
        let (_tmp, d) = crate::testing::scratch_dir("podgate-sys-");
        let ino = Inotify::new().unwrap();
        let wd = ino
            .add(&d, libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE)
            .unwrap();
        std::fs::write(d.join("a.tmp"), b"x").unwrap();
        std::fs::rename(d.join("a.tmp"), d.join("10-a.conflist")).unwrap();
        let ready = poll_readable([ino.fd()], Duration::from_secs(5)).unwrap();
        assert_eq!(ready, [true]);
        let ev = ino.read().unwrap();
        assert!(ev
            .iter()
            .any(|e| e.wd == wd && e.name == "10-a.conflist" && e.mask & libc::IN_MOVED_TO != 0));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
