//! `petrel convert`: a Fluent Bit configuration converted by the real
//! command, then run by the agent over real files, and the command's exit
//! statuses and report for what it cannot convert or read.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn convert(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("convert")
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn a_converted_fluent_bit_config_runs_with_fluent_bits_record_shape() {
    let d = tempdir();
    let logs = d.path().join("logs");
    let out = d.path().join("out");
    std::fs::create_dir_all(&logs).unwrap();
    let parsers = write(
        d.path(),
        "parsers.conf",
        "[PARSER]\n    Name   json\n    Format json\n",
    );
    let main = write(
        d.path(),
        "fluent-bit.conf",
        &format!(
            "[SERVICE]\n    Flush     1\n    Log_Level info\n\n[INPUT]\n    Name           tail\n    Tag            app\n    Path           {}/*.log\n    Parser         json\n    Read_from_Head On\n\n[FILTER]\n    Name    grep\n    Match   app\n    Exclude level ^debug$\n\n[FILTER]\n    Name    modify\n    Match   *\n    Set     env prod\n    Rename  msg text\n\n[OUTPUT]\n    Name  file\n    Match app\n    Path  {}\n    File  app.json\n    Format plain\n",
            logs.display(),
            out.display()
        ),
    );
    append(
        &logs.join("a.log"),
        b"{\"level\":\"info\",\"msg\":\"one\"}\n{\"level\":\"debug\",\"msg\":\"noise\"}\n{\"level\":\"warn\",\"msg\":\"two\"}\n",
    );
    let conf = d.path().join("petrel");
    let report = d.path().join("report.md");
    let (code, _, err) = convert(&[
        "--from",
        "fluent-bit",
        &main,
        &parsers,
        "--out",
        &conf.display().to_string(),
        "--report",
        &report.display().to_string(),
    ]);
    let md = std::fs::read_to_string(&report).unwrap_or_default();
    assert_eq!(code, 0, "{err}\n{md}");
    assert!(md.contains(", 0 not converted."), "{md}");
    // The output's format is named as approximated, with how it differs.
    assert!(
        md.contains("| [OUTPUT] file | Format | approximated |"),
        "{md}"
    );
    // What was written passes `petrel validate`.
    let v = Command::new(bin())
        .args(["validate", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
    let data = d.path().join("data");
    let _agent = Agent::start(&conf, &data);
    let file = out.join("app.json");
    wait_for(LONG, "two records", || {
        let n = count_lines(&file);
        if n >= 2 {
            Ok(())
        } else {
            Err(format!("{n} lines"))
        }
    });
    let records: Vec<serde_json::Value> = read_lines(&file)
        .iter()
        .map(|l| serde_json::from_slice(l).expect("json"))
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    for (r, text) in records.iter().zip(["one", "two"]) {
        // Fluent Bit's record: the parsed keys and the modify filter's
        // changes. The line also stays under `log` (the fluent-bit
        // layout's name for the message): the report calls the parser
        // approximated for that reason, checked below.
        assert_eq!(r["text"], text, "{r}");
        assert_eq!(r["env"], "prod", "{r}");
        assert!(r.get("msg").is_none(), "renamed: {r}");
        assert!(r["log"].as_str().is_some_and(|l| l.contains(text)), "{r}");
    }
    assert!(records.iter().all(|r| r["level"] != "debug"));
    assert!(
        md.contains("| [PARSER] json | Format | approximated | parse_json: the parsed keys join the record and the line stays in `log`"),
        "{md}"
    );
}

#[test]
fn what_is_not_converted_fails_the_command_unless_bypassed_and_bad_input_names_its_line() {
    let d = tempdir();
    let main = write(
        d.path(),
        "fluent-bit.conf",
        "[INPUT]\n    Name  tail\n    Path  /var/log/app.log\n\n[FILTER]\n    Name   lua\n    Match  *\n    script x.lua\n    call   f\n\n[OUTPUT]\n    Name    stdout\n    Match   *\n    Frobnicate 1\n",
    );
    let (code, stdout, err) = convert(&["--from", "fluent-bit", &main]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "| [FILTER] lua | — | not converted | write the script as a `remap` (VRL) program |"
        ),
        "{err}"
    );
    assert!(
        err.contains("| [OUTPUT] stdout | Frobnicate | not converted |"),
        "{err}"
    );
    assert!(
        stdout.contains("type: \"stdout\""),
        "the pipelines are printed: {stdout}"
    );
    let (code, _, err) = convert(&["--from", "fluent-bit", &main, "--bypass-errors"]);
    assert_eq!(code, 0, "{err}");
    let bad = write(
        d.path(),
        "bad.conf",
        "[INPUT]\n    Name tail\n[OUTPUT\n    Name stdout\n",
    );
    let (code, _, err) = convert(&["--from", "fluent-bit", &bad]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("bad.conf:3: `[OUTPUT`: a section header is `[NAME]`"),
        "{err}"
    );
    write(d.path(), "loop_a.conf", "@INCLUDE loop_b.conf\n");
    let b = write(d.path(), "loop_b.conf", "@INCLUDE loop_a.conf\n");
    let (code, _, err) = convert(&["--from", "fluent-bit", &b]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`@INCLUDE` loop"), "{err}");
}

/// Fluent Bit's tail database, as its `in_tail` plugin creates it.
fn fluent_bit_db(path: &Path, rows: &[(&Path, u64, u64)]) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "CREATE TABLE in_tail_files (id INTEGER PRIMARY KEY, name TEXT NOT NULL, offset INTEGER, inode INTEGER, created INTEGER, rotated INTEGER DEFAULT 0);",
    )
    .unwrap();
    for (name, offset, inode) in rows {
        c.execute(
            "INSERT INTO in_tail_files (name, offset, inode, created) VALUES (?1, ?2, ?3, 0)",
            rusqlite::params![name.display().to_string(), *offset as i64, *inode as i64],
        )
        .unwrap();
    }
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().ino()
}

