//! The connection to the server: one task that connects (WebSocket, or
//! plain HTTP polling), sends the status, reads what the server sends and
//! reconnects with exponential backoff and jitter, honouring the server's
//! `retry_after` (an UNAVAILABLE error response, or `Retry-After` on a
//! 429 or 503).
//!
//! Its state machine follows the specification (and opamp-go's client,
//! read for its behaviour): the first message of every connection is the
//! full status; later ones carry what changed; a WebSocket connection
//! sends a heartbeat every `heartbeat` when nothing changed, an HTTP one
//! polls every `polling`; a server that stops answering (no message
//! within `response_timeout` of one sent) is left and reconnected to.
//! With [`Transport::Auto`], a WebSocket upgrade refused twice in a row by
//! a server that answers HTTP (a proxy that blocks upgrades) switches to
//! plain HTTP polling, and WebSocket is tried again after
//! `websocket_retry`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite;

use crate::frame::{decode_http, decode_ws, encode_ws};
use crate::proto;
use crate::report::{Reporter, Sent};

/// Which transport the client uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// WebSocket, falling back to plain HTTP polling when upgrades are
    /// refused.
    Auto,
    /// WebSocket only.
    WebSocket,
    /// Plain HTTP polling only.
    Http,
}

/// How the client connects.
#[derive(Clone)]
pub struct Settings {
    /// `ws://`, `wss://`, `http://` or `https://` URL of the server's
    /// OpAMP endpoint (the scheme's TLS choice holds for both transports).
    pub endpoint: String,
    /// Which transport.
    pub transport: Transport,
    /// Headers sent with the upgrade request and every HTTP request
    /// (`Authorization: Bearer ...`).
    pub headers: Vec<(String, String)>,
    /// TLS settings for `wss://` and `https://`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The agent's instance uid.
    pub instance_uid: [u8; 16],
    /// WebSocket heartbeat period (the server may offer another).
    pub heartbeat: Duration,
    /// Plain HTTP polling period (the server may offer another).
    pub polling: Duration,
    /// Largest message accepted from the server; a larger one is refused
    /// without being read whole.
    pub max_message_bytes: usize,
    /// First reconnect wait; doubled after each failure up to
    /// `backoff_max`, each wait drawn between half and one and a half of
    /// it (jitter).
    pub backoff_initial: Duration,
    /// Longest reconnect wait.
    pub backoff_max: Duration,
    /// Longest wait for the server's answer to a message, and for a
    /// connection to be established.
    pub response_timeout: Duration,
    /// With [`Transport::Auto`], how long plain HTTP is used after
    /// WebSocket was refused before WebSocket is tried again.
    pub websocket_retry: Duration,
}

impl Settings {
    /// Settings with the specification's defaults (30 s heartbeat and
    /// polling) for `endpoint`.
    pub fn new(endpoint: &str, instance_uid: [u8; 16]) -> Settings {
        Settings {
            endpoint: endpoint.to_string(),
            transport: Transport::Auto,
            headers: Vec::new(),
            tls: None,
            instance_uid,
            heartbeat: Duration::from_secs(30),
            polling: Duration::from_secs(30),
            max_message_bytes: 17 << 20,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            response_timeout: Duration::from_secs(30),
            websocket_retry: Duration::from_secs(600),
        }
    }
}

/// Something the server sent that was not used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// A short word for counting: `malformed`, `bad_header`,
    /// `text_frame`, `too_large`, `unknown_capability`,
    /// `unknown_command`, `wrong_instance_uid`.
    pub reason: &'static str,
    /// What it was, for the log.
    pub detail: String,
}

