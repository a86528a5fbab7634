//! Helpers shared by the `engine_*` integration tests (each test file includes this module;
//! not every file uses every helper).
#![allow(dead_code)]

pub mod history;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tephra::*;

/// Proptest cases for the store-level property tests: `PROPTEST_CASES`, else 16 (each case
/// opens real stores on disk).
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(16)
}

/// An event from string slices.
pub use tephra_test_support::ev;

/// A temp dir on the real disk under the target dir.
pub fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Store config with `size`-byte segments and default writer settings.
pub fn cfg(size: u64) -> StoreConfig {
    StoreConfig::new(SegmentConfig::new(size))
}

/// Every event of the store, forward, as owned copies.
pub fn read_all(h: &StoreHandle) -> Vec<(u64, Event)> {
    h.read(Query::all(), Position::ZERO, None).collect_owned().unwrap().into_iter().map(|(p, e)| (p.get(), e)).collect()
}

/// Segment files of `dir`, ascending by base.
pub fn segments(dir: &Path) -> Vec<PathBuf> {
    tephra::log::segment::list_segments(dir).unwrap().into_iter().map(|(_, p)| p).collect()
}

/// The full content of every file in `dir` (not recursive), by name.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// A small deterministic PRNG (xorshift64*), so tests need no extra dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Seeded from the clock; the seed is printed so a failure can be replayed.
    pub fn from_time(what: &str) -> Rng {
        let seed = std::env::var("TEPHRA_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
        eprintln!("{what}: TEPHRA_TEST_SEED={seed}");
        Rng::new(seed)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// Re-runs the current test binary as a child running only test `name`, with `env` set.
pub fn child(name: &str, env: &[(&str, String)]) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1", "-q"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}
