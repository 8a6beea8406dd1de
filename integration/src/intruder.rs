//! The intruder (`examples/intruder.rs`): code standing in for an attacker
//! inside one of the DaemonSet's containers, built as a static executable
//! (the image is distroless: no C library to load) for the privilege cases
//! to run in a container with `kubectl exec`.

use crate::{output_text, target_dir, workspace_root};
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The static intruder executable, built once per test process
/// (`cargo build --example intruder --target x86_64-unknown-linux-gnu` with
/// `crt-static`, into its own target subdirectory).
pub fn binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "-q",
                    "-p",
                    "podgate-integration",
                    "--example",
                    "intruder",
                    "--target",
                    TARGET,
                ])
                .env("RUSTFLAGS", "-C target-feature=+crt-static")
                .current_dir(workspace_root())
                .output()
                .expect("running cargo build");
            assert!(
                out.status.success(),
                "building the intruder:\n{}",
                output_text(&out)
            );
            let bin = target_dir().join(TARGET).join("debug/examples/intruder");
            assert!(bin.is_file(), "{} missing", bin.display());
            bin
        })
        .clone()
}
