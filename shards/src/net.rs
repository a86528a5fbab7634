//! The network types of a shard: TCP listeners and streams driven by its executor's io_uring.
//! Thin wrappers over glommio's, so that the server names no glommio type.

use futures_lite::{AsyncRead, AsyncWrite};
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A listening TCP socket whose accepted connections belong to the executor that accepts them.
pub struct TcpListener(glommio::net::TcpListener);

impl TcpListener {
    /// Waits for the next connection; it is served on this executor.
    ///
    /// # Errors
    /// The accept's own error (`EMFILE`, `ENFILE`, ...), with its OS error number kept.
    pub async fn accept(&self) -> io::Result<TcpStream> {
        self.0.accept().await.map(TcpStream).map_err(io::Error::from)
    }

    /// The address the listener is bound to (the port the kernel chose for port 0).
    ///
    /// # Errors
    /// As `getsockname(2)`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr().map_err(io::Error::from)
    }
}

impl FromRawFd for TcpListener {
    /// Takes over a bound, listening TCP socket.
    ///
    /// # Safety
    /// `fd` must be such a socket, owned by nothing else.
    unsafe fn from_raw_fd(fd: RawFd) -> Self {
        // SAFETY: as the caller promised.
        TcpListener(unsafe { glommio::net::TcpListener::from_raw_fd(fd) })
    }
}

/// A connected TCP stream of this executor (the futures-io traits).
pub struct TcpStream(glommio::net::TcpStream);

impl TcpStream {
    /// Sets `TCP_NODELAY`.
    ///
    /// # Errors
    /// As `setsockopt(2)`.
    pub fn set_nodelay(&self, value: bool) -> io::Result<()> {
        self.0.set_nodelay(value).map_err(io::Error::from)
    }

    /// Shuts down the read half, the write half or both.
    ///
    /// # Errors
    /// As `shutdown(2)`.
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.0.shutdown(how).await.map_err(io::Error::from)
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_close(cx)
    }
}
