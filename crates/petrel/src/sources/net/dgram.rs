//! Datagram receivers (UDP, Unix datagram sockets): batched `recvmmsg`,
//! one message per datagram, and kernel drops made visible.
//!
//! UDP has no flow control: when the receiver falls behind, the kernel
//! drops datagrams at the socket. `SO_RXQ_OVFL` makes the kernel report
//! the socket's drop count with every datagram, and `SO_MEMINFO` is read
//! while the receiver waits for the pipeline (its buffer full, a sink
//! stalled), so the growth is counted as `error_type="kernel_dropped"`
//! during an outage too: loss is never invisible. The receiver never
//! blocks: it waits for room in the pipeline's queue while watching its
//! stop flag, so a stalled sink cannot hold up the agent's shutdown.

use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::BytesMut;
use petrel_core::LazyCounter;
use petrel_core::Span;

use super::intake::{Intake, TrySubmit};
use super::{now_ns, Block, ListenAddr};

/// Datagrams asked of one `recvmmsg`.
const BATCH: usize = 64;

/// A block handed to the pipeline holds at most this many bytes of
/// datagrams, gathered over several `recvmmsg` calls when they come fast.
const BLOCK_BYTES: usize = 256 * 1024;

/// When a `recvmmsg` drained the socket with fewer datagrams than this,
/// the receiver waits [`LINGER`] once and receives again before handing
/// the block on: at moderate rates every datagram would otherwise wake the
/// whole pipeline on its own (measured: 6.8 CPU s per million datagrams at
/// 50k/s, against 4.2 at 200k/s, where calls return full batches).
const LINGER_BELOW: usize = 32;

/// How long datagrams are left to gather in the socket buffer; the latency
/// this adds is bounded by it. The default receive buffer holds a few
/// thousand datagrams, many times what arrives meanwhile at 200k/s.
const LINGER: std::time::Duration = std::time::Duration::from_millis(1);

/// How often the kernel's drop count is read while the receiver waits for
/// room in the pipeline (no datagram is received meanwhile to carry it).
const DROP_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// `SO_MEMINFO` (asm-generic/socket.h; the same on every Linux
/// architecture that has it), which the libc crate does not define.
const SO_MEMINFO: libc::c_int = 55;

/// `SO_RCVBUF` asked for when `receive_buffer_bytes` is not configured:
/// the kernel's default (`net.core.rmem_default`, 208 KiB on most systems)
/// holds only a few hundred small datagrams, about a millisecond at high
/// rates, and UDP loss is invisible to the sender.
pub const DEFAULT_RECEIVE_BUFFER: usize = 4 << 20;

/// Counters of a datagram receiver.
#[derive(Clone)]
pub struct DgramCounters {
    /// Datagrams the kernel dropped at the socket (receiver too slow).
    pub kernel_dropped: LazyCounter,
    /// Datagrams longer than `max_message_bytes`, cut.
    pub too_long: LazyCounter,
    /// Datagrams received but not handed to the pipeline because the
    /// source stopped while its buffer was full.
    pub discarded: LazyCounter,
    /// Failed receives.
    pub read_errors: LazyCounter,
}

/// What a datagram receiver needs.
pub struct DgramSpec {
    /// Where to listen.
    pub addr: ListenAddr,
    /// `SO_RCVBUF` to ask for (as root beyond `net.core.rmem_max`);
    /// `None`: [`DEFAULT_RECEIVE_BUFFER`].
    pub receive_buffer_bytes: Option<usize>,
    /// Longer datagrams are cut (counted).
    pub max_message_bytes: usize,
    /// Mode of a created Unix socket.
    pub socket_mode: u32,
    /// Counters.
    pub counters: DgramCounters,
}

/// A receiving thread.
pub struct DgramReceiver {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    unix_path: Option<PathBuf>,
}

impl DgramReceiver {
    /// Stops receiving (within 100 ms).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// True while the thread runs.
    pub fn is_alive(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }
}

impl Drop for DgramReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}

enum Socket {
    Udp(std::net::UdpSocket),
    Unix(std::os::unix::net::UnixDatagram),
}

