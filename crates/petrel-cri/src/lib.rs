//! Node-wide container metadata from the local container runtime.
//!
//! Petrel's `kubernetes_logs` source takes pod and container metadata from the
//! runtime on the node (containerd's CRI API over its unix socket) instead of
//! watching the Kubernetes API server from every node, which is what overloads
//! API servers with per-node LISTs. [`RuntimeWatcher`] keeps one cache for the
//! whole agent, refreshed periodically and on demand, on its own thread: readers
//! take an `Arc<Snapshot>` and never wait for the runtime.

#![warn(missing_docs)]

mod docker;
mod model;
mod watcher;

#[cfg(feature = "lab")]
pub mod lab;

pub use model::{ContainerInfo, PodInfo, Snapshot, WatcherStats};
pub use watcher::{Runtime, RuntimeWatcher, WatcherOptions};

/// The CRI `runtime.v1` messages and the `RuntimeService` client, generated at
/// build time from the vendored `proto/api.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("runtime.v1");
}

use std::path::{Path, PathBuf};
use std::time::Duration;

use api::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Opens a gRPC channel to a CRI runtime listening on the unix socket `path`.
///
/// Every step (connecting, the HTTP/2 handshake) is bounded by `timeout`, so a
/// socket whose server accepts but never answers cannot hang the caller.
pub async fn connect(
    path: &Path,
    timeout: Duration,
) -> std::io::Result<RuntimeServiceClient<Channel>> {
    let path: PathBuf = path.to_path_buf();
    // The URI is only a placeholder required by tonic: the connector ignores it.
    let endpoint = Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout);
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    let channel = tokio::time::timeout(timeout, endpoint.connect_with_connector(connector))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting to the CRI socket timed out after {timeout:?}"),
            )
        })?
        .map_err(|e| std::io::Error::other(error_chain(&e)))?;
    Ok(RuntimeServiceClient::new(channel))
}

/// Formats an error with its sources ("transport error: No such file or directory"),
/// since tonic's top-level messages alone do not say what went wrong.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let m = src.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = src.source();
    }
    s
}

/// Formats a gRPC status with the code name and message.
pub(crate) fn status_error(what: &str, s: &tonic::Status) -> String {
    let mut m = format!("{what}: {:?}: {}", s.code(), s.message());
    if let Some(src) = std::error::Error::source(s) {
        m.push_str(": ");
        m.push_str(&error_chain(src));
    }
    m
}
