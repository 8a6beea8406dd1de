//! One pass of install, check or uninstall over a node's CNI dirs.
//!
//! podgate's chain is a conflist of its own (`--conflist-name`, default
//! `00-podgate.conflist`) that sorts before the primary's file: the primary's
//! plugins followed by podgate's, rendered from the primary's current
//! content on every pass. The primary's file is never written. When the
//! primary's file disappears, podgate's copy is withdrawn with it.
//!
//! Install order: binaries first, then the chain, so a chain never names a
//! plugin the runtime cannot find. Uninstall goes the other way round. Files
//! an earlier podgate chained in place (recorded in the state dir) are given
//! back once podgate's own file is in place.

use super::chain::{self, converted_name, kind_of, Kind, List, ORIG_SUFFIX};
use super::fsx;
use super::json::Json;
use super::state::{Backup, StateDir};
use super::validate::{self, BINARIES};
use super::{Error, Readiness};
use crate::logging::info;
use std::path::{Path, PathBuf};

/// Where things are on this node.
#[derive(Debug, Clone)]
pub struct Node {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub state: StateDir,
    /// podgate's own conflist in `conf_dir`.
    pub own_file: String,
}

/// What the installer chains, from where.
#[derive(Debug, Clone)]
pub struct Source {
    pub binaries_dir: PathBuf,
    pub plugins_file: PathBuf,
    /// `--primary`: a file name in the conf dir.
    pub primary: Option<String>,
    /// Where the entries' host paths may point (checked before an install
    /// pass writes them into the chain).
    pub host_paths: validate::HostPaths,
}

/// What one install pass did to the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// podgate's file already held the primary's chain plus podgate's.
    Unchanged { file: String, from: String },
    /// podgate's file (re-)rendered from the primary `from`; `fresh`: it was
    /// missing (first install, or someone deleted it).
    Rendered {
        file: String,
        from: String,
        fresh: bool,
    },
}

impl Applied {
    /// podgate's own conflist.
    pub fn file(&self) -> &str {
        match self {
            Applied::Unchanged { file, .. } | Applied::Rendered { file, .. } => file,
        }
    }

    /// Whether podgate's file had to be put back (it was gone).
    pub fn fresh(&self) -> bool {
        matches!(self, Applied::Rendered { fresh: true, .. })
    }
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Applied::Unchanged { file, from } => {
                write!(f, "{file} is current (the chain of {from} plus podgate)")
            }
            Applied::Rendered { file, from, fresh } => write!(
                f,
                "{} {file} from {from}: its plugins, then podgate's ({from} left as its owner wrote it)",
                if *fresh { "wrote" } else { "re-rendered" }
            ),
        }
    }
}

/// podgate's entries from the plugins file, validated as the plugins would.
pub fn load_entries(path: &Path) -> Result<Vec<Json>, Error> {
    let text = fsx::read(path).map_err(|source| {
        if source.not_found() {
            Error::PluginsFileMissing(path.into())
        } else {
            Error::PluginsFile {
                path: path.into(),
                msg: source.to_string(),
            }
        }
    })?;
    let entries = chain::parse_entries(&text).map_err(|e| Error::PluginsFile {
        path: path.into(),
        msg: e.to_string(),
    })?;
    validate::validate_entries(&entries).map_err(|e| Error::PluginsFile {
        path: path.into(),
        msg: e.to_string(),
    })?;
    Ok(entries)
}

/// Copy the plugin binaries that differ. Returns the names written.
pub fn install_binaries(src: &Source, node: &Node) -> Result<Vec<&'static str>, Error> {
    std::fs::create_dir_all(&node.bin_dir).map_err(|e| Error::io("creating", &node.bin_dir, e))?;
    let mut written = Vec::new();
    for name in BINARIES {
        if fsx::install_executable(&src.binaries_dir.join(name), &node.bin_dir.join(name))? {
            written.push(name);
        }
    }
    Ok(written)
}

/// The first binary that is missing or differs from the source, if any.
fn stale_binary(src: &Source, node: &Node) -> Result<Option<&'static str>, Error> {
    for name in BINARIES {
        let want = fsx::read(&src.binaries_dir.join(name))?;
        if !fsx::executable_with(&node.bin_dir.join(name), &want)? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

pub fn remove_binaries(node: &Node) -> Result<Vec<&'static str>, Error> {
    let mut removed = Vec::new();
    for name in BINARIES {
        if fsx::remove(&node.bin_dir.join(name))? {
            removed.push(name);
        }
    }
    Ok(removed)
}

