//! What the agent keeps of the API server's objects: per object only the
//! keys events and selection use, never whole objects, so memory is
//! bounded by the number of pods on the node (and namespaces, and the
//! workload controllers of the cluster), times what is kept of each.
//!
//! Each kind is a map replaced whole by a relist and patched by watch
//! events. The generation moves only when something kept changed, not at
//! every status update the watch delivers, since each move makes every
//! source re-derive the metadata of its open files.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Deserialize;

/// Pairs of text kept for an object (labels, chosen annotations), sorted
/// by key.
pub type Pairs = Box<[(String, String)]>;

/// The kinds the agent follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Pods of this node.
    Pods,
    /// Every namespace.
    Namespaces,
    /// This node.
    Node,
    /// ReplicaSets (metadata only), to find their Deployment.
    ReplicaSets,
    /// Jobs (metadata only), to find their CronJob.
    Jobs,
}

impl Kind {
    /// Every kind, in the order they are started.
    pub const ALL: [Kind; 5] = [
        Kind::Namespaces,
        Kind::Node,
        Kind::ReplicaSets,
        Kind::Jobs,
        Kind::Pods,
    ];

    /// The resource name, as RBAC rules and messages name it.
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::Namespaces => "namespaces",
            Kind::Node => "nodes",
            Kind::ReplicaSets => "replicasets",
            Kind::Jobs => "jobs",
        }
    }

    /// The API group, as RBAC rules name it (`""`: core).
    pub fn group(self) -> &'static str {
        match self {
            Kind::ReplicaSets => "apps",
            Kind::Jobs => "batch",
            _ => "",
        }
    }
}

/// The controller of an object (its `ownerReferences` entry with
/// `controller: true`), for the kinds that name a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `ReplicaSet`, `Deployment`, `StatefulSet`, `DaemonSet`, `Job` or
    /// `CronJob`.
    pub kind: OwnerKind,
    /// Its name (same namespace as the owned object).
    pub name: String,
}

/// The owner kinds that become event fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerKind {
    /// `apps/v1 ReplicaSet`.
    ReplicaSet,
    /// `apps/v1 Deployment`.
    Deployment,
    /// `apps/v1 StatefulSet`.
    StatefulSet,
    /// `apps/v1 DaemonSet`.
    DaemonSet,
    /// `batch/v1 Job`.
    Job,
    /// `batch/v1 CronJob`.
    CronJob,
}

impl OwnerKind {
    fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "ReplicaSet" => OwnerKind::ReplicaSet,
            "Deployment" => OwnerKind::Deployment,
            "StatefulSet" => OwnerKind::StatefulSet,
            "DaemonSet" => OwnerKind::DaemonSet,
            "Job" => OwnerKind::Job,
            "CronJob" => OwnerKind::CronJob,
            _ => return None,
        })
    }

    /// The event field that names it (`k8s.deployment` ...).
    pub fn field(self) -> &'static str {
        match self {
            OwnerKind::ReplicaSet => "k8s.replicaset",
            OwnerKind::Deployment => "k8s.deployment",
            OwnerKind::StatefulSet => "k8s.statefulset",
            OwnerKind::DaemonSet => "k8s.daemonset",
            OwnerKind::Job => "k8s.job",
            OwnerKind::CronJob => "k8s.cronjob",
        }
    }
}

/// What is kept of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Every label (events carry them all, as from the runtime).
    pub labels: Pairs,
    /// The annotations named in some source's configuration.
    pub annotations: Pairs,
    /// `status.podIP`, once assigned.
    pub pod_ip: Option<String>,
    /// Its controller, when a workload kind.
    pub owner: Option<Owner>,
}

/// What is kept of a namespace or the node: labels and the named
/// annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelsMeta {
    /// Every label.
    pub labels: Pairs,
    /// The annotations named in some source's configuration.
    pub annotations: Pairs,
}

// --- The JSON the API server sends, only the fields read. ---

/// `metadata` of any object (full or `PartialObjectMetadata`).
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `name`.
    #[serde(default)]
    pub name: String,
    /// `namespace` (empty for cluster-wide kinds).
    #[serde(default)]
    pub namespace: String,
    /// `uid`.
    #[serde(default)]
    pub uid: String,
    /// `resourceVersion`: where a watch resumes.
    #[serde(default)]
    pub resource_version: String,
    /// `labels`.
    #[serde(default)]
    pub labels: Option<HashMap<String, String>>,
    /// `annotations` (filtered when kept).
    #[serde(default)]
    pub annotations: Option<HashMap<String, String>>,
    /// `ownerReferences`.
    #[serde(default)]
    pub owner_references: Option<Vec<OwnerReference>>,
}

