//! Shared harness for the end-to-end tests: runs the real `petrel` binary on
//! real files in a temporary directory, reads its metrics over HTTP, and
//! offers bounded waits that fail with a helpful message.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Generous bound for waits on a loaded 2-core machine.
pub const LONG: Duration = Duration::from_secs(60);
/// Bound for things that should happen within a few seconds.
pub const MEDIUM: Duration = Duration::from_secs(30);
/// Poll period of the wait loops.
pub const POLL: Duration = Duration::from_millis(50);

/// The binary under test.
pub fn bin() -> PathBuf {
    // PETREL_TEST_BIN runs the tests against another build (an older
    // commit, to see a regression test fail before its fix).
    std::env::var_os("PETREL_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_petrel")))
}

/// A fresh temporary directory (removed on drop).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("petrel-e2e-")
        .tempdir()
        .expect("create temp dir")
}

/// Writes `yaml` to `dir/<name>.yaml` (the pipeline is then called `name`).
pub fn write_config(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(&p, yaml).expect("write config");
    p
}

/// A one-source, one-sink pipeline reading `include` from the beginning and
/// writing `text` to `out`.
pub fn simple_config(include: &str, out: &Path, extra_source_keys: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{include}\"]\n    read_from: beginning\n{extra_source_keys}sinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
        out.display()
    )
}

/// Polls `check` every [`POLL`] until it returns `Ok`, or panics after
/// `timeout` with `what` and the last reason `check` gave.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) => {
                if start.elapsed() >= timeout {
                    panic!("timed out after {timeout:?} waiting for {what}: {why}");
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Appends `data` to `path` (creating it).
pub fn append(path: &Path, data: &[u8]) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(data).expect("append");
}

/// The complete (newline-terminated) lines of `path`, without newlines; a
/// missing file has none, and a trailing unterminated piece is ignored.
pub fn read_lines(path: &Path) -> Vec<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => split_lines(&b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

/// Complete lines of `b`, without newlines.
pub fn split_lines(b: &[u8]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
    v.pop(); // the piece after the last newline (empty when complete)
    v
}

/// Number of complete lines in `path` (0 when missing).
pub fn count_lines(path: &Path) -> usize {
    match std::fs::read(path) {
        Ok(b) => memchr_count(&b),
        Err(_) => 0,
    }
}

fn memchr_count(b: &[u8]) -> usize {
    b.iter().filter(|&&c| c == b'\n').count()
}

/// Counts of each distinct line.
pub fn histogram<I: IntoIterator<Item = Vec<u8>>>(lines: I) -> HashMap<Vec<u8>, usize> {
    let mut h = HashMap::new();
    for l in lines {
        *h.entry(l).or_insert(0) += 1;
    }
    h
}

/// Runs `petrel gen` and returns the number of bytes written.
pub fn gen(format: &str, size: &str, output: &Path) -> u64 {
    let out = Command::new(bin())
        .args(["gen", "--format", format, "--size", size, "--output"])
        .arg(output)
        .output()
        .expect("run petrel gen");
    assert!(
        out.status.success(),
        "petrel gen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::metadata(output).expect("gen output").len()
}

/// Runs `petrel` with `args` in directory `cwd` to completion (bounded by
/// [`MEDIUM`]); returns (exit code, stdout, stderr).
pub fn run_to_end<S: AsRef<std::ffi::OsStr>>(
    cwd: &Path,
    args: &[S],
) -> (Option<i32>, String, String) {
    run_to_end_env(cwd, args, &[])
}

/// [`run_to_end`] with `env` added to the environment (the secrets a
/// configuration's `${VAR}` names).
pub fn run_to_end_env<S: AsRef<std::ffi::OsStr>>(
    cwd: &Path,
    args: &[S],
    env: &[(String, String)],
) -> (Option<i32>, String, String) {
    let child = Command::new(bin())
        .current_dir(cwd)
        .args(args)
        .env_remove("PETREL_LOG")
        .env_remove("PETREL_LOG_FORMAT")
        .env_remove("PETREL_DATA_DIR")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run petrel");
    // Bounded: a command that should exit at once must not hang the suite.
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(MEDIUM) {
        Ok(r) => r.expect("wait for petrel"),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!(
                "petrel {:?} did not exit within {MEDIUM:?}",
                args.iter()
                    .map(|a| a.as_ref().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            );
        }
    };
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What to do with the agent's standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdoutMode {
    /// Discard it.
    Null,
    /// Collect it in the background ([`Agent::stdout_bytes`]).
    Capture,
    /// Leave the pipe unread for the test to take ([`Agent::take_stdout`]).
    Piped,
}

/// Options of [`Agent::start_with`].
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Extra command line arguments after the standard ones.
    pub args: Vec<String>,
    /// Standard output handling.
    pub stdout: StdoutMode,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Soft and hard limit of open files (`ulimit -n`), when set.
    pub nofile: Option<u64>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            args: Vec::new(),
            stdout: StdoutMode::Null,
            env: Vec::new(),
            nofile: None,
        }
    }
}

