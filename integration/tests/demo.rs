//! `integration/demo.sh` end to end, on the debug build CI has already made:
//! it exits 0, tells the before/after story and removes what it made.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podgate_integration::{output_text, require_root, workspace_root};
use std::process::Command;

#[test]
fn the_demo_shows_cross_node_hops_silent_without_forwarding_and_answering_with_the_profile() {
    require_root();
    let out = Command::new("bash")
        .arg(workspace_root().join("integration/demo.sh"))
        .env("PODGATE_DEMO_PROFILE", "debug")
        .output()
        .expect("running integration/demo.sh");
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (before, after) = stdout
        .split_once("== 2.")
        .unwrap_or_else(|| panic!("no second act:\n{text}"));
    for needle in [
        "(node B)................. timeout",
        "0 of 3 answer: timeout",
        "verdict: pod 10.244.2.2 silent for tunnel clients: forwarding is off in the pod netns",
    ] {
        assert!(before.contains(needle), "{needle:?} missing:\n{text}");
    }
    for needle in [
        "(node A)................. answers",
        "(node B)................. answers",
        "(node C)................. answers",
        "3 of 3 answer: backend-a, backend-b, backend-c",
        "verdict: all 3 hops answer",
        "network namespaces of this demo left: 0",
        "demo: ok",
    ] {
        assert!(after.contains(needle), "{needle:?} missing:\n{text}");
    }
}
