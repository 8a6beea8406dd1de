//! Pure conflist transformations: which files a runtime loads, how podgate's
//! entries are appended to (and removed from) a primary's plugin list, and how
//! a single-plugin `.conf` becomes a conflist. No I/O here.

use super::json::{Json, Obj};
use crate::Error;
use podgate_cni::version::Version;

/// Entries whose `type` starts with this are podgate's: removed before
/// appending, so a chain never holds two generations of them.
pub const PODGATE_TYPE_PREFIX: &str = "podgate-";
/// Suffix a converted `.conf` is renamed to: no runtime loads it, and
/// uninstall renames it back byte for byte.
pub const ORIG_SUFFIX: &str = ".podgate-orig";
/// Oldest spec version with chaining (`prevResult`).
const MIN_CHAIN_VERSION: Version = Version(0, 3, 0);

/// How a runtime (containerd, CRI-O: libcni's `ConfFiles`) reads a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `.conflist`: `{"cniVersion","name","plugins":[...]}`.
    List,
    /// `.conf` / `.json`: one plugin's config.
    Single,
}

/// The kind of a file in the conf dir, or None when no runtime loads it.
pub fn kind_of(file_name: &str) -> Option<Kind> {
    if file_name.ends_with(".conflist") {
        Some(Kind::List)
    } else if file_name.ends_with(".conf") || file_name.ends_with(".json") {
        Some(Kind::Single)
    } else {
        None
    }
}

/// `10-calico.conf` -> `10-calico.conflist`.
pub fn converted_name(single: &str) -> String {
    let stem = single
        .strip_suffix(".conf")
        .or_else(|| single.strip_suffix(".json"))
        .unwrap_or(single);
    format!("{stem}.conflist")
}

pub fn is_podgate(plugin: &Json) -> bool {
    plugin
        .as_object()
        .and_then(|o| o.str_field("type"))
        .is_some_and(|t| t.starts_with(PODGATE_TYPE_PREFIX))
}

fn parse_object(file: &str, text: &[u8]) -> Result<Obj, Error> {
    match Json::parse(text) {
        Ok(Json::Object(o)) => Ok(o),
        Ok(_) => Err(Error::ConfNotObject { file: file.into() }),
        Err(source) => Err(Error::ConfNotJson {
            file: file.into(),
            source,
        }),
    }
}

/// A conflist: an object with a non-empty array of plugin objects.
#[derive(Debug, Clone, PartialEq)]
pub struct List(Obj);

impl List {
    pub fn parse(file: &str, text: &[u8]) -> Result<List, Error> {
        let top = parse_object(file, text)?;
        let Some(Json::Array(plugins)) = top.get("plugins") else {
            return Err(Error::NoPlugins { file: file.into() });
        };
        if plugins.is_empty() {
            return Err(Error::NoPlugins { file: file.into() });
        }
        if let Some(index) = plugins.iter().position(|p| p.as_object().is_none()) {
            return Err(Error::PluginNotObject {
                file: file.into(),
                index,
            });
        }
        Ok(List(top))
    }

    /// A single-plugin `.conf` as a conflist: name and cniVersion move to the
    /// list (libcni injects them into every plugin's config anyway), every
    /// other key stays with the plugin, in order.
    pub fn from_single(file: &str, text: &[u8]) -> Result<List, Error> {
        let mut plugin = parse_object(file, text)?;
        if plugin.str_field("type").is_none() {
            return Err(Error::NoType { file: file.into() });
        }
        let mut top = Obj::new();
        for key in ["cniVersion", "name"] {
            if let Some(v) = plugin.remove(key) {
                top.insert(key, v);
            }
        }
        top.insert("plugins", Json::Array(vec![Json::Object(plugin)]));
        Ok(List(top))
    }

    pub fn plugins(&self) -> &[Json] {
        match self.0.get("plugins") {
            Some(Json::Array(p)) => p,
            _ => &[],
        }
    }

    pub fn cni_version(&self) -> Option<&str> {
        self.0.str_field("cniVersion")
    }

    pub fn has_podgate(&self) -> bool {
        self.plugins().iter().any(is_podgate)
    }

    /// The primary's plugins (everything that is not podgate's).
    pub fn others(&self) -> Vec<Json> {
        self.plugins()
            .iter()
            .filter(|p| !is_podgate(p))
            .cloned()
            .collect()
    }

    fn with_plugins(&self, plugins: Vec<Json>) -> List {
        let mut top = self.0.clone();
        top.insert("plugins", Json::Array(plugins));
        List(top)
    }

