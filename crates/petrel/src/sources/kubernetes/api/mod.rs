//! Metadata from the Kubernetes API server: namespace labels and
//! annotations, node labels, the owning workload (followed up from
//! ReplicaSets and Jobs), the pod's IP, and the pod's labels and
//! annotations when the runtime lacks them.
//!
//! One [`KubeApi`] per set of credentials serves every source of every
//! pipeline (it lives in the shared [`super::Catalog`]): one list+watch
//! per kind (pods of this node, namespaces, this node, and metadata-only
//! ReplicaSets and Jobs), on one thread of its own. Sources only read its
//! [`store::Store`]; nothing asks the API server per event or per file.
//!
//! Failures never hold logs back: while the API server cannot be reached
//! (or refuses us) the store keeps what it had, sources wait at most
//! `metadata_wait_ms` for a pod it does not know, the errors are counted
//! (`petrel_kubernetes_api_errors_total`) and `/health` says `degraded`.

pub mod auth;
pub mod store;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::health::Health;
use petrel_core::metrics::Labels;
use petrel_core::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use auth::Credentials;
use store::{Kind, LabelsMeta, Owner, PodMeta, Store};

/// The `api` key, documented once for every plugin that reads it.
pub const API_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "api",
    kind: petrel_core::plugin::KeyKind::OneOf(&["auto", "true", "false"]),
    default: Some(r#"auto"#),
    doc: r#"Metadata from the Kubernetes API server (namespace and node labels, the owning workload, the pod IP): `auto` uses it when in-cluster credentials (`KUBERNETES_SERVICE_HOST` and the service account token) or `$KUBECONFIG` (or `kubeconfig`) are there; `true` requires it; `false` never asks. Needs `$NODE_NAME` and the RBAC of the shipped ClusterRole."#,
};

/// The `kubeconfig` key, documented once for every plugin that reads it.
pub const KUBECONFIG_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "kubeconfig",
    kind: petrel_core::plugin::KeyKind::String,
    default: None,
    doc: r#"A kubeconfig for the API server (outside a cluster): its current context's server, CA (or `insecure-skip-tls-verify`), and token, token file or client certificate. Default: in-cluster credentials, else `$KUBECONFIG`."#,
};

/// Whether the API server is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiChoice {
    /// When credentials are found.
    Auto,
    /// Always; no credentials is an error.
    On,
    /// Never.
    Off,
}

/// The `api` and `kubeconfig` keys.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// `api:`.
    pub choice: ApiChoice,
    /// `kubeconfig:`.
    pub kubeconfig: Option<PathBuf>,
}

impl ApiSettings {
    /// Reads `api` and `kubeconfig`.
    pub fn parse(map: &Map<'_>) -> Self {
        let choice = match map.choice("api", &["auto", "true", "false"]) {
            Some("true") => ApiChoice::On,
            Some("false") => ApiChoice::Off,
            _ => ApiChoice::Auto,
        };
        let kubeconfig = map
            .get("kubeconfig")
            .and_then(|n| n.as_str().map(|s| crate::paths::resolve_path(n, s)));
        if choice == ApiChoice::Off {
            if let Some(n) = map.get("kubeconfig") {
                n.error("`kubeconfig` is set but `api: false` turns the API server off; remove one of them");
            }
        }
        Self { choice, kubeconfig }
    }

