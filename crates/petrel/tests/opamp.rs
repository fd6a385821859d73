//! Fleet management over OpAMP, end to end: the real agent against a real
//! OpAMP server (opamp-go's server v0.23.0, `tests/opamp_server/`) on
//! loopback. Remote pipelines are applied per pipeline and reported
//! (APPLYING, then APPLIED or FAILED with the lines), the last known good
//! set survives the server's absence and a crash loop, local limits hold,
//! secrets stay out of the effective configuration, WebSocket falls back
//! to plain HTTP polling, nothing is lost or duplicated across pushes,
//! and bad input from the server is counted while the pipelines run on.

mod common;
mod opamp_server;
mod server;
mod syslog_servers;

use std::path::{Path, PathBuf};

use common::*;
use opamp_server::{statuses, OpampServer, Options};
use serde_json::Value;

/// A managed agent's files.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
    local: PathBuf,
    agent_file: PathBuf,
}

impl Setup {
    /// An agent file for `endpoint` (with `extra` YAML lines under
    /// `opamp:`) whose limits allow the temporary directory, and `more`
    /// top-level sections.
    fn new(endpoint: &str, extra: &str, more: &str) -> Setup {
        let dir = tempdir();
        let root = dir.path().to_path_buf();
        let data = root.join("data");
        let local = root.join("local");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::create_dir_all(root.join("logs")).unwrap();
        std::fs::create_dir_all(root.join("out")).unwrap();
        let agent_file = root.join("agent.yaml");
        let has_remote = more.contains("remote:");
        let has_limits = more.contains("limits:");
        let mut text = format!(
            "opamp:\n  endpoint: {endpoint}\n  heartbeat_secs: 5\n  polling_secs: 1\n  response_timeout_secs: 5\n  backoff_max_secs: 2\n{extra}"
        );
        if !has_remote {
            text.push_str("remote:\n  health_watch_secs: 1\n");
        }
        if !has_limits {
            text.push_str(&format!(
                "limits:\n  read_paths: [\"{0}/**\"]\n  write_paths: [\"{0}/**\"]\n",
                root.display()
            ));
        }
        text.push_str(more);
        std::fs::write(&agent_file, text).unwrap();
        Setup {
            _dir: dir,
            root,
            data,
            local,
            agent_file,
        }
    }

    fn start(&self) -> Agent {
        self.start_env(&[])
    }

    fn start_env(&self, env: &[(&str, &str)]) -> Agent {
        Agent::start_with(
            &self.local,
            &self.data,
            AgentOptions {
                args: vec![
                    "--agent-config".into(),
                    self.agent_file.display().to_string(),
                ],
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..AgentOptions::default()
            },
        )
    }

    fn log(&self, name: &str) -> PathBuf {
        self.root.join("logs").join(format!("{name}.log"))
    }

    fn out(&self, name: &str) -> PathBuf {
        self.root.join("out").join(format!("{name}.txt"))
    }

    /// A pipeline reading `logs/<input>.log` into `out/<output>.txt`.
    fn pipeline(&self, input: &str, output: &str) -> String {
        simple_config(
            &self.log(input).display().to_string(),
            &self.out(output),
            "",
        )
    }
}

/// `/health` as JSON.
fn health(a: &Agent) -> Value {
    let Ok((_, body)) = a.http_get("/health") else {
        // The agent is restarting (the crash test): nothing to read yet.
        return Value::Null;
    };
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/health: {e}: {body}"))
}

/// Waits until `/health` reports `hash` with `status`; returns the
/// managed state.
fn wait_status(a: &Agent, hash: &str, status: &str) -> Value {
    wait_for(LONG, &format!("remote config {hash} {status}"), || {
        let m = health(a)["managed"].clone();
        if m["remote_config_hash"] == hash && m["remote_config_status"] == status {
            Ok(m)
        } else {
            Err(format!("{m}"))
        }
    })
}

/// Waits until the server received a status `status` for `hash`.
fn wait_server_status(s: &OpampServer, hash: &str, status: &str) -> (String, String, String) {
    wait_for(
        LONG,
        &format!("the server to receive {status} for {hash}"),
        || {
            let st = statuses(&s.messages());
            st.iter()
                .find(|(h, s, _)| h == hash && s == status)
                .cloned()
                .ok_or_else(|| format!("{st:?}"))
        },
    )
}

fn wait_lines(path: &Path, n: usize) {
    wait_for(LONG, &format!("{n} lines in {}", path.display()), || {
        let c = count_lines(path);
        if c >= n {
            Ok(())
        } else {
            Err(format!("{c} lines"))
        }
    });
}

fn metric(a: &Agent, name: &str, labels: &[(&str, &str)]) -> f64 {
    a.metric_or_zero(name, labels)
}

fn attr<'a>(list: &'a Value, key: &str) -> Option<&'a str> {
    list.as_array()?
        .iter()
        .find(|kv| kv["key"] == key)?
        .get("value")?
        .get("stringValue")?
        .as_str()
}

