//! Sinks that never hold each other back: `buffer: {type: disk}` on a
//! sink. A real OpenSearch node (scripts/opensearch.sh) is stopped while
//! the file sink of the same pipeline keeps receiving; the agent is killed
//! with `kill -9` while the buffer holds data; OpenSearch then catches up
//! with nothing missing and nothing twice. A full buffer blocks or drops
//! (counted) as configured.

mod common;
mod opensearch;
mod server;
mod versitygw;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use opensearch::OpenSearch;
use versitygw::Versity;

/// How many times each line is in the objects of the bucket.
fn s3_line_counts(vg: &Versity) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashMap::new();
    for o in vg.list() {
        for l in vg.object_lines(&o.key) {
            *seen.entry(l).or_insert(0) += 1;
        }
    }
    seen
}

/// `n` numbered lines `line-0000000 petrel ...` from `from`.
fn numbered(from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 40);
    for i in from..from + n {
        out.extend_from_slice(format!("line-{i:07} petrel buffered sink\n").as_bytes());
    }
    out
}

fn buffer_metric(agent: &Agent, name: &str, sink: &str) -> f64 {
    agent.metric_or_zero(name, &[("component_kind", "sink"), ("component_id", sink)])
}

/// Waits until `path` has at least `n` lines.
fn wait_file_lines(path: &Path, n: usize, what: &str) {
    wait_for(Duration::from_secs(120), what, || {
        let c = count_lines(path);
        if c >= n {
            Ok(())
        } else {
            Err(format!("{c} of {n} lines"))
        }
    });
}

#[test]
fn a_stopped_store_holds_back_no_other_sink_and_catches_up_after_kill_9_without_loss_or_duplicates()
{
    const FIRST: usize = 20_000;
    // About 11 MB while the store is down: more than the memory limit, so
    // only the disk buffer can let the file sink and the source go on.
    const WHILE_DOWN: usize = 300_000;
    const LIMIT: u64 = 4 << 20;
    let mut os = OpenSearch::start(&[]);
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let out = dir.path().join("out.ndjson");
    append(&log, &numbered(0, FIRST));
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "both",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: file\n    id: archive\n    path: {}\n    encoding: ndjson\n  - type: elasticsearch\n    component_id: store\n    endpoints: [\"{}\"]\n    index: buffered\n    batch: {{ max_events: 1000, timeout_ms: 200 }}\n    buffer: {{ type: disk, max_size: 256MiB, when_full: block }}\n  - type: s3\n    id: archive_s3\n{}    encoding: text\n    key_prefix: \"all/\"\n    batch: {{ timeout_ms: 1000 }}\n",
            log.display(),
            out.display(),
            os.url(),
            vg.sink_keys()
        ),
    );
    let opts = || AgentOptions {
        args: vec!["--memory-limit".into(), LIMIT.to_string()],
        ..Default::default()
    };
    let mut agent = Agent::start_with(&cfg, &data, opts());
    wait_for(Duration::from_secs(120), "the first part indexed", || {
        let c = os.count("buffered");
        if c >= FIRST as u64 / 2 {
            Ok(())
        } else {
            Err(format!("{c} documents"))
        }
    });
    os.stop();
    append(&log, &numbered(FIRST, WHILE_DOWN));
    let total = FIRST + WHILE_DOWN;
    // The file sink gets everything while the store is down, and the
    // source commits the whole file: nothing waits for the stopped sink.
    wait_file_lines(
        &out,
        total,
        "the file sink has every line while OpenSearch is down",
    );
    let size = std::fs::metadata(&log).unwrap().len();
    wait_for(
        Duration::from_secs(60),
        "the whole file committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    // The s3 archive too, before OpenSearch comes back.
    wait_for(
        Duration::from_secs(120),
        "the s3 sink has every line while OpenSearch is down",
        || {
            let n = s3_line_counts(&vg).len();
            if n >= total {
                Ok(())
            } else {
                Err(format!("{n} of {total} distinct lines in objects"))
            }
        },
    );
    let held = buffer_metric(&agent, "petrel_component_buffer_bytes", "store");
    assert!(
        held > 1e6,
        "the disk buffer holds what OpenSearch has not taken: {held} bytes"
    );
    assert!(
        buffer_metric(&agent, "petrel_component_buffer_events", "store") > 0.0,
        "events in the buffer are shown"
    );
    assert_eq!(
        buffer_metric(&agent, "petrel_component_buffer_max_bytes", "store"),
        (256u64 << 20) as f64
    );
    // Killed while the buffer holds data: it must survive on disk.
    agent.kill9();
    let mut agent = Agent::start_with(&cfg, &data, opts());
    os.restart();
    wait_for(Duration::from_secs(180), "OpenSearch caught up", || {
        let c = os.count("buffered");
        if c >= total as u64 {
            Ok(())
        } else {
            Err(format!("{c} of {total} documents"))
        }
    });
    wait_for(Duration::from_secs(60), "the buffer emptied", || {
        let b = buffer_metric(&agent, "petrel_component_buffer_bytes", "store");
        if b == 0.0 {
            Ok(())
        } else {
            Err(format!("{b} bytes still buffered"))
        }
    });
    assert_eq!(
        os.count("buffered"),
        total as u64,
        "documents in OpenSearch"
    );
    let dups = os.repeated("buffered", "message.keyword");
    assert!(dups.is_empty(), "messages indexed twice: {dups:?}");
    // The file sink has every line (at least once: the restart may have
    // re-read the tail that was not yet committed).
    let lines = read_lines(&out);
    let mut seen = std::collections::HashSet::new();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson");
        seen.insert(v["message"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), total, "distinct lines in the file sink");
    // The archive kept its promise across the kill: each line in one object.
    let counts = s3_line_counts(&vg);
    assert_eq!(counts.len(), total, "distinct lines in the s3 objects");
    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).take(5).collect();
    assert!(twice.is_empty(), "lines in two objects: {twice:?}");
    agent.stop();
}