#[test]
fn imported_fluent_bit_positions_send_every_later_line_once_and_nothing_before() {
    let d = tempdir();
    let logs = d.path().join("logs");
    let out = d.path().join("out");
    std::fs::create_dir_all(&logs).unwrap();
    let lines = |f: &str, from: usize, to: usize| -> String {
        (from..to).map(|i| format!("{f} line {i}\n")).collect()
    };
    // a: Fluent Bit delivered 6 of 10 lines. c: all 5, and more come
    // after the switch. b: rotated after Fluent Bit stopped (its
    // position names the old inode).
    let a = logs.join("a.log");
    let b = logs.join("b.log");
    let c = logs.join("c.log");
    append(&a, lines("a", 0, 10).as_bytes());
    append(&b, lines("b", 0, 4).as_bytes());
    append(&c, lines("c", 0, 5).as_bytes());
    let a_pos = lines("a", 0, 6).len() as u64;
    let b_old = inode(&b);
    std::fs::rename(&b, logs.join("b.log.1")).unwrap();
    append(&b, lines("b-new", 0, 3).as_bytes());
    let db = d.path().join("tail.db");
    fluent_bit_db(
        &db,
        &[
            (&a, a_pos, inode(&a)),
            (&b, 40, b_old),
            (&c, lines("c", 0, 5).len() as u64, inode(&c)),
        ],
    );
    let main = write(
        d.path(),
        "fluent-bit.conf",
        &format!(
            "[INPUT]\n    Name           tail\n    Path           {}/*.log\n    DB             {}\n    Read_from_Head On\n\n[OUTPUT]\n    Name  file\n    Match *\n    Path  {}\n    File  all.json\n",
            logs.display(),
            db.display(),
            out.display()
        ),
    );
    let conf = d.path().join("petrel");
    let data = d.path().join("data");
    let (code, _, err) = convert(&[
        "--from",
        "fluent-bit",
        &main,
        "--out",
        &conf.display().to_string(),
        "--import-positions",
        &db.display().to_string(),
        "--data-dir",
        &data.display().to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 position(s) of 3 imported"), "{err}");
    assert!(err.contains("rotated since"), "{err}");
    let agent = Agent::start(&conf, &data);
    append(&c, lines("c", 5, 8).as_bytes());
    let file = out.join("all.json");
    let want = 4 + 3 + 3;
    wait_for(LONG, "the lines after the positions", || {
        let n = count_lines(&file);
        if n >= want {
            Ok(())
        } else {
            Err(format!("{n} of {want} lines"))
        }
    });
    // Nothing more comes (nothing before a position is read again).
    drop(agent);
    let mut got: Vec<String> = read_lines(&file)
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).expect("json");
            v["log"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    got.sort();
    let mut expect: Vec<String> = [lines("a", 6, 10), lines("b-new", 0, 3), lines("c", 5, 8)]
        .concat()
        .lines()
        .map(str::to_string)
        .collect();
    expect.sort();
    assert_eq!(got, expect);
}
