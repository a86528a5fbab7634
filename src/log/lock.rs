//! The `LOCK` file: one writer per data directory (docs/format.md §9).
//!
//! A POSIX record lock (`fcntl(F_SETLK, F_WRLCK)` over the whole file) held for as long as the
//! store is open, plus an in-process registry because record locks belong to the process: a
//! second open in the same process would otherwise succeed, and closing *any* descriptor of the
//! file drops every lock the process holds on it. The registry is checked **before** the file
//! is opened, so a refused in-process open never touches (and never releases) the holder's lock,
//! which is the reference's bug.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

fn registry() -> &'static Mutex<HashSet<PathBuf>> {
    static R: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Why the directory lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another writer holds the lock; `holder` is its pid when known.
    #[error("data directory is locked: {path} is held by {}", holder.map(|p| format!("pid {p}")).unwrap_or_else(|| "another process".into()))]
    Locked { path: PathBuf, holder: Option<u32> },
    /// Any other failure to open or lock the file.
    #[error("cannot lock {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A held directory lock; dropping it releases both the registry entry and the record lock.
#[derive(Debug)]
pub struct DirLock {
    _file: Option<File>,
    key: PathBuf,
}

fn flock(kind: libc::c_short) -> libc::flock {
    // SAFETY-free construction: libc::flock is plain old data.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0;
    fl
}

impl DirLock {
    /// Takes the lock on `dir/LOCK`, creating the file if needed, and writes our pid into it.
    ///
    /// A filesystem without record locking (`EOPNOTSUPP`, `ENOSYS`, `ENOLCK`) gives a warning
    /// and the lock is held only in-process.
    ///
    /// # Errors
    /// [`LockError::Locked`] naming the file and the holder's pid, or [`LockError::Io`].
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join("LOCK");
        let key = dir.canonicalize().map_err(|source| LockError::Io { path: path.clone(), source })?;
        {
            let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
            if !reg.insert(key.clone()) {
                return Err(LockError::Locked { path, holder: Some(std::process::id()) });
            }
        }
        match Self::take_file_lock(&path) {
            Ok(file) => Ok(DirLock { _file: file, key }),
            Err(e) => {
                registry().lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                Err(e)
            }
        }
    }

    fn take_file_lock(path: &Path) -> Result<Option<File>, LockError> {
        let io = |source| LockError::Io { path: path.to_owned(), source };
        // O_NONBLOCK: a FIFO or a device put in the lock file's place must not hang the open;
        // anything but a regular file is refused below.
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
        if !file.metadata().map_err(io)?.file_type().is_file() {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the lock file is not a regular file (remove it; the server creates it)")));
        }
        let fl = flock(libc::F_WRLCK as libc::c_short);
        match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_SETLK(&fl)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EACCES) | Err(nix::errno::Errno::EAGAIN) => {
                let mut probe = flock(libc::F_WRLCK as libc::c_short);
                let holder = match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut probe)) {
                    Ok(_) if probe.l_type != libc::F_UNLCK as libc::c_short && probe.l_pid > 0 => Some(probe.l_pid as u32),
                    _ => {
                        let mut s = String::new();
                        let _ = file.read_to_string(&mut s);
                        s.trim().parse().ok()
                    }
                };
                return Err(LockError::Locked { path: path.to_owned(), holder });
            }
            Err(e @ (nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::ENOSYS | nix::errno::Errno::ENOLCK)) => {
                tracing::warn!(path = %path.display(), error = %e, "filesystem cannot lock; keeping one writer is up to you");
                return Ok(None);
            }
            Err(e) => return Err(io(e.into())),
        }
        // Overwrite, then trim to length: truncating to zero first would make ext4 flush the
        // file on close (its replace-by-truncate heuristic), a few ms on every open.
        // The pid only names the holder in another process's refusal: the lock is what keeps
        // one writer, so a pid that cannot be written (a full disk, an empty `LOCK` needing a
        // block) is said and the open goes on, as the reference's does (review: a full disk
        // refused to start a healthy store, "cannot lock ... No space left on device").
        let pid = format!("{}\n", std::process::id());
        let recorded = crate::fault::io_point("lock_pid")
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()))
            .and_then(|()| file.set_len(pid.len() as u64));
        if let Err(e) = recorded {
            tracing::warn!(path = %path.display(), error = %e, "cannot write our pid into the lock file; the lock is held all the same");
        }
        Ok(Some(file))
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Close the descriptor (releasing the record lock) before leaving the registry: once the
        // key is gone another thread of this process may take the lock, and a close after its
        // fcntl would drop the new holder's record lock too (POSIX locks belong to the process).
        drop(self._file.take());
        registry().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_in_process_is_refused_and_keeps_the_first_lock() {
        let d = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(d.path()).unwrap();
        for _ in 0..3 {
            match DirLock::acquire(d.path()) {
                Err(LockError::Locked { holder, path }) => {
                    assert_eq!(holder, Some(std::process::id()));
                    assert!(path.ends_with("LOCK"));
                }
                other => panic!("expected Locked, got {other:?}"),
            }
        }
        // (Reading LOCK here would close a descriptor of it and drop our record lock: the
        // cross-process check lives in the integration tests.)
        drop(first);
        DirLock::acquire(d.path()).unwrap();
    }
}
