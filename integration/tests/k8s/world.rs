//! What the cases share: the cluster (up on first use), the images built
//! for it, and the README's command blocks.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use podgate_integration::k8s::{Cluster, Containerd};
use podgate_integration::{output_text, workspace_root};

#[derive(Default)]
pub struct World {
    cluster: Option<Cluster>,
    /// The containerd the next cluster runs (2.x unless a case says).
    pub containerd: Option<Containerd>,
    /// podgate's image (HEAD) as an archive, under podgate.yaml's name.
    image: Option<PathBuf>,
    /// The install case ran and passed.
    pub installed: bool,
    /// The policy case applied the edited policy.
    pub policy_edited: bool,
    /// Every node as it was before the install.
    pub before_install: Option<std::collections::BTreeMap<&'static str, crate::nodes::NodeView>>,
}

impl World {
    /// The cluster, brought up on first use (containerd 2.x unless
    /// [`World::containerd`] says otherwise); prints `kubectl version` and
    /// the nodes, as the CI log shows them.
    pub fn cluster(&mut self) -> &Cluster {
        if self.cluster.is_none() {
            let c = Cluster::up(self.containerd.unwrap_or(Containerd::V2));
            println!("{}", c.kubectl_ok(&["version"]));
            println!("{}", c.kubectl_ok(&["get", "nodes", "-o", "wide"]));
            self.cluster = Some(c);
        }
        self.cluster.as_ref().unwrap()
    }

    /// Takes the cluster down (the next [`World::cluster`] brings up a new
    /// one). With `PODGATE_K8S_KEEP=1` the last cluster stays up for a look
    /// (`cluster.sh shell`; `cluster.sh down` when done).
    pub fn finish(&mut self) {
        if let Some(c) = self.cluster.take() {
            if std::env::var_os("PODGATE_K8S_KEEP").is_some() {
                println!("PODGATE_K8S_KEEP: the cluster stays up; integration/k8s/cluster.sh down removes it");
                std::mem::forget(c);
            }
        }
        self.installed = false;
        self.policy_edited = false;
        self.before_install = None;
    }

    /// podgate's image, built from the Dockerfile by
    /// integration/image/build.sh for HEAD under the name podgate.yaml
    /// runs, and loaded into every node's containerd.
    pub fn podgate_image(&mut self) -> PathBuf {
        if self.image.is_none() {
            self.image = Some(build_podgate_image(
                &podgate_integration::image::manifest_name(),
                &head_commit(),
            ));
        }
        let image = self.image.clone().unwrap();
        self.cluster().load_image(&image);
        image
    }
}

pub fn head_commit() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git rev-parse HEAD:\n{}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `integration/image/build.sh --arch amd64 --tag NAME --commit COMMIT`:
/// a docker-archive under the target dir.
pub fn build_podgate_image(name: &str, commit: &str) -> PathBuf {
    let dir = podgate_integration::target_dir().join("podgate-k8s-images");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("podgate-{}.tar", &commit[..12.min(commit.len())]));
    podgate_integration::image::build_amd64(name, commit, &out);
    out
}

/// An image of `integration/k8s/images/build.sh` (pause, greeter,
/// openvpn) under the target dir.
pub fn test_image(what: &str) -> PathBuf {
    let dir = podgate_integration::target_dir().join("podgate-k8s-images");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{what}.tar"));
    let run = Command::new("bash")
        .arg(workspace_root().join("integration/k8s/images/build.sh"))
        .arg(what)
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "images/build.sh {what}:\n{}",
        output_text(&run)
    );
    out
}

/// The first ```sh block after the heading `heading` of the markdown file
/// `file` (relative to the workspace root) that contains `containing`:
/// the commands a reader copies, run verbatim by the tests.
pub fn sh_block(file: &str, heading: &str, containing: &str) -> String {
    let text = std::fs::read_to_string(workspace_root().join(file)).unwrap();
    let start = text
        .lines()
        .position(|l| l.trim_start_matches('#').trim() == heading && l.starts_with('#'))
        .unwrap_or_else(|| panic!("{file}: no heading '{heading}'"));
    let mut block: Option<Vec<&str>> = None;
    for line in text.lines().skip(start + 1) {
        match &mut block {
            None if line.trim() == "```sh" => block = Some(Vec::new()),
            None if line.starts_with("## ") => break,
            None => {}
            Some(b) if line.trim() == "```" => {
                let body = b
                    .iter()
                    .map(|l| l.trim_start())
                    .collect::<Vec<_>>()
                    .join("\n");
                if body.contains(containing) {
                    return body;
                }
                block = None;
            }
            Some(b) => b.push(line),
        }
    }
    panic!("{file}: no ```sh block containing '{containing}' under '{heading}'")
}

/// A temporary directory holding `conf` (a link to the repository's) and
/// the given files: where an operator runs the README's commands, which
/// name `conf/kubernetes/...` and files of their own.
pub fn workdir(files: &[(&str, &str)]) -> podgate_integration::TempDir {
    let dir = podgate_integration::TempDir::new("k8s-work");
    std::os::unix::fs::symlink(workspace_root().join("conf"), dir.path().join("conf")).unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    dir
}
