//! The `s3` sink writing into a real Versity S3 gateway (versitygw v1.8.0,
//! built by scripts/versitygw.sh) over a POSIX directory: every line in
//! exactly one object (gzip and zstd), objects closed by size and by time,
//! multipart uploads for big objects, no line in two objects after three
//! `kill -9`, nothing lost while the store is down for 30 s, and wrong
//! keys holding the data (403) until a reload fixes them.

mod common;
mod server;
mod versitygw;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use versitygw::{Object, Versity};

/// `n` lines from number `from`, each unique.
fn numbered(from: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 48);
    for i in from..from + n {
        out.extend_from_slice(format!("line-{i:08} petrel archives this line to s3\n").as_bytes());
    }
    out
}

/// The file source reading `log` into an s3 sink with `sink` keys.
fn pipeline(log: &Path, sink: &str) -> String {
    format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: s3\n{sink}",
        log.display()
    )
}

/// An object's lines, decompressed by its extension.
fn object_lines(vg: &Versity, key: &str) -> Vec<String> {
    vg.object_lines(key)
}

/// The objects under `prefix` and, for each line, the objects holding it.
fn lines_by_object(vg: &Versity, prefix: &str) -> (Vec<Object>, HashMap<String, Vec<String>>) {
    let objects: Vec<Object> = vg
        .list()
        .into_iter()
        .filter(|o| o.key.starts_with(prefix))
        .collect();
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for o in &objects {
        for l in object_lines(vg, &o.key) {
            seen.entry(l).or_default().push(o.key.clone());
        }
    }
    (objects, seen)
}

/// Every line of `expected` is in exactly one object under `prefix`, and
/// nothing else is; returns the objects.
fn assert_exactly_once(vg: &Versity, prefix: &str, expected: &[u8]) -> Vec<Object> {
    let (objects, seen) = lines_by_object(vg, prefix);
    let want: Vec<&str> = std::str::from_utf8(expected)
        .expect("utf-8")
        .lines()
        .collect();
    let missing: Vec<&&str> = want
        .iter()
        .filter(|l| !seen.contains_key(**l))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "lines in no object under {prefix}, e.g. {missing:?}"
    );
    let twice: Vec<(&String, &Vec<String>)> =
        seen.iter().filter(|(_, o)| o.len() > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "lines in two objects under {prefix}, e.g. {twice:?}"
    );
    assert_eq!(
        seen.len(),
        want.len(),
        "objects under {prefix} hold lines never written"
    );
    objects
}

