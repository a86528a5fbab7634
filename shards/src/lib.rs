//! The thread-per-core runtime under tephra: one pinned glommio executor per shard, the
//! placement of shards on CPUs, and the locked-memory set-up glommio needs. It knows nothing
//! about events.
//!
//! glommio is pinned to `=0.9.0` (DESIGN "Boxes"); everything runtime-specific that the
//! server needs goes through this crate so the runtime stays swappable.

use glommio::{LocalExecutorBuilder, Placement};
use std::future::Future;
use std::sync::OnceLock;

/// Locked-memory budget glommio registers per executor for fixed I/O buffers, in bytes.
pub const IO_MEMORY: usize = 4 << 20;

/// Raises `RLIMIT_MEMLOCK` so every executor can register its I/O buffers (best effort, once
/// per process). Returns the io_memory each executor should use: [`IO_MEMORY`] when the limit
/// allows `shards` executors, else a smaller share (glommio then still works, but without
/// registered buffers below 64 KiB it logs an error, so we never go below that).
pub fn prepare_memlock(shards: usize) -> usize {
    static RAISED: OnceLock<u64> = OnceLock::new();
    let limit = *RAISED.get_or_init(|| {
        use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
        let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap_or((0, 0));
        if soft != RLIM_INFINITY && setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_ok() {
            return RLIM_INFINITY;
        }
        if soft < hard && setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard).is_ok() {
            return hard;
        }
        soft
    });
    // glommio registers io_memory in each of its three rings, and each executor also needs
    // some locked memory for the rings themselves.
    let per = (limit / shards.max(1) as u64 / 3).saturating_sub(256 << 10);
    (per as usize).clamp(64 << 10, IO_MEMORY)
}

/// How long an idle executor spins before parking, in microseconds: a request arriving within
/// this window is picked up without a cross-thread wake-up.
pub const SPIN_BEFORE_PARK_US: u64 = 0;

/// Runs `fut` in a task queue marked latency-sensitive, and everything it spawns with
/// `glommio::spawn_local` inherits that queue.
///
/// This matters for correctness of wake-ups, not just priority: glommio 0.9 writes the
/// executor's eventfd for a wake-up coming from another thread only when the woken task's queue
/// is latency-sensitive; otherwise a wake-up that races with the executor going to sleep is
/// only noticed at the next timer (we measured 1 s stalls of cross-shard append replies).
///
/// # Panics
/// When called outside a glommio executor.
pub async fn latency_sensitive<F: Future + 'static>(fut: F) -> F::Output
where
    F::Output: 'static,
{
    let tq = glommio::executor().create_task_queue(
        glommio::Shares::Static(1000),
        glommio::Latency::Matters(std::time::Duration::from_millis(LATENCY_MS)),
        "latency-sensitive",
    );
    glommio::spawn_local_into(fut, tq).expect("task queue just created").await
}

/// Interval of the per-executor heartbeat, in microseconds.
pub const HEARTBEAT_US: u64 = 2_000;

/// Wakes the executor every [`HEARTBEAT_US`]: each wake-up makes glommio drain its queue of
/// wake-ups from other threads. Under load we measured rare cross-thread wake-ups that glommio
/// 0.9 left queued while its thread slept in `io_uring_enter` (a request then waited for the
/// next timer: up to 1 s, or forever on an executor with no timers). The heartbeat bounds that
/// stall at one interval, for a negligible cost when idle.
async fn heartbeat() {
    loop {
        glommio::timer::sleep(std::time::Duration::from_micros(HEARTBEAT_US)).await;
    }
}

/// Registers this executor with the process-wide kicker thread, which sends it a message every
/// [`HEARTBEAT_US`]. The message arrives as a wake-up from another thread into a latency-sensitive
/// task, which glommio signals through the executor's eventfd: a second, independent way out of a
/// sleep that missed its timer (we also observed whole-executor stalls with a timer pending).
fn kicker() -> flume::Receiver<()> {
    use std::sync::Mutex;
    static KICKS: OnceLock<Mutex<Vec<flume::Sender<()>>>> = OnceLock::new();
    let (tx, rx) = flume::bounded(1);
    let list = KICKS.get_or_init(|| {
        std::thread::Builder::new()
            .name("tephra-kicker".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_micros(HEARTBEAT_US));
                if let Some(l) = KICKS.get() {
                    let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
                    l.retain(|tx| !matches!(tx.try_send(()), Err(flume::TrySendError::Disconnected(_))));
                }
            })
            .expect("kicker thread");
        Mutex::new(Vec::new())
    });
    list.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
    rx
}

async fn kicked(rx: flume::Receiver<()>) {
    while rx.recv_async().await.is_ok() {}
}

/// The latency target of [`latency_sensitive`] queues, in milliseconds.
pub const LATENCY_MS: u64 = 1;

/// Spawns one glommio executor thread named `name`, optionally pinned to `cpu`, running the
/// future built by `make` on it, with a [`heartbeat`] and the kicker beside it.
/// Returns the thread's join handle.
///
/// # Errors
/// The I/O error glommio reports when the executor cannot start (no io_uring, memlock).
pub fn spawn_executor<G, F, T>(name: &str, cpu: Option<usize>, shards: usize, make: G) -> std::io::Result<glommio::ExecutorJoinHandle<T>>
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let io_memory = prepare_memlock(shards);
    let placement = match cpu {
        Some(c) => Placement::Fixed(c),
        None => Placement::Unbound,
    };
    LocalExecutorBuilder::new(placement)
        .name(name)
        .io_memory(io_memory)
        .spin_before_park(std::time::Duration::from_micros(SPIN_BEFORE_PARK_US))
        .spawn(move || async move {
            // The work itself runs in the default queue (in a latency-sensitive queue glommio
            // 0.9 sometimes never ran the writer again after a cross-shard append); the
            // heartbeat and the kicker run in a latency-sensitive one, so the kicker's
            // cross-thread wake-ups always reach the executor's eventfd.
            let rx = kicker();
            glommio::spawn_local(latency_sensitive(async move {
                glommio::spawn_local(heartbeat()).detach();
                kicked(rx).await
            }))
            .detach();
            make().await
        })
        .map_err(|e| std::io::Error::other(e.to_string()))
}
