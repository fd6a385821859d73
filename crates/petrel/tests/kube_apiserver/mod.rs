//! A real Kubernetes API server on 127.0.0.1 for the tests: etcd (Debian's
//! `etcd-server`) and `kube-apiserver` v1.34.4 (built by
//! `scripts/kube-apiserver.sh` into `.cache/kube-apiserver/bin`), both
//! started through [`ServerProcess`], with certificates and the service
//! account signing key made by openssl in the server's own directory, an
//! admin token (`system:masters`) in a token file, and RBAC on. No
//! controller runs: the tests create owner chains themselves.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::server::{cached_binary, free_port, ServerProcess};

/// The admin's bearer token (group `system:masters`).
pub const ADMIN_TOKEN: &str = "petrel-test-admin-token";

/// etcd and kube-apiserver, killed when dropped.
pub struct KubeApiServer {
    etcd: ServerProcess,
    apiserver: ServerProcess,
    /// The API server's HTTPS port.
    pub port: u16,
    etcd_port: u16,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (scripts/install-test-tools.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One HTTPS request to the API server: (status, JSON body or Null).
pub fn request(
    port: u16,
    ca: &Path,
    method: &str,
    path: &str,
    token: &str,
    body: Option<(&str, &serde_json::Value)>,
) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ca = std::fs::read(ca).expect("ca.crt");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("ca pem"))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client");
        let url = format!("https://127.0.0.1:{port}{path}");
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut rb = client.request(method, url).bearer_auth(token);
        if let Some((content_type, b)) = body {
            rb = rb.header("Content-Type", content_type).body(b.to_string());
        }
        match rb.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                (
                    status,
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
                )
            }
            Err(e) => (0, serde_json::Value::String(e.to_string())),
        }
    })
}

impl KubeApiServer {
    /// Starts etcd, makes the certificates and keys, starts the API
    /// server and waits until `/readyz` answers.
    pub fn start() -> KubeApiServer {
        let etcd_port = free_port();
        let mut etcd = ServerProcess::new("etcd", "petrel-etcd-", "etcd.log");
        let peer = free_port();
        let mut cmd = Command::new("etcd");
        cmd.arg("--name=petrel-test")
            .arg(format!("--data-dir={}", etcd.dir().join("data").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!(
                "--initial-cluster=petrel-test=http://127.0.0.1:{peer}"
            ))
            .arg("--listen-metrics-urls=")
            .arg("--quota-backend-bytes=1073741824");
        etcd.start(
            cmd,
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                std::net::TcpStream::connect(("127.0.0.1", etcd_port))
                    .map(|mut s| {
                        use std::io::{Read, Write};
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
                        let mut b = String::new();
                        let _ = s.read_to_string(&mut b);
                        b.contains("\"health\":\"true\"")
                    })
                    .unwrap_or(false)
            },
        );
        let apiserver =
            ServerProcess::new("kube-apiserver", "petrel-kube-apiserver-", "apiserver.log");
        let d = apiserver.dir().to_path_buf();
        openssl(
            &d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=petrel-test-ca",
            ],
        );
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            &d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=kube-apiserver",
            ],
        );
        openssl(
            &d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        // A client certificate of the admin group, for the kubeconfig tests.
        std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        openssl(
            &d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "client.key",
                "-out",
                "client.csr",
                "-subj",
                "/O=system:masters/CN=petrel-client",
            ],
        );
        openssl(
            &d,
            &[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "client.crt",
                "-days",
                "2",
                "-extfile",
                "client.ext",
            ],
        );
        openssl(&d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(&d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        std::fs::write(
            d.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n"),
        )
        .unwrap();
        let mut s = KubeApiServer {
            etcd,
            apiserver,
            port: free_port(),
            etcd_port,
        };
        s.start_apiserver();
        s
    }

    /// The API server's directory (certificates, keys, log).
    pub fn dir(&self) -> &Path {
        self.apiserver.dir()
    }

    /// The CA that signed the server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir().join("ca.crt")
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Starts (again, after [`KubeApiServer::stop_apiserver`]) the API
    /// server on its port, over the same etcd.
    pub fn start_apiserver(&mut self) {
        let d = self.dir().to_path_buf();
        let mut cmd = Command::new(cached_binary(
            "kube-apiserver/bin/kube-apiserver",
            "scripts/kube-apiserver.sh",
        ));
        let f = |name: &str| d.join(name).display().to_string();
        cmd.arg(format!(
            "--etcd-servers=http://127.0.0.1:{}",
            self.etcd_port
        ))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg(format!("--secure-port={}", self.port))
        .arg(format!("--tls-cert-file={}", f("server.crt")))
        .arg(format!("--tls-private-key-file={}", f("server.key")))
        .arg(format!("--client-ca-file={}", f("ca.crt")))
        .arg(format!("--token-auth-file={}", f("tokens.csv")))
        .arg("--authorization-mode=RBAC")
        .arg("--anonymous-auth=false")
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg(format!("--service-account-key-file={}", f("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            f("sa.key")
        ))
        // Documentation addresses: nothing is ever sent to them.
        .arg("--service-cluster-ip-range=198.51.100.0/24")
        // No controller manager creates the `default` service
        // accounts that this admission plugin requires of pods.
        .arg("--disable-admission-plugins=ServiceAccount")
        .arg(format!("--cert-dir={}", f("certs")))
        .arg("--enable-priority-and-fairness=false")
        .arg("--profiling=false")
        .arg("--v=1");
        let (port, ca) = (self.port, self.ca());
        self.apiserver.start(
            cmd,
            Duration::from_secs(180),
            Duration::from_millis(500),
            || request(port, &ca, "GET", "/readyz", ADMIN_TOKEN, None).0 == 200,
        );
    }

    /// Stops the API server (etcd keeps the data).
    pub fn stop_apiserver(&mut self) {
        self.apiserver.stop(Duration::from_secs(10));
    }

    /// The API server's log (its last 4 KiB).
    pub fn log(&self) -> String {
        self.apiserver.log()
    }

    /// A request as the admin.
    pub fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        request(
            self.port,
            &self.ca(),
            method,
            path,
            ADMIN_TOKEN,
            body.map(|b| (content_type, b)),
        )
    }

    /// Creates an object as the admin (POST to `path`); fails the test
    /// unless the server created it. Returns it (with its uid).
    pub fn create(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let (st, v) = self.admin("POST", path, Some(&body));
        assert!(
            st == 201 || st == 200,
            "POST {path}: {st} {v}\nbody: {body}"
        );
        v
    }

    /// Merge-patches an object as the admin.
    pub fn patch(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let (st, v) = self.admin("PATCH", path, Some(&body));
        assert_eq!(st, 200, "PATCH {path}: {v}");
        v
    }

    /// A kubeconfig in `dir` for this server: with `token`, or the admin
    /// client certificate when `None`.
    pub fn kubeconfig(&self, dir: &Path, token: Option<&str>) -> PathBuf {
        let user = match token {
            Some(t) => format!("    token: {t}\n"),
            None => format!(
                "    client-certificate: {}\n    client-key: {}\n",
                self.dir().join("client.crt").display(),
                self.dir().join("client.key").display()
            ),
        };
        let p = dir.join("kubeconfig");
        std::fs::write(
            &p,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: test\n  user:\n{user}",
                self.url(),
                self.ca().display()
            ),
        )
        .unwrap();
        p
    }
}