/// Pipeline `name`: a file source into a file sink and an http sink with
/// the disk buffer `buffer`, whose server holds every request until
/// released.
/// `source_extra`: more lines of the source (e.g. a small read block, so
/// that the buffer holds many small records).
fn held_http_pipeline(
    dir: &Path,
    name: &str,
    addr: std::net::SocketAddr,
    source_extra: &str,
    buffer: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let log = dir.join("app.log");
    let out = dir.join("out.ndjson");
    std::fs::write(&log, b"").unwrap();
    let cfg = write_config(
        dir,
        name,
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n{source_extra}sinks:\n  - type: file\n    id: archive\n    path: {}\n    encoding: ndjson\n  - type: http\n    id: slow\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n    batch: {{ max_events: 500, timeout_ms: 100 }}\n    buffer: {buffer}\n",
            log.display(),
            out.display()
        ),
    );
    (cfg, log, out)
}

/// A small disk buffer (2 MiB) that does `when_full` when full.
fn stalled_pipeline(
    dir: &Path,
    when_full: &str,
    addr: std::net::SocketAddr,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    held_http_pipeline(
        dir,
        "stalled",
        addr,
        "",
        &format!("{{ type: disk, max_size: 2MiB, when_full: {when_full} }}"),
    )
}

#[test]
fn a_full_buffer_that_drops_newest_counts_what_it_dropped_and_holds_back_nothing() {
    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let dir = tempdir();
    let (cfg, log, out) = stalled_pipeline(dir.path(), "drop_newest", addr);
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    // 200,000 lines of about 40 bytes, 8 MB: four times the buffer.
    const N: usize = 200_000;
    append(&log, &numbered(0, N));
    wait_file_lines(&out, N, "the file sink has every line");
    let dropped = agent.metric_or_zero(
        "petrel_component_discarded_events_total",
        &[("component_id", "slow"), ("reason", "buffer_full")],
    );
    assert!(dropped > 0.0, "a full buffer drops and counts");
    server.released.store(true, Ordering::SeqCst);
    // What was buffered arrives; with what was dropped, that is all.
    wait_for(
        Duration::from_secs(60),
        "delivered + dropped = written",
        || {
            let got = server.lines() as f64;
            let dropped = agent.metric_or_zero(
                "petrel_component_discarded_events_total",
                &[("component_id", "slow"), ("reason", "buffer_full")],
            );
            if got + dropped == N as f64 {
                Ok(())
            } else {
                Err(format!("{got} delivered + {dropped} dropped of {N}"))
            }
        },
    );
}

