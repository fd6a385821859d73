//! The `journald` source against real journal files written by
//! `systemd-journal-remote` from export-format input (text and binary
//! fields, repeated fields, several units), read back through the real
//! `journalctl`: every entry once and field by field what `journalctl -o
//! json` says, a second file while following (rotation), units and
//! matches, nothing lost across `kill -9`, a vacuumed journal counted as a
//! gap, and a journal this journalctl cannot read reported with what to do.
//!
//! Needs `scripts/install-journal-tools.sh` (Debian packages `systemd` and
//! `systemd-journal-remote`); without them every test fails naming it.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value as J;

const REMOTE: &str = "/lib/systemd/systemd-journal-remote";
const BOOT: &str = "6c0a1b0e4f2d4b8c9e7a5d3c1b0a9f8e";
/// `__REALTIME_TIMESTAMP` of entry 0: 2023-11-14T22:13:20Z.
const BASE_US: u64 = 1_700_000_000_000_000;
const LEVELS: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

fn tools() {
    assert!(
        Path::new(REMOTE).exists(),
        "{REMOTE} is missing: run scripts/install-journal-tools.sh (Debian package systemd-journal-remote)"
    );
    let ok = Command::new("journalctl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "journalctl is missing: run scripts/install-journal-tools.sh (Debian package systemd)"
    );
}

/// The message of entry `i`: mostly text; every 50th a non-UTF-8 binary
/// value, another every 50th a multi-line one (binary in export format).
fn message(i: u64) -> Vec<u8> {
    match i % 50 {
        7 => format!("raw \u{1}bytes {i} ")
            .into_bytes()
            .into_iter()
            .chain([0xff, 0xfe, b'!'])
            .collect(),
        13 => format!("first line of {i}\nsecond line\n\tindented third").into_bytes(),
        _ => format!("entry {i:07} of the test journal, with some padding to look like a log line")
            .into_bytes(),
    }
}

/// Appends entry `i` in journal export format to `out`.
fn export_entry(out: &mut Vec<u8>, i: u64) {
    let mut field = |k: &str, v: &[u8]| {
        if v.contains(&b'\n') || std::str::from_utf8(v).is_err() {
            out.extend_from_slice(k.as_bytes());
            out.push(b'\n');
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend_from_slice(v);
            out.push(b'\n');
        } else {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v);
            out.push(b'\n');
        }
    };
    field(
        "__REALTIME_TIMESTAMP",
        (BASE_US + i * 7).to_string().as_bytes(),
    );
    field(
        "__MONOTONIC_TIMESTAMP",
        (5_000_000 + i * 7).to_string().as_bytes(),
    );
    field("_BOOT_ID", BOOT.as_bytes());
    field("_HOSTNAME", b"node-1");
    field("_SYSTEMD_UNIT", format!("app{}.service", i % 3).as_bytes());
    field("SYSLOG_IDENTIFIER", format!("app{}", i % 3).as_bytes());
    field("_PID", (1000 + i % 3).to_string().as_bytes());
    field("PRIORITY", (i % 8).to_string().as_bytes());
    field("SEQ", i.to_string().as_bytes());
    if i % 50 == 7 {
        field("KIND", b"binary");
    }
    if i % 100 == 5 {
        // A field given twice: journalctl shows a list.
        field("TAG", b"first");
        field("TAG", b"second");
    }
    field("MESSAGE", &message(i));
    out.push(b'\n');
}

