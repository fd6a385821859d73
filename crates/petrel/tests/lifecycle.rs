//! Process lifecycle: restarts resume from the checkpoint, SIGKILL loses
//! nothing, SIGTERM drains in-flight data and exits 0.

mod common;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

fn committed(agent: &Agent, pipeline: &str, path: &Path) -> f64 {
    agent.metric_or_zero(
        "petrel_file_committed_offset_bytes",
        &[("pipeline", pipeline), ("path", &path.to_string_lossy())],
    )
}

fn wait_committed(agent: &Agent, pipeline: &str, path: &Path, size: u64) {
    wait_for(
        LONG,
        &format!("committed offset {size}"),
        || match committed(agent, pipeline, path) {
            n if n == size as f64 => Ok(()),
            n => Err(format!("committed = {n}")),
        },
    );
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Scenario 5: Stop with SIGTERM, append while stopped, start again: the appended
/// lines arrive (the checkpoint wins over `read_from: end`) and nothing is
/// read twice.
#[test]
fn restart_resumes_from_checkpoint_without_rereading() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    std::fs::File::create(&app).unwrap();
    let out = dir.path().join("out").join("out.log");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "resume",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: end\nsinks:\n  - type: file\n    path: \"{}\"\n",
            logs.display(),
            out.display()
        ),
    );
    let line = |i: usize| format!("resume-line-{i:05} some payload to make it longer\n");

    let mut agent = Agent::start(&cfg, &data);
    wait_for(MEDIUM, "the agent to watch app.log", || {
        match agent.metric_or_zero("petrel_files_open", &[("pipeline", "resume")]) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("files_open = {n}")),
        }
    });
    for chunk in (0..1000).collect::<Vec<_>>().chunks(100) {
        append(
            &app,
            chunk
                .iter()
                .map(|&i| line(i))
                .collect::<String>()
                .as_bytes(),
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for(LONG, "1000 lines", || match count_lines(&out) {
        1000 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    agent.stop();
    assert_eq!(
        checkpoint_offset(&data, &app),
        Some(file_len(&app)),
        "the final checkpoint holds the file's size"
    );

    // Written while the agent is down.
    append(&app, (1000..1500).map(line).collect::<String>().as_bytes());
    let mut agent = Agent::start(&cfg, &data);
    wait_committed(&agent, "resume", &app, file_len(&app));
    agent.stop();

    let got = histogram(read_lines(&out));
    let expected: Vec<String> = (0..1500).map(|i| line(i).trim_end().to_string()).collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|l| !got.contains_key(l.as_bytes()))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "lost lines, e.g. {missing:?}");
    let repeated: Vec<(String, usize)> = got
        .iter()
        .filter(|(_, &c)| c > 1)
        .map(|(l, &c)| (String::from_utf8_lossy(l).into_owned(), c))
        .take(5)
        .collect();
    assert!(
        repeated.is_empty(),
        "lines read twice after restart: {repeated:?}"
    );
    assert_eq!(got.len(), 1500, "only the written lines");
}

/// Scenario 6: SIGKILL in the middle of heavy writing, then restart with the same
/// data dir: every input line is in the output at least once, and the
/// duplicates stay within the documented bound: what was delivered since
/// the last checkpoint write (one checkpoint interval, 1 s, of throughput)
/// plus what was in flight (at most `--memory-limit`).
#[test]
fn kill9_during_heavy_writing_loses_nothing() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let staging = dir.path().join("staging.data");
    let total = gen("single128", "100MB", &staging);
    let app = logs.join("app.log");
    std::fs::File::create(&app).unwrap();
    let out = dir.path().join("out").join("out.log");
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "crash",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    const RATE: f64 = 10e6;
    const MEMORY_LIMIT: u64 = 16 << 20;
    let opts = || AgentOptions {
        args: vec!["--memory-limit".into(), MEMORY_LIMIT.to_string()],
        ..Default::default()
    };
    let mut agent = Agent::start_with(&cfg, &data, opts());

    // Copy the data set into the watched file in 1 MiB appends at about
    // 10 MB/s, so that the agent is killed while the file still grows.
    let written = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (staging, app, written, done) =
            (staging.clone(), app.clone(), written.clone(), done.clone());
        std::thread::spawn(move || {
            let mut src = std::fs::File::open(&staging).unwrap();
            let mut dst = OpenOptions::new().append(true).open(&app).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let start = Instant::now();
            loop {
                let n = src.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                dst.write_all(&buf[..n]).unwrap();
                let w = written.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
                // Pace to RATE.
                let due = Duration::from_secs_f64(w as f64 / RATE);
                if let Some(d) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(d);
                }
            }
            done.store(true, Ordering::SeqCst);
        })
    };

    let at_kill = wait_for(LONG, "a committed offset above 0", || {
        match committed(&agent, "crash", &app) {
            n if n > 0.0 => Ok(n as u64),
            n => Err(format!("committed = {n}")),
        }
    });
    let written_at_kill = written.load(Ordering::SeqCst);
    let writing = !done.load(Ordering::SeqCst);
    agent.kill9();
    eprintln!(
        "kill -9 at committed offset {at_kill} of {total} (writer at {written_at_kill}, still writing: {writing})"
    );
    assert!(at_kill < total, "killed too late to test anything");

    let mut agent = Agent::start_with(&cfg, &data, opts());
    writer.join().expect("writer");
    assert_eq!(file_len(&app), total);
    wait_committed(&agent, "crash", &app, total);
    agent.stop();

    // Compare by line hash; single128 lines are unique.
    let (input, tail) = hash_histogram(&staging);
    assert!(tail.is_empty());
    let input_lines: u64 = input.values().map(|&c| c as u64).sum();
    let (output, out_tail) = hash_histogram(&out);
    assert!(
        out_tail.is_empty(),
        "the output ends with an unterminated piece of {} bytes",
        out_tail.len()
    );
    let mut lost = Vec::new();
    let mut dups = 0u64;
    for (h, &n) in &input {
        let got = output.get(h).copied().unwrap_or(0);
        if got < n {
            lost.push(*h);
        } else {
            dups += (got - n) as u64;
        }
    }
    let unknown: u64 = output
        .iter()
        .filter(|(h, _)| !input.contains_key(h))
        .map(|(_, &c)| c as u64)
        .sum();
    // A write cut short by SIGKILL can leave a torn line that the next
    // write completes with other bytes: such a line is not in the input, and
    // the line it started is then only "lost" if it was not written again,
    // which the checkpoint guarantees it was.
    let torn = find_unknown_lines(&out, &input);
    let really_lost: Vec<u64> = lost
        .iter()
        .copied()
        .filter(|h| !torn.iter().any(|t| t.1.contains(h)))
        .collect();
    eprintln!(
        "kill -9: {input_lines} input lines, {} lost, {dups} duplicate(s), {unknown} torn line(s) {:?}",
        really_lost.len(),
        torn.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    assert!(
        really_lost.is_empty(),
        "{} input line(s) never delivered",
        really_lost.len()
    );
    assert!(
        unknown <= 1,
        "{unknown} output lines are not input lines: {torn:?}"
    );
    // The bound, in lines: one checkpoint interval of delivery at the
    // writer's rate (twice, for catching up after a pause) plus the
    // memory limit's worth of in-flight data.
    let line_len = total as f64 / input_lines as f64;
    let bound = ((2.0 * RATE + MEMORY_LIMIT as f64) / line_len) as u64;
    assert!(
        dups <= bound,
        "duplicates ({dups}) exceed the documented bound ({bound} lines: 1 s of delivery + --memory-limit in flight)"
    );
}