#[test]
fn connects_over_tls_with_a_token_and_describes_itself() {
    let certs = tempdir();
    let (ca, cert, key) = syslog_servers::make_certs(certs.path());
    let srv = OpampServer::start_with(Options {
        tls: Some((cert, key)),
        token: Some("s3cret-token".into()),
        record: true,
    });
    let s = Setup::new(
        &srv.ws_endpoint(),
        &format!(
            "  headers: {{Authorization: \"Bearer ${{OPAMP_TOKEN}}\"}}\n  tls: {{ca_file: \"{}\"}}\n  labels: {{team: payments}}\n",
            ca.display()
        ),
        "",
    );
    write_config(&s.local, "app", &s.pipeline("app", "app"));
    let a = s.start_env(&[("OPAMP_TOKEN", "s3cret-token")]);
    wait_for(LONG, "connected", || {
        let m = health(&a)["managed"].clone();
        if m["connected"] == true {
            Ok(())
        } else {
            Err(m.to_string())
        }
    });
    let msgs = srv.messages();
    assert_eq!(msgs[0].transport, "websocket");
    let first = &msgs[0].msg;
    // The uid is the one kept in the data dir, a UUID v7.
    let uid = opamp_server::b64(first["instanceUid"].as_str().unwrap());
    assert_eq!(uid.len(), 16);
    assert_eq!(uid[6] >> 4, 7, "UUID version 7");
    let kept = std::fs::read_to_string(s.data.join("opamp/instance_uid")).unwrap();
    assert_eq!(
        kept.trim().replace('-', ""),
        opamp_server::b64_to_hex(first["instanceUid"].as_str().unwrap())
    );
    let d = &first["agentDescription"];
    assert_eq!(
        attr(&d["identifyingAttributes"], "service.name"),
        Some("petrel")
    );
    assert!(attr(&d["identifyingAttributes"], "service.version").is_some());
    assert_eq!(
        attr(&d["nonIdentifyingAttributes"], "team"),
        Some("payments")
    );
    assert_eq!(
        attr(&d["nonIdentifyingAttributes"], "os.type"),
        Some("linux")
    );
    assert!(attr(&d["nonIdentifyingAttributes"], "host.name").is_some());
    let caps = first["capabilities"].as_str().map_or_else(
        || first["capabilities"].as_u64().unwrap(),
        |s| s.parse().unwrap(),
    );
    for bit in [0x1u64, 0x2, 0x4, 0x400, 0x800, 0x1000, 0x2000, 0x4000] {
        assert_ne!(caps & bit, 0, "capability {bit:#x} in {caps:#x}");
    }
    assert!(first["availableComponents"]["hash"]
        .as_str()
        .is_some_and(|h| !h.is_empty()));
    let eff = &first["effectiveConfig"]["configMap"]["configMap"];
    assert!(eff.get("local/app.yaml").is_some(), "{eff}");
    let health_tree = &first["health"];
    assert!(
        health_tree["componentHealthMap"]["pipeline:app"]["componentHealthMap"]
            .get("source:file_0")
            .is_some(),
        "{health_tree}"
    );
    // Without the token the server refuses (401): the agent does not
    // connect, and says why.
    drop(a);
    let bad = Setup::new(
        &srv.ws_endpoint(),
        &format!("  tls: {{ca_file: \"{}\"}}\n", ca.display()),
        "",
    );
    let b = bad.start();
    wait_for(LONG, "a refused connection reported", || {
        let m = health(&b)["managed"].clone();
        if m["connected"] == false && m["last_error"].as_str().is_some_and(|e| e.contains("401")) {
            Ok(())
        } else {
            Err(m.to_string())
        }
    });
    // The same uid after a restart.
    let a = s.start_env(&[("OPAMP_TOKEN", "s3cret-token")]);
    wait_for(LONG, "reconnected", || {
        if health(&a)["managed"]["connected"] == true {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let uids: std::collections::BTreeSet<String> = srv
        .messages()
        .iter()
        .filter_map(|m| m.msg["instanceUid"].as_str().map(str::to_string))
        .collect();
    assert_eq!(uids.len(), 1, "one uid across restarts: {uids:?}");
}

#[test]
fn three_remote_pipelines_apply_and_carry_data() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    let a = s.start();
    let files: Vec<(String, String)> = ["a", "b", "c"]
        .iter()
        .map(|n| (format!("{n}.yaml"), s.pipeline(n, n)))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let hash = srv.set_config(&refs);
    let m = wait_status(&a, &hash, "APPLIED");
    for n in ["a", "b", "c"] {
        assert_eq!(m["pipelines"][n]["status"], "APPLIED", "{m}");
        append(&s.log(n), format!("line of {n}\n").as_bytes());
    }
    for n in ["a", "b", "c"] {
        wait_lines(&s.out(n), 1);
        assert_eq!(
            read_lines(&s.out(n)),
            vec![format!("line of {n}").into_bytes()]
        );
    }
    // APPLYING first, then APPLIED, for that hash.
    let st = statuses(&srv.messages());
    let mine: Vec<&str> = st
        .iter()
        .filter(|(h, _, _)| *h == hash)
        .map(|(_, s, _)| s.as_str())
        .collect();
    assert_eq!(mine.first(), Some(&"APPLYING"), "{st:?}");
    assert!(mine.contains(&"APPLIED"), "{st:?}");
    // The files are in the managed directory, and in the health tree.
    for n in ["a", "b", "c"] {
        assert!(s.data.join(format!("opamp/pipelines/{n}.yaml")).exists());
    }
    wait_for(LONG, "the health tree with b APPLIED", || {
        let msgs = srv.messages();
        let tree = msgs
            .iter()
            .rev()
            .find_map(|m| m.msg.get("health"))
            .ok_or("no health")?;
        let st = &tree["componentHealthMap"]["pipeline:b"]["componentHealthMap"]["remote_config"]
            ["status"];
        if st == "APPLIED" {
            Ok(())
        } else {
            Err(tree.to_string())
        }
    });
    assert_eq!(
        metric(
            &a,
            "petrel_opamp_remote_config_applies_total",
            &[("result", "applied")]
        ),
        1.0
    );
}

#[test]
fn one_bad_pipeline_fails_alone_with_its_line() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    let a = s.start();
    let good_a = s.pipeline("a", "a");
    let good_b = s.pipeline("b", "b");
    let bad = "sources:\n  - type: stdin\nsinks:\n  - type: stdout\n  - type: kafak\n";
    let hash = srv.set_config(&[("a.yaml", &good_a), ("b.yaml", &good_b), ("c.yaml", bad)]);
    let m = wait_status(&a, &hash, "FAILED");
    assert_eq!(m["pipelines"]["a"]["status"], "APPLIED", "{m}");
    assert_eq!(m["pipelines"]["b"]["status"], "APPLIED", "{m}");
    assert_eq!(m["pipelines"]["c"]["status"], "FAILED", "{m}");
    let err = m["pipelines"]["c"]["error"].as_str().unwrap();
    assert!(
        err.starts_with("remote/c.yaml:5:11: unknown sink type `kafak`"),
        "{err}"
    );
    assert!(err.contains("did you mean `kafka`"), "{err}");
    let (_, _, server_err) = wait_server_status(&srv, &hash, "FAILED");
    assert!(
        server_err.contains("pipeline c: remote/c.yaml:5:11:"),
        "{server_err}"
    );
    assert!(!server_err.contains("pipeline a"), "{server_err}");
    // The good ones run.
    append(&s.log("a"), b"x\n");
    append(&s.log("b"), b"y\n");
    wait_lines(&s.out("a"), 1);
    wait_lines(&s.out("b"), 1);
    assert!(!s.data.join("opamp/pipelines/c.yaml").exists(), "not kept");
    // In the health tree, c is not running, with its line.
    let c = wait_for(LONG, "c in the health tree", || {
        let msgs = srv.messages();
        let tree = msgs
            .iter()
            .rev()
            .find_map(|m| m.msg.get("health"))
            .ok_or("no health")?;
        let c = tree["componentHealthMap"]["pipeline:c"].clone();
        if c["status"] == "not running" {
            Ok(c)
        } else {
            Err(tree.to_string())
        }
    });
    assert!(c["lastError"].as_str().unwrap().contains("kafak"), "{c}");
}

#[test]
fn an_empty_map_removes_the_remote_pipelines_only() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    write_config(&s.local, "local", &s.pipeline("local", "local"));
    let a = s.start();
    let r = s.pipeline("r", "r");
    let h1 = srv.set_config(&[("r.yaml", &r)]);
    wait_status(&a, &h1, "APPLIED");
    append(&s.log("r"), b"1\n");
    wait_lines(&s.out("r"), 1);
    let h2 = srv.set_config(&[]);
    let m = wait_status(&a, &h2, "APPLIED");
    assert!(m["pipelines"].as_object().unwrap().is_empty(), "{m}");
    assert!(!s.data.join("opamp/pipelines/r.yaml").exists());
    // The local pipeline runs on; the remote one no longer reads.
    append(&s.log("local"), b"still here\n");
    wait_lines(&s.out("local"), 1);
    append(&s.log("r"), b"2\n");
    append(&s.log("local"), b"and here\n");
    wait_lines(&s.out("local"), 2);
    assert_eq!(
        count_lines(&s.out("r")),
        1,
        "the removed pipeline read nothing more"
    );
    assert_eq!(health(&a)["status"], "ok");
}

