//! The thread-per-core runtime under tephra: one pinned glommio executor per shard, the
//! placement of shards on CPUs, and the locked-memory set-up glommio needs. It knows nothing
//! about events.
//!
//! glommio is pinned to `=0.9.0` (docs/architecture.md §6); everything runtime-specific that the
//! server needs goes through this crate so the runtime stays swappable: its executors
//! ([`spawn_executor`], [`Executor`]), tasks ([`spawn`], [`spawn_bulk`], [`Task`]), timers
//! ([`sleep`]), network types ([`net`]) and synchronisation ([`sync`]). Every task spawned
//! through it gets [`reliable_wakes`], so no call site can forget them. Outside this crate the
//! workspace's `clippy.toml` refuses glommio's own types and functions.

// The one place glommio is named (the lint is for everyone else).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

pub mod net;
pub mod sync;

use glommio::{LocalExecutorBuilder, Placement};
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

/// Locked-memory budget glommio registers per executor for fixed I/O buffers, in bytes: the
/// least glommio takes (64 KiB). Those buffers serve only glommio's own file reads (`DmaFile`,
/// `BufferedFile`), which the server does not use (its segments are read and written with
/// plain system calls, its sockets receive into heap buffers); the 4 MiB it asked for before
/// were pinned for nothing (new-user review: 3.9 MB pinned by an idle two-shard server, 0.4
/// MB now).
pub const IO_MEMORY: usize = 64 << 10;

/// Checks that this process may create an io_uring instance, which every glommio executor
/// (every shard) needs, by creating a small one (`io_uring_setup(2)`, 4 entries) and closing
/// it. Called before anything else at start, so a host without io_uring gets one clear error
/// before the store is opened, not a panic inside glommio ("Failed to register a probe ...
/// kernel should be at least 5.8") followed by "shard 0 stopped before it could listen".
///
/// # Errors
/// [`IoUringUnusable`], with the error of `io_uring_setup`.
pub fn io_uring_usable() -> Result<(), IoUringUnusable> {
    // struct io_uring_params is 120 bytes; all zero asks for a plain ring.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup(2) with a valid, writable params buffer of the kernel's size.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: the descriptor was just returned to us and is closed once.
        unsafe { libc::close(fd as i32) };
        return Ok(());
    }
    Err(IoUringUnusable(std::io::Error::last_os_error()))
}

/// This process cannot create an io_uring instance ([`io_uring_usable`]): the error of
/// `io_uring_setup(2)`. Its message is a sentence for the operator naming the cause by that
/// error: `ENOSYS` (a kernel without io_uring), `EPERM`/`EACCES` (refused: the
/// `kernel.io_uring_disabled` sysctl or a seccomp filter, such as Docker's default profile),
/// `ENOMEM` (locked memory on older kernels), anything else with its errno text.
#[derive(Debug)]
pub struct IoUringUnusable(pub std::io::Error);

impl std::fmt::Display for IoUringUnusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.0.raw_os_error() {
            Some(libc::ENOSYS) => "this kernel has no io_uring (glommio needs Linux 5.8 or later, built with CONFIG_IO_URING)",
            Some(libc::EPERM) | Some(libc::EACCES) => "io_uring is refused to this process: by the sysctl kernel.io_uring_disabled (1 allows it only to the group kernel.io_uring_group names, 2 to no one), or by a seccomp filter such as Docker's default profile (since Docker 25; run the container with a profile that allows io_uring_setup, io_uring_enter and io_uring_register)",
            Some(libc::ENOMEM) => "the kernel refused the ring's memory (on kernels before 5.12 it counts against the locked-memory limit: raise ulimit -l / LimitMEMLOCK)",
            _ => "io_uring_setup failed",
        };
        write!(f, "cannot use io_uring, which every shard's runtime (glommio) needs: {why} ({})", self.0)
    }
}

impl std::error::Error for IoUringUnusable {}

