//! `kubernetes_logs` and `container_files` against a real containerd with
//! its CRI plugin (a private one per test, started by `scripts/cri-lab.sh`,
//! whose `setup` the test command runs first): pods with labels run
//! busybox containers that print numbered lines, some longer than 16 KiB;
//! Petrel collects them with the runtime's metadata, selects by label,
//! keeps collecting across a container restart, reads a terminated pod's
//! log to its end and lets go of it once deleted, and reads files inside a
//! running container through `/proc/<pid>/root`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use common::*;
use petrel_cri::lab::{ContainerState, Containerd};

const IMAGE: &str = "localhost/crilab/busybox:1";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn s<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(|x| x.as_str()).unwrap_or("")
}

/// Events of `out` whose message starts with `prefix`.
fn with_prefix(out: &Path, prefix: &str) -> Vec<serde_json::Value> {
    if !out.exists() {
        return Vec::new();
    }
    json_lines(out)
        .into_iter()
        .filter(|v| s(v, "message").starts_with(prefix))
        .collect()
}

fn wait_events(out: &Path, prefix: &str, n: usize) -> Vec<serde_json::Value> {
    wait_for(
        LONG,
        &format!("{n} `{prefix}` events in {}", out.display()),
        || {
            let got = with_prefix(out, prefix);
            if got.len() >= n {
                Ok(got)
            } else {
                Err(format!("{} so far", got.len()))
            }
        },
    )
}

/// A shell loop printing `<prefix>-1` .. `<prefix>-n`.
fn numbered(prefix: &str, n: usize) -> String {
    format!("i=1; while [ $i -le {n} ]; do echo {prefix}-$i; i=$((i+1)); done")
}

