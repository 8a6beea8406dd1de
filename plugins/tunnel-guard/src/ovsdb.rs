//! OVSDB (RFC 7047 JSON-RPC over a unix socket): the node's chassis
//! (`external_ids:system-id`) and protection mark
//! (`external_ids:ovn-ipsec-protection-mark`) from the `Open_vSwitch` table.

use crate::io::{self, Deadline, IoError};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;

pub const SYSTEM_ID: &str = "system-id";
pub const PROTECTION_MARK: &str = "ovn-ipsec-protection-mark";

#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    #[error("ovsdb: {0}")]
    Io(#[from] IoError),
    #[error("ovsdb: {0}")]
    Answer(String),
}

/// The `Open_vSwitch` row's external_ids the guard cares about (raw text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OvsInfo {
    pub system_id: Option<String>,
    pub protection_mark: Option<String>,
}

const REQUEST_ID: &str = "podgate-tunnel-guard";

pub fn request() -> Value {
    json!({
        "id": REQUEST_ID,
        "method": "transact",
        "params": ["Open_vSwitch", {
            "op": "select", "table": "Open_vSwitch", "where": [], "columns": ["external_ids"]
        }]
    })
}

pub fn query(socket: &Path, dl: &Deadline) -> Result<OvsInfo, OvsdbError> {
    let mut s = io::connect(socket, dl)?;
    io::write_all(&mut s, request().to_string().as_bytes(), dl)?;
    let reply = io::read_until(&mut s, dl, |buf, _eof| {
        find_reply(buf).map_err(IoError::Protocol)
    })?;
    parse_reply(&reply)
}

/// The JSON-RPC stream has no framing: parse whole values as they complete and
/// return our reply (ignoring anything else, such as an `echo` request).
pub fn find_reply(buf: &[u8]) -> Result<Option<Value>, String> {
    for v in serde_json::Deserializer::from_slice(buf).into_iter::<Value>() {
        match v {
            Ok(v) if v.get("id") == Some(&Value::String(REQUEST_ID.into())) => return Ok(Some(v)),
            Ok(_) => {}
            Err(e) if e.is_eof() => return Ok(None),
            Err(e) => return Err(format!("not JSON-RPC: {e}")),
        }
    }
    Ok(None)
}

pub fn parse_reply(reply: &Value) -> Result<OvsInfo, OvsdbError> {
    let answer = |m: &str| OvsdbError::Answer(m.to_string());
    if let Some(e) = reply.get("error").filter(|e| !e.is_null()) {
        return Err(OvsdbError::Answer(format!("transact failed: {e}")));
    }
    let op = reply
        .get("result")
        .and_then(|r| r.get(0))
        .ok_or_else(|| answer("transact reply without result"))?;
    if let Some(e) = op.get("error").filter(|e| !e.is_null()) {
        return Err(OvsdbError::Answer(format!("select failed: {e}")));
    }
    let rows = op
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(|| answer("select reply without rows"))?;
    let row = match rows.as_slice() {
        [row] => row,
        [] => return Err(answer("Open_vSwitch table has no row")),
        _ => return Err(answer("Open_vSwitch table has more than one row")),
    };
    let ids =
        ovsdb_map(row.get("external_ids")).ok_or_else(|| answer("external_ids is not a map"))?;
    let get = |k: &str| ids.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    Ok(OvsInfo {
        system_id: get(SYSTEM_ID),
        protection_mark: get(PROTECTION_MARK),
    })
}

/// An OVSDB `["map", [[k, v], ...]]` of strings.
fn ovsdb_map(v: Option<&Value>) -> Option<Vec<(String, String)>> {
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

    fn reply(ids: Value) -> Value {
        json!({"id": REQUEST_ID, "result": [{"rows": [{"external_ids": ids}]}], "error": null})
    }

    #[test]
    fn reads_system_id_and_mark() {
        let r = reply(json!([
            "map",
            [
                ["hostname", "n1"],
                ["system-id", "chassis-a"],
                ["ovn-ipsec-protection-mark", "759815"]
            ]
        ]));
        let info = parse_reply(&r).unwrap();
        assert_eq!(info.system_id.as_deref(), Some("chassis-a"));
        assert_eq!(info.protection_mark.as_deref(), Some("759815"));
        let empty = parse_reply(&reply(json!(["map", []]))).unwrap();
        assert_eq!(empty, OvsInfo::default());
    }

    #[test]
    fn bad_replies() {
        assert!(parse_reply(
            &json!({"id": REQUEST_ID, "error": "unknown database", "result": null})
        )
        .is_err());
        assert!(parse_reply(&json!({"id": REQUEST_ID, "result": [{"error": "x"}]})).is_err());
        assert!(parse_reply(&json!({"id": REQUEST_ID, "result": [{"rows": []}]})).is_err());
        assert!(parse_reply(&reply(json!(["set", []]))).is_err());
        assert!(parse_reply(&reply(json!(["map", [["a", 1]]]))).is_err());
    }

    #[test]
    fn stream_framing() {
        let full = reply(json!(["map", []])).to_string();
        assert_eq!(
            find_reply(full.as_bytes()).unwrap(),
            Some(reply(json!(["map", []])))
        );
        assert_eq!(find_reply(&full.as_bytes()[..10]).unwrap(), None);
        let echo = format!("{{\"id\":\"echo\",\"method\":\"echo\",\"params\":[]}}{full}");
        assert!(find_reply(echo.as_bytes()).unwrap().is_some());
        assert!(find_reply(b"}garbage").is_err());
    }
}
