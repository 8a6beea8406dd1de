//! The image as operators get it: built by `integration/image/build.sh` from
//! the repository's Dockerfile (unchanged, on local stand-ins for its base
//! images), for amd64 and arm64, and what is inside it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::containerd::Containerd;
use podgate_integration::cri::Cri;
use podgate_integration::registry::{self, Registry};
use podgate_integration::{output_text, require_root, workspace_root, Netns, TempDir, TestNode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

const BINARIES: [&str; 3] = ["podgate", "podgate-router", "podgate-tunnel-guard"];

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?}\n{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn podman(args: &[&str]) -> String {
    run_ok(Command::new("podman").args(args))
}

/// The commit build.sh names by default, read here on its own.
fn head_commit() -> String {
    let out = run_ok(
        Command::new("git")
            .arg("-C")
            .arg(workspace_root())
            .args(["rev-parse", "HEAD"]),
    );
    out.trim().to_string()
}

/// An image built by build.sh for `arch`, with its docker-archive.
struct Built {
    tag: String,
    archive: PathBuf,
}

/// Builds (once per test process) the image for `arch`, tagged
/// `localhost/podgate-it:<arch>`, with `--commit` = HEAD.
fn built(arch: &'static str) -> &'static Built {
    static AMD64: OnceLock<Built> = OnceLock::new();
    static ARM64: OnceLock<Built> = OnceLock::new();
    let cell = match arch {
        "amd64" => &AMD64,
        "arm64" => &ARM64,
        _ => panic!("no image for {arch}"),
    };
    cell.get_or_init(|| {
        require_root();
        // In the build's own target dir, replaced by each run: a static is
        // never dropped, so a temporary dir held here would be left behind.
        let dir = podgate_integration::target_dir().join("podgate-image-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let tag = format!("localhost/podgate-it:{arch}");
        let archive = dir.join(format!("{arch}.tar"));
        let _ = std::fs::remove_file(&archive);
        let started = std::time::Instant::now();
        let out = run(Command::new("bash")
            .arg(workspace_root().join("integration/image/build.sh"))
            .args(["--arch", arch, "--tag", &tag, "--commit", &head_commit()])
            .arg("--out")
            .arg(&archive));
        assert!(
            out.status.success(),
            "build.sh --arch {arch}\n{}",
            output_text(&out)
        );
        eprintln!(
            "image {tag} built in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        Built { tag, archive }
    })
}

/// The image's `/usr/local/bin`, copied out (`podman create` + `podman cp`:
/// nothing of the image runs).
fn extract_binaries(tag: &str, into: &Path) {
    let id = podman(&["create", "--network", "none", tag]);
    let id = id.trim();
    let from = format!("{id}:/usr/local/bin/.");
    let copied = run(Command::new("podman").args(["cp", &from]).arg(into));
    podman(&["rm", id]);
    assert!(copied.status.success(), "{}", output_text(&copied));
    for b in BINARIES {
        assert!(into.join(b).is_file(), "{b} is not in {tag}");
    }
}

/// `file -b` of every shipped binary: ELF for `machine`, linked statically.
fn assert_static_binaries_for(dir: &Path, machine: &str) {
    for b in BINARIES {
        let desc = run_ok(Command::new("file").arg("-b").arg(dir.join(b)));
        assert!(
            desc.starts_with("ELF 64-bit LSB") && desc.contains(machine),
            "{b} is not an ELF executable for {machine}: {desc}"
        );
        assert!(
            desc.contains("statically linked") || desc.contains("static-pie linked"),
            "{b} is not statically linked: {desc}"
        );
        assert!(!desc.contains("interpreter"), "{b} wants a loader: {desc}");
    }
}

fn assert_names_version_and_commit(version_output: &str) {
    let want = format!(
        "podgate {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        head_commit()
    );
    assert_eq!(version_output.trim(), want);
}

#[test]
fn the_amd64_image_runs_podgate_as_nonroot_with_install_watch_as_its_default_arguments() {
    let image = built("amd64");
    let config: Value = serde_json::from_str(&podman(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        &image.tag,
    ]))
    .unwrap();
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/podgate"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["install", "--watch"]));
    assert_eq!(config["User"], "65532:65532");
}

#[test]
fn podgate_in_the_amd64_image_names_its_version_and_commit() {
    let image = built("amd64");
    let ns = Netns::new("image-run");
    let network = format!("ns:{}", ns.path().display());
    let version = podman(&[
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--network",
        &network,
        "--ulimit",
        "nofile=10000:10000",
        "--ulimit",
        "nproc=1000:1000",
        &image.tag,
        "--version",
    ]);
    assert_names_version_and_commit(&version);
}

#[test]
fn the_amd64_image_ships_static_x86_64_binaries() {
    let image = built("amd64");
    let dir = TempDir::new("image-amd64-bin");
    extract_binaries(&image.tag, dir.path());
    assert_static_binaries_for(dir.path(), "x86-64");
}

#[test]
fn containerd_imports_the_saved_amd64_image_under_its_name() {
    let image = built("amd64");
    let containerd = Containerd::start(TestNode::new("image-ctr"));
    run_ok(
        Command::new("ctr")
            .arg("--address")
            .arg(containerd.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&image.archive),
    );
    let names = run_ok(
        Command::new("ctr")
            .arg("--address")
            .arg(containerd.socket())
            .args(["-n", "k8s.io", "images", "ls", "-q"]),
    );
    assert!(
        names.lines().any(|n| n == image.tag),
        "{} not among containerd's images:\n{names}",
        image.tag
    );
}

/// The multi-arch path of conf/kubernetes/README.md "Building the image":
/// the two architectures' images as one manifest list, pushed (`podman
/// manifest push --all`) to a real registry in a node netns under the name
/// conf/kubernetes/podgate.yaml runs; containerd pulls that name through a
/// mirror entry and gets this machine's (amd64) image of the list.
#[test]
fn both_architectures_pushed_under_the_manifests_name_pull_as_the_amd64_image() {
    let (amd64, arm64) = (built("amd64"), built("arm64"));
    let name = podgate_integration::image::manifest_name();
    let (host, repository) = registry::split_image_name(&name);
    let containerd = Containerd::start(TestNode::new("image-pull"));
    let ns = &containerd.node().ns;
    let ip = "10.250.0.1";
    ns.exec_ok(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    let registry = Registry::start(ns, ip);
    let list = registry.push_manifest_list(&[&amd64.tag, &arm64.tag], repository);
    containerd.mirror(host, &registry.url());
    let mut cri = Cri::connect(&containerd);
    assert!(cri.image_status(&name).is_none(), "{name} before the pull");
    let pulled = cri
        .pull_image(&name)
        .unwrap_or_else(|e| panic!("PullImage {name}: {e}\n{}", registry.log()));
    assert_eq!(pulled, registry::image_id(&amd64.tag));
    assert_ne!(pulled, registry::image_id(&arm64.tag));
    let status = cri.image_status(&name).unwrap();
    let (repo, _tag) = name.rsplit_once(':').unwrap();
    let by_digest = format!("{repo}@{list}");
    assert!(status.repo_digests.contains(&by_digest), "{status:?}");
}

#[test]
fn the_arm64_image_ships_static_aarch64_binaries_that_name_the_commit_under_qemu() {
    let image = built("arm64");
    let arch = podman(&[
        "image",
        "inspect",
        "--format",
        "{{.Os}}/{{.Architecture}}",
        &image.tag,
    ]);
    assert_eq!(arch.trim(), "linux/arm64");
    let dir = TempDir::new("image-arm64-bin");
    extract_binaries(&image.tag, dir.path());
    assert_static_binaries_for(dir.path(), "ARM aarch64");
    let version = run_ok(
        Command::new("qemu-aarch64-static")
            .arg(dir.path().join("podgate"))
            .arg("--version"),
    );
    assert_names_version_and_commit(&version);
}

/// Runs the named cases of the integration test `test` with the arm64
/// image's plugins in `PODGATE_BIN_DIR` and qemu-user as
/// `PODGATE_BIN_RUNNER` (the runner's wrapper scripts put qemu in front of
/// every plugin call), and asserts that every case ran and passed.
fn run_under_qemu(test: &str, cases: &[&str]) {
    let image = built("arm64");
    let dir = TempDir::new("image-arm64-qemu");
    extract_binaries(&image.tag, dir.path());
    // --workspace: the features CI's `cargo test --workspace` built these
    // test binaries with, so nothing is compiled again.
    let out = run(Command::new(env!("CARGO"))
        .args(["test", "-q", "--workspace"])
        .args(["--test", test, "--", "--exact"])
        .args(cases)
        .current_dir(workspace_root())
        .env("PODGATE_BIN_DIR", dir.path())
        .env("PODGATE_BIN_RUNNER", "qemu-aarch64-static"));
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    // Every case ran (a renamed test would otherwise match nothing).
    let passed: usize = text
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert_eq!(passed, cases.len(), "{text}");
}

/// The arm64 router and tunnel-guard, run by qemu-user, through the same
/// conformance cases (VERSION, bad input, pass-through of prevResult) as the
/// machine's own binaries. Bad input includes a CNI_NETNS that is a regular
/// file and one that is a mount namespace: qemu-user does not translate
/// `NS_GET_NSTYPE`, so these are refused by the router's fallback check.
#[test]
fn the_arm64_plugins_pass_the_conformance_cases_under_qemu() {
    run_under_qemu(
        "conformance",
        &[
            "every_verb_every_version",
            "pass_through_echoes_the_text_or_converts_the_shape",
            "hostile_input_gets_a_code_and_changes_nothing",
        ],
    );
}

/// The arm64 router under qemu-user adds a return route on the node for the
/// pod's pool, CHECK passes, and DEL removes it again (router.rs: the route
/// is read back from the node netns after ADD and after DEL, and no state
/// record is left). rtnetlink is translated by qemu-user; masquerade and
/// XFRM are not run under it.
#[test]
fn the_arm64_router_adds_checks_and_deletes_a_return_route_under_qemu() {
    run_under_qemu("router", &["a_return_route_is_added_checked_and_deleted"]);
}
