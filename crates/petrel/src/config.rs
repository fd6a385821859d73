//! Loading pipeline files: one YAML file per pipeline, named by its stem.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use petrel_core::config::{closest, parse_yaml, ConfigError, ConfigErrors, Node};
use petrel_core::plugin::{Plugin, ProcessorConfig, SinkConfig, SourceConfig};

use crate::paths::ReadMatcher;
use crate::processors::when::When;
use crate::registry;

/// One pipeline: sources → processors → sinks.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The file stem.
    pub name: String,
    /// The file it came from.
    pub file: PathBuf,
    /// The file's text as written, `${VAR}` not expanded, followed by the
    /// text of the files its processors read (`remap`'s `file`): on
    /// reload, a pipeline whose text did not change keeps running
    /// untouched. Comparing the text as written is enough, since the
    /// agent's environment does not change while it runs; and it keeps
    /// the values of variables (secrets among them) out of this copy.
    pub text: Arc<str>,
    /// Sources with their ids.
    pub sources: Vec<(String, Arc<dyn SourceConfig>)>,
    /// Processors with their ids, in order.
    pub processors: Vec<(String, Arc<dyn ProcessorConfig>)>,
    /// Sinks with their ids.
    pub sinks: Vec<(String, Arc<dyn SinkConfig>)>,
    /// Which events each sink of `sinks` (same index) receives: its
    /// `when:` key.
    pub sink_routes: Vec<SinkRoute>,
    /// Where each sink of `sinks` (same index) holds what it has not
    /// delivered yet: its `buffer:` key.
    pub sink_buffers: Vec<SinkBuffer>,
    /// Combinations that load but are likely not what was meant
    /// (`validate` prints them, `run` logs them).
    pub warnings: Vec<ConfigError>,
}

/// The events a sink receives (`when:` in its entry).
#[derive(Debug, Clone, Default)]
pub enum SinkRoute {
    /// No `when:`: every event.
    #[default]
    All,
    /// `when: {include: ..., exclude: ...}` or `when: {vrl: '...'}`: events
    /// meeting the condition, in the languages of the `filter` processor.
    When(When),
    /// `when: unmatched`: events that no other sink's condition took.
    Unmatched,
    /// Named by a processor's `reroute_dropped`: only the events that
    /// processors set aside for it (under this sink id), none of the flow.
    Rerouted(Arc<str>),
}

/// Keys every sink entry accepts besides its plugin's own.
const SINK_COMMON_KEYS: &[&str] = &["when", "buffer"];

/// Where a sink holds the data it has not delivered yet (`buffer:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SinkBuffer {
    /// `{type: memory}` (the default): payloads wait in memory, paid by the
    /// pipeline's memory budget, and a batch is acknowledged to the source
    /// once every sink delivered it; a stalled sink holds the source.
    #[default]
    Memory,
    /// `{type: disk, max_size, when_full}`: a batch counts as delivered
    /// for this sink once it is durable in the sink's own buffer on disk,
    /// which the sink then drains at its own pace.
    Disk {
        /// Undelivered bytes the buffer may hold.
        max_size: u64,
        /// What happens to new data when it is full.
        when_full: WhenFull,
    },
}

/// What a full disk buffer does with new data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Waits for room, holding the source (as a memory buffer does).
    #[default]
    Block,
    /// Drops the new data and counts it (`reason="buffer_full"`), so the
    /// source and the other sinks go on.
    DropNewest,
}

/// The smallest `max_size` of a disk buffer: a few segments of useful
/// size (the spool's own minimum).
pub const MIN_DISK_BUFFER: u64 = petrel_spool::MIN_MAX_BYTES;

/// The default `max_size` of a disk buffer.
pub const DEFAULT_DISK_BUFFER: u64 = 256 << 20;

