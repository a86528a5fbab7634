//! Length-prefixed framing (docs/protocol.md §4): every frame is a 4-byte big-endian `u32` body
//! length followed by that many bytes of one protobuf message.
//!
//! The core is sans-IO: [`FrameDecoder`] is fed bytes (or lends its spare buffer to a
//! reader) and hands back complete frame bodies, checking each length prefix against the
//! frame cap *before* any room is made for the body. [`encode_frame`] appends one frame to
//! a buffer. Thin drivers on top serve blocking ([`read_frame`], [`write_frame`],
//! [`FrameDecoder::read_next`]) and `futures-lite` async I/O ([`read_frame_async`],
//! [`write_frame_async`], [`FrameDecoder::read_next_async`]).

use std::io::{self, Read, Write};
use std::ops::Range;

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use prost::Message;

/// Default cap on a frame body, in bytes: 16 MiB (16,777,216). The 4-byte prefix is not
/// counted; `len == max` is accepted and `len > max` refused (docs/protocol.md §4).
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// Size of the big-endian length prefix, in bytes.
pub const PREFIX_LEN: usize = 4;

/// Receive-buffer capacity a [`FrameDecoder`] keeps between frames (64 KiB). After a larger
/// frame the buffer shrinks back to this once it is empty, so one big frame does not pin
/// memory for the life of a connection.
pub const RETAINED_CAPACITY: usize = 64 * 1024;

/// How many bytes the read drivers ask the transport for at a time (64 KiB).
pub const READ_CHUNK: usize = 64 * 1024;

/// True when a frame length prefix `len` is really the start of a TLS record (content type 21
/// alert or 22 handshake, version 3.x): a TLS server answering a plaintext peer.
pub fn is_tls_record_prefix(len: u64) -> bool {
    matches!(len >> 24, 21 | 22) && (len >> 16) & 0xff == 3
}

/// True when a frame length prefix `len` is really the ASCII `HTTP` that starts an HTTP
/// response: an HTTP server (the metrics port, a proxy) answering a Hello.
pub fn is_http_prefix(len: u64) -> bool {
    len == u64::from(u32::from_be_bytes(*b"HTTP"))
}

