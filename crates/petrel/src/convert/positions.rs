//! Positions import: another agent's read positions written as Petrel
//! checkpoints, so that Petrel starts on each file where the other agent
//! stopped, with nothing sent twice and nothing skipped.
//!
//! A position is a path, the file's inode when the agent recorded it, and
//! the offset delivered up to. It is imported for every file source of
//! the Petrel pipelines whose globs take that file (`file` and
//! `kubernetes_logs`), keyed as the source keeps its checkpoints
//! (`pipeline/source id`, then the file's device and inode, a fingerprint
//! of its first bytes as they are now, and the offset).
//!
//! A position is not imported, and the report says why, when:
//! - the file is gone;
//! - it was rotated since (another inode at the path): the old file is
//!   not followed, and the new one is read per the source's `read_from`;
//! - it is shorter than the offset (truncated): read per `read_from`;
//! - no Petrel source reads it;
//! - Petrel has its own checkpoint for it already (kept: it is newer).
//!
//! Formats: Fluent Bit's tail database (SQLite, table `in_tail_files`),
//! read without changing it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Origin, Outcome, ReadError, Report};
use crate::config::PipelineConfig;
use crate::sources::file::checkpoint::{CheckpointStore, Entry};
use crate::sources::file::identity::{FileId, Fingerprint};

/// One position of the other agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The path it recorded.
    pub path: String,
    /// The inode it recorded, if any.
    pub inode: Option<u64>,
    /// Bytes delivered.
    pub offset: u64,
    /// Where it was read (the database and row).
    pub at: Origin,
}

fn read_err(path: &Path, message: impl Into<String>) -> ReadError {
    ReadError {
        at: Origin {
            file: path.display().to_string(),
            line: 1,
        },
        message: message.into(),
    }
}

/// Reads Fluent Bit's tail database (`DB` of a tail input) read-only.
pub fn read_fluent_bit(db: &Path) -> Result<Vec<Position>, ReadError> {
    let mut head = [0u8; 16];
    let ok = std::fs::File::open(db)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok();
    if !ok || &head != b"SQLite format 3\0" {
        return Err(read_err(
            db,
            "not a SQLite database: give the file of the tail input's `DB` key",
        ));
    }
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| read_err(db, format!("cannot open: {e}")))?;
    let mut stmt = conn
        .prepare("SELECT id, name, offset, inode FROM in_tail_files ORDER BY id")
        .map_err(|e| {
            read_err(
                db,
                format!("no Fluent Bit tail positions in it (table `in_tail_files`): {e}"),
            )
        })?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })
        .map_err(|e| read_err(db, format!("cannot read `in_tail_files`: {e}")))?;
    let mut out = Vec::new();
    for r in rows {
        let (id, name, offset, inode) =
            r.map_err(|e| read_err(db, format!("a row of `in_tail_files`: {e}")))?;
        out.push(Position {
            path: name,
            inode: inode.and_then(|i| u64::try_from(i).ok()),
            offset: offset.and_then(|o| u64::try_from(o).ok()).unwrap_or(0),
            at: Origin {
                file: db.display().to_string(),
                line: usize::try_from(id).unwrap_or(0),
            },
        });
    }
    Ok(out)
}

/// The sources of `pipelines` that read `path`: their checkpoint keys.
fn readers_of(path: &Path, pipelines: &[PipelineConfig]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pipelines {
        for (id, s) in &p.sources {
            let Some((include, exclude)) = s.read_globs() else {
                continue;
            };
            let set = |globs: &[String]| {
                let mut b = globset::GlobSetBuilder::new();
                for g in globs {
                    if let Ok(g) = globset::GlobBuilder::new(g).literal_separator(true).build() {
                        b.add(g);
                    }
                }
                b.build().ok()
            };
            let (Some(inc), Some(exc)) = (set(include), set(exclude)) else {
                continue;
            };
            if inc.is_match(path) && !exc.is_match(path) {
                out.push(format!("{}/{id}", p.name));
            }
        }
    }
    out
}

/// Writes `positions` into the checkpoints of `data_dir` for the sources
/// of `pipelines` that read them; every position gets a report entry.
/// Returns how many checkpoints were written.
pub fn import(
    positions: &[Position],
    pipelines: &[PipelineConfig],
    data_dir: &Path,
    report: &mut Report,
) -> Result<usize, ReadError> {
    let store_err = |e: std::io::Error| read_err(data_dir, format!("the checkpoints: {e}"));
    let mut store = CheckpointStore::open(data_dir).map_err(store_err)?;
    let mut snap = store.load().map_err(store_err)?;
    let seen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 3600 * 3600);
    let comp = "[positions]";
    let mut written = 0;
    for pos in positions {
        let path = PathBuf::from(&pos.path);
        let mut say = |o: Outcome, note: String| report.add(&pos.at, comp, &pos.path, o, note);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                say(
                    Outcome::Converted,
                    format!("not imported: the file is gone ({e}); nothing left to read"),
                );
                continue;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                say(Outcome::NotConverted, format!("cannot stat: {e}"));
                continue;
            }
        };
        let id = FileId::of(&meta);
        if pos.inode.is_some_and(|i| i != id.ino) {
            say(Outcome::Approximated, "not imported: the file was rotated since (another inode at this path); the file there now is read per the source's `read_from`".into());
            continue;
        }
        if meta.len() < pos.offset {
            say(Outcome::Approximated, format!("not imported: the file is shorter ({} bytes) than the position ({}): truncated since, read per the source's `read_from`", meta.len(), pos.offset));
            continue;
        }
        // The real file behind a link (/var/log/containers → /var/log/pods),
        // as the sources' globs name it.
        let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        let mut keys = readers_of(&path, pipelines);
        for k in readers_of(&real, pipelines) {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            say(
                Outcome::NotConverted,
                "no Petrel source reads this file: check the converted pipelines' `include`".into(),
            );
            continue;
        }
        let fingerprint = match Fingerprint::read(&file, meta.len()) {
            Ok(f) => f,
            Err(e) => {
                say(
                    Outcome::NotConverted,
                    format!("cannot read its first bytes: {e}"),
                );
                continue;
            }
        };
        for key in keys {
            let entries: &mut HashMap<FileId, Entry> = snap.entry(key.clone()).or_default();
            if let Some(have) = entries.get(&id) {
                say(Outcome::Converted, format!("kept Petrel's own position for `{key}` (offset {}), newer than the imported one ({})", have.offset, pos.offset));
                continue;
            }
            entries.insert(
                id,
                Entry {
                    id,
                    fingerprint,
                    offset: pos.offset,
                    path: real.display().to_string(),
                    seen,
                },
            );
            written += 1;
            say(
                Outcome::Converted,
                format!(
                    "`{key}` starts at offset {} of {} bytes",
                    pos.offset,
                    meta.len()
                ),
            );
        }
    }
    store.save(&snap).map_err(store_err)?;
    Ok(written)
}
