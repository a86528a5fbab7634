//! End-to-end tests of `tephra-bench`: spawn the built binary against scratch
//! directories under the target dir and check exit codes, output and JSON.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{run, text, BIN};

/// A fresh, empty scratch directory under the target dir (ext4 on the build disk).
fn scratch(name: &str) -> PathBuf {
    common::scratch("tephra-bench-tests", name)
}

fn expected_labels(sizes: &[&str]) -> Vec<String> {
    let mut v = Vec::new();
    for s in sizes {
        for m in ["buffered", "O_DIRECT"] {
            for l in ["prealloc", "growing"] {
                v.push(format!("{m} {l} {s}"));
            }
        }
    }
    v.push("O_DIRECT prealloc 4 KiB tail +1024 B/commit".into());
    v
}

fn check_latency(row: &Value, key: &str) {
    let l = &row[key];
    let g = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{key}.{k} missing in {}", row["label"]));
    let (min, p50, p99, p999, max) = (g("min_us"), g("p50_us"), g("p99_us"), g("p999_us"), g("max_us"));
    assert!(min > 0, "{}: min {min}", row["label"]);
    assert!(min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max, "{}: {key} not ordered: {min} {p50} {p99} {p999} {max}", row["label"]);
    assert!(l["mean_us"].as_f64().unwrap() > 0.0);
}

fn assert_dir_empty(d: &Path) {
    let left: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "probe left files behind: {left:?}");
}

#[test]
fn short_run_json_has_all_rows_with_ordered_percentiles() {
    let d = scratch("json");
    let out = run(&["fsync", "--dir", d.to_str().unwrap(), "--commits", "8", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v["tool"], "tephra-bench");
    assert_eq!(v["subcommand"], "fsync");
    assert_eq!(v["event_bytes"], 256);
    let rows = v["rows"].as_array().unwrap();
    let labels: Vec<String> = rows.iter().map(|r| r["label"].as_str().unwrap().to_string()).collect();
    assert_eq!(labels, expected_labels(&["4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB"]));
    for r in rows {
        assert!(r["error"].is_null(), "{}: {}", r["label"], r["error"]);
        assert_eq!(r["commits"], 8, "{}", r["label"]);
        assert_eq!(r["stopped_by"], "commits");
        check_latency(r, "commit_latency");
        check_latency(r, "fdatasync_latency");
        // fdatasync is part of the commit
        assert!(r["fdatasync_latency"]["min_us"].as_u64() <= r["commit_latency"]["max_us"].as_u64());
        for k in ["elapsed_s", "commits_per_s_p50", "commits_per_s_measured", "events_per_s_p50", "events_per_s_measured"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{}: {k}", r["label"]);
        }
        let block = r["block_bytes"].as_u64().unwrap();
        let payload = r["payload_bytes"].as_u64().unwrap();
        let ratio = r["events_per_s_measured"].as_f64().unwrap() / r["commits_per_s_measured"].as_f64().unwrap();
        assert!((ratio - payload as f64 / 256.0).abs() < 1e-6);
        assert_eq!(r["bytes_written"].as_u64().unwrap(), 8 * block);
        assert!(["buffered", "direct"].contains(&r["mode"].as_str().unwrap()));
        assert!(["preallocated", "growing"].contains(&r["layout"].as_str().unwrap()));
    }
    let m = &v["machine"];
    assert!(m["kernel"].as_str().unwrap().starts_with("Linux"));
    assert!(m["cpus_online"].as_u64().unwrap() >= 1);
    assert!(m["fs"]["magic"].as_str().unwrap().starts_with("0x"));
    assert!(v["glommio"]["io_memory"].as_u64().unwrap() >= 65536);
    assert!(v["warnings"].is_array() && v["notes"].is_array());
    assert_dir_empty(&d);
}

#[test]
fn table_output_with_time_budget() {
    let d = scratch("table");
    let out = run(&["fsync", "--dir", d.to_str().unwrap(), "--seconds", "0.05", "--block-sizes", "4k,64k"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let s = text(&out.stdout);
    for needle in ["p50 µs", "p99.9 µs", "commits/s", "kernel", "filesystem", "cpus", "glommio"] {
        assert!(s.contains(needle), "missing {needle:?} in:\n{s}");
    }
    for label in expected_labels(&["4 KiB", "64 KiB"]) {
        assert!(s.contains(&label), "missing row {label:?} in:\n{s}");
    }
    assert!(!s.contains("16 KiB"));
    assert_dir_empty(&d);
}

#[test]
fn time_budget_stops_rows_by_time() {
    let d = scratch("time");
    let out = run(&["fsync", "--dir", d.to_str().unwrap(), "--seconds", "0.02", "--block-sizes", "4k", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["stopped_by"], "time", "{}", r["label"]);
        assert!(r["commits"].as_u64().unwrap() >= 1);
        check_latency(r, "commit_latency");
    }
    assert_dir_empty(&d);
}

fn assert_usage_failure(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "stdout: {} stderr: {}", text(&out.stdout), text(&out.stderr));
    assert!(out.stdout.is_empty(), "printed numbers: {}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("µs") && !err.contains("p50"), "stderr has numbers: {err}");
}

#[test]
fn nonexistent_dir_exits_2() {
    let d = scratch("missing").join("no-such-dir");
    assert_usage_failure(&run(&["fsync", "--dir", d.to_str().unwrap(), "--commits", "2"]), "does not exist");
    assert_usage_failure(&run(&["fsync", "--dir", d.to_str().unwrap(), "--commits", "2", "--json"]), "does not exist");
}

#[test]
fn file_instead_of_dir_exits_2() {
    let d = scratch("file");
    let f = d.join("plain-file");
    std::fs::write(&f, b"x").unwrap();
    assert_usage_failure(&run(&["fsync", "--dir", f.to_str().unwrap(), "--commits", "2"]), "is not a directory");
}

#[test]
fn read_only_dir_exits_2() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // chmod does not stop root; /proc refuses new files for everyone.
        assert_usage_failure(&run(&["fsync", "--dir", "/proc/self", "--commits", "2"]), "not writable");
    } else {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("readonly");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o555)).unwrap();
        let out = run(&["fsync", "--dir", d.to_str().unwrap(), "--commits", "2"]);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_usage_failure(&out, "not writable");
    }
}

