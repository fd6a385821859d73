//! This machine's identity, as events and producers name it.

use std::sync::Arc;

/// This host's name, from the kernel (`${HOSTNAME}` is a shell variable
/// that systemd does not export).
pub fn hostname() -> Arc<str> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the kernel NUL-terminates
    // names shorter than it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).as_ref().into()
}
