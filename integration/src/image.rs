//! podgate's image, built from the repository's Dockerfile by
//! `integration/image/build.sh` for the tests that run it in a runtime.

use crate::{output_text, workspace_root};
use std::path::Path;
use std::process::{Command, Stdio};

/// `integration/image/build.sh --arch amd64 --tag NAME --commit COMMIT --out
/// OUT`: the amd64 image under `name`, its binaries naming `commit` in
/// `podgate --version` (another commit makes other binaries), saved to `out`
/// as an archive `ctr images import` takes.
pub fn build_amd64(name: &str, commit: &str, out: &Path) {
    let build = workspace_root().join("integration/image/build.sh");
    let run = Command::new("bash")
        .arg(&build)
        .args([
            "--arch", "amd64", "--tag", name, "--commit", commit, "--out",
        ])
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{} failed:\n{}",
        build.display(),
        output_text(&run)
    );
}

/// The image every container of `conf/kubernetes/podgate.yaml`'s DaemonSet
/// runs (one image for all, asserted): the name an operator's nodes pull
/// and the tests load images under.
pub fn manifest_name() -> String {
    use serde_json::Value;
    let path = workspace_root().join("conf/kubernetes/podgate.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let ds = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            v
        })
        .find(|d| {
            d.get("kind").is_some_and(|k| k == "DaemonSet")
                && d.pointer("/metadata/name").is_some_and(|n| n == "podgate")
        })
        .unwrap_or_else(|| panic!("{}: no DaemonSet podgate", path.display()));
    let images: Vec<&str> = ds
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .expect("a pod template with containers")
        .iter()
        .map(|c| {
            c.get("image")
                .and_then(Value::as_str)
                .expect("a container's image")
        })
        .collect();
    let first = *images.first().expect("a container");
    assert!(images.iter().all(|i| *i == first), "{images:?}");
    first.to_string()
}
