//! `type: journald` — entries of the systemd journal.
//!
//! ```yaml
//! sources:
//!   - type: journald
//!     directory: /var/log/journal      # default: the system journal
//!     units: [kubelet, containerd]     # `_SYSTEMD_UNIT=kubelet.service` ...
//!     include_matches: { _TRANSPORT: [kernel, journal] }
//!     exclude_matches: { SYSLOG_IDENTIFIER: [noisy] }
//!     since_now: false                 # without a checkpoint: from the oldest entry
//! ```
//!
//! The journal is read through `journalctl --follow --output=export`, the
//! journal's own reader (with `--merge`, every boot and every machine's
//! files of the directory, see `journalctl_args`): it knows every journal file format and
//! compression its systemd version knows, follows rotation, and merges
//! the files of a directory. Its export format is parsed here without
//! copying: a batch's buffer is the bytes journalctl wrote, and each field
//! of an entry is a span of it, binary values included (bytes, never
//! re-encoded).
//!
//! The checkpoint is the journal cursor of the last entry every sink
//! acknowledged, saved in the data dir. On start journalctl is asked to
//! begin *at* that cursor (`--cursor`, not `--after-cursor`: journalctl
//! 252 skips one entry after seeking even when the cursor's entry is gone,
//! which loses the oldest surviving entry after a vacuum). When the first
//! entry is the checkpoint's own, it is dropped (already delivered); when
//! it is another one, the checkpoint's entry was rotated or vacuumed away
//! while the agent was behind or stopped, and unless the first entry is
//! its direct successor (same sequence number id, number + 1) the gap is
//! counted (`journal_gap`) and logged; reading goes on at the oldest
//! surviving entry.
//!
//! A failed delivery restarts journalctl at the checkpoint: entries after
//! it are read again (at least once, never lost). When the budget is full
//! the pipe to journalctl fills and it waits: backpressure.

use std::collections::HashMap;
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use petrel_core::config::Map;
use petrel_core::metrics::ComponentMetrics;
use petrel_core::plugin::{Emitter, KeyDoc, KeyKind, Source, SourceContext, SourcePlugin};
use petrel_core::state::StateStore;
use petrel_core::LazyCounter;
use petrel_core::{
    BatchAck, Event, EventBatch, Key, MemoryCharge, PipelineBudget, SourceInfo, Span, Value,
};

use super::ordered::{readable, OrderedShared, RunningOrdered};

/// Keys accepted by the journald source.
pub const KEYS: &[&str] = &[
    "type",
    "id",
    "directory",
    "units",
    "include_matches",
    "exclude_matches",
    "since_now",
    "max_age",
    "journalctl_path",
    "max_entry_bytes",
];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Reads the systemd journal (the system journal, or the journal files of `directory`) through `journalctl --follow --output=export`. Each entry is an event: `MESSAGE` is the message, `PRIORITY` also gives `level` (emerg, alert, crit, err, warning, notice, info, debug), `__REALTIME_TIMESTAMP` the event time, and every field is kept under its journal name (`_SYSTEMD_UNIT`, `_PID`, `_HOSTNAME`, `_BOOT_ID`, `__CURSOR`, ...) as the bytes the journal holds (binary values too). The journal cursor is checkpointed once every sink acknowledged; entries rotated or vacuumed away before they were read are counted as `journal_gap`. In a container, mount `/var/log/journal`, `/run/log/journal` and `/etc/machine-id` read-only."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "directory",
        kind: KeyKind::String,
        default: None,
        doc: r#"Read the journal files of this directory (`journalctl --directory`), e.g. a host's `/var/log/journal` mounted into a container. Without it: the system journal (`/var/log/journal` and `/run/log/journal`)."#,
    },
    KeyDoc {
        name: "units",
        kind: KeyKind::List,
        default: None,
        doc: r#"Only entries of these systemd units (`_SYSTEMD_UNIT=` matches, any of them); `.service` is appended to a name without a suffix (`kubelet` → `kubelet.service`)."#,
    },
    KeyDoc {
        name: "include_matches",
        kind: KeyKind::Map,
        default: None,
        doc: r#"Field name → list of values: only entries whose field has one of the values, for every field listed (journalctl matches: values of one field are ORed, fields ANDed). Field names are the journal's (upper case letters, digits, `_`)."#,
    },
    KeyDoc {
        name: "exclude_matches",
        kind: KeyKind::Map,
        default: None,
        doc: r#"Field name → list of values: entries whose field has one of the values are dropped (counted in `petrel_component_discarded_events_total{reason="excluded"}`)."#,
    },
    KeyDoc {
        name: "since_now",
        kind: KeyKind::Bool,
        default: Some("false"),
        doc: r#"Without a checkpoint, start at the end of the journal (only new entries) instead of its oldest entry. With a checkpoint, reading always resumes after it."#,
    },
    KeyDoc {
        name: "max_age",
        kind: KeyKind::Duration,
        default: None,
        doc: r#"Without a checkpoint, start with the entries of the last `max_age` (`12h`, `7d`; Alloy's `max_age`) instead of the oldest entry (`journalctl --since`). With a checkpoint, reading resumes after it whatever its age."#,
    },
    KeyDoc {
        name: "journalctl_path",
        kind: KeyKind::String,
        default: Some("journalctl"),
        doc: r#"The journalctl to run (looked up in `PATH` without a `/`). It must be at least as new as the systemd that writes the journal: an older one skips files with features it does not know, which is reported as `journal_unsupported` with what to do."#,
    },
    KeyDoc {
        name: "max_entry_bytes",
        kind: KeyKind::Bytes,
        default: Some("8MiB"),
        doc: r#"Larger entries (in export format) are dropped and counted as `entry_too_large`; 4KiB to 512MiB."#,
    },
];