/// Reads a sink's `buffer:`; problems are reported at the key.
fn sink_buffer(item: Node<'_>, sink: &dyn SinkConfig) -> SinkBuffer {
    let Some(n) = item.as_map_quiet().and_then(|m| m.get("buffer")) else {
        return SinkBuffer::Memory;
    };
    if n.as_map_quiet().is_none() {
        n.error("`buffer` must be a map, e.g. `buffer: {type: disk, max_size: 1GiB, when_full: block}` or `buffer: {type: memory}`");
        return SinkBuffer::Memory;
    }
    let Some(m) = n.as_map(&["type", "max_size", "when_full"]) else {
        return SinkBuffer::Memory;
    };
    let Some(kind) = m.choice("type", &["memory", "disk"]) else {
        if m.get("type").is_none() {
            n.error("`buffer` needs a `type`: `memory` (the default) or `disk`");
        }
        return SinkBuffer::Memory;
    };
    if kind == "memory" {
        for key in ["max_size", "when_full"] {
            if let Some(k) = m.get(key) {
                k.error(format!("`{key}` applies to `type: disk` buffers only; a memory buffer is bounded by `--memory-limit`"));
            }
        }
        return SinkBuffer::Memory;
    }
    if let Some(key) = sink.commits_source_positions() {
        n.error(format!(
            "`{key}` commits the source's offsets inside the sink's transactions, which a disk buffer between them would break; remove `buffer` or `{key}`"
        ));
        return SinkBuffer::Memory;
    }
    let max_size = match m.get("max_size") {
        None => DEFAULT_DISK_BUFFER,
        Some(k) => match k.as_u64(true) {
            Some(v) if v >= MIN_DISK_BUFFER => v,
            Some(_) => {
                k.error(format!(
                    "`max_size` of a disk buffer must be at least {} bytes (1MiB); e.g. `max_size: 1GiB`",
                    MIN_DISK_BUFFER
                ));
                return SinkBuffer::Memory;
            }
            None => return SinkBuffer::Memory,
        },
    };
    let when_full = match m.get("when_full") {
        None => WhenFull::Block,
        Some(_) => match m.choice("when_full", &["block", "drop_newest"]) {
            Some("drop_newest") => WhenFull::DropNewest,
            Some(_) => WhenFull::Block,
            None => return SinkBuffer::Memory,
        },
    };
    SinkBuffer::Disk {
        max_size,
        when_full,
    }
}

/// Reads a sink's `when:`; problems are reported at the key.
fn sink_route(item: Node<'_>) -> SinkRoute {
    let Some(n) = item.as_map_quiet().and_then(|m| m.get("when")) else {
        return SinkRoute::All;
    };
    if n.as_map_quiet().is_none() {
        if let petrel_core::config::YamlNode::Scalar(t) = n.raw() {
            if t.as_str() == "unmatched" {
                return SinkRoute::Unmatched;
            }
        }
        n.error(
            "`when` must be `unmatched` or a condition like the filter processor's, \
             e.g. `when: {include: {level: \"^error$\"}}`",
        );
        return SinkRoute::All;
    }
    When::parse(n, "when")
        .map(SinkRoute::When)
        .unwrap_or_default()
}