#[test]
fn a_full_buffer_that_blocks_holds_the_source_and_delivers_everything_once_released() {
    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let dir = tempdir();
    let data = dir.path().join("data");
    let (cfg, log, out) = stalled_pipeline(dir.path(), "block", addr);
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec!["--memory-limit".into(), (4u64 << 20).to_string()],
            ..Default::default()
        },
    );
    const N: usize = 200_000;
    append(&log, &numbered(0, N));
    // The buffer fills (2 MiB), then the memory budget: the source stops
    // short of the end of the file and the file sink with it.
    wait_for(
        Duration::from_secs(60),
        "the buffer nearly full in /health",
        || {
            let b = buffer_metric(&agent, "petrel_component_buffer_bytes", "slow");
            match agent.http_get("/health") {
                Ok((_, body)) if body.contains("degraded") && body.contains("disk buffer") => {
                    Ok(())
                }
                other => Err(format!("{b} bytes buffered; /health: {other:?}")),
            }
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    let size = std::fs::metadata(&log).unwrap().len();
    let committed = checkpoint_offset(&data, &log).unwrap_or(0);
    assert!(
        committed < size,
        "the source is held: {committed} of {size} committed"
    );
    assert!(count_lines(&out) < N, "the file sink waits with the source");
    server.released.store(true, Ordering::SeqCst);
    wait_file_lines(&out, N, "the file sink has every line once released");
    wait_for(
        Duration::from_secs(60),
        "the http sink has every line",
        || {
            let got = server.lines();
            if got >= N {
                Ok(())
            } else {
                Err(format!("{got} of {N}"))
            }
        },
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &[("component_id", "slow")],
        ),
        0.0,
        "nothing dropped when blocking"
    );
}

#[test]
fn buffer_mistakes_are_reported_at_the_key() {
    let dir = tempdir();
    let cases = [
        (
            "buffer: { type: disk, when_full: drop_oldest }",
            "when_full",
            "drop_newest",
        ),
        (
            "buffer: { type: disk, max_size: 1000 }",
            "max_size",
            "at least",
        ),
        ("buffer: { type: tape }", "type", "`disk`"),
        (
            "buffer: { type: memory, max_size: 1GiB }",
            "max_size",
            "memory-limit",
        ),
        ("buffer: disk", "buffer", "must be a map"),
    ];
    for (i, (buffer, key, hint)) in cases.iter().enumerate() {
        let cfg = write_config(
            dir.path(),
            &format!("b{i}"),
            &format!("sources:\n  - type: stdin\nsinks:\n  - type: stdout\n    {buffer}\n"),
        );
        assert!(cfg.exists());
        let name = format!("b{i}.yaml");
        let (code, out, err) = run_to_end(dir.path(), &["validate", "--config", &name]);
        let text = format!("{out}{err}");
        assert_ne!(code, Some(0), "{buffer} must be refused: {text}");
        assert!(
            text.contains(&format!("b{i}.yaml:5:")) && text.contains(key) && text.contains(hint),
            "{buffer}: error at line 5 naming `{key}` and saying `{hint}`: {text}"
        );
    }
}

