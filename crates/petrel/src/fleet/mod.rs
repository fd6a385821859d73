//! Fleet management over OpAMP: the agent connects to a management
//! server (off unless `--agent-config` has an `opamp:` section or
//! `--opamp-endpoint` is given), describes itself, reports its health and
//! effective configuration, and runs the pipelines the server sends
//! beside its local ones.
//!
//! A remote configuration is one pipeline per file (`AgentConfigMap`
//! keys are file names, `app.yaml` is pipeline `app`). An offer is applied
//! transactionally, on the agent's main thread like any reload:
//!
//! 1. each file is validated with the loader of `petrel validate`, and
//!    checked against the local limits (`limits.rs`) and the local
//!    pipelines' names;
//! 2. the valid ones are staged, and a pending marker is written;
//! 3. the new set (local pipelines, valid remote ones, and the previous
//!    version of each refused one) goes through the reload machinery
//!    (`Topology::apply`): unchanged pipelines are untouched, changed ones
//!    drained and rebuilt without loss or duplicates, and a pipeline that
//!    cannot start keeps its previous version;
//! 4. the changed pipelines are watched for `remote.health_watch_secs`;
//!    one that turns unhealthy is rolled back to its previous version.
//!
//! The server is told APPLYING, then APPLIED or FAILED with every
//! refused pipeline's lines, overall and per pipeline in the health tree.
//! An empty map means no remote pipelines. The applied set is kept in the
//! managed directory, and the agent starts from it while the server is
//! away; a start that finds the pending marker counts, and after
//! `remote.crash_starts` starts that never reached the end of the watch
//! the last known good set is put back and the offer refused for good.

pub mod agent_file;
pub mod limits;
#[cfg(feature = "opentelemetry")]
pub mod own_telemetry;
pub mod redact;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use petrel_core::Metrics;
use petrel_opamp::proto;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::PipelineConfig;
use crate::topology::Topology;
use agent_file::{AgentFile, OpampSettings};
use store::{PipelineStatus, Store};

/// `RemoteConfigStatuses`.
const APPLIED: &str = "APPLIED";
const APPLYING: &str = "APPLYING";
const FAILED: &str = "FAILED";

/// What the OpAMP task hands to the main thread.
// A few per connection, moved once through a channel: the size of the
// offer variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum FleetMsg {
    /// A remote configuration offer.
    Offer(proto::AgentRemoteConfig),
    /// The server's restart command: an in-process reload.
    Restart,
    /// Connection settings: where the agent's own telemetry goes.
    ConnectionSettings(proto::ConnectionSettingsOffers),
}

/// The name of the pipeline that carries the agent's own logs to the
/// destination the server offers (no remote pipeline can take it).
pub const OWN_LOGS: &str = "opamp-own-logs";

/// The managed state that `/health` and `petrel top` show.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The server's endpoint.
    pub endpoint: String,
    /// Connected now.
    pub connected: bool,
    /// `websocket` or `http` (the last transport that worked).
    pub transport: String,
    /// Why the last connection attempt failed.
    pub last_error: String,
    /// The last offer's hash (hex).
    pub hash: String,
    /// Its status.
    pub status: String,
    /// Why it failed.
    pub error: String,
    /// Remote pipelines by name with their status.
    pub pipelines: BTreeMap<String, PipelineStatus>,
    /// Where the agent's own logs and metrics go (`logs → URL`), as the
    /// server offered.
    pub own_telemetry: String,
    /// `APPLIED` or `FAILED` for the last connection settings offered.
    pub own_telemetry_status: String,
    /// Why they were refused.
    pub own_telemetry_error: String,
}

impl View {
    /// The managed state as the JSON object of `/health`'s `managed` key.
    pub fn json(&self) -> serde_json::Value {
        let pipelines: serde_json::Map<String, serde_json::Value> = self
            .pipelines
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    serde_json::json!({"status": v.status, "error": v.error}),
                )
            })
            .collect();
        serde_json::json!({
            "server": self.endpoint,
            "connected": self.connected,
            "transport": self.transport,
            "last_error": self.last_error,
            "remote_config_hash": self.hash,
            "remote_config_status": self.status,
            "remote_config_error": self.error,
            "pipelines": pipelines,
            "own_telemetry": self.own_telemetry,
            "own_telemetry_status": self.own_telemetry_status,
            "own_telemetry_error": self.own_telemetry_error,
        })
    }
}

/// The fleet's counters.
#[derive(Clone)]
struct Counters {
    refused: Family<Vec<(String, String)>, Counter>,
    applies: Family<Vec<(String, String)>, Counter>,
    reverts: Family<Vec<(String, String)>, Counter>,
    connected: Family<Vec<(String, String)>, Gauge>,
    config_info: Family<Vec<(String, String)>, Gauge>,
    remote_pipelines: Family<Vec<(String, String)>, Gauge>,
}

fn label(k: &str, v: &str) -> Vec<(String, String)> {
    vec![(k.to_string(), v.to_string())]
}

impl Counters {
    fn new(m: &Metrics) -> Counters {
        Counters {
            refused: m.named_counters(
                "opamp_messages_refused",
                "Messages (or parts) from the OpAMP server that were refused, by reason",
            ),
            applies: m.named_counters(
                "opamp_remote_config_applies",
                "Remote configuration offers processed, by result (applied, failed, unchanged)",
            ),
            reverts: m.named_counters(
                "opamp_reverts",
                "Remote pipelines put back to an earlier version, by reason (unhealthy, crash_loop)",
            ),
            connected: m.named_gauges(
                "opamp_connected",
                "1 while connected to the OpAMP server, by transport",
            ),
            config_info: m.named_gauges(
                "opamp_remote_config_info",
                "1 for the hash and status of the last remote configuration",
            ),
            remote_pipelines: m.named_gauges(
                "opamp_remote_pipelines",
                "Remote pipelines of the last offer, by status",
            ),
        }
    }
}

