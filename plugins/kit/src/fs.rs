//! Files podgate keeps: atomic replacement (temp file in the same directory,
//! then rename) and `flock` with a bounded wait ([`flock`] on an open file,
//! [`lock`] on a lock file). The state store, the installer and the cni
//! crate's log and event files all write and lock through here, each file
//! reached through a [`Dir`] handle of its directory (no link followed,
//! only regular files used: see [`crate::dir`]).

use crate::dir::{Dir, Open};
use crate::error::{Error, Result};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn err(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::File {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// How [`atomic_write`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteMode {
    /// Permission bits of the new file.
    pub mode: u32,
    /// Set `mode` exactly after creating the file (the umask may have
    /// narrowed it).
    pub exact_mode: bool,
    /// fsync the file before the rename and its directory after: the new
    /// contents survive a power loss, not only a killed process.
    pub durable: bool,
}

/// A file's directory (followed as given: the caller's path) and name.
fn split(path: &Path) -> Result<(Dir, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        err(
            "naming",
            path,
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        )
    })?;
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = Dir::open_following(parent).map_err(|e| err("opening", parent, e))?;
    Ok((dir, name))
}

/// Replace `path` with `bytes`: written to `tmp` (a name in the same
/// directory that no reader loads; a stale file there is removed first and
/// the temp file created anew, never written through), then
/// renamed over `path`, so a reader sees the old or the new file, never a
/// torn one. On failure `tmp` is removed: a full or read-only disk must not
/// collect half-written temp files. `path`'s directory is the caller's
/// ([`atomic_write_in`] for one a container may write).
pub fn atomic_write(path: &Path, tmp: &Path, bytes: &[u8], how: WriteMode) -> Result<()> {
    let (dir, name) = split(path)?;
    let tmp_name = tmp
        .file_name()
        .filter(|_| tmp.parent() == path.parent())
        .ok_or_else(|| {
            err(
                "naming a temp file beside",
                path,
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            )
        })?;
    atomic_write_in(&dir, name, tmp_name, bytes, how)
}

/// [`atomic_write`] of `name` in `dir` through temp file `tmp` there.
pub fn atomic_write_in(
    dir: &Dir,
    name: impl AsRef<OsStr>,
    tmp: impl AsRef<OsStr>,
    bytes: &[u8],
    how: WriteMode,
) -> Result<()> {
    let (name, tmp) = (name.as_ref(), tmp.as_ref());
    let res = write_new(dir, tmp, bytes, how).and_then(|()| {
        dir.rename(tmp, name)
            .map_err(|e| err("renaming into place", &dir.join(name), e))
    });
    if res.is_err() {
        let _ = dir.remove_file(tmp);
    }
    res?;
    if how.durable {
        dir.sync().map_err(|e| err("fsync", dir.path(), e))?;
    }
    Ok(())
}