/// Raises `RLIMIT_MEMLOCK` so every executor can register its I/O buffers (best effort, once
/// per process) and returns the io_memory each executor asks for: [`IO_MEMORY`], already the
/// least glommio takes, so there is no smaller share to fall back to.
pub fn prepare_memlock() -> usize {
    raise_memlock();
    IO_MEMORY
}

/// The least `RLIMIT_MEMLOCK` glommio 0.9 starts an executor with, in bytes: below it every
/// executor fails to start (`MemLockLimit`), whatever its io_memory.
pub const MIN_MEMLOCK: u64 = 512 << 10;

/// Checks, after raising it as far as the process may, that the locked-memory limit lets
/// glommio start executors (at least [`MIN_MEMLOCK`]). Called at start, before the store is
/// opened, so a low limit gets one clear error instead of every shard's thread ending with
/// "shard 0 stopped before it could listen".
///
/// # Errors
/// [`MemlockTooLow`], with the limit the process ends at.
pub fn memlock_sufficient() -> Result<(), MemlockTooLow> {
    let limit = raise_memlock();
    if limit >= MIN_MEMLOCK {
        return Ok(());
    }
    Err(MemlockTooLow { limit })
}

/// The locked-memory limit is below [`MIN_MEMLOCK`] and this process cannot raise it
/// ([`memlock_sufficient`]). Its message gives the limit and how to raise it.
#[derive(Debug)]
pub struct MemlockTooLow {
    /// The soft `RLIMIT_MEMLOCK` after raising it as far as the process may, in bytes.
    pub limit: u64,
}

impl std::fmt::Display for MemlockTooLow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the locked-memory limit (RLIMIT_MEMLOCK) is {} KiB and cannot be raised by this process; every shard's runtime (glommio) needs at least {} KiB: raise it (ulimit -l, systemd's LimitMEMLOCK=, docker run --ulimit memlock=-1, or run with CAP_SYS_RESOURCE)",
            self.limit >> 10,
            MIN_MEMLOCK >> 10
        )
    }
}

impl std::error::Error for MemlockTooLow {}

/// Raises `RLIMIT_MEMLOCK` (soft) as far as the process may, once: to unlimited when it may
/// (root, `CAP_SYS_RESOURCE`), else to the hard limit. Returns the soft limit it ends at.
fn raise_memlock() -> u64 {
    static RAISED: OnceLock<u64> = OnceLock::new();
    *RAISED.get_or_init(|| {
        use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
        let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap_or((0, 0));
        if soft != RLIM_INFINITY && setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_ok() {
            return RLIM_INFINITY;
        }
        if soft < hard && setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard).is_ok() {
            return hard;
        }
        soft
    })
}

/// Scheduler shares of an executor's bulk queue ([`spawn_bulk`]) against the 1000 of its
/// default queue: when both have work, bulk tasks get a fifth of the executor.
pub const BULK_SHARES: usize = 250;

thread_local! {
    static BULK_QUEUE: std::cell::Cell<Option<glommio::TaskQueueHandle>> = const { std::cell::Cell::new(None) };
}

/// Spawns `fut` on this executor's **bulk** task queue (created on first use, with
/// [`BULK_SHARES`]), detached. Long-running streaming work (reads, subscription catch-up) goes
/// there and calls [`bulk_yield`] between steps, so that the default queue, where connections
/// read requests and answer appends, gets the executor back every [`BULK_SLICE_US`] or so
/// (appends on a shard running 128 scans: p99 1.4 ms, worst ~5 ms; before, an append waited
/// for all the scans). Tasks that `fut` spawns stay in the bulk queue. Like every spawn here,
/// it runs `fut` with [`reliable_wakes`].
///
/// # Panics
/// Outside a glommio executor.
pub fn spawn_bulk(fut: impl Future<Output = ()> + 'static) {
    let queue = BULK_QUEUE.with(|q| match q.get() {
        Some(h) => h,
        None => {
            let h = glommio::executor().create_task_queue(glommio::Shares::Static(BULK_SHARES), glommio::Latency::NotImportant, "bulk");
            q.set(Some(h));
            h
        }
    });
    // The handle was created by this thread's executor, the only one it ever runs.
    glommio::spawn_local_into(reliable_wakes(fut), queue).expect("the bulk queue belongs to this executor").detach();
}

