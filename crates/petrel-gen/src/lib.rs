//! `petrel gen` — deterministic benchmark log data.
//!
//! Every line of a data set has the same size so that throughput measured in
//! bytes and in lines are interchangeable, and everything is derived from one
//! seeded PRNG so that two runs with the same options produce byte-identical
//! files and benchmark results stay comparable across machines and releases.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The benchmark data sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSet {
    /// `[<ts>] [info] [<pid>] <file>:<n> log:<random>`, 128 bytes per line.
    Single128,
    /// Like `Single128` with varying levels, 512 bytes per line.
    Regex512,
    /// One flat JSON object per line, 512 bytes per line.
    Json512,
    /// `|`-delimited fields, 512 bytes per line.
    Delim512,
    /// Stack-trace events of 23 lines of 512 bytes each.
    Multiline512,
    /// nginx combined access log, 283 bytes per line.
    Nginx283,
}

/// Same order as `DataSet::NAMES`, which `from_name` relies on.
const ALL_DATA_SETS: [DataSet; 6] = [
    DataSet::Single128,
    DataSet::Regex512,
    DataSet::Json512,
    DataSet::Delim512,
    DataSet::Multiline512,
    DataSet::Nginx283,
];

/// Lines per multiline512 event: one header plus 22 stack frames.
const MULTILINE_EVENT_LINES: usize = 23;

impl DataSet {
    /// Names accepted by `from_name`, in declaration order (handy for CLI help and value parsers).
    pub const NAMES: &'static [&'static str] = &[
        "single128",
        "regex512",
        "json512",
        "delim512",
        "multiline512",
        "nginx283",
    ];

    /// Looks a data set up by name, ignoring ASCII case.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .and_then(|i| ALL_DATA_SETS.get(i).copied())
    }

    /// The canonical name, as listed in `NAMES`.
    pub fn name(&self) -> &'static str {
        match self {
            DataSet::Single128 => "single128",
            DataSet::Regex512 => "regex512",
            DataSet::Json512 => "json512",
            DataSet::Delim512 => "delim512",
            DataSet::Multiline512 => "multiline512",
            DataSet::Nginx283 => "nginx283",
        }
    }

    /// Nominal line size in bytes including the newline (128, 512 or 283).
    pub fn line_bytes(&self) -> usize {
        match self {
            DataSet::Single128 => 128,
            DataSet::Regex512 | DataSet::Json512 | DataSet::Delim512 | DataSet::Multiline512 => 512,
            DataSet::Nginx283 => 283,
        }
    }

    /// Size of the smallest unit that may be written on its own: a line, or a
    /// whole event for multiline512 so that readers never see half a trace.
    fn unit_bytes(&self) -> usize {
        match self {
            DataSet::Multiline512 => self.line_bytes() * MULTILINE_EVENT_LINES,
            _ => self.line_bytes(),
        }
    }
}

/// Options of `petrel gen`.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// The data set to generate.
    pub format: DataSet,
    /// Total bytes to write (size mode). Exactly one of `size` or (`rate` and `duration_secs`) is set.
    pub size: Option<u64>,
    /// Bytes per second (rate mode).
    pub rate: Option<u64>,
    /// How long to write in rate mode, in seconds.
    pub duration_secs: Option<u64>,
    /// File to append to; missing parent directories are created.
    pub output: PathBuf,
    /// When set, once the current file holds at least this many bytes it is renamed to `<output>.1`, then `.2`, ... (increasing numbers, never overwritten; the next free number is used), and a fresh `<output>` is created. Rotation happens only on line (for multiline512: event) boundaries.
    pub rotate_bytes: Option<u64>,
    /// PRNG seed; the same seed and options give byte-identical output.
    pub seed: u64,
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenReport {
    /// Bytes appended across all files.
    pub bytes: u64,
    /// Lines appended across all files.
    pub lines: u64,
    /// Events appended: one per line, except multiline512 where an event is 23 lines.
    pub events: u64,
    /// Number of distinct files that received at least one byte during this run.
    pub files: u64,
}

/// Size mode writes in blocks of about this size: large enough to amortise
/// syscalls, small enough to stay in cache.
const CHUNK_BYTES: usize = 1 << 20;
/// Rate mode pacing interval; small enough that a tailing agent sees steady growth.
const SLICE: Duration = Duration::from_millis(10);
const SLICES_PER_SEC: u64 = 100;

