//! Our `tephra-server` and its host: CPU placement within the mask, io_uring missing, a locked
//! memory limit too low, no transparent huge pages, and a file system that cannot preallocate.

use tephra_test_support as support;
mod server_util;

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use server_util::*;
use support::{ev, run_to_exit, Server};
use tephra::client::Client;

/// A data directory whose file system cannot preallocate (fallocate fails with EOPNOTSUPP,
/// as on ext2; injected here at the first segment's reservation) stops the start with exit 1
/// and an error that says so and names file systems that work (new-user review: a bare
/// "Operation not supported (os error 95)").
#[test]
fn a_file_system_that_cannot_preallocate_is_named_at_start() {
    let Some(faulty) = support::crash_points_binary() else { return };
    let out = run_to_exit(&faulty, &["--bind", "127.0.0.1:0"], &[("TEPHRA_CRASH_POINT", "segment_extend:eopnotsupp")], None, Duration::from_secs(20));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("the data directory's file system cannot preallocate segment files") && out.stderr.contains("use ext4, xfs, btrfs or tmpfs"),
        "{out:?}"
    );
    assert!(!out.stdout.contains("server listening"), "{out:?}");
}

/// The server turns transparent huge pages off for its process (a first touch of a 2 MiB page
/// inside the writer stalled every append in flight for up to 25 ms).
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let srv = Server::start(&bin(), &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", srv.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("THP_enabled:")).unwrap_or_else(|| panic!("no THP_enabled line:\n{status}"));
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}

/// The CPUs listed in `/proc/PID/task/TID/status` (`Cpus_allowed_list`, e.g. "0-1,3") of every
/// thread of `pid`, with the thread's name.
fn threads_cpus(pid: i32) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else { continue };
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("").to_owned();
        let mut cpus = Vec::new();
        for part in field("Cpus_allowed_list:").split(',').filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
                None => cpus.push(part.parse().unwrap()),
            }
        }
        out.push((field("Name:"), cpus));
    }
    out
}

/// This thread's CPU mask, read from the kernel (not through the code under test).
fn my_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let mask = sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    (0..CpuSet::count()).filter(|&c| mask.is_set(c).unwrap()).collect()
}

