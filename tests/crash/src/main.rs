//! `tephra-crash`: the crash-consistency harness. See `scripts/crash-soak.sh`.
//!
//! ```text
//! tephra-crash <soak|points|faults|corruption|ci|liveness|verify> [--server PATH] [--seed S] [--cycles N]
//!              [--workload pure,conditional,subscription,mixed] [--round R]
//!              [--segment-size BYTES] [--kill-ms LO-HI] [--run-dir DIR]
//! ```
//! `--server` (or `TEPHRA_CRASH_SERVER`) must be a `tephra-server` built with
//! `--features crash-points` for `points`, `faults` and `ci`.
//! Exit status 0 when every invariant held; 1 with `VIOLATION seed=.. at ..` otherwise (the
//! data directory, witness and server log are kept); 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use tephra_crash::workload::Workload;
use tephra_crash::{Failure, SoakOpts};

fn usage(msg: &str) -> ExitCode {
    eprintln!("{msg}\nusage: tephra-crash <soak|points|faults|corruption|ci|liveness|verify> [--server PATH] [--seed S] [--cycles N] [--workload LIST] [--round R] [--segment-size BYTES] [--kill-ms LO-HI] [--run-dir DIR]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(mode) = args.first().cloned() else { return usage("no mode") };
    let mut server = std::env::var_os("TEPHRA_CRASH_SERVER").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target/crash/release/tephra-server"));
    let mut seed: u64 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64 % 1_000_000).unwrap_or(1);
    let mut cycles = 100u64;
    let mut workloads = Workload::ALL.to_vec();
    let mut round = 25u64;
    let mut segment_size = 256 * 1024u64;
    let mut kill_ms = (20u64, 600u64);
    let mut run_dir: Option<PathBuf> = None;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let Some(v) = it.next() else { return usage(&format!("{a} needs a value")) };
        let num = |v: &str| v.parse::<u64>().ok();
        match a.as_str() {
            "--server" => server = PathBuf::from(v),
            "--seed" => match num(v) {
                Some(n) => seed = n,
                None => return usage("bad --seed"),
            },
            "--cycles" => match num(v) {
                Some(n) => cycles = n,
                None => return usage("bad --cycles"),
            },
            "--round" => match num(v) {
                Some(n) if n > 0 => round = n,
                _ => return usage("bad --round"),
            },
            "--segment-size" => match num(v) {
                Some(n) => segment_size = n,
                None => return usage("bad --segment-size"),
            },
            "--kill-ms" => match v.split_once('-').and_then(|(a, b)| Some((num(a)?, num(b)?))) {
                Some((a, b)) if a <= b => kill_ms = (a, b),
                _ => return usage("bad --kill-ms (LO-HI)"),
            },
            "--workload" => {
                let parsed: Option<Vec<Workload>> = v.split(',').map(Workload::parse).collect();
                match parsed {
                    Some(w) if !w.is_empty() => workloads = w,
                    _ => return usage("bad --workload (pure,conditional,subscription,mixed)"),
                }
            }
            "--run-dir" => run_dir = Some(PathBuf::from(v)),
            _ => return usage(&format!("unknown option {a}")),
        }
    }
    if !server.exists() {
        return usage(&format!("server binary {} not found (build it with --features crash-points)", server.display()));
    }
    let run_dir = run_dir.unwrap_or_else(|| PathBuf::from(format!("target/crash-runs/{mode}-{seed}")));
    if mode != "verify" {
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(&run_dir).expect("run dir");
    }
    println!("tephra-crash {mode}: seed {seed}, server {}, run dir {}", server.display(), run_dir.display());
    let t = Instant::now();
    let result: Result<Vec<String>, Failure> = match mode.as_str() {
        "soak" => {
            let o = SoakOpts { seed, cycles, workloads, round, segment_size, kill_ms, run_dir: run_dir.clone(), verbose: true };
            tephra_crash::soak(&server, &o).map(|r| vec![format!("soak: {r}")])
        }
        "points" => tephra_crash::points(&server, seed, &run_dir, 64 * 1024),
        "faults" => tephra_crash::faults(&server, seed, &run_dir, 64 * 1024),
        "corruption" => tephra_crash::corruption(&server, seed, &run_dir),
        "ci" => tephra_crash::ci(&server, seed, cycles, &run_dir),
        "liveness" => tephra_crash::liveness(&server, seed, cycles, &run_dir),
        "verify" => tephra_crash::verify(&server, seed, &run_dir),
        _ => return usage(&format!("unknown mode {mode}")),
    };
    let hangs = tephra_crash::hangs();
    if !hangs.is_empty() {
        println!(
            "LIVENESS: {} time(s) the server stopped answering for {} s (restarted and checked; not a durability violation):",
            hangs.len(),
            tephra_crash::workload::ANSWER_TIMEOUT.as_secs()
        );
        for h in &hangs {
            println!("  - {h}");
        }
    }
    match result {
        Ok(lines) => {
            for l in &lines {
                println!("  ok: {l}");
            }
            if mode != "verify" {
                let _ = std::fs::remove_dir_all(&run_dir);
            }
            println!("tephra-crash {mode} seed {seed}: every invariant held ({:.0} s)", t.elapsed().as_secs_f64());
            println!("crash: {} passed, 0 failed", lines.len());
            ExitCode::SUCCESS
        }
        Err(f) => {
            println!("{f}");
            println!("reproduce: tephra-crash {} --seed {seed} (cycle/scenario above)", args.join(" "));
            println!("crash: 0 passed, 1 failed");
            ExitCode::from(1)
        }
    }
}
