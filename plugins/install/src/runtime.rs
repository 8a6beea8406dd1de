//! Readiness: whether pods created now go through podgate's chain. One
//! function, [`ready`], answers for `install --check`, the ready file and
//! `podgate_install_ready`.
//!
//! The file check (reconcile's `status`: binaries current, podgate's file
//! sorting first and holding the primary's current chain plus the plugins
//! file's entries) says what the conf dir holds. What counts is what the
//! runtime loaded, so unless the operator passed `--runtime-endpoint none`
//! the runtime is asked first, over CRI ([`podgate_cri::runtime_status`]) and its
//! default network must carry podgate's entries exactly as the plugins file
//! has them. The file it loaded is named by matching the loaded bytes
//! against the conf dir. With Multus (thick or thin) the runtime shows only
//! Multus; then Multus's `clusterNetwork` must name podgate's file, and
//! Multus's generated file must be newer than podgate's (its daemon read
//! podgate's file as it is now). A runtime that does not report what it
//! loaded (CRI-O) leaves the file check plus its NetworkReady condition.

use super::chain::{is_podgate, kind_of, Kind};
use super::fsx;
use super::history::Seen;
use super::json::Json;
use super::reconcile::{self, Node, Source};
use super::{Error, Readiness};
use podgate_cri::{LoadedNetwork, RuntimeStatus};
use std::path::Path;

/// `--runtime-endpoint`: which runtime readiness asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// crictl's default sockets, first that answers.
    Default,
    At(String),
    /// `none`: the file check only.
    FileOnly,
}

impl Runtime {
    pub fn from_arg(arg: Option<&str>) -> Runtime {
        match arg {
            None => Runtime::Default,
            Some("none") => Runtime::FileOnly,
            Some(e) => Runtime::At(e.to_string()),
        }
    }
}

/// Multus's plugin types: the thick plugin's shim and the thin plugin.
const MULTUS_TYPES: [&str; 2] = ["multus-shim", "multus"];

/// Ok(podgate's file) when pods created now get podgate's chain; Err(one
/// line naming what the runtime loaded and why it is not podgate's chain).
pub fn ready(
    node: &Node,
    src: &Source,
    entries: &[Json],
    runtime: &Runtime,
) -> Result<Readiness, Error> {
    Ok(judge(node, src, entries, runtime)?.ready)
}

/// [`ready`]'s answer, and what it learnt of the runtime on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ready: Readiness,
    /// What the runtime's loaded network has in it, configured as now or
    /// not: podgate-router, an enforcing tunnel guard (through Multus: in
    /// podgate's file, when its clusterNetwork is that file); None when the
    /// runtime was not asked, did not answer, or does not report what it
    /// loaded (CRI-O).
    pub loaded: Option<Seen>,
}

/// The one readiness test (see the module doc).
pub fn judge(
    node: &Node,
    src: &Source,
    entries: &[Json],
    runtime: &Runtime,
) -> Result<Verdict, Error> {
    let endpoint = match runtime {
        Runtime::FileOnly => {
            return Ok(Verdict {
                ready: reconcile::status(node, src, entries)?,
                loaded: None,
            })
        }
        Runtime::Default => None,
        Runtime::At(e) => Some(e.as_str()),
    };
    // The runtime first: what it loaded is what pods get, and it names the
    // file it loaded; then the conf dir, so a stale binary or a chain not
    // yet re-rendered from the primary's new content is not ready either.
    let status = match podgate_cri::runtime_status(endpoint) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Verdict {
                ready: Readiness::NotReady(format!(
                    "cannot tell what the runtime loaded: {e} (--runtime-endpoint none: trust the conf dir alone)"
                )),
                loaded: None,
            })
        }
    };
    let loaded = loaded_is_podgates(node, entries, &status);
    Ok(Verdict {
        loaded: serves(node, &status),
        ready: match loaded {
            Err(why) => Readiness::NotReady(why),
            Ok(()) => reconcile::status(node, src, entries)?,
        },
    })
}

/// [`ready`] again until it says yes or `wait` has passed (a runtime
/// reloads its CNI config a moment after the conf dir changes).
pub fn wait_ready(
    node: &Node,
    src: &Source,
    runtime: &Runtime,
    wait: std::time::Duration,
) -> Result<Readiness, Error> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let entries = reconcile::load_entries(&src.plugins_file)?;
        let r = ready(node, src, &entries, runtime)?;
        if r.is_chained() || std::time::Instant::now() >= deadline {
            return Ok(r);
        }
        std::thread::sleep(RECHECK);
    }
}

