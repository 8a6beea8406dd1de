//! Thin safe wrappers over inotify, signalfd and poll (libc).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// Size of `struct inotify_event` without its name.
const EVENT_HEADER: usize = 16;

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub struct Inotify {
    fd: OwnedFd,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub wd: i32,
    pub mask: u32,
    pub name: String,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: plain syscall; the returned descriptor is owned from here on.
        let fd = cvt(unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) })?;
        // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watch `dir`; returns the watch descriptor.
    pub fn add(&self, dir: &Path, mask: u32) -> io::Result<i32> {
        let path = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid descriptor and NUL-terminated path.
        cvt(unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), mask) })
    }

    /// Every queued event (none when nothing is queued).
    pub fn read(&self) -> io::Result<Vec<Event>> {
        let mut events = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: the buffer is valid for writes of its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(events),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let len = usize::try_from(n).unwrap_or(0);
            if len == 0 {
                return Ok(events);
            }
            parse_events(buf.get(..len).unwrap_or_default(), &mut events);
        }
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_ne_bytes(bytes))
}

/// Decode `struct inotify_event` records (wd, mask, cookie, len, name[len]).
fn parse_events(mut b: &[u8], out: &mut Vec<Event>) {
    while b.len() >= EVENT_HEADER {
        let (Some(wd), Some(mask), Some(len)) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 12)) else {
            return;
        };
        let end = EVENT_HEADER + len as usize;
        let Some(raw_name) = b.get(EVENT_HEADER..end) else {
            return;
        };
        let name = raw_name.split(|&c| c == 0).next().unwrap_or_default();
        out.push(Event {
            wd: i32::from_ne_bytes(wd.to_ne_bytes()),
            mask,
            name: String::from_utf8_lossy(name).into_owned(),
        });
        b = b.get(end..).unwrap_or_default();
    }
}

/// SIGTERM/SIGINT/SIGHUP delivered as readable data instead of handlers.
/// Blocks those signals for the calling thread (call before any thread starts).
pub struct Signals {
    fd: OwnedFd,
}

impl Signals {
    pub fn new() -> io::Result<Signals> {
        // SAFETY: sigset_t is plain data; it is initialised by sigemptyset
        // before use, and the mask/fd calls get valid pointers.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            cvt(libc::sigprocmask(
                libc::SIG_BLOCK,
                &set,
                std::ptr::null_mut(),
            ))?;
            let fd = cvt(libc::signalfd(
                -1,
                &set,
                libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
            ))?;
            Ok(Signals {
                fd: OwnedFd::from_raw_fd(fd),
            })
        }
    }

    /// The next pending signal number, if any.
    pub fn read(&self) -> io::Result<Option<i32>> {
        // SAFETY: signalfd_siginfo is plain data, fully written by read().
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is valid for writes of `size` bytes.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast::<libc::c_void>(),
                size,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok((usize::try_from(n).ok() == Some(size)).then_some(info.ssi_signo as i32))
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout` passes; returns which are
/// readable (EINTR counts as a timeout).
pub fn poll_readable<const N: usize>(fds: [i32; N], timeout: Duration) -> io::Result<[bool; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfds` is a valid array of N pollfd structures.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok([false; N]);
        }
        return Err(e);
    }
    Ok(pfds.map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_inotify_records() {
        let mut raw = Vec::new();
        for (wd, mask, name) in [
            (1i32, libc::IN_MOVED_TO, "10-a.conflist"),
            (2, libc::IN_DELETE, ""),
        ] {
            let padded = if name.is_empty() { 0 } else { 16 };
            raw.extend(wd.to_ne_bytes());
            raw.extend(mask.to_ne_bytes());
            raw.extend(0u32.to_ne_bytes());
            raw.extend((padded as u32).to_ne_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(padded, 0);
            raw.extend(n);
        }
        let mut ev = Vec::new();
        parse_events(&raw, &mut ev);
        assert_eq!(
            ev,
            vec![
                Event {
                    wd: 1,
                    mask: libc::IN_MOVED_TO,
                    name: "10-a.conflist".into()
                },
                Event {
                    wd: 2,
                    mask: libc::IN_DELETE,
                    name: String::new()
                },
            ]
        );
        // A truncated record is ignored, not read past.
        let mut short = Vec::new();
        parse_events(raw.get(..20).unwrap(), &mut short);
        assert!(short.is_empty());
    }

    #[test]
    fn inotify_sees_a_rename() {
        let d = std::env::temp_dir().join(format!("podgate-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
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