/// A running `petrel run`. Killed (SIGKILL) on drop if still running; its
/// stderr is printed when the test panics.
pub struct Agent {
    child: Child,
    /// The API port.
    pub port: u16,
    stderr: Arc<Mutex<String>>,
    stdout: Option<Arc<Mutex<Vec<u8>>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Agent {
    /// Starts `petrel run --config config --data-dir data_dir` with an API on
    /// a free port and waits until the API is listening.
    pub fn start(config: &Path, data_dir: &Path) -> Agent {
        Self::start_with(config, data_dir, AgentOptions::default())
    }

    /// Like [`Agent::start`], with options.
    pub fn start_with(config: &Path, data_dir: &Path, opts: AgentOptions) -> Agent {
        let mut cmd = Command::new(bin());
        // If the test process dies without dropping the agent, the agent
        // must not live on (it could fill the disk).
        // SAFETY: prctl is async-signal-safe; nothing else runs in the hook.
        let nofile = opts.nofile;
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(n) = nofile {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--api-addr", "127.0.0.1:0", "--log-level", "info"])
            .args(&opts.args)
            .env_remove("PETREL_LOG")
            .env_remove("PETREL_LOG_FORMAT")
            .env_remove("PETREL_DATA_DIR")
            .env_remove("PETREL_API_TOKEN")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(match opts.stdout {
                StdoutMode::Null => Stdio::null(),
                _ => Stdio::piped(),
            });
        let mut child = cmd.spawn().expect("spawn petrel run");
        let stderr_pipe = child.stderr.take().expect("stderr pipe");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<u16>();
        let mut readers = Vec::new();
        {
            let stderr = stderr.clone();
            readers.push(std::thread::spawn(move || {
                let mut r = BufReader::new(stderr_pipe);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match r.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let s = String::from_utf8_lossy(&line);
                    if let Some(port) = parse_api_port(&s) {
                        let _ = tx.send(port);
                    }
                    stderr.lock().unwrap().push_str(&s);
                }
            }));
        }
        let stdout = if opts.stdout == StdoutMode::Capture {
            let mut pipe = child.stdout.take().expect("stdout pipe");
            let buf = Arc::new(Mutex::new(Vec::new()));
            let b = buf.clone();
            readers.push(std::thread::spawn(move || {
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
                    }
                }
            }));
            Some(buf)
        } else {
            None
        };
        let mut agent = Agent {
            child,
            port: 0,
            stderr,
            stdout,
            readers,
            exit: None,
        };
        let deadline = Instant::now() + MEDIUM;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(port) => {
                    agent.port = port;
                    break;
                }
                Err(_) => {
                    if let Ok(Some(st)) = agent.child.try_wait() {
                        agent.exit = Some(st);
                        std::thread::sleep(Duration::from_millis(100));
                        panic!(
                            "petrel run exited ({st}) before its API was up; stderr:\n{}",
                            agent.stderr()
                        );
                    }
                    if Instant::now() >= deadline {
                        panic!(
                            "petrel run did not log `API listening on` within {MEDIUM:?}; stderr:\n{}",
                            agent.stderr()
                        );
                    }
                }
            }
        }
        agent
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the agent logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Standard output collected so far ([`StdoutMode::Capture`]).
    pub fn stdout_bytes(&self) -> Vec<u8> {
        self.stdout
            .as_ref()
            .expect("agent started without StdoutMode::Capture")
            .lock()
            .unwrap()
            .clone()
    }

    /// The unread stdout pipe ([`StdoutMode::Piped`]).
    pub fn take_stdout(&mut self) -> ChildStdout {
        self.child
            .stdout
            .take()
            .expect("agent started without StdoutMode::Piped")
    }

    /// GET `path` from the API; returns (status, body).
    pub fn http_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        self.http("GET", path)
    }

    /// Sends `method path` (no body) to the API; returns (status, body).
    pub fn http(&self, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP header end")
        })?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no status"))?;
        Ok((status, body.to_string()))
    }

    /// The `/metrics` text (panics when the API does not answer 200).
    pub fn metrics(&self) -> String {
        match self.http_get("/metrics") {
            Ok((200, body)) => body,
            Ok((st, body)) => panic!("GET /metrics answered {st}: {body}"),
            Err(e) => panic!("GET /metrics failed: {e}; stderr:\n{}", self.stderr()),
        }
    }

    /// The value of the sample of `name` whose labels include `labels`.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        find_metric(&self.metrics(), name, labels)
    }

    /// Like [`Agent::metric`], 0 when absent.
    pub fn metric_or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metric(name, labels).unwrap_or(0.0)
    }

    /// Sends `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({}, {sig}) failed", self.child.id());
    }

    /// Waits for the process to exit, up to `timeout`; panics otherwise.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(st) = self.exit {
            return st;
        }
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    self.exit = Some(st);
                    for r in self.readers.drain(..) {
                        let _ = r.join();
                    }
                    return st;
                }
                Ok(None) => {}
                Err(e) => panic!("wait for petrel: {e}"),
            }
            if start.elapsed() >= timeout {
                panic!(
                    "petrel did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status if the process has exited (without waiting).
    pub fn try_exit(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(st) = self.exit {
            return Ok(Some(st));
        }
        let st = self.child.try_wait()?;
        if st.is_some() {
            self.exit = st;
        }
        Ok(st)
    }

    /// SIGTERM, then waits (bounded) and asserts exit code 0; returns how
    /// long the exit took.
    pub fn stop(&mut self) -> Duration {
        let t = Instant::now();
        self.signal(libc::SIGTERM);
        let st = self.wait_exit(MEDIUM);
        assert_eq!(
            st.code(),
            Some(0),
            "petrel should exit 0 after SIGTERM, got {st}; stderr:\n{}",
            self.stderr()
        );
        t.elapsed()
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit(MEDIUM);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let log = self.stderr();
            let tail: String = log
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!("---- petrel stderr (last 60 lines) ----\n{tail}\n----");
        }
    }
}