/// How soon readiness is asked again while the runtime has not yet loaded
/// what is on disk.
pub const RECHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the network the runtime serves pods with is podgate's chain.
fn loaded_is_podgates(node: &Node, entries: &[Json], status: &RuntimeStatus) -> Result<(), String> {
    let at = &status.endpoint;
    let Some(cni) = &status.cni else {
        // CRI-O: nothing but its NetworkReady condition to go on.
        return match &status.network_not_ready {
            None => Ok(()),
            Some(why) => Err(format!("the runtime at {at} has no network ready: {why}")),
        };
    };
    let reload = cni
        .load_error
        .as_deref()
        .map(|e| format!(" (its last reload failed: {e})"))
        .unwrap_or_default();
    let Some(net) = &cni.default else {
        return Err(format!(
            "the runtime at {at} has no network loaded from {}{reload}",
            cni.conf_dir
        ));
    };
    let loaded = loaded_file(&node.conf_dir, net)
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| {
            format!(
                "network {:?}, whose bytes match no file in {} now",
                net.name,
                node.conf_dir.display()
            )
        });
    let why = |msg: String| format!("the runtime at {at} loaded {loaded}: {msg}{reload}");
    if let [only] = net.plugins.as_slice() {
        if MULTUS_TYPES.contains(&only.kind.as_str()) {
            return multus_delegates_to_podgate(node, &loaded, &only.source).map_err(why);
        }
    }
    let want: Vec<serde_json::Value> = entries
        .iter()
        .map(Json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    for p in &net.plugins {
        let v = Json::parse(p.source.as_bytes())
            .map_err(|e| why(format!("plugin {:?}: {e}", p.kind)))?;
        if is_podgate(&v) {
            got.push(v.to_value().map_err(|e| e.to_string())?);
        }
    }
    if got.is_empty() {
        let kinds: Vec<&str> = net.plugins.iter().map(|p| p.kind.as_str()).collect();
        let renamed = node
            .conf_dir
            .join(format!("{}.cilium_bak", node.own_file))
            .exists();
        let hint = if renamed {
            format!(
                "; {} was renamed to {}.cilium_bak (Cilium's cni.exclusive)",
                node.own_file, node.own_file
            )
        } else {
            String::new()
        };
        return Err(why(format!(
            "no podgate plugin in its chain [{}]{hint}",
            kinds.join(", ")
        )));
    }
    if got != want {
        return Err(why(
            "its podgate plugins differ from the plugins file".into()
        ));
    }
    Ok(())
}

/// What the runtime's default network has in it (see [`Verdict::loaded`]).
fn serves(node: &Node, status: &RuntimeStatus) -> Option<Seen> {
    let cni = status.cni.as_ref()?;
    let none = Seen {
        router: false,
        guard: false,
    };
    let Some(net) = &cni.default else {
        return Some(none);
    };
    let parse = |src: &str| serde_json::from_str::<serde_json::Value>(src).ok();
    let plugins: Vec<serde_json::Value> = match net.plugins.as_slice() {
        [only] if MULTUS_TYPES.contains(&only.kind.as_str()) => {
            let to_own = parse(&only.source)
                .and_then(|c| c.get("clusterNetwork")?.as_str().map(str::to_string))
                .is_some_and(|c| Path::new(&c).file_name() == Some(node.own_file.as_ref()));
            if !to_own {
                return Some(none);
            }
            // Multus runs the file as it is at each call.
            std::fs::read(node.conf_dir.join(&node.own_file))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|l| l.get("plugins")?.as_array().cloned())
                .unwrap_or_default()
        }
        plugins => plugins.iter().filter_map(|p| parse(&p.source)).collect(),
    };
    let kind = |p: &serde_json::Value| p.get("type").and_then(|t| t.as_str()).map(str::to_string);
    Some(Seen {
        router: plugins.iter().any(|p| kind(p).as_deref() == Some(ROUTER)),
        guard: plugins.iter().any(|p| {
            kind(p).as_deref() == Some(GUARD)
                && podgate_tunnel_guard::GuardConfig::from_value(p).is_ok_and(|g| g.enforces())
        }),
    })
}

const ROUTER: &str = "podgate-router";
const GUARD: &str = "podgate-tunnel-guard";

