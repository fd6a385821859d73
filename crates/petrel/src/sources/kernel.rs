//! `type: kernel` — the kernel log, from `/dev/kmsg`.
//!
//! ```yaml
//! sources:
//!   - type: kernel
//!     since_now: false    # without a checkpoint: the whole ring buffer
//! ```
//!
//! Each `read` of `/dev/kmsg` returns one record,
//! `prio,seq,ts_usec,flags[,...];message\n` followed by continuation lines
//! ` KEY=value\n` (`SUBSYSTEM=`, `DEVICE=`). The event's message is the
//! message as the kernel escaped it (non-printable bytes as `\xNN`);
//! `level` and `facility` are names, `PRIORITY` and `SYSLOG_FACILITY` the
//! numbers as journald writes them, `seq` the kernel's sequence number,
//! `_BOOT_ID` the boot, continuation lines fields under their keys, and
//! the event time is the boot's wall clock time plus `ts_usec`.
//!
//! The checkpoint is the boot id and the sequence number of the last
//! record every sink acknowledged. A restart in the same boot skips what
//! was delivered; a new boot starts over (sequence numbers restart). When
//! the ring buffer overwrote records before they were read (`EPIPE` from
//! `read`, or a first record past the checkpoint after a restart), the
//! records lost are counted as `kmsg_overwritten`.

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use petrel_core::config::Map;
use petrel_core::metrics::ComponentMetrics;
use petrel_core::plugin::{Emitter, KeyDoc, KeyKind, Source, SourceContext, SourcePlugin};
use petrel_core::state::StateStore;
use petrel_core::{
    BatchAck, Event, EventBatch, Key, LazyCounter, PipelineBudget, SourceInfo, Span, Value,
};
use petrel_syslog::writer::FACILITIES;

use super::ordered::{readable, OrderedShared, RunningOrdered};

/// Keys accepted by the kernel source.
pub const KEYS: &[&str] = &["type", "id", "path", "since_now"];

/// What this plugin does, for the component reference.
pub const DOC: &str = r#"Reads the kernel log from `/dev/kmsg`, one event per record: the message, `level` and `facility` (names), `PRIORITY` and `SYSLOG_FACILITY` (numbers), the kernel's sequence number `seq`, `_BOOT_ID`, continuation lines (`SUBSYSTEM`, `DEVICE`) as fields, and the event time. The boot id and sequence number are checkpointed once every sink acknowledged; records the ring buffer overwrote before they were read are counted as `kmsg_overwritten`. Needs read access to `/dev/kmsg` (root, or `CAP_SYSLOG` with `kernel.dmesg_restrict`)."#;

/// The documentation of each of [`KEYS`], for the component reference.
pub const KEY_DOCS: &[KeyDoc] = &[
    KeyDoc::TYPE,
    KeyDoc::ID,
    KeyDoc {
        name: "path",
        kind: KeyKind::String,
        default: Some("/dev/kmsg"),
        doc: r#"The kernel log device."#,
    },
    KeyDoc {
        name: "since_now",
        kind: KeyKind::Bool,
        default: Some("false"),
        doc: r#"Without a checkpoint of this boot, start with new records instead of the oldest record of the ring buffer."#,
    },
];

/// Registration of `type: kernel`.
pub const PLUGIN: SourcePlugin = SourcePlugin {
    type_name: "kernel",
    doc: DOC,
    keys: KEYS,
    key_docs: KEY_DOCS,
    parse: |m| KernelConfig::parse(m).map(|c| Arc::new(c) as _),
};

/// Room for one record: the kernel refuses a smaller read (`EINVAL`);
/// records are at most 8 KiB (`CONSOLE_EXT_LOG_MAX`).
const RECORD_MAX: usize = 16 << 10;
/// Bytes of records per batch.
const BATCH_BYTES: usize = 256 << 10;
const LEVELS: &[u8] = b"emergalertcriterrwarningnoticeinfodebug01234567";
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
/// Offset of the digits `0`..`7` in [`LEVELS`].
const DIGITS: usize = 39;
const SAVE_EVERY: Duration = Duration::from_millis(200);

/// Configuration of the kernel source.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// The device (`/dev/kmsg`).
    pub path: String,
    /// Start with new records without a checkpoint of this boot.
    pub since_now: bool,
}

impl KernelConfig {
    /// Reads the source's keys.
    pub fn parse(map: Map<'_>) -> Option<Self> {
        let path = map.str("path").unwrap_or("/dev/kmsg").to_string();
        if path.is_empty() {
            if let Some(n) = map.get("path") {
                n.error("`path` is empty; remove it to read /dev/kmsg");
            }
            return None;
        }
        Some(Self {
            path,
            since_now: map.bool("since_now").unwrap_or(false),
        })
    }
}