    /// The credentials to use: `Ok(None)` when the API is off (or `auto`
    /// found none); an error when `api: true` or a named kubeconfig
    /// cannot be used.
    pub fn credentials(&self) -> Result<Option<Credentials>, String> {
        if self.choice == ApiChoice::Off {
            return Ok(None);
        }
        if let Some(p) = &self.kubeconfig {
            return auth::kubeconfig(p).map(Some);
        }
        if auth::in_cluster_available() {
            return auth::in_cluster().map(Some);
        }
        if let Some(p) = auth::kubeconfig_from_env() {
            return match auth::kubeconfig(&p) {
                Ok(c) => Ok(Some(c)),
                Err(e) if self.choice == ApiChoice::Auto => {
                    tracing::error!(error = %e, "$KUBECONFIG cannot be used; Kubernetes API metadata is off");
                    Ok(None)
                }
                Err(e) => Err(e),
            };
        }
        match self.choice {
            ApiChoice::On => Err(format!(
                "`api: true` but there are no in-cluster credentials (KUBERNETES_SERVICE_HOST and {}/token) and no $KUBECONFIG; set `kubeconfig:`",
                auth::service_account_dir().display()
            )),
            _ => Ok(None),
        }
    }

    /// The key under which one [`KubeApi`] is shared.
    pub fn share_key(&self) -> String {
        format!("{:?}", self.kubeconfig)
    }
}

/// The state of one kind's list+watch.
#[derive(Debug, Clone, Default)]
struct KindState {
    /// Listed, and the watch is up (or only briefly down).
    ok: bool,
    /// The last error, and when it was logged.
    error: Option<(String, Instant)>,
}

/// What the watch loops and the readers share.
pub struct Shared {
    creds: Credentials,
    client: reqwest::Client,
    node: String,
    /// What is kept.
    pub store: Store,
    states: Mutex<[KindState; 5]>,
    errors: Family<Labels, Counter>,
    objects: Family<Labels, Gauge>,
    cache_bytes: Gauge,
    health: Arc<Health>,
}

const HEALTH_KEY: &str = "kubernetes/api";

fn kind_index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Shared {
    fn labels(kind: Kind, reason: &str) -> Labels {
        vec![
            ("resource".into(), kind.resource().into()),
            ("reason".into(), reason.into()),
        ]
    }

    /// Counts one error of `kind`.
    fn count(&self, kind: Kind, reason: &str) {
        self.errors.get_or_create(&Self::labels(kind, reason)).inc();
    }

    /// The list and watch of `kind` work.
    fn ok(&self, kind: Kind) {
        let mut st = self.states.lock();
        let s = &mut st[kind_index(kind)];
        if s.error.take().is_some() {
            tracing::info!(
                resource = kind.resource(),
                "Kubernetes API: {} listed and watched again; events carry its metadata again",
                kind.resource()
            );
        }
        s.ok = true;
        if st.iter().all(|s| s.ok) {
            self.health.recovered(HEALTH_KEY);
        }
    }

    /// `kind` failed with `e`: counted, logged (a changed error at once,
    /// the same one again at most every minute) and `/health` degraded.
    fn failed(&self, kind: Kind, e: &watch::Failure) {
        self.count(kind, &e.reason());
        let group = match kind.group() {
            "" => "core".to_string(),
            g => g.to_string(),
        };
        let text = match e {
            watch::Failure::Status(401, m) => format!(
                "401 Unauthorized listing {}: the API server refused the credentials of {} ({m}); check the token or certificate",
                kind.resource(),
                self.creds.origin
            ),
            watch::Failure::Status(403, m) => format!(
                "403 Forbidden: RBAC does not allow `list` and `watch` on `{}` (API group {group}){}; grant the verbs get, list, watch on {} to the agent's service account (the ClusterRole of deploy/kubernetes/rbac.yaml); server: {m}",
                kind.resource(),
                if kind == Kind::Pods || kind == Kind::Node {
                    " cluster-wide"
                } else {
                    ""
                },
                kind.resource()
            ),
            watch::Failure::Status(c, m) => format!("HTTP {c} for {}: {m}", kind.resource()),
            watch::Failure::Unreachable(m) => format!(
                "cannot reach the API server at {} for {}: {m}",
                self.creds.server,
                kind.resource()
            ),
            watch::Failure::Invalid(m) => format!("unreadable answer: {m}"),
            watch::Failure::Expired => "expired".into(),
        };
        let mut st = self.states.lock();
        let s = &mut st[kind_index(kind)];
        s.ok = false;
        let log = match &s.error {
            Some((prev, at)) => *prev != text || at.elapsed() >= Duration::from_secs(60),
            None => true,
        };
        if log {
            s.error = Some((text.clone(), Instant::now()));
            let loud = matches!(e, watch::Failure::Status(401 | 403, _));
            if loud {
                tracing::error!(
                    resource = kind.resource(),
                    "Kubernetes API: {text}; events carry the container runtime's metadata only"
                );
            } else {
                tracing::warn!(resource = kind.resource(), "Kubernetes API: {text}; events carry the container runtime's metadata only until it answers");
            }
        }
        self.health.degraded(
            HEALTH_KEY,
            format!("Kubernetes API metadata incomplete: {text}"),
        );
    }

    fn update_gauges(&self) {
        for (kind, n) in self.store.counts() {
            self.objects
                .get_or_create(&vec![("resource".into(), kind.resource().into())])
                .set(n as i64);
        }
        self.cache_bytes.set(self.store.heap_bytes() as i64);
    }
}

