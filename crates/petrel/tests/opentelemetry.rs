//! The `opentelemetry` sink and source against a real OpenTelemetry
//! Collector v0.161.0 (built by scripts/otelcol.sh into .cache/otelcol):
//! Petrel → collector (gRPC) → Petrel (HTTP) keeps every line with its
//! attributes and resource; OTLP in → OTLP out keeps resource, scope and
//! record fields exactly (over HTTP protobuf and JSON, and the gRPC
//! source); a full spool answers 429 and the collector's retries then
//! deliver everything; TLS on both protocols; the sink's answers (retry,
//! dead letter, partial success); what the source answered 200 survives
//! `kill -9`.

#![cfg(feature = "opentelemetry")]

mod common;
mod otelcol;
mod server;
mod victorialogs;

use otelcol::Otelcol;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;

/// The collector's configuration: an OTLP receiver (`receiver`, YAML of
/// `protocols:`), the batch processor, and `exporter` (YAML, id first).
fn collector_config(receiver: &str, exporter: &str, exporter_id: &str) -> String {
    format!(
        "receivers:\n  otlp:\n    protocols:\n{receiver}processors:\n  batch:\n    send_batch_size: 1000\n    send_batch_max_size: 1000\n    timeout: 200ms\nexporters:\n{exporter}service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [{exporter_id}]\n"
    )
}

fn otlp_http_exporter(port: u16) -> String {
    format!(
        "  otlp_http:\n    logs_endpoint: http://127.0.0.1:{port}/v1/logs\n    retry_on_failure:\n      enabled: true\n      initial_interval: 200ms\n      max_interval: 1s\n      max_elapsed_time: 300s\n"
    )
}

