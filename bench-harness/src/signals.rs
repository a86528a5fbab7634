//! SIGINT/SIGTERM handling of the load-generating subcommands: the first signal sets
//! [`STOP`], and the running benchmark winds down (requests in flight finish, servers the
//! harness started are stopped by pid, partial results are written, exit 130 after SIGINT
//! and 143 after SIGTERM: see [`interrupted_exit_code`]). The
//! handler resets itself, so a second signal kills the harness the ordinary way; servers
//! it started then die with it (`PR_SET_PDEATHSIG`, see [`crate::server`]).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set once SIGINT or SIGTERM arrived (after [`install`]).
pub static STOP: AtomicBool = AtomicBool::new(false);

/// The number of the first stop signal that arrived (0: none yet), here or in the `fsync`
/// probe's own handler.
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Records `signal` as the one that stopped the run, unless one was recorded already
/// (async-signal-safe: one atomic compare-and-swap).
pub fn record(signal: libc::c_int) {
    let _ = SIGNAL.compare_exchange(0, signal, Ordering::Relaxed, Ordering::Relaxed);
}

/// The exit code of a run a signal stopped, as a shell reports a process killed by it:
/// 128 + the signal's number, so 143 after SIGTERM and 130 after SIGINT (also when no signal
/// was recorded).
pub fn interrupted_exit_code() -> i32 {
    match SIGNAL.load(Ordering::Relaxed) {
        libc::SIGTERM => 128 + libc::SIGTERM,
        _ => 128 + libc::SIGINT,
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    record(signal);
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the one-shot SIGINT/SIGTERM handlers.
pub fn install() {
    install_handler(on_signal);
}

/// Installs `handler` for SIGINT and SIGTERM, once: it resets itself, so a second signal
/// kills the process the ordinary way. `handler` must be async-signal-safe (store to
/// atomics only).
pub fn install_handler(handler: extern "C" fn(libc::c_int)) {
    // SAFETY: the handler only stores to atomics (async-signal-safe, the caller's promise);
    // the sigaction struct is zero-initialised and its mask emptied before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// True once a stop signal arrived.
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}
