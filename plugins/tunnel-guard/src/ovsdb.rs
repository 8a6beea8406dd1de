//! OVSDB (RFC 7047 JSON-RPC over a unix socket): one read-only transaction
//! selecting what the agent's own readback reads (`pkg/ovs`
//! `ipsecProtectionSnapshot`): the `Open_vSwitch` row (`_uuid`,
//! `external_ids`), every `Port` (`interfaces`, `external_ids`) and every
//! `Interface` (`type`, `options`).

use crate::io::{self, Deadline, IoError, Malformed};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

pub const SYSTEM_ID: &str = "system-id";
/// The agent's lease in `Open_vSwitch` `external_ids` (`pkg/ovs`
/// `IPsecProtection.externalIDs`); any of them set means protection is required
/// (`pkg/ipsec/preparation.go` `protectionRequired`).
pub const NODE_UID: &str = "ovn-ipsec-protection-node-uid";
pub const LEASE: &str = "ovn-ipsec-protection-lease";
pub const PROTECTION_MARK: &str = "ovn-ipsec-protection-mark";
pub const REQID: &str = "ovn-ipsec-protection-reqid";
pub const LEASE_KEYS: [&str; 4] = [NODE_UID, LEASE, PROTECTION_MARK, REQID];
/// A Port with this `external_ids` key is an OVN tunnel to that chassis.
pub const CHASSIS_ID: &str = "ovn-chassis-id";
pub const EVPN_TUNNEL: &str = "ovn-evpn-tunnel";
/// Interface `options` the guard reads: the agent's marks and what decides
/// whether they are required (`remote_name`) or the tunnel is supported.
const OPTIONS: [&str; 6] = [
    "remote_ip",
    "remote_name",
    "dst_port",
    "egress_pkt_mark",
    "ipsec_mark_out",
    "ipsec_reqid",
];

#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    #[error("ovsdb: {0}")]
    Io(#[from] IoError),
    #[error("ovsdb: {0}")]
    Answer(String),
}

/// One OVN tunnel: a Port with `external_ids:ovn-chassis-id` (or an EVPN
/// tunnel) and its interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelPort {
    pub port: String,
    pub chassis: String,
    pub evpn: bool,
    pub interfaces: Vec<TunnelInterface>,
    /// Interface UUIDs of the port that have no Interface row.
    pub dangling: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelInterface {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Only the keys in `OPTIONS`.
    pub options: BTreeMap<String, String>,
}

impl TunnelInterface {
    pub fn option(&self, k: &str) -> &str {
        self.options.get(k).map_or("", String::as_str)
    }
}

/// What the guard reads from OVSDB. The lease text is not secret (it is
/// published for ovn-controller) but is not needed in reports either.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OvsInfo {
    /// The `Open_vSwitch` row's `_uuid`: a rebuilt database has a new one.
    pub uuid: String,
    pub system_id: Option<String>,
    pub node_uid: Option<String>,
    #[serde(skip)]
    pub lease: Option<String>,
    pub protection_mark: Option<String>,
    pub reqid: Option<String>,
    /// Not serialized (thousands on a large cluster); see [`OvsInfo::tunnel_count`].
    #[serde(skip)]
    pub tunnels: Vec<TunnelPort>,
    pub tunnel_count: usize,
}

impl OvsInfo {
    /// The lease keys that are set (non-empty), in [`LEASE_KEYS`] order.
    pub fn lease_keys_set(&self) -> Vec<&'static str> {
        LEASE_KEYS
            .into_iter()
            .zip([
                &self.node_uid,
                &self.lease,
                &self.protection_mark,
                &self.reqid,
            ])
            .filter(|(_, v)| v.as_deref().is_some_and(|v| !v.is_empty()))
            .map(|(k, _)| k)
            .collect()
    }
}

const REQUEST_ID: &str = "podgate-tunnel-guard";

pub fn request() -> Value {
    let select = |table: &str, columns: &[&str]| json!({"op": "select", "table": table, "where": [], "columns": columns});
    json!({
        "id": REQUEST_ID,
        "method": "transact",
        "params": ["Open_vSwitch",
            select("Open_vSwitch", &["_uuid", "external_ids"]),
            select("Port", &["_uuid", "name", "interfaces", "external_ids"]),
            select("Interface", &["_uuid", "name", "type", "options"])]
    })
}

