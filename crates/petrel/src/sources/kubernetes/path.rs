//! What a container log file's path tells without asking anybody.
//!
//! - CRI (kubelet): `<pods_dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`,
//!   rotated by kubelet to `<restart>.log.<YYYYMMDD-hhmmss>` (and later
//!   gzipped, which is never read: the plain rotated file was read first).
//! - Docker json-file: `<docker_dir>/<id>/<id>-json.log`, rotated by dockerd
//!   to `<id>-json.log.<n>`.

use std::path::Path;

/// Identity of a container log file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogPath {
    /// A kubelet pod log.
    Cri {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Pod uid.
        uid: String,
        /// Container name.
        container: String,
        /// Restart count (the file's number).
        restart: u32,
    },
    /// A Docker json-file log.
    Docker {
        /// Full container id.
        id: String,
    },
}

impl LogPath {
    /// Parses `path` under `pods_dir` or `docker_dir`.
    pub fn parse(path: &Path, pods_dir: &Path, docker_dir: &Path) -> Option<Self> {
        if let Ok(rel) = path.strip_prefix(pods_dir) {
            let mut it = rel.iter().map(|c| c.to_str());
            let (Some(Some(pod_dir)), Some(Some(container)), Some(Some(file)), None) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                return None;
            };
            // Namespace and pod names are DNS labels/subdomains and uids
            // are UUIDs: none contains `_`.
            let mut parts = pod_dir.split('_');
            let (Some(namespace), Some(pod), Some(uid), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            let (num, rest) = file.split_once(".log")?;
            if !(rest.is_empty() || rest.starts_with('.')) || rest.ends_with(".gz") {
                return None;
            }
            let restart = num.parse().ok()?;
            if namespace.is_empty() || pod.is_empty() || uid.is_empty() || container.is_empty() {
                return None;
            }
            return Some(Self::Cri {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                uid: uid.to_string(),
                container: container.to_string(),
                restart,
            });
        }
        if let Ok(rel) = path.strip_prefix(docker_dir) {
            let mut it = rel.iter().map(|c| c.to_str());
            let (Some(Some(id)), Some(Some(file)), None) = (it.next(), it.next(), it.next()) else {
                return None;
            };
            let rest = file.strip_prefix(id)?.strip_prefix("-json.log")?;
            if !(rest.is_empty() || rest.starts_with('.')) || rest.ends_with(".gz") {
                return None;
            }
            if id.len() < 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            return Some(Self::Docker { id: id.to_string() });
        }
        None
    }

    /// The directory that identifies the container (its files share it).
    pub fn container_key(&self) -> String {
        match self {
            Self::Cri {
                uid,
                container,
                restart,
                ..
            } => format!("{uid}/{container}/{restart}"),
            Self::Docker { id } => id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(p: &str) -> Option<LogPath> {
        LogPath::parse(
            Path::new(p),
            Path::new("/var/log/pods"),
            Path::new("/var/lib/docker/containers"),
        )
    }

    #[test]
    fn cri_paths_live_and_rotated() {
        let want = LogPath::Cri {
            namespace: "default".into(),
            pod: "web-7d4b9c-xk2lp".into(),
            uid: "0f1e2d3c-aaaa-bbbb-cccc-111122223333".into(),
            container: "nginx".into(),
            restart: 2,
        };
        let dir =
            "/var/log/pods/default_web-7d4b9c-xk2lp_0f1e2d3c-aaaa-bbbb-cccc-111122223333/nginx";
        assert_eq!(parse(&format!("{dir}/2.log")), Some(want.clone()));
        assert_eq!(parse(&format!("{dir}/2.log.20240102-030405")), Some(want));
        assert_eq!(parse(&format!("{dir}/2.log.20240102-030405.gz")), None);
        assert_eq!(parse(&format!("{dir}/x.log")), None);
        assert_eq!(parse("/var/log/pods/bad/nginx/0.log"), None);
        assert_eq!(parse("/var/log/other/a_b_c/nginx/0.log"), None);
    }

    #[test]
    fn docker_paths_live_and_rotated() {
        let id = "4b825dc642cb6eb9a060e54bf8d69288fbee4904aaaabbbbccccddddeeeeffff";
        let want = Some(LogPath::Docker { id: id.into() });
        let base = format!("/var/lib/docker/containers/{id}/{id}-json.log");
        assert_eq!(parse(&base), want);
        assert_eq!(parse(&format!("{base}.1")), want);
        assert_eq!(parse(&format!("{base}.1.gz")), None);
        assert_eq!(
            parse(&format!("/var/lib/docker/containers/{id}/config.v2.json")),
            None
        );
    }
}
