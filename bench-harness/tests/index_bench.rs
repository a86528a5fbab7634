//! End-to-end test of `tephra-bench index prepare` and `index run` on a tiny log (20,000
//! events in 1 MiB segments): the manifest must describe the log the server actually holds
//! (checked here by a full scan, independently of the harness), the run must produce
//! parseable results for every contender, and a run whose expectations are wrong must fail
//! loudly instead of reporting numbers.
//!
//! Our server: `$TEPHRA_SERVER`, else `target/release/tephra-server` (built on demand unless
//! `TEPHRA_BENCH_BUILD_SERVER=0`). The reference joins the run when it is installed
//! (`$TEPHRA_REFERENCE_SERVER`, else `~/.tephra-reference/bin/tephra-server`); otherwise the
//! run uses `--reference none` and says so on stderr.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tephra::client::Client;
use tephra::{Position, Query};
use tephra_bench::index::layout::{Manifest, RARE_TYPE};
use tephra_bench::server::{ServerProcess, ServerSpec};

mod common;
use common::{json_of, ours, run, text};

fn scratch(name: &str) -> PathBuf {
    common::scratch("tephra-bench-index", name)
}

const PREPARE: &[&str] = &["--events", "20000", "--tags", "1000", "--rare-tags", "100", "--segment-bytes", "1048576", "--batch", "256", "--json"];

