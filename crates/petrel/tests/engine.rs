//! The engine's own guarantees: one agent per data dir, SIGHUP does not
//! kill, a panicking processor is isolated and reported by `/health`, and
//! shutdown is bounded by one deadline however many sinks are stuck.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn lines(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{tag}-{i:06} payload\n")).collect()
}

#[test]
fn a_second_agent_on_the_same_data_dir_is_refused() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "lock",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    let data = dir.path().join("data");
    let first = Agent::start(&cfg, &data);
    let second = Command::new(bin())
        .args(["run", "--api-addr", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .expect("run second agent");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "second agent must not run: {err}");
    assert!(
        err.contains(&format!("in use by petrel process {}", first.pid())),
        "the refusal names the holder's PID: {err}"
    );
    assert!(
        !err.contains("API listening"),
        "refused before binding anything: {err}"
    );
}

#[test]
fn an_unwritable_data_dir_is_refused_before_starting() {
    let dir = tempdir();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "ro",
        &simple_config(&format!("{}/logs/*.log", dir.path().display()), &out, ""),
    );
    // A regular file where the data dir should be: not creatable as root
    // either, unlike a chmod'ed directory.
    let data = dir.path().join("not-a-dir");
    std::fs::write(&data, b"x").unwrap();
    let run = Command::new(bin())
        .args(["run", "--api-addr", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .expect("run agent");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(
        err.contains("--data-dir"),
        "says how to choose another: {err}"
    );
    assert!(!err.contains("API listening"), "{err}");
    assert!(!out.exists(), "no sink file created before the check");
}

#[test]
fn sighup_does_not_stop_the_agent() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "hup",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    let mut agent = Agent::start(&cfg, &dir.path().join("data"));
    append(&app, lines(100, "before").as_bytes());
    wait_for(LONG, "first lines", || match count_lines(&out) {
        100 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    agent.signal(libc::SIGHUP);
    wait_for(MEDIUM, "reload logged", || {
        if agent.stderr().contains("reload") {
            Ok(())
        } else {
            Err("no reload in the log".into())
        }
    });
    append(&app, lines(100, "after").as_bytes());
    wait_for(LONG, "lines after SIGHUP", || match count_lines(&out) {
        200 => Ok(()),
        n => Err(format!("{n} lines")),
    });
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(LONG).success(), "{}", agent.stderr());
}

#[test]
fn a_panicking_processor_drops_one_event_and_the_pipeline_flows_on() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let app = logs.join("app.log");
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "panicky",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nprocessors:\n  - type: fields\n    add: {{ stage: one }}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
            logs.display(),
            out.display()
        ),
    );
    let mut text = lines(500, "good");
    text.push_str("POISON-EVENT here\n");
    text.push_str(&lines(500, "late"));
    append(&app, text.as_bytes());
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            env: vec![("PETREL_TEST_PANIC_ON".into(), "POISON-EVENT".into())],
            ..Default::default()
        },
    );
    let labels = [("pipeline", "panicky"), ("reason", "panic")];
    wait_for(LONG, "the poison event counted", || {
        match agent.metric_or_zero("petrel_component_discarded_events_total", &labels) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("discarded(panic) = {n}")),
        }
    });
    let (status, body) = agent.http_get("/health").expect("GET /health");
    assert_eq!(status, 503, "unhealthy while isolating: {body}");
    assert!(body.contains("panicked"), "{body}");
    wait_for(LONG, "every other line delivered", || {
        let got = histogram(read_lines(&out));
        let missing = (0..500)
            .flat_map(|i| {
                [
                    format!("good-{i:06} payload"),
                    format!("late-{i:06} payload"),
                ]
            })
            .filter(|l| !got.contains_key(l.as_bytes()))
            .count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} lines missing"))
        }
    });
    let got = histogram(read_lines(&out));
    assert!(
        !got.keys().any(|l| l.starts_with(b"POISON")),
        "the poison event is not delivered"
    );
    wait_for(LONG, "/health recovers", || {
        match agent.http_get("/health") {
            Ok((200, _)) => Ok(()),
            Ok((st, body)) => Err(format!("{st}: {body}")),
            Err(e) => Err(e.to_string()),
        }
    });
    assert!(
        agent.stderr().contains("panicked"),
        "logged with its component"
    );
}

