//! Take key material out of everything the report copies: PEM blocks
//! (private keys and certificates alike), values of secret-named JSON keys,
//! and `0x`-hex strings as long as an SA key (how `ip xfrm state` prints
//! them). The report never reads SAs or the agent's keys in the first place;
//! this is the second line, for what operators put into configs and logs.

use serde_json::Value;

/// Hex digits after `0x` from which a string is taken for a key (128 bits).
const KEY_HEX: usize = 32;

/// Names of JSON keys whose string values are dropped (lowercased substring).
const SECRET_NAMES: [&str; 9] = [
    "key",
    "secret",
    "password",
    "passwd",
    "token",
    "psk",
    "cert",
    "credential",
    "private",
];

fn secret_name(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    SECRET_NAMES.iter().any(|s| k.contains(s))
}

/// Text: PEM blocks and long `0x` hex.
pub fn text(s: &str) -> String {
    hex_keys(&pem(s))
}

fn pem(s: &str) -> String {
    const BEGIN: &str = "-----BEGIN ";
    const END: &str = "-----END ";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(BEGIN) {
        out.push_str(rest.get(..i).unwrap_or(""));
        let after = rest.get(i + BEGIN.len()..).unwrap_or("");
        let label: String = after.chars().take_while(|c| *c != '-').take(40).collect();
        // The block ends after the END marker's closing dashes; without an END
        // marker everything to the end of the line (or text) goes.
        let end = after.find(END).and_then(|j| {
            let tail = after.get(j + END.len()..)?;
            let close = tail.find("-----")?;
            Some(i + BEGIN.len() + j + END.len() + close + 5)
        });
        let end = end.unwrap_or_else(|| {
            rest.get(i..)
                .and_then(|r| r.find('\n'))
                .map_or(rest.len(), |n| i + n)
        });
        out.push_str(&format!("[redacted PEM {}]", label.trim()));
        rest = rest.get(end..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

fn hex_keys(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 1 < b.len() {
        let starts = b.get(i) == Some(&b'0')
            && matches!(b.get(i + 1), Some(b'x') | Some(b'X'))
            && (i == 0 || !b.get(i - 1).is_some_and(u8::is_ascii_alphanumeric));
        if starts {
            let n = b
                .get(i + 2..)
                .unwrap_or_default()
                .iter()
                .take_while(|c| c.is_ascii_hexdigit())
                .count();
            if n >= KEY_HEX {
                out.push_str(s.get(copied..i).unwrap_or(""));
                out.push_str("[redacted key]");
                i += 2 + n;
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(s.get(copied..).unwrap_or(""));
    out
}

/// JSON: string values under secret-named keys (also inside arrays) are
/// replaced; objects under such keys are descended (podgate's own `key` of
/// an attachment is an object of names); every other string is scrubbed as text.
pub fn json(v: &mut Value) {
    walk(v, false);
}

fn walk(v: &mut Value, secret: bool) {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                walk(val, secret_name(k));
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| walk(x, secret)),
        Value::String(s) if secret => *s = "[redacted]".into(),
        Value::String(s) => *s = text(s),
        _ => {}
    }
}

/// A file's bytes: JSON documents and JSON lines are scrubbed as JSON,
/// anything else as text. Non-UTF-8 content is not copied.
pub fn file(bytes: &[u8]) -> String {
    let Ok(s) = std::str::from_utf8(bytes) else {
        return format!("[{} bytes, not UTF-8 text: not copied]\n", bytes.len());
    };
    if let Ok(mut v) = serde_json::from_str::<Value>(s) {
        json(&mut v);
        return serde_json::to_string_pretty(&v).map_or_else(|_| text(s), |t| t + "\n");
    }
    lines(s)
}

/// Line by line: JSON lines as JSON, others as text.
pub fn lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for line in s.lines() {
        match serde_json::from_str::<Value>(line) {
            Ok(mut v) if v.is_object() => {
                json(&mut v);
                out.push_str(&v.to_string());
            }
            _ => out.push_str(&text(line)),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pem_blocks_go_whole() {
        let s = "a -----BEGIN PRIVATE KEY-----\nMIIEv\nQQ==\n-----END PRIVATE KEY----- b";
        assert_eq!(text(s), "a [redacted PEM PRIVATE KEY] b");
        let esc = r#"{"x":"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"}"#;
        assert_eq!(text(esc), r#"{"x":"[redacted PEM CERTIFICATE]"}"#);
        assert_eq!(
            text("-----BEGIN RSA PRIVATE KEY-----\nMII\nnext"),
            "[redacted PEM RSA PRIVATE KEY]\nMII\nnext"
        );
    }

    #[test]
    fn long_hex_keys_go_short_hex_and_ids_stay() {
        let k = "0x0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            text(&format!("enc aes {k} 128")),
            "enc aes [redacted key] 128"
        );
        assert_eq!(text("mark 0xb9807 ok"), "mark 0xb9807 ok");
        let cid = "3f9a".repeat(16);
        assert_eq!(text(&cid), cid);
    }

    #[test]
    fn secret_named_json_values_go() {
        let mut v = json!({"type": "x", "tls": {"privateKey": "abc", "certFile": "/p"},
                           "saKey": "zz", "keys": ["a"], "mark": 5, "name": "-----BEGIN X-----q-----END X-----"});
        json(&mut v);
        assert_eq!(v["tls"]["privateKey"], "[redacted]");
        assert_eq!(v["tls"]["certFile"], "[redacted]");
        assert_eq!(v["saKey"], "[redacted]");
        assert_eq!(v["keys"], json!(["[redacted]"]));
        let mut k = json!({"key": {"network": "n", "containerID": "c"}});
        json(&mut k);
        assert_eq!(k["key"]["containerID"], "c");
        assert_eq!(v["mark"], 5);
        assert_eq!(v["type"], "x");
        assert_eq!(v["name"], "[redacted PEM X]");
    }
}
