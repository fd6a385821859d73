//! `kubernetes_logs` with metadata from a real Kubernetes API server
//! (etcd + kube-apiserver v1.34.4 on 127.0.0.1, RBAC on; see
//! `kube_apiserver/mod.rs`): the test creates namespaces, the node,
//! workloads with their owner chains and pods bound to the node through
//! the API (no controller runs), and writes the pods' logs where kubelet
//! would (`<pods_dir>/<ns>_<pod>_<uid>/<container>/0.log`). The source runs
//! with `runtime: none`, so every field beyond the path's comes from the
//! API server. One test runs real containers instead: a private containerd
//! (`scripts/cri-lab.sh`, through `petrel_cri::lab`) runs the pods the API
//! server knows, under the same names and uids, and `kubernetes_logs` and
//! `container_files` read them with `runtime: containerd` and `api: true`.
//!
//! One API server at a time ([`SERIAL`]): each takes a core while it
//! starts, and the machine has two.

mod common;
mod kube_apiserver;
mod server;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use kube_apiserver::KubeApiServer;
use serde_json::{json, Value};

static SERIAL: Mutex<()> = Mutex::new(());

const T: &str = "2024-03-01T10:20:30.123456789Z";
const NODE: &str = "petrel-node-1";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn uid(v: &Value) -> String {
    v["metadata"]["uid"]
        .as_str()
        .unwrap_or_else(|| panic!("no uid in {v}"))
        .to_string()
}

fn namespace(k: &KubeApiServer, name: &str, labels: Value, annotations: Value) {
    k.create(
        "/api/v1/namespaces",
        json!({"metadata": {"name": name, "labels": labels, "annotations": annotations}}),
    );
}

fn node(k: &KubeApiServer, name: &str, labels: Value) {
    k.create(
        "/api/v1/nodes",
        json!({"metadata": {"name": name, "labels": labels}}),
    );
}

fn containers() -> Value {
    json!([{"name": "app", "image": "busybox"}])
}

/// A workload object of `kind` (its plural path under `api`), owned by
/// `owner` when given; its uid.
fn workload(
    k: &KubeApiServer,
    api: &str,
    plural: &str,
    ns: &str,
    name: &str,
    spec: Value,
    owner: Option<Value>,
) -> String {
    let mut meta = json!({"name": name});
    if let Some(o) = owner {
        meta["ownerReferences"] = json!([o]);
    }
    let v = k.create(
        &format!("{api}/namespaces/{ns}/{plural}"),
        json!({"metadata": meta, "spec": spec}),
    );
    uid(&v)
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true})
}

fn selector_spec(app: &str) -> Value {
    json!({
        "selector": {"matchLabels": {"app": app}},
        "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": containers()}}
    })
}

fn job_spec() -> Value {
    json!({"template": {"spec": {"containers": containers(), "restartPolicy": "Never"}}})
}

/// CronJob `backup` in namespace `shop`, its Job `backup-2902` and that
/// Job's pod `backup-2902-z` on [`NODE`]; returns the pod's uid.
fn cronjob_pod(k: &KubeApiServer) -> String {
    let cj = workload(
        k,
        "/apis/batch/v1",
        "cronjobs",
        "shop",
        "backup",
        json!({"schedule": "0 3 * * *", "jobTemplate": {"spec": job_spec()}}),
        None,
    );
    let job = workload(
        k,
        "/apis/batch/v1",
        "jobs",
        "shop",
        "backup-2902",
        job_spec(),
        Some(owner("batch/v1", "CronJob", "backup", &cj)),
    );
    pod(
        k,
        "shop",
        "backup-2902-z",
        NODE,
        json!({"app": "backup"}),
        Some(owner("batch/v1", "Job", "backup-2902", &job)),
    )
}

/// A pod bound to `node_name`; its uid.
fn pod(
    k: &KubeApiServer,
    ns: &str,
    name: &str,
    node_name: &str,
    labels: Value,
    owner: Option<Value>,
) -> String {
    let mut meta = json!({"name": name, "labels": labels});
    if let Some(o) = owner {
        meta["ownerReferences"] = json!([o]);
    }
    let v = k.create(
        &format!("/api/v1/namespaces/{ns}/pods"),
        json!({"metadata": meta, "spec": {"nodeName": node_name, "containers": containers()}}),
    );
    uid(&v)
}

/// A Deployment, its ReplicaSet and one pod of it on [`NODE`]: the pod's uid.
fn deployment_pod(k: &KubeApiServer, ns: &str, app: &str, pod_name: &str) -> String {
    let d = workload(
        k,
        "/apis/apps/v1",
        "deployments",
        ns,
        app,
        selector_spec(app),
        None,
    );
    let rs_name = format!("{app}-7d9f8");
    let rs = workload(
        k,
        "/apis/apps/v1",
        "replicasets",
        ns,
        &rs_name,
        selector_spec(app),
        Some(owner("apps/v1", "Deployment", app, &d)),
    );
    pod(
        k,
        ns,
        pod_name,
        NODE,
        json!({"app": app}),
        Some(owner("apps/v1", "ReplicaSet", &rs_name, &rs)),
    )
}