/// Why a frame could not be read, written or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The transport failed.
    #[error("frame i/o error: {0}")]
    Io(#[from] io::Error),
    /// A body (received or about to be sent) is longer than the cap. On receive this is
    /// detected from the prefix alone, before the body is buffered; the stream cannot be
    /// resynchronised afterwards.
    #[error("frame length {len} exceeds the maximum of {max}")]
    TooLong {
        /// The offending body length in bytes.
        len: u64,
        /// The cap in force.
        max: u32,
    },
    /// The peer closed the stream part-way through a frame (a "torn frame"): an I/O error,
    /// not a clean close (docs/protocol.md §4).
    #[error("connection closed mid-frame: {buffered} bytes of an incomplete frame were received")]
    Torn {
        /// Bytes of the incomplete frame (prefix included) that had arrived.
        buffered: usize,
    },
    /// A complete body did not decode as the expected message (including invalid UTF-8 in
    /// a string field).
    #[error("frame decode error: {0}")]
    Decode(#[from] prost::DecodeError),
}

impl From<FrameError> for io::Error {
    /// Transport errors pass through; a torn frame becomes `UnexpectedEof`; an over-long or
    /// undecodable frame becomes `InvalidData`.
    fn from(err: FrameError) -> io::Error {
        match err {
            FrameError::Io(e) => e,
            e @ FrameError::Torn { .. } => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            e => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// Appends one frame holding `msg` to `out`.
///
/// # Errors
/// [`FrameError::TooLong`] when the encoded body is longer than `max_frame_len`; nothing is
/// appended in that case.
pub fn encode_frame<M: Message>(msg: &M, max_frame_len: u32, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let len = msg.encoded_len();
    if len as u64 > u64::from(max_frame_len) {
        return Err(FrameError::TooLong { len: len as u64, max: max_frame_len });
    }
    out.reserve(PREFIX_LEN + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode_raw(out);
    Ok(())
}

/// Encodes `msg` as one frame and writes it with a single `write_all` (prefix and body
/// together, so `TCP_NODELAY` sends them in one segment). Does not flush.
///
/// # Errors
/// [`FrameError::TooLong`] (nothing written) or [`FrameError::Io`].
pub fn write_frame<M: Message, W: Write + ?Sized>(writer: &mut W, msg: &M, max_frame_len: u32) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    encode_frame(msg, max_frame_len, &mut buf)?;
    writer.write_all(&buf)?;
    Ok(())
}

/// Async twin of [`write_frame`]. Does not flush.
///
/// # Errors
/// [`FrameError::TooLong`] (nothing written) or [`FrameError::Io`].
pub async fn write_frame_async<M: Message, W: AsyncWrite + Unpin + ?Sized>(writer: &mut W, msg: &M, max_frame_len: u32) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    encode_frame(msg, max_frame_len, &mut buf)?;
    writer.write_all(&buf).await?;
    Ok(())
}

/// Reads exactly one frame body from a blocking reader, without reading past it.
///
/// Returns `Ok(None)` on EOF exactly at a frame boundary (a clean close). The length prefix
/// is checked against `max_frame_len` before the body is allocated. Reads the prefix and
/// body separately; for a stream of frames, [`FrameDecoder::read_next`] needs fewer system
/// calls.
///
/// # Errors
/// [`FrameError::TooLong`], [`FrameError::Torn`] on EOF mid-frame, [`FrameError::Io`].
pub fn read_frame<R: Read + ?Sized>(reader: &mut R, max_frame_len: u32) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    let got = read_full(reader, &mut prefix)?;
    let Some(mut body) = body_for_prefix(&prefix, got, max_frame_len)? else {
        return Ok(None);
    };
    let got = read_full(reader, &mut body)?;
    checked_body(body, got).map(Some)
}

/// Reads one frame with [`read_frame`] and decodes it as `M`.
///
/// # Errors
/// As [`read_frame`], plus [`FrameError::Decode`].
pub fn read_message<M: Message + Default, R: Read + ?Sized>(reader: &mut R, max_frame_len: u32) -> Result<Option<M>, FrameError> {
    match read_frame(reader, max_frame_len)? {
        Some(body) => Ok(Some(M::decode(body.as_slice())?)),
        None => Ok(None),
    }
}

/// Async twin of [`read_frame`].
///
/// # Errors
/// [`FrameError::TooLong`], [`FrameError::Torn`] on EOF mid-frame, [`FrameError::Io`].
pub async fn read_frame_async<R: AsyncRead + Unpin + ?Sized>(reader: &mut R, max_frame_len: u32) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    let got = read_full_async(reader, &mut prefix).await?;
    let Some(mut body) = body_for_prefix(&prefix, got, max_frame_len)? else {
        return Ok(None);
    };
    let got = read_full_async(reader, &mut body).await?;
    checked_body(body, got).map(Some)
}

/// Async twin of [`read_message`].
///
/// # Errors
/// As [`read_frame_async`], plus [`FrameError::Decode`].
pub async fn read_message_async<M: Message + Default, R: AsyncRead + Unpin + ?Sized>(reader: &mut R, max_frame_len: u32) -> Result<Option<M>, FrameError> {
    match read_frame_async(reader, max_frame_len).await? {
        Some(body) => Ok(Some(M::decode(body.as_slice())?)),
        None => Ok(None),
    }
}

/// The zeroed body buffer a length prefix announces, after `got` bytes of the prefix were
/// read: `None` on EOF before the prefix (a clean close).
///
/// # Errors
/// [`FrameError::Torn`] on a short prefix, [`FrameError::TooLong`] past `max_frame_len`.
fn body_for_prefix(prefix: &[u8; PREFIX_LEN], got: usize, max_frame_len: u32) -> Result<Option<Vec<u8>>, FrameError> {
    if got == 0 {
        return Ok(None);
    }
    if got < PREFIX_LEN {
        return Err(FrameError::Torn { buffered: got });
    }
    let len = u32::from_be_bytes(*prefix);
    if len > max_frame_len {
        return Err(FrameError::TooLong { len: u64::from(len), max: max_frame_len });
    }
    Ok(Some(vec![0u8; len as usize]))
}

/// `body` once `got` of its bytes were read.
///
/// # Errors
/// [`FrameError::Torn`] when fewer than all of them came.
fn checked_body(body: Vec<u8>, got: usize) -> Result<Vec<u8>, FrameError> {
    if got < body.len() {
        return Err(FrameError::Torn { buffered: PREFIX_LEN + got });
    }
    Ok(body)
}

/// Fills `buf` unless EOF comes first; returns how many bytes were read.
fn read_full<R: Read + ?Sized>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

async fn read_full_async<R: AsyncRead + Unpin + ?Sized>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// An incremental, sans-IO frame splitter for one direction of a connection.
///
/// Bytes go in through [`feed`](Self::feed), or without a copy by writing into
/// [`spare`](Self::spare) and calling [`commit`](Self::commit). Complete bodies come out of
/// [`next_frame`](Self::next_frame) as slices borrowed from the internal buffer, valid until
/// the decoder is next used. Partial frames are kept across calls, so a reader with a
/// timeout can stop and resume anywhere; [`has_partial`](Self::has_partial) tells whether
/// the stream is part-way through a frame (what a slow-loris timer needs), and
/// [`finish`](Self::finish) classifies an EOF as clean or torn.
///
/// Each length prefix is checked against the cap as soon as its 4 bytes are in, before room
/// is made for the body: `len > max` gives [`FrameError::TooLong`], after which the decoder
/// is stuck (the stream cannot be resynchronised) and keeps returning that error.
#[derive(Debug)]
pub struct FrameDecoder {
    /// Initialised storage: `buf[start..end]` is unconsumed data, `buf[end..]` is spare.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max: u32,
    /// Set once a prefix over the cap was seen: `(len, max)`.
    failed: Option<(u64, u32)>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl FrameDecoder {
    /// An empty decoder enforcing `max_frame_len` on every body.
    pub fn new(max_frame_len: u32) -> FrameDecoder {
        FrameDecoder { buf: Vec::new(), start: 0, end: 0, max: max_frame_len, failed: None }
    }

    /// The cap on a frame body, in bytes.
    pub fn max_frame_len(&self) -> u32 {
        self.max
    }

    /// Changes the cap; applies to every prefix not yet checked.
    pub fn set_max_frame_len(&mut self, max_frame_len: u32) {
        self.max = max_frame_len;
    }

    /// Appends received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        let spare = self.spare(data.len());
        spare[..data.len()].copy_from_slice(data);
        self.commit(data.len());
    }

    /// Makes room for at least `min` more bytes and returns the whole spare region. Write
    /// received bytes to its front, then call [`commit`](Self::commit) with their count.
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > RETAINED_CAPACITY {
                self.buf.truncate(RETAINED_CAPACITY);
                self.buf.shrink_to(RETAINED_CAPACITY);
            }
        }
        if self.buf.len() - self.end < min {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < min {
                let want = (self.end + min).max(self.buf.len().saturating_mul(2));
                self.buf.resize(want, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// Marks the first `n` bytes of the last [`spare`](Self::spare) region as received.
    ///
    /// # Panics
    /// If `n` is larger than that region.
    pub fn commit(&mut self, n: usize) {
        assert!(n <= self.buf.len() - self.end, "commit past the spare region");
        self.end += n;
    }

    /// Bytes received and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// True when bytes of a not-yet-returned frame are buffered. Once
    /// [`next_frame`](Self::next_frame) has returned `Ok(None)`, this means the stream is
    /// part-way through a frame.
    pub fn has_partial(&self) -> bool {
        self.end > self.start
    }

    /// How many more bytes the frame at the front needs before it is complete: the rest of
    /// the prefix if that is incomplete, else the rest of the body (0 when a whole frame is
    /// buffered).
    pub fn needed(&self) -> usize {
        let avail = self.end - self.start;
        if avail < PREFIX_LEN {
            return PREFIX_LEN - avail;
        }
        let len = self.front_len() as usize;
        (PREFIX_LEN + len).saturating_sub(avail)
    }

    /// True when [`next_frame`](Self::next_frame) would return without more input: a whole
    /// frame is buffered, or the front prefix is over the cap (an error is due).
    pub fn ready(&self) -> bool {
        if self.failed.is_some() {
            return true;
        }
        self.end - self.start >= PREFIX_LEN && (self.front_len() > self.max || self.needed() == 0)
    }

    fn front_len(&self) -> u32 {
        let p = &self.buf[self.start..self.start + PREFIX_LEN];
        u32::from_be_bytes([p[0], p[1], p[2], p[3]])
    }

    /// Locates the next complete body and consumes it, returning its range in `buf`.
    fn next_range(&mut self) -> Result<Option<Range<usize>>, FrameError> {
        if let Some((len, max)) = self.failed {
            return Err(FrameError::TooLong { len, max });
        }
        let avail = self.end - self.start;
        if avail < PREFIX_LEN {
            return Ok(None);
        }
        let len = self.front_len();
        if len > self.max {
            self.failed = Some((u64::from(len), self.max));
            return Err(FrameError::TooLong { len: u64::from(len), max: self.max });
        }
        let total = PREFIX_LEN + len as usize;
        if avail < total {
            return Ok(None);
        }
        let body = self.start + PREFIX_LEN..self.start + total;
        self.start += total;
        Ok(Some(body))
    }

    /// Returns the next complete frame body, or `Ok(None)` if more bytes are needed.
    ///
    /// # Errors
    /// [`FrameError::TooLong`] as soon as a prefix over the cap is buffered (and on every
    /// later call).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        Ok(self.next_range()?.map(|r| &self.buf[r]))
    }

    /// Returns and decodes the next complete frame as `M`.
    ///
    /// # Errors
    /// As [`next_frame`](Self::next_frame), plus [`FrameError::Decode`] (the frame is
    /// consumed either way).
    pub fn next_message<M: Message + Default>(&mut self) -> Result<Option<M>, FrameError> {
        match self.next_range()? {
            Some(r) => Ok(Some(M::decode(&self.buf[r])?)),
            None => Ok(None),
        }
    }

    /// Classifies an end of stream: `Ok(())` if it fell on a frame boundary.
    ///
    /// # Errors
    /// [`FrameError::Torn`] when bytes of an incomplete frame are buffered (call
    /// [`next_frame`](Self::next_frame) until it returns `Ok(None)` first).
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.has_partial() {
            Err(FrameError::Torn { buffered: self.buffered() })
        } else {
            Ok(())
        }
    }

    /// Performs one `read` into the spare buffer (at least [`READ_CHUNK`] bytes of room).
    /// Returns the byte count; 0 means EOF.
    ///
    /// # Errors
    /// The reader's error (`Interrupted` included).
    pub fn fill_from<R: Read + ?Sized>(&mut self, reader: &mut R) -> io::Result<usize> {
        let n = reader.read(self.spare(READ_CHUNK))?;
        self.commit(n);
        Ok(n)
    }

    /// Async twin of [`fill_from`](Self::fill_from).
    ///
    /// # Errors
    /// The reader's error (`Interrupted` included).
    pub async fn fill_from_async<R: AsyncRead + Unpin + ?Sized>(&mut self, reader: &mut R) -> io::Result<usize> {
        let n = reader.read(self.spare(READ_CHUNK)).await?;
        self.commit(n);
        Ok(n)
    }

    /// Returns the next frame body, reading from `reader` as needed. Bytes read past the
    /// frame stay buffered for the next call. `Ok(None)` is a clean EOF at a frame boundary.
    ///
    /// # Errors
    /// [`FrameError::TooLong`], [`FrameError::Torn`] on EOF mid-frame, [`FrameError::Io`]
    /// (a `WouldBlock`/`TimedOut` from a socket timeout leaves the partial frame buffered,
    /// so calling again resumes safely).
    pub fn read_next<R: Read + ?Sized>(&mut self, reader: &mut R) -> Result<Option<&[u8]>, FrameError> {
        loop {
            if let Some(r) = self.next_range()? {
                return Ok(Some(&self.buf[r]));
            }
            match self.fill_from(reader) {
                Ok(0) => return self.finish().map(|()| None),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Async twin of [`read_next`](Self::read_next).
    ///
    /// # Errors
    /// As [`read_next`](Self::read_next).
    pub async fn read_next_async<R: AsyncRead + Unpin + ?Sized>(&mut self, reader: &mut R) -> Result<Option<&[u8]>, FrameError> {
        loop {
            if let Some(r) = self.next_range()? {
                return Ok(Some(&self.buf[r]));
            }
            match self.fill_from_async(reader).await {
                Ok(0) => return self.finish().map(|()| None),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{request, Request, StatsRequest};

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn every_split_point_yields_the_same_frames() {
        let bodies: Vec<Vec<u8>> = vec![b"hello".to_vec(), Vec::new(), vec![7u8; 300], b"x".to_vec()];
        let stream: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
        for split in 0..=stream.len() {
            let mut dec = FrameDecoder::new(1024);
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                dec.feed(part);
                while let Some(b) = dec.next_frame().unwrap() {
                    got.push(b.to_vec());
                }
            }
            assert_eq!(got, bodies, "split at {split}");
            assert!(!dec.has_partial());
            dec.finish().unwrap();
        }
        // One byte at a time, checking has_partial along the way.
        let mut dec = FrameDecoder::new(1024);
        let mut got = Vec::new();
        for (i, b) in stream.iter().enumerate() {
            dec.feed(std::slice::from_ref(b));
            while let Some(f) = dec.next_frame().unwrap() {
                got.push(f.to_vec());
            }
            let boundary = [0usize, 9, 13, 317, 322].contains(&(i + 1));
            assert_eq!(dec.has_partial(), !boundary, "after byte {i}");
        }
        assert_eq!(got, bodies);
    }

    #[test]
    fn len_equal_to_max_is_accepted_and_one_more_is_refused() {
        let mut dec = FrameDecoder::new(8);
        dec.feed(&frame(&[1u8; 8]));
        assert_eq!(dec.next_frame().unwrap().unwrap(), &[1u8; 8]);

        let mut dec = FrameDecoder::new(8);
        // Only the prefix: the refusal must not wait for (or make room for) the body.
        dec.feed(&9u32.to_be_bytes());
        let cap = dec.buf.len();
        match dec.next_frame() {
            Err(FrameError::TooLong { len: 9, max: 8 }) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(dec.buf.len(), cap, "no room made for the body");
        // Sticky.
        dec.feed(&[0u8; 9]);
        assert!(matches!(dec.next_frame(), Err(FrameError::TooLong { len: 9, max: 8 })));
    }

    #[test]
    fn huge_prefix_is_refused_without_allocating() {
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
        dec.feed(&u32::MAX.to_be_bytes());
        assert!(matches!(dec.next_frame(), Err(FrameError::TooLong { len, max }) if len == u64::from(u32::MAX) && max == DEFAULT_MAX_FRAME_LEN));
        assert!(dec.buf.len() <= 64);
    }

    #[test]
    fn torn_frames_are_reported_at_eof() {
        let full = frame(b"abcdef");
        for cut in 1..full.len() {
            let mut dec = FrameDecoder::new(64);
            dec.feed(&full[..cut]);
            assert!(dec.next_frame().unwrap().is_none());
            assert!(dec.has_partial());
            assert!(matches!(dec.finish(), Err(FrameError::Torn { buffered }) if buffered == cut));
            let mut r = &full[..cut];
            assert!(matches!(read_frame(&mut r, 64), Err(FrameError::Torn { buffered }) if buffered == cut));
            let mut r = &full[..cut];
            assert!(matches!(FrameDecoder::new(64).read_next(&mut r), Err(FrameError::Torn { .. })));
        }
        let mut r: &[u8] = &[];
        assert!(read_frame(&mut r, 64).unwrap().is_none());
        let io: io::Error = FrameError::Torn { buffered: 1 }.into();
        assert_eq!(io.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn zero_length_body_decodes_as_an_empty_request() {
        let mut dec = FrameDecoder::new(16);
        dec.feed(&[0, 0, 0, 0]);
        let req: Request = dec.next_message().unwrap().unwrap();
        assert_eq!(req, Request { request_id: 0, kind: None });
        assert_eq!(read_message::<Request, _>(&mut &[0u8, 0, 0, 0][..], 16).unwrap(), Some(Request::default()));
    }

    #[test]
    fn encoder_refuses_bodies_over_the_cap_and_writes_nothing() {
        let req = Request::new(1, request::Kind::Stats(StatsRequest {}));
        let body_len = req.encoded_len();
        let mut out = vec![0xAA];
        assert!(matches!(encode_frame(&req, body_len as u32 - 1, &mut out), Err(FrameError::TooLong { .. })));
        assert_eq!(out, vec![0xAA]);
        encode_frame(&req, body_len as u32, &mut out).unwrap();
        assert_eq!(&out[1..], &[0, 0, 0, 4, 0x08, 0x01, 0x32, 0x00]);
        let mut sink = Vec::new();
        assert!(write_frame(&mut sink, &req, 3).is_err());
        assert!(sink.is_empty());
    }

    #[test]
    fn read_next_keeps_extra_bytes_and_resumes_after_would_block() {
        struct Trickle {
            data: Vec<u8>,
            pos: usize,
            block_next: bool,
        }
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.block_next = !self.block_next;
                if self.block_next {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let n = 3.min(buf.len()).min(self.data.len() - self.pos);
                buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
                self.pos += n;
                Ok(n)
            }
        }
        let mut stream = frame(b"first");
        stream.extend(frame(b"second"));
        let mut r = Trickle { data: stream, pos: 0, block_next: false };
        let mut dec = FrameDecoder::new(64);
        let mut got = Vec::new();
        loop {
            match dec.read_next(&mut r) {
                Ok(Some(f)) => got.push(f.to_vec()),
                Ok(None) => break,
                Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, vec![b"first".to_vec(), b"second".to_vec()]);
    }

    #[test]
    fn buffer_shrinks_back_after_a_large_frame() {
        let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
        let big = vec![3u8; 1 << 20];
        dec.feed(&frame(&big));
        assert_eq!(dec.next_frame().unwrap().unwrap().len(), big.len());
        dec.feed(&frame(b"small"));
        assert_eq!(dec.next_frame().unwrap().unwrap(), b"small");
        assert!(dec.buf.len() <= RETAINED_CAPACITY, "kept {} bytes", dec.buf.len());
    }

    #[test]
    fn async_helpers_round_trip() {
        let req = Request::hello(1, Some("tok"));
        let mut wire = Vec::new();
        futures_lite::future::block_on(write_frame_async(&mut wire, &req, 1024)).unwrap();
        let mut cursor = futures_lite::io::Cursor::new(wire.clone());
        let back: Request = futures_lite::future::block_on(read_message_async(&mut cursor, 1024)).unwrap().unwrap();
        assert_eq!(back, req);
        let mut cursor = futures_lite::io::Cursor::new(wire.clone());
        let mut dec = FrameDecoder::new(1024);
        let body = futures_lite::future::block_on(dec.read_next_async(&mut cursor)).unwrap().unwrap().to_vec();
        assert_eq!(body, wire[4..]);
        assert!(futures_lite::future::block_on(dec.read_next_async(&mut cursor)).unwrap().is_none());
        let mut torn = futures_lite::io::Cursor::new(wire[..5].to_vec());
        assert!(matches!(futures_lite::future::block_on(read_frame_async(&mut torn, 1024)), Err(FrameError::Torn { buffered: 5 })));
    }
}