/// The primary: the file a runtime would load first without podgate's own,
/// i.e. the first `.conflist`/`.conf`/`.json` in bytewise order (libcni's
/// `ConfFiles`, as containerd and CRI-O use it) other than podgate's file, or
/// `--primary` (followed to the conversion an earlier podgate made of it).
fn find_primary(node: &Node, src: &Source) -> Result<String, Error> {
    if let Some(name) = &src.primary {
        if *name == node.own_file {
            return Err(Error::BadPrimary(name.clone()));
        }
        if node.conf_dir.join(name).exists() {
            return Ok(name.clone());
        }
        if kind_of(name) == Some(Kind::Single) {
            let target = converted_name(name);
            let ours = node
                .state
                .load(&target)?
                .is_some_and(|b| b.converted_from.as_deref() == Some(name));
            if ours && node.conf_dir.join(&target).exists() {
                return Ok(target);
            }
        }
        return Err(Error::PrimaryMissing {
            name: name.clone(),
            dir: node.conf_dir.clone(),
        });
    }
    fsx::list_files(&node.conf_dir)?
        .into_iter()
        .find(|n| kind_of(n).is_some() && *n != node.own_file)
        .ok_or_else(|| Error::NoPrimary(node.conf_dir.clone()))
}

/// Read a conf-dir file that was just listed; vanishing meanwhile is a race
/// with its writer, not a failure.
fn read_listed(node: &Node, name: &str) -> Result<Vec<u8>, Error> {
    fsx::read(&node.conf_dir.join(name)).map_err(|e| {
        if e.not_found() {
            Error::Vanished(name.into())
        } else {
            e
        }
    })
}

fn mode_or_default(path: &Path) -> u32 {
    fsx::mode_of(path).unwrap_or(0o644)
}

/// Render podgate's own conflist from the primary, then give back any file
/// an earlier podgate chained in place (and render again if that changed
/// which file is the primary).
pub fn apply(node: &Node, src: &Source, entries: &[Json]) -> Result<Applied, Error> {
    let applied = render(node, src, entries)?;
    let mut migrated = false;
    for b in node.state.list()? {
        if b.file != node.own_file {
            info(restore(node, &b)?);
            migrated = true;
        }
    }
    if migrated {
        let again = render(node, src, entries)?;
        // Report the first pass's freshness: that is when the file appeared.
        return Ok(match (applied.fresh(), again) {
            (true, Applied::Unchanged { file, from } | Applied::Rendered { file, from, .. }) => {
                Applied::Rendered {
                    file,
                    from,
                    fresh: true,
                }
            }
            (false, a) => a,
        });
    }
    Ok(applied)
}

/// The primary's chain with podgate's entries after it, as a conflist.
fn chain_of(node: &Node, name: &str, entries: &[Json]) -> Result<List, Error> {
    let text = read_listed(node, name)?;
    let list = match kind_of(name) {
        Some(Kind::Single) => List::from_single(name, &text)?,
        _ => List::parse(name, &text)?,
    };
    list.check_chainable(name)?;
    Ok(list.merged(entries))
}

/// The runtime must load podgate's file first.
fn check_order(node: &Node, primary: &str) -> Result<(), Error> {
    if node.own_file.as_str() < primary {
        Ok(())
    } else {
        Err(Error::SortsAfter {
            own: node.own_file.clone(),
            primary: primary.into(),
        })
    }
}

/// Whether the file named like podgate's is podgate's: recorded as rendered,
/// or a conflist holding podgate entries (state dir lost).
fn own_is_ours(node: &Node, text: &[u8]) -> Result<bool, Error> {
    let recorded = node
        .state
        .load(&node.own_file)?
        .is_some_and(|b| b.rendered_from.is_some());
    Ok(recorded || List::parse(&node.own_file, text).is_ok_and(|l| l.has_podgate()))
}