/// Writes entries `range` into the journal file `dir/name` with
/// systemd-journal-remote.
fn write_journal(dir: &Path, name: &str, range: std::ops::Range<u64>) -> PathBuf {
    let mut input = Vec::new();
    for i in range {
        export_entry(&mut input, i);
    }
    let path = dir.join(name);
    let mut child = Command::new(REMOTE)
        .arg(format!("--output={}", path.display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start systemd-journal-remote");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let st = wait_child(&mut child, "systemd-journal-remote");
    writer.join().expect("writer").expect("write export input");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut err).ok();
    assert!(st.success(), "systemd-journal-remote failed ({st}): {err}");
    path
}

/// `journalctl --directory=dir -o json`, every entry.
fn journal_json(dir: &Path) -> Vec<J> {
    let out = Command::new("journalctl")
        .arg(format!("--directory={}", dir.display()))
        .args(["--output=json", "--no-pager", "--merge"])
        .output()
        .expect("run journalctl");
    assert!(
        out.status.success(),
        "journalctl -o json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("journalctl json line"))
        .collect()
}

/// A journalctl JSON value as the text the agent's ndjson gives: strings
/// as they are, byte arrays (binary values) as text with U+FFFD for what
/// is not UTF-8, lists of values (repeated fields) as lists.
fn as_agent(v: &J) -> J {
    match v {
        J::Array(a) if a.iter().all(J::is_u64) => {
            let bytes: Vec<u8> = a.iter().map(|b| b.as_u64().unwrap_or(0) as u8).collect();
            J::String(String::from_utf8_lossy(&bytes).into_owned())
        }
        J::Array(a) => J::Array(a.iter().map(as_agent).collect()),
        other => other.clone(),
    }
}

/// RFC 3339 of microseconds since the epoch, as the agent writes it.
fn rfc3339_us(us: u64) -> String {
    let secs = (us / 1_000_000) as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        (us % 1_000_000) * 1000
    )
}

/// Checks one event of the agent against journalctl's view of the entry.
fn check_event(journal: &J, agent: &J) {
    let j = journal.as_object().expect("journal entry object");
    let a = agent.as_object().expect("agent event object");
    for (k, v) in j {
        let got = if k == "MESSAGE" {
            a.get("message")
        } else {
            a.get(k)
        };
        assert_eq!(
            got,
            Some(&as_agent(v)),
            "field {k} of {journal}\nagent: {agent}"
        );
    }
    let prio: usize = j["PRIORITY"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("PRIORITY");
    assert_eq!(
        a.get("level").and_then(J::as_str),
        Some(LEVELS[prio]),
        "{agent}"
    );
    let us: u64 = j["__REALTIME_TIMESTAMP"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("time");
    assert_eq!(
        a.get("timestamp").and_then(J::as_str),
        Some(rfc3339_us(us).as_str()),
        "{agent}"
    );
    for k in a.keys() {
        let known = j.contains_key(k)
            || ["message", "level", "timestamp", "source_type", "host"].contains(&k.as_str());
        assert!(known, "field {k} is not the journal's: {agent}");
    }
}

fn seq_of(v: &J) -> u64 {
    v["SEQ"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no SEQ in {v}"))
}

fn journald_pipeline(dir: &Path, name: &str, journal: &Path, keys: &str, out: &Path, enc: &str) {
    write_config(
        dir,
        name,
        &format!(
            "sources:\n  - type: journald\n    id: journal\n    directory: \"{}\"\n{keys}sinks:\n  - type: file\n    path: \"{}\"\n    encoding: {enc}\n",
            journal.display(),
            out.display()
        ),
    );
}

#[test]
fn every_entry_is_read_once_field_by_field_across_rotation_units_and_matches() {
    tools();
    let dir = tempdir();
    let journal = dir.path().join("journal");
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    const N: u64 = 3000;
    write_journal(&journal, "a.journal", 0..N);
    let (all, app1, binary) = (
        dir.path().join("all.ndjson"),
        dir.path().join("app1.ndjson"),
        dir.path().join("binary.log"),
    );
    journald_pipeline(&conf, "all", &journal, "", &all, "ndjson");
    journald_pipeline(
        &conf,
        "app1",
        &journal,
        "    units: [app1]\n    exclude_matches:\n      PRIORITY: [\"7\"]\n",
        &app1,
        "ndjson",
    );
    journald_pipeline(
        &conf,
        "binary",
        &journal,
        "    include_matches:\n      KIND: [binary]\n",
        &binary,
        "text",
    );
    let mut agent = Agent::start(&conf, &dir.path().join("data"));
    wait_lines(&all, N as usize);
    // Rotation: a second file appears while the agent follows.
    write_journal(&journal, "b.journal", N..2 * N);
    wait_lines(&all, 2 * N as usize);
    let expected = journal_json(&journal);
    assert_eq!(expected.len() as u64, 2 * N);
    let app1_expected: Vec<&J> = expected
        .iter()
        .filter(|e| e["_SYSTEMD_UNIT"] == "app1.service" && e["PRIORITY"] != "7")
        .collect();
    wait_lines(&app1, app1_expected.len());
    let binary_expected: Vec<Vec<u8>> = (0..2 * N).filter(|i| i % 50 == 7).map(message).collect();
    wait_lines(&binary, binary_expected.len());
    agent.stop();

    // Every entry exactly once (nothing failed, nothing restarted), each
    // field what journalctl says.
    let got = json_lines(&all);
    assert_eq!(got.len() as u64, 2 * N, "entries delivered");
    let by_seq: HashMap<u64, &J> = got.iter().map(|e| (seq_of(e), e)).collect();
    assert_eq!(by_seq.len() as u64, 2 * N, "each entry once");
    for e in &expected {
        check_event(e, by_seq[&seq_of(e)]);
    }
    // Journal order within the pipeline.
    let seqs: Vec<u64> = got.iter().map(seq_of).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in journal order");

    let got = json_lines(&app1);
    assert_eq!(got.len(), app1_expected.len(), "units + exclude_matches");
    for (e, a) in app1_expected.iter().zip(&got) {
        check_event(e, a);
    }

    // Binary values reach a text sink as the very bytes of the journal.
    assert_eq!(read_lines(&binary), binary_expected, "raw MESSAGE bytes");
}

/// Distinct SEQ values in an ndjson output, and the number of lines.
fn seqs(out: &Path) -> (HashSet<u64>, usize) {
    let lines = json_lines(out);
    (lines.iter().map(seq_of).collect(), lines.len())
}

#[test]
fn kill_9_loses_nothing_and_a_vacuumed_journal_is_counted_as_a_gap() {
    tools();
    let dir = tempdir();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let out = dir.path().join("out.ndjson");
    let data = dir.path().join("data");
    journald_pipeline(dir.path(), "j", &journal, "", &out, "ndjson");
    let cfg = dir.path().join("j.yaml");
    const N: u64 = 40_000;
    let a = write_journal(&journal, "a.journal", 0..N);

    // kill -9 while reading: what was not checkpointed is read again.
    let mut agent = Agent::start(&cfg, &data);
    wait_for(LONG, "some entries delivered", || {
        let n = count_lines(&out);
        if n >= 2000 {
            Ok(())
        } else {
            Err(format!("{n} lines"))
        }
    });
    agent.kill9();
    let before = count_lines(&out);
    println!("killed with {before} of {N} entries delivered");
    let mut agent = Agent::start(&cfg, &data);
    wait_for(LONG, "every entry after kill -9", || {
        let (s, n) = seqs(&out);
        if s.len() as u64 == N {
            Ok(())
        } else {
            Err(format!("{} distinct of {N} ({n} lines)", s.len()))
        }
    });
    let (s, n) = seqs(&out);
    assert!((0..N).all(|i| s.contains(&i)), "an entry is missing");
    println!("{n} lines for {N} entries after kill -9 (duplicates are the unacknowledged tail)");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("j", "journal", "journal_gap")
        ),
        0.0,
        "no gap when the checkpoint's entry is still there"
    );
    agent.stop();

    // Stopped: two more files are written, then the two oldest are
    // vacuumed (deleted). The checkpoint's entry (the last of a) is gone
    // and so is all of b: a gap, and reading resumes at c's first entry.
    let b = write_journal(&journal, "b.journal", N..N + 1000);
    write_journal(&journal, "c.journal", N + 1000..N + 2000);
    std::fs::remove_file(&a).unwrap();
    std::fs::remove_file(&b).unwrap();
    let lines_before = count_lines(&out);
    let agent = Agent::start(&cfg, &data);
    wait_for(LONG, "c's entries after the vacuum", || {
        let (s, _) = seqs(&out);
        let missing = (N + 1000..N + 2000).filter(|i| !s.contains(i)).count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of c missing"))
        }
    });
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("j", "journal", "journal_gap"),
        1.0,
        false,
    );
    let (s, n) = seqs(&out);
    assert_eq!(
        n - lines_before,
        1000,
        "c's entries, each once, and nothing else"
    );
    assert!(
        (N..N + 1000).all(|i| !s.contains(&i)),
        "b was vacuumed: none of it can be read"
    );
    assert!(
        agent.stderr().contains("rotated or vacuumed away"),
        "the gap is logged"
    );
}

