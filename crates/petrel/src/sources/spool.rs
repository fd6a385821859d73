//! `type: spool` — what `petrel pipe` (or another Petrel writer) appended
//! to a spool directory, one event per line.
//!
//! ```yaml
//! sources:
//!   - type: spool
//!     path: /var/lib/petrel/spool/apache
//! ```
//! Delivered records are committed in the directory (`reader.state`) and
//! finished segments deleted; after a restart reading resumes there. Only
//! one source (one agent) may read a spool directory.

use std::path::PathBuf;
use std::sync::Arc;

use petrel_core::config::Map;
use petrel_core::plugin::{Source, SourceContext, SourcePlugin};

use super::net::{intake, RawDecode, RunningNet};

/// Keys accepted by the spool source.
pub const KEYS: &[&str] = &["type", "id", "path"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Delivers what `petrel pipe` wrote to a spool directory, commits what every sink acknowledged, and deletes finished segments. One per directory."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[petrel_core::plugin::KeyDoc] = &[
    petrel_core::plugin::KeyDoc::TYPE,
    petrel_core::plugin::KeyDoc::ID,
    petrel_core::plugin::KeyDoc {
        name: "path",
        kind: petrel_core::plugin::KeyKind::String,
        default: None,
        doc: r#"Required: the absolute spool directory given to `petrel pipe --spool-dir`."#,
    },
];

/// Registration of `type: spool`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "spool",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| SpoolSourceConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Configuration of the spool source.
#[derive(Debug, Clone)]
pub struct SpoolSourceConfig {
    path: PathBuf,
}

impl SpoolSourceConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let n = map.required("path", "/var/lib/petrel/spool/apache")?;
        let p = n.as_str()?;
        if !p.starts_with('/') {
            n.error(format!(
                "`path` must be absolute (the directory given to `petrel pipe --spool-dir`); got `{p}`"
            ));
            return None;
        }
        Some(Self { path: p.into() })
    }
}

impl petrel_core::plugin::SourceConfig for SpoolSourceConfig {
    fn local_paths(&self) -> Vec<String> {
        vec![self.path.to_string_lossy().into_owned()]
    }

    fn type_name(&self) -> &'static str {
        "spool"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let runner = intake::start_spool_reader(&ctx, Arc::new(RawDecode), &self.path, "spool")?;
        tracing::info!(source = %ctx.key, path = %self.path.display(), "reading spool");
        Ok(Box::new(RunningNet::new(Vec::new(), runner, None)))
    }
}
