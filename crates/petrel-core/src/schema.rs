//! What an event looks like when it leaves: the one module every encoder
//! asks for the names, the shape and the selection of the fields it
//! writes.
//!
//! - **Names.** Petrel's own names of the metadata its sources attach
//!   (`file`, `host`, `k8s.pod_name`, `k8s.labels.<key>`, ...; the *flat*
//!   names, which processors and conditions use) and their names in each
//!   [`Layout`]: [`NAMES`], one row per name, is the table the component
//!   reference prints ([`reference_table`]). A name that is not in it is
//!   written as it is in every layout. A new metadata field (issue 42) is
//!   one more row; a new layout (issue 44) one more column.
//! - **Shape.** [`Layout::nests`]: objects (`{"kubernetes":{"pod":{"name":
//!   ...}}}`) or dotted keys (`"k8s.pod.name"`); `dedot` replaces the dots
//!   of label and annotation keys with `_`.
//! - **Selection.** `only_fields` and `except_fields` ([`FieldPath`]), the
//!   key and format of the event time ([`TimeFormat`]).
//!
//! [`Output`] holds a sink's choice; [`Output::plan`] resolves it once per
//! batch (the metadata is the batch's), and [`Output::write_json`] writes
//! one event. The default output (`flat`, nothing selected, RFC 3339 times)
//! takes the writer of [`crate::encode::write_event_json`], unchanged.

use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt::Write as _;

use crate::encode::{write_event_json, JsonShape};
use crate::event::{Event, EventBatch, SourceInfo, Value};
use crate::json::{write_json_str, write_json_value, EncodeStats};
use petrel_time::write_rfc3339;

/// True when the second segment of a dotted name names a map of keys
/// that may hold dots themselves (`k8s.labels.app.kubernetes.io/name`):
/// `labels`, `annotations` or a name ending with `_labels` or
/// `_annotations`.
pub fn is_family(segment: &str) -> bool {
    segment == "labels"
        || segment == "annotations"
        || segment.ends_with("_labels")
        || segment.ends_with("_annotations")
}

/// The segments of a dotted field name: split at every dot, except that
/// the key of a label or annotation stays one segment
/// (`k8s.labels.app.kubernetes.io/name` is `k8s`, `labels`,
/// `app.kubernetes.io/name`).
pub fn segments(name: &str) -> Vec<&str> {
    let mut out = Vec::with_capacity(3);
    let mut rest = name;
    while let Some((head, tail)) = rest.split_once('.') {
        out.push(head);
        rest = tail;
        if out.len() == 2 && is_family(head) {
            break;
        }
    }
    out.push(rest);
    out
}

/// True when `name` is `prefix` or lies below it (`k8s.pod_name` is
/// under `k8s`; `k8s.labels.app.kubernetes.io/name` is under
/// `k8s.labels` but not under `k8s.labels.app`).
pub fn is_under(name: &str, prefix: &str) -> bool {
    if name.len() == prefix.len() {
        return name == prefix;
    }
    if !(name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'.')) {
        return false;
    }
    // Dots inside a label key are not boundaries: compare by segments
    // when the prefix reaches into a family.
    let p = segments(prefix);
    if p.len() <= 2 {
        return true;
    }
    let n = segments(name);
    n.len() >= p.len() && n[..p.len()] == p[..]
}

/// Puts `value` at `path` inside the object `root` (objects created on
/// the way; a non-object in the way is replaced).
pub fn insert_path(root: &mut Value, path: &[&str], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *root = value;
        return;
    };
    if !matches!(root, Value::Object(_)) {
        *root = Value::Object(Vec::new());
    }
    let Value::Object(entries) = root else { return };
    let i = match entries.iter().position(|(k, _)| k == first) {
        Some(i) => i,
        None => {
            entries.push(((*first).to_string().into(), Value::Null));
            entries.len() - 1
        }
    };
    insert_path(&mut entries[i].1, rest, value);
}

/// A named way of writing the metadata, chosen per sink with
/// `metadata: {layout: ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Petrel's names as dotted keys (`"k8s.pod_name"`): the default.
    #[default]
    Flat,
    /// Petrel's names as objects (`{"k8s":{"pod_name":...}}`).
    Nested,
    /// Elastic Common Schema, as Filebeat writes it (`log.file.path`,
    /// `kubernetes.pod.name`, `@timestamp`).
    Ecs,
    /// OpenTelemetry semantic conventions (`k8s.pod.name`,
    /// `log.file.path`) as dotted keys; the opentelemetry sink puts the
    /// metadata into the resource, as the Collector does.
    Otel,
    /// The `kubernetes` object of Fluent Bit's kubernetes filter
    /// (`pod_name`, `namespace_name`, `docker_id`, ...), the line as `log`.
    FluentBit,
    /// The names of Vector's `kubernetes_logs` source
    /// (`kubernetes.pod_namespace`, `kubernetes.pod_labels`), with
    /// `source_type`.
    Vector,
}

impl Layout {
    /// Every layout, in the order of the reference table's columns.
    pub const ALL: [Layout; 6] = [
        Layout::Flat,
        Layout::Nested,
        Layout::Ecs,
        Layout::Otel,
        Layout::FluentBit,
        Layout::Vector,
    ];