#[test]
fn starts_from_the_last_known_good_set_while_the_server_is_away() {
    let mut srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    let mut a = s.start();
    let hash = srv.set_config(&[("kept.yaml", &s.pipeline("kept", "kept"))]);
    wait_status(&a, &hash, "APPLIED");
    a.stop();
    srv.kill();
    let a = s.start();
    append(&s.log("kept"), b"while away\n");
    wait_lines(&s.out("kept"), 1);
    let m = health(&a)["managed"].clone();
    assert_eq!(m["connected"], false, "{m}");
    assert_eq!(m["remote_config_hash"], hash.as_str(), "{m}");
    assert_eq!(m["remote_config_status"], "APPLIED", "{m}");
    // Back: the agent reconnects and reports the set it runs.
    srv.restart();
    wait_server_status(&srv, &hash, "APPLIED");
}

#[test]
fn a_server_restart_in_the_middle_of_an_apply_is_reported_to_the_new_one() {
    let mut srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "remote:\n  health_watch_secs: 4\n");
    let a = s.start();
    let hash = srv.set_config(&[("m.yaml", &s.pipeline("m", "m"))]);
    wait_server_status(&srv, &hash, "APPLYING");
    srv.restart();
    let m = wait_status(&a, &hash, "APPLIED");
    assert_eq!(m["pipelines"]["m"]["status"], "APPLIED");
    // The new server (which knows nothing) learns the outcome from the
    // full status of the reconnect.
    let (_, status, _) = wait_server_status(&srv, &hash, "APPLIED");
    assert_eq!(status, "APPLIED");
    let first = &srv.messages()[0].msg;
    assert!(
        first.get("agentDescription").is_some(),
        "a full status first: {first}"
    );
    append(&s.log("m"), b"after\n");
    wait_lines(&s.out("m"), 1);
}