/// A copy of the prepared log (segments only) in `to`.
fn copy_segments(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if tephra_bench::index::layout::is_segment_name(&name) {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Reads the whole prepared log through our server and checks the manifest against it.
fn manifest_matches_the_log(server: &Path, dir: &Path, scratch: &Path) {
    let m = Manifest::load(dir).unwrap();
    let copy = scratch.join("scan-copy");
    copy_segments(dir, &copy);
    let s = ServerProcess::start(&ServerSpec {
        binary: server.to_path_buf(),
        data_dir: copy.clone(),
        env: vec![("TEPHRA__SEGMENT__SIZE".into(), m.segment_bytes.to_string())],
        log_file: scratch.join("scan-server.log"),
    })
    .unwrap();
    let mut c = Client::connect(s.addr).unwrap();
    let (all, _) = c.read_all(Query::all(), Position::ZERO).unwrap();
    assert_eq!(all.len() as u64, m.layout.events);
    let mut rare: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut rare_type = Vec::new();
    let mut types: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen_k = vec![false; m.layout.events as usize];
    for (i, se) in all.iter().enumerate() {
        let p = se.position.get();
        assert_eq!(p, i as u64 + 1);
        let e = &se.event;
        assert_eq!(e.data().len() as u64, m.layout.event_bytes);
        let k = u64::from_le_bytes(e.data()[..8].try_into().unwrap());
        assert!(!std::mem::replace(&mut seen_k[k as usize], true), "event {k} twice");
        let tags: Vec<&str> = e.tags().collect();
        assert!(tags.contains(&format!("bulk-{}", k % m.layout.tags).as_str()), "{tags:?} at {p}");
        for t in tags.iter().filter(|t| t.starts_with("rare-")) {
            rare.entry(t.to_string()).or_default().push(p);
        }
        if e.event_type() == RARE_TYPE {
            rare_type.push(p);
        } else {
            *types.entry(e.event_type().to_owned()).or_default() += 1;
        }
    }
    assert_eq!(rare.len() as u64, m.layout.rare_tags);
    for (j, want) in m.rare_tag_positions.iter().enumerate() {
        assert_eq!(want.len(), 10);
        assert_eq!(rare.get(&format!("rare-{j}")), Some(want), "rare-{j}");
        // Spread over the whole log: one in each tenth (by event number, positions follow
        // the batches closely).
        assert!(want[0] <= m.layout.events / 5 && want[9] >= m.layout.events * 4 / 5, "rare-{j}: {want:?}");
    }
    assert_eq!(rare_type, m.rare_type_positions);
    let counts: Vec<u64> = (0..m.layout.common_types).map(|c| types.get(&format!("type-{c}")).copied().unwrap_or(0)).collect();
    assert_eq!(counts, m.type_counts);
    assert!(counts.iter().all(|&n| n > 1000), "{counts:?}");
    drop(c);
    drop(s);
}

#[test]
fn prepare_and_run_measure_correct_results() {
    let Some(server) = ours() else { return };
    let server_s = server.to_str().unwrap();
    let d = scratch("e2e");
    let data = d.join("data");
    let data_s = data.to_str().unwrap();

    // prepare: writes, then reuses; a different request is refused without --force.
    let mut args = vec!["index", "prepare", "--dir", data_s, "--ours", server_s];
    args.extend_from_slice(PREPARE);
    let j = json_of(&run(&args));
    assert_eq!(j["action"], "wrote", "{j}");
    assert_eq!(j["events"], 20000);
    assert!(j["segment_files"].as_u64().unwrap() >= 3, "several segments: {j}");
    assert_eq!(json_of(&run(&args))["action"], "reused");
    let mut other = args.clone();
    other.pop();
    other.extend(["--seed", "7", "--json"]);
    let out = run(&other);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--force"), "{}", text(&out.stderr));
    let names: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !tephra_bench::index::layout::is_segment_name(n))
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["prepare-server.log", "prepare.json"], "only the log, its manifest and the server log");

    manifest_matches_the_log(&server, &data, &d);

    // run: ours, the reference when installed, the scan baseline.
    let reference = tephra_bench::server::default_reference();
    if reference.is_none() {
        eprintln!("\n*** the reference tephra-server is not installed: running ours only (--reference none) ***\n");
    }
    let ref_arg = reference.as_ref().map_or("none".to_owned(), |p| p.display().to_string());
    let out_dir = d.join("out");
    let o = run(&[
        "index",
        "run",
        "--dir",
        data_s,
        "--ours",
        server_s,
        "--reference",
        &ref_arg,
        "--rounds",
        "1",
        "--selective-reads",
        "30",
        "--type-reads",
        "8",
        "--appends",
        "5",
        "--scan-reads",
        "2",
        "--scan-appends",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
        "--json",
    ]);
    let r = json_of(&o);
    let mut want = vec!["ours"];
    if reference.is_some() {
        want.push("reference");
    }
    want.push("ours-scan");
    let mut got: Vec<&str> = r["runs"].as_array().unwrap().iter().map(|x| x["contender"].as_str().unwrap()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{r}");
    for x in r["runs"].as_array().unwrap() {
        let name = x["contender"].as_str().unwrap();
        assert!(x["head"].as_u64().unwrap() >= 20000);
        assert!(x["open_warm_s"].as_f64().unwrap() > 0.0);
        if name != "ours-scan" {
            assert!(x["open_cold_s"].as_f64().unwrap() > 0.0, "{x}");
        }
        let expect = if name == "ours-scan" { (2, 2, 2) } else { (30, 8, 5) };
        assert_eq!(x["selective"]["count"], expect.0, "{name}");
        assert_eq!(x["rare_type"]["count"], expect.1, "{name}");
        assert_eq!(x["common_type"]["count"], 8, "{name}");
        assert_eq!(x["append_boundary"]["count"], expect.2, "{name}");
        assert_eq!(x["append_unique"]["count"], expect.2, "{name}");
        assert_eq!(x["append_exists"]["count"], expect.2, "{name}");
        for k in ["selective", "rare_type", "common_type", "append_boundary", "append_unique", "append_exists"] {
            let s = &x[k];
            assert!(s["p50_us"].as_f64().unwrap() > 0.0 && s["p50_us"].as_f64() <= s["p99_us"].as_f64(), "{name} {k}: {s}");
        }
        assert!(x["exit_codes"].as_array().unwrap().iter().all(|c| c == 0), "clean shutdowns: {x}");
    }
    let sel = r["summary"].as_array().unwrap().iter().find(|s| s["key"] == "selective_p50_us").unwrap();
    assert!(sel["scan_over_ours"].as_f64().unwrap() > 0.0);
    assert_eq!(sel["ours_over_reference"].is_null(), reference.is_none());
    assert!(out_dir.join("index.md").is_file() && out_dir.join("index.json").is_file());
    assert!(out_dir.join("logs").join("ours-r1.log").is_file());
    assert!(!d.join("data.work").exists(), "the copies are removed");
    Manifest::load(&data).unwrap().check_segments(&data).expect("the prepared directory is untouched");

    // A manifest that expects something else: the run fails loudly, with no report.
    let bad = d.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    copy_segments(&data, &bad);
    let mut m = Manifest::load(&data).unwrap();
    m.rare_type_positions[0] += 1;
    m.segments = tephra_bench::index::layout::segment_files(&bad).unwrap();
    m.store(&bad).unwrap();
    let bad_out = d.join("bad-out");
    let o = run(&[
        "index",
        "run",
        "--dir",
        bad.to_str().unwrap(),
        "--ours",
        server_s,
        "--reference",
        "none",
        "--rounds",
        "1",
        "--scan-rounds",
        "0",
        "--selective-reads",
        "3",
        "--type-reads",
        "3",
        "--appends",
        "3",
        "--out",
        bad_out.to_str().unwrap(),
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("WRONG RESULT") && err.contains(RARE_TYPE), "{err}");
    assert!(!bad_out.join("index.md").exists());
    let _ = std::fs::remove_dir_all(&d);
}