/// As [`atomic_write_in`] without `durable`, for a file that is rebuilt
/// from others when a power cut leaves it empty (the router's claims
/// index): an existing `name` is replaced by exchanging the two names
/// (`renameat2(RENAME_EXCHANGE)`), then the old file, now at `tmp`, is
/// unlinked. Readers see the old or the new file, as with a rename; but
/// ext4 writes a file's data out before a rename over an existing file
/// commits (`auto_da_alloc`, about 0.1 ms a replace here), and not before
/// an exchange. Where `name` does not exist yet, or the filesystem cannot
/// exchange, a plain rename. An old file left at `tmp` by a kill is
/// removed by the next write (or the caller's sweep of temp files).
pub fn swap_write(
    dir: &Dir,
    name: impl AsRef<OsStr>,
    tmp: impl AsRef<OsStr>,
    bytes: &[u8],
    mode: u32,
) -> Result<()> {
    let (name, tmp) = (name.as_ref(), tmp.as_ref());
    let how = WriteMode {
        mode,
        exact_mode: false,
        durable: false,
    };
    let path = || dir.join(name);
    let res = write_new(dir, tmp, bytes, how).and_then(|()| match dir.exchange(tmp, name) {
        Ok(()) => {
            // The old file: no reader loads `tmp`, so a failure here
            // leaves only what the next write removes.
            let _ = dir.remove_file(tmp);
            Ok(())
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => dir
            .rename(tmp, name)
            .map_err(|e| err("renaming into place", &path(), e)),
        Err(e) => Err(err("exchanging into place", &path(), e)),
    });
    if res.is_err() {
        let _ = dir.remove_file(tmp);
    }
    res
}

/// Create `tmp` in `dir` anew with `bytes` (a stale file there is removed
/// first, never written through), with `how`'s mode, fsynced if `durable`.
fn write_new(dir: &Dir, tmp: &OsStr, bytes: &[u8], how: WriteMode) -> Result<()> {
    let path = dir.join(tmp);
    let _ = dir.remove_file(tmp);
    let mut f = dir
        .open_file(tmp, Open::CreateNew(how.mode))
        .map_err(|e| err("creating", &path, e))?;
    f.write_all(bytes).map_err(|e| err("writing", &path, e))?;
    if how.exact_mode {
        f.set_permissions(fs::Permissions::from_mode(how.mode))
            .map_err(|e| err("chmod", &path, e))?;
    }
    if how.durable {
        f.sync_all().map_err(|e| err("fsync", &path, e))?;
    }
    Ok(())
}

/// fsync the directory holding `path` (makes a rename or unlink durable).
pub fn sync_dir_of(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err("fsync", dir, e))
}

/// An exclusive `flock`, released on drop.
#[derive(Debug)]
pub struct FileLock {
    file: Option<File>,
    acquired: Instant,
    waited: Duration,
    /// A lock file that exists only while held: unlinked on release while
    /// still locked.
    unlink: Option<(Dir, std::ffi::OsString)>,
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if let Some((dir, name)) = self.unlink.take() {
            let _ = dir.remove_file(name);
        }
        drop(self.file.take());
    }
}

impl FileLock {
    /// How long [`lock`] waited for it (contention).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// How long it has been held so far.
    pub fn held(&self) -> Duration {
        self.acquired.elapsed()
    }
}

/// How a lock file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockFile {
    /// Created once and kept. Only a purge unlinks it, while holding it; a
    /// waiter that then gets the lock of the unlinked file retries on the
    /// path, as for a transient one.
    Kept,
    /// Unlinked by its holder on release; a waiter that then gets the lock
    /// of an unlinked file retries on the path, so no files accumulate.
    Transient,
}

/// Take an exclusive flock on `path` (created with mode 0600 if missing),
/// waiting at most `wait` ([`flock`]). A timeout is an `EWOULDBLOCK`
/// "locking" error naming the file. `path`'s directory is the caller's
/// ([`lock_in`] for one a container may write).
pub fn lock(path: &Path, wait: Duration, file: LockFile) -> Result<FileLock> {
    let (dir, name) = split(path)?;
    lock_in(&dir, name, wait, file)
}

/// [`lock`] of the lock file `name` in `dir`.
pub fn lock_in(
    dir: &Dir,
    name: impl AsRef<OsStr>,
    wait: Duration,
    file: LockFile,
) -> Result<FileLock> {
    let name = name.as_ref();
    let start = Instant::now();
    loop {
        let f = open_lock_file(dir, name)?;
        flock(&f, Flock::Exclusive, wait.saturating_sub(start.elapsed()))
            .map_err(|e| err("locking", &dir.join(name), e))?;
        if !dir.names_file(name, &f) {
            // Unlinked by the holder we waited for (a transient lock's
            // release, a kept one's purge): lock what the path is now.
            if start.elapsed() > wait {
                return Err(err(
                    "locking",
                    &dir.join(name),
                    std::io::Error::from_raw_os_error(libc::EWOULDBLOCK),
                ));
            }
            continue;
        }
        let acquired = Instant::now();
        return Ok(FileLock {
            file: Some(f),
            acquired,
            waited: acquired - start,
            unlink: (file == LockFile::Transient).then(|| (dir.clone(), name.to_os_string())),
        });
    }
}

