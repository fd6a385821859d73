//! `type: file` — tails files matched by globs, through rotation,
//! truncation and restarts, committing offsets only after delivery.
//!
//! Layout: [`discovery`] finds files for all sources at once, [`reader`]
//! reads one file into batches, [`tracker`] turns acknowledgements into
//! committed offsets, [`checkpoint`] persists them, [`identity`] tells
//! files apart, and [`service`] is the input thread tying them together.

pub mod checkpoint;
pub mod decode;
pub mod discovery;
pub mod identity;
pub mod multiline;
pub mod reader;
pub mod service;
pub mod tracker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_core::config::{Map, YamlNode};
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};

use reader::ReadContext;
use service::{FileService, ServiceOptions, SourceSpec};

/// Keys accepted by the file source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "include",
    "exclude",
    "read_from",
    "max_line_bytes",
    "partial_line_timeout_ms",
    "read_block_bytes",
    "multiline",
    "close_inactive_secs",
    "ignore_older",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Tails files matched by globs through rotation, truncation and restarts; an offset is committed only once every sink acknowledged the events below it. Every event carries `message`, `file` and `host`."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "include",
        kind: petrel_core::plugin::KeyKind::List,
        default: None,
        doc: r#"Globs of files to read (required): `*` and `?` within a path component, `[..]` classes, `**` any number of directories."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "exclude",
        kind: petrel_core::plugin::KeyKind::List,
        default: Some(r#"[]"#),
        doc: r#"Globs of files to skip; a pattern without leading `/` or `**` matches at any depth (`*.gz` = `**/*.gz`)."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "read_from",
        kind: petrel_core::plugin::KeyKind::OneOf(&["beginning", "end"]),
        default: Some(r#"end"#),
        doc: r#"Where to start in a file without checkpoint. `end` applies only to files present at the source's very first start; files that appear later, including while the agent was stopped, are read from their beginning."#,
    },
    petrel_core::plugin::KeyDoc {
        name: "max_line_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"1MiB"#),
        doc: r#"Longer lines are split into pieces of this size, each an event; counted as `line_too_long`."#,
    },
    PARTIAL_LINE_TIMEOUT_DOC,
    petrel_core::plugin::KeyDoc {
        name: "read_block_bytes",
        kind: petrel_core::plugin::KeyKind::Bytes,
        default: Some(r#"256KiB"#),
        doc: r#"Size of one read, 4KiB to 64MiB."#,
    },
    crate::sources::file::multiline::MULTILINE_DOC,
    petrel_core::plugin::KeyDoc {
        name: "close_inactive_secs",
        kind: petrel_core::plugin::KeyKind::Duration,
        default: Some(r#"300"#),
        doc: r#"A file read to its end that has not grown for this long is closed (its offset kept) and reopened at that offset when it grows, so thousands of idle files do not hold a descriptor each."#,
    },
    IGNORE_OLDER_DOC,
];

/// The `ignore_older` key, documented once for every plugin that reads it.
pub const IGNORE_OLDER_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "ignore_older",
    kind: petrel_core::plugin::KeyKind::Duration,
    default: None,
    doc: r#"A file without checkpoint last modified longer ago than this (`24h`, `7d`; Filebeat's `ignore_older`, Vector's `ignore_older_secs`) is not read: it is watched from its end, so lines appended to it later are read. Files with a checkpoint resume where they were."#,
};

/// The `partial_line_timeout_ms` key, documented once for every plugin that reads it.
pub const PARTIAL_LINE_TIMEOUT_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "partial_line_timeout_ms",
    kind: petrel_core::plugin::KeyKind::Duration,
    default: Some(r#"5000"#),
    doc: r#"A last line without newline is emitted once the file has not grown for this long."#,
};

/// Where to start in files that have no checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// From the first byte.
    Beginning,
    /// From the current end (files present at the first scan only; files
    /// that appear later are always read from the beginning).
    End,
}

/// Configuration of the file source.
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    /// Absolute include globs (`*`, `?`, `[..]`, `**`).
    pub include: Vec<String>,
    /// Absolute exclude globs.
    pub exclude: Vec<String>,
    /// Start position for files without checkpoint.
    pub read_from: ReadFrom,
    /// Lines longer than this are split into pieces (counted).
    pub max_line_bytes: usize,
    /// Emit an unterminated last line after the file stopped growing this long.
    pub partial_line_timeout: Duration,
    /// How long a decoded file's unfinished message (a container line's
    /// first parts) waits for its last part while the file stays at its
    /// path (`partial_line_timeout` once it was rotated away or deleted).
    pub unfinished_line_timeout: Duration,
    /// Size of one read.
    pub read_block_bytes: usize,
    /// Joining lines into events.
    pub multiline: Option<multiline::Multiline>,
    /// Close a file read to its end that did not grow for this long
    /// (default 5 minutes); it is reopened at its offset when it grows.
    pub close_inactive: Option<Duration>,
    /// A file without checkpoint whose last change is older than this is
    /// watched from its end: only what is appended later is read.
    pub ignore_older: Option<Duration>,
}