#[test]
fn a_pipeline_that_crashes_the_agent_is_reverted_after_n_starts() {
    let srv = OpampServer::start();
    let s = Setup::new(
        &srv.ws_endpoint(),
        "",
        "remote:\n  health_watch_secs: 2\n  crash_starts: 2\n",
    );
    let env = [("PETREL_TEST_ABORT_ON", "CRASH-ME")];
    let mut a = s.start_env(&env);
    let good = srv.set_config(&[("p.yaml", &s.pipeline("good", "p"))]);
    wait_status(&a, &good, "APPLIED");
    append(&s.log("good"), b"fine\n");
    wait_lines(&s.out("p"), 1);
    // The new version reads a file whose line crashes the process.
    append(&s.log("crash"), b"CRASH-ME\n");
    let bad = srv.set_config(&[("p.yaml", &s.pipeline("crash", "p"))]);
    let st = a.wait_exit(LONG);
    assert!(!st.success(), "the agent crashed: {st}");
    // A supervisor starts it again; each start with the pending apply
    // crashes, until the guard puts the good set back.
    let mut starts = 0;
    let a = loop {
        starts += 1;
        assert!(starts <= 4, "still crashing after {starts} starts");
        let mut a = s.start_env(&env);
        let up = wait_for(LONG, "the agent to crash or settle", || {
            if let Ok(Some(_)) = a.try_exit() {
                return Ok(false);
            }
            match health(&a)["managed"]["remote_config_status"].as_str() {
                Some("FAILED") => Ok(true),
                _ => Err("applying".into()),
            }
        });
        if up {
            break a;
        }
        let _ = a.wait_exit(MEDIUM);
    };
    assert_eq!(
        starts, 3,
        "two starts with the pending apply, then the revert"
    );
    let m = health(&a)["managed"].clone();
    assert_eq!(m["remote_config_hash"], bad.as_str(), "{m}");
    assert!(
        m["remote_config_error"]
            .as_str()
            .unwrap()
            .contains("reverted to the last known good configuration"),
        "{m}"
    );
    assert_eq!(
        metric(
            &a,
            "petrel_opamp_reverts_total",
            &[("reason", "crash_loop")]
        ),
        1.0
    );
    // The good version runs again, and the refused offer is not applied
    // again though the server keeps offering it.
    append(&s.log("good"), b"again\n");
    wait_lines(&s.out("p"), 2);
    let (_, _, err) = wait_server_status(&srv, &bad, "FAILED");
    assert!(err.contains("did not reach healthy"), "{err}");
    assert_eq!(
        std::fs::read_to_string(s.data.join("opamp/pipelines/p.yaml")).unwrap(),
        s.pipeline("good", "p")
    );
}

