//! The file sink under hostile conditions: its output deleted, replaced or
//! repointed while it runs, a full disk, a FIFO as its path. Nothing it
//! acknowledges may be lost, torn or duplicated.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn numbered(tag: &str, from: usize, to: usize) -> String {
    (from..to)
        .map(|i| format!("{tag}-{i:06} {}\n", "y".repeat(40)))
        .collect()
}

fn line(tag: &str, i: usize) -> Vec<u8> {
    format!("{tag}-{i:06} {}", "y".repeat(40)).into_bytes()
}

fn config(dir: &Path, logs: &Path, out: &Path) -> PathBuf {
    write_config(
        dir,
        "sink",
        &simple_config(&format!("{}/*.log", logs.display()), out, ""),
    )
}

#[test]
fn a_deleted_output_directory_is_recreated_and_nothing_is_lost() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let out_dir = dir.path().join("out");
    let out = out_dir.join("sub").join("o.log");
    let agent = Agent::start(&config(dir.path(), &logs, &out), &dir.path().join("data"));
    append(&input, numbered("d", 0, 1000).as_bytes());
    wait_lines(&out, 1000);
    std::fs::remove_dir_all(&out_dir).unwrap();
    append(&input, numbered("d", 1000, 3000).as_bytes());
    wait_lines(&out, 2000);
    std::thread::sleep(Duration::from_millis(500));
    let h = histogram(read_lines(&out));
    for i in 1000..3000 {
        assert_eq!(h.get(&line("d", i)), Some(&1), "line {i}");
    }
    assert_eq!(h.len(), 2000, "only the lines written after the deletion");
    assert!(
        fds_pointing_at(agent.pid(), &out)
            .iter()
            .all(|t| !t.contains("(deleted)")),
        "no descriptor left on the deleted file"
    );
    assert!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("error_type", "output_replaced")]
        ) >= 1.0
    );
}

#[test]
fn a_symlink_repointed_from_dev_full_to_a_file_recovers() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let link = dir.path().join("out.log");
    std::os::unix::fs::symlink("/dev/full", &link).unwrap();
    let _agent = Agent::start(&config(dir.path(), &logs, &link), &dir.path().join("data"));
    append(&input, numbered("s", 0, 500).as_bytes());
    // Writes fail on /dev/full and are retried; then the link is repointed.
    std::thread::sleep(Duration::from_secs(1));
    let real = dir.path().join("real.log");
    std::fs::write(&real, b"").unwrap();
    let tmp = dir.path().join("out.log.new");
    std::os::unix::fs::symlink(&real, &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    wait_lines(&real, 500);
    std::thread::sleep(Duration::from_millis(500));
    let h = histogram(read_lines(&real));
    for i in 0..500 {
        assert_eq!(h.get(&line("s", i)), Some(&1), "line {i}");
    }
    assert_eq!(h.len(), 500);
}

#[test]
fn a_full_disk_leaves_no_torn_or_duplicate_record() {
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("app.log");
    let mnt = dir.path().join("small");
    let _fs = Tmpfs::mount(&mnt, "1m");
    // Most of the space taken, so the output fills the rest mid-write.
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![b'f'; 700 << 10]).unwrap();
    let out = mnt.join("out.log");
    let agent = Agent::start(&config(dir.path(), &logs, &out), &dir.path().join("data"));
    // About 560 KB: more than the room left.
    const N: usize = 10_000;
    append(&input, numbered("e", 0, N).as_bytes());
    wait_for(LONG, "write failures on the full disk", || {
        let n = agent.metric_or_zero(
            "petrel_component_errors_total",
            &[("error_type", "write_failed")],
        );
        (n >= 1.0).then_some(()).ok_or(format!("{n} failures"))
    });
    std::fs::remove_file(&filler).unwrap();
    wait_lines(&out, N);
    std::thread::sleep(Duration::from_millis(500));
    let lines = read_lines(&out);
    let h = histogram(lines.iter().cloned());
    for i in 0..N {
        assert_eq!(h.get(&line("e", i)), Some(&1), "line {i}");
    }
    assert_eq!(lines.len(), N, "no torn piece, no duplicate");
    let text = std::fs::read(&out).unwrap();
    assert!(text.ends_with(b"\n"), "ends with a complete record");
}

#[test]
fn a_fifo_as_sink_path_is_refused_at_once() {
    let dir = tempdir();
    let fifo = dir.path().join("pipe");
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let cfg = write_config(
        dir.path(),
        "fifo",
        &simple_config(&format!("{}/logs/*.log", dir.path().display()), &fifo, ""),
    );
    let (code, out, _) = run_to_end(
        dir.path(),
        &["validate", "--config", &cfg.to_string_lossy()],
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("is a FIFO"), "{out}");
    // `run_to_end` bounds the wait: a hang in open() fails the test.
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
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is a FIFO"), "{err}");
}

/// A templated path (`{{ host }}`, rsyslog's dynaFile): 1,000 distinct
/// hosts through a sink bounded to 64 open files; every line is in its
/// host's file, once, in order, and the files have the sink's mode. The
/// agent never holds more than the bound of output files open.
#[test]
fn a_templated_path_puts_every_line_in_its_file_under_the_open_file_bound() {
    const HOSTS: usize = 1000;
    const PER_HOST: usize = 5;
    let dir = tempdir();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let input = logs.join("remote.log");
    let mut text = String::new();
    for round in 0..PER_HOST {
        for h in 0..HOSTS {
            text.push_str(&format!("h{h:04} line-{round}\n"));
        }
    }
    append(&input, text.as_bytes());
    let out = dir.path().join("out");
    let cfg = write_config(
        dir.path(),
        "dyn",
        &format!(
            "sources:\n  - type: file\n    include: [\"{}/*.log\"]\n    read_from: beginning\nprocessors:\n  - type: parse_regex\n    pattern: '^(?<host>\\S+) '\nsinks:\n  - type: file\n    path: \"{}/{{{{ host }}}}/app.log\"\n    mode: \"0640\"\n    max_open_files: 64\n",
            logs.display(),
            out.display()
        ),
    );
    let data = dir.path().join("data");
    let agent = Agent::start(&cfg, &data);
    let len = std::fs::metadata(&input).unwrap().len();
    wait_for(LONG, "the input committed", || {
        match checkpoint_offset(&data, &input) {
            Some(o) if o == len => Ok(()),
            o => Err(format!("{o:?}")),
        }
    });
    let prefix = out.to_string_lossy().into_owned();
    let open = std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with(&prefix))
        .count();
    assert!(open > 0 && open <= 64, "{open} output files open");
    use std::os::unix::fs::PermissionsExt;
    for h in 0..HOSTS {
        let f = out.join(format!("h{h:04}")).join("app.log");
        let want: Vec<Vec<u8>> = (0..PER_HOST)
            .map(|r| format!("h{h:04} line-{r}").into_bytes())
            .collect();
        assert_eq!(read_lines(&f), want, "{}", f.display());
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640, "{}", f.display());
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), HOSTS);
}