/// Marks the sinks that processors name in `reroute_dropped` as taking
/// only the events set aside for them; a name that is not a sink of the
/// pipeline, or a named sink that also has `when:`, is reported at the key.
fn mark_rerouted(
    processors: &[Node<'_>],
    sinks: &[(String, Arc<dyn SinkConfig>)],
    sink_nodes: &[Node<'_>],
    routes: &mut [SinkRoute],
) {
    for node in processors {
        let Some(key) = node.as_map_quiet().and_then(|m| m.get("reroute_dropped")) else {
            continue;
        };
        let petrel_core::config::YamlNode::Scalar(name) = key.raw() else {
            // The plugin reports a value that is not a sink id.
            continue;
        };
        let Some(i) = sinks.iter().position(|(id, _)| id == name.as_str()) else {
            let ids: Vec<&str> = sinks.iter().map(|(id, _)| id.as_str()).collect();
            key.error(format!(
                "`reroute_dropped` names sink `{}`, which this pipeline does not have; name one of its sinks by `id` ({}), e.g. a file sink for the dropped events",
                name.as_str(),
                ids.join(", ")
            ));
            continue;
        };
        if let Some(w) = sink_nodes
            .get(i)
            .and_then(|n| n.as_map_quiet())
            .and_then(|m| m.get("when"))
        {
            w.error(format!(
                "sink `{}` receives the events a processor drops (`reroute_dropped`) and nothing else, so it cannot also have `when`; remove `when` or reroute to another sink",
                name.as_str()
            ));
            continue;
        }
        if let Some(r) = routes.get_mut(i) {
            *r = SinkRoute::Rerouted(name.as_str().into());
        }
    }
}

/// Puts each processor whose entry has `when:` inside the wrapper that
/// runs it on the matching events only; problems are reported at the key.
fn wrap_when(processors: &mut [(String, Arc<dyn ProcessorConfig>)], nodes: &[Node<'_>]) {
    use crate::processors::when::{When, WhenConfig};
    for ((_, cfg), node) in processors.iter_mut().zip(nodes) {
        let Some(w) = node.as_map_quiet().and_then(|m| m.get("when")) else {
            continue;
        };
        if let Some(when) = When::parse(w, "when") {
            *cfg = Arc::new(WhenConfig {
                when,
                inner: cfg.clone(),
            });
        }
    }
}

const TOP_KEYS: &[&str] = &["sources", "processors", "sinks"];

/// Loads `path`: one pipeline file, or every `*.yaml`/`*.yml` in a
/// directory. Returns every problem found, each with its position.
pub fn load(path: &Path) -> Result<Vec<PipelineConfig>, Vec<ConfigError>> {
    load_with(path, false)
}

/// Like [`load`]; with `allow_empty`, a directory without pipeline files
/// is an empty configuration (an agent whose pipelines all come from its
/// management server), not an error.
pub fn load_with(path: &Path, allow_empty: bool) -> Result<Vec<PipelineConfig>, Vec<ConfigError>> {
    let shown: Arc<str> = path.to_string_lossy().into();
    let whole = |msg: String| {
        vec![ConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            message: msg,
        }]
    };
    let meta = std::fs::metadata(path).map_err(|e| whole(format!("cannot read: {e}")))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| whole(format!("cannot list directory: {e}")))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            // `petrel test` files live beside the pipelines they test.
            .filter(|p| !is_test_file(p))
            .collect();
        v.sort();
        if v.is_empty() && allow_empty {
            return Ok(Vec::new());
        }
        if v.is_empty() {
            return Err(whole(
                "no pipeline files (*.yaml or *.yml) in this directory; add one, e.g. from examples/".into(),
            ));
        }
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut pipelines = Vec::new();
    let mut errors = Vec::new();
    let mut names = std::collections::HashMap::new();
    for f in files {
        match load_file(&f) {
            Ok(p) => {
                if let Some(prev) = names.insert(p.name.clone(), p.file.clone()) {
                    errors.push(ConfigError {
                        file: f.to_string_lossy().into(),
                        line: 1,
                        col: 1,
                        message: format!(
                            "pipeline name `{}` is also used by {}; rename one of the files",
                            p.name,
                            prev.display()
                        ),
                    });
                }
                pipelines.push(p);
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(pipelines)
    } else {
        Err(errors)
    }
}

/// True for `*.test.yaml`/`*.test.yml`: `petrel test` files, not pipelines.
pub fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".test.yaml") || n.ends_with(".test.yml"))
}

/// Loads one pipeline file.
pub fn load_file(path: &Path) -> Result<PipelineConfig, Vec<ConfigError>> {
    load_file_as(path, path.to_string_lossy().into())
}

