//! The peer transport: one TCP connection per pair of nodes, carrying peer frames
//! ([`super::peer`]) both ways. Plain threads and blocking sockets at the edge, beside the
//! node's loop: nothing on the journal path waits for the network ([`Links::send`] only
//! queues, and drops when it cannot).
//!
//! | rule | what |
//! |---|---|
//! | who dials | the lower id dials the higher one; both directions share that connection |
//! | reconnect | after a failed dial or a closed link, after 20 ms, doubling to 1 s (back to 20 ms once a link has lived 1 s) |
//! | wire | each frame is a `u32` little-endian length, then the bytes of [`encode_frame`]; a length above [`MAX_FRAME`] closes the link |
//! | handshake | the dialer first sends `encode_frame(cluster, me, peer, &[])`; the acceptor closes a connection whose first frame does not decode for it ([`decode_frame`]: another cluster, another node), comes from a node not among its peers, or from a higher id |
//! | another cluster | a handshake of another cluster (the two nodes' `peers` name different sets of nodes) is answered with one [`encode_refusal`] frame of this cluster, saying so, and closed; the dialer logs it (once a minute) and goes on trying, as either configuration may be the one to change |
//! | identity | the handshake carries the dialer's data directory incarnation ([`encode_hello`]); when [`Links::record_incarnation`] holds another one for that node id (the directory records each member's first), the acceptor answers one [`encode_refusal`] frame and closes: a second process started with a running node's id, or a node whose data was lost, never displaces the node the cluster knows, and the refused dialer's node stops for good (its reader hands the refusal on in [`Inbound::refused`]) |
//! | refusal | a later frame that does not decode, or names another sender than the handshake, closes that link only; the dialer reconnects |
//! | replacement | a newer connection from the same peer replaces the old one, which is closed |
//! | queues | per peer, at most [`QUEUE_FRAMES`] frames wait; a writer drains them through a buffer and flushes when the queue is momentarily empty, so many frames go in few system calls |
//! | TLS | with a [`PeerTls`], every connection is mutual TLS 1.3 ([`super::tls`]), its handshake done before the handshake frame; a connection whose TLS handshake fails (no TLS, a certificate the CA did not sign or not valid for the peer's host) is refused like a bad handshake frame, and the dialer tries again as after a failed dial. The queued frames go into the session without a copy, many to a record |
//!
//! Threads: one acceptor, one link thread per peer (it dials or takes the accepted
//! connection, and writes), one reader per connection (it decodes and hands each frame's
//! messages to the inbox). Dropping [`Links`] stops and joins them all and closes every socket.
//! Source: docs/journals.md §9.4.

use std::collections::BTreeMap;
use std::io::{self, BufReader, BufWriter, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use raft::eraftpb::Message;

use super::peer::{decode_frame_removals, encode_hello, encode_refusal, PeerError, PeerFrame};
use super::tls::{PeerTls, Session, TlsRead, TlsWrite};
use crate::journal::JournalId;

/// Largest peer frame, in bytes, sent or accepted (64 MiB). A longer length prefix closes the
/// link; a longer frame given to [`Links::send`] is dropped.
pub const MAX_FRAME: usize = 64 << 20;
/// Frames that may wait for one peer's writer; [`Links::send`] drops beyond this.
pub const QUEUE_FRAMES: usize = 4096;
/// First pause before a dialer tries again.
pub const MIN_BACKOFF: Duration = Duration::from_millis(20);
/// Longest pause between a dialer's attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long an accepted connection has to deliver its handshake frame, in all (and, on TLS
/// links, how long the TLS handshake may take).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes read at once, each on its own thread; a connection beyond is closed at once.
pub const MAX_HANDSHAKES: usize = 32;
/// How long one write may block (a peer that stopped reading) before its link is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a peer's refusal of this node's link (another cluster) is logged as a warning.
pub const REFUSAL_EVERY: Duration = Duration::from_secs(60);
/// How long one dial attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

const WRITE_BUFFER: usize = 256 << 10;
const READ_BUFFER: usize = 64 << 10;
/// How often a reader waiting on a full inbox looks whether the links are stopping.
const INBOX_POLL: Duration = Duration::from_millis(100);

/// What a peer sent: the messages of one frame, each for one group.
#[derive(Clone, Debug, PartialEq)]
pub struct Inbound {
    /// The sending node (the one its link's handshake named).
    pub from: u64,
    /// The frame's consensus messages, each with its group, in the frame's order.
    pub messages: Vec<(JournalId, Message)>,
    /// The groups whose leader (the sender) says this node is no longer among their voters,
    /// each with the leader's term (docs/journals.md §9.8).
    pub removed: Vec<(JournalId, u64)>,
    /// The sender refused this node's handshake because the cluster knows this node's id by
    /// another data directory: why. This node must stop for good.
    pub refused: Option<String>,
}

/// One peer link's state and counters, for metrics and `cluster status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStats {
    /// The peer's node id.
    pub peer: u64,
    /// The peer's address as configured.
    pub addr: String,
    /// Whether a connection to the peer is up (frames are being queued for it).
    pub connected: bool,
    /// Connections established since start (each dial or accepted handshake that took).
    pub connects: u64,
    /// Frames written to the peer.
    pub sent: u64,
    /// Frames dropped: the peer was not connected, its queue was full, the frame was above
    /// [`MAX_FRAME`], or its link closed with the frame still queued.
    pub dropped: u64,
    /// Frames received from the peer and handed to the inbox.
    pub received: u64,
    /// Frames from the peer refused (did not decode, another sender, too long), each of
    /// which closed the link.
    pub refused: u64,
}