/// The log file kubelet would write for container `app` of the pod.
fn log_path(pods: &Path, ns: &str, pod: &str, uid: &str) -> PathBuf {
    let d = pods.join(format!("{ns}_{pod}_{uid}")).join("app");
    std::fs::create_dir_all(&d).unwrap();
    d.join("0.log")
}

fn line(msg: &str) -> Vec<u8> {
    format!("{T} stdout F {msg}\n").into_bytes()
}

/// A `kubernetes_logs` pipeline reading `pods` into `out`, with `extra`
/// source keys.
fn config(dir: &Path, pods: &Path, out: &Path, extra: &str) -> PathBuf {
    std::fs::create_dir_all(pods).unwrap();
    write_config(
        dir,
        "k8s",
        &format!(
            "sources:\n  - type: kubernetes_logs\n    id: pods\n    pods_dir: {}\n    docker_dir: {}\n    runtime: none\n    metadata_wait_ms: 1500\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            pods.display(),
            dir.join("no-docker").display(),
            out.display()
        ),
    )
}

fn opts(env: &[(&str, &str)]) -> AgentOptions {
    let mut env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.push(("NODE_NAME".into(), NODE.into()));
    AgentOptions {
        env,
        ..Default::default()
    }
}

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

/// The first event whose message is `msg`, once it is there.
fn event(out: &Path, msg: &str) -> Value {
    wait_for(LONG, &format!("the event `{msg}`"), || {
        json_lines(out)
            .into_iter()
            .find(|v| field(v, "message") == msg)
            .ok_or_else(|| format!("{} events so far", json_lines(out).len()))
    })
}

fn api_errors(agent: &Agent, resource: &str, reason: &str) -> f64 {
    agent.metric_or_zero(
        "petrel_kubernetes_api_errors_total",
        &[("resource", resource), ("reason", reason)],
    )
}

fn all_api_errors(agent: &Agent, reason: &str) -> f64 {
    ["pods", "namespaces", "nodes", "replicasets", "jobs"]
        .iter()
        .map(|r| api_errors(agent, r, reason))
        .sum()
}

fn objects(agent: &Agent, resource: &str) -> Option<f64> {
    agent.metric("petrel_kubernetes_api_objects", &[("resource", resource)])
}

fn health(agent: &Agent) -> (u16, Value) {
    let (st, body) = agent.http_get("/health").expect("GET /health");
    (st, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The ClusterRole and ClusterRoleBinding shipped in
/// `deploy/kubernetes/rbac.yaml`, as JSON objects (the ServiceAccount
/// too), in file order.
fn shipped_rbac() -> Vec<Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/rbac.yaml");
    let text = std::fs::read_to_string(&p).expect("deploy/kubernetes/rbac.yaml");
    text.split("\n---")
        .filter(|doc| doc.lines().any(|l| l.starts_with("kind:")))
        .map(|doc| {
            let n = marked_yaml::parse_yaml(0, doc).expect("rbac.yaml parses");
            to_json(&n)
        })
        .collect()
}

fn to_json(n: &marked_yaml::Node) -> Value {
    match n {
        marked_yaml::Node::Scalar(s) => Value::String(s.as_str().to_string()),
        marked_yaml::Node::Sequence(s) => Value::Array(s.iter().map(to_json).collect()),
        marked_yaml::Node::Mapping(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.as_str().to_string(), to_json(v)))
                .collect(),
        ),
    }
}

/// Creates the shipped ServiceAccount, ClusterRole and binding (in
/// namespace `petrel`), exactly as in the file.
fn apply_shipped_rbac(k: &KubeApiServer) {
    namespace(k, "petrel", json!({}), json!({}));
    let docs = shipped_rbac();
    let kinds: Vec<&str> = docs.iter().map(|d| field(d, "kind")).collect();
    assert_eq!(
        kinds,
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"],
        "deploy/kubernetes/rbac.yaml"
    );
    for d in docs {
        let path = match field(&d, "kind") {
            "ServiceAccount" => "/api/v1/namespaces/petrel/serviceaccounts".to_string(),
            "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".to_string(),
            _ => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".to_string(),
        };
        k.create(&path, d);
    }
}

/// A service account token (TokenRequest), bound to `secret` when given
/// (deleting the secret then invalidates the token).
fn sa_token(k: &KubeApiServer, ns: &str, sa: &str, secret: Option<(&str, &str)>) -> String {
    let mut spec = json!({"expirationSeconds": 3600});
    if let Some((name, uid)) = secret {
        spec["boundObjectRef"] =
            json!({"kind": "Secret", "apiVersion": "v1", "name": name, "uid": uid});
    }
    let v = k.create(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
    );
    v["status"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {v}"))
        .to_string()
}

/// The in-cluster environment of a pod: `KUBERNETES_SERVICE_*` and a
/// service account directory (token, ca.crt) at `sa_dir`.
fn in_cluster(k: &KubeApiServer, sa_dir: &Path, token: &str) -> Vec<(String, String)> {
    std::fs::create_dir_all(sa_dir).unwrap();
    std::fs::copy(k.ca(), sa_dir.join("ca.crt")).unwrap();
    write_token(sa_dir, token);
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT".into(), k.port.to_string()),
        (
            "PETREL_KUBERNETES_SERVICEACCOUNT_DIR".into(),
            sa_dir.display().to_string(),
        ),
    ]
}