/// Loads one pipeline file, naming it `shown` in problems (a remote
/// pipeline is named by its key, not by where it was staged).
pub fn load_file_as(path: &Path, shown: Arc<str>) -> Result<PipelineConfig, Vec<ConfigError>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![ConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            message: format!("cannot read: {e}"),
        }]
    })?;
    let mut raw = parse_yaml(&shown, &text).map_err(|e| vec![e])?;
    // Top-level `x-` keys hold anchors for the rest of the file (the
    // Compose convention): resolved already, and otherwise ignored, so a
    // variable only they use need not be set.
    if let petrel_core::config::YamlNode::Mapping(m) = &mut raw {
        m.retain(|k, _| !k.as_str().starts_with("x-"));
    }
    // Once, here, for every value of the file: `validate`, `run` and
    // reloads read the same expanded values, and no plugin expands again.
    let env_errors = petrel_core::yaml::expand_env_tree(&shown, &text, &mut raw, &|name| {
        std::env::var(name).ok()
    });
    // An unset variable does not stop the reading: every other problem of
    // the file is reported in the same run. What a plugin says about a
    // value left unexpanded is dropped below (the variable is the cause).
    let errs = ConfigErrors::new();
    // Relative paths inside the file resolve against its directory, which
    // must therefore be absolute.
    let abs_file: Arc<str> = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into();
    let root = Node::root(&abs_file, &raw, &errs);
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pipeline".into());
    let mut p = PipelineConfig {
        name,
        file: path.to_path_buf(),
        text: text.as_str().into(),
        sources: Vec::new(),
        processors: Vec::new(),
        sinks: Vec::new(),
        sink_routes: Vec::new(),
        sink_buffers: Vec::new(),
        warnings: Vec::new(),
    };
    if let Some(m) = root.as_map(TOP_KEYS) {
        if let Some(n) = m.required("sources", "[{ type: file, include: [\"/var/log/*.log\"] }]") {
            p.sources = section(n, "source", registry::SOURCES, &[]).0;
            if n.as_list().is_empty() {
                n.error("`sources` is empty; add at least one source, e.g. `- type: file`");
            }
        }
        let mut processor_nodes = Vec::new();
        if let Some(n) = m.get("processors") {
            let (mut processors, nodes) = section(
                n,
                "processor",
                registry::PROCESSORS,
                crate::processors::when::KEYS,
            );
            wrap_when(&mut processors, &nodes);
            // The pipeline counts as changed on reload when a file it read
            // changed, not only its own text.
            let inputs: String = processors
                .iter()
                .filter_map(|(_, c)| c.file_input())
                .map(|(name, text)| format!("\n\0{name}\0{text}"))
                .collect();
            if !inputs.is_empty() {
                p.text = format!("{}{inputs}", p.text).into();
            }
            p.processors = processors;
            processor_nodes = nodes;
        }
        if let Some(n) = m.required("sinks", "[{ type: stdout }]") {
            let (sinks, nodes) = section(n, "sink", registry::SINKS, SINK_COMMON_KEYS);
            if n.as_list().is_empty() {
                n.error("`sinks` is empty; add at least one sink, e.g. `- type: stdout`");
            }
            check_feedback(&sinks, &nodes, &p.sources);
            p.sink_routes = nodes.iter().map(|n| sink_route(*n)).collect();
            mark_rerouted(&processor_nodes, &sinks, &nodes, &mut p.sink_routes);
            p.sink_buffers = nodes
                .iter()
                .zip(&sinks)
                .map(|(n, (_, s))| sink_buffer(*n, s.as_ref()))
                .collect();
            for ((_, sink), (node, route)) in sinks.iter().zip(nodes.iter().zip(&p.sink_routes)) {
                let Some(key) = sink.commits_source_positions() else {
                    continue;
                };
                for (id, src) in &p.sources {
                    if let Some((line, col)) = src.replays_on_start() {
                        p.warnings.push(ConfigError {
                            file: shown.clone(),
                            line,
                            col,
                            message: format!(
                                "source `{id}` replays from a fixed position on every start, so the sink's `{key}` cannot prevent duplicates across restarts: each start re-emits what was already written; use `start: earliest` (only where the group has no committed offset) unless a replay is meant"
                            ),
                        });
                    }
                }
                if sinks.len() > 1 || !matches!(route, SinkRoute::All) {
                    let at = node
                        .as_map_quiet()
                        .and_then(|m| m.get(key))
                        .unwrap_or(*node);
                    at.error(format!(
                        "`{key}` commits the source's offsets inside the sink's transactions, so this sink must be the pipeline's only one and take every event (no `when`); move the other sinks to a pipeline of their own"
                    ));
                }
            }
            let conditional = p
                .sink_routes
                .iter()
                .any(|r| matches!(r, SinkRoute::When(_)));
            for (r, node) in p.sink_routes.iter().zip(&nodes) {
                if matches!(r, SinkRoute::Unmatched) && !conditional {
                    if let Some(w) = node.as_map_quiet().and_then(|m| m.get("when")) {
                        w.error("`when: unmatched` takes the events no other sink's `when` condition took, but no sink of this pipeline has one; remove it or add `when: {include: ...}` to another sink");
                    }
                }
            }
            p.sinks = sinks;
        }
    } else if errs.is_empty() {
        root.error("the file is empty; it needs `sources` and `sinks`");
    }
    // Report with the path as the user gave it.
    p.warnings
        .extend(errs.take_warnings().into_iter().map(|mut w| {
            w.file = shown.clone();
            w
        }));
    let mut list: Vec<ConfigError> = errs
        .into_vec()
        .into_iter()
        .filter(|e| !env_errors.iter().any(|v| v.line == e.line))
        .collect();
    list.extend(env_errors);
    list.sort_by_key(|e| (e.line, e.col));
    let list: Vec<ConfigError> = list
        .into_iter()
        .map(|mut e| {
            e.file = shown.clone();
            e
        })
        .collect();
    if list.is_empty() {
        Ok(p)
    } else {
        Err(list)
    }
}

