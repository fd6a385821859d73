//! End-to-end tests of the file source: rotation, truncation, deletion,
//! many files, invalid UTF-8, over-long lines and partial lines, all through
//! the real binary and real files.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// A numbered line of about 100 bytes: `line-000123 <payload>`.
fn numbered(i: usize) -> String {
    format!("line-{i:06} {}\n", payload(i))
}

fn payload(i: usize) -> String {
    // Deterministic filler that differs per line, so that a line stitched
    // from two others cannot pass as valid.
    let mut s = String::with_capacity(88);
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while s.len() < 88 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push((b'a' + (x % 26) as u8) as char);
    }
    s
}

/// Parses a line produced by [`numbered`]; `None` when it is not one
/// (corrupt, torn or stitched).
fn parse_numbered(l: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(l).ok()?;
    let n: usize = s.strip_prefix("line-")?.get(..6)?.parse().ok()?;
    (format!("{s}\n") == numbered(n)).then_some(n)
}

/// Per number, how often it appears in `out`; and the lines that are not
/// valid numbered lines.
fn tally(out: &Path) -> (HashMap<usize, usize>, Vec<String>) {
    let mut seen = HashMap::new();
    let mut bad = Vec::new();
    for l in read_lines(out) {
        match parse_numbered(&l) {
            Some(n) => *seen.entry(n).or_insert(0) += 1,
            None => bad.push(String::from_utf8_lossy(&l).chars().take(120).collect()),
        }
    }
    (seen, bad)
}

fn files_open(agent: &Agent, pipeline: &str) -> f64 {
    agent.metric_or_zero("petrel_files_open", &[("pipeline", pipeline)])
}

