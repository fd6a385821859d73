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

/// A pipeline with a file sink and an http sink whose server holds every
/// request: the http sink has a small disk buffer.
fn stalled_pipeline(
    dir: &Path,
    when_full: &str,
    addr: std::net::SocketAddr,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let log = dir.join("app.log");
    let out = dir.join("out.ndjson");
    std::fs::write(&log, b"").unwrap();
    let cfg = write_config(
        dir,
        "stalled",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: file\n    id: archive\n    path: {}\n    encoding: ndjson\n  - type: http\n    id: slow\n    url: http://{addr}/ingest\n    encoding: ndjson\n    timeout_ms: 600000\n    batch: {{ max_events: 500, timeout_ms: 100 }}\n    buffer: {{ type: disk, max_size: 2MiB, when_full: {when_full} }}\n",
            log.display(),
            out.display()
        ),
    );
    (cfg, log, out)
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
