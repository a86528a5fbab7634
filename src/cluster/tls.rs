//! TLS 1.3 on the peer links (docs/journals.md §9.4): mutual, each node presenting its own
//! certificate (`tls.cert`, `tls.key`) and verifying the other's against the cluster's CA
//! (`cluster.tls_ca`); rustls over ring, on the links' blocking sockets.
//!
//! | side | what it checks |
//! |---|---|
//! | the dialer | the acceptor's chain against the CA, and that its certificate is valid for the host of the address the dialer lists it at (a DNS name or an IP address), as any TLS client does |
//! | the acceptor | the dialer's chain against the CA during the TLS handshake; then, once the handshake frame names the dialer, that its certificate is valid for the host the acceptor lists that node at (`PeerTls::check_name`) |
//!
//! Each connection makes a full handshake (no session tickets, no resumption), so a node whose
//! certificate is no longer trusted is refused at its next connection.
//!
//! A connection's reader and writer threads share its [`Session`] behind a mutex that is held
//! only while rustls works (decrypting what arrived, encrypting what goes out), never across a
//! blocking socket call: a peer that stops reading holds back this node's writer only, as on a
//! plain link. A record the session must send unasked (the answer to a key update) goes out
//! with the writer's next write.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};

/// Most bytes rustls holds encrypted before the writer sends them: one write encrypts at most
/// this much of the writer's frames, so a long frame goes out in slices of this size.
const SEND_LIMIT: usize = 256 << 10;

/// A node's TLS on its peer links: its certificate chain and key, presented both as a server
/// (to dialers) and as a client (to the nodes it dials), and the CA that every peer's
/// certificate must chain to. Cheap to clone.
#[derive(Clone)]
pub struct PeerTls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

/// A connection's TLS session, shared by its reader and its writer.
pub(super) type Session = Arc<Mutex<Connection>>;

fn lock(s: &Session) -> std::sync::MutexGuard<'_, Connection> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PeerTls {
    /// TLS 1.3 for the peer links from this node's certificate `chain` (its own certificate
    /// first), its private `key` and the `roots` every peer's chain must lead to (the CA).
    ///
    /// # Errors
    /// rustls' refusal: `roots` is empty, the key is not the certificate's or of a kind it
    /// cannot sign with.
    pub fn new(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>, roots: RootCertStore) -> Result<PeerTls, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .build()
            .map_err(|e| rustls::Error::General(format!("cannot verify peers' certificates: {e}")))?;
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(NoServerSessionStorage {});
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        client.resumption = Resumption::disabled();
        Ok(PeerTls { client: Arc::new(client), server: Arc::new(server) })
    }

    /// The dialer's TLS handshake on `tcp`, connected to the peer listed at `addr`
    /// (`HOST:PORT`), finished by `deadline`.
    ///
    /// # Errors
    /// The host of `addr` is neither a DNS name nor an IP address; the peer's certificate does
    /// not chain to the CA or is not valid for that host (`InvalidData`, rustls' reason); the
    /// socket failed; the handshake was not done by `deadline` (`TimedOut`).
    pub(super) fn connect(&self, tcp: &TcpStream, addr: &str, deadline: Instant) -> io::Result<Session> {
        let name = server_name(addr).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let conn = ClientConnection::new(Arc::clone(&self.client), name).map_err(io::Error::other)?;
        handshake(conn.into(), tcp, deadline)
    }

    /// The acceptor's TLS handshake on `tcp`, finished by `deadline`.
    ///
    /// # Errors
    /// As [`PeerTls::connect`]: the dialer presented no certificate or one that does not chain
    /// to the CA; the peer does not speak TLS; the socket failed; `deadline` passed.
    pub(super) fn accept(&self, tcp: &TcpStream, deadline: Instant) -> io::Result<Session> {
        let conn = ServerConnection::new(Arc::clone(&self.server)).map_err(io::Error::other)?;
        handshake(conn.into(), tcp, deadline)
    }

    /// Whether the certificate the peer of `session` presented is valid for the host of
    /// `addr` (`HOST:PORT`), the address this node lists that peer at. The acceptor checks it
    /// once the handshake frame names the dialer; the dialer's rustls already checked the
    /// acceptor's.
    ///
    /// # Errors
    /// Why not, as a sentence.
    pub(super) fn check_name(session: &Session, addr: &str) -> Result<(), String> {
        let name = server_name(addr)?;
        let s = lock(session);
        let cert = s.peer_certificates().and_then(|c| c.first()).ok_or("it presented no certificate")?;
        let parsed = ParsedCertificate::try_from(cert).map_err(|e| format!("its certificate cannot be read: {e}"))?;
        rustls::client::verify_server_name(&parsed, &name)
            .map_err(|e| format!("its certificate is not valid for {}, the host this node lists it at in cluster.peers: {e}", host_of(addr)))
    }
}