/// Scenario 1: A writer appends numbered lines and rotates by renaming (the rotated
/// names do not match the include) while the agent runs; every line must
/// arrive.
#[test]
fn rename_rotation_under_load_loses_nothing() {
    const N: usize = 30_000;
    const ROTATE_EVERY: usize = 5_000;
    const BURST: usize = 50;
    /// Lines written through the old handle after its rename, as a process
    /// that has not reopened its log yet would.
    const AFTER_RENAME: usize = 100;

    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    File::create(&app).unwrap();
    let out = dir.path().join("out").join("out.log");
    let cfg = write_config(
        dir.path(),
        "rot",
        &simple_config(&app.to_string_lossy(), &out, ""),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(MEDIUM, "the agent to open app.log", || {
        match files_open(&agent, "rot") {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("files_open = {n}")),
        }
    });

    let writer_app = app.clone();
    let writer = std::thread::spawn(move || {
        let mut f = OpenOptions::new().append(true).open(&writer_app).unwrap();
        let mut rotations = 0;
        let mut i = 0;
        while i < N {
            if i > 0 && i % ROTATE_EVERY == 0 {
                rotations += 1;
                let rotated = writer_app.with_file_name(format!("app.log.{rotations}"));
                std::fs::rename(&writer_app, &rotated).unwrap();
                let mut burst = String::new();
                for _ in 0..AFTER_RENAME {
                    burst.push_str(&numbered(i));
                    i += 1;
                }
                f.write_all(burst.as_bytes()).unwrap();
                f = OpenOptions::new()
                    .create_new(true)
                    .append(true)
                    .open(&writer_app)
                    .unwrap();
            }
            let mut burst = String::new();
            let end = (i + BURST)
                .min(N)
                .min((i / ROTATE_EVERY + 1) * ROTATE_EVERY);
            while i < end {
                burst.push_str(&numbered(i));
                i += 1;
            }
            f.write_all(burst.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        rotations
    });
    let rotations = writer.join().expect("writer thread");
    assert!(rotations >= 5, "the writer rotated {rotations} times");

    let (seen, bad) = wait_for(LONG, "every numbered line in the output", || {
        let (seen, bad) = tally(&out);
        if seen.len() == N {
            Ok((seen, bad))
        } else {
            let missing: Vec<usize> = (0..N).filter(|n| !seen.contains_key(n)).take(10).collect();
            Err(format!(
                "{} of {N} distinct lines so far; first missing: {missing:?}",
                seen.len()
            ))
        }
    });
    let dups: usize = seen.values().map(|c| c - 1).sum();
    eprintln!("rename rotation: {N} lines, {rotations} rotations, {dups} duplicate(s)");
    assert!(
        bad.is_empty(),
        "corrupt or stitched lines in the output: {bad:?}"
    );
    assert!((0..N).all(|n| seen.contains_key(&n)));
    assert_eq!(
        dups, 0,
        "lines delivered more than once without any restart or failure"
    );
}

/// Scenario 2: copytruncate: the file is copied away and truncated in place, then
/// written again; the new lines must arrive, whether the new content is
/// shorter than the old offset (size check) or longer (fingerprint check).
#[test]
fn copytruncate_rereads_from_start() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    let mut expected: Vec<String> = (0..200)
        .map(|i| format!("old-{i:04} first generation\n"))
        .collect();
    append(&app, expected.concat().as_bytes());
    let cfg = write_config(
        dir.path(),
        "ct",
        &simple_config(&app.to_string_lossy(), &out, ""),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let wait_all = |expected: &Vec<String>, what: &str| {
        wait_for(LONG, what, || {
            let got = histogram(read_lines(&out));
            let missing: Vec<&String> = expected
                .iter()
                .filter(|l| !got.contains_key(l.trim_end().as_bytes()))
                .take(5)
                .collect();
            if missing.is_empty() {
                Ok(got)
            } else {
                Err(format!("missing e.g. {missing:?}"))
            }
        })
    };
    wait_all(&expected, "the first generation");

    // Round 1: shorter new content (size < offset).
    std::fs::copy(&app, dir.path().join("app.log.1")).unwrap();
    OpenOptions::new()
        .write(true)
        .open(&app)
        .unwrap()
        .set_len(0)
        .unwrap();
    let round1: Vec<String> = (0..20)
        .map(|i| format!("new-{i:04} second generation\n"))
        .collect();
    append(&app, round1.concat().as_bytes());
    expected.extend(round1);
    wait_all(&expected, "the lines written after the first truncation");

    // Round 2: truncate and at once write more than was there before, so
    // that only the changed first bytes reveal the rewrite.
    std::fs::copy(&app, dir.path().join("app.log.2")).unwrap();
    OpenOptions::new()
        .write(true)
        .open(&app)
        .unwrap()
        .set_len(0)
        .unwrap();
    let round2: Vec<String> = (0..400)
        .map(|i| format!("NEW-{i:04} third generation!!\n"))
        .collect();
    append(&app, round2.concat().as_bytes());
    expected.extend(round2);
    let got = wait_all(&expected, "the lines written after the second truncation");

    let known: std::collections::HashSet<&[u8]> =
        expected.iter().map(|l| l.trim_end().as_bytes()).collect();
    let unknown: Vec<String> = got
        .keys()
        .filter(|l| !known.contains(l.as_slice()))
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    assert!(
        unknown.is_empty(),
        "lines that were never written: {unknown:?}"
    );
    let truncations = wait_for(MEDIUM, "file_truncated >= 2", || {
        let n = agent.metric_or_zero(
            "petrel_component_errors_total",
            &[
                ("pipeline", "ct"),
                ("component_kind", "source"),
                ("error_type", "file_truncated"),
            ],
        );
        if n >= 2.0 {
            Ok(n)
        } else {
            Err(format!("file_truncated = {n}"))
        }
    });
    eprintln!("copytruncate: file_truncated = {truncations}");
}

/// Scenario 3: A file deleted while open is read to its end and closed, releasing
/// its descriptor.
#[test]
fn deleted_file_is_closed() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    let lines: String = (0..1000).map(numbered).collect();
    append(&app, lines.as_bytes());
    let cfg = write_config(
        dir.path(),
        "del",
        &simple_config(&format!("{}/*.log", dir.path().display()), &out, ""),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "all 1000 lines", || match count_lines(&out) {
        1000 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    wait_for(MEDIUM, "files_open = 1", || {
        let n = files_open(&agent, "del");
        if n == 1.0 {
            Ok(())
        } else {
            Err(format!("files_open = {n}"))
        }
    });
    let fds = fds_pointing_at(agent.pid(), &app);
    assert!(
        !fds.is_empty(),
        "the agent should hold {} open",
        app.display()
    );

    std::fs::remove_file(&app).unwrap();
    wait_for(MEDIUM, "files_open to drop to 0 after deletion", || {
        let n = files_open(&agent, "del");
        if n == 0.0 {
            Ok(())
        } else {
            Err(format!("files_open = {n}"))
        }
    });
    wait_for(
        MEDIUM,
        "the descriptor of the deleted file to be closed",
        || {
            let fds = fds_pointing_at(agent.pid(), &app);
            if fds.is_empty() {
                Ok(())
            } else {
                Err(format!("still open: {fds:?}"))
            }
        },
    );
    assert_eq!(count_lines(&out), 1000, "no line lost or repeated");
}

/// Scenario 4: 10,000 files in 100 nested directories, half present at start and
/// half created while running; every line arrives.
#[test]
fn ten_thousand_files_in_nested_dirs() {
    const DIRS: usize = 100;
    const FILES: usize = 100;
    let dir = tempdir();
    let root = dir.path().join("root");
    let out = dir.path().join("out").join("out.log");
    let mut expected = BTreeSet::new();
    let mut make_dir = |d: usize| {
        // Two levels: root/gNN/dNNN/fNNN.log.
        let sub = root
            .join(format!("g{:02}", d % 10))
            .join(format!("d{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..FILES {
            let mut body = String::new();
            for l in 0..1 + (d * FILES + f) % 3 {
                let line = format!("d{d:03}-f{f:03}-l{l}");
                body.push_str(&line);
                body.push('\n');
                expected.insert(line);
            }
            std::fs::write(sub.join(format!("f{f:03}.log")), body).unwrap();
        }
        // Not matched by the include.
        std::fs::write(sub.join("ignored.txt"), "not a log\n").unwrap();
    };
    for d in 0..DIRS / 2 {
        make_dir(d);
    }
    let cfg = write_config(
        dir.path(),
        "many",
        &simple_config(&format!("{}/**/*.log", root.display()), &out, ""),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    for d in DIRS / 2..DIRS {
        make_dir(d);
    }
    let total = expected.len();
    wait_for(LONG, "every line of 10,000 files", || {
        match count_lines(&out) {
            n if n >= total => Ok(()),
            n => Err(format!("{n} of {total} lines")),
        }
    });
    let got = histogram(read_lines(&out));
    let missing: Vec<&String> = expected
        .iter()
        .filter(|l| !got.contains_key(l.as_bytes()))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "missing lines, e.g. {missing:?}");
    let extra: Vec<String> = got
        .keys()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .filter(|l| !expected.contains(l))
        .take(10)
        .collect();
    assert!(extra.is_empty(), "unexpected lines: {extra:?}");
    let dups: usize = got.values().map(|c| c - 1).sum();
    assert_eq!(dups, 0, "lines delivered twice");
    wait_for(MEDIUM, "files_open = 10000", || {
        match files_open(&agent, "many") {
            n if n == (DIRS * FILES) as f64 => Ok(()),
            n => Err(format!("files_open = {n}")),
        }
    });
}

/// Scenario 8: Invalid UTF-8 passes byte-exact through `text` and is replaced (and
/// counted) by `ndjson`.
#[test]
fn invalid_utf8_text_exact_ndjson_replaced() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let text_out = dir.path().join("out.txt");
    let json_out = dir.path().join("out.ndjson");
    let input: &[u8] = b"ok-1\nbad-\xff\xfe-end\nok-2 caf\xc3\xa9\n";
    append(&app, input);
    let cfg = write_config(
        dir.path(),
        "utf",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            app.display(),
            text_out.display(),
            json_out.display()
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "3 lines in both outputs", || {
        match (count_lines(&text_out), count_lines(&json_out)) {
            (3, 3) => Ok(()),
            other => Err(format!("(text, ndjson) lines = {other:?}")),
        }
    });
    let text = std::fs::read(&text_out).unwrap();
    assert_eq!(
        text,
        input,
        "text output must be byte-exact: {:?}",
        String::from_utf8_lossy(&text)
    );

    let msgs: Vec<serde_json::Value> = read_lines(&json_out)
        .iter()
        .map(|l| serde_json::from_slice(l).expect("each ndjson line is valid JSON"))
        .collect();
    let messages: Vec<&str> = msgs
        .iter()
        .map(|v| v["message"].as_str().expect("message is a string"))
        .collect();
    assert!(messages.contains(&"ok-1"), "{messages:?}");
    assert!(messages.contains(&"ok-2 café"), "{messages:?}");
    let bad = messages
        .iter()
        .find(|m| m.starts_with("bad-"))
        .unwrap_or_else(|| panic!("no bad- line in {messages:?}"));
    let middle = bad
        .strip_prefix("bad-")
        .and_then(|m| m.strip_suffix("-end"))
        .unwrap_or_else(|| panic!("bad line mangled: {bad:?}"));
    assert!(
        !middle.is_empty() && middle.chars().all(|c| c == '\u{FFFD}'),
        "invalid bytes should become U+FFFD, got {bad:?}"
    );
    for v in &msgs {
        assert_eq!(v["file"].as_str(), Some(&*app.to_string_lossy()), "{v}");
    }
    let invalid = wait_for(MEDIUM, "invalid_utf8 >= 1 on the ndjson sink", || {
        let n = agent.metric_or_zero(
            "petrel_component_errors_total",
            &[
                ("pipeline", "utf"),
                ("component_kind", "sink"),
                ("component_id", "file_1"),
                ("error_type", "invalid_utf8"),
            ],
        );
        if n >= 1.0 {
            Ok(n)
        } else {
            Err(format!("invalid_utf8 = {n}"))
        }
    });
    eprintln!("invalid_utf8 on ndjson sink = {invalid}");
    let text_invalid = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[
            ("pipeline", "utf"),
            ("component_kind", "sink"),
            ("component_id", "file_0"),
            ("error_type", "invalid_utf8"),
        ],
    );
    assert_eq!(text_invalid, 0.0, "the text sink alters nothing");
}

/// Scenario 9: A 10 MiB line with the default max_line_bytes (1 MiB) is split into
/// 10 pieces that together are the line; the agent goes on.
#[test]
fn ten_mib_line_is_split_into_pieces() {
    const MIB: usize = 1 << 20;
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    let mut line = Vec::with_capacity(10 * MIB + 1);
    let mut x: u64 = 0x1234_5678_9abc_def1;
    while line.len() < 10 * MIB {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        line.push(b'A' + (x % 26) as u8);
    }
    let mut data = line.clone();
    data.push(b'\n');
    append(&app, &data);
    let cfg = write_config(
        dir.path(),
        "long",
        &simple_config(&app.to_string_lossy(), &out, ""),
    );
    // One processing thread: with several, batches of one file can reach
    // the sink out of order (see `per_file_order_is_preserved`), and the
    // pieces of this line go out in several batches.
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--threads".into(), "1".into()],
            ..Default::default()
        },
    );
    wait_for(LONG, "10 MiB of pieces in the output", || {
        let len = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) as usize;
        if len >= 10 * MIB + 10 {
            Ok(())
        } else {
            Err(format!("{len} bytes"))
        }
    });
    append(&app, b"after the long line\n");
    wait_for(LONG, "the normal line written after the long one", || {
        if read_lines(&out).iter().any(|l| l == b"after the long line") {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let lines = read_lines(&out);
    let pieces: Vec<&Vec<u8>> = lines
        .iter()
        .filter(|l| l.as_slice() != b"after the long line")
        .collect();
    let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
    assert_eq!(
        pieces.len(),
        10,
        "expected 10 pieces of at most 1 MiB, got lengths {lens:?}"
    );
    assert!(lens.iter().all(|&l| l <= MIB), "piece lengths {lens:?}");
    let in_order: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
    if in_order != line {
        // Tell reordering apart from corruption.
        let mut at: Vec<usize> = pieces
            .iter()
            .map(|p| {
                (0..10)
                    .find(|k| line[k * MIB..((k + 1) * MIB).min(line.len())] == p[..])
                    .unwrap_or(usize::MAX)
            })
            .collect();
        let arrived = at.clone();
        at.sort_unstable();
        assert_eq!(
            at,
            (0..10).collect::<Vec<_>>(),
            "the pieces are not the line's 1 MiB chunks (arrival order {arrived:?})"
        );
        panic!("the pieces arrived out of order: {arrived:?}");
    }
    let too_long = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[
            ("pipeline", "long"),
            ("component_kind", "source"),
            ("error_type", "line_too_long"),
        ],
    );
    assert_eq!(
        too_long, 1.0,
        "line_too_long counts split lines, not pieces"
    );
}

/// Lines at and around `max_line_bytes`: a line of exactly the limit is not
/// split, longer ones are split into pieces of the limit, each split line is
/// counted once, and a newline that arrives after the pieces of a line went
/// out does not add an empty event.
#[test]
fn max_line_bytes_boundaries() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    let cfg = write_config(
        dir.path(),
        "limit",
        &simple_config(
            &app.to_string_lossy(),
            &out,
            "    max_line_bytes: 64\n    partial_line_timeout_ms: 600000\n",
        ),
    );
    let a = "a".repeat(64);
    let b = "b".repeat(128);
    let c = "c".repeat(200);
    let d = "d".repeat(63);
    append(&app, format!("{a}\n").as_bytes());
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--threads".into(), "1".into()],
            ..Default::default()
        },
    );
    wait_for(LONG, "the 64-byte line", || match count_lines(&out) {
        1 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    // The first piece of `b` goes out before its newline is written.
    append(&app, b.as_bytes());
    wait_for(
        LONG,
        "the first piece of the 128-byte line",
        || match count_lines(&out) {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} lines")),
        },
    );
    append(&app, format!("\n{c}\n{d}\n").as_bytes());
    let want: Vec<String> = vec![
        a.clone(),
        "b".repeat(64),
        "b".repeat(64),
        "c".repeat(64),
        "c".repeat(64),
        "c".repeat(64),
        "c".repeat(8),
        d.clone(),
    ];
    wait_for(LONG, "the last line", || {
        let got: Vec<String> = read_lines(&out)
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect();
        if got.last() == Some(&d) {
            Ok(())
        } else {
            Err(format!("{} lines so far", got.len()))
        }
    });
    let got: Vec<String> = read_lines(&out)
        .into_iter()
        .map(|l| String::from_utf8(l).unwrap())
        .collect();
    let lens = |v: &[String]| v.iter().map(|l| l.len()).collect::<Vec<_>>();
    assert_eq!(
        got,
        want,
        "piece lengths {:?}, want {:?}",
        lens(&got),
        lens(&want)
    );
    let too_long = agent.metric_or_zero(
        "petrel_component_errors_total",
        &[
            ("pipeline", "limit"),
            ("component_kind", "source"),
            ("error_type", "line_too_long"),
        ],
    );
    assert_eq!(too_long, 2.0, "two lines exceeded the limit");
}

