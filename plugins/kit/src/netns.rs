//! Network namespaces: open by path (never created), and scoped entry.
//!
//! [`NetNs::open_in`] executes a closure with the calling thread inside the
//! target namespace and brings the thread back before it returns (also when
//! the closure panics; a thread that cannot come back ends the process
//! rather than go on in the wrong namespace). Handles made there (netlink
//! sockets, /proc/sys files) stay bound to that namespace and are used
//! afterwards from any thread. [`NetNs::run`] is the same for callers that
//! may already be in the namespace (the CLI).

use crate::error::{Error, Result};
use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
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
        let md = file.metadata().map_err(|source| Error::Netns {
            path: path.into(),
            op: "stat",
            source,
        })?;
        let ns = NetNs {
            file,
            path: path.into(),
            dev: md.dev(),
            ino: md.ino(),
        };
        // A mount or pid namespace file is nsfs too; only a network one will do.
        // SAFETY: ioctl on an fd we own, no memory passed.
        let kind = unsafe { libc::ioctl(ns.file.as_raw_fd(), NS_GET_NSTYPE as _) };
        let kind = if kind < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(kind)
        };
        check_nstype(kind, || ns.open_in(|| ()), path)?;
        Ok(ns)
    }

    /// The calling thread's namespace.
    pub fn current() -> Result<NetNs> {
        NetNs::open(Path::new(THREAD_NETNS))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Same namespace (compared by device and inode, as the kernel identifies it).
    pub fn same_as(&self, other: &NetNs) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Device and inode of the nsfs file (no trip into the namespace).
    pub fn dev_ino(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The full identity: device, inode and the kernel's netns cookie (one
    /// trip into the namespace). Inodes of destroyed namespaces are reused;
    /// cookies never are within a boot.
    pub fn identity(&self) -> Result<NsIdentity> {
        let cookie = self.run(current_cookie)??;
        Ok(NsIdentity {
            dev: self.dev,
            ino: self.ino,
            cookie,
        })
    }

    /// Run `f` inside this namespace: on the calling thread moved there and
    /// back ([`NetNs::open_in`]), or right here when the caller already is
    /// in it.
    pub fn run<T, F: FnOnce() -> T>(&self, f: F) -> Result<T> {
        // One statx of the thread's own link (not opening it): device and
        // inode are all the comparison needs.
        if current_identity_with(None).is_ok_and(|c| (c.dev, c.ino) == self.dev_ino()) {
            return Ok(f());
        }
        self.open_in(f)
    }

    /// Open handles in this namespace: `f` runs on the calling thread moved
    /// into the namespace with `setns`, and the thread is moved back to the
    /// namespace it was in before this returns (or unwinds). `Err` if the
    /// thread could not enter the namespace (`f` is then dropped unrun).
    ///
    /// No helper thread: a thread costs a stack mapping, its faults and a
    /// join (~0.1 ms of a plugin call; plugins/kit/README.md design notes);
    /// `setns(CLONE_NEWNET)` moves only the calling thread, so the other
    /// threads of a process never see the change.
    ///
    /// Unlike [`NetNs::run`] this does not first check whether the caller
    /// already is in the namespace (four syscalls): `setns` into the
    /// namespace a thread is in is allowed and changes nothing.
    pub fn open_in<T, F: FnOnce() -> T>(&self, f: F) -> Result<T> {
        let home = File::open(THREAD_NETNS).map_err(|source| Error::Netns {
            path: PathBuf::from(THREAD_NETNS),
            op: "open (the namespace to come back to)",
            source,
        })?;
        setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Netns {
            path: self.path.clone(),
            op: "setns",
            source: e.into(),
        })?;
        let _back = ComeBack { home, from: self };
        Ok(f())
    }
}