/// An HTTP endpoint that accepts connections and never answers.
fn black_hole_server() -> (u16, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        let end = std::time::Instant::now() + Duration::from_secs(120);
        while !s.load(Ordering::Relaxed) && std::time::Instant::now() < end {
            if let Ok((mut c, _)) = l.accept() {
                let _ = c.set_read_timeout(Some(Duration::from_millis(10)));
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                held.push(c);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    (port, stop)
}

#[test]
fn shutdown_is_bounded_by_one_deadline_with_stuck_sinks() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let (port, stop) = black_hole_server();
    let sinks: String = (0..6)
        .map(|i| {
            format!("  - type: http\n    id: stuck{i}\n    url: \"http://127.0.0.1:{port}/in\"\n")
        })
        .collect();
    let cfg = write_config(
        dir.path(),
        "stuck",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nsinks:\n{sinks}",
            logs.display()
        ),
    );
    append(&logs.join("app.log"), lines(1000, "x").as_bytes());
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--shutdown-timeout".into(), "2".into()],
            ..Default::default()
        },
    );
    wait_for(LONG, "lines read", || {
        match agent.metric_or_zero(
            "petrel_component_sent_events_total",
            &[("pipeline", "stuck"), ("component_kind", "source")],
        ) {
            n if n >= 1000.0 => Ok(()),
            n => Err(format!("{n} events read")),
        }
    });
    agent.signal(libc::SIGTERM);
    // Six stuck sinks used to take 5 s each in turn; one 2 s deadline for
    // the whole shutdown ends well within this bound.
    let st = agent.wait_exit(Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    assert!(st.code().is_some(), "exited by itself: {st}");
}

#[test]
fn a_huge_shutdown_timeout_does_not_overflow() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "huge",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    append(&logs.join("app.log"), lines(10, "h").as_bytes());
    let mut agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--shutdown-timeout".into(), "18446744073709551".into()],
            ..Default::default()
        },
    );
    wait_for(LONG, "lines", || match count_lines(&out) {
        10 => Ok(()),
        n => Err(format!("{n}")),
    });
    agent.signal(libc::SIGTERM);
    let st = agent.wait_exit(LONG);
    let err = agent.stderr();
    assert!(st.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Checks an OpenMetrics exposition strictly: every family has one HELP
/// and one TYPE with the same name, every sample belongs to a declared
/// family with a suffix its type allows, labels and values parse, and the
/// text ends with `# EOF`.
fn check_exposition(text: &str) -> Result<usize, String> {
    use std::collections::HashMap;
    let mut help: HashMap<String, usize> = HashMap::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = 0;
    let lines = text.lines();
    let mut ended = false;
    for line in lines {
        if ended {
            return Err(format!("text after # EOF: {line}"));
        }
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            *help.entry(name.to_string()).or_default() += 1;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, ty) = (it.next().unwrap_or_default(), it.next().unwrap_or_default());
            if types.insert(name.to_string(), ty.to_string()).is_some() {
                return Err(format!("family {name} declared twice"));
            }
            if help.get(name) != Some(&1) {
                return Err(format!("# TYPE {name} without exactly one # HELP {name}"));
            }
            continue;
        }
        if line.starts_with('#') {
            return Err(format!("unknown comment line: {line}"));
        }
        let (name_labels, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("sample without value: {line}"))?;
        value
            .parse::<f64>()
            .map_err(|_| format!("value does not parse: {line}"))?;
        let name = match name_labels.split_once('{') {
            Some((n, labels)) => {
                let labels = labels
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels: {line}"))?;
                for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair
                        .split_once("=\"")
                        .ok_or_else(|| format!("bad label `{pair}`: {line}"))?;
                    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                        return Err(format!("bad label name `{k}`: {line}"));
                    }
                    let _ = v;
                }
                n
            }
            None => name_labels,
        };
        let family = types
            .iter()
            .find(|(fam, ty)| {
                let suffixes: &[&str] = match ty.as_str() {
                    "counter" => &["_total", "_created"],
                    "histogram" => &["_bucket", "_sum", "_count", "_created"],
                    "gauge" | "unknown" | "info" => &["", "_info"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| name == format!("{fam}{s}"))
            })
            .map(|(f, _)| f.clone());
        if family.is_none() {
            return Err(format!(
                "sample {name} belongs to no declared family of a matching type"
            ));
        }
        samples += 1;
    }
    if !ended {
        return Err("no # EOF at the end".into());
    }
    Ok(samples)
}

#[test]
fn the_metrics_exposition_is_strictly_valid() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "expo",
        &simple_config(&format!("{}/*.log", logs.display()), &out, ""),
    );
    append(&logs.join("a.log"), lines(100, "m").as_bytes());
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    wait_for(LONG, "delivery", || {
        let n = count_lines(&out);
        (n == 100).then_some(()).ok_or(format!("{n}"))
    });
    let text = agent.metrics();
    match check_exposition(&text) {
        Ok(n) => assert!(n >= 10, "{n} samples:\n{text}"),
        Err(e) => panic!("{e}\n{text}"),
    }
    // The checker itself rejects what it should.
    assert!(check_exposition("# HELP a_total x\n# TYPE a counter\na_total 1\n# EOF\n").is_err());
    assert!(check_exposition("# HELP a x\n# TYPE a gauge\na 1\n").is_err());
}