/// Lines of one file reach a sink in file order, also with several
/// processing threads finishing batches in any order (the workers put
/// payloads back in read order before the sink).
#[test]
fn per_file_order_is_preserved() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    let size = gen("single128", "100MB", &app);
    let cfg = write_config(
        dir.path(),
        "order",
        &simple_config(&app.to_string_lossy(), &out, ""),
    );
    let _agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--threads".into(), "2".into()],
            ..Default::default()
        },
    );
    wait_for(
        LONG,
        "the whole file in the output",
        || match std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) {
            n if n >= size => Ok(()),
            n => Err(format!("{n} of {size} bytes")),
        },
    );
    let input = std::fs::read(&app).unwrap();
    let output = std::fs::read(&out).unwrap();
    if let Some(i) = input.iter().zip(&output).position(|(a, b)| a != b) {
        let line = input[..i].iter().filter(|&&c| c == b'\n').count() + 1;
        panic!("output differs from the file from line {line} on (byte {i})");
    }
}

/// Scenario 11: An unterminated last line is emitted after partial_line_timeout_ms.
#[test]
fn partial_last_line_is_emitted_after_timeout() {
    let dir = tempdir();
    let app = dir.path().join("app.log");
    let out = dir.path().join("out").join("out.log");
    append(&app, b"first\n");
    let cfg = write_config(
        dir.path(),
        "partial",
        &simple_config(
            &app.to_string_lossy(),
            &out,
            "    partial_line_timeout_ms: 300\n",
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "the first line", || match count_lines(&out) {
        1 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    let written = Instant::now();
    append(&app, b"abc");
    wait_for(LONG, "the unterminated `abc` as an event", || {
        let got = std::fs::read(&out).unwrap_or_default();
        if got == b"first\nabc\n" {
            Ok(())
        } else {
            Err(format!("output {:?}", String::from_utf8_lossy(&got)))
        }
    });
    assert!(
        written.elapsed() >= Duration::from_millis(300),
        "emitted before partial_line_timeout_ms"
    );
    // What follows is a new line, not a continuation of `abc`.
    append(&app, b"def\n");
    wait_for(LONG, "`def` as its own line", || {
        let got = std::fs::read(&out).unwrap_or_default();
        if got == b"first\nabc\ndef\n" {
            Ok(())
        } else {
            Err(format!("output {:?}", String::from_utf8_lossy(&got)))
        }
    });
}

/// A file rotated to a name outside the include pattern while the agent was
/// down, with lines it had not read yet: on restart they are read from the
/// checkpointed offset, next to the new file.
#[test]
fn file_rotated_while_down_is_finished_on_restart() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    let data = dir.path().join("data");
    let out = dir.path().join("out").join("out.log");
    let cfg = write_config(
        dir.path(),
        "down",
        &simple_config(&app.to_string_lossy(), &out, ""),
    );
    let text = |r: std::ops::Range<usize>| r.map(numbered).collect::<String>();
    append(&app, text(0..1000).as_bytes());
    let size = std::fs::metadata(&app).unwrap().len();

    let mut agent = Agent::start(&cfg, &data);
    wait_for(
        LONG,
        "the first 1000 lines committed",
        || match checkpoint_offset(&data, &app) {
            Some(o) if o == size => Ok(()),
            o => Err(format!("committed offset {o:?} of {size}")),
        },
    );
    agent.stop();

    // While the agent is down: the application logs more, then rotates.
    append(&app, text(1000..1500).as_bytes());
    std::fs::rename(&app, logs.join("app.log.1")).unwrap();
    append(&app, text(1500..1800).as_bytes());

    let mut agent = Agent::start(&cfg, &data);
    let (seen, bad) = wait_for(LONG, "all 1800 lines in the output", || {
        let (seen, bad) = tally(&out);
        match seen.len() {
            1800 => Ok((seen, bad)),
            n => Err(format!("{n} distinct lines")),
        }
    });
    agent.stop();
    assert!(bad.is_empty(), "corrupt lines: {bad:?}");
    let dups: Vec<_> = seen.iter().filter(|(_, &c)| c > 1).collect();
    assert!(
        dups.is_empty(),
        "a clean stop leaves no duplicates: {dups:?}"
    );
    assert!(
        agent
            .stderr()
            .contains("finishing a file rotated away while the agent was down"),
        "the resumed file is logged"
    );
}

/// Resident memory of `pid` in bytes (0 once it is gone).
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Writes to files no pattern selects until dropped: small appends in a
/// tight loop, round-robin, so that no two consecutive inotify events are
/// identical (the kernel merges those) and the queue fills as fast as the
/// writes go.
struct Storm {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Storm {
    fn start(files: Vec<std::path::PathBuf>) -> Storm {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, writes) = (stop.clone(), writes.clone());
            std::thread::spawn(move || {
                let mut handles: Vec<File> = files
                    .iter()
                    .map(|p| {
                        OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(p)
                            .unwrap()
                    })
                    .collect();
                // Bounded even if the test forgets to stop it.
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if n % 65_536 == 0 {
                        if Instant::now() >= deadline {
                            break;
                        }
                        // Keeps the disk use flat over a long run.
                        for h in &handles {
                            let _ = h.set_len(0);
                        }
                    }
                    let i = (n % handles.len() as u64) as usize;
                    let _ = handles[i].write_all(b"x\n");
                    n += 1;
                    writes.store(n, Ordering::Relaxed);
                }
            })
        };
        Storm {
            stop,
            writes,
            thread: Some(thread),
        }
    }

    fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Scenario 12: Files no pattern selects, written as fast as inotify
/// events can be read, beside the collected file (issue 22): the collected
/// file is still read to its end, memory stays bounded, and SIGTERM stops
/// the agent, all while the storm goes on.
#[test]
fn inotify_storm_beside_collected_file() {
    const BEFORE: usize = 10_000;
    const N: usize = 20_000;
    /// An agent with one file pipeline lives in a few tens of MB; the
    /// unbounded drain kept a path per event and grew by tens of MB per
    /// second of storm.
    const MAX_RSS: u64 = 100 * 1024 * 1024;

    let dir = tempdir();
    // Reading an event costs the old drain a copy of the directory's path
    // and of the name (and keeps both), while writing costs the writer the
    // same whatever their length: long ones let one writer thread outpace
    // the reader even on a busy two-core machine.
    let mut logs = dir.path().to_path_buf();
    while logs.as_os_str().len() < 3000 {
        logs.push(format!("{:_<200}", "d"));
    }
    std::fs::create_dir_all(&logs).unwrap();
    let app = logs.join("app.log");
    let text = |r: std::ops::Range<usize>| r.map(numbered).collect::<String>();
    append(&app, text(0..BEFORE).as_bytes());
    let storm = Storm::start(
        (0..4)
            .map(|i| logs.join(format!("noise-{i}-{:_<200}.txt", "")))
            .collect(),
    );
    wait_for(MEDIUM, "the storm to start", || match storm.writes() {
        w if w >= 100_000 => Ok(()),
        w => Err(format!("{w} writes")),
    });

    let out = dir.path().join("out").join("out.log");
    let include = format!("{}/*.log", logs.display());
    let cfg = write_config(dir.path(), "storm", &simple_config(&include, &out, ""));
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    let pid = agent.pid();
    let mut max_rss = 0;
    let mut check_rss = || {
        let rss = rss_bytes(pid);
        max_rss = max_rss.max(rss);
        assert!(
            rss < MAX_RSS,
            "agent RSS {} MiB during the storm (bound {} MiB)",
            rss >> 20,
            MAX_RSS >> 20
        );
    };

    // The rest is written once the agent runs, so that it has to keep
    // reading during the storm rather than only at its first scan.
    wait_for(LONG, "the first lines in the output", || {
        check_rss();
        match count_lines(&out) {
            0 => Err("no line yet".into()),
            _ => Ok(()),
        }
    });
    let mut f = OpenOptions::new().append(true).open(&app).unwrap();
    for chunk in (BEFORE..N).step_by(500) {
        f.write_all(text(chunk..(chunk + 500).min(N)).as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let (seen, bad) = wait_for(LONG, "every line of app.log in the output", || {
        check_rss();
        let (seen, bad) = tally(&out);
        match seen.len() {
            N => Ok((seen, bad)),
            n => Err(format!("{n} of {N} distinct lines")),
        }
    });
    assert!(bad.is_empty(), "corrupt lines: {bad:?}");
    // Some more seconds of storm for the memory bound to mean something.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        check_rss();
        std::thread::sleep(POLL);
    }
    let before_stop = storm.writes();
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(MEDIUM);
    let during = storm.writes() - before_stop;
    drop(storm);
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status}"
    );
    assert!(during > 0, "the storm went on until the agent exited");
    eprintln!(
        "inotify storm: {N} lines delivered, max RSS {} MiB, {during} storm writes during shutdown",
        max_rss >> 20
    );
    assert!((0..N).all(|n| seen.contains_key(&n)));
}