#[test]
fn petrel_to_collector_over_grpc_to_petrel_over_http_keeps_attributes_and_resource() {
    const N: usize = 5000;
    let dir = tempdir();
    let (grpc_port, b_port) = (free_port(), free_port());
    // The receiving agent: OTLP/HTTP in, ndjson out.
    let out = dir.path().join("out.ndjson");
    let b_cfg = write_config(
        dir.path(),
        "receiver",
        &format!(
            "sources:\n  - type: opentelemetry\n    http_address: 127.0.0.1:{b_port}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let b_data = dir.path().join("b-data");
    let _b = Agent::start(&b_cfg, &b_data);
    let col = Otelcol::start(
        &collector_config(
            &format!("      grpc:\n        endpoint: 127.0.0.1:{grpc_port}\n"),
            &otlp_http_exporter(b_port),
            "otlp_http",
        ),
        grpc_port,
    );
    // The sending agent: JSON lines, parsed, out over gRPC.
    let log = dir.path().join("app.log");
    let mut lines = Vec::new();
    for i in 0..N {
        lines.extend_from_slice(
            format!(
                "{{\"message\":\"line-{i:05} hello\",\"level\":\"{}\",\"n\":{i},\"user\":{{\"id\":7,\"tags\":[\"a\",\"b\"]}},\"ok\":true,\"ratio\":0.5,\"service\":\"checkout\"}}\n",
                if i % 2 == 0 { "warn" } else { "ERROR" }
            )
            .as_bytes(),
        );
    }
    append(&log, &lines);
    let a_cfg = write_config(
        dir.path(),
        "sender",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\nsinks:\n  - type: opentelemetry\n    protocol: grpc\n    endpoint: http://127.0.0.1:{grpc_port}\n    compression: gzip\n    resource: {{ deployment.environment: test }}\n    batch: {{ max_events: 700, timeout_ms: 200 }}\n",
            log.display()
        ),
    );
    let _a = Agent::start(&a_cfg, &dir.path().join("a-data"));
    wait_for(Duration::from_secs(120), "every line through", || {
        let n = count_lines(&out);
        if n >= N {
            Ok(())
        } else {
            Err(format!("{n} of {N}"))
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let got = json_lines(&out);
    assert_eq!(got.len(), N, "lines arrived once each");
    let host = hostname();
    let mut seen = HashSet::new();
    for ev in &got {
        let msg = ev["message"].as_str().expect("message").to_string();
        let i: usize = msg[5..10].parse().expect("number");
        assert!(seen.insert(i), "line {i} twice");
        let r = &ev["resource"];
        assert_eq!(r["service.name"], "checkout", "{ev}");
        assert_eq!(r["deployment.environment"], "test", "{ev}");
        assert_eq!(r["host.name"], host.as_str(), "{ev}");
        let a = &ev["attributes"];
        // As the Collector's `filelog` puts it: on the record.
        assert_eq!(a["log.file.path"], log.to_str().unwrap(), "{ev}");
        assert!(r.get("log.file.path").is_none(), "{ev}");
        assert_eq!(a["n"], i, "{ev}");
        assert_eq!(a["ok"], true, "{ev}");
        assert_eq!(a["ratio"], 0.5, "{ev}");
        assert_eq!(
            a["user"],
            serde_json::json!({"id": 7, "tags": ["a", "b"]}),
            "{ev}"
        );
        assert!(
            a.get("level").is_none() && a.get("service").is_none(),
            "{ev}"
        );
        if i % 2 == 0 {
            assert_eq!(ev["severity_text"], "warn", "{ev}");
            assert_eq!(ev["severity_number"], 13, "{ev}");
        } else {
            assert_eq!(ev["severity_text"], "ERROR", "{ev}");
            assert_eq!(ev["severity_number"], 17, "{ev}");
        }
        assert!(
            ev["observed_time_unix_nano"].as_i64().unwrap_or(0) > 0,
            "{ev}"
        );
    }
    drop(col);
}

/// An OTLP/JSON request with two resources, scopes, every attribute type,
/// trace context, severity and times.
fn rich_request() -> serde_json::Value {
    serde_json::json!({
      "resourceLogs": [
        {
          "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "cart"}},
            {"key": "k8s.pod.uid", "value": {"stringValue": "0c6a-11"}},
            {"key": "replicas", "value": {"intValue": "3"}}
          ]},
          "schemaUrl": "https://opentelemetry.io/schemas/1.26.0",
          "scopeLogs": [{
            "scope": {"name": "io.petrel.test", "version": "1.2.3",
                      "attributes": [{"key": "lib", "value": {"stringValue": "x"}}]},
            "logRecords": [
              {
                "timeUnixNano": "1700000000000000001",
                "observedTimeUnixNano": "1700000000500000000",
                "severityNumber": 17,
                "severityText": "ERROR",
                "body": {"stringValue": "payment failed"},
                "attributes": [
                  {"key": "http.status", "value": {"intValue": "502"}},
                  {"key": "ratio", "value": {"doubleValue": 0.25}},
                  {"key": "ok", "value": {"boolValue": false}},
                  {"key": "tags", "value": {"arrayValue": {"values": [
                    {"stringValue": "a"}, {"intValue": "2"}]}}},
                  {"key": "ctx", "value": {"kvlistValue": {"values": [
                    {"key": "user", "value": {"stringValue": "u1"}}]}}}
                ],
                "flags": 1,
                "traceId": "5b8efff798038103d269b633813fc60c",
                "spanId": "eee19b7ec3c1b174"
              },
              {
                "observedTimeUnixNano": "1700000000600000000",
                "body": {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}},
                "eventName": "login"
              }
            ]
          }]
        },
        {
          "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "billing"}}]},
          "scopeLogs": [{
            "scope": {"name": "other"},
            "logRecords": [{
              "timeUnixNano": "1700000001000000000",
              "observedTimeUnixNano": "1700000001000000000",
              "severityNumber": 9,
              "severityText": "INFO",
              "body": {"stringValue": "invoice sent"}
            }]
          }]
        }
      ]
    })
}

fn parse_request(json: &[u8]) -> ExportLogsServiceRequest {
    serde_json::from_slice(json)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(json)))
}

