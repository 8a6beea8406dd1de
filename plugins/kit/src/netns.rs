//! Network namespaces: open by path (never created), and scoped entry.
//!
//! `run` executes a closure on a short-lived thread that joins the target
//! namespace and then exits, so no thread of ours is ever left in the wrong
//! namespace (even on panic), and the calling thread never moves. Sockets made
//! inside `run` stay bound to that namespace and can be used afterwards from
//! the caller's thread.

use crate::error::{Error, Result};
use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `NS_GET_NSTYPE` from linux/nsfs.h: which kind of namespace an nsfs fd is.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl NetNs {
    /// Open an existing namespace (`/var/run/netns/x`, `/proc/PID/ns/net`).
    /// Plain `open(O_RDONLY)`: a missing path is an error, never created.
    pub fn open(path: &Path) -> Result<NetNs> {
        let file = File::open(path).map_err(|source| Error::Netns {
            path: path.into(),
            op: "open",
            source,
        })?;
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| Error::Netns {
            path: path.into(),
            op: "fstatfs",
            source: e.into(),
        })?;
        let magic = fs.filesystem_type().0 as i64;
        if magic != NSFS_MAGIC {
            return Err(Error::NotNetns { path: path.into() });
        }
        // A mount or pid namespace file is nsfs too; only a network one will do.
        // SAFETY: ioctl on an fd we own, no memory passed.
        let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
        if kind != libc::CLONE_NEWNET {
            return Err(Error::NotNetns { path: path.into() });
        }
        let md = file.metadata().map_err(|source| Error::Netns {
            path: path.into(),
            op: "stat",
            source,
        })?;
        Ok(NetNs {
            file,
            path: path.into(),
            dev: md.dev(),
            ino: md.ino(),
        })
    }

    /// The calling thread's namespace.
    pub fn current() -> Result<NetNs> {
        NetNs::open(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Same namespace (compared by device and inode, as the kernel identifies it).
    pub fn same_as(&self, other: &NetNs) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Run `f` inside this namespace on a scoped helper thread.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        if NetNs::current().is_ok_and(|c| c.same_as(self)) {
            return Ok(f());
        }
        std::thread::scope(|s| {
            let handle = s.spawn(|| -> Result<T> {
                setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Netns {
                    path: self.path.clone(),
                    op: "setns",
                    source: e.into(),
                })?;
                Ok(f())
            });
            match handle.join() {
                Ok(r) => r,
                // Re-raise on the caller's thread so the panic hook reports it.
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_regular_files_and_missing_paths() {
        for p in ["/etc/hostname", "/proc/self/status", "/proc/self/ns/mnt"] {
            let e = NetNs::open(Path::new(p)).unwrap_err();
            assert!(matches!(e, Error::NotNetns { .. }), "{p}: {e}");
        }
        let e = NetNs::open(Path::new("/nonexistent/netns")).unwrap_err();
        assert!(e.is_not_found());
        assert!(!Path::new("/nonexistent/netns").exists());
    }

    #[test]
    fn current_is_same_as_itself() {
        let a = NetNs::current().unwrap();
        let b = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(a.same_as(&b));
        assert_eq!(a.run(|| 7).unwrap(), 7);
    }
}
