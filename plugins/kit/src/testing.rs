//! What the kit's own tests share.

/// `ip netns add pg-kit-<tag>-<pid>`: a bind-mounted namespace (its path in
/// `.0`), deleted on drop.
pub struct NamedNetns(pub String);

impl NamedNetns {
    pub fn add(tag: &str) -> NamedNetns {
        let name = format!("pg-kit-{tag}-{}", std::process::id());
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        NamedNetns(format!("/var/run/netns/{name}"))
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let name = self.0.trim_start_matches("/var/run/netns/");
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", name])
            .status();
    }
}

/// A fresh directory `$TMPDIR/<prefix><random>` and its path, removed
/// (recursively) with the returned guard.
pub fn scratch_dir(prefix: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let d = t.path().to_path_buf();
    (t, d)
}
