//! Real syslog receivers for the syslog sink's tests: rsyslogd (unpacked
//! into `.cache/rsyslog` with its TLS driver by
//! `scripts/install-syslog-tools.sh`) and syslog-ng (Debian's
//! syslog-ng-core, installed by the same script). Each runs in the
//! foreground with its own configuration, pid file and work directory,
//! unprivileged ports from `free_port`, started and stopped through
//! [`ServerProcess`]. Each writes every message it receives to a file, one
//! line per message with every header field, `|`-separated:
//!
//! `PRI|FACILITY|SEVERITY|TIME|HOSTNAME|APP-NAME|PROCID|MSGID|SD|MSG`

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::server::{cached_binary, free_port, ServerProcess};

/// Which receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// rsyslogd 8.
    Rsyslog,
    /// syslog-ng 3.
    SyslogNg,
}

/// How the receiver listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// UDP; syslog-ng needs to know whether RFC 5424 comes (its
    /// `syslog()` driver) or RFC 3164 (`network()`); rsyslog takes both.
    Udp { rfc5424: bool },
    /// TCP; `octet` for RFC 6587 octet counting (syslog-ng needs to know;
    /// rsyslog takes both).
    Tcp { octet: bool },
    /// TLS with the receiver's certificate (octet counting).
    Tls,
}

/// A receiver and the file it writes.
pub struct Receiver {
    server: ServerProcess,
    kind: Kind,
    listen: Listen,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The output file.
    pub out: PathBuf,
    cmd: fn(&Receiver) -> Command,
}

/// A certificate authority and a server certificate for `localhost`
/// signed by it, made with openssl in `dir`: (ca, cert, key).
pub fn make_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let st = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("openssl is needed");
        assert!(st.success(), "openssl {args:?} failed");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=petrel test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

fn rsyslogd() -> PathBuf {
    if Path::new("/usr/sbin/rsyslogd").exists() {
        return "/usr/sbin/rsyslogd".into();
    }
    cached_binary(
        "rsyslog/usr/sbin/rsyslogd",
        "scripts/install-syslog-tools.sh",
    )
}

fn syslog_ng() -> PathBuf {
    let p = PathBuf::from("/usr/sbin/syslog-ng");
    assert!(
        p.exists(),
        "/usr/sbin/syslog-ng missing: run scripts/install-syslog-tools.sh"
    );
    p
}

impl Receiver {
    /// Starts `kind` listening as `listen` on a free port; TLS uses the
    /// certificate made by [`make_certs`] in `certs`.
    pub fn start(kind: Kind, listen: Listen, certs: Option<&Path>) -> Receiver {
        let name = match kind {
            Kind::Rsyslog => "rsyslogd",
            Kind::SyslogNg => "syslog-ng",
        };
        let server = ServerProcess::new(name, &format!("petrel-{name}-"), "server.log");
        let port = free_port();
        let out = server.dir().join("received.log");
        let dir = server.dir().to_path_buf();
        let conf = match kind {
            Kind::Rsyslog => rsyslog_conf(&dir, listen, port, &out, certs),
            Kind::SyslogNg => syslog_ng_conf(listen, port, &out, certs),
        };
        let conf_path = dir.join(match kind {
            Kind::Rsyslog => "rsyslog.conf",
            Kind::SyslogNg => "syslog-ng.conf",
        });
        std::fs::write(&conf_path, conf).unwrap();
        let mut r = Receiver {
            server,
            kind,
            listen,
            port,
            out,
            cmd: match kind {
                Kind::Rsyslog => rsyslog_cmd,
                Kind::SyslogNg => syslog_ng_cmd,
            },
        };
        r.restart();
        r
    }

    /// Starts the receiver again (same port, same output file, appended).
    pub fn restart(&mut self) {
        let cmd = (self.cmd)(self);
        let port = self.port;
        let udp = matches!(self.listen, Listen::Udp { .. });
        let pid = self.server.dir().join("server.pid");
        let _ = std::fs::remove_file(&pid);
        self.server.start(
            cmd,
            Duration::from_secs(30),
            Duration::from_millis(50),
            move || {
                if udp {
                    // Nothing to connect to: ready once the pid file says
                    // it finished starting.
                    pid.exists() && udp_bound(port)
                } else {
                    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                }
            },
        );
    }

    /// Stops it (SIGTERM: it closes its connections and flushes its file).
    pub fn stop(&mut self) {
        self.server.stop(Duration::from_secs(10));
    }

    /// The received lines, split into their fields.
    pub fn records(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(10, '|').map(str::to_string).collect())
            .collect()
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        self.server.log()
    }
}

/// Whether something listens on UDP `port` of 127.0.0.1 (`/proc/net/udp`).
fn udp_bound(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/udp")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(&want))
        })
        .unwrap_or(false)
}

