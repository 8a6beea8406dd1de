//! What the installer's own tests share.

/// A fresh directory `$TMPDIR/<prefix><random>` and its path, removed
/// (recursively) with the returned guard.
pub fn scratch_dir(prefix: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let d = t.path().to_path_buf();
    (t, d)
}