fn parse_api_port(line: &str) -> Option<u16> {
    let rest = line.split("API listening on ").nth(1)?;
    let rest = rest
        .strip_prefix("http://")
        .or_else(|| rest.strip_prefix("https://"))?;
    // Ends at white space (text logs) or at the closing quote (`--log-format json`).
    let addr = rest.split(|c: char| c.is_whitespace() || c == '"').next()?;
    addr.rsplit(':').next()?.parse().ok()
}

/// Finds the sample of `name` (exact metric name, e.g.
/// `petrel_files_open`) whose labels include every pair of `labels`.
pub fn find_metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (metric, label_text, value) = match line.find('{') {
            Some(i) => {
                let close = line.rfind('}')?;
                (&line[..i], &line[i + 1..close], line[close + 1..].trim())
            }
            None => {
                let mut it = line.splitn(2, ' ');
                (it.next()?, "", it.next()?.trim())
            }
        };
        if metric != name {
            continue;
        }
        let got = parse_labels(label_text);
        if labels
            .iter()
            .all(|(k, v)| got.iter().any(|(gk, gv)| gk == k && gv == v))
        {
            return value.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let eq = match s[i..].find('=') {
            Some(e) => i + e,
            None => break,
        };
        let key = s[i..eq].trim_matches(|c| c == ',' || c == ' ').to_string();
        let mut j = eq + 2; // skip `="`
        let mut val = String::new();
        while j < b.len() && b[j] != b'"' {
            if b[j] == b'\\' && j + 1 < b.len() {
                j += 1;
                val.push(match b[j] {
                    b'n' => '\n',
                    c => c as char,
                });
            } else {
                // Label values are UTF-8; copy whole characters.
                let ch = s[j..].chars().next().unwrap();
                val.push(ch);
                j += ch.len_utf8() - 1;
            }
            j += 1;
        }
        out.push((key, val));
        i = j + 1;
    }
    out
}