/// `Ok` if the nsfs file at `path` is a network namespace, given what
/// `NS_GET_NSTYPE` answered (`kind`). Only when the ioctl itself is not
/// supported (kernels before 4.11 answer ENOTTY; qemu-user, which does not
/// translate it, ENOSYS; EINVAL for an unknown request) does the kernel's
/// other type check decide: `enter` moves the thread into the namespace with
/// `setns(fd, CLONE_NEWNET)` and back, which the kernel refuses with EINVAL
/// for any other kind of namespace. (The fd's `/proc/self/fd` link would not
/// do: for a bind-mounted namespace, `/var/run/netns/x` as runtimes pass it,
/// it names the mount point, not `net:[<inode>]`.) Every other outcome is a
/// refusal.
fn check_nstype(
    kind: std::io::Result<libc::c_int>,
    enter: impl FnOnce() -> Result<()>,
    path: &Path,
) -> Result<()> {
    let not_netns = || Error::NotNetns { path: path.into() };
    match kind {
        Ok(libc::CLONE_NEWNET) => Ok(()),
        Ok(_) => Err(not_netns()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTTY | libc::ENOSYS | libc::EINVAL)
            ) =>
        {
            match enter() {
                Ok(()) => Ok(()),
                Err(Error::Netns { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                    Err(not_netns())
                }
                Err(e) => Err(e),
            }
        }
        Err(source) => Err(Error::Netns {
            path: path.into(),
            op: "ioctl(NS_GET_NSTYPE)",
            source,
        }),
    }
}

/// Moves the thread back into `home` when dropped: after the closure of
/// [`NetNs::open_in`] returns or while it unwinds.
struct ComeBack<'a> {
    home: File,
    from: &'a NetNs,
}

impl Drop for ComeBack<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.home, CloneFlags::CLONE_NEWNET) {
            // Going on would run node-side work inside the pod's namespace:
            // fail closed. A panic reaches the plugin's panic hook (a CNI
            // error on stdout); during an unwind, a second panic aborts.
            panic!(
                "cannot return from netns {} to this thread's own namespace: setns: {e}",
                self.from.path.display()
            );
        }
    }
}

/// Which namespace, as the kernel tells them apart: (dev, ino) of the nsfs
/// file plus the netns cookie (`SO_NETNS_COOKIE`, never reused within a boot;
/// `None` on kernels before 5.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NsIdentity {
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
}

impl NsIdentity {
    /// Same namespace: dev and inode equal, and the cookies too when both
    /// sides know one.
    pub fn same_as(&self, other: &NsIdentity) -> bool {
        self.dev == other.dev
            && self.ino == other.ino
            && match (self.cookie, other.cookie) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// `SO_NETNS_COOKIE` from asm-generic/socket.h.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The netns cookie of the calling thread's namespace (a throwaway socket
/// asked with `SO_NETNS_COOKIE`). `Ok(None)` on kernels that lack it.
pub fn current_cookie() -> Result<Option<u64>> {
    // SAFETY: plain socket(2); the fd is owned by `sock` below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Netns {
            path: PathBuf::from(THREAD_NETNS),
            op: "socket for SO_NETNS_COOKIE",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    cookie_of(sock.as_fd())
}

/// The netns cookie of the namespace socket `sock` is bound to (the one it
/// was created in). `Ok(None)` where it cannot be read: kernels that lack
/// `SO_NETNS_COOKIE` answer ENOPROTOOPT; qemu-user (an arm64 binary run on
/// another machine) passes the option on with an `int`-sized buffer, which
/// the kernel answers with EINVAL (it does for nothing else: the 8 bytes
/// given here are the option's size). Identities then compare device and
/// inode only, as on those kernels.
pub fn cookie_of(sock: std::os::fd::BorrowedFd<'_>) -> Result<Option<u64>> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOPROTOOPT | libc::EINVAL)) {
            return Ok(None);
        }
        return Err(Error::Netns {
            path: PathBuf::from("(the netns the socket is bound to)"),
            op: "getsockopt(SO_NETNS_COOKIE)",
            source: e,
        });
    }
    Ok(Some(cookie))
}

/// The calling thread's own network namespace.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// The identity of the calling thread's namespace (the node's, for a plugin).
pub fn current_identity() -> Result<NsIdentity> {
    current_identity_with(current_cookie()?)
}