#[test]
fn a_full_disk_under_a_disk_buffer_acknowledges_nothing_and_is_unhealthy_until_it_has_room() {
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _fs = Tmpfs::mount(&data, "16m");
    append(&log, &numbered(0, 10));
    let cfg = write_config(
        dir.path(),
        "fulldisk",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n    buffer: {{ type: disk, max_size: 64MiB }}\n",
            log.display(),
            out.display()
        ),
    );
    let mut agent = Agent::start(&cfg, &data);
    wait_file_lines(&out, 10, "the first lines through the buffer");
    let first = std::fs::metadata(&log).unwrap().len();
    wait_for(
        Duration::from_secs(30),
        "the first lines committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == first => Ok(()),
            other => Err(format!("{other:?} of {first}")),
        },
    );
    let committed_before = Some(first);
    // Fill the file system that holds the buffer (and the checkpoints).
    let filler = fill_disk(&data);
    const N: usize = 50_000;
    append(&log, &numbered(10, N));
    wait_for(
        Duration::from_secs(60),
        "/health unhealthy naming the buffer",
        || {
            let (code, body) = agent.http_get("/health").map_err(|e| e.to_string())?;
            (code == 503 && body.contains("cannot write the disk buffer"))
                .then_some(())
                .ok_or(format!("{code} {body}"))
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    // Nothing that is not durable was acknowledged: the source did not
    // commit past what was written before the disk filled, and the sink
    // got nothing it could not have been given from the buffer.
    assert_eq!(
        checkpoint_offset(&data, &log),
        committed_before,
        "no commit while the buffer cannot be written"
    );
    assert!(
        count_lines(&out) < 10 + N,
        "the sink cannot have everything yet"
    );
    // Room again: everything arrives and the agent is healthy again.
    std::fs::remove_file(&filler).unwrap();
    wait_file_lines(&out, 10 + N, "every line once the disk has room");
    wait_for(Duration::from_secs(60), "/health ok", || {
        let (code, body) = agent.http_get("/health").map_err(|e| e.to_string())?;
        (code == 200).then_some(()).ok_or(format!("{code} {body}"))
    });
    agent.stop();
}

/// The segment files of a sink's disk buffer, largest first.
fn buffer_segments(data: &Path, pipeline: &str, sink: &str) -> Vec<std::path::PathBuf> {
    let dir = data.join("buffers").join(pipeline).join(sink);
    let mut segs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).map_or(0, |m| m.len())));
    segs
}

/// The `message` of each distinct line the stalled server took.
fn delivered(server: &Stalled) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashMap::new();
    for b in server.bodies.lock().unwrap().iter() {
        for l in b.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson from the sink");
            let m = v["message"].as_str().unwrap_or_default().to_string();
            *seen.entry(m).or_insert(0) += 1;
        }
    }
    seen
}

/// The source read in small blocks (so the buffer holds many records, a
/// few hundred lines each).
fn small_records_pipeline(
    dir: &Path,
    addr: std::net::SocketAddr,
    buffer: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    held_http_pipeline(dir, "small", addr, "    read_block_bytes: 16KiB\n", buffer)
}

/// A pipeline whose http sink's server held every request while its disk
/// buffer took `n` lines (durably: the file sink has them and the source
/// committed the whole file), and whose agent was then killed (-9).
struct HeldBuffer {
    server: Arc<Stalled>,
    dir: tempfile::TempDir,
    data: std::path::PathBuf,
    cfg: std::path::PathBuf,
}

fn held_buffer(n: usize) -> HeldBuffer {
    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let dir = tempdir();
    let data = dir.path().join("data");
    let (cfg, log, out) =
        small_records_pipeline(dir.path(), addr, "{ type: disk, max_size: 64MiB }");
    let mut agent = Agent::start(&cfg, &data);
    append(&log, &numbered(0, n));
    wait_file_lines(&out, n, "the file sink has every line");
    let size = std::fs::metadata(&log).unwrap().len();
    wait_for(
        Duration::from_secs(60),
        "the whole file committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    assert!(buffer_metric(&agent, "petrel_component_buffer_events", "slow") > 0.0);
    agent.kill9();
    HeldBuffer {
        server,
        dir,
        data,
        cfg,
    }
}

#[test]
fn damage_in_a_buffer_segment_is_logged_counted_and_reported_and_what_follows_is_delivered() {
    const N: usize = 20_000;
    let HeldBuffer {
        server,
        dir: _dir,
        data,
        cfg,
    } = held_buffer(N);
    // 64 bytes flipped in the middle of the segment, 3,000 cut from its end.
    let seg = buffer_segments(&data, "small", "slow")
        .into_iter()
        .next()
        .expect("a buffer segment");
    let mut bytes = std::fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    bytes.truncate(bytes.len() - 3000);
    std::fs::write(&seg, &bytes).unwrap();
    server.released.store(true, Ordering::SeqCst);
    let agent = Agent::start(&cfg, &data);
    wait_for(
        Duration::from_secs(60),
        "the damaged buffer read to its end",
        || {
            let damaged = buffer_metric(
                &agent,
                "petrel_component_buffer_damaged_records_total",
                "slow",
            );
            let left = buffer_metric(&agent, "petrel_component_buffer_events", "slow");
            if damaged >= 2.0 && left == 0.0 {
                Ok(())
            } else {
                Err(format!("{damaged} damaged places, {left} events left"))
            }
        },
    );
    // Never silent: counted, logged with the file and offset, in /health.
    assert!(
        buffer_metric(
            &agent,
            "petrel_component_buffer_damaged_bytes_total",
            "slow"
        ) > 64.0
    );
    let log_text = agent.stderr();
    let name = seg.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        log_text.contains("disk buffer damage")
            && log_text.contains(&name)
            && log_text.contains("offset"),
        "the damage is logged with its file and offset: {log_text}"
    );
    let (_, health) = agent.http_get("/health").unwrap();
    assert!(health.contains("damage in its disk buffer"), "{health}");
    // What is not in the damaged records is delivered: two records of a
    // few hundred lines at most are lost, never the segment.
    let got = delivered(&server);
    let lost = N - got.len();
    assert!(lost > 0, "the damage lost something, or it was not damage");
    assert!(
        lost <= 1_500,
        "{lost} of {N} lines lost: more than the damaged records"
    );
    assert!(
        got.keys().all(|m| m.starts_with("line-")),
        "garbage delivered"
    );
    assert_eq!(got[&format!("line-{:07} petrel buffered sink", N / 4)], 1);
}