/// What the client tells the agent.
// A handful per connection and offer, moved once through a channel: the
// size of the offer variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Event {
    /// Connected (the server answered the first message).
    Connected {
        /// `websocket` or `http`.
        transport: &'static str,
    },
    /// Not connected any more (or a connection attempt failed).
    Disconnected {
        /// Why, for the log.
        why: String,
        /// When the next attempt is made.
        retry_in: Duration,
    },
    /// A remote configuration offer.
    RemoteConfig(proto::AgentRemoteConfig),
    /// Connection settings offered (own telemetry destinations).
    ConnectionSettings(proto::ConnectionSettingsOffers),
    /// The server asks for a restart.
    Restart,
    /// The server offers packages.
    PackagesOffered(proto::PackagesAvailable),
    /// The server assigned a new instance uid (already in use by the
    /// client; the agent persists it).
    NewInstanceUid([u8; 16]),
    /// Something the server sent was refused.
    Refused(Refusal),
    /// The server answered with an error.
    ServerError {
        /// `ServerErrorResponseType`.
        kind: i32,
        /// Its message.
        message: String,
    },
}

/// The running client; [`ClientHandle::stop`] disconnects it.
pub struct ClientHandle {
    stop: watch::Sender<bool>,
    done: std::sync::mpsc::Receiver<()>,
}

impl ClientHandle {
    /// Tells the server the agent disconnects (WebSocket) and waits up to
    /// `within` for the task to end. Callable from any thread outside the
    /// runtime.
    pub fn stop(self, within: Duration) {
        let _ = self.stop.send(true);
        let _ = self.done.recv_timeout(within);
    }
}

/// Starts the client on `rt`. Events arrive on the returned receiver; the
/// client stops when the receiver is dropped or [`ClientHandle::stop`] is
/// called.
pub fn spawn(
    settings: Settings,
    reporter: Reporter,
    rt: &tokio::runtime::Handle,
) -> (ClientHandle, mpsc::Receiver<Event>) {
    let (events_tx, events_rx) = mpsc::channel(64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let client = Client {
        uid: settings.instance_uid,
        settings,
        reporter,
        events: events_tx,
        stop: stop_rx,
        seq: 0,
        heartbeat_offer: None,
    };
    rt.spawn(async move {
        client.run().await;
        let _ = done_tx.send(());
    });
    (
        ClientHandle {
            stop: stop_tx,
            done: done_rx,
        },
        events_rx,
    )
}

/// How a connection ended.
enum End {
    /// Stopped by the agent.
    Stopped,
    /// Never established.
    Failed {
        /// The server answered HTTP but refused the WebSocket upgrade (or
        /// the connection was cut during it): a reason to fall back.
        upgrade_refused: bool,
        why: String,
        retry_after: Option<Duration>,
    },
    /// Established, then lost.
    Lost {
        why: String,
        retry_after: Option<Duration>,
    },
}

/// What one message from the server asks of the client.
#[derive(Default)]
struct Asked {
    full: bool,
    components: bool,
    unavailable: Option<Option<Duration>>,
}

struct Client {
    settings: Settings,
    reporter: Reporter,
    events: mpsc::Sender<Event>,
    stop: watch::Receiver<bool>,
    uid: [u8; 16],
    seq: u64,
    /// `heartbeat_interval_seconds` offered by the server.
    heartbeat_offer: Option<Duration>,
}

/// Exponential backoff with jitter.
struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    fn wait(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        jitter(base)
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// `d` scaled by a random factor in [0.5, 1.5): many agents that lost the
/// same server do not come back in step.
fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 4];
    let r = match getrandom::fill(&mut b) {
        Ok(()) => u32::from_le_bytes(b) as f64 / (u32::MAX as f64 + 1.0),
        Err(_) => 0.5,
    };
    d.mul_f64(0.5 + r)
}

/// Longest `retry_after` honoured: a server asking for more is probably
/// wrong, and an agent that never comes back is worse.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

fn ws_url(endpoint: &str) -> String {
    if let Some(r) = endpoint.strip_prefix("http://") {
        format!("ws://{r}")
    } else if let Some(r) = endpoint.strip_prefix("https://") {
        format!("wss://{r}")
    } else {
        endpoint.to_string()
    }
}