impl FileSourceConfig {
    /// Reads the source's keys; relative patterns are resolved against the
    /// directory of the configuration file.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        // Every key is checked even when an earlier one is wrong, so that
        // `petrel validate` reports all problems at once.
        let mut include = Vec::new();
        if let Some(inc_node) = map.required("include", "[\"/var/log/app/*.log\"]") {
            let items = inc_node.as_list();
            // A mapping was already reported by `as_list`; a list whose
            // globs are all invalid was reported glob by glob.
            if items.is_empty() && !matches!(inc_node.raw(), YamlNode::Mapping(_)) {
                inc_node
                    .error("`include` needs at least one glob, e.g. `[\"/var/log/app/*.log\"]`");
            }
            for n in items {
                if let Some(g) = n.as_str().and_then(|p| glob_of(n, p)) {
                    include.push(g);
                }
            }
        }
        let mut exclude = Vec::new();
        if let Some(n) = map.get("exclude") {
            for (p, n) in n.as_str_list() {
                // Relative excludes such as `**/*.gz` match anywhere.
                let pat = if p.starts_with('/') || p.starts_with("**") {
                    p.to_string()
                } else {
                    format!("**/{p}")
                };
                if let Err(e) = discovery::compile_glob(&pat) {
                    n.error(format!("invalid glob `{p}`: {}", e.kind()));
                } else {
                    exclude.push(pat);
                }
            }
        }
        let read_from = match map.choice("read_from", &["beginning", "end"]) {
            Some("beginning") => Some(ReadFrom::Beginning),
            Some(_) => Some(ReadFrom::End),
            None if map.get("read_from").is_some() => None, // reported
            None => Some(ReadFrom::End),
        };
        let max_line_bytes = map.u64("max_line_bytes", true).unwrap_or(1 << 20) as usize;
        let read_block_bytes = map.u64("read_block_bytes", true).unwrap_or(256 << 10) as usize;
        if max_line_bytes < 64 {
            if let Some(n) = map.get("max_line_bytes") {
                n.error("`max_line_bytes` must be at least 64");
            }
        }
        if !(4096..=64 << 20).contains(&read_block_bytes) {
            if let Some(n) = map.get("read_block_bytes") {
                n.error("`read_block_bytes` must be between 4096 and 64MiB");
            }
        }
        let partial_line_timeout =
            Duration::from_millis(map.u64("partial_line_timeout_ms", false).unwrap_or(5000));
        let multiline = match map.get("multiline") {
            Some(n) => multiline::Multiline::parse(n, max_line_bytes).map(Some),
            None => Some(None),
        };
        let (Some(read_from), Some(multiline)) = (read_from, multiline) else {
            return None; // reported
        };
        if include.is_empty() {
            return None; // reported above
        }
        Some(Self {
            include,
            exclude,
            read_from,
            max_line_bytes: max_line_bytes.clamp(64, 1 << 30),
            partial_line_timeout,
            // Plain files have no decoded messages.
            unfinished_line_timeout: partial_line_timeout,
            read_block_bytes: read_block_bytes.clamp(4096, 64 << 20),
            multiline,
            close_inactive: map
                .u64("close_inactive_secs", false)
                .map(Duration::from_secs),
            ignore_older: match map.get("ignore_older") {
                Some(n) => Some(n.as_duration()?),
                None => None,
            },
        })
    }
}

fn glob_of(n: petrel_core::config::Node<'_>, p: &str) -> Option<String> {
    if p.trim().is_empty() {
        n.error("an include glob must not be empty; write a path such as `/var/log/app/*.log`");
        return None;
    }
    let abs = crate::paths::resolve_path(n, p)
        .to_string_lossy()
        .into_owned();
    if !discovery::is_clean_absolute(&abs) {
        n.error(format!("include glob `{p}` must not contain `..`"));
        return None;
    }
    match discovery::compile_glob(&abs) {
        Ok(_) => Some(abs),
        Err(e) => {
            n.error(format!(
                "invalid glob `{p}`: {}; check brackets and braces",
                e.kind()
            ));
            None
        }
    }
}