#[test]
fn kubernetes_logs_and_container_files_against_a_real_containerd() {
    let cd = Containerd::start().expect("start containerd (scripts/cri-lab.sh setup first)");
    let lab = cd.client().expect("CRI client");
    let dir = tempdir();
    let (all, web, files) = (
        dir.path().join("all.ndjson"),
        dir.path().join("web.ndjson"),
        dir.path().join("files.ndjson"),
    );
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let source = |extra: &str| {
        format!(
            "  - type: kubernetes_logs\n    pods_dir: {}\n    runtime: containerd\n    containerd_socket: {}\n    annotation_fields: [team]\n    partial_line_timeout_ms: 500\n    metadata_wait_ms: 2000\n{extra}",
            cd.pods_dir().display(),
            cd.socket().display()
        )
    };
    let sink = |p: &Path| {
        format!(
            "sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
            p.display()
        )
    };
    write_config(
        &conf,
        "all",
        &format!("sources:\n{}{}", source(""), sink(&all)),
    );
    write_config(
        &conf,
        "web",
        &format!(
            "sources:\n{}{}",
            source("    include: { pod_labels: { app: web } }\n    exclude: { containers: [sidecar] }\n"),
            sink(&web)
        ),
    );
    write_config(
        &conf,
        "files",
        &format!(
            "sources:\n  - type: container_files\n    paths: [\"/var/log/app/*.log\"]\n    runtime: containerd\n    containerd_socket: {}\n    include: {{ pod_labels: {{ app: web }} }}\n{}",
            cd.socket().display(),
            sink(&files)
        ),
    );
    let agent = Agent::start_with(
        &conf,
        &dir.path().join("data"),
        AgentOptions {
            env: vec![("NODE_NAME".into(), "node-7".into())],
            ..Default::default()
        },
    );

    // Pod web-1: a container printing numbered lines, one of 40000 bytes
    // (containerd writes it as P, P, F records), writing a file inside
    // the container, then staying up.
    let web_uid = "6b1f0c2e-0000-4000-8000-000000000001";
    let web_dir = cd.pods_dir().join(format!("shop_web-1_{web_uid}"));
    let web_pod = lab
        .run_pod_sandbox(
            "web-1",
            "shop",
            web_uid,
            &labels(&[("app", "web"), ("tier", "front")]),
            &labels(&[("team", "payments"), ("other", "not copied")]),
            &web_dir,
        )
        .expect("run pod web-1");
    let script = format!(
        "mkdir -p /var/log/app; {}; head -c 40000 /dev/zero | tr '\\0' x; echo; echo web-err >&2; \
         i=1; while [ $i -le 30 ]; do echo file-$i >> /var/log/app/app.log; i=$((i+1)); done; exec sleep 600",
        numbered("web", 50)
    );
    let web_c0 = lab
        .create_and_start_container(
            &web_pod,
            "main",
            IMAGE,
            &["sh", "-c", &script],
            "main/0.log",
            0,
        )
        .expect("start web-1/main");
    // Pod db-1 (another label): prints and exits.
    let db_uid = "6b1f0c2e-0000-4000-8000-000000000002";
    let db_dir = cd.pods_dir().join(format!("data_db-1_{db_uid}"));
    let db_pod = lab
        .run_pod_sandbox(
            "db-1",
            "data",
            db_uid,
            &labels(&[("app", "db")]),
            &labels(&[]),
            &db_dir,
        )
        .expect("run pod db-1");
    let db_c = lab
        .create_and_start_container(
            &db_pod,
            "main",
            IMAGE,
            &["sh", "-c", &numbered("db", 200)],
            "main/0.log",
            0,
        )
        .expect("start db-1/main");

    // Everything, with the runtime's metadata.
    let got = wait_events(&all, "web-", 51);
    let ev = got
        .iter()
        .find(|v| s(v, "message") == "web-7")
        .expect("web-7");
    assert_eq!(s(ev, "k8s.namespace"), "shop");
    assert_eq!(s(ev, "k8s.pod_name"), "web-1");
    assert_eq!(s(ev, "k8s.pod_uid"), web_uid);
    assert_eq!(s(ev, "k8s.container_name"), "main");
    assert_eq!(s(ev, "k8s.restart_count"), "0");
    assert_eq!(s(ev, "container.id"), web_c0);
    assert_eq!(s(ev, "container.image"), IMAGE);
    assert_eq!(s(ev, "k8s.labels.app"), "web");
    assert_eq!(s(ev, "k8s.labels.tier"), "front");
    assert_eq!(s(ev, "k8s.annotations.team"), "payments");
    assert_eq!(
        s(ev, "k8s.annotations.other"),
        "",
        "not in annotation_fields"
    );
    assert_eq!(
        s(ev, "k8s.labels.io.kubernetes.pod.uid"),
        "",
        "kubelet's own labels are not pod labels"
    );
    assert_eq!(s(ev, "k8s.node_name"), "node-7");
    assert_eq!(s(ev, "stream"), "stdout");
    assert!(s(ev, "timestamp").ends_with('Z') || s(ev, "timestamp").contains('+'));
    let err = got
        .iter()
        .find(|v| s(v, "message") == "web-err")
        .expect("web-err");
    assert_eq!(s(err, "stream"), "stderr");
    let nums: Vec<&str> = got.iter().map(|v| s(v, "message")).collect();
    for i in 1..=50 {
        assert!(
            nums.contains(&format!("web-{i}").as_str()),
            "web-{i} missing"
        );
    }
    let long = wait_events(&all, "xxxx", 1);
    assert_eq!(long.len(), 1, "the 40000-byte line is one event");
    assert_eq!(s(&long[0], "message").len(), 40000);
    // The terminated pod's log, read to its end.
    let db = wait_events(&all, "db-", 200);
    assert_eq!(db.len(), 200);
    assert_eq!(s(&db[0], "k8s.labels.app"), "db");

    // Selection by label: only web-1's lines, each once.
    let w = wait_events(&web, "web-", 51);
    assert!(
        with_prefix(&web, "db-").is_empty(),
        "db-1 selected by app=web"
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for v in &w {
        *seen.entry(s(v, "message").to_string()).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "duplicates: {seen:?}");

    // Files inside the running container, with its metadata.
    let f = wait_events(&files, "file-", 30);
    assert_eq!(f.len(), 30);
    assert_eq!(s(&f[0], "k8s.pod_name"), "web-1");
    assert_eq!(s(&f[0], "container.id"), web_c0);
    assert!(
        s(&f[0], "file").ends_with("/root/var/log/app/app.log"),
        "{}",
        s(&f[0], "file")
    );

    // A restart: attempt 1 writes 1.log and is collected too.
    lab.stop_container(&web_c0, 5).expect("stop web-1/main");
    lab.create_and_start_container(
        &web_pod,
        "main",
        IMAGE,
        &[
            "sh",
            "-c",
            &format!("{}; exec sleep 600", numbered("again", 20)),
        ],
        "main/1.log",
        1,
    )
    .expect("restart web-1/main");
    let again = wait_events(&web, "again-", 20);
    assert_eq!(s(&again[0], "k8s.restart_count"), "1");
    assert_ne!(s(&again[0], "container.id"), web_c0);

    // The terminated pod's log directory deleted (kubelet's garbage
    // collection): the agent lets go of the file.
    wait_for(LONG, "db-1 exited", || match lab.container_state(&db_c) {
        Ok(ContainerState::Exited(_)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    lab.stop_pod(&db_pod).expect("stop db-1");
    lab.remove_pod(&db_pod).expect("remove db-1");
    let db_log = db_dir.join("main/0.log");
    std::fs::remove_dir_all(&db_dir).expect("delete db-1's logs");
    wait_for(Duration::from_secs(90), "the deleted log closed", || {
        let fds = fds_pointing_at(agent.pid(), &db_log);
        if fds.is_empty() {
            Ok(())
        } else {
            Err(format!("{fds:?}"))
        }
    });
    assert_eq!(with_prefix(&all, "db-").len(), 200, "nothing read twice");

    // containerd frozen: a container it cannot describe is still read,
    // with its path's metadata, once `metadata_wait_ms` passed, and the
    // miss is counted; nothing waits on the runtime.
    let cpid = cd.pid().expect("containerd pid");
    // SAFETY: kill(2) on containerd's pid, which this test started.
    unsafe { libc::kill(cpid as i32, libc::SIGSTOP) };
    let ghost = cd
        .pods_dir()
        .join("shop_ghost-1_6b1f0c2e-0000-4000-8000-00000000000f/main");
    std::fs::create_dir_all(&ghost).unwrap();
    append(
        &ghost.join("0.log"),
        b"2026-01-02T03:04:05.000000006Z stdout F ghost-1\n",
    );
    let g = wait_events(&all, "ghost-", 1);
    // SAFETY: as above.
    unsafe { libc::kill(cpid as i32, libc::SIGCONT) };
    assert_eq!(s(&g[0], "k8s.pod_name"), "ghost-1");
    assert_eq!(s(&g[0], "container.id"), "", "no runtime metadata for it");
    assert!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("all", "kubernetes_logs_0", "metadata_missing")
        ) >= 1.0
    );
    assert_eq!(
        agent.metric_or_zero(
            "petrel_component_errors_total",
            &source_error("all", "kubernetes_logs_0", "container_record_invalid")
        ),
        0.0
    );
    drop(agent);
    drop(cd);
}

/// The same source on a Docker node (Debian's docker.io, a private daemon
/// from `scripts/docker-lab.sh`): json-file logs with 16 KiB partials, and
/// metadata from the engine API, pods from the labels kubelet's dockershim
/// puts on containers.
#[test]
fn kubernetes_logs_against_a_real_docker_daemon() {
    use petrel_cri::lab::Dockerd;
    let d = Dockerd::start().expect("start dockerd (scripts/docker-lab.sh setup first)");
    let docker = |args: &[&str]| d.docker(args).unwrap_or_else(|e| panic!("{e}"));
    let pod = [
        "io.kubernetes.pod.uid=7d1e0b7c-3a55-4f0e-8f57-5c0b9e2a1d44",
        "io.kubernetes.pod.name=web-1",
        "io.kubernetes.pod.namespace=shop",
    ];
    let run = |extra: &[&str], cmd: &[&str]| {
        let mut args = vec![
            "run",
            "-d",
            "--network",
            "none",
            "--log-driver",
            "json-file",
        ];
        for l in &pod {
            args.extend_from_slice(&["--label", l]);
        }
        args.extend_from_slice(extra);
        args.push(Dockerd::IMAGE);
        args.extend_from_slice(cmd);
        docker(&args)
    };
    run(
        &[
            "--label",
            "io.kubernetes.docker.type=podsandbox",
            "--label",
            "io.kubernetes.container.name=POD",
            "--label",
            "app=web",
        ],
        &["sleep", "300"],
    );
    let script = format!(
        "{}; head -c 40000 /dev/zero | tr '\\0' x; echo; echo main-err >&2; exec sleep 300",
        numbered("main", 30)
    );
    let main = run(
        &["--label", "io.kubernetes.container.name=main"],
        &["sh", "-c", &script],
    );
    let plain = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--log-driver",
        "json-file",
        "--name",
        "plain",
        Dockerd::IMAGE,
        "sh",
        "-c",
        &format!("{}; exec sleep 300", numbered("plain", 10)),
    ]);
    let log_path = docker(&["inspect", "--format", "{{.LogPath}}", &main]);
    let docker_dir = Path::new(&log_path)
        .parent()
        .and_then(Path::parent)
        .expect("containers dir")
        .to_path_buf();

    let dir = tempdir();
    let (all, web) = (dir.path().join("all.ndjson"), dir.path().join("web.ndjson"));
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    for (name, out, extra) in [
        ("all", &all, ""),
        ("web", &web, "    include: { pod_labels: { app: web } }\n"),
    ] {
        write_config(
            &conf,
            name,
            &format!(
                "sources:\n  - type: kubernetes_logs\n    pods_dir: {}\n    docker_dir: {}\n    runtime: docker\n    docker_socket: {}\n{extra}sinks:\n  - type: file\n    path: {}\n    encoding: ndjson\n",
                dir.path().join("no-pods").display(),
                docker_dir.display(),
                d.socket().display(),
                out.display()
            ),
        );
    }
    let agent = Agent::start(&conf, &dir.path().join("data"));
    let got = wait_events(&all, "main-", 31);
    let ev = got
        .iter()
        .find(|v| s(v, "message") == "main-3")
        .expect("main-3");
    assert_eq!(s(ev, "container.id"), main);
    assert_eq!(s(ev, "k8s.namespace"), "shop");
    assert_eq!(s(ev, "k8s.pod_name"), "web-1");
    assert_eq!(s(ev, "k8s.container_name"), "main");
    assert_eq!(s(ev, "container.image"), Dockerd::IMAGE);
    assert_eq!(s(ev, "k8s.labels.app"), "web");
    assert_eq!(s(ev, "stream"), "stdout");
    let err = got
        .iter()
        .find(|v| s(v, "message") == "main-err")
        .expect("main-err");
    assert_eq!(s(err, "stream"), "stderr");
    let long = wait_events(&all, "xxxx", 1);
    assert_eq!(long.len(), 1);
    assert_eq!(s(&long[0], "message").len(), 40000);
    let p = wait_events(&all, "plain-", 10);
    assert_eq!(s(&p[0], "container.id"), plain);
    assert_eq!(s(&p[0], "k8s.namespace"), "", "not a pod");
    // Selected by the pod's label: main's lines, not the plain container's.
    wait_events(&web, "main-", 31);
    wait_events(&web, "xxxx", 1);
    assert!(with_prefix(&web, "plain-").is_empty());
    drop(agent);
}
