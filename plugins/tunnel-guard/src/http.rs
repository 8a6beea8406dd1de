//! HTTP/1.1 GET over a unix stream, as the agent's Go `net/http` servers
//! speak it (`pkg/ipsec/agent.go` status socket, `protection_endpoint.go`
//! protection socket): one request per connection, bounded by the deadline
//! and [`io::MAX_RESPONSE`].

use crate::io::{self, Deadline, IoError, Malformed};
use std::os::unix::net::UnixStream;

/// `GET <target>` on a connected stream: (status, body).
pub fn get(mut s: UnixStream, target: &str, dl: &Deadline) -> Result<(u16, Vec<u8>), IoError> {
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: podgate-tunnel-guard\r\n\
         Accept: */*\r\nConnection: close\r\n\r\n"
    );
    io::write_all(&mut s, req.as_bytes(), dl)?;
    io::read_until(&mut s, dl, io::MAX_RESPONSE, |buf, eof| {
        Ok(parse_response(buf, eof)?)
    })
}

/// A complete HTTP/1.x response in `buf` as (status, body); Ok(None) when more
/// bytes are needed; Err when it can never be valid.
pub fn parse_response(buf: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, Malformed> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        if eof && !buf.is_empty() {
            return Err(Malformed::NoHeaderEnd);
        }
        return if buf.len() > 16 && !buf.starts_with(b"HTTP/1.") {
            Err(Malformed::NotHttp)
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(buf.get(..head_end).unwrap_or_default())
        .map_err(|_| Malformed::HeadersNotUtf8)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (proto, code) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if !proto.starts_with("HTTP/1.") {
        return Err(Malformed::StatusLine(truncate(status_line)));
    }
    let code: u16 = code
        .parse()
        .ok()
        .filter(|c| (100..=599).contains(c))
        .ok_or_else(|| Malformed::StatusLine(truncate(status_line)))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            return Err(Malformed::HeaderLine(truncate(line)));
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = Some(
                v.parse::<usize>()
                    .map_err(|_| Malformed::ContentLength(v.to_string()))?,
            );
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = buf.get(head_end + 4..).unwrap_or_default();
    if chunked {
        return match dechunk(body)? {
            Some(b) => Ok(Some((code, b))),
            None if eof => Err(Malformed::TruncatedChunks),
            None => Ok(None),
        };
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some((code, body.get(..n).unwrap_or_default().to_vec()))),
        Some(_) if eof => Err(Malformed::ShortBody),
        Some(_) => Ok(None),
        None if eof => Ok(Some((code, body.to_vec()))),
        None => Ok(None),
    }
}

/// Decode a chunked body: Some once the last chunk arrived.
fn dechunk(mut b: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = find(b, b"\r\n") else {
            return Ok(None);
        };
        let size_line = std::str::from_utf8(b.get(..eol).unwrap_or_default()).unwrap_or("?");
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| Malformed::ChunkSize(truncate(size_line)))?;
        let data_start = eol + 2;
        if size == 0 {
            return Ok(Some(out));
        }
        let Some(data) = b.get(data_start..data_start.saturating_add(size)) else {
            return Ok(None);
        };
        out.extend_from_slice(data);
        b = match b.get(data_start + size..) {
            Some(rest) if rest.len() < 2 => return Ok(None),
            Some(rest) if rest.starts_with(b"\r\n") => rest.get(2..).unwrap_or_default(),
            _ => return Err(Malformed::ChunkEnd),
        };
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn truncate(s: &str) -> String {
    s.chars().take(60).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn content_length_and_close() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA";
        assert_eq!(
            parse_response(r, false).unwrap(),
            Some((200, b"ok".to_vec()))
        );
        assert_eq!(parse_response(&r[..30], false).unwrap(), None);
        let r = b"HTTP/1.0 503 Service Unavailable\r\nServer: x\r\n\r\nnot ready";
        assert_eq!(parse_response(r, false).unwrap(), None);
        assert_eq!(
            parse_response(r, true).unwrap(),
            Some((503, b"not ready".to_vec()))
        );
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n";

    #[test]
    fn a_chunked_body_is_joined_and_chunk_extensions_ignored() {
        assert_eq!(
            parse_response(CHUNKED, false).unwrap(),
            Some((200, b"{\"a\":1}".to_vec()))
        );
    }

    #[test]
    fn a_chunked_body_cut_short_is_incomplete_until_the_stream_ends() {
        for n in 45..CHUNKED.len() - 5 {
            assert_eq!(parse_response(&CHUNKED[..n], false).unwrap(), None, "{n}");
        }
        assert!(parse_response(&CHUNKED[..50], true).is_err());
    }

    #[test]
    fn a_chunk_size_that_is_not_hex_is_an_error() {
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(parse_response(bad, false).is_err());
    }

    #[test]
    fn a_reply_that_is_not_http_is_an_error() {
        assert!(parse_response(b"\x00\x01garbage garbage garbage", false).is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 abc OK\r\n\r\n", true).is_err());
    }

    #[test]
    fn a_bad_or_unmet_content_length_is_an_error() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", true).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", true).is_err());
    }

    #[test]
    fn a_stream_that_ends_inside_the_head_is_an_error_and_nothing_yet_is_incomplete() {
        assert!(parse_response(b"HTTP/1.1 200", true).is_err());
        assert_eq!(parse_response(b"", false).unwrap(), None);
    }
}
