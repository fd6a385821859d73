//! Which containers a source reads: namespaces, pod names, pod labels and
//! annotations, namespace labels, container names. Evaluated once per
//! container file when it is about to be opened (and again when the
//! metadata changes), never per event.

use petrel_core::config::{Map, Node};

use super::api::ApiView;
use super::path::LogPath;
use super::RuntimeInfo;

/// Keys accepted under `include:` and `exclude:`.
pub const KEYS: &[&str] = &[
    "namespaces",
    "pods",
    "pod_labels",
    "pod_annotations",
    "namespace_labels",
    "containers",
];

/// The `include` key, documented once for every plugin that reads it.
pub const INCLUDE_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "include",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Which containers are read, decided once per container file: `{namespaces, pods, containers, pod_labels, pod_annotations, namespace_labels}`. Every condition given must hold; a list matches when any of its names does (`*` wildcards), labels and annotations all must match (value `"*"`: any value). Pod labels and annotations need a runtime or the API server; namespace labels the API server."#,
};

/// The `exclude` key, documented once for every plugin that reads it.
pub const EXCLUDE_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "exclude",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Containers skipped: the same keys as `include`; any one condition given excludes."#,
};

/// One `include:` or `exclude:` block.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    /// Namespace names (`*` wildcards allowed).
    pub namespaces: Vec<String>,
    /// Pod names (`*` wildcards allowed).
    pub pods: Vec<String>,
    /// Pod labels: key and value (`*`: any value, the label present).
    pub pod_labels: Vec<(String, String)>,
    /// Pod annotations, like labels.
    pub pod_annotations: Vec<(String, String)>,
    /// Labels of the pod's namespace (from the API server), like pod
    /// labels.
    pub namespace_labels: Vec<(String, String)>,
    /// Container names (`*` wildcards allowed).
    pub containers: Vec<String>,
}

