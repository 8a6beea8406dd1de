//! Files podgate keeps: atomic replacement (temp file in the same directory,
//! then rename) and `flock` with a bounded wait ([`flock`] on an open file,
//! [`lock`] on a lock file). The state store, the installer and the cni
//! crate's log and event files all write and lock through here.

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
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

/// Replace `path` with `bytes`: written to `tmp` (a name in the same
/// directory that no reader loads; a stale file there is removed first and
/// the temp file created anew, never written through), then
/// renamed over `path`, so a reader sees the old or the new file, never a
/// torn one. On failure `tmp` is removed: a full or read-only disk must not
/// collect half-written temp files.
pub fn atomic_write(path: &Path, tmp: &Path, bytes: &[u8], how: WriteMode) -> Result<()> {
    let res = write_new(tmp, bytes, how)
        .and_then(|()| fs::rename(tmp, path).map_err(|e| err("renaming into place", path, e)));
    if res.is_err() {
        let _ = fs::remove_file(tmp);
    }
    res?;
    if how.durable {
        sync_dir_of(path)?;
    }
    Ok(())
}

/// As [`atomic_write`] without `durable`, for a file that is rebuilt from
/// others when a power cut leaves it empty (the router's claims index): an
/// existing `path` is replaced by exchanging the two names
/// (`renameat2(RENAME_EXCHANGE)`), then the old file, now at `tmp`, is
/// unlinked. Readers see the old or the new file, as with a rename; but
/// ext4 writes a file's data out before a rename over an existing file
/// commits (`auto_da_alloc`, about 0.1 ms a replace here), and not before
/// an exchange. Where `path` does not exist yet, or the filesystem cannot
/// exchange, a plain rename. An old file left at `tmp` by a kill is
/// removed by the next write (or the caller's sweep of temp files).
pub fn swap_write(path: &Path, tmp: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    let how = WriteMode {
        mode,
        exact_mode: false,
        durable: false,
    };
    let res = write_new(tmp, bytes, how).and_then(|()| {
        match renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RenameFlags::RENAME_EXCHANGE) {
            Ok(()) => {
                // The old file: no reader loads `tmp`, so a failure here
                // leaves only what the next write removes.
                let _ = fs::remove_file(tmp);
                Ok(())
            }
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINVAL) => {
                fs::rename(tmp, path).map_err(|e| err("renaming into place", path, e))
            }
            Err(e) => Err(err("exchanging into place", path, e.into())),
        }
    });
    if res.is_err() {
        let _ = fs::remove_file(tmp);
    }
    res
}