/// Registration of `type: file`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "file",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| FileSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// How long the file input, once caught up, lets new writes accumulate
/// after inotify woke it. Every read costs a hand-off through each stage
/// (processing pool, sink, acknowledgement, checkpoint); loggers that write
/// every few milliseconds or every line made that the dominant cost at low
/// rates. Data arriving while the input is still catching up is read at
/// once. 250 ms rather than 50: four containers' logs at 3 MB/s cost 1.0 %
/// of a core at 50 ms, 0.6 % at 250 ms and 0.55 % at 500 ms (BENCHMARKS.md
/// section 7), and a quarter second is well inside what shippers that
/// flush every second add anyway.
const IDLE_READ_DELAY: Duration = Duration::from_millis(250);

impl petrel_core::plugin::SourceConfig for FileSourceConfig {
    fn type_name(&self) -> &'static str {
        "file"
    }

    fn read_globs(&self) -> Option<(&[String], &[String])> {
        Some((&self.include, &self.exclude))
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        start_reading(ctx, self.clone(), None, "file")
    }
}

/// Registers a source that reads files with the shared input thread:
/// `type: file`, and sources built on it (`kubernetes_logs`) that choose
/// files, set their metadata and decode their lines with `select`.
pub fn start_reading(
    ctx: SourceContext,
    config: FileSourceConfig,
    select: Option<Arc<dyn service::FileSelector>>,
    source_type: &'static str,
) -> anyhow::Result<Box<dyn Source>> {
    let agent = ctx.metrics.metrics().clone();
    // One input thread reads for every file source of every pipeline.
    let service = ctx.shared.get_or_try_init(|| {
        FileService::start(
            ServiceOptions {
                data_dir: ctx.engine.data_dir.clone(),
                rescan_interval: Duration::from_secs(10),
                poll_interval: Duration::from_secs(1),
                checkpoint_interval: Duration::from_secs(1),
                deleted_file_timeout: Duration::from_secs(60),
                rotated_file_idle: Duration::from_secs(5),
                close_inactive: Duration::from_secs(300),
                checkpoint_ttl: ctx.engine.checkpoint_ttl,
                idle_read_delay: IDLE_READ_DELAY,
            },
            agent.clone(),
        )
    })?;
    let mut config = config;
    for p in ctx.own_outputs.iter() {
        for s in crate::paths::spellings(p) {
            config.exclude.push(globset::escape(&s.to_string_lossy()));
        }
    }
    let m = &ctx.metrics;
    let spec = SourceSpec {
        key: ctx.key.clone(),
        pipeline: ctx.pipeline.clone(),
        own_outputs: ctx.own_outputs.clone(),
        ctx: ReadContext {
            block_bytes: config.read_block_bytes,
            max_line_bytes: config.max_line_bytes,
            partial_line_timeout: config.partial_line_timeout,
            unfinished_line_timeout: config.unfinished_line_timeout,
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            sent_events: m.sent_events.clone(),
            sent_bytes: m.sent_bytes.clone(),
            split_lines: m.error_counter("line_too_long"),
            pauses: m.backpressure_pauses(),
            read_errors: m.error_counter("read_failed"),
            truncations: m.error_counter("file_truncated"),
            meta: ctx.meta.clone(),
            multiline: config.multiline.clone().map(Arc::new),
            multiline_cut: m.error_counter("multiline_cut"),
        },
        config,
        select,
        source_type,
    };
    service.add(spec);
    Ok(Box::new(RunningFileSource {
        service,
        key: ctx.key,
        stopped: None,
    }))
}

/// A file source registered with the shared input thread.
struct RunningFileSource {
    service: Arc<FileService>,
    key: String,
    stopped: Option<(Instant, std::sync::mpsc::Receiver<bool>)>,
}

impl Source for RunningFileSource {
    fn begin_stop(&mut self, deadline: Instant) {
        if self.stopped.is_none() {
            self.stopped = Some((deadline, self.service.remove(&self.key, deadline)));
        }
    }

    fn wait_stopped(mut self: Box<Self>, deadline: Instant) -> anyhow::Result<()> {
        if self.stopped.is_none() {
            self.begin_stop(deadline);
        }
        let Some((deadline, rx)) = self.stopped.take() else {
            return Ok(());
        };
        // The input thread answers by the deadline; a little slack for
        // the final checkpoint write.
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
        match rx.recv_timeout(wait) {
            Ok(true) => Ok(()),
            Ok(false) => Err(anyhow::anyhow!(
                "source {}: its final offsets could not be written to the checkpoint",
                self.key
            )),
            Err(_) => Err(anyhow::anyhow!(
                "source {}: the input thread did not answer the stop request",
                self.key
            )),
        }
    }

    fn is_alive(&self) -> bool {
        self.service.is_alive()
    }
}