/// A running health watch.
struct Watch {
    until: Instant,
    /// Pipelines changed or added by the apply, with their previous
    /// configuration and file (none for an added one).
    watched: BTreeMap<String, Option<(PipelineConfig, String, Vec<u8>)>>,
    /// Set at start (the pending marker's watch): nothing to roll back.
    startup: bool,
}

/// Fleet management of one agent.
pub struct Fleet {
    settings: OpampSettings,
    file: AgentFile,
    store: Store,
    reporter: petrel_opamp::Reporter,
    metrics: Arc<Metrics>,
    counters: Counters,
    view: Arc<Mutex<View>>,
    watch: Option<Watch>,
    client: Option<petrel_opamp::ClientHandle>,
    uid: [u8; 16],
    started_unix_nanos: u64,
    health_sig: u64,
    rt: Option<tokio::runtime::Handle>,
    #[cfg(feature = "opentelemetry")]
    own: own_telemetry::Own,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| s.get(2 * i..2 * i + 2))
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect()
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Pipeline names for a log line: all of a few, the count and the first
/// ones of many (an apply of 1,000 pipelines made one 15 kB line).
fn names(list: &[String]) -> String {
    const SHOWN: usize = 10;
    if list.len() <= SHOWN {
        return format!("{list:?}");
    }
    format!(
        "{} ({:?} and {} more)",
        list.len(),
        &list[..SHOWN],
        list.len() - SHOWN
    )
}

/// The pipeline name of a config map key: `app.yaml` → `app`.
pub fn pipeline_name(key: &str) -> Result<&str, String> {
    let stem = key
        .strip_suffix(".yaml")
        .or_else(|| key.strip_suffix(".yml"))
        .ok_or_else(|| {
            format!("`{key}`: a remote pipeline's key must be a file name ending in .yaml or .yml, e.g. `app.yaml`")
        })?;
    if stem == OWN_LOGS {
        return Err(format!(
            "`{key}`: the name `{OWN_LOGS}` is the agent's own-logs pipeline (set by the connection settings' `own_logs`); choose another"
        ));
    }
    let ok = !stem.is_empty()
        && stem.len() <= 100
        && !stem.starts_with('.')
        && !stem.ends_with(".test")
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !ok {
        return Err(format!(
            "`{key}`: a remote pipeline's name must be 1 to 100 letters, digits, `_`, `-` or `.`, not starting with `.` nor ending in `.test`"
        ));
    }
    Ok(stem)
}

impl Fleet {
    /// Opens the fleet state under `data_dir`: counts this start against
    /// a pending apply, and puts the last known good set back after
    /// `remote.crash_starts` starts that did not reach healthy.
    pub fn open(
        file: AgentFile,
        settings: OpampSettings,
        data_dir: &Path,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Fleet> {
        let mut store = Store::open(data_dir, file.remote.dir.as_deref())
            .map_err(|e| anyhow::anyhow!("fleet state in {}: {e}", data_dir.display()))?;
        let uid = store.instance_uid()?;
        let counters = Counters::new(&metrics);
        if let Some(p) = store.state.pending.as_mut() {
            p.starts += 1;
            let (hash, starts) = (p.hash.clone(), p.starts);
            if starts > file.remote.crash_starts {
                let why = format!(
                    "reverted to the last known good configuration{} after {} starts that did not reach healthy while applying this one",
                    if store.state.good_hash.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", store.state.good_hash)
                    },
                    starts - 1
                );
                tracing::error!(hash = %hash, "remote configuration: {why}");
                store.revert()?;
                store.state.pending = None;
                store.state.refused.insert(hash.clone(), why.clone());
                store.state.hash = hash;
                store.state.status = FAILED.into();
                store.state.error = why.clone();
                for s in store.state.pipelines.values_mut() {
                    if s.status != FAILED {
                        s.status = FAILED.into();
                        s.error = why.clone();
                    }
                }
                counters
                    .reverts
                    .get_or_create(&label("reason", "crash_loop"))
                    .inc();
            } else {
                tracing::warn!(hash = %hash, start = starts, of = file.remote.crash_starts, "an apply of a remote configuration was not proven healthy before the agent stopped; starting with it again");
            }
            store.save()?;
        }
        let view = View {
            endpoint: settings.endpoint.clone(),
            ..View::default()
        };
        let mut f = Fleet {
            settings,
            file,
            store,
            reporter: petrel_opamp::Reporter::default(),
            metrics,
            counters,
            view: Arc::new(Mutex::new(view)),
            watch: None,
            client: None,
            uid,
            started_unix_nanos: unix_nanos(),
            health_sig: 0,
            rt: None,
            #[cfg(feature = "opentelemetry")]
            own: own_telemetry::Own::default(),
        };
        f.publish_status();
        Ok(f)
    }

    /// The managed state for `/health`.
    pub fn view(&self) -> Arc<Mutex<View>> {
        self.view.clone()
    }

    /// The managed directory.
    pub fn dir(&self) -> &Path {
        &self.store.dir
    }

    fn is_remote(&self, p: &PipelineConfig) -> bool {
        p.file.starts_with(&self.store.dir)
    }

    /// The remote pipelines kept in the managed directory, checked again
    /// (the limits or the local pipelines may have changed since they were
    /// applied); those that no longer load are left out and reported.
    pub fn remote_pipelines(&mut self, local: &[PipelineConfig]) -> Vec<PipelineConfig> {
        let local_names: BTreeSet<&str> = local.iter().map(|p| p.name.as_str()).collect();
        let mut out = Vec::new();
        for (key, path) in store::list(&self.store.dir) {
            let Ok(name) = pipeline_name(&key).map(str::to_string) else {
                continue;
            };
            match self.validate(&key, &name, &path, &local_names) {
                Ok(p) => out.push(p),
                Err(why) => {
                    tracing::error!(pipeline = %name, "the remote pipeline kept in {} is not started: {why}", self.store.dir.display());
                    self.store.state.pipelines.insert(
                        name,
                        PipelineStatus {
                            status: FAILED.into(),
                            error: why,
                        },
                    );
                }
            }
        }
        if self.store.state.pending.is_some() {
            self.watch = Some(Watch {
                until: Instant::now() + self.file.remote.health_watch,
                watched: out.iter().map(|p| (p.name.clone(), None)).collect(),
                startup: true,
            });
        }
        self.publish_status();
        out
    }

