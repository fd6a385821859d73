//! Where the API server is and how to prove who we are: the pod's service
//! account (in-cluster) or a kubeconfig (outside a cluster).
//!
//! Only what a read-only metadata client needs is read: the server, its
//! CA, a bearer token (or token file), a client certificate and key, and
//! `insecure-skip-tls-verify`. Exec plugins and auth providers are not
//! run: an agent must not execute what a config file names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use petrel_core::config::{parse_yaml, ConfigErrors, Map, Node};

/// The default mount of the pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Overrides [`SERVICE_ACCOUNT_DIR`] (tests, unusual mounts).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "PETREL_KUBERNETES_SERVICEACCOUNT_DIR";

/// Where the bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// None: a client certificate (or nothing) authenticates.
    None,
    /// A fixed token (kubeconfig `token`).
    Static(Arc<str>),
    /// A file read again before each request, since kubelet rotates the
    /// projected service account token (about hourly) by rewriting it.
    File(PathBuf),
}

/// How to reach and authenticate to the API server.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// `https://host:port`, without a trailing slash.
    pub server: String,
    /// PEM of the authorities that sign the server's certificate; `None`:
    /// the built-in web roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate followed by its key, PEM.
    pub identity_pem: Option<Vec<u8>>,
    /// `insecure-skip-tls-verify`.
    pub insecure: bool,
    /// The bearer token.
    pub token: Token,
    /// Where these came from, for messages.
    pub origin: String,
}

impl Token {
    /// The `Authorization` header value, if any; a token file that cannot
    /// be read is an error (the request would only be refused).
    pub fn header(&self) -> Result<Option<String>, String> {
        match self {
            Token::None => Ok(None),
            Token::Static(t) => Ok(Some(format!("Bearer {t}"))),
            Token::File(p) => match std::fs::read_to_string(p) {
                Ok(t) if !t.trim().is_empty() => Ok(Some(format!("Bearer {}", t.trim()))),
                Ok(_) => Err(format!("token file {} is empty", p.display())),
                Err(e) => Err(format!("token file {}: {e}", p.display())),
            },
        }
    }
}

/// The service account directory: [`SERVICE_ACCOUNT_DIR_ENV`] or the
/// default.
pub fn service_account_dir() -> PathBuf {
    std::env::var_os(SERVICE_ACCOUNT_DIR_ENV)
        .filter(|s| !s.is_empty())
        .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from)
}

/// True when the agent runs in a pod with a service account token:
/// `KUBERNETES_SERVICE_HOST` is set and the token file exists.
pub fn in_cluster_available() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty())
        && service_account_dir().join("token").is_file()
}

/// The first existing file of `$KUBECONFIG` (a `:`-separated list).
pub fn kubeconfig_from_env() -> Option<PathBuf> {
    let v = std::env::var_os("KUBECONFIG")?;
    std::env::split_paths(&v).find(|p| p.is_file())
}

/// The in-cluster credentials: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`,
/// the service account's CA and its token file.
pub fn in_cluster() -> Result<Credentials, String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .map_err(|_| "KUBERNETES_SERVICE_HOST is not set".to_string())?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let dir = service_account_dir();
    let ca_path = dir.join("ca.crt");
    let ca_pem = std::fs::read(&ca_path).map_err(|e| format!("{}: {e}", ca_path.display()))?;
    // An IPv6 service address needs brackets in a URL.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    Ok(Credentials {
        server: format!("https://{host}:{port}"),
        ca_pem: Some(ca_pem),
        identity_pem: None,
        insecure: false,
        token: Token::File(dir.join("token")),
        origin: format!("in-cluster service account ({})", dir.display()),
    })
}

/// Reads a kubeconfig: its current context's cluster and user. Problems
/// name the file, line and key.
pub fn kubeconfig(path: &Path) -> Result<Credentials, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: Arc<str> = Arc::from(path.display().to_string());
    let raw = parse_yaml(&file, &text).map_err(|e| e.to_string())?;
    let errs = ConfigErrors::new();
    let root = Node::root(&file, &raw, &errs);
    let out = read_kubeconfig(root, path.parent().unwrap_or(Path::new(".")));
    if !errs.is_empty() {
        let all: Vec<String> = errs.into_vec().iter().map(|e| e.to_string()).collect();
        return Err(all.join("; "));
    }
    out.ok_or_else(|| format!("{}: no usable cluster and user", path.display()))
}

/// The entry `name` of the list at `key` (`clusters`, `users`,
/// `contexts`), as its inner mapping (`cluster`, `user`, `context`).
fn named<'a>(root: &Map<'a>, key: &str, inner: &str, name: &str) -> Option<Map<'a>> {
    let list = root.get(key)?;
    for item in list.as_list() {
        let Some(m) = item.as_map_quiet() else {
            continue;
        };
        if m.get("name").and_then(|n| n.as_str()) == Some(name) {
            let Some(inner_node) = m.get(inner) else {
                m.node()
                    .error(format!("`{key}` entry `{name}` has no `{inner}`"));
                return None;
            };
            let Some(inner_map) = inner_node.as_map_quiet() else {
                inner_node.error(format!("`{inner}` must be a mapping"));
                return None;
            };
            return Some(inner_map);
        }
    }
    root.node()
        .error(format!("no entry named `{name}` under `{key}`"));
    None
}

