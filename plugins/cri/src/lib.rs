//! podgate's CRI client: the node's container runtime (containerd, CRI-O)
//! over gRPC on its unix socket. Used by the helper (a pod's netns by
//! Kubernetes name, [`sandbox`]) and the node agent (the CNI config the
//! runtime loaded, [`status`]); never by the plugins, which stay small,
//! synchronous and API-free.
//!
//! Every call runs on a current-thread tokio runtime of its own and returns
//! plain data: callers stay synchronous.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod proxy;
pub mod sandbox;
pub mod status;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

pub use sandbox::{
    find_pod, is_ready, ready_sandboxes, stop_sandbox, PodName, PodNetns, ReadySandbox,
    SandboxNetns,
};
pub use status::{runtime_status, LoadedCni, LoadedNetwork, LoadedPlugin, RuntimeStatus};

/// crictl's default endpoints, tried in this order when none is given.
pub const DEFAULT_ENDPOINTS: [&str; 3] = [
    "unix:///run/containerd/containerd.sock",
    "unix:///run/crio/crio.sock",
    "unix:///var/run/cri-dockerd.sock",
];
/// One budget per CRI call (connect, list, status).
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read (tonic's default is 4 MiB): the kubelet's own CRI
/// client reads up to 16 MiB (`maxMsgSize`, `pkg/kubelet/cri/remote`), and
/// containerd sends at most that by default. A sandbox's annotations can
/// hold 256 KiB (the API server's limit), so 4 MiB is about 17 such pods
/// in one `ListPodSandbox`; a node whose listing is larger than 16 MiB
/// breaks its kubelet first. Past it, the call fails naming the sizes.
pub const MAX_MESSAGE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("--runtime-endpoint {0:?}: only unix:///PATH (or a plain socket path) is supported")]
    BadEndpoint(String),
    #[error("no CRI runtime found (tried {tried}); pass --runtime-endpoint")]
    NoRuntime { tried: String },
    #[error("CRI runtime at {endpoint}: connecting: {msg}")]
    Connect { endpoint: String, msg: String },
    #[error("CRI runtime at {endpoint}: {call}: {msg}")]
    Call {
        endpoint: String,
        call: &'static str,
        msg: String,
    },
    #[error("--k8s-pod {0:?}: give NAMESPACE/NAME")]
    BadPod(String),
    #[error("pod {pod}: no ready sandbox on this node's runtime ({endpoint}){hint}")]
    NotFound {
        pod: String,
        endpoint: String,
        hint: String,
    },
    #[error("pod {pod}: sandbox {id} uses the node's network namespace (hostNetwork)")]
    HostNetwork { pod: String, id: String },
    #[error("pod {pod}: sandbox {id}: the runtime reports neither a netns path nor a pid")]
    NoNetns { pod: String, id: String },
    #[error("starting the CRI client: {0}")]
    Runtime(std::io::Error),
    #[error("CRI runtime at {endpoint}: Status: info[{key:?}] is not the JSON expected: {msg}")]
    BadInfo {
        endpoint: String,
        key: &'static str,
        msg: String,
    },
}

/// The socket path of `unix:///PATH` (or a bare absolute path, as crictl
/// accepts).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let p = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if p.starts_with('/') {
        Ok(PathBuf::from(p))
    } else {
        Err(CriError::BadEndpoint(endpoint.into()))
    }
}

/// Runs `f` on a current-thread runtime of its own.
pub(crate) fn block_on<T>(
    f: impl std::future::Future<Output = Result<T, CriError>>,
) -> Result<T, CriError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(CriError::Runtime)?
        .block_on(f)
}

/// A client of the runtime at `endpoint`, or of the first default endpoint
/// whose socket exists and answers; with the endpoint used.
pub(crate) async fn client(
    endpoint: Option<&str>,
) -> Result<(String, RuntimeServiceClient<Channel>), CriError> {
    match endpoint {
        Some(e) => Ok((e.to_string(), connect(e).await?)),
        None => connect_default().await,
    }
}

pub(crate) fn call_err(endpoint: &str, call: &'static str, s: tonic::Status) -> CriError {
    CriError::Call {
        endpoint: endpoint.into(),
        call,
        msg: s.message().to_string(),
    }
}

async fn connect_default() -> Result<(String, RuntimeServiceClient<Channel>), CriError> {
    let mut tried = Vec::new();
    for e in DEFAULT_ENDPOINTS {
        let exists = socket_path(e).is_ok_and(|p| p.exists());
        if !exists {
            tried.push(format!("{e}: no socket"));
            continue;
        }
        match connect(e).await {
            Ok(c) => return Ok((e.to_string(), c)),
            Err(err) => tried.push(err.to_string()),
        }
    }
    Err(CriError::NoRuntime {
        tried: tried.join("; "),
    })
}

async fn connect(endpoint: &str) -> Result<RuntimeServiceClient<Channel>, CriError> {
    let path = socket_path(endpoint)?;
    let fail = |msg: String| CriError::Connect {
        endpoint: endpoint.into(),
        msg,
    };
    // The URI is a placeholder: the connector below always dials the socket.
    let channel = Endpoint::from_static("http://cri.invalid")
        .connect_timeout(TIMEOUT)
        .timeout(TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| fail(error_chain(&e)))?;
    Ok(RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        // tonic's messages often repeat their source's.
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/var/run/crio/crio.sock").unwrap(),
            PathBuf::from("/var/run/crio/crio.sock")
        );
        assert!(socket_path("tcp://127.0.0.1:1234").is_err());
        assert!(socket_path("unix://relative.sock").is_err());
    }
}
