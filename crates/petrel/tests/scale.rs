//! Many pipelines share a handful of threads.

mod common;

use common::*;

fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Threads:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(usize::MAX)
}

/// 1,000 pipelines × 10 files each: every line is delivered, and the agent
/// runs on a fixed, small set of threads (input, workers, sink runtime and
/// its bounded blocking pool), not one per pipeline or file.
#[test]
fn thousand_pipelines_ten_files_each_on_few_threads() {
    const PIPELINES: usize = 1000;
    const FILES: usize = 10;
    let dir = tempdir();
    let conf = dir.path().join("pipelines");
    std::fs::create_dir_all(&conf).unwrap();
    for p in 0..PIPELINES {
        let logs = dir.path().join("logs").join(format!("p{p:04}"));
        std::fs::create_dir_all(&logs).unwrap();
        for f in 0..FILES {
            std::fs::write(
                logs.join(format!("f{f}.log")),
                format!("pipeline {p} file {f}\n"),
            )
            .unwrap();
        }
        write_config(
            &conf,
            &format!("p{p:04}"),
            &format!(
                "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nsinks:\n  - type: blackhole\n",
                logs.display()
            ),
        );
    }
    let agent = Agent::start_with(
        &conf,
        &dir.path().join("data"),
        AgentOptions {
            args: vec!["--threads".into(), "2".into()],
            ..AgentOptions::default()
        },
    );
    let total = || -> f64 {
        let text = agent.metrics();
        text.lines()
            .filter(|l| {
                l.starts_with("petrel_component_sent_events_total{")
                    && l.contains("component_kind=\"sink\"")
            })
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    let mut peak_threads = 0;
    wait_for(LONG, "10,000 lines through 1,000 pipelines", || {
        peak_threads = peak_threads.max(threads_of(agent.pid()));
        match total() {
            n if n == (PIPELINES * FILES) as f64 => Ok(()),
            n => Err(format!("{n} delivered")),
        }
    });
    peak_threads = peak_threads.max(threads_of(agent.pid()));
    eprintln!("1000 pipelines: peak {peak_threads} threads");
    // main + input + 2 workers + 1 sink runtime thread + at most 8
    // blocking writers, plus the signal thread.
    assert!(
        peak_threads <= 16,
        "{peak_threads} threads for 1,000 pipelines"
    );
}