/// The checkpoint: a sequence number within a boot.
#[derive(Debug, Clone, PartialEq)]
struct Position {
    boot: String,
    seq: u64,
}

impl Position {
    fn encode(&self) -> String {
        format!("{} {}", self.boot, self.seq)
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let s = std::str::from_utf8(b).ok()?;
        let (boot, seq) = s.trim().split_once(' ')?;
        Some(Self {
            boot: boot.to_string(),
            seq: seq.parse().ok()?,
        })
    }
}

/// One parsed record, as spans of the buffer it was read into.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Syslog priority (facility × 8 + level).
    pub prio: u32,
    /// The kernel's sequence number.
    pub seq: u64,
    /// Microseconds since boot.
    pub ts_usec: u64,
    /// The message (without its newline).
    pub message: Span,
    /// Continuation lines: key and value.
    pub fields: Vec<(Span, Span)>,
}

/// Parses the record at `start..start + len` of `buf`.
pub fn parse_record(buf: &[u8], start: usize, len: usize) -> Option<Record> {
    let rec = buf.get(start..start + len)?;
    let semi = memchr::memchr(b';', rec)?;
    let mut head = rec[..semi].split(|&b| b == b',');
    let num = |f: Option<&[u8]>| -> Option<u64> { std::str::from_utf8(f?).ok()?.parse().ok() };
    let prio = num(head.next())? as u32;
    let seq = num(head.next())?;
    let ts_usec = num(head.next())?;
    let body = &rec[semi + 1..];
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    let mut lines = body.split(|&b| b == b'\n');
    let msg = lines.next().unwrap_or_default();
    let base = start + semi + 1;
    let message = Span::new(base, msg.len());
    let mut fields = Vec::new();
    let mut off = base + msg.len() + 1;
    for line in lines {
        if let Some(kv) = line.strip_prefix(b" ") {
            if let Some(eq) = memchr::memchr(b'=', kv) {
                fields.push((
                    Span::new(off + 1, eq),
                    Span::new(off + 1 + eq + 1, kv.len() - eq - 1),
                ));
            }
        }
        off += line.len() + 1;
    }
    Some(Record {
        prio,
        seq,
        ts_usec,
        message,
        fields,
    })
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`, without dashes like
/// journald's `_BOOT_ID`).
fn boot_id() -> std::io::Result<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(s.trim().replace('-', ""))
}

/// Wall clock time of the boot in nanoseconds: now minus the monotonic
/// clock (which `ts_usec` counts).
fn boot_wall_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    now - mono
}

impl petrel_core::plugin::SourceConfig for KernelConfig {
    fn local_paths(&self) -> Vec<String> {
        vec![self.path.clone()]
    }

    fn type_name(&self) -> &'static str {
        "kernel"
    }

    fn start(&self, ctx: SourceContext) -> anyhow::Result<Box<dyn Source>> {
        let boot = boot_id().map_err(|e| {
            anyhow::anyhow!(
                "source {}: cannot read /proc/sys/kernel/random/boot_id: {e}",
                ctx.key
            )
        })?;
        let saved = match ctx.state.load() {
            Ok(b) => b.and_then(|b| Position::decode(&b)),
            Err(e) => anyhow::bail!(
                "source {}: cannot read its checkpoint {}: {e}",
                ctx.key,
                ctx.state.path().display()
            ),
        };
        // Another boot's sequence numbers mean nothing in this one.
        let saved = saved.filter(|p| p.boot == boot);
        let fd = open_kmsg(&self.path).map_err(|e| {
            anyhow::anyhow!(
                "source {}: cannot open {}: {e}; the agent needs root or CAP_SYSLOG (kernel.dmesg_restrict), and in a container the host's /dev/kmsg",
                ctx.key,
                self.path
            )
        })?;
        if saved.is_none() && self.since_now {
            // SAFETY: lseek on the descriptor just opened.
            unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
        }
        let mut meta: Vec<(Key, Arc<str>)> = ctx.meta.iter().cloned().collect();
        meta.push((Key::Borrowed("_BOOT_ID"), boot.clone().into()));
        let shared = Arc::new(Shared::new(saved.clone(), |p: &Position| {
            p.encode().into_bytes()
        }));
        let m = &ctx.metrics;
        let mut reader = Reader {
            path: self.path.clone(),
            fd,
            boot,
            last_seq: saved.map(|p| p.seq),
            shared: shared.clone(),
            emitter: ctx.emitter.clone(),
            budget: ctx.budget.clone(),
            info: Arc::new(SourceInfo {
                path: "".into(),
                meta: meta.into(),
                source_type: "kernel",
            }),
            state: ctx.state.clone(),
            key: ctx.key.clone(),
            boot_ns: boot_wall_ns(),
            overwritten: m.error_counter("kmsg_overwritten"),
            invalid: m.error_counter("invalid_record"),
            metrics: ctx.metrics.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("petrel-kernel".into())
            .spawn(move || reader.run())?;
        Ok(Box::new(RunningOrdered::new(
            shared,
            handle,
            ctx.key,
            ctx.state,
            "kernel log",
        )))
    }
}

fn open_kmsg(path: &str) -> std::io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path).map_err(|_| std::io::Error::other("NUL in path"))?;
    // SAFETY: a valid C string; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

type Shared = OrderedShared<Position>;

struct Reader {
    path: String,
    fd: OwnedFd,
    boot: String,
    /// Sequence number of the last record read (or of the checkpoint).
    last_seq: Option<u64>,
    shared: Arc<Shared>,
    emitter: Arc<dyn Emitter>,
    budget: Arc<PipelineBudget>,
    info: Arc<SourceInfo>,
    state: StateStore,
    key: String,
    boot_ns: i64,
    overwritten: LazyCounter,
    invalid: LazyCounter,
    metrics: ComponentMetrics,
}

impl Reader {
    fn run(&mut self) {
        let mut last_save = Instant::now();
        while !self.shared.stop_reading.load(Ordering::SeqCst) {
            if last_save.elapsed() >= SAVE_EVERY {
                last_save = Instant::now();
                self.save();
            }
            if self.shared.commits.take_rewind() {
                tracing::warn!(source = %self.key, "a delivery failed; reading the kernel log again from the last checkpoint");
                if let Err(e) = self.reopen() {
                    tracing::error!(source = %self.key, error = %e, "cannot open {} again", self.path);
                    std::thread::sleep(Duration::from_secs(1));
                    self.shared.commits.request_rewind();
                    continue;
                }
            }
            if !readable(self.fd.as_raw_fd(), Duration::from_millis(100)) {
                continue;
            }
            let want = self.budget.reservation(BATCH_BYTES);
            let Some(mut charge) = self
                .budget
                .charge_blocking(want, Instant::now() + Duration::from_millis(100))
            else {
                continue;
            };
            let mut buf: Vec<u8> = Vec::with_capacity(BATCH_BYTES + RECORD_MAX + LEVELS.len());
            let mut records = Vec::new();
            while buf.len() < BATCH_BYTES {
                let at = buf.len();
                buf.resize(at + RECORD_MAX, 0);
                // SAFETY: reading into the RECORD_MAX bytes just added.
                let n = unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        buf[at..].as_mut_ptr().cast(),
                        RECORD_MAX,
                    )
                };
                if n < 0 {
                    buf.truncate(at);
                    let e = std::io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EPIPE) => {
                            // Overwritten before they were read; the next
                            // read gives the oldest record left, and the
                            // jump of its sequence number counts them.
                            tracing::warn!(source = %self.key, "kernel log records were overwritten in the ring buffer before they were read");
                            continue;
                        }
                        Some(libc::EINTR) => continue,
                        _ if e.kind() == ErrorKind::WouldBlock => break,
                        _ => {
                            tracing::error!(source = %self.key, error = %e, "cannot read {}", self.path);
                            std::thread::sleep(Duration::from_millis(500));
                            break;
                        }
                    }
                }
                let n = n as usize;
                buf.truncate(at + n);
                let Some(rec) = parse_record(&buf, at, n) else {
                    self.invalid.inc();
                    buf.truncate(at);
                    continue;
                };
                if let Some(last) = self.last_seq {
                    if rec.seq <= last {
                        // Delivered before a restart or rewind.
                        buf.truncate(at);
                        continue;
                    }
                    if rec.seq > last + 1 {
                        let lost = rec.seq - last - 1;
                        self.overwritten.inc_by(lost);
                        tracing::warn!(source = %self.key, lost, "kernel log records lost to ring buffer overwrite");
                    }
                }
                self.last_seq = Some(rec.seq);
                records.push(rec);
            }
            if records.is_empty() {
                continue;
            }
            self.emit(buf, records, &mut charge);
        }
        self.save();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.save();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn save(&self) {
        if let Err(e) = self.shared.save(&self.state) {
            tracing::error!(source = %self.key, error = %e, "cannot save the kernel log checkpoint");
        }
    }

    /// Opens the device again, to read what follows the checkpoint.
    fn reopen(&mut self) -> std::io::Result<()> {
        self.fd = open_kmsg(&self.path)?;
        self.last_seq = self.shared.commits.committed().map(|p| p.seq);
        Ok(())
    }

    fn emit(&self, mut buf: Vec<u8>, records: Vec<Record>, charge: &mut petrel_core::MemoryCharge) {
        let input = buf.len();
        let table = buf.len();
        buf.extend_from_slice(LEVELS);
        let mut events = Vec::with_capacity(records.len());
        for r in &records {
            let level = (r.prio & 7) as usize;
            let fac = (r.prio >> 3) as usize;
            let mut ev = Event::from_span(r.message);
            let (s, n) = LEVEL_SPANS[level];
            ev.fields
                .push((Key::Borrowed("level"), Value::Span(Span::new(table + s, n))));
            ev.fields.push((
                Key::Borrowed("PRIORITY"),
                Value::Span(Span::new(table + DIGITS + level, 1)),
            ));
            if let Some(name) = FACILITIES.get(fac) {
                ev.fields
                    .push((Key::Borrowed("facility"), Value::Str((*name).into())));
            }
            ev.fields
                .push((Key::Borrowed("SYSLOG_FACILITY"), Value::Int(fac as i64)));
            ev.fields
                .push((Key::Borrowed("seq"), Value::Int(r.seq as i64)));
            for &(k, v) in &r.fields {
                let name = String::from_utf8_lossy(k.get(&buf)).into_owned();
                ev.fields.push((Key::Owned(name), Value::Span(v)));
            }
            ev.time_ns = Some(self.boot_ns + r.ts_usec as i64 * 1000);
            events.push(ev);
        }
        let last = records.last().map(|r| Position {
            boot: self.boot.clone(),
            seq: r.seq,
        });
        let seq = self.shared.commits.register(last);
        charge.shrink_to(self.budget.reservation(buf.len()));
        let n = events.len() as u64;
        let mut batch = EventBatch::new(Bytes::from(buf), self.info.clone());
        batch.events = events;
        batch.input_bytes = input as u64;
        batch.charge = std::mem::replace(charge, petrel_core::MemoryCharge::none());
        batch.ack = Some(BatchAck::start(self.shared.commits.clone(), seq));
        self.metrics.sent_events.inc_by(n);
        self.metrics.sent_bytes.inc_by(input as u64);
        self.emitter.emit(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as `/dev/kmsg` gives them (recorded on Linux 6.x).
    const RECORDS: &[&[u8]] = &[
        b"5,0,0,-;Linux version 6.18.44 (builder@sandboxing) #1 SMP PREEMPT_DYNAMIC\n",
        b"6,341,510435211,-;petrel-probe-123\n",
        b"3,1057,93711204,-,caller=T512;usb 1-1: device descriptor read/64, error -71\n SUBSYSTEM=usb\n DEVICE=c189:0\n",
        b"12,1058,93711300,c;escaped \\x0a newline\n",
    ];

    #[test]
    fn parses_recorded_records() {
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for r in RECORDS {
            let at = buf.len();
            buf.extend_from_slice(r);
            got.push(parse_record(&buf, at, r.len()).expect("record"));
        }
        assert_eq!((got[0].prio, got[0].seq, got[0].ts_usec), (5, 0, 0));
        assert!(got[0].message.get(&buf).starts_with(b"Linux version"));
        assert_eq!(got[1].message.get(&buf), b"petrel-probe-123");
        assert_eq!(
            (got[2].prio & 7, got[2].prio >> 3, got[2].seq),
            (3, 0, 1057)
        );
        assert_eq!(
            got[2].message.get(&buf),
            b"usb 1-1: device descriptor read/64, error -71"
        );
        let kv: Vec<(&[u8], &[u8])> = got[2]
            .fields
            .iter()
            .map(|(k, v)| (k.get(&buf), v.get(&buf)))
            .collect();
        assert_eq!(
            kv,
            vec![
                (&b"SUBSYSTEM"[..], &b"usb"[..]),
                (&b"DEVICE"[..], &b"c189:0"[..])
            ]
        );
        assert_eq!((got[3].prio & 7, got[3].prio >> 3), (4, 1));
        assert_eq!(got[3].message.get(&buf), b"escaped \\x0a newline");
        assert_eq!(parse_record(b"garbage\n", 0, 8), None);
        assert_eq!(parse_record(b"x,1,2,-;m\n", 0, 10), None);
    }

    #[test]
    fn checkpoint_round_trip() {
        let p = Position {
            boot: "abc".into(),
            seq: 42,
        };
        assert_eq!(Position::decode(p.encode().as_bytes()), Some(p));
        assert_eq!(Position::decode(b"nonsense"), None);
    }
}
