//! `app | petrel run`: the stdin source delivers every line (the last one
//! even without a newline) and the agent exits 0 by itself once standard
//! input ended and everything was delivered.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn piped_input_is_delivered_and_the_agent_exits_by_itself() {
    let dir = tempdir();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "pipe",
        &format!(
            "sources:\n  - type: stdin\nsinks:\n  - type: file\n    path: \"{}\"\n    encoding: text\n",
            out.display()
        ),
    );
    let mut child = Command::new(bin())
        .args([
            "run",
            "--api-addr",
            "127.0.0.1:0",
            "--memory-limit",
            "4MiB",
            "--config",
        ])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start petrel");
    let mut stdin = child.stdin.take().unwrap();
    // More than the memory limit, so reading must pause and resume.
    const N: usize = 200_000;
    let writer = std::thread::spawn(move || {
        let mut text = String::new();
        for i in 0..N {
            text.push_str(&format!("line {i:07} from a piped application\n"));
        }
        text.push_str("the last line has no newline");
        stdin.write_all(text.as_bytes()).unwrap();
        // Dropping stdin closes the pipe: end of input.
    });
    writer.join().unwrap();
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("petrel did not exit after its standard input ended");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "exit {status}: {err}");
    let lines = read_lines(&out);
    assert_eq!(lines.len(), N + 1, "{err}");
    for (i, l) in lines.iter().take(N).enumerate() {
        assert_eq!(
            l,
            format!("line {i:07} from a piped application").as_bytes()
        );
    }
    assert_eq!(lines[N], b"the last line has no newline");
}

#[test]
fn two_stdin_sources_are_refused() {
    let dir = tempdir();
    let out = dir.path().join("out.log");
    let cfg = write_config(
        dir.path(),
        "two",
        &format!(
            "sources:\n  - type: stdin\n  - type: stdin\nsinks:\n  - type: file\n    path: \"{}\"\n",
            out.display()
        ),
    );
    let data = dir.path().join("data");
    let (code, _, err) = run_to_end(
        dir.path(),
        &[
            "run",
            "--api-addr",
            "127.0.0.1:0",
            "--config",
            &cfg.to_string_lossy(),
            "--data-dir",
            &data.to_string_lossy(),
        ],
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("already read by another `stdin` source"),
        "{err}"
    );
}