#[test]
fn otlp_in_otlp_out_keeps_resource_scope_and_record_fields() {
    let dir = tempdir();
    let (col_port, src_port) = (free_port(), free_port());
    let file = dir.path().join("collector-out.json");
    let col = Otelcol::start(
        &collector_config(
            &format!("      http:\n        endpoint: 127.0.0.1:{col_port}\n"),
            &format!("  file:\n    path: {}\n", file.display()),
            "file",
        ),
        col_port,
    );
    let cfg = write_config(
        dir.path(),
        "relay",
        &format!(
            "sources:\n  - type: opentelemetry\n    http_address: 127.0.0.1:{src_port}\nsinks:\n  - type: opentelemetry\n    endpoint: http://127.0.0.1:{col_port}/v1/logs\n    batch: {{ timeout_ms: 100 }}\n"
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    let input = rich_request();
    let (status, body) = post(
        src_port,
        "/v1/logs",
        &[("Content-Type", "application/json")],
        input.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let got = wait_for(Duration::from_secs(60), "the collector's file", || {
        let text = std::fs::read(&file).unwrap_or_default();
        let mut all = ExportLogsServiceRequest::default();
        for line in split_lines(&text) {
            all.resource_logs.extend(parse_request(&line).resource_logs);
        }
        let n: usize = all
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum();
        if n >= 3 {
            Ok(all)
        } else {
            Err(format!("{n} records"))
        }
    });
    let want = parse_request(input.to_string().as_bytes());
    assert_eq!(got, want, "what came out differs from what went in");
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_sent_events_total",
            &[
                ("component_type", "opentelemetry"),
                ("component_kind", "sink")
            ]
        ),
        3.0
    );
    drop(col);
}

#[test]
fn a_full_spool_answers_429_and_the_collectors_retries_deliver_everything() {
    full_spool(false);
}

#[test]
fn a_full_spool_answers_unavailable_over_grpc_and_the_collectors_retries_deliver_everything() {
    full_spool(true);
}

/// Petrel → collector → Petrel (HTTP, or gRPC when `grpc`) whose 1 MiB
/// spool fills while its sink is held: refusals, then every line once.
fn full_spool(grpc: bool) {
    const N: usize = 20_000;
    let dir = tempdir();
    let (grpc_port, b_port) = (free_port(), free_port());
    // The receiving agent's sink is held: its 1 MiB spool fills.
    let stalled = Arc::new(Stalled::default());
    let down = serve_stalled(stalled.clone());
    let b_cfg = write_config(
        dir.path(),
        "receiver",
        &format!(
            "sources:\n  - type: opentelemetry\n    {}_address: 127.0.0.1:{b_port}\n    max_body_bytes: 256KiB\n    buffer: {{ type: disk, max_bytes: 1MiB }}\nsinks:\n  - type: http\n    url: http://{down}/ingest\n    batch: {{ max_events: 500, timeout_ms: 100 }}\n    max_in_flight_requests: 2\n",
            if grpc { "grpc" } else { "http" }
        ),
    );
    let b = Agent::start(&b_cfg, &dir.path().join("b-data"));
    let exporter = if grpc {
        format!("  otlp_grpc:\n    endpoint: 127.0.0.1:{b_port}\n    tls:\n      insecure: true\n    retry_on_failure:\n      enabled: true\n      initial_interval: 200ms\n      max_interval: 1s\n      max_elapsed_time: 300s\n")
    } else {
        otlp_http_exporter(b_port)
    };
    let col = Otelcol::start(
        &collector_config(
            &format!("      grpc:\n        endpoint: 127.0.0.1:{grpc_port}\n"),
            &exporter,
            if grpc { "otlp_grpc" } else { "otlp_http" },
        ),
        grpc_port,
    );
    let log = dir.path().join("app.log");
    let mut lines = Vec::new();
    for i in 0..N {
        lines.extend_from_slice(
            format!("line-{i:06} a line long enough to fill a small spool quickly, padded out\n")
                .as_bytes(),
        );
    }
    append(&log, &lines);
    let a_cfg = write_config(
        dir.path(),
        "sender",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: opentelemetry\n    protocol: grpc\n    endpoint: http://127.0.0.1:{grpc_port}\n    batch: {{ max_events: 1000, timeout_ms: 100 }}\n",
            log.display()
        ),
    );
    let _a = Agent::start(&a_cfg, &dir.path().join("a-data"));
    // The spool fills and requests are refused with 429.
    wait_for(Duration::from_secs(120), "429 answers", || {
        let n = b.metric_or_zero(
            "petrel_component_errors_total",
            &[
                ("component_type", "opentelemetry"),
                ("error_type", "buffer_full"),
            ],
        );
        if n >= 3.0 {
            Ok(())
        } else {
            Err(format!("{n} refusals"))
        }
    });
    // Let the data out: the collector's retries bring the rest.
    stalled.released.store(true, Ordering::SeqCst);
    let count = || -> usize {
        stalled
            .bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| split_lines(b).len())
            .sum()
    };
    wait_for(Duration::from_secs(240), "every line delivered", || {
        let n = count();
        if n >= N {
            Ok(())
        } else {
            Err(format!("{n} of {N}"))
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let mut seen = HashSet::new();
    for body in stalled.bodies.lock().unwrap().iter() {
        for line in split_lines(body) {
            let v: serde_json::Value = serde_json::from_slice(&line).expect("json");
            let msg = v["message"].as_str().expect("message").to_string();
            assert!(seen.insert(msg.clone()), "{msg} delivered twice");
        }
    }
    assert_eq!(seen.len(), N, "every line exactly once");
    drop(col);
}

#[test]
fn round_trip_through_the_grpc_source_and_the_json_sink_keeps_everything() {
    // test → collector (HTTP in) → otlp_grpc → Petrel's source (gRPC) →
    // Petrel's sink (OTLP/HTTP JSON, gzip) → collector (HTTP in) → file.
    let dir = tempdir();
    let (in_port, out_port, src_port) = (free_port(), free_port(), free_port());
    let file = dir.path().join("collector-out.json");
    let config = format!(
        "receivers:\n  otlp/in:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{in_port}\n  otlp/out:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{out_port}\nexporters:\n  otlp_grpc:\n    endpoint: 127.0.0.1:{src_port}\n    tls:\n      insecure: true\n    retry_on_failure:\n      initial_interval: 200ms\n      max_interval: 1s\n  file:\n    path: {}\nservice:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs/in:\n      receivers: [otlp/in]\n      exporters: [otlp_grpc]\n    logs/out:\n      receivers: [otlp/out]\n      exporters: [file]\n",
        file.display()
    );
    let cfg = write_config(
        dir.path(),
        "relay",
        &format!(
            "sources:\n  - type: opentelemetry\n    grpc_address: 127.0.0.1:{src_port}\nsinks:\n  - type: opentelemetry\n    endpoint: http://127.0.0.1:{out_port}/v1/logs\n    encoding: json\n    compression: gzip\n    batch: {{ timeout_ms: 100 }}\n"
        ),
    );
    let _agent = Agent::start(&cfg, &dir.path().join("data"));
    let col = Otelcol::start(&config, in_port);
    wait_for(Duration::from_secs(30), "the out receiver", || {
        std::net::TcpStream::connect(("127.0.0.1", out_port))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let input = rich_request();
    let (status, body) = post(
        in_port,
        "/v1/logs",
        &[("Content-Type", "application/json")],
        input.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let got = wait_for(Duration::from_secs(60), "the collector's file", || {
        let text = std::fs::read(&file).unwrap_or_default();
        let mut all = ExportLogsServiceRequest::default();
        for line in split_lines(&text) {
            all.resource_logs.extend(parse_request(&line).resource_logs);
        }
        let n: usize = all
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum();
        if n >= 3 {
            Ok(all)
        } else {
            Err(format!("{n} records"))
        }
    });
    let want = parse_request(input.to_string().as_bytes());
    assert_eq!(got, want, "what came out differs from what went in");
    drop(col);
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is needed");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `ca.pem` and a server certificate for 127.0.0.1 signed by it
/// (`server.pem`, `server.key`), in `dir`.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=petrel test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

#[test]
fn tls_on_both_protocols() {
    const N: usize = 200;
    let dir = tempdir();
    certificates(dir.path());
    let d = dir.path().display();
    let (grpc_port, http_port) = (free_port(), free_port());
    let out = dir.path().join("out.ndjson");
    let b_cfg = write_config(
        dir.path(),
        "receiver",
        &format!(
            "sources:\n  - type: opentelemetry\n    grpc_address: 127.0.0.1:{grpc_port}\n    http_address: 127.0.0.1:{http_port}\n    tls: {{ cert_file: {d}/server.pem, key_file: {d}/server.key }}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let _b = Agent::start(&b_cfg, &dir.path().join("b-data"));
    let log = dir.path().join("app.log");
    let mut lines = Vec::new();
    for i in 0..N {
        lines.extend_from_slice(format!("line-{i:04}\n").as_bytes());
    }
    append(&log, &lines);
    let a_cfg = write_config(
        dir.path(),
        "sender",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: opentelemetry\n    protocol: grpc\n    endpoint: https://127.0.0.1:{grpc_port}\n    tls: {{ ca_file: {d}/ca.pem }}\n    resource: {{ via: grpc }}\n    batch: {{ timeout_ms: 100 }}\n  - type: opentelemetry\n    endpoint: https://127.0.0.1:{http_port}/v1/logs\n    tls: {{ ca_file: {d}/ca.pem }}\n    resource: {{ via: http }}\n    compression: gzip\n    batch: {{ timeout_ms: 100 }}\n",
            log.display()
        ),
    );
    let _a = Agent::start(&a_cfg, &dir.path().join("a-data"));
    wait_for(Duration::from_secs(60), "every line by both sinks", || {
        let n = count_lines(&out);
        if n >= 2 * N {
            Ok(())
        } else {
            Err(format!("{n} of {}", 2 * N))
        }
    });
    let got = json_lines(&out);
    assert_eq!(got.len(), 2 * N);
    for via in ["grpc", "http"] {
        let msgs: HashSet<&str> = got
            .iter()
            .filter(|e| e["resource"]["via"] == via)
            .map(|e| e["message"].as_str().unwrap())
            .collect();
        assert_eq!(msgs.len(), N, "{via}");
    }
}

/// An OTLP/HTTP endpoint answering as told: the first request 503 with
/// `Retry-After`, any request holding a record `bad...` 400, and a
/// partial success for each `reject-me` record. Records of requests
/// answered 2xx are kept.
#[derive(Default)]
struct Picky {
    requests: std::sync::atomic::AtomicUsize,
    accepted: std::sync::Mutex<Vec<String>>,
}

fn serve_picky(state: Arc<Picky>) -> std::net::SocketAddr {
    use prost::Message;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/v1/logs",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let s = state.clone();
                    async move {
                        use axum::http::StatusCode;
                        use opentelemetry_proto::tonic::collector::logs::v1::*;
                        if s.requests.fetch_add(1, Ordering::SeqCst) == 0 {
                            return (StatusCode::SERVICE_UNAVAILABLE, [("Retry-After", "1")], Vec::new());
                        }
                        let req = ExportLogsServiceRequest::decode(&body[..]).expect("protobuf");
                        let bodies: Vec<String> = req
                            .resource_logs
                            .iter()
                            .flat_map(|r| &r.scope_logs)
                            .flat_map(|s| &s.log_records)
                            .map(|r| match r.body.as_ref().and_then(|b| b.value.as_ref()) {
                                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(t)) => t.clone(),
                                _ => String::new(),
                            })
                            .collect();
                        if bodies.iter().any(|b| b.starts_with("bad")) {
                            return (StatusCode::BAD_REQUEST, [("Retry-After", "0")], b"bad record".to_vec());
                        }
                        let rejected = bodies.iter().filter(|b| *b == "reject-me").count() as i64;
                        s.accepted.lock().unwrap().extend(bodies);
                        let answer = ExportLogsServiceResponse {
                            partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
                                rejected_log_records: rejected,
                                error_message: "not today".into(),
                            }),
                        };
                        (StatusCode::OK, [("Retry-After", "0")], answer.encode_to_vec())
                    }
                }),
            );
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    addr
}

#[test]
fn answers_retry_dead_letter_and_partial_success() {
    let dir = tempdir();
    let picky = Arc::new(Picky::default());
    let addr = serve_picky(picky.clone());
    let log = dir.path().join("app.log");
    append(
        &log,
        b"one\ntwo\nbad record\nthree\nreject-me\nfour\nfive\nsix\n",
    );
    let dead = dir.path().join("dead.ndjson");
    let cfg = write_config(
        dir.path(),
        "picky",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: opentelemetry\n    endpoint: http://{addr}/v1/logs\n    dead_letter: {}\n    batch: {{ timeout_ms: 300 }}\n",
            log.display(),
            dead.display()
        ),
    );
    let data = dir.path().join("data");
    let agent = Agent::start(&cfg, &data);
    let size = std::fs::metadata(&log).unwrap().len();
    wait_for(
        Duration::from_secs(60),
        "the file committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    let mut accepted = picky.accepted.lock().unwrap().clone();
    accepted.sort();
    assert_eq!(
        accepted,
        ["five", "four", "one", "reject-me", "six", "three", "two"]
    );
    let dl = json_lines(&dead);
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0]["status"], 400);
    assert_eq!(dl[0]["answer"], "bad record");
    assert_eq!(
        dl[0]["record"]["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"],
        "bad record"
    );
    let m = |name: &str, labels: &[(&str, &str)]| {
        let mut l = vec![("component_type", "opentelemetry")];
        l.extend_from_slice(labels);
        agent.metric_or_zero(name, &l)
    };
    assert_eq!(
        m(
            "petrel_component_discarded_events_total",
            &[("reason", "rejected")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "petrel_component_discarded_events_total",
            &[("reason", "dead_letter")]
        ),
        1.0
    );
    assert!(
        m(
            "petrel_component_errors_total",
            &[("error_type", "request_failed")]
        ) >= 1.0
    );
}