#[test]
fn a_damaged_buffer_state_file_never_stops_the_agent_and_never_skips_data() {
    const N: usize = 20_000;
    let HeldBuffer {
        server,
        dir: _dir,
        data,
        cfg,
    } = held_buffer(N);
    let state = data.join("buffers/small/slow/reader.state");
    // Garbage: the agent starts, says so, and reads the buffer again.
    let junk: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&state, &junk).unwrap();
    let mut agent = Agent::start(&cfg, &data);
    wait_for(
        Duration::from_secs(30),
        "the damaged state reported",
        || {
            let t = agent.stderr();
            t.contains("reader.state").then_some(()).ok_or(t)
        },
    );
    assert!(buffer_metric(&agent, "petrel_component_buffer_events", "slow") as usize >= N / 2);
    agent.kill9();
    // A read position past the end of the segment: read again, not skipped.
    let seg = buffer_segments(&data, "small", "slow")
        .into_iter()
        .next()
        .unwrap();
    let seq = seg.file_stem().unwrap().to_string_lossy().to_string();
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::write(&state, format!("{seq} {}\n", len + 4096)).unwrap();
    server.released.store(true, Ordering::SeqCst);
    let agent = Agent::start(&cfg, &data);
    wait_for(Duration::from_secs(60), "every line delivered", || {
        let n = delivered(&server).len();
        (n == N).then_some(()).ok_or(format!("{n} of {N}"))
    });
    assert!(
        agent.stderr().contains("past the segment's end"),
        "{}",
        agent.stderr()
    );
}

#[test]
fn a_batch_larger_than_the_buffer_is_written_never_dropped_under_block() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let log = dir.path().join("app.log");
    let out = dir.path().join("out.ndjson");
    // 16 MB of lines read in 8 MiB blocks: batches far over the 1 MiB
    // buffer.
    const N: usize = 400_000;
    append(&log, &numbered(0, N));
    let cfg = write_config(
        dir.path(),
        "big",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\n    read_block_bytes: 8MiB\nsinks:\n  - type: file\n    id: through\n    path: {}\n    encoding: ndjson\n    buffer: {{ type: disk, max_size: 1MiB, when_full: block }}\n",
            log.display(),
            out.display()
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec!["--memory-limit".into(), (64u64 << 20).to_string()],
            ..Default::default()
        },
    );
    wait_file_lines(&out, N, "every line through the small buffer");
    assert_eq!(count_lines(&out), N, "each line once");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &[("component_id", "through")],
        ),
        0.0,
        "nothing dropped under block"
    );
}

