//! A filtering CRI proxy: serves the CRI's gRPC (HTTP/2) on a unix socket
//! and forwards to the runtime, unchanged, only the calls whose method is
//! in its allowlist; any other call is answered `PERMISSION_DENIED`
//! without reaching the runtime.
//!
//! Whoever can connect to a runtime's CRI socket can ask it for a
//! privileged container with the node's `/` mounted: the socket makes its
//! holder node-root. The node agent needs the runtime only to read
//! (which chain it loaded, which sandboxes run, their netns and
//! addresses) and, with `--repair-unguarded`, to stop sandboxes; so the
//! DaemonSet gives the socket to a container without capabilities that
//! runs this proxy, and the agent only the proxy's socket.
//!
//! The gRPC method is the request's `:path`, which is all the proxy reads:
//! it never decodes a message, so what it forwards is what the runtime
//! would have received directly. One upstream connection per request (the
//! agent makes a few per collection).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The calls podgate's CRI client makes to read ([`crate::status`],
/// [`crate::sandbox`]).
pub const READS: [&str; 4] = [
    "/runtime.v1.RuntimeService/Version",
    "/runtime.v1.RuntimeService/Status",
    "/runtime.v1.RuntimeService/ListPodSandbox",
    "/runtime.v1.RuntimeService/PodSandboxStatus",
];
/// The one write it makes: `--repair-unguarded` stopping a sandbox.
pub const STOP_SANDBOX: &str = "/runtime.v1.RuntimeService/StopPodSandbox";

/// gRPC's `PERMISSION_DENIED`.
const GRPC_PERMISSION_DENIED: &str = "7";
/// gRPC's `UNAVAILABLE`.
const GRPC_UNAVAILABLE: &str = "14";
/// Bound on one forwarded call (the runtime's answer included).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls in flight on one connection from the agent.
const MAX_STREAMS: u32 = 16;

type Body = BoxBody<Bytes, hyper::Error>;

/// What the proxy forwards, and to which runtime.
#[derive(Debug, Clone)]
pub struct Filter {
    /// The runtime's socket; None: crictl's defaults, the first whose
    /// socket exists, looked up for every call (a runtime restarting
    /// makes its socket anew).
    pub upstream: Option<PathBuf>,
    /// The gRPC methods (`/package.Service/Method`) forwarded.
    pub allowed: Vec<&'static str>,
}

/// What happened to one call, for the caller's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Forwarded(String),
    Denied(String),
    /// Forwarding failed (no runtime, connection refused, timeout).
    Failed {
        method: String,
        why: String,
    },
}

/// Serve `listener` until `stop` resolves; `event` hears about every call.
pub async fn serve(
    listener: tokio::net::UnixListener,
    filter: Filter,
    event: impl Fn(Event) + Send + Sync + 'static,
    stop: impl Future<Output = ()>,
) {
    let filter = Arc::new(filter);
    let event = Arc::new(event);
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    event(Event::Failed { method: String::new(), why: format!("accept: {e}") });
                    continue;
                }
            },
        };
        let (filter, event) = (Arc::clone(&filter), Arc::clone(&event));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (filter, event) = (Arc::clone(&filter), Arc::clone(&event));
                async move { Ok::<_, std::convert::Infallible>(call(&filter, &*event, req).await) }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(MAX_STREAMS)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A gRPC answer with no message: `grpc-status` in the headers
/// ("Trailers-Only").
fn grpc_error(status: &'static str, msg: &str) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    let h = r.headers_mut();
    h.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    h.insert(
        "grpc-status",
        hyper::header::HeaderValue::from_static(status),
    );
    // grpc-message: printable ASCII as is, anything else percent-encoded.
    let encoded: String = msg
        .bytes()
        .map(|b| match b {
            0x20..=0x7e if b != b'%' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    if let Ok(v) = hyper::header::HeaderValue::from_str(&encoded) {
        h.insert("grpc-message", v);
    }
    r
}

async fn call(
    filter: &Filter,
    event: &(dyn Fn(Event) + Send + Sync),
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.uri().path().to_string();
    if !filter.allowed.iter().any(|m| *m == method) {
        event(Event::Denied(method.clone()));
        return grpc_error(
            GRPC_PERMISSION_DENIED,
            &format!("podgate's CRI proxy does not forward {method}"),
        );
    }
    match tokio::time::timeout(CALL_TIMEOUT, forward(filter, req)).await {
        Ok(Ok(resp)) => {
            event(Event::Forwarded(method));
            resp
        }
        Ok(Err(why)) => {
            event(Event::Failed {
                method: method.clone(),
                why: why.clone(),
            });
            grpc_error(GRPC_UNAVAILABLE, &why)
        }
        Err(_) => {
            let why = format!("no answer within {}s", CALL_TIMEOUT.as_secs());
            event(Event::Failed {
                method,
                why: why.clone(),
            });
            grpc_error(GRPC_UNAVAILABLE, &why)
        }
    }
}

/// The runtime's socket for this call.
fn upstream(filter: &Filter) -> Result<PathBuf, String> {
    if let Some(p) = &filter.upstream {
        return Ok(p.clone());
    }
    crate::DEFAULT_ENDPOINTS
        .iter()
        .filter_map(|e| crate::socket_path(e).ok())
        .find(|p| p.exists())
        .ok_or_else(|| "no CRI runtime socket found".to_string())
}

async fn forward(filter: &Filter, req: Request<Incoming>) -> Result<Response<Body>, String> {
    let path = upstream(filter)?;
    let stream = tokio::net::UnixStream::connect(&path)
        .await
        .map_err(|e| format!("connecting to {}: {e}", path.display()))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 to {}: {e}", path.display()))?;
    tokio::spawn(conn);
    // The runtime sees an absolute URI, as from its own clients (the
    // authority is a placeholder: the connection is the socket).
    let (mut parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    parts.uri = format!("http://cri.invalid{pq}")
        .parse()
        .map_err(|e| format!("request path: {e}"))?;
    let resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| format!("forwarding to {}: {e}", path.display()))?;
    Ok(resp.map(|b| b.boxed()))
}
