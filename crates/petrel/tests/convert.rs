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