/// One `ownerReferences` entry.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    /// The owner's kind (`ReplicaSet` ...).
    #[serde(default)]
    pub kind: String,
    /// The owner's name.
    #[serde(default)]
    pub name: String,
    /// Whether it is the managing controller.
    #[serde(default)]
    pub controller: Option<bool>,
}

/// An object: its metadata and, for pods, the status' IP.
#[derive(Debug, Deserialize, Default)]
pub struct Object {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status` (pods).
    #[serde(default)]
    pub status: Option<Status>,
}

/// The part of a pod's `status` kept.
#[derive(Debug, Deserialize, Default)]
pub struct Status {
    /// `podIP` (not the camel case of the field name).
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
}

fn sorted(m: Option<HashMap<String, String>>, keep: impl Fn(&str) -> bool) -> Pairs {
    let mut v: Vec<(String, String)> = m
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| keep(k))
        .collect();
    v.sort();
    v.into_boxed_slice()
}

fn controller(refs: Option<Vec<OwnerReference>>) -> Option<Owner> {
    let refs = refs?;
    // The controller is the one that names the workload; without one
    // marked, the first reference of a known kind.
    let pick = refs
        .iter()
        .find(|r| r.controller == Some(true))
        .or_else(|| refs.iter().find(|r| OwnerKind::parse(&r.kind).is_some()))?;
    Some(Owner {
        kind: OwnerKind::parse(&pick.kind)?,
        name: pick.name.clone(),
    })
}

/// The objects kept, one map per kind, and the generation.
#[derive(Default)]
pub struct Store {
    inner: RwLock<Inner>,
    generation: AtomicU64,
    /// Set once the node was listed (found or not): until then an event
    /// read would miss the node's labels for no reason but timing.
    node_listed: std::sync::atomic::AtomicBool,
    /// Annotation keys some source named: the only ones kept.
    wanted: RwLock<HashSet<String>>,
}

#[derive(Default)]
struct Inner {
    /// By pod uid.
    pods: HashMap<String, Arc<PodMeta>>,
    /// By name.
    namespaces: HashMap<String, Arc<LabelsMeta>>,
    node: Option<Arc<LabelsMeta>>,
    /// By `namespace/name`: only those with a controller (a ReplicaSet
    /// or Job without one adds nothing to an event).
    replicasets: HashMap<String, Owner>,
    jobs: HashMap<String, Owner>,
}

/// One kept object, ready to go into its kind's map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// A pod, by uid.
    Pod(String, Arc<PodMeta>),
    /// A namespace, by name.
    Namespace(String, Arc<LabelsMeta>),
    /// The node.
    Node(Arc<LabelsMeta>),
    /// A ReplicaSet or Job by `namespace/name`, with its controller.
    Owned(Kind, String, Option<Owner>),
}

impl Store {
    /// Changes whenever something kept does.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Marks the node as listed with nothing found (its list was refused).
    pub fn mark_node_listed(&self) {
        self.node_listed.store(true, Ordering::Release);
    }

    /// Whether the node was listed once (it may not exist, or not be
    /// readable: then it is listed with nothing found).
    pub fn node_listed(&self) -> bool {
        self.node_listed.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds annotation keys to keep; true when one is new (what is kept
    /// must then be listed again to have it).
    pub fn want_annotations<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> bool {
        let mut w = self.wanted.write();
        let mut new = false;
        for k in keys {
            new |= w.insert(k.to_string());
        }
        new
    }

    /// What is kept of `o`, an object of `kind`; `None`: nothing to keep.
    pub fn keep(&self, kind: Kind, o: Object) -> Option<Kept> {
        let m = o.metadata;
        let wanted = self.wanted.read();
        let annotations = |a| sorted(a, |k| wanted.contains(k));
        Some(match kind {
            Kind::Pods => Kept::Pod(
                m.uid,
                Arc::new(PodMeta {
                    namespace: m.namespace,
                    name: m.name,
                    labels: sorted(m.labels, |_| true),
                    annotations: annotations(m.annotations),
                    pod_ip: o.status.and_then(|s| s.pod_ip).filter(|ip| !ip.is_empty()),
                    owner: controller(m.owner_references),
                }),
            ),
            Kind::Namespaces | Kind::Node => {
                let meta = Arc::new(LabelsMeta {
                    labels: sorted(m.labels, |_| true),
                    annotations: annotations(m.annotations),
                });
                if kind == Kind::Node {
                    Kept::Node(meta)
                } else {
                    Kept::Namespace(m.name, meta)
                }
            }
            Kind::ReplicaSets | Kind::Jobs => Kept::Owned(
                kind,
                format!("{}/{}", m.namespace, m.name),
                controller(m.owner_references),
            ),
        })
    }

    /// Replaces everything kept of `kind` (a relist).
    pub fn replace(&self, kind: Kind, objects: Vec<Kept>) {
        let changed;
        {
            let mut g = self.inner.write();
            match kind {
                Kind::Pods => {
                    let new: HashMap<_, _> = objects
                        .into_iter()
                        .filter_map(|k| match k {
                            Kept::Pod(uid, p) => Some((uid, p)),
                            _ => None,
                        })
                        .collect();
                    changed = new != g.pods;
                    g.pods = new;
                }
                Kind::Namespaces => {
                    let new: HashMap<_, _> = objects
                        .into_iter()
                        .filter_map(|k| match k {
                            Kept::Namespace(n, m) => Some((n, m)),
                            _ => None,
                        })
                        .collect();
                    changed = new != g.namespaces;
                    g.namespaces = new;
                }
                Kind::Node => {
                    let new = objects.into_iter().find_map(|k| match k {
                        Kept::Node(m) => Some(m),
                        _ => None,
                    });
                    changed = new != g.node;
                    g.node = new;
                    self.node_listed.store(true, Ordering::Release);
                }
                Kind::ReplicaSets | Kind::Jobs => {
                    let new: HashMap<_, _> = objects
                        .into_iter()
                        .filter_map(|k| match k {
                            Kept::Owned(_, key, Some(o)) => Some((key, o)),
                            _ => None,
                        })
                        .collect();
                    let map = if kind == Kind::Jobs {
                        &mut g.jobs
                    } else {
                        &mut g.replicasets
                    };
                    changed = new != *map;
                    *map = new;
                }
            }
            shrink(&mut g);
        }
        if changed {
            self.bump();
        }
    }

    /// Applies one watch event: `deleted` removes, otherwise adds or
    /// updates.
    pub fn apply(&self, kept: Kept, deleted: bool) {
        let mut g = self.inner.write();
        let changed = match kept {
            Kept::Pod(uid, p) => upsert(&mut g.pods, uid, (!deleted).then_some(p)),
            Kept::Namespace(n, m) => upsert(&mut g.namespaces, n, (!deleted).then_some(m)),
            Kept::Node(m) => {
                let new = (!deleted).then_some(m);
                let changed = new != g.node;
                g.node = new;
                changed
            }
            Kept::Owned(kind, key, o) => {
                let map = if kind == Kind::Jobs {
                    &mut g.jobs
                } else {
                    &mut g.replicasets
                };
                upsert(map, key, if deleted { None } else { o })
            }
        };
        drop(g);
        if changed {
            self.bump();
        }
    }

    /// The pod of uid `uid`.
    pub fn pod(&self, uid: &str) -> Option<Arc<PodMeta>> {
        self.inner.read().pods.get(uid).cloned()
    }

    /// The pod `name` in `namespace`: for a log path whose uid the API
    /// server does not know (a static pod's files are named with its
    /// config's uid, its mirror pod in the API has another). A scan, done
    /// only when the uid missed: pods of one node are a few hundred.
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<PodMeta>> {
        self.inner
            .read()
            .pods
            .values()
            .find(|p| p.name == name && p.namespace == namespace)
            .cloned()
    }

    /// The namespace `name`.
    pub fn namespace(&self, name: &str) -> Option<Arc<LabelsMeta>> {
        self.inner.read().namespaces.get(name).cloned()
    }

    /// This node.
    pub fn node(&self) -> Option<Arc<LabelsMeta>> {
        self.inner.read().node.clone()
    }

    /// The chain of workloads above `owner` in `namespace`, starting with
    /// it: a ReplicaSet's Deployment, a Job's CronJob.
    pub fn owners(&self, namespace: &str, owner: &Owner) -> Vec<Owner> {
        let g = self.inner.read();
        let mut chain = vec![owner.clone()];
        let mut cur = owner.clone();
        // Deployment > ReplicaSet and CronJob > Job are the only chains
        // of built-in kinds; a bound stops a cycle a bad object could make.
        for _ in 0..4 {
            let key = format!("{namespace}/{}", cur.name);
            let next = match cur.kind {
                OwnerKind::ReplicaSet => g.replicasets.get(&key),
                OwnerKind::Job => g.jobs.get(&key),
                _ => None,
            };
            match next {
                Some(n) if !chain.contains(n) => {
                    chain.push(n.clone());
                    cur = n.clone();
                }
                _ => break,
            }
        }
        chain
    }

    /// How many objects of each kind are kept.
    pub fn counts(&self) -> [(Kind, usize); 5] {
        let g = self.inner.read();
        [
            (Kind::Pods, g.pods.len()),
            (Kind::Namespaces, g.namespaces.len()),
            (Kind::Node, usize::from(g.node.is_some())),
            (Kind::ReplicaSets, g.replicasets.len()),
            (Kind::Jobs, g.jobs.len()),
        ]
    }

    /// An estimate of the heap bytes kept: the maps' tables and every
    /// string's capacity (what the cache costs per object, measured).
    pub fn heap_bytes(&self) -> usize {
        let g = self.inner.read();
        let pairs = |p: &Pairs| {
            p.len() * std::mem::size_of::<(String, String)>()
                + p.iter()
                    .map(|(k, v)| k.capacity() + v.capacity())
                    .sum::<usize>()
        };
        let labels = |m: &LabelsMeta| {
            std::mem::size_of::<LabelsMeta>() + pairs(&m.labels) + pairs(&m.annotations)
        };
        let owner = |o: &Owner| std::mem::size_of::<Owner>() + o.name.capacity();
        let entry = |k: &String| k.capacity() + 16;
        let mut n = 0;
        for (k, p) in &g.pods {
            n += entry(k)
                + std::mem::size_of::<PodMeta>()
                + p.namespace.capacity()
                + p.name.capacity()
                + pairs(&p.labels)
                + pairs(&p.annotations)
                + p.pod_ip.as_ref().map_or(0, |s| s.capacity())
                + p.owner.as_ref().map_or(0, owner);
        }
        for (k, m) in &g.namespaces {
            n += entry(k) + labels(m);
        }
        n += g.node.as_deref().map_or(0, labels);
        for (k, o) in g.replicasets.iter().chain(g.jobs.iter()) {
            n += entry(k) + owner(o);
        }
        n
    }
}

fn upsert<V: PartialEq>(map: &mut HashMap<String, V>, key: String, v: Option<V>) -> bool {
    match v {
        Some(v) => {
            if map.get(&key) == Some(&v) {
                return false;
            }
            map.insert(key, v);
            true
        }
        None => map.remove(&key).is_some(),
    }
}

/// Gives back the memory of maps that shrank a lot (a relist after many
/// pods went).
fn shrink(g: &mut Inner) {
    fn s<V>(m: &mut HashMap<String, V>) {
        if m.capacity() > 64 && m.capacity() > 4 * m.len() {
            m.shrink_to_fit();
        }
    }
    s(&mut g.pods);
    s(&mut g.namespaces);
    s(&mut g.replicasets);
    s(&mut g.jobs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Object {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn keeps_only_named_annotations_and_follows_owners() {
        let s = Store::default();
        s.want_annotations(["team"]);
        let pod = obj(
            r#"{"metadata":{"name":"web-abc-1","namespace":"shop","uid":"u1","labels":{"app":"web"},
                "annotations":{"team":"a","kubectl.kubernetes.io/last-applied-configuration":"{...}"},
                "ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-abc","uid":"r1","controller":true}]},
               "spec":{"nodeName":"n1"},"status":{"podIP":"10.0.0.7"}}"#,
        );
        let kept = s.keep(Kind::Pods, pod).unwrap();
        let g0 = s.generation();
        s.replace(Kind::Pods, vec![kept.clone()]);
        assert_eq!(s.generation(), g0 + 1);
        // The same content again moves nothing.
        s.apply(kept, false);
        assert_eq!(s.generation(), g0 + 1);
        let p = s.pod("u1").unwrap();
        assert_eq!(&*p.annotations, &[("team".to_string(), "a".to_string())]);
        assert_eq!(p.pod_ip.as_deref(), Some("10.0.0.7"));
        let rs = obj(
            r#"{"metadata":{"name":"web-abc","namespace":"shop","ownerReferences":[{"kind":"Deployment","name":"web","controller":true}]}}"#,
        );
        let kept = s.keep(Kind::ReplicaSets, rs).unwrap();
        s.replace(Kind::ReplicaSets, vec![kept]);
        let chain = s.owners("shop", p.owner.as_ref().unwrap());
        let names: Vec<(&str, &str)> = chain
            .iter()
            .map(|o| (o.kind.field(), o.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [("k8s.replicaset", "web-abc"), ("k8s.deployment", "web")]
        );
        s.apply(
            Kept::Owned(
                Kind::Jobs,
                "shop/backup-1".into(),
                Some(Owner {
                    kind: OwnerKind::CronJob,
                    name: "backup".into(),
                }),
            ),
            false,
        );
        let chain = s.owners(
            "shop",
            &Owner {
                kind: OwnerKind::Job,
                name: "backup-1".into(),
            },
        );
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].kind, OwnerKind::CronJob);
        assert!(s.heap_bytes() > 0);
    }
}
