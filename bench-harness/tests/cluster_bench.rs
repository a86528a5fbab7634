//! `tephra-bench cluster` end to end, tiny: one fenced workload with writers sharing journals,
//! the read workload and one failover trial, on three nodes of ours, one node of ours, and a
//! three-member etcd when it is installed (scripts/install-etcd.sh; without it the etcd half is
//! SKIPPED loudly). Checks that every run measured something, that ours holds exactly the
//! records it acknowledged, that failover acknowledged a write, that the files are written and
//! the data directories removed.

mod common;

use common::{json_of, run, scratch, skip, text};
use serde_json::Value;

fn runs_of<'a>(report: &'a Value, system: &str) -> Vec<&'a Value> {
    report["runs"].as_array().expect("runs").iter().filter(|r| r["system"] == system).collect()
}

#[test]
fn cluster_benchmark_runs_every_part() {
    let Some(ours) = common::ours() else { return };
    let etcd = tephra_bench::etcd::default_etcd();
    if etcd.is_none() {
        skip("etcd is not installed (scripts/install-etcd.sh): tephra-bench cluster runs against ours only");
    }
    let dir = scratch("cluster-bench", "data");
    let out = scratch("cluster-bench", "out");
    let etcd_arg = etcd.as_ref().map_or("none".to_owned(), |p| p.display().to_string());
    let args = [
        "cluster",
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
        "0.5",
        "--warmup",
        "0.2",
        // Four writers over two journals: two writers race on each.
        "--journals",
        "2",
        "--writers",
        "4",
        "--batches",
        "2",
        "--readers",
        "3",
        "--failover-trials",
        "1",
        "--settle-ms",
        "50",
        "--json",
    ];
    let started = std::time::Instant::now();
    let output = run(&args);
    eprintln!("tephra-bench cluster took {:.1} s\nstderr:\n{}", started.elapsed().as_secs_f64(), text(&output.stderr));
    let report = json_of(&output);

    let three = runs_of(&report, "ours");
    let one = runs_of(&report, "ours-1node");
    assert_eq!((three.len(), one.len()), (2, 1), "fenced on both, reads on the cluster only: {report:#}");
    for r in three.iter().chain(&one) {
        assert!(r["failed"].is_null(), "a run failed: {r:#}");
        assert!(r["records_per_sec"].as_f64().unwrap() > 0.0, "nothing acknowledged: {r:#}");
        let l = &r["latency"];
        assert!(l["p50_us"].as_u64().unwrap() <= l["p99_us"].as_u64().unwrap(), "{r:#}");
        if r["workload"].as_str().unwrap().starts_with("fenced") {
            assert_eq!(r["check"], "held = acked", "{r:#}");
            assert_eq!(r["records_acked_total"].as_u64().unwrap() % 2, 0, "whole batches of 2: {r:#}");
            assert!(r["server"]["writes"].as_u64().unwrap() > 0, "the leader's /metrics counted no write: {r:#}");
        }
    }
    let led: u64 = three[0]["leaders"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(led, 2, "every journal has one leader: {:#}", three[0]);
    let failover = report["failover"].as_array().unwrap();
    assert_eq!(failover.len(), if etcd.is_some() { 2 } else { 1 }, "{report:#}");
    for f in failover {
        assert!(f["failed"].is_null(), "failover failed: {f:#}");
        assert_eq!(f["trials_ms"].as_array().unwrap().len(), 1, "{f:#}");
    }
    if etcd.is_some() {
        let etcd_runs = runs_of(&report, "etcd");
        assert_eq!(etcd_runs.len(), 2, "{report:#}");
        for r in &etcd_runs {
            assert!(r["failed"].is_null(), "an etcd run failed: {r:#}");
            assert!(r["records_per_sec"].as_f64().unwrap() > 0.0, "nothing acknowledged: {r:#}");
        }
    }
    let table = std::fs::read_to_string(out.join("cluster.md")).expect("cluster.md");
    assert!(table.contains("| workload | ours records/s | etcd records/s |"), "{table}");
    assert!(table.contains("## Failover") && table.contains("## Where a write's time goes (ours)"), "{table}");
    assert!(out.join("cluster.json").is_file());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "data directories left behind: {left:?}");
}

#[test]
fn cluster_benchmark_refuses_bad_arguments() {
    for bad in [
        &["cluster", "--writers", "0"][..],
        &["cluster", "--batches", "x"],
        &["cluster", "--store-durability", "lazy"],
        &["cluster", "--etcd", "/nonexistent/etcd"],
    ] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
}