/// Registration of `type: journald`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "journald",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| JournaldConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Bytes asked of one read of journalctl's output.
const READ_BYTES: usize = 256 << 10;
/// The buffer asked for journalctl's output pipe (the kernel's default is
/// 64 KiB): with the default, a reader that keeps up wakes for every 64
/// KiB journalctl writes, and those wakeups cost more than the parsing.
const PIPE_BYTES: libc::c_int = 1 << 20;
/// Syslog severity names, appended to every batch buffer so that `level`
/// is a span like the other fields (no allocation per entry).
const LEVELS: &[u8] = b"emergalertcriterrwarningnoticeinfodebug";
/// (start, len) of each severity 0..=7 in [`LEVELS`].
const LEVEL_SPANS: [(usize, usize); 8] = [
    (0, 5),
    (5, 5),
    (10, 4),
    (14, 3),
    (17, 7),
    (24, 6),
    (30, 4),
    (34, 5),
];
/// Distinct field names given a `'static` name (leaked once, shared by
/// every journald source); journals have a few hundred at most, and
/// beyond this names are allocated per event instead of leaking more.
const MAX_INTERNED: usize = 4096;
/// Field positions of an entry whose names are remembered (entries have
/// a few dozen fields).
const MAX_POSITIONS: usize = 256;
/// How often the checkpoint is written when it moved.
const SAVE_EVERY: Duration = Duration::from_millis(200);
const MIN_RESTART: Duration = Duration::from_millis(200);
const MAX_RESTART: Duration = Duration::from_secs(30);

/// Configuration of the journald source.
#[derive(Debug, Clone)]
pub struct JournaldConfig {
    /// `journalctl --directory`; the system journal when `None`.
    pub directory: Option<String>,
    /// `_SYSTEMD_UNIT` values, suffix added.
    pub units: Vec<String>,
    /// Field → values passed to journalctl as matches.
    pub include: Vec<(String, Vec<String>)>,
    /// Field → values whose entries are dropped.
    pub exclude: Vec<(String, Vec<Vec<u8>>)>,
    /// Start at the end without a checkpoint.
    pub since_now: bool,
    /// Without a checkpoint, start this long ago (not at the oldest
    /// entry).
    pub max_age: Option<std::time::Duration>,
    /// The journalctl to run.
    pub journalctl: String,
    /// Larger entries are dropped.
    pub max_entry_bytes: usize,
}

/// True for a journal field name (what journalctl accepts in a match).
fn valid_field_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// The unit name journald records: `.service` added without a suffix.
fn unit_name(u: &str) -> String {
    if u.contains('.') {
        u.to_string()
    } else {
        format!("{u}.service")
    }
}

fn parse_matches(map: &Map<'_>, key: &str) -> Option<Vec<(String, Vec<String>)>> {
    let Some(node) = map.get(key) else {
        return Some(Vec::new());
    };
    let m = node.as_map_quiet();
    let Some(m) = m else {
        node.error(format!(
            "`{key}` must be a mapping of journal field names to lists of values, e.g. `{key}: {{ _SYSTEMD_UNIT: [sshd.service] }}`"
        ));
        return None;
    };
    let mut out = Vec::new();
    let mut ok = true;
    for (field, values) in m.entries() {
        if !valid_field_name(field) {
            values.error(format!(
                "`{field}` in `{key}` is not a journal field name (upper case letters, digits and `_`, e.g. `_SYSTEMD_UNIT`)"
            ));
            ok = false;
            continue;
        }
        let list: Vec<String> = values
            .as_str_list()
            .into_iter()
            .map(|(s, _)| s.to_string())
            .collect();
        if list.is_empty() {
            values.error(format!(
                "`{key}.{field}` needs at least one value, e.g. `{field}: [value]`"
            ));
            ok = false;
            continue;
        }
        out.push((field.to_string(), list));
    }
    ok.then_some(out)
}

impl JournaldConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let mut ok = true;
        let directory = map.str("directory").map(str::to_string);
        if let (Some(d), Some(n)) = (&directory, map.get("directory")) {
            if d.is_empty() {
                n.error("`directory` is empty; give the journal directory, e.g. `/var/log/journal`, or remove the key to read the system journal");
                ok = false;
            }
        }
        let mut units = Vec::new();
        if let Some(n) = map.get("units") {
            for (u, un) in n.as_str_list() {
                if u.is_empty() || u.contains('=') || u.contains(char::is_whitespace) {
                    un.error(format!(
                        "`{u}` is not a unit name; write it as systemd does, e.g. `kubelet` or `kubelet.service`"
                    ));
                    ok = false;
                }
                units.push(unit_name(u));
            }
        }
        let include = parse_matches(&map, "include_matches");
        let exclude = parse_matches(&map, "exclude_matches");
        let since_now = map.bool("since_now").unwrap_or(false);
        let max_age = match map.get("max_age") {
            None => None,
            Some(n) => match n.as_duration() {
                Some(_) if since_now => {
                    n.error("`max_age` reads the last entries on a first start, `since_now: true` none of them; keep one of the two");
                    ok = false;
                    None
                }
                Some(d) => Some(d),
                None => {
                    ok = false;
                    None
                }
            },
        };
        let journalctl = map
            .str("journalctl_path")
            .unwrap_or("journalctl")
            .to_string();
        let max_entry_bytes = map.u64("max_entry_bytes", true).unwrap_or(8 << 20);
        if !(4096..=512 << 20).contains(&max_entry_bytes) {
            if let Some(n) = map.get("max_entry_bytes") {
                n.error("`max_entry_bytes` must be between 4KiB and 512MiB");
            }
            ok = false;
        }
        let (Some(include), Some(exclude)) = (include, exclude) else {
            return None;
        };
        if !ok {
            return None;
        }
        Some(Self {
            directory,
            units,
            include,
            exclude: exclude
                .into_iter()
                .map(|(k, v)| (k, v.into_iter().map(String::into_bytes).collect()))
                .collect(),
            since_now,
            max_age,
            journalctl,
            max_entry_bytes: max_entry_bytes as usize,
        })
    }

    /// journalctl's arguments: where it reads, where it starts, the
    /// matches. Values of one field are ORed by journalctl, fields ANDed;
    /// units are one more field (`_SYSTEMD_UNIT`), merged with an
    /// `include_matches` entry of that name.
    pub fn journalctl_args(&self, cursor: Option<&str>) -> Vec<String> {
        let mut args = vec![
            "--follow".to_string(),
            "--output=export".to_string(),
            "--no-pager".to_string(),
            // `--follow` alone implies `--boot` (the journal's last boot)
            // in journalctl 252, even at a cursor: entries of an earlier
            // boot not yet read at a reboot would be skipped. `--merge`
            // lifts that. Not `--quiet`: it hides the message that a
            // journal file uses a feature this journalctl does not know.
            "--merge".to_string(),
        ];
        if let Some(d) = &self.directory {
            args.push(format!("--directory={d}"));
        }
        match cursor {
            Some(c) => {
                args.push(format!("--cursor={c}"));
                args.push("--no-tail".to_string());
            }
            None if self.since_now => args.push("--lines=0".to_string()),
            None => {
                args.push("--no-tail".to_string());
                if let Some(age) = self.max_age {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    let since = now.saturating_sub(age).as_secs();
                    args.push(format!("--since=@{since}"));
                }
            }
        }
        for u in &self.units {
            args.push(format!("_SYSTEMD_UNIT={u}"));
        }
        for (field, values) in &self.include {
            if field == "_SYSTEMD_UNIT" && !self.units.is_empty() {
                // One field: journalctl ORs all its values together,
                // which would widen `units`; keep `units` and AND by
                // filtering here instead (see `accept`).
                continue;
            }
            for v in values {
                args.push(format!("{field}={v}"));
            }
        }
        args
    }
}