    /// Names accepted in configuration, in the order of [`Layout::ALL`].
    pub const NAMES: &'static [&'static str] =
        &["flat", "nested", "ecs", "otel", "fluent-bit", "vector"];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Parses a configuration name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
    }

    /// True when dotted names are written as objects.
    pub fn nests(self) -> bool {
        !matches!(self, Layout::Flat | Layout::Otel)
    }

    /// `dedot` when the sink does not say: on for `ecs`, as Filebeat's
    /// `labels.dedot` and `annotations.dedot`.
    pub fn default_dedot(self) -> bool {
        matches!(self, Layout::Ecs)
    }

    /// The key of the message.
    pub fn message_key(self) -> &'static str {
        match self {
            Layout::FluentBit => "log",
            _ => "message",
        }
    }

    /// The key of the event time when neither the sink nor
    /// `timestamp_key` says otherwise.
    pub fn time_key(self) -> &'static str {
        match self {
            Layout::Ecs => "@timestamp",
            // The key Fluent Bit's `cri` and `docker` parsers keep the
            // time under (`Time_Keep`): what its users' mappings have.
            Layout::FluentBit => "time",
            _ => "timestamp",
        }
    }

    /// True when the source's `type` is written as `source_type`.
    pub fn writes_source_type(self) -> bool {
        matches!(self, Layout::Vector)
    }

    fn column(self) -> usize {
        match self {
            Layout::Flat | Layout::Nested => usize::MAX,
            Layout::Ecs => 0,
            Layout::Otel => 1,
            Layout::FluentBit => 2,
            Layout::Vector => 3,
        }
    }
}

