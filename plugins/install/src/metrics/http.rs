//! The agent's HTTP endpoint: hyper's HTTP/1.1 server on the agent's
//! current-thread tokio runtime, `GET /metrics` and `GET /healthz` only.
//!
//! A pod on the node can reach this port, so every resource a client can
//! hold is bounded ([`LIMITS`]): at most `max_connections` open at once;
//! request heads of at most `max_header_bytes` (431 beyond) that must be
//! complete within `header_timeout` of the connection (or of the previous
//! answer on a kept-alive one), which is also the idle timeout; request
//! bodies are never read (a request announcing one gets 413 and the
//! connection is closed); and no connection lives longer than `lifetime`.
//!
//! At the cap a new connection from the peer address holding the most
//! connections is closed at once (accept and close: the cheapest answer to
//! a flood). A connection from any other peer does not wait and is not
//! refused while a connection of a peer holding the most is idle (between
//! accept and its request head, or between answers): the longest-idle one
//! is closed for it. A pod flooding the port or holding idle or
//! slow-header connections thus never closes the connection of a scraper
//! at another address; only `max_connections` answers being written at
//! once could keep a scraper out, and an answer (the last collection, a
//! few KiB) is written in one go.

use crate::logging;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub lifetime: Duration,
    /// On shutdown: how long answers in flight may take to finish.
    pub shutdown_grace: Duration,
}

pub const LIMITS: Limits = Limits {
    max_connections: 64,
    header_timeout: Duration::from_secs(5),
    max_header_bytes: 8192,
    max_headers: 32,
    lifetime: Duration::from_secs(60),
    shutdown_grace: Duration::from_secs(2),
};

/// Pending connections the kernel queues before accept.
const BACKLOG: u32 = 4096;
/// Pause after a failed accept (EMFILE, ENOBUFS) instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What the endpoint shows, published by the agent's worker.
#[derive(Debug)]
pub struct Pages {
    metrics: Mutex<Option<Bytes>>,
    last_run: Mutex<Option<Instant>>,
    /// The worker panicked (why): unhealthy for good.
    failed: Mutex<Option<String>>,
    /// `/healthz` fails once the worker has not finished a round this long.
    stalled_after: Duration,
}

impl Pages {
    pub fn new(stalled_after: Duration) -> Arc<Pages> {
        Arc::new(Pages {
            metrics: Mutex::new(None),
            last_run: Mutex::new(None),
            failed: Mutex::new(None),
            stalled_after,
        })
    }

    /// The worker died (`why`): `/healthz` fails from now on and
    /// `/metrics` shows `page` (not ready) instead of the last collection.
    pub fn fail(&self, why: &str, page: String) {
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.to_string());
        *self.metrics.lock().unwrap_or_else(PoisonError::into_inner) = Some(Bytes::from(page));
    }

    /// A new collection's exposition text; also a sign of life.
    pub fn publish(&self, text: String) {
        *self.metrics.lock().unwrap_or_else(PoisonError::into_inner) = Some(Bytes::from(text));
        self.alive();
    }

    /// The worker finished a round (collection or sweep).
    pub fn alive(&self) {
        *self.last_run.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    pub(crate) fn metrics(&self) -> Option<Bytes> {
        self.metrics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Ok while the worker's loops run; Err(why not).
    pub(crate) fn health(&self) -> Result<(), Unhealthy> {
        if let Some(why) = &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            return Err(Unhealthy::Panicked(why.clone()));
        }
        let last = *self.last_run.lock().unwrap_or_else(PoisonError::into_inner);
        match last {
            None => Err(Unhealthy::NotStarted),
            Some(t) if t.elapsed() > self.stalled_after => Err(Unhealthy::Stalled {
                secs: t.elapsed().as_secs(),
            }),
            Some(_) => Ok(()),
        }
    }
}

/// Why `/healthz` fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unhealthy {
    /// A worker round panicked (its message).
    #[error("the collection worker panicked: {0}")]
    Panicked(String),
    #[error("the first collection has not finished")]
    NotStarted,
    #[error("no collection or sweep finished for {secs}s")]
    Stalled { secs: u64 },
}

type Answer = Response<BoxBody<Bytes, Infallible>>;

fn text(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let body: Bytes = body.into();
    // Said here: the body wrapper that tracks the answer hides its length.
    let len = HeaderValue::from(body.len());
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r.headers_mut().insert(header::CONTENT_LENGTH, len);
    r
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    text(status, "text/plain; charset=utf-8", body)
}

/// The answer to one request head.
fn answer(req: &Request<Incoming>, pages: &Pages) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    if !req.body().is_end_stream() {
        let mut r = plain(StatusCode::PAYLOAD_TOO_LARGE, "no request body\n");
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => match pages.metrics() {
            Some(body) => text(StatusCode::OK, super::exposition::CONTENT_TYPE, body),
            None => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the first collection has not finished\n",
            ),
        },
        "/healthz" => match pages.health() {
            Ok(()) => plain(StatusCode::OK, "ok\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                format!("{why}\n"),
            ),
        },
        _ => plain(StatusCode::NOT_FOUND, "only /metrics and /healthz\n"),
    }
}

/// The open connections: each one's peer address and since when it is
/// idle (None while answering).
#[derive(Debug)]
struct Slots {
    cap: usize,
    open: Mutex<(u64, BTreeMap<u64, Slot>)>,
}

