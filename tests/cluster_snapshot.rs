//! Compaction and snapshots of journal groups (docs/journals.md §9.9), on real
//! `tephra-server` processes: a group's log is compacted once the journal's `first_seq` passes
//! the records of its entries, a node that was down while that happened catches up by a
//! snapshot and serves every record still held, every node restarts from its compacted log,
//! and a voter added by `configure` after compaction joins through a snapshot.

use std::time::{Duration, Instant};

use support::cluster::client;
use support::Cluster;
use tephra::client::journal::{ConfigureOutcome, CreateOutcome, JournalError, Journals, ReadOutcome, SetLeaderOutcome, TruncateOutcome};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};
use tephra_test_support as support;

const A: LeaderUuid = LeaderUuid(0xa);
/// Entries between snapshot candidates: small, so a few hundred writes compact many times.
const ENV: [(&str, &str); 2] = [("TEPHRA__CLUSTER__SNAPSHOT_ENTRIES", "16"), ("TEPHRA__METRICS__BIND", "127.0.0.1:0")];

fn server() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

fn create(c: &mut Journals, name: &str, survive: u8) -> JournalId {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.create_surviving("acme", name, Mode::Single, StoreDurability::Ordered, survive) {
            Ok(CreateOutcome::Created { id }) => return id,
            Ok(CreateOutcome::Ambiguous) | Err(JournalError::Unavailable(_) | JournalError::Unreachable(_) | JournalError::NoAnswer { .. }) => {
                assert!(Instant::now() < deadline, "create {name}: no verdict within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("create {name}: {other:?}"),
        }
    }
}

fn write(c: &mut Journals, id: JournalId, seq: u64) {
    support::cluster::write_until_written(c, id, A, seq, format!("r{seq}").as_bytes());
}

fn truncate(c: &mut Journals, id: JournalId, up_to: u64) {
    match c.truncate(id, up_to, Some(A)).unwrap() {
        TruncateOutcome::Applied { state } => assert_eq!(state.first_seq, up_to),
        other => panic!("truncate to {up_to}: {other:?}"),
    }
}

/// Writes `n` one-record batches from `next` on, truncating to `keep` records behind the tail
/// after every 40: each truncation lets the groups compact to their last candidate.
fn write_and_truncate(c: &mut Journals, id: JournalId, next: u64, n: u64, keep: u64) -> u64 {
    for seq in next..next + n {
        write(c, id, seq);
        if (seq + 1) % 40 == 0 {
            truncate(c, id, seq + 1 - keep);
        }
    }
    truncate(c, id, next + n - keep);
    next + n
}

/// A counter of node `id`'s `/metrics` (0 when absent or the node is down).
fn counter(cluster: &Cluster, id: u64, name: &str) -> u64 {
    cluster
        .metrics(id, Duration::from_secs(2))
        .and_then(|m| m.lines().find(|l| l.starts_with(&format!("{name} "))).and_then(|l| l.rsplit(' ').next()?.parse().ok()))
        .unwrap_or(0)
}

/// Waits until node `id`'s counter `name` reaches `min` (a node refreshes what `/metrics`
/// shows between its rounds, not at once); its last value.
fn wait_counter(cluster: &Cluster, id: u64, name: &str, min: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = counter(cluster, id, name);
        if v >= min || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node that leads `id`'s group, once one does (within 5 s).
fn group_leader(cluster: &Cluster, id: JournalId) -> u64 {
    for _ in 0..100 {
        if let Some(l) = cluster.group_leader(id.tenant, id.journal) {
            return l;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the group of {id} has no leader within 5 s");
}

/// Reads every record of `id` from node `addr` alone, once it serves them: `(first_seq,
/// records)`.
fn read_all(addr: &str, id: JournalId, want_next: u64) -> (u64, Vec<Vec<u8>>) {
    let mut c = client(vec![addr.to_owned()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let first = match c.read(id, 0, 0, 0) {
            Ok(ReadOutcome::Truncated { state }) => Some(state.first_seq),
            Ok(ReadOutcome::Page { from: 0, state, .. }) => Some(state.first_seq),
            _ => None,
        };
        if let Some(first) = first {
            if let Ok(ReadOutcome::Page { from, records, state }) = c.read(id, first, 0, 0) {
                if state.next_seq == want_next {
                    assert_eq!(from, first);
                    return (first, records);
                }
            }
        }
        assert!(Instant::now() < deadline, "{addr} did not serve {id} up to {want_next} within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn expected(first: u64, next: u64) -> Vec<Vec<u8>> {
    (first..next).map(|s| format!("r{s}").into_bytes()).collect()
}

#[test]
fn a_node_that_missed_the_compacted_entries_catches_up_by_a_snapshot_and_every_node_restarts_from_its_compacted_log() {
    let mut cluster = Cluster::start(&server(), 3, &ENV);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "compacted", 1);
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    let mut next = write_and_truncate(&mut c, id, 0, 20, 5);
    let leader = group_leader(&cluster, id);
    let behind = cluster.ids().find(|&n| n != leader).unwrap();

    // One voter down while the others write, truncate and compact far past it.
    cluster.kill(behind);
    next = write_and_truncate(&mut c, id, next, 200, 5);
    assert!(wait_counter(&cluster, leader, "tephra_cluster_compactions_total", 2) >= 2, "the leader compacted its log");

    // Back: its next entry is compacted on the leader, so it gets a snapshot and then the
    // entries holding the records still held.
    cluster.start_node(behind);
    let addr = cluster.node(behind).unwrap().addr.to_string();
    let (first, records) = read_all(&addr, id, next);
    assert_eq!((first, records), (next - 5, expected(next - 5, next)), "node {behind} after catching up");
    assert!(wait_counter(&cluster, behind, "tephra_cluster_snapshots_installed_total", 1) >= 1, "node {behind} installed a snapshot");
    assert!(wait_counter(&cluster, leader, "tephra_cluster_snapshots_sent_total", 1) >= 1, "node {leader} sent a snapshot");

    // More writes, then every node restarts from its compacted log (snapshot items first).
    next = write_and_truncate(&mut c, id, next, 40, 5);
    for n in 1..=3 {
        cluster.kill(n);
    }
    for n in 1..=3 {
        cluster.start_node(n);
    }
    let mut c = client(cluster.addrs());
    next = write_and_truncate(&mut c, id, next, 3, 5);
    for n in cluster.ids().collect::<Vec<_>>() {
        let addr = cluster.node(n).unwrap().addr.to_string();
        assert_eq!(read_all(&addr, id, next), (next - 5, expected(next - 5, next)), "node {n} after the restart");
    }
}

/// A voter that `configure` adds after the group's log was compacted joins through a
/// snapshot whose configuration already holds it.
#[test]
fn a_voter_added_after_compaction_joins_through_a_snapshot() {
    let cluster = Cluster::start(&server(), 5, &ENV);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "growing", 1);
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    let mut next = write_and_truncate(&mut c, id, 0, 120, 5);
    assert_eq!(c.configure(id, 2).unwrap(), ConfigureOutcome::Configured);
    next = write_and_truncate(&mut c, id, next, 10, 5);
    for n in cluster.ids().collect::<Vec<_>>() {
        let addr = cluster.node(n).unwrap().addr.to_string();
        assert_eq!(read_all(&addr, id, next), (next - 5, expected(next - 5, next)), "node {n} after the change");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut installed = 0;
    while installed < 2 && Instant::now() < deadline {
        installed = cluster.ids().map(|n| counter(&cluster, n, "tephra_cluster_snapshots_installed_total")).sum::<u64>();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(installed >= 2, "the two new voters joined through snapshots ({installed} installed)");
}

/// A follower that holds records the snapshot it gets still counts as kept (the snapshot's
/// `first_seq` is below them) but misses later ones below its `next_seq` drops them all, and
/// goes on from the snapshot's `next_seq` (a soak found the node loop stopping on "held
/// records must be dense" there).
#[test]
fn a_follower_holding_records_below_the_snapshots_next_seq_goes_on_from_it() {
    let mut cluster = Cluster::start(&server(), 3, &ENV);
    let mut c = client(cluster.addrs());
    let id = create(&mut c, "dense", 1);
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    // Six records every voter holds, then one voter down.
    for seq in 0..6 {
        write(&mut c, id, seq);
    }
    let leader = group_leader(&cluster, id);
    let behind = cluster.ids().find(|&n| n != leader).unwrap();
    cluster.kill(behind);
    // Thirty more; the first candidate (taken near entry 16, with every record then still
    // kept) becomes the snapshot once a truncation passes its next_seq, and no later one does.
    for seq in 6..36 {
        write(&mut c, id, seq);
    }
    truncate(&mut c, id, 20);
    assert!(wait_counter(&cluster, leader, "tephra_cluster_compactions_total", 1) >= 1, "the leader compacted its log");
    cluster.start_node(behind);
    let addr = cluster.node(behind).unwrap().addr.to_string();
    assert_eq!(read_all(&addr, id, 36), (20, expected(20, 36)), "node {behind} after catching up");
    assert!(wait_counter(&cluster, behind, "tephra_cluster_snapshots_installed_total", 1) >= 1, "node {behind} installed a snapshot");
    // It goes on taking writes.
    write(&mut c, id, 36);
    assert_eq!(read_all(&addr, id, 37), (20, expected(20, 37)));
}

/// The segment files of node `id`'s command log.
fn segment_files(cluster: &Cluster, id: u64) -> usize {
    std::fs::read_dir(cluster.data_dir(id).join("journals"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .count()
}

/// A record of 2 KiB that says which it is.
fn big(seq: u64) -> Vec<u8> {
    let mut r = format!("big{seq}:").into_bytes();
    r.resize(2048, b'.');
    r
}

/// Segments a cluster node no longer needs go (docs/journals.md §9.9): a journal written and
/// truncated to nothing is compacted once idle, the directory's entries and the groups' hard
/// states that pinned old segments move to the log's head, and every node then holds a few
/// segments instead of all it wrote; each restarts from what is left (with segment files
/// missing below the recorded bound) and serves every record kept.
#[test]
fn segments_no_longer_needed_are_given_back_and_every_node_restarts_from_what_is_left() {
    // Candidates every 64 entries: the queue compacts while it is written (each snapshot
    // item then lies after entries that follow it), and once more when idle.
    let env = [("TEPHRA__CLUSTER__SNAPSHOT_ENTRIES", "64"), ENV[1], ("TEPHRA__JOURNAL__SEGMENT_SIZE", "65536")];
    let mut cluster = Cluster::start(&server(), 3, &env);
    let mut c = client(cluster.addrs());
    let kept = create(&mut c, "kept", 1);
    let queue = create(&mut c, "queue", 1);
    for id in [kept, queue] {
        assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    }
    // Both idle and empty for a while: each compacts at once, so the snapshot of the kept
    // journal lies in the oldest segment, and its entries after it (a trial found every
    // node then failing to restart once that segment went).
    std::thread::sleep(Duration::from_secs(4));
    // About 600 KiB through the queue, truncated in rounds: ten segments of 64 KiB on every
    // node. Then three queue records that stay, after its last snapshot.
    let mut next = 0;
    for _ in 0..6 {
        for _ in 0..50 {
            support::cluster::write_until_written(&mut c, queue, A, next, &big(next));
            next += 1;
        }
        truncate(&mut c, queue, next);
    }
    let first = next;
    for _ in 0..3 {
        support::cluster::write_until_written(&mut c, queue, A, next, &big(next));
        next += 1;
    }
    // The kept journal's records come last: its snapshot lies far behind them.
    for seq in 0..9 {
        support::cluster::write_until_written(&mut c, kept, A, seq, &big(seq));
    }
    // Idle: the queue's group compacts, and each node gives back all but a few of the ten or
    // more segments it wrote (most already while the queue was written).
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let held: Vec<usize> = (1..=3).map(|n| segment_files(&cluster, n)).collect();
        let deleted: Vec<u64> = (1..=3).map(|n| counter(&cluster, n, "tephra_journal_segments_deleted_total")).collect();
        if held.iter().all(|&h| h <= 4) && deleted.iter().all(|&d| d >= 6) {
            break;
        }
        assert!(Instant::now() < deadline, "after 40 s idle: segments held {held:?}, deleted {deleted:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Idle, nothing keeps moving: a pass (one every 10 s when nothing is sealed) finds
    // nothing more to move.
    let moved: Vec<u64> = (1..=3).map(|n| counter(&cluster, n, "tephra_journal_items_relocated_total")).collect();
    std::thread::sleep(Duration::from_secs(11));
    let later: Vec<u64> = (1..=3).map(|n| counter(&cluster, n, "tephra_journal_items_relocated_total")).collect();
    assert_eq!(moved, later, "items written again while idle");
    for n in 1..=3 {
        // The bound's layout: one line, `reclaimed POSITION` in decimal.
        let bound = std::fs::read_to_string(cluster.data_dir(n).join("journals/reclaimed")).unwrap();
        let position = bound.strip_prefix("reclaimed ").and_then(|r| r.strip_suffix('\n')).and_then(|p| p.parse::<u64>().ok());
        assert!(position.is_some_and(|p| p > 1), "{bound:?}");
    }

    // Every node restarts from the segments left, and serves both journals as they were.
    for n in 1..=3 {
        cluster.kill(n);
    }
    for n in 1..=3 {
        cluster.start_node(n);
    }
    let mut c = client(cluster.addrs());
    support::cluster::write_until_written(&mut c, queue, A, next, &big(next));
    support::cluster::write_until_written(&mut c, kept, A, 9, &big(9));
    for n in cluster.ids().collect::<Vec<_>>() {
        let addr = cluster.node(n).unwrap().addr.to_string();
        assert_eq!(read_all(&addr, kept, 10), (0, (0..10).map(big).collect()), "node {n}: the kept journal");
        assert_eq!(read_all(&addr, queue, next + 1), (first, (first..=next).map(big).collect()), "node {n}: the queue");
    }

    // A bound that does not read as one is refused at the start, naming the file.
    cluster.kill(3);
    std::fs::write(cluster.data_dir(3).join("journals/reclaimed"), "reclaimed lots\n").unwrap();
    let out = std::process::Command::new(server())
        .args(["--bind", "127.0.0.1:0", "--data-dir"])
        .arg(cluster.data_dir(3))
        .envs(cluster.node_env(3))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("reclaimed") && stderr.contains("expected one line 'reclaimed POSITION'"), "{stderr}");
}