/// One metadata name and its names in the layouts that rename it. A name
/// ending with `.*` stands for a family of keys (labels, annotations):
/// the key follows the family's name in every layout.
#[derive(Debug, Clone, Copy)]
pub struct NameRow {
    /// Petrel's name: in conditions, templates, processors, and written
    /// by the `flat` layout (the `nested` one splits it at its dots).
    pub flat: &'static str,
    /// In `ecs`, `otel`, `fluent-bit` and `vector`, in this order.
    pub names: [&'static str; 4],
    /// In `otel` on the opentelemetry sink: an attribute of each log
    /// record (as the Collector's `filelog` writes `log.file.path`),
    /// not of the resource.
    pub otel_record: bool,
    /// Which sources set it.
    pub set_by: &'static str,
}

/// Every metadata name that a layout renames, with its name in each.
/// Names not listed are written as they are (split at their dots where
/// the layout nests).
pub const NAMES: &[NameRow] = &[
    NameRow {
        flat: "file",
        names: ["log.file.path", "log.file.path", "file", "file"],
        otel_record: true,
        set_by: "file sources (the path read)",
    },
    NameRow {
        flat: "host",
        names: ["host.name", "host.name", "host", "host"],
        otel_record: false,
        set_by: "every source (this machine's name)",
    },
    NameRow {
        flat: "stream",
        names: ["stream", "log.iostream", "stream", "stream"],
        otel_record: true,
        set_by: "container logs (`stdout`/`stderr`)",
    },
    NameRow {
        flat: "source_address",
        names: [
            "log.source.address",
            "network.peer.address",
            "source_address",
            "source_address",
        ],
        otel_record: false,
        set_by: "network sources (the peer's address)",
    },
    NameRow {
        flat: "k8s.namespace",
        names: [
            "kubernetes.namespace",
            "k8s.namespace.name",
            "kubernetes.namespace_name",
            "kubernetes.pod_namespace",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files`",
    },
    NameRow {
        flat: "k8s.pod_name",
        names: [
            "kubernetes.pod.name",
            "k8s.pod.name",
            "kubernetes.pod_name",
            "kubernetes.pod_name",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files`",
    },
    NameRow {
        flat: "k8s.pod_uid",
        names: [
            "kubernetes.pod.uid",
            "k8s.pod.uid",
            "kubernetes.pod_id",
            "kubernetes.pod_uid",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files`",
    },
    NameRow {
        flat: "k8s.pod_ip",
        names: [
            "kubernetes.pod.ip",
            "k8s.pod.ip",
            "kubernetes.pod_ip",
            "kubernetes.pod_ip",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true`",
    },
    NameRow {
        flat: "k8s.container_name",
        names: [
            "kubernetes.container.name",
            "k8s.container.name",
            "kubernetes.container_name",
            "kubernetes.container_name",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files`",
    },
    NameRow {
        flat: "k8s.restart_count",
        names: [
            "kubernetes.container.restart_count",
            "k8s.container.restart_count",
            "kubernetes.restart_count",
            "kubernetes.container_restart_count",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` (from the log path)",
    },
    NameRow {
        flat: "k8s.node_name",
        names: [
            "kubernetes.node.name",
            "k8s.node.name",
            "kubernetes.host",
            "kubernetes.pod_node_name",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` (`NODE_NAME`)",
    },
    NameRow {
        flat: "container.id",
        names: [
            "container.id",
            "container.id",
            "kubernetes.docker_id",
            "kubernetes.container_id",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files` (from the runtime)",
    },
    NameRow {
        flat: "container.image",
        names: [
            "container.image.name",
            "container.image.name",
            "kubernetes.container_image",
            "kubernetes.container_image",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files` (from the runtime)",
    },
    NameRow {
        flat: "k8s.labels.*",
        names: [
            "kubernetes.labels.*",
            "k8s.pod.label.*",
            "kubernetes.labels.*",
            "kubernetes.pod_labels.*",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs`, `container_files` (the pod's labels)",
    },
    NameRow {
        flat: "k8s.annotations.*",
        names: [
            "kubernetes.annotations.*",
            "k8s.pod.annotation.*",
            "kubernetes.annotations.*",
            "kubernetes.pod_annotations.*",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` (`annotation_fields`)",
    },
    NameRow {
        flat: "k8s.namespace_labels.*",
        names: [
            "kubernetes.namespace_labels.*",
            "k8s.namespace.label.*",
            "kubernetes_namespace.labels.*",
            "kubernetes.namespace_labels.*",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true`",
    },
    NameRow {
        flat: "k8s.namespace_annotations.*",
        names: [
            "kubernetes.namespace_annotations.*",
            "k8s.namespace.annotation.*",
            "kubernetes_namespace.annotations.*",
            "kubernetes.namespace_annotations.*",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (`annotation_fields`)",
    },
    NameRow {
        flat: "k8s.node_labels.*",
        names: [
            "kubernetes.node.labels.*",
            "k8s.node.label.*",
            "kubernetes.node_labels.*",
            "kubernetes.node_labels.*",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true`",
    },
    NameRow {
        flat: "k8s.replicaset",
        names: [
            "kubernetes.replicaset.name",
            "k8s.replicaset.name",
            "kubernetes.replicaset",
            "kubernetes.replicaset",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "k8s.deployment",
        names: [
            "kubernetes.deployment.name",
            "k8s.deployment.name",
            "kubernetes.deployment",
            "kubernetes.deployment",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "k8s.statefulset",
        names: [
            "kubernetes.statefulset.name",
            "k8s.statefulset.name",
            "kubernetes.statefulset",
            "kubernetes.statefulset",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "k8s.daemonset",
        names: [
            "kubernetes.daemonset.name",
            "k8s.daemonset.name",
            "kubernetes.daemonset",
            "kubernetes.daemonset",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "k8s.job",
        names: [
            "kubernetes.job.name",
            "k8s.job.name",
            "kubernetes.job",
            "kubernetes.job",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "k8s.cronjob",
        names: [
            "kubernetes.cronjob.name",
            "k8s.cronjob.name",
            "kubernetes.cronjob",
            "kubernetes.cronjob",
        ],
        otel_record: false,
        set_by: "`kubernetes_logs` with `api: true` (the pod's owners)",
    },
    NameRow {
        flat: "kafka.topic",
        names: [
            "kafka.topic",
            "messaging.destination.name",
            "kafka.topic",
            "topic",
        ],
        otel_record: false,
        set_by: "`kafka`",
    },
    NameRow {
        flat: "kafka.partition",
        names: [
            "kafka.partition",
            "messaging.destination.partition.id",
            "kafka.partition",
            "partition",
        ],
        otel_record: false,
        set_by: "`kafka`",
    },
];

/// The output name of metadata `name` in `layout`, as segments; `dedot`
/// replaces the dots of a family key (label, annotation) with `_`.
pub fn out_segments(layout: Layout, dedot: bool, name: &str) -> Vec<Cow<'static, str>> {
    let segs = segments(name);
    let col = layout.column();
    let renamed: Option<(&'static str, Option<&str>)> = if col == usize::MAX {
        None
    } else {
        NAMES
            .iter()
            .find_map(|row| match row.flat.strip_suffix(".*") {
                None if row.flat == name => Some((row.names[col], None)),
                Some(family) if segs.len() == 3 && name.len() > family.len() => {
                    let fam_segs = segments(family);
                    (fam_segs[..] == segs[..2]).then(|| {
                        let target = row.names[col].strip_suffix(".*").unwrap_or(row.names[col]);
                        (target, Some(segs[2]))
                    })
                }
                _ => None,
            })
    };
    let key_of = |k: &str| -> Cow<'static, str> {
        if dedot && k.contains('.') {
            Cow::Owned(k.replace('.', "_"))
        } else {
            Cow::Owned(k.to_string())
        }
    };
    match renamed {
        Some((target, key)) => {
            let mut out: Vec<Cow<'static, str>> = target.split('.').map(Cow::Borrowed).collect();
            if let Some(k) = key {
                out.push(key_of(k));
            }
            out
        }
        None => {
            let family = segs.len() == 3 && is_family(segs[1]);
            segs.iter()
                .enumerate()
                .map(|(i, s)| {
                    if family && i == 2 {
                        key_of(s)
                    } else {
                        Cow::Owned((*s).to_string())
                    }
                })
                .collect()
        }
    }
}

/// How the event time is written (`timestamp_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeFormat {
    /// `"2024-05-01T10:00:00.123456789Z"` (the default).
    #[default]
    Rfc3339,
    /// Whole seconds since the epoch, a number.
    Unix,
    /// Milliseconds since the epoch, a number.
    UnixMs,
    /// Nanoseconds since the epoch, a number.
    UnixNs,
    /// Seconds since the epoch with a fraction, a number (Fluent Bit's
    /// `json_date_format double`).
    UnixFloat,
}

impl TimeFormat {
    /// Names accepted in configuration.
    pub const NAMES: &'static [&'static str] =
        &["rfc3339", "unix", "unix_ms", "unix_ns", "unix_float"];

    /// Parses a configuration name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "rfc3339" => Self::Rfc3339,
            "unix" => Self::Unix,
            "unix_ms" => Self::UnixMs,
            "unix_ns" => Self::UnixNs,
            "unix_float" => Self::UnixFloat,
            _ => return None,
        })
    }

    /// Appends the JSON value of time `ns`.
    pub fn write_json(self, ns: i64, out: &mut Vec<u8>) {
        match self {
            Self::Rfc3339 => {
                out.push(b'"');
                write_rfc3339(ns, out);
                out.push(b'"');
            }
            Self::Unix => push_int(out, ns.div_euclid(1_000_000_000)),
            Self::UnixMs => push_int(out, ns.div_euclid(1_000_000)),
            Self::UnixNs => push_int(out, ns),
            Self::UnixFloat => {
                let secs = ns.div_euclid(1_000_000_000);
                let frac = ns.rem_euclid(1_000_000_000);
                push_int(out, secs);
                let mut digits = format!("{frac:09}");
                while digits.len() > 1 && digits.ends_with('0') {
                    digits.pop();
                }
                out.push(b'.');
                out.extend_from_slice(digits.as_bytes());
            }
        }
    }
}

fn push_int(out: &mut Vec<u8>, n: i64) {
    let mut s = String::new();
    let _ = write!(s, "{n}");
    out.extend_from_slice(s.as_bytes());
}

/// A field named in `only_fields` or `except_fields`: a dotted name of
/// the event (`host`, `k8s.labels`, `kubernetes.pod_name` inside a field
/// that holds an object), or the name a layout writes (`log.file.path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// The path of dotted name `name` (a label key stays whole).
    pub fn new(name: &str) -> Self {
        Self(segments(name).into_iter().map(str::to_string).collect())
    }

    /// The name as written.
    pub fn as_dotted(&self) -> String {
        self.0.join(".")
    }
}

/// How a path relates to a field at `path`.
#[derive(Debug, PartialEq, Eq)]
enum Reach<'a> {
    /// The path names the field or something that holds it.
    Whole,
    /// The path names something inside the field: the rest of it.
    Inside(&'a [String]),
    /// Unrelated.
    No,
}

fn reach<'a, S: AsRef<str>>(p: &'a FieldPath, path: &[S]) -> Reach<'a> {
    let n = p.0.len().min(path.len());
    if p.0[..n]
        .iter()
        .zip(&path[..n])
        .any(|(a, b)| a != b.as_ref())
    {
        return Reach::No;
    }
    if p.0.len() <= path.len() {
        Reach::Whole
    } else {
        Reach::Inside(&p.0[path.len()..])
    }
}

/// What a sink writes of its events: the metadata layout, the fields
/// selected, the time's key and format. One per sink, read from its
/// `metadata`, `only_fields`, `except_fields`, `timestamp_format` and
/// `timestamp_key` keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// How the metadata is named and shaped.
    pub layout: Layout,
    /// Dots in label and annotation keys become `_`.
    pub dedot: bool,
    /// Only these fields are written (`only_fields`).
    pub only: Option<Vec<FieldPath>>,
    /// These fields are not written (`except_fields`).
    pub except: Vec<FieldPath>,
    /// How the event time is written.
    pub time_format: TimeFormat,
    /// The time's key; the sink's or the layout's when `None`.
    pub time_key: Option<Box<str>>,
}

/// What is written for one entry of a batch's metadata.
#[derive(Debug, Clone)]
struct PlannedEntry {
    /// The entry's number ([`SourceInfo::entry`]).
    index: usize,
    /// Its flat name.
    name: Box<str>,
    /// Its output name, as segments.
    out: Vec<Cow<'static, str>>,
    /// Written (not removed by `only_fields`/`except_fields`).
    selected: bool,
    /// On the opentelemetry sink: into the resource (else into the
    /// record's attributes).
    resource: bool,
}

/// An [`Output`] resolved against one batch's metadata: the output name
/// of each entry, and whether it is selected. Built once per batch.
#[derive(Debug, Clone)]
pub struct Plan<'o> {
    output: &'o Output,
    /// `None`: the default output, written by the unchanged writer.
    entries: Option<Vec<PlannedEntry>>,
}

impl Output {
    /// True for the default: `flat`, every field, RFC 3339 times under
    /// the sink's key.
    pub fn is_default(&self) -> bool {
        *self == Output::default()
    }

    /// The key of the event time: `timestamp_key`, else the sink's own
    /// (`@timestamp` for Elasticsearch), else the layout's.
    pub fn time_key<'a>(&'a self, sink: Option<&'a str>) -> &'a str {
        self.time_key
            .as_deref()
            .or(sink)
            .unwrap_or_else(|| self.layout.time_key())
    }

    /// The output name of metadata `name`, dotted.
    pub fn out_name(&self, name: &str) -> String {
        out_segments(self.layout, self.dedot, name).join(".")
    }

    /// True when a field named `name` is written as a whole (not
    /// removed by `only_fields` or `except_fields`): for names a sink
    /// writes on its own (Loki's structured metadata).
    pub fn selects(&self, name: &str) -> bool {
        !matches!(self.selected(&[&segments(name)[..]]), Selection::No)
    }

    /// [`Output::selected`] of own field `name`, without splitting the
    /// name when no `only_fields` and no `except_fields` path starts with
    /// its first segment (the common case, per field and event).
    fn own_selected_fast(&self, name: &str) -> Selection<'_> {
        let head = name.split('.').next().unwrap_or(name);
        if self.only.is_none()
            && !self
                .except
                .iter()
                .any(|p| p.0.first().is_some_and(|h| h == head))
        {
            return Selection::Whole;
        }
        self.selected(&[&segments(name)[..]])
    }

    fn selected<S: AsRef<str>>(&self, paths: &[&[S]]) -> Selection<'_> {
        let mut except = Vec::new();
        for p in &self.except {
            for path in paths {
                match reach(p, path) {
                    Reach::Whole => return Selection::No,
                    Reach::Inside(rest) => except.push(rest),
                    Reach::No => {}
                }
            }
        }
        let only = match &self.only {
            None => None,
            Some(only) => {
                let mut inside = Vec::new();
                let mut whole = false;
                for p in only {
                    for path in paths {
                        match reach(p, path) {
                            Reach::Whole => whole = true,
                            Reach::Inside(rest) => inside.push(rest),
                            Reach::No => {}
                        }
                    }
                }
                match (whole, inside.is_empty()) {
                    (true, _) => None,
                    (false, true) => return Selection::No,
                    (false, false) => Some(inside),
                }
            }
        };
        if only.is_none() && except.is_empty() {
            Selection::Whole
        } else {
            Selection::Inside(Filter { only, except })
        }
    }

    /// Resolves this output against `source`'s metadata, once per batch.
    pub fn plan(&self, source: &SourceInfo) -> Plan<'_> {
        if self.is_default() {
            return Plan {
                output: self,
                entries: None,
            };
        }
        let mut entries = Vec::with_capacity(source.entry_count() + 1);
        let mut push = |index: usize, name: &str| {
            let out = out_segments(self.layout, self.dedot, name);
            let flat = segments(name);
            let out_names: Vec<&str> = out.iter().map(|c| &**c).collect();
            let selected = !matches!(self.selected(&[&flat[..], &out_names[..]]), Selection::No);
            let record = self.layout == Layout::Otel
                && NAMES.iter().any(|r| r.flat == name && r.otel_record);
            // Layouts that do not nest write the dotted name as one key:
            // joined here, once per batch, not per event.
            let out = if out.len() > 1 && !self.layout.nests() {
                vec![Cow::Owned(out.join("."))]
            } else {
                out
            };
            entries.push(PlannedEntry {
                index,
                name: name.into(),
                out,
                selected,
                resource: !record,
            });
        };
        for (i, name, _) in source.entries() {
            push(i, name);
        }
        if self.layout.writes_source_type() && !source.source_type.is_empty() {
            push(usize::MAX, "source_type");
        }
        Plan {
            output: self,
            entries: Some(entries),
        }
    }
}