/// The connections of one node to each of its peers. See the module documentation.
pub struct Links {
    shared: Arc<Shared>,
    local: SocketAddr,
    /// A handle on the acceptor's listener, to wake it when stopping.
    listener: TcpListener,
    acceptor: Option<JoinHandle<()>>,
    peers: BTreeMap<u64, Peer>,
}

/// What every thread of one [`Links`] shares.
struct Shared {
    me: u64,
    cluster: u64,
    /// This node's data directory incarnation, told in every handshake it sends.
    incarnation: u64,
    /// The incarnation the cluster knows each node id by ([`Links::record_incarnation`]).
    known: Mutex<BTreeMap<u64, u64>>,
    stop: AtomicBool,
    inbox: flume::Sender<Inbound>,
    /// TLS on every connection, when set.
    tls: Option<PeerTls>,
    /// Incoming connections refused at their handshake.
    refused_handshakes: AtomicU64,
    /// The connections whose handshake is being read, by a number of their own, to close
    /// when stopping.
    pending: Mutex<BTreeMap<u64, TcpStream>>,
    /// The number the next pending connection gets.
    next_pending: AtomicU64,
}

/// [`Links`]' handle on one peer's link thread.
struct Peer {
    state: Arc<PeerState>,
    frames: flume::Sender<Vec<u8>>,
    control: flume::Sender<Control>,
    thread: Option<JoinHandle<()>>,
}

/// One peer's state, shared by [`Links`], its link thread and its reader.
struct PeerState {
    id: u64,
    addr: String,
    connected: AtomicBool,
    connects: AtomicU64,
    sent: AtomicU64,
    dropped: AtomicU64,
    received: AtomicU64,
    refused: AtomicU64,
    /// The live connection, to close when stopping.
    current: Mutex<Option<TcpStream>>,
    /// When a refusal by the peer was last said at warning level.
    last_refusal: Mutex<Option<Instant>>,
}

/// One peer connection: its socket and, on a TLS link, its session.
struct Conn {
    tcp: TcpStream,
    tls: Option<Session>,
}

impl Conn {
    /// The reading half, on a handle of its own on the socket.
    fn input(&self) -> io::Result<Input> {
        let tcp = self.tcp.try_clone()?;
        Ok(match &self.tls {
            None => Input::Plain(BufReader::with_capacity(READ_BUFFER, tcp)),
            Some(s) => Input::Tls(TlsRead::new(tcp, Arc::clone(s))),
        })
    }

    /// The writing half.
    fn output(self) -> Output {
        match self.tls {
            None => Output::Plain(BufWriter::with_capacity(WRITE_BUFFER, self.tcp)),
            Some(s) => Output::Tls(TlsWrite::new(self.tcp, s)),
        }
    }
}

/// The reading half of a connection: buffered reads of the socket, or the TLS session's
/// plaintext (which is buffered already).
enum Input {
    Plain(BufReader<TcpStream>),
    Tls(TlsRead),
}

impl Input {
    fn socket(&self) -> &TcpStream {
        match self {
            Input::Plain(r) => r.get_ref(),
            Input::Tls(r) => r.socket(),
        }
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::Plain(r) => r.read(buf),
            Input::Tls(r) => r.read(buf),
        }
    }
}

/// The writing half of a connection: a buffer in front of the socket, or the TLS session.
enum Output {
    Plain(BufWriter<TcpStream>),
    Tls(TlsWrite),
}

impl Output {
    fn socket(&self) -> &TcpStream {
        match self {
            Output::Plain(w) => w.get_ref(),
            Output::Tls(w) => w.socket(),
        }
    }
}

/// What a link thread is told besides frames to send.
enum Control {
    /// The acceptor took a connection from this peer (handshake checked).
    Accepted(Conn),
    /// The reader of connection `generation` ended; the link is down.
    Closed(u64),
    /// [`Links`] is being dropped.
    Stop,
}