/// Labels of a component of pipeline `p`.
pub fn component<'a>(p: &'a str, kind: &'a str, id: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("pipeline", p),
        ("component_kind", kind),
        ("component_id", id),
    ]
}

/// The committed offset recorded for `path` in `data_dir/checkpoints.json`.
pub fn checkpoint_offset(data_dir: &Path, path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(data_dir.join("checkpoints.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).expect("checkpoints.json is JSON");
    let want = path.to_string_lossy();
    for files in v.get("sources")?.as_object()?.values() {
        for f in files.as_array()? {
            if f.get("path").and_then(|p| p.as_str()) == Some(&want) {
                return f.get("offset").and_then(|o| o.as_u64());
            }
        }
    }
    None
}

/// Cheap deterministic 64-bit hash of a line (FNV-1a), for comparing large
/// data sets without holding every line.
pub fn line_hash(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in b {
        h ^= c as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// For each distinct line hash in `path`, how often it occurs; also returns
/// the trailing unterminated piece, if any.
pub fn hash_histogram(path: &Path) -> (HashMap<u64, u32>, Vec<u8>) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut h = HashMap::new();
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        let n = r.read_until(b'\n', &mut line).expect("read");
        if n == 0 {
            return (h, Vec::new());
        }
        if line.last() != Some(&b'\n') {
            return (h, line);
        }
        line.pop();
        *h.entry(line_hash(&line)).or_insert(0) += 1;
    }
}

/// File descriptors of process `pid` that point at `path` (including
/// `path (deleted)`).
pub fn fds_pointing_at(pid: u32, path: &Path) -> Vec<String> {
    let want = path.to_string_lossy().into_owned();
    let mut hits = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return hits;
    };
    for e in rd.flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy().into_owned();
            if t == want || t == format!("{want} (deleted)") {
                hits.push(format!("{} -> {t}", e.path().display()));
            }
        }
    }
    hits
}

/// This machine's host name as the kernel knows it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Waits (up to [`LONG`]) until `path` has at least `n` lines.
pub fn wait_lines(path: &Path, n: usize) {
    wait_for(LONG, &format!("{n} lines in {}", path.display()), || {
        let c = count_lines(path);
        if c >= n {
            Ok(())
        } else {
            Err(format!("{c} lines"))
        }
    });
}

/// A small tmpfs mounted for a test (a full disk on demand); unmounted on
/// drop. Needs root; the test fails, naming why, without it.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `1m`) at `path`.
    pub fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN); this test fills a disk and cannot run without it"
        );
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Fills the file system that holds `dir` with a file `dir/filler`
/// (closed, so that removing it frees the room); returns its path.
pub fn fill_disk(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).expect("create the filler");
    let block = vec![b'x'; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    filler
}

/// Keeps the file system of `dir` full but for 512 KiB freed every 3 s
/// (a filler file cut by 512 KiB, then grown until the disk is full
/// again) until `stop`; returns how many times it freed room.
pub fn flap_disk(dir: &Path, stop: &std::sync::atomic::AtomicBool) -> usize {
    use std::io::Write;
    let filler = fill_disk(dir);
    let mut rounds = 0;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let len = std::fs::metadata(&filler).map_or(0, |m| m.len());
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .and_then(|f| f.set_len(len.saturating_sub(512 << 10)));
        rounds += 1;
        std::thread::sleep(Duration::from_millis(1500));
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&filler) {
            let block = vec![b'x'; 4096];
            while f.write_all(&block).is_ok() {}
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    let _ = std::fs::remove_file(&filler);
    rounds
}