/// Which part of a field is written.
enum Selection<'a> {
    Whole,
    /// Parts of it: `only_fields` or `except_fields` named something
    /// within.
    Inside(Filter<'a>),
    No,
}

/// Paths inside an object field, relative to it.
#[derive(Clone, Default)]
struct Filter<'a> {
    /// Only these (`None`: all).
    only: Option<Vec<&'a [String]>>,
    /// Not these.
    except: Vec<&'a [String]>,
}

/// One thing to write: its key path and where its value comes from.
/// Where an item of [`Plan::write_json`] is written: one key, or the
/// segments of a planned entry (borrowed, not copied per event).
#[derive(Clone, Copy)]
enum Path<'p> {
    One(&'p str),
    Segs(&'p [Cow<'static, str>]),
}

impl<'p> Path<'p> {
    fn len(&self) -> usize {
        match self {
            Path::One(_) => 1,
            Path::Segs(s) => s.len(),
        }
    }

    fn at(&self, i: usize) -> &'p str {
        match self {
            Path::One(k) => k,
            Path::Segs(s) => &s[i],
        }
    }
}

enum Item<'e> {
    Message(&'e Value),
    Meta(&'e str),
    Own(&'e Value, Option<Filter<'e>>),
    Time(i64),
    DefaultTime,
}

impl Plan<'_> {
    /// The output this plan resolves.
    pub fn output(&self) -> &Output {
        self.output
    }

    /// Appends the JSON object of `ev` (no newline), as the output says.
    pub fn write_json(
        &self,
        batch: &EventBatch,
        ev: &Event,
        shape: JsonShape<'_>,
        out: &mut Vec<u8>,
        stats: &mut EncodeStats,
    ) {
        let Some(entries) = &self.entries else {
            write_event_json(batch, ev, shape, out, stats);
            return;
        };
        let o = self.output;
        let layout = o.layout;
        let time_key = o.time_key(shape.sink_time_key());
        let message_key = layout.message_key();
        let skip = |name: &str| shape.skip.contains(&name);
        // Per event: kept on the stack for the usual sizes (the allocator
        // was a fifth of this function's time with heap vectors).
        let mut items: SmallVec<[(Path<'_>, Item<'_>); 24]> = SmallVec::new();
        let mut used: SmallVec<[bool; 24]> = smallvec::smallvec![false; ev.fields.len()];
        // An own field named like the message key, or like the time key
        // when there is a time, takes its place.
        let own_named = |k: &str| ev.fields.iter().any(|(f, _)| f == k);
        if !matches!(ev.message, Value::Null)
            && !skip("message")
            && (message_key == "message" || !own_named(message_key))
        {
            let sel = o.selected(&[&["message"][..], &[message_key][..]]);
            if !matches!(sel, Selection::No) {
                items.push((Path::One(message_key), Item::Message(&ev.message)));
            }
        }
        for e in entries {
            if !e.selected || skip(&e.name) {
                continue;
            }
            let value = if e.index == usize::MAX {
                Item::Meta(batch.source.source_type)
            } else {
                // An own field of the entry's name takes its place (and
                // its name in the layout), hidden or not.
                match ev.fields.iter().position(|(k, _)| **k == *e.name) {
                    Some(j) => {
                        used[j] = true;
                        Item::Own(&ev.fields[j].1, None)
                    }
                    None if ev.hidden.contains(e.index) => continue,
                    None => match batch.source.entry(e.index) {
                        Some((_, v)) => Item::Meta(v),
                        None => continue,
                    },
                }
            };
            items.push((Path::Segs(&e.out), value));
        }
        let has_time = ev.time_ns.is_some() || shape.default_time.is_some();
        if has_time && !skip("timestamp") {
            let sel = o.selected(&[&["timestamp"][..], &[time_key][..]]);
            if !matches!(sel, Selection::No) {
                let item = match ev.time_ns {
                    Some(ns) => Item::Time(ns),
                    None => Item::DefaultTime,
                };
                items.push((Path::One(time_key), item));
            }
        }
        for (j, (k, v)) in ev.fields.iter().enumerate() {
            if used[j]
                || (has_time && k == time_key)
                || (k == message_key && message_key != "message")
                || skip(k)
            {
                continue;
            }
            let inside = match o.own_selected_fast(k) {
                Selection::No => continue,
                Selection::Whole => None,
                Selection::Inside(filter) => Some(filter),
            };
            items.push((Path::One(k), Item::Own(v, inside)));
        }
        // Metadata whose object an own field of the same name replaces
        // (an own `kubernetes` beside the layout's `kubernetes.*`, an own
        // `log` beside `ecs`' `log.file.path`): each key is written once,
        // the event's own. (Only entries have paths of several segments;
        // an own field that took an entry's place goes with it.)
        if layout.nests() {
            let owns: SmallVec<[&str; 8]> = items
                .iter()
                .filter(|(p, it)| p.len() == 1 && matches!(it, Item::Own(..)))
                .map(|(p, _)| p.at(0))
                .collect();
            if !owns.is_empty() {
                items.retain(|(p, _)| !(p.len() > 1 && owns.contains(&p.at(0))));
            }
        }
        let mut w = Writer {
            batch,
            shape,
            format: o.time_format,
            out,
            stats,
        };
        let refs: SmallVec<[usize; 24]> = (0..items.len()).collect();
        w.object(&items, &refs, 0);
    }

    /// Calls `f` with the output name (dotted), the value of every
    /// metadata entry `ev` has and the output selects, and whether it
    /// belongs to an OTLP resource (else to the record's attributes), for
    /// sinks that write the metadata as attributes. An own field that
    /// took an entry's place gives its value.
    pub fn for_each_meta<'e>(
        &self,
        batch: &'e EventBatch,
        ev: &'e Event,
        mut f: impl FnMut(String, MetaValue<'e>, bool),
    ) {
        let owned;
        let entries = match &self.entries {
            Some(e) => e,
            None => {
                owned = self.output.force_plan(&batch.source);
                &owned
            }
        };
        for e in entries {
            if !e.selected {
                continue;
            }
            if e.index == usize::MAX {
                f(
                    e.out.join("."),
                    MetaValue::Text(batch.source.source_type),
                    true,
                );
                continue;
            }
            let own = ev.fields.iter().find(|(k, _)| **k == *e.name);
            if own.is_none() && ev.hidden.contains(e.index) {
                continue;
            }
            let name = e.out.join(".");
            match own {
                Some((_, v)) => f(name, MetaValue::Own(v), e.resource),
                None => {
                    if let Some((_, v)) = batch.source.entry(e.index) {
                        f(name, MetaValue::Text(v), e.resource);
                    }
                }
            }
        }
    }

    /// True when own field `name` is written: selected, and not one that
    /// took a metadata entry's place ([`Plan::for_each_meta`] gives those).
    pub fn own_selected(&self, batch: &EventBatch, name: &str) -> bool {
        if batch.source.find(name).is_some() {
            return false;
        }
        match &self.entries {
            None => true,
            Some(_) => !matches!(self.output.selected(&[&segments(name)[..]]), Selection::No),
        }
    }

    /// True when the message is written.
    pub fn message_selected(&self) -> bool {
        self.entries.is_none()
            || !matches!(
                self.output
                    .selected(&[&["message"][..], &[self.output.layout.message_key()][..]]),
                Selection::No
            )
    }
}

