//! A real OpenTelemetry Collector (built by `scripts/otelcol.sh` into
//! `.cache/otelcol`) on 127.0.0.1 for the tests, started with a given
//! configuration.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use super::server::{cached_binary, ServerProcess};

/// A collector process with its own directory; killed on drop.
pub struct Otelcol {
    server: ServerProcess,
}

impl Otelcol {
    /// Starts a collector with `config` (YAML) and waits until `port`
    /// accepts connections.
    pub fn start(config: &str, port: u16) -> Otelcol {
        Self::start_with_env(config, port, &[])
    }

    /// [`Otelcol::start`] with `env` added to the collector's environment
    /// (`KUBECONFIG` for `k8sattributes`).
    pub fn start_with_env(config: &str, port: u16, env: &[(&str, &str)]) -> Otelcol {
        let mut server = ServerProcess::new("the collector", "petrel-otelcol-", "otelcol.log");
        let cfg = server.dir().join("config.yaml");
        std::fs::write(&cfg, config).expect("write collector config");
        let mut cmd = Command::new(cached_binary("otelcol/otelcol", "scripts/otelcol.sh"));
        cmd.arg("--config").arg(&cfg);
        cmd.envs(env.iter().copied());
        server.start(
            cmd,
            Duration::from_secs(60),
            Duration::from_millis(50),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Otelcol { server }
    }

    /// The Collector built by `scripts/peers/otelcol-k8s.sh` (filelog,
    /// k8sattributes, the file exporter), with `config` and `env`; it
    /// listens on nothing, so it is taken as started once it runs.
    pub fn start_peer(config: &str, env: &[(&str, &str)]) -> Otelcol {
        let mut server =
            ServerProcess::new("the peer collector", "petrel-otelcol-k8s-", "otelcol.log");
        let cfg = server.dir().join("config.yaml");
        std::fs::write(&cfg, config).expect("write collector config");
        let mut cmd = Command::new(cached_binary(
            "otelcol-k8s/otelcol",
            "scripts/peers/otelcol-k8s.sh",
        ));
        cmd.arg("--config").arg(&cfg);
        cmd.envs(env.iter().copied());
        server.start(
            cmd,
            Duration::from_secs(60),
            Duration::from_millis(50),
            || true,
        );
        Otelcol { server }
    }

    /// The collector's log so far (last 4 KiB).
    pub fn log(&self) -> String {
        self.server.log()
    }
}

impl Drop for Otelcol {
    fn drop(&mut self) {
        self.server.kill();
        if std::thread::panicking() {
            eprintln!("--- collector log ---\n{}", self.log());
        }
    }
}