/// Create `tmp` anew with `bytes` (a stale file there is removed first,
/// never written through), with `how`'s mode, fsynced if `durable`.
fn write_new(tmp: &Path, bytes: &[u8], how: WriteMode) -> Result<()> {
    let _ = fs::remove_file(tmp);
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(how.mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(tmp)
        .map_err(|e| err("creating", tmp, e))?;
    f.write_all(bytes).map_err(|e| err("writing", tmp, e))?;
    if how.exact_mode {
        f.set_permissions(fs::Permissions::from_mode(how.mode))
            .map_err(|e| err("chmod", tmp, e))?;
    }
    if how.durable {
        f.sync_all().map_err(|e| err("fsync", tmp, e))?;
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
    unlink: Option<PathBuf>,
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if let Some(p) = self.unlink.take() {
            let _ = fs::remove_file(p);
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
/// "locking" error naming the file.
pub fn lock(path: &Path, wait: Duration, file: LockFile) -> Result<FileLock> {
    let start = Instant::now();
    loop {
        let f = open_lock_file(path)?;
        flock(&f, Flock::Exclusive, wait.saturating_sub(start.elapsed()))
            .map_err(|e| err("locking", path, e))?;
        if !names(path, &f) {
            // Unlinked by the holder we waited for (a transient lock's
            // release, a kept one's purge): lock what the path is now.
            if start.elapsed() > wait {
                return Err(err(
                    "locking",
                    path,
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
            unlink: (file == LockFile::Transient).then(|| path.to_path_buf()),
        });
    }
}

/// One attempt at [`lock`] without waiting: None while another process
/// holds it, or when the file it opened was unlinked just now (a transient
/// lock's release, a kept one's purge).
pub fn try_lock(path: &Path, file: LockFile) -> Result<Option<FileLock>> {
    let f = open_lock_file(path)?;
    if !try_flock(&f, Flock::Exclusive).map_err(|e| err("locking", path, e))? {
        return Ok(None);
    }
    if !names(path, &f) {
        return Ok(None);
    }
    Ok(Some(FileLock {
        file: Some(f),
        acquired: Instant::now(),
        waited: Duration::ZERO,
        unlink: (file == LockFile::Transient).then(|| path.to_path_buf()),
    }))
}

/// Open (or create, mode 0600) a lock file.
fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| err("opening", path, e))
}

/// Is some process holding the lock on `path` right now? Never creates the
/// file.
pub fn lock_busy(path: &Path) -> bool {
    let Some(f) = open_existing(path) else {
        return false;
    };
    // The lock, if taken, goes with `f`.
    matches!(try_flock(&f, Flock::Exclusive), Ok(false))
}

/// Unlink the [`LockFile::Transient`] lock file at `path` if nobody holds
/// it, taking it first so the unlink happens under the lock (as a holder's
/// own release does).
pub fn remove_orphaned_lock(path: &Path) -> bool {
    let Some(f) = open_existing(path) else {
        return false;
    };
    // Released when `f` drops, after the unlink.
    matches!(try_flock(&f, Flock::Exclusive), Ok(true))
        && names(path, &f)
        && fs::remove_file(path).is_ok()
}

/// A lock file opened for `flock` only if it exists (read-only, never
/// created).
fn open_existing(path: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .ok()
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

/// Does `path` still name the open `file` (same device and inode)?
fn names(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(path), file.metadata()) {
        (Ok(p), Ok(f)) => p.dev() == f.dev() && p.ino() == f.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("podgate-kitfs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn swap_write_creates_then_exchanges_and_leaves_no_old_file() {
        let d = tmpdir("s");
        let (f, tmp) = (d.join("x"), d.join(".x.tmp"));
        // A stale temp file (a killed writer's) is replaced, not written through.
        fs::write(&tmp, b"stale and longer").unwrap();
        swap_write(&f, &tmp, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"one");
        assert!(!tmp.exists());
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let first = inode(&f);
        swap_write(&f, &tmp, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_ne!(inode(&f), first, "a new file, not the old one rewritten");
        assert!(!tmp.exists(), "the old file is unlinked");
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A failure names its step and leaves no temp file.
        let e = swap_write(&d.join("no/such"), &d.join("no/.tmp"), b"x", 0o600).unwrap_err();
        assert!(e.to_string().starts_with("creating"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn atomic_write_replaces_and_cleans_up() {
        let d = tmpdir("w");
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
        let d = tmpdir("l");
        let p = d.join(".lock");
        let held = lock(&p, Duration::from_secs(1), LockFile::Kept).unwrap();
        assert!(lock_busy(&p));
        let e = lock(&p, Duration::from_millis(50), LockFile::Kept).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EWOULDBLOCK));
        assert!(e.to_string().contains(".lock"), "{e}");
        drop(held);
        // The waiter that timed out above left its helper thread blocked in
        // flock: it takes the lock for an instant when `held` goes, finds
        // nobody waiting and drops it. The lock must be free right after.
        let free_by = Instant::now() + Duration::from_secs(2);
        while lock_busy(&p) {
            assert!(
                Instant::now() < free_by,
                "lock still held after its holder released it"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = lock(&p, Duration::from_secs(1), LockFile::Transient).unwrap();
        assert!(!remove_orphaned_lock(&p));
        drop(t);
        assert!(!p.exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn shared_flocks_coexist_and_an_exclusive_one_waits_until_they_go() {
        let d = tmpdir("f");
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