impl Selector {
    /// Reads a selector block.
    pub fn parse(n: Node<'_>) -> Option<Self> {
        let m: Map<'_> = n.as_map(KEYS)?;
        let list = |k: &str| {
            m.get(k)
                .map(|n| {
                    n.as_str_list()
                        .into_iter()
                        .map(|(s, _)| s.to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let pairs = |k: &str| -> Vec<(String, String)> {
            let Some(n) = m.get(k) else {
                return Vec::new();
            };
            let Some(map) = n.as_map_quiet() else {
                n.error(format!(
                    "`{k}` must be a mapping of names to values, e.g. `{k}: {{app: nginx}}` (`\"*\"` matches any value)"
                ));
                return Vec::new();
            };
            map.entries()
                .into_iter()
                // A value that is not text was reported by as_str.
                .filter_map(|(key, v)| v.as_str().map(|s| (key.to_string(), s.to_string())))
                .collect()
        };
        Some(Self {
            namespaces: list("namespaces"),
            pods: list("pods"),
            pod_labels: pairs("pod_labels"),
            pod_annotations: pairs("pod_annotations"),
            namespace_labels: pairs("namespace_labels"),
            containers: list("containers"),
        })
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.pods.is_empty()
            && self.pod_labels.is_empty()
            && self.pod_annotations.is_empty()
            && self.namespace_labels.is_empty()
            && self.containers.is_empty()
    }

    /// True when it looks at namespace labels (known only from the API
    /// server).
    pub fn needs_api(&self) -> bool {
        !self.namespace_labels.is_empty()
    }

    /// True when it looks at labels or annotations (known only from a
    /// runtime).
    pub fn needs_runtime(&self) -> bool {
        !self.pod_labels.is_empty() || !self.pod_annotations.is_empty()
    }

    /// Include semantics: every condition given holds (a list matches when
    /// any of its names does; labels and annotations all must match, like a
    /// Kubernetes `matchLabels`).
    pub fn matches_all(&self, c: &Facts<'_>) -> bool {
        (self.namespaces.is_empty() || any_name(&self.namespaces, c.namespace))
            && (self.pods.is_empty() || any_name(&self.pods, c.pod))
            && (self.containers.is_empty() || any_name(&self.containers, c.container))
            && self.pod_labels.iter().all(|(k, v)| has(c.labels, k, v))
            && self
                .pod_annotations
                .iter()
                .all(|(k, v)| has(c.annotations, k, v))
            && self
                .namespace_labels
                .iter()
                .all(|(k, v)| has(c.namespace_labels, k, v))
    }

    /// Exclude semantics: any single condition given holds.
    pub fn matches_any(&self, c: &Facts<'_>) -> bool {
        any_name(&self.namespaces, c.namespace)
            || any_name(&self.pods, c.pod)
            || any_name(&self.containers, c.container)
            || self.pod_labels.iter().any(|(k, v)| has(c.labels, k, v))
            || self
                .pod_annotations
                .iter()
                .any(|(k, v)| has(c.annotations, k, v))
            || self
                .namespace_labels
                .iter()
                .any(|(k, v)| has(c.namespace_labels, k, v))
    }
}

/// What is known of one container, for selection.
pub struct Facts<'a> {
    /// Namespace, when known.
    pub namespace: Option<&'a str>,
    /// Pod name, when known.
    pub pod: Option<&'a str>,
    /// Container name, when known.
    pub container: Option<&'a str>,
    /// Pod labels (empty when unknown).
    pub labels: &'a [(String, String)],
    /// Pod annotations (empty when unknown).
    pub annotations: &'a [(String, String)],
    /// Labels of the pod's namespace (empty when unknown).
    pub namespace_labels: &'a [(String, String)],
}

impl<'a> Facts<'a> {
    /// Facts from the runtime (files inside containers) and, when known,
    /// the API server.
    pub fn of_runtime(rt: &'a RuntimeInfo, api: Option<&'a ApiView>) -> Self {
        let mut f = Self {
            namespace: rt.namespace.as_deref(),
            pod: rt.pod_name.as_deref(),
            container: rt.container_name.as_deref(),
            labels: &rt.labels,
            annotations: &rt.annotations,
            namespace_labels: &[],
        };
        f.add_api(api);
        f
    }

    /// What the API server adds: namespace labels, and the pod's labels
    /// and annotations where the runtime has none.
    fn add_api(&mut self, api: Option<&'a ApiView>) {
        let Some(api) = api else { return };
        if let Some(ns) = &api.namespace {
            self.namespace_labels = &ns.labels;
        }
        if let Some(pod) = &api.pod {
            if self.labels.is_empty() {
                self.labels = &pod.labels;
            }
            if self.annotations.is_empty() {
                self.annotations = &pod.annotations;
            }
            if self.namespace.is_none() {
                self.namespace = Some(&pod.namespace);
            }
            if self.pod.is_none() {
                self.pod = Some(&pod.name);
            }
        }
    }

    /// Facts from the path and, when known, the runtime and the API
    /// server.
    pub fn of(p: &'a LogPath, rt: Option<&'a RuntimeInfo>, api: Option<&'a ApiView>) -> Self {
        let (mut namespace, mut pod, mut container) = match p {
            LogPath::Cri {
                namespace,
                pod,
                container,
                ..
            } => (
                Some(namespace.as_str()),
                Some(pod.as_str()),
                Some(container.as_str()),
            ),
            LogPath::Docker { .. } => (None, None, None),
        };
        if let Some(rt) = rt {
            namespace = namespace.or(rt.namespace.as_deref());
            pod = pod.or(rt.pod_name.as_deref());
            container = container.or(rt.container_name.as_deref());
        }
        let mut f = Self {
            namespace,
            pod,
            container,
            labels: rt.map_or(&[][..], |r| &r.labels[..]),
            annotations: rt.map_or(&[][..], |r| &r.annotations[..]),
            namespace_labels: &[],
        };
        f.add_api(api);
        f
    }
}

fn any_name(list: &[String], name: Option<&str>) -> bool {
    name.is_some_and(|n| list.iter().any(|p| wildcard(p, n)))
}

fn has(pairs: &[(String, String)], k: &str, v: &str) -> bool {
    pairs
        .iter()
        .any(|(pk, pv)| pk == k && (v == "*" || pv == v))
}

/// `*` matches any run of characters; everything else literally.
pub fn wildcard(pattern: &str, s: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == s;
    };
    let Some(mut s) = s.strip_prefix(head) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let Some((last, middle)) = parts.split_last() else {
        return true;
    };
    for p in middle {
        match s.find(p) {
            Some(i) => s = &s[i + p.len()..],
            None => return false,
        }
    }
    s.len() >= last.len() && s.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard("kube-*", "kube-system"));
        assert!(wildcard("*", ""));
        assert!(wildcard("a*b*c", "aXXbYYc"));
        assert!(!wildcard("a*b*c", "aXXcYYb"));
        assert!(wildcard("web", "web"));
        assert!(!wildcard("web", "web2"));
        assert!(!wildcard("ab*ba", "aba"));
    }

    fn facts<'a>(labels: &'a [(String, String)]) -> Facts<'a> {
        Facts {
            namespace: Some("default"),
            pod: Some("web-1"),
            container: Some("nginx"),
            labels,
            annotations: &[],
            namespace_labels: &[],
        }
    }

    #[test]
    fn include_needs_every_condition_exclude_any() {
        let labels = vec![("app".to_string(), "nginx".to_string())];
        let inc = Selector {
            namespaces: vec!["default".into()],
            pod_labels: vec![("app".into(), "nginx".into())],
            ..Default::default()
        };
        assert!(inc.matches_all(&facts(&labels)));
        assert!(!inc.matches_all(&facts(&[])));
        let exc = Selector {
            namespaces: vec!["kube-system".into()],
            containers: vec!["ngin*".into()],
            ..Default::default()
        };
        assert!(exc.matches_any(&facts(&[])));
        assert!(!Selector::default().matches_any(&facts(&labels)));
        assert!(Selector::default().matches_all(&facts(&labels)));
    }
}