/// Replaces the token file at once, as kubelet does (write, rename).
fn write_token(sa_dir: &Path, token: &str) {
    let tmp = sa_dir.join(".token.tmp");
    std::fs::write(&tmp, token).unwrap();
    std::fs::rename(&tmp, sa_dir.join("token")).unwrap();
}

fn env_refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

#[test]
fn owners_namespace_and_node_metadata_and_a_namespace_label_added_later() {
    let _g = serial();
    let k = KubeApiServer::start();
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    namespace(
        &k,
        "shop",
        json!({"team": "checkout"}),
        json!({"contact": "ops@example.org", "unnamed": "not copied"}),
    );
    namespace(&k, "quiet", json!({"logs": "off"}), json!({}));
    node(&k, NODE, json!({"topology.kubernetes.io/zone": "z1"}));
    node(&k, "other-node", json!({}));
    let web = deployment_pod(&k, "shop", "web", "web-7d9f8-x1");
    let sts = workload(
        &k,
        "/apis/apps/v1",
        "statefulsets",
        "shop",
        "db",
        {
            let mut s = selector_spec("db");
            s["serviceName"] = json!("db");
            s
        },
        None,
    );
    let db = pod(
        &k,
        "shop",
        "db-0",
        NODE,
        json!({"app": "db"}),
        Some(owner("apps/v1", "StatefulSet", "db", &sts)),
    );
    let ds = workload(
        &k,
        "/apis/apps/v1",
        "daemonsets",
        "shop",
        "agent",
        selector_spec("agent"),
        None,
    );
    let agent_pod = pod(
        &k,
        "shop",
        "agent-q2",
        NODE,
        json!({"app": "agent"}),
        Some(owner("apps/v1", "DaemonSet", "agent", &ds)),
    );
    let backup = cronjob_pod(&k);
    let solo = pod(&k, "shop", "solo", NODE, json!({"app": "solo"}), None);
    k.patch(
        "/api/v1/namespaces/shop/pods/solo/status",
        json!({"status": {"podIP": "192.0.2.10", "podIPs": [{"ip": "192.0.2.10"}]}}),
    );
    let noise = pod(&k, "quiet", "noise", NODE, json!({}), None);
    // Not on this node: never in the agent's cache.
    pod(&k, "shop", "elsewhere", "other-node", json!({}), None);

    let kubeconfig = k.kubeconfig(dir.path(), None);
    let cfg = config(
        dir.path(),
        &pods,
        &out,
        &format!(
            "    kubeconfig: {}\n    annotation_fields: [contact]\n    exclude: {{ namespace_labels: {{ logs: \"off\" }} }}\n",
            kubeconfig.display()
        ),
    );
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&[]));
    for (ns, name, u) in [
        ("shop", "web-7d9f8-x1", &web),
        ("shop", "db-0", &db),
        ("shop", "agent-q2", &agent_pod),
        ("shop", "backup-2902-z", &backup),
        ("shop", "solo", &solo),
        ("quiet", "noise", &noise),
    ] {
        append(
            &log_path(&pods, ns, name, u),
            &line(&format!("first from {name}")),
        );
    }
    let web_ev = event(&out, "first from web-7d9f8-x1");
    assert_eq!(field(&web_ev, "k8s.replicaset"), "web-7d9f8", "{web_ev}");
    assert_eq!(field(&web_ev, "k8s.deployment"), "web", "{web_ev}");
    assert_eq!(field(&web_ev, "k8s.labels.app"), "web", "{web_ev}");
    assert_eq!(
        field(&web_ev, "k8s.namespace_labels.team"),
        "checkout",
        "{web_ev}"
    );
    assert_eq!(
        field(&web_ev, "k8s.namespace_annotations.contact"),
        "ops@example.org",
        "{web_ev}"
    );
    assert!(
        web_ev.get("k8s.namespace_annotations.unnamed").is_none(),
        "{web_ev}"
    );
    assert_eq!(
        field(&web_ev, "k8s.node_labels.topology.kubernetes.io/zone"),
        "z1",
        "{web_ev}"
    );
    assert_eq!(field(&web_ev, "k8s.node_name"), NODE);
    let db_ev = event(&out, "first from db-0");
    assert_eq!(field(&db_ev, "k8s.statefulset"), "db", "{db_ev}");
    let ds_ev = event(&out, "first from agent-q2");
    assert_eq!(field(&ds_ev, "k8s.daemonset"), "agent", "{ds_ev}");
    let job_ev = event(&out, "first from backup-2902-z");
    assert_eq!(field(&job_ev, "k8s.job"), "backup-2902", "{job_ev}");
    assert_eq!(field(&job_ev, "k8s.cronjob"), "backup", "{job_ev}");
    let solo_ev = event(&out, "first from solo");
    assert_eq!(field(&solo_ev, "k8s.pod_ip"), "192.0.2.10", "{solo_ev}");
    for owner_field in [
        "k8s.deployment",
        "k8s.replicaset",
        "k8s.statefulset",
        "k8s.job",
    ] {
        assert!(solo_ev.get(owner_field).is_none(), "{solo_ev}");
    }
    // Only this node's pods are kept (the one on other-node is not).
    assert_eq!(objects(&agent, "pods"), Some(6.0));
    assert_eq!(objects(&agent, "nodes"), Some(1.0));
    // The namespace labelled logs=off is excluded by its label.
    let msgs: Vec<String> = json_lines(&out)
        .iter()
        .map(|v| field(v, "message").to_string())
        .collect();
    assert!(!msgs.iter().any(|m| m == "first from noise"), "{msgs:?}");

    // A label added to the namespace while the pod runs: later events
    // carry it.
    k.patch(
        "/api/v1/namespaces/shop",
        json!({"metadata": {"labels": {"tier": "gold"}}}),
    );
    let log = log_path(&pods, "shop", "web-7d9f8-x1", &web);
    let mut n = 0;
    let later = wait_for(LONG, "an event with the new namespace label", || {
        n += 1;
        append(&log, &line(&format!("later {n}")));
        std::thread::sleep(Duration::from_millis(200));
        json_lines(&out)
            .into_iter()
            .find(|v| {
                field(v, "message").starts_with("later ")
                    && field(v, "k8s.namespace_labels.tier") == "gold"
            })
            .ok_or_else(|| "none yet".to_string())
    });
    assert_eq!(field(&later, "k8s.deployment"), "web", "{later}");
    assert_eq!(all_api_errors(&agent, "http_403"), 0.0);
}

