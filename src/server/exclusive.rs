//! Start-up checks against other processes: a data directory or an address still held by a
//! previous server on its way out is waited for, and an address another server holds (or
//! takes while this one binds) is refused, as the reference refuses it.

use crate::store::{Store, StoreConfig};
use std::net::SocketAddr;

/// How long a start waits for the data directory's `LOCK` while another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a start waits, past [`LOCK_WAIT`] or [`BIND_WAIT`], while the previous server of
/// its data directory is still being torn down (see [`previous_server_exiting`]).
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// True when `pid` is a process on its way out: its main thread has exited (zombie) while some
/// of its threads have not yet run to their end (`/proc/PID/stat` state `Z` or `X`).
fn exiting(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false)
}

/// True when the process named in `dir/LOCK` (the last server of the directory) is on its way
/// out. After `kill -9` on a host other programs keep busy, its idle-class sealing thread can
/// keep it, its listeners and the lock alive for seconds (review: a restart right after it was
/// refused 1 time in 4 or 5, with the address or the directory still held).
fn previous_server_exiting(dir: &std::path::Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("LOCK")).ok()?.trim().parse().ok()?;
    (pid != std::process::id() && exiting(pid)).then_some(pid)
}

/// [`Store::open_parts`], retried for up to [`LOCK_WAIT`] while another process holds the data
/// directory's lock: a server restarted the moment the previous one was told to exit can find
/// the lock still held, since the old process releases it only once the kernel has run each of
/// its threads to its end, which on a host other programs keep busy took seconds (review: a
/// restart right after `kill -9` was refused with the directory locked). A server that keeps
/// running there is still refused, after the wait.
pub(super) fn open_waiting_for_lock(dir: &std::path::Path, cfg: StoreConfig) -> Result<(Store, crate::store::WriterTask), crate::store::OpenError> {
    use crate::log::{lock::LockError, LogError};
    use crate::store::OpenError;
    let started = std::time::Instant::now();
    let mut announced = false;
    loop {
        match Store::open_parts(dir, cfg.clone()) {
            Err(OpenError::Log(LogError::Lock(LockError::Locked { path, holder })))
                if holder != Some(std::process::id()) && (started.elapsed() < LOCK_WAIT || (started.elapsed() < EXIT_WAIT && holder.is_some_and(exiting))) =>
            {
                if !std::mem::replace(&mut announced, true) {
                    let holder = holder.map_or_else(|| "another process".to_string(), |p| format!("pid {p}"));
                    tracing::info!(lock = %path.display(), %holder, "data directory locked; waiting up to {LOCK_WAIT:?} for it to be released (longer while its holder is exiting)");
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// [`probe_exclusive`], retried for up to [`BIND_WAIT`] while the address is in use: a server
/// restarted the moment the previous one exited can find the old listener still held, since
/// the kernel tears down an exited process's io_uring (and the accept pending in it) in the
/// background (review: 2 of 32 immediate restarts failed with "Address already in use"),
/// and for up to [`EXIT_WAIT`] while the data directory's previous server is still exiting
/// ([`previous_server_exiting`]). Another server that keeps the address is still refused,
/// after the wait.
pub(super) fn probe_until_free(addr: SocketAddr, data_dir: &std::path::Path) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut announced = false;
    let mut exit_announced = false;
    loop {
        match probe_exclusive(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && (started.elapsed() < BIND_WAIT || (started.elapsed() < EXIT_WAIT && previous_server_exiting(data_dir).is_some())) =>
            {
                if !std::mem::replace(&mut announced, true) {
                    tracing::info!(%addr, "address in use; waiting up to {BIND_WAIT:?} for it to be released");
                }
                if started.elapsed() >= BIND_WAIT && !std::mem::replace(&mut exit_announced, true) {
                    let pid = previous_server_exiting(data_dir).unwrap_or(0);
                    tracing::info!(%addr, pid, "the data directory's previous server is still exiting; waiting up to {EXIT_WAIT:?} for it");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// How long a start waits for its address to be released (see [`probe_until_free`]).
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds `addr` with `SO_REUSEADDR` only (no `SO_REUSEPORT`) and lets it go: fails with
/// `AddrInUse` when any listener (ours or another server's) holds the address.
pub(super) fn probe_exclusive(addr: SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sk = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sk.set_reuse_address(true)?;
    sk.bind(&addr.into())
}

/// How many times a start binds before it gives an address shared with another server up.
pub(super) const BIND_ATTEMPTS: u32 = 4;

/// A random pause of 20-150 ms before binding again, so that of two servers that let go of
/// one address at the same moment, one binds well before the other looks.
pub(super) fn backoff() -> std::time::Duration {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    std::time::Duration::from_millis(20 + r % 131)
}

/// The listening TCP sockets on `addr`'s port, other than the sockets whose inode numbers are
/// in `ours`, that share the address with it (the same IP, or a wildcard on either side), from
/// `/proc/net/tcp` and `/proc/net/tcp6` of this network namespace.
///
/// # Errors
/// When `/proc/net/tcp` cannot be read or parsed (a missing `tcp6`, IPv6 off, counts as none).
pub(super) fn foreign_listeners(addr: SocketAddr, ours: &[u64]) -> Result<Vec<SocketAddr>, String> {
    use procfs::net::TcpState;
    let mut all = procfs::net::tcp().map_err(|e| e.to_string())?;
    all.extend(procfs::net::tcp6().unwrap_or_default());
    let overlaps = |a: SocketAddr| a.port() == addr.port() && (a.ip() == addr.ip() || a.ip().is_unspecified() || addr.ip().is_unspecified());
    Ok(all.into_iter().filter(|e| e.state == TcpState::Listen && overlaps(e.local_address) && !ours.contains(&e.inode)).map(|e| e.local_address).collect())
}