impl Links {
    /// Binds the peer listener at `bind` (`HOST:PORT`; port 0 picks a free port, see
    /// [`Links::local_addr`]), then starts as [`Links::start_on`].
    ///
    /// # Errors
    /// The bind's error (address in use, not resolvable, ...), or a thread that cannot start.
    pub fn start(me: Identity, bind: &str, peers: &BTreeMap<u64, String>, tls: Option<PeerTls>, inbox: flume::Sender<Inbound>) -> io::Result<Links> {
        let listener = TcpListener::bind(bind)?;
        Links::start_on(listener, me, peers, tls, inbox)
    }

    /// Starts the links of node `me` on an already bound listener: an acceptor
    /// thread and one link per peer of `peers` (node id to `HOST:PORT`; an entry for `me` is
    /// ignored). Every peer's messages go to `inbox`, one [`Inbound`] per frame; a bounded inbox
    /// that is full holds the readers (and through TCP the senders) back. With `tls`, every
    /// connection is mutual TLS ([`super::tls`]): a peer is reached and accepted only over TLS,
    /// with a certificate of the CA valid for the host `peers` lists it at.
    ///
    /// Binding first lets a caller learn every node's port before any starts, as tests with
    /// several nodes on port 0 do: bind each node's listener, build the peer maps from their
    /// `local_addr`, then start each.
    ///
    /// # Errors
    /// Cloning the listener's handle, or a thread that cannot start.
    pub fn start_on(
        listener: TcpListener,
        me: Identity,
        peers: &BTreeMap<u64, String>,
        tls: Option<PeerTls>,
        inbox: flume::Sender<Inbound>,
    ) -> io::Result<Links> {
        let local = listener.local_addr()?;
        let handle = listener.try_clone()?;
        let Identity { node: me, cluster, incarnation } = me;
        let shared = Arc::new(Shared {
            me,
            cluster,
            incarnation,
            known: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
            inbox,
            tls,
            refused_handshakes: AtomicU64::new(0),
            pending: Mutex::new(BTreeMap::new()),
            next_pending: AtomicU64::new(0),
        });
        let mut links = Links { shared: Arc::clone(&shared), local, listener: handle, acceptor: None, peers: BTreeMap::new() };
        for (&id, addr) in peers.iter().filter(|(&id, _)| id != me) {
            let state = Arc::new(PeerState {
                id,
                addr: addr.clone(),
                connected: AtomicBool::new(false),
                connects: AtomicU64::new(0),
                sent: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                received: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                current: Mutex::new(None),
                last_refusal: Mutex::new(None),
            });
            let (frames_tx, frames) = flume::bounded(QUEUE_FRAMES);
            let (control_tx, control) = flume::unbounded();
            let link = Link { shared: Arc::clone(&shared), state: Arc::clone(&state), frames, control, control_tx: control_tx.clone(), generation: 0 };
            // Registered before the thread starts, so that a failure to start stops those
            // already running (Drop).
            links.peers.insert(id, Peer { state, frames: frames_tx, control: control_tx, thread: None });
            let thread = std::thread::Builder::new().name(format!("tephra-link-{id}")).spawn(move || link.run())?;
            if let Some(peer) = links.peers.get_mut(&id) {
                peer.thread = Some(thread);
            }
        }
        let routes: BTreeMap<u64, Route> = links.peers.iter().map(|(&id, p)| (id, Route { control: p.control.clone(), addr: p.state.addr.clone() })).collect();
        let routes = Arc::new(routes);
        links.acceptor = Some(std::thread::Builder::new().name("tephra-link-accept".into()).spawn(move || accept(listener, &shared, &routes))?);
        Ok(links)
    }