/// Spawns `fut` on this executor's default task queue, with [`reliable_wakes`]: a wake-up it
/// receives from another thread (a reply from the writer, a blocking job done) reaches the
/// executor even while it sleeps. Dropping the returned [`Task`] cancels it; [`Task::detach`]
/// lets it run on its own.
///
/// # Panics
/// Outside a glommio executor.
pub fn spawn<T: 'static>(fut: impl Future<Output = T> + 'static) -> Task<T> {
    Task(glommio::spawn_local(reliable_wakes(fut)))
}

/// A task spawned by [`spawn`]: awaiting it gives its output; dropping it cancels it.
pub struct Task<T>(glommio::Task<T>);

impl<T> Task<T> {
    /// Lets the task run to its end on its own.
    pub fn detach(self) {
        self.0.detach();
    }
}

impl<T> Future for Task<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        std::pin::Pin::new(&mut self.get_mut().0).poll(cx)
    }
}

/// Waits `wait` on this executor's timers (they may oversleep by up to [`KICK_US`] while the
/// executor is busy, [`KICK_IDLE_ROUNDS`] kicks while it idles: see the notes on waking).
pub async fn sleep(wait: std::time::Duration) {
    glommio::timer::sleep(wait).await;
}

/// How long the bulk tasks of an executor may run, together, before they step aside for its
/// I/O and its default queue ([`bulk_yield`]), in microseconds.
pub const BULK_SLICE_US: u64 = 500;

/// The timer a bulk task waits on when its slice is used up, in microseconds: long enough not
/// to be due already when it is first polled (glommio then returns at once), short enough to
/// be due by the time the executor has looked at its I/O.
const BULK_PAUSE_US: u64 = 20;

thread_local! {
    /// The bulk tasks' current slice: a number that changes with each slice, and when the
    /// slice began (`None` before the first).
    static BULK_SLICE: std::cell::Cell<(u64, Option<std::time::Instant>)> = const { std::cell::Cell::new((0, None)) };
}

/// Called by a bulk task between steps of its work: once the bulk tasks of this executor have
/// used up a slice of [`BULK_SLICE_US`] together, each of them waits on a timer that is due
/// almost at once. glommio 0.9 runs its task queues back to back and looks at I/O only when no
/// task is runnable (or after its 100 ms preemption timer; a shorter one lost wake-ups here),
/// so the bulk tasks must all stop being runnable for the executor to take in new requests:
/// every one of them stops at its next step. The first to resume starts the next slice, which
/// the others share: a task that resumes after that slice is used up waits again before its
/// next step.
pub async fn bulk_yield() {
    loop {
        let now = std::time::Instant::now();
        let (slice, start) = BULK_SLICE.with(|s| s.get());
        let Some(start) = start else {
            BULK_SLICE.with(|s| s.set((slice, Some(now))));
            return;
        };
        if now.duration_since(start) < std::time::Duration::from_micros(BULK_SLICE_US) {
            return;
        }
        sleep(std::time::Duration::from_micros(BULK_PAUSE_US)).await;
        BULK_SLICE.with(|s| {
            if s.get().0 == slice {
                s.set((slice.wrapping_add(1), Some(std::time::Instant::now())));
            }
        });
    }
}

/// How long an idle executor spins before parking, in microseconds: a request arriving within
/// this window is picked up without a cross-thread wake-up.
pub const SPIN_BEFORE_PARK_US: u64 = 0;