impl petrel_core::plugin::SourceConfig for JournaldConfig {
    fn local_paths(&self) -> Vec<String> {
        match &self.directory {
            Some(d) => vec![d.clone()],
            None => vec!["/var/log/journal".into(), "/run/log/journal".into()],
        }
    }
    fn runs_program(&self) -> Option<String> {
        // The default is the system's own journalctl; another one named
        // by the configuration is a program chosen by whoever wrote it.
        (self.journalctl != "journalctl").then(|| self.journalctl.clone())
    }

    fn type_name(&self) -> &'static str {
        "journald"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let committed = match ctx.state.load() {
            Ok(Some(b)) => match String::from_utf8(b) {
                Ok(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
                _ => {
                    tracing::warn!(state = %ctx.state.path().display(), "journald checkpoint is not a cursor; starting as without one");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => anyhow::bail!(
                "source {}: cannot read its checkpoint {}: {e}",
                ctx.key,
                ctx.state.path().display()
            ),
        };
        let shared = Arc::new(Shared::new(committed, |c: &String| c.as_bytes().to_vec()));
        // `units` and an `include_matches._SYSTEMD_UNIT` both given: the
        // latter is applied here (see `journalctl_args`).
        let unit_filter = if self.units.is_empty() {
            None
        } else {
            self.include
                .iter()
                .find(|(f, _)| f == "_SYSTEMD_UNIT")
                .map(|(_, v)| v.iter().map(|s| s.as_bytes().to_vec()).collect())
        };
        let m = &ctx.metrics;
        let mut reader = Reader {
            cfg: self.clone(),
            shared: shared.clone(),
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            info: Arc::new(SourceInfo {
                path: "".into(),
                meta: ctx.meta.clone(),
                source_type: "journald",
            }),
            state: ctx.state.clone(),
            key: ctx.key.clone(),
            names: HashMap::new(),
            by_position: Vec::new(),
            unit_filter,
            gaps: m.error_counter("journal_gap"),
            unsupported: m.error_counter("journal_unsupported"),
            too_large: m.error_counter("entry_too_large"),
            invalid: m.error_counter("invalid_export"),
            failures: m.error_counter("journalctl_failed"),
            excluded: m.discarded_counter("excluded"),
            metrics: ctx.metrics.clone(),
            carry: Vec::new(),
            skip: None,
            first_check: None,
            last_seq: None,
            skipped: m.error_counter("journal_skipped"),
            skipped_unlogged: 0,
            skipped_logged: None,
        };
        let handle = std::thread::Builder::new()
            .name("petrel-journald".into())
            .spawn(move || reader.run())?;
        Ok(Box::new(RunningOrdered::new(
            shared, handle, ctx.key, ctx.state, "journal",
        )))
    }
}

type Shared = OrderedShared<String>;

/// Where the skipping of an over-large entry is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Skip {
    /// At the start of a line, `n` bytes of the field name seen.
    Line(usize),
    /// In a text value, until its newline.
    Text,
    /// Reading the 8-byte length of a binary value: bytes so far.
    BinLen([u8; 8], usize),
    /// In a binary value: bytes left, its newline included.
    BinData(u64),
}

/// Field names given a `'static` name, by their bytes.
type Interned = Mutex<HashMap<Box<[u8]>, &'static str>>;

/// Field name interning shared by all journald sources.
fn interned() -> &'static Interned {
    static NAMES: OnceLock<Interned> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// One parsed field line of the export format.
enum Step {
    /// A field: name span, value span, position after it.
    Field(Span, Span, usize),
    /// The empty line ending an entry: position after it.
    End(usize),
    /// More bytes needed.
    Need,
    /// Not export format.
    Invalid(&'static str),
}

/// Parses the field line at `pos` of `buf` (journal export format: `NAME=value\n`,
/// or `NAME\n` + little-endian u64 length + bytes + `\n`; an empty line
/// ends the entry).
fn step(buf: &[u8], pos: usize) -> Step {
    let rest = &buf[pos..];
    let Some(i) = memchr::memchr2(b'=', b'\n', rest) else {
        return Step::Need;
    };
    if rest[i] == b'\n' {
        if i == 0 {
            return Step::End(pos + 1);
        }
        let name = Span::new(pos, i);
        let hdr = pos + i + 1;
        let Some(len) = buf.get(hdr..hdr + 8) else {
            return Step::Need;
        };
        let mut l = [0u8; 8];
        l.copy_from_slice(len);
        let len = u64::from_le_bytes(l);
        let start = hdr + 8;
        let Some(end) = usize::try_from(len).ok().and_then(|l| start.checked_add(l)) else {
            return Step::Invalid("binary field length out of range");
        };
        match buf.get(end) {
            None => Step::Need,
            Some(b'\n') => Step::Field(name, Span::new(start, end - start), end + 1),
            Some(_) => Step::Invalid("binary field not followed by a newline"),
        }
    } else {
        if i == 0 {
            return Step::Invalid("field without a name");
        }
        let vstart = pos + i + 1;
        match memchr::memchr(b'\n', &buf[vstart..]) {
            None => Step::Need,
            Some(j) => Step::Field(Span::new(pos, i), Span::new(vstart, j), vstart + j + 1),
        }
    }
}

/// One `read(2)` of at most `max` bytes from `out` appended to `buf`
/// (whose spare capacity must hold them), without initialising the spare
/// capacity first; the bytes read.
fn read_spare(out: &mut ChildStdout, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
    let max = max.min(buf.capacity() - buf.len());
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is `max` or more writable bytes owned by `buf`;
    // read(2) writes at most `max` of them, and only the `n` it reports
    // written become part of `buf`.
    let n = unsafe { libc::read(out.as_raw_fd(), spare.as_mut_ptr().cast(), max) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the first `n` spare bytes were written by read(2) above.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// The sequence number id and number of a cursor (`s=...;i=<hex>;...`).
fn cursor_seq(c: &[u8]) -> Option<(&[u8], u64)> {
    let mut s = None;
    let mut i = None;
    for part in c.split(|&b| b == b';') {
        if let Some(v) = part.strip_prefix(b"s=") {
            s = Some(v);
        } else if let Some(v) = part.strip_prefix(b"i=") {
            i = std::str::from_utf8(v)
                .ok()
                .and_then(|v| u64::from_str_radix(v, 16).ok());
        }
    }
    Some((s?, i?))
}

/// What a started journalctl's first entry is compared with.
struct FirstCheck {
    cursor: String,
}

struct Reader {
    cfg: JournaldConfig,
    shared: Arc<Shared>,
    emitter: Arc<dyn Emitter>,
    budget: Arc<PipelineBudget>,
    info: Arc<SourceInfo>,
    state: StateStore,
    key: String,
    /// Field names seen, as event keys.
    names: HashMap<Box<[u8]>, Key>,
    /// The name and key of the field at each position of the last entry
    /// seen there: a journal's entries mostly list the same fields in the
    /// same order, so most names are found by one comparison, not hashed.
    by_position: Vec<(Box<[u8]>, Key)>,
    unit_filter: Option<Vec<Vec<u8>>>,
    gaps: LazyCounter,
    unsupported: LazyCounter,
    too_large: LazyCounter,
    invalid: LazyCounter,
    failures: LazyCounter,
    excluded: LazyCounter,
    metrics: ComponentMetrics,
    /// Bytes of an unfinished entry.
    carry: Vec<u8>,
    /// Skipping an over-large entry.
    skip: Option<Skip>,
    /// Set after starting at a checkpoint, until the first entry is seen.
    first_check: Option<FirstCheck>,
    /// Sequence number id and number of the last entry read, to see the
    /// entries journalctl skips (a damaged journal file: it leaves them
    /// out without a word).
    last_seq: Option<(Vec<u8>, u64)>,
    /// Entries skipped that way.
    skipped: LazyCounter,
    /// Skipped entries not yet logged, and when the last log line was.
    skipped_unlogged: u64,
    skipped_logged: Option<Instant>,
}

/// Why reading from one journalctl stopped.
enum Ended {
    Stop,
    Rewind,
    Exited,
    Invalid,
}

impl Reader {
    fn run(&mut self) {
        let mut backoff = MIN_RESTART;
        let mut last_save = Instant::now();
        while !self.shared.stop_reading.load(Ordering::SeqCst) {
            // After a failed delivery everything after the checkpoint is
            // read again; answers of batches in flight no longer matter.
            self.shared.commits.take_rewind();
            let cursor = self.shared.commits.committed();
            let started = Instant::now();
            let ended = match self.spawn(cursor.as_deref()) {
                Ok((child, stdout)) => {
                    self.first_check = cursor.map(|cursor| FirstCheck { cursor });
                    // The first entry is checked against the checkpoint.
                    self.last_seq = None;
                    self.carry.clear();
                    self.skip = None;
                    self.read_child(child, stdout, &mut last_save)
                }
                Err(e) => {
                    self.failures.inc();
                    let msg = format!(
                        "cannot run `{}`: {e}; install journalctl (Debian package `systemd`) or set `journalctl_path`",
                        self.cfg.journalctl
                    );
                    tracing::error!(source = %self.key, "{msg}");
                    self.metrics.failing(msg);
                    Ended::Exited
                }
            };
            match ended {
                Ended::Stop => break,
                Ended::Rewind => {
                    tracing::warn!(source = %self.key, "a delivery failed; reading the journal again from the last checkpoint");
                }
                Ended::Exited | Ended::Invalid => {
                    if started.elapsed() > MAX_RESTART {
                        backoff = MIN_RESTART;
                    }
                    backoff = (backoff * 2).min(MAX_RESTART);
                }
            }
            if matches!(ended, Ended::Rewind) {
                backoff = (backoff * 2).min(MAX_RESTART);
            }
            let until = Instant::now() + backoff;
            while Instant::now() < until && !self.shared.stop_reading.load(Ordering::SeqCst) {
                self.save_now(&mut last_save);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Stopping: keep saving the checkpoint as answers arrive, until
        // `wait_stopped` is done.
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.save_now(&mut last_save);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn save_now(&self, last: &mut Instant) {
        if last.elapsed() < SAVE_EVERY {
            return;
        }
        *last = Instant::now();
        if let Err(e) = self.shared.save(&self.state) {
            tracing::error!(source = %self.key, state = %self.state.path().display(), error = %e, "cannot save the journal checkpoint");
        }
    }

    fn spawn(&self, cursor: Option<&str>) -> std::io::Result<(Child, ChildStdout)> {
        let args = self.cfg.journalctl_args(cursor);
        tracing::debug!(source = %self.key, ?args, "starting journalctl");
        let mut cmd = Command::new(&self.cfg.journalctl);
        cmd.args(&args)
            .env("LC_ALL", "C")
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl and setpgid are async-signal-safe; journalctl ends
        // with the agent even on `kill -9`.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // Its own process group: a Ctrl-C meant for the agent
                // must not end journalctl before the agent has stopped.
                libc::setpgid(0, 0);
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(
                "journalctl's output pipes are missing",
            ));
        };
        // SAFETY: fcntl on the pipe we own; F_SETPIPE_SZ only changes its
        // kernel buffer, and a refusal (over /proc/sys/fs/pipe-max-size)
        // leaves the default, which works too.
        unsafe {
            libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES);
        }
        let watcher = StderrWatcher {
            key: self.key.clone(),
            journalctl: self.cfg.journalctl.clone(),
            unsupported: self.unsupported.clone(),
            metrics: self.metrics.clone(),
        };
        let _ = std::thread::Builder::new()
            .name("petrel-journalctl-err".into())
            .spawn(move || watcher.run(stderr));
        Ok((child, stdout))
    }

    fn read_child(
        &mut self,
        mut child: Child,
        mut out: ChildStdout,
        last_save: &mut Instant,
    ) -> Ended {
        let ended = loop {
            self.save_now(last_save);
            if self.shared.stop_reading.load(Ordering::SeqCst) {
                break Ended::Stop;
            }
            if self.shared.commits.rewind_pending() {
                break Ended::Rewind;
            }
            if !readable(out.as_raw_fd(), Duration::from_millis(100)) {
                continue;
            }
            let want = self.budget.reservation(READ_BYTES + self.carry.len());
            let Some(mut charge) = self
                .budget
                .charge_blocking(want, Instant::now() + Duration::from_millis(100))
            else {
                continue;
            };
            let mut buf = std::mem::take(&mut self.carry);
            buf.reserve(READ_BYTES + LEVELS.len());
            // One read: what the pipe holds now (waiting for a full block
            // would hold back the last entries until more come), into the
            // spare capacity as it is: zeroing 256 KiB before each read
            // cost more than parsing what it brought.
            let got = read_spare(&mut out, &mut buf, READ_BYTES);
            let n = match got {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    self.carry = buf;
                    continue;
                }
                Err(e) => {
                    tracing::error!(source = %self.key, error = %e, "cannot read journalctl's output");
                    break Ended::Exited;
                }
            };
            if n == 0 {
                break Ended::Exited;
            }
            if let Some(s) = self.skip {
                let (used, left) = self.skip_entry(s, &buf);
                self.skip = left;
                buf.drain(..used);
                if left.is_some() {
                    continue;
                }
            }
            match self.emit_entries(buf, &mut charge) {
                Ok(()) => {}
                Err(why) => {
                    self.invalid.inc();
                    tracing::error!(source = %self.key, why, "journalctl's output is not the journal export format; restarting it at the checkpoint");
                    self.shared.commits.request_rewind();
                    break Ended::Invalid;
                }
            }
        };
        let _ = child.kill();
        let status = child.wait();
        if matches!(ended, Ended::Exited) && !self.shared.stop_reading.load(Ordering::SeqCst) {
            self.failures.inc();
            let msg = format!(
                "journalctl ended ({}); starting it again at the checkpoint",
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string())
            );
            tracing::error!(source = %self.key, "{msg}");
            self.metrics.failing(msg);
        }
        ended
    }

    /// Skips the rest of an over-large entry in `buf`: bytes consumed, and
    /// where the skipping is if the entry goes on.
    fn skip_entry(&self, mut s: Skip, buf: &[u8]) -> (usize, Option<Skip>) {
        let mut i = 0;
        while i < buf.len() {
            match s {
                Skip::Line(n) => match memchr::memchr2(b'=', b'\n', &buf[i..]) {
                    None => {
                        s = Skip::Line(n + buf.len() - i);
                        i = buf.len();
                    }
                    Some(j) => {
                        let at = i + j;
                        i = at + 1;
                        if buf[at] == b'=' {
                            s = Skip::Text;
                        } else if n + j == 0 {
                            return (i, None);
                        } else {
                            s = Skip::BinLen([0; 8], 0);
                        }
                    }
                },
                Skip::Text => match memchr::memchr(b'\n', &buf[i..]) {
                    None => i = buf.len(),
                    Some(j) => {
                        i += j + 1;
                        s = Skip::Line(0);
                    }
                },
                Skip::BinLen(mut l, mut got) => {
                    while got < 8 && i < buf.len() {
                        l[got] = buf[i];
                        got += 1;
                        i += 1;
                    }
                    s = if got == 8 {
                        Skip::BinData(u64::from_le_bytes(l).saturating_add(1))
                    } else {
                        Skip::BinLen(l, got)
                    };
                }
                Skip::BinData(left) => {
                    let take = left.min((buf.len() - i) as u64);
                    i += take as usize;
                    s = if left == take {
                        Skip::Line(0)
                    } else {
                        Skip::BinData(left - take)
                    };
                }
            }
        }
        (i, Some(s))
    }

    fn key_of(&mut self, name: &[u8]) -> Key {
        if let Some(k) = self.names.get(name) {
            return k.clone();
        }
        let text = String::from_utf8_lossy(name).into_owned();
        let key: Key = {
            let mut g = interned().lock();
            if let Some(s) = g.get(name) {
                Key::Borrowed(s)
            } else if g.len() < MAX_INTERNED {
                let s: &'static str = Box::leak(text.clone().into_boxed_str());
                g.insert(name.into(), s);
                Key::Borrowed(s)
            } else {
                Key::Owned(text)
            }
        };
        if self.names.len() < MAX_INTERNED {
            self.names.insert(name.into(), key.clone());
        }
        key
    }

    /// The key of field `name` at position `i` of an entry.
    fn key_at(&mut self, i: usize, name: &[u8]) -> Key {
        if let Some((n, k)) = self.by_position.get(i) {
            if **n == *name {
                return k.clone();
            }
        }
        let key = self.key_of(name);
        if i < self.by_position.len() {
            self.by_position[i] = (name.into(), key.clone());
        } else if i == self.by_position.len() && i < MAX_POSITIONS {
            self.by_position.push((name.into(), key.clone()));
        }
        key
    }

    /// Parses the complete entries of `buf` into one batch and emits it;
    /// keeps the unfinished rest for the next read.
    fn emit_entries(
        &mut self,
        mut buf: Vec<u8>,
        charge: &mut MemoryCharge,
    ) -> Result<(), &'static str> {
        let mut events = Vec::new();
        let mut last_cursor: Option<Span> = None;
        let mut pos = 0;
        let mut consumed = 0;
        let mut fields: Vec<(Span, Span)> = Vec::with_capacity(32);
        'entries: loop {
            fields.clear();
            let mut p = pos;
            loop {
                match step(&buf, p) {
                    Step::Field(n, v, next) => {
                        fields.push((n, v));
                        p = next;
                    }
                    Step::End(next) => {
                        p = next;
                        break;
                    }
                    Step::Need => break 'entries,
                    Step::Invalid(why) => return Err(why),
                }
            }
            consumed = p;
            pos = p;
            if fields.is_empty() {
                continue;
            }
            let mut ev = Event {
                message: Value::Span(Span::new(0, 0)),
                fields: Vec::with_capacity(fields.len() + 1),
                time_ns: None,
                hidden: petrel_core::Hidden::NONE,
            };
            let mut cursor = None;
            let mut level = None;
            for (i, &(n, v)) in fields.iter().enumerate() {
                let name = n.get(&buf);
                match name {
                    b"MESSAGE" => {
                        ev.message = Value::Span(v);
                        continue;
                    }
                    b"__CURSOR" => cursor = Some(v),
                    b"__REALTIME_TIMESTAMP" => {
                        ev.time_ns = std::str::from_utf8(v.get(&buf))
                            .ok()
                            .and_then(|s| s.parse::<i64>().ok())
                            .and_then(|us| us.checked_mul(1000));
                    }
                    b"PRIORITY" => {
                        if let [d @ b'0'..=b'7'] = v.get(&buf) {
                            level = Some((d - b'0') as usize);
                        }
                    }
                    _ => {}
                }
                let key = self.key_at(i, name);
                // A field may repeat in an entry: its values become a list.
                if let Some(slot) = ev.fields.iter_mut().find(|(k, _)| *k == key) {
                    match &mut slot.1 {
                        Value::Array(a) => a.push(Value::Span(v)),
                        other => {
                            let first = std::mem::replace(other, Value::Null);
                            *other = Value::Array(vec![first, Value::Span(v)]);
                        }
                    }
                } else {
                    ev.fields.push((key, Value::Span(v)));
                }
            }
            if let Some(l) = level {
                // Becomes a span of the level table once the batch's
                // buffer is complete (below).
                ev.fields
                    .push((Key::Borrowed("level"), Value::Int(l as i64)));
            }
            if let Some(c) = cursor {
                last_cursor = Some(c);
                self.note_sequence(c.get(&buf));
                if let Some(check) = self.first_check.take() {
                    let got = c.get(&buf);
                    if got == check.cursor.as_bytes() {
                        // The checkpoint's own entry: delivered already.
                        continue 'entries;
                    }
                    self.report_gap(check.cursor.as_bytes(), got);
                }
            }
            if !self.accept(&buf, &ev) {
                self.excluded.inc();
                continue;
            }
            events.push(ev);
        }
        let rest = buf.split_off(consumed);
        if rest.len() > self.cfg.max_entry_bytes {
            // An entry larger than allowed: drop what came of it and the
            // rest of it as it arrives.
            self.too_large.inc();
            tracing::warn!(source = %self.key, max_entry_bytes = self.cfg.max_entry_bytes, "journal entry too large; dropped");
            let (_, left) = self.skip_entry(Skip::Line(0), &rest);
            self.skip = left;
        } else {
            self.carry = rest;
        }
        if consumed == 0 && events.is_empty() {
            return Ok(());
        }
        // Level names as spans of the table after the entries.
        let table = buf.len();
        buf.extend_from_slice(LEVELS);
        for ev in &mut events {
            if let Some(slot) = ev.fields.iter_mut().rev().find(|(k, _)| k == "level") {
                if let Value::Int(l) = slot.1 {
                    let (s, n) = LEVEL_SPANS[(l as usize).min(7)];
                    slot.1 = Value::Span(Span::new(table + s, n));
                }
            }
        }
        let cursor = last_cursor.map(|c| String::from_utf8_lossy(c.get(&buf)).into_owned());
        let seq = self.shared.commits.register(cursor);
        let n = events.len() as u64;
        charge.shrink_to(self.budget.reservation(buf.len()));
        let mut batch = EventBatch::new(Bytes::from(buf), self.info.clone());
        batch.events = events;
        batch.input_bytes = consumed as u64;
        batch.charge = std::mem::replace(charge, MemoryCharge::none());
        batch.ack = Some(BatchAck::start(self.shared.commits.clone(), seq));
        self.metrics.sent_events.inc_by(n);
        self.metrics.sent_bytes.inc_by(consumed as u64);
        self.metrics.recovered();
        self.emitter.emit(batch);
        Ok(())
    }

