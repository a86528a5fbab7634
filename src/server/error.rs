//! Why a server did not start, by the stage of the start that failed.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the server could not start: the stage that failed and what it needs to say so. The
/// messages are for the operator (the binary prints them after `error: `).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// io_uring, which every shard's runtime needs, cannot be used on this host
    /// ([`shards::io_uring_usable`]; the message says which refusal, and what to change).
    #[error(transparent)]
    IoUring(#[from] shards::IoUringUnusable),
    /// The locked-memory limit is below what a shard's runtime needs and cannot be raised
    /// ([`shards::memlock_sufficient`]; the message gives the limit and how to raise it).
    #[error(transparent)]
    LockedMemory(#[from] shards::MemlockTooLow),
    /// The journal command log (`journals/` in the data directory) refused to open.
    #[error(transparent)]
    Journals(crate::journal::store::StoreError),
    /// The `[cluster]` settings cannot be served: a malformed peer list, or a peer port that
    /// cannot be bound.
    #[error("cluster: {0}")]
    Cluster(String),
    /// `tls.cert` or `tls.key` could not be loaded.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// The listen address or the metrics address in the settings does not resolve.
    #[error(transparent)]
    Address(#[from] crate::config::ConfigError),
    /// Another listener holds the address, and kept it past the wait for a previous server to
    /// let go of it (checked before the store is opened, and again right before binding).
    #[error("cannot bind {addr}: {source}")]
    AddressInUse {
        /// The listen address.
        addr: SocketAddr,
        /// The probe's error (`Address already in use`).
        source: std::io::Error,
    },
    /// The store refused to open.
    #[error(transparent)]
    Open(#[from] crate::store::OpenError),
    /// A follower could not open the data directory.
    #[error("cannot follow {}: {source}", dir.display())]
    Follow {
        /// The data directory.
        dir: PathBuf,
        /// Why.
        source: crate::follow::FollowerError,
    },
    /// The writer's thread could not be started.
    #[error("cannot start the writer: {0}")]
    Writer(std::io::Error),
    /// A shard's thread could not be started.
    #[error("cannot start shard {shard}: {source}")]
    ShardSpawn {
        /// The shard's number.
        shard: usize,
        /// The error starting its thread.
        source: std::io::Error,
    },
    /// A shard could not bind its listener (or read back the address it bound).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address it bound.
        addr: SocketAddr,
        /// The socket call's error.
        source: std::io::Error,
    },
    /// A shard's thread panicked before its listener was bound.
    #[error("shard {shard} stopped before it could listen: its thread panicked (a thread it needs could not start?)")]
    ShardPanicked {
        /// The shard's number.
        shard: usize,
    },
    /// A shard's runtime could not be set up.
    #[error("shard {shard} could not start its runtime: {reason}")]
    ShardRuntime {
        /// The shard's number.
        shard: usize,
        /// The runtime's error, in words.
        reason: String,
    },
    /// A shard's thread ended before its listener was bound, for no reason it gave.
    #[error("shard {shard} stopped before it could listen (a thread it needs could not start?)")]
    ShardEnded {
        /// The shard's number.
        shard: usize,
    },
    /// A shard's thread ended while the shards were binding again (see [`Self::AddressShared`]).
    #[error("a shard stopped while binding")]
    ShardEndedRebinding,
    /// Another server began listening on the address while this one was binding, and the
    /// address was still shared after 4 binds.
    #[error("cannot bind {addr}: another server began listening on {} while this one was binding; refusing to share the address (start one server per address)", holders.join(", "))]
    AddressShared {
        /// The listen address.
        addr: SocketAddr,
        /// The other listeners on it.
        holders: Vec<String>,
    },
    /// The metrics endpoint could not bind its address.
    #[error("cannot bind metrics on {addr}: {source}")]
    Metrics {
        /// `metrics.bind`.
        addr: SocketAddr,
        /// The bind's error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::StartError;

    /// The start-up messages operators and scripts match on (tests/server_ops.rs) say what they
    /// said when every stage gave a string.
    #[test]
    fn start_errors_name_their_stage_as_before() {
        let addr: std::net::SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let in_use = StartError::AddressInUse { addr, source: std::io::Error::from_raw_os_error(libc::EADDRINUSE) };
        assert!(in_use.to_string().starts_with("cannot bind 127.0.0.1:7070: Address already in use"), "{in_use}");
        let shared = StartError::AddressShared { addr, holders: vec!["0.0.0.0:7070".into(), "[::]:7070".into()] };
        assert_eq!(shared.to_string(), "cannot bind 127.0.0.1:7070: another server began listening on 0.0.0.0:7070, [::]:7070 while this one was binding; refusing to share the address (start one server per address)");
        assert_eq!(
            StartError::ShardPanicked { shard: 1 }.to_string(),
            "shard 1 stopped before it could listen: its thread panicked (a thread it needs could not start?)"
        );
        assert_eq!(StartError::ShardEnded { shard: 0 }.to_string(), "shard 0 stopped before it could listen (a thread it needs could not start?)");
        let memlock = StartError::from(shards::MemlockTooLow { limit: 64 << 10 }).to_string();
        assert!(memlock.starts_with("the locked-memory limit (RLIMIT_MEMLOCK) is 64 KiB") && memlock.contains("at least 512 KiB"), "{memlock}");
        let uring = StartError::from(shards::IoUringUnusable(std::io::Error::from_raw_os_error(libc::EPERM))).to_string();
        assert!(uring.starts_with("cannot use io_uring") && uring.contains("seccomp") && uring.contains("Operation not permitted"), "{uring}");
    }
}
