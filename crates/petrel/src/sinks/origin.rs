//! Names derived from where an event was read ([`EventBatch::event_origin`]):
//! the same every time the same bytes are read again, so that a store
//! overwrites what a restart sends again instead of adding a copy. The
//! elasticsearch sink's document ids and the s3 sink's object keys.
//!
//! [`EventBatch::event_origin`]: petrel_core::EventBatch::event_origin

/// Renders 16 bytes as 22 characters of unpadded url-safe base64.
pub fn id_text(h: u128, out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    // 128 bits are 21 groups of six and two bits left over.
    for i in 0..22u32 {
        let shift = 128i32 - 6 * (i as i32 + 1);
        let v = if shift >= 0 {
            (h >> shift) & 63
        } else {
            (h << -shift) & 63
        };
        out.push(ALPHABET[v as usize]);
    }
}

/// The id of the event read at `offset` of stream `stream`: XXH3-128 of
/// both, fixed by the hash's specification so ids stay the same across
/// builds and restarts.
pub fn origin_id(stream: u128, offset: u64) -> u128 {
    let mut input = [0u8; 24];
    input[..16].copy_from_slice(&stream.to_le_bytes());
    input[16..].copy_from_slice(&offset.to_le_bytes());
    twox_hash::XxHash3_128::oneshot(&input)
}

/// The 22-character name of the event read at `offset` of `stream`
/// ([`origin_id`] as [`id_text`]).
pub fn origin_name(stream: u128, offset: u64) -> String {
    let mut out = Vec::with_capacity(22);
    id_text(origin_id(stream, offset), &mut out);
    // The alphabet is ASCII.
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable() {
        let mut out = Vec::new();
        id_text(0, &mut out);
        assert_eq!(out, b"AAAAAAAAAAAAAAAAAAAAAA");
        out.clear();
        id_text(u128::MAX, &mut out);
        assert_eq!(
            out, b"_____________________w",
            "base64url of 16 bytes of 0xff"
        );
        out.clear();
        id_text(1u128 << 127, &mut out);
        assert_eq!(out, b"gAAAAAAAAAAAAAAAAAAAAA");
        // Pinned: ids already written to servers (document ids, object
        // keys) must stay valid.
        assert_eq!(origin_name(7, 42), PINNED_ID);
    }

    const PINNED_ID: &str = "TpesrnaBEtyTEBFeKPFCcQ";
}