    /// Chaining needs a primary and a spec version that knows prevResult.
    pub fn check_chainable(&self, file: &str) -> Result<(), Error> {
        if self.others().is_empty() {
            return Err(Error::OnlyPodgate { file: file.into() });
        }
        let version = self.cni_version().unwrap_or("");
        match Version::parse(version) {
            Some(v) if v >= MIN_CHAIN_VERSION => Ok(()),
            _ => Err(Error::OldVersion {
                file: file.into(),
                version: version.into(),
            }),
        }
    }

    /// Old podgate entries removed, `entries` appended after the primary's
    /// plugins; everything else as it was.
    pub fn merged(&self, entries: &[Json]) -> List {
        let mut plugins = self.others();
        plugins.extend(entries.iter().cloned());
        self.with_plugins(plugins)
    }

    /// Without podgate's entries (None when it has none).
    pub fn stripped(&self) -> Option<List> {
        self.has_podgate().then(|| self.with_plugins(self.others()))
    }

    /// Equal as JSON values.
    pub fn same(&self, other: &List) -> bool {
        self.0.same(&other.0)
    }

    pub fn to_text(&self) -> Result<String, serde_json::Error> {
        Json::Object(self.0.clone()).to_pretty()
    }
}

/// podgate's entries from the `--plugins` file: an array of plugin objects, a
/// conflist-shaped object (`"plugins": [...]`) or one plugin object. Their
/// `cniVersion`/`name` are dropped: entries inherit the list's.
pub fn parse_entries(text: &[u8]) -> Result<Vec<Json>, Error> {
    let items = match Json::parse(text).map_err(Error::EntriesNotJson)? {
        Json::Array(items) => items,
        Json::Object(o) if o.get("type").is_some() => vec![Json::Object(o)],
        Json::Object(mut o) => match o.remove("plugins") {
            Some(Json::Array(items)) => items,
            _ => return Err(Error::EntriesShape),
        },
        _ => return Err(Error::EntriesShape),
    };
    if items.is_empty() {
        return Err(Error::EntriesEmpty);
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            let Json::Object(mut o) = item else {
                return Err(Error::EntryNoType { index });
            };
            let ty = o.str_field("type").ok_or(Error::EntryNoType { index })?;
            if !ty.starts_with(PODGATE_TYPE_PREFIX) {
                return Err(Error::EntryNotPodgate {
                    index,
                    ty: ty.into(),
                });
            }
            o.remove("cniVersion");
            o.remove("name");
            Ok(Json::Object(o))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "log_level": "info", "ipam": {"type": "calico-ipam"}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}"#;

    fn entries() -> Vec<Json> {
        parse_entries(br#"[{"type":"podgate-router","cniVersion":"9.9.9","profiles":{}}]"#).unwrap()
    }

    #[test]
    fn a_file_is_read_as_a_runtime_reads_it_by_its_extension() {
        assert_eq!(kind_of("10-calico.conflist"), Some(Kind::List));
        assert_eq!(kind_of("10-bridge.conf"), Some(Kind::Single));
        assert_eq!(kind_of("99-x.json"), Some(Kind::Single));
    }

    #[test]
    fn podgates_saved_originals_and_temp_files_are_not_network_configs() {
        assert_eq!(kind_of("10-x.conf.podgate-orig"), None);
        assert_eq!(kind_of(".10-x.conflist.podgate-tmp-12"), None);
    }

    #[test]
    fn a_converted_single_conf_is_named_conflist() {
        assert_eq!(converted_name("10-bridge.conf"), "10-bridge.conflist");
        assert_eq!(converted_name("10-bridge.json"), "10-bridge.conflist");
    }

    #[test]
    fn merge_appends_after_primary_and_is_idempotent() {
        let l = List::parse("c", CALICO.as_bytes()).unwrap();
        let e = entries();
        assert_eq!(e[0].as_object().unwrap().get("cniVersion"), None);
        let m = l.merged(&e);
        let types: Vec<_> = m
            .plugins()
            .iter()
            .map(|p| p.as_object().unwrap().str_field("type").unwrap())
            .collect();
        assert_eq!(types, ["calico", "bandwidth", "portmap", "podgate-router"]);
        assert_eq!(m.merged(&e), m);
        assert!(m.merged(&e).same(&m));
        assert!(!l.merged(&e).same(&l));
        assert_eq!(m.stripped().unwrap(), l);
        assert!(l.stripped().is_none());
        let text = m.to_text().unwrap();
        assert!(text.find("\"name\"").unwrap() < text.find("\"cniVersion\"").unwrap());
    }

    #[test]
    fn old_entries_anywhere_are_replaced() {
        let l = List::parse(
            "c",
            br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"podgate-router","old":1},{"type":"bridge"},{"type":"podgate-tunnel-guard"}]}"#,
        )
        .unwrap();
        let m = l.merged(&entries());
        assert_eq!(m.plugins().len(), 2);
        assert!(!is_podgate(&m.plugins()[0]));
    }

    #[test]
    fn single_conf_conversion() {
        let l = List::from_single(
            "10-bridge.conf",
            br#"{"cniVersion":"0.4.0","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&Json::Object(l.0.clone())).unwrap(),
            r#"{"cniVersion":"0.4.0","name":"mynet","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}}]}"#
        );
        assert!(matches!(
            List::from_single("x.conf", br#"{"name":"n","plugins":[]}"#),
            Err(Error::NoType { .. })
        ));
    }

    #[test]
    fn a_conflist_that_is_not_a_json_object_with_plugin_objects_is_refused() {
        assert!(matches!(
            List::parse("f", b"{\"plugins\": [ {\"type\": "),
            Err(Error::ConfNotJson { .. })
        ));
        assert!(matches!(
            List::parse("f", b"[]"),
            Err(Error::ConfNotObject { .. })
        ));
        assert!(matches!(
            List::parse("f", br#"{"cniVersion":"1.0.0","name":"n"}"#),
            Err(Error::NoPlugins { .. })
        ));
        assert!(matches!(
            List::parse("f", br#"{"plugins":[]}"#),
            Err(Error::NoPlugins { .. })
        ));
        assert!(matches!(
            List::parse("f", br#"{"plugins":[1]}"#),
            Err(Error::PluginNotObject { index: 0, .. })
        ));
    }

    #[test]
    fn a_list_older_than_0_3_0_cannot_be_chained() {
        let old = List::parse("f", br#"{"cniVersion":"0.2.0","plugins":[{"type":"a"}]}"#).unwrap();
        assert!(matches!(
            old.check_chainable("f"),
            Err(Error::OldVersion { .. })
        ));
    }

    #[test]
    fn a_list_of_podgate_alone_has_no_primary_to_chain_after() {
        let only = List::parse(
            "f",
            br#"{"cniVersion":"1.0.0","plugins":[{"type":"podgate-router"}]}"#,
        )
        .unwrap();
        assert!(matches!(
            only.check_chainable("f"),
            Err(Error::OnlyPodgate { .. })
        ));
    }

    #[test]
    fn a_primarys_conflist_of_a_chaining_version_can_be_chained() {
        let ok = List::parse("f", CALICO.as_bytes()).unwrap();
        assert!(ok.check_chainable("f").is_ok());
    }

    #[test]
    fn a_conflist_whose_version_omits_the_patch_chains_as_libcni_reads_it() {
        let short = List::parse("f", br#"{"cniVersion":"1.0","plugins":[{"type":"a"}]}"#).unwrap();
        assert!(short.check_chainable("f").is_ok());
        let none = List::parse("f", br#"{"plugins":[{"type":"a"}]}"#).unwrap();
        assert!(matches!(
            none.check_chainable("f"),
            Err(Error::OldVersion { .. })
        ));
    }

    #[test]
    fn podgate_entries_come_as_an_object_a_list_or_an_array_of_podgate_plugins() {
        assert_eq!(
            parse_entries(br#"{"type":"podgate-router"}"#)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            parse_entries(
                br#"{"plugins":[{"type":"podgate-router"},{"type":"podgate-tunnel-guard"}]}"#
            )
            .unwrap()
            .len(),
            2
        );
    }

    #[test]
    fn entries_that_are_empty_not_podgates_typeless_or_not_json_are_refused() {
        assert!(matches!(
            parse_entries(br#"[{"type":"portmap"}]"#),
            Err(Error::EntryNotPodgate { .. })
        ));
        assert!(matches!(parse_entries(b"[]"), Err(Error::EntriesEmpty)));
        assert!(matches!(
            parse_entries(b"[3]"),
            Err(Error::EntryNoType { .. })
        ));
        assert!(matches!(
            parse_entries(b"nope"),
            Err(Error::EntriesNotJson(_))
        ));
        assert!(matches!(parse_entries(b"{}"), Err(Error::EntriesShape)));
    }
}