/// A running client of the API server, shared by every source that uses
/// the same credentials. Dropping the last handle stops its thread.
pub struct KubeApi {
    shared: Arc<Shared>,
    relist: tokio::sync::watch::Sender<u64>,
    /// Dropped with the handle: ends the thread's runtime and its loops.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// What the API server says of one container's pod, namespace and node.
#[derive(Debug, Default, Clone)]
pub struct ApiView {
    /// The pod, when known.
    pub pod: Option<Arc<PodMeta>>,
    /// Its namespace.
    pub namespace: Option<Arc<LabelsMeta>>,
    /// This node.
    pub node: Option<Arc<LabelsMeta>>,
    /// Whether the node was listed yet (`node` is then final, found or
    /// not).
    pub node_listed: bool,
    /// The pod's workload chain, nearest first (`ReplicaSet`, then its
    /// `Deployment`).
    pub owners: Vec<Owner>,
}

impl KubeApi {
    /// Starts the list+watch loops against `creds` for node `node`.
    pub fn start(
        creds: Credentials,
        node: String,
        metrics: &Arc<Metrics>,
    ) -> anyhow::Result<Arc<Self>> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("petrel/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &creds.ca_pem {
            // The cluster's CA alone: a public root has no business
            // vouching for an API server.
            b = b.tls_built_in_root_certs(false);
            for cert in reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| anyhow::anyhow!("Kubernetes API CA ({}): {e}", creds.origin))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some(pem) = &creds.identity_pem {
            b = b.identity(reqwest::Identity::from_pem(pem).map_err(|e| {
                anyhow::anyhow!("Kubernetes API client certificate ({}): {e}", creds.origin)
            })?);
        }
        if creds.insecure {
            tracing::warn!(server = %creds.server, "Kubernetes API: insecure-skip-tls-verify: the server's certificate is not checked");
            b = b.danger_accept_invalid_certs(true);
        }
        let client = b.build()?;
        tracing::info!(server = %creds.server, credentials = %creds.origin, node = %node, "Kubernetes API metadata: listing and watching pods of this node, namespaces, the node, ReplicaSets and Jobs");
        let errors = metrics.named_counters(
            "kubernetes_api_errors",
            "Failed requests to the Kubernetes API server, by resource and reason",
        );
        let objects = metrics.named_gauges(
            "kubernetes_api_objects",
            "Objects of the Kubernetes API kept for metadata, by resource",
        );
        let cache_bytes = metrics
            .named_gauges(
                "kubernetes_api_cache_bytes",
                "Estimated heap bytes of the Kubernetes API metadata kept",
            )
            .get_or_create(&Vec::new())
            .clone();
        let shared = Arc::new(Shared {
            creds,
            client,
            node,
            store: Store::default(),
            states: Mutex::new(Default::default()),
            errors,
            objects,
            cache_bytes,
            health: metrics.health.clone(),
        });
        // Shown as 0 before the first error, so that a dashboard has the
        // series.
        for kind in Kind::ALL {
            let _ = shared
                .errors
                .get_or_create(&Shared::labels(kind, "unreachable"));
        }
        let (relist, relist_rx) = tokio::sync::watch::channel(0u64);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        std::thread::Builder::new()
            .name("petrel-k8s-api".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "Kubernetes API: cannot start its runtime; metadata from the API is off");
                        return;
                    }
                };
                rt.block_on(async move {
                    for kind in Kind::ALL {
                        tokio::spawn(watch::run(s.clone(), kind, relist_rx.clone()));
                    }
                    let _ = stop_rx.await;
                });
            })?;
        Ok(Arc::new(Self {
            shared,
            relist,
            _stop: stop,
        }))
    }

    /// Keeps the annotations `keys` too (a source names them); lists again
    /// when one is new, so that objects already kept have them.
    pub fn want_annotations<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        if self.shared.store.want_annotations(keys) {
            self.relist.send_modify(|e| *e += 1);
        }
    }

    /// Changes whenever what is kept does.
    pub fn generation(&self) -> u64 {
        self.shared.store.generation()
    }

    /// What is known of pod `uid` named `name` in `namespace` (any may be
    /// unknown): by uid, else by namespace and name.
    pub fn view(&self, namespace: Option<&str>, uid: Option<&str>, name: Option<&str>) -> ApiView {
        let s = &self.shared.store;
        let pod = uid
            .and_then(|u| s.pod(u))
            .or_else(|| match (namespace, name) {
                (Some(ns), Some(n)) => s.pod_by_name(ns, n),
                _ => None,
            });
        let ns = pod.as_ref().map(|p| p.namespace.as_str()).or(namespace);
        let owners = match (&pod, ns) {
            (Some(p), Some(ns)) => p
                .owner
                .as_ref()
                .map(|o| s.owners(ns, o))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        ApiView {
            namespace: ns.and_then(|n| s.namespace(n)),
            node: s.node(),
            node_listed: s.node_listed(),
            pod,
            owners,
        }
    }
}