#[test]
fn what_the_source_answered_200_survives_kill_9() {
    use prost::Message;
    const REQUESTS: usize = 40;
    const PER: usize = 50;
    let dir = tempdir();
    let port = free_port();
    // The sink's endpoint holds everything: nothing is delivered (and
    // committed) before the kill. After the restart a second endpoint
    // answers (the first one's held requests are never answered, so what
    // arrives was read from the spool again).
    let config = |down: std::net::SocketAddr| {
        write_config(
            dir.path(),
            "durable",
            &format!(
                "sources:\n  - type: opentelemetry\n    http_address: 127.0.0.1:{port}\nsinks:\n  - type: http\n    url: http://{down}/ingest\n    batch: {{ timeout_ms: 100 }}\n"
            ),
        )
    };
    let never = Arc::new(Stalled::default());
    let cfg = config(serve_stalled(never.clone()));
    let data = dir.path().join("data");
    let mut agent = Agent::start(&cfg, &data);
    for r in 0..REQUESTS {
        let mut req: ExportLogsServiceRequest = serde_json::from_value(serde_json::json!({
            "resourceLogs": [{"scopeLogs": [{"logRecords": []}]}]
        }))
        .unwrap();
        let recs = &mut req.resource_logs[0].scope_logs[0].log_records;
        for i in 0..PER {
            let rec = opentelemetry_proto::tonic::logs::v1::LogRecord {
                body: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                    value: Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                            format!("r{r:03}-{i:03}"),
                        ),
                    ),
                }),
                ..Default::default()
            };
            recs.push(rec);
        }
        let (status, body) = post(
            port,
            "/v1/logs",
            &[("Content-Type", "application/x-protobuf")],
            &req.encode_to_vec(),
        );
        assert_eq!(status, 200, "{body}");
    }
    agent.kill9();
    assert!(never.bodies.lock().unwrap().is_empty(), "nothing answered");
    let held = Arc::new(Stalled::default());
    held.released.store(true, Ordering::SeqCst);
    let cfg = config(serve_stalled(held.clone()));
    let _again = Agent::start(&cfg, &data);
    let distinct = || -> HashSet<String> {
        held.bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| split_lines(b))
            .map(|l| {
                let v: serde_json::Value = serde_json::from_slice(&l).expect("json");
                v["message"].as_str().expect("message").to_string()
            })
            .collect()
    };
    wait_for(Duration::from_secs(60), "every accepted record", || {
        let n = distinct().len();
        if n >= REQUESTS * PER {
            Ok(())
        } else {
            Err(format!("{n} of {}", REQUESTS * PER))
        }
    });
    assert_eq!(distinct().len(), REQUESTS * PER);
}