#[derive(Debug)]
struct Slot {
    peer: IpAddr,
    idle_since: Option<Instant>,
    close: Arc<Notify>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, BTreeMap<u64, Slot>)> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection from `peer`. At the cap, a peer holding
    /// the most connections gets no more (None: closed at once, before any
    /// work is spent on it), and any other peer's connection takes the
    /// place of the longest-idle connection of a peer holding the most.
    /// None too when every open connection is answering.
    fn admit(&self, peer: IpAddr) -> Option<(u64, Arc<Notify>)> {
        let mut g = self.lock();
        let (next, open) = &mut *g;
        if open.len() >= self.cap {
            let mut per_peer: BTreeMap<IpAddr, usize> = BTreeMap::new();
            for s in open.values() {
                *per_peer.entry(s.peer).or_default() += 1;
            }
            let most = per_peer.values().copied().max().unwrap_or(0);
            if per_peer.get(&peer).copied().unwrap_or(0) >= most {
                return None;
            }
            let (_, _, victim) = open
                .iter()
                .filter_map(|(id, s)| {
                    let held = per_peer.get(&s.peer).copied().unwrap_or(0);
                    s.idle_since.map(|t| (std::cmp::Reverse(held), t, *id))
                })
                .min()?;
            if let Some(s) = open.remove(&victim) {
                s.close.notify_one();
            }
        }
        let id = *next;
        *next += 1;
        let close = Arc::new(Notify::new());
        open.insert(
            id,
            Slot {
                peer,
                idle_since: Some(Instant::now()),
                close: Arc::clone(&close),
            },
        );
        Some((id, close))
    }

    fn set_idle(&self, id: u64, idle: bool) {
        if let Some(s) = self.lock().1.get_mut(&id) {
            s.idle_since = idle.then(Instant::now);
        }
    }

    fn release(&self, id: u64) {
        self.lock().1.remove(&id);
    }

    fn len(&self) -> usize {
        self.lock().1.len()
    }
}

/// Marks its connection idle again when dropped: hyper drops an answer's
/// body once it is written.
struct Answering {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.slots.set_idle(self.id, true);
    }
}

/// Frees its slot however the connection ends.
struct Held {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slots.release(self.id);
    }
}

/// A listening socket on `addr` (with SO_REUSEADDR, so a restarted agent
/// gets its port back at once). Call inside the runtime.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

async fn connection(
    stream: TcpStream,
    slots: Arc<Slots>,
    (id, close): (u64, Arc<Notify>),
    pages: Arc<Pages>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let _held = Held {
        slots: Arc::clone(&slots),
        id,
    };
    let service = service_fn(move |req: Request<Incoming>| {
        slots.set_idle(id, false);
        let answering = Answering {
            slots: Arc::clone(&slots),
            id,
        };
        let resp: Answer = answer(&req, &pages).map(|body| {
            body.map_frame(move |f| {
                let _ = &answering;
                f
            })
            .boxed()
        });
        std::future::ready(Ok::<_, Infallible>(resp))
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes.max(8192) * 2);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    // Dropping the connection closes its socket.
    tokio::select! {
        _ = conn.as_mut() => {}
        () = close.notified() => {}
        () = tokio::time::sleep(limits.lifetime) => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.shutdown_grace, conn.as_mut()).await;
        }
    }
}

/// Serve until `shutdown` completes, then stop accepting, let answers in
/// flight finish for at most `shutdown_grace` and return.
pub async fn serve(
    listener: TcpListener,
    pages: Arc<Pages>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Slots {
        cap: limits.max_connections.max(1),
        open: Mutex::new((0, BTreeMap::new())),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Some(slot) = slots.admit(peer.ip()) {
                        tokio::spawn(connection(
                            stream,
                            Arc::clone(&slots),
                            slot,
                            Arc::clone(&pages),
                            limits,
                            stop_rx.clone(),
                        ));
                    }
                }
                Err(e) => {
                    logging::at(
                        podgate_cni::log::Level::Debug,
                        &format!("metrics: accept: {e}"),
                    );
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = async {
        while slots.len() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let _ = tokio::time::timeout(limits.shutdown_grace, drained).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fails_before_the_first_collection_and_once_the_worker_stalls() {
        let pages = Pages::new(Duration::from_millis(50));
        assert!(pages.health().is_err());
        assert!(pages.metrics().is_none(), "/metrics is 503 until then");
        pages.publish("m 1\n".into());
        assert_eq!(pages.health(), Ok(()));
        assert_eq!(pages.metrics().as_deref(), Some(&b"m 1\n"[..]));
        std::thread::sleep(Duration::from_millis(80));
        assert!(pages
            .health()
            .unwrap_err()
            .to_string()
            .contains("no collection or sweep"));
        pages.alive();
        assert_eq!(pages.health(), Ok(()));
    }

    #[test]
    fn at_the_cap_the_peer_holding_most_gets_no_more_and_gives_up_its_longest_idle_connection() {
        let slots = Slots {
            cap: 3,
            open: Mutex::new((0, BTreeMap::new())),
        };
        let (pod, scraper, other): (IpAddr, IpAddr, IpAddr) = (
            [10, 0, 0, 9].into(),
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
        );
        let (s, _) = slots.admit(scraper).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let (a, a_close) = slots.admit(pod).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let (b, _) = slots.admit(pod).unwrap();
        assert!(slots.admit(pod).is_none(), "the pod holds the most");
        // The scraper's connection is the oldest; the pod's oldest goes.
        let (c, _) = slots.admit(other).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let told = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), a_close.notified()).await
        });
        assert!(told.is_ok(), "the pod's oldest idle connection is closed");
        assert_eq!(slots.len(), 3);
        slots.release(a);
        assert_eq!(slots.len(), 3, "a was already gone");
        for id in [s, b, c] {
            slots.set_idle(id, false);
        }
        let newcomer: IpAddr = [10, 0, 0, 3].into();
        assert!(
            slots.admit(newcomer).is_none(),
            "every connection is answering"
        );
        slots.set_idle(s, true);
        assert!(slots.admit(newcomer).is_some(), "the scraper's was idle");
    }
}