// Waking a sleeping executor from another thread.
//
// glommio 0.9 sleeps in `io_uring_enter` on its *main* ring, linked to its latency ring by a
// poll on the latency ring's descriptor. Its timers and the eventfd that other threads write to
// wake it (`Latency::Matters` queues, or any wake while it is about to sleep) complete in the
// latency ring. On this kernel (6.18) that link sometimes does not fire: the executor sleeps
// on with a timer due and the eventfd written, until something completes in its main ring
// (a socket becoming readable, a file write). We measured whole shards asleep for 10 s with
// replies queued for them (`server_wire` floods), and earlier 1 s stalls and a writer that
// "never ran again".
//
// What always wakes it is a completion in the main ring, and glommio puts a socket's readiness
// poll there. So each executor reads from its own Unix socket pair, and a [`Nudge`] (one byte
// written to the other end) wakes it for certain. [`reliable_wakes`] makes every wake-up a task
// receives from another thread also nudge that task's executor, and a process-wide kicker
// thread nudges every executor every [`KICK_US`] so timers cannot oversleep by more.

/// A handle that wakes one executor from any thread (see the notes above).
#[derive(Clone)]
pub struct Nudge(Arc<NudgeInner>);

struct NudgeInner {
    /// A byte is on its way (written and not yet drained): no need to write another.
    armed: AtomicBool,
    /// A task of the executor ran since the kicker last looked (see [`KICK_US`]).
    active: AtomicBool,
    tx: std::os::unix::net::UnixStream,
    /// The executor's thread; a wake-up on it needs no nudge.
    thread: std::thread::ThreadId,
}

impl Nudge {
    /// Wakes the executor (cheap when a wake-up is already on its way).
    pub fn nudge(&self) {
        if !self.0.armed.swap(true, Ordering::SeqCst) {
            // WouldBlock: the socket is full, so the executor has a readable socket already.
            let _ = (&self.0.tx).write(&[1]);
        }
    }

    /// The nudge of the executor running on this thread.
    ///
    /// # Panics
    /// Outside an executor started by [`spawn_executor`].
    pub fn current() -> Nudge {
        CURRENT.with(|c| c.borrow().clone()).expect("not on an executor started by shards::spawn_executor")
    }
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Nudge>> = const { std::cell::RefCell::new(None) };
}

/// Creates this executor's nudge and the task that drains it.
fn install_nudge() -> std::io::Result<Nudge> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let (rx, tx) = std::os::unix::net::UnixStream::pair()?;
    rx.set_nonblocking(true)?;
    tx.set_nonblocking(true)?;
    let nudge = Nudge(Arc::new(NudgeInner { armed: AtomicBool::new(false), active: AtomicBool::new(true), tx, thread: std::thread::current().id() }));
    // SAFETY: `rx` is a connected stream socket we own; glommio takes it over.
    let rx = unsafe { glommio::net::UnixStream::from_raw_fd(rx.into_raw_fd()) };
    let n = nudge.clone();
    glommio::spawn_local(async move {
        use futures_lite::AsyncReadExt;
        let mut rx = rx;
        let mut buf = [0u8; 64];
        // Drain, then disarm: a nudge that found the flag still set was issued before the
        // disarm, while this executor was awake, and glommio looks at its queue of cross-thread
        // wake-ups once more before it sleeps.
        while let Ok(n_read) = rx.read(&mut buf).await {
            if n_read == 0 {
                break;
            }
            n.0.armed.store(false, Ordering::SeqCst);
        }
    })
    .detach();
    CURRENT.with(|c| *c.borrow_mut() = Some(nudge.clone()));
    Ok(nudge)
}

/// A waker that wakes `inner` and, from another thread, nudges its executor.
struct NudgingWaker {
    inner: Waker,
    nudge: Nudge,
}

impl Wake for NudgingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.inner.wake_by_ref();
        if std::thread::current().id() != self.nudge.0.thread {
            self.nudge.nudge();
        }
    }
}

/// Runs `fut` so that every wake-up it receives from another thread (a channel message from
/// the writer, a reply from a shard) also [nudges](Nudge) this executor: the wake-up cannot be
/// missed by a sleeping executor. Wake-ups from this thread cost nothing extra.
///
/// Outside an executor started by [`spawn_executor`] it is a plain pass-through.
pub fn reliable_wakes<F: Future>(fut: F) -> ReliableWakes<F> {
    ReliableWakes { fut, waker: None }
}

