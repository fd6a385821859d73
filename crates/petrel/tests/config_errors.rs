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
        "sources:\n  - type: http\n    address: 127.0.0.1:8080\n    buffer: { type: disk, max_size: 4MiB }\nsinks:\n  - type: blackhole\n",
        &["body_vs_spool.yaml:4:37: `buffer.max_size` (4194304) must be at least twice `max_body_bytes` (10485760): every request is one spool record; raise `buffer.max_size` or lower `max_body_bytes`"],
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
        &["duplicate_key.yaml:6:1: duplicate key `sources` (also on line 1); remove one of the two"],
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
        // As VRL prints them: several lines, the caret under the column.
        &[
            "remap.yaml:6:18: remap: error[E105]: call to undefined function",
            "  ┌─ :1:6",
            "  │",
            "1 │ .a = foo(1)",
            "  │      ^^^",
            "  │      │",
            "  │      undefined function",
            "  │      did you mean \"bool\"?",
            "  │",
            "  = learn more about error code 105 at https://errors.vrl.dev/105",
            "  = see language documentation at https://vrl.dev",
            "  = try your code in the VRL REPL, learn more at https://vrl.dev/examples",
            "remap.yaml:8:19: remap: error[E204]: syntax error",
            "  ┌─ :1:7",
            "  │",
            "1 │ .a = (",
            "  │       ^",
            "  │",
            "  │       unexpected end of program",
            "  │       expected one of: \"identifier\", \"string literal\", \"raw string literal\", \"integer literal\", \"float literal\", \"regex literal\", \"timestamp literal\", \"function call\", \"path literal\", \"null\", \"true\", \"false\", \"_\", \"!\", \"[\", \"{\", \"(\"",
            "  │",
            "  = see language documentation at https://vrl.dev",
            "  = try your code in the VRL REPL, learn more at https://vrl.dev/examples",
        ],
    ),
    (
        "empty_include.yaml",
        "sources:\n  - type: file\n    include: [\"\"]\nsinks:\n  - type: stdout\n",
        &["empty_include.yaml:3:15: an include glob must not be empty; write a path such as `/var/log/app/*.log`"],
    ),
    (
        // `${VAR}` in any value: an unset one is refused at its `${`,
        // naming it, in a list item, a URL and a program alike.
        "unset_env.yaml",
        "sources:\n  - type: file\n    include: [\"/var/log/${PETREL_TEST_UNSET_A}/*.log\"]\nprocessors:\n  - type: remap\n    source: |\n      .a = \"${PETREL_TEST_UNSET_B}\"\nsinks:\n  - type: elasticsearch\n    endpoints: [\"http://${PETREL_TEST_UNSET_C}:9200\", \"http://${OK:-es}:9200\"]\n",
        &[
            "unset_env.yaml:3:25: environment variable `PETREL_TEST_UNSET_A` is not set (or not UTF-8); set it, or give a default with `${PETREL_TEST_UNSET_A:-default}`",
            "unset_env.yaml:7:13: environment variable `PETREL_TEST_UNSET_B` is not set (or not UTF-8); set it, or give a default with `${PETREL_TEST_UNSET_B:-default}`",
            "unset_env.yaml:10:25: environment variable `PETREL_TEST_UNSET_C` is not set (or not UTF-8); set it, or give a default with `${PETREL_TEST_UNSET_C:-default}`",
        ],
    ),
    (
        "bad_env_name.yaml",
        "sources:\n  - type: file\n    include: [\"x/*.log\"]\nsinks:\n  - type: file\n    path: \"out/${1ST}.log\"\n",
        &["bad_env_name.yaml:6:16: invalid environment variable name `1ST`: use letters, digits and `_`, e.g. `${HOSTNAME}` or `${REGION:-eu-west-1}`; write `$${` for a literal `${`"],
    ),
    (
        // A problem in an anchored mapping is reported where it was
        // written, for each entry that merges it.
        "anchors.yaml",
        "x-out: &out\n  type: file\n  encoding: ndjsn\nsources:\n  - type: file\n    include: [\"x/*.log\"]\nsinks:\n  - <<: *out\n    path: out/a.log\n  - <<: *out\n    path: out/b.log\n",
        &[
            "anchors.yaml:3:13: `sinks[0].encoding` must be one of `text`, `ndjson`, found `ndjsn`; did you mean `ndjson`?",
            "anchors.yaml:3:13: `sinks[1].encoding` must be one of `text`, `ndjson`, found `ndjsn`; did you mean `ndjson`?",
        ],
    ),
    (
        "merge_scalar.yaml",
        "x-n: &n 5\nsources:\n  - type: file\n    include: [\"x/*.log\"]\n    <<: *n\nsinks:\n  - type: stdout\n",
        &["merge_scalar.yaml:5:9: `<<` merges a mapping or a list of mappings, e.g. `<<: *defaults` where `defaults` is an anchor on a mapping"],
    ),
    (
        "yaml_tag.yaml",
        "sources:\n  - type: file\n    include: !!seq [\"x/*.log\"]\nsinks:\n  - type: stdout\n",
        &["yaml_tag.yaml:3:20: YAML tags are not supported (`!!seq`); remove the tag"],
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

/// Runs `petrel ARGS` in `cwd` with `env` added; (exit code, stdout,
/// stderr).
fn run_with_env(
    cwd: &Path,
    args: &[&str],
    env: &[(&str, String)],
) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(bin())
        .current_dir(cwd)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("PETREL_LOG")
        .output()
        .expect("run petrel");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `${VAR}` in every kind of value: a URL (refused before as an invalid
/// URL), a list, a number-like string, a duration, a program, a path; all
/// `validate` without a word, and `run` writes what the variables hold.
/// Anchors and merge keys carry values from `x-` blocks, which are
/// otherwise ignored (one of them uses a variable that is not set).
#[test]
fn env_in_every_key_type_with_anchors_validate_and_run() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = dir.path().join("out.ndjson");
    let yaml = "\
x-unused: { a: \"${PETREL_T_NEVER_SET}\" }
x-fields: &fields
  env: \"${PETREL_T_ENV}\"
  price: \"$$5 and $${NOT_A_VAR}\"
x-sink: &sink
  type: file
  encoding: ndjson
sources:
  - type: file
    include: [\"${PETREL_T_LOGS}/*.log\"]
    read_from: beginning
    max_line_bytes: \"${PETREL_T_MAXLINE}\"
processors:
  - type: fields
    add:
      <<: *fields
      region: \"${PETREL_T_REGION:-eu-west-1}\"
  - type: remap
    source: |
      .tag = \"${PETREL_T_TAG}\"
sinks:
  - <<: *sink
    path: \"${PETREL_T_OUT}\"
  - type: elasticsearch
    endpoints: [\"http://${PETREL_T_ES_HOST}:9200\"]
    batch: { timeout_ms: \"${PETREL_T_LINGER}\" }
    when: { vrl: '.tag == \"${PETREL_T_TAG}-never\"' }
  - type: loki
    endpoint: \"${PETREL_T_LOKI}\"
    labels: { app: x }
    when: { vrl: 'false' }
  - type: http
    url: \"http://127.0.0.1:${PETREL_T_PORT}/ingest\"
    when: { vrl: 'false' }
";
    std::fs::write(dir.path().join("env.yaml"), yaml).unwrap();
    let env = vec![
        ("PETREL_T_ENV", "production".to_string()),
        ("PETREL_T_LOGS", logs.to_string_lossy().into_owned()),
        ("PETREL_T_MAXLINE", "4096".to_string()),
        ("PETREL_T_TAG", "t1".to_string()),
        ("PETREL_T_OUT", out.to_string_lossy().into_owned()),
        ("PETREL_T_ES_HOST", "127.0.0.1".to_string()),
        ("PETREL_T_LINGER", "100".to_string()),
        ("PETREL_T_LOKI", "http://127.0.0.1:3100".to_string()),
        ("PETREL_T_PORT", "9".to_string()),
    ];
    let (code, stdout, stderr) =
        run_with_env(dir.path(), &["validate", "--config", "env.yaml"], &env);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    // The same file without one of them: refused by validate and run alike.
    let missing: Vec<(&str, String)> = env
        .iter()
        .filter(|(k, _)| *k != "PETREL_T_LOKI")
        .cloned()
        .collect();
    let (code, stdout, _) =
        run_with_env(dir.path(), &["validate", "--config", "env.yaml"], &missing);
    assert_eq!(code, Some(2), "{stdout}");
    assert_eq!(
        lines(&stdout),
        vec!["env.yaml:29:16: environment variable `PETREL_T_LOKI` is not set (or not UTF-8); set it, or give a default with `${PETREL_T_LOKI:-default}`"]
    );
    let data = dir.path().join("data");
    let (code, _, stderr) = run_with_env(
        dir.path(),
        &[
            "run",
            "--config",
            "env.yaml",
            "--data-dir",
            &data.to_string_lossy(),
            "--api-addr",
            "127.0.0.1:0",
        ],
        &missing,
    );
    assert_eq!(code, Some(2));
    assert_eq!(lines(&stderr), lines(&stdout));

    std::fs::write(logs.join("a.log"), "hello\n").unwrap();
    let mut agent = Agent::start_with(
        &dir.path().join("env.yaml"),
        &data,
        AgentOptions {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        },
    );
    wait_lines(&out, 1);
    agent.stop();
    let v = &json_lines(&out)[0];
    assert_eq!(v["message"], "hello", "{v}");
    assert_eq!(v["env"], "production", "{v}");
    assert_eq!(v["price"], "$5 and ${NOT_A_VAR}", "{v}");
    assert_eq!(v["region"], "eu-west-1", "{v}");
    assert_eq!(v["tag"], "t1", "{v}");
}

/// A source's buffer size is `max_size`, as a sink's; the old name
/// `max_bytes` still loads, with a warning that says what to write.
#[test]
fn the_old_name_of_a_buffer_size_loads_with_a_warning() {
    let dir = tempdir();
    let yaml = "sources:\n  - type: http\n    address: 127.0.0.1:0\n    buffer: { type: disk, max_bytes: 64MiB }\nsinks:\n  - type: blackhole\n";
    std::fs::write(dir.path().join("old.yaml"), yaml).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "old.yaml"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(
        lines(&stdout),
        vec![
            "old.yaml:4:38: warning: `buffer.max_bytes` is deprecated: write `max_size` (the name a sink's disk buffer uses)",
            "old.yaml: 1 pipeline(s) valid",
        ]
    );
    let both = "sources:\n  - type: http\n    address: 127.0.0.1:0\n    buffer: { type: disk, max_size: 64MiB, max_bytes: 64MiB }\nsinks:\n  - type: blackhole\n";
    std::fs::write(dir.path().join("both.yaml"), both).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "both.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(
        stdout.contains("`max_bytes` is the old name of `max_size`"),
        "{stdout}"
    );
}

/// `validate --offline` checks a configuration away from its host: the
/// TLS files and the program file it names need not exist there, while
/// every other problem is still reported.
#[test]
fn validate_offline_skips_what_needs_the_host() {
    let dir = tempdir();
    let yaml = "sources:\n  - type: tcp\n    address: 127.0.0.1:0\n    tls: { cert_file: /etc/petrel/tls/missing.crt, key_file: /etc/petrel/tls/missing.key }\nprocessors:\n  - type: remap\n    file: /etc/petrel/programs/missing.vrl\nsinks:\n  - type: blackhole\n";
    std::fs::write(dir.path().join("host.yaml"), yaml).unwrap();
    let (code, stdout, _) = run_to_end(dir.path(), &["validate", "--config", "host.yaml"]);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("missing.crt"), "{stdout}");
    assert!(stdout.contains("missing.vrl"), "{stdout}");
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["validate", "--offline", "--config", "host.yaml"],
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "warning: the VRL program `/etc/petrel/programs/missing.vrl` was not checked"
        ),
        "{stdout}"
    );
    // A mistake in the configuration itself is still one.
    let bad = yaml.replace("type: blackhole", "type: blackhol");
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let (code, stdout, _) = run_to_end(
        dir.path(),
        &["validate", "--offline", "--config", "bad.yaml"],
    );
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("unknown sink type `blackhol`"), "{stdout}");
}