    /// Starts the remote pipelines of the managed directory beside the
    /// running local ones (the agent's start).
    pub fn start_remote(&mut self, topo: &mut Topology) {
        let mut set = topo.configs();
        let remote = self.remote_pipelines(&set);
        if !remote.is_empty() {
            if self.file.remote.replace_local {
                set.retain(|l| !remote.iter().any(|r| r.name == l.name));
            }
            set.extend(remote);
            match topo.apply(set) {
                Ok(applied) => {
                    for (name, why) in applied.failed {
                        self.store.state.pipelines.insert(
                            name,
                            PipelineStatus {
                                status: FAILED.into(),
                                error: format!("cannot be started: {why}"),
                            },
                        );
                    }
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "starting the remote pipelines")
                }
            }
            self.publish_status();
        }
        self.refresh_effective(topo);
    }

    /// Loads one remote file and checks it; the error is every line.
    fn validate(
        &self,
        key: &str,
        name: &str,
        path: &Path,
        local_names: &BTreeSet<&str>,
    ) -> Result<PipelineConfig, String> {
        if local_names.contains(name) && !self.file.remote.replace_local {
            return Err(format!(
                "a local pipeline is named `{name}`; local pipelines cannot be replaced remotely unless the agent file sets `remote.replace_local: true`"
            ));
        }
        let shown: Arc<str> = format!("remote/{key}").into();
        let mut p = crate::config::load_file_as(path, shown).map_err(|errs| {
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        let broken = limits::check(&p, &self.file.limits);
        if !broken.is_empty() {
            return Err(broken
                .iter()
                .map(|b| format!("remote/{key}: breaks a local limit: {b}"))
                .collect::<Vec<_>>()
                .join("\n"));
        }
        p.file = self.store.dir.join(key);
        Ok(p)
    }

    /// `local` with the running remote pipelines added (a local reload
    /// keeps them): a local pipeline wins over a remote one of its name
    /// unless `remote.replace_local`.
    pub fn merge_local(
        &mut self,
        mut local: Vec<PipelineConfig>,
        topo: &Topology,
    ) -> Vec<PipelineConfig> {
        let remote: Vec<PipelineConfig> = topo
            .running()
            .filter(|p| self.is_remote(p))
            .cloned()
            .collect();
        for r in remote {
            match local.iter().position(|l| l.name == r.name) {
                Some(i) if self.file.remote.replace_local => local[i] = r,
                Some(_) => {
                    tracing::warn!(pipeline = %r.name, "a local pipeline now has the name of a remote one: the local one runs, the remote one stops");
                    self.store.state.pipelines.insert(
                        r.name.clone(),
                        PipelineStatus {
                            status: FAILED.into(),
                            error: format!("a local pipeline is named `{}`; local pipelines cannot be replaced remotely unless the agent file sets `remote.replace_local: true`", r.name),
                        },
                    );
                }
                None => local.push(r),
            }
        }
        #[cfg(feature = "opentelemetry")]
        if let Some(p) = self.own_logs_pipeline() {
            local.retain(|l| l.name != p.name);
            local.push(p);
        }
        local
    }

    /// Starts the OpAMP client on `rt`; what it receives for the main
    /// thread arrives on the returned channel.
    pub fn start(
        &mut self,
        rt: &tokio::runtime::Handle,
        topo: &Topology,
    ) -> crossbeam_channel::Receiver<FleetMsg> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.rt = Some(rt.clone());
        let owner = crate::tls::Owner {
            component: "opamp".into(),
            metrics: Some(topo.metrics()),
        };
        let tls = match self.settings.tls.rustls_client_config(&owner) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "OpAMP TLS settings cannot be used; wss:// and https:// endpoints will not connect");
                None
            }
        };
        let mut s = petrel_opamp::Settings::new(&self.settings.endpoint, self.uid);
        s.transport = self.settings.transport;
        s.headers = self.settings.headers.clone();
        s.tls = tls;
        s.heartbeat = self.settings.heartbeat;
        s.polling = self.settings.polling;
        s.response_timeout = self.settings.response_timeout;
        s.backoff_max = self.settings.backoff_max;
        // Room for the largest configuration the agent accepts, and the
        // message around it.
        s.max_message_bytes = (self.file.remote.max_bytes as usize).saturating_add(1 << 20);
        self.reporter.set_capabilities(
            petrel_opamp::caps::REPORTS_STATUS
                | petrel_opamp::caps::ACCEPTS_REMOTE_CONFIG
                | petrel_opamp::caps::REPORTS_EFFECTIVE_CONFIG
                | petrel_opamp::caps::REPORTS_REMOTE_CONFIG
                | petrel_opamp::caps::REPORTS_HEALTH
                | petrel_opamp::caps::REPORTS_HEARTBEAT
                | petrel_opamp::caps::REPORTS_AVAILABLE_COMPONENTS
                | petrel_opamp::caps::ACCEPTS_RESTART_COMMAND
                | petrel_opamp::caps::REPORTS_PACKAGE_STATUSES
                | petrel_opamp::caps::REPORTS_CONNECTION_SETTINGS_STATUS
                | if cfg!(feature = "opentelemetry") && self.settings.own_telemetry {
                    petrel_opamp::caps::REPORTS_OWN_LOGS | petrel_opamp::caps::REPORTS_OWN_METRICS
                } else {
                    0
                },
        );
        self.reporter.set_description(self.description());
        self.reporter
            .set_available_components(available_components());
        // The first message carries the whole status.
        self.refresh_health(topo);
        self.counters
            .connected
            .get_or_create(&label("transport", "none"))
            .set(0);
        let (handle, events) = petrel_opamp::spawn(s, self.reporter.clone(), rt);
        self.client = Some(handle);
        rt.spawn(bridge(
            events,
            tx,
            self.view.clone(),
            self.counters.clone(),
            self.reporter.clone(),
            self.store_root(),
            self.description(),
        ));
        tracing::info!(endpoint = %self.settings.endpoint, instance_uid = %petrel_opamp::uid_text(&self.uid), "fleet management: connecting to the OpAMP server");
        rx
    }

    fn store_root(&self) -> PathBuf {
        // `instance_uid` lives beside `state.json` (not beside the
        // managed directory, which `remote.dir` may put elsewhere).
        self.store.root.clone()
    }

    fn description(&self) -> proto::AgentDescription {
        description(&self.uid, &self.settings.labels)
    }

    /// Stops the client (telling the server the agent disconnects).
    pub fn stop(&mut self) {
        if let Some(c) = self.client.take() {
            c.stop(Duration::from_secs(3));
        }
    }

    /// Acts on a message of the OpAMP task. `reload` runs a full reload
    /// (the restart command).
    pub fn handle(
        &mut self,
        msg: FleetMsg,
        topo: &mut Topology,
        reload: impl FnOnce(&mut Topology, &mut Fleet),
    ) {
        match msg {
            FleetMsg::Offer(rc) => self.apply_offer(rc, topo),
            FleetMsg::Restart => {
                tracing::info!(
                    "the OpAMP server asked for a restart: reloading the configuration in-process"
                );
                reload(topo, self);
            }
            FleetMsg::ConnectionSettings(offers) => self.apply_connection_settings(offers, topo),
        }
    }

    /// Without the `opentelemetry` feature there is no sink to send the
    /// agent's telemetry with: an offer is refused, saying so.
    #[cfg(not(feature = "opentelemetry"))]
    fn apply_connection_settings(
        &mut self,
        offers: proto::ConnectionSettingsOffers,
        _topo: &mut Topology,
    ) {
        let why = "this agent was built without the `opentelemetry` feature: it cannot send its own telemetry";
        tracing::warn!("the OpAMP server offered own-telemetry destinations: {why}");
        self.reporter
            .set_connection_settings_status(proto::ConnectionSettingsStatus {
                last_connection_settings_hash: offers.hash,
                status: proto::ConnectionSettingsStatuses::Failed as i32,
                error_message: why.into(),
            });
    }

    fn set_status(&mut self, hash: &[u8], status: &str, error: String) {
        self.store.state.hash = hex(hash);
        self.store.state.status = status.into();
        self.store.state.error = error;
        if let Err(e) = self.store.save() {
            tracing::error!(error = %e, "cannot write the fleet state");
        }
        self.publish_status();
    }

    /// Tells the server (and `/health`) the current status.
    fn publish_status(&mut self) {
        let st = &self.store.state;
        let code = match st.status.as_str() {
            APPLIED => proto::RemoteConfigStatuses::Applied,
            APPLYING => proto::RemoteConfigStatuses::Applying,
            FAILED => proto::RemoteConfigStatuses::Failed,
            _ => proto::RemoteConfigStatuses::Unset,
        };
        if code != proto::RemoteConfigStatuses::Unset {
            self.reporter
                .set_remote_config_status(proto::RemoteConfigStatus {
                    last_remote_config_hash: unhex(&st.hash),
                    status: code as i32,
                    error_message: st.error.clone(),
                });
        }
        self.counters.config_info.clear();
        if !st.hash.is_empty() {
            self.counters
                .config_info
                .get_or_create(&vec![
                    ("hash".to_string(), st.hash.clone()),
                    ("status".to_string(), st.status.clone()),
                ])
                .set(1);
        }
        self.counters.remote_pipelines.clear();
        for s in st.pipelines.values() {
            self.counters
                .remote_pipelines
                .get_or_create(&label("status", &s.status))
                .inc();
        }
        let mut v = self.view.lock();
        v.hash = st.hash.clone();
        v.status = st.status.clone();
        v.error = st.error.clone();
        v.pipelines = st.pipelines.clone();
    }

    fn refuse_all(&mut self, hash: &[u8], reason: &'static str, why: String) {
        tracing::error!(
            reason,
            "remote configuration refused, nothing of it applied: {why}"
        );
        self.counters
            .refused
            .get_or_create(&label("reason", reason))
            .inc();
        self.counters
            .applies
            .get_or_create(&label("result", "failed"))
            .inc();
        self.set_status(hash, FAILED, why);
    }

    fn apply_offer(&mut self, rc: proto::AgentRemoteConfig, topo: &mut Topology) {
        let hash = rc.config_hash.clone();
        let hx = hex(&hash);
        if hx == self.store.state.hash && !self.store.state.status.is_empty() {
            // Offered again (every answer of a server that has it for
            // this agent): nothing changed.
            return;
        }
        if let Some(why) = self.store.state.refused.get(&hx).cloned() {
            tracing::warn!(hash = %hx, "remote configuration refused again: {why}");
            self.set_status(&hash, FAILED, why);
            return;
        }
        // A watch still running is settled first: its pipelines count as
        // healthy so far.
        self.finish_watch(topo);
        let files = rc.config.map(|c| c.config_map).unwrap_or_default();
        tracing::info!(hash = %hx, files = files.len(), "applying a remote configuration");
        self.store.state.pipelines.clear();
        self.set_status(&hash, APPLYING, String::new());
        let total: usize = files.values().map(|f| f.body.len()).sum();
        if files.len() > self.file.remote.max_pipelines {
            let why = format!(
                "the configuration has {} pipelines, more than `remote.max_pipelines` ({}) in the agent file; nothing was applied and the current pipelines keep running",
                files.len(),
                self.file.remote.max_pipelines
            );
            return self.refuse_all(&hash, "too_many_pipelines", why);
        }
        if total as u64 > self.file.remote.max_bytes {
            let why = format!(
                "the configuration has {total} bytes, more than `remote.max_bytes` ({}) in the agent file; nothing was applied and the current pipelines keep running",
                self.file.remote.max_bytes
            );
            return self.refuse_all(&hash, "config_too_large", why);
        }
        if let Err(e) = self.store.clear_staging() {
            return self.refuse_all(&hash, "io", format!("cannot stage: {e}"));
        }
        let running = topo.configs();
        let local_names: BTreeSet<&str> = running
            .iter()
            .filter(|p| !self.is_remote(p))
            .map(|p| p.name.as_str())
            .collect();
        let mut failed: BTreeMap<String, String> = BTreeMap::new();
        let mut accepted: Vec<(String, PipelineConfig)> = Vec::new();
        let mut offered: BTreeSet<String> = BTreeSet::new();
        let mut same: BTreeSet<String> = BTreeSet::new();
        for (key, f) in &files {
            let name = match pipeline_name(key) {
                Ok(n) => n.to_string(),
                Err(e) => {
                    failed.insert(key.clone(), e);
                    continue;
                }
            };
            if !offered.insert(name.clone()) {
                failed.insert(
                    name.clone(),
                    format!("`{key}`: another key names pipeline `{name}` too; keep one"),
                );
                accepted.retain(|(_, p)| p.name != name);
                continue;
            }
            let ct = f.content_type.split(';').next().unwrap_or("").trim();
            if !matches!(
                ct,
                "" | "text/yaml"
                    | "application/yaml"
                    | "application/x-yaml"
                    | "text/x-yaml"
                    | "text/plain"
            ) {
                failed.insert(
                    name,
                    format!("`{key}`: content type `{ct}` is not YAML; send pipeline files as text/yaml"),
                );
                continue;
            }
            if std::str::from_utf8(&f.body).is_err() {
                failed.insert(name, format!("`{key}`: the file is not UTF-8 text"));
                continue;
            }
            // A file the managed directory already holds as offered is
            // validated where it is: a push that changes one pipeline of
            // 1,000 writes one file, not 1,000 (new inodes are most of an
            // apply's time on a busy ext4).
            let kept = self.store.dir.join(key);
            let path = if std::fs::read(&kept).is_ok_and(|b| b == f.body) {
                same.insert(key.clone());
                kept
            } else {
                match self.store.stage(key, &f.body) {
                    Ok(p) => p,
                    Err(e) => {
                        failed.insert(name, format!("`{key}`: cannot stage: {e}"));
                        continue;
                    }
                }
            };
            match self.validate(key, &name, &path, &local_names) {
                Ok(p) => accepted.push((key.clone(), p)),
                Err(why) => {
                    failed.insert(name, why);
                }
            }
        }
        // The new set: local pipelines as they run, the accepted remote
        // ones, and the previous version of each refused one.
        let mut old_remote: BTreeMap<String, PipelineConfig> = BTreeMap::new();
        let mut set: Vec<PipelineConfig> = Vec::new();
        for p in running {
            if self.is_remote(&p) {
                old_remote.insert(p.name.clone(), p);
            } else {
                set.push(p);
            }
        }
        if self.file.remote.replace_local {
            set.retain(|l| !accepted.iter().any(|(_, p)| p.name == l.name));
        }
        for name in failed.keys() {
            if let Some(old) = old_remote.get(name) {
                set.push(old.clone());
            }
        }
        let mut previous: BTreeMap<String, Option<(PipelineConfig, String, Vec<u8>)>> =
            BTreeMap::new();
        for (key, p) in &accepted {
            if same.contains(key) {
                // The same file: the pipeline runs unchanged, unwatched.
                set.push(p.clone());
                continue;
            }
            let prev = old_remote.get(&p.name).and_then(|old| {
                let key = self.store.key_of(&p.name)?;
                let text = std::fs::read(self.store.dir.join(&key)).ok()?;
                Some((old.clone(), key, text))
            });
            previous.insert(p.name.clone(), prev);
            set.push(p.clone());
        }
        let removed: Vec<String> = old_remote
            .keys()
            .filter(|n| !offered.contains(*n))
            .cloned()
            .collect();
        // A crash from here on is counted at the next starts.
        self.store.state.pending = Some(store::Pending {
            hash: hx.clone(),
            starts: 0,
        });
        for name in failed.keys() {
            self.store.state.pipelines.insert(
                name.clone(),
                PipelineStatus {
                    status: FAILED.into(),
                    error: failed[name].clone(),
                },
            );
        }
        if let Err(e) = self.store.save() {
            return self.refuse_all(&hash, "io", format!("cannot write the fleet state: {e}"));
        }
        let applied = match topo.apply(set) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "applying the remote configuration: a pipeline did not stop cleanly");
                crate::topology::Applied::default()
            }
        };
        for (name, why) in &applied.failed {
            failed.insert(name.clone(), format!("cannot be started: {why}"));
        }
        let changed: BTreeSet<&String> = applied.added.iter().chain(&applied.changed).collect();
        let mut watched = BTreeMap::new();
        for (key, p) in &accepted {
            if failed.contains_key(&p.name) {
                continue;
            }
            if !same.contains(key) {
                if let Err(e) = self.store.commit(key, &p.name) {
                    tracing::error!(pipeline = %p.name, error = %e, "cannot keep the remote pipeline in the managed directory");
                }
            }
            if changed.contains(&p.name) {
                watched.insert(p.name.clone(), previous.remove(&p.name).flatten());
            }
        }
        for name in &removed {
            if let Err(e) = self.store.remove(name) {
                tracing::error!(pipeline = %name, error = %e, "cannot remove the remote pipeline from the managed directory");
            }
        }
        if let Err(e) = self.store.sync() {
            tracing::error!(error = %e, "cannot sync the managed directory; a power loss now could lose this apply (the server sends it again)");
        }
        for name in offered.iter().chain(failed.keys()) {
            let st = match failed.get(name) {
                Some(why) => PipelineStatus {
                    status: FAILED.into(),
                    error: why.clone(),
                },
                None => PipelineStatus {
                    status: APPLYING.into(),
                    error: String::new(),
                },
            };
            self.store.state.pipelines.insert(name.clone(), st);
        }
        if let Err(e) = self.store.save() {
            tracing::error!(error = %e, "cannot write the fleet state");
        }
        tracing::info!(
            added = %names(&applied.added), changed = %names(&applied.changed), removed = %names(&applied.removed),
            unchanged = applied.unchanged, refused = failed.len(),
            "remote configuration swapped in; watching the changed pipelines' health"
        );
        self.publish_status();
        self.refresh_effective(topo);
        self.watch = Some(Watch {
            until: Instant::now() + self.file.remote.health_watch,
            watched,
            startup: false,
        });
        if self.file.remote.health_watch.is_zero() {
            self.finish_watch(topo);
        }
    }

    /// How long until the running health watch ends (none running: none).
    pub fn watch_remaining(&self) -> Option<Duration> {
        self.watch
            .as_ref()
            .map(|w| w.until.saturating_duration_since(Instant::now()))
    }

    /// Once a main-loop turn: the health watch, and the health tree.
    pub fn tick(&mut self, topo: &mut Topology) {
        if let Some(w) = &self.watch {
            let report = self.metrics.health.report();
            let sick: Vec<(String, String)> = w
                .watched
                .keys()
                .filter_map(|name| {
                    let prefix = format!("{name}/");
                    report
                        .iter()
                        .find(|u| u.component.starts_with(&prefix))
                        .map(|u| (name.clone(), format!("{}: {}", u.component, u.reason)))
                })
                .collect();
            let startup = w.startup;
            for (name, why) in sick {
                if startup {
                    // Nothing older to go back to: the pending marker
                    // stays and the next start counts.
                    continue;
                }
                self.roll_back(&name, &why, topo);
            }
            if self
                .watch
                .as_ref()
                .is_some_and(|w| Instant::now() >= w.until)
            {
                self.finish_watch(topo);
            }
        }
        self.refresh_health(topo);
    }

    fn roll_back(&mut self, name: &str, why: &str, topo: &mut Topology) {
        let Some(prev) = self.watch.as_mut().and_then(|w| w.watched.remove(name)) else {
            return;
        };
        let mut set: Vec<PipelineConfig> = topo
            .configs()
            .into_iter()
            .filter(|p| p.name != name)
            .collect();
        let what = match &prev {
            Some((old, _, _)) => {
                set.push(old.clone());
                "rolled back to its previous configuration"
            }
            None => "stopped (it had no previous configuration)",
        };
        tracing::error!(pipeline = %name, problem = %why, "a remote pipeline turned unhealthy within the health watch: {what}");
        if let Err(e) = topo.apply(set) {
            tracing::error!(pipeline = %name, error = %format!("{e:#}"), "rolling back");
        }
        let res = match &prev {
            Some((_, key, text)) => self.store.restore(key, name, text),
            None => self.store.remove(name),
        };
        if let Err(e) = res {
            tracing::error!(pipeline = %name, error = %e, "cannot restore the managed directory");
        }
        self.counters
            .reverts
            .get_or_create(&label("reason", "unhealthy"))
            .inc();
        self.store.state.pipelines.insert(
            name.to_string(),
            PipelineStatus {
                status: FAILED.into(),
                error: format!("unhealthy within the health watch ({why}); {what}"),
            },
        );
        self.refresh_effective(topo);
    }

    fn finish_watch(&mut self, topo: &Topology) {
        let Some(w) = self.watch.take() else { return };
        for s in self.store.state.pipelines.values_mut() {
            if s.status == APPLYING {
                s.status = APPLIED.into();
            }
        }
        let errors: Vec<String> = self
            .store
            .state
            .pipelines
            .iter()
            .filter(|(_, s)| s.status == FAILED)
            .map(|(n, s)| format!("pipeline {n}: {}", s.error))
            .collect();
        let pending_hash = self.store.state.pending.take().map(|p| p.hash);
        if let Err(e) = self.store.promote() {
            tracing::error!(error = %e, "cannot keep the last known good set");
        } else if let Some(h) = pending_hash {
            self.store.state.good_hash = h;
        }
        if w.startup && self.store.state.status != APPLYING {
            // A start that reached healthy: the status stays as reported.
            let _ = self.store.save();
            self.publish_status();
            return;
        }
        let (status, result) = if errors.is_empty() {
            (APPLIED, "applied")
        } else {
            (FAILED, "failed")
        };
        self.counters
            .applies
            .get_or_create(&label("result", result))
            .inc();
        let hash = unhex(&self.store.state.hash);
        if errors.is_empty() {
            tracing::info!(hash = %self.store.state.hash, "remote configuration APPLIED");
        } else {
            tracing::error!(hash = %self.store.state.hash, "remote configuration FAILED in part (the other pipelines are applied):\n{}", errors.join("\n"));
        }
        self.set_status(&hash, status, errors.join("\n"));
        self.refresh_effective(topo);
    }

    /// Sends the effective configuration again (after any apply or
    /// reload).
    pub fn refresh_effective(&mut self, topo: &Topology) {
        let mut map = BTreeMap::new();
        for p in topo.running() {
            let origin = if self.is_remote(p) {
                "remote"
            } else if p.name == OWN_LOGS {
                "opamp"
            } else {
                "local"
            };
            let file = p
                .file
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| format!("{}.yaml", p.name));
            // The text as written: a processor's program file appended
            // for change detection is left out.
            let text = p.text.split("\n\0").next().unwrap_or_default();
            map.insert(
                format!("{origin}/{file}"),
                proto::AgentConfigFile {
                    body: redact::redact(text).into_bytes(),
                    content_type: "text/yaml".into(),
                },
            );
        }
        self.reporter.set_effective_config(proto::EffectiveConfig {
            config_map: Some(proto::AgentConfigMap { config_map: map }),
        });
    }

    /// Rebuilds the health tree when a problem or the pipeline set
    /// changed.
    fn refresh_health(&mut self, topo: &Topology) {
        let problems = self.metrics.health.snapshot();
        let sig = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for p in &problems {
                (&p.component, p.state, &p.reason).hash(&mut h);
            }
            for p in topo.running() {
                p.name.hash(&mut h);
                p.text.len().hash(&mut h);
            }
            for (n, s) in &self.store.state.pipelines {
                (n, &s.status).hash(&mut h);
            }
            h.finish()
        };
        if sig == self.health_sig {
            return;
        }
        self.health_sig = sig;
        let tree = health_tree(
            &problems,
            topo.running(),
            &self.store.state.pipelines,
            |p| self.is_remote(p),
            self.started_unix_nanos,
        );
        self.reporter.set_health(tree);
    }
}

