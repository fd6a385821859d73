//! Line decoders: files whose lines are records of another program's log
//! format (container runtimes' CRI and Docker json-file logs) rather than
//! the messages themselves.
//!
//! The reader hands a decoder the complete lines of each block. The
//! decoder writes the messages they carry into a new buffer, one message
//! per line, and says how many raw bytes it consumed: a message split over
//! several records (a container's 16 KiB partials) whose last record has
//! not been written yet stays in the reader's carry, uncommitted, and is
//! decoded again with the next block. So the checkpoint never passes the
//! first record of an unfinished message, and a restart loses nothing.

/// The output stream a record was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// No stream (an invalid record passed through as is).
    None,
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One decoded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedMsg {
    /// Offset of the message in [`Decoded::out`] (its newline follows it).
    pub start: usize,
    /// Length without the newline.
    pub len: usize,
    /// Offset in the raw input of the first record of the message.
    pub raw_start: usize,
    /// The runtime's timestamp of the first record.
    pub time_ns: Option<i64>,
    /// Where the process wrote it.
    pub stream: Stream,
}

/// What one call to [`LineDecoder::decode`] produced.
#[derive(Debug, Default)]
pub struct Decoded {
    /// The messages, each followed by `\n`.
    pub out: Vec<u8>,
    /// One entry per message, in the order of their completion.
    pub msgs: Vec<DecodedMsg>,
    /// Raw bytes from this offset on were not consumed: they start a
    /// message whose last record is still to come.
    pub held: usize,
}

impl Decoded {
    /// Empties it for the next call, keeping the allocations.
    pub fn clear(&mut self) {
        self.out.clear();
        self.msgs.clear();
        self.held = 0;
    }
}

/// Turns complete raw lines into messages; one per open file, so it may
/// keep state between calls.
pub trait LineDecoder: Send + std::fmt::Debug {
    /// Decodes `raw` (complete lines only, each ending with `\n`), which
    /// starts at file offset `base`. With `flush`, unfinished messages are
    /// emitted as they are (the file ended for good) and `held` is
    /// `raw.len()`.
    fn decode(&mut self, raw: &[u8], base: u64, flush: bool, out: &mut Decoded);

    /// Forgets what earlier calls left behind: the reader starts over at a
    /// new offset (a re-read after a failed delivery, a truncation).
    fn reset(&mut self);
}