#[test]
fn a_pipeline_breaking_a_local_limit_fails_and_nothing_of_it_runs() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "remote:\n  health_watch_secs: 1\n");
    // Rewrite the limits: only logs/ may be read, only file and stdout
    // sinks, and no host but the local ones.
    let agent = std::fs::read_to_string(&s.agent_file).unwrap().replace(
        "limits:\n",
        "limits:\n  sink_types: [file, stdout]\n  destinations: [\"collector.internal\"]\n",
    );
    std::fs::write(&s.agent_file, agent).unwrap();
    let a = s.start();
    let reads_etc =
        "sources:\n  - type: file\n    include: [\"/etc/*.conf\"]\nsinks:\n  - type: stdout\n";
    let http_out = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\nsinks:\n  - type: http\n    url: http://evil.example.com/x\n",
        s.log("h").display()
    );
    let env = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\nsinks:\n  - type: file\n    path: \"${{HOME}}/x\"\n",
        s.log("e").display()
    );
    let ok = s.pipeline("ok", "ok");
    let hash = srv.set_config(&[
        ("etc.yaml", reads_etc),
        ("http.yaml", &http_out),
        ("env.yaml", &env),
        ("ok.yaml", &ok),
    ]);
    let m = wait_status(&a, &hash, "FAILED");
    let err = |n: &str| m["pipelines"][n]["error"].as_str().unwrap().to_string();
    assert!(
        err("etc").contains("`/etc/*.conf` reaches outside `limits.read_paths`"),
        "{m}"
    );
    assert!(
        err("http").contains("type `http` is not among `limits.sink_types`"),
        "{m}"
    );
    assert!(err("http").contains("sends to `evil.example.com`"), "{m}");
    assert!(
        err("env").contains("`${...}` environment references"),
        "{m}"
    );
    assert_eq!(m["pipelines"]["ok"]["status"], "APPLIED");
    // Nothing of the refused pipelines started.
    let metrics = a.metrics();
    for n in ["etc", "http", "env"] {
        assert!(
            !metrics.contains(&format!("pipeline=\"{n}\"")),
            "{n} has components running"
        );
    }
    append(&s.log("ok"), b"ok\n");
    wait_lines(&s.out("ok"), 1);
}

#[test]
fn the_effective_config_names_origins_and_redacts_secrets() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    // Destinations that refuse nothing: the sinks only need to load.
    let local = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\nsinks:\n  - type: http\n    url: http://127.0.0.1:9/x\n    headers: {{Authorization: \"Bearer local-secret-1\", X-Team: logs}}\n",
        s.log("l").display()
    );
    write_config(&s.local, "withsecret", &local);
    let a = s.start();
    let remote = format!(
        "sources:\n  - type: file\n    include: [\"{}\"]\nsinks:\n  - type: elasticsearch\n    endpoints: [\"http://127.0.0.1:9\"]\n    auth:\n      strategy: basic\n      user: bob\n      password: remote-secret-2 # rotated monthly\n",
        s.log("r").display()
    );
    let hash = srv.set_config(&[("es.yaml", &remote)]);
    wait_status(&a, &hash, "APPLIED");
    let eff = wait_for(LONG, "an effective config with both files", || {
        let msgs = srv.messages();
        let e = msgs
            .iter()
            .rev()
            .find_map(|m| m.msg.get("effectiveConfig"))
            .cloned()
            .ok_or("none")?;
        let map = e["configMap"]["configMap"].clone();
        if map.get("remote/es.yaml").is_some() && map.get("local/withsecret.yaml").is_some() {
            Ok(map)
        } else {
            Err(map.to_string())
        }
    });
    let body =
        |k: &str| String::from_utf8(opamp_server::b64(eff[k]["body"].as_str().unwrap())).unwrap();
    let l = body("local/withsecret.yaml");
    let r = body("remote/es.yaml");
    assert!(
        !l.contains("local-secret-1") && l.contains("\"<redacted>\""),
        "{l}"
    );
    assert!(l.contains("X-Team: logs"), "{l}");
    assert!(
        !r.contains("remote-secret-2") && r.contains("password: \"<redacted>\" # rotated monthly"),
        "{r}"
    );
    assert!(r.contains("user: bob"), "{r}");
    for m in srv.messages() {
        let t = m.msg.to_string();
        assert!(!t.contains("local-secret-1") && !t.contains("remote-secret-2"));
    }
}

#[test]
fn with_websocket_blocked_plain_http_polling_works() {
    let srv = OpampServer::start();
    srv.set_mode("block_ws");
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    let a = s.start();
    let hash = srv.set_config(&[("poll.yaml", &s.pipeline("poll", "poll"))]);
    let m = wait_status(&a, &hash, "APPLIED");
    assert_eq!(m["transport"], "http", "{m}");
    assert_eq!(m["connected"], true, "{m}");
    let msgs = srv.messages();
    assert!(!msgs.is_empty());
    assert!(
        msgs.iter().all(|m| m.transport == "http"),
        "only plain HTTP got through"
    );
    wait_server_status(&srv, &hash, "APPLIED");
    append(&s.log("poll"), b"polled\n");
    wait_lines(&s.out("poll"), 1);
    assert_eq!(
        metric(&a, "petrel_opamp_connected", &[("transport", "http")]),
        1.0
    );
}

