//! A loopback TCP proxy for fault injection: it listens on `127.0.0.1:0` and forwards every
//! connection to one target, byte for byte, until told otherwise. A cluster test puts one in
//! front of each peer link (the dialing node lists the proxy as its peer's address), so that a
//! partition is a set of proxies told to cut or hold, and a slow network is a delay.
//!
//! | mode | live connections | new connections |
//! |---|---|---|
//! | [`Mode::Open`] | bytes flow (after the delay, when one is set) | accepted, forwarded |
//! | [`Mode::Cut`] | closed at once, both ends | accepted and closed at once (the dialer sees the connection drop) |
//! | [`Mode::Hold`] | kept open, but no byte moves either way until the mode changes: what a silent partition looks like to TCP (a writer blocks once the buffers fill) | accepted and connected, then held the same way |
//!
//! Leaving `Hold` for `Open` delivers what was held, in order; leaving it for `Cut` drops it.
//! Threads: one acceptor, and per connection one reader and one writer per direction (a
//! reader hands chunks, stamped with the time they arrived, to its writer through a bounded
//! queue, so that a delay delays each byte without slowing the stream).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a proxy does with the bytes it is given; see the module's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward.
    Open,
    /// Close every connection, and every new one at once.
    Cut,
    /// Keep connections open but move no byte.
    Hold,
}

/// How long one upstream connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Chunks that may wait between one direction's reader and writer.
const QUEUE_CHUNKS: usize = 64;
/// Largest chunk read at once.
const CHUNK: usize = 64 << 10;
/// How often a waiting thread looks whether the proxy is stopping.
const POLL: Duration = Duration::from_millis(100);

/// A running proxy. Dropping it closes the listener and every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    target: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    mode: Mode,
    delay: Duration,
    stopping: bool,
    /// Both sockets of every live connection, to close them on a cut.
    live: Vec<(u64, TcpStream, TcpStream)>,
    next_conn: u64,
    /// Connections accepted since start.
    accepted: u64,
}

impl Proxy {
    /// Starts a proxy to `target` on a free loopback port, open and without delay.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = State { mode: Mode::Open, delay: Duration::ZERO, stopping: false, live: Vec::new(), next_conn: 0, accepted: 0 };
        let shared = Arc::new(Shared { target, state: Mutex::new(state), changed: Condvar::new() });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new().name(format!("proxy-{addr}")).spawn(move || accept(listener, &s)).expect("spawn the proxy's acceptor");
        Proxy { addr, shared, acceptor: Some(acceptor) }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.lock().mode
    }

    /// Connections accepted since start (cut ones included).
    pub fn accepted(&self) -> u64 {
        self.shared.lock().accepted
    }

    /// Connections open now.
    pub fn live(&self) -> usize {
        self.shared.lock().live.len()
    }

    /// Switches to `mode`; [`Mode::Cut`] closes every live connection before it returns.
    pub fn set_mode(&self, mode: Mode) {
        let mut st = self.shared.lock();
        st.mode = mode;
        if mode == Mode::Cut {
            for (_, a, b) in st.live.drain(..) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    /// [`Proxy::set_mode`] with [`Mode::Cut`].
    pub fn cut(&self) {
        self.set_mode(Mode::Cut);
    }

    /// [`Proxy::set_mode`] with [`Mode::Hold`].
    pub fn hold(&self) {
        self.set_mode(Mode::Hold);
    }

    /// [`Proxy::set_mode`] with [`Mode::Open`] and no delay.
    pub fn heal(&self) {
        self.set_delay(Duration::ZERO);
        self.set_mode(Mode::Open);
    }

    /// Delays every byte by `delay` from when the proxy read it (both directions).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.lock().delay = delay;
        self.shared.changed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stopping = true;
            for (_, a, b) in st.live.drain(..) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // Wake the acceptor from its blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets connection `id` (it closed).
    fn forget(&self, id: u64) {
        self.lock().live.retain(|(i, _, _)| *i != id);
    }
}

fn accept(listener: TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(client) = stream else { continue };
        let mode = {
            let mut st = shared.lock();
            if st.stopping {
                return;
            }
            st.accepted += 1;
            st.mode
        };
        if mode == Mode::Cut {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(upstream) = TcpStream::connect_timeout(&shared.target, CONNECT_TIMEOUT) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let Ok(handles) = clones(&client, &upstream) else { continue };
        let id = {
            let mut st = shared.lock();
            // A cut between the accept and here: close this one too.
            if st.mode == Mode::Cut || st.stopping {
                let _ = client.shutdown(Shutdown::Both);
                let _ = upstream.shutdown(Shutdown::Both);
                continue;
            }
            let id = st.next_conn;
            st.next_conn += 1;
            st.live.push((id, handles.0, handles.1));
            id
        };
        let Ok((client2, upstream2)) = clones(&client, &upstream) else {
            shared.forget(id);
            continue;
        };
        pump(id, shared, client, upstream2);
        pump(id, shared, upstream, client2);
    }
}

fn clones(a: &TcpStream, b: &TcpStream) -> std::io::Result<(TcpStream, TcpStream)> {
    Ok((a.try_clone()?, b.try_clone()?))
}

/// Starts the reader and writer that move bytes from `from` to `to`.
fn pump(id: u64, shared: &Arc<Shared>, from: TcpStream, to: TcpStream) {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let Ok(from2) = from.try_clone() else {
        close(id, shared, &from, &to);
        return;
    };
    let _ = std::thread::Builder::new().name("proxy-read".into()).spawn(move || read(from, &tx));
    let s = Arc::clone(shared);
    let _ = std::thread::Builder::new().name("proxy-write".into()).spawn(move || write(id, &s, &from2, to, &rx));
}

fn close(id: u64, shared: &Shared, a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
    shared.forget(id);
}

/// Reads `from` until it ends; the writer then sends what is queued (unless cut) and closes
/// both ends.
fn read(mut from: TcpStream, tx: &SyncSender<(Instant, Vec<u8>)>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
}

fn write(id: u64, shared: &Shared, from: &TcpStream, mut to: TcpStream, rx: &Receiver<(Instant, Vec<u8>)>) {
    loop {
        let (at, chunk) = match rx.recv_timeout(POLL) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) => {
                if shared.lock().stopping {
                    break;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        // Wait while held, and until the chunk's delay has passed.
        let mut st = shared.lock();
        loop {
            if st.stopping || st.mode == Mode::Cut {
                drop(st);
                close(id, shared, from, &to);
                return;
            }
            let due = at + st.delay;
            let now = Instant::now();
            if st.mode == Mode::Open && now >= due {
                break;
            }
            let wait = if st.mode == Mode::Hold { POLL } else { (due - now).min(POLL) };
            st = shared.changed.wait_timeout(st, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(st);
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    close(id, shared, from, &to);
}
