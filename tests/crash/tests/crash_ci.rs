//! The CI part of the crash harness: a short SIGKILL soak over all four workloads, every named
//! crash point armed once, every I/O fault once, and the corruption matrix, against the real
//! `tephra-server` built with `--features crash-points`.
//!
//! `scripts/test.sh` builds that binary and names it in `TEPHRA_CRASH_SERVER`; without it these
//! tests are skipped with a notice. `TEPHRA_CRASH_SEED` fixes the seed (printed either way);
//! `TEPHRA_CRASH_CYCLES` overrides the 50 soak cycles. The long soak is
//! `scripts/crash-soak.sh --cycles N --seed S`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn seed() -> u64 {
    let s = std::env::var("TEPHRA_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64 % 1_000_000).unwrap_or(1));
    eprintln!("crash harness seed {s} (TEPHRA_CRASH_SEED={s} reproduces)");
    s
}

fn run_dir(name: &str, seed: u64) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-{name}-{seed}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs one phase of the harness (one at a time: they share the machine's disk and cores)
/// with a fresh seed and run directory, and reports its lines or fails with its violation.
/// Skipped when the crash-points server is not built.
fn phase(name: &str, run: impl FnOnce(&Path, u64, &Path) -> Result<Vec<String>, tephra_crash::Failure>) {
    let Some(bin) = tephra_test_support::crash_points_binary() else { return };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed();
    let dir = run_dir(name, seed);
    let r = run(&bin, seed, &dir);
    let hangs = tephra_crash::hangs();
    if !hangs.is_empty() {
        eprintln!("\n*** LIVENESS: the server stopped answering {} time(s) (restarted and checked): {hangs:#?} ***\n", hangs.len());
        assert!(std::env::var_os("TEPHRA_CRASH_STRICT_LIVENESS").is_none(), "liveness failures with TEPHRA_CRASH_STRICT_LIVENESS set");
    }
    match r {
        Ok(lines) => {
            for l in lines {
                eprintln!("  ok: {l}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(f) => panic!("{f}"),
    }
}

#[test]
fn sigkill_soak_over_all_workloads() {
    phase("soak", |bin, seed, dir| {
        let cycles = std::env::var("TEPHRA_CRASH_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
        let r = tephra_crash::soak(bin, &tephra_crash::SoakOpts::ci(seed, cycles, dir.to_path_buf()));
        if let Ok(r) = &r {
            assert_eq!(r.cycles, cycles);
            assert!(r.per_workload.iter().all(|(_, n)| *n > 0) || cycles < 20, "{r}");
        }
        r.map(|r| vec![format!("soak: {r}")])
    });
}

#[test]
fn every_crash_point_once() {
    phase("points", |bin, seed, dir| tephra_crash::points(bin, seed, dir, 64 * 1024));
}

#[test]
fn io_faults_fail_stop_and_recover() {
    phase("faults", |bin, seed, dir| tephra_crash::faults(bin, seed, dir, 64 * 1024));
}

#[test]
fn corruption_matrix_on_a_closed_store() {
    phase("corruption", tephra_crash::corruption);
}
