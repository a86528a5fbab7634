//! What the end-to-end tests of `tephra-bench` share: the built binary, scratch directories,
//! JSON output, and the servers to run against (ours, built on demand; the reference).
//!
//! Include with `mod common;` from a test of this crate.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The `tephra-bench` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tephra-bench");

/// A fresh, empty scratch directory `<group>/<name>-<pid>` under the target dir (ext4 on the
/// build disk).
pub fn scratch(group: &str, name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(group).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `tephra-bench args` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("spawn tephra-bench")
}

/// Bytes as text, lossily.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON a successful run printed on stdout.
pub fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "exit {:?}\nstdout: {}\nstderr: {}", out.status, text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", text(&out.stdout)))
}

/// Says loudly on stderr that a test is skipped, and why.
pub fn skip(what: &str) {
    eprintln!("\n*** SKIPPED: {what} ***\n");
}

/// The workspace's `target/` (the test binary is `target/<profile>/deps/<test>-*`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Our release server: `$TEPHRA_SERVER`, else `target/release/tephra-server`, built once if
/// missing (unless `TEPHRA_BENCH_BUILD_SERVER=0`); `None` after a notice when there is none.
pub fn ours() -> Option<PathBuf> {
    static OURS: OnceLock<Option<PathBuf>> = OnceLock::new();
    OURS.get_or_init(|| {
        if let Some(p) = std::env::var_os("TEPHRA_SERVER").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let p = target_dir().join("release").join("tephra-server");
        if !p.is_file() && std::env::var("TEPHRA_BENCH_BUILD_SERVER").as_deref() != Ok("0") {
            eprintln!("building {} (cargo build --release --bin tephra-server)", p.display());
            let st = Command::new(env!("CARGO"))
                // `async-io` as tephra-bench enables it, so the library already built for
                // these tests is reused and only the binary is compiled.
                .args(["build", "--release", "--bin", "tephra-server", "-p", "tephra", "--features", "async-io"])
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .status();
            if !matches!(st, Ok(s) if s.success()) {
                eprintln!("building tephra-server failed: {st:?}");
            }
        }
        p.is_file().then_some(p)
    })
    .clone()
    .or_else(|| {
        skip("our tephra-server is not built (cargo build --release --bin tephra-server)");
        None
    })
}

/// The reference server (`tephra_bench::server::default_reference`), or `None` after a
/// notice.
pub fn reference() -> Option<PathBuf> {
    let p = tephra_bench::server::default_reference();
    if p.is_none() {
        skip("the reference tephra-server is missing: set TEPHRA_REFERENCE_SERVER or run scripts/install-reference.sh");
    }
    p
}
