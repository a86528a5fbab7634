//! `tephra-bench journal` end to end, short: every workload for about 1 s against our server,
//! and against etcd when it is installed (scripts/install-etcd.sh; without it the etcd half is
//! SKIPPED loudly). Checks that every run measured something, that ours holds exactly the
//! records it acknowledged, that the files are written and the data directories removed.

mod common;

use common::{json_of, run, scratch, skip, text};
use serde_json::Value;

fn runs_of<'a>(report: &'a Value, system: &str) -> Vec<&'a Value> {
    report["runs"].as_array().expect("runs").iter().filter(|r| r["system"] == system).collect()
}

#[test]
fn journal_benchmark_runs_every_workload() {
    let Some(ours) = common::ours() else { return };
    let etcd = tephra_bench::etcd::default_etcd();
    if etcd.is_none() {
        skip("etcd is not installed (scripts/install-etcd.sh): tephra-bench journal runs against ours only");
    }
    let dir = scratch("journal-bench", "data");
    let out = scratch("journal-bench", "out");
    let etcd_arg = etcd.as_ref().map_or("none".to_owned(), |p| p.display().to_string());
    let args = [
        "journal",
        "--ours",
        ours.to_str().unwrap(),
        "--etcd",
        &etcd_arg,
        "--dir",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--rounds",
        "1",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--writers",
        "8",
        "--settle-ms",
        "50",
        "--json",
    ];
    let started = std::time::Instant::now();
    let output = run(&args);
    eprintln!("tephra-bench journal took {:.1} s\nstderr:\n{}", started.elapsed().as_secs_f64(), text(&output.stderr));
    let report = json_of(&output);

    let ours_runs = runs_of(&report, "ours");
    // single × 1, single × 64, multi, tail, dcb.
    assert_eq!(ours_runs.len(), 5, "{report:#}");
    for r in &ours_runs {
        assert!(r["failed"].is_null(), "a run failed: {r:#}");
        assert!(r["records_per_sec"].as_f64().unwrap() > 0.0, "nothing acknowledged: {r:#}");
        let l = &r["latency"];
        assert!(l["p50_us"].as_u64().unwrap() <= l["p99_us"].as_u64().unwrap(), "{r:#}");
        if !r["workload"].as_str().unwrap().contains("DCB") {
            assert_eq!(r["check"], "held = acked", "{r:#}");
        }
    }
    let table = std::fs::read_to_string(out.join("journal.md")).expect("journal.md");
    assert!(table.contains("| workload | ours records/s | etcd records/s |"), "{table}");
    assert!(table.contains("of our DCB server's 8 × 1 conditional append rate"), "{table}");
    assert!(out.join("journal.json").is_file());
    if etcd.is_some() {
        let etcd_runs = runs_of(&report, "etcd");
        assert_eq!(etcd_runs.len(), 4, "{report:#}");
        for r in &etcd_runs {
            assert!(r["failed"].is_null(), "an etcd run failed: {r:#}");
            assert!(r["records_per_sec"].as_f64().unwrap() > 0.0, "nothing acknowledged: {r:#}");
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "data directories left behind: {left:?}");
}

#[test]
fn journal_benchmark_refuses_bad_arguments() {
    for bad in [&["journal", "--batches", "0"][..], &["journal", "--store-durability", "lazy"], &["journal", "--etcd", "/nonexistent/etcd"]] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
}