pub fn query(socket: &Path, dl: &Deadline) -> Result<OvsInfo, OvsdbError> {
    let mut s = io::connect(socket, dl)?;
    io::write_all(&mut s, request().to_string().as_bytes(), dl)?;
    let mut framer = Framer::default();
    let reply = io::read_until(&mut s, dl, io::MAX_OVSDB_REPLY, |buf, _eof| {
        Ok(framer.reply(buf)?)
    })?;
    parse_reply(&reply)
}

/// The JSON-RPC stream has no framing: parse whole values as they complete and
/// return our reply (ignoring anything else, such as an `echo` request).
pub fn find_reply(buf: &[u8]) -> Result<Option<Value>, Malformed> {
    Framer::default().reply(buf)
}

/// Finds where top-level JSON values end in a growing buffer, scanning each
/// byte once (brackets outside strings), so a reply of many megabytes read in
/// small pieces is parsed once, not once per piece.
#[derive(Debug, Default)]
struct Framer {
    /// Bytes of the buffer already scanned.
    scanned: usize,
    /// Start of the value being scanned.
    start: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Framer {
    /// Our reply, once complete in `buf` (the same buffer, grown, on every call).
    fn reply(&mut self, buf: &[u8]) -> Result<Option<Value>, Malformed> {
        while let Some(end) = self.next_end(buf) {
            let value = buf.get(self.start..end).unwrap_or_default();
            self.start = end;
            let v: Value = serde_json::from_slice(value)?;
            if v.get("id") == Some(&Value::String(REQUEST_ID.into())) {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// The end of the next complete top-level value, scanning from `scanned`.
    fn next_end(&mut self, buf: &[u8]) -> Option<usize> {
        while let Some(&b) = buf.get(self.scanned) {
            self.scanned += 1;
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    if self.depth == 0 {
                        // Whitespace between values is skipped.
                        self.start = self.scanned - 1;
                    }
                    self.depth += 1;
                }
                b'}' | b']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(self.scanned);
                    }
                }
                b' ' | b'\t' | b'\r' | b'\n' if self.depth == 0 => {}
                // A scalar or a stray closer at top level is not JSON-RPC:
                // hand it to the parser, which names the error.
                _ if self.depth == 0 => {
                    self.start = self.scanned - 1;
                    return Some(buf.len().min(self.scanned + 64));
                }
                _ => {}
            }
        }
        None
    }
}

fn answer(m: impl Into<String>) -> OvsdbError {
    OvsdbError::Answer(m.into())
}

fn rows<'v>(result: &'v [Value], i: usize, table: &str) -> Result<&'v [Value], OvsdbError> {
    let op = result
        .get(i)
        .ok_or_else(|| answer(format!("transact reply lacks the {table} select")))?;
    if let Some(e) = op.get("error").filter(|e| !e.is_null()) {
        return Err(answer(format!("select {table} failed: {e}")));
    }
    op.get("rows")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| answer(format!("select {table} reply without rows")))
}

fn text<'v>(row: &'v Value, col: &str) -> &'v str {
    row.get(col).and_then(Value::as_str).unwrap_or("")
}

/// `["uuid", "<uuid>"]`.
fn uuid(v: Option<&Value>) -> Option<&str> {
    match v?.as_array()?.as_slice() {
        [tag, Value::String(u)] if tag == "uuid" => Some(u),
        _ => None,
    }
}

/// A set of UUIDs: one atom, or `["set", [atoms]]`.
fn uuid_set(v: Option<&Value>) -> Option<Vec<String>> {
    let v = v?;
    if let Some(u) = uuid(Some(v)) {
        return Some(vec![u.to_string()]);
    }
    match v.as_array()?.as_slice() {
        [tag, Value::Array(items)] if tag == "set" => items
            .iter()
            .map(|i| uuid(Some(i)).map(str::to_string))
            .collect(),
        _ => None,
    }
}