#[test]
fn the_shipped_cluster_role_is_enough_and_a_missing_one_is_a_loud_error() {
    let _g = serial();
    let k = KubeApiServer::start();
    apply_shipped_rbac(&k);
    namespace(&k, "shop", json!({"team": "checkout"}), json!({}));
    node(&k, NODE, json!({"zone": "z1"}));
    let web = deployment_pod(&k, "shop", "web", "web-7d9f8-x1");
    let job = workload(
        &k,
        "/apis/batch/v1",
        "jobs",
        "shop",
        "once",
        job_spec(),
        None,
    );
    let once = pod(
        &k,
        "shop",
        "once-a",
        NODE,
        json!({}),
        Some(owner("batch/v1", "Job", "once", &job)),
    );

    // The agent's service account, bound to exactly the shipped role,
    // in-cluster (`api` left at `auto`).
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    let token = sa_token(&k, "petrel", "petrel", None);
    let env = in_cluster(&k, &dir.path().join("sa"), &token);
    let cfg = config(dir.path(), &pods, &out, "");
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&env_refs(&env)));
    append(
        &log_path(&pods, "shop", "web-7d9f8-x1", &web),
        &line("with rbac"),
    );
    append(
        &log_path(&pods, "shop", "once-a", &once),
        &line("job with rbac"),
    );
    let ev = event(&out, "with rbac");
    assert_eq!(field(&ev, "k8s.deployment"), "web", "{ev}");
    assert_eq!(field(&ev, "k8s.namespace_labels.team"), "checkout", "{ev}");
    assert_eq!(field(&ev, "k8s.node_labels.zone"), "z1", "{ev}");
    let ev = event(&out, "job with rbac");
    assert_eq!(field(&ev, "k8s.job"), "once", "{ev}");
    assert_eq!(
        all_api_errors(&agent, "http_403"),
        0.0,
        "{}",
        agent.stderr()
    );
    assert_eq!(
        all_api_errors(&agent, "http_401"),
        0.0,
        "{}",
        agent.stderr()
    );

    // A service account without the role: events still flow (with the
    // path's metadata), and the refusal is an error naming the verbs and
    // the resource.
    k.create(
        "/api/v1/namespaces/petrel/serviceaccounts",
        json!({"metadata": {"name": "nobody"}}),
    );
    let dir2 = tempdir();
    let (pods2, out2) = (dir2.path().join("pods"), dir2.path().join("out.ndjson"));
    let token = sa_token(&k, "petrel", "nobody", None);
    let env = in_cluster(&k, &dir2.path().join("sa"), &token);
    let cfg = config(dir2.path(), &pods2, &out2, "");
    let denied = Agent::start_with(&cfg, &dir2.path().join("data"), opts(&env_refs(&env)));
    append(
        &log_path(&pods2, "shop", "web-7d9f8-x1", &web),
        &line("without rbac"),
    );
    let ev = event(&out2, "without rbac");
    assert_eq!(field(&ev, "k8s.pod_name"), "web-7d9f8-x1", "{ev}");
    assert!(ev.get("k8s.deployment").is_none(), "{ev}");
    assert!(ev.get("k8s.namespace_labels.team").is_none(), "{ev}");
    wait_for(MEDIUM, "the 403 counted", || {
        let n = api_errors(&denied, "pods", "http_403");
        if n > 0.0 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    let stderr = denied.stderr();
    let loud = stderr
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("403 Forbidden") && l.contains("`pods`"))
        .unwrap_or_else(|| panic!("no loud 403 error about pods:\n{stderr}"));
    assert!(loud.contains("`list` and `watch`"), "{loud}");
    assert!(loud.contains("get, list, watch"), "{loud}");
    let (st, body) = health(&denied);
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
}