/// The health tree: agent → `pipeline:<name>` → `source:<id>`,
/// `processor:<id>`, `sink:<id>` (and `reload`, `remote_config`), with the
/// states of `/health` (`ok`, `failing`, `unhealthy`, `stuck`,
/// `degraded`); problems of no pipeline (threads, checkpoints) hang from
/// the agent.
pub fn health_tree<'a>(
    problems: &[petrel_core::health::ProblemState],
    running: impl Iterator<Item = &'a PipelineConfig>,
    remote: &BTreeMap<String, PipelineStatus>,
    is_remote: impl Fn(&PipelineConfig) -> bool,
    started: u64,
) -> proto::ComponentHealth {
    let now = unix_nanos();
    let node = |state: &str, reason: &str| proto::ComponentHealth {
        healthy: matches!(state, "ok" | "degraded" | "failing"),
        start_time_unix_nano: started,
        last_error: reason.to_string(),
        status: state.to_string(),
        status_time_unix_nano: now,
        component_health_map: Default::default(),
    };
    let worst = |a: &str, b: &str| -> String {
        let rank = |s: &str| match s {
            "ok" => 0,
            "degraded" => 1,
            "failing" => 2,
            "not running" => 3,
            "unhealthy" => 4,
            _ => 5,
        };
        if rank(b) > rank(a) { b } else { a }.to_string()
    };
    let mut root = node("ok", "");
    let mut pipelines: BTreeMap<String, proto::ComponentHealth> = BTreeMap::new();
    for p in running {
        let mut n = node("ok", "");
        let kinds = [
            (
                "source",
                p.sources.iter().map(|(i, _)| i).collect::<Vec<_>>(),
            ),
            ("processor", p.processors.iter().map(|(i, _)| i).collect()),
            ("sink", p.sinks.iter().map(|(i, _)| i).collect()),
        ];
        for (kind, ids) in kinds {
            for id in ids {
                n.component_health_map
                    .insert(format!("{kind}:{id}"), node("ok", ""));
            }
        }
        if is_remote(p) {
            n.component_health_map.insert(
                "remote_config".into(),
                remote_node(remote.get(&p.name), &node),
            );
        }
        pipelines.insert(p.name.clone(), n);
    }
    // Refused remote pipelines that do not run at all.
    for (name, st) in remote {
        if st.status == FAILED && !pipelines.contains_key(name) {
            let mut n = node("not running", &st.error);
            n.healthy = false;
            n.component_health_map
                .insert("remote_config".into(), remote_node(Some(st), &node));
            pipelines.insert(name.clone(), n);
        }
    }
    for pr in problems {
        let (head, rest) = pr.component.split_once('/').unwrap_or((&pr.component, ""));
        if let (Some(pn), false) = (pipelines.get_mut(head), rest.is_empty()) {
            // `sink/out` → `sink:out`; `sink/out/damage` → under it.
            let mut parts = rest.splitn(3, '/');
            let key = match (parts.next(), parts.next()) {
                (Some(k), Some(id)) => format!("{k}:{id}"),
                (Some(k), None) => k.to_string(),
                _ => rest.to_string(),
            };
            let e = pn
                .component_health_map
                .entry(key)
                .or_insert_with(|| node("ok", ""));
            let st = worst(&e.status, pr.state);
            *e = proto::ComponentHealth {
                component_health_map: std::mem::take(&mut e.component_health_map),
                ..node(&st, &pr.reason)
            };
            let st = worst(&pn.status, pr.state);
            if st != pn.status {
                pn.status = st;
                pn.healthy = matches!(pn.status.as_str(), "ok" | "degraded" | "failing");
                pn.last_error = format!("{}: {}", pr.component, pr.reason);
            }
        } else {
            root.component_health_map
                .insert(pr.component.clone(), node(pr.state, &pr.reason));
        }
        let st = worst(&root.status, pr.state);
        if st != root.status {
            root.status = st;
            root.last_error = format!("{}: {}", pr.component, pr.reason);
        }
    }
    root.healthy = matches!(root.status.as_str(), "ok" | "degraded" | "failing");
    for (name, n) in pipelines {
        root.component_health_map
            .insert(format!("pipeline:{name}"), n);
    }
    root
}