/// The future returned by [`reliable_wakes`].
pub struct ReliableWakes<F> {
    fut: F,
    waker: Option<(Arc<NudgingWaker>, Waker)>,
}

impl<F: Future> Future for ReliableWakes<F> {
    type Output = F::Output;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `fut` is structurally pinned; `waker` is never pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let fresh = match &this.waker {
            Some((w, _)) => !w.inner.will_wake(cx.waker()),
            None => true,
        };
        if fresh {
            let Some(nudge) = CURRENT.with(|c| c.borrow().clone()) else {
                // No nudge on this thread (it could not be created): plain wake-ups.
                // SAFETY: as below.
                return unsafe { std::pin::Pin::new_unchecked(&mut this.fut) }.poll(cx);
            };
            let w = Arc::new(NudgingWaker { inner: cx.waker().clone(), nudge });
            this.waker = Some((w.clone(), Waker::from(w)));
        }
        let (nw, waker) = this.waker.as_ref().expect("set above");
        nw.nudge.0.active.store(true, Ordering::Relaxed);
        let mut cx2 = Context::from_waker(waker);
        // SAFETY: `this.fut` is never moved out of the pinned `ReliableWakes`.
        unsafe { std::pin::Pin::new_unchecked(&mut this.fut) }.poll(&mut cx2)
    }
}

/// How often the kicker thread nudges a busy executor, in microseconds: the longest a timer
/// can oversleep while the executor works (see the notes above), and the backstop for any
/// cross-thread wake-up that was not made reliable with [`reliable_wakes`]. An executor counts
/// as busy for [`KICK_BUSY_ROUNDS`] rounds after any of its [`reliable_wakes`] tasks ran.
pub const KICK_US: u64 = 2_000;

/// Rounds of [`KICK_US`] an executor stays busy after a task of it ran (20 ms).
pub const KICK_BUSY_ROUNDS: u32 = 10;

/// An idle executor is nudged every this many rounds (every 50 ms): a timer armed while it
/// idles (a read tick, a reaping deadline) oversleeps by up to that. Kicking idle executors
/// every 2 ms too cost an idle server ~6% of a core.
pub const KICK_IDLE_ROUNDS: u32 = 25;

/// Whether the kicker nudges an executor none of whose tasks ran for `quiet` rounds: every
/// round while it is busy, every [`KICK_IDLE_ROUNDS`]th once idle.
fn kick_due(quiet: u32) -> bool {
    quiet <= KICK_BUSY_ROUNDS || quiet % KICK_IDLE_ROUNDS == 0
}

/// Registers `nudge` with the process-wide kicker thread.
fn register_kick(nudge: Nudge) {
    /// Each executor with the rounds since one of its tasks last ran.
    type Kicks = Mutex<Vec<(std::sync::Weak<NudgeInner>, u32)>>;
    static KICKS: OnceLock<Kicks> = OnceLock::new();
    let list = KICKS.get_or_init(|| {
        std::thread::Builder::new()
            .name("tephra-kicker".into())
            .spawn(|| {
                use_process_mask();
                loop {
                    std::thread::sleep(std::time::Duration::from_micros(KICK_US));
                    if let Some(l) = KICKS.get() {
                        let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
                        l.retain_mut(|(w, quiet)| match w.upgrade() {
                            Some(n) => {
                                *quiet = if n.active.swap(false, Ordering::Relaxed) { 0 } else { quiet.saturating_add(1) };
                                if kick_due(*quiet) {
                                    Nudge(n).nudge();
                                }
                                true
                            }
                            None => false,
                        });
                    }
                }
            })
            .expect("kicker thread");
        Mutex::new(Vec::new())
    });
    list.lock().unwrap_or_else(|e| e.into_inner()).push((Arc::downgrade(&nudge.0), 0));
}

