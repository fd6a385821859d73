//! Request bodies of the sources that receive over HTTP: decompression by
//! `Content-Encoding` with a bound on the inflated size (a small bomb
//! cannot grow past it), and the message that names what was wrong.

use std::io::Read;

use bytes::Bytes;

/// A `Content-Encoding` the HTTP sources decompress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No compression (`identity` or none).
    Identity,
    /// gzip (one or more members).
    Gzip,
    /// zstd frames.
    Zstd,
    /// The LZ4 frame format (what `lz4 -c` writes).
    Lz4,
}

impl Encoding {
    /// Reads a `Content-Encoding` value among `allowed`; `Err` carries the
    /// value as given, for the answer.
    pub fn parse(value: Option<&str>, allowed: &[Encoding]) -> Result<Encoding, String> {
        let v = value
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let e = match v.as_str() {
            "" | "identity" => Encoding::Identity,
            "gzip" | "x-gzip" => Encoding::Gzip,
            "zstd" => Encoding::Zstd,
            "lz4" => Encoding::Lz4,
            _ => return Err(v),
        };
        if e == Encoding::Identity || allowed.contains(&e) {
            Ok(e)
        } else {
            Err(v)
        }
    }

    /// The name as in the header.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
            Encoding::Zstd => "zstd",
            Encoding::Lz4 => "lz4",
        }
    }
}

/// Why a body could not be decompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inflate {
    /// It inflates beyond the limit.
    TooLarge,
    /// It is not valid data of its encoding.
    Invalid(Encoding),
}

impl Inflate {
    /// What to tell the client.
    pub fn message(self, max: usize) -> String {
        match self {
            Inflate::TooLarge => format!(
                "body larger than max_body_bytes ({max} bytes, after decompression); send smaller batches"
            ),
            Inflate::Invalid(e) => format!(
                "the body is not valid {} data, as its `Content-Encoding: {}` says it is",
                e.name(),
                e.name()
            ),
        }
    }
}

/// Why a request body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// It did not arrive within the time allowed.
    Timeout,
    /// It is larger than the limit.
    TooLarge,
    /// The connection failed while reading it.
    Failed,
}

/// Reads a request body of at most `max` bytes within `timeout`.
pub async fn read(
    body: hyper::body::Incoming,
    max: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ReadError> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, max);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(ReadError::Timeout),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ReadError::TooLarge)
        }
        Ok(Err(_)) => Err(ReadError::Failed),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// Decompresses `body` by `encoding`, at most `max` bytes.
pub fn decode(encoding: Encoding, body: Bytes, max: usize) -> Result<Bytes, Inflate> {
    let invalid = Inflate::Invalid(encoding);
    match encoding {
        Encoding::Identity => Ok(body),
        Encoding::Gzip => inflate(flate2::read::MultiGzDecoder::new(&body[..]), max, invalid),
        Encoding::Zstd => match zstd::stream::read::Decoder::new(&body[..]) {
            Ok(d) => inflate(d, max, invalid),
            Err(_) => Err(invalid),
        },
        Encoding::Lz4 => inflate(lz4_flex::frame::FrameDecoder::new(&body[..]), max, invalid),
    }
}

/// Reads `r` to its end, at most `max` bytes.
fn inflate(r: impl Read, max: usize, invalid: Inflate) -> Result<Bytes, Inflate> {
    let mut out = Vec::new();
    match r.take(max as u64 + 1).read_to_end(&mut out) {
        Ok(n) if n > max => Err(Inflate::TooLarge),
        Ok(_) => Ok(out.into()),
        Err(_) => Err(invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(b: &[u8]) -> Bytes {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b).unwrap();
        gz.finish().unwrap().into()
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        let gz = gzip(&vec![b'a'; 100_000]);
        assert!(gz.len() < 1000);
        assert_eq!(
            decode(Encoding::Gzip, gz.clone(), 50_000),
            Err(Inflate::TooLarge)
        );
        assert_eq!(
            decode(Encoding::Gzip, gz, 100_000).map(|b| b.len()),
            Ok(100_000)
        );
    }

    #[test]
    fn a_body_that_is_not_gzip_is_said_to_be_invalid_gzip_not_too_large() {
        let e = decode(Encoding::Gzip, Bytes::from_static(b"not gzip"), 100).unwrap_err();
        assert_eq!(e, Inflate::Invalid(Encoding::Gzip));
        let msg = e.message(100);
        assert!(msg.contains("not valid gzip"), "{msg}");
        assert!(!msg.contains("max_body_bytes"), "{msg}");
    }

    #[test]
    fn lz4_frames_are_inflated_within_the_limit() {
        let body = b"{\"a\":1}\n".repeat(10_000);
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut enc, &body).unwrap();
        let lz: Bytes = enc.finish().unwrap().into();
        assert_eq!(
            decode(Encoding::Lz4, lz.clone(), body.len()).map(|b| b.len()),
            Ok(body.len())
        );
        assert_eq!(
            decode(Encoding::Lz4, lz, body.len() - 1),
            Err(Inflate::TooLarge)
        );
    }

    #[test]
    fn encodings_outside_the_allowed_ones_are_refused_by_name() {
        let gz_only = [Encoding::Gzip];
        assert_eq!(Encoding::parse(None, &gz_only), Ok(Encoding::Identity));
        assert_eq!(
            Encoding::parse(Some(" GZIP "), &gz_only),
            Ok(Encoding::Gzip)
        );
        assert_eq!(Encoding::parse(Some("zstd"), &gz_only), Err("zstd".into()));
        assert_eq!(Encoding::parse(Some("br"), &gz_only), Err("br".into()));
    }
}