#[test]
fn a_disk_that_fills_and_frees_again_and_again_loses_nothing_a_buffer_acknowledged() {
    const N: usize = 180_000;
    let server = Arc::new(Stalled::default());
    let addr = serve_stalled(server.clone());
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _fs = Tmpfs::mount(&data, "8m");
    // The buffer may hold more than the disk: the disk is the limit.
    let (cfg, log, out) =
        small_records_pipeline(dir.path(), addr, "{ type: disk, max_size: 64MiB }");
    let mut agent = Agent::start(&cfg, &data);
    // The disk stays full but for 512 KiB freed every 3 s (then filled
    // again), while lines arrive and the http sink's server holds every
    // request.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flapper = {
        let stop = stop.clone();
        let data = data.clone();
        std::thread::spawn(move || flap_disk(&data, &stop))
    };
    for k in 0..12 {
        append(&log, &numbered(k * (N / 12), N / 12));
        std::thread::sleep(Duration::from_millis(1000));
    }
    stop.store(true, Ordering::SeqCst);
    let rounds = flapper.join().unwrap();
    assert!(rounds >= 3, "the disk flapped {rounds} times");
    // Killed with what the buffer acknowledged on disk, restarted with
    // room again and the server answering: every line arrives.
    let log_text = agent.stderr();
    assert!(
        log_text.contains("disk buffer") && log_text.contains("No space left"),
        "the disk refused the buffer's writes: {log_text}"
    );
    agent.kill9();
    server.released.store(true, Ordering::SeqCst);
    let agent = Agent::start(&cfg, &data);
    wait_file_lines(&out, N, "the file sink has every line");
    wait_for(
        Duration::from_secs(120),
        "the http sink has every line",
        || {
            let n = delivered(&server).len();
            (n == N)
                .then_some(())
                .ok_or(format!("{n} of {N} distinct lines"))
        },
    );
    let _ = agent;
}

/// The messages in the records of a sink's disk buffer that are after its
/// saved read position (what a restart reads again), from the files
/// themselves (the agent must not be running).
fn unread_in_buffer(dir: &Path) -> std::collections::HashSet<String> {
    let mut r = petrel_spool::Reader::open(dir).expect("open the buffer");
    let mut out = std::collections::HashSet::new();
    while let Some(c) = r.read(1 << 20).expect("read the buffer") {
        for rec in &c.records {
            let b = &c.buf[rec.clone()];
            // version, time, events, input bytes, record ends, attachment.
            let n = u32::from_le_bytes(b[25..29].try_into().unwrap()) as usize;
            let at = 29 + 4 * n;
            let alen = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            for l in b[at + 4 + alen..]
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
            {
                let v: serde_json::Value = serde_json::from_slice(l).expect("ndjson record");
                out.insert(v["message"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    out
}

#[test]
fn a_kill_9_while_draining_resends_only_what_came_after_the_saved_read_position() {
    const N: usize = 200_000;
    let HeldBuffer {
        server,
        dir: _dir,
        data,
        cfg,
    } = held_buffer(N);
    server.released.store(true, Ordering::SeqCst);
    let mut agent = Agent::start(&cfg, &data);
    wait_for(
        Duration::from_secs(60),
        "half of the buffer drained",
        || {
            let n = server.lines();
            (n >= N / 2).then_some(()).ok_or(format!("{n} of {N}"))
        },
    );
    agent.kill9();
    let before = delivered(&server);
    let unread = unread_in_buffer(&data.join("buffers/small/slow"));
    let agent = Agent::start(&cfg, &data);
    wait_for(Duration::from_secs(120), "every line delivered", || {
        let n = delivered(&server).len();
        (n == N).then_some(()).ok_or(format!("{n} of {N}"))
    });
    let after = delivered(&server);
    let resent: Vec<&String> = after
        .iter()
        .filter(|(_, &c)| c > 1)
        .map(|(m, _)| m)
        .collect();
    // Delivered lines are committed one record at a time, the position
    // saved at most every 100 ms: what is sent again after the kill is
    // what was saved as unread, never a line before the saved position.
    let early: Vec<_> = resent
        .iter()
        .filter(|m| !unread.contains(**m))
        .take(5)
        .collect();
    assert!(
        early.is_empty(),
        "lines before the saved position sent again: {early:?}"
    );
    eprintln!(
        "kill -9 mid-drain: {} lines delivered before it, {} saved as unread, {} sent twice",
        before.len(),
        unread.len(),
        resent.len()
    );
    let _ = agent;
}