    /// Queues one frame (bytes made by [`encode_frame`] for node `to`) for node `to`, without
    /// ever blocking: the frame is dropped, and counted in [`LinkStats::dropped`], when the peer
    /// is not connected, its queue holds [`QUEUE_FRAMES`] frames already, or the frame is longer
    /// than [`MAX_FRAME`]. Consensus retransmits what is lost. A `to` that is not a peer is
    /// ignored.
    pub fn send(&self, to: u64, frame: Vec<u8>) {
        let Some(peer) = self.peers.get(&to) else {
            tracing::debug!(to, "no link to node {to}: not among this node's peers; frame dropped");
            return;
        };
        if frame.len() > MAX_FRAME {
            tracing::warn!(to, len = frame.len(), "peer frame for node {to} is {} bytes, above the {MAX_FRAME}-byte limit; dropped", frame.len());
            peer.state.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !peer.state.connected.load(Ordering::Acquire) || peer.frames.try_send(frame).is_err() {
            peer.state.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every peer's link: connected or not, and its counters, by peer id.
    pub fn stats(&self) -> Vec<LinkStats> {
        self.peers
            .values()
            .map(|p| {
                let s = &p.state;
                LinkStats {
                    peer: s.id,
                    addr: s.addr.clone(),
                    connected: s.connected.load(Ordering::Acquire),
                    connects: s.connects.load(Ordering::Relaxed),
                    sent: s.sent.load(Ordering::Relaxed),
                    dropped: s.dropped.load(Ordering::Relaxed),
                    received: s.received.load(Ordering::Relaxed),
                    refused: s.refused.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Whether a connection to peer `to` is up (false for a node that is not a peer).
    pub fn connected(&self, to: u64) -> bool {
        self.peers.get(&to).is_some_and(|p| p.state.connected.load(Ordering::Acquire))
    }

    /// Incoming connections closed at their handshake (another cluster, an unknown node, a
    /// higher id dialing, no handshake in time).
    pub fn refused_handshakes(&self) -> u64 {
        self.shared.refused_handshakes.load(Ordering::Relaxed)
    }

    /// The address the peer listener is bound to (the port chosen when bound with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Records that the cluster knows node `node` by data directory incarnation
    /// `incarnation`: from then on a handshake from `node` telling another one (0 included)
    /// is refused with an [`encode_refusal`] answer. The node loop records what the directory
    /// holds for each member.
    pub fn record_incarnation(&self, node: u64, incarnation: u64) {
        lock(&self.shared.known).insert(node, incarnation);
    }
}

/// Who a node is on its peer links: what its handshakes tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The node's id (non-zero).
    pub node: u64,
    /// The cluster's id (`config::cluster_id` of every member's id).
    pub cluster: u64,
    /// The incarnation of the node's data directory (drawn at random when it was made; 0:
    /// not told).
    pub incarnation: u64,
}

impl Drop for Links {
    /// Stops every thread and closes every socket: the listener, a handshake in progress, each
    /// peer's connection; then joins the threads.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, s) in std::mem::take(&mut *lock(&self.shared.pending)) {
            let _ = s.shutdown(Shutdown::Both);
        }
        // On Linux a blocked accept returns once its listening socket is shut down.
        let _ = socket2::SockRef::from(&self.listener).shutdown(Shutdown::Both);
        for peer in self.peers.values() {
            let _ = peer.control.send(Control::Stop);
            if let Some(s) = lock(&peer.state.current).as_ref() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for peer in self.peers.values_mut() {
            if let Some(t) = peer.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why reading a frame stopped.
enum ReadError {
    /// The connection failed or ended.
    Io(io::Error),
    /// The length prefix is above [`MAX_FRAME`].
    TooLong(usize),
}

/// Reads one length-prefixed frame.
fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, ReadError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(ReadError::Io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ReadError::TooLong(len));
    }
    // Grown as bytes arrive, not reserved whole on a peer's word.
    let mut frame = Vec::new();
    r.take(len as u64).read_to_end(&mut frame).map_err(ReadError::Io)?;
    if frame.len() < len {
        return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(frame)
}

/// A frame's length prefix.
fn length_prefix(frame: &[u8]) -> io::Result<[u8; 4]> {
    u32::try_from(frame.len()).map(u32::to_le_bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame above 4 GiB"))
}

/// Writes one length-prefixed frame (buffered).
fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(&length_prefix(frame)?)?;
    w.write_all(frame)
}

/// Writes length-prefixed `frames` into a TLS session: the prefixes and the frames go in as
/// they are (no copy before encryption), many frames to a record.
fn write_frames_tls(w: &mut TlsWrite, frames: &[Vec<u8>]) -> io::Result<()> {
    let prefixes = frames.iter().map(|f| length_prefix(f)).collect::<io::Result<Vec<_>>>()?;
    let mut slices: Vec<IoSlice<'_>> = prefixes.iter().zip(frames).flat_map(|(p, f)| [IoSlice::new(p), IoSlice::new(f)]).collect();
    w.write_all_slices(&mut slices)
}

/// Socket options of every peer connection: no Nagle delay, bounded writes, keepalive probes
/// that find a peer gone without a word within seconds.
fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(5)).with_interval(Duration::from_secs(1)).with_retries(3);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Where the acceptor hands a peer's connections: its link thread, and the address this node
/// lists it at (which its TLS certificate must be valid for).
struct Route {
    control: flume::Sender<Control>,
    addr: String,
}

/// The acceptor: takes each incoming connection and reads its handshake on a thread of its
/// own (at most [`MAX_HANDSHAKES`] at once, each within [`HANDSHAKE_TIMEOUT`] in all), so a
/// connection that sends its handshake slowly or never holds up no other.
fn accept(listener: TcpListener, shared: &Arc<Shared>, routes: &Arc<BTreeMap<u64, Route>>) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let (stream, remote) = match accepted {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "peer listener could not accept a connection");
                std::thread::sleep(MIN_BACKOFF);
                continue;
            }
        };
        let number = shared.next_pending.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = lock(&shared.pending);
            if pending.len() >= MAX_HANDSHAKES {
                drop(pending);
                shared.refused_handshakes.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%remote, "refused a peer connection from {remote}: {MAX_HANDSHAKES} handshakes are being read already");
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            }
            if let Ok(handle) = stream.try_clone() {
                pending.insert(number, handle);
            }
        }
        // Checked after publishing the pending connection, which Drop closes after setting
        // `stop`.
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let (shared_h, routes_h) = (Arc::clone(shared), Arc::clone(routes));
        let spawned = std::thread::Builder::new().name("tephra-link-hello".into()).spawn(move || {
            let checked = handshake(&stream, &shared_h, &routes_h);
            lock(&shared_h.pending).remove(&number);
            settle_handshake(stream, remote, checked, &shared_h, &routes_h);
        });
        if let Err(e) = spawned {
            lock(&shared.pending).remove(&number);
            tracing::warn!(%remote, error = %e, "refused a peer connection from {remote}: no thread to read its handshake");
        }
    }
}