/// Scenario 13: many pipelines, each a glob over its own directory (issue
/// 33's set-up, where the include globs are matched through one map of
/// directories instead of a regex per glob): each pipeline gets the files
/// of its directory and only those, a directory created after the start is
/// picked up, and no zero-valued backpressure or error series appear.
#[test]
fn many_pipelines_each_glob_their_own_directory() {
    const PIPELINES: usize = 40;
    let dir = tempdir();
    let apps = dir.path().join("apps");
    let cfg = dir.path().join("pipelines");
    std::fs::create_dir_all(&cfg).unwrap();
    let out = |i: usize| dir.path().join("out").join(format!("out-{i}.log"));
    for i in 0..PIPELINES {
        // The last two directories appear only after the start.
        if i < PIPELINES - 2 {
            std::fs::create_dir_all(apps.join(format!("app-{i}"))).unwrap();
        }
        let include = format!("{}/app-{i}/*.log", apps.display());
        write_config(
            &cfg,
            &format!("p{i:02}"),
            &simple_config(&include, &out(i), ""),
        );
    }
    let lines =
        |i: usize, n: usize| -> String { (0..n).map(|l| format!("app-{i}-line-{l}\n")).collect() };
    // Before the start: a matching file, and one the glob does not select.
    append(&apps.join("app-3/a.log"), lines(3, 100).as_bytes());
    append(&apps.join("app-3/a.txt"), b"not selected\n");
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "app-3's lines", || match count_lines(&out(3)) {
        100 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    // After the start: a new file in an existing directory, and a
    // directory (with its file) that did not exist at the start.
    let late = PIPELINES - 1;
    append(&apps.join("app-7/b.log"), lines(7, 50).as_bytes());
    std::fs::create_dir_all(apps.join(format!("app-{late}"))).unwrap();
    append(
        &apps.join(format!("app-{late}/c.log")),
        lines(late, 30).as_bytes(),
    );
    for (i, n) in [(7, 50), (late, 30)] {
        wait_for(LONG, &format!("app-{i}'s lines"), || {
            match count_lines(&out(i)) {
                c if c == n => Ok(()),
                c => Err(format!("{c} lines")),
            }
        });
    }
    for (i, n) in [(3, 100), (7, 50), (late, 30)] {
        let got: Vec<Vec<u8>> = read_lines(&out(i));
        let want: Vec<Vec<u8>> = split_lines(lines(i, n).as_bytes());
        assert_eq!(got, want, "pipeline {i} got exactly its directory's lines");
    }
    for i in (0..PIPELINES).filter(|i| ![3, 7, late].contains(i)) {
        assert_eq!(count_lines(&out(i)), 0, "pipeline {i} read nothing");
    }
    let metrics = agent.metrics();
    for name in [
        "petrel_backpressure_pauses_total",
        "petrel_component_errors_total",
    ] {
        assert!(
            !metrics.contains(&format!("{name}{{")),
            "no zero-valued {name} series:\n{metrics}"
        );
    }
}

/// `ignore_older`: a file last changed longer ago than that is not read
/// (the others are), and what is appended to it later is; it is watched
/// from its end.
#[test]
fn ignore_older_skips_old_content_and_reads_what_is_appended() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let old = logs.join("old.log");
    let new = logs.join("new.log");
    std::fs::write(&old, "old content 1\nold content 2\n").unwrap();
    let two_days = std::time::SystemTime::now() - Duration::from_secs(2 * 86_400);
    File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_days)
        .unwrap();
    std::fs::write(&new, "new content\n").unwrap();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "older",
        &simple_config(
            &format!("{}/*.log", logs.display()),
            &out,
            "    ignore_older: 24h\n",
        ),
    );
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    // The scan that found the new file found the old one and opened it
    // at its end: once the new file's line is out, an append to the old
    // one comes after that.
    wait_lines(&out, 1);
    append(&old, b"appended later\n");
    wait_lines(&out, 2);
    agent.stop();
    let got: BTreeSet<String> = read_lines(&out)
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    assert_eq!(
        got,
        BTreeSet::from(["new content".to_string(), "appended later".to_string()])
    );
}
