//! How an [`AsyncClient`](super::AsyncClient) opens its sockets: the [`Connector`] trait,
//! a TLS wrapper for any connector, and (feature `async-io`) a plain TCP connector.

use std::future::Future;
use std::io;
use std::sync::Arc;

use futures_lite::{AsyncRead, AsyncWrite};

/// Opens one byte stream to the server. The client calls it once per socket (the control
/// socket and each bulk socket) and then performs that socket's Hello itself, so a
/// connector only has to produce a connected, ready-to-use stream (TCP, TLS over TCP, a
/// Unix socket, an in-memory pipe ...).
///
/// The stream uses the `futures-io` traits (re-exported by `futures-lite`, implemented by
/// `async-io`'s `Async<TcpStream>`, glommio's `TcpStream`, `futures-rustls` streams, and by
/// tokio streams through `tokio-util`'s `compat`).
///
/// Any closure returning a future implements it (on glommio, the same with its `TcpStream`:
/// the test `runs_on_glommio` in `tests/async_client/cases.rs` does it):
///
/// ```ignore
/// // async-io's reactor, under any executor (here an async-executor `LocalExecutor`):
/// let connect = move || async move {
///     let s = async_io::Async::<std::net::TcpStream>::connect(addr).await?;
///     s.get_ref().set_nodelay(true)?;
///     Ok::<_, std::io::Error>(s)
/// };
/// let (client, driver) = AsyncClient::connect_with(connect, AsyncClientConfig::default()).await?;
/// executor.spawn(driver).detach();
/// ```
pub trait Connector {
    /// The connected stream.
    type Stream: AsyncRead + AsyncWrite + Unpin;

    /// Opens a new stream.
    ///
    /// # Errors
    /// Whatever prevented the connection; it is returned unchanged from
    /// [`AsyncClient::connect_with`](super::AsyncClient::connect_with).
    fn connect(&self) -> impl Future<Output = io::Result<Self::Stream>>;
}

impl<F, Fut, S> Connector for F
where
    F: Fn() -> Fut,
    Fut: Future<Output = io::Result<S>>,
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Stream = S;

    fn connect(&self) -> impl Future<Output = io::Result<S>> {
        self()
    }
}

/// Wraps a connector in client-side TLS (implicit TLS, docs/protocol.md §3: the TLS handshake comes
/// first, then the frames travel inside the session), using `futures-rustls`.
///
/// The handshake has no time limit of its own (the client has no timer); bound
/// [`AsyncClient::connect_with`](super::AsyncClient::connect_with) with your runtime's
/// timeout if the server may stall. Configurations come from
/// [`client::tls`](crate::client::tls).
///
/// A failed handshake names its usual cause where it is known, as the blocking client's
/// does: a plaintext server, a CA certificate used as the server's own, or a close (a server
/// at its connection limit closes new connections during the handshake).
#[derive(Clone)]
pub struct TlsConnector<C> {
    inner: C,
    server_name: rustls::pki_types::ServerName<'static>,
    tls: futures_rustls::TlsConnector,
}

impl<C> std::fmt::Debug for TlsConnector<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl<C> TlsConnector<C> {
    /// TLS over the streams of `inner`, verifying the server's certificate for
    /// `server_name` (a DNS name or an IP address) against `config`'s roots.
    ///
    /// # Errors
    /// `InvalidInput` when `server_name` is neither a valid DNS name nor an IP address.
    pub fn new(inner: C, server_name: &str, config: Arc<rustls::ClientConfig>) -> io::Result<TlsConnector<C>> {
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(TlsConnector { inner, server_name, tls: futures_rustls::TlsConnector::from(config) })
    }
}

impl<C: Connector> Connector for TlsConnector<C> {
    type Stream = futures_rustls::client::TlsStream<C::Stream>;

    async fn connect(&self) -> io::Result<Self::Stream> {
        let tcp = self.inner.connect().await?;
        self.tls.connect(self.server_name.clone(), tcp).await.map_err(crate::client::tls_hint)
    }
}

/// Plain TCP over `async-io`'s reactor (`Async<TcpStream>`), with `TCP_NODELAY` set.
/// Works under any executor (smol, async-std, `futures::executor`, or `async_io::block_on`);
/// async-io runs its own reactor thread.
#[cfg(feature = "async-io")]
#[derive(Clone, Debug)]
pub struct TcpConnector {
    addrs: Vec<std::net::SocketAddr>,
}

#[cfg(feature = "async-io")]
impl TcpConnector {
    /// Resolves `addr` now (blocking, with the system resolver); each connect then tries
    /// the resolved addresses in order.
    ///
    /// # Errors
    /// The resolver's error, or `InvalidInput` when `addr` resolves to nothing.
    pub fn new(addr: impl std::net::ToSocketAddrs) -> io::Result<TcpConnector> {
        let addrs: Vec<_> = addr.to_socket_addrs()?.collect();
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing"));
        }
        Ok(TcpConnector { addrs })
    }
}

#[cfg(feature = "async-io")]
impl Connector for TcpConnector {
    type Stream = async_io::Async<std::net::TcpStream>;

    async fn connect(&self) -> io::Result<Self::Stream> {
        let mut last = None;
        for addr in &self.addrs {
            match async_io::Async::<std::net::TcpStream>::connect(*addr).await {
                Ok(s) => {
                    s.get_ref().set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")))
    }
}
