//! What the `kafka` source and sink share: librdkafka settings from the
//! config (the `librdkafka:` pass-through, checked where it is written) and
//! Kafka's rule for topic names.

use petrel_core::config::Map;
use rdkafka::config::ClientConfig;

/// librdkafka settings from key/value pairs.
pub fn client_config(pairs: &[(String, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in pairs {
        c.set(k, v);
    }
    c
}

/// Appends the entry's `librdkafka:` settings to `client` (refusing the
/// keys of `refused`, each with why), then lets librdkafka check the whole
/// set, so that a bad setting is reported at the entry rather than at
/// start. `None` after reporting a problem.
pub fn librdkafka_settings(
    map: &Map<'_>,
    client: &mut Vec<(String, String)>,
    refused: &[(&str, &str)],
) -> Option<()> {
    if let Some(n) = map.get("librdkafka") {
        let Some(m) = n.as_map_quiet() else {
            n.error("`librdkafka` must be a mapping of librdkafka settings, e.g. `{ security.protocol: ssl }`");
            return None;
        };
        for (k, v) in m.entries() {
            if let Some((_, why)) = refused.iter().find(|(key, _)| *key == k) {
                v.error(format!("`{k}` cannot be set: {why}"));
                return None;
            }
            if let Some(v) = v.as_str() {
                client.push((k.to_string(), v.to_string()));
            }
        }
    }
    if let Err(e) = client_config(client).create_native_config() {
        map.node()
            .error(format!("Kafka client settings rejected: {e}"));
        return None;
    }
    Some(())
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
