//! `scripts/cri-lab.sh run-pod`: runs one pod with one container through CRI.
//!
//! Usage: cri-lab SOCKET PODS_DIR NAME NAMESPACE COMMAND...
//! Env: CRILAB_LABELS="k=v,k2=v2", CRILAB_ANNOTATIONS, CRILAB_CONTAINER (main),
//! CRILAB_IMAGE (localhost/crilab/busybox:1), CRILAB_CGROUP (crilab).
//! Prints the pod's log directory; the log file is `<dir>/<container>/0.log`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

fn kv(var: &str) -> BTreeMap<String, String> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        return Err("usage: cri-lab SOCKET PODS_DIR NAME NAMESPACE COMMAND...".into());
    }
    let (socket, pods_dir, name, ns) = (&args[0], &args[1], &args[2], &args[3]);
    let command: Vec<&str> = args[4..].iter().map(String::as_str).collect();
    let cgroup = format!(
        "/{}",
        std::env::var("CRILAB_CGROUP").unwrap_or_else(|_| "crilab".into())
    );
    let container = std::env::var("CRILAB_CONTAINER").unwrap_or_else(|_| "main".into());
    let image =
        std::env::var("CRILAB_IMAGE").unwrap_or_else(|_| "localhost/crilab/busybox:1".into());
    let uid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_string();
    let log_dir = PathBuf::from(pods_dir).join(format!("{ns}_{name}_{uid}"));

    let lab = petrel_cri::lab::Lab::connect(socket.as_ref(), &cgroup, Duration::from_secs(60))?;
    let pod = lab.run_pod_sandbox(
        name,
        ns,
        &uid,
        &kv("CRILAB_LABELS"),
        &kv("CRILAB_ANNOTATIONS"),
        &log_dir,
    )?;
    let id = lab.create_and_start_container(
        &pod,
        &container,
        &image,
        &command,
        &format!("{container}/0.log"),
        0,
    )?;
    eprintln!(
        "cri-lab: pod {pod} container {id} log {}/{container}/0.log",
        log_dir.display()
    );
    println!("{}", log_dir.display());
    Ok(())
}