/// An HTTP server (`POST /ingest`) that holds every request unanswered
/// until `released`, then answers 200: a stalled downstream for a sink.
#[derive(Default)]
pub struct Stalled {
    /// Set to let held and later requests through.
    pub released: std::sync::atomic::AtomicBool,
    /// Requests waiting for an answer.
    pub held: std::sync::atomic::AtomicUsize,
    /// Bodies answered 200, in arrival order.
    pub bodies: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Stalled {
    /// Non-empty lines in the bodies answered so far (ndjson records).
    pub fn lines(&self) -> usize {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.split(|&c| c == b'\n').filter(|l| !l.is_empty()).count())
            .sum()
    }
}

/// Runs a [`Stalled`] server on 127.0.0.1 in its own thread (for the rest
/// of the test process); returns its address.
pub fn serve_stalled(state: std::sync::Arc<Stalled>) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stalled server");
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/ingest",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let s = state.clone();
                    async move {
                        s.held.fetch_add(1, Ordering::SeqCst);
                        while !s.released.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        s.held.fetch_sub(1, Ordering::SeqCst);
                        s.bodies.lock().unwrap().push(body.to_vec());
                        axum::http::StatusCode::OK
                    }
                }),
            );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    addr
}

/// Connects, retrying while the source is still starting.
pub fn connect(port: u16) -> TcpStream {
    let started = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("connect {port}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The ndjson lines of `path`, parsed.
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    read_lines(path)
        .iter()
        .map(|l| serde_json::from_slice(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// A minimal HTTP/1.1 client: one request per connection. Returns the
/// status and the body.
pub fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let text = post_raw(port, path, headers, body);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

/// [`post`], returning the whole response as text (status line, headers,
/// body).
pub fn post_raw(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> String {
    let mut s = connect(port);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).into_owned()
}

/// Waits (up to [`LONG`]) until metric `name` with `labels` reaches `want`
/// (at least `want` when `at_least`, else exactly).
pub fn wait_metric(agent: &Agent, name: &str, labels: &[(&str, &str)], want: f64, at_least: bool) {
    wait_for(LONG, &format!("{name} {labels:?} = {want}"), || {
        let n = agent.metric_or_zero(name, labels);
        if n == want || (at_least && n >= want) {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    });
}

/// Labels of the error counter `error_type` of source `id` in `pipeline`.
pub fn source_error<'a>(
    pipeline: &'a str,
    id: &'a str,
    error_type: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut l = component(pipeline, "source", id);
    l.push(("error_type", error_type));
    l
}

/// Writes pipeline `name`: one `syslog` source on TCP 127.0.0.1:`port`
/// with `extra` keys (YAML lines indented by four spaces) into an ndjson
/// file sink at `out`.
pub fn syslog_to_ndjson(dir: &Path, name: &str, port: u16, extra: &str, out: &Path) -> PathBuf {
    write_config(
        dir,
        name,
        &format!(
            "sources:\n  - type: syslog\n    address: 127.0.0.1:{port}\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            out.display()
        ),
    )
}

/// Waits (up to [`LONG`]) for `child` to exit; its status.
pub fn wait_child(child: &mut Child, what: &str) -> ExitStatus {
    wait_for(LONG, &format!("{what} exited"), || match child.try_wait() {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err("still running".to_string()),
        Err(e) => Err(e.to_string()),
    })
}

/// A process's resident memory from `/proc/<pid>/status`, in bytes:
/// `VmRSS` now, or `VmHWM` (its peak) with `peak`.
pub fn proc_rss(pid: u32, peak: bool) -> u64 {
    let key = if peak { "VmHWM:" } else { "VmRSS:" };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
