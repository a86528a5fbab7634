//! The shards: starting them, binding their `SO_REUSEPORT` listeners until the address is
//! known to be this server's alone, and each shard's accept loop.

use super::error::StartError;
use super::exclusive::{backoff, foreign_listeners, probe_exclusive, BIND_ATTEMPTS};
use super::{conn, Context, ReplyRouter};
use shards::net::{TcpListener, TcpStream};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What a shard that has bound its listener does next (see [`Launch`]).
#[derive(Clone, Copy)]
enum Word {
    /// Serve: the address is ours alone.
    Accept,
    /// Another server listens there too: close the listener, say so, and wait for the next word.
    Release,
    /// Bind again (after a [`Word::Release`]).
    Bind,
}

/// This shard's listener on `addr`, one of `shards`: `SO_REUSEPORT` (every shard binds the
/// same address, [`steer`] keeps the group to them) and `SO_REUSEADDR` (a restart binds at once
/// even while connections of the previous process sit in TIME_WAIT on the port, as the
/// reference's listener does; glommio's own `bind` sets only the first), backlog 1024. Also
/// returns the socket's inode number (for [`foreign_listeners`]) and its descriptor (owned by
/// the listener).
fn listen(addr: SocketAddr, shards: usize) -> std::io::Result<(TcpListener, u64, std::os::fd::RawFd)> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let sk = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sk.set_reuse_address(true)?;
    sk.set_reuse_port(true)?;
    sk.bind(&addr.into())?;
    sk.listen(LISTEN_BACKLOG)?;
    // A kernel that refuses the program (before Linux 4.5, or a filter forbidding it) leaves
    // the kernel's own choice, which serves our shards just as well.
    if let Err(e) = steer(sk.as_raw_fd(), shards) {
        tracing::warn!(error = %e, "could not attach the listeners' connection steering; another program binding this port with SO_REUSEPORT would get a share of the connections");
    }
    let inode = nix::sys::stat::fstat(sk.as_raw_fd())?.st_ino;
    let fd = sk.into_raw_fd();
    // SAFETY: a bound, listening TCP socket whose descriptor is handed over exactly once.
    Ok((unsafe { TcpListener::from_raw_fd(fd) }, inode, fd))
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; not in the libc crate for Linux).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Gives the `SO_REUSEPORT` group of `listener` (one of `shards` listening sockets) a classic BPF
/// program that sends each new connection to a random one of the group's first `shards`
/// sockets. The shards' listeners are the group's first members; any socket another program of
/// the same user binds to the port later joins after them and so never gets a connection,
/// where the kernel's own choice (a hash over all members) would hand it a share of the
/// clients: the reference's exclusive listener refuses such a program, the kernel cannot refuse
/// it here, so it is ignored instead. The program belongs to the group: attaching it from every
/// shard, and again after [`reset_backlog`] listens anew, sets the same one.
///
/// # Errors
/// The kernel refused the program (it needs Linux 4.5); the caller warns and goes on.
fn steer(listener: std::os::fd::RawFd, shards: usize) -> std::io::Result<()> {
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let program = [
        // A = a random u32; A %= shards; return A (the index in the group).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, (libc::SKF_AD_OFF + libc::SKF_AD_RANDOM) as u32),
        stmt(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, shards.max(1) as u32),
        stmt(libc::BPF_RET | libc::BPF_A, 0),
    ];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `program`, both alive for the call; the kernel copies them.
    let r = unsafe {
        libc::setsockopt(
            listener,
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Resets every connection waiting in the accept queue of `listener` (a listening socket's
/// descriptor) and listens again: a shard out of file descriptors cannot accept them, and left
/// in the backlog they would wait for their clients' own timeouts. Shutting a listening socket
/// down resets its queue and keeps its address; `listen` then puts it back in the
/// `SO_REUSEPORT` group. No descriptor is needed (a reserve one, the usual trick, can be taken
/// by another shard the moment it is freed: CI saw a connection hang that way). Returns how
/// many were waiting.
fn reset_backlog(listener: std::os::fd::RawFd, shards: usize) -> std::io::Result<u64> {
    // SAFETY: plain socket calls on a descriptor the caller's listener owns; `info` is a
    // properly sized, writable tcp_info.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // For a listening socket `tcpi_unacked` is the length of its accept queue.
        let waiting = if libc::getsockopt(listener, libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len) == 0 {
            u64::from(info.tcpi_unacked)
        } else {
            0
        };
        if waiting == 0 {
            return Ok(0);
        }
        if libc::shutdown(listener, libc::SHUT_RD) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::listen(listener, LISTEN_BACKLOG) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Back in the group (the group and its program are new when it was the only member).
        // The program was accepted at start; should it be refused now, the socket listens
        // anyway and the kernel's own choice applies.
        if let Err(e) = steer(listener, shards) {
            tracing::warn!(error = %e, "could not set the listeners' connection steering again");
        }
        Ok(waiting)
    }
}

/// The listeners' accept queue length.
const LISTEN_BACKLOG: i32 = 1024;

/// Descriptors kept from connections for the log's own files (a new segment, its spare, an
/// index file, a directory sync): a connection whose descriptor number comes within this (or
/// an eighth of the open-files limit, if less) of that limit is refused at accept. Small on
/// purpose: every segment holds a descriptor, so a large store may leave few free, and a
/// larger reserve refused every connection there (review: 217 segments under a limit of 256).
const FD_RESERVE: u64 = 16;

/// Accept failures, said at most once a second per shard (a shard out of descriptors fails
/// every accept it tries).
#[derive(Default)]
struct AcceptErrors {
    last_said: Option<Instant>,
    failed: u64,
    reset: u64,
}

impl AcceptErrors {
    /// Counts a failed accept; `reset` is how many pending connections were reset after it,
    /// `None` when the failure was not for want of descriptors.
    fn note(&mut self, shard: usize, reset: Option<u64>, e: &dyn std::fmt::Display) {
        self.failed += 1;
        self.reset += reset.unwrap_or(0);
        if self.last_said.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return;
        }
        self.last_said = Some(Instant::now());
        let failed = std::mem::take(&mut self.failed);
        let reset_since = std::mem::take(&mut self.reset);
        if reset.is_some() {
            tracing::warn!(shard, error = %e, failed, reset = reset_since, "accept failed: out of file descriptors; new connections are reset (raise the open-files limit, e.g. LimitNOFILE, or lower server.limits.max_connections)");
        } else {
            tracing::warn!(shard, error = %e, failed, "accept failed");
        }
    }
}

/// What a shard's bind gave: the address bound and the listening socket's inode number, or
/// the address it tried and the error.
type Bound = Result<(SocketAddr, u64), (SocketAddr, std::io::Error)>;

/// The shards of a server being started: their threads, and the channels through which each
/// says what its bind gave and takes its next [`Word`] (one channel of words per shard: a
/// shared one would let a quick shard take two).
pub(super) struct Launch {
    threads: Vec<shards::Executor<()>>,
    words: Vec<flume::Sender<Word>>,
    /// Each shard's own channel for what its bind gave (again after a [`Word::Bind`]): a shard
    /// whose thread dies before it has bound (a thread it cannot start, under a process limit)
    /// is seen at once instead of waited for forever (review: the server hung, never listening,
    /// deaf to SIGTERM).
    bound: Vec<flume::Receiver<Bound>>,
    /// One message per shard that let go of its listener after a [`Word::Release`].
    released: flume::Receiver<()>,
    /// The inode numbers of the shards' listening sockets.
    ours: Vec<u64>,
    /// The address every shard listens on (for port 0, the port shard 0 was given).
    addr: SocketAddr,
}

impl Launch {
    /// Starts `n` shards serving `ctx`, pinned within the CPUs the process was given (its
    /// affinity mask), one after the other: each binds and listens, then waits for the word to
    /// accept, so nothing is accepted until the address is known to be ours alone
    /// ([`Launch::claim_address`]). Shard 0 binds first so `--bind host:0` resolves to one port
    /// every shard shares.
    ///
    /// # Errors
    /// A shard that could not start or bind; the shards already started are stopped.
    pub(super) fn start(ctx: &Arc<Context>, n: usize, bind: SocketAddr) -> Result<Launch, StartError> {
        let placement = shards::placement(n, &shards::allowed_cpus());
        let (released_tx, released) = flume::bounded::<()>(n);
        let mut launch = Launch {
            threads: Vec::with_capacity(n),
            words: Vec::with_capacity(n),
            bound: Vec::with_capacity(n),
            released,
            ours: Vec::with_capacity(n),
            addr: bind,
        };
        for (shard, &cpu) in placement.iter().enumerate() {
            if let Err(e) = launch.start_shard(ctx, shard, n, cpu, released_tx.clone()) {
                return Err(launch.refuse(ctx, e));
            }
        }
        Ok(launch)
    }

    /// Starts shard `shard` of `n` on `cpu` and waits for its bind.
    fn start_shard(&mut self, ctx: &Arc<Context>, shard: usize, n: usize, cpu: Option<usize>, released: flume::Sender<()>) -> Result<(), StartError> {
        let ctx2 = ctx.clone();
        let (tx, bound) = flume::bounded::<Bound>(1);
        let (to_shard, words) = flume::bounded::<Word>(1);
        self.words.push(to_shard);
        let addr = self.addr;
        let thread = shards::spawn_executor(&format!("tephra-shard-{shard}"), cpu, move || shard_main(ctx2, shard, n, addr, tx, words, released))
            .map_err(|source| StartError::ShardSpawn { shard, source })?;
        self.threads.push(thread);
        let got = bound.recv();
        self.bound.push(bound);
        match got {
            Ok(Ok((a, inode))) => {
                self.addr = a;
                self.ours.push(inode);
                Ok(())
            }
            Ok(Err((addr, source))) => Err(StartError::Bind { addr, source }),
            // Its thread has ended: how it ended says why (a runtime that could not be set up,
            // a panic).
            Err(_) => Err(match self.threads.pop().map(shards::Executor::join) {
                Some(Err(shards::ExecutorEnd::Panicked)) => StartError::ShardPanicked { shard },
                Some(Err(shards::ExecutorEnd::Failed(reason))) => StartError::ShardRuntime { shard, reason },
                _ => StartError::ShardEnded { shard },
            }),
        }
    }

    /// Makes sure no other server listens on the address before any connection is accepted.
    ///
    /// The probe before the store was opened and the binds are two steps: a server started in
    /// the same few milliseconds can pass its probe between them and join our listeners
    /// (review: 7 of 30 starts 10 ms apart both listened, and clients were split between two
    /// stores). Looking after our own binds closes that gap: of two such servers at least the
    /// later one sees the other, and a server accepts only once it has looked. When both see
    /// each other, both let go of the address and wait a random while; the first to find it
    /// free binds again and keeps it, the other finds it held and refuses.
    ///
    /// # Errors
    /// [`StartError::AddressShared`] after [`BIND_ATTEMPTS`] binds, or a shard that failed to
    /// bind again; the shards are stopped.
    pub(super) fn claim_address(mut self, ctx: &Context) -> Result<Launch, StartError> {
        match self.settle() {
            Ok(()) => Ok(self),
            Err(e) => Err(self.refuse(ctx, e)),
        }
    }

    /// The loop of [`Launch::claim_address`].
    fn settle(&mut self) -> Result<(), StartError> {
        let mut attempt = 1;
        loop {
            crate::fault::pause_point("before_check");
            let foreign = match foreign_listeners(self.addr, &self.ours) {
                Ok(foreign) => foreign,
                Err(e) => {
                    tracing::warn!(addr = %self.addr, error = %e, "could not list the listening sockets to check the address is ours alone");
                    Vec::new()
                }
            };
            crate::fault::pause_point("after_check");
            if foreign.is_empty() {
                return Ok(());
            }
            let mut holders = foreign.iter().map(|a| a.to_string()).collect::<Vec<_>>();
            holders.dedup();
            let shared = StartError::AddressShared { addr: self.addr, holders };
            if attempt == BIND_ATTEMPTS {
                return Err(shared);
            }
            attempt += 1;
            self.tell(Word::Release);
            if (0..self.words.len()).any(|_| self.released.recv().is_err()) {
                return Err(shared);
            }
            std::thread::sleep(backoff());
            if probe_exclusive(self.addr).is_err() {
                return Err(shared);
            }
            tracing::info!(addr = %self.addr, "another server started on this address at the same moment; binding again");
            self.tell(Word::Bind);
            self.rebound()?;
        }
    }

    /// Collects every shard's answer to a [`Word::Bind`].
    fn rebound(&mut self) -> Result<(), StartError> {
        self.ours.clear();
        for bound in &self.bound {
            match bound.recv() {
                Ok(Ok((_, inode))) => self.ours.push(inode),
                Ok(Err((addr, source))) => return Err(StartError::Bind { addr, source }),
                Err(_) => return Err(StartError::ShardEndedRebinding),
            }
        }
        Ok(())
    }

    /// Tells every shard to start accepting, and returns their threads and the address they
    /// listen on. From here connections are served, so a signal is a graceful shutdown
    /// ([`super::LISTENING`]; before, a client that had its answer could see the process exit
    /// 143: a test caught it under load).
    pub(super) fn accept(self) -> (Vec<shards::Executor<()>>, SocketAddr) {
        super::LISTENING.store(true, Ordering::SeqCst);
        self.tell(Word::Accept);
        (self.threads, self.addr)
    }

    fn tell(&self, w: Word) {
        for t in &self.words {
            let _ = t.send(w);
        }
    }

    /// Stops the shards (dropping the words' senders lets the shards waiting for a word end,
    /// closing their listeners, so they can be joined) and returns `e`.
    fn refuse(self, ctx: &Context, e: StartError) -> StartError {
        let Launch { threads, words, bound, released, .. } = self;
        drop(words);
        ctx.shutdown();
        for s in threads {
            let _ = s.join();
        }
        drop((bound, released));
        e
    }
}

/// A shard's thread: binds its listener, serves the connections it accepts once told to, and
/// returns once shutdown began and all of them have ended.
async fn shard_main(
    ctx: Arc<Context>,
    shard: usize,
    shards: usize,
    addr: SocketAddr,
    bound: flume::Sender<Bound>,
    words: flume::Receiver<Word>,
    released: flume::Sender<()>,
) {
    // Fault injection: the shard's thread dies before it binds, as when a thread it needs
    // cannot be started under a process limit.
    if crate::fault::fires("shard_start") {
        panic!("injected fault: shard {shard} dies before it binds");
    }
    let Some((listener, listener_fd)) = bind_until_accepted(addr, shards, &bound, &words, &released).await else { return };
    accept_loop(ctx, shard, shards, listener, listener_fd).await;
}

/// Binds and listens on `addr`, says what it got through `bound`, and waits for the word:
/// the listener and its descriptor on [`Word::Accept`]; on [`Word::Release`] it lets go of the
/// listener and binds again when told to. `None` when refused (the address is shared, or
/// another shard failed to bind): the listener closes here, resetting whatever connected
/// meanwhile, before any request is read.
async fn bind_until_accepted(
    mut addr: SocketAddr,
    shards: usize,
    bound: &flume::Sender<Bound>,
    words: &flume::Receiver<Word>,
    released: &flume::Sender<()>,
) -> Option<(TcpListener, std::os::fd::RawFd)> {
    loop {
        let (listener, inode, fd) = match listen(addr, shards) {
            Ok(l) => l,
            Err(e) => {
                let _ = bound.send(Err((addr, e)));
                return None;
            }
        };
        let local = listener.local_addr();
        if let Ok(a) = local {
            addr = a;
        }
        let _ = bound.send(local.map(|a| (a, inode)).map_err(|e| (addr, e)));
        match words.recv_async().await {
            Ok(Word::Accept) => return Some((listener, fd)),
            Ok(Word::Release) => {
                drop(listener);
                let _ = released.send(());
                match words.recv_async().await {
                    Ok(Word::Bind) => continue,
                    _ => return None,
                }
            }
            Ok(Word::Bind) | Err(_) => return None,
        }
    }
}

/// Serves the connections `listener` accepts, each on a task of its own, until shutdown
/// begins; then waits for every one of them to end (they notice the shutdown themselves).
async fn accept_loop(ctx: Arc<Context>, shard: usize, shards: usize, listener: TcpListener, listener_fd: std::os::fd::RawFd) {
    let (router, replies) = ReplyRouter::new();
    // Woken by the writer's thread ([`shards::spawn`] makes that wake-up reach a sleeping shard).
    shards::spawn(router.clone().dispatch(replies)).detach();
    let live = Rc::new(std::cell::Cell::new(0usize));
    let closing = Rc::new(event_listener::Event::new());
    let mut accept_errors = AcceptErrors::default();
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            ctx.wait_shutdown().await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                accept_failed(&ctx, shard, shards, listener_fd, &mut accept_errors, &e);
                shards::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if !admit(&ctx, &stream) {
            let _ = stream.shutdown(std::net::Shutdown::Both).await;
            continue;
        }
        ctx.active_connections.fetch_add(1, Ordering::SeqCst);
        live.set(live.get() + 1);
        let (ctx2, router2, live2, closing2) = (ctx.clone(), router.clone(), live.clone(), closing.clone());
        shards::spawn(async move {
            conn::serve(ctx2.clone(), router2, stream).await;
            ctx2.active_connections.fetch_sub(1, Ordering::SeqCst);
            live2.set(live2.get() - 1);
            closing2.notify(usize::MAX);
        })
        .detach();
    }
    drop(listener);
    while live.get() > 0 {
        let l = closing.listen();
        if live.get() == 0 {
            break;
        }
        futures_lite::future::or(l, shards::sleep(std::time::Duration::from_millis(100))).await;
    }
}

/// Counts and says a failed accept. Out of descriptors, the pending connections would wait in
/// the backlog for their clients' own timeouts: they are reset now (review: 33 of 60 Hellos
/// hung, and the log took ~190 lines a second).
fn accept_failed(ctx: &Context, shard: usize, shards: usize, listener_fd: std::os::fd::RawFd, errors: &mut AcceptErrors, e: &std::io::Error) {
    if !matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
        errors.note(shard, None, e);
        return;
    }
    match reset_backlog(listener_fd, shards) {
        Ok(n) => {
            ctx.connections_refused.fetch_add(n, Ordering::Relaxed);
            errors.note(shard, Some(n), e);
        }
        Err(le) => tracing::error!(shard, error = %le, "could not reset the connections waiting to be accepted, nor listen again"),
    }
}