/// The host of `HOST:PORT` or `[V6]:PORT`.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The name a peer listed at `addr` must hold in its certificate: the host as an IP address
/// or a DNS name.
fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = host_of(addr);
    ServerName::try_from(host.to_owned())
        .map_err(|_| format!("{host:?} (from {addr:?}) is neither a DNS name nor an IP address, so no certificate can name it"))
}

/// Runs `conn`'s handshake over `tcp` until done or `deadline`; leaves `tcp`'s read timeout
/// at what is left of it.
fn handshake(mut conn: Connection, tcp: &TcpStream, deadline: Instant) -> io::Result<Session> {
    let mut io = tcp;
    while conn.is_handshaking() {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
        let left = left.ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake did not finish in time"))?;
        tcp.set_read_timeout(Some(left))?;
        conn.complete_io(&mut io)?;
    }
    while conn.wants_write() {
        conn.write_tls(&mut io)?;
    }
    conn.set_buffer_limit(Some(SEND_LIMIT));
    Ok(Arc::new(Mutex::new(conn)))
}

/// The reading half of a TLS peer connection: plaintext out of the session, which reads the
/// socket when it holds none.
pub(super) struct TlsRead {
    tcp: TcpStream,
    session: Session,
}

impl TlsRead {
    /// Reads `session`'s plaintext, its records arriving on `tcp` (a handle on the
    /// connection's socket).
    pub(super) fn new(tcp: TcpStream, session: Session) -> TlsRead {
        TlsRead { tcp, session }
    }
}

impl TlsRead {
    /// The socket, to shut it down.
    pub(super) fn socket(&self) -> &TcpStream {
        &self.tcp
    }
}

impl Read for TlsRead {
    /// Plaintext the session holds; when it holds none, waits (unlocked, honouring the socket's
    /// read timeout) for records to arrive, then decrypts them. `Ok(0)` after the peer's
    /// `close_notify`; `UnexpectedEof` when the socket closed without one; `InvalidData` for a
    /// record that does not decrypt or an alert.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match lock(&self.session).reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            // Blocks until bytes (or the end) arrive without taking them, so that the session
            // is not held while waiting.
            self.tcp.peek(&mut [0u8])?;
            let mut s = lock(&self.session);
            s.read_tls(&mut &self.tcp)?;
            s.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

/// The writing half of a TLS peer connection: plaintext into the session, records out to the
/// socket.
pub(super) struct TlsWrite {
    tcp: TcpStream,
    session: Session,
    /// Records taken out of the session, to send once it is unlocked (kept for reuse).
    records: Vec<u8>,
}

impl TlsWrite {
    /// Writes into `session`, its records going out on `tcp` (a handle on the connection's
    /// socket).
    pub(super) fn new(tcp: TcpStream, session: Session) -> TlsWrite {
        TlsWrite { tcp, session, records: Vec::new() }
    }

    /// The socket, to shut it down.
    pub(super) fn socket(&self) -> &TcpStream {
        &self.tcp
    }

    /// Encrypts as much of `bufs` as the session takes (at most [`SEND_LIMIT`] bytes) and sends
    /// the records; how many bytes of `bufs` went.
    fn send(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = {
            let mut s = lock(&self.session);
            let n = if bufs.is_empty() { 0 } else { s.writer().write_vectored(bufs)? };
            while s.wants_write() {
                s.write_tls(&mut self.records)?;
            }
            n
        };
        let sent = (&self.tcp).write_all(&self.records);
        self.records.clear();
        sent.map(|()| n)
    }

    /// Writes every byte of `bufs`, in as few records as rustls makes of them (records span
    /// the slices, so many small frames share a record).
    ///
    /// # Errors
    /// The session's error (a fatal alert received), or the socket's (closed, the write
    /// timeout passed).
    pub(super) fn write_all_slices(&mut self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        while !bufs.is_empty() {
            match self.send(bufs)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => IoSlice::advance_slices(&mut bufs, n),
            }
        }
        Ok(())
    }

    /// Sends whatever records the session holds (the answer to a key update).
    ///
    /// # Errors
    /// As [`TlsWrite::write_all_slices`].
    pub(super) fn flush(&mut self) -> io::Result<()> {
        self.send(&[]).map(|_| ())
    }
}