impl Socket {
    fn fd(&self) -> RawFd {
        match self {
            Socket::Udp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// Binds now and receives on a thread of its own.
pub fn listen(spec: DgramSpec, intake: Intake) -> anyhow::Result<DgramReceiver> {
    let (sock, unix_path) = match &spec.addr {
        ListenAddr::Inet(a) => (
            Socket::Udp(
                std::net::UdpSocket::bind(a)
                    .map_err(|e| anyhow::anyhow!("cannot listen on udp {a}: {e}"))?,
            ),
            None,
        ),
        ListenAddr::Unix(p) => {
            super::stream::remove_stale_socket(p)?;
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let s = std::os::unix::net::UnixDatagram::bind(p)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", p.display()))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(spec.socket_mode))?;
            (Socket::Unix(s), Some(p.clone()))
        }
    };
    let fd = sock.fd();
    set_receive_buffer(
        fd,
        spec.receive_buffer_bytes.unwrap_or(DEFAULT_RECEIVE_BUFFER),
        spec.receive_buffer_bytes.is_some(),
    );
    let one: libc::c_int = 1;
    // SAFETY: a valid socket and a pointer to an int of the given size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RXQ_OVFL,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let unix_peer: Option<Arc<str>> = unix_path.as_ref().map(|p| p.display().to_string().into());
    let handle = std::thread::Builder::new()
        .name("petrel-dgram".into())
        .spawn(move || {
            let mut r = Receiving::new(&spec, unix_peer);
            r.run(&sock, &spec, &intake, &stop2);
        })?;
    Ok(DgramReceiver {
        stop,
        handle: Some(handle),
        unix_path,
    })
}

/// Asks for an `SO_RCVBUF` of `bytes` (beyond `net.core.rmem_max` when
/// privileged); a failure is a warning when the size was configured.
fn set_receive_buffer(fd: RawFd, bytes: usize, configured: bool) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: a valid socket and a pointer to an int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
    if !configured {
        return;
    }
    tracing::warn!(
        bytes,
        "cannot set the socket's receive buffer; the system default (net.core.rmem_default) applies"
    );
}

/// Buffers of one `recvmmsg` call, reused.
struct Receiving {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    controls: Vec<[u64; 8]>,
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    /// The kernel's drop count as last reported.
    drops: Option<u32>,
    unix_peer: Option<Arc<str>>,
    last_peer: Option<(Vec<u8>, Arc<str>)>,
    /// Datagrams gathered for the next block.
    data: BytesMut,
    /// Their spans, per run of one sender.
    runs: Vec<(Option<Arc<str>>, Vec<Span>)>,
}

// SAFETY: the raw pointers in `iovs`/`msgs` point into this struct's own
// vectors and are rebuilt before every call; nothing is shared.
unsafe impl Send for Receiving {}

impl Receiving {
    fn new(spec: &DgramSpec, unix_peer: Option<Arc<str>>) -> Self {
        // One byte more than allowed, so a longer datagram is recognised
        // (besides MSG_TRUNC) without keeping more of it.
        let size = spec.max_message_bytes + 1;
        Self {
            bufs: (0..BATCH).map(|_| vec![0; size]).collect(),
            // SAFETY: all-zero sockaddr_storage and mmsghdr are valid values.
            addrs: (0..BATCH).map(|_| unsafe { zeroed() }).collect(),
            controls: vec![[0; 8]; BATCH],
            iovs: Vec::with_capacity(BATCH),
            msgs: Vec::with_capacity(BATCH),
            drops: None,
            unix_peer,
            last_peer: None,
            data: BytesMut::new(),
            runs: Vec::new(),
        }
    }

    fn run(&mut self, sock: &Socket, spec: &DgramSpec, intake: &Intake, stop: &AtomicBool) {
        let fd = sock.fd();
        while !stop.load(Ordering::SeqCst) {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                continue;
            }
            let mut lingered = false;
            loop {
                let n = self.receive(fd);
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::Interrupted
                    {
                        spec.counters.read_errors.inc();
                        tracing::warn!(error = %e, "receiving datagrams failed");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    break;
                }
                let n = n as usize;
                self.gather(n, spec);
                if self.data.len() >= BLOCK_BYTES {
                    break;
                }
                if n < LINGER_BELOW {
                    if lingered || stop.load(Ordering::SeqCst) {
                        break;
                    }
                    lingered = true;
                    std::thread::sleep(LINGER);
                }
            }
            for b in self.take_blocks() {
                if !self.hand_over(b, fd, spec, intake, stop) {
                    return;
                }
            }
        }
    }

    /// Queues `block`, waiting for room while the pipeline's buffer is
    /// full; meanwhile the kernel drops what arrives, which is counted.
    /// False when the source stops (the block is counted as discarded).
    fn hand_over(
        &mut self,
        mut block: Block,
        fd: RawFd,
        spec: &DgramSpec,
        intake: &Intake,
        stop: &AtomicBool,
    ) -> bool {
        let mut last_poll = std::time::Instant::now();
        loop {
            match intake.try_submit(block) {
                TrySubmit::Done => return true,
                TrySubmit::Closed => return false,
                TrySubmit::Full(b) => block = b,
            }
            if stop.load(Ordering::SeqCst) {
                spec.counters.discarded.inc_by(block.frames.len() as u64);
                return false;
            }
            if last_poll.elapsed() >= DROP_POLL {
                last_poll = std::time::Instant::now();
                if let Some(d) = socket_drops(fd) {
                    self.count_drops(d, spec);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Counts the growth of the socket's drop count `d`.
    fn count_drops(&mut self, d: u32, spec: &DgramSpec) {
        let before = self.drops.unwrap_or(0);
        if d > before {
            spec.counters.kernel_dropped.inc_by((d - before) as u64);
            tracing::warn!(
                dropped = d - before,
                "the kernel dropped datagrams at the socket: the receiver fell behind or the pipeline's buffer is full (raise `receive_buffer_bytes`, check the sinks)"
            );
        }
        if d >= before {
            self.drops = Some(d);
        }
    }

    fn receive(&mut self, fd: RawFd) -> isize {
        self.iovs.clear();
        self.msgs.clear();
        for b in self.bufs.iter_mut() {
            self.iovs.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            });
        }
        for i in 0..BATCH {
            // SAFETY: all-zero msghdr is valid; fields set below.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = size_of::<[u64; 8]>() as _;
            self.msgs.push(h);
        }
        // SAFETY: `msgs` holds BATCH headers whose pointers point into
        // buffers owned by `self`, alive for the call.
        unsafe {
            libc::recvmmsg(
                fd,
                self.msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            ) as isize
        }
    }

    /// Adds the `n` datagrams just received to the block being gathered.
    fn gather(&mut self, n: usize, spec: &DgramSpec) {
        if self.data.capacity() == 0 {
            self.data
                .reserve(BLOCK_BYTES + BATCH * (spec.max_message_bytes + 1).min(2048));
        }
        let mut dropped_now = None;
        for i in 0..n {
            let h = self.msgs[i];
            let mut len = (h.msg_len as usize).min(spec.max_message_bytes + 1);
            if len > spec.max_message_bytes || h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                spec.counters.too_long.inc();
                len = len.min(spec.max_message_bytes);
            }
            if let Some(d) = overflow_count(&h.msg_hdr) {
                dropped_now = Some(d);
            }
            let peer = self.peer(i, h.msg_hdr.msg_namelen);
            let mut msg = &self.bufs[i][..len];
            // Many senders end a datagram with a newline or NUL.
            while let [rest @ .., b'\n' | b'\r' | 0] = msg {
                msg = rest;
            }
            if msg.is_empty() {
                continue;
            }
            let start = self.data.len();
            self.data.extend_from_slice(msg);
            let span = Span::new(start, msg.len());
            match self.runs.last_mut() {
                Some((p, spans)) if *p == peer => spans.push(span),
                _ => self.runs.push((peer, vec![span])),
            }
        }
        if let Some(d) = dropped_now {
            self.count_drops(d, spec);
        }
    }

    /// The gathered datagrams as blocks, one per run of the same sender.
    fn take_blocks(&mut self) -> Vec<Block> {
        if self.runs.is_empty() {
            return Vec::new();
        }
        let buf = self.data.split().freeze();
        let received_ns = now_ns();
        std::mem::take(&mut self.runs)
            .into_iter()
            .map(|(peer, frames)| Block {
                buf: buf.clone(),
                frames,
                peer,
                received_ns,
                json: false,
            })
            .collect()
    }

    fn peer(&mut self, i: usize, namelen: libc::socklen_t) -> Option<Arc<str>> {
        if let Some(p) = &self.unix_peer {
            return Some(p.clone());
        }
        let raw = &self.addrs[i];
        // SAFETY: sockaddr_storage is plain bytes of at least `namelen`.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (raw as *const libc::sockaddr_storage).cast::<u8>(),
                (namelen as usize).min(size_of::<libc::sockaddr_storage>()),
            )
        };
        if let Some((b, p)) = &self.last_peer {
            if b == bytes {
                return Some(p.clone());
            }
        }
        let addr = sockaddr_to_string(raw)?;
        let p: Arc<str> = addr.into();
        self.last_peer = Some((bytes.to_vec(), p.clone()));
        Some(p)
    }
}

fn sockaddr_to_string(raw: &libc::sockaddr_storage) -> Option<String> {
    match raw.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a = unsafe { &*(raw as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(format!("{ip}:{}", u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let a =
                unsafe { &*(raw as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(format!("[{ip}]:{}", u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// The socket's drop count (`SK_MEMINFO_DROPS` of `SO_MEMINFO`, the
/// counter `SO_RXQ_OVFL` reports), without receiving anything.
fn socket_drops(fd: RawFd) -> Option<u32> {
    let mut info = [0u32; 16];
    let mut len = size_of::<[u32; 16]>() as libc::socklen_t;
    // SAFETY: a valid socket, and a buffer of `len` bytes the kernel fills
    // with at most that many.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let idx = libc::SK_MEMINFO_DROPS as usize;
    (rc == 0 && (len as usize) > idx * size_of::<u32>()).then(|| info[idx])
}

/// The socket's drop count from an `SO_RXQ_OVFL` control message.
fn overflow_count(h: &libc::msghdr) -> Option<u32> {
    // SAFETY: the CMSG macros walk the control buffer the kernel filled,
    // within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                let p = libc::CMSG_DATA(c).cast::<u32>();
                return Some(std::ptr::read_unaligned(p));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