#[test]
fn api_server_unreachable_at_start_events_flow_after_metadata_wait() {
    // No API server at all: a port where nothing listens.
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "current-context: c\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{}', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: nothing}}\n",
            free_port()
        ),
    )
    .unwrap();
    let cfg = config(
        dir.path(),
        &pods,
        &out,
        &format!("    api: true\n    kubeconfig: {}\n", kc.display()),
    );
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&[]));
    let log = log_path(
        &pods,
        "shop",
        "web-1",
        "5f0c3a1e-1111-2222-3333-444455556666",
    );
    append(&log, &line("no api"));
    let ev = event(&out, "no api");
    assert_eq!(field(&ev, "k8s.namespace"), "shop", "{ev}");
    assert_eq!(field(&ev, "k8s.pod_name"), "web-1", "{ev}");
    assert!(all_api_errors(&agent, "unreachable") > 0.0);
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("k8s", "pods", "metadata_missing")
        ),
        1.0
    );
    let (st, body) = health(&agent);
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    let reason = body["problems"][0]["reason"].as_str().unwrap_or("");
    assert!(reason.contains("cannot reach the API server"), "{body}");
}

#[test]
fn api_server_stopped_mid_stream_loses_nothing_and_metadata_comes_back() {
    let _g = serial();
    let mut k = KubeApiServer::start();
    namespace(&k, "shop", json!({"team": "checkout"}), json!({}));
    node(&k, NODE, json!({}));
    let web = deployment_pod(&k, "shop", "web", "web-7d9f8-x1");
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    let kubeconfig = k.kubeconfig(dir.path(), None);
    let cfg = config(
        dir.path(),
        &pods,
        &out,
        &format!("    kubeconfig: {}\n", kubeconfig.display()),
    );
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&[]));
    let log = log_path(&pods, "shop", "web-7d9f8-x1", &web);
    // A steady writer for the whole test (bounded: at most 20,000 lines).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, log) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 20_000 {
                append(&log, &line(&format!("seq {n}")));
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        })
    };
    let first = event(&out, "seq 0");
    assert_eq!(field(&first, "k8s.deployment"), "web", "{first}");

    k.stop_apiserver();
    let outage = Instant::now();
    wait_for(
        LONG,
        "/health degraded while the API server is down",
        || {
            let (st, body) = health(&agent);
            if st == 200
                && body["status"] == "degraded"
                && all_api_errors(&agent, "unreachable") > 0.0
            {
                Ok(())
            } else {
                Err(format!("{st} {body}"))
            }
        },
    );
    // Events keep flowing meanwhile, with what the cache had.
    let during = json_lines(&out).len();
    wait_for(LONG, "events during the outage", || {
        let n = json_lines(&out).len();
        if n > during + 20 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
    let rest = Duration::from_secs(30).saturating_sub(outage.elapsed());
    std::thread::sleep(rest);
    k.start_apiserver();

    // Back: a pod created now and a namespace label changed now reach
    // the events.
    let late = deployment_pod_again(&k, "late-1");
    append(&log_path(&pods, "shop", "late-1", &late), &line("late pod"));
    let late_ev = event(&out, "late pod");
    assert_eq!(field(&late_ev, "k8s.deployment"), "web", "{late_ev}");
    k.patch(
        "/api/v1/namespaces/shop",
        json!({"metadata": {"labels": {"after": "outage"}}}),
    );
    wait_for(LONG, "an event with the label set after the outage", || {
        json_lines(&out)
            .into_iter()
            .find(|v| {
                field(v, "message").starts_with("seq ")
                    && field(v, "k8s.namespace_labels.after") == "outage"
            })
            .ok_or_else(|| "none yet".to_string())
    });
    wait_for(LONG, "/health ok again", || {
        let (st, body) = health(&agent);
        if st == 200 && body["status"] == "ok" {
            Ok(())
        } else {
            Err(format!("{st} {body}"))
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    // Nothing lost, nothing twice.
    let got = wait_for(LONG, "every line written", || {
        let seqs: Vec<u32> = json_lines(&out)
            .iter()
            .filter_map(|v| field(v, "message").strip_prefix("seq ")?.parse().ok())
            .collect();
        if seqs.len() >= written as usize {
            Ok(seqs)
        } else {
            Err(format!("{} of {written}", seqs.len()))
        }
    });
    let mut sorted = got.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), written as usize, "lost lines");
    assert_eq!(got.len(), written as usize, "duplicated lines");
    println!(
        "outage: {written} lines written over the test, all delivered once; {} events from the API server's stop to the end",
        json_lines(&out).len().saturating_sub(during)
    );
}

/// A second pod of the `web` Deployment's ReplicaSet of
/// [`deployment_pod`] in `shop`.
fn deployment_pod_again(k: &KubeApiServer, pod_name: &str) -> String {
    let (st, rs) = k.admin(
        "GET",
        "/apis/apps/v1/namespaces/shop/replicasets/web-7d9f8",
        None,
    );
    assert_eq!(st, 200, "{rs}");
    pod(
        k,
        "shop",
        pod_name,
        NODE,
        json!({"app": "web"}),
        Some(owner("apps/v1", "ReplicaSet", "web-7d9f8", &uid(&rs))),
    )
}

#[test]
fn a_rotated_service_account_token_is_read_again() {
    let _g = serial();
    let mut k = KubeApiServer::start();
    apply_shipped_rbac(&k);
    namespace(&k, "shop", json!({}), json!({}));
    node(&k, NODE, json!({}));
    let web = deployment_pod(&k, "shop", "web", "web-7d9f8-x1");
    // Tokens bound to a secret each: deleting the secret revokes the
    // token, so only a re-read token can work after the rotation.
    let secret = |name: &str| {
        uid(&k.create(
            "/api/v1/namespaces/petrel/secrets",
            json!({"metadata": {"name": name}}),
        ))
    };
    let s1 = secret("token-1");
    let t1 = sa_token(&k, "petrel", "petrel", Some(("token-1", &s1)));
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    let sa_dir = dir.path().join("sa");
    let env = in_cluster(&k, &sa_dir, &t1);
    let cfg = config(dir.path(), &pods, &out, "");
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&env_refs(&env)));
    let log = log_path(&pods, "shop", "web-7d9f8-x1", &web);
    append(&log, &line("before rotation"));
    let ev = event(&out, "before rotation");
    assert_eq!(field(&ev, "k8s.deployment"), "web", "{ev}");

    // Rotation: a new token in the file, the old one revoked.
    let s2 = secret("token-2");
    let t2 = sa_token(&k, "petrel", "petrel", Some(("token-2", &s2)));
    write_token(&sa_dir, &t2);
    let (st, _) = k.admin("DELETE", "/api/v1/namespaces/petrel/secrets/token-1", None);
    assert_eq!(st, 200);
    wait_for(MEDIUM, "the old token refused", || {
        let (st, _) =
            kube_apiserver::request(k.port, &k.ca(), "GET", "/api/v1/namespaces", &t1, None);
        if st == 401 {
            Ok(())
        } else {
            Err(format!("{st}"))
        }
    });
    // Every connection is made again (with whatever token the agent
    // sends now).
    k.stop_apiserver();
    k.start_apiserver();
    k.patch(
        "/api/v1/namespaces/shop",
        json!({"metadata": {"labels": {"rotated": "yes"}}}),
    );
    let mut n = 0;
    wait_for(
        LONG,
        "an event with the label set after the rotation",
        || {
            n += 1;
            append(&log, &line(&format!("after rotation {n}")));
            std::thread::sleep(Duration::from_millis(200));
            json_lines(&out)
                .into_iter()
                .find(|v| field(v, "k8s.namespace_labels.rotated") == "yes")
                .ok_or_else(|| "none yet".to_string())
        },
    );
    assert_eq!(
        all_api_errors(&agent, "http_401"),
        0.0,
        "{}",
        agent.stderr()
    );
}

