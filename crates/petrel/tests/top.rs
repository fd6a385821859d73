//! `petrel top` driven in a real terminal (tmux) against a running agent:
//! the screen shows the pipeline with non-zero rates, `q` exits 0, and an
//! address where no agent answers gives a clear message.

mod common;
mod pki;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// A detached tmux session running `cmd`; killed on drop.
struct Tmux {
    name: String,
}

impl Tmux {
    fn start(name: &str, cmd: &str) -> Tmux {
        let st = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                "160",
                "-y",
                "40",
                cmd,
            ])
            .status()
            .expect("tmux is needed (scripts/install-test-tools.sh)");
        assert!(st.success(), "tmux new-session failed");
        Tmux {
            name: name.to_string(),
        }
    }

    fn screen(&self) -> String {
        let o = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        let st = Command::new("tmux")
            .args(["send-keys", "-t", &self.name, keys])
            .status()
            .expect("tmux send-keys");
        assert!(st.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .status();
    }
}

/// The command line for tmux: `petrel top ...`, its exit status written to
/// `exit_file` when it ends.
fn top_cmd(addr: &str, exit_file: &Path) -> String {
    format!(
        "{} top --api-addr {addr} --interval-ms 300; echo $? > {}",
        bin().display(),
        exit_file.display()
    )
}

/// Waits for `petrel top`'s exit status in `exit_file`. The shell creates
/// the file before it writes the status: an empty file is not an answer
/// yet (it was once read as "", which failed this test).
fn exit_status(exit_file: &Path) -> String {
    wait_for(LONG, "petrel top exited", || {
        std::fs::read_to_string(exit_file)
            .map_err(|e| e.to_string())
            .and_then(|s| match s.trim() {
                "" => Err("the exit file is still empty".to_string()),
                code => Ok(code.to_string()),
            })
    })
}

#[test]
fn top_shows_a_busy_pipeline_and_q_exits_0() {
    let dir = tempdir();
    let log = dir.path().join("app.log");
    append(&log, b"first\n");
    let cfg = write_config(
        dir.path(),
        "busy_web",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nprocessors:\n  - type: parse_json\n    id: json\nsinks:\n  - type: blackhole\n",
            log.display()
        ),
    );
    let agent = Agent::start(&cfg, &dir.path().join("data"));
    // A steady writer for as long as the test needs it (bounded).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, log) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            for i in 0..(LONG.as_millis() / 20) {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let lines: String = (0..50).map(|j| format!("line {i} {j}\n")).collect();
                append(&log, lines.as_bytes());
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let exit_file = dir.path().join("exit");
    let session = format!("petrel-top-{}", std::process::id());
    let tmux = Tmux::start(
        &session,
        &top_cmd(&format!("127.0.0.1:{}", agent.port), &exit_file),
    );
    // The source's row: pipeline, kind, `file_0 (file)`, in ev/s, out ev/s.
    let screen = wait_for(LONG, "a non-zero rate for busy_web's source", || {
        let s = tmux.screen();
        let busy = s.lines().any(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            t.len() > 5 && t[0] == "busy_web" && t[1] == "source" && t[2] == "file_0" && t[5] != "0"
        });
        if busy {
            Ok(s)
        } else {
            Err(s)
        }
    });
    assert!(screen.contains("petrel top"), "{screen}");
    assert!(screen.contains("q quit"), "the help line: {screen}");
    assert!(
        screen
            .lines()
            .any(|l| l.starts_with("busy_web") && l.contains("sink")),
        "the sink's row: {screen}"
    );
    tmux.keys("q");
    let code = exit_status(&exit_file);
    assert_eq!(code, "0", "exit status of `petrel top` after q");
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
}

#[test]
fn top_reads_an_api_served_over_tls_with_a_client_certificate() {
    let dir = tempdir();
    let ca = pki::Ca::new(&dir.path().join("pki"), "api-ca");
    let server = ca.issue("api", "127.0.0.1", 0x21, true);
    let client = ca.issue("operator", "operator", 0x22, false);
    let log = dir.path().join("app.log");
    append(&log, b"first\n");
    let cfg = write_config(
        dir.path(),
        "tls_web",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}\"]\n    read_from: beginning\nsinks:\n  - type: blackhole\n",
            log.display()
        ),
    );
    let agent = Agent::start_with(
        &cfg,
        &dir.path().join("data"),
        AgentOptions {
            args: vec![
                "--api-tls-cert".into(),
                server.cert.display().to_string(),
                "--api-tls-key".into(),
                server.key.display().to_string(),
                "--api-tls-client-ca".into(),
                ca.pem().display().to_string(),
                "--api-auth".into(),
                "metrics".into(),
            ],
            env: vec![("PETREL_API_TOKEN".into(), "top-token".into())],
            ..Default::default()
        },
    );
    let exit_file = dir.path().join("exit");
    let session = format!("petrel-top-tls-{}", std::process::id());
    let cmd = format!(
        "PETREL_API_TOKEN=top-token {} top --api-addr https://127.0.0.1:{} --api-ca-file {} --api-cert-file {} --api-key-file {} --interval-ms 300; echo $? > {}",
        bin().display(),
        agent.port,
        ca.pem().display(),
        client.cert.display(),
        client.key.display(),
        exit_file.display()
    );
    let tmux = Tmux::start(&session, &cmd);
    let screen = wait_for(LONG, "tls_web's rows over TLS", || {
        let s = tmux.screen();
        if s.lines()
            .any(|l| l.starts_with("tls_web") && l.contains("source"))
        {
            Ok(s)
        } else {
            Err(s)
        }
    });
    assert!(screen.contains("petrel top"), "{screen}");
    tmux.keys("q");
    let code = wait_for(LONG, "petrel top exited", || {
        std::fs::read_to_string(&exit_file)
            .map(|s| s.trim().to_string())
            .map_err(|e| e.to_string())
    });
    assert_eq!(code, "0");
}

#[test]
fn top_says_clearly_when_no_agent_answers() {
    let dir = tempdir();
    let port = free_port();
    let exit_file = dir.path().join("exit");
    let session = format!("petrel-top-none-{}", std::process::id());
    let tmux = Tmux::start(&session, &top_cmd(&format!("127.0.0.1:{port}"), &exit_file));
    wait_for(LONG, "the no-agent message", || {
        let s = tmux.screen();
        if s.contains(&format!("no agent answers at 127.0.0.1:{port}")) {
            Ok(())
        } else {
            Err(s)
        }
    });
    tmux.keys("q");
    let code = exit_status(&exit_file);
    assert_eq!(code, "0");
}
