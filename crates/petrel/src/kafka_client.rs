//! What the `kafka` source and sink share: librdkafka settings from the
//! config (the friendly `tls:` and `sasl:` keys, and the `librdkafka:`
//! pass-through, checked where they are written), the OIDC token source of
//! SASL OAUTHBEARER, the explanation of connection failures, and Kafka's
//! rule for topic names.
//!
//! Settings are kept in the order they were given (Petrel's own first, then
//! `tls:`, `sasl:`, then `librdkafka:`, whose keys win), and checked in that
//! order: every problem is reported, each at the key that caused it, and the
//! same configuration gives the same messages on every run (librdkafka's
//! own check, through a hash map, named whichever setting came first).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petrel_core::config::{Map, Node};
use rdkafka::bindings as rd;
use rdkafka::client::OAuthToken;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// librdkafka settings whose values are secrets: never printed, never
/// echoed in an error.
pub const SECRET_KEYS: &[&str] = &[
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "sasl.oauthbearer.client.secret",
    "ssl.key.pem",
];

/// The settings of OIDC client credentials (librdkafka's
/// `sasl.oauthbearer.method: oidc`), served by Petrel's [`Oidc`] rather
/// than by librdkafka, which would need libcurl: they are kept in the
/// settings (so that two sinks with different credentials never share a
/// producer) and left out of what librdkafka is given.
const OIDC_KEYS: &[&str] = &[
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
];

/// SASL mechanisms the build supports.
pub const MECHANISMS: &[&str] = &[
    "PLAIN",
    "SCRAM-SHA-256",
    "SCRAM-SHA-512",
    "OAUTHBEARER",
    "GSSAPI",
];

/// Keys of `tls:` on the kafka source and sink.
pub const TLS_KEYS: &[&str] = &[
    "ca_file",
    "cert_file",
    "key_file",
    "key_password",
    "verify",
    "verify_hostname",
];

/// Keys of `sasl:` on the kafka source and sink.
pub const SASL_KEYS: &[&str] = &[
    "mechanism",
    "username",
    "password",
    "password_file",
    "token_endpoint_url",
    "client_id",
    "client_secret",
    "client_secret_file",
    "scope",
    "kerberos_service_name",
    "kerberos_principal",
    "kerberos_keytab",
];

/// The `tls` key of the kafka source and sink.
pub const TLS_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "tls",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"Connect over TLS (librdkafka's OpenSSL; `security.protocol: ssl`, or `sasl_ssl` with `sasl`): `{ca_file, cert_file, key_file, key_password, verify, verify_hostname}`. `ca_file` (PEM) is the authority the brokers' certificates must chain to (default: the system's, found by librdkafka's `probe`); `cert_file` + `key_file` (PEM) present a client certificate (mutual TLS), `key_password` (`${VAR}` allowed) decrypts an encrypted key; `verify: false` accepts any broker certificate (tests only), `verify_hostname: false` accepts one that does not name the broker's host. `tls: {}` is TLS with the system's authorities. The files are checked when the configuration is loaded; `petrel_tls_certificate_expiry_seconds` reports when the client certificate expires. librdkafka reads them when the client starts: a renewed certificate is used after a reload or restart."#,
};

/// The `sasl` key of the kafka source and sink.
pub const SASL_DOC: petrel_core::plugin::KeyDoc = petrel_core::plugin::KeyDoc {
    name: "sasl",
    kind: petrel_core::plugin::KeyKind::Map,
    default: None,
    doc: r#"SASL authentication (`security.protocol: sasl_ssl` with `tls`, else `sasl_plaintext`): `mechanism` is `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` (with `username` and `password` or `password_file`), `OAUTHBEARER` (OIDC client credentials: `token_endpoint_url`, `client_id`, `client_secret` or `client_secret_file`, optional `scope`; Petrel fetches the token and fetches a new one before it expires) or `GSSAPI` (Kerberos: `kerberos_service_name` (default `kafka`), `kerberos_principal`, `kerberos_keytab`; librdkafka runs `kinit`, which must be installed). Secrets may be `${VAR}` (environment) or read from a `*_file` (its content, a final newline removed); they are never logged."#,
};

/// librdkafka settings, in the order they were given (a key given twice
/// keeps its last value). Printed with the secrets hidden.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Settings(pub Vec<(String, String)>);

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| {
                if SECRET_KEYS.contains(&k.as_str()) {
                    format!("{k}=(secret)")
                } else {
                    format!("{k}={v}")
                }
            }))
            .finish()
    }
}

