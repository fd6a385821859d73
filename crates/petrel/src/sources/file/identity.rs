//! File identity: device and inode, plus a fingerprint of the first bytes so
//! that a reused inode or a truncated-and-rewritten file is not mistaken for
//! the file we knew.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

/// Bytes of the file start covered by a full fingerprint.
pub const FINGERPRINT_BYTES: usize = 1024;

/// Device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// st_dev.
    pub dev: u64,
    /// st_ino.
    pub ino: u64,
}

impl FileId {
    /// Identity of an open file or of metadata from stat.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// A hash of the first `len` bytes of a file. Short files get a short
/// fingerprint that is extended as they grow, so there is no "wait until
/// 1 KiB" blind spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// Bytes covered (at most [`FINGERPRINT_BYTES`]).
    pub len: u32,
    /// FNV-1a over those bytes.
    pub hash: u64,
}

impl Fingerprint {
    /// Fingerprint of the first `min(size, FINGERPRINT_BYTES)` bytes.
    pub fn read(file: &File, size: u64) -> std::io::Result<Self> {
        Self::read_len(file, size.min(FINGERPRINT_BYTES as u64) as usize)
    }

    /// Fingerprint of exactly the first `len` bytes (fewer if the file is
    /// shorter now).
    pub fn read_len(file: &File, len: usize) -> std::io::Result<Self> {
        let mut buf = [0u8; FINGERPRINT_BYTES];
        let want = len.min(FINGERPRINT_BYTES);
        let mut got = 0;
        while got < want {
            let n = file.read_at(&mut buf[got..want], got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(Self {
            len: got as u32,
            hash: fnv1a(&buf[..got]),
        })
    }

    /// True when the file still starts with the bytes this fingerprint
    /// covers.
    pub fn matches(&self, file: &File) -> std::io::Result<bool> {
        let now = Self::read_len(file, self.len as usize)?;
        Ok(now == *self)
    }

    /// Extends a partial fingerprint with the bytes that follow the ones it
    /// covers (as many as fit under [`FINGERPRINT_BYTES`]).
    pub fn extend(&mut self, following: &[u8]) {
        let take =
            (FINGERPRINT_BYTES - (self.len as usize).min(FINGERPRINT_BYTES)).min(following.len());
        if take == 0 {
            return;
        }
        let state = if self.len == 0 { FNV_BASIS } else { self.hash };
        self.hash = fnv1a_from(state, &following[..take]);
        self.len += take as u32;
    }

    /// True when it covers fewer than [`FINGERPRINT_BYTES`].
    pub fn is_partial(&self) -> bool {
        (self.len as usize) < FINGERPRINT_BYTES
    }
}

/// The identity of a file's content as a stream of positions: device,
/// inode and the file's first line (at most [`FINGERPRINT_BYTES`] of it),
/// hashed with XXH3-128, whose output is fixed by its specification. The
/// same after restarts and renames (rotation); different for a reused
/// inode or a file truncated and written again, unless the new content
/// starts with the same first line. Sinks derive event ids from it, so it
/// must never change between builds. `head` is the file's first bytes;
/// the flag is false while the first line is still unfinished (the
/// identity may then change once it is).
pub fn stream_identity(id: FileId, head: &[u8]) -> (u128, bool) {
    let (line, complete) = match memchr::memchr(b'\n', head) {
        Some(nl) => (&head[..=nl], true),
        None => (head, head.len() >= FINGERPRINT_BYTES),
    };
    let mut input = Vec::with_capacity(16 + line.len());
    input.extend_from_slice(&id.dev.to_le_bytes());
    input.extend_from_slice(&id.ino.to_le_bytes());
    input.extend_from_slice(line);
    (twox_hash::XxHash3_128::oneshot(&input), complete)
}

/// FNV-1a, 64 bit. Checkpoints store this hash, so it must never change
/// between builds; std's hashers make no such promise, and for at most
/// 1 KiB per file the speed of a better hash does not matter.
fn fnv1a(data: &[u8]) -> u64 {
    fnv1a_from(FNV_BASIS, data)
}

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a continued from `h` (the hash of the bytes before `data`).
fn fnv1a_from(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn grows_and_detects_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(b"abc").unwrap();
        let r = std::fs::File::open(&p).unwrap();
        let fp = Fingerprint::read(&r, 3).unwrap();
        assert_eq!(fp.len, 3);
        f.write_all(&[b'x'; 2000]).unwrap();
        assert!(fp.matches(&r).unwrap(), "appending keeps the prefix");
        let full = Fingerprint::read(&r, 2003).unwrap();
        assert_eq!(full.len as usize, FINGERPRINT_BYTES);
        std::fs::write(&p, b"xyz").unwrap();
        assert!(!fp.matches(&r).unwrap(), "rewritten start is detected");
    }

    #[test]
    fn stream_identity_is_the_inode_and_the_first_line() {
        let id = FileId { dev: 1, ino: 2 };
        let (a, done) = stream_identity(id, b"first\nsecond\n");
        assert!(done);
        assert_eq!(stream_identity(id, b"first\nother and longer\n").0, a);
        assert_ne!(stream_identity(id, b"First\nsecond\n").0, a, "new content");
        assert_ne!(stream_identity(FileId { dev: 1, ino: 3 }, b"first\n").0, a);
        assert!(!stream_identity(id, b"fir").1, "an unfinished first line");
        // Pinned: ids already written to a server must stay valid.
        assert_eq!(
            a,
            twox_hash::XxHash3_128::oneshot(b"\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0first\n")
        );
    }

    #[test]
    fn extend_equals_reading_more() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut fp = Fingerprint::default();
        fp.extend(&data[..0]);
        assert_eq!(fp, Fingerprint::default());
        fp.extend(&data[..10]);
        assert_eq!((fp.len, fp.hash), (10, fnv1a(&data[..10])));
        fp.extend(&data[10..]);
        assert_eq!(fp.len as usize, FINGERPRINT_BYTES);
        assert_eq!(fp.hash, fnv1a(&data[..FINGERPRINT_BYTES]));
        fp.extend(b"more");
        assert_eq!(
            fp.hash,
            fnv1a(&data[..FINGERPRINT_BYTES]),
            "a full one stays"
        );
    }
}
