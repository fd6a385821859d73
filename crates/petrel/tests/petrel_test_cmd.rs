//! `petrel test`: pipeline unit tests run by the real binary. Passing and
//! failing suites (exit codes, counts, the exact diff), malformed test
//! files (exit 2 with file, line and key), the JUnit report (parsed by
//! Python's XML parser) and the shipped example tests.

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A configuration directory with one pipeline `web`: parse_regex,
/// filter, fields; a file source and a file sink in `dir` (neither may be
/// touched by `petrel test`).
fn web_config(dir: &Path) -> PathBuf {
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).expect("mkdir conf");
    let yaml = format!(
        r#"sources:
  - type: file
    id: access
    include: ["{logs}/*.log"]
processors:
  - type: parse_regex
    id: parse
    pattern: '^(?<client>\S+) (?<method>[A-Z]+) (?<path>\S+) (?<status>\d{{3}})$'
    on_error: drop
  - type: filter
    id: no_health
    exclude:
      path: '^/healthz$'
  - type: fields
    id: tag
    add:
      service: web
sinks:
  - type: file
    id: out
    path: "{out}"
    encoding: ndjson
"#,
        logs = dir.join("logs").display(),
        out = dir.join("out.ndjson").display(),
    );
    write_config(&conf, "web", &yaml);
    conf
}

const PASSING: &str = r#"pipeline: web
tests:
  - name: requests become fields
    input:
      - '10.0.0.1 GET /index.html 200'
    at: parse
    expect:
      count: 1
      events:
        - equals: { client: 10.0.0.1, method: GET, status: "200" }
          matches: { path: '^/index' }
          absent: [service]
  - name: health checks and garbage are dropped, the rest is tagged
    input: |
      10.0.0.2 GET /healthz 200
      not a request
      10.0.0.3 POST /login 302
    at: out
    expect:
      count: 1
      dropped: { filtered: 1, parse_error: 1 }
      events:
        - equals: { client: 10.0.0.3, service: web }
"#;

const FAILING: &str = r#"pipeline: web
tests:
  - name: still passes
    input: ['10.0.0.1 GET / 200']
    expect: { count: 1 }
  - name: wrong expectations
    input:
      - '10.0.0.2 GET /healthz 200'
      - '10.0.0.3 POST /login 302'
    expect:
      count: 2
      dropped: { filtered: 0 }
      events:
        - equals: { status: "200", user: bob }
          matches: { path: '^/api/' }
          absent: [client]
        - equals: { client: 10.0.0.3 }
"#;

#[test]
fn passing_suite_exits_0_and_counts_the_tests() {
    let dir = tempdir();
    let conf = web_config(dir.path());
    // Beside the pipelines: found by default, and skipped as a pipeline.
    std::fs::write(conf.join("web.test.yaml"), PASSING).expect("write test");
    let (code, stdout, stderr) = run_to_end(dir.path(), &["test", "--config", "conf"]);
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("ok   conf/web.test.yaml: requests become fields\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n2 passed, 0 failed (1 test file(s))\n"),
        "{stdout}"
    );
    // Sources and sinks were never started.
    assert!(!dir.path().join("out.ndjson").exists());
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "conf"]);
    assert_eq!(
        code,
        Some(0),
        "the test file must not count as a pipeline: {stdout}"
    );
    assert!(stdout.contains("1 pipeline(s) valid"), "{stdout}");
}

#[test]
fn failing_suite_exits_1_and_prints_the_diff() {
    let dir = tempdir();
    web_config(dir.path());
    std::fs::write(dir.path().join("fail.test.yaml"), FAILING).expect("write test");
    let (code, stdout, stderr) =
        run_to_end(dir.path(), &["test", "--config", "conf", "fail.test.yaml"]);
    assert_eq!(code, Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == "FAIL fail.test.yaml: wrong expectations")
        .unwrap_or_else(|| panic!("no FAIL line in:\n{stdout}"));
    assert_eq!(
        lines[start + 1..start + 10],
        [
            "  count at the sinks' input: expected 2, got 1",
            "  dropped with reason `filtered` before the sinks' input: expected 0, got 1",
            "  event 0, field `status`: expected \"200\", got \"302\"",
            "  event 0, field `user`: expected \"bob\", got no such field",
            "  event 0, field `path`: expected a match of /^/api//, got \"/login\"",
            "  event 0, field `client`: expected absent, got \"10.0.0.3\"",
            "  event 1: expected an event, got none (1 event(s) at the sinks' input)",
            "  discarded: filtered=1 (no_health)",
            "  actual events:",
        ],
        "{stdout}"
    );
    // The rest of the line holds this machine's host name.
    assert!(
        lines[start + 10].starts_with("    0: {\"message\":\"10.0.0.3 POST /login 302\""),
        "{stdout}"
    );
    assert!(
        lines.contains(&"ok   fail.test.yaml: still passes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n1 passed, 1 failed (1 test file(s))\n"),
        "{stdout}"
    );
}