pub fn parse_reply(reply: &Value) -> Result<OvsInfo, OvsdbError> {
    if let Some(e) = reply.get("error").filter(|e| !e.is_null()) {
        return Err(answer(format!("transact failed: {e}")));
    }
    let result = reply
        .get("result")
        .and_then(Value::as_array)
        .ok_or_else(|| answer("transact reply without result"))?;
    let root = match rows(result, 0, "Open_vSwitch")? {
        [row] => row,
        [] => return Err(answer("Open_vSwitch table has no row")),
        _ => return Err(answer("Open_vSwitch table has more than one row")),
    };
    let root_uuid = uuid(root.get("_uuid"))
        .filter(|u| is_uuid(u))
        .ok_or_else(|| answer("Open_vSwitch row without a valid _uuid"))?;
    let ids = ovsdb_map(root.get("external_ids"))
        .ok_or_else(|| answer("Open_vSwitch external_ids is not a string map"))?;
    let get = |k: &str| ids.get(k).cloned();

    let mut ifaces: BTreeMap<String, TunnelInterface> = BTreeMap::new();
    for row in rows(result, 2, "Interface")? {
        let Some(id) = uuid(row.get("_uuid")) else {
            return Err(answer("Interface row without _uuid"));
        };
        let options = ovsdb_map(row.get("options")).ok_or_else(|| {
            answer(format!(
                "Interface {} options is not a string map",
                text(row, "name")
            ))
        })?;
        ifaces.insert(
            id.to_string(),
            TunnelInterface {
                name: text(row, "name").to_string(),
                kind: text(row, "type").to_string(),
                options: options
                    .into_iter()
                    .filter(|(k, _)| OPTIONS.contains(&k.as_str()))
                    .collect(),
            },
        );
    }
    let mut tunnels = Vec::new();
    for row in rows(result, 1, "Port")? {
        let name = text(row, "name");
        let ext = ovsdb_map(row.get("external_ids"))
            .ok_or_else(|| answer(format!("Port {name} external_ids is not a string map")))?;
        let chassis = ext.get(CHASSIS_ID).cloned().unwrap_or_default();
        let evpn = ext.get(EVPN_TUNNEL).is_some_and(|v| v == "true");
        if chassis.is_empty() && !evpn {
            continue;
        }
        let members = uuid_set(row.get("interfaces"))
            .ok_or_else(|| answer(format!("Port {name} interfaces is not a UUID set")))?;
        let found: Vec<TunnelInterface> = members
            .iter()
            .filter_map(|u| ifaces.get(u).cloned())
            .collect();
        tunnels.push(TunnelPort {
            port: name.to_string(),
            chassis,
            evpn,
            dangling: members.len() - found.len(),
            interfaces: found,
        });
    }
    Ok(OvsInfo {
        uuid: root_uuid.to_string(),
        system_id: get(SYSTEM_ID),
        node_uid: get(NODE_UID),
        lease: get(LEASE),
        protection_mark: get(PROTECTION_MARK),
        reqid: get(REQID),
        tunnel_count: tunnels.len(),
        tunnels,
    })
}

