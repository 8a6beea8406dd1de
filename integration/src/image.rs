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