impl std::ops::Deref for Settings {
    type Target = [(String, String)];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Settings {
    /// The last value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// librdkafka settings from key/value pairs, without the ones Petrel
/// serves itself (OIDC, see [`Oidc`]).
pub fn client_config(pairs: &[(String, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in pairs {
        if OIDC_KEYS.contains(&k.as_str()) {
            continue;
        }
        c.set(k, v);
    }
    c
}

/// One setting being gathered, with the config node that asked for it
/// (where a problem with it is reported).
struct Entry<'a> {
    key: String,
    value: String,
    node: Option<Node<'a>>,
    /// The key as the user wrote it (`tls.ca_file`), for messages.
    label: String,
}

/// Gathers a client's settings: Petrel's own, then `tls:`, `sasl:` and
/// `librdkafka:` of the entry, and checks them all.
pub struct SettingsBuilder<'a> {
    entries: Vec<Entry<'a>>,
}

impl<'a> SettingsBuilder<'a> {
    /// Starts with Petrel's own settings (the user's win over them).
    pub fn new(defaults: Vec<(String, String)>) -> Self {
        Self {
            entries: defaults
                .into_iter()
                .map(|(key, value)| Entry {
                    label: key.clone(),
                    key,
                    value,
                    node: None,
                })
                .collect(),
        }
    }

    /// Adds one of Petrel's own settings.
    pub fn push(&mut self, key: &str, value: impl Into<String>) {
        self.entries.push(Entry {
            key: key.into(),
            label: key.into(),
            value: value.into(),
            node: None,
        });
    }

    fn push_at(&mut self, key: &str, value: impl Into<String>, node: Node<'a>) {
        self.entries.push(Entry {
            key: key.into(),
            label: key.into(),
            value: value.into(),
            node: Some(node),
        });
    }

    /// Like `push_at`, for a friendly key `label` (`tls.ca_file`).
    fn push_as(&mut self, key: &str, value: impl Into<String>, node: Node<'a>, label: &str) {
        self.push_at(key, value, node);
        if let Some(e) = self.entries.last_mut() {
            e.label = label.into();
        }
    }

    /// The last value of `key` so far.
    fn last(&self, key: &str) -> Option<&Entry<'a>> {
        self.entries.iter().rev().find(|e| e.key == key)
    }

    /// Reads `tls:`, `sasl:` and `librdkafka:` of `map` (refusing the
    /// librdkafka keys of `refused`, each with why), then checks the whole
    /// set: Petrel's checks first (files, mechanisms, what goes together),
    /// then librdkafka's, setting by setting. Every problem is reported;
    /// `None` when there was one.
    pub fn finish(mut self, map: &Map<'a>, refused: &[(&str, &str)]) -> Option<Settings> {
        let errors_before = map.node().errors().len();
        let mut ok = true;
        let tls = map.get("tls");
        let sasl = map.get("sasl");
        if let Some(n) = tls {
            ok &= self.read_tls(n);
        }
        if let Some(n) = sasl {
            ok &= self.read_sasl(n, tls.is_some());
        }
        if let Some(n) = map.get("librdkafka") {
            match n.as_map_quiet() {
                Some(m) => {
                    for (k, v) in m.entries() {
                        if let Some((_, why)) = refused.iter().find(|(key, _)| *key == k) {
                            v.error(format!("`{k}` cannot be set: {why}"));
                            ok = false;
                            continue;
                        }
                        match v.raw() {
                            marked_yaml::Node::Scalar(s) => {
                                self.push_at(k, s.as_str(), v);
                            }
                            _ => {
                                v.error(format!(
                                    "librdkafka setting `{k}` must be a single value (a string, number or boolean)"
                                ));
                                ok = false;
                            }
                        }
                    }
                }
                None => {
                    n.error("`librdkafka` must be a mapping of librdkafka settings, e.g. `{ socket.timeout.ms: 30000 }`");
                    ok = false;
                }
            }
        }
        self.default_ca();
        ok &= self.check_security(map);
        ok &= self.check_kinit(map);
        ok &= self.check_files();
        ok &= self.check_with_librdkafka(map);
        if !ok || map.node().errors().len() > errors_before {
            return None;
        }
        Some(Settings(
            self.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        ))
    }

    /// `tls:` → `security.protocol: ssl` and the `ssl.*` settings.
    fn read_tls(&mut self, n: Node<'a>) -> bool {
        let m = match n.raw() {
            // `tls:` with nothing after it: TLS with the defaults.
            marked_yaml::Node::Scalar(s) if s.as_str().is_empty() => None,
            _ => match n.as_map(TLS_KEYS) {
                Some(m) => Some(m),
                None => return false,
            },
        };
        self.push_at("security.protocol", "ssl", n);
        let Some(m) = m else {
            return true;
        };
        let mut ok = true;
        for (key, prop) in [
            ("ca_file", "ssl.ca.location"),
            ("cert_file", "ssl.certificate.location"),
            ("key_file", "ssl.key.location"),
        ] {
            if let Some(v) = m.get(key) {
                match v.as_str() {
                    Some(p) => {
                        let p = crate::paths::resolve_path(v, p);
                        self.push_as(prop, p.to_string_lossy(), v, &format!("tls.{key}"));
                    }
                    None => ok = false,
                }
            }
        }
        if m.get("cert_file").is_some() != m.get("key_file").is_some() {
            n.error(
                "`tls`: `cert_file` and `key_file` go together (a client certificate and its key)",
            );
            ok = false;
        }
        if let Some(v) = m.get("key_password") {
            match secret(v, "key_password") {
                Some(s) => self.push_at("ssl.key.password", s, v),
                None => ok = false,
            }
        }
        if let Some(v) = m.get("verify") {
            match v.as_bool() {
                Some(b) => self.push_at("enable.ssl.certificate.verification", b.to_string(), v),
                None => ok = false,
            }
        }
        if let Some(v) = m.get("verify_hostname") {
            match v.as_bool() {
                Some(b) => self.push_at(
                    "ssl.endpoint.identification.algorithm",
                    if b { "https" } else { "none" },
                    v,
                ),
                None => ok = false,
            }
        }
        ok
    }

    /// `sasl:` → `security.protocol: sasl_*` and the `sasl.*` settings.
    fn read_sasl(&mut self, n: Node<'a>, tls: bool) -> bool {
        let Some(m) = n.as_map(SASL_KEYS) else {
            if matches!(n.raw(), marked_yaml::Node::Scalar(s) if s.as_str().is_empty()) {
                n.error("`sasl` needs at least `mechanism`, e.g. `sasl: {mechanism: SCRAM-SHA-512, username: petrel, password: \"${KAFKA_PASSWORD}\"}`");
            }
            return false;
        };
        let Some(mech_node) = m.required("mechanism", "SCRAM-SHA-512") else {
            return false;
        };
        let Some(mech) = mech_node.as_str() else {
            return false;
        };
        let Some(mech) = MECHANISMS
            .iter()
            .find(|x| x.eq_ignore_ascii_case(mech))
            .copied()
        else {
            mech_node.error(format!(
                "unknown SASL mechanism `{mech}`; use one of {}",
                MECHANISMS.join(", ")
            ));
            return false;
        };
        self.push_at(
            "security.protocol",
            if tls { "sasl_ssl" } else { "sasl_plaintext" },
            n,
        );
        self.push_at("sasl.mechanism", mech, mech_node);
        let mut ok = true;
        // Which keys belong to which mechanism: one meant for another is a
        // mistake worth a message, not something to ignore.
        let own: &[&str] = match mech {
            "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                &["username", "password", "password_file"]
            }
            "OAUTHBEARER" => &[
                "token_endpoint_url",
                "client_id",
                "client_secret",
                "client_secret_file",
                "scope",
            ],
            _ => &[
                "kerberos_service_name",
                "kerberos_principal",
                "kerberos_keytab",
            ],
        };
        for (k, v) in m.entries() {
            if k != "mechanism" && SASL_KEYS.contains(&k) && !own.contains(&k) {
                v.error(format!("`{k}` is not used with SASL {mech}"));
                ok = false;
            }
        }
        let one_of = |a: &str, b: &str, what: &str, example: &str| -> Option<(String, Node<'a>)> {
            match (m.get(a), m.get(b)) {
                (Some(_), Some(nb)) => {
                    nb.error(format!(
                        "`{a}` and `{b}` are two ways to give the {what}: keep one"
                    ));
                    None
                }
                (Some(na), None) => secret(na, a).map(|s| (s, na)),
                (None, Some(nb)) => secret_file(nb, b).map(|s| (s, nb)),
                (None, None) => {
                    n.error(format!(
                        "SASL {mech} needs `{a}` (or `{b}`), e.g. `{a}: {example}`"
                    ));
                    None
                }
            }
        };
        match mech {
            "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                match m
                    .required("username", "petrel")
                    .and_then(|u| Some((secret(u, "username")?, u)))
                {
                    Some((u, node)) => self.push_at("sasl.username", u, node),
                    None => ok = false,
                }
                match one_of(
                    "password",
                    "password_file",
                    "password",
                    "\"${KAFKA_PASSWORD}\"",
                ) {
                    Some((p, node)) => self.push_at("sasl.password", p, node),
                    None => ok = false,
                }
            }
            "OAUTHBEARER" => {
                self.push_at("sasl.oauthbearer.method", "oidc", mech_node);
                match m.required("token_endpoint_url", "https://idp.example.com/oauth2/token") {
                    Some(u) => match u.as_str() {
                        Some(s) => self.push_at("sasl.oauthbearer.token.endpoint.url", s, u),
                        None => ok = false,
                    },
                    None => ok = false,
                }
                match m
                    .required("client_id", "petrel")
                    .and_then(|u| Some((secret(u, "client_id")?, u)))
                {
                    Some((c, node)) => self.push_at("sasl.oauthbearer.client.id", c, node),
                    None => ok = false,
                }
                match one_of(
                    "client_secret",
                    "client_secret_file",
                    "client secret",
                    "\"${KAFKA_CLIENT_SECRET}\"",
                ) {
                    Some((s, node)) => self.push_at("sasl.oauthbearer.client.secret", s, node),
                    None => ok = false,
                }
                if let Some(s) = m.get("scope") {
                    match s.as_str() {
                        Some(v) => self.push_at("sasl.oauthbearer.scope", v, s),
                        None => ok = false,
                    }
                }
            }
            _ => {
                for (key, prop) in [
                    ("kerberos_service_name", "sasl.kerberos.service.name"),
                    ("kerberos_principal", "sasl.kerberos.principal"),
                    ("kerberos_keytab", "sasl.kerberos.keytab"),
                ] {
                    if let Some(v) = m.get(key) {
                        match v.as_str() {
                            Some(s) if key == "kerberos_keytab" => {
                                let p = crate::paths::resolve_path(v, s);
                                self.push_as(prop, p.to_string_lossy(), v, "sasl.kerberos_keytab");
                            }
                            Some(s) => self.push_at(prop, s, v),
                            None => ok = false,
                        }
                    }
                }
            }
        }
        ok
    }

    /// With TLS and no authority named, librdkafka is told to look for the
    /// system's: the OpenSSL built into Petrel knows no system path of its
    /// own (its default directory is that of its build).
    fn default_ca(&mut self) {
        let protocol = self
            .last("security.protocol")
            .map(|e| e.value.to_ascii_lowercase())
            .unwrap_or_default();
        if !protocol.ends_with("ssl") {
            return;
        }
        let named = ["ssl.ca.location", "ssl.ca.pem", "ssl.ca.certificate.stores"]
            .iter()
            .any(|k| self.last(k).is_some());
        if !named {
            self.push("ssl.ca.location", "probe");
        }
    }

    /// What goes together: a protocol that carries what `tls`/`sasl`
    /// asked for, a known mechanism with its credentials, OIDC complete.
    fn check_security(&self, map: &Map<'a>) -> bool {
        let mut ok = true;
        let at = |e: Option<&Entry<'a>>| -> Node<'a> {
            e.and_then(|e| e.node).unwrap_or_else(|| map.node())
        };
        let protocol_entry = self.last("security.protocol");
        let protocol = protocol_entry
            .map(|e| e.value.to_ascii_lowercase())
            .unwrap_or_else(|| "plaintext".into());
        if !["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"].contains(&protocol.as_str()) {
            at(protocol_entry).error(format!(
                "unknown `security.protocol` `{protocol}`; use plaintext, ssl, sasl_plaintext or sasl_ssl (or the `tls` and `sasl` keys)"
            ));
            return false;
        }
        let uses_tls = protocol.ends_with("ssl");
        let uses_sasl = protocol.starts_with("sasl");
        if let (Some(t), false) = (map.get("tls"), uses_tls) {
            at(protocol_entry).error(format!(
                "`security.protocol: {protocol}` turns off the TLS that `tls` (line {}) asks for; remove one of them",
                t.position().0
            ));
            ok = false;
        }
        if let (Some(s), false) = (map.get("sasl"), uses_sasl) {
            at(protocol_entry).error(format!(
                "`security.protocol: {protocol}` turns off the SASL that `sasl` (line {}) asks for; remove one of them",
                s.position().0
            ));
            ok = false;
        }
        // The `sasl` key checked its own mechanism and credentials; these
        // checks are for settings given through `librdkafka`.
        if uses_sasl && map.get("sasl").is_none() {
            let mech_entry = self.last("sasl.mechanism").or(self.last("sasl.mechanisms"));
            // librdkafka's default mechanism.
            let mech = mech_entry
                .map(|e| e.value.to_ascii_uppercase())
                .unwrap_or_else(|| "GSSAPI".into());
            if !MECHANISMS.contains(&mech.as_str()) {
                at(mech_entry).error(format!(
                    "unknown SASL mechanism `{mech}`; use one of {}",
                    MECHANISMS.join(", ")
                ));
                ok = false;
            }
            if matches!(mech.as_str(), "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512") {
                for k in ["sasl.username", "sasl.password"] {
                    if self.last(k).is_none_or(|e| e.value.is_empty()) {
                        at(mech_entry).error(format!(
                            "SASL {mech} needs `{k}` (or `sasl: {{mechanism: {mech}, username: ..., password: ...}}`)"
                        ));
                        ok = false;
                    }
                }
            }
            if mech == "OAUTHBEARER" {
                let oidc = self
                    .last("sasl.oauthbearer.method")
                    .is_some_and(|e| e.value.eq_ignore_ascii_case("oidc"));
                let unsecured = self
                    .last("enable.sasl.oauthbearer.unsecure.jwt")
                    .is_some_and(|e| e.value == "true");
                if oidc {
                    for k in [
                        "sasl.oauthbearer.token.endpoint.url",
                        "sasl.oauthbearer.client.id",
                        "sasl.oauthbearer.client.secret",
                    ] {
                        if self.last(k).is_none_or(|e| e.value.is_empty()) {
                            at(self.last("sasl.oauthbearer.method"))
                                .error(format!("`sasl.oauthbearer.method: oidc` needs `{k}`"));
                            ok = false;
                        }
                    }
                    if let Some(e) = self.last("sasl.oauthbearer.token.endpoint.url") {
                        if !(e.value.starts_with("https://") || e.value.starts_with("http://")) {
                            at(Some(e)).error(format!(
                                "the token endpoint `{}` must be an http:// or https:// URL",
                                e.value
                            ));
                            ok = false;
                        }
                    }
                } else if !unsecured {
                    at(mech_entry).error(
                        "SASL OAUTHBEARER needs a token source: `sasl: {mechanism: OAUTHBEARER, token_endpoint_url: ..., client_id: ..., client_secret: ...}` (OIDC client credentials)",
                    );
                    ok = false;
                }
            }
        }
        ok
    }

    /// With GSSAPI, librdkafka runs `sasl.kerberos.kinit.cmd` to get a
    /// ticket, and refuses to create the client when a setting that
    /// command names (`%{sasl.kerberos.keytab}` in its default) is not
    /// set: found here, at the key to add, instead of at start.
    fn check_kinit(&self, map: &Map<'a>) -> bool {
        let protocol = self
            .last("security.protocol")
            .map(|e| e.value.to_ascii_lowercase())
            .unwrap_or_default();
        let mech_entry = self.last("sasl.mechanism").or(self.last("sasl.mechanisms"));
        let gssapi = mech_entry.is_none_or(|e| e.value.eq_ignore_ascii_case("GSSAPI"));
        if !protocol.starts_with("sasl") || !gssapi {
            return true;
        }
        // `0` turns the refresh (and kinit) off: a ticket cache kept by
        // something else.
        if self
            .last("sasl.kerberos.min.time.before.relogin")
            .is_some_and(|e| e.value.trim() == "0")
        {
            return true;
        }
        let cmd = self
            .last("sasl.kerberos.kinit.cmd")
            .map_or(DEFAULT_KINIT_CMD, |e| e.value.as_str());
        let mut ok = true;
        let mut rest = cmd;
        let mut named: Vec<&str> = Vec::new();
        while let Some(at) = rest.find("%{") {
            let Some(end) = rest[at..].find('}') else {
                break;
            };
            let prop = &rest[at + 2..at + end];
            rest = &rest[at + end + 1..];
            // librdkafka's defaults (`kafkaclient`, `kafka`) fill these;
            // the default command names the keytab twice.
            if matches!(
                prop,
                "sasl.kerberos.principal" | "sasl.kerberos.service.name"
            ) || self.last(prop).is_some_and(|e| !e.value.is_empty())
                || named.contains(&prop)
            {
                continue;
            }
            named.push(prop);
            let fix = match prop {
                "sasl.kerberos.keytab" => {
                    "add `kerberos_keytab: /path/to/client.keytab` to `sasl`".to_string()
                }
                other => format!("set `{other}` under `librdkafka`"),
            };
            let at_node = mech_entry
                .and_then(|e| e.node)
                .or_else(|| map.get("sasl"))
                .unwrap_or_else(|| map.node());
            at_node.error(format!(
                "SASL GSSAPI: librdkafka gets its Kerberos ticket with `kinit`, whose command needs `{prop}`: {fix} (or, with a ticket cache kept up to date by something else, `librdkafka: {{sasl.kerberos.min.time.before.relogin: 0}}`)"
            ));
            ok = false;
        }
        ok
    }

    /// The files the settings name exist and hold what they should.
    fn check_files(&self) -> bool {
        // `validate --offline`: the files are on the host the config is
        // for.
        if !petrel_core::config::host_checks() {
            return true;
        }
        let mut ok = true;
        for (key, what) in [
            ("ssl.ca.location", FileKind::Ca),
            ("ssl.certificate.location", FileKind::Cert),
            ("ssl.key.location", FileKind::Key),
            ("ssl.crl.location", FileKind::Any),
            ("ssl.keystore.location", FileKind::Any),
            ("sasl.kerberos.keytab", FileKind::Any),
        ] {
            let Some(e) = self.last(key) else { continue };
            if key == "ssl.ca.location" && e.value == "probe" {
                continue;
            }
            // Petrel's own settings name no file; the user's are checked
            // where they are written.
            let Some(n) = e.node else { continue };
            let encrypted = self.last("ssl.key.password").is_some();
            if let Err(why) = check_file(Path::new(&e.value), what, encrypted) {
                n.error(format!("`{}`: {why}", e.label));
                ok = false;
            }
        }
        ok
    }

    /// librdkafka's own check of each setting, in order; every refusal is
    /// reported at its key. A secret's value is never echoed.
    fn check_with_librdkafka(&self, map: &Map<'a>) -> bool {
        let mut ok = true;
        // SAFETY: a configuration object of our own, destroyed below; the
        // strings outlive each call.
        let conf = unsafe { rd::rd_kafka_conf_new() };
        for e in &self.entries {
            if OIDC_KEYS.contains(&e.key.as_str()) {
                continue;
            }
            // A later value of the same key is the one that counts.
            if self.last(&e.key).is_some_and(|l| !std::ptr::eq(l, e)) {
                continue;
            }
            let (Ok(k), Ok(v)) = (
                std::ffi::CString::new(e.key.as_str()),
                std::ffi::CString::new(e.value.as_str()),
            ) else {
                e.node.unwrap_or_else(|| map.node()).error(format!(
                    "librdkafka setting `{}` holds a NUL character",
                    e.key
                ));
                ok = false;
                continue;
            };
            let mut buf = [0 as std::ffi::c_char; 512];
            // SAFETY: valid C strings and a buffer of the size given.
            let r = unsafe {
                rd::rd_kafka_conf_set(conf, k.as_ptr(), v.as_ptr(), buf.as_mut_ptr(), buf.len())
            };
            if r != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
                // SAFETY: librdkafka NUL-terminates the message it writes.
                let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                let msg = if SECRET_KEYS.contains(&e.key.as_str()) {
                    format!(
                        "librdkafka refuses the value of `{}` (not shown: a secret)",
                        e.key
                    )
                } else if r == rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_UNKNOWN {
                    format!("unknown librdkafka setting `{}`: {msg}", e.key)
                } else {
                    format!("librdkafka refuses `{}: {}`: {msg}", e.key, e.value)
                };
                e.node.unwrap_or_else(|| map.node()).error(msg);
                ok = false;
            }
        }
        // SAFETY: created above, not handed to any client.
        unsafe { rd::rd_kafka_conf_destroy(conf) };
        ok
    }
}

