//! A connection's transport: the TCP stream with its keepalive, TLS over it when configured,
//! and the ways a connection ends (delivering what was queued, lingering to discard what the
//! client still sends).

use super::{unless_shutdown, Context};
use futures_lite::{AsyncRead, AsyncWrite};
use shards::net::TcpStream;
use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Context as TaskCx, Poll};
use std::time::{Duration, Instant};

/// The transport: plain TCP or TLS over it.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<futures_rustls::server::TlsStream<Heard>>),
}

/// A TCP stream that notes when it last received bytes: under TLS the connection's reader sees
/// only whole decrypted records, and a record still arriving is activity too (docs/operations.md
/// §4.4: "no complete frame or progressing byte").
pub(super) struct Heard {
    stream: TcpStream,
    last: Rc<Cell<Instant>>,
}

impl AsyncRead for Heard {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let got = Pin::new(&mut me.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(n)) = &got {
            if *n > 0 {
                me.last.set(Instant::now());
            }
        }
        got
    }
}

impl AsyncWrite for Heard {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_close(cx)
    }
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskCx<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_close(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// Sets up an accepted stream: `TCP_NODELAY`, TCP keepalive as configured, and the TLS
/// handshake when TLS is on (bounded by `tls_handshake_secs`, and by a graceful shutdown).
/// Returns the transport and when the client last sent bytes under TLS (`heard`; a plain
/// connection's reader sees every byte itself); `None` when the handshake failed or timed out
/// (counted as reaped) or a shutdown began.
pub(super) async fn open(ctx: &Context, stream: TcpStream, accepted: Instant) -> Option<(Io, Rc<Cell<Instant>>)> {
    let _ = stream.set_nodelay(true);
    set_keepalive(ctx, &stream);
    let heard = Rc::new(Cell::new(accepted));
    let Some(cfg) = &ctx.tls else { return Some((Io::Plain(stream), heard)) };
    let acceptor = futures_rustls::TlsAcceptor::from(cfg.clone());
    let limit = ctx.settings.server.timeouts.tls_handshake().unwrap_or(Duration::from_secs(3600));
    let stream = Heard { stream, last: heard.clone() };
    let hs = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
        shards::sleep(limit).await;
        None
    });
    // A stalled handshake must not hold up a graceful shutdown either.
    match unless_shutdown(ctx, hs).await {
        None => None,
        Some(Some(Ok(s))) => Some((Io::Tls(Box::new(s)), heard)),
        Some(Some(Err(e))) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Some(None) => {
            ctx.connections_reaped.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Sets TCP keepalive on `stream` from `server.keepalive` (a failure is only logged).
fn set_keepalive(ctx: &Context, stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    // SAFETY: borrow the descriptor only to set options; the stream keeps owning it.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let ka = socket2::TcpKeepalive::new().with_time(ctx.settings.server.keepalive.idle()).with_interval(ctx.settings.server.keepalive.interval());
    if let Err(e) = socket2::SockRef::from(&sock).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// Closes a connection at a graceful shutdown once the client's kernel has acknowledged every
/// byte sent to it, or after `limit`: half-close, then poll the socket's unacknowledged
/// output (`SIOCOUTQ`). The reader is not drained, so closing with requests still unread
/// sends a reset; a reset makes the client's kernel drop what it had not *received* yet (the
/// answers still in our send queue, behind a client that was slow to read), never what it
/// had: an append stored and answered must not lose its answer to the close (the client
/// would not know it was stored, and a retry would store it twice).
pub(super) async fn close_once_delivered<W: AsyncWrite + Unpin>(fd: std::os::fd::RawFd, mut writer: W, limit: Duration) {
    use futures_lite::AsyncWriteExt;
    if writer.close().await.is_err() {
        return;
    }
    let delivered = async {
        while unacknowledged_output(fd).is_some_and(|n| n > 0) {
            shards::sleep(Duration::from_millis(1)).await;
        }
    };
    futures_lite::future::or(delivered, shards::sleep(limit)).await;
}

nix::ioctl_read_bad!(siocoutq, libc::TIOCOUTQ, libc::c_int);

/// Bytes written to the TCP socket `fd` that its peer has not acknowledged yet (sent or not),
/// from `SIOCOUTQ` (tcp(7)); `None` if the socket cannot say.
fn unacknowledged_output(fd: std::os::fd::RawFd) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which points at `n`; `fd` is the
    // connection's socket, open for as long as its stream halves live (the caller holds one).
    unsafe { siocoutq(fd, &mut n) }.ok().map(|_| n.max(0) as usize)
}

/// Closes a connection the server gave up on while its client may still be sending (a frame
/// over the cap, a bad Hello, an undecodable frame, a timeout): half-close (the client reads
/// the error and then end-of-stream), then read and discard what keeps arriving until the
/// client closes too, for at most [`LINGER`] and [`LINGER_BYTES`]. Closing a socket with
/// unread bytes in it sends a reset instead, and a reset makes the client's kernel drop the
/// error frame it had not read yet: a client that was writing a 20 MiB frame would see
/// "connection reset" instead of `TOO_LARGE`.
pub(super) async fn linger<R: futures_lite::AsyncRead + Unpin, W: AsyncWrite + Unpin>(mut reader: R, mut writer: W) {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    if writer.close().await.is_err() {
        return;
    }
    let discard = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0usize;
        while total < LINGER_BYTES {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    futures_lite::future::or(discard, shards::sleep(LINGER)).await;
}

/// Longest a closing connection keeps discarding what its client still sends.
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes a closing connection discards before it closes regardless.
const LINGER_BYTES: usize = 64 << 20;