#[test]
fn a_journal_file_newer_than_journalctl_is_reported_with_what_to_do() {
    tools();
    let dir = tempdir();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let path = write_journal(&journal, "a.journal", 0..10);
    // An incompatible flag this journalctl does not know, as a newer
    // systemd sets for a feature it adds (header: signature, compatible
    // flags, then incompatible flags at byte 12).
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"LPKSHHRH", "a journal file");
    let mut flags = [0u8; 4];
    flags.copy_from_slice(&bytes[12..16]);
    let flags = u32::from_le_bytes(flags) | 1 << 31;
    bytes[12..16].copy_from_slice(&flags.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let out = dir.path().join("out.ndjson");
    journald_pipeline(dir.path(), "j", &journal, "", &out, "ndjson");
    let agent = Agent::start(&dir.path().join("j.yaml"), &dir.path().join("data"));
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("j", "journal", "journal_unsupported"),
        1.0,
        true,
    );
    wait_for(MEDIUM, "the error with what to do", || {
        let e = agent.stderr();
        if e.contains("newer systemd than this journalctl") && e.contains("journalctl_path") {
            Ok(())
        } else {
            Err(e)
        }
    });
    assert_eq!(count_lines(&out), 0);
}

#[test]
fn config_errors_name_the_line_and_the_fix() {
    let dir = tempdir();
    write_config(
        dir.path(),
        "bad",
        "sources:\n  - type: journald\n    include_matches:\n      _systemd_unit: [a]\n    exclude_matches: [x]\nsinks:\n  - type: blackhole\n",
    );
    let (code, stdout, stderr) = run_to_end(dir.path(), &["validate", "--config", "bad.yaml"]);
    let text = format!("{stdout}{stderr}");
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("bad.yaml:4:") && text.contains("not a journal field name"),
        "{text}"
    );
    assert!(
        text.contains("bad.yaml:5:") && text.contains("must be a mapping of journal field names"),
        "{text}"
    );
}