    /// Counts the entries journalctl left out before the one of `cursor`:
    /// with every entry read (no `units` or `include_matches`, which make
    /// gaps on purpose), entries of one sequence number id follow each
    /// other by one, and a jump is entries journalctl skipped, which it
    /// does without a word for entries of a damaged journal file.
    fn note_sequence(&mut self, cursor: &[u8]) {
        let Some((id, i)) = cursor_seq(cursor) else {
            return;
        };
        let filtered = !self.cfg.units.is_empty() || !self.cfg.include.is_empty();
        if let Some((last_id, last)) = &self.last_seq {
            if !filtered && last_id.as_slice() == id && i > last + 1 {
                let n = i - last - 1;
                self.skipped.inc_by(n);
                self.skipped_unlogged += n;
            }
        }
        if self.skipped_unlogged > 0
            && self
                .skipped_logged
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                source = %self.key,
                skipped_entries = self.skipped_unlogged,
                "journalctl left out entries between two it read (their sequence numbers are missing): a damaged journal file (journalctl --verify names it); counted as error_type=\"journal_skipped\""
            );
            self.skipped_unlogged = 0;
            self.skipped_logged = Some(Instant::now());
        }
        match &mut self.last_seq {
            Some((last_id, last)) if last_id.as_slice() == id => *last = i,
            _ => self.last_seq = Some((id.to_vec(), i)),
        }
    }

    /// The first entry after starting at checkpoint `saved` is `got`: the
    /// checkpoint's entry is gone. A gap unless `got` directly follows it.
    fn report_gap(&self, saved: &[u8], got: &[u8]) {
        let (a, b) = (cursor_seq(saved), cursor_seq(got));
        let lost = match (a, b) {
            (Some((sa, ia)), Some((sb, ib))) if sa == sb => {
                if ib <= ia + 1 {
                    return;
                }
                Some(ib - ia - 1)
            }
            _ => None,
        };
        self.gaps.inc();
        match lost {
            Some(n) => tracing::warn!(
                source = %self.key,
                lost_entries = n,
                "the journal entry of the checkpoint was rotated or vacuumed away before the entries after it were read; {n} entries are gone (fewer when `units` or matches filter); resuming at the oldest entry left"
            ),
            None => tracing::warn!(
                source = %self.key,
                checkpoint = %String::from_utf8_lossy(saved),
                resumed_at = %String::from_utf8_lossy(got),
                "the journal entry of the checkpoint was rotated or vacuumed away; entries between it and the oldest entry left may be lost; resuming at the oldest entry left"
            ),
        }
    }

    /// False when `exclude_matches` (or the `_SYSTEMD_UNIT` include next
    /// to `units`) rejects the entry.
    fn accept(&self, buf: &[u8], ev: &Event) -> bool {
        let has = |name: &str, values: &[Vec<u8>]| -> bool {
            match ev.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v) {
                Some(Value::Array(a)) => a.iter().any(|v| {
                    v.as_bytes(buf)
                        .is_some_and(|b| values.iter().any(|x| x == b))
                }),
                Some(v) => v
                    .as_bytes(buf)
                    .is_some_and(|b| values.iter().any(|x| x == b)),
                None => false,
            }
        };
        if let Some(units) = &self.unit_filter {
            if !has("_SYSTEMD_UNIT", units) {
                return false;
            }
        }
        for (field, values) in &self.cfg.exclude {
            let hit = if field == "MESSAGE" {
                ev.message
                    .as_bytes(buf)
                    .is_some_and(|b| values.iter().any(|x| x == b))
            } else {
                has(field, values)
            };
            if hit {
                return false;
            }
        }
        true
    }
}