/// librdkafka's default `sasl.kerberos.kinit.cmd`.
const DEFAULT_KINIT_CMD: &str = "kinit -R -t \"%{sasl.kerberos.keytab}\" -k %{sasl.kerberos.principal} || kinit -t \"%{sasl.kerberos.keytab}\" -k %{sasl.kerberos.principal}";

/// What a file named by a setting must hold.
#[derive(Clone, Copy)]
enum FileKind {
    Ca,
    Cert,
    Key,
    Any,
}

fn check_file(p: &Path, kind: FileKind, encrypted_key: bool) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if meta.is_dir() {
        // An OpenSSL directory of hashed CA files.
        return match kind {
            FileKind::Ca => Ok(()),
            _ => Err(format!("{} is a directory, not a file", p.display())),
        };
    }
    let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let pem = bytes.windows(11).any(|w| w == b"-----BEGIN ");
    match kind {
        FileKind::Ca | FileKind::Cert if pem => {
            let certs: Result<Vec<CertificateDer<'static>>, _> =
                CertificateDer::pem_slice_iter(&bytes).collect();
            match certs {
                Ok(c) if !c.is_empty() => Ok(()),
                Ok(_) => Err(format!("{} holds no PEM certificate", p.display())),
                Err(e) => Err(format!(
                    "{}: not a readable PEM certificate: {e}",
                    p.display()
                )),
            }
        }
        FileKind::Ca | FileKind::Cert => Err(format!(
            "{} is not a PEM file (`-----BEGIN CERTIFICATE-----`)",
            p.display()
        )),
        FileKind::Key if encrypted_key => Ok(()),
        FileKind::Key => PrivateKeyDer::from_pem_slice(&bytes)
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "{}: no readable private key ({e}); an encrypted key needs `key_password`",
                    p.display()
                )
            }),
        FileKind::Any => Ok(()),
    }
}