/// Why a handshake was refused.
struct Refusal {
    why: String,
    /// The dialer's id and the TLS session, when the dialer is told ([`encode_refusal`]): the
    /// cluster knows its id by another data directory.
    answer: Option<(u64, Option<Session>)>,
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, answer: None }
    }
}

/// Hands a connection whose handshake checked out to its peer's link thread, or closes it
/// saying why (to the dialer too, when it is to stop for good).
fn settle_handshake(stream: TcpStream, remote: SocketAddr, checked: Result<(u64, Option<Session>), Refusal>, shared: &Shared, routes: &BTreeMap<u64, Route>) {
    match checked {
        Ok((from, tls)) => {
            if let Some(route) = routes.get(&from) {
                let _ = route.control.send(Control::Accepted(Conn { tcp: stream, tls }));
            }
        }
        Err(Refusal { why, answer }) => {
            shared.refused_handshakes.fetch_add(1, Ordering::Relaxed);
            if !shared.stop.load(Ordering::SeqCst) {
                tracing::warn!(%remote, "refused a peer connection from {remote}: {why}");
            }
            if let Some((to, tls)) = answer {
                let frame = encode_refusal(shared.cluster, shared.me, to, &why);
                let sent = match tls {
                    None => write_frame(&mut &stream, &frame),
                    Some(s) => stream.try_clone().and_then(|h| {
                        let mut w = TlsWrite::new(h, s);
                        write_frames_tls(&mut w, &[frame])?;
                        w.flush()
                    }),
                };
                if let Err(e) = sent {
                    tracing::debug!(%remote, error = %e, "could not tell node {to} why its connection was refused");
                }
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// A reader that gives up once `until` has passed, however the bytes trickle in: each read
/// waits at most for what is left.
struct Deadline<'s, R> {
    inner: R,
    socket: &'s TcpStream,
    until: Instant,
}

impl<R: Read> Read for Deadline<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake took too long"));
        }
        self.socket.set_read_timeout(Some(left))?;
        self.inner.read(buf)
    }
}

/// Makes an accepted connection's TLS handshake (on a TLS link), then reads and checks its
/// handshake frame: the sender's id and the TLS session, or why it is refused.
fn handshake(stream: &TcpStream, shared: &Shared, routes: &BTreeMap<u64, Route>) -> Result<(u64, Option<Session>), Refusal> {
    configure(stream).map_err(|e| format!("socket options: {e}"))?;
    let until = Instant::now() + HANDSHAKE_TIMEOUT;
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| e.to_string())?;
    let session = match &shared.tls {
        None => None,
        Some(tls) => Some(tls.accept(stream, until).map_err(|e| {
            format!("TLS handshake failed: {e} (every node needs [tls] with a certificate signed by the CA each node names as cluster.tls_ca)")
        })?),
    };
    let read = match &session {
        None => read_frame(&mut Deadline { inner: stream, socket: stream, until }),
        Some(s) => {
            let tcp = stream.try_clone().map_err(|e| e.to_string())?;
            read_frame(&mut Deadline { inner: TlsRead::new(tcp, Arc::clone(s)), socket: stream, until })
        }
    };
    let frame = read.map_err(|e| match e {
        ReadError::Io(e) => format!("no handshake within {HANDSHAKE_TIMEOUT:?}: {e}"),
        ReadError::TooLong(len) => format!("handshake length {len} is above the {MAX_FRAME}-byte limit"),
    })?;
    let hello = match decode_frame_removals(&frame, shared.cluster, shared.me) {
        Ok(hello) => hello,
        // A node configured with another set of nodes: it is told why, so that it can say so
        // (it goes on trying, as its configuration or ours may be the one to change).
        Err(e @ PeerError::ForeignCluster { .. }) => {
            let why = format!("bad handshake: {e}: the two nodes' cluster.peers name different sets of nodes (this one: {:?})", members(shared.me, routes));
            let answer = <PeerFrame as prost::Message>::decode(frame.as_slice()).ok().map(|f| (f.from, session));
            return Err(Refusal { why, answer });
        }
        Err(e) => return Err(format!("bad handshake: {e}").into()),
    };
    let from = hello.from;
    if !routes.contains_key(&from) {
        return Err(format!("node {from} is not among this node's peers").into());
    }
    if from > shared.me {
        return Err(format!("node {from} dialed node {} but the lower id dials", shared.me).into());
    }
    if !hello.messages.is_empty() || !hello.removed.is_empty() || !hello.refused.is_empty() {
        return Err(format!("node {from}'s handshake carries more than its identity").into());
    }
    if let (Some(s), Some(route)) = (&session, routes.get(&from)) {
        PeerTls::check_name(s, &route.addr).map_err(|e| format!("node {from}: {e}"))?;
    }
    let known = lock(&shared.known).get(&from).copied();
    if let Some(known) = known.filter(|&k| k != hello.incarnation) {
        let why = format!(
            "the cluster knows node {from} by a data directory of incarnation {known:016x}, and this connection's is {:016x}: another process runs with that node's id, or its data directory was lost or replaced",
            hello.incarnation
        );
        return Err(Refusal { why, answer: Some((from, session)) });
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((from, session))
}

