//! SIGINT/SIGTERM handling of the load-generating subcommands: the first signal sets
//! [`STOP`], and the running benchmark winds down (requests in flight finish, servers the
//! harness started are stopped by pid, partial results are written, exit 130). The
//! handler resets itself, so a second signal kills the harness the ordinary way; servers
//! it started then die with it (`PR_SET_PDEATHSIG`, see [`crate::server`]).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once SIGINT or SIGTERM arrived (after [`install`]).
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the one-shot SIGINT/SIGTERM handlers.
pub fn install() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe); the sigaction
    // struct is zero-initialised and its mask emptied before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
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
