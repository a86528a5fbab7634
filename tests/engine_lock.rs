//! The `LOCK` file (docs/format.md §9): one writer per directory,
//! in-process and across processes, and a refused in-process open must not release the
//! holder's POSIX record lock (the reference's bug). Cross-process checks run in child
//! processes (this test binary re-run in a child mode), because reading `LOCK` from this
//! process would itself close a descriptor of it and drop our own record lock.

mod engine_util;

use engine_util::*;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};
use tephra::*;

/// Child mode: prints the LOCK file's content, then tries to open the store and prints
/// `OPENED` or `REFUSED <error>`.
#[test]
fn lock_child() {
    let Ok(dir) = std::env::var("TEPHRA_LOCK_DIR") else { return };
    let content = std::fs::read_to_string(Path::new(&dir).join("LOCK")).unwrap_or_default();
    println!("LOCKFILE {}", content.trim());
    match Store::open(&dir, cfg(4096)) {
        Ok(_) => println!("OPENED"),
        Err(e) => println!("REFUSED {e}"),
    }
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

struct ChildView {
    lockfile: String,
    opened: bool,
    refusal: String,
}

fn from_child(dir: &Path) -> ChildView {
    let out = child("lock_child", &[("TEPHRA_LOCK_DIR", dir.display().to_string())]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |prefix: &str| text.lines().find_map(|l| l.find(prefix).map(|i| l[i + prefix.len()..].to_owned()));
    let lockfile = line("LOCKFILE ").unwrap_or_else(|| panic!("child printed no LOCKFILE line: {text} {}", String::from_utf8_lossy(&out.stderr)));
    let opened = text.contains("OPENED");
    let refusal = line("REFUSED ").unwrap_or_default();
    assert!(opened == refusal.is_empty(), "child output: {text}");
    ChildView { lockfile, opened, refusal }
}

#[test]
fn one_writer_per_directory_in_process_and_across_processes() {
    let d = dir();
    let pid = std::process::id();
    let store = Store::open(d.path(), cfg(4096)).unwrap();
    store.handle().append(vec![ev("A", &[], b"x")], None).unwrap();
    // A second open in this process fails fast, naming LOCK and our pid; several times over.
    for _ in 0..3 {
        let t = Instant::now();
        let err = Store::open(d.path(), cfg(4096)).err().expect("second in-process open succeeded").to_string();
        assert!(t.elapsed() < Duration::from_secs(1), "the refusal did not fail fast");
        assert!(err.contains("LOCK"), "{err}");
        assert!(err.contains(&format!("pid {pid}")), "{err}");
    }
    // After those refusals the record lock is still held: another process is refused, and the
    // error names this process as the holder. LOCK holds our pid.
    let c = from_child(d.path());
    assert!(!c.opened, "a child process opened the directory while this process holds it");
    assert!(c.refusal.contains("LOCK") && c.refusal.contains(&format!("pid {pid}")), "{}", c.refusal);
    assert_eq!(c.lockfile, pid.to_string());
    // The store still works, and once it is dropped a child can open the directory.
    assert_eq!(store.handle().append(vec![ev("A", &[], b"y")], None).unwrap().first.get(), 2);
    drop(store);
    let c = from_child(d.path());
    assert!(c.opened, "child refused after the store was dropped: {}", c.refusal);
    // And this process can open it again (the child's lock died with it).
    let s = Store::open(d.path(), cfg(4096)).unwrap();
    assert_eq!(s.handle().head(), Position(2));
}

#[test]
fn a_refused_open_of_a_corrupt_store_releases_the_lock() {
    let d = dir();
    drop(Store::open(d.path(), cfg(4096)).unwrap());
    let seg = segments(d.path()).pop().unwrap();
    std::fs::write(&seg, vec![0xAB; 4096]).unwrap();
    assert!(Store::open(d.path(), cfg(4096)).is_err());
    // The failed open took the lock and must have let go of it.
    let c = from_child(d.path());
    assert!(!c.opened && !c.refusal.contains("LOCK"), "the child should fail on the header, not the lock: {}", c.refusal);
}

#[test]
fn deleting_the_lock_file_does_not_admit_a_second_in_process_writer() {
    let d = dir();
    let store = Store::open(d.path(), cfg(4096)).unwrap();
    std::fs::remove_file(d.path().join("LOCK")).unwrap();
    let err = Store::open(d.path(), cfg(4096)).err().expect("second in-process open succeeded after LOCK was deleted").to_string();
    assert!(err.contains("LOCK"), "{err}");
    // Also through another spelling of the same directory.
    let alias = d.path().join(".");
    assert!(Store::open(&alias, cfg(4096)).is_err(), "opened the same directory through another path");
    store.handle().append(vec![ev("A", &[], b"x")], None).unwrap();
    drop(store);
    let s = Store::open(d.path(), cfg(4096)).unwrap();
    assert_eq!(s.handle().head(), Position(1));
    assert!(d.path().join("LOCK").exists());
}

/// Child mode: answers, for each directory read from stdin, whether another process holds a
/// write lock on its LOCK file (`LOCKED <pid>` or `FREE`).
#[test]
fn lock_probe_child() {
    if std::env::var("TEPHRA_LOCK_PROBE").is_err() {
        return;
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let path = Path::new(&line.unwrap()).join("LOCK");
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        nix::fcntl::fcntl(f.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut fl)).unwrap();
        if fl.l_type == libc::F_UNLCK as libc::c_short {
            writeln!(out, "FREE").unwrap();
        } else {
            writeln!(out, "LOCKED {}", fl.l_pid).unwrap();
        }
        out.flush().unwrap();
    }
    std::process::exit(0);
}

/// A hand-over inside one process: while one thread releases the lock another takes it. The
/// new holder must end up holding the record lock; if the old holder closed its descriptor
/// after the new one locked, POSIX would drop the new holder's lock too. (The window is a few
/// instructions wide, so this is a smoke test of the hand-over, not a reliable reproducer.)
#[test]
fn a_handover_between_threads_keeps_the_record_lock() {
    use tephra::log::lock::DirLock;
    let d = dir();
    let mut probe = child("lock_probe_child", &[("TEPHRA_LOCK_PROBE", "1".into())])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = probe.stdin.take().unwrap();
    let mut from = BufReader::new(probe.stdout.take().unwrap());
    let mut ask = || {
        writeln!(to, "{}", d.path().display()).unwrap();
        let mut l = String::new();
        loop {
            l.clear();
            from.read_line(&mut l).unwrap();
            if l.starts_with("LOCKED") || l.starts_with("FREE") || l.is_empty() {
                return l.trim().to_owned();
            }
        }
    };
    let pid = std::process::id();
    let t = Instant::now();
    let mut rounds = 0;
    while rounds < 40 && t.elapsed() < Duration::from_millis(500) {
        rounds += 1;
        let first = DirLock::acquire(d.path()).unwrap();
        let dir = d.path().to_owned();
        let taker = std::thread::spawn(move || loop {
            if let Ok(l) = DirLock::acquire(&dir) {
                return l;
            }
            std::hint::spin_loop();
        });
        std::thread::yield_now();
        drop(first);
        let second = taker.join().unwrap();
        assert_eq!(ask(), format!("LOCKED {pid}"), "round {rounds}: the new holder lost its record lock");
        drop(second);
    }
    assert_eq!(ask(), "FREE");
    drop(to);
    probe.wait().unwrap();
}

/// A FIFO in the lock file's place is refused at once with a message naming the file, not
/// waited on (review); a regular file again opens.
#[test]
fn a_lock_file_that_is_not_a_regular_file_is_refused() {
    let d = dir();
    let lock = d.path().join("LOCK");
    nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = Instant::now();
    let err = match Store::open(d.path(), cfg(4096)) {
        Ok(_) => panic!("opened with a FIFO as its lock file"),
        Err(e) => e.to_string(),
    };
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(err.contains("LOCK") && err.contains("not a regular file"), "{err}");
    std::fs::remove_file(&lock).unwrap();
    drop(Store::open(d.path(), cfg(4096)).unwrap());
}
