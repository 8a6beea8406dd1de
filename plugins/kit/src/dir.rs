//! A directory opened without following a link, and every name in it
//! reached through that handle (`openat`, `renameat`, `unlinkat`, `fstatat`
//! relative to its descriptor), never through a link either.
//!
//! For directories a less trusted party can write (the state dir a
//! container of the DaemonSet mounts read-write), read and written by root
//! processes (the plugins, the helper, the installer): a symbolic link
//! planted as a file or a subdirectory must not redirect a write, a FIFO
//! must not hang a CNI call and a device or a huge file must not be read.
//! So: links are refused (`O_NOFOLLOW`: `ELOOP`), files are opened
//! non-blocking and used only if they are regular files, reads are
//! bounded, and a subdirectory is itself a [`Dir`] opened the same way.
//! Only the path handed to [`Dir::open`] is followed up to its last
//! component: it is the caller's (an operator's configured path).
//!
//! A device node opened before its type is checked could act on open (a
//! watchdog); no podgate container may create one (none holds
//! `CAP_MKNOD`), so the check after a non-blocking open is enough here.

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, renameat2, OFlag, RenameFlags};
use nix::sys::stat::{fstatat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory handle; clones share the descriptor.
#[derive(Debug, Clone)]
pub struct Dir(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    fd: OwnedFd,
    path: PathBuf,
}

/// What a file in a [`Dir`] is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    Read,
    /// Created with the mode; fails if the name exists (a stale temp file
    /// is removed first by the caller, never written through).
    CreateNew(u32),
    /// Read-write, created with the mode if missing (a lock file).
    ReadWriteCreate(u32),
    /// Appended to; created with the mode if `Some`.
    Append(Option<u32>),
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The error of a name that is a symbolic link, for a clearer message than
/// `ELOOP`'s "too many levels of symbolic links".
fn refused(e: Errno, what: &str) -> io::Error {
    match e {
        Errno::ELOOP => io::Error::new(
            ErrorKind::InvalidInput,
            format!("{what} is a symbolic link: never followed here"),
        ),
        e => io::Error::from(e),
    }
}

/// A directory open's error: `O_DIRECTORY|O_NOFOLLOW` on a link fails
/// with `ENOTDIR` (or `ELOOP`), as on a file; `is_link` tells them apart.
fn dir_refused(e: Errno, is_link: impl Fn() -> bool) -> io::Error {
    match e {
        Errno::ENOTDIR | Errno::ELOOP if is_link() => refused(Errno::ELOOP, "the directory"),
        e => io::Error::from(e),
    }
}

fn not_regular() -> io::Error {
    io::Error::new(
        ErrorKind::InvalidInput,
        "not a regular file (a FIFO, device, socket or directory is never read or written here)",
    )
}

impl Dir {
    /// `path`, a directory and not a link to one; the components above it
    /// are followed as given.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(path, DIR_FLAGS, Mode::empty()).map_err(|e| {
            dir_refused(e, || {
                std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
            })
        })?;
        Ok(Dir(Arc::new(Inner {
            fd,
            path: path.to_path_buf(),
        })))
    }

    /// [`Dir::open`], following a link at `path`'s last component too: for
    /// an operator's directory that only root can write (a log file's).
    pub fn open_following(path: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(path, DIR_FLAGS.difference(OFlag::O_NOFOLLOW), Mode::empty())?;
        Ok(Dir(Arc::new(Inner {
            fd,
            path: path.to_path_buf(),
        })))
    }

    /// [`Dir::open`], creating `path` (and missing parents) with `mode`
    /// first.
    pub fn create(path: &Path, mode: u32) -> io::Result<Dir> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)?;
        Dir::open(path)
    }

    /// The path it was opened at, for messages and for callers that hand a
    /// path on (never used to reach the files here).
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// `name`'s path, for messages.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.path.join(name)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }

    /// The subdirectory `name` (not a link); None when it does not exist.
    pub fn sub(&self, name: impl AsRef<OsStr>) -> io::Result<Option<Dir>> {
        let name = name.as_ref();
        match openat(self.fd(), name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(Some(Dir(Arc::new(Inner {
                fd,
                path: self.join(name),
            })))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(dir_refused(e, || {
                fstatat(self.fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
            })),
        }
    }

    /// [`Dir::sub`], created with `mode` if missing.
    pub fn create_sub(&self, name: impl AsRef<OsStr>, mode: u32) -> io::Result<Dir> {
        let name = name.as_ref();
        match mkdirat(self.fd(), name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        self.sub(name)?
            .ok_or_else(|| io::Error::from(ErrorKind::NotFound))
    }

    /// The regular file `name`, opened as `how` says without following a
    /// link and without blocking (a FIFO opens at once and is refused).
    pub fn open_file(&self, name: impl AsRef<OsStr>, how: Open) -> io::Result<File> {
        self.open_regular(name, how).map(|(f, _)| f)
    }

    /// [`Dir::open_file`], with the size `fstat` found.
    fn open_regular(&self, name: impl AsRef<OsStr>, how: Open) -> io::Result<(File, u64)> {
        let (flags, mode) = match how {
            Open::Read => (OFlag::O_RDONLY, 0),
            Open::CreateNew(m) => (OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, m),
            Open::ReadWriteCreate(m) => (OFlag::O_RDWR | OFlag::O_CREAT, m),
            Open::Append(None) => (OFlag::O_WRONLY | OFlag::O_APPEND, 0),
            Open::Append(Some(m)) => (OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT, m),
        };
        let flags =
            flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let fd = openat(
            self.fd(),
            name.as_ref(),
            flags,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| refused(e, "the file"))?;
        regular(fd)
    }

    /// The bytes of the regular file `name`, at most `max` of them (more is
    /// an error, not a truncated read); None when it does not exist.
    pub fn read(&self, name: impl AsRef<OsStr>, max: u64) -> io::Result<Option<Vec<u8>>> {
        let (f, len) = match self.open_regular(name, Open::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if len > max {
            return Err(too_large(max));
        }
        read_bounded(f, max, len).map(Some)
    }

    /// `renameat(from, to)`, both names in this directory.
    pub fn rename(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        renameat(self.fd(), from.as_ref(), self.fd(), to.as_ref()).map_err(io::Error::from)
    }

    /// [`Dir::rename`] of `from` into the directory `to`.
    pub fn rename_to(
        &self,
        from: impl AsRef<OsStr>,
        to: &Dir,
        name: impl AsRef<OsStr>,
    ) -> io::Result<()> {
        renameat(self.fd(), from.as_ref(), to.fd(), name.as_ref()).map_err(io::Error::from)
    }

    /// Exchange two names (`renameat2(RENAME_EXCHANGE)`).
    pub fn exchange(&self, a: impl AsRef<OsStr>, b: impl AsRef<OsStr>) -> io::Result<()> {
        renameat2(
            self.fd(),
            a.as_ref(),
            self.fd(),
            b.as_ref(),
            RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(io::Error::from)
    }

    /// Unlink the file (or link) `name`.
    pub fn remove_file(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        unlinkat(self.fd(), name.as_ref(), UnlinkatFlags::NoRemoveDir).map_err(io::Error::from)
    }

    /// Remove the empty directory `name`.
    pub fn remove_dir(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        unlinkat(self.fd(), name.as_ref(), UnlinkatFlags::RemoveDir).map_err(io::Error::from)
    }

    /// Remove `name` and, if it is a directory (not a link to one),
    /// everything in it.
    pub fn remove_all(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let name = name.as_ref();
        if !self.is_dir(name)? {
            return self.remove_file(name);
        }
        if let Some(sub) = self.sub(name)? {
            for n in sub.names()? {
                match sub.remove_all(&n) {
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    r => r?,
                }
            }
        }
        self.remove_dir(name)
    }

    /// Is there anything (a link too) named `name`?
    pub fn exists(&self, name: impl AsRef<OsStr>) -> bool {
        fstatat(
            self.fd(),
            name.as_ref(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok()
    }

    /// Is `name` a regular file (a link is not)? False when missing.
    pub fn is_file(&self, name: impl AsRef<OsStr>) -> bool {
        fstatat(
            self.fd(),
            name.as_ref(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
    }

    /// Is `name` a directory (a link is not)? A missing name is NotFound.
    pub fn is_dir(&self, name: impl AsRef<OsStr>) -> io::Result<bool> {
        let st = fstatat(
            self.fd(),
            name.as_ref(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    /// The names in the directory (without `.` and `..`), one listing.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut d = nix::dir::Dir::openat(
            self.fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                out.push(OsStr::from_bytes(n).to_os_string());
            }
        }
        Ok(out)
    }

    /// Does `name` still name the open file `f` (same device and inode)?
    pub fn names_file(&self, name: impl AsRef<OsStr>, f: &File) -> bool {
        let here = fstatat(
            self.fd(),
            name.as_ref(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        match (here, f.metadata()) {
            (Ok(p), Ok(m)) => p.st_dev == m.dev() && p.st_ino == m.ino(),
            _ => false,
        }
    }

    /// fsync the directory: a rename or unlink in it survives a power loss.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(self.fd()).map_err(io::Error::from)
    }
}

/// The open file `fd` with its size, if it is a regular file.
fn regular(fd: OwnedFd) -> io::Result<(File, u64)> {
    let f = File::from(fd);
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(not_regular());
    }
    Ok((f, m.len()))
}

/// The regular file at `path`, at most `max` bytes, opened non-blocking
/// (a FIFO opens at once and is refused, never read; a device is refused
/// too); a link at its last component is followed only with `follow`. For
/// a file someone less trusted controls that is not in a [`Dir`] (a pod's
/// `resolv.conf` under `/proc/<pid>/root`).
pub fn read_regular(path: &Path, max: u64, follow: bool) -> io::Result<Vec<u8>> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    if !follow {
        flags |= OFlag::O_NOFOLLOW;
    }
    let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| refused(e, "the file"))?;
    let (f, len) = regular(fd)?;
    if len > max {
        return Err(too_large(max));
    }
    read_bounded(f, max, len)
}

fn too_large(max: u64) -> io::Error {
    io::Error::new(
        ErrorKind::InvalidData,
        format!("larger than {max} bytes: not read"),
    )
}

/// All of `f`, at most `max` bytes (more is an error); `hint`: the size
/// `fstat` gave, room made for it at once, so a file that does not grow
/// meanwhile is read in one `read` and its end seen in a second, whatever
/// its size (a growing read buffer would take more calls the larger the
/// file).
pub fn read_bounded(mut f: File, max: u64, hint: u64) -> io::Result<Vec<u8>> {
    let room = usize::try_from(hint.min(max))
        .unwrap_or(0)
        .saturating_add(1);
    let mut out = vec![0u8; room];
    let mut len = 0;
    loop {
        if len == out.len() {
            let more = out.len().max(4096);
            out.resize(out.len().saturating_add(more), 0);
        }
        let Some(spare) = out.get_mut(len..) else {
            break;
        };
        match f.read(spare) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if len as u64 > max {
            return Err(too_large(max));
        }
    }
    out.truncate(len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fresh directory, removed with the returned guard.
    fn tmpdir(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        crate::testing::scratch_dir(&format!("podgate-dir-{tag}-"))
    }

    #[test]
    fn links_fifos_and_big_files_are_refused_and_their_targets_untouched() {
        let (_tmp, d) = tmpdir("refuse");
        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let state = d.join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::symlink(&target, state.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("absent"), state.join("dangling")).unwrap();
        nix::unistd::mkfifo(&state.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink(&d, state.join("subdir-link")).unwrap();
        std::fs::write(state.join("big"), vec![b'x'; 100]).unwrap();
        let dir = Dir::open(&state).unwrap();

        for how in [Open::Read, Open::Append(None), Open::Append(Some(0o600))] {
            let e = dir.open_file("link", how).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        let e = dir
            .open_file("dangling", Open::ReadWriteCreate(0o600))
            .unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!d.join("absent").exists(), "created through the link");
        let e = dir.open_file("fifo", Open::Read).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(dir.open_file("fifo", Open::Append(None)).is_err());
        let e = dir.sub("subdir-link").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = dir.read("big", 10).unwrap_err();
        assert!(e.to_string().contains("larger than 10 bytes"), "{e}");
        assert_eq!(dir.read("big", 100).unwrap().unwrap().len(), 100);
        assert_eq!(dir.read("absent", 10).unwrap(), None);
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // The directory itself as a link.
        std::os::unix::fs::symlink(&state, d.join("state-link")).unwrap();
        let e = Dir::open(&d.join("state-link")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(Dir::open_following(&d.join("state-link")).is_ok());
        // remove_all removes links, never what they point at.
        dir.create_sub("sub", 0o700).unwrap();
        std::os::unix::fs::symlink(&target, state.join("sub/l")).unwrap();
        dir.remove_all("sub").unwrap();
        dir.remove_all("subdir-link").unwrap();
        assert!(target.exists() && d.is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_are_created_renamed_listed_and_removed_relative_to_the_handle() {
        let (_tmp, d) = tmpdir("ops");
        let dir = Dir::create(&d.join("a/b"), 0o700).unwrap();
        let mut f = dir.open_file("x.tmp", Open::CreateNew(0o600)).unwrap();
        f.write_all(b"one").unwrap();
        assert!(dir.open_file("x.tmp", Open::CreateNew(0o600)).is_err());
        dir.rename("x.tmp", "x").unwrap();
        assert!(dir.names_file("x", &f));
        let sub = dir.create_sub("q", 0o700).unwrap();
        dir.rename_to("x", &sub, "x").unwrap();
        assert_eq!(sub.read("x", 10).unwrap().unwrap(), b"one");
        let mut names = dir.names().unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("q")]);
        assert!(dir.is_dir("q").unwrap());
        dir.remove_all("q").unwrap();
        assert!(dir.names().unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