fn remote_node(
    st: Option<&PipelineStatus>,
    node: &dyn Fn(&str, &str) -> proto::ComponentHealth,
) -> proto::ComponentHealth {
    match st {
        Some(s) => {
            let mut n = node(&s.status, &s.error);
            n.healthy = s.status != FAILED;
            n
        }
        None => node(APPLIED, ""),
    }
}

/// The agent's description: identifying attributes (`service.name`,
/// `service.version`, `service.instance.id`) and the others (`host.name`,
/// `os.type`, the Kubernetes node and pod where known, user labels).
pub fn description(uid: &[u8; 16], labels: &[(String, String)]) -> proto::AgentDescription {
    use petrel_opamp::kv;
    let mut other = vec![
        kv("host.name", &crate::host::hostname()),
        kv("os.type", std::env::consts::OS),
        kv("host.arch", std::env::consts::ARCH),
    ];
    for (var, attr) in [
        ("NODE_NAME", "k8s.node.name"),
        ("POD_NAME", "k8s.pod.name"),
        ("POD_NAMESPACE", "k8s.namespace.name"),
    ] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                other.push(kv(attr, &v));
            }
        }
    }
    for (k, v) in labels {
        other.push(kv(k, v));
    }
    proto::AgentDescription {
        identifying_attributes: vec![
            kv("service.name", "petrel"),
            kv("service.version", env!("CARGO_PKG_VERSION")),
            kv("service.instance.id", &petrel_opamp::uid_text(uid)),
        ],
        non_identifying_attributes: other,
    }
}

