//! A minimal blocking HTTP/1.1 client with keep-alive: one POST at a time
//! per connection, which is all an IO thread needs.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Where batches are POSTed: `http://host:port/path`.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    host: String,
    port: u16,
    path: String,
}

impl Endpoint {
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("endpoint `{url}` must start with http:// (e.g. http://127.0.0.1:8088/ingest)")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
                Ok(p) => (h, p),
                Err(_) => return Err(format!("endpoint `{url}` has an invalid port `{p}`")),
            },
            _ => (authority, 80),
        };
        if host.is_empty() {
            return Err(format!("endpoint `{url}` has no host"));
        }
        Ok(Self {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            path: path.to_string(),
        })
    }
}

/// What the server answered.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    /// `Retry-After` in seconds, when given as a number.
    pub retry_after: Option<u64>,
    /// The start of the body, for error messages.
    pub body: String,
}

/// One keep-alive connection (opened on demand).
pub(crate) struct Client {
    endpoint: Endpoint,
    /// Request headers other than the length.
    head: String,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
}

impl Client {
    pub(crate) fn new(
        endpoint: Endpoint,
        content_encoding: Option<&str>,
        bearer_token: Option<&str>,
        timeout: Duration,
    ) -> Self {
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/x-ndjson\r\nUser-Agent: petrel-producer/{}\r\n",
            endpoint.path,
            endpoint.host,
            endpoint.port,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(e) = content_encoding {
            head.push_str(&format!("Content-Encoding: {e}\r\n"));
        }
        if let Some(t) = bearer_token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        Self {
            endpoint,
            head,
            timeout,
            conn: None,
        }
    }

    fn connect(&self) -> io::Result<BufReader<TcpStream>> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
        for addr in (self.endpoint.host.as_str(), self.endpoint.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, self.timeout.min(Duration::from_secs(5))) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(self.timeout))?;
                    s.set_write_timeout(Some(self.timeout))?;
                    return Ok(BufReader::with_capacity(8 << 10, s));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// POSTs `body`. A kept-alive connection the server closed meanwhile
    /// (no answer at all) is replaced once: the server saw no request.
    pub(crate) fn post(&mut self, body: &[u8]) -> io::Result<Response> {
        let reused = self.conn.is_some();
        match self.try_post(body) {
            Err(e) if reused && e.kind() == io::ErrorKind::ConnectionAborted => self.try_post(body),
            r => r,
        }
    }

    fn try_post(&mut self, body: &[u8]) -> io::Result<Response> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect()?,
        };
        let mut head = String::with_capacity(self.head.len() + 32);
        head.push_str(&self.head);
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let s = conn.get_mut();
        let sent = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
        if let Err(e) = sent {
            // A dead kept-alive connection shows up as a reset or a broken pipe.
            return Err(match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    io::Error::new(io::ErrorKind::ConnectionAborted, e)
                }
                _ => e,
            });
        }
        let (resp, keep) = read_response(&mut conn)?;
        if keep {
            self.conn = Some(conn);
        }
        Ok(resp)
    }
}

fn read_response(conn: &mut BufReader<TcpStream>) -> io::Result<(Response, bool)> {
    let mut line = String::new();
    let n = match conn.read_line(&mut line) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
        Err(e) => return Err(e),
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the connection closed before an answer",
        ));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("not an HTTP status line: {:?}", line.trim_end())))?;
    let mut keep = !line.starts_with("HTTP/1.0");
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut retry_after = None;
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(bad("the connection closed inside the headers".into()));
        }
        let h = line.trim_end();
        if h.is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse()
                    .map_err(|_| bad("bad Content-Length".into()))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                keep = false;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                keep = true;
            }
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = value.parse().ok();
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            conn.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad("bad chunk size".into()))?;
            if size == 0 {
                // Trailers end with an empty line.
                loop {
                    line.clear();
                    if conn.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            read_n(conn, size, &mut body)?;
            line.clear();
            conn.read_line(&mut line)?;
        }
    } else if let Some(n) = length {
        read_n(conn, n, &mut body)?;
    } else {
        keep = false;
        conn.take(64 << 10).read_to_end(&mut body)?;
    }
    body.truncate(300);
    Ok((
        Response {
            status,
            retry_after,
            body: String::from_utf8_lossy(&body).trim().to_string(),
        },
        keep,
    ))
}

/// Reads `n` bytes, keeping only the first few hundred.
fn read_n(conn: &mut BufReader<TcpStream>, n: usize, keep: &mut Vec<u8>) -> io::Result<()> {
    let mut left = n;
    let mut buf = [0u8; 4096];
    while left > 0 {
        let want = left.min(buf.len());
        conn.read_exact(&mut buf[..want])?;
        if keep.len() < 300 {
            keep.extend_from_slice(&buf[..want]);
        }
        left -= want;
    }
    Ok(())
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let e = Endpoint::parse("http://127.0.0.1:8088/ingest").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("127.0.0.1", 8088, "/ingest")
        );
        let e = Endpoint::parse("http://localhost").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("localhost", 80, "/")
        );
        let e = Endpoint::parse("http://[::1]:9000/x").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        assert!(Endpoint::parse("https://x/").is_err());
        assert!(Endpoint::parse("http://x:y/").is_err());
    }

    #[test]
    fn keep_alive_chunked_and_retry_after() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            for answer in [
                "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"accepted\":1}".to_string(),
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfull\r\n0\r\n\r\n".to_string(),
            ] {
                let mut len = 0;
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        len = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                assert_eq!(body, b"{}\n");
                w.write_all(answer.as_bytes()).unwrap();
            }
        });
        let ep = Endpoint::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let mut c = Client::new(ep, None, None, Duration::from_secs(10));
        let r = c.post(b"{}\n").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "{\"accepted\":1}"));
        let r = c.post(b"{}\n").unwrap();
        assert_eq!(
            (r.status, r.retry_after, r.body.as_str()),
            (503, Some(3), "full")
        );
        server.join().unwrap();
    }
}