/// Whether a connection just accepted may be served: refused (and counted) when its descriptor
/// is within [`FD_RESERVE`] of the open-files limit or the connection cap is reached.
///
/// Descriptors are allocated lowest first, so a connection's number says that every one below
/// it is in use: within the reserve of the limit, it is refused, keeping what is left for the
/// log (a new segment, its spare, index files). Connections alone could otherwise take every
/// descriptor and fail each rollover (review: 284 of 300 appends refused with "Too many open
/// files" while 200 idle connections were open).
fn admit(ctx: &Context, stream: &TcpStream) -> bool {
    let reserve = FD_RESERVE.min(ctx.open_files / 8);
    if std::os::fd::AsRawFd::as_raw_fd(stream) as u64 + reserve >= ctx.open_files {
        ctx.connections_refused.fetch_add(1, Ordering::Relaxed);
        if !ctx.fd_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(open_files = ctx.open_files, reserve, "the open-files limit is nearly reached: new connections are refused, keeping descriptors for the log (raise the limit, e.g. ulimit -n or LimitNOFILE, or lower server.limits.max_connections)");
        }
        return false;
    }
    ctx.fd_warned.store(false, Ordering::Relaxed);
    if let Some(cap) = ctx.settings.server.limits.connection_cap() {
        if ctx.active_connections.load(Ordering::SeqCst) >= cap.get() as u64 {
            ctx.connections_refused.fetch_add(1, Ordering::Relaxed);
            if !ctx.cap_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(cap = cap.get(), "connection cap reached; refusing new connections");
            }
            return false;
        }
        ctx.cap_warned.store(false, Ordering::Relaxed);
    }
    true
}