fn http_url(endpoint: &str) -> String {
    if let Some(r) = endpoint.strip_prefix("ws://") {
        format!("http://{r}")
    } else if let Some(r) = endpoint.strip_prefix("wss://") {
        format!("https://{r}")
    } else {
        endpoint.to_string()
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured: the
/// backoff applies then).
fn retry_after_header(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    h.get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

impl Client {
    async fn emit(&self, e: Event) {
        let _ = self.events.send(e).await;
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow() || self.events.is_closed()
    }

    async fn run(mut self) {
        let mut backoff = Backoff {
            next: self.settings.backoff_initial,
            initial: self.settings.backoff_initial,
            max: self.settings.backoff_max.max(self.settings.backoff_initial),
        };
        let auto = self.settings.transport == Transport::Auto;
        let mut http = self.settings.transport == Transport::Http;
        let mut refused_upgrades = 0u32;
        let mut http_since = Instant::now();
        loop {
            if self.stopped() {
                return;
            }
            if auto && http && http_since.elapsed() >= self.settings.websocket_retry {
                tracing::info!(
                    "trying WebSocket again after {:?} of plain HTTP polling",
                    self.settings.websocket_retry
                );
                http = false;
            }
            let end = if http {
                self.http_session().await
            } else {
                self.ws_session().await
            };
            let (why, retry_after) = match end {
                End::Stopped => return,
                End::Failed {
                    upgrade_refused,
                    why,
                    retry_after,
                } => {
                    if upgrade_refused && auto && !http {
                        refused_upgrades += 1;
                        if refused_upgrades >= 2 {
                            tracing::warn!(error = %why, "the server refuses WebSocket upgrades; using plain HTTP polling");
                            http = true;
                            http_since = Instant::now();
                            refused_upgrades = 0;
                            continue;
                        }
                    }
                    (why, retry_after)
                }
                End::Lost { why, retry_after } => {
                    // A connection that worked: come back soon, then back
                    // off again if it keeps failing.
                    backoff.reset();
                    refused_upgrades = 0;
                    (why, retry_after)
                }
            };
            let wait = retry_after.unwrap_or_else(|| backoff.wait());
            self.emit(Event::Disconnected {
                why,
                retry_in: wait,
            })
            .await;
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// The next message: uid, sequence number, capabilities and the parts
    /// of the status that are due.
    fn next_message(
        &mut self,
        sent: &mut Sent,
        full: bool,
        components: bool,
    ) -> proto::AgentToServer {
        self.seq += 1;
        let mut m = proto::AgentToServer {
            instance_uid: self.uid.to_vec(),
            sequence_num: self.seq,
            ..Default::default()
        };
        self.reporter.compose(&mut m, sent, full, components);
        m
    }

    fn heartbeat(&self, base: Duration) -> Duration {
        self.heartbeat_offer
            .unwrap_or(base)
            .max(Duration::from_secs(1))
    }

    /// Acts on one message from the server.
    async fn handle(&mut self, msg: proto::ServerToAgent, refused_caps: &mut bool) -> Asked {
        let mut asked = Asked::default();
        if !msg.instance_uid.is_empty() && msg.instance_uid != self.uid {
            self.emit(Event::Refused(Refusal {
                reason: "wrong_instance_uid",
                detail: format!(
                    "a message for instance {} reached instance {}",
                    hex(&msg.instance_uid),
                    crate::uid_text(&self.uid)
                ),
            }))
            .await;
            return asked;
        }
        if let Some(err) = msg.error_response {
            if err.r#type == proto::ServerErrorResponseType::Unavailable as i32 {
                let after = err.details.map(|d| {
                    let proto::server_error_response::Details::RetryInfo(r) = d;
                    Duration::from_nanos(r.retry_after_nanoseconds).min(MAX_RETRY_AFTER)
                });
                asked.unavailable = Some(after);
            }
            self.emit(Event::ServerError {
                kind: err.r#type,
                message: err.error_message,
            })
            .await;
            return asked;
        }
        let unknown = msg.capabilities & !crate::caps::KNOWN_SERVER;
        if unknown != 0 {
            self.emit(Event::Refused(Refusal {
                reason: "unknown_capability",
                detail: format!(
                    "server capability bits {unknown:#x} are not defined by OpAMP v0.18.0; ignored"
                ),
            }))
            .await;
        }
        if let Some(c) = &msg.custom_capabilities {
            if !c.capabilities.is_empty() && !*refused_caps {
                *refused_caps = true;
                self.emit(Event::Refused(Refusal {
                    reason: "unknown_capability",
                    detail: format!(
                        "the server's custom capabilities {:?} are not supported; ignored",
                        c.capabilities
                    ),
                }))
                .await;
            }
        }
        if let Some(m) = &msg.custom_message {
            self.emit(Event::Refused(Refusal {
                reason: "unknown_capability",
                detail: format!(
                    "custom message of capability `{}` (type `{}`) is not supported; ignored",
                    m.capability, m.r#type
                ),
            }))
            .await;
        }
        if let Some(id) = msg.agent_identification {
            match <[u8; 16]>::try_from(id.new_instance_uid.as_slice()) {
                Ok(uid) if uid != self.uid => {
                    self.uid = uid;
                    self.emit(Event::NewInstanceUid(uid)).await;
                    asked.full = true;
                }
                Ok(_) => {}
                Err(_) => {
                    self.emit(Event::Refused(Refusal {
                        reason: "malformed",
                        detail: format!(
                            "new_instance_uid has {} bytes, not 16; the uid is kept",
                            id.new_instance_uid.len()
                        ),
                    }))
                    .await
                }
            }
        }
        if let Some(cmd) = msg.command {
            // A command comes alone: the specification has the other
            // fields ignored.
            if cmd.r#type == proto::CommandType::Restart as i32 {
                self.emit(Event::Restart).await;
            } else {
                self.emit(Event::Refused(Refusal {
                    reason: "unknown_command",
                    detail: format!("command type {} is not defined; ignored", cmd.r#type),
                }))
                .await;
            }
            return asked;
        }
        if msg.flags & proto::ServerToAgentFlags::ReportFullState as u64 != 0 {
            asked.full = true;
        }
        if msg.flags & proto::ServerToAgentFlags::ReportAvailableComponents as u64 != 0 {
            asked.components = true;
        }
        if let Some(s) = msg.connection_settings {
            if let Some(h) = s.opamp.as_ref().map(|o| o.heartbeat_interval_seconds) {
                if h > 0 {
                    self.heartbeat_offer = Some(Duration::from_secs(h.min(86_400)));
                }
            }
            self.emit(Event::ConnectionSettings(s)).await;
        }
        if let Some(p) = msg.packages_available {
            self.emit(Event::PackagesOffered(p)).await;
        }
        if let Some(rc) = msg.remote_config {
            self.emit(Event::RemoteConfig(rc)).await;
        }
        asked
    }

    async fn ws_session(&mut self) -> End {
        use tungstenite::client::IntoClientRequest;
        let url = ws_url(&self.settings.endpoint);
        let mut req = match url.as_str().into_client_request() {
            Ok(r) => r,
            Err(e) => {
                return End::Failed {
                    upgrade_refused: false,
                    why: format!("bad endpoint {url}: {e}"),
                    retry_after: None,
                }
            }
        };
        for (k, v) in &self.settings.headers {
            match (
                tungstenite::http::HeaderName::from_bytes(k.as_bytes()),
                tungstenite::http::HeaderValue::from_str(v),
            ) {
                (Ok(k), Ok(v)) => {
                    req.headers_mut().append(k, v);
                }
                _ => {
                    tracing::warn!(header = %k, "OpAMP header is not a valid HTTP header; not sent")
                }
            }
        }
        let config = tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(self.settings.max_message_bytes))
            .max_frame_size(Some(self.settings.max_message_bytes));
        let connector = if url.starts_with("wss://") {
            match &self.settings.tls {
                Some(t) => Some(tokio_tungstenite::Connector::Rustls(t.clone())),
                None => {
                    return End::Failed {
                        upgrade_refused: false,
                        why: "wss:// needs TLS settings".into(),
                        retry_after: None,
                    }
                }
            }
        } else {
            Some(tokio_tungstenite::Connector::Plain)
        };
        let connect =
            tokio_tungstenite::connect_async_tls_with_config(req, Some(config), true, connector);
        let mut stop = self.stop.clone();
        let connected = tokio::select! {
            r = tokio::time::timeout(self.settings.response_timeout, connect) => r,
            _ = stop.changed() => return End::Stopped,
        };
        let mut ws = match connected {
            Err(_) => {
                return End::Failed {
                    upgrade_refused: false,
                    why: format!(
                        "no WebSocket connection to {url} within {:?}",
                        self.settings.response_timeout
                    ),
                    retry_after: None,
                }
            }
            Ok(Err(e)) => return classify_ws_error(&url, e),
            Ok(Ok((ws, _))) => ws,
        };
        let mut sent = Sent::default();
        let mut full = true;
        let mut components = false;
        let mut announced = false;
        let mut refused_caps = false;
        // When the last message was sent and no answer came yet.
        let mut awaiting: Option<Instant> = None;
        let mut last_sent = Instant::now();
        let mut pending_send = true;
        loop {
            if pending_send {
                pending_send = false;
                let m = self.next_message(&mut sent, full, components);
                full = false;
                components = false;
                let bytes = encode_ws(&m);
                let send = ws.send(tungstenite::Message::Binary(bytes.into()));
                match tokio::time::timeout(self.settings.response_timeout, send).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        return self.lost_or_failed(announced, format!("sending to {url}: {e}"))
                    }
                    Err(_) => {
                        return self.lost_or_failed(
                            announced,
                            format!(
                                "sending to {url} took longer than {:?}",
                                self.settings.response_timeout
                            ),
                        )
                    }
                }
                last_sent = Instant::now();
                awaiting.get_or_insert(last_sent);
            }
            let heartbeat_at = last_sent + self.heartbeat(self.settings.heartbeat);
            let answer_by = awaiting.map(|t| t + self.settings.response_timeout);
            let wake = answer_by.map_or(heartbeat_at, |a| a.min(heartbeat_at));
            let reporter = self.reporter.clone();
            tokio::select! {
                frame = ws.next() => {
                    let frame = match frame {
                        None => return self.lost_or_failed(announced, format!("{url} closed the connection")),
                        Some(Err(e)) => {
                            if let tungstenite::Error::Capacity(c) = &e {
                                self.emit(Event::Refused(Refusal {
                                    reason: "too_large",
                                    detail: format!("{c} (the limit is {} bytes); the connection is dropped", self.settings.max_message_bytes),
                                })).await;
                            }
                            return self.lost_or_failed(announced, format!("reading from {url}: {e}"));
                        }
                        Some(Ok(f)) => f,
                    };
                    let data = match frame {
                        tungstenite::Message::Binary(b) => b,
                        tungstenite::Message::Text(t) => {
                            awaiting = None;
                            self.emit(Event::Refused(Refusal {
                                reason: "text_frame",
                                detail: format!("a text WebSocket message of {} bytes (OpAMP sends binary ones)", t.len()),
                            })).await;
                            continue;
                        }
                        tungstenite::Message::Close(c) => {
                            let why = c.map(|c| format!("{url} closed the connection: {} {}", u16::from(c.code), c.reason))
                                .unwrap_or_else(|| format!("{url} closed the connection"));
                            return self.lost_or_failed(announced, why);
                        }
                        // Pings are answered by the library.
                        _ => continue,
                    };
                    awaiting = None;
                    let msg = match decode_ws(&data) {
                        Ok(m) => m,
                        Err(e) => {
                            let reason = match e {
                                crate::frame::FrameError::BadHeader(_) | crate::frame::FrameError::NoHeader => "bad_header",
                                crate::frame::FrameError::Malformed(_) => "malformed",
                            };
                            self.emit(Event::Refused(Refusal { reason, detail: format!("{e} ({} bytes)", data.len()) })).await;
                            continue;
                        }
                    };
                    if !announced {
                        announced = true;
                        self.emit(Event::Connected { transport: "websocket" }).await;
                    }
                    let asked = self.handle(msg, &mut refused_caps).await;
                    if let Some(after) = asked.unavailable {
                        let _ = ws.close(None).await;
                        return End::Lost { why: format!("{url} is unavailable (UNAVAILABLE error response)"), retry_after: after };
                    }
                    if asked.full || asked.components {
                        full |= asked.full;
                        components |= asked.components;
                        pending_send = true;
                    }
                }
                _ = reporter.changed() => {
                    if self.reporter.has_changes(&sent) {
                        pending_send = true;
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    if answer_by.is_some_and(|a| Instant::now() >= a) {
                        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                        return self.lost_or_failed(announced, format!("{url} did not answer within {:?}", self.settings.response_timeout));
                    }
                    // Heartbeat: nothing changed, the server learns the
                    // agent is there.
                    pending_send = true;
                }
                _ = stop.changed() => {
                    self.seq += 1;
                    let bye = proto::AgentToServer {
                        instance_uid: self.uid.to_vec(),
                        sequence_num: self.seq,
                        capabilities: self.reporter.capabilities(),
                        agent_disconnect: Some(proto::AgentDisconnect {}),
                        ..Default::default()
                    };
                    let close = async {
                        let _ = ws.send(tungstenite::Message::Binary(encode_ws(&bye).into())).await;
                        let _ = ws.close(None).await;
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(2), close).await;
                    return End::Stopped;
                }
            }
        }
    }

    fn lost_or_failed(&self, announced: bool, why: String) -> End {
        if announced {
            End::Lost {
                why,
                retry_after: None,
            }
        } else {
            End::Failed {
                upgrade_refused: false,
                why,
                retry_after: None,
            }
        }
    }

    async fn http_session(&mut self) -> End {
        let url = http_url(&self.settings.endpoint);
        let mut b = reqwest::Client::builder()
            .timeout(self.settings.response_timeout)
            .connect_timeout(self.settings.response_timeout);
        if let Some(t) = &self.settings.tls {
            b = b.use_preconfigured_tls((**t).clone());
        }
        let client = match b.build() {
            Ok(c) => c,
            Err(e) => {
                return End::Failed {
                    upgrade_refused: false,
                    why: format!("HTTP client: {e}"),
                    retry_after: None,
                }
            }
        };
        let mut sent = Sent::default();
        let mut full = true;
        let mut components = false;
        let mut announced = false;
        let mut refused_caps = false;
        let uid_header = crate::uid_text(&self.uid);
        loop {
            let m = self.next_message(&mut sent, full, components);
            let mut req = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
                .header("OpAMP-Instance-UID", &uid_header)
                .body(m.encode_to_vec());
            for (k, v) in &self.settings.headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let mut stop = self.stop.clone();
            let resp = tokio::select! {
                r = req.send() => r,
                _ = stop.changed() => return End::Stopped,
            };
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    // The next session starts over with the full status,
                    // so what this request carried is not lost.
                    return self.lost_or_failed(announced, format!("POST {url}: {e}"));
                }
            };
            let status = resp.status();
            if status == reqwest::StatusCode::TOO_MANY_REQUESTS
                || status == reqwest::StatusCode::SERVICE_UNAVAILABLE
            {
                let after = retry_after_header(resp.headers());
                return End::Lost {
                    why: format!("{url} answered {status}"),
                    retry_after: after,
                };
            }
            if !status.is_success() {
                return self.lost_or_failed(announced, format!("{url} answered {status}"));
            }
            let body = match read_limited(resp, self.settings.max_message_bytes).await {
                Ok(b) => b,
                Err(BodyError::TooLarge(n)) => {
                    self.emit(Event::Refused(Refusal {
                        reason: "too_large",
                        detail: format!(
                            "an answer of {n} bytes or more (the limit is {} bytes)",
                            self.settings.max_message_bytes
                        ),
                    }))
                    .await;
                    Vec::new()
                }
                Err(BodyError::Read(e)) => {
                    return self
                        .lost_or_failed(announced, format!("reading the answer of {url}: {e}"))
                }
            };
            full = false;
            components = false;
            if !announced {
                announced = true;
                self.emit(Event::Connected { transport: "http" }).await;
            }
            let mut now = false;
            if !body.is_empty() {
                match decode_http(&body) {
                    Ok(msg) => {
                        let asked = self.handle(msg, &mut refused_caps).await;
                        if let Some(after) = asked.unavailable {
                            return End::Lost {
                                why: format!("{url} is unavailable (UNAVAILABLE error response)"),
                                retry_after: after,
                            };
                        }
                        full = asked.full;
                        components = asked.components;
                        now = full || components;
                    }
                    Err(e) => {
                        self.emit(Event::Refused(Refusal {
                            reason: "malformed",
                            detail: format!("{e} ({} bytes)", body.len()),
                        }))
                        .await
                    }
                }
            }
            if now || self.reporter.has_changes(&sent) {
                continue;
            }
            let poll = self.heartbeat(self.settings.polling);
            let reporter = self.reporter.clone();
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = async {
                    // Only a real change cuts the wait short.
                    loop {
                        reporter.changed().await;
                        if reporter.has_changes(&sent) { break; }
                    }
                } => {}
                _ = stop.changed() => return End::Stopped,
            }
        }
    }
}