/// One attempt at [`lock_in`] without waiting: None while another process
/// holds it, or when the file it opened was unlinked just now (a transient
/// lock's release, a kept one's purge).
pub fn try_lock(dir: &Dir, name: impl AsRef<OsStr>, file: LockFile) -> Result<Option<FileLock>> {
    let name = name.as_ref();
    let f = open_lock_file(dir, name)?;
    if !try_flock(&f, Flock::Exclusive).map_err(|e| err("locking", &dir.join(name), e))? {
        return Ok(None);
    }
    if !dir.names_file(name, &f) {
        return Ok(None);
    }
    Ok(Some(FileLock {
        file: Some(f),
        acquired: Instant::now(),
        waited: Duration::ZERO,
        unlink: (file == LockFile::Transient).then(|| (dir.clone(), name.to_os_string())),
    }))
}

/// Open (or create, mode 0600) a lock file: a regular file, never through
/// a link (a planted link must not make root create or open its target).
fn open_lock_file(dir: &Dir, name: &OsStr) -> Result<File> {
    dir.open_file(name, Open::ReadWriteCreate(0o600))
        .map_err(|e| err("opening", &dir.join(name), e))
}

/// Is some process holding the lock `name` in `dir` right now? Never
/// creates the file.
pub fn lock_busy(dir: &Dir, name: impl AsRef<OsStr>) -> bool {
    let Ok(f) = dir.open_file(name, Open::Read) else {
        return false;
    };
    // The lock, if taken, goes with `f`.
    matches!(try_flock(&f, Flock::Exclusive), Ok(false))
}

/// Unlink the [`LockFile::Transient`] lock file `name` in `dir` if nobody
/// holds it, taking it first so the unlink happens under the lock (as a
/// holder's own release does).
pub fn remove_orphaned_lock(dir: &Dir, name: impl AsRef<OsStr>) -> bool {
    let name = name.as_ref();
    let Ok(f) = dir.open_file(name, Open::Read) else {
        return false;
    };
    // Released when `f` drops, after the unlink.
    matches!(try_flock(&f, Flock::Exclusive), Ok(true))
        && dir.names_file(name, &f)
        && dir.remove_file(name).is_ok()
}

/// Which `flock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flock {
    /// Many holders at once (`LOCK_SH`).
    Shared,
    /// One holder (`LOCK_EX`).
    Exclusive,
}

/// Take `kind` on `file` (std's file locks: `flock(2)`), waiting at most
/// `wait`. Uncontended: one non-blocking attempt, no thread. Busy: a helper
/// thread blocks in `flock` on a duplicate descriptor (the same open file,
/// so the same lock) and the caller waits for it with a timeout, so the lock
/// passes to a waiter the moment it is released (no polling, no signals
/// that could interrupt the caller's syscalls). A timeout is an
/// `EWOULDBLOCK` error; the helper still waits, and a lock it gets later
/// belongs to `file` (the open file, not the descriptor) until `file` is
/// closed: a caller that gives up drops `file` (every caller here does).
pub fn flock(file: &File, kind: Flock, wait: Duration) -> std::io::Result<()> {
    if try_flock(file, kind)? {
        return Ok(());
    }
    let dup = file.try_clone()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        // flock needs next to no stack; the default 2 MiB is mapped for nothing.
        .stack_size(64 * 1024)
        .spawn(move || {
            let got = loop {
                let got = match kind {
                    Flock::Shared => dup.lock_shared(),
                    Flock::Exclusive => dup.lock(),
                };
                match got {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    got => break got,
                }
            };
            // The waiter may have given up: then only `dup` drops here; the
            // lock goes when the caller closes `file` too.
            let _ = tx.send(got);
        })?;
    match rx.recv_timeout(wait) {
        Ok(got) => got,
        Err(_) => Err(std::io::Error::from_raw_os_error(libc::EWOULDBLOCK)),
    }
}

