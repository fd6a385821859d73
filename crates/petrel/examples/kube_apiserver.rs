//! The tests' real Kubernetes API server (etcd and kube-apiserver
//! v1.34.4, started exactly as the `kubernetes_api` tests start it:
//! `tests/kube_apiserver/mod.rs` through `tests/server/mod.rs`), kept up
//! with a node full of pods for `bench/kubernetes.py --mode api`.
//!
//! ```text
//! kube_apiserver DIR PODS NODE
//! ```
//!
//! Creates namespace `bench` (2 labels), node `NODE` (2 labels), a
//! Deployment, its ReplicaSet and `PODS` pods of it bound to `NODE` (3
//! labels, 2 annotations, a pod IP each), writes `DIR/kubeconfig`, prints
//! one JSON line (`{"kubeconfig": ..., "namespace": ..., "pods": [[name,
//! uid], ...]}`) and keeps both servers up until its stdin closes (at
//! most 4 hours), then stops them.
//!
//! Build: `cargo build --workspace --profile ci --locked --example
//! kube_apiserver` (needs `scripts/kube-apiserver.sh`).

#[path = "../tests/kube_apiserver/mod.rs"]
mod kube_apiserver;
#[path = "../tests/server/mod.rs"]
mod server;

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

fn uid(v: &serde_json::Value) -> String {
    v["metadata"]["uid"]
        .as_str()
        .unwrap_or_else(|| panic!("no uid in {v}"))
        .to_string()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, pods, node] = args.as_slice() else {
        eprintln!("usage: kube_apiserver DIR PODS NODE");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let pods: usize = pods.parse().expect("PODS is a number");
    let k = kube_apiserver::KubeApiServer::start();
    const NS: &str = "bench";
    k.create(
        "/api/v1/namespaces",
        json!({"metadata": {"name": NS, "labels": {"team": "load", "env": "bench"}}}),
    );
    k.create(
        "/api/v1/nodes",
        json!({"metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": "z1", "pool": "general"}}}),
    );
    let containers = json!([{"name": "app", "image": "busybox"}]);
    let spec = json!({
        "selector": {"matchLabels": {"app": "app"}},
        "template": {"metadata": {"labels": {"app": "app"}}, "spec": {"containers": containers}}
    });
    let d = uid(&k.create(
        &format!("/apis/apps/v1/namespaces/{NS}/deployments"),
        json!({"metadata": {"name": "app"}, "spec": spec}),
    ));
    let rs = uid(&k.create(
        &format!("/apis/apps/v1/namespaces/{NS}/replicasets"),
        json!({"metadata": {"name": "app-5c4f9", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "app", "uid": d, "controller": true}
        ]}, "spec": spec}),
    ));
    let mut made = Vec::with_capacity(pods);
    for i in 0..pods {
        let name = format!("app-5c4f9-{i:05}");
        let p = k.create(
            &format!("/api/v1/namespaces/{NS}/pods"),
            json!({
                "metadata": {
                    "name": name,
                    "labels": {"app": "app", "pod-template-hash": "5c4f9", "version": "v1"},
                    "annotations": {"team-owner": "load", "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-5c4f9", "uid": rs, "controller": true}]
                },
                "spec": {"nodeName": node, "containers": containers}
            }),
        );
        let ip = format!("10.244.{}.{}", i / 250, i % 250 + 1);
        k.patch(
            &format!("/api/v1/namespaces/{NS}/pods/{name}/status"),
            json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}),
        );
        made.push((name, uid(&p)));
    }
    let kubeconfig = k.kubeconfig(&dir, None);
    println!(
        "{}",
        json!({"kubeconfig": kubeconfig, "namespace": NS, "pods": made})
    );
    // Until the bench closes our stdin (or exits), bounded.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = tx.send(());
    });
    let deadline = Instant::now() + Duration::from_secs(4 * 3600);
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            _ => break,
        }
    }
    drop(k);
}
