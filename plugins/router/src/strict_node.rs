//! `node/strict.json` in the state dir: what the node looked like before
//! the first strict pod, restored after the last. Written before the
//! node-wide settings change (write-ahead), like the attachment records,
//! and unlike them fsynced: an empty file after a power cut would stop
//! every strict ADD (it cannot be read), while an attachment record that
//! cannot be read describes only its own pod (see the router README,
//! unreadable records).

use podgate_kit::netns::NsIdentity;
use podgate_kit::state::{StateStore, MAX_RECORD};
use podgate_kit::Error;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the node looked like before the first strict pod, restored after the
/// last (`node/strict.json` in the state dir). Written before the node-wide
/// settings change (write-ahead), like the attachment records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeShared {
    /// [`VERSION`] (1 in earlier files); absent in files written before
    /// the format was versioned.
    #[serde(default)]
    pub version: u64,
    /// Boot and node netns it was written in: from another one, it
    /// describes nothing that still exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_netns_id: Option<NsIdentity>,
    /// The IPv4 local-table rule was moved from priority 0 to 1000.
    pub local_moved: bool,
    /// The IPv6 one (version 2: a strict pod with IPv6 addresses).
    #[serde(default)]
    pub local_moved6: bool,
    pub sysctl_previous: BTreeMap<String, String>,
    /// The values podgate wrote: a sysctl is put back only while it holds one.
    #[serde(default)]
    pub sysctl_written: BTreeMap<String, String>,
}

/// The format this binary writes; it reads every earlier one (fields are
/// only added: 2 added `localMoved6`).
pub const VERSION: u64 = 2;

impl NodeShared {
    /// Was the local rule of this family moved?
    pub fn moved(&self, v6: bool) -> bool {
        if v6 {
            self.local_moved6
        } else {
            self.local_moved
        }
    }

    pub fn set_moved(&mut self, v6: bool) {
        if v6 {
            self.local_moved6 = true;
        } else {
            self.local_moved = true;
        }
    }

    pub fn describes_this_node(&self, boot_id: Option<&str>, node: Option<NsIdentity>) -> bool {
        let same_boot = match (self.boot_id.as_deref(), boot_id) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let same_ns = match (self.node_netns_id, node) {
            (Some(a), Some(b)) => a.same_as(&b),
            _ => true,
        };
        same_boot && same_ns
    }
}

const SHARED_KEY: &str = "strict.json";
/// The state dir's subdirectory holding the node-wide strict settings.
pub const DIR: &str = "node";

pub fn read_shared(store: &StateStore) -> Result<Option<NodeShared>, Error> {
    let Some(node) = store.sub(DIR)? else {
        return Ok(None);
    };
    let Some(b) = node.read_named(SHARED_KEY, MAX_RECORD)? else {
        return Ok(None);
    };
    serde_json::from_slice(&b)
        .map(Some)
        .map_err(|e| Error::StateCorrupt {
            path: node.dir().join(SHARED_KEY),
            msg: e.to_string(),
        })
}

pub fn write_shared(store: &StateStore, s: &NodeShared) -> Result<(), Error> {
    store.create_sub(DIR)?.write_named_durable(SHARED_KEY, s)
}

/// Temp files a killed writer of `node/strict.json` left (lock held).
pub fn sweep_temp(store: &StateStore) -> Result<usize, Error> {
    match store.sub(DIR)? {
        Some(node) => node.sweep_temp(),
        None => Ok(0),
    }
}

pub fn remove_shared(store: &StateStore) {
    if let Ok(Some(node)) = store.sub(DIR) {
        let _ = node.remove_named(SHARED_KEY);
    }
    let _ = store.handle().remove_dir(DIR);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_settings_of_another_boot_or_netns_describe_nothing_here() {
        let id = NsIdentity {
            dev: 4,
            ino: 100,
            cookie: Some(7),
        };
        let s = NodeShared {
            version: 1,
            boot_id: Some("b1".into()),
            node_netns_id: Some(id),
            ..Default::default()
        };
        assert!(s.describes_this_node(Some("b1"), Some(id)));
        assert!(!s.describes_this_node(Some("b2"), Some(id)));
        let other = NsIdentity { ino: 101, ..id };
        assert!(!s.describes_this_node(Some("b1"), Some(other)));
        // Unknown on either side never discards the file.
        assert!(s.describes_this_node(None, None));
        let old: NodeShared = serde_json::from_str(
            r#"{"localMoved": true, "sysctlPrevious": {"net.ipv4.tcp_early_demux": "1"}}"#,
        )
        .unwrap();
        assert_eq!(old.version, 0);
        assert!(old.describes_this_node(Some("b1"), Some(id)));
        assert!(old.sysctl_written.is_empty());
        assert!(old.moved(false) && !old.moved(true));
    }
}
