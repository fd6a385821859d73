//! The agent's status as the client reports it: one current value per
//! part of `AgentToServer`, each with a version, so that the client sends
//! a part only when it changed since it last sent it (status compression)
//! and every part when the server lost track.

use std::sync::{Arc, Mutex};

use crate::proto;

/// One part of the status and its version (0: never set).
#[derive(Debug)]
struct Part<T> {
    value: Option<Arc<T>>,
    version: u64,
}

impl<T> Default for Part<T> {
    fn default() -> Self {
        Self {
            value: None,
            version: 0,
        }
    }
}

impl<T: PartialEq> Part<T> {
    /// Replaces the value; true when it differs from the one held.
    fn set(&mut self, v: T, clock: &mut u64) -> bool {
        if self.value.as_deref() == Some(&v) {
            return false;
        }
        *clock += 1;
        self.value = Some(Arc::new(v));
        self.version = *clock;
        true
    }
}

#[derive(Debug, Default)]
struct Parts {
    clock: u64,
    capabilities: u64,
    description: Part<proto::AgentDescription>,
    health: Part<proto::ComponentHealth>,
    effective: Part<proto::EffectiveConfig>,
    remote_status: Part<proto::RemoteConfigStatus>,
    packages: Part<proto::PackageStatuses>,
    components: Part<proto::AvailableComponents>,
    connection_status: Part<proto::ConnectionSettingsStatus>,
}

/// The versions of each part last sent on a connection.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    description: u64,
    health: u64,
    effective: u64,
    remote_status: u64,
    packages: u64,
    components: u64,
    connection_status: u64,
}

/// The agent's current status, shared between the agent (which sets it)
/// and the client (which sends it). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Reporter {
    parts: Arc<Mutex<Parts>>,
    changed: Arc<tokio::sync::Notify>,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident, $field:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, v: $ty) {
            let changed = {
                let mut p = self.lock();
                let Parts { clock, $field, .. } = &mut *p;
                $field.set(v, clock)
            };
            if changed {
                self.changed.notify_one();
            }
        }
    };
}

impl Reporter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        // A panic while holding the lock leaves plain data behind.
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the `AgentCapabilities` bits (sent in every message).
    pub fn set_capabilities(&self, caps: u64) {
        self.lock().capabilities = caps;
    }

    /// The capabilities set.
    pub fn capabilities(&self) -> u64 {
        self.lock().capabilities
    }

    setter!(
        /// Sets the agent's description (identifying and other attributes).
        set_description, description, proto::AgentDescription);
    setter!(
        /// Sets the health tree (agent → pipeline → component).
        set_health, health, proto::ComponentHealth);
    setter!(
        /// Sets the effective configuration.
        set_effective_config, effective, proto::EffectiveConfig);
    setter!(
        /// Sets the status of the last remote configuration received.
        set_remote_config_status, remote_status, proto::RemoteConfigStatus);
    setter!(
        /// Sets the package statuses (the agent installs no packages: an
        /// offer is answered with an error in these).
        set_package_statuses, packages, proto::PackageStatuses);
    setter!(
        /// Sets the available components (full list; the client sends only
        /// the hash unless the server asks for the list).
        set_available_components, components, proto::AvailableComponents);
    setter!(
        /// Sets the status of the last connection settings offered.
        set_connection_settings_status, connection_status, proto::ConnectionSettingsStatus);

    /// The status of the last remote configuration, as set.
    pub fn remote_config_status(&self) -> Option<Arc<proto::RemoteConfigStatus>> {
        self.lock().remote_status.value.clone()
    }

    /// Waits until a part changes.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// True when a part changed since `sent`.
    pub fn has_changes(&self, sent: &Sent) -> bool {
        let p = self.lock();
        p.description.version > sent.description
            || p.health.version > sent.health
            || p.effective.version > sent.effective
            || p.remote_status.version > sent.remote_status
            || p.packages.version > sent.packages
            || p.components.version > sent.components
            || p.connection_status.version > sent.connection_status
    }

    /// Fills `msg` with the parts changed since `sent` (every part set
    /// when `full`) and records them as sent. The available components
    /// carry only their hash unless `components_full`.
    pub fn compose(
        &self,
        msg: &mut proto::AgentToServer,
        sent: &mut Sent,
        full: bool,
        components_full: bool,
    ) {
        let p = self.lock();
        msg.capabilities = p.capabilities;
        fn take<T: Clone>(part: &Part<T>, sent: &mut u64, full: bool) -> Option<T> {
            let v = part.value.as_deref()?;
            if full || part.version > *sent {
                *sent = part.version;
                return Some(v.clone());
            }
            None
        }
        msg.agent_description = take(&p.description, &mut sent.description, full);
        msg.health = take(&p.health, &mut sent.health, full);
        msg.effective_config = take(&p.effective, &mut sent.effective, full);
        msg.remote_config_status = take(&p.remote_status, &mut sent.remote_status, full);
        msg.package_statuses = take(&p.packages, &mut sent.packages, full);
        msg.connection_settings_status =
            take(&p.connection_status, &mut sent.connection_status, full);
        let components_due = full || components_full || p.components.version > sent.components;
        if let (true, Some(c)) = (components_due, p.components.value.as_deref()) {
            sent.components = p.components.version;
            msg.available_components = Some(if components_full {
                c.clone()
            } else {
                proto::AvailableComponents {
                    components: Default::default(),
                    hash: c.hash.clone(),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_parts_are_sent_and_all_when_full() {
        let r = Reporter::default();
        r.set_capabilities(0x1);
        r.set_health(proto::ComponentHealth {
            healthy: true,
            ..Default::default()
        });
        r.set_remote_config_status(proto::RemoteConfigStatus {
            status: 1,
            ..Default::default()
        });
        let mut sent = Sent::default();
        let mut m = proto::AgentToServer::default();
        r.compose(&mut m, &mut sent, false, false);
        assert!(m.health.is_some() && m.remote_config_status.is_some());
        assert!(!r.has_changes(&sent));
        // The same value again is no change.
        r.set_health(proto::ComponentHealth {
            healthy: true,
            ..Default::default()
        });
        assert!(!r.has_changes(&sent));
        r.set_health(proto::ComponentHealth::default());
        assert!(r.has_changes(&sent));
        let mut m = proto::AgentToServer::default();
        r.compose(&mut m, &mut sent, false, false);
        assert!(m.health.is_some());
        assert!(
            m.remote_config_status.is_none(),
            "unchanged: compressed away"
        );
        let mut m = proto::AgentToServer::default();
        r.compose(&mut m, &mut sent, true, false);
        assert!(m.health.is_some() && m.remote_config_status.is_some());
        assert_eq!(m.capabilities, 1);
    }

    #[test]
    fn components_carry_their_hash_unless_asked_for_the_list() {
        let r = Reporter::default();
        let mut comps = proto::AvailableComponents {
            hash: vec![1, 2],
            ..Default::default()
        };
        comps
            .components
            .insert("sources".into(), Default::default());
        r.set_available_components(comps);
        let mut sent = Sent::default();
        let mut m = proto::AgentToServer::default();
        r.compose(&mut m, &mut sent, true, false);
        let c = m.available_components.unwrap();
        assert_eq!(c.hash, vec![1, 2]);
        assert!(c.components.is_empty());
        let mut m = proto::AgentToServer::default();
        r.compose(&mut m, &mut sent, false, true);
        assert_eq!(m.available_components.unwrap().components.len(), 1);
    }
}