/// Reads journalctl's standard error: logs it, and recognises a journal
/// that this journalctl is too old for.
struct StderrWatcher {
    key: String,
    journalctl: String,
    unsupported: LazyCounter,
    metrics: ComponentMetrics,
}

/// Messages of a journalctl that meets a journal (or flags) newer than
/// itself.
const TOO_OLD: &[&str] = &[
    "unsupported feature",
    "unknown incompatible flag",
    "has unknown incompatible",
    "unrecognized option",
    "Protocol not supported",
];

impl StderrWatcher {
    fn run(self, stderr: std::process::ChildStderr) {
        let mut r = std::io::BufReader::new(stderr);
        let mut line = Vec::new();
        let mut logged = 0u32;
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if text.is_empty() {
                continue;
            }
            if TOO_OLD.iter().any(|p| text.contains(p)) {
                self.unsupported.inc();
                let msg = format!(
                    "`{}` cannot read this journal: {text}. The journal was most likely written by a newer systemd than this journalctl ({}). Use a journalctl at least as new as the host's systemd: set `journalctl_path` to one (the host's journalctl mounted into the container with its libraries, or an image built on a newer distribution), or make the host write a journal older tools read (journald.conf `Compress=no`, `Seal=no`)",
                    self.journalctl,
                    journalctl_version(&self.journalctl)
                );
                tracing::error!(source = %self.key, "{msg}");
                self.metrics.failing(msg);
            } else if logged < 100 {
                // Bounded: a journalctl complaining in a loop must not
                // flood the agent's log.
                logged += 1;
                tracing::warn!(source = %self.key, "journalctl: {text}");
            }
        }
    }
}

