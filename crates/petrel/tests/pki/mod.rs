//! Certificates for the TLS tests, made with the real `openssl` (and
//! `keytool` for the Java trust store): an authority, server certificates
//! for 127.0.0.1, client certificates, an expired one, and a second
//! authority nobody trusts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The password of the PKCS#12 stores made here.
pub const STORE_PASSWORD: &str = "petrel-test";

fn run(dir: &Path, args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e} (openssl and keytool are needed)", args[0]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority in a directory: `NAME.pem`, `NAME.key`.
pub struct Ca {
    /// Where its files and the certificates it signs go.
    pub dir: PathBuf,
    /// Its name (file stem).
    pub name: String,
}

/// A certificate and its key (PEM, the key PKCS#8 unencrypted).
#[derive(Clone, Debug)]
pub struct Cert {
    /// The certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// Its serial number, lower-case hex as `openssl` prints it.
    pub serial: String,
}

impl Ca {
    /// A new authority `name` in `dir` (EC P-256, ten years).
    pub fn new(dir: &Path, name: &str) -> Ca {
        std::fs::create_dir_all(dir).expect("pki dir");
        run(
            dir,
            &[
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "3650",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
        Ca {
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    /// The authority's certificate.
    pub fn pem(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// A certificate `name` for `cn`, valid for `days`, with serial
    /// `serial` (hex) and, for a server, `subjectAltName=IP:127.0.0.1`.
    pub fn issue(&self, name: &str, cn: &str, serial: u64, server: bool) -> Cert {
        self.issue_days(name, cn, serial, server, 365)
    }

    /// Like [`Ca::issue`], valid for `days`.
    pub fn issue_days(&self, name: &str, cn: &str, serial: u64, server: bool, days: u32) -> Cert {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.pem");
        let mut req = vec![
            "openssl".to_string(),
            "req".into(),
            "-new".into(),
            "-newkey".into(),
            "ec".into(),
            "-pkeyopt".into(),
            "ec_paramgen_curve:prime256v1".into(),
            "-nodes".into(),
            "-subj".into(),
            format!("/CN={cn}"),
            "-keyout".into(),
            key.clone(),
            "-out".into(),
            csr.clone(),
        ];
        // Extensions make an X.509 v3 certificate: rustls (webpki)
        // refuses v1 ones, which `openssl x509 -req` makes without them.
        req.push("-addext".into());
        if server {
            req.push("subjectAltName=IP:127.0.0.1,DNS:localhost".into());
        } else {
            req.push("extendedKeyUsage=clientAuth".into());
        }
        let req: Vec<&str> = req.iter().map(String::as_str).collect();
        run(&self.dir, &req);
        let serial_hex = format!("{serial:x}");
        let serial_arg = format!("0x{serial_hex}");
        let ca_pem = format!("{}.pem", self.name);
        let ca_key = format!("{}.key", self.name);
        run(
            &self.dir,
            &[
                "openssl",
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_pem,
                "-CAkey",
                &ca_key,
                "-set_serial",
                &serial_arg,
                "-days",
                &days.to_string(),
                "-copy_extensions",
                "copy",
                "-out",
                &crt,
            ],
        );
        Cert {
            cert: self.dir.join(crt),
            key: self.dir.join(key),
            serial: serial_hex,
        }
    }

    /// A client certificate `name` that expired in 2020.
    pub fn issue_expired(&self, name: &str, cn: &str) -> Cert {
        let dir = &self.dir;
        let db = dir.join(format!("{name}-ca"));
        std::fs::create_dir_all(&db).expect("ca db");
        std::fs::write(db.join("index.txt"), "").expect("index");
        std::fs::write(db.join("serial"), "7E57\n").expect("serial");
        let cnf = db.join("ca.cnf");
        std::fs::write(
            &cnf,
            format!(
                "[ca]\ndefault_ca = t\n[t]\ndatabase = {d}/index.txt\nnew_certs_dir = {d}\nserial = {d}/serial\ndefault_md = sha256\npolicy = any\ncopy_extensions = copy\n[any]\ncommonName = supplied\n",
                d = db.display()
            ),
        )
        .expect("ca.cnf");
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.pem");
        run(
            dir,
            &[
                "openssl",
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        let ca_pem = format!("{}.pem", self.name);
        let ca_key = format!("{}.key", self.name);
        run(
            dir,
            &[
                "openssl",
                "ca",
                "-batch",
                "-notext",
                "-config",
                &cnf.to_string_lossy(),
                "-cert",
                &ca_pem,
                "-keyfile",
                &ca_key,
                "-in",
                &csr,
                "-out",
                &crt,
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
            ],
        );
        Cert {
            cert: dir.join(crt),
            key: dir.join(key),
            serial: "7e57".into(),
        }
    }

    /// A PKCS#12 key store holding `c` and this authority (for a Java
    /// server), password [`STORE_PASSWORD`].
    pub fn keystore(&self, c: &Cert, name: &str) -> PathBuf {
        let out = self.dir.join(format!("{name}.p12"));
        run(
            &self.dir,
            &[
                "openssl",
                "pkcs12",
                "-export",
                "-in",
                &c.cert.to_string_lossy(),
                "-inkey",
                &c.key.to_string_lossy(),
                "-certfile",
                &self.pem().to_string_lossy(),
                "-name",
                name,
                "-out",
                &out.to_string_lossy(),
                "-passout",
                &format!("pass:{STORE_PASSWORD}"),
            ],
        );
        out
    }

    /// A PKCS#12 trust store holding this authority, made by `keytool`.
    pub fn truststore(&self) -> PathBuf {
        let out = self.dir.join(format!("{}-trust.p12", self.name));
        let _ = std::fs::remove_file(&out);
        run(
            &self.dir,
            &[
                "keytool",
                "-importcert",
                "-noprompt",
                "-alias",
                &self.name,
                "-file",
                &self.pem().to_string_lossy(),
                "-keystore",
                &out.to_string_lossy(),
                "-storetype",
                "PKCS12",
                "-storepass",
                STORE_PASSWORD,
            ],
        );
        out
    }
}

/// The serial number of the certificate in PEM file `p` (lower-case hex,
/// no leading zeros).
pub fn serial_of(p: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(p)
        .output()
        .expect("openssl x509");
    let s = String::from_utf8_lossy(&out.stdout);
    s.trim()
        .trim_start_matches("serial=")
        .trim_start_matches('0')
        .to_ascii_lowercase()
}