/// A secret value: the text, with `${VAR}` replaced from the environment.
fn secret(n: Node<'_>, what: &str) -> Option<String> {
    let raw = n.as_str()?;
    match petrel_core::config::expand_env(raw, |name| std::env::var(name).ok()) {
        Ok(s) => Some(s.into_owned()),
        Err(e) => {
            n.error(format!("`{what}`: {e}"));
            None
        }
    }
}

/// A secret read from the file `n` names (one final newline removed, as
/// Kubernetes secrets and `echo` leave one).
fn secret_file(n: Node<'_>, what: &str) -> Option<String> {
    let raw = n.as_str()?;
    let p = crate::paths::resolve_path(n, raw);
    match std::fs::read_to_string(&p) {
        Ok(s) => {
            let s = s.strip_suffix('\n').unwrap_or(&s);
            let s = s.strip_suffix('\r').unwrap_or(s);
            if s.is_empty() {
                n.error(format!("`{what}` {} is empty", p.display()));
                return None;
            }
            Some(s.to_string())
        }
        Err(e) => {
            n.error(format!("`{what}` {}: {e}", p.display()));
            None
        }
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or
/// `..`. A name rendered from event data that breaks it would be refused
/// by the broker forever.
pub fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// OIDC client credentials (OAuth 2.0 `client_credentials` grant) for SASL
/// OAUTHBEARER, as librdkafka's `sasl.oauthbearer.method: oidc` does them:
/// a POST to the token endpoint with the client's id and secret (HTTP basic
/// authentication), the `access_token` of the answer as the token, its
/// JWT `sub` claim as the principal and its `exp` claim (else `expires_in`)
/// as its lifetime. librdkafka asks again at 80 % of the lifetime.
#[derive(Clone)]
pub struct Oidc {
    url: String,
    client_id: String,
    client_secret: String,
    scope: Option<String>,
    extensions: Option<String>,
    /// Extra authority for an https endpoint (the `tls.ca_file`).
    ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("url", &self.url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// How long a token request may take.
const OIDC_TIMEOUT: Duration = Duration::from_secs(10);

impl Oidc {
    /// The OIDC source of `pairs`, when they ask for one.
    pub fn from_settings(pairs: &[(String, String)]) -> Option<Oidc> {
        let last: HashMap<&str, &str> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mech = last.get("sasl.mechanism").or(last.get("sasl.mechanisms"))?;
        if !mech.eq_ignore_ascii_case("OAUTHBEARER")
            || !last
                .get("sasl.oauthbearer.method")
                .is_some_and(|m| m.eq_ignore_ascii_case("oidc"))
        {
            return None;
        }
        Some(Oidc {
            url: last.get("sasl.oauthbearer.token.endpoint.url")?.to_string(),
            client_id: last.get("sasl.oauthbearer.client.id")?.to_string(),
            client_secret: last.get("sasl.oauthbearer.client.secret")?.to_string(),
            scope: last.get("sasl.oauthbearer.scope").map(|s| s.to_string()),
            extensions: last
                .get("sasl.oauthbearer.extensions")
                .map(|s| s.to_string()),
            ca_file: last
                .get("ssl.ca.location")
                .filter(|p| **p != "probe")
                .map(PathBuf::from),
        })
    }

    /// Fetches a token (blocking, at most [`OIDC_TIMEOUT`]); called by
    /// librdkafka's refresh event, on the thread that polls the client.
    pub fn token(&self) -> Result<OAuthToken, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("OIDC: {e}"))?;
        let body = rt.block_on(self.request())?;
        parse_token_answer(&body, now_ms())
    }

    async fn request(&self) -> Result<String, String> {
        let tls = crate::sinks::tls::Tls {
            ca_file: self.ca_file.clone(),
            verify: true,
            ..Default::default()
        };
        let client = crate::sinks::client::build_client(
            &tls,
            OIDC_TIMEOUT,
            &crate::tls::Owner::named("kafka OIDC"),
        )
        .map_err(|e| format!("OIDC client: {e:#}"))?;
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(s) = &self.scope {
            form.append_pair("scope", s);
        }
        let resp = client
            .post(&self.url)
            .basic_auth(&self.client_id, Some(&self.client_secret))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(form.finish())
            .send()
            .await
            .map_err(|e| format!("token endpoint {}: {e}", self.url))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("token endpoint {}: {e}", self.url))?;
        if !status.is_success() {
            let short: String = text.chars().take(300).collect();
            return Err(format!(
                "token endpoint {} answered {status}: {short} (check client_id and client_secret)",
                self.url
            ));
        }
        let _ = &self.extensions;
        Ok(text)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The token of a token endpoint's JSON answer, its principal (`sub`)
/// and its lifetime (`exp`, else `expires_in` from `now_ms`).
pub fn parse_token_answer(body: &str, now_ms: i64) -> Result<OAuthToken, String> {
    let v: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| format!("token endpoint answer is not JSON: {e}"))?;
    let token = v
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or("token endpoint answer has no `access_token`")?
        .to_string();
    let claims = token
        .split('.')
        .nth(1)
        .and_then(|p| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.trim_end_matches('='))
                .ok()
        })
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .ok_or("the access token is not a JWT (three base64url parts)")?;
    let principal = claims
        .get("sub")
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .ok_or("the access token has no `sub` claim (the principal)")?
        .to_string();
    let lifetime_ms = match claims.get("exp").and_then(|e| e.as_f64()) {
        Some(exp) => (exp * 1000.0) as i64,
        None => match v.get("expires_in").and_then(|e| e.as_f64()) {
            Some(s) => now_ms + (s * 1000.0) as i64,
            None => {
                return Err(
                    "the access token has no `exp` claim and the answer no `expires_in`".into(),
                )
            }
        },
    };
    if lifetime_ms <= now_ms {
        return Err("the token endpoint gave a token that has already expired".into());
    }
    Ok(OAuthToken {
        token,
        principal_name: principal,
        lifetime_ms,
    })
}