#[test]
fn every_line_arrives_once_across_twenty_pushes() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "remote:\n  health_watch_secs: 0\n");
    let a = s.start();
    let steady = s.pipeline("steady", "steady");
    let mut expected = Vec::new();
    let mut n = 0;
    for push in 0..20 {
        // The churning pipeline changes at each push; `steady` never does.
        let churn = format!("{}# push {push}\n", s.pipeline("churn", "churn"));
        let hash = srv.set_config(&[("steady.yaml", &steady), ("churn.yaml", &churn)]);
        let mut chunk = String::new();
        for _ in 0..5000 {
            let line = format!("line {n:06} {}", "x".repeat(40));
            chunk.push_str(&line);
            chunk.push('\n');
            expected.push(line.into_bytes());
            n += 1;
        }
        append(&s.log("steady"), chunk.as_bytes());
        append(&s.log("churn"), format!("churn {push}\n").as_bytes());
        wait_status(&a, &hash, "APPLIED");
    }
    assert_eq!(n, 100_000);
    wait_lines(&s.out("steady"), n);
    let got = read_lines(&s.out("steady"));
    assert_eq!(got.len(), n, "no line twice");
    assert_eq!(histogram(got), histogram(expected), "each line once");
    wait_lines(&s.out("churn"), 20);
    assert_eq!(
        histogram(read_lines(&s.out("churn")))
            .values()
            .copied()
            .max(),
        Some(1),
        "the changed pipeline duplicated nothing either"
    );
    assert_eq!(
        metric(
            &a,
            "petrel_opamp_remote_config_applies_total",
            &[("result", "applied")]
        ),
        20.0
    );
}