#[test]
fn a_thousand_pods_on_the_node_memory_per_pod() {
    let _g = serial();
    let k = KubeApiServer::start();
    namespace(&k, "bulk", json!({"team": "load"}), json!({}));
    node(&k, NODE, json!({"zone": "z1"}));
    let d = workload(
        &k,
        "/apis/apps/v1",
        "deployments",
        "bulk",
        "app",
        selector_spec("app"),
        None,
    );
    let rs = workload(
        &k,
        "/apis/apps/v1",
        "replicasets",
        "bulk",
        "app-5c4f9",
        selector_spec("app"),
        Some(owner("apps/v1", "Deployment", "app", &d)),
    );
    let dir = tempdir();
    let (pods, out) = (dir.path().join("pods"), dir.path().join("out.ndjson"));
    let kubeconfig = k.kubeconfig(dir.path(), None);
    let cfg = config(
        dir.path(),
        &pods,
        &out,
        &format!(
            "    kubeconfig: {}\n    annotation_fields: [team-owner]\n",
            kubeconfig.display()
        ),
    );
    let agent = Agent::start_with(&cfg, &dir.path().join("data"), opts(&[]));
    wait_for(LONG, "the node listed", || {
        (objects(&agent, "nodes") == Some(1.0))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    });
    std::thread::sleep(Duration::from_secs(2));
    let rss0 = agent.metric_or_zero("process_resident_memory_bytes", &[]);
    let cache0 = agent.metric_or_zero("petrel_kubernetes_api_cache_bytes", &[]);
    const PODS: usize = 1000;
    for i in 0..PODS {
        let name = format!("app-5c4f9-{i:05}");
        let (st, v) = k.admin(
            "POST",
            "/api/v1/namespaces/bulk/pods",
            Some(&json!({
                "metadata": {
                    "name": name,
                    "labels": {"app": "app", "pod-template-hash": "5c4f9", "version": "v1"},
                    "annotations": {"team-owner": "load", "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
                    "ownerReferences": [owner("apps/v1", "ReplicaSet", "app-5c4f9", &rs)]
                },
                "spec": {"nodeName": NODE, "containers": containers()}
            })),
        );
        assert_eq!(st, 201, "{v}");
    }
    wait_for(LONG, "1000 pods in the agent's cache", || {
        let n = objects(&agent, "pods");
        (n == Some(PODS as f64))
            .then_some(())
            .ok_or_else(|| format!("{n:?}"))
    });
    std::thread::sleep(Duration::from_secs(2));
    let rss1 = agent.metric_or_zero("process_resident_memory_bytes", &[]);
    let cache1 = agent.metric_or_zero("petrel_kubernetes_api_cache_bytes", &[]);
    let per_pod_cache = (cache1 - cache0) / PODS as f64;
    let per_pod_rss = (rss1 - rss0) / PODS as f64;
    println!(
        "kubernetes API metadata, {PODS} pods on the node (3 labels, 1 named annotation kept of 2, owner): cache {per_pod_cache:.0} bytes/pod (estimate), RSS {:.1} MB -> {:.1} MB: {per_pod_rss:.0} bytes/pod",
        rss0 / 1e6,
        rss1 / 1e6
    );
    // What is kept per pod is a few strings: it must not be whole
    // objects (a pod's JSON here is about 1.5 KB, with managedFields).
    assert!(
        (100.0..1500.0).contains(&per_pod_cache),
        "cache bytes per pod: {per_pod_cache}"
    );
    // And it is the pods' keys that are kept: one event shows them.
    let p = k
        .admin("GET", "/api/v1/namespaces/bulk/pods/app-5c4f9-00007", None)
        .1;
    append(
        &log_path(&pods, "bulk", "app-5c4f9-00007", &uid(&p)),
        &line("one of many"),
    );
    let ev = event(&out, "one of many");
    assert_eq!(field(&ev, "k8s.deployment"), "app", "{ev}");
    assert_eq!(field(&ev, "k8s.annotations.team-owner"), "load", "{ev}");
    assert!(
        ev.get("k8s.annotations.kubectl.kubernetes.io/restartedAt")
            .is_none(),
        "{ev}"
    );
}

/// Pods created through the API server (a Deployment's through its
/// ReplicaSet, a CronJob's through its Job, all bound to [`NODE`]) run as
/// real containers in a private containerd under the same namespace, names
/// and uids, so containerd writes their logs and describes them over CRI.
/// `kubernetes_logs` (their stdout) and `container_files` (a file inside
/// one) both run with `runtime: containerd` and `api: true`: each event
/// carries the runtime's fields (container id, image, restart count, the
/// labels the container was started with) and the API server's (namespace
/// and node labels, the owning workloads, the pod IP).
#[test]
fn containerd_containers_of_api_pods_carry_runtime_and_api_fields() {
    use petrel_cri::lab::Containerd;
    use std::collections::BTreeMap;
    const IMAGE: &str = "localhost/crilab/busybox:1";
    let _g = serial();
    let k = KubeApiServer::start();
    namespace(&k, "shop", json!({"team": "checkout"}), json!({}));
    node(
        &k,
        NODE,
        json!({"topology.kubernetes.io/zone": "z1", "pool": "general"}),
    );
    let web = deployment_pod(&k, "shop", "web", "web-7d9f8-x1");
    k.patch(
        "/api/v1/namespaces/shop/pods/web-7d9f8-x1/status",
        json!({"status": {"podIP": "192.0.2.21", "podIPs": [{"ip": "192.0.2.21"}]}}),
    );
    let backup = cronjob_pod(&k);

    let cd = Containerd::start().expect("start containerd (scripts/cri-lab.sh setup first)");
    let lab = cd.client().expect("CRI client");
    let dir = tempdir();
    let (logs_out, files_out) = (
        dir.path().join("logs.ndjson"),
        dir.path().join("files.ndjson"),
    );
    let kubeconfig = k.kubeconfig(dir.path(), None);
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let api_keys = format!(
        "    runtime: containerd\n    containerd_socket: {}\n    api: true\n    kubeconfig: {}\n    metadata_wait_ms: 30000\n",
        cd.socket().display(),
        kubeconfig.display()
    );
    let sink = |p: &Path| {
        format!(
            "sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            p.display()
        )
    };
    write_config(
        &conf,
        "logs",
        &format!(
            "sources:\n  - type: kubernetes_logs\n    id: pods\n    pods_dir: {}\n    docker_dir: {}\n{api_keys}{}",
            cd.pods_dir().display(),
            dir.path().join("no-docker").display(),
            sink(&logs_out)
        ),
    );
    write_config(
        &conf,
        "files",
        &format!(
            "sources:\n  - type: container_files\n    id: inside\n    paths: [\"/var/log/app/*.log\"]\n{api_keys}    include: {{ namespace_labels: {{ team: checkout }} }}\n{}",
            sink(&files_out)
        ),
    );
    let agent = Agent::start_with(&conf, &dir.path().join("data"), opts(&[]));

    let run = |name: &str, uid: &str, app: &str, script: &str| {
        let labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        let pod_dir = cd.pods_dir().join(format!("shop_{name}_{uid}"));
        let sandbox = lab
            .run_pod_sandbox(name, "shop", uid, &labels, &BTreeMap::new(), &pod_dir)
            .unwrap_or_else(|e| panic!("run pod {name}: {e}\n{}", cd.log_tail(20)));
        lab.create_and_start_container(
            &sandbox,
            "main",
            IMAGE,
            &["sh", "-c", script],
            "main/0.log",
            0,
        )
        .unwrap_or_else(|e| panic!("start {name}/main: {e}\n{}", cd.log_tail(20)))
    };
    let web_c = run(
        "web-7d9f8-x1",
        &web,
        "web",
        "mkdir -p /var/log/app; echo web-out-1; echo web-out-2; echo file-1 >> /var/log/app/app.log; echo file-2 >> /var/log/app/app.log; exec sleep 600",
    );
    let backup_c = run(
        "backup-2902-z",
        &backup,
        "backup",
        "echo backup-out-1; exec sleep 600",
    );

    let api_fields = |ev: &Value| {
        assert_eq!(field(ev, "k8s.namespace_labels.team"), "checkout", "{ev}");
        assert_eq!(
            field(ev, "k8s.node_labels.topology.kubernetes.io/zone"),
            "z1",
            "{ev}"
        );
        assert_eq!(field(ev, "k8s.node_labels.pool"), "general", "{ev}");
        assert_eq!(field(ev, "k8s.node_name"), NODE, "{ev}");
    };

    // kubernetes_logs: containerd's log file of web's container.
    let ev = event(&logs_out, "web-out-2");
    api_fields(&ev);
    assert_eq!(field(&ev, "k8s.namespace"), "shop", "{ev}");
    assert_eq!(field(&ev, "k8s.pod_name"), "web-7d9f8-x1", "{ev}");
    assert_eq!(field(&ev, "k8s.pod_uid"), web, "{ev}");
    assert_eq!(field(&ev, "k8s.container_name"), "main", "{ev}");
    assert_eq!(field(&ev, "k8s.restart_count"), "0", "{ev}");
    assert_eq!(field(&ev, "stream"), "stdout", "{ev}");
    assert_eq!(field(&ev, "container.id"), web_c, "{ev}");
    assert_eq!(field(&ev, "container.image"), IMAGE, "{ev}");
    assert_eq!(field(&ev, "k8s.labels.app"), "web", "{ev}");
    assert_eq!(field(&ev, "k8s.replicaset"), "web-7d9f8", "{ev}");
    assert_eq!(field(&ev, "k8s.deployment"), "web", "{ev}");
    assert_eq!(field(&ev, "k8s.pod_ip"), "192.0.2.21", "{ev}");
    let ev = event(&logs_out, "backup-out-1");
    api_fields(&ev);
    assert_eq!(field(&ev, "container.id"), backup_c, "{ev}");
    assert_eq!(field(&ev, "k8s.labels.app"), "backup", "{ev}");
    assert_eq!(field(&ev, "k8s.job"), "backup-2902", "{ev}");
    assert_eq!(field(&ev, "k8s.cronjob"), "backup", "{ev}");
    assert!(ev.get("k8s.deployment").is_none(), "{ev}");
    assert!(ev.get("k8s.pod_ip").is_none(), "no IP set: {ev}");

    // container_files: the file inside web's container, selected by its
    // namespace's label (which only the API server knows).
    let f1 = event(&files_out, "file-1");
    event(&files_out, "file-2");
    api_fields(&f1);
    assert_eq!(field(&f1, "k8s.namespace"), "shop", "{f1}");
    assert_eq!(field(&f1, "k8s.pod_name"), "web-7d9f8-x1", "{f1}");
    assert_eq!(field(&f1, "k8s.pod_uid"), web, "{f1}");
    assert_eq!(field(&f1, "k8s.container_name"), "main", "{f1}");
    assert_eq!(field(&f1, "container.id"), web_c, "{f1}");
    assert_eq!(field(&f1, "container.image"), IMAGE, "{f1}");
    assert_eq!(field(&f1, "k8s.labels.app"), "web", "{f1}");
    assert_eq!(field(&f1, "k8s.deployment"), "web", "{f1}");
    assert_eq!(field(&f1, "k8s.replicaset"), "web-7d9f8", "{f1}");
    assert_eq!(field(&f1, "k8s.pod_ip"), "192.0.2.21", "{f1}");
    assert!(
        field(&f1, "file").ends_with("/root/var/log/app/app.log"),
        "{f1}"
    );
    assert_eq!(json_lines(&files_out).len(), 2, "only web writes a file");
    // Every container was known to both in time: nothing read without
    // its metadata.
    for (pipeline, source) in [("logs", "pods"), ("files", "inside")] {
        assert_eq!(
            agent.metric_or_zero(
                "petrel_component_errors_total",
                &source_error(pipeline, source, "metadata_missing")
            ),
            0.0,
            "{pipeline}/{source}: {}",
            agent.stderr()
        );
    }
    assert_eq!(all_api_errors(&agent, "http_403"), 0.0);
    drop(agent);
    drop(cd);
}
