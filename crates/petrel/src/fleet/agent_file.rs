//! The agent file (`--agent-config`): how the agent is managed, not what
//! it collects. Its `opamp:` section names the management server, its
//! `remote:` section how remote pipelines are applied, and its `limits:`
//! what a remote pipeline may do; the server can change none of it.
//!
//! ```yaml
//! opamp:
//!   endpoint: wss://fleet.example.com/v1/opamp
//!   headers: { Authorization: "Bearer ${OPAMP_TOKEN}" }
//!   tls: { ca_file: /etc/petrel/fleet-ca.pem }
//!   labels: { team: payments }
//! remote:
//!   health_watch_secs: 10
//! limits:
//!   read_paths: ["/var/log/**"]
//!   sink_types: [kafka, http]
//!   destinations: ["*.logs.example.com"]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use petrel_core::config::{closest, parse_yaml, ConfigError, ConfigErrors, Map, Node};

use crate::sinks::tls::{parse_tls, Tls};

/// The whole agent file.
#[derive(Debug, Clone, Default)]
pub struct AgentFile {
    /// The management server; `None`: the agent is not managed.
    pub opamp: Option<OpampSettings>,
    /// How remote pipelines are applied.
    pub remote: RemoteSettings,
    /// What remote pipelines may do.
    pub limits: Limits,
}

/// `opamp:`: the connection to the management server.
#[derive(Debug, Clone)]
pub struct OpampSettings {
    /// `ws://`, `wss://`, `http://` or `https://`.
    pub endpoint: String,
    /// `auto` (WebSocket, plain HTTP polling when upgrades are refused),
    /// `websocket` or `http`.
    pub transport: petrel_opamp::Transport,
    /// Headers of every request (`${VAR}` expanded).
    pub headers: Vec<(String, String)>,
    /// TLS settings for `wss://` and `https://`.
    pub tls: Tls,
    /// WebSocket heartbeat.
    pub heartbeat: Duration,
    /// Plain HTTP polling period.
    pub polling: Duration,
    /// Longest wait for an answer.
    pub response_timeout: Duration,
    /// Longest reconnect wait.
    pub backoff_max: Duration,
    /// User labels, sent as non-identifying attributes.
    pub labels: Vec<(String, String)>,
    /// Whether the agent sends its own logs and metrics where the server
    /// offers (`own_logs`, `own_metrics`); the destinations are checked
    /// against `limits` like a remote sink's.
    pub own_telemetry: bool,
    /// How often the agent's metrics are sent to an offered `own_metrics`
    /// destination.
    pub own_metrics_interval: Duration,
}

impl OpampSettings {
    /// Settings for `endpoint` with every default.
    pub fn with_endpoint(endpoint: &str) -> OpampSettings {
        OpampSettings {
            endpoint: endpoint.to_string(),
            transport: petrel_opamp::Transport::Auto,
            headers: Vec::new(),
            tls: Tls {
                verify: true,
                ..Tls::default()
            },
            heartbeat: Duration::from_secs(30),
            polling: Duration::from_secs(30),
            response_timeout: Duration::from_secs(30),
            backoff_max: Duration::from_secs(60),
            labels: Vec::new(),
            own_telemetry: true,
            own_metrics_interval: Duration::from_secs(60),
        }
    }
}

/// `remote:`: how remote pipelines are kept and applied.
#[derive(Debug, Clone)]
pub struct RemoteSettings {
    /// The managed directory (default `<data-dir>/opamp/pipelines`).
    pub dir: Option<PathBuf>,
    /// Most pipelines a remote configuration may hold.
    pub max_pipelines: usize,
    /// Most bytes a remote configuration may hold.
    pub max_bytes: u64,
    /// How long changed pipelines are watched after an apply.
    pub health_watch: Duration,
    /// Starts without reaching healthy after which a pending apply is
    /// reverted to the last known good set.
    pub crash_starts: u32,
    /// Whether a remote pipeline may replace a local one of the same name.
    pub replace_local: bool,
}

impl Default for RemoteSettings {
    fn default() -> Self {
        RemoteSettings {
            dir: None,
            max_pipelines: 2000,
            max_bytes: 16 << 20,
            health_watch: Duration::from_secs(10),
            crash_starts: 3,
            replace_local: false,
        }
    }
}