/// An operator's reading of a line of librdkafka's own log that matters
/// although the client goes on (and that no error callback repeats): a
/// Kerberos ticket refresh (`kinit`, SASL GSSAPI) that failed.
pub fn explain_log(facility: &str, message: &str) -> Option<&'static str> {
    if facility == "SASLREFRESH" && message.contains("failed") {
        return Some("SASL GSSAPI: getting a Kerberos ticket with `kinit` failed (is `kinit` installed, and does `sasl.kerberos_keytab` hold the key of `sasl.kerberos_principal`?); the brokers will refuse the connection");
    }
    None
}

/// An operator's reading of a librdkafka client error: the cause, in
/// words that say what to fix, or `None` when the error says it itself.
pub fn explain(error: &KafkaError, reason: &str) -> Option<&'static str> {
    let code = error.rdkafka_error_code();
    let text = reason.to_ascii_lowercase();
    if code == Some(RDKafkaErrorCode::Authentication)
        || code == Some(RDKafkaErrorCode::SaslAuthenticationFailed)
        || text.contains("authentication failed")
        || text.contains("sasl authentication error")
    {
        return Some(
            "the broker refused the SASL credentials (user name, password or token: `sasl`)",
        );
    }
    if text.contains("unsupported sasl mechanism") {
        return Some("the broker's listener does not offer this SASL mechanism (`sasl.mechanism`; the reason lists those it offers)");
    }
    if text.contains("certificate expired") {
        return Some("a certificate has expired (the broker refused ours, or its own is out of date): renew it");
    }
    if text.contains("certificate verify failed") || text.contains("unable to get local issuer") {
        return Some("the broker's certificate is not trusted: `tls.ca_file` must hold the authority that signed it");
    }
    if text.contains("certificate unknown") {
        return Some("the broker refused our client certificate (expired, or not signed by an authority it trusts: `tls.cert_file`)");
    }
    if text.contains("certificate required")
        || text.contains("bad certificate")
        || text.contains("unknown ca")
        || text.contains("handshake failure")
    {
        return Some("the broker refused the TLS handshake: it wants a client certificate it trusts (`tls.cert_file`, `tls.key_file`)");
    }
    if code == Some(RDKafkaErrorCode::SSL) || text.contains("ssl handshake failed") {
        return Some("the TLS handshake with the broker failed (is the listener TLS? `tls`)");
    }
    if text.contains("disconnected while requesting apiversion")
        || text.contains("connection setup timed out in state apiversion_query")
        || text.contains("disconnected: verify that security.protocol is correctly configured")
    {
        return Some("the broker closed the connection at once: `security.protocol` (the `tls` and `sasl` keys) may not match the listener's");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers_give_the_principal_and_the_lifetime() {
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims = e.encode(br#"{"sub":"petrel-client","exp":2000000000}"#);
        let jwt = format!("e30.{claims}.c2ln");
        let t = parse_token_answer(&format!(r#"{{"access_token":"{jwt}","expires_in":60}}"#), 0)
            .expect("token");
        assert_eq!(t.principal_name, "petrel-client");
        assert_eq!(t.lifetime_ms, 2_000_000_000_000);
        assert_eq!(t.token, jwt);
        let no_exp = e.encode(br#"{"sub":"x"}"#);
        let t = parse_token_answer(
            &format!(r#"{{"access_token":"a.{no_exp}.b","expires_in":60}}"#),
            1000,
        )
        .expect("token");
        assert_eq!(t.lifetime_ms, 61_000);
        for bad in [
            "not json",
            r#"{"error":"invalid_client"}"#,
            r#"{"access_token":"opaque"}"#,
        ] {
            assert!(parse_token_answer(bad, 0).is_err(), "{bad}");
        }
        let expired = e.encode(br#"{"sub":"x","exp":1}"#);
        assert!(
            parse_token_answer(&format!(r#"{{"access_token":"a.{expired}.b"}}"#), 5000).is_err()
        );
    }

    #[test]
    fn secrets_are_not_printed() {
        let s = Settings(vec![
            ("sasl.username".into(), "petrel".into()),
            ("sasl.password".into(), "hunter2".into()),
        ]);
        let d = format!("{s:?}");
        assert!(d.contains("sasl.username=petrel"), "{d}");
        assert!(!d.contains("hunter2"), "{d}");
    }

    #[test]
    fn oidc_settings_are_served_by_petrel_not_librdkafka() {
        let pairs: Vec<(String, String)> = [
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            (
                "sasl.oauthbearer.token.endpoint.url",
                "http://127.0.0.1:1/token",
            ),
            ("sasl.oauthbearer.client.id", "id"),
            ("sasl.oauthbearer.client.secret", "s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let o = Oidc::from_settings(&pairs).expect("oidc");
        assert_eq!(o.client_id, "id");
        let c = client_config(&pairs);
        assert!(c.get("sasl.oauthbearer.method").is_none());
        assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
    }
}