/// One non-blocking attempt: Ok(false) when another holder has it.
fn try_flock(f: &File, kind: Flock) -> std::io::Result<bool> {
    let got = match kind {
        Flock::Shared => f.try_lock_shared(),
        Flock::Exclusive => f.try_lock(),
    };
    match got {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed with the returned guard.
    fn tmpdir(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        crate::testing::scratch_dir(&format!("podgate-kitfs-{tag}-"))
    }

    #[test]
    fn swap_write_creates_then_exchanges_and_leaves_no_old_file() {
        let (_tmp, d) = tmpdir("s");
        let dir = Dir::open(&d).unwrap();
        let (f, tmp) = (d.join("x"), d.join(".x.tmp"));
        // A stale temp file (a killed writer's) is replaced, not written through.
        fs::write(&tmp, b"stale and longer").unwrap();
        swap_write(&dir, "x", ".x.tmp", b"one", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"one");
        assert!(!tmp.exists());
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let first = inode(&f);
        swap_write(&dir, "x", ".x.tmp", b"two", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_ne!(inode(&f), first, "a new file, not the old one rewritten");
        assert!(!tmp.exists(), "the old file is unlinked");
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A failure names its step and leaves no temp file (a directory
        // removed under its handle).
        fs::create_dir(d.join("no")).unwrap();
        let gone = Dir::open(&d.join("no")).unwrap();
        fs::remove_dir(d.join("no")).unwrap();
        let e = swap_write(&gone, "such", ".tmp", b"x", 0o600).unwrap_err();
        assert!(e.to_string().starts_with("creating"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn atomic_write_replaces_and_cleans_up() {
        let (_tmp, d) = tmpdir("w");
        let (f, tmp) = (d.join("x"), d.join(".x.tmp"));
        for durable in [false, true] {
            let how = WriteMode {
                mode: 0o640,
                exact_mode: true,
                durable,
            };
            atomic_write(&f, &tmp, b"one", how).unwrap();
            atomic_write(&f, &tmp, b"two", how).unwrap();
            assert_eq!(fs::read(&f).unwrap(), b"two");
            assert_eq!(
                fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
                0o640
            );
            assert!(!tmp.exists());
        }
        // A failed rename (target is a non-empty directory) leaves no temp.
        let sub = d.join("sub");
        fs::create_dir_all(sub.join("y")).unwrap();
        let how = WriteMode {
            mode: 0o600,
            exact_mode: false,
            durable: false,
        };
        let e = atomic_write(&sub, &tmp, b"x", how).unwrap_err();
        assert!(e.to_string().starts_with("renaming into place"), "{e}");
        assert!(!tmp.exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lock_is_exclusive_and_bounded() {
        let (_tmp, d) = tmpdir("l");
        let p = d.join(".lock");
        let dir = Dir::open(&d).unwrap();
        let held = lock(&p, Duration::from_secs(1), LockFile::Kept).unwrap();
        assert!(lock_busy(&dir, ".lock"));
        let e = lock(&p, Duration::from_millis(50), LockFile::Kept).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EWOULDBLOCK));
        assert!(e.to_string().contains(".lock"), "{e}");
        drop(held);
        // The waiter that timed out above left its helper thread blocked in
        // flock: it takes the lock for an instant when `held` goes, finds
        // nobody waiting and drops it. The lock must be free right after.
        let free_by = Instant::now() + Duration::from_secs(2);
        while lock_busy(&dir, ".lock") {
            assert!(
                Instant::now() < free_by,
                "lock still held after its holder released it"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = lock(&p, Duration::from_secs(1), LockFile::Transient).unwrap();
        assert!(!remove_orphaned_lock(&dir, ".lock"));
        drop(t);
        assert!(!p.exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shared_flocks_coexist_and_an_exclusive_one_waits_until_they_go() {
        let (_tmp, d) = tmpdir("f");
        let p = d.join("log");
        fs::write(&p, "").unwrap();
        let (a, b, c) = (
            File::open(&p).unwrap(),
            File::open(&p).unwrap(),
            File::open(&p).unwrap(),
        );
        flock(&a, Flock::Shared, Duration::ZERO).unwrap();
        flock(&b, Flock::Shared, Duration::ZERO).unwrap();
        let e = flock(&c, Flock::Exclusive, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK));
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop((a, b));
        });
        flock(&c, Flock::Exclusive, Duration::from_secs(5)).unwrap();
        release.join().unwrap();
        fs::remove_dir_all(&d).unwrap();
    }
}
