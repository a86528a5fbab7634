//! End-to-end tests of the load-generating subcommands against real servers on loopback:
//! ours (`target/release/tephra-server`, built on demand unless
//! `TEPHRA_BENCH_BUILD_SERVER=0`, or `$TEPHRA_SERVER`) and the reference
//! (`$TEPHRA_REFERENCE_SERVER`, else `~/.tephra-reference/bin/tephra-server`). A test whose
//! server is missing is skipped with a loud notice on stderr.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tephra_bench::server::{ServerProcess, ServerSpec};

mod common;
use common::{json_of, ours, reference, run, skip, text, BIN};

fn scratch(name: &str) -> PathBuf {
    common::scratch("tephra-bench-load", name)
}

fn start(binary: &Path, dir: &Path) -> ServerProcess {
    ServerProcess::start(&ServerSpec {
        binary: binary.to_path_buf(),
        data_dir: dir.join("data"),
        env: vec![("TEPHRA__SEGMENT__SIZE".into(), "16777216".into())],
        log_file: dir.join("server.log"),
    })
    .expect("server starts")
}

/// Runs `check` with the address of a fresh `binary` (when there is one: `ours()` and
/// `reference()` give `None` after a skip notice) in the scratch directory `name`, then stops
/// the server and removes the directory.
fn on_server(binary: Option<PathBuf>, name: &str, check: impl FnOnce(&str)) {
    let Some(binary) = binary else { return };
    let dir = scratch(name);
    let server = start(&binary, &dir);
    check(&server.addr.to_string());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two tests of `check`: against our server (`$ours`) and against the reference (`$reference`).
macro_rules! against_both {
    ($check:ident: $ours:ident, $reference:ident) => {
        #[test]
        fn $ours() {
            on_server(ours(), stringify!($ours), $check);
        }

        #[test]
        fn $reference() {
            on_server(reference(), stringify!($reference), $check);
        }
    };
}

fn stored_events(addr: &str) -> u64 {
    tephra::client::Client::connect(addr).unwrap().stats().unwrap().event_count
}

fn check_latency(l: &Value, what: &str) {
    let g = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{what}.{k} missing: {l}"));
    let (p50, p99, p999, max) = (g("p50_us"), g("p99_us"), g("p999_us"), g("max_us"));
    assert!(p50 > 0, "{what}: p50 {p50}");
    assert!(p50 <= p99 && p99 <= p999 && p999 <= max, "{what}: not ordered: {p50} {p99} {p999} {max}");
    assert!(l["count"].as_u64().unwrap() > 0);
}

fn append_counts_match(addr: &str) {
    let out = run(&["append", "--addr", addr, "-c", "4", "-b", "8", "--duration", "1.5", "--warmup", "0.3", "--json"]);
    let j = json_of(&out);
    let total = j["events_acked_total"].as_u64().unwrap();
    assert!(j["events"].as_u64().unwrap() > 0, "{j}");
    assert!(j["events"].as_u64().unwrap() <= total);
    assert_eq!(j["events"].as_u64().unwrap(), 8 * j["requests"].as_u64().unwrap());
    assert!(j["events_per_sec"].as_f64().unwrap() > 0.0);
    assert!(j["errors"].as_object().unwrap().is_empty(), "{j}");
    assert_eq!(j["conditional"], Value::Bool(true));
    check_latency(&j["latency"], "append");
    assert_eq!(stored_events(addr), total, "the store holds exactly the acknowledged events");

    // Unconditional, batch 1: more of the same events.
    let out = run(&["append", "--addr", addr, "-c", "2", "-b", "1", "--duration", "1.5", "--warmup", "0", "--unconditional", "--json"]);
    let j2 = json_of(&out);
    assert_eq!(j2["conditional"], Value::Bool(false));
    check_latency(&j2["latency"], "append unconditional");
    let total = total + j2["events_acked_total"].as_u64().unwrap();
    assert_eq!(stored_events(addr), total);

    // The pipelined generators, 4 requests in flight per connection.
    let mut total = total;
    for client in ["raw", "async"] {
        let out =
            run(&["append", "--addr", addr, "-c", "2", "-b", "16", "--inflight", "4", "--client", client, "--duration", "1.5", "--warmup", "0.2", "--json"]);
        let j3 = json_of(&out);
        assert_eq!(j3["client"], client);
        assert_eq!(j3["inflight"], 4);
        assert!(j3["errors"].as_object().unwrap().is_empty(), "{j3}");
        assert!(j3["events"].as_u64().unwrap() > 0, "{j3}");
        assert_eq!(j3["events"].as_u64().unwrap(), 16 * j3["requests"].as_u64().unwrap());
        check_latency(&j3["latency"], client);
        let timeline: u64 = j3["timeline_events"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(timeline, j3["events_acked_total"].as_u64().unwrap());
        total += j3["events_acked_total"].as_u64().unwrap();
        assert_eq!(stored_events(addr), total, "{client}: the store holds exactly the acknowledged events");
    }
}

against_both!(append_counts_match: append_against_ours_counts_what_the_store_holds, append_against_the_reference_counts_what_the_store_holds);

fn read_reports_sane_numbers(addr: &str) {
    let out = run(&[
        "read",
        "--addr",
        addr,
        "--populate",
        "5000",
        "--needle-every",
        "500",
        "--scan-repeats",
        "2",
        "--selective-reads",
        "5",
        "--subscribers",
        "3",
        "--sub-appends",
        "20",
        "--json",
    ]);
    let j = json_of(&out);
    assert_eq!(j["events_appended"].as_u64().unwrap(), 5020, "{j}");
    let scan = &j["scan"];
    assert_eq!(scan["events"].as_u64().unwrap(), 5000);
    assert!(scan["bytes"].as_u64().unwrap() >= 5000 * 256);
    assert!(scan["events_per_sec_median"].as_f64().unwrap() > 0.0);
    assert!(scan["mb_per_sec_median"].as_f64().unwrap() > 0.0);
    let sel = &j["selective"];
    assert_eq!(sel["matches"].as_u64().unwrap(), 10);
    assert_eq!(sel["expected_matches"].as_u64().unwrap(), 10);
    assert_eq!(sel["reads"].as_u64().unwrap(), 5);
    check_latency(&sel["latency"], "selective");
    let f = &j["fanout"];
    assert_eq!(f["events"].as_u64().unwrap(), 20);
    assert_eq!(f["deliveries"].as_u64().unwrap(), 60, "{f}");
    assert_eq!(f["incomplete"], Value::Bool(false));
    let lag = &f["lag"];
    let (p50, p99, p999) = (lag["p50_us"].as_u64().unwrap(), lag["p99_us"].as_u64().unwrap(), lag["p999_us"].as_u64().unwrap());
    assert!(p50 <= p99 && p99 <= p999, "lag not ordered: {lag}");
    check_latency(&f["append_latency"], "fan-out appends");
    assert_eq!(stored_events(addr), 5020);
}

against_both!(read_reports_sane_numbers: read_against_ours_reports_sane_numbers, read_against_the_reference_reports_sane_numbers);

fn pid_alive(pid: u32) -> bool {
    // A zombie would still have /proc/PID; compare reaps its children, so none is left.
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `compare` of `ours` and `reference` with its data in `dir/data`, its results in `dir/out`,
/// and `more` options.
fn compare_args(ours: &Path, reference: &Path, dir: &Path, more: &[&str]) -> Vec<String> {
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let mut args = vec!["compare".to_owned(), "--ours".into(), path(ours), "--reference".into(), path(reference)];
    args.extend(["--dir".into(), path(&dir.join("data")), "--out".into(), path(&dir.join("out"))]);
    args.extend(more.iter().map(|a| a.to_string()));
    args
}

#[test]
fn compare_runs_both_servers_and_writes_table_json_and_chart() {
    let Some(ours_bin) = ours() else { return };
    // Without the reference, the mechanics are still checked with ours on both sides.
    let ref_bin = tephra_bench::server::default_reference().unwrap_or_else(|| {
        skip("the reference tephra-server is missing: compare test uses ours on both sides");
        ours_bin.clone()
    });
    let dir = scratch("compare");
    let out_dir = dir.join("out");
    let args = compare_args(
        &ours_bin,
        &ref_bin,
        &dir,
        &[
            "--matrix",
            "2x1,2x16",
            // Quick read-side settings, explicit append settings.
            "--quick",
            "--read",
            "--read-populate",
            "3000",
            "--rounds",
            "2",
            // Long enough that a window is never empty, even on a loaded machine.
            "--duration",
            "1.5",
            "--warmup",
            "0.2",
            "--settle-ms",
            "0",
            "--segment-size",
            "16777216",
        ],
    );
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, text(&out.stderr));
    assert!(stdout.contains("| 2 × 1 |") && stdout.contains("| 2 × 16 |"), "{stdout}");
    assert!(stdout.contains("ours/reference"), "{stdout}");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("compare.json")).unwrap()).unwrap();
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2 * 2 * 2);
    // Alternating A B A B.
    let order: Vec<&str> = runs.iter().map(|r| r["server"].as_str().unwrap()).collect();
    assert_eq!(order, ["ours", "reference"].repeat(4));
    for r in runs {
        assert_eq!(r["stored_events"].as_u64(), r["report"]["events_acked_total"].as_u64(), "{r}");
        check_latency(&r["report"]["latency"], "compare run");
        assert!(!pid_alive(r["server_pid"].as_u64().unwrap() as u32), "server left running: {r}");
    }
    for c in j["cells"].as_array().unwrap() {
        assert!(c["throughput_ratio"].as_f64().unwrap() > 0.0, "{c}");
    }
    let svg = std::fs::read_to_string(out_dir.join("compare.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("2 × 16"), "{}", &svg[..200.min(svg.len())]);
    assert!(std::fs::read_to_string(out_dir.join("compare.md")).unwrap().contains("| 2 × 1 |"));
    // The read side ran on both servers every round, and each held what it appended.
    assert!(stdout.contains("Read side"), "{stdout}");
    let reads = j["read_runs"].as_array().unwrap();
    let order: Vec<&str> = reads.iter().map(|r| r["server"].as_str().unwrap()).collect();
    assert_eq!(order, ["ours", "reference"].repeat(2));
    for r in reads {
        let rep = &r["report"];
        assert_eq!(rep["scan"]["events"].as_u64(), Some(3000), "{r}");
        assert_eq!(rep["selective"]["matches"].as_u64(), Some(10), "{r}");
        assert_eq!(r["stored_events"], rep["events_appended"], "{r}");
        check_latency(&rep["selective"]["latency"], "compare read");
    }
    // Every data directory was removed.
    assert_eq!(std::fs::read_dir(dir.join("data")).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_stops_its_server_on_sigint() {
    let Some(ours_bin) = ours() else { return };
    let dir = scratch("compare-sigint");
    let args =
        compare_args(&ours_bin, &ours_bin, &dir, &["--matrix", "2x1", "--rounds", "1", "--duration", "30", "--warmup", "0", "--segment-size", "16777216"]);
    let mut child = Command::new(BIN).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep draining stderr after the pid line.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split(" pid ").nth(1) {
                if let Some(pid) = rest.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
                    let _ = tx.send(pid);
                }
            }
        }
    });
    let pid = rx.recv_timeout(Duration::from_secs(60)).expect("compare reports the server's pid");
    assert!(pid_alive(pid));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "compare did not stop after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(!pid_alive(pid), "server {pid} still running after compare was interrupted");
    let j: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("out").join("compare.json")).unwrap()).unwrap();
    assert_eq!(j["interrupted"], Value::Bool(true));
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_usage(args: &[&str], needle: &str) {
    let out = run(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: stderr lacks {needle:?}: {err}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    assert_usage(&["append"], "--addr");
    assert_usage(&["append", "--addr", "nonsense"], "not HOST:PORT");
    assert_usage(&["append", "--addr", "127.0.0.1:1", "--batch", "0"], "--batch");
    assert_usage(&["append", "--addr", "127.0.0.1:1", "--duration", "0"], "--duration");
    assert_usage(&["append", "--addr", "127.0.0.1:1", "--inflight", "4"], "--inflight 4");
    assert_usage(&["append", "--addr", "127.0.0.1:1", "--inflight", "300", "--client", "raw"], "at most 256");
    assert_usage(&["append", "--addr", "127.0.0.1:1", "--client", "tokio"], "--client");
    assert_usage(&["read"], "--addr");
    assert_usage(&["read", "--addr", "127.0.0.1:1", "--sub-batch", "0"], "--sub-batch");
    assert_usage(&["compare", "--matrix", "16"], "CONNECTIONSxBATCH");
    assert_usage(&["compare", "--ours", "/nonexistent/tephra-server"], "does not exist");
    assert_usage(&["compare", "--server-env", "novalue"], "KEY=VALUE");
}

#[test]
fn an_unreachable_server_fails_with_exit_1() {
    // Bind then drop a listener to get a port that refuses connections.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let out = run(&["append", "--addr", &addr, "--duration", "0.2", "--warmup", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("connection 1 of 16"), "{}", text(&out.stderr));
    let out = run(&["read", "--addr", &addr]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

/// `append --duration 20` stopped by a signal after about 3 s: the longest stall is measured
/// inside the window that actually ran (it counted the empty buckets up to the planned end,
/// reporting an 18 s stall after a 2 s window), and the exit code names the signal: 143 after
/// SIGTERM (it was 130), 130 after SIGINT.
#[test]
fn an_interrupted_append_reports_stalls_inside_the_window_it_ran_and_exits_by_signal() {
    on_server(ours(), "append-interrupted", |addr| {
        for (signal, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
            let child = Command::new(BIN)
                .args(["append", "--addr", addr, "-c", "2", "-b", "8", "--duration", "20", "--warmup", "1", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_secs(3));
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
            let started = Instant::now();
            let out = child.wait_with_output().unwrap();
            assert!(started.elapsed() < Duration::from_secs(10), "append took {:?} to stop", started.elapsed());
            assert_eq!(out.status.code(), Some(code), "signal {signal}: stderr: {}", text(&out.stderr));
            let j: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", text(&out.stdout)));
            assert_eq!(j["interrupted"], Value::Bool(true), "{j}");
            let window = j["window_seconds"].as_f64().unwrap();
            assert!(window > 1.0 && window < 5.0, "window {window} s: {j}");
            let stall = j["longest_stall_ms"].as_u64().unwrap();
            assert!((stall as f64) < window * 1000.0, "a {stall} ms stall inside a {window} s window: {j}");
            assert!(stall < 1500, "a {stall} ms stall on an idle loopback server: {j}");
        }
    });
}