fn render(node: &Node, src: &Source, entries: &[Json]) -> Result<Applied, Error> {
    let name = match find_primary(node, src) {
        Ok(n) => n,
        Err(e @ (Error::NoPrimary(_) | Error::PrimaryMissing { .. })) => {
            // Never leave a copy of a primary that is gone: the runtime would
            // go on wiring pods with a network nobody provides any more.
            if let Some(msg) = withdraw_own(node)? {
                info(msg);
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    check_order(node, &name)?;
    let out = chain_of(node, &name, entries)?
        .to_text()
        .map_err(Error::Encode)?;
    let path = node.conf_dir.join(&node.own_file);
    let current = fsx::read_opt(&path)?;
    if let Some(cur) = &current {
        if !own_is_ours(node, cur)? {
            return Err(Error::OwnTaken(node.own_file.clone()));
        }
        // Only podgate writes this file: byte equality, so it always reads
        // exactly as the primary's current file does (key order included).
        let recorded_from = node
            .state
            .load(&node.own_file)?
            .and_then(|b| b.rendered_from);
        if *cur == out.as_bytes() && recorded_from.as_deref() == Some(name.as_str()) {
            return Ok(Applied::Unchanged {
                file: node.own_file.clone(),
                from: name,
            });
        }
    }
    // The record goes first: a crash before the write leaves a record for a
    // file that is not there yet, which uninstall handles.
    node.state.save(&Backup {
        file: node.own_file.clone(),
        written: out.clone(),
        original: None,
        converted_from: None,
        rendered_from: Some(name.clone()),
    })?;
    fsx::atomic_write(
        &path,
        out.as_bytes(),
        mode_or_default(&node.conf_dir.join(&name)),
    )?;
    Ok(Applied::Rendered {
        file: node.own_file.clone(),
        from: name,
        fresh: current.is_none(),
    })
}

/// Remove podgate's own file (when it is podgate's) and its record.
fn withdraw_own(node: &Node) -> Result<Option<String>, Error> {
    let path = node.conf_dir.join(&node.own_file);
    let msg = match fsx::read_opt(&path)? {
        Some(cur) if own_is_ours(node, &cur)? => {
            fsx::remove(&path)?;
            Some(format!("removed {}", node.own_file))
        }
        Some(_) => Some(format!(
            "left {} alone: it was not written by podgate",
            node.own_file
        )),
        None => None,
    };
    node.state.remove(&node.own_file)?;
    Ok(msg)
}

/// Chained(file) when podgate's file holds exactly the primary's current
/// chain plus these entries, sorts first, and the binaries are current;
/// NotReady(reason) otherwise.
pub fn status(node: &Node, src: &Source, entries: &[Json]) -> Result<Readiness, Error> {
    if let Some(bin) = stale_binary(src, node)? {
        return Ok(Readiness::NotReady(format!(
            "{bin} in {} is missing or differs from {}",
            node.bin_dir.display(),
            src.binaries_dir.display()
        )));
    }
    let name = match find_primary(node, src) {
        Ok(n) => n,
        Err(e) if e.is_transient() => return Ok(Readiness::NotReady(e.to_string())),
        Err(e) => return Err(e),
    };
    if let Err(e) = check_order(node, &name) {
        return Ok(Readiness::NotReady(e.to_string()));
    }
    let chain = match chain_of(node, &name, entries) {
        Ok(c) => c,
        Err(e) if e.is_transient() => return Ok(Readiness::NotReady(e.to_string())),
        Err(e) => return Err(e),
    };
    let own = &node.own_file;
    Ok(match fsx::read_opt(&node.conf_dir.join(own))? {
        None => Readiness::NotReady(format!(
            "{own} is missing: the runtime wires pods with {name} alone, without podgate"
        )),
        Some(cur) => match List::parse(own, &cur) {
            Ok(l) if l.same(&chain) => Readiness::Chained(own.clone()),
            Ok(_) => Readiness::NotReady(format!(
                "{own} is not the current chain of {name} plus {}",
                src.plugins_file.display()
            )),
            Err(e) => Readiness::NotReady(e.to_string()),
        },
    })
}

/// Give a chained file back: its original bytes while it still holds what
/// podgate wrote, else the current content minus podgate's entries.
fn restore(node: &Node, b: &Backup) -> Result<String, Error> {
    let path = node.conf_dir.join(&b.file);
    let conversion = match (&b.converted_from, &b.original) {
        (Some(conf), orig) => Some((conf.as_str(), orig.as_deref())),
        _ => None,
    };
    let msg = match fsx::read_opt(&path)? {
        Some(cur) if cur == b.written.as_bytes() => match (conversion, &b.original) {
            (Some((conf, orig)), _) => {
                restore_conf(node, conf, orig)?;
                fsx::remove(&path)?;
                format!("restored {conf}, removed {}", b.file)
            }
            (None, Some(orig)) => {
                fsx::atomic_write(&path, orig.as_bytes(), mode_or_default(&path))?;
                format!("restored {} byte for byte", b.file)
            }
            (None, None) => strip_file(node, &b.file, &cur)?,
        },
        Some(cur) => match (conversion, List::parse(&b.file, &cur)) {
            (_, Err(e)) => format!("left {} alone: {e}", b.file),
            (Some((conf, Some(orig))), Ok(list))
                if List::from_single(conf, orig.as_bytes())
                    .is_ok_and(|l| l.same(&list.stripped().unwrap_or_else(|| list.clone()))) =>
            {
                restore_conf(node, conf, Some(orig))?;
                fsx::remove(&path)?;
                format!("restored {conf}, removed {}", b.file)
            }
            _ => strip_file(node, &b.file, &cur)?,
        },
        None => match conversion {
            Some((conf, orig)) => {
                restore_conf(node, conf, orig)?;
                format!("restored {conf}")
            }
            None => format!("{} is gone", b.file),
        },
    };
    node.state.remove(&b.file)?;
    Ok(msg)
}

/// Put a converted `.conf` back: its renamed original, or the recorded bytes.
/// A `.conf` the primary has rewritten since wins over both.
fn restore_conf(node: &Node, conf: &str, original: Option<&str>) -> Result<(), Error> {
    let conf_path = node.conf_dir.join(conf);
    let orig_path = node.conf_dir.join(format!("{conf}{ORIG_SUFFIX}"));
    if conf_path.exists() {
        fsx::remove(&orig_path)?;
    } else if orig_path.exists() {
        fsx::rename(&orig_path, &conf_path)?;
    } else if let Some(o) = original {
        fsx::atomic_write(&conf_path, o.as_bytes(), 0o644)?;
    }
    Ok(())
}

/// Remove podgate's entries from a conflist, keeping everything else.
fn strip_file(node: &Node, name: &str, text: &[u8]) -> Result<String, Error> {
    let list = match List::parse(name, text) {
        Ok(l) => l,
        Err(e) => return Ok(format!("left {name} alone: {e}")),
    };
    let Some(stripped) = list.stripped() else {
        return Ok(format!("{name} has no podgate entries"));
    };
    if stripped.plugins().is_empty() {
        return Ok(format!("left {name} alone: it holds only podgate plugins"));
    }
    let path = node.conf_dir.join(name);
    let out = stripped.to_text().map_err(Error::Encode)?;
    fsx::atomic_write(&path, out.as_bytes(), mode_or_default(&path))?;
    Ok(format!("removed podgate entries from {name}"))
}

/// Take podgate out of the conf dir: its own file goes; files an earlier
/// podgate chained in place get their original bytes back, converted `.conf`
/// files return, and any other conflist holding podgate entries loses just
/// those.
pub fn unchain_all(node: &Node) -> Result<Vec<String>, Error> {
    let _lock = node.state.lock()?;
    let mut msgs = Vec::new();
    msgs.extend(withdraw_own(node)?);
    for b in node.state.list()? {
        if b.file != node.own_file {
            msgs.push(restore(node, &b)?);
        }
    }
    let files = match fsx::list_files(&node.conf_dir) {
        Ok(f) => f,
        Err(e) if e.not_found() => return Ok(msgs),
        Err(e) => return Err(e),
    };
    for name in &files {
        if kind_of(name) == Some(Kind::List) && *name != node.own_file {
            if let Some(text) = fsx::read_opt(&node.conf_dir.join(name))? {
                if List::parse(name, &text).is_ok_and(|l| l.has_podgate()) {
                    msgs.push(strip_file(node, name, &text)?);
                }
            }
        }
    }
    // Renamed `.conf` files without a record (state dir lost).
    for name in &files {
        if let Some(conf) = name.strip_suffix(ORIG_SUFFIX) {
            msgs.push(restore_orphan(node, conf)?);
        }
    }
    Ok(msgs)
}

/// What of podgate's is still on the node (what [`unchain_all`] and, with
/// `binaries`, [`remove_binaries`] take away): empty once uninstalled.
pub fn leftovers(node: &Node, binaries: bool) -> Result<Vec<String>, Error> {
    let mut left = Vec::new();
    let files = match fsx::list_files(&node.conf_dir) {
        Ok(f) => f,
        Err(e) if e.not_found() => Vec::new(),
        Err(e) => return Err(e),
    };
    for name in &files {
        let path = node.conf_dir.join(name);
        if *name == node.own_file || name.ends_with(ORIG_SUFFIX) {
            left.push(path.display().to_string());
        } else if kind_of(name) == Some(Kind::List) {
            if let Some(text) = fsx::read_opt(&path)? {
                if List::parse(name, &text).is_ok_and(|l| l.has_podgate()) {
                    left.push(format!("podgate entries in {}", path.display()));
                }
            }
        }
    }
    if binaries {
        for name in BINARIES {
            let path = node.bin_dir.join(name);
            if path.exists() {
                left.push(path.display().to_string());
            }
        }
    }
    Ok(left)
}

fn restore_orphan(node: &Node, conf: &str) -> Result<String, Error> {
    let orig_path = node.conf_dir.join(format!("{conf}{ORIG_SUFFIX}"));
    if node.conf_dir.join(conf).exists() {
        fsx::remove(&orig_path)?;
        return Ok(format!("removed stale {conf}{ORIG_SUFFIX}"));
    }
    let target = converted_name(conf);
    let target_path = node.conf_dir.join(&target);
    let orig = fsx::read(&orig_path)?;
    match fsx::read_opt(&target_path)? {
        None => {}
        Some(t) => {
            let same = match (List::parse(&target, &t), List::from_single(conf, &orig)) {
                (Ok(cur), Ok(want)) => cur.stripped().unwrap_or(cur).same(&want),
                _ => false,
            };
            if !same {
                return Ok(format!(
                    "left {conf}{ORIG_SUFFIX}: {target} differs from it; restore by hand"
                ));
            }
        }
    }
    fsx::rename(&orig_path, &node.conf_dir.join(conf))?;
    fsx::remove(&target_path)?;
    Ok(format!("restored {conf}"))
}

/// A whole install pass: entries, binaries, chain.
pub fn install_once(node: &Node, src: &Source) -> Result<Applied, Error> {
    let entries = load_entries(&src.plugins_file)?;
    src.host_paths
        .check(&entries)
        .map_err(|e| Error::PluginsFile {
            path: src.plugins_file.clone(),
            msg: e.to_string(),
        })?;
    let _lock = node.state.lock()?;
    let written = install_binaries(src, node)?;
    if !written.is_empty() {
        info(format!(
            "installed {} into {}",
            written.join(", "),
            node.bin_dir.display()
        ));
    }
    apply(node, src, &entries)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A node in a fresh temporary directory (no root needed): `conf/` with
    /// a bridge primary `10-bridge.conflist`, `bin/`, `state/`, `src/` with
    /// stand-in plugin binaries, and `plugins.json` with a router entry.
    pub(crate) struct Scratch {
        pub root: PathBuf,
        pub node: Node,
        pub src: Source,
        /// Removes `root` when the scratch goes.
        _dir: tempfile::TempDir,
    }

    pub(crate) const PRIMARY: &str = "10-bridge.conflist";
    pub(crate) const PRIMARY_TEXT: &str = r#"{"cniVersion": "1.0.0", "name": "podnet", "plugins": [{"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}}]}"#;

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            let (dir, root) = crate::testing::scratch_dir(&format!("podgate-reconcile-{tag}-"));
            for d in ["conf", "bin", "state", "src"] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            for name in BINARIES {
                fsx::atomic_write(&root.join("src").join(name), name.as_bytes(), 0o755).unwrap();
            }
            std::fs::write(root.join("conf").join(PRIMARY), PRIMARY_TEXT).unwrap();
            let router = serde_json::json!([{"type": "podgate-router",
                "stateDir": root.join("router-state"), "profiles": {}}]);
            std::fs::write(root.join("plugins.json"), router.to_string()).unwrap();
            Scratch {
                node: Node {
                    conf_dir: root.join("conf"),
                    bin_dir: root.join("bin"),
                    state: StateDir::new(&root.join("state")),
                    own_file: "00-podgate.conflist".into(),
                },
                src: Source {
                    binaries_dir: root.join("src"),
                    plugins_file: root.join("plugins.json"),
                    primary: None,
                    host_paths: validate::HostPaths {
                        extra_roots: vec![root.clone()],
                        installer_state: root.join("state"),
                    },
                },
                root,
                _dir: dir,
            }
        }

        pub(crate) fn status(&self) -> Readiness {
            let entries = load_entries(&self.src.plugins_file).unwrap();
            status(&self.node, &self.src, &entries).unwrap()
        }

        pub(crate) fn own(&self) -> Option<Vec<u8>> {
            fsx::read_opt(&self.node.conf_dir.join(&self.node.own_file)).unwrap()
        }

        pub(crate) fn primary(&self) -> Vec<u8> {
            std::fs::read(self.node.conf_dir.join(PRIMARY)).unwrap()
        }
    }

    fn types(text: &[u8]) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(text).unwrap();
        v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_pass_chains_the_primary_into_podgates_own_file_and_changes_nothing_else() {
        let s = Scratch::new("chain");
        assert!(!s.status().is_chained());
        let applied = install_once(&s.node, &s.src).unwrap();
        assert_eq!(
            applied,
            Applied::Rendered {
                file: "00-podgate.conflist".into(),
                from: PRIMARY.into(),
                fresh: true
            }
        );
        assert_eq!(
            s.primary(),
            PRIMARY_TEXT.as_bytes(),
            "the primary's file is never written"
        );
        assert_eq!(types(&s.own().unwrap()), ["bridge", "podgate-router"]);
        for name in BINARIES {
            assert_eq!(
                std::fs::read(s.node.bin_dir.join(name)).unwrap(),
                name.as_bytes()
            );
        }
        assert_eq!(s.status(), Readiness::Chained("00-podgate.conflist".into()));
        // Nothing changed: nothing written.
        assert!(matches!(
            install_once(&s.node, &s.src).unwrap(),
            Applied::Unchanged { .. }
        ));
    }

    #[test]
    fn readiness_names_what_is_out_of_date() {
        let s = Scratch::new("stale");
        install_once(&s.node, &s.src).unwrap();
        // A new binary to install: not ready until the pass copies it.
        fsx::atomic_write(&s.src.binaries_dir.join(BINARIES[0]), b"v2", 0o755).unwrap();
        match s.status() {
            Readiness::NotReady(why) => assert!(why.contains("differs from"), "{why}"),
            r => panic!("{r:?}"),
        }
        install_once(&s.node, &s.src).unwrap();
        assert!(s.status().is_chained());
        // The primary's chain changed: podgate's file re-rendered from it.
        let portmap = PRIMARY_TEXT.replace(
            "}}]}",
            r#"}}, {"type": "portmap", "capabilities": {"portMappings": true}}]}"#,
        );
        std::fs::write(s.node.conf_dir.join(PRIMARY), &portmap).unwrap();
        match s.status() {
            Readiness::NotReady(why) => assert!(why.contains("not the current chain"), "{why}"),
            r => panic!("{r:?}"),
        }
        let applied = install_once(&s.node, &s.src).unwrap();
        assert!(
            matches!(applied, Applied::Rendered { fresh: false, .. }),
            "{applied:?}"
        );
        assert_eq!(
            types(&s.own().unwrap()),
            ["bridge", "portmap", "podgate-router"]
        );
        assert!(s.status().is_chained());
    }

    #[test]
    fn a_primary_gone_withdraws_podgates_file() {
        let s = Scratch::new("gone");
        install_once(&s.node, &s.src).unwrap();
        std::fs::remove_file(s.node.conf_dir.join(PRIMARY)).unwrap();
        let e = install_once(&s.node, &s.src).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert_eq!(s.own(), None, "no copy of a primary nobody provides");
        assert!(!s.status().is_chained());
    }

    #[test]
    fn a_plugins_file_with_a_host_path_out_of_place_is_not_chained() {
        let s = Scratch::new("hostpath");
        std::fs::write(
            &s.src.plugins_file,
            r#"[{"type": "podgate-router", "stateDir": "/etc", "profiles": {}}]"#,
        )
        .unwrap();
        let e = install_once(&s.node, &s.src).unwrap_err();
        assert!(e.to_string().contains("stateDir /etc is outside"), "{e}");
        assert_eq!(s.own(), None);
    }

    #[test]
    fn uninstall_takes_podgate_out_and_leaves_nothing() {
        let s = Scratch::new("uninstall");
        install_once(&s.node, &s.src).unwrap();
        assert!(!leftovers(&s.node, true).unwrap().is_empty());
        unchain_all(&s.node).unwrap();
        assert_eq!(s.own(), None);
        assert_eq!(s.primary(), PRIMARY_TEXT.as_bytes());
        assert_eq!(remove_binaries(&s.node).unwrap(), BINARIES);
        assert_eq!(leftovers(&s.node, true).unwrap(), Vec::<String>::new());
    }
}
