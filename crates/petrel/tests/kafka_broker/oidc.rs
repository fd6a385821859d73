//! A small OIDC token endpoint for the OAUTHBEARER tests: answers the
//! OAuth 2.0 client credentials grant (`POST`, HTTP basic authentication
//! of the client) with a JWT signed ES256 by its own key, whose public half
//! it writes as a JWKS file for the broker's
//! `OAuthBearerValidatorCallbackHandler`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

/// The key id in the JWKS and in the tokens' headers.
const KID: &str = "petrel-test";

/// A running token endpoint (a thread serving until the process ends).
pub struct TokenEndpoint {
    /// `http://127.0.0.1:PORT/token`.
    pub url: String,
    /// Tokens handed out so far.
    pub issued: Arc<AtomicUsize>,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

impl TokenEndpoint {
    /// Starts the endpoint for client `client_id`/`secret` and writes the
    /// JWKS of its key to `jwks`.
    pub fn start(jwks: &Path, client_id: &str, secret: &str) -> TokenEndpoint {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("key");
        // Uncompressed point: 0x04, x, y.
        let public = key.public_key().as_ref();
        let (x, y) = (&public[1..33], &public[33..65]);
        std::fs::write(
            jwks,
            format!(
                r#"{{"keys":[{{"kty":"EC","crv":"P-256","use":"sig","alg":"ES256","kid":"{KID}","x":"{}","y":"{}"}}]}}"#,
                b64(x),
                b64(y)
            ),
        )
        .expect("write jwks");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind token endpoint");
        let url = format!(
            "http://127.0.0.1:{}/token",
            listener.local_addr().expect("addr").port()
        );
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"))
        );
        let issued = Arc::new(AtomicUsize::new(0));
        let count = issued.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { continue };
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let mut r = BufReader::new(match s.try_clone() {
                    Ok(c) => c,
                    Err(_) => continue,
                });
                let mut auth = String::new();
                let mut len = 0usize;
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        match k.trim().to_ascii_lowercase().as_str() {
                            "authorization" => auth = v.trim().to_string(),
                            "content-length" => len = v.trim().parse().unwrap_or(0),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0; len.min(1 << 16)];
                let _ = r.read_exact(&mut body);
                let body = String::from_utf8_lossy(&body);
                let (status, answer) = if auth != expected {
                    (
                        "401 Unauthorized",
                        r#"{"error":"invalid_client"}"#.to_string(),
                    )
                } else if !body.contains("grant_type=client_credentials") {
                    (
                        "400 Bad Request",
                        r#"{"error":"unsupported_grant_type"}"#.to_string(),
                    )
                } else {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    let header =
                        b64(format!(r#"{{"alg":"ES256","typ":"JWT","kid":"{KID}"}}"#).as_bytes());
                    let claims = b64(
                        format!(
                            r#"{{"sub":"petrel-client","iss":"petrel-test-idp","iat":{now},"exp":{},"scope":"kafka"}}"#,
                            now + 3600
                        )
                        .as_bytes(),
                    );
                    let input = format!("{header}.{claims}");
                    let sig = key
                        .sign(&SystemRandom::new(), input.as_bytes())
                        .expect("sign");
                    count.fetch_add(1, Ordering::SeqCst);
                    (
                        "200 OK",
                        format!(
                            r#"{{"access_token":"{input}.{}","token_type":"bearer","expires_in":3600}}"#,
                            b64(sig.as_ref())
                        ),
                    )
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        TokenEndpoint { url, issued }
    }
}