/// Petrel → VictoriaLogs over OTLP/HTTP protobuf (VictoriaLogs takes OTLP
/// logs at `/insert/opentelemetry/v1/logs`, protobuf only): every line
/// stored once, with its severity, attributes and resource.
#[test]
fn petrel_to_victorialogs_over_otlp_http_protobuf() {
    const N: usize = 20_000;
    let vl = victorialogs::VictoriaLogs::start();
    let dir = tempdir();
    let log = dir.path().join("app.log");
    let mut text = String::new();
    for i in 0..N {
        let level = ["info", "warn", "error"][i % 3];
        text.push_str(&format!(
            "{{\"level\":\"{level}\",\"seq\":{i},\"msg\":\"served request {i}\",\"service\":\"checkout\"}}\n"
        ));
    }
    std::fs::write(&log, text).unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        "vl",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\nsinks:\n  - type: opentelemetry\n    endpoint: {}/insert/opentelemetry/v1/logs\n    encoding: protobuf\n    resource: {{ deployment.environment: test }}\n    batch: {{ max_events: 2000, timeout_ms: 100 }}\n",
            log.display(),
            vl.url()
        ),
    );
    let _agent = Agent::start(&cfg, &data);
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    wait_for(
        Duration::from_secs(120),
        "every line committed",
        || match checkpoint_offset(&data, &log) {
            Some(o) if o == size => Ok(()),
            other => Err(format!("checkpoint {other:?} of {size}")),
        },
    );
    assert_eq!(vl.count("*"), N as u64, "records stored");
    let uniq = vl.query("* | stats count_uniq(seq) as u");
    assert_eq!(
        uniq[0]["u"].as_str(),
        Some(N.to_string().as_str()),
        "each line once"
    );
    let by_level = vl.query("* | stats by (severity_text) count() as n");
    let mut levels: Vec<(String, String)> = by_level
        .iter()
        .map(|r| {
            (
                r["severity_text"].as_str().unwrap_or_default().to_string(),
                r["n"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    levels.sort();
    let count = |k: usize| (0..N).filter(|i| i % 3 == k).count().to_string();
    let want = vec![
        ("error".to_string(), count(2)),
        ("info".to_string(), count(0)),
        ("warn".to_string(), count(1)),
    ];
    assert_eq!(levels, want, "severity per record: {by_level:?}");
    let one = vl.query("seq:=17");
    assert_eq!(one.len(), 1, "{one:?}");
    let r = &one[0];
    // The body is the event's message (the line; parse_json keeps it),
    // the parsed fields are attributes, the level gives the severity.
    assert!(
        r["_msg"]
            .as_str()
            .unwrap_or_default()
            .contains("\"seq\":17"),
        "{r}"
    );
    assert_eq!(r["msg"], "served request 17", "{r}");
    assert_eq!(
        r["severity_number"], "17",
        "error is SEVERITY_NUMBER_ERROR: {r}"
    );
    assert_eq!(r["service.name"], "checkout", "{r}");
    assert_eq!(r["deployment.environment"], "test", "{r}");
    assert_eq!(r["log.file.path"], log.display().to_string(), "{r}");
}

/// CPU seconds (user + system) process `pid` used so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The outside check's flood, on both listeners: with `ulimit -n 512`, a
/// client holds 600 silent connections to the gRPC port. Connections past
/// what the agent can take are refused and counted (not left to fail the
/// whole process's accepts), `/health` and `/metrics` keep answering, the
/// accept loop does not spin, idle ones are closed after
/// `idle_timeout_secs`, and then OTLP requests are served again. Before,
/// the source had no limits at all: the API refused connections and a
/// network thread spun at 100 %. Also: `auth.bearer_token` on both
/// listeners, and a gzip body that is not gzip is named as such.
#[test]
fn a_connection_flood_leaves_the_api_reachable_and_idle_connections_are_closed() {
    use prost::Message;
    let dir = tempdir();
    let (grpc, http) = (free_port(), free_port());
    let out = dir.path().join("out.ndjson");
    // The idle timeout must outlast the flood: with 3 s, a loaded machine
    // (the whole suite on two cores) took longer than that to open the
    // 600 connections, the first ones were closed as idle, their
    // descriptors took later ones in, and only 34 were refused.
    let cfg = write_config(
        dir.path(),
        "flood",
        &format!(
            "sources:\n  - type: opentelemetry\n    grpc_address: 127.0.0.1:{grpc}\n    http_address: 127.0.0.1:{http}\n    max_connections: 1000\n    idle_timeout_secs: 10\n    auth: {{ bearer_token: s3cret }}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            nofile: Some(512),
            ..Default::default()
        },
    );
    let request = |msg: &str| {
        ExportLogsServiceRequest {
            resource_logs: vec![opentelemetry_proto::tonic::logs::v1::ResourceLogs {
                scope_logs: vec![opentelemetry_proto::tonic::logs::v1::ScopeLogs {
                    log_records: vec![opentelemetry_proto::tonic::logs::v1::LogRecord {
                        body: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                            value: Some(
                                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                                    msg.to_string(),
                                ),
                            ),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    };
    let proto = [("Content-Type", "application/x-protobuf")];
    let authed = [
        ("Content-Type", "application/x-protobuf"),
        ("Authorization", "Bearer s3cret"),
    ];
    // The token is checked.
    let (status, body) = post(http, "/v1/logs", &proto, &request("no token"));
    assert_eq!(status, 401, "{body}");
    let (status, body) = post(http, "/v1/logs", &authed, &request("before"));
    assert_eq!(status, 200, "{body}");
    // A body that claims gzip and is not: the answer says so.
    let mut gz = authed.to_vec();
    gz.push(("Content-Encoding", "gzip"));
    let (status, body) = post(http, "/v1/logs", &gz, &request("not gzip"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not valid gzip"), "{body}");
    // The flood.
    let mut held = Vec::new();
    for _ in 0..600 {
        match std::net::TcpStream::connect(("127.0.0.1", grpc)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("connect: {e}"),
        }
    }
    let refused = source_error("flood", "opentelemetry_0", "connection_refused");
    wait_for(
        LONG,
        "connections past the descriptor reserve refused",
        || match agent.metric_or_zero("petrel_component_errors_total", &refused) {
            n if n >= 50.0 => Ok(()),
            n => Err(format!("{n} refused")),
        },
    );
    let pid = agent.pid();
    let before = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(2));
    for path in ["/health", "/metrics"] {
        let (status, body) = agent
            .http_get(path)
            .unwrap_or_else(|e| panic!("{path} unreachable during the flood: {e}"));
        assert_eq!(status, 200, "{path}: {body}");
    }
    // No accept loop spinning on EMFILE: a spinning thread burns a core.
    let used = cpu_secs(pid) - before;
    assert!(
        used < 0.5,
        "the agent used {used:.2} CPU s in 2 s while the connections were held"
    );
    assert!(
        agent.stderr().matches("accept failed").count() < 20,
        "accept errors logged in a loop"
    );
    // Idle connections are closed after idle_timeout_secs...
    let idle = source_error("flood", "opentelemetry_0", "idle_timeout");
    // Every connection was either refused at once or accepted and held.
    let accepted = 600.0 - agent.metric_or_zero("petrel_component_errors_total", &refused);
    assert!(
        accepted >= 100.0,
        "only {accepted} of 600 accepted under ulimit -n 512"
    );
    wait_for(LONG, "the silent connections closed", || {
        match agent.metric_or_zero("petrel_component_errors_total", &idle) {
            n if n >= accepted => Ok(()),
            n => Err(format!("{n} of {accepted} closed as idle")),
        }
    });
    // ... and requests are served again, on both listeners.
    let (status, body) = post(http, "/v1/logs", &authed, &request("after"));
    assert_eq!(status, 200, "{body}");
    drop(held);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let grpc_status = |token: Option<&str>| {
        rt.block_on(async {
            use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
            let mut c = LogsServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
                .await
                .expect("gRPC connect");
            let mut req = tonic::Request::new(
                ExportLogsServiceRequest::decode(&request("over grpc")[..]).unwrap(),
            );
            if let Some(t) = token {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {t}").parse().unwrap());
            }
            c.export(req).await.map(|_| ()).map_err(|s| s.code())
        })
    };
    assert_eq!(grpc_status(None), Err(tonic::Code::Unauthenticated));
    assert_eq!(
        grpc_status(Some("wrong")),
        Err(tonic::Code::Unauthenticated)
    );
    assert_eq!(grpc_status(Some("s3cret")), Ok(()));
    wait_for(LONG, "the accepted records in the file", || {
        let msgs: Vec<String> = json_lines(&out)
            .iter()
            .filter_map(|v| v["message"].as_str().map(String::from))
            .collect();
        if msgs.len() == 3 {
            Ok(())
        } else {
            Err(format!("{msgs:?}"))
        }
    });
    let msgs: HashSet<String> = json_lines(&out)
        .iter()
        .filter_map(|v| v["message"].as_str().map(String::from))
        .collect();
    let want: HashSet<String> = ["before", "after", "over grpc"].map(String::from).into();
    assert_eq!(msgs, want);
    let unauthorized = source_error("flood", "opentelemetry_0", "unauthorized");
    assert_eq!(
        agent.metric_or_zero("petrel_component_errors_total", &unauthorized),
        3.0
    );
}

/// What a processor removed is absent from the OTLP resource and
/// attributes, a renamed field is an attribute under its new name, and
/// `except_fields` leaves out what it names (the body with `message`):
/// through the real Collector to a Petrel receiver.
#[test]
fn removed_renamed_and_excluded_fields_through_the_collector() {
    let dir = tempdir();
    let (grpc_port, b_port) = (free_port(), free_port());
    let out = dir.path().join("out.ndjson");
    let b_cfg = write_config(
        dir.path(),
        "receiver",
        &format!(
            "sources:\n  - type: opentelemetry\n    http_address: 127.0.0.1:{b_port}\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: ndjson\n",
            out.display()
        ),
    );
    let _b = Agent::start(&b_cfg, &dir.path().join("b-data"));
    let col = Otelcol::start(
        &collector_config(
            &format!("      grpc:\n        endpoint: 127.0.0.1:{grpc_port}\n"),
            &otlp_http_exporter(b_port),
            "otlp_http",
        ),
        grpc_port,
    );
    let log = dir.path().join("app.log");
    append(
        &log,
        b"{\"level\":\"info\",\"user\":\"ann\",\"secret\":\"s\"}\n",
    );
    let a_cfg = write_config(
        dir.path(),
        "sender",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\n  - type: fields\n    remove: [host]\n    rename: {{ file: path }}\nsinks:\n  - type: opentelemetry\n    protocol: grpc\n    endpoint: http://127.0.0.1:{grpc_port}\n    except_fields: [secret, message]\n    batch: {{ timeout_ms: 100 }}\n",
            log.display()
        ),
    );
    let _a = Agent::start(&a_cfg, &dir.path().join("a-data"));
    wait_lines(&out, 1);
    let ev = &json_lines(&out)[0];
    let r = &ev["resource"];
    assert!(r.get("host.name").is_none(), "{ev}");
    let a = &ev["attributes"];
    assert_eq!(a["path"], log.to_str().unwrap(), "{ev}");
    assert_eq!(a["user"], "ann", "{ev}");
    for gone in ["log.file.path", "secret", "host"] {
        assert!(a.get(gone).is_none(), "`{gone}` in {ev}");
    }
    assert!(
        ev.get("message").is_none() || ev["message"].is_null(),
        "no body: {ev}"
    );
    drop(col);
}
