//! Broken pipeline files: `petrel validate` prints exactly one
//! `FILE:LINE:COL: message` line per problem and exits 2, and `petrel run`
//! refuses to start with the same lines on stderr.

mod common;

use std::path::Path;

use common::*;

/// (file name, contents, expected lines). The file is passed by its
/// relative name, so that is how it appears in the messages.
const CASES: &[(&str, &str, &[&str])] = &[
    (
        "unknown_key.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/*.log\"]\nsinkz:\n  - type: stdout\n",
        &[
            "unknown_key.yaml:1:1: missing required key `sinks` in the file; add for example `sinks: [{ type: stdout }]`",
            "unknown_key.yaml:4:1: unknown key `sinkz` in the file; did you mean `sinks`?",
        ],
    ),
    (
        "unknown_source_key.yaml",
        "sources:\n  - type: file\n    includ: [\"/var/log/*.log\"]\nsinks:\n  - type: blackhole\n",
        &[
            "unknown_source_key.yaml:2:5: missing required key `include` in `sources[0]`; add for example `include: [\"/var/log/app/*.log\"]`",
            "unknown_source_key.yaml:3:5: unknown key `includ` in `sources[0]`; did you mean `include`?",
        ],
    ),
    (
        "wrong_enum.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/*.log\"]\n    read_from: begining\nsinks:\n  - type: stdout\n    encoding: jsonl\n",
        &[
            "wrong_enum.yaml:4:16: `sources[0].read_from` must be one of `beginning`, `end`, found `begining`; did you mean `beginning`?",
            "wrong_enum.yaml:7:15: `sinks[0].encoding` must be one of `text`, `ndjson`, found `jsonl`",
        ],
    ),
    (
        "unknown_type.yaml",
        "sources:\n  - type: fiel\n    include: [\"/var/log/*.log\"]\nsinks:\n  - type: stdout\n",
        &["unknown_type.yaml:2:11: unknown source type `fiel`; did you mean `file`?; available: `file`, `kubernetes_logs`, `container_files`, `stdin`, `journald`, `kernel`, `internal_logs`, `fluent`, `beats`, `syslog`, `tcp`, `http`, `splunk_hec`, `spool`, `kafka`, `opentelemetry`"],
    ),
    (
        "body_vs_spool.yaml",
        "sources:\n  - type: http\n    address: 127.0.0.1:8080\n    buffer: { type: disk, max_bytes: 4MiB }\nsinks:\n  - type: blackhole\n",
        &["body_vs_spool.yaml:4:38: `buffer.max_bytes` (4194304) must be at least twice `max_body_bytes` (10485760): every request is one spool record; raise `buffer.max_bytes` or lower `max_body_bytes`"],
    ),
    (
        "otlp.yaml",
        "sources:\n  - type: opentelemetry\n    max_body_bytes: 1MiB\nsinks:\n  - type: opentelemetry\n    endpoint: http://127.0.0.1:4318\n  - type: opentelemetry\n    protocol: grpc\n    endpoint: http://127.0.0.1:4317\n    encoding: json\n",
        &[
            "otlp.yaml:2:5: give `grpc_address` (e.g. `127.0.0.1:4317`), `http_address` (e.g. `127.0.0.1:4318`) or both",
            "otlp.yaml:6:15: `endpoint` is the full URL for `protocol: http`, path included, e.g. `http://127.0.0.1:4318/v1/logs`",
            "otlp.yaml:10:15: `encoding: json` is for `protocol: http`; gRPC always sends protobuf",
        ],
    ),
    (
        "missing_sinks.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/*.log\"]\n",
        &["missing_sinks.yaml:1:1: missing required key `sinks` in the file; add for example `sinks: [{ type: stdout }]`"],
    ),
    (
        "bad_glob.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/[.log\", \"/var/log/*.log\"]\nsinks:\n  - type: blackhole\n",
        &["bad_glob.yaml:3:15: invalid glob `/var/log/[.log`: unclosed character class; missing ']'; check brackets and braces"],
    ),
    (
        "syntax.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/*.log\"\nsinks:\n  - type: stdout\n",
        &["syntax.yaml:4:1: YAML syntax error: invalid indentation at byte 55 line 4 column 1"],
    ),
    (
        "duplicate_key.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/*.log\"]\nsinks:\n  - type: stdout\nsources: []\n",
        &["duplicate_key.yaml:6:1: duplicate key `sources`; remove one of the two"],
    ),
    (
        // Every problem of a source is reported, not only the first one.
        "all_problems.yaml",
        "sources:\n  - type: file\n    read_from: middle\n    max_line_bytes: 10\n    partial_line_timeout_ms: soon\nsinks:\n  - type: stdout\n",
        &[
            "all_problems.yaml:2:5: missing required key `include` in `sources[0]`; add for example `include: [\"/var/log/app/*.log\"]`",
            "all_problems.yaml:3:16: `sources[0].read_from` must be one of `beginning`, `end`, found `middle`",
            "all_problems.yaml:4:21: `max_line_bytes` must be at least 64",
            "all_problems.yaml:5:30: `sources[0].partial_line_timeout_ms` must be a non-negative integer, found `soon`",
        ],
    ),
    (
        // One problem, one line: an invalid glob is not also reported as a
        // missing one.
        "dotdot.yaml",
        "sources:\n  - type: file\n    include: \"../elsewhere/*.log\"\nsinks:\n  - type: stdout\n",
        &["dotdot.yaml:3:14: include glob `../elsewhere/*.log` must not contain `..`"],
    ),
    (
        // The pipeline would read back its own output forever.
        "feedback.yaml",
        "sources:\n  - type: file\n    include: [\"logs/*.log\"]\nsinks:\n  - type: blackhole\n  - type: file\n    path: logs/out.log\n",
        &["feedback.yaml:7:11: the file sink writes `logs/out.log`, which source `file_0` of this pipeline reads: it would read its own output forever; write elsewhere or add the path to that source's `exclude`"],
    ),
    (
        // `..` does not hide the loop.
        "feedback_dotdot.yaml",
        "sources:\n  - type: file\n    include: [\"ll/*.log\"]\nsinks:\n  - type: file\n    path: ll/sub/../out.log\n",
        &["feedback_dotdot.yaml:6:11: the file sink writes `ll/sub/../out.log`, which source `file_0` of this pipeline reads: it would read its own output forever; write elsewhere or add the path to that source's `exclude`"],
    ),
    (
        // VRL's own diagnostics, at their place in the program.
        "remap.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/x.log\"]\nprocessors:\n  - type: remap\n    source: .a = foo(1)\n  - type: remap\n    source: .a = (\nsinks:\n  - type: blackhole\n",
        &[
            "remap.yaml:6:18: remap: VRL error[E105]: call to undefined function: undefined function: did you mean \"bool\"?",
            "remap.yaml:8:19: remap: VRL error[E204]: syntax error: unexpected end of program: expected one of: \"identifier\", \"string literal\", \"raw string literal\", \"integer literal\", \"float literal\", \"regex literal\", \"timestamp literal\", \"function call\", \"path literal\", \"null\", \"true\", \"false\", \"_\", \"!\", \"[\", \"{\", \"(\"",
        ],
    ),
    (
        "empty_include.yaml",
        "sources:\n  - type: file\n    include: [\"\"]\nsinks:\n  - type: stdout\n",
        &["empty_include.yaml:3:15: an include glob must not be empty; write a path such as `/var/log/app/*.log`"],
    ),
    (
        "empty_sink_path.yaml",
        "sources:\n  - type: file\n    include: [\"x/*.log\"]\nsinks:\n  - type: file\n    path: \"\"\n",
        &["empty_sink_path.yaml:5:5: `path` must not be empty"],
    ),
];