/// [`current_identity`] with the cookie already read from a socket this
/// thread made in its namespace (a netlink socket the caller opens anyway):
/// then only one `statx` is left. The link is the calling thread's own
/// network namespace by construction, so unlike [`NetNs::open`] there is
/// nothing to verify (nsfs, the namespace type) and nothing to keep open:
/// `stat` follows it to the nsfs inode, the same device and inode an open
/// fd reports.
pub fn current_identity_with(cookie: Option<u64>) -> Result<NsIdentity> {
    let md = std::fs::metadata(THREAD_NETNS).map_err(|source| Error::Netns {
        path: PathBuf::from(THREAD_NETNS),
        op: "stat",
        source,
    })?;
    Ok(NsIdentity {
        dev: md.dev(),
        ino: md.ino(),
        cookie,
    })
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's ID (`/proc/sys/kernel/random/boot_id`): records written in an
/// earlier boot describe pods that no longer exist.
pub fn boot_id() -> Result<String> {
    std::fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::State {
            path: PathBuf::from(BOOT_ID),
            op: "read",
            source,
        })
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

    /// `check_nstype` for the file at `path` when `NS_GET_NSTYPE` answered
    /// `kind`, with the real `setns` into it (and back) as the fallback.
    fn checked(path: &str, kind: std::io::Result<libc::c_int>) -> Result<()> {
        let ns = NetNs {
            file: File::open(path).unwrap(),
            path: PathBuf::from(path),
            dev: 0,
            ino: 0,
        };
        check_nstype(kind, || ns.open_in(|| ()), Path::new(path))
    }

    fn failed(errno: i32) -> std::io::Result<libc::c_int> {
        Err(std::io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn without_ns_get_nstype_a_network_namespace_is_told_by_entering_it() {
        let home = NetNs::current().unwrap();
        let bound = crate::testing::NamedNetns::add("netns");
        for errno in [libc::ENOTTY, libc::ENOSYS, libc::EINVAL] {
            checked("/proc/self/ns/net", failed(errno)).unwrap();
            // A bind-mounted one (/var/run/netns/x, as runtimes pass it).
            checked(&bound.0, failed(errno)).unwrap();
            assert!(NetNs::current().unwrap().same_as(&home));
        }
    }

    #[test]
    fn without_ns_get_nstype_anything_but_a_network_namespace_is_refused() {
        let home = NetNs::current().unwrap();
        for errno in [libc::ENOTTY, libc::ENOSYS, libc::EINVAL] {
            for p in ["/proc/self/ns/mnt", "/proc/self/ns/uts", "/etc/hostname"] {
                let e = checked(p, failed(errno)).unwrap_err();
                assert!(
                    matches!(e, Error::NotNetns { .. }),
                    "{p}, errno {errno}: {e}"
                );
            }
            // Entering fails for another reason: refused, with that reason.
            let e = check_nstype(
                failed(errno),
                || {
                    Err(Error::Netns {
                        path: PathBuf::from("x"),
                        op: "setns",
                        source: std::io::Error::from_raw_os_error(libc::EPERM),
                    })
                },
                Path::new("x"),
            )
            .unwrap_err();
            assert!(e.to_string().contains("setns"), "{e}");
            assert!(NetNs::current().unwrap().same_as(&home));
        }
    }

    #[test]
    fn ns_get_nstype_decides_when_it_answers_and_its_other_failures_are_refusals() {
        checked("/proc/self/ns/net", Ok(libc::CLONE_NEWNET)).unwrap();
        // Not entered when the ioctl names another type.
        let e = checked("/proc/self/ns/net", Ok(libc::CLONE_NEWNS)).unwrap_err();
        assert!(matches!(e, Error::NotNetns { .. }), "{e}");
        for errno in [libc::EBADF, libc::EPERM, libc::EFAULT] {
            let e = checked("/proc/self/ns/net", failed(errno)).unwrap_err();
            assert!(
                matches!(&e, Error::Netns { op: "ioctl(NS_GET_NSTYPE)", source, .. }
                    if source.raw_os_error() == Some(errno)),
                "errno {errno}: {e}"
            );
        }
    }

    #[test]
    fn current_identity_is_what_opening_the_namespace_says() {
        let opened = NetNs::current().unwrap().identity().unwrap();
        let stated = current_identity().unwrap();
        assert_eq!(opened, stated);
        assert_eq!(current_identity_with(opened.cookie).unwrap(), opened);
        // The calling thread's, not the process's: a thread in another
        // namespace gets that one's.
        let (other, other_opened) = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
            let ns = NetNs::current().unwrap();
            (current_identity().unwrap(), ns.identity().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(other, other_opened);
        assert_ne!((other.dev, other.ino), (stated.dev, stated.ino));
    }

    #[test]
    fn current_is_same_as_itself() {
        let a = NetNs::current().unwrap();
        let b = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(a.same_as(&b));
        assert_eq!(a.run(|| 7).unwrap(), 7);
    }

    /// A fresh namespace, made on a thread that then ends (the nsfs fd
    /// keeps it alive); needs root, as every netns test here.
    fn fresh() -> NetNs {
        std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
            NetNs::current().unwrap()
        })
        .join()
        .unwrap()
    }

    #[test]
    fn handles_opened_in_a_namespace_stay_bound_to_it() {
        let ns = fresh();
        assert!(!ns.same_as(&NetNs::current().unwrap()));
        let name = "net.ipv4.conf.lo.forwarding";
        let here = crate::sysctl::read(name).unwrap();
        let there = if here == "1" { "0" } else { "1" };
        // Written inside the namespace (by path, on the helper thread) ...
        ns.open_in(|| crate::sysctl::ensure(name, there))
            .unwrap()
            .unwrap();
        // ... and read through a handle opened there, from this thread.
        let f = ns
            .open_in(|| crate::sysctl::SysctlFile::open(name, "fresh"))
            .unwrap()
            .unwrap();
        assert_eq!(f.read().unwrap(), there);
        assert_eq!(crate::sysctl::read(name).unwrap(), here);
        // The cookie off a socket opened there is the namespace's, not ours.
        let sock = ns.open_in(crate::nft::NftSocket::new).unwrap().unwrap();
        let cookie = sock.netns_cookie().unwrap();
        assert_eq!(cookie, ns.identity().unwrap().cookie);
        if let (Some(a), Some(b)) = (cookie, current_cookie().unwrap()) {
            assert_ne!(a, b);
        }
    }

    #[test]
    fn the_thread_comes_back_after_the_closure_and_after_a_panic() {
        let ns = fresh();
        let home = NetNs::current().unwrap();
        // Inside the closure this thread is in `ns` ...
        let inside = ns.open_in(|| NetNs::current().unwrap()).unwrap();
        assert!(inside.same_as(&ns));
        // ... and back home afterwards.
        assert!(NetNs::current().unwrap().same_as(&home));
        // A panic inside unwinds through the return too.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ns.open_in(|| panic!("inside")).unwrap()
        }));
        assert!(caught.is_err());
        assert!(NetNs::current().unwrap().same_as(&home));
        // A namespace that cannot be entered leaves the thread where it was
        // and does not run the closure.
        // (A UTS namespace file: setns(CLONE_NEWNET) refuses it.)
        let bad = NetNs {
            file: File::open("/proc/self/ns/uts").unwrap(),
            path: PathBuf::from("/proc/self/ns/uts"),
            dev: 0,
            ino: 0,
        };
        let mut ran = false;
        assert!(bad.open_in(|| ran = true).is_err());
        assert!(!ran);
        assert!(NetNs::current().unwrap().same_as(&home));
    }

    #[test]
    fn identity_of_the_current_namespace_is_stable() {
        let a = current_identity().unwrap();
        let b = NetNs::current().unwrap().identity().unwrap();
        assert!(a.same_as(&b), "{a:?} {b:?}");
        let other = NsIdentity {
            ino: a.ino + 1,
            ..a
        };
        assert!(!a.same_as(&other));
        assert_eq!(boot_id().unwrap().len(), 36);
    }
}