/// Starts the client `settings` names, or `None` when the API is off or
/// (with `auto`) has no credentials. An error when it is required and
/// cannot be used.
pub fn connect(
    settings: &ApiSettings,
    node: Option<&str>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<KubeApi>>> {
    let creds = match settings.credentials() {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(None),
        Err(e) => anyhow::bail!("Kubernetes API: {e}"),
    };
    let node = match node {
        Some(n) => n.to_string(),
        None => {
            // kubelet names the node after the host unless told otherwise.
            let h = crate::host::hostname().to_lowercase();
            tracing::warn!(node = %h, "Kubernetes API: $NODE_NAME is not set; watching the pods of the node named after this host (set NODE_NAME from spec.nodeName in the DaemonSet)");
            h
        }
    };
    KubeApi::start(creds, node, metrics).map(Some)
}

#[cfg(test)]
impl Shared {
    /// A `Shared` that no loop runs, for the watch parser's tests.
    pub(crate) fn for_tests() -> Self {
        let metrics = Metrics::new();
        Shared {
            creds: Credentials {
                server: "https://127.0.0.1:1".into(),
                ca_pem: None,
                identity_pem: None,
                insecure: false,
                token: auth::Token::None,
                origin: "test".into(),
            },
            client: reqwest::Client::new(),
            node: "n1".into(),
            store: Store::default(),
            states: Mutex::new(Default::default()),
            errors: metrics.named_counters("kubernetes_api_errors", "test"),
            objects: metrics.named_gauges("kubernetes_api_objects", "test"),
            cache_bytes: Gauge::default(),
            health: metrics.health.clone(),
        }
    }
}
