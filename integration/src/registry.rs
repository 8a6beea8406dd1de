//! A real container registry inside a test netns: Debian's `docker-registry`
//! (distribution 2.8; its binary, put in place by `install-deps.sh` without
//! the package's service), run with a config and a storage dir of its own in
//! a temp dir and listening only on an address of that netns. Images reach
//! it with `podman push` run inside the netns (`nsenter --net=`), and a
//! containerd in the same netns pulls them through a mirror entry
//! ([`crate::containerd::Containerd::mirror`]). Nothing listens on, or is
//! sent to, the machine's own network.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{http_get, output_text, run_ok, Netns, TempDir};

/// Where `integration/install-deps.sh` puts the package's binary.
pub const REGISTRY_BIN: &str = "/usr/local/libexec/podgate-it/docker-registry";
const PORT: u16 = 5000;
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// `integration/image/build.sh`'s lock.
const IMAGE_LOCK: &str = "/run/lock/podgate-image-build.lock";

/// The registry process (killed by its PID on drop) and its files.
pub struct Registry {
    child: Child,
    netns: PathBuf,
    ip: String,
    dir: TempDir,
}

impl Registry {
    /// Starts the registry in `ns`, listening on `ip` (an address of `ns`),
    /// and waits until its API answers.
    pub fn start(ns: &Netns, ip: &str) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).is_file(),
            "{REGISTRY_BIN} missing: run integration/install-deps.sh"
        );
        let dir = TempDir::new("registry");
        let config = dir.path().join("config.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: warn\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {storage}\n\
                 http:\n  addr: {ip}:{PORT}\n  secret: podgate-test-registry\n",
                storage = dir.path().join("storage").display(),
            ),
        )
        .unwrap();
        let log = File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", ns.path().display()))
            .arg(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {REGISTRY_BIN}: {e}"));
        let mut r = Registry {
            child,
            netns: ns.path().to_path_buf(),
            ip: ip.into(),
            dir,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("the registry exited ({status}) at start:\n{}", r.log());
            }
            // The registry API's base endpoint: 200 once it serves.
            if let Ok((200, _)) = http_get(ns, ip, PORT, "/v2/", Duration::from_secs(1)) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "the registry did not answer on {} within {START_TIMEOUT:?}:\n{}",
                r.host(),
                r.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `<ip>:<port>`, as image names and podman take it.
    pub fn host(&self) -> String {
        format!("{}:{PORT}", self.ip)
    }

    /// The registry's URL (plain HTTP), as containerd's hosts.toml takes it.
    pub fn url(&self) -> String {
        format!("http://{}", self.host())
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The local images `images` (one per architecture) as one manifest
    /// list, pushed with every image to `<this registry>/<repository>`
    /// (`podman manifest create`, `add`, `push --all`); the list's digest.
    pub fn push_manifest_list(&self, images: &[&str], repository: &str) -> String {
        let _lock = image_lock();
        let list = format!("localhost/podgate-it-list:{}", crate::random_suffix());
        run_ok(Command::new("podman").args(["manifest", "create", &list]));
        let _remove = ManifestList(list.clone());
        for image in images {
            run_ok(Command::new("podman").args([
                "manifest",
                "add",
                &list,
                &format!("containers-storage:{image}"),
            ]));
        }
        self.podman_push(&["manifest", "push", "--all", &list], repository)
    }

    /// `podman <args> --tls-verify=false --digestfile F
    /// docker://<this registry>/<repository>` inside the registry's netns;
    /// the digest podman wrote.
    fn podman_push(&self, args: &[&str], repository: &str) -> String {
        let digest_file = self.dir.path().join("pushed.digest");
        let _ = fs::remove_file(&digest_file);
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .arg("podman")
            .args(args)
            .args(["--tls-verify=false", "--digestfile"])
            .arg(&digest_file)
            .arg(format!("docker://{}/{repository}", self.host()))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman {args:?}: {}\n{}",
            output_text(&out),
            self.log()
        );
        fs::read_to_string(&digest_file).unwrap().trim().to_string()
    }
}

/// `sha256:<hex>`: a local image's ID (its config's digest).
pub fn image_id(image: &str) -> String {
    let id = run_ok(
        Command::new("podman")
            .args(["image", "inspect", "--format", "{{.Id}}", image])
            .stdin(Stdio::null()),
    );
    format!("sha256:{}", id.trim())
}

/// The lock `integration/image/build.sh` holds while it builds (its builds
/// retag podman's images and prune untagged ones), held while a push reads
/// podman's images.
fn image_lock() -> File {
    fs::create_dir_all(Path::new(IMAGE_LOCK).parent().unwrap()).unwrap();
    let lock =
        File::create(IMAGE_LOCK).unwrap_or_else(|e| panic!("{IMAGE_LOCK}: {e} (run as root)"));
    lock.lock().unwrap();
    lock
}

/// A local manifest list, removed on drop.
struct ManifestList(String);

impl Drop for ManifestList {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["manifest", "rm", &self.0])
            .stdin(Stdio::null())
            .output();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An image name split into its registry host and the rest
/// (`ghcr.io/podgate/podgate:0.1.0` -> `ghcr.io`, `podgate/podgate:0.1.0`).
/// Panics on a name without a registry host (`podgate/podgate:0.1.0` means
/// docker.io to a runtime, which a test does not mirror).
pub fn split_image_name(image: &str) -> (&str, &str) {
    let (host, rest) = image
        .split_once('/')
        .unwrap_or_else(|| panic!("{image}: no registry host"));
    assert!(
        host.contains('.') || host.contains(':') || host == "localhost",
        "{image}: no registry host"
    );
    (host, rest)
}