/// The registry's sources, processors and sinks, with a hash of their
/// names.
pub fn available_components() -> proto::AvailableComponents {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let mut components = BTreeMap::new();
    for (kind, names) in [
        (
            "sources",
            crate::registry::type_names(crate::registry::SOURCES),
        ),
        (
            "processors",
            crate::registry::type_names(crate::registry::PROCESSORS),
        ),
        ("sinks", crate::registry::type_names(crate::registry::SINKS)),
    ] {
        let mut sub = BTreeMap::new();
        for n in names {
            h.update(format!("{kind}/{n}\n"));
            sub.insert(n.to_string(), proto::ComponentDetails::default());
        }
        components.insert(
            kind.to_string(),
            proto::ComponentDetails {
                metadata: Vec::new(),
                sub_component_map: sub,
            },
        );
    }
    proto::AvailableComponents {
        components,
        hash: h.finalize().to_vec(),
    }
}

/// Handles the client's events on the runtime: connection state, counts
/// and logs; offers and commands go to the main thread.
async fn bridge(
    mut events: tokio::sync::mpsc::Receiver<petrel_opamp::Event>,
    tx: crossbeam_channel::Sender<FleetMsg>,
    view: Arc<Mutex<View>>,
    counters: Counters,
    reporter: petrel_opamp::Reporter,
    root: PathBuf,
    description: proto::AgentDescription,
) {
    use petrel_opamp::Event;
    let mut description = description;
    let mut was_connected = false;
    while let Some(e) = events.recv().await {
        match e {
            Event::Connected { transport } => {
                tracing::info!(transport, "connected to the OpAMP server");
                was_connected = true;
                counters.connected.clear();
                counters
                    .connected
                    .get_or_create(&label("transport", transport))
                    .set(1);
                let mut v = view.lock();
                v.connected = true;
                v.transport = transport.into();
                v.last_error.clear();
            }
            Event::Disconnected { why, retry_in } => {
                if was_connected {
                    tracing::warn!(error = %why, retry_in = ?retry_in, "lost the OpAMP server; the agent keeps running its pipelines");
                } else {
                    tracing::warn!(error = %why, retry_in = ?retry_in, "cannot reach the OpAMP server; the agent runs its last applied pipelines meanwhile");
                }
                was_connected = false;
                counters.connected.clear();
                let mut v = view.lock();
                // Kept at 0 (not removed), so that `petrel top` tells a
                // managed agent that is disconnected from one that is not
                // managed.
                let last = if v.transport.is_empty() {
                    "none"
                } else {
                    v.transport.as_str()
                };
                counters
                    .connected
                    .get_or_create(&label("transport", last))
                    .set(0);
                v.connected = false;
                v.last_error = why;
            }
            Event::RemoteConfig(rc) => {
                if tx.send(FleetMsg::Offer(rc)).is_err() {
                    return;
                }
            }
            Event::Restart => {
                if tx.send(FleetMsg::Restart).is_err() {
                    return;
                }
            }
            Event::ConnectionSettings(s) => {
                if tx.send(FleetMsg::ConnectionSettings(s)).is_err() {
                    return;
                }
            }
            Event::PackagesOffered(p) => {
                counters
                    .refused
                    .get_or_create(&label("reason", "packages"))
                    .inc();
                tracing::warn!(packages = p.packages.len(), "the OpAMP server offered packages; Petrel installs no packages (it is updated by its package manager or image): reported as failed");
                let why = "package installation is not supported: Petrel is updated by its package manager or container image";
                let packages = p
                    .packages
                    .iter()
                    .map(|(name, a)| {
                        (
                            name.clone(),
                            proto::PackageStatus {
                                name: name.clone(),
                                server_offered_version: a.version.clone(),
                                server_offered_hash: a.hash.clone(),
                                status: proto::PackageStatusEnum::InstallFailed as i32,
                                error_message: why.into(),
                                ..Default::default()
                            },
                        )
                    })
                    .collect();
                reporter.set_package_statuses(proto::PackageStatuses {
                    packages,
                    server_provided_all_packages_hash: p.all_packages_hash,
                    error_message: why.into(),
                });
            }
            Event::NewInstanceUid(uid) => {
                tracing::info!(instance_uid = %petrel_opamp::uid_text(&uid), "the OpAMP server assigned a new instance uid");
                let text = format!("{}\n", petrel_opamp::uid_text(&uid));
                if let Err(e) = std::fs::write(root.join("instance_uid"), text) {
                    tracing::error!(error = %e, "cannot keep the new instance uid");
                }
                for a in &mut description.identifying_attributes {
                    if a.key == "service.instance.id" {
                        *a = petrel_opamp::kv("service.instance.id", &petrel_opamp::uid_text(&uid));
                    }
                }
                reporter.set_description(description.clone());
            }
            Event::Refused(r) => {
                counters
                    .refused
                    .get_or_create(&label("reason", r.reason))
                    .inc();
                tracing::warn!(reason = r.reason, "refused a message from the OpAMP server; the current pipelines keep running: {}", r.detail);
            }
            Event::ServerError { kind, message } => {
                counters
                    .refused
                    .get_or_create(&label("reason", "server_error"))
                    .inc();
                tracing::warn!(kind, "the OpAMP server answered with an error: {message}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_pipelines() {
        assert_eq!(pipeline_name("app.yaml"), Ok("app"));
        assert_eq!(pipeline_name("a-b_c.1.yml"), Ok("a-b_c.1"));
        for bad in [
            "app",
            "../x.yaml",
            ".hidden.yaml",
            "a/b.yaml",
            ".yaml",
            "t.test.yaml",
            "",
        ] {
            assert!(pipeline_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn components_are_listed_with_a_stable_hash() {
        let a = available_components();
        assert_eq!(a, available_components());
        assert!(a.components["sinks"].sub_component_map.contains_key("file"));
        assert_eq!(a.hash.len(), 32);
    }
}
