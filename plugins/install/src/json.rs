//! A JSON value that keeps object keys in file order.
//!
//! serde_json's `Map` sorts keys unless the workspace-wide `preserve_order`
//! feature is on; rather than change every crate's maps, the installer reads
//! conflists into this small type so a rewritten primary keeps its own key
//! order (and duplicate keys resolve as Go's encoding/json, which libcni
//! uses, resolves them: the last one wins, in the first one's place).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Number;
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Obj),
}

/// Object members in file order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Obj(Vec<(String, Json)>);

impl Obj {
    pub fn new() -> Obj {
        Obj(Vec::new())
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        self.0.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Replaces the value in place, or appends the member.
    pub fn insert(&mut self, key: impl Into<String>, value: Json) {
        let key = key.into();
        match self.get_mut(&key) {
            Some(slot) => *slot = value,
            None => self.0.push((key, value)),
        }
    }

    /// Removes the member, keeping the others' order.
    pub fn remove(&mut self, key: &str) -> Option<Json> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    /// Equal as JSON values: same members, whatever their order.
    pub fn same(&self, other: &Obj) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .all(|(k, v)| other.get(k).is_some_and(|o| v.same(o)))
    }

    pub fn str_field(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Json::String(s)) => Some(s),
            _ => None,
        }
    }
}

impl Json {
    pub fn parse(text: &[u8]) -> Result<Json, serde_json::Error> {
        serde_json::from_slice(text)
    }

    pub fn as_object(&self) -> Option<&Obj> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Equal as JSON values (object member order ignored, as libcni reads it).
    pub fn same(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Array(a), Json::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
            }
            (Json::Object(a), Json::Object(b)) => a.same(b),
            (a, b) => a == b,
        }
    }

    /// Two-space indented text with a final newline, as most CNI installers write.
    pub fn to_pretty(&self) -> Result<String, serde_json::Error> {
        let mut s = serde_json::to_string_pretty(self)?;
        s.push('\n');
        Ok(s)
    }

    /// The same value as a `serde_json::Value` (key order lost), for typed parsing.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(v) => s.serialize_str(v),
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(o) => o.serialize(s),
        }
    }
}

impl Serialize for Obj {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut obj = Obj::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            obj.insert(k, v);
        }
        Ok(Json::Object(obj))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order_and_values() {
        let text = br#"{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico","mtu":0,"x":1.5,"neg":-3,"n":null,"b":true}]}"#;
        let v = Json::parse(text).unwrap();
        let compact = serde_json::to_string(&v).unwrap();
        assert_eq!(compact.as_bytes(), text);
    }

    #[test]
    fn duplicate_keys_last_wins_in_first_place() {
        let v = Json::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn same_ignores_member_order_only() {
        let a = Json::parse(br#"{"a":1,"b":[{"x":1,"y":2}]}"#).unwrap();
        let b = Json::parse(br#"{"b":[{"y":2,"x":1}],"a":1}"#).unwrap();
        let c = Json::parse(br#"{"b":[{"y":2,"x":1}],"a":2}"#).unwrap();
        let d = Json::parse(br#"{"a":1,"b":[2,1]}"#).unwrap();
        let e = Json::parse(br#"{"a":1,"b":[1,2]}"#).unwrap();
        assert!(a.same(&b) && b.same(&a));
        assert!(!a.same(&c));
        assert!(!d.same(&e));
        assert_ne!(a, b);
    }

    #[test]
    fn remove_keeps_order() {
        let Json::Object(mut o) = Json::parse(br#"{"a":1,"b":2,"c":3,"d":4}"#).unwrap() else {
            panic!("object");
        };
        o.remove("b");
        o.insert("e", Json::Null);
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"a":1,"c":3,"d":4,"e":null}"#
        );
    }
}