#[test]
fn malformed_test_file_exits_2_naming_file_line_and_key() {
    let dir = tempdir();
    web_config(dir.path());
    let bad = "pipeline: web\ntests:\n  - name: typo\n    input: ['x']\n    expect:\n      count: one\n      events:\n        - equls: { client: x }\n";
    std::fs::write(dir.path().join("bad.test.yaml"), bad).expect("write test");
    let (code, stdout, stderr) =
        run_to_end(dir.path(), &["test", "--config", "conf", "bad.test.yaml"]);
    assert_eq!(code, Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "bad.test.yaml:6:14: `tests[0].expect.count` must be a non-negative integer, found `one`",
            "bad.test.yaml:8:11: unknown key `equls` in `tests[0].expect.events[0]`; did you mean `equals`?",
        ],
        "{stdout}"
    );
    // With several pipelines, the test file must say which.
    let conf = dir.path().join("conf");
    write_config(
        &conf,
        "other",
        "sources:\n  - type: stdin\nsinks:\n  - type: blackhole\n",
    );
    let unnamed = "tests:\n  - input: ['x']\n    expect: { count: 1 }\n";
    std::fs::write(dir.path().join("unnamed.test.yaml"), unnamed).expect("write test");
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["test", "--config", "conf", "unnamed.test.yaml"],
    );
    assert_eq!(code, Some(2), "{stdout}");
    assert_eq!(
        stdout,
        "unnamed.test.yaml:1:1: missing required key `pipeline`: the configuration has several pipelines (other, web)\n"
    );
    // A component that is not in the pipeline.
    let bad_at =
        "pipeline: web\ntests:\n  - input: ['x']\n    at: prase\n    expect: { count: 1 }\n";
    std::fs::write(dir.path().join("at.test.yaml"), bad_at).expect("write test");
    let (code, stdout, _) = run_to_end(dir.path(), &["test", "--config", "conf", "at.test.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(
        stdout.starts_with(
            "at.test.yaml:4:9: `at`: no component `prase` in pipeline `web`; did you mean `parse`?"
        ),
        "{stdout}"
    );
}

#[test]
fn junit_report_parses_with_the_right_counts() {
    let dir = tempdir();
    web_config(dir.path());
    std::fs::write(dir.path().join("a.test.yaml"), PASSING).expect("write test");
    std::fs::write(dir.path().join("b.test.yaml"), FAILING).expect("write test");
    let report = dir.path().join("report.xml");
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &[
            "test",
            "--config",
            "conf",
            "--junit",
            report.to_str().expect("utf-8"),
            "a.test.yaml",
            "b.test.yaml",
        ],
    );
    assert_eq!(code, Some(1), "{stdout}");
    let script = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.findall('./testsuite/testcase')
fails = [c for c in cases if c.find('failure') is not None]
print(root.tag, root.get('tests'), root.get('failures'), len(root.findall('testsuite')), len(cases), len(fails))
for c in fails:
    print(c.get('classname'), '|', c.get('name'), '|', c.find('failure').get('message'))
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&report)
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the report does not parse: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&report).unwrap_or_default()
    );
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "testsuites 4 1 2 4 1",
            "web | wrong expectations | count at the sinks' input: expected 2, got 1",
        ]
    );
}

#[test]
fn shipped_example_tests_pass() {
    let root = repo_root();
    for (config, tests) in [
        ("examples/pipelines/nginx-kafka.yaml", 3),
        ("examples/pipelines/app-json-http.yaml", 4),
        ("examples/config-dir/pipelines/", 1),
    ] {
        let (code, stdout, stderr) = run_to_end(&root, &["test", "--config", config]);
        assert_eq!(code, Some(0), "{config}:\n{stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("\n{tests} passed, 0 failed (1 test file(s))\n")),
            "{config}:\n{stdout}"
        );
    }
}