// ---- kernel source (/dev/kmsg) ----

/// A line written to /dev/kmsg, or why it could not be (no root, a
/// sandbox without the device, `dmesg_restrict`).
fn write_kmsg(line: &str) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .map_err(|e| format!("open /dev/kmsg for writing: {e}"))?;
    f.write_all(line.as_bytes())
        .map_err(|e| format!("write /dev/kmsg: {e}"))
}

fn kmsg_readable() -> Result<(), String> {
    std::fs::File::open("/dev/kmsg")
        .map(drop)
        .map_err(|e| format!("open /dev/kmsg for reading: {e}"))
}

#[test]
fn kernel_records_are_read_once_with_priority_facility_sequence_and_boot() {
    let unique = format!("petrel-kmsg-{}-{}", std::process::id(), rfc3339_us(BASE_US));
    let first = format!("{unique} first");
    if let Err(why) = kmsg_readable().and_then(|_| write_kmsg(&format!("<4>{first}\n"))) {
        // The sandbox forbids it: say so loudly, and test the parser on
        // records recorded from a real /dev/kmsg instead.
        eprintln!("!!!! kernel source: {why}: /dev/kmsg is not usable here; testing the parser on recorded records only !!!!");
        let rec =
            b"3,1057,93711204,-,caller=T512;usb 1-1: error -71\n SUBSYSTEM=usb\n DEVICE=c189:0\n";
        let r = petrel::sources::kernel::parse_record(rec, 0, rec.len()).expect("a record");
        assert_eq!(
            (r.prio, r.seq, r.ts_usec, r.fields.len()),
            (3, 1057, 93711204, 2)
        );
        return;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "");
    let dir = tempdir();
    let out = dir.path().join("out.ndjson");
    let cfg = write_config(
        dir.path(),
        "k",
        &format!(
            "sources:\n  - type: kernel\n    id: kmsg\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let data = dir.path().join("data");
    let find = |text: &str| -> Vec<J> {
        if !out.exists() {
            return Vec::new();
        }
        json_lines(&out)
            .into_iter()
            .filter(|e| e["message"] == text)
            .collect()
    };
    let mut agent = Agent::start(&cfg, &data);
    let got = wait_for(LONG, "the line written to /dev/kmsg", || {
        let v = find(&first);
        if v.is_empty() {
            Err("not yet".into())
        } else {
            Ok(v)
        }
    });
    let e = &got[0];
    assert_eq!(e["level"], "warning", "{e}");
    assert_eq!(e["PRIORITY"], "4", "{e}");
    // Written from user space: the kernel files it under `user`.
    assert_eq!(e["facility"], "user", "{e}");
    assert_eq!(e["SYSLOG_FACILITY"], 1, "{e}");
    assert!(e["seq"].as_u64().is_some(), "{e}");
    assert_eq!(e["_BOOT_ID"], boot.as_str(), "{e}");
    assert!(
        e["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{e}"
    );
    agent.stop();

    // Restarted in the same boot: the checkpoint skips what was delivered.
    let second = format!("{unique} second");
    write_kmsg(&format!("<6>{second}\n")).expect("write /dev/kmsg");
    let agent = Agent::start(&cfg, &data);
    wait_for(LONG, "the second line", || {
        if find(&second).is_empty() {
            Err("not yet".into())
        } else {
            Ok(())
        }
    });
    assert_eq!(find(&first).len(), 1, "the first line was delivered once");
    assert_eq!(find(&second)[0]["level"], "info");
    drop(agent);
}

// ---- internal_logs source ----

#[test]
fn the_agents_own_log_records_are_events() {
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let out = dir.path().join("internal.ndjson");
    write_config(
        &conf,
        "self",
        &format!(
            "sources:\n  - type: internal_logs\n    id: logs\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    // A pipeline that logs an error (and retries with backoff): journalctl
    // cannot be run.
    write_config(
        &conf,
        "broken",
        "sources:\n  - type: journald\n    id: journal\n    journalctl_path: /nonexistent/journalctl\nsinks:\n  - type: blackhole\n",
    );
    let agent = Agent::start(&conf, &dir.path().join("data"));
    let e = wait_for(LONG, "the journald error as an event", || {
        let lines = if out.exists() {
            json_lines(&out)
        } else {
            Vec::new()
        };
        lines
            .into_iter()
            .find(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("cannot run `/nonexistent/journalctl`"))
            })
            .ok_or_else(|| "not yet".to_string())
    });
    assert_eq!(e["level"], "error", "{e}");
    assert_eq!(e["target"], "petrel::sources::journald", "{e}");
    assert_eq!(e["source"], "broken/journal", "{e}");
    assert!(e["timestamp"].as_str().is_some(), "{e}");
    drop(agent);
}

#[test]
fn internal_logs_fed_back_by_a_failing_sink_stay_bounded() {
    // internal_logs → an HTTP sink whose endpoint (this agent's own http
    // source, with a body limit no batch fits) refuses what it carries, and
    // the sink logs its failures: records it carries make new ones. The
    // rate limit (1 per second: the agent's start-up records already
    // exceed it) bounds the loop, and counts what it drops.
    let dir = tempdir();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let port = free_port();
    let dead = dir.path().join("dead.ndjson");
    let received = dir.path().join("received.ndjson");
    write_config(
        &conf,
        "self",
        &format!(
            "sources:\n  - type: internal_logs\n    id: logs\n    rate_limit: 1\nsinks:\n  - type: http\n    url: \"http://127.0.0.1:{port}/\"\n    encoding: ndjson\n    dead_letter: \"{}\"\n",
            dead.display()
        ),
    );
    write_config(
        &conf,
        "endpoint",
        &format!(
            "sources:\n  - type: http\n    address: 127.0.0.1:{port}\n    max_body_bytes: 64\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            received.display()
        ),
    );
    let started = std::time::Instant::now();
    let agent = Agent::start(&conf, &dir.path().join("data"));
    let labels = |reason| {
        let mut l = component("self", "source", "logs");
        l.push(("reason", reason));
        l
    };
    wait_for(LONG, "the rate limit to drop records of the loop", || {
        let n = agent.metric_or_zero(
            "petrel_component_discarded_events_total",
            &labels("rate_limited"),
        );
        if n > 0.0 {
            Ok(())
        } else {
            Err(format!(
                "dead letters: {}",
                if dead.exists() { count_lines(&dead) } else { 0 }
            ))
        }
    });
    // Never more records taken than the bucket allows: 1 at once, then 1
    // per second (and one of slack for the reading of the clock).
    let taken = agent.metric_or_zero(
        "petrel_component_sent_events_total",
        &component("self", "source", "logs"),
    );
    let bound = 1.0 + started.elapsed().as_secs_f64() + 1.0;
    assert!(
        taken <= bound,
        "{taken} records taken, at most {bound} allowed"
    );
    assert!(
        agent.http_get("/health/live").is_ok_and(|(s, _)| s == 200),
        "the agent is alive"
    );
    drop(agent);
}

/// `max_age`: on a first start (no checkpoint) only the entries of the
/// last `max_age` are read; the older ones of the same journal are not.
#[test]
fn max_age_reads_only_the_recent_entries_on_a_first_start() {
    tools();
    let dir = tempdir();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut input = Vec::new();
    // Ten entries of three days ago, then ten of the last minutes.
    for i in 0..20u64 {
        let age_us = if i < 10 {
            3 * 86_400_000_000
        } else {
            60_000_000
        };
        let entry = format!(
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID={BOOT}\n_HOSTNAME=node-1\nSEQ={i}\nMESSAGE=entry {i}\n\n",
            now_us - age_us + i,
            1_000_000 + i,
        );
        input.extend_from_slice(entry.as_bytes());
    }
    let path = journal.join("a.journal");
    let mut child = Command::new(REMOTE)
        .arg(format!("--output={}", path.display()))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start systemd-journal-remote");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&input).expect("write export input");
    drop(stdin);
    assert!(wait_child(&mut child, "systemd-journal-remote").success());
    let out = dir.path().join("out.ndjson");
    journald_pipeline(
        dir.path(),
        "age",
        &journal,
        "    max_age: 1h\n",
        &out,
        "ndjson",
    );
    let mut agent = Agent::start(&dir.path().join("age.yaml"), &dir.path().join("data"));
    wait_lines(&out, 10);
    agent.stop();
    let (got, n) = seqs(&out);
    assert_eq!(n, 10, "each recent entry once");
    assert_eq!(got, (10..20).collect::<HashSet<u64>>());
}

/// Damages the entry object of entry `i` in `file` (its object type), so
/// that journalctl leaves the entry out without a word.
fn damage_entry(file: &Path, i: u64) {
    let mut data = std::fs::read(file).unwrap();
    // An entry object: header (type, flags, reserved, size: 16 bytes),
    // seqnum, then realtime and monotonic, which `export_entry` chose.
    let mut pat = (BASE_US + i * 7).to_le_bytes().to_vec();
    pat.extend_from_slice(&(5_000_000 + i * 7).to_le_bytes());
    let at = data
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap_or_else(|| panic!("entry {i}'s object not found"));
    data[at - 24] = 0x7f;
    std::fs::write(file, data).unwrap();
}

#[test]
fn entries_a_damaged_journal_file_loses_are_counted_and_logged() {
    tools();
    let dir = tempdir();
    let journal = dir.path().join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    const N: u64 = 3000;
    let file = write_journal(&journal, "a.journal", 0..N);
    for i in [1000, 1500, 2000] {
        damage_entry(&file, i);
    }
    // journalctl itself says nothing and gives the others.
    assert_eq!(journal_json(&journal).len(), N as usize - 3);
    let out = dir.path().join("out.ndjson");
    journald_pipeline(dir.path(), "damaged", &journal, "", &out, "ndjson");
    let agent = Agent::start(&dir.path().join("damaged.yaml"), &dir.path().join("data"));
    wait_lines(&out, N as usize - 3);
    let (got, lines) = seqs(&out);
    assert_eq!(lines, N as usize - 3);
    for i in [1000, 1500, 2000] {
        assert!(!got.contains(&i));
    }
    wait_metric(
        &agent,
        "petrel_component_errors_total",
        &source_error("damaged", "journal", "journal_skipped"),
        3.0,
        false,
    );
    assert!(
        agent.stderr().contains("journalctl left out entries"),
        "{}",
        agent.stderr()
    );
}