#[test]
fn proc_dir_exits_2() {
    assert_usage_failure(&run(&["fsync", "--dir", "/proc", "--commits", "2"]), "not writable");
}

#[test]
fn unknown_options_of_the_other_subcommands_exit_2() {
    for sub in ["append", "read", "compare"] {
        let out = run(&[sub, "--anything", "x"]);
        assert_eq!(out.status.code(), Some(2), "{sub}");
        assert!(text(&out.stderr).contains("unexpected argument"), "{sub}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn usage_errors_exit_2() {
    let d = scratch("usage");
    let ds = d.to_str().unwrap();
    for args in [
        vec!["fsync", "--dir", ds, "--seconds", "1", "--commits", "3"],
        vec!["fsync", "--dir", ds, "--block-sizes", "1000"],
        vec!["fsync", "--dir", ds, "--seconds", "-1"],
        vec!["fsync"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
    }
    assert_dir_empty(&d);
}

#[test]
fn sigint_stops_early_and_removes_files() {
    let d = scratch("sigint");
    let child = Command::new(BIN)
        .args(["fsync", "--dir", d.to_str().unwrap(), "--seconds", "10", "--block-sizes", "4k", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first row's file exists (the handler is installed by then), so the
    // signal lands mid-measurement.
    let has_row_file = || std::fs::read_dir(&d).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with(".tephra-bench-fsync."));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !has_row_file() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(has_row_file(), "no row file appeared");
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "stderr: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("partial result is JSON");
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.len() < 5, "{} rows", rows.len());
    assert_eq!(rows.last().unwrap()["stopped_by"], "interrupted");
    assert!(v["warnings"].to_string().contains("interrupted"));
    assert_dir_empty(&d);
}

#[test]
fn tmpfs_gets_a_prominent_warning() {
    let shm = Path::new("/dev/shm");
    let on_tmpfs = nix::sys::statfs::statfs(shm).map(|s| s.filesystem_type().0 as u64 == 0x0102_1994).unwrap_or(false);
    if !on_tmpfs {
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    let d = shm.join(format!("tephra-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let out = run(&["fsync", "--dir", d.to_str().unwrap(), "--commits", "3", "--block-sizes", "4k"]);
    let _ = std::fs::remove_dir_all(&d);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("WARNING") && s.contains("tmpfs") && s.contains("MEANINGLESS"), "{s}");
    assert!(text(&out.stderr).contains("WARNING"));
}