impl Output {
    fn force_plan(&self, source: &SourceInfo) -> Vec<PlannedEntry> {
        let forced = Output {
            // Any difference from the default makes `plan` resolve names.
            time_key: Some(
                self.time_key
                    .clone()
                    .unwrap_or_else(|| self.layout.time_key().into()),
            ),
            ..self.clone()
        };
        forced.plan(source).entries.unwrap_or_default()
    }
}

/// A metadata value handed to [`Plan::for_each_meta`].
#[derive(Debug, Clone, Copy)]
pub enum MetaValue<'e> {
    /// The batch's text.
    Text(&'e str),
    /// An own field of the event that took the entry's place.
    Own(&'e Value),
}

struct Writer<'a, 'b> {
    batch: &'a EventBatch,
    shape: JsonShape<'a>,
    format: TimeFormat,
    out: &'b mut Vec<u8>,
    stats: &'b mut EncodeStats,
}

impl Writer<'_, '_> {
    /// Writes the items `idx` of `items` as one object, their paths from
    /// `depth` on: items that share a segment there go into one object.
    fn object(&mut self, items: &[(Path<'_>, Item<'_>)], idx: &[usize], depth: usize) {
        self.out.push(b'{');
        let mut done: SmallVec<[bool; 24]> = smallvec::smallvec![false; idx.len()];
        let mut first = true;
        for a in 0..idx.len() {
            if done[a] {
                continue;
            }
            let (path, item) = &items[idx[a]];
            let key = path.at(depth);
            if !first {
                self.out.push(b',');
            }
            first = false;
            write_json_str(self.out, key);
            self.out.push(b':');
            if path.len() == depth + 1 {
                done[a] = true;
                self.value(item);
                continue;
            }
            let mut group: SmallVec<[usize; 16]> = SmallVec::new();
            for b in a..idx.len() {
                let (p, _) = &items[idx[b]];
                if !done[b] && p.len() > depth + 1 && p.at(depth) == key {
                    done[b] = true;
                    group.push(idx[b]);
                }
            }
            self.object(items, &group, depth + 1);
        }
        self.out.push(b'}');
    }

    fn value(&mut self, item: &Item<'_>) {
        match item {
            Item::Message(v) => write_json_value(self.batch, v, self.out, self.stats),
            Item::Meta(t) => write_json_str(self.out, t),
            Item::Own(v, None) => write_json_value(self.batch, v, self.out, self.stats),
            Item::Own(v, Some(filter)) => self.filtered(v, filter),
            Item::Time(ns) => self.format.write_json(*ns, self.out),
            Item::DefaultTime => {
                match (self.format, self.shape.default_time, self.shape.default_ns) {
                    (TimeFormat::Rfc3339, Some(text), _) => {
                        self.out.push(b'"');
                        self.out.extend_from_slice(text);
                        self.out.push(b'"');
                    }
                    (f, _, Some(ns)) => f.write_json(ns, self.out),
                    (_, Some(text), None) => {
                        self.out.push(b'"');
                        self.out.extend_from_slice(text);
                        self.out.push(b'"');
                    }
                    (_, None, None) => self.out.extend_from_slice(b"null"),
                }
            }
        }
    }

    /// Writes the parts of `v` that `filter` (paths relative to it)
    /// selects: only those of `only`, none of `except`.
    fn filtered(&mut self, v: &Value, filter: &Filter<'_>) {
        let Value::Object(fields) = v else {
            // Paths inside a value that is not an object: it is written
            // whole unless `only` named something within it.
            if filter.only.is_none() {
                write_json_value(self.batch, v, self.out, self.stats);
            } else {
                self.out.extend_from_slice(b"null");
            }
            return;
        };
        self.out.push(b'{');
        let mut first = true;
        for (k, x) in fields {
            /// Whether `paths` name key `k` whole, and what they name
            /// below it.
            fn below<'p>(paths: &[&'p [String]], k: &str) -> (bool, Vec<&'p [String]>) {
                let mut whole = false;
                let mut deeper = Vec::new();
                for p in paths {
                    if p.first().is_some_and(|s| s == k) {
                        if p.len() == 1 {
                            whole = true;
                        } else {
                            deeper.push(&p[1..]);
                        }
                    }
                }
                (whole, deeper)
            }
            let (dropped, except) = below(&filter.except, k);
            if dropped {
                continue;
            }
            let only = match &filter.only {
                None => None,
                Some(paths) => match below(paths, k) {
                    (true, _) => None,
                    (false, deeper) if deeper.is_empty() => continue,
                    (false, deeper) => Some(deeper),
                },
            };
            if !first {
                self.out.push(b',');
            }
            first = false;
            write_json_str(self.out, k);
            self.out.push(b':');
            if only.is_none() && except.is_empty() {
                write_json_value(self.batch, x, self.out, self.stats);
            } else {
                self.filtered(x, &Filter { only, except });
            }
        }
        self.out.push(b'}');
    }
}