/// `limits:`: what remote pipelines may do, whatever the server says.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Globs of the paths remote sources may read.
    pub read_paths: Vec<String>,
    /// Globs of the paths remote sinks may write.
    pub write_paths: Vec<String>,
    /// Source types remote pipelines may use (`None`: all).
    pub source_types: Option<Vec<String>>,
    /// Sink types remote pipelines may use (`None`: all).
    pub sink_types: Option<Vec<String>>,
    /// Host patterns remote sinks may send to (`*` any).
    pub destinations: Vec<String>,
    /// Whether remote pipelines may read the environment (`${VAR}`, VRL's
    /// `allow_env`).
    pub allow_env: bool,
    /// Whether remote pipelines may run programs.
    pub allow_exec: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            read_paths: vec!["/var/log/**".into()],
            write_paths: Vec::new(),
            source_types: None,
            sink_types: None,
            destinations: vec!["*".into()],
            allow_env: false,
            allow_exec: false,
        }
    }
}

const TOP_KEYS: &[&str] = &["opamp", "remote", "limits"];
const OPAMP_KEYS: &[&str] = &[
    "endpoint",
    "transport",
    "headers",
    "tls",
    "heartbeat_secs",
    "polling_secs",
    "response_timeout_secs",
    "backoff_max_secs",
    "labels",
    "own_telemetry",
    "own_metrics_interval_secs",
];
const REMOTE_KEYS: &[&str] = &[
    "dir",
    "max_pipelines",
    "max_bytes",
    "health_watch_secs",
    "crash_starts",
    "replace_local",
];
const LIMIT_KEYS: &[&str] = &[
    "read_paths",
    "write_paths",
    "source_types",
    "sink_types",
    "destinations",
    "allow_env",
    "allow_exec",
];

/// Reads the agent file at `path`. Every problem is reported with its
/// position, as pipeline files' are.
pub fn load(path: &Path) -> Result<AgentFile, Vec<ConfigError>> {
    let shown: Arc<str> = path.to_string_lossy().into();
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![ConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            message: format!("cannot read the agent file: {e}"),
        }]
    })?;
    parse(&shown, path, &text)
}

/// Parses an agent file's `text` (`path` resolves relative paths in it).
pub fn parse(shown: &Arc<str>, path: &Path, text: &str) -> Result<AgentFile, Vec<ConfigError>> {
    let raw = parse_yaml(shown, text).map_err(|e| vec![e])?;
    let errs = ConfigErrors::new();
    let abs: Arc<str> = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into();
    let root = Node::root(&abs, &raw, &errs);
    let mut out = AgentFile::default();
    if let Some(m) = root.as_map(TOP_KEYS) {
        if let Some(n) = m.get("opamp") {
            out.opamp = parse_opamp(n);
        }
        if let Some(n) = m.get("remote") {
            if let Some(r) = n.as_map(REMOTE_KEYS) {
                out.remote = parse_remote(&r);
            }
        }
        if let Some(n) = m.get("limits") {
            if let Some(l) = n.as_map(LIMIT_KEYS) {
                out.limits = parse_limits(&l);
            }
        }
    }
    let list: Vec<ConfigError> = errs
        .into_vec()
        .into_iter()
        .map(|mut e| {
            e.file = shown.clone();
            e
        })
        .collect();
    if list.is_empty() {
        Ok(out)
    } else {
        Err(list)
    }
}

fn secs(m: &Map<'_>, key: &str, default: Duration, min: u64) -> Duration {
    match m.get(key) {
        None => default,
        Some(n) => match n.as_u64(false) {
            Some(v) if v >= min => Duration::from_secs(v),
            Some(_) => {
                n.error(format!("`{key}` must be at least {min}"));
                default
            }
            None => default,
        },
    }
}

/// Checks an endpoint URL: scheme and host.
pub fn check_endpoint(e: &str) -> Result<(), String> {
    let Some((scheme, rest)) = e.split_once("://") else {
        return Err(format!(
            "`{e}` is not a URL; write e.g. `wss://fleet.example.com/v1/opamp` or `http://127.0.0.1:4320/v1/opamp`"
        ));
    };
    if !matches!(scheme, "ws" | "wss" | "http" | "https") {
        return Err(format!(
            "`{e}`: the scheme must be ws, wss (WebSocket), http or https (plain HTTP); found `{scheme}`"
        ));
    }
    if rest.split('/').next().is_none_or(str::is_empty) {
        return Err(format!("`{e}` names no host"));
    }
    Ok(())
}