/// Every node id of this node's cluster, in order.
fn members(me: u64, routes: &BTreeMap<u64, Route>) -> Vec<u64> {
    let mut ids: Vec<u64> = routes.keys().copied().chain([me]).collect();
    ids.sort_unstable();
    ids
}

/// One peer's link thread: it dials (lower id) or takes accepted connections (higher id),
/// starts a reader on each, and writes the queued frames.
struct Link {
    shared: Arc<Shared>,
    state: Arc<PeerState>,
    frames: flume::Receiver<Vec<u8>>,
    control: flume::Receiver<Control>,
    /// Given to readers, to report their end.
    control_tx: flume::Sender<Control>,
    /// Counts connections, so that a stale reader's [`Control::Closed`] is told apart.
    generation: u64,
}

/// Why a dial failed.
enum Dial {
    /// No connection: the address does not resolve, nothing listens, the socket failed.
    Unreachable(io::Error),
    /// Connected, but the TLS handshake failed (the peer's certificate is refused, the peer
    /// refused ours or does not speak TLS, no handshake in time).
    Tls(io::Error),
}

/// How serving one connection ended.
enum End {
    /// The connection failed or the peer closed it.
    Closed,
    /// A newer connection from the peer replaces it.
    Replaced(Conn),
    /// The links are stopping.
    Stop,
}

