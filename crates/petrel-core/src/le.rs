//! Little-endian readers for the records Petrel writes beside buffered
//! data (disk buffer records, the routes of sinks that keep them in the
//! buffer): each takes bytes off the front of a slice, `None` when it is
//! too short, so that a damaged record is refused, never read past.

/// Takes `n` bytes off the front of `b`.
pub fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if b.len() < n {
        return None;
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Some(head)
}

/// Takes a little-endian `u32` off the front of `b`.
pub fn take_u32(b: &mut &[u8]) -> Option<u32> {
    take(b, 4)?.try_into().ok().map(u32::from_le_bytes)
}

/// Takes a little-endian `u64` off the front of `b`.
pub fn take_u64(b: &mut &[u8]) -> Option<u64> {
    take(b, 8)?.try_into().ok().map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_order_and_refuses_short_input() {
        let data = [1u8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9];
        let mut b = &data[..];
        assert_eq!(take_u32(&mut b), Some(1));
        assert_eq!(take_u64(&mut b), Some(2));
        assert_eq!(take_u32(&mut b), None);
        assert_eq!(take(&mut b, 1), Some(&[9u8][..]));
        assert_eq!(take(&mut b, 1), None);
    }
}