enum BodyError {
    TooLarge(usize),
    Read(reqwest::Error),
}

/// Reads a response body of at most `max` bytes; a longer one is not read
/// past the limit.
async fn read_limited(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if let Some(n) = resp.content_length() {
        if n as usize > max {
            return Err(BodyError::TooLarge(n as usize));
        }
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(body.len() + chunk.len()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn classify_ws_error(url: &str, e: tungstenite::Error) -> End {
    use std::io::ErrorKind;
    match e {
        tungstenite::Error::Http(resp) => {
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
            // 401: the credentials are wrong, plain HTTP would be refused
            // too; 429 and 503: the server is busy, not WebSocket-blind.
            let busy = status == 429 || status == 503;
            End::Failed {
                upgrade_refused: status != 401 && !busy,
                why: format!("{url} refused the WebSocket upgrade with HTTP {status}"),
                retry_after: if busy { retry_after } else { None },
            }
        }
        tungstenite::Error::Io(io) => {
            // Refused or unreachable: the server is down. Cut during the
            // handshake: something in between dropped the upgrade.
            let cut = matches!(
                io.kind(),
                ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe
            );
            End::Failed {
                upgrade_refused: cut,
                why: format!("connecting to {url}: {io}"),
                retry_after: None,
            }
        }
        tungstenite::Error::Protocol(p) => End::Failed {
            upgrade_refused: true,
            why: format!("WebSocket handshake with {url}: {p}"),
            retry_after: None,
        },
        other => End::Failed {
            upgrade_refused: false,
            why: format!("connecting to {url}: {other}"),
            retry_after: None,
        },
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_map_between_transports() {
        assert_eq!(ws_url("http://h:1/v1/opamp"), "ws://h:1/v1/opamp");
        assert_eq!(ws_url("https://h/v1/opamp"), "wss://h/v1/opamp");
        assert_eq!(ws_url("wss://h/x"), "wss://h/x");
        assert_eq!(http_url("ws://h:1/v1/opamp"), "http://h:1/v1/opamp");
        assert_eq!(http_url("wss://h/v1/opamp"), "https://h/v1/opamp");
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter() {
        let mut b = Backoff {
            next: Duration::from_secs(1),
            initial: Duration::from_secs(1),
            max: Duration::from_secs(8),
        };
        let waits: Vec<Duration> = (0..6).map(|_| b.wait()).collect();
        for (w, base) in waits.iter().zip([1u64, 2, 4, 8, 8, 8]) {
            let base = Duration::from_secs(base);
            assert!(*w >= base / 2 && *w < base * 3 / 2, "{w:?} for {base:?}");
        }
        b.reset();
        assert!(b.wait() < Duration::from_millis(1500));
    }
}