impl Link {
    fn dials(&self) -> bool {
        self.shared.me < self.state.id
    }

    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    fn run(mut self) {
        let mut next: Option<Conn> = None;
        let mut backoff = MIN_BACKOFF;
        loop {
            if self.stopping() {
                return;
            }
            let stream = match next.take() {
                Some(s) => s,
                None if self.dials() => match self.dial() {
                    Ok(s) => s,
                    Err(e) => {
                        self.dial_failed(&e);
                        match self.pause(backoff) {
                            Some(End::Stop) => return,
                            Some(End::Replaced(s)) => next = Some(s),
                            _ => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                },
                None => match self.control.recv() {
                    Ok(Control::Accepted(s)) => s,
                    Ok(Control::Closed(_)) => continue,
                    Ok(Control::Stop) | Err(_) => return,
                },
            };
            let started = Instant::now();
            match self.serve(stream) {
                End::Stop => return,
                End::Replaced(s) => next = Some(s),
                End::Closed if self.dials() => {
                    if started.elapsed() >= MAX_BACKOFF {
                        backoff = MIN_BACKOFF;
                    }
                    match self.pause(backoff) {
                        Some(End::Stop) => return,
                        Some(End::Replaced(s)) => next = Some(s),
                        _ => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                End::Closed => {}
            }
        }
    }

    /// Logs a failed dial: a peer that cannot be reached at debug level (it may just be down),
    /// a failed TLS handshake as a warning (a certificate or configuration to fix).
    fn dial_failed(&self, e: &Dial) {
        let (peer, addr) = (self.state.id, &self.state.addr);
        match e {
            Dial::Unreachable(e) => tracing::debug!(peer, error = %e, "could not reach node {peer} at {addr}"),
            Dial::Tls(e) if !self.stopping() => tracing::warn!(peer, "link to node {peer}: TLS handshake with {addr} failed; trying again: {e}"),
            Dial::Tls(_) => {}
        }
    }

    /// Waits `d` before the next dial; `Some` when told to stop (or handed a connection).
    fn pause(&self, d: Duration) -> Option<End> {
        let deadline = Instant::now() + d;
        loop {
            match self.control.recv_deadline(deadline) {
                Ok(Control::Stop) | Err(flume::RecvTimeoutError::Disconnected) => return Some(End::Stop),
                Ok(Control::Accepted(s)) => return Some(End::Replaced(s)),
                Ok(Control::Closed(_)) => continue,
                Err(flume::RecvTimeoutError::Timeout) => return None,
            }
        }
    }

    /// Connects to the peer, makes the TLS handshake (on a TLS link) and sends the handshake
    /// frame.
    fn dial(&self) -> Result<Conn, Dial> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{} resolves to no address", self.state.addr));
        for addr in self.state.addr.to_socket_addrs().map_err(Dial::Unreachable)? {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    // Published so that stopping the links closes a TLS handshake waiting on the
                    // peer; checked after publishing, as Drop closes `current` after setting
                    // `stop`.
                    *lock(&self.state.current) = stream.try_clone().ok();
                    if self.stopping() {
                        return Err(Dial::Unreachable(io::Error::other("the links are stopping")));
                    }
                    let greeted = self.greet(stream);
                    if greeted.is_err() {
                        lock(&self.state.current).take();
                    }
                    return greeted;
                }
                Err(e) => last = e,
            }
        }
        Err(Dial::Unreachable(last))
    }

    /// Makes a dialed connection's TLS handshake (on a TLS link) and sends the handshake frame.
    fn greet(&self, stream: TcpStream) -> Result<Conn, Dial> {
        configure(&stream).map_err(Dial::Unreachable)?;
        let hello = encode_hello(self.shared.cluster, self.shared.me, self.state.id, self.shared.incarnation);
        let Some(tls) = &self.shared.tls else {
            write_frame(&mut &stream, &hello).map_err(Dial::Unreachable)?;
            return Ok(Conn { tcp: stream, tls: None });
        };
        let session = tls.connect(&stream, &self.state.addr, Instant::now() + HANDSHAKE_TIMEOUT).map_err(Dial::Tls)?;
        stream.set_read_timeout(None).map_err(Dial::Unreachable)?;
        let handle = stream.try_clone().map_err(Dial::Unreachable)?;
        write_frames_tls(&mut TlsWrite::new(handle, Arc::clone(&session)), &[hello]).map_err(Dial::Unreachable)?;
        Ok(Conn { tcp: stream, tls: Some(session) })
    }

    /// Serves one connection until it closes, is replaced, or the links stop: a reader
    /// thread on it, and the queued frames written to it.
    fn serve(&mut self, conn: Conn) -> End {
        let peer = self.state.id;
        self.generation += 1;
        let generation = self.generation;
        let reader = match (conn.input(), conn.tcp.try_clone()) {
            (Ok(r), Ok(handle)) => {
                *lock(&self.state.current) = Some(handle);
                let (shared, state, control) = (Arc::clone(&self.shared), Arc::clone(&self.state), self.control_tx.clone());
                std::thread::Builder::new().name(format!("tephra-link-{peer}-read")).spawn(move || read(r, generation, &shared, &state, &control))
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let reader = match reader {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(peer, error = %e, "link to node {peer}: could not start its reader");
                lock(&self.state.current).take();
                let _ = conn.tcp.shutdown(Shutdown::Both);
                return End::Closed;
            }
        };
        // Stop may have come between the check in `run` and publishing `current`.
        if self.stopping() {
            let _ = conn.tcp.shutdown(Shutdown::Both);
        }
        self.state.connects.fetch_add(1, Ordering::Relaxed);
        self.state.connected.store(true, Ordering::Release);
        tracing::info!(peer, addr = %self.state.addr, "link to node {peer} is up");
        let mut out = conn.output();
        let end = loop {
            let event = flume::Selector::new().recv(&self.frames, |f| f.map_or(Err(None), Ok)).recv(&self.control, |c| Err(c.ok())).wait();
            match event {
                Ok(frame) => {
                    if let Err(e) = self.write(&mut out, frame) {
                        if !self.stopping() {
                            tracing::warn!(peer, error = %e, "link to node {peer}: write failed; closing it");
                        }
                        break End::Closed;
                    }
                }
                Err(Some(Control::Closed(g))) if g == generation => break End::Closed,
                Err(Some(Control::Closed(_))) => continue,
                Err(Some(Control::Accepted(s))) => {
                    tracing::info!(peer, "link to node {peer}: a newer connection replaces this one");
                    break End::Replaced(s);
                }
                Err(Some(Control::Stop)) | Err(None) => break End::Stop,
            }
        };
        self.state.connected.store(false, Ordering::Release);
        lock(&self.state.current).take();
        let _ = out.socket().shutdown(Shutdown::Both);
        let _ = reader.join();
        let stale = self.frames.drain().count() as u64;
        self.state.dropped.fetch_add(stale, Ordering::Relaxed);
        if matches!(end, End::Closed) {
            tracing::info!(peer, "link to node {peer} is down");
        }
        end
    }

    /// Writes `first` and whatever else is queued, then flushes.
    fn write(&self, out: &mut Output, first: Vec<u8>) -> io::Result<()> {
        let out = match out {
            Output::Plain(out) => out,
            Output::Tls(out) => return self.write_tls(out, first),
        };
        write_frame(out, &first)?;
        self.state.sent.fetch_add(1, Ordering::Relaxed);
        for frame in self.frames.try_iter().take(QUEUE_FRAMES) {
            write_frame(out, &frame)?;
            self.state.sent.fetch_add(1, Ordering::Relaxed);
        }
        out.flush()
    }

    /// [`Link::write`] on a TLS link: `first` and whatever else is queued go into the session
    /// in batches of about [`WRITE_BUFFER`] bytes, each sent before the next is taken.
    fn write_tls(&self, out: &mut TlsWrite, first: Vec<u8>) -> io::Result<()> {
        let mut queued = self.frames.try_iter().take(QUEUE_FRAMES);
        let mut batch = vec![first];
        loop {
            let mut bytes = batch[0].len();
            while bytes < WRITE_BUFFER {
                let Some(frame) = queued.next() else { break };
                bytes += frame.len();
                batch.push(frame);
            }
            write_frames_tls(out, &batch)?;
            self.state.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
            batch.clear();
            match queued.next() {
                Some(frame) => batch.push(frame),
                None => return out.flush(),
            }
        }
    }
}

/// A connection's reader: decodes each frame and hands its messages to the inbox, until the
/// connection ends or a frame is refused; then closes the connection and tells the link thread.
fn read(mut input: Input, generation: u64, shared: &Shared, state: &PeerState, control: &flume::Sender<Control>) {
    let peer = state.id;
    loop {
        let refusal = match read_frame(&mut input) {
            // What a TLS session refused (an alert from the peer, such as its refusal of this
            // node's certificate, or a record that does not decrypt): worth a warning.
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::InvalidData && !shared.stop.load(Ordering::SeqCst) => {
                tracing::warn!(peer, "link to node {peer}: TLS session failed, closing the link: {e}");
                None
            }
            Err(ReadError::Io(e)) => {
                if !shared.stop.load(Ordering::SeqCst) {
                    tracing::debug!(peer, error = %e, "link to node {peer}: connection ended");
                }
                None
            }
            Err(ReadError::TooLong(len)) => Some(format!("frame length {len} is above the {MAX_FRAME}-byte limit")),
            Ok(frame) => match decode_frame_removals(&frame, shared.cluster, shared.me) {
                // The peer, of another cluster, refused this node's handshake and says why.
                Err(e @ PeerError::ForeignCluster { .. }) => match refusal_of(&frame) {
                    None => Some(e.to_string()),
                    Some(why) => {
                        state.refused.fetch_add(1, Ordering::Relaxed);
                        // Said once a minute: the dialer tries again every second.
                        let mut last = lock(&state.last_refusal);
                        if last.is_none_or(|t| t.elapsed() >= REFUSAL_EVERY) {
                            tracing::warn!(peer, "node {peer} refused this node's link: {why}");
                            *last = Some(Instant::now());
                        } else {
                            tracing::debug!(peer, "node {peer} refused this node's link: {why}");
                        }
                        None
                    }
                },
                Err(e) => Some(e.to_string()),
                Ok(f) if f.from != peer => Some(format!("frame from node {} on the link of node {peer}", f.from)),
                // The peer refused this node's handshake (it knows this node's id by another
                // data directory): the node is told, and the connection is over.
                Ok(f) if !f.refused.is_empty() => {
                    state.received.fetch_add(1, Ordering::Relaxed);
                    deliver(shared, Inbound { from: f.from, messages: Vec::new(), removed: Vec::new(), refused: Some(f.refused) });
                    None
                }
                Ok(f) if f.messages.is_empty() && f.removed.is_empty() => continue,
                Ok(f) => {
                    state.received.fetch_add(1, Ordering::Relaxed);
                    if deliver(shared, Inbound { from: f.from, messages: f.messages, removed: f.removed, refused: None }) {
                        continue;
                    }
                    None
                }
            },
        };
        if let Some(why) = refusal {
            state.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer, "link to node {peer}: refused a frame, closing the link: {why}");
        }
        break;
    }
    let _ = input.socket().shutdown(Shutdown::Both);
    let _ = control.send(Control::Closed(generation));
}

/// The reason in a refusal frame ([`encode_refusal`]) whatever its cluster, if `frame` is one.
fn refusal_of(frame: &[u8]) -> Option<String> {
    <PeerFrame as prost::Message>::decode(frame).ok().map(|f| f.refused).filter(|r| !r.is_empty())
}

/// Hands `inbound` to the inbox, waiting while it is full; false when the links stop or the
/// inbox is gone.
fn deliver(shared: &Shared, mut inbound: Inbound) -> bool {
    loop {
        match shared.inbox.send_timeout(inbound, INBOX_POLL) {
            Ok(()) => return true,
            Err(flume::SendTimeoutError::Timeout(back)) if !shared.stop.load(Ordering::SeqCst) => inbound = back,
            Err(_) => return false,
        }
    }
}
