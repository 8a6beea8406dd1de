//! File operations a runtime may race with: every write goes to a temp file
//! in the same directory (a name no runtime loads), is fsynced, then renamed
//! over the target, and the directory is fsynced (the writing and syncing
//! is `podgate_kit::fs`'s; this module names the temp files and knows the
//! conf dir).

use crate::Error;
use podgate_kit::fs::{self as kfs, WriteMode};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, Error>;

/// The file's bytes, or None when it does not exist.
pub fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("reading", path, e)),
    }
}

pub fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Error::io("reading", path, e))
}

/// Temp names start with a dot and end in `.podgate-tmp-<pid>`: no runtime
/// loads them (libcni only reads `.conf`, `.conflist`, `.json`).
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        Error::io(
            "naming a temp file for",
            path,
            std::io::Error::from(ErrorKind::InvalidInput),
        )
    })?;
    Ok(path.with_file_name(format!(
        ".{}.podgate-tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".podgate-tmp-")
}

/// The mode of an existing file (permission bits), if any.
pub fn mode_of(path: &Path) -> Option<u32> {
    fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// Atomically replace `path` with `bytes` (mode `mode`, exactly).
///
/// Durable (file and directory fsynced), unlike the kit's state records:
/// these files are the node's CNI configuration and plugin binaries, read by
/// the runtime after a reboot too. A power loss right after a rename must
/// not leave a conflist that is empty or a binary that is truncated (every
/// pod on the node would fail to start), and the installer writes rarely,
/// so the fsync costs nothing that matters.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let how = WriteMode {
        mode,
        exact_mode: true,
        durable: true,
    };
    Ok(kfs::atomic_write(path, &temp_path(path)?, bytes, how)?)
}

/// Rename `from` to `to` (same directory) and make it durable.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|e| Error::io("renaming", from, e))?;
    sync_dir_of(to)
}

/// Remove a file; a missing file is fine.
pub fn remove(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir_of(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("removing", path, e)),
    }
}

fn sync_dir_of(path: &Path) -> Result<()> {
    Ok(kfs::sync_dir_of(path)?)
}

/// File names in `dir`, sorted bytewise (as Go's `os.ReadDir` sorts them),
/// directories left out.
pub fn list_files(dir: &Path) -> Result<Vec<String>> {
    let rd = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut names: Vec<String> = rd
        .flatten()
        .filter(|e| !e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// Copy `src` to `dst` atomically with mode 0755 unless `dst` already has the
/// same bytes and is executable. Returns whether it wrote.
pub fn install_executable(src: &Path, dst: &Path) -> Result<bool> {
    let bytes = read(src)?;
    if executable_with(dst, &bytes)? {
        return Ok(false);
    }
    atomic_write(dst, &bytes, 0o755)?;
    Ok(true)
}

/// Whether `path` is an executable file holding exactly `bytes`.
pub fn executable_with(path: &Path, bytes: &[u8]) -> Result<bool> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io("stat", path, e)),
    };
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 || meta.len() != bytes.len() as u64
    {
        return Ok(false);
    }
    Ok(read(path)? == bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A fresh directory, removed with the returned guard.
    fn tmpdir(tag: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        crate::testing::scratch_dir(&format!("podgate-fsx-{tag}-"))
    }

    #[test]
    fn atomic_write_and_install_executable() {
        let (_tmp, d) = tmpdir("w");
        let f = d.join("10-x.conflist");
        atomic_write(&f, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"one");
        assert_eq!(mode_of(&f), Some(0o600));
        assert_eq!(list_files(&d).unwrap(), vec!["10-x.conflist"]);

        let src = d.join("src");
        fs::write(&src, b"\x7fELF...").unwrap();
        let dst = d.join("bin");
        assert!(install_executable(&src, &dst).unwrap());
        assert_eq!(mode_of(&dst), Some(0o755));
        assert!(!install_executable(&src, &dst).unwrap());
        fs::set_permissions(&dst, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(install_executable(&src, &dst).unwrap());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn temp_names_are_not_loaded() {
        let t = temp_path(Path::new("/x/10-calico.conflist")).unwrap();
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(is_temp_name(name));
        assert_eq!(super::super::chain::kind_of(name), None);
    }
}
