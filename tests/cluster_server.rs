//! Replicated journals on a three-node cluster of real `tephra-server` processes on loopback
//! (docs/journals.md §9.5): a journal created on any node is written through the blocking
//! client with every node listed, each node serves the same records, and the journal goes on
//! through the SIGKILL of its group's leader and serves everything after the node comes back.
//! With `[tls]` and `cluster.tls_ca`, clients and peers speak TLS only, and a node whose
//! certificate the CA did not sign refuses to start.

use std::time::{Duration, Instant};

use support::cluster::client;
use support::Cluster;
use tephra::client::journal::{CreateOutcome, DeleteOutcome, JournalError, Journals, JournalsConfig, JournalsTls, ReadOutcome, SetLeaderOutcome, WriteOutcome};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};
use tephra_test_support as support;

const A: LeaderUuid = LeaderUuid(0xa);

fn server_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

fn record(i: u64) -> Vec<u8> {
    format!("record-{i:05}").into_bytes()
}

/// Writes `records` at `seq` as leader `A`, settling an ambiguous answer; the seq after them.
fn write(c: &mut Journals, id: JournalId, seq: u64, records: &[Vec<u8>]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.write_single(id, A, seq, records) {
            Ok(WriteOutcome::Written { seq: s, count, .. }) => {
                assert_eq!(s, seq);
                return seq + u64::from(count);
            }
            Ok(WriteOutcome::Ambiguous | WriteOutcome::NotLeader { .. } | WriteOutcome::Busy)
            | Err(JournalError::Unreachable(_) | JournalError::NoAnswer { .. }) => {
                assert!(Instant::now() < deadline, "no verdict for the write at {seq} within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("write at {seq}: {other:?}"),
        }
    }
}

/// Every record of `id` as node `addr` serves it, from 0.
fn read_all(addr: &str, id: JournalId) -> Vec<Vec<u8>> {
    read_all_with(&mut client(vec![addr.to_owned()]), addr, id)
}

/// Every record of `id` as `c`'s server (at `addr`) serves it, from 0.
fn read_all_with(c: &mut Journals, addr: &str, id: JournalId) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.read(id, out.len() as u64, 0, 0) {
            Ok(ReadOutcome::Page { records, state, .. }) => {
                out.extend(records);
                if out.len() as u64 >= state.next_seq {
                    return out;
                }
            }
            other => {
                assert!(Instant::now() < deadline, "node {addr} did not serve {id} within 20 s: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The node that leads `id`'s group, from each node's `/metrics`.
fn leader(cluster: &Cluster, id: JournalId) -> u64 {
    let label = format!("tephra_cluster_group_is_leader{{tenant=\"{:016x}\",journal=\"{:016x}\"}} 1", id.tenant, id.journal);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for n in cluster.ids() {
            if cluster.node(n).unwrap().metrics().contains(&label) {
                return n;
            }
        }
        assert!(Instant::now() < deadline, "no node leads {id}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn create(c: &mut Journals, name: &str) -> JournalId {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.create("acme", name, Mode::Single, StoreDurability::Ordered) {
            Ok(CreateOutcome::Created { id }) => return id,
            other => {
                assert!(Instant::now() < deadline, "create {name}: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn three_nodes_serve_the_same_journal_and_survive_the_loss_of_its_leader() {
    let env = [("TEPHRA__METRICS__BIND", "127.0.0.1:0")];
    let mut cluster = Cluster::start(&server_bin(), 3, &env);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "orders");
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    let all: Vec<Vec<u8>> = (0..300).map(record).collect();
    let mut seq = 0;
    for chunk in all[..200].chunks(10) {
        seq = write(&mut c, id, seq, chunk);
    }
    for addr in cluster.addrs() {
        assert_eq!(read_all(&addr, id), all[..200], "node {addr}");
    }

    let dead = leader(&cluster, id);
    cluster.kill(dead);
    let killed_at = Instant::now();
    let mut c = client(cluster.addrs());
    seq = write(&mut c, id, seq, &all[200..201]);
    let failover = killed_at.elapsed();
    eprintln!("first write after the leader died: {failover:?}");
    assert!(failover < Duration::from_secs(5), "the first write after the leader died took {failover:?}");
    for chunk in all[201..300].chunks(11) {
        seq = write(&mut c, id, seq, chunk);
    }
    assert_eq!(seq, 300);
    assert_ne!(leader(&cluster, id), dead);

    cluster.start_node(dead);
    let back = cluster.node(dead).unwrap().addr.to_string();
    assert_eq!(read_all(&back, id), all, "the restarted node serves every record");
    for addr in cluster.addrs() {
        assert_eq!(read_all(&addr, id), all, "node {addr}");
    }
}

/// `tephra cluster status --json` over `servers`: its exit code and one document per server.
fn status(servers: &[String]) -> (i32, Vec<serde_json::Value>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tephra"))
        .args(["--json", "--timeout", "2", "cluster", "--servers", &servers.join(","), "status"])
        .output()
        .unwrap();
    let docs = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (out.status.code().unwrap_or(-1), docs)
}

#[test]
fn cluster_status_shows_each_node_its_groups_and_a_node_that_is_down() {
    let mut cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "status");
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    write(&mut c, id, 0, &[record(0), record(1)]);
    let servers = cluster.addrs();
    // Every node converges: one leader per group, the same term, nothing behind.
    let deadline = Instant::now() + Duration::from_secs(10);
    let docs = loop {
        let (code, docs) = status(&servers);
        assert_eq!(code, 0, "{docs:?}");
        let settled = docs.iter().all(|d| {
            d["groups"].as_array().unwrap().len() == 2
                && d["groups"].as_array().unwrap().iter().all(|g| g["behind"] == 0 && g["leader"].is_u64())
                && d["peers"].as_array().unwrap().iter().all(|p| p["connected"] == true)
        });
        if settled {
            break docs;
        }
        assert!(Instant::now() < deadline, "the status did not settle: {docs:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let nodes: Vec<u64> = docs.iter().map(|d| d["node"].as_u64().unwrap()).collect();
    assert_eq!(nodes, [1, 2, 3]);
    for group in ["directory", "acme/status"] {
        let rows: Vec<&serde_json::Value> = docs.iter().flat_map(|d| d["groups"].as_array().unwrap()).filter(|g| g["group"] == group).collect();
        assert_eq!(rows.len(), 3, "{group} on every node");
        assert_eq!(rows.iter().filter(|g| g["role"] == "leader").count(), 1, "one leader of {group}: {rows:?}");
        assert!(rows.iter().all(|g| g["leader"] == rows[0]["leader"] && g["voters"] == serde_json::json!([1, 2, 3])), "{rows:?}");
    }

    // A node down: it is shown unreachable, the others show its link down, exit 1.
    cluster.kill(2);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, docs) = status(&servers);
        assert_eq!(code, 1);
        assert!(docs[1]["error"].is_string(), "{docs:?}");
        let down = |d: &serde_json::Value| d["peers"].as_array().unwrap().iter().any(|p| p["node"] == 2 && p["connected"] == false);
        if down(&docs[0]) && down(&docs[2]) {
            break;
        }
        assert!(Instant::now() < deadline, "node 2's links still up: {docs:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_deleted_journal_is_gone_on_every_node_and_its_name_is_free_again() {
    let cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "gone");
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    write(&mut c, id, 0, &[record(0), record(1), record(2)]);
    match c.delete(id).unwrap() {
        DeleteOutcome::Deleted { state } => assert_eq!(state.next_seq, 3),
        other => panic!("delete: {other:?}"),
    }
    assert!(matches!(c.write_single(id, A, 3, &[record(3)]).unwrap(), WriteOutcome::UnknownJournal));
    for addr in cluster.addrs() {
        let mut one = client(vec![addr.clone()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match one.read(id, 0, 0, 0).unwrap() {
                ReadOutcome::UnknownJournal => break,
                other => assert!(Instant::now() < deadline, "node {addr} still serves the deleted journal: {other:?}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The name is freed by the directory group shortly after: a new journal, empty.
    let again = create(&mut c, "gone");
    assert_ne!(again, id);
    assert!(matches!(c.set_leader(again, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    match c.read(again, 0, 0, 0).unwrap() {
        ReadOutcome::Page { records, state, .. } => assert!(records.is_empty() && state.next_seq == 0),
        other => panic!("read of the new journal: {other:?}"),
    }
}

/// Starts a server by hand as node `id` of `cluster` (its environment, `extra` on top) on
/// `data_dir`, and waits up to 15 s for it to stop by itself: its exit code and its stderr.
fn run_until_it_stops(cluster: &Cluster, id: u64, data_dir: &std::path::Path, extra: &[(&str, &str)]) -> (Option<i32>, String) {
    // Started by hand: it may stop before it would print its ready line.
    let mut node = std::process::Command::new(server_bin())
        .args(["--bind", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .envs(cluster.node_env(id))
        .envs(extra.iter().copied())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(15) {
            let _ = node.kill();
            let _ = node.wait();
            panic!("the second node {id} did not stop by itself within 15 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(node.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn a_node_whose_data_was_lost_refuses_to_rejoin_as_itself() {
    let mut cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "kept");
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    write(&mut c, id, 0, &[record(0)]);
    // Every node has joined the directory by now (it asks within a tick of a known leader).
    std::thread::sleep(Duration::from_millis(500));

    // A second process with node 1's id (its own data directory and peer port) while node 1
    // runs: its peers refuse its links and tell it why; it stops with exit 3, and node 1 stays.
    let second = tempfile::tempdir().unwrap();
    let peer_port = support::cluster::free_addr().to_string();
    let (code, stderr) = run_until_it_stops(&cluster, 1, second.path(), &[("TEPHRA__CLUSTER__BIND", &peer_port)]);
    assert_eq!(code, Some(3), "exit 3: do not restart; it said: {stderr}");
    assert!(stderr.contains("another process runs with that node's id") && stderr.contains("do not restart this node"), "{stderr}");
    assert!(cluster.wait_exit(1, Duration::from_millis(500)).is_none(), "node 1 runs on: {}", cluster.log(1));
    assert_eq!(write(&mut c, id, 1, &[record(1)]), 2);

    cluster.kill(3);
    std::fs::remove_dir_all(cluster.data_dir(3)).unwrap();
    let (code, stderr) = run_until_it_stops(&cluster, 3, &cluster.data_dir(3), &[]);
    assert_eq!(code, Some(3), "exit 3: do not restart; it said: {stderr}");
    assert!(stderr.contains("do not restart this node"), "{stderr}");
    // The others go on.
    let mut c = client(cluster.addrs());
    assert_eq!(write(&mut c, id, 2, &[record(2)]), 3);

    // A single node refuses a cluster member's data directory (node 3's, stopped), naming it.
    let out = std::process::Command::new(server_bin()).args(["--bind", "127.0.0.1:0", "--data-dir"]).arg(cluster.data_dir(3)).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("belongs to a cluster member"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_leader_past_its_admission_limit_answers_busy_and_the_client_sends_the_write_again() {
    let env = [("TEPHRA__METRICS__BIND", "127.0.0.1:0"), ("PAROS_ADMISSION_ROUNDS", "2")];
    let cluster = Cluster::start(&server_bin(), 3, &env);
    let mut c = client(cluster.addrs());
    let id = match c.create("acme", "busy", Mode::Multi, StoreDurability::Ordered) {
        Ok(CreateOutcome::Created { id }) => id,
        other => panic!("create: {other:?}"),
    };
    let lead = leader(&cluster, id);
    let addr = cluster.node(lead).unwrap().addr.to_string();
    let writers: Vec<_> = (0..24)
        .map(|w| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = client(vec![addr]);
                for i in 0..20 {
                    match c.write_multi(id, &[format!("w{w}-{i}").into_bytes()]).unwrap() {
                        WriteOutcome::Written { .. } => {}
                        other => panic!("writer {w} record {i}: {other:?}"),
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let records = read_all(&addr, id);
    assert_eq!(records.len(), 24 * 20, "every write landed once");
    let busy: u64 = support::sample(&cluster.node(lead).unwrap().metrics(), "tephra_cluster_busy_total").parse().unwrap();
    assert!(busy > 0, "24 writers against an admission limit of 2 met BUSY");
}

/// A client of `servers` over TLS, trusting `ca` and checking each server's address.
fn tls_client(servers: Vec<String>, ca: &std::path::Path) -> Journals {
    let mut c = JournalsConfig::new(servers);
    c.request_timeout = Duration::from_secs(10);
    c.read_timeout = Duration::from_secs(3);
    c.tls = Some(JournalsTls { config: tephra::client::tls::config_with_custom_ca(ca).unwrap(), server_name: None });
    Journals::new(c)
}

#[test]
fn a_cluster_with_tls_serves_clients_and_peers_over_tls_only() {
    let certs = support::scratch_dir();
    let (ca, cert, key) = support::TestCa::new("cluster CA").write(certs.path(), &["127.0.0.1", "localhost"]);
    let (ca_s, cert_s, key_s) = (ca.display().to_string(), cert.display().to_string(), key.display().to_string());
    let env = [("TEPHRA__TLS__CERT", cert_s.as_str()), ("TEPHRA__TLS__KEY", key_s.as_str()), ("TEPHRA__CLUSTER__TLS_CA", ca_s.as_str())];
    let cluster = Cluster::start(&server_bin(), 3, &env);
    let mut c = tls_client(cluster.addrs(), &ca);
    let id = create(&mut c, "sealed");
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    let all: Vec<Vec<u8>> = (0..60).map(record).collect();
    let mut seq = 0;
    for chunk in all.chunks(7) {
        seq = write(&mut c, id, seq, chunk);
    }
    for addr in cluster.addrs() {
        assert_eq!(read_all_with(&mut tls_client(vec![addr.clone()], &ca), &addr, id), all, "node {addr}");
    }
    for n in 1..=3 {
        let log = cluster.log(n);
        assert!(log.lines().any(|l| l.contains("cluster member") && l.contains("tls=true")), "node {n}:\n{log}");
    }
    // The peer port speaks TLS only: a plaintext peer's handshake frame is refused, said so.
    let mut plain = std::net::TcpStream::connect(cluster.peer_addrs[2]).unwrap();
    let hello = tephra::cluster::peer::encode_frame(tephra::config::cluster_id([1, 2, 3]), 1, 3, &[]);
    let _ = std::io::Write::write_all(&mut plain, &[&(hello.len() as u32).to_le_bytes()[..], &hello].concat());
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = std::io::Read::read_to_end(&mut plain, &mut Vec::new());
    let node3 = cluster.node(3).unwrap();
    assert!(node3.log_shows("TLS handshake failed", Duration::from_secs(10)), "{}", node3.log());
    // And the cluster goes on.
    assert_eq!(write(&mut c, id, seq, &[record(60)]), 61);
}

#[test]
fn a_node_whose_certificate_the_cluster_ca_did_not_sign_refuses_to_start() {
    let certs = support::scratch_dir();
    let (_, cert, key) = support::TestCa::new("one CA").write(certs.path(), &["127.0.0.1"]);
    let other = certs.path().join("other-ca.pem");
    std::fs::write(&other, support::TestCa::new("another CA").pem()).unwrap();
    let (cert_s, key_s, other_s) = (cert.display().to_string(), key.display().to_string(), other.display().to_string());
    let missing = certs.path().join("missing.pem").display().to_string();
    for (ca, says) in [(other_s.as_str(), "would be refused by the other nodes"), (missing.as_str(), "cannot read cluster.tls_ca")] {
        let env = [
            ("TEPHRA__CLUSTER__NODE_ID", "1"),
            ("TEPHRA__CLUSTER__BIND", "127.0.0.1:1"),
            ("TEPHRA__CLUSTER__PEERS", "2=127.0.0.1:2"),
            ("TEPHRA__TLS__CERT", cert_s.as_str()),
            ("TEPHRA__TLS__KEY", key_s.as_str()),
            ("TEPHRA__CLUSTER__TLS_CA", ca),
        ];
        let out = support::run_to_exit(&server_bin(), &["--bind", "127.0.0.1:0"], &env, None, Duration::from_secs(30));
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(out.stderr.contains(says) && out.stderr.contains(ca), "{ca}: {}", out.stderr);
    }
}