/// RFC 4122 text form, as OVSDB prints `_uuid`.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// An OVSDB `["map", [[k, v], ...]]` of strings.
fn ovsdb_map(v: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let [tag, pairs] = v?.as_array()?.as_slice() else {
        return None;
    };
    if tag != "map" {
        return None;
    }
    pairs
        .as_array()?
        .iter()
        .map(|p| match p.as_array()?.as_slice() {
            [Value::String(k), Value::String(v)] => Some((k.clone(), v.clone())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const ROOT: &str = "0d9a3c5e-1b2f-4c6d-8e7f-9a0b1c2d3e4f";

    fn reply(ids: Value, ports: Value, ifaces: Value) -> Value {
        json!({"id": REQUEST_ID, "error": null, "result": [
            {"rows": [{"_uuid": ["uuid", ROOT], "external_ids": ids}]},
            {"rows": ports}, {"rows": ifaces}]})
    }

    #[test]
    fn reads_the_root_lease_and_tunnels() {
        let r = reply(
            json!([
                "map",
                [
                    ["system-id", "chassis-a"],
                    [PROTECTION_MARK, "759815"],
                    [REQID, "77"],
                    [NODE_UID, "n"],
                    [LEASE, "L"]
                ]
            ]),
            json!([
                {"_uuid": ["uuid", "p1"], "name": "ovn-abc-0", "interfaces": ["uuid", "i1"],
                 "external_ids": ["map", [["ovn-chassis-id", "chassis-b"]]]},
                {"_uuid": ["uuid", "p2"], "name": "br-int", "interfaces": ["set", [["uuid", "i2"]]],
                 "external_ids": ["map", []]}
            ]),
            json!([
                {"_uuid": ["uuid", "i1"], "name": "ovn-abc-0", "type": "geneve",
                 "options": ["map", [["remote_ip", "10.0.0.2"], ["egress_pkt_mark", "759815"],
                                     ["csum", "true"]]]},
                {"_uuid": ["uuid", "i2"], "name": "br-int", "type": "internal", "options": ["map", []]}
            ]),
        );
        let info = parse_reply(&r).unwrap();
        assert_eq!(info.uuid, ROOT);
        assert_eq!(info.system_id.as_deref(), Some("chassis-a"));
        assert_eq!(info.lease_keys_set(), LEASE_KEYS);
        assert_eq!(info.tunnels.len(), 1);
        let t = &info.tunnels[0];
        assert_eq!(
            (t.port.as_str(), t.chassis.as_str(), t.dangling),
            ("ovn-abc-0", "chassis-b", 0)
        );
        assert_eq!(t.interfaces[0].option("egress_pkt_mark"), "759815");
        assert_eq!(t.interfaces[0].option("csum"), "");
        // The lease text stays out of reports.
        assert!(!serde_json::to_string(&info).unwrap().contains("\"L\""));
    }

    #[test]
    fn an_ovsdb_reply_of_the_wrong_shape_is_an_error() {
        let empty = || json!(["map", []]);
        assert!(parse_reply(
            &json!({"id": REQUEST_ID, "error": "unknown database", "result": null})
        )
        .is_err());
        assert!(parse_reply(&json!({"id": REQUEST_ID, "result": [{"error": "x"}]})).is_err());
        assert!(parse_reply(
            &json!({"id": REQUEST_ID, "result": [{"rows": []}, {"rows": []}, {"rows": []}]})
        )
        .is_err());
        assert!(parse_reply(&reply(json!(["set", []]), json!([]), json!([]))).is_err());
        assert!(parse_reply(&reply(json!(["map", [["a", 1]]]), json!([]), json!([]))).is_err());
        let mut r = reply(empty(), json!([]), json!([]));
        r["result"][0]["rows"][0]["_uuid"] = json!(["uuid", "not-a-uuid"]);
        assert!(parse_reply(&r).is_err());
        let r = reply(
            empty(),
            json!([{"name": "t", "interfaces": 3,
            "external_ids": ["map", [["ovn-chassis-id", "x"]]]}]),
            json!([]),
        );
        assert!(parse_reply(&r).is_err());
        assert!(parse_reply(&reply(empty(), json!([]), json!([])))
            .unwrap()
            .lease_keys_set()
            .is_empty());
    }

    #[test]
    fn the_reply_is_found_in_the_stream_after_other_messages_and_split_anywhere() {
        let v = reply(json!(["map", []]), json!([]), json!([]));
        let full = v.to_string();
        assert_eq!(find_reply(full.as_bytes()).unwrap(), Some(v));
        assert_eq!(find_reply(&full.as_bytes()[..10]).unwrap(), None);
        let echo = format!("{{\"id\":\"echo\",\"method\":\"echo\",\"params\":[]}}{full}");
        assert!(find_reply(echo.as_bytes()).unwrap().is_some());
        assert!(find_reply(b"}garbage").is_err());
        assert!(find_reply(b"  garbage").is_err());
        // Brackets inside strings, escaped quotes, values split anywhere.
        let tricky = json!({"id": "other", "params": ["}]\"{[", "\\"]}).to_string();
        let stream = format!(
            "{tricky}
{full}"
        );
        let mut f = Framer::default();
        let bytes = stream.as_bytes();
        let mut got = None;
        for n in 1..=bytes.len() {
            if let Some(v) = f.reply(&bytes[..n]).unwrap() {
                got = Some((n, v));
                break;
            }
        }
        assert_eq!(got.map(|(n, _)| n), Some(bytes.len()));
    }

    #[test]
    fn only_a_complete_hyphenated_uuid_is_a_uuid() {
        assert!(is_uuid(ROOT));
        assert!(!is_uuid("0d9a3c5e-1b2f-4c6d-8e7f-9a0b1c2d3e4"));
        assert!(!is_uuid("0d9a3c5e_1b2f-4c6d-8e7f-9a0b1c2d3e4f"));
    }
}