/// The table of every metadata name in every layout, in Markdown, for
/// the component reference.
pub fn reference_table() -> String {
    let mut s = String::new();
    s.push_str("| ");
    for (i, n) in Layout::NAMES.iter().enumerate() {
        if i > 0 {
            s.push_str(" | ");
        }
        s.push('`');
        s.push_str(n);
        s.push('`');
    }
    s.push_str(" | set by |\n|");
    for _ in 0..=Layout::NAMES.len() {
        s.push_str("---|");
    }
    s.push('\n');
    let nested = |flat: &str| -> String {
        let segs = segments(flat.strip_suffix(".*").unwrap_or(flat));
        let mut out = segs.join(" › ");
        if flat.ends_with(".*") {
            out.push_str(" › *key*");
        }
        out
    };
    let cell = |name: &str| -> String {
        if name == "—" {
            return name.to_string();
        }
        match name.strip_suffix(".*") {
            Some(f) => format!("`{f}.`*key*"),
            None => format!("`{name}`"),
        }
    };
    let row = |s: &mut String, flat: &str, names: [&str; 4], by: &str| {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {by} |",
            cell(flat),
            nested(flat),
            cell(names[0]),
            cell(names[1]),
            cell(names[2]),
            cell(names[3]),
        );
    };
    row(
        &mut s,
        "message",
        ["message", "message", "log", "message"],
        "the event's message (in OTLP: the body)",
    );
    row(
        &mut s,
        "timestamp",
        ["@timestamp", "timestamp", "time", "timestamp"],
        "the event time (`timestamp_key` and the sink may rename it)",
    );
    row(
        &mut s,
        "source_type",
        ["—", "—", "—", "source_type"],
        "the source's `type` (readable in conditions; written by `vector` only)",
    );
    for r in NAMES {
        row(&mut s, r.flat, r.names, r.set_by);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{SourceInfo, Span};
    use bytes::Bytes;
    use std::sync::Arc;

    #[test]
    fn segments_keep_label_keys_whole() {
        assert_eq!(segments("host"), ["host"]);
        assert_eq!(segments("k8s.pod_name"), ["k8s", "pod_name"]);
        assert_eq!(
            segments("k8s.labels.app.kubernetes.io/name"),
            ["k8s", "labels", "app.kubernetes.io/name"]
        );
        assert_eq!(
            segments("k8s.node_labels.kubernetes.io/os"),
            ["k8s", "node_labels", "kubernetes.io/os"]
        );
        assert_eq!(segments("a.b.c"), ["a", "b", "c"]);
        assert!(is_under("k8s.pod_name", "k8s"));
        assert!(is_under("k8s", "k8s"));
        assert!(!is_under("k8s2", "k8s"));
        assert!(is_under("k8s.labels.app.kubernetes.io/name", "k8s.labels"));
        assert!(!is_under(
            "k8s.labels.app.kubernetes.io/name",
            "k8s.labels.app"
        ));
        assert!(is_under("k8s.labels.app", "k8s.labels.app"));
    }

    #[test]
    fn names_in_each_layout() {
        let n = |l, d, name| out_segments(l, d, name).join("|");
        assert_eq!(n(Layout::Flat, false, "k8s.pod_name"), "k8s|pod_name");
        assert_eq!(n(Layout::Ecs, true, "k8s.pod_name"), "kubernetes|pod|name");
        assert_eq!(
            n(Layout::Ecs, true, "k8s.labels.app.kubernetes.io/name"),
            "kubernetes|labels|app_kubernetes_io/name"
        );
        assert_eq!(
            n(Layout::Ecs, false, "k8s.labels.app.kubernetes.io/name"),
            "kubernetes|labels|app.kubernetes.io/name"
        );
        assert_eq!(
            n(Layout::Otel, false, "k8s.namespace"),
            "k8s|namespace|name"
        );
        assert_eq!(
            n(Layout::FluentBit, false, "container.id"),
            "kubernetes|docker_id"
        );
        assert_eq!(
            n(Layout::Vector, false, "k8s.namespace"),
            "kubernetes|pod_namespace"
        );
        assert_eq!(n(Layout::Ecs, true, "something.else"), "something|else");
        assert_eq!(
            n(Layout::Flat, true, "k8s.labels.a.b"),
            "k8s|labels|a_b",
            "dedot applies to flat names too"
        );
    }

    fn batch() -> EventBatch {
        let meta: Vec<(crate::Key, Arc<str>)> = vec![
            ("host".into(), "n1".into()),
            ("k8s.pod_name".into(), "web-1".into()),
            ("k8s.labels.app".into(), "web".into()),
            ("k8s.labels.app.kubernetes.io/name".into(), "shop".into()),
        ];
        let mut b = EventBatch::new(
            Bytes::from_static(b"hello"),
            Arc::new(SourceInfo::file("/var/log/a.log", meta.into())),
        );
        b.events.push(Event::from_span(Span::new(0, 5)));
        b
    }

    fn json(o: &Output, b: &EventBatch, i: usize) -> String {
        let mut out = Vec::new();
        let plan = o.plan(&b.source);
        plan.write_json(
            b,
            &b.events[i],
            JsonShape::NDJSON,
            &mut out,
            &mut EncodeStats::default(),
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn layouts_write_the_same_event_in_their_names() {
        let mut b = batch();
        b.events[0].time_ns = Some(1_000_000_123);
        let flat = json(&Output::default(), &b, 0);
        assert_eq!(
            flat,
            r#"{"message":"hello","file":"/var/log/a.log","host":"n1","k8s.pod_name":"web-1","k8s.labels.app":"web","k8s.labels.app.kubernetes.io/name":"shop","timestamp":"1970-01-01T00:00:01.000000123Z"}"#
        );
        let ecs = Output {
            layout: Layout::Ecs,
            dedot: true,
            ..Default::default()
        };
        assert_eq!(
            json(&ecs, &b, 0),
            r#"{"message":"hello","log":{"file":{"path":"/var/log/a.log"}},"host":{"name":"n1"},"kubernetes":{"pod":{"name":"web-1"},"labels":{"app":"web","app_kubernetes_io/name":"shop"}},"@timestamp":"1970-01-01T00:00:01.000000123Z"}"#
        );
        let otel = Output {
            layout: Layout::Otel,
            time_format: TimeFormat::UnixNs,
            ..Default::default()
        };
        assert_eq!(
            json(&otel, &b, 0),
            r#"{"message":"hello","log.file.path":"/var/log/a.log","host.name":"n1","k8s.pod.name":"web-1","k8s.pod.label.app":"web","k8s.pod.label.app.kubernetes.io/name":"shop","timestamp":1000000123}"#
        );
        let fb = Output {
            layout: Layout::FluentBit,
            time_format: TimeFormat::UnixFloat,
            time_key: Some("date".into()),
            ..Default::default()
        };
        assert_eq!(
            json(&fb, &b, 0),
            r#"{"log":"hello","file":"/var/log/a.log","host":"n1","kubernetes":{"pod_name":"web-1","labels":{"app":"web","app.kubernetes.io/name":"shop"}},"date":1.000000123}"#
        );
    }

    /// An own field whose name is the first segment of a layout's object
    /// (a parsed `log` beside `ecs`' `log.file.path`) is written once,
    /// the event's own: never a duplicate key, which Elasticsearch
    /// refuses.
    #[test]
    fn an_own_field_replaces_the_layouts_object_of_its_name() {
        let mut b = batch();
        let src = b.source.clone();
        src.set(&mut b.events[0], "log".into(), Value::Str("parsed".into()));
        src.set(
            &mut b.events[0],
            "file".into(),
            Value::Str("/app/x.go".into()),
        );
        let ecs = Output {
            layout: Layout::Ecs,
            dedot: true,
            ..Default::default()
        };
        let text = json(&ecs, &b, 0);
        assert_eq!(text.matches("\"log\":").count(), 1, "{text}");
        assert!(text.contains(r#""log":"parsed""#), "{text}");
        assert!(!text.contains("/app/x.go"), "{text}");
        assert!(text.contains(r#""host":{"name":"n1"}"#), "{text}");
    }

    #[test]
    fn removed_renamed_and_selected_fields() {
        let mut b = batch();
        let src = b.source.clone();
        let ev = &mut b.events[0];
        assert!(src.remove(ev, "host"));
        assert!(src.remove(ev, "k8s.labels"));
        src.set(ev, "level".into(), Value::Str("info".into()));
        let v = src.take(ev, "file");
        assert_eq!(v, Some(Value::Str("/var/log/a.log".into())));
        src.set(ev, "path".into(), v.unwrap_or(Value::Null));
        assert!(src.remove(ev, "message"));
        let flat = json(&Output::default(), &b, 0);
        assert_eq!(
            flat,
            r#"{"k8s.pod_name":"web-1","level":"info","path":"/var/log/a.log"}"#
        );
        let ecs = Output {
            layout: Layout::Ecs,
            dedot: true,
            except: vec![FieldPath::new("kubernetes.pod.name")],
            ..Default::default()
        };
        assert_eq!(
            json(&ecs, &b, 0),
            r#"{"level":"info","path":"/var/log/a.log"}"#
        );
        let only = Output {
            only: Some(vec![FieldPath::new("level"), FieldPath::new("k8s")]),
            ..Default::default()
        };
        assert_eq!(
            json(&only, &b, 0),
            r#"{"k8s.pod_name":"web-1","level":"info"}"#
        );
    }

    #[test]
    fn a_group_moved_into_an_own_object() {
        let mut b = batch();
        let src = b.source.clone();
        let ev = &mut b.events[0];
        let k = src.take(ev, "k8s").expect("the group as an object");
        src.set(ev, "kubernetes".into(), k);
        let only = Output {
            only: Some(vec![FieldPath::new("kubernetes.labels")]),
            ..Default::default()
        };
        assert_eq!(
            json(&only, &b, 0),
            r#"{"kubernetes":{"labels":{"app":"web","app.kubernetes.io/name":"shop"}}}"#
        );
        assert_eq!(
            json(&Output::default(), &b, 0),
            r#"{"message":"hello","file":"/var/log/a.log","host":"n1","kubernetes":{"pod_name":"web-1","labels":{"app":"web","app.kubernetes.io/name":"shop"}}}"#
        );
    }

    #[test]
    fn time_formats() {
        let w = |f: TimeFormat, ns| {
            let mut v = Vec::new();
            f.write_json(ns, &mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(w(TimeFormat::Unix, 1_700_000_000_999_000_000), "1700000000");
        assert_eq!(
            w(TimeFormat::UnixMs, 1_700_000_000_999_000_000),
            "1700000000999"
        );
        assert_eq!(w(TimeFormat::UnixNs, 5), "5");
        assert_eq!(w(TimeFormat::UnixFloat, 1_500_000_000), "1.5");
        assert_eq!(w(TimeFormat::UnixFloat, 2_000_000_000), "2.0");
        assert_eq!(w(TimeFormat::Unix, -1), "-1");
        assert_eq!(
            w(TimeFormat::Rfc3339, 0),
            "\"1970-01-01T00:00:00.000000000Z\""
        );
    }

    #[test]
    fn reference_table_names_every_row() {
        let t = reference_table();
        for r in NAMES {
            assert!(t.contains(r.flat.trim_end_matches(".*")), "{}", r.flat);
        }
        assert!(t.contains("`kubernetes.pod_namespace`"));
    }
}