enum Mode {
    Size(u64),
    Rate { bytes_per_sec: u64, secs: u64 },
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

impl Mode {
    fn from_options(opts: &GenOptions) -> io::Result<Self> {
        match (opts.size, opts.rate, opts.duration_secs) {
            (Some(size), None, None) => Ok(Mode::Size(size)),
            (None, Some(0), Some(_)) => Err(invalid("gen: rate must be greater than zero")),
            (None, Some(bytes_per_sec), Some(secs)) => Ok(Mode::Rate {
                bytes_per_sec,
                secs,
            }),
            (None, None, None) => Err(invalid(
                "gen: either a size or a rate and a duration is required",
            )),
            (Some(_), _, _) => Err(invalid(
                "gen: size cannot be combined with rate or duration",
            )),
            (None, Some(_), None) => Err(invalid("gen: rate mode needs a duration")),
            (None, None, Some(_)) => Err(invalid("gen: rate mode needs a rate")),
        }
    }
}

/// Writes the data set; appends to an existing output file.
pub fn run(opts: &GenOptions) -> io::Result<GenReport> {
    let mode = Mode::from_options(opts)?;
    if opts.rotate_bytes == Some(0) {
        // Every (even empty) file would already be "full", rotating forever.
        return Err(invalid("gen: rotate size must be greater than zero"));
    }
    let unit = opts.format.unit_bytes();
    let mut writer = RotatingWriter::open(&opts.output, opts.rotate_bytes, unit)?;
    let mut generator = Generator::new(opts.format, opts.seed);
    let mut report = GenReport::default();
    let mut buf = Vec::with_capacity(CHUNK_BYTES + unit);

    // Generates at least `want` bytes of whole units and appends them.
    let mut emit = |writer: &mut RotatingWriter, want: u64, report: &mut GenReport| {
        buf.clear();
        let (lines, events) = generator.fill(&mut buf, usize::try_from(want).unwrap_or(usize::MAX));
        report.bytes += buf.len() as u64;
        report.lines += lines;
        report.events += events;
        writer.write_units(&buf)
    };

    match mode {
        Mode::Size(total) => {
            while report.bytes < total {
                emit(
                    &mut writer,
                    (total - report.bytes).min(CHUNK_BYTES as u64),
                    &mut report,
                )?;
            }
        }
        Mode::Rate {
            bytes_per_sec,
            secs,
        } => {
            let start = Instant::now();
            let slices = secs.saturating_mul(SLICES_PER_SEC);
            for slice in 0..slices {
                // Deadlines are computed from `start`, not from the previous
                // wake-up, so oversleeping never accumulates into drift; the
                // cumulative byte target likewise lets a late slice catch up.
                sleep_until(start, SLICE.as_millis() as u64 * slice);
                let target =
                    u128::from(bytes_per_sec) * u128::from(slice + 1) / u128::from(SLICES_PER_SEC);
                let target = u64::try_from(target).unwrap_or(u64::MAX);
                if target > report.bytes {
                    emit(&mut writer, target - report.bytes, &mut report)?;
                    writer.flush()?;
                }
            }
            // Keep the run as long as requested even though the last slice is
            // written one slice before the end.
            sleep_until(start, secs.saturating_mul(1000));
        }
    }
    writer.flush()?;
    report.files = writer.files;
    Ok(report)
}

fn sleep_until(start: Instant, offset_ms: u64) {
    if let Some(due) = start.checked_add(Duration::from_millis(offset_ms)) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// Appends whole units to `<output>`, rotating it by rename when it is full.
struct RotatingWriter {
    path: PathBuf,
    name: OsString,
    file: File,
    len: u64,
    rotate: Option<u64>,
    unit: u64,
    next_index: u64,
    current_has_data: bool,
    files: u64,
}

impl RotatingWriter {
    fn open(path: &Path, rotate: Option<u64>, unit: usize) -> io::Result<Self> {
        let name = path
            .file_name()
            .ok_or_else(|| invalid("gen: output path has no file name"))?
            .to_os_string();
        if let Some(parent) = non_empty_parent(path) {
            fs::create_dir_all(parent)?;
        }
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        // Start after the highest existing suffix so that numbers keep
        // increasing across runs, even when earlier rotated files were removed.
        let next_index = match rotate {
            Some(_) => highest_rotated_index(path, &name)?.saturating_add(1),
            None => 1,
        };
        let mut writer = RotatingWriter {
            path: path.to_path_buf(),
            name,
            file,
            len,
            rotate,
            unit: unit as u64,
            next_index,
            current_has_data: false,
            files: 0,
        };
        // A pre-existing file may already be over the limit.
        writer.maybe_rotate()?;
        Ok(writer)
    }

    /// `buf` must consist of whole units so that any unit multiple is a line
    /// (or event) boundary.
    fn write_units(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut rest = buf;
        while !rest.is_empty() {
            let take = match self.rotate {
                None => rest.len(),
                Some(limit) => {
                    let units = limit.saturating_sub(self.len).div_ceil(self.unit).max(1);
                    usize::try_from(units.saturating_mul(self.unit))
                        .map_or(rest.len(), |bytes| bytes.min(rest.len()))
                }
            };
            let (now, later) = rest.split_at(take);
            self.file.write_all(now)?;
            self.len += take as u64;
            if !self.current_has_data {
                self.current_has_data = true;
                self.files += 1;
            }
            rest = later;
            self.maybe_rotate()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    fn maybe_rotate(&mut self) -> io::Result<()> {
        match self.rotate {
            Some(limit) if self.len >= limit => self.rotate_now(),
            _ => Ok(()),
        }
    }

    fn rotate_now(&mut self) -> io::Result<()> {
        let mut index = self.next_index;
        let target = loop {
            let candidate = rotated_path(&self.path, &self.name, index);
            match fs::symlink_metadata(&candidate) {
                Ok(_) => {
                    index = index
                        .checked_add(1)
                        .ok_or_else(|| io::Error::other("gen: no free rotation index"))?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break candidate,
                Err(e) => return Err(e),
            }
        };
        self.file.flush()?;
        fs::rename(&self.path, &target)?;
        self.next_index = index.saturating_add(1);
        self.file = open_append(&self.path)?;
        self.len = self.file.metadata()?.len();
        self.current_has_data = false;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn non_empty_parent(path: &Path) -> Option<&Path> {
    path.parent().filter(|p| !p.as_os_str().is_empty())
}

fn rotated_path(path: &Path, name: &OsString, index: u64) -> PathBuf {
    let mut rotated = name.clone();
    rotated.push(format!(".{index}"));
    path.with_file_name(rotated)
}

/// Highest `N` among existing `<name>.N` siblings of `path`, 0 if none.
fn highest_rotated_index(path: &Path, name: &OsString) -> io::Result<u64> {
    let dir = non_empty_parent(path).unwrap_or(Path::new("."));
    let name = name.as_encoded_bytes();
    let mut highest = 0;
    for entry in fs::read_dir(dir)? {
        let entry_name = entry?.file_name();
        let index = entry_name
            .as_encoded_bytes()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(b"."))
            .filter(|digits| !digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| digits.parse::<u64>().ok());
        if let Some(index) = index {
            highest = highest.max(index);
        }
    }
    Ok(highest)
}

/// splitmix64: tiny, fast, and good enough for filler data; chosen over an
/// external crate so that the byte stream can never change under us with a
/// dependency upgrade.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is negligible here).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    fn range(&mut self, lo: u64, hi_inclusive: u64) -> u64 {
        lo + self.below(hi_inclusive - lo + 1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// 64 entries so that six random bits select a character without rejection;
/// the two repeated letters skew the distribution insignificantly.
const ALNUM: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789ab";

fn fill_alnum(rng: &mut SplitMix64, dst: &mut [u8]) {
    let mut chunks = dst.chunks_exact_mut(8);
    for chunk in &mut chunks {
        for (d, b) in chunk.iter_mut().zip(rng.next_u64().to_le_bytes()) {
            *d = ALNUM[usize::from(b & 63)];
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        for (d, b) in rest.iter_mut().zip(rng.next_u64().to_le_bytes()) {
            *d = ALNUM[usize::from(b & 63)];
        }
    }
}

/// Pads the line started at `base` with random characters (or, as a safety
/// net, trims it) so that it is exactly `line_len` bytes once `suffix` and
/// the newline are appended.
fn finish_line(
    rng: &mut SplitMix64,
    out: &mut Vec<u8>,
    base: usize,
    line_len: usize,
    suffix: &[u8],
) {
    let body_end = base + line_len - 1 - suffix.len();
    if out.len() > body_end {
        out.truncate(body_end);
    } else {
        let from = out.len();
        out.resize(body_end, 0);
        fill_alnum(rng, &mut out[from..]);
    }
    out.extend_from_slice(suffix);
    out.push(b'\n');
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Zero-padded to `width` digits; higher digits that do not fit are dropped.
fn push_padded(out: &mut Vec<u8>, mut v: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for d in out[start..].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

const US_PER_SEC: u64 = 1_000_000;
const US_PER_DAY: u64 = 86_400 * US_PER_SEC;
/// 2025-04-03 as days since 1970-01-01.
const START_DAY: i64 = 20_181;
/// 10:02:06.561793 as microseconds since midnight.
const START_US: u64 = (10 * 3600 + 2 * 60 + 6) * US_PER_SEC + 561_793;
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Synthetic wall clock; the date parts are cached because they change once
/// per simulated day while timestamps are rendered on every line.
#[derive(Debug, Clone)]
struct Clock {
    day: i64,
    us: u64,
    iso_date: [u8; 10],
    clf_date: [u8; 11],
}

impl Clock {
    fn new() -> Self {
        Self::at(START_DAY, START_US)
    }

    fn at(day: i64, us: u64) -> Self {
        let mut clock = Clock {
            day,
            us,
            iso_date: [0; 10],
            clf_date: [0; 11],
        };
        clock.render_date();
        clock
    }

    fn advance(&mut self, us: u64) {
        self.us += us;
        if self.us >= US_PER_DAY {
            self.day += (self.us / US_PER_DAY) as i64;
            self.us %= US_PER_DAY;
            self.render_date();
        }
    }

    fn render_date(&mut self) {
        let (year, month, day) = civil_from_days(self.day);
        let mut iso = Vec::with_capacity(10);
        push_padded(&mut iso, year, 4);
        iso.push(b'-');
        push_padded(&mut iso, month, 2);
        iso.push(b'-');
        push_padded(&mut iso, day, 2);
        self.iso_date.copy_from_slice(&iso);

        let mut clf = Vec::with_capacity(11);
        push_padded(&mut clf, day, 2);
        clf.push(b'/');
        clf.extend_from_slice(MONTHS[(month as usize - 1) % 12]);
        clf.push(b'/');
        push_padded(&mut clf, year, 4);
        self.clf_date.copy_from_slice(&clf);
    }

    fn push_hms(&self, out: &mut Vec<u8>) {
        let secs = self.us / US_PER_SEC;
        push_padded(out, secs / 3600, 2);
        out.push(b':');
        push_padded(out, secs / 60 % 60, 2);
        out.push(b':');
        push_padded(out, secs % 60, 2);
    }

    /// `2025-04-03 10:02:06.561793`
    fn push_iso(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.iso_date);
        out.push(b' ');
        self.push_hms(out);
        out.push(b'.');
        push_padded(out, self.us % US_PER_SEC, 6);
    }

    /// `03/Apr/2025:10:02:06 +0000`
    fn push_clf(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.clf_date);
        out.push(b':');
        self.push_hms(out);
        out.extend_from_slice(b" +0000");
    }
}

/// Howard Hinnant's `civil_from_days`: (year, month, day) for days since 1970-01-01.
fn civil_from_days(days: i64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year.max(0) as u64, month as u64, day as u64)
}

const SOURCE_FILE: &[u8] = b"/root/stdout-test/server_stdout.go";
const LEVELS: &[&str] = &["info", "warn", "error", "debug"];
/// Clock step per event in microseconds: small and random so that
/// timestamps are strictly increasing but not evenly spaced.
const MAX_STEP_US: u64 = 150;

const FRAME_PACKAGES: &[&str] = &[
    "service",
    "repository",
    "controller",
    "util",
    "core.pipeline",
];
const FRAME_CLASSES: &[&str] = &[
    "Handler",
    "Dispatcher",
    "OrderRepository",
    "Worker",
    "Pipeline",
];
const FRAME_METHODS: &[&str] = &["method", "handle", "process", "dispatch", "invoke"];

/// Repeated entries weight the draw towards the common cases of real traffic.
const HTTP_METHODS: &[&str] = &[
    "GET", "GET", "GET", "GET", "GET", "POST", "POST", "PUT", "DELETE",
];
const HTTP_STATUSES: &[&str] = &[
    "200", "200", "200", "200", "200", "200", "201", "204", "301", "302", "304", "400", "403",
    "404", "404", "500", "502", "503",
];
const HTTP_PATHS: &[&str] = &[
    "/api/v1/users/",
    "/api/v1/orders/",
    "/static/js/",
    "/images/",
    "/search/",
];
const HTTP_REFERERS: &[&str] = &[
    "-",
    "https://www.example.com/",
    "https://www.example.com/search?q=petrel",
    "https://news.example.org/article/2025/04/03",
];
const USER_AGENTS: &[&str] = &[
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/123.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:124.0) Gecko/20100101 Firefox/124.0",
    "curl/8.5.0",
    "Go-http-client/1.1",
    "kube-probe/1.29",
];

/// An in-memory, deterministic stream of one data set; used by `run()` and by
/// benchmarks/tests that want data in memory.
///
/// The PRNG and the synthetic clock live in the generator, so consecutive
/// `fill` calls continue one stream: the concatenation of their outputs does
/// not depend on how the bytes were split between calls.
#[derive(Debug, Clone)]
pub struct Generator {
    format: DataSet,
    rng: SplitMix64,
    clock: Clock,
    /// Reused for the nginx suffix so the inner loop does not allocate.
    scratch: Vec<u8>,
}

impl Generator {
    /// A generator at the start of the stream for `format` and `seed`.
    pub fn new(format: DataSet, seed: u64) -> Self {
        Generator {
            format,
            rng: SplitMix64(seed),
            clock: Clock::new(),
            scratch: Vec::with_capacity(256),
        }
    }

    /// Fills `out` with whole lines (whole events for multiline512) until at
    /// least `min_bytes` were appended, and returns the `(lines, events)`
    /// appended by this call. Bytes already in `out` are left untouched.
    pub fn fill(&mut self, out: &mut Vec<u8>, min_bytes: usize) -> (u64, u64) {
        let start = out.len();
        let unit = self.format.unit_bytes();
        // Capped so that an absurd request fails by running out of memory
        // gradually rather than by a capacity overflow up front.
        out.reserve(min_bytes.min(64 << 20) + unit);
        let (mut lines, mut events) = (0u64, 0u64);
        while out.len() - start < min_bytes {
            match self.format {
                DataSet::Single128 => self.bracket_line(out, 128, false),
                DataSet::Regex512 => self.bracket_line(out, 512, true),
                DataSet::Json512 => self.json_line(out),
                DataSet::Delim512 => self.delim_line(out),
                DataSet::Multiline512 => {
                    self.bracket_line(out, 512, true);
                    for _ in 1..MULTILINE_EVENT_LINES {
                        self.frame_line(out);
                    }
                    lines += MULTILINE_EVENT_LINES as u64 - 1;
                }
                DataSet::Nginx283 => self.nginx_line(out),
            }
            // Advancing after the event makes the first one carry exactly the
            // documented start time.
            self.tick();
            lines += 1;
            events += 1;
        }
        (lines, events)
    }

    fn tick(&mut self) {
        let step = self.rng.range(1, MAX_STEP_US);
        self.clock.advance(step);
    }

    /// `[<ts>] [<level>] [<pid>] <file>:<n> log:<random>`
    fn bracket_line(&mut self, out: &mut Vec<u8>, len: usize, random_level: bool) {
        let base = out.len();
        out.push(b'[');
        self.clock.push_iso(out);
        out.extend_from_slice(b"] [");
        let level = if random_level {
            self.rng.pick(LEVELS)
        } else {
            "info"
        };
        out.extend_from_slice(level.as_bytes());
        out.extend_from_slice(b"] [");
        push_u64(out, self.rng.range(100_000, 199_999));
        out.extend_from_slice(b"] ");
        out.extend_from_slice(SOURCE_FILE);
        out.push(b':');
        push_u64(out, self.rng.range(1, 999));
        out.extend_from_slice(b" log:");
        finish_line(&mut self.rng, out, base, len, b"");
    }

    /// `{"time":"<ts>","level":"<level>","pid":<int>,"file":"<path>","line":<int>,"log":"<random>"}`
    fn json_line(&mut self, out: &mut Vec<u8>) {
        let base = out.len();
        out.extend_from_slice(b"{\"time\":\"");
        self.clock.push_iso(out);
        out.extend_from_slice(b"\",\"level\":\"");
        out.extend_from_slice(self.rng.pick(LEVELS).as_bytes());
        out.extend_from_slice(b"\",\"pid\":");
        push_u64(out, self.rng.range(100_000, 199_999));
        out.extend_from_slice(b",\"file\":\"");
        out.extend_from_slice(SOURCE_FILE);
        out.extend_from_slice(b"\",\"line\":");
        push_u64(out, self.rng.range(1, 999));
        out.extend_from_slice(b",\"log\":\"");
        finish_line(&mut self.rng, out, base, 512, b"\"}");
    }

    /// `<ts>|<level>|<pid>|<file>|<line>|<random>`
    fn delim_line(&mut self, out: &mut Vec<u8>) {
        let base = out.len();
        self.clock.push_iso(out);
        out.push(b'|');
        out.extend_from_slice(self.rng.pick(LEVELS).as_bytes());
        out.push(b'|');
        push_u64(out, self.rng.range(100_000, 199_999));
        out.push(b'|');
        out.extend_from_slice(SOURCE_FILE);
        out.push(b'|');
        push_u64(out, self.rng.range(1, 999));
        out.push(b'|');
        finish_line(&mut self.rng, out, base, 512, b"");
    }

    /// `    at com.example.<pkg>.<Class>.<method><n>(<Class>.java:<line>) <random>`
    fn frame_line(&mut self, out: &mut Vec<u8>) {
        let base = out.len();
        out.extend_from_slice(b"    at com.example.");
        out.extend_from_slice(self.rng.pick(FRAME_PACKAGES).as_bytes());
        out.push(b'.');
        let class = self.rng.pick(FRAME_CLASSES).as_bytes();
        out.extend_from_slice(class);
        out.push(b'.');
        out.extend_from_slice(self.rng.pick(FRAME_METHODS).as_bytes());
        push_u64(out, self.rng.range(0, 999));
        out.push(b'(');
        out.extend_from_slice(class);
        out.extend_from_slice(b".java:");
        push_u64(out, self.rng.range(1, 9999));
        out.extend_from_slice(b") ");
        finish_line(&mut self.rng, out, base, 512, b"");
    }

    /// nginx combined format; the request path absorbs the padding because it
    /// is the field whose length varies most in real traffic.
    fn nginx_line(&mut self, out: &mut Vec<u8>) {
        let base = out.len();
        push_u64(out, self.rng.range(1, 223));
        for _ in 0..3 {
            out.push(b'.');
            push_u64(out, self.rng.below(256));
        }
        out.extend_from_slice(b" - - [");
        self.clock.push_clf(out);
        out.extend_from_slice(b"] \"");
        out.extend_from_slice(self.rng.pick(HTTP_METHODS).as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.rng.pick(HTTP_PATHS).as_bytes());

        self.scratch.clear();
        self.scratch.extend_from_slice(b" HTTP/1.1\" ");
        let status = self.rng.pick(HTTP_STATUSES);
        self.scratch.extend_from_slice(status.as_bytes());
        self.scratch.push(b' ');
        let body = match status {
            "204" | "304" => 0,
            _ => self.rng.range(100, 99_999),
        };
        push_u64(&mut self.scratch, body);
        self.scratch.extend_from_slice(b" \"");
        self.scratch
            .extend_from_slice(self.rng.pick(HTTP_REFERERS).as_bytes());
        self.scratch.extend_from_slice(b"\" \"");
        self.scratch
            .extend_from_slice(self.rng.pick(USER_AGENTS).as_bytes());
        self.scratch.push(b'"');
        finish_line(&mut self.rng, out, base, 283, &self.scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn generate(format: DataSet, seed: u64, min_bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        Generator::new(format, seed).fill(&mut out, min_bytes);
        out
    }

    fn lines(buf: &[u8]) -> Vec<&str> {
        std::str::from_utf8(buf)
            .expect("generated data is ASCII")
            .split_terminator('\n')
            .collect()
    }

    fn is_digits(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    }

    fn is_word(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    }

    fn is_alnum(s: &str) -> bool {
        s.bytes().all(|b| b.is_ascii_alphanumeric())
    }

    /// `YYYY-MM-DD HH:MM:SS.ffffff`
    fn check_iso_ts(ts: &str) {
        let b = ts.as_bytes();
        assert_eq!(b.len(), 26, "timestamp {ts:?}");
        for (i, &c) in b.iter().enumerate() {
            let expected = match i {
                4 | 7 => Some(b'-'),
                10 => Some(b' '),
                13 | 16 => Some(b':'),
                19 => Some(b'.'),
                _ => None,
            };
            match expected {
                Some(sep) => assert_eq!(c, sep, "timestamp {ts:?}"),
                None => assert!(c.is_ascii_digit(), "timestamp {ts:?}"),
            }
        }
    }

    /// Mirrors `\[([^]]+)]\s\[(\w+)]\s\[(\d+)]\s(\S+):(\d+)\slog:(.*)` and
    /// returns (timestamp, level).
    fn check_bracket_line(line: &str) -> (&str, &str) {
        let rest = line.strip_prefix('[').expect("starts with [");
        let (ts, rest) = rest.split_once("] [").expect("ts field");
        assert!(!ts.contains(']'));
        check_iso_ts(ts);
        let (level, rest) = rest.split_once("] [").expect("level field");
        assert!(is_word(level), "level {level:?}");
        let (pid, rest) = rest.split_once("] ").expect("pid field");
        assert!(is_digits(pid), "pid {pid:?}");
        let (location, tail) = rest.split_once(" log:").expect("log field");
        let (file, n) = location.rsplit_once(':').expect("file:line");
        assert!(!file.is_empty() && !file.contains(char::is_whitespace));
        assert!(is_digits(n), "line number {n:?}");
        assert!(is_alnum(tail), "tail {tail:?}");
        (ts, level)
    }

    /// A minimal parser for flat JSON objects with string and integer values,
    /// enough to prove the lines are valid JSON without a dependency.
    fn parse_flat_json(line: &str) -> Vec<(String, String)> {
        fn string(b: &[u8], i: &mut usize) -> String {
            assert_eq!(b[*i], b'"');
            *i += 1;
            let start = *i;
            while b[*i] != b'"' {
                assert!(b[*i] >= 0x20 && b[*i] != b'\\', "unescaped char in string");
                *i += 1;
            }
            *i += 1;
            String::from_utf8(b[start..*i - 1].to_vec()).expect("utf8")
        }
        let b = line.as_bytes();
        assert_eq!(b[0], b'{');
        let mut i = 1;
        let mut fields = Vec::new();
        loop {
            let key = string(b, &mut i);
            assert_eq!(b[i], b':');
            i += 1;
            let value = if b[i] == b'"' {
                string(b, &mut i)
            } else {
                let start = i;
                while b[i].is_ascii_digit() {
                    i += 1;
                }
                assert!(i > start, "value of {key} is neither string nor integer");
                line[start..i].to_string()
            };
            fields.push((key, value));
            match b[i] {
                b',' => i += 1,
                b'}' => {
                    assert_eq!(i + 1, b.len(), "trailing bytes after object");
                    return fields;
                }
                c => panic!("unexpected {:?}", c as char),
            }
        }
    }

    #[test]
    fn every_line_has_its_nominal_length() {
        for &format in &ALL_DATA_SETS {
            for seed in [0, 1, 42, u64::MAX] {
                let buf = generate(format, seed, 300_000);
                assert!(buf.len() >= 300_000);
                assert_eq!(buf.last(), Some(&b'\n'), "{}", format.name());
                assert!(buf.is_ascii() && !buf.contains(&b'\r'));
                assert_eq!(buf.len() % format.unit_bytes(), 0);
                for line in buf.split_inclusive(|&b| b == b'\n') {
                    assert_eq!(
                        line.len(),
                        format.line_bytes(),
                        "{}: {:?}",
                        format.name(),
                        String::from_utf8_lossy(line)
                    );
                    assert!(!line[..line.len() - 1].contains(&b'\n'));
                }
            }
        }
    }

    #[test]
    fn fill_reports_lines_and_events() {
        for &format in &ALL_DATA_SETS {
            let mut out = Vec::new();
            let (lines_written, events) = Generator::new(format, 7).fill(&mut out, 100_000);
            assert_eq!(lines_written, (out.len() / format.line_bytes()) as u64);
            assert_eq!(events, (out.len() / format.unit_bytes()) as u64);
            // Overshoot is less than one unit.
            assert!(out.len() < 100_000 + format.unit_bytes());
            assert_eq!(Generator::new(format, 7).fill(&mut Vec::new(), 0), (0, 0));
        }
    }

    #[test]
    fn output_is_deterministic_per_seed() {
        for &format in &ALL_DATA_SETS {
            let a = generate(format, 1234, 200_000);
            assert_eq!(a, generate(format, 1234, 200_000), "{}", format.name());
            assert_ne!(a, generate(format, 1235, 200_000), "{}", format.name());
        }
    }

    #[test]
    fn chunked_fills_form_one_stream() {
        for &format in &ALL_DATA_SETS {
            let whole = generate(format, 99, 500_000);
            let mut generator = Generator::new(format, 99);
            let mut chunked = Vec::new();
            while chunked.len() < whole.len() {
                generator.fill(&mut chunked, 3_000);
            }
            assert_eq!(&chunked[..whole.len()], &whole[..], "{}", format.name());
        }
    }

    #[test]
    fn single128_matches_benchmark_shape() {
        let buf = generate(DataSet::Single128, 5, 50_000);
        let all = lines(&buf);
        assert!(all[0].starts_with("[2025-04-03 10:02:06.561793] [info] ["));
        let mut previous = "";
        for line in all {
            let (ts, level) = check_bracket_line(line);
            assert_eq!(level, "info");
            assert!(line.contains("] /root/stdout-test/server_stdout.go:"));
            assert!(
                ts > previous,
                "timestamps must increase: {previous} then {ts}"
            );
            previous = ts;
        }
    }

    #[test]
    fn regex512_lines_have_the_documented_fields() {
        let buf = generate(DataSet::Regex512, 3, 400_000);
        let mut levels = std::collections::BTreeSet::new();
        let mut previous = "";
        for line in lines(&buf) {
            let (ts, level) = check_bracket_line(line);
            assert!(LEVELS.contains(&level));
            assert!(ts > previous);
            previous = ts;
            levels.insert(level);
        }
        assert_eq!(levels.len(), LEVELS.len(), "all levels occur");
    }

    #[test]
    fn json512_lines_are_flat_objects_with_keys_in_order() {
        let buf = generate(DataSet::Json512, 11, 200_000);
        for line in lines(&buf) {
            let fields = parse_flat_json(line);
            let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["time", "level", "pid", "file", "line", "log"]);
            check_iso_ts(&fields[0].1);
            assert!(LEVELS.contains(&fields[1].1.as_str()));
            assert!(is_digits(&fields[2].1) && is_digits(&fields[4].1));
            assert!(is_alnum(&fields[5].1) && !fields[5].1.is_empty());
        }
    }

    #[test]
    fn delim512_lines_have_six_fields() {
        let buf = generate(DataSet::Delim512, 13, 200_000);
        for line in lines(&buf) {
            let fields: Vec<&str> = line.split('|').collect();
            assert_eq!(fields.len(), 6, "{line}");
            check_iso_ts(fields[0]);
            assert!(LEVELS.contains(&fields[1]));
            assert!(is_digits(fields[2]) && is_digits(fields[4]));
            assert_eq!(fields[3].as_bytes(), SOURCE_FILE);
            assert!(is_alnum(fields[5]));
        }
    }

    #[test]
    fn multiline512_events_have_a_header_and_22_frames() {
        let mut buf = Vec::new();
        let (n_lines, events) = Generator::new(DataSet::Multiline512, 17).fill(&mut buf, 100_000);
        assert_eq!(n_lines, events * 23);
        let all = lines(&buf);
        assert_eq!(all.len() as u64, n_lines);
        for event in all.chunks(23) {
            assert_eq!(event.len(), 23);
            check_bracket_line(event[0]);
            for frame in &event[1..] {
                assert!(frame.starts_with("    at com.example."), "{frame}");
                let (call, tail) = frame.split_once(") ").expect("frame ends with ') '");
                assert!(call.contains(".java:"));
                assert!(is_alnum(tail));
            }
        }
    }

    #[test]
    fn nginx283_lines_are_combined_log_format() {
        let buf = generate(DataSet::Nginx283, 19, 200_000);
        for line in lines(&buf) {
            let (ip, rest) = line.split_once(" - - [").expect("ip");
            let octets: Vec<&str> = ip.split('.').collect();
            assert_eq!(octets.len(), 4);
            assert!(octets
                .iter()
                .all(|o| is_digits(o) && o.parse::<u8>().is_ok()));
            let (ts, rest) = rest.split_once("] \"").expect("time");
            assert_eq!(ts.len(), 26);
            assert!(ts.ends_with(" +0000") && ts[2..].starts_with("/Apr/2025:"));
            let (request, rest) = rest.split_once("\" ").expect("request");
            let parts: Vec<&str> = request.split(' ').collect();
            assert_eq!(parts.len(), 3, "{request}");
            assert!(HTTP_METHODS.contains(&parts[0]));
            assert!(parts[1].starts_with('/'));
            assert_eq!(parts[2], "HTTP/1.1");
            let (status, rest) = rest.split_once(' ').expect("status");
            assert!(HTTP_STATUSES.contains(&status));
            let (bytes, rest) = rest.split_once(" \"").expect("bytes");
            assert!(is_digits(bytes));
            let (referer, agent) = rest.split_once("\" \"").expect("referer");
            assert!(HTTP_REFERERS.contains(&referer));
            let agent = agent.strip_suffix('"').expect("agent quoted");
            assert!(USER_AGENTS.contains(&agent));
        }
    }

    #[test]
    fn nginx_tables_leave_room_for_padding() {
        fn longest(items: &[&str]) -> usize {
            items.iter().map(|s| s.len()).max().unwrap_or(0)
        }
        let prefix = "223.255.255.255 - - [".len()
            + "03/Apr/2025:10:02:06 +0000".len()
            + "] \"".len()
            + longest(HTTP_METHODS)
            + 1
            + longest(HTTP_PATHS);
        let suffix = " HTTP/1.1\" ".len()
            + 3
            + " 99999 \"".len()
            + longest(HTTP_REFERERS)
            + "\" \"".len()
            + longest(USER_AGENTS)
            + 1;
        assert!(prefix + suffix + 1 < 283, "{} bytes", prefix + suffix + 1);
    }

    #[test]
    fn clock_rolls_over_days_months_and_years() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(START_DAY), (2025, 4, 3));
        let mut out = Vec::new();
        Clock::new().push_iso(&mut out);
        assert_eq!(out, b"2025-04-03 10:02:06.561793");

        let last_us = US_PER_DAY - 1;
        for (day, before, after) in [
            (
                START_DAY - 34,
                "2025-02-28 23:59:59.999999",
                "2025-03-01 00:00:00.000000",
            ),
            (
                START_DAY - 400,
                "2024-02-28 23:59:59.999999",
                "2024-02-29 00:00:00.000000",
            ),
            (
                START_DAY + 272,
                "2025-12-31 23:59:59.999999",
                "2026-01-01 00:00:00.000000",
            ),
        ] {
            let mut clock = Clock::at(day, last_us);
            out.clear();
            clock.push_iso(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), before);
            clock.advance(1);
            out.clear();
            clock.push_iso(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), after);
        }
        let mut clock = Clock::at(START_DAY + 272, last_us);
        clock.advance(1);
        out.clear();
        clock.push_clf(&mut out);
        assert_eq!(out, b"01/Jan/2026:00:00:00 +0000");
    }

    /// A unique scratch directory, removed on drop even when the test fails.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "petrel-gen-{tag}-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("create temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn options(format: DataSet, output: PathBuf) -> GenOptions {
        GenOptions {
            format,
            size: None,
            rate: None,
            duration_secs: None,
            output,
            rotate_bytes: None,
            seed: 1,
        }
    }

    fn count_lines(path: &Path) -> u64 {
        let data = fs::read(path).expect("read output");
        data.iter().filter(|&&b| b == b'\n').count() as u64
    }

    #[test]
    fn inconsistent_options_are_invalid_input() {
        let dir = TempDir::new("invalid");
        let base = options(DataSet::Single128, dir.0.join("out.log"));
        let cases = [
            (None, None, None, None),
            (Some(1000), Some(10), Some(1), None),
            (Some(1000), None, Some(1), None),
            (None, Some(10), None, None),
            (None, None, Some(1), None),
            (None, Some(0), Some(1), None),
            (Some(1000), None, None, Some(0)),
        ];
        for (size, rate, duration_secs, rotate_bytes) in cases {
            let opts = GenOptions {
                size,
                rate,
                duration_secs,
                rotate_bytes,
                ..base.clone()
            };
            let err = run(&opts).expect_err("must be rejected");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{opts:?}");
        }
    }

    #[test]
    fn size_mode_appends_whole_events_and_matches_generator() {
        let dir = TempDir::new("size");
        let out = dir.0.join("out.log");
        let mut opts = options(DataSet::Multiline512, out.clone());
        opts.size = Some(1);
        let report = run(&opts).expect("run");
        assert_eq!(
            report,
            GenReport {
                bytes: 23 * 512,
                lines: 23,
                events: 1,
                files: 1
            }
        );
        opts.size = Some(3 * 1024 * 1024 + 7);
        let second = run(&opts).expect("run");
        assert!(second.bytes >= 3 * 1024 * 1024 + 7);
        assert_eq!(second.bytes % (23 * 512), 0);
        assert!(second.bytes < 3 * 1024 * 1024 + 7 + 23 * 512);
        let data = fs::read(&out).expect("read");
        assert_eq!(data.len() as u64, report.bytes + second.bytes);
        // The second run starts the same seeded stream again after the first.
        let expected = generate(DataSet::Multiline512, 1, second.bytes as usize);
        assert_eq!(&data[report.bytes as usize..], &expected[..]);
    }

    #[test]
    fn size_mode_rotation_splits_on_line_boundaries() {
        let dir = TempDir::new("rotate");
        let out = dir.0.join("out.log");
        let mut opts = options(DataSet::Regex512, out.clone());
        opts.size = Some(2_500_000);
        opts.rotate_bytes = Some(300_000);
        let report = run(&opts).expect("run");

        let mut total_lines = count_lines(&out);
        let mut total_bytes = fs::metadata(&out).expect("out").len();
        let mut rotated = 0;
        for index in 1.. {
            let path = dir.0.join(format!("out.log.{index}"));
            let Ok(meta) = fs::metadata(&path) else { break };
            assert!(
                meta.len() >= 300_000 && meta.len() < 300_000 + 512,
                "{index}"
            );
            assert_eq!(meta.len() % 512, 0);
            total_lines += count_lines(&path);
            total_bytes += meta.len();
            rotated += 1;
        }
        assert_eq!(rotated, 2_500_000 / 300_000);
        assert!(fs::metadata(&out).expect("out").len() < 300_000);
        assert_eq!(total_lines, report.lines);
        assert_eq!(total_bytes, report.bytes);
        assert_eq!(report.files, rotated + 1);
        let entries = fs::read_dir(&dir.0).expect("dir").count() as u64;
        assert_eq!(entries, rotated + 1, "no stray files");
    }

    #[test]
    fn rotation_never_overwrites_existing_files() {
        let dir = TempDir::new("norewrite");
        let out = dir.0.join("app.log");
        fs::write(dir.0.join("app.log.1"), b"keep\n").expect("seed .1");
        fs::write(dir.0.join("app.log.3"), b"keep3\n").expect("seed .3");
        // Over the limit already: rotated before anything is appended.
        fs::write(&out, vec![b'x'; 2000]).expect("seed out");
        let mut opts = options(DataSet::Single128, out.clone());
        opts.size = Some(5000);
        opts.rotate_bytes = Some(1000);
        let report = run(&opts).expect("run");

        assert_eq!(fs::read(dir.0.join("app.log.1")).expect(".1"), b"keep\n");
        assert_eq!(fs::read(dir.0.join("app.log.3")).expect(".3"), b"keep3\n");
        assert_eq!(
            fs::read(dir.0.join("app.log.4")).expect(".4"),
            vec![b'x'; 2000]
        );
        assert!(!dir.0.join("app.log.2").exists());
        let mut lines_seen = count_lines(&out);
        for index in 5..=9 {
            let path = dir.0.join(format!("app.log.{index}"));
            assert_eq!(fs::metadata(&path).expect("rotated").len(), 1024);
            lines_seen += count_lines(&path);
        }
        assert!(!dir.0.join("app.log.10").exists());
        assert_eq!(lines_seen, report.lines);
        assert_eq!(report.bytes, 5120);
    }

    #[test]
    fn rate_mode_writes_about_rate_times_duration() {
        let dir = TempDir::new("rate");
        let out = dir.0.join("nested").join("rate.log");
        let mut opts = options(DataSet::Nginx283, out.clone());
        opts.rate = Some(200_000);
        opts.duration_secs = Some(1);
        let started = Instant::now();
        // Sample the file half-way through: paced output has grown part of
        // the way, a writer that dumps everything at once (or at the end) has
        // not. The bounds are wide so that a loaded machine does not flake.
        let sampled = out.clone();
        let sampler = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            fs::metadata(&sampled).map(|m| m.len()).unwrap_or(0)
        });
        let report = run(&opts).expect("run");
        let midway = sampler.join().expect("sampler");
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert!(
            (20_000..=180_000).contains(&midway),
            "{midway} bytes after 0.5 s"
        );
        assert!(
            (100_000..=300_000).contains(&report.bytes),
            "{} bytes",
            report.bytes
        );
        assert_eq!(fs::metadata(&out).expect("out").len(), report.bytes);
        assert_eq!(report.lines, report.bytes / 283);
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(DataSet::NAMES.len(), ALL_DATA_SETS.len());
        for (&name, &format) in DataSet::NAMES.iter().zip(&ALL_DATA_SETS) {
            assert_eq!(format.name(), name);
            assert_eq!(DataSet::from_name(name), Some(format));
            assert_eq!(DataSet::from_name(&name.to_uppercase()), Some(format));
        }
        assert_eq!(DataSet::from_name("json"), None);
    }
}