fn lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.is_empty()).collect()
}

fn setup() -> tempfile::TempDir {
    let dir = tempdir();
    for (name, yaml, _) in CASES {
        std::fs::write(dir.path().join(name), yaml).unwrap();
    }
    dir
}

#[test]
fn validate_prints_exact_positions_and_exits_2() {
    let dir = setup();
    let mut failures = Vec::new();
    for (name, _, expected) in CASES {
        let (code, stdout, stderr) = run_to_end(dir.path(), &["validate", "--config", name]);
        if code != Some(2) || lines(&stdout) != *expected {
            failures.push(format!(
                "{name}: exit {code:?}\n  expected:\n    {}\n  got stdout:\n    {}\n  stderr: {stderr}",
                expected.join("\n    "),
                lines(&stdout).join("\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn run_with_bad_config_exits_2_with_same_lines_on_stderr() {
    let dir = setup();
    let data = dir.path().join("data");
    let data = data.to_string_lossy();
    let mut failures = Vec::new();
    for (name, _, expected) in CASES {
        let (code, stdout, stderr) = run_to_end(
            dir.path(),
            &[
                "run",
                "--config",
                name,
                "--data-dir",
                &data,
                "--api-addr",
                "127.0.0.1:0",
            ],
        );
        let got = lines(&stderr);
        if code != Some(2) || got != *expected || !stdout.is_empty() {
            failures.push(format!(
                "{name}: exit {code:?}\n  expected on stderr:\n    {}\n  got stderr:\n    {}\n  stdout: {stdout}",
                expected.join("\n    "),
                got.join("\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        !Path::new(&*data).join("checkpoints.json").exists(),
        "a refused configuration must not touch the data dir"
    );
}

#[test]
fn valid_config_and_directories() {
    let dir = tempdir();
    let ok = "sources:\n  - type: file\n    include: [\"logs/*.log\"]\nsinks:\n  - type: file\n    path: out/x.log\n";
    std::fs::write(dir.path().join("ok.yaml"), ok).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "ok.yaml"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout, "ok.yaml: 1 pipeline(s) valid\n");
    // Writing into a watched directory is fine when the output is excluded.
    std::fs::write(
        dir.path().join("excluded.yaml"),
        "sources:\n  - type: file\n    include: [\"logs/*.log\"]\n    exclude: [\"out.log\"]\nsinks:\n  - type: file\n    path: logs/out.log\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "excluded.yaml"]);
    assert_eq!(code, Some(0), "{stdout}");

    // A directory: every *.yaml/*.yml is a pipeline; problems name the file.
    let pipelines = dir.path().join("pipelines");
    std::fs::create_dir(&pipelines).unwrap();
    std::fs::write(pipelines.join("a.yaml"), ok).unwrap();
    std::fs::write(pipelines.join("b.yml"), ok).unwrap();
    std::fs::write(pipelines.join("notes.txt"), "not a pipeline: [").unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "pipelines"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout, "pipelines: 2 pipeline(s) valid\n");
    std::fs::write(
        pipelines.join("c.yaml"),
        "sources:\n  - type: file\n    include: [\"x/*.log\"]\nsinks:\n  - type: stdout\n    encoding: txt\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "pipelines"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert_eq!(
        lines(&stdout),
        vec!["pipelines/c.yaml:6:15: `sinks[0].encoding` must be one of `text`, `ndjson`, found `txt`; did you mean `text`?"]
    );

    // An empty directory is an error too.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "empty"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert_eq!(
        lines(&stdout),
        vec!["empty:1:1: no pipeline files (*.yaml or *.yml) in this directory; add one, e.g. from examples/"]
    );
}

/// A symlinked directory does not hide a feedback loop either.
#[test]
fn feedback_through_a_symlinked_directory_is_refused() {
    let dir = tempdir();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
    std::fs::write(
        dir.path().join("sym.yaml"),
        "sources:\n  - type: file\n    include: [\"link/*.log\"]\nsinks:\n  - type: file\n    path: real/out.log\n",
    )
    .unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "sym.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert_eq!(
        lines(&stdout),
        vec!["sym.yaml:6:11: the file sink writes `real/out.log`, which source `file_0` of this pipeline reads: it would read its own output forever; write elsewhere or add the path to that source's `exclude`"]
    );
}

/// The elasticsearch sink reads `id` as its document id setting, so two
/// of them with `id: auto` in one pipeline are fine; their component ids
/// come from `component_id`, and a duplicate one is refused there.
#[test]
fn a_sink_whose_id_is_a_setting_takes_its_component_id_from_component_id() {
    let dir = tempdir();
    let two = "sources:\n  - type: file\n    include: [\"logs/*.log\"]\nsinks:\n  - type: elasticsearch\n    endpoints: [\"http://127.0.0.1:9200\"]\n    id: auto\n  - type: elasticsearch\n    endpoints: [\"http://127.0.0.1:9201\"]\n    id: auto\n";
    std::fs::write(dir.path().join("two.yaml"), two).unwrap();
    let (code, stdout, stderr) = run_to_end(dir.path(), &["validate", "--config", "two.yaml"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let clash = "sources:\n  - type: file\n    include: [\"logs/*.log\"]\nsinks:\n  - type: elasticsearch\n    endpoints: [\"http://127.0.0.1:9200\"]\n    component_id: es\n  - type: elasticsearch\n    endpoints: [\"http://127.0.0.1:9201\"]\n    component_id: es\n";
    std::fs::write(dir.path().join("clash.yaml"), clash).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "clash.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("duplicate sink id `es`"), "{stdout}");
}