/// `systemd 252 (252.39-1~deb12u2)`, or why it is unknown.
fn journalctl_version(journalctl: &str) -> String {
    Command::new(journalctl)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "version unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(fields: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in fields {
            if v.contains(&b'\n') || std::str::from_utf8(v).is_err() {
                out.extend_from_slice(k.as_bytes());
                out.push(b'\n');
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                out.extend_from_slice(v);
                out.push(b'\n');
            } else {
                out.extend_from_slice(format!("{k}=").as_bytes());
                out.extend_from_slice(v);
                out.push(b'\n');
            }
        }
        out.push(b'\n');
        out
    }

    #[test]
    fn steps_through_text_and_binary_fields() {
        let buf = export(&[("A", b"x"), ("B", b"a\nb\xff")]);
        let Step::Field(n, v, next) = step(&buf, 0) else {
            panic!("text field")
        };
        assert_eq!((n.get(&buf), v.get(&buf)), (&b"A"[..], &b"x"[..]));
        let Step::Field(n, v, next) = step(&buf, next) else {
            panic!("binary field")
        };
        assert_eq!((n.get(&buf), v.get(&buf)), (&b"B"[..], &b"a\nb\xff"[..]));
        assert!(matches!(step(&buf, next), Step::End(e) if e == buf.len()));
        for cut in 0..buf.len() - 1 {
            let mut p = 0;
            let part = &buf[..cut];
            loop {
                match step(part, p) {
                    Step::Field(_, _, n) => p = n,
                    Step::Need => break,
                    Step::End(_) => panic!("ended early at cut {cut}"),
                    Step::Invalid(w) => panic!("{w} at cut {cut}"),
                }
            }
        }
    }

    #[test]
    fn skipping_an_entry_stops_at_its_end_in_any_cut() {
        let big = export(&[("A", b"x"), ("B", &[b'\n'; 300][..]), ("C", b"y")]);
        let next = export(&[("D", b"z")]);
        let mut all = big.clone();
        all.extend_from_slice(&next);
        let r = Reader::dummy();
        for cut in 0..all.len() {
            let (u1, s) = r.skip_entry(Skip::Line(0), &all[..cut]);
            let used = match s {
                None => u1,
                Some(s) => {
                    let (u2, s2) = r.skip_entry(s, &all[cut..]);
                    assert!(s2.is_none(), "cut {cut}");
                    cut + u2
                }
            };
            assert_eq!(used, big.len(), "cut {cut}");
        }
    }

    #[test]
    fn cursor_sequence_numbers() {
        let c = b"s=36c2;i=1f;b=01;m=3e8;t=60a;x=d6";
        assert_eq!(cursor_seq(c), Some((&b"36c2"[..], 0x1f)));
        assert_eq!(cursor_seq(b"garbage"), None);
    }

    #[test]
    fn units_get_a_suffix_and_become_matches() {
        assert_eq!(unit_name("kubelet"), "kubelet.service");
        assert_eq!(unit_name("docker.socket"), "docker.socket");
        let c = JournaldConfig {
            directory: Some("/j".into()),
            units: vec!["a.service".into()],
            include: vec![("_TRANSPORT".into(), vec!["kernel".into(), "stdout".into()])],
            exclude: vec![],
            since_now: true,
            max_age: None,
            journalctl: "journalctl".into(),
            max_entry_bytes: 1 << 20,
        };
        let a = c.journalctl_args(None);
        assert!(a.contains(&"--lines=0".to_string()), "{a:?}");
        assert!(a.contains(&"--directory=/j".to_string()));
        assert!(a.contains(&"_SYSTEMD_UNIT=a.service".to_string()));
        assert!(a.contains(&"_TRANSPORT=stdout".to_string()));
        let a = c.journalctl_args(Some("s=1;i=2"));
        assert!(a.contains(&"--cursor=s=1;i=2".to_string()), "{a:?}");
        assert!(!a.contains(&"--lines=0".to_string()));
    }

    impl Reader {
        fn dummy() -> Reader {
            struct Null;
            impl Emitter for Null {
                fn emit(&self, _: EventBatch) {}
            }
            let metrics = petrel_core::Metrics::new().component("p", "source", "j", "journald");
            let metrics_skipped = metrics.error_counter("journal_skipped");
            Reader {
                cfg: JournaldConfig {
                    directory: None,
                    units: vec![],
                    include: vec![],
                    exclude: vec![],
                    since_now: false,
                    max_age: None,
                    journalctl: "journalctl".into(),
                    max_entry_bytes: 4096,
                },
                shared: Arc::new(Shared::new(None, |c: &String| c.as_bytes().to_vec())),
                emitter: Arc::new(Null),
                budget: PipelineBudget::new(petrel_core::MemoryBudget::new(1 << 24), 1 << 24),
                info: Arc::default(),
                state: StateStore::new(std::path::Path::new("/nonexistent"), "p/j"),
                key: "p/j".into(),
                names: HashMap::new(),
                by_position: Vec::new(),
                unit_filter: None,
                gaps: metrics.error_counter("journal_gap"),
                unsupported: metrics.error_counter("journal_unsupported"),
                too_large: metrics.error_counter("entry_too_large"),
                invalid: metrics.error_counter("invalid_export"),
                failures: metrics.error_counter("journalctl_failed"),
                excluded: metrics.discarded_counter("excluded"),
                metrics,
                carry: Vec::new(),
                skip: None,
                first_check: None,
                last_seq: None,
                skipped: metrics_skipped,
                skipped_unlogged: 0,
                skipped_logged: None,
            }
        }
    }

    #[test]
    fn entries_journalctl_leaves_out_are_counted() {
        let mut r = Reader::dummy();
        for c in [
            "s=aa;i=1",
            "s=aa;i=2",
            "s=aa;i=7",
            "s=bb;i=40",
            "s=bb;i=41",
            "s=aa;i=9",
        ] {
            r.note_sequence(c.as_bytes());
        }
        // 3..6 of `aa` missing; another id (another machine's journal) is
        // no gap, and neither is its switch back.
        assert_eq!(r.skipped.get(), 4);
        // With units or matches gaps are what was asked for.
        let mut r = Reader::dummy();
        r.cfg.units = vec!["a.service".into()];
        r.note_sequence(b"s=aa;i=1");
        r.note_sequence(b"s=aa;i=9");
        assert_eq!(r.skipped.get(), 0);
    }
}