fn parse_opamp(n: Node<'_>) -> Option<OpampSettings> {
    let m = n.as_map(OPAMP_KEYS)?;
    let endpoint_node = m.required("endpoint", "wss://fleet.example.com/v1/opamp")?;
    let endpoint = endpoint_node.as_str()?;
    if let Err(e) = check_endpoint(endpoint) {
        endpoint_node.error(e);
        return None;
    }
    let mut s = OpampSettings::with_endpoint(endpoint);
    s.transport = match m.choice("transport", &["auto", "websocket", "http"]) {
        Some("websocket") => petrel_opamp::Transport::WebSocket,
        Some("http") => petrel_opamp::Transport::Http,
        _ => petrel_opamp::Transport::Auto,
    };
    if let Some(h) = m.get("headers") {
        let hm = h.as_map_quiet();
        if hm.is_none() {
            h.error("`headers` must be a map of header name to value, e.g. `{Authorization: \"Bearer ${OPAMP_TOKEN}\"}`");
        }
        for (k, v) in hm.map(|m| m.entries()).unwrap_or_default() {
            let Some(raw) = v.as_str() else { continue };
            match petrel_core::config::expand_env(raw, |name| std::env::var(name).ok()) {
                Ok(val) => s.headers.push((k.to_string(), val.into_owned())),
                Err(e) => v.error(format!("`headers.{k}`: {e}")),
            }
        }
    }
    if let Some(t) = m.get("tls") {
        s.tls = parse_tls(t)?;
    }
    s.heartbeat = secs(&m, "heartbeat_secs", s.heartbeat, 1);
    s.polling = secs(&m, "polling_secs", s.polling, 1);
    s.response_timeout = secs(&m, "response_timeout_secs", s.response_timeout, 1);
    s.backoff_max = secs(&m, "backoff_max_secs", s.backoff_max, 1);
    s.own_telemetry = m.bool("own_telemetry").unwrap_or(s.own_telemetry);
    s.own_metrics_interval = secs(&m, "own_metrics_interval_secs", s.own_metrics_interval, 1);
    if let Some(l) = m.get("labels") {
        for (k, v) in l.as_map_quiet().map(|m| m.entries()).unwrap_or_default() {
            if let Some(v) = v.as_str() {
                s.labels.push((k.to_string(), v.to_string()));
            }
        }
        if l.as_map_quiet().is_none() {
            l.error("`labels` must be a map, e.g. `{team: payments, region: eu-west-1}`");
        }
    }
    Some(s)
}

fn parse_remote(m: &Map<'_>) -> RemoteSettings {
    let mut r = RemoteSettings::default();
    if let Some(n) = m.get("dir") {
        if let Some(p) = n.as_str() {
            r.dir = Some(crate::paths::resolve_path(n, p));
        }
    }
    if let Some(v) = m.u64("max_pipelines", false) {
        r.max_pipelines = v as usize;
    }
    if let Some(v) = m.u64("max_bytes", true) {
        r.max_bytes = v;
    }
    r.health_watch = secs(m, "health_watch_secs", r.health_watch, 0);
    if let Some(n) = m.get("crash_starts") {
        match n.as_u64(false) {
            Some(v) if (1..=1000).contains(&v) => r.crash_starts = v as u32,
            Some(_) => n.error("`crash_starts` must be between 1 and 1000"),
            None => {}
        }
    }
    if let Some(b) = m.bool("replace_local") {
        r.replace_local = b;
    }
    r
}