/// Runs `f` on one of the process's blocking threads (`tephra-blocking`, [`BLOCKING_THREADS`]
/// of them, started on first use) and waits for its result without blocking the executor:
/// for work that may wait for the disk. The wake-up back to the executor goes through its
/// [`Nudge`] ([`reliable_wakes`]), not glommio's own blocking pool, whose completions take
/// the latency-ring path described above. `None` if `f` panicked. Dropping the returned
/// future before a thread takes the job up means `f` never runs.
pub async fn run_blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = flume::bounded(1);
    let job: Job = Box::new(move || {
        // Its caller went away (a cancelled read, a closed connection) while the job queued:
        // skip it, so abandoned fetches do not hold up the ones still wanted.
        if tx.is_disconnected() {
            return;
        }
        let _ = tx.send(f());
    });
    if let Err(flume::SendError(job)) = blocking_pool().send(job) {
        // No thread could be started: run it here rather than never.
        job();
    }
    reliable_wakes(rx.recv_async()).await.ok()
}

/// Drops `value` on one of [`run_blocking`]'s threads, without waiting: for values whose drop
/// takes long enough to hold up the thread that owns them (a query of many thousands of
/// items frees as many allocations). Callable from any thread, inside an executor or not.
pub fn drop_detached<T: Send + 'static>(value: T) {
    let job: Job = Box::new(move || drop(value));
    if let Err(flume::SendError(job)) = blocking_pool().send(job) {
        job();
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The queue of [`run_blocking`]'s threads, started on first use.
fn blocking_pool() -> &'static flume::Sender<Job> {
    static POOL: OnceLock<flume::Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = flume::unbounded::<Job>();
        for i in 0..BLOCKING_THREADS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new().name(format!("tephra-blocking-{i}")).spawn(move || {
                use_process_mask();
                while let Ok(job) = rx.recv() {
                    // A panicking job drops its result sender: its caller gets `None`.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a blocking thread");
            }
        }
        tx
    })
}

/// The process's CPU mask, as the first call of [`allowed_cpus`] read it; `None` inside when
/// it could not be read.
static PROCESS_MASK: OnceLock<Option<nix::sched::CpuSet>> = OnceLock::new();

/// The CPU mask of the calling thread, read once for the process by the first call (every
/// later call returns that first answer, from whichever thread). Called at start, before any
/// shard is pinned, it is the process's own mask: what `taskset`, a container's cpuset
/// (`docker --cpuset-cpus`, Kubernetes' static CPU manager) or systemd's `CPUAffinity` left it.
fn process_mask() -> Option<&'static nix::sched::CpuSet> {
    PROCESS_MASK
        .get_or_init(|| match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
            Ok(m) => Some(m),
            Err(e) => {
                // nix's CpuSet holds 1024 CPUs: a larger machine fails here (EINVAL).
                tracing::warn!(error = %e, "cannot read this process's CPU mask (sched_getaffinity); shards are left unpinned");
                None
            }
        })
        .as_ref()
}

/// The CPUs of the process's mask (see `process_mask`: the first call reads it from the
/// calling thread, so call it at start from an unpinned thread), ascending. Empty when the
/// mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    use nix::sched::CpuSet;
    let Some(mask) = process_mask() else { return Vec::new() };
    (0..CpuSet::count()).filter(|&c| mask.is_set(c).unwrap_or(false)).collect()
}

/// Gives the calling thread the process's whole mask back (when [`allowed_cpus`] has read it),
/// for the process-wide threads a shard happens to start (the kicker, the blocking pool): a new
/// thread inherits the mask of the thread that starts it, and a pinned shard's is one CPU.
fn use_process_mask() {
    if let Some(Some(mask)) = PROCESS_MASK.get() {
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), mask) {
            tracing::warn!(error = %e, "cannot widen a thread to the process's CPU mask; it stays on the CPU of the shard that started it");
        }
    }
}