/// The conf dir file the runtime loaded: a `.conflist` by its bytes; a
/// `.conf`/`.json` by its JSON value, against the single plugin libcni
/// wrapped it in (re-encoded by Go, so not byte for byte).
fn loaded_file(dir: &Path, net: &LoadedNetwork) -> Result<Option<String>, Error> {
    let single = match net.plugins.as_slice() {
        [only] => serde_json::from_str::<serde_json::Value>(&only.source).ok(),
        _ => None,
    };
    for name in fsx::list_files(dir)? {
        let Some(kind) = kind_of(&name) else {
            continue;
        };
        let Some(bytes) = fsx::read_opt(&dir.join(&name))? else {
            continue;
        };
        let same = match kind {
            Kind::List => bytes == net.source.as_bytes(),
            Kind::Single => single.as_ref().is_some_and(|want| {
                serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v == *want)
            }),
        };
        if same {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Multus serves pods from its `clusterNetwork`; its daemon picks that file
/// at start and re-reads it (rewriting its own generated file) whenever it
/// changes. Ready when it names podgate's file (by file name: Multus sees the
/// conf dir under its own mount, `/host/etc/cni/net.d` by default) and
/// Multus's generated file is not older than podgate's.
fn multus_delegates_to_podgate(node: &Node, loaded: &str, source: &str) -> Result<(), String> {
    let conf: serde_json::Value =
        serde_json::from_str(source).map_err(|e| format!("Multus's config: {e}"))?;
    let Some(cluster) = conf.get("clusterNetwork").and_then(|v| v.as_str()) else {
        return Err(
            "Multus without a clusterNetwork file: podgate cannot tell what it delegates to".into(),
        );
    };
    let target = Path::new(cluster)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if target != node.own_file {
        return Err(format!(
            "Multus delegates to {cluster}, not {} (its daemon chose it at start: restart the Multus daemon, and set multusMasterCNI: {})",
            node.own_file, node.own_file
        ));
    }
    let mtime = |name: &str| {
        std::fs::metadata(node.conf_dir.join(name))
            .and_then(|m| m.modified())
            .ok()
    };
    match (mtime(loaded), mtime(&node.own_file)) {
        (Some(multus), Some(own)) if multus >= own => Ok(()),
        _ => Err(format!(
            "Multus's daemon has not re-read {} since it was last written ({loaded} is older): is the Multus daemon running?",
            node.own_file
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDir;
    use podgate_cri::{LoadedCni, LoadedPlugin};
    use std::path::PathBuf;

    const OWN: &str = "00-podgate.conflist";

    /// A node whose directories live in a temporary directory removed with
    /// the returned guard.
    fn node(tag: &str) -> (tempfile::TempDir, Node) {
        let (t, d) = crate::testing::scratch_dir(&format!("podgate-runtime-{tag}-"));
        let node = Node {
            conf_dir: d.clone(),
            bin_dir: d.join("bin"),
            state: StateDir::new(&d.join("state")),
            own_file: OWN.into(),
        };
        (t, node)
    }

    fn entries() -> Vec<Json> {
        vec![Json::parse(br#"{"type": "podgate-router", "profiles": {}}"#).unwrap()]
    }

    fn plugin(src: &str) -> LoadedPlugin {
        let v: serde_json::Value = serde_json::from_str(src).unwrap();
        LoadedPlugin {
            kind: v["type"].as_str().unwrap().into(),
            // Go re-encodes each plugin: compact, keys sorted.
            source: v.to_string(),
        }
    }

    fn loaded(source: &str, plugins: &[&str]) -> RuntimeStatus {
        RuntimeStatus {
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            network_not_ready: None,
            cni: Some(LoadedCni {
                conf_dir: "/etc/cni/net.d".into(),
                default: Some(LoadedNetwork {
                    name: "k8s-pod-network".into(),
                    source: source.into(),
                    plugins: plugins.iter().map(|p| plugin(p)).collect(),
                }),
                load_error: None,
            }),
        }
    }

    fn put(node: &Node, name: &str, text: &str) -> PathBuf {
        let p = node.conf_dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    const CALICO: &str = r#"{"type": "calico"}"#;
    const ROUTER: &str = r#"{"profiles": {}, "type": "podgate-router"}"#;

    #[test]
    fn the_loaded_chain_with_podgates_entries_as_configured_is_ready() {
        let (_tmp, n) = node("ok");
        let own = r#"{"name": "k8s-pod-network", "plugins": [{"type": "calico"}, {"type": "podgate-router", "profiles": {}}]}"#;
        put(&n, OWN, own);
        assert_eq!(
            loaded_is_podgates(&n, &entries(), &loaded(own, &[CALICO, ROUTER])),
            Ok(())
        );
        // Configured otherwise than the plugins file says: not ready.
        let other = r#"{"profiles": {"x": {}}, "type": "podgate-router"}"#;
        let err = loaded_is_podgates(&n, &entries(), &loaded(own, &[CALICO, other])).unwrap_err();
        assert!(
            err.contains("loaded 00-podgate.conflist") && err.contains("differ"),
            "{err}"
        );
    }

    #[test]
    fn a_loaded_file_without_podgate_is_named_with_its_chain() {
        let (_tmp, n) = node("other");
        let first = r#"{"name": "k8s-pod-network", "plugins": [{"type": "calico"}]}"#;
        put(&n, "00-aaa.conflist", first);
        put(&n, "10-calico.conf", r#"{"name": "x", "type": "calico"}"#);
        let err = loaded_is_podgates(&n, &entries(), &loaded(first, &[CALICO])).unwrap_err();
        assert!(
            err.contains("loaded 00-aaa.conflist: no podgate plugin in its chain [calico]"),
            "{err}"
        );
        // A .conf is matched by its value, as libcni re-encodes it.
        let err = loaded_is_podgates(
            &n,
            &entries(),
            &loaded("{}", &[r#"{"type":"calico","name":"x"}"#]),
        )
        .unwrap_err();
        assert!(err.contains("loaded 10-calico.conf:"), "{err}");
        // Bytes that match no file any more.
        let err = loaded_is_podgates(&n, &entries(), &loaded("{\"gone\":1}", &[CALICO, CALICO]))
            .unwrap_err();
        assert!(err.contains("match no file"), "{err}");
    }

    #[test]
    fn multus_is_ready_only_delegating_to_podgates_file_read_since_it_was_written() {
        let (_tmp, n) = node("multus");
        put(&n, OWN, "{}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let shim = |cluster: &str| {
            format!(
                r#"{{"cniVersion":"0.3.1","name":"multus-cni-network","clusterNetwork":"{cluster}","type":"multus-shim"}}"#
            )
        };
        let to_calico = shim("/host/etc/cni/net.d/10-calico.conflist");
        put(&n, "00-multus.conf", &to_calico);
        let err = loaded_is_podgates(&n, &entries(), &loaded("{}", &[&to_calico])).unwrap_err();
        assert!(
            err.contains("loaded 00-multus.conf: Multus delegates to /host/etc/cni/net.d/10-calico.conflist, not 00-podgate.conflist"),
            "{err}"
        );
        let to_own = shim("/host/etc/cni/net.d/00-podgate.conflist");
        put(&n, "00-multus.conf", &to_own);
        assert_eq!(
            loaded_is_podgates(&n, &entries(), &loaded("{}", &[&to_own])),
            Ok(())
        );
        // podgate's file rewritten after Multus last read it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        put(&n, OWN, "{ }");
        let err = loaded_is_podgates(&n, &entries(), &loaded("{}", &[&to_own])).unwrap_err();
        assert!(err.contains("has not re-read 00-podgate.conflist"), "{err}");
    }

    /// The history's two series: podgate-router in the loaded chain
    /// however configured, and a tunnel guard only while it enforces (not
    /// in audit mode, not `required: never`); through Multus, what
    /// podgate's file holds.
    #[test]
    fn the_history_sees_the_router_and_an_enforcing_guard_in_the_loaded_chain() {
        let (_tmp, n) = node("serves");
        let seen = |router, guard| Some(Seen { router, guard });
        let other = r#"{"profiles": {"x": {}}, "type": "podgate-router"}"#;
        let enforce = r#"{"type": "podgate-tunnel-guard", "required": "always"}"#;
        let audit = r#"{"type": "podgate-tunnel-guard", "required": "always", "mode": "audit"}"#;
        let never = r#"{"type": "podgate-tunnel-guard", "required": "never"}"#;
        assert_eq!(
            serves(&n, &loaded("{}", &[CALICO, other])),
            seen(true, false)
        );
        assert_eq!(serves(&n, &loaded("{}", &[CALICO])), seen(false, false));
        assert_eq!(
            serves(&n, &loaded("{}", &[CALICO, enforce, ROUTER])),
            seen(true, true)
        );
        assert_eq!(
            serves(&n, &loaded("{}", &[CALICO, audit, ROUTER])),
            seen(true, false)
        );
        assert_eq!(
            serves(&n, &loaded("{}", &[CALICO, never])),
            seen(false, false)
        );
        let shim = |to: &str| {
            format!(r#"{{"type":"multus-shim","clusterNetwork":"/host/etc/cni/net.d/{to}"}}"#)
        };
        put(
            &n,
            OWN,
            &format!(r#"{{"plugins": [{CALICO}, {enforce}, {ROUTER}]}}"#),
        );
        assert_eq!(serves(&n, &loaded("{}", &[&shim(OWN)])), seen(true, true));
        assert_eq!(
            serves(&n, &loaded("{}", &[&shim("10-calico.conflist")])),
            seen(false, false)
        );
        let mut crio = loaded("{}", &[]);
        crio.cni = None;
        assert_eq!(serves(&n, &crio), None);
    }

    #[test]
    fn a_runtime_that_does_not_report_its_config_leaves_its_network_condition() {
        let (_tmp, n) = node("crio");
        let mut st = loaded("{}", &[]);
        st.cni = None;
        assert_eq!(loaded_is_podgates(&n, &entries(), &st), Ok(()));
        st.network_not_ready = Some("NetworkPluginNotReady: no CNI configuration".into());
        let err = loaded_is_podgates(&n, &entries(), &st).unwrap_err();
        assert!(
            err.contains("no network ready: NetworkPluginNotReady"),
            "{err}"
        );
    }
}