/// Output lines not in the input, with the hashes of the input lines that
/// each ends with (a torn write followed by a complete line).
fn find_unknown_lines(out: &Path, input: &HashMap<u64, u32>) -> Vec<(String, Vec<u64>)> {
    let mut found = Vec::new();
    for l in std::fs::read(out).unwrap().split(|&c| c == b'\n') {
        if l.is_empty() || input.contains_key(&line_hash(l)) {
            continue;
        }
        let suffixes: Vec<u64> = (1..l.len())
            .map(|i| line_hash(&l[i..]))
            .filter(|h| input.contains_key(h))
            .collect();
        found.push((
            String::from_utf8_lossy(&l[..l.len().min(200)]).into_owned(),
            suffixes,
        ));
    }
    found
}

/// Scenario 10: SIGTERM while the sink is stalled and the memory budget is full: the
/// agent delivers everything it read, checkpoints exactly that, and exits 0;
/// the next run delivers the rest, and the final checkpoint is the file size.
#[test]
fn sigterm_drains_in_flight_data_and_exits_0() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    let size = gen("single128", "20MB", &app);
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "drain",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nsinks:\n  - type: stdout\n    encoding: text\n",
            logs.display()
        ),
    );
    let input = std::fs::read(&app).unwrap();

    // Phase 1: nobody reads the agent's stdout, so the sink stalls and the
    // (small) memory budget fills up with in-flight data.
    let mut agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec![
                "--memory-limit".into(),
                "4MiB".into(),
                "--shutdown-timeout".into(),
                "20".into(),
            ],
            stdout: StdoutMode::Piped,
            ..Default::default()
        },
    );
    let mut pipe = agent.take_stdout();
    wait_for(LONG, "the memory budget to fill (backpressure)", || {
        let m = agent.metrics();
        let pauses = find_metric(
            &m,
            "petrel_backpressure_pauses_total",
            &[("pipeline", "drain")],
        )
        .unwrap_or(0.0);
        let used = find_metric(&m, "petrel_memory_used_bytes", &[]).unwrap_or(0.0);
        if pauses > 0.0 && used > 0.0 {
            Ok(())
        } else {
            Err(format!("pauses = {pauses}, memory used = {used}"))
        }
    });
    let t = Instant::now();
    agent.signal(libc::SIGTERM);
    // Unblock the sink only now: everything it delivers from here on is the
    // drain.
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        pipe.read_to_end(&mut v).unwrap();
        v
    });
    let status = agent.wait_exit(MEDIUM);
    let took = t.elapsed();
    assert_eq!(status.code(), Some(0), "exit after SIGTERM: {status}");
    let phase1 = reader.join().unwrap();
    let offset = checkpoint_offset(&data, &app).expect("a checkpoint for app.log");
    eprintln!(
        "drain: SIGTERM to exit {took:?}; delivered {} bytes, checkpoint {offset} of {size}",
        phase1.len()
    );
    assert!(
        offset > 0 && offset < size,
        "stopped mid-file: checkpoint {offset} of {size}"
    );
    assert_eq!(
        phase1.len() as u64,
        offset,
        "everything delivered is checkpointed and nothing else"
    );
    let mut a = split_lines(&phase1);
    let mut b = split_lines(&input[..offset as usize]);
    a.sort_unstable();
    b.sort_unstable();
    assert!(
        a == b,
        "the drained output is not the first {offset} bytes' lines"
    );
    assert!(agent.stderr().contains("final checkpoint written"));

    // Phase 2: the rest, exactly once.
    let mut agent = Agent::start_with(
        &cfg,
        &data,
        AgentOptions {
            args: vec![],
            stdout: StdoutMode::Capture,
            ..Default::default()
        },
    );
    wait_committed(&agent, "drain", &app, size);
    agent.stop();
    let phase2 = agent.stdout_bytes();
    assert_eq!(checkpoint_offset(&data, &app), Some(size));
    assert_eq!(
        phase1.len() + phase2.len(),
        input.len(),
        "both runs together deliver the file exactly once"
    );
    let mut all = split_lines(&phase1);
    all.extend(split_lines(&phase2));
    all.sort_unstable();
    let mut want = split_lines(&input);
    want.sort_unstable();
    assert!(
        all == want,
        "both runs together deliver every line exactly once"
    );
}
