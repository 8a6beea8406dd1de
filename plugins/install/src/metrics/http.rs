//! A deliberately tiny HTTP/1.1 server: `GET /metrics` and nothing else.
//! One connection at a time, the request (line + headers) at most
//! [`MAX_REQUEST`] bytes and [`DEADLINE`] long, `Connection: close`. Anything
//! else is answered with a status and closed: 404 for other paths, 405 for
//! other methods, 400 for garbage, 431 for oversized, 408 for slow.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

pub const MAX_REQUEST: usize = 8192;
pub const DEADLINE: Duration = Duration::from_secs(2);
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serve forever; `body` renders the metrics for each scrape.
pub fn serve(listener: TcpListener, body: &(dyn Fn() -> String + Sync)) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else {
            continue; // EMFILE, a reset before accept: keep serving
        };
        let _ = handle(stream, body);
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Metrics,
    NotFound,
    BadMethod,
    Bad,
}

/// Judge the request head (everything before the blank line).
pub fn parse(head: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Bad;
    };
    let line = text.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Bad;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Request::Metrics,
        ("GET", _) => Request::NotFound,
        _ => Request::BadMethod,
    }
}

fn respond(
    s: &mut TcpStream,
    status: &str,
    extra: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

/// Close without a reset: a client whose request we stopped reading (too
/// large) would otherwise lose the answer. Bounded like the request.
fn drain_and_close(s: &mut TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 4096];
    let mut left = 16 * MAX_REQUEST;
    while left > 0 {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn handle(mut s: TcpStream, body: &(dyn Fn() -> String + Sync)) -> std::io::Result<()> {
    let res = answer(&mut s, body);
    drain_and_close(&mut s);
    res
}

fn answer(s: &mut TcpStream, body: &(dyn Fn() -> String + Sync)) -> std::io::Result<()> {
    let start = Instant::now();
    s.set_write_timeout(Some(DEADLINE))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_REQUEST {
            let text = "request too large\n";
            return respond(
                s,
                "431 Request Header Fields Too Large",
                "",
                "text/plain",
                text,
            );
        }
        let left = DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() {
            return respond(s, "408 Request Timeout", "", "text/plain", "too slow\n");
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return respond(s, "408 Request Timeout", "", "text/plain", "too slow\n");
            }
            Err(e) => return Err(e),
        }
    };
    match parse(buf.get(..head_end).unwrap_or_default()) {
        Request::Metrics => respond(s, "200 OK", "", CONTENT_TYPE, &body()),
        Request::NotFound => respond(s, "404 Not Found", "", "text/plain", "only /metrics\n"),
        Request::BadMethod => respond(
            s,
            "405 Method Not Allowed",
            "Allow: GET\r\n",
            "text/plain",
            "only GET\n",
        ),
        Request::Bad => respond(s, "400 Bad Request", "", "text/plain", "bad request\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x"), Request::Metrics);
        assert_eq!(parse(b"GET /metrics?name[]=x HTTP/1.0"), Request::Metrics);
        assert_eq!(parse(b"GET / HTTP/1.1"), Request::NotFound);
        assert_eq!(parse(b"GET /metrics/../debug HTTP/1.1"), Request::NotFound);
        assert_eq!(parse(b"POST /metrics HTTP/1.1"), Request::BadMethod);
        assert_eq!(parse(b"HEAD /metrics HTTP/1.1"), Request::BadMethod);
        assert_eq!(parse(b"GET /metrics"), Request::Bad);
        assert_eq!(parse(b"GET /metrics SPDY/3"), Request::Bad);
        assert_eq!(parse(b"\xff\xfe"), Request::Bad);
    }

    #[test]
    fn serves_and_bounds_requests() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve(l, &|| "m 1\n".to_string()));
        let ask = |req: &[u8]| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = c.write_all(req);
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            out
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nm 1\n"), "{ok}");
        assert!(ask(b"GET /x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20000));
        assert!(ask(huge.as_bytes()).starts_with("HTTP/1.1 431"));
        let t = Instant::now();
        assert!(ask(b"GET /metrics HTTP/1.1\r\n").starts_with("HTTP/1.1 408"));
        assert!(t.elapsed() < DEADLINE + Duration::from_secs(2));
    }
}