fn parse_limits(m: &Map<'_>) -> Limits {
    let mut l = Limits::default();
    let paths = |key: &str| -> Option<Vec<String>> {
        let n = m.get(key)?;
        let mut v = Vec::new();
        for (p, pn) in n.as_str_list() {
            if !crate::paths::is_clean_absolute(p) {
                pn.error(format!(
                    "`{key}`: `{p}` must be an absolute path glob without `..`, e.g. `/var/log/**`"
                ));
                continue;
            }
            if let Err(e) = globset::Glob::new(p) {
                pn.error(format!("`{key}`: `{p}` is not a glob: {e}"));
                continue;
            }
            v.push(p.to_string());
        }
        Some(v)
    };
    if let Some(v) = paths("read_paths") {
        l.read_paths = v;
    }
    if let Some(v) = paths("write_paths") {
        l.write_paths = v;
    }
    let types = |key: &str, known: Vec<&'static str>| -> Option<Vec<String>> {
        let n = m.get(key)?;
        let mut v = Vec::new();
        for (t, tn) in n.as_str_list() {
            if !known.contains(&t) {
                let mut msg = format!("`{key}`: unknown type `{t}`");
                if let Some(best) = closest(t, &known) {
                    msg.push_str(&format!("; did you mean `{best}`?"));
                }
                tn.error(msg);
                continue;
            }
            v.push(t.to_string());
        }
        Some(v)
    };
    l.source_types = types(
        "source_types",
        crate::registry::type_names(crate::registry::SOURCES),
    );
    l.sink_types = types(
        "sink_types",
        crate::registry::type_names(crate::registry::SINKS),
    );
    if let Some(n) = m.get("destinations") {
        l.destinations = Vec::new();
        for (d, dn) in n.as_str_list() {
            if d.is_empty() || d.contains('/') || d.contains(':') && !d.contains("::") {
                dn.error(format!(
                    "`destinations`: `{d}` must be a host pattern without scheme or port, e.g. `*.logs.example.com`, `10.0.0.7` or `*`"
                ));
                continue;
            }
            l.destinations.push(d.to_ascii_lowercase());
        }
    }
    if let Some(b) = m.bool("allow_env") {
        l.allow_env = b;
    }
    if let Some(b) = m.bool("allow_exec") {
        l.allow_exec = b;
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(t: &str) -> Result<AgentFile, Vec<String>> {
        let shown: Arc<str> = "/etc/petrel/agent.yaml".into();
        parse(&shown, Path::new("/etc/petrel/agent.yaml"), t)
            .map_err(|e| e.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn a_full_file_reads() {
        let a = parse_text(
            "opamp:\n  endpoint: wss://h/v1/opamp\n  transport: http\n  headers: {Authorization: Bearer x}\n  labels: {team: a}\n  heartbeat_secs: 5\nremote:\n  max_pipelines: 10\n  health_watch_secs: 2\n  replace_local: true\nlimits:\n  read_paths: [\"/srv/**\"]\n  sink_types: [file]\n  destinations: [\"*.example.com\"]\n  allow_env: true\n",
        )
        .unwrap();
        let o = a.opamp.unwrap();
        assert_eq!(o.endpoint, "wss://h/v1/opamp");
        assert_eq!(o.transport, petrel_opamp::Transport::Http);
        assert_eq!(o.headers, vec![("Authorization".into(), "Bearer x".into())]);
        assert_eq!(o.heartbeat, Duration::from_secs(5));
        assert_eq!(a.remote.max_pipelines, 10);
        assert!(a.remote.replace_local);
        assert_eq!(a.limits.read_paths, vec!["/srv/**".to_string()]);
        assert_eq!(a.limits.sink_types, Some(vec!["file".to_string()]));
        assert!(a.limits.allow_env);
    }

    #[test]
    fn problems_are_positioned_and_say_how_to_fix() {
        let e = parse_text(
            "opamp:\n  endpoint: ftp://h\nlimits:\n  read_paths: [relative/*]\n  sink_types: [kafak]\n  destinations: [\"http://x\"]\n",
        )
        .unwrap_err();
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("/etc/petrel/agent.yaml:2:13: "), "{e:?}");
        assert!(e[0].contains("scheme must be ws"), "{e:?}");
        assert!(e[1].contains("absolute path glob"), "{e:?}");
        assert!(e[2].contains("did you mean `kafka`"), "{e:?}");
        assert!(e[3].contains("host pattern"), "{e:?}");
        let e = parse_text("opamp:\n  endpont: ws://h\n").unwrap_err();
        assert!(
            e.iter().any(|l| l.contains("did you mean `endpoint`")),
            "{e:?}"
        );
    }
}