#[test]
fn bad_input_from_the_server_is_counted_and_the_pipelines_run_on() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "", "");
    let a = s.start();
    let hash = srv.set_config(&[("keep.yaml", &s.pipeline("keep", "keep"))]);
    wait_status(&a, &hash, "APPLIED");
    let refused = |reason: &str| {
        metric(
            &a,
            "petrel_opamp_messages_refused_total",
            &[("reason", reason)],
        )
    };
    for (kind, reason) in [
        ("text", "text_frame"),
        ("bad_header", "bad_header"),
        ("garbage", "malformed"),
        ("unknown_capability", "unknown_capability"),
        ("unknown_command", "unknown_command"),
        ("packages", "packages"),
    ] {
        assert_eq!(
            srv.send(serde_json::json!({"kind": kind})),
            1,
            "{kind} sent"
        );
        wait_for(LONG, &format!("{reason} counted"), || {
            if refused(reason) >= 1.0 {
                Ok(())
            } else {
                Err(a.stderr().lines().last().unwrap_or("").to_string())
            }
        });
    }
    assert!(a
        .stderr()
        .contains("refused a message from the OpAMP server"));
    // A package offer is answered: not supported.
    wait_for(LONG, "package statuses", || {
        let msgs = srv.messages();
        let p = msgs
            .iter()
            .rev()
            .find_map(|m| m.msg.get("packageStatuses"))
            .ok_or("none")?;
        if p["errorMessage"]
            .as_str()
            .is_some_and(|e| e.contains("not supported"))
        {
            Ok(())
        } else {
            Err(p.to_string())
        }
    });
    // 10,000 pipelines: decoded, refused whole by `remote.max_pipelines`.
    let template = format!(
        "sources:\n  - type: stdin\nsinks:\n  - type: file\n    path: \"{}/many-{{{{N}}}}.txt\"\n",
        s.root.display()
    );
    assert_eq!(
        srv.send(serde_json::json!({"kind": "many", "count": 10000, "template": template})),
        1
    );
    wait_for(LONG, "10,000 pipelines refused", || {
        if refused("too_many_pipelines") >= 1.0 {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    wait_for(LONG, "the server told why", || {
        let st = statuses(&srv.messages());
        st.iter()
            .find(|(_, s, e)| {
                s == "FAILED"
                    && e.contains("10000 pipelines, more than `remote.max_pipelines` (2000)")
            })
            .map(|_| ())
            .ok_or_else(|| format!("{st:?}"))
    });
    // 100 MB: refused unread (over the message limit); the connection is
    // dropped and made again.
    srv.send(serde_json::json!({"kind": "big", "bytes": 100 << 20}));
    wait_for(LONG, "100 MB refused", || {
        if refused("too_large") >= 1.0 {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    // Connected again (the agent waits its backoff first).
    wait_for(LONG, "the agent connected again", || {
        if srv.ws_agents() == 1 {
            Ok(())
        } else {
            Err(format!("{} WebSocket agents", srv.ws_agents()))
        }
    });
    // The server's standing configuration is applied again on reconnect
    // (its hash differs from the refused one's), and the pipeline ran
    // all along.
    wait_status(&a, &hash, "APPLIED");
    append(&s.log("keep"), b"still running\n");
    wait_lines(&s.out("keep"), 1);
    assert!(!s.root.join("many-0.txt").exists());
    // The restart command is an in-process reload.
    let reloads = metric(&a, "petrel_config_reload_total", &[("result", "unchanged")]);
    // Sent once it reaches the agent (under load the connection may be
    // between a drop and the reconnect at that moment).
    wait_for(LONG, "the restart command sent", || {
        match srv.send(serde_json::json!({"kind": "restart"})) {
            1 => Ok(()),
            n => Err(format!("sent to {n} agents")),
        }
    });
    wait_for(LONG, "a reload", || {
        if metric(&a, "petrel_config_reload_total", &[("result", "unchanged")]) > reloads {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    assert_eq!(health(&a)["status"], "ok");
}

/// The `connectionSettingsStatus` reports received, as (status without
/// its prefix, error message), in order.
fn connection_statuses(msgs: &[opamp_server::Received]) -> Vec<(String, String)> {
    msgs.iter()
        .filter_map(|r| {
            let s = r.msg.get("connectionSettingsStatus")?;
            Some((
                s.get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .trim_start_matches("ConnectionSettingsStatuses_")
                    .to_string(),
                s.get("errorMessage")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            ))
        })
        .collect()
}

fn wait_connection_status(s: &OpampServer, n: usize, status: &str) -> String {
    wait_for(
        LONG,
        &format!("connection settings status #{n} {status}"),
        || {
            let st = connection_statuses(&s.messages());
            match st.get(n) {
                Some((got, err)) if got == status => Ok(err.clone()),
                _ => Err(format!("{st:?}")),
            }
        },
    )
}

fn wait_ws_agent(srv: &OpampServer) {
    wait_for(LONG, "a WebSocket agent", || {
        if srv.ws_agents() == 1 {
            Ok(())
        } else {
            Err(format!("{} WebSocket agents", srv.ws_agents()))
        }
    });
}

fn otlp_logs(srv: &OpampServer) -> Vec<(Value, ExportLogsServiceRequest)> {
    srv.otlp_requests()
        .into_iter()
        .filter(|r| r.path == "/otlp/v1/logs")
        .map(|r| {
            let req = ExportLogsServiceRequest::decode(r.body.as_slice())
                .unwrap_or_else(|e| panic!("an own-logs request that is not OTLP: {e}"));
            (r.headers, req)
        })
        .collect()
}

fn otlp_metrics(srv: &OpampServer) -> Vec<ExportMetricsServiceRequest> {
    srv.otlp_requests()
        .into_iter()
        .filter(|r| r.path == "/otlp/v1/metrics")
        .map(|r| {
            ExportMetricsServiceRequest::decode(r.body.as_slice())
                .unwrap_or_else(|e| panic!("an own-metrics request that is not OTLP: {e}"))
        })
        .collect()
}

fn resource_attr(r: Option<&Resource>, key: &str) -> Option<String> {
    r?.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

#[test]
fn own_logs_and_metrics_go_where_the_server_offers_within_the_limits() {
    let srv = OpampServer::start();
    let s = Setup::new(&srv.ws_endpoint(), "  own_metrics_interval_secs: 1\n", "");
    let a = s.start();
    wait_ws_agent(&srv);
    let first = srv.messages();
    let caps = first[0].msg["capabilities"].as_str().map_or_else(
        || first[0].msg["capabilities"].as_u64().unwrap(),
        |s| s.parse().unwrap(),
    );
    for bit in [0x40u64, 0x80, 0x8000] {
        assert_ne!(caps & bit, 0, "capability {bit:#x} in {caps:#x}");
    }
    let token = "Bearer own-token-7c1";
    srv.send(serde_json::json!({
        "kind": "telemetry",
        "logs": srv.otlp_endpoint("logs"),
        "metrics": srv.otlp_endpoint("metrics"),
        "header": token,
    }));
    wait_connection_status(&srv, 0, "APPLIED");
    assert_eq!(health(&a)["managed"]["own_telemetry_status"], "APPLIED");
    // A log record of the agent after the pipeline started: an apply.
    let hash = srv.set_config(&[("app.yaml", &s.pipeline("app", "app"))]);
    wait_status(&a, &hash, "APPLIED");
    let (headers, req) = wait_for(LONG, "the agent's own logs over OTLP", || {
        otlp_logs(&srv)
            .into_iter()
            .find(|(_, r)| format!("{r:?}").contains("applying a remote configuration"))
            .ok_or_else(|| format!("{} log requests", otlp_logs(&srv).len()))
    });
    assert_eq!(headers["Authorization"], token);
    let res = req.resource_logs[0].resource.as_ref();
    assert_eq!(
        resource_attr(res, "service.name").as_deref(),
        Some("petrel")
    );
    assert!(resource_attr(res, "service.instance.id").is_some());
    // Metrics every second: counters as monotonic sums, the process
    // metrics under the semantic conventions' names.
    let m = wait_for(LONG, "the agent's own metrics over OTLP", || {
        otlp_metrics(&srv)
            .into_iter()
            .find(|r| format!("{r:?}").contains("petrel_component_sent_events"))
            .ok_or_else(|| format!("{} metrics requests", otlp_metrics(&srv).len()))
    });
    let names: Vec<&str> = m.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert!(names.contains(&"process.cpu.time"), "{names:?}");
    assert!(names.contains(&"petrel_opamp_connected"), "{names:?}");
    assert_eq!(
        resource_attr(m.resource_metrics[0].resource.as_ref(), "service.name").as_deref(),
        Some("petrel")
    );
    assert!(metric(&a, "petrel_opamp_own_metrics_sent_total", &[]) >= 1.0);
    // The effective configuration shows the own-logs pipeline, its token
    // redacted.
    let eff = wait_for(
        LONG,
        "the own-logs pipeline in the effective config",
        || {
            let msgs = srv.messages();
            let e = msgs
                .iter()
                .rev()
                .find_map(|m| m.msg.get("effectiveConfig"))
                .ok_or("none")?;
            let f = &e["configMap"]["configMap"]["opamp/opamp-own-logs.yaml"]["body"];
            f.as_str()
                .map(|b| String::from_utf8_lossy(&opamp_server::b64(b)).into_owned())
                .ok_or_else(|| e.to_string())
        },
    );
    assert!(eff.contains("internal_logs"), "{eff}");
    assert!(!eff.contains("own-token-7c1"), "{eff}");
    // An offer that asks to skip verification is refused whole; what
    // ran goes on.
    srv.send(serde_json::json!({
        "kind": "telemetry",
        "logs": srv.otlp_endpoint("logs"),
        "metrics": srv.otlp_endpoint("metrics"),
        "header": token,
        "insecure": true,
    }));
    let why = wait_connection_status(&srv, 1, "FAILED");
    assert!(why.contains("verif"), "{why}");
    let before = otlp_metrics(&srv).len();
    wait_for(LONG, "metrics still sent", || {
        if otlp_metrics(&srv).len() > before {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    // Empty destinations turn both off.
    srv.send(serde_json::json!({"kind": "telemetry", "logs": "", "metrics": ""}));
    wait_connection_status(&srv, 2, "APPLIED");
    wait_for(LONG, "the own-logs pipeline stopped", || {
        let h = health(&a);
        if h["managed"]["own_telemetry"] == "" {
            Ok(())
        } else {
            Err(h["managed"].to_string())
        }
    });
    // Nothing more after the exporter stopped (one request may have
    // been under way).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let stopped = otlp_metrics(&srv).len();
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        otlp_metrics(&srv).len(),
        stopped,
        "metrics after turning off"
    );
    drop(a);

    // An agent whose limits allow other destinations refuses the offer,
    // and sends nothing.
    let b = Setup::new(
        &srv.ws_endpoint(),
        "  own_metrics_interval_secs: 1\n",
        "limits:\n  destinations: [\"*.example.com\"]\n",
    );
    let _b = b.start();
    wait_ws_agent(&srv);
    let n = connection_statuses(&srv.messages()).len();
    let sent = srv.otlp_requests().len();
    srv.send(serde_json::json!({
        "kind": "telemetry",
        "logs": srv.otlp_endpoint("logs"),
        "metrics": srv.otlp_endpoint("metrics"),
    }));
    let why = wait_connection_status(&srv, n, "FAILED");
    assert!(why.contains("limits.destinations"), "{why}");
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        srv.otlp_requests().len(),
        sent,
        "nothing sent past the limits"
    );
}

#[test]
fn a_new_instance_uid_is_kept_with_the_fleet_state_when_the_managed_directory_is_elsewhere() {
    let srv = OpampServer::start();
    let s = Setup::new(
        &srv.ws_endpoint(),
        "",
        "remote:\n  health_watch_secs: 1\n  dir: MANAGED\n",
    );
    // The managed directory outside the data dir (`remote.dir`).
    let managed = s.root.join("managed");
    let text = std::fs::read_to_string(&s.agent_file)
        .unwrap()
        .replace("MANAGED", &managed.display().to_string());
    std::fs::write(&s.agent_file, text).unwrap();
    let a = s.start();
    wait_ws_agent(&srv);
    // 16 bytes: "new-uid-01234567".
    assert_eq!(
        srv.send(serde_json::json!({"kind": "new_uid", "template": "new-uid-01234567"})),
        1
    );
    let want = "6e65772d-7569-642d-3031-323334353637";
    wait_for(LONG, "the new uid kept in the data dir", || {
        let kept = std::fs::read_to_string(s.data.join("opamp/instance_uid")).unwrap_or_default();
        if kept.trim() == want {
            Ok(())
        } else {
            Err(kept)
        }
    });
    assert!(
        !s.root.join("instance_uid").exists(),
        "written beside the managed directory"
    );
    // The agent uses it after a restart.
    drop(a);
    let n = srv.messages().len();
    let _a = s.start();
    wait_for(LONG, "a message with the new uid", || {
        let msgs = srv.messages();
        match msgs
            .get(n..)
            .unwrap_or_default()
            .iter()
            .find_map(|m| m.msg["instanceUid"].as_str())
        {
            Some(u) if opamp_server::b64_to_hex(u) == want.replace('-', "") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}