/// Starts the server with this thread's CPU mask narrowed to `cpus` (a child inherits the mask
/// of the thread that forks it, as under `taskset -c`), then restores the mask.
fn start_on_cpus(cpus: &[usize], env: &[(&str, &str)]) -> Server {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let before = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let mut only = CpuSet::new();
    for &c in cpus {
        only.set(c).unwrap();
    }
    sched_setaffinity(Pid::from_raw(0), &only).unwrap();
    let srv = std::panic::catch_unwind(|| Server::start(&bin(), env));
    sched_setaffinity(Pid::from_raw(0), &before).unwrap();
    srv.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The shard number in a shard thread's (truncated) name, `tephra-shard-N-...`.
fn shard_number(name: &str) -> Option<usize> {
    let digits: String = name.strip_prefix("tephra-shard-")?.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Starts the server on `cpus` with `env`, has it start its process-wide threads (a stats call
/// starts the blocking pool), and returns it with its threads' CPU lists once the blocking
/// threads are there.
fn placed(cpus: &[usize], env: &[(&str, &str)]) -> (Server, Vec<(String, Vec<usize>)>) {
    let srv = start_on_cpus(cpus, env);
    let mut c = Client::connect(srv.addr).unwrap();
    let r = c.append(vec![ev("Placed", &["cpu"], b"x")], None).unwrap();
    assert_eq!(r.first.get(), 1);
    c.stats().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let threads = threads_cpus(srv.pid());
        if threads.iter().any(|(n, _)| n.starts_with("tephra-blocking")) && threads.iter().any(|(n, _)| n == "tephra-kicker") {
            return (srv, threads);
        }
        assert!(Instant::now() < deadline, "no blocking or kicker thread after a stats call: {threads:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Shards are pinned within the CPU mask the server was started with (`taskset`, a container's
/// cpuset), and no thread leaves it. With one shard per allowed CPU, shard `i` is pinned to the
/// mask's `i`-th CPU, and the process-wide threads a shard starts (the kicker, the blocking
/// pool) get the whole mask, not that shard's CPU; with more shards than allowed CPUs none is
/// pinned. Before, shard `i` was pinned to CPU `i`: under a mask of CPU 1 shard 0 ran on CPU 0
/// (in a cpuset without CPU 0 the pin failed and the server did not start), and the kicker and
/// blocking threads inherited one shard's CPU.
#[test]
fn shards_are_pinned_within_the_cpu_mask_and_no_thread_leaves_it() {
    let allowed = my_cpus();
    if allowed.len() < 2 {
        eprintln!("*** one CPU allowed here ({allowed:?}): no narrower mask or second shard to place; not checked ***");
        return;
    }
    // The whole mask, one shard per CPU: each shard on its own CPU, everything else on all.
    let per_cpu = allowed.len().to_string();
    let (_srv, threads) = placed(&allowed, &[("TEPHRA__SERVER__READS__WORKER_THREADS", &per_cpu)]);
    let mut seen = vec![false; allowed.len()];
    for (name, cpus) in &threads {
        match shard_number(name) {
            Some(i) => {
                assert_eq!(cpus, &vec![allowed[i]], "shard thread {name} (shard {i}) is not pinned to the mask's CPU {i} ({})", allowed[i]);
                seen[i] = true;
            }
            // glommio's own helper threads of a shard are named after it too (and pinned with
            // it); every other thread may run anywhere in the mask.
            None if name.starts_with("tephra-shard") => {}
            None => assert_eq!(cpus, &allowed, "thread {name} is confined to {cpus:?} within the mask {allowed:?}"),
        }
    }
    assert!(seen.iter().all(|&s| s), "not every shard was found: {threads:?}");
    // Narrowed to the last CPU, with the default shard count (one) and with two shards
    // (unpinned): no thread outside it.
    let last = *allowed.last().unwrap();
    for env in [&[][..], &[("TEPHRA__SERVER__READS__WORKER_THREADS", "2")][..]] {
        let (_srv, threads) = placed(&[last], env);
        assert!(threads.iter().any(|(n, _)| shard_number(n).is_some()), "no shard threads among {threads:?}");
        for (name, cpus) in &threads {
            assert_eq!(cpus, &vec![last], "thread {name} may run on {cpus:?}, outside the mask [{last}] the server was started with ({env:?})");
        }
    }
}

/// A host that refuses io_uring (Docker's default seccomp profile, `kernel.io_uring_disabled`)
/// gets one clear error, exit 1, before the store is opened: the child runs under a seccomp
/// filter that fails `io_uring_setup` with EPERM. Before, the store was opened, glommio
/// panicked ("Failed to register a probe ... kernel should be at least 5.8") and the server
/// said "shard 0 stopped before it could listen".
#[test]
fn a_host_without_io_uring_is_told_so_before_the_store_is_opened() {
    use std::os::unix::process::CommandExt;
    // Classic BPF: load the syscall number; io_uring_setup (425 on every architecture)
    // returns EPERM, everything else is allowed.
    #[repr(C)]
    struct Insn(u16, u8, u8, u32);
    #[repr(C)]
    struct Prog(u16, *const Insn);
    const IO_URING_SETUP: u32 = 425;
    let filter = [
        Insn(0x20, 0, 0, 0),                                // ld [nr]
        Insn(0x15, 0, 1, IO_URING_SETUP),                   // jeq io_uring_setup
        Insn(0x06, 0, 0, 0x0005_0000 | libc::EPERM as u32), // ret ERRNO(EPERM)
        Insn(0x06, 0, 0, 0x7fff_0000),                      // ret ALLOW
    ];
    let prog = Prog(filter.len() as u16, filter.as_ptr());
    let prog_addr = &prog as *const Prog as usize;
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["--bind", "127.0.0.1:0", "--data-dir"]).arg(&data).env("NO_COLOR", "1");
    // SAFETY: only prctl(2) between fork and exec, on memory that outlives the spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, prog_addr, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.contains("cannot use io_uring") && stderr.contains("seccomp") && stderr.contains("Operation not permitted"), "{stderr}");
    assert!(!stderr.contains("panicked") && !stdout.contains("panicked"), "{stderr}{stdout}");
    assert!(!data.exists(), "the store was opened (created) before io_uring was checked");
}

/// A locked-memory limit below what glommio needs (512 KiB), which the process cannot raise
/// (here 64 KiB, as many containers have, and no privilege to lift it), gets one clear error
/// naming the limit and how to raise it, exit 1, before the store is opened. Before, every
/// shard's thread ended at once and the server said only "shard 0 stopped before it could
/// listen". As root the server lifts the limit itself, so the child also drops to `nobody`.
#[test]
fn a_locked_memory_limit_too_low_for_the_runtime_is_told_so() {
    use std::os::unix::process::CommandExt;
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let data = scratch.path().join("data");
    // A copy that `nobody` can reach: the checkout may sit under a directory only root may
    // enter (CI's clone is in a 0700 mktemp directory; the exec failed with EACCES there).
    let exe = scratch.path().join("tephra-server");
    std::fs::copy(bin(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(["--bind", "127.0.0.1:0", "--data-dir"]).arg(&data).env("NO_COLOR", "1");
    // SAFETY: only setrlimit(2), setgid(2) and setuid(2) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::geteuid() == 0 && (libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(65534) != 0 || libc::setuid(65534) != 0) {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The fresh copy may still be open for writing in a child another test thread forked:
    // exec fails with ETXTBSY until that child execs, so retry that briefly.
    let mut tries = 0;
    let out = loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr.contains("the locked-memory limit (RLIMIT_MEMLOCK) is 64 KiB") && stderr.contains("at least 512 KiB") && stderr.contains("ulimit -l"),
        "{stderr}"
    );
    assert!(!data.exists(), "the store was opened (created) before the limit was checked");
}