fn rsyslog_conf(dir: &Path, listen: Listen, port: u16, out: &Path, certs: Option<&Path>) -> String {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let input = match listen {
        Listen::Udp { .. } => format!(
            "module(load=\"imudp\")\ninput(type=\"imudp\" address=\"127.0.0.1\" port=\"{port}\" ruleset=\"r\")"
        ),
        Listen::Tcp { .. } => format!(
            "module(load=\"imtcp\")\ninput(type=\"imtcp\" address=\"127.0.0.1\" port=\"{port}\" ruleset=\"r\")"
        ),
        Listen::Tls => {
            let c = certs.expect("certificates for TLS");
            format!(
                "global(DefaultNetstreamDriverCAFile=\"{ca}\" DefaultNetstreamDriverCertFile=\"{cert}\" DefaultNetstreamDriverKeyFile=\"{key}\")\n\
                 module(load=\"imtcp\" StreamDriver.Name=\"ossl\" StreamDriver.Mode=\"1\" StreamDriver.AuthMode=\"anon\")\n\
                 input(type=\"imtcp\" address=\"127.0.0.1\" port=\"{port}\" ruleset=\"r\")",
                ca = c.join("ca.pem").display(),
                cert = c.join("server.pem").display(),
                key = c.join("server.key").display(),
            )
        }
    };
    format!(
        "# A private rsyslogd for the syslog sink tests (no imuxsock, no /var paths).\n\
         global(workDirectory=\"{work}\" maxMessageSize=\"64k\")\n\
         {input}\n\
         template(name=\"fields\" type=\"string\" string=\"%pri%|%syslogfacility%|%syslogseverity%|%timereported:::date-rfc3339%|%hostname%|%app-name%|%procid%|%msgid%|%structured-data%|%msg%\\n\")\n\
         ruleset(name=\"r\") {{ action(type=\"omfile\" file=\"{out}\" template=\"fields\") }}\n",
        work = work.display(),
        out = out.display(),
    )
}

fn rsyslog_cmd(r: &Receiver) -> Command {
    let bin = rsyslogd();
    let mut cmd = Command::new(&bin);
    cmd.arg("-n")
        .arg("-f")
        .arg(r.server.dir().join("rsyslog.conf"))
        .arg("-i")
        .arg(r.server.dir().join("server.pid"))
        .env("TZ", "UTC");
    if bin != Path::new("/usr/sbin/rsyslogd") {
        // The unpacked rsyslogd needs its module directory named.
        let lib = bin.parent().and_then(Path::parent).unwrap().join("lib");
        let moddir = std::fs::read_dir(&lib)
            .unwrap()
            .flatten()
            .map(|e| e.path().join("rsyslog"))
            .find(|p| p.join("imtcp.so").exists())
            .expect("rsyslog modules (scripts/install-syslog-tools.sh)");
        cmd.arg("-M").arg(moddir);
    }
    cmd
}

fn syslog_ng_conf(listen: Listen, port: u16, out: &Path, certs: Option<&Path>) -> String {
    let version = Command::new(syslog_ng())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("Config version:"))
        .unwrap_or("3.35")
        .trim()
        .to_string();
    let source = match listen {
        Listen::Udp { rfc5424: true } => {
            format!("syslog(ip(\"127.0.0.1\") port({port}) transport(\"udp\"));")
        }
        Listen::Udp { rfc5424: false } => {
            format!("network(ip(\"127.0.0.1\") port({port}) transport(\"udp\"));")
        }
        Listen::Tcp { octet: true } => {
            format!("syslog(ip(\"127.0.0.1\") port({port}) transport(\"tcp\"));")
        }
        // Newline framing: the network() driver, RFC 3164 or (with the
        // flag) RFC 5424 per line.
        Listen::Tcp { octet: false } => {
            format!("network(ip(\"127.0.0.1\") port({port}) transport(\"tcp\"));")
        }
        Listen::Tls => {
            let c = certs.expect("certificates for TLS");
            format!(
                "syslog(ip(\"127.0.0.1\") port({port}) transport(\"tls\") tls(key-file(\"{}\") cert-file(\"{}\") peer-verify(optional-untrusted)));",
                c.join("server.key").display(),
                c.join("server.pem").display()
            )
        }
    };
    format!(
        "@version: {version}\n\
         # A private syslog-ng for the syslog sink tests (no system() or /dev/log source).\n\
         options {{ keep-hostname(yes); use-dns(no); frac-digits(6); ts-format(iso); log-msg-size(65536); }};\n\
         source s {{ {source} }};\n\
         destination d {{ file(\"{out}\" template(\"${{PRI}}|${{FACILITY_NUM}}|${{LEVEL_NUM}}|${{ISODATE}}|${{HOST}}|${{PROGRAM}}|${{PID}}|${{MSGID}}|${{SDATA}}|${{MSG}}\\n\")); }};\n\
         log {{ source(s); destination(d); flags(flow-control); }};\n",
        out = out.display()
    )
}

fn syslog_ng_cmd(r: &Receiver) -> Command {
    let d = r.server.dir();
    let mut cmd = Command::new(syslog_ng());
    cmd.arg("-F")
        .arg("-f")
        .arg(d.join("syslog-ng.conf"))
        .arg("--persist-file")
        .arg(d.join("syslog-ng.persist"))
        .arg("--pidfile")
        .arg(d.join("server.pid"))
        .arg("--control")
        .arg(d.join("syslog-ng.ctl"))
        .env("TZ", "UTC");
    cmd
}