/// A file or inline base64 value: `<key>` names a file (relative to the
/// kubeconfig), `<key>-data` holds the bytes in base64.
fn file_or_data(m: &Map<'_>, key: &str, dir: &Path) -> Option<Vec<u8>> {
    if let Some(n) = m.get(&format!("{key}-data")) {
        let s = n.as_str()?;
        match base64::engine::general_purpose::STANDARD.decode(s.trim()) {
            Ok(b) => return Some(b),
            Err(e) => {
                n.error(format!("`{key}-data` is not base64: {e}"));
                return None;
            }
        }
    }
    let n = m.get(key)?;
    let p = dir.join(n.as_str()?);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(e) => {
            n.error(format!("`{key}`: {}: {e}", p.display()));
            None
        }
    }
}

fn read_kubeconfig(root: Node<'_>, dir: &Path) -> Option<Credentials> {
    let Some(root) = root.as_map_quiet() else {
        root.error("a kubeconfig must be a mapping");
        return None;
    };
    let current = root.required("current-context", "my-context")?;
    let context_name = current.as_str()?;
    let ctx = named(&root, "contexts", "context", context_name)?;
    let cluster_name = ctx.required("cluster", "my-cluster")?.as_str()?;
    let cluster = named(&root, "clusters", "cluster", cluster_name)?;
    let server_node = cluster.required("server", "https://127.0.0.1:6443")?;
    let server = server_node.as_str()?.trim_end_matches('/').to_string();
    if !server.starts_with("https://") && !server.starts_with("http://") {
        server_node.error(format!("`server` must be an http(s) URL, found `{server}`"));
        return None;
    }
    let insecure = cluster.bool("insecure-skip-tls-verify").unwrap_or(false);
    let ca_pem = file_or_data(&cluster, "certificate-authority", dir);
    let (mut token, mut identity_pem) = (Token::None, None);
    if let Some(user_name) = ctx.get("user").and_then(|n| n.as_str()) {
        let user = named(&root, "users", "user", user_name)?;
        if let Some(t) = user.get("token").and_then(|n| n.as_str()) {
            token = Token::Static(Arc::from(t.trim()));
        } else if let Some(n) = user.get("tokenFile") {
            token = Token::File(dir.join(n.as_str()?));
        }
        let cert = file_or_data(&user, "client-certificate", dir);
        let key = file_or_data(&user, "client-key", dir);
        match (cert, key) {
            (Some(mut c), Some(k)) => {
                c.push(b'\n');
                c.extend(k);
                identity_pem = Some(c);
            }
            (None, None) => {}
            _ => {
                user.node().error(
                    "`client-certificate` and `client-key` go together (a client certificate and its key)",
                );
                return None;
            }
        }
        for unsupported in ["exec", "auth-provider"] {
            if let Some(n) = user.get(unsupported) {
                n.error(format!(
                    "`{unsupported}` is not supported (the agent runs no credential plugin); use a token, a token file or a client certificate"
                ));
                return None;
            }
        }
    }
    Some(Credentials {
        server,
        ca_pem,
        identity_pem,
        insecure,
        token,
        origin: format!("kubeconfig {} (context {context_name})", root.node().file()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_current_context_with_inline_and_file_data() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), b"CA").unwrap();
        std::fs::write(dir.path().join("tok"), b"file-token\n").unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             contexts:\n- name: a\n  context: {cluster: c1, user: u1}\n- name: b\n  context: {cluster: c2, user: u2}\n\
             clusters:\n- name: c1\n  cluster: {server: 'https://one'}\n- name: c2\n  cluster:\n    server: https://127.0.0.1:6443/\n    certificate-authority: ca.pem\n\
             users:\n- name: u1\n  user: {token: t1}\n- name: u2\n  user:\n    tokenFile: tok\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
        )
        .unwrap();
        let c = kubeconfig(&cfg).unwrap();
        assert_eq!(c.server, "https://127.0.0.1:6443");
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(c.identity_pem.as_deref(), Some(&b"CERT\nKEY"[..]));
        assert_eq!(c.token, Token::File(dir.path().join("tok")));
        assert_eq!(
            c.token.header().unwrap().as_deref(),
            Some("Bearer file-token")
        );
        assert!(!c.insecure);
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config");
        std::fs::write(
            &cfg,
            "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://x', insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user:\n    exec: {command: aws}\n",
        )
        .unwrap();
        let e = kubeconfig(&cfg).unwrap_err();
        assert!(e.contains("config:11"), "{e}");
        assert!(e.contains("`exec` is not supported"), "{e}");
        std::fs::write(&cfg, "current-context: a\ncontexts: []\n").unwrap();
        let e = kubeconfig(&cfg).unwrap_err();
        assert!(e.contains("no entry named `a` under `contexts`"), "{e}");
    }
}