/// Where each of `shards` shards runs: shard `i` pinned to the `i`-th CPU of `allowed` (see
/// [`allowed_cpus`]) when there is one shard per allowed CPU, else every shard unpinned
/// (`None`), left to the scheduler within the process's mask. Never a CPU outside `allowed`:
/// pinning by CPU number alone put shard 0 on CPU 0 under `taskset -c 1` (out of the
/// operator's mask), and in a cpuset that excludes CPU 0 the pin failed and the server did not
/// start. Fewer shards than allowed CPUs (a CPU quota such as `docker --cpus=1`, which lowers
/// the default shard count, or a smaller `server.reads.worker_threads`) are not pinned either:
/// pinning them to the first CPUs of the mask would put every such process on a host on CPU 0.
pub fn placement(shards: usize, allowed: &[usize]) -> Vec<Option<usize>> {
    if shards == allowed.len() {
        allowed.iter().map(|&c| Some(c)).collect()
    } else {
        vec![None; shards]
    }
}

/// Threads of [`run_blocking`].
pub const BLOCKING_THREADS: usize = 4;

/// An executor thread started by [`spawn_executor`].
pub struct Executor<T: Send + 'static>(glommio::ExecutorJoinHandle<T>);

/// Why an executor's thread ended without its future's output.
#[derive(Debug)]
pub enum ExecutorEnd {
    /// The thread panicked (its future, or the runtime's set-up).
    Panicked,
    /// The runtime could not be set up (glommio's error, in words).
    Failed(String),
}

impl<T: Send + 'static> Executor<T> {
    /// Waits for the thread to end.
    ///
    /// # Errors
    /// [`ExecutorEnd`] when it ended without the future's output.
    pub fn join(self) -> Result<T, ExecutorEnd> {
        self.0.join().map_err(|e| match e {
            glommio::GlommioError::BuilderError(glommio::BuilderErrorKind::ThreadPanic(_)) => ExecutorEnd::Panicked,
            e => ExecutorEnd::Failed(e.to_string()),
        })
    }
}

