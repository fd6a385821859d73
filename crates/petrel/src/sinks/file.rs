//! `type: file` — appends encoded events to a local file.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::encode::{encode_batch, Encoding};
use petrel_core::plugin::{BoxFuture, Encoded, PayloadReceiver, Sink};
use petrel_core::{ComponentMetrics, EventBatch};

use super::writer::{self, Target};

/// Keys accepted by the file sink.
pub const KEYS: &[&str] = &["type", "id", "path", "encoding", "fsync", "read_back"];

/// Configuration of the file sink.
#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// Output path; parent directories are created.
    pub path: PathBuf,
    /// `text` or `ndjson`.
    pub encoding: Encoding,
    /// fdatasync after every write, before acknowledging.
    pub fsync: bool,
    /// Other pipelines' file sources may read this file (chaining
    /// pipelines through a file). Without it every file source skips it.
    pub read_back: bool,
}

impl FileSinkConfig {
    /// Reads the sink's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let path = map.required("path", "/var/tmp/out/app.log")?.as_str()?;
        if path.is_empty() {
            map.node().error("`path` must not be empty");
            return None;
        }
        Some(Self {
            path: crate::paths::resolve_path(map.node(), path),
            encoding: super::parse_encoding(&map)?,
            fsync: map.bool("fsync").unwrap_or(false),
            read_back: map.bool("read_back").unwrap_or(false),
        })
    }
}

/// The running file sink.
pub struct FileSink {
    encoding: Encoding,
    fsync: bool,
    file: Mutex<Option<SyncFile>>,
    metrics: ComponentMetrics,
}

struct SyncFile(File);

impl std::io::Write for SyncFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Target for SyncFile {
    fn sync(&mut self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

impl FileSink {
    /// Opens (creating if needed) the output file for appending.
    pub fn new(c: &FileSinkConfig, metrics: ComponentMetrics) -> anyhow::Result<Self> {
        if let Some(dir) = c.path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    anyhow::anyhow!("file sink: cannot create directory {}: {e}", dir.display())
                })?;
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&c.path)
            .map_err(|e| anyhow::anyhow!("file sink: cannot open {}: {e}", c.path.display()))?;
        Ok(Self {
            encoding: c.encoding,
            fsync: c.fsync,
            file: Mutex::new(Some(SyncFile(file))),
            metrics,
        })
    }
}

impl Sink for FileSink {
    fn encode(&self, batch: &EventBatch, out: &mut Encoded) {
        out.invalid_utf8 = encode_batch(self.encoding, batch, &mut out.bytes, None).invalid_utf8;
    }

    fn run(self: Arc<Self>, rx: PayloadReceiver) -> BoxFuture {
        Box::pin(async move {
            let Some(file) = self.file.lock().take() else {
                return;
            };
            writer::run(file, rx, self.fsync, self.metrics.clone()).await;
        })
    }
}

/// Registration of `type: file`.
pub const PLUGIN: petrel_core::plugin::SinkPlugin = petrel_core::plugin::SinkPlugin {
    type_name: "file",
    keys: KEYS,
    parse: |m| FileSinkConfig::parse(m).map(|c| std::sync::Arc::new(c) as _),
};

impl petrel_core::plugin::SinkConfig for FileSinkConfig {
    fn type_name(&self) -> &'static str {
        "file"
    }

    fn build(
        &self,
        metrics: ComponentMetrics,
    ) -> anyhow::Result<std::sync::Arc<dyn petrel_core::plugin::Sink>> {
        Ok(std::sync::Arc::new(FileSink::new(self, metrics)?))
    }

    fn output_file(&self) -> Option<petrel_core::plugin::OutputFile<'_>> {
        Some(petrel_core::plugin::OutputFile {
            path: &self.path,
            key: "path",
            read_back: self.read_back,
        })
    }
}