/// Reports file sinks whose output a file source of the same pipeline
/// reads: the pipeline would read back everything it writes, forever (and
/// fill the disk). Paths are compared both as written (without `..`) and
/// with symlinks resolved, so neither hides the loop.
fn check_feedback(
    sinks: &[(String, Arc<dyn SinkConfig>)],
    nodes: &[Node<'_>],
    sources: &[(String, Arc<dyn SourceConfig>)],
) {
    // No sink writes a file (the common case): no glob is compiled.
    if sinks.iter().all(|(_, s)| s.output_file().is_none()) {
        return;
    }
    let mut readers = Vec::new();
    for (id, src) in sources {
        if let Some((inc, exc)) = src.read_globs() {
            readers.push((id, ReadMatcher::new(inc, exc)));
        }
    }
    if readers.is_empty() {
        return;
    }
    for ((_, sink), node) in sinks.iter().zip(nodes) {
        let Some(out) = sink.output_file() else {
            continue;
        };
        let key_node = node
            .as_map_quiet()
            .and_then(|m| m.get(out.key))
            .unwrap_or(*node);
        if let Some((id, _)) = readers.iter().find(|(_, m)| m.reads(out.path)) {
            let given = match key_node.raw() {
                petrel_core::config::YamlNode::Scalar(s) => s.as_str().to_string(),
                _ => out.path.display().to_string(),
            };
            key_node.error(format!(
                "the file sink writes `{given}`, which source `{id}` of this pipeline reads: it would read its own output forever; write elsewhere or add the path to that source's `exclude`"
            ));
        }
    }
}

/// Parses each entry of a `sources:`, `processors:` or `sinks:` list with
/// the registered plugin of its `type`. Returns the entries with their ids,
/// and the node of each (for checks across entries).
fn section<'a, C: ?Sized>(
    n: Node<'a>,
    what: &str,
    plugins: &[&Plugin<C>],
    common_keys: &[&'static str],
) -> (Vec<(String, Arc<C>)>, Vec<Node<'a>>) {
    let types = registry::type_names(plugins);
    let mut out: Vec<(String, Arc<C>)> = Vec::new();
    let mut nodes = Vec::new();
    for (i, item) in n.as_list().into_iter().enumerate() {
        let Some(ty) = component_type(item, &types, what) else {
            continue;
        };
        let Some(plugin) = plugins.iter().find(|p| p.type_name == ty) else {
            continue;
        };
        let keys: Vec<&str> = plugin.keys.iter().chain(common_keys).copied().collect();
        let Some(map) = item.as_map(&keys) else {
            continue;
        };
        let Some(cfg) = (plugin.parse)(map) else {
            continue;
        };
        let m = item.as_map_quiet();
        // A plugin whose own settings use `id` (a document id) lists
        // `component_id` among its keys: its component id is read there.
        let id_key = if plugin.keys.contains(&COMPONENT_ID_KEY) {
            COMPONENT_ID_KEY
        } else {
            "id"
        };
        let id = m
            .and_then(|m| m.str(id_key))
            .map(str::to_string)
            .unwrap_or_else(|| format!("{ty}_{i}"));
        if out.iter().any(|(other, _)| *other == id) {
            item.error(format!(
                "duplicate {what} id `{id}`; give each {what} its own `id`"
            ));
        }
        out.push((id, cfg));
        nodes.push(item);
    }
    (out, nodes)
}

/// The key naming a component whose plugin reads `id` as a setting of its
/// own (the elasticsearch sink's document id); other plugins use `id`.
pub const COMPONENT_ID_KEY: &str = "component_id";

/// Reads `type:` of a component and checks it against `types`.
pub fn component_type(node: Node<'_>, types: &[&'static str], what: &str) -> Option<&'static str> {
    let Some(m) = node.as_map_quiet() else {
        node.error(format!(
            "each {what} must be a mapping with a `type`, e.g. `- type: {}`",
            types.first().copied().unwrap_or("...")
        ));
        return None;
    };
    let Some(tn) = m.get("type") else {
        node.error(format!(
            "missing required key `type` in this {what}; one of {}",
            list(types)
        ));
        return None;
    };
    let t = tn.as_str()?;
    if let Some(found) = types.iter().find(|x| **x == t) {
        return Some(found);
    }
    let mut msg = format!("unknown {what} type `{t}`");
    if let Some(best) = closest(t, types) {
        msg.push_str(&format!("; did you mean `{best}`?"));
    }
    if types.is_empty() {
        msg.push_str(&format!("; no {what} types exist yet, remove this entry"));
    } else {
        msg.push_str(&format!("; available: {}", list(types)));
    }
    tn.error(msg);
    None
}

fn list(types: &[&str]) -> String {
    types
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