/// Spawns one glommio executor thread named `name`, optionally pinned to `cpu`, running the
/// future built by `make` on it with [`reliable_wakes`], its [`Nudge`] installed and registered
/// with the kicker. Returns the thread's handle.
///
/// # Errors
/// The I/O error glommio reports when the executor cannot start (no io_uring, memlock).
pub fn spawn_executor<G, F, T>(name: &str, cpu: Option<usize>, make: G) -> std::io::Result<Executor<T>>
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let io_memory = prepare_memlock();
    let placement = match cpu {
        Some(c) => Placement::Fixed(c),
        None => Placement::Unbound,
    };
    LocalExecutorBuilder::new(placement)
        .name(name)
        .io_memory(io_memory)
        .spin_before_park(std::time::Duration::from_micros(SPIN_BEFORE_PARK_US))
        .spawn(move || async move {
            // Everything runs in the default task queue (in a latency-sensitive queue glommio
            // 0.9 once never ran the writer again after a cross-shard append).
            match install_nudge() {
                Ok(nudge) => register_kick(nudge),
                Err(e) => tracing::error!(error = %e, "cannot create the executor's wake-up socket; cross-thread wake-ups may be late"),
            }
            reliable_wakes(make()).await
        })
        .map(Executor)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{kick_due, placement, run_blocking, BLOCKING_THREADS, KICK_BUSY_ROUNDS, KICK_IDLE_ROUNDS, KICK_US};

    #[test]
    fn shards_are_pinned_only_to_allowed_cpus() {
        // `taskset -c 1` on a two-CPU host: the one shard goes on CPU 1, not CPU 0.
        assert_eq!(placement(1, &[1]), vec![Some(1)]);
        // A cpuset of 2,3,5: shards on those CPUs, in order.
        assert_eq!(placement(3, &[2, 3, 5]), vec![Some(2), Some(3), Some(5)]);
        // Fewer shards than allowed CPUs (a CPU quota, a smaller worker_threads): none pinned,
        // rather than all on the mask's first CPUs.
        assert_eq!(placement(2, &[2, 3, 5]), vec![None, None]);
        assert_eq!(placement(1, &[0, 1]), vec![None]);
        // More shards than allowed CPUs, or a mask that could not be read: none pinned.
        assert_eq!(placement(2, &[1]), vec![None, None]);
        assert_eq!(placement(1, &[]), vec![None]);
    }

    #[test]
    fn allowed_cpus_are_the_mask_the_kernel_reports() {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
        let mut want = Vec::new();
        for part in list.split(',') {
            match part.split_once('-') {
                Some((a, b)) => want.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
                None => want.push(part.parse::<usize>().unwrap()),
            }
        }
        assert_eq!(super::allowed_cpus(), want);
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_blocking_job_whose_caller_went_away_before_it_started_never_runs() {
        // Every blocking thread held, so the next job queues.
        let (release, held) = flume::unbounded::<()>();
        let (started_tx, started) = flume::unbounded::<()>();
        let holders: Vec<_> = (0..BLOCKING_THREADS)
            .map(|_| {
                let (held, started_tx) = (held.clone(), started_tx.clone());
                std::thread::spawn(move || {
                    futures_lite::future::block_on(run_blocking(move || {
                        let _ = started_tx.send(());
                        let _ = held.recv();
                    }))
                })
            })
            .collect();
        for _ in 0..BLOCKING_THREADS {
            started.recv().unwrap();
        }
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut abandoned = Box::pin(run_blocking(move || r.store(true, Ordering::SeqCst)));
        // Polled once: queued behind the held threads; then its caller goes away.
        assert!(futures_lite::future::block_on(futures_lite::future::poll_once(abandoned.as_mut())).is_none());
        drop(abandoned);
        let r = ran.clone();
        let wanted = std::thread::spawn(move || futures_lite::future::block_on(run_blocking(move || r.load(Ordering::SeqCst))));
        for _ in 0..BLOCKING_THREADS {
            release.send(()).unwrap();
        }
        for h in holders {
            assert_eq!(h.join().unwrap(), Some(()));
        }
        // The job queued after the abandoned one ran, and saw the abandoned one had not.
        assert_eq!(wanted.join().unwrap(), Some(false));
        assert!(!ran.load(Ordering::SeqCst), "an abandoned job ran");
    }

    /// A task spawned on an executor gives its output to whoever awaits it, a semaphore's
    /// units come back with their permit, and an executor whose future panicked says so.
    #[test]
    fn spawned_tasks_answer_and_a_panicked_executor_is_named() {
        let h = super::spawn_executor("shards-test", None, || async {
            let units = super::sync::Semaphore::new(1);
            let held = units.try_acquire(1).expect("one unit free");
            assert!(units.try_acquire(1).is_none());
            let waiting = super::spawn({
                let units = units.clone();
                async move { units.acquire(1).await.is_some() }
            });
            super::sleep(std::time::Duration::from_millis(1)).await;
            drop(held);
            let got = waiting.await;
            let answer = super::spawn(async { 6 * 7 }).await;
            (got, answer)
        })
        .unwrap();
        assert_eq!(h.join().unwrap(), (true, 42));
        let h = super::spawn_executor("shards-test", None, || async { panic!("on purpose") }).unwrap();
        assert!(matches!(h.join(), Err(super::ExecutorEnd::Panicked)));
    }

    #[test]
    fn busy_executors_are_kicked_every_round_idle_ones_every_50_ms() {
        let kicked: Vec<u32> = (0..=200).filter(|&q| kick_due(q)).collect();
        // Busy: the round a task ran and the ten after it (20 ms of 2 ms kicks).
        assert_eq!(&kicked[..11], &(0..=10).collect::<Vec<_>>()[..]);
        // Idle: every 25th round, i.e. every 50 ms.
        assert_eq!(&kicked[11..], &[25, 50, 75, 100, 125, 150, 175, 200]);
        assert_eq!(KICK_US * KICK_BUSY_ROUNDS as u64, 20_000);
        assert_eq!(KICK_US * KICK_IDLE_ROUNDS as u64, 50_000);
        assert!(kick_due(u32::MAX - u32::MAX % KICK_IDLE_ROUNDS), "a long idle executor is still kicked");
    }
}