fn wait_committed(data: &Path, log: &Path) {
    let size = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    wait_for(
        Duration::from_secs(180),
        "every line committed",
        || match checkpoint_offset(data, log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
}

fn wait_objects(vg: &Versity, prefix: &str, n: usize) {
    wait_for(Duration::from_secs(120), "objects in the bucket", || {
        let c = vg
            .list()
            .iter()
            .filter(|o| o.key.starts_with(prefix))
            .count();
        if c >= n {
            Ok(())
        } else {
            Err(format!("{c} objects under {prefix}"))
        }
    });
}

fn sink_metric(agent: &Agent, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l = vec![("component_type", "s3")];
    l.extend_from_slice(labels);
    agent.metric_or_zero(name, &l)
}

#[test]
fn every_line_in_one_object_gzip_by_size_and_zstd_by_time() {
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    let first = numbered(0, 20_000);
    append(&log, &first);
    // Two sinks over the same lines: gzip objects closed at 64 KiB of
    // lines, zstd objects closed 1 s after they opened.
    let cfg = write_config(
        dir.path(),
        "s3",
        &format!(
            "{}{}    key_prefix: \"gz/\"\n    batch: {{ max_bytes: 65536, timeout_ms: 60000 }}\n  - type: s3\n    id: zstd\n{}    compression: zstd\n    key_prefix: \"zst/date=%F/\"\n    batch: {{ timeout_ms: 1000 }}\n",
            pipeline(&log, ""),
            vg.sink_keys(),
            vg.sink_keys(),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    // A second burst after the first object closed by time is in another
    // object.
    let second = numbered(20_000, 5_000);
    append(&log, &second);
    wait_committed(&data, &log);
    let mut all = first.clone();
    all.extend_from_slice(&second);
    let gz = assert_exactly_once(&vg, "gz/", &all);
    // 25,000 lines of 45 bytes are 1.1 MB; an object closes at the first
    // batch that brings it to 64 KiB (objects hold whole batches, of up to
    // a read of the file source), long before its 60 s.
    assert!(gz.len() >= 4, "closed by size: {} objects", gz.len());
    assert!(gz.iter().all(|o| o.key.ends_with(".log.gz")), "{gz:?}");
    let zst = assert_exactly_once(&vg, "zst/", &all);
    assert!(zst.len() >= 2, "closed by time: {zst:?}");
    for o in &zst {
        let name = o.key.strip_prefix("zst/date=").expect("prefix");
        let (date, file) = name.split_once('/').expect("a date then a file name");
        assert_eq!(date.len(), 10, "%F: {}", o.key);
        assert!(date.chars().filter(|c| *c == '-').count() == 2, "{}", o.key);
        let (secs, rest) = file.split_once('-').expect("time-id");
        assert!(secs.parse::<u64>().is_ok(), "%s: {}", o.key);
        assert_eq!(rest.len(), 22 + ".log.zst".len(), "{}", o.key);
    }
    assert_eq!(
        sink_metric(
            &agent,
            "petrel_component_sent_events_total",
            &[("component_id", "zstd")]
        ),
        25_000.0
    );
}

#[test]
fn a_big_object_is_uploaded_in_parts() {
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    // 13 MB of lines in one object: parts of 5 MiB as it grows.
    let lines = numbered(0, 290_000);
    append(&log, &lines);
    let cfg = write_config(
        dir.path(),
        "s3",
        &pipeline(
            &log,
            &format!(
                "{}    compression: none\n    key_prefix: \"big/\"\n    batch: {{ max_bytes: 64MiB, timeout_ms: 5000 }}\n",
                vg.sink_keys()
            ),
        ),
    );
    let _agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    let objects = assert_exactly_once(&vg, "big/", &lines);
    let big: Vec<&Object> = objects.iter().filter(|o| o.size > 5 << 20).collect();
    assert!(!big.is_empty(), "no object over one part: {objects:?}");
    for o in big {
        let parts = o
            .etag
            .rsplit_once('-')
            .and_then(|(_, n)| n.parse::<u32>().ok());
        assert!(
            parts.is_some_and(|n| n as u64 >= o.size / (5 << 20)),
            "{} of {} bytes has the ETag `{}`, not a multipart upload's",
            o.key,
            o.size,
            o.etag
        );
    }
}

#[test]
fn kill_9_three_times_while_uploading_leaves_every_line_in_one_object() {
    const N: usize = 600_000;
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    let lines = numbered(0, N);
    append(&log, &lines);
    // Small objects (32 KiB of lines, so one batch each), so that each
    // kill lands between many of them, some complete and not yet
    // committed, and in the middle of others.
    let cfg = write_config(
        dir.path(),
        "s3",
        &pipeline(
            &log,
            &format!(
                "{}    key_prefix: \"k/\"\n    batch: {{ max_bytes: 32768, timeout_ms: 2000 }}\n",
                vg.sink_keys()
            ),
        ),
    );
    let mut skipped = 0.0;
    for (round, at) in [10usize, 40, 80].into_iter().enumerate() {
        let mut agent = Agent::start(&cfg, &data);
        wait_objects(&vg, "k/", at);
        skipped += sink_metric(&agent, "petrel_component_duplicates_skipped_total", &[]);
        agent.kill9();
        eprintln!(
            "kill -9 #{} at {} objects, checkpoint {:?}",
            round + 1,
            vg.list().len(),
            checkpoint_offset(&data, &log)
        );
    }
    let agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    skipped += sink_metric(&agent, "petrel_component_duplicates_skipped_total", &[]);
    assert_exactly_once(&vg, "k/", &lines);
    eprintln!("lines read again and found complete in the store: {skipped}");
    let journal = std::fs::read_dir(data.join("s3"))
        .expect("the record of objects")
        .count();
    assert_eq!(journal, 1, "one record file for the one sink");
}

#[test]
fn the_store_down_for_30_s_loses_nothing() {
    let mut vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    let first = numbered(0, 50_000);
    append(&log, &first);
    let cfg = write_config(
        dir.path(),
        "s3",
        &pipeline(
            &log,
            &format!(
                "{}    key_prefix: \"down/\"\n    batch: {{ max_bytes: 262144, timeout_ms: 1000 }}\n    timeout_ms: 2000\n",
                vg.sink_keys()
            ),
        ),
    );
    let agent = Agent::start(&cfg, &data);
    wait_objects(&vg, "down/", 2);
    vg.stop();
    let second = numbered(50_000, 50_000);
    append(&log, &second);
    std::thread::sleep(Duration::from_secs(30));
    let committed = checkpoint_offset(&data, &log).unwrap_or(0);
    assert!(
        committed < std::fs::metadata(&log).expect("log").len(),
        "lines written while the store was down cannot be committed"
    );
    vg.restart();
    wait_committed(&data, &log);
    let mut all = first;
    all.extend_from_slice(&second);
    assert_exactly_once(&vg, "down/", &all);
    assert!(
        sink_metric(&agent, "petrel_component_retried_events_total", &[]) > 0.0,
        "calls to the stopped store were retried"
    );
}

#[test]
fn wrong_keys_hold_the_data_loudly_until_a_reload_fixes_them() {
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    let lines = numbered(0, 10_000);
    append(&log, &lines);
    let good = vg.sink_keys();
    let bad = good.replace(versitygw::SECRET_KEY, "not-the-secret");
    let sink = |keys: &str| {
        pipeline(
            &log,
            &format!("{keys}    key_prefix: \"auth/\"\n    batch: {{ timeout_ms: 500 }}\n"),
        )
    };
    let cfg = write_config(dir.path(), "s3", &sink(&bad));
    let agent = Agent::start(&cfg, &data);
    wait_for(Duration::from_secs(60), "a loud 403", || {
        let err = agent.stderr();
        match err
            .lines()
            .find(|l| l.contains("403") && l.contains("ERROR"))
        {
            Some(l) if l.contains("bucket logs") && l.contains("key auth/") => Ok(()),
            Some(l) => Err(format!("the error does not name the bucket and key: {l}")),
            None => Err("no error yet".into()),
        }
    });
    assert!(
        sink_metric(
            &agent,
            "petrel_component_errors_total",
            &[("error_type", "forbidden")]
        ) >= 1.0
    );
    assert_eq!(
        checkpoint_offset(&data, &log).unwrap_or(0),
        0,
        "nothing committed"
    );
    assert_eq!(
        sink_metric(&agent, "petrel_component_sent_events_total", &[]),
        0.0
    );
    assert!(vg.list().is_empty(), "nothing stored with wrong keys");
    // The operator fixes the keys.
    write_config(dir.path(), "s3", &sink(&good));
    let (status, body) = agent.http("POST", "/reload").expect("POST /reload");
    assert_eq!(status, 200, "reload: {body}");
    wait_committed(&data, &log);
    assert_exactly_once(&vg, "auth/", &lines);
}

/// Objects in `ndjson` hold what the sink's output selects: fields a
/// processor removed are absent, a renamed one is there under its new
/// name, `except_fields` leaves out what it names, and `nested` writes
/// the metadata as objects.
#[test]
fn ndjson_objects_without_removed_or_excluded_fields() {
    let vg = Versity::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let data = dir.path().join("data");
    append(&log, &numbered(0, 100));
    let cfg = pipeline(&log, &vg.sink_keys()).replace(
        "sinks:\n",
        "processors:\n  - type: fields\n    remove: [host]\n    rename: { message: line }\n    add: { tmp: x, env: prod }\nsinks:\n",
    ) + "    key_prefix: \"nd/\"\n    encoding: ndjson\n    metadata: { layout: nested }\n    except_fields: [tmp]\n    batch: { timeout_ms: 500 }\n";
    let cfg = write_config(dir.path(), "s3nd", &cfg);
    let _agent = Agent::start(&cfg, &data);
    wait_committed(&data, &log);
    let mut got = Vec::new();
    for o in vg.list().into_iter().filter(|o| o.key.starts_with("nd/")) {
        for l in object_lines(&vg, &o.key) {
            got.push(serde_json::from_str::<serde_json::Value>(&l).expect("ndjson"));
        }
    }
    assert_eq!(got.len(), 100);
    let file = log.display().to_string();
    for (i, v) in got.iter().enumerate() {
        let want = serde_json::json!({
            "file": file,
            "line": format!("line-{i:08} petrel archives this line to s3"),
            "env": "prod",
        });
        assert!(got.contains(&want) || v == &want, "{v}");
    }
    for v in &got {
        assert!(
            v.get("host").is_none() && v.get("tmp").is_none() && v.get("message").is_none(),
            "{v}"
        );
    }
}
