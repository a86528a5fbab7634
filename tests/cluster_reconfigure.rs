//! Reconfiguration on three real `tephra-server` processes (docs/journals.md §9.8): nodes that
//! leave a journal's group and come back. A node moved out (F = 1 to F = 0) and back in is sent
//! the whole log again, so its command log holds the same entries twice; it restarts with every
//! record, and a multi-writer journal's writes are applied there once. A node that was down while it was moved out never gets the entries that move it out
//! (a leader sends nothing to a node out of its configuration): the group's leader tells it
//! when it comes back, and it stops its copy; moved back in, it serves every record.

use std::time::{Duration, Instant};

use support::Cluster;
use tephra::client::journal::{
    ConfigureOutcome, CreateOutcome, JournalError, Journals, JournalsConfig, ListOutcome, ReadOutcome, SetLeaderOutcome, WriteOutcome,
};
use tephra::cluster::placement::place;
use tephra::cluster::replica::Member;
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};
use tephra_test_support as support;

const A: LeaderUuid = LeaderUuid(0xa);

fn server_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"))
}

fn client(servers: Vec<String>) -> Journals {
    let mut c = JournalsConfig::new(servers);
    c.request_timeout = Duration::from_secs(10);
    c.read_timeout = Duration::from_secs(3);
    Journals::new(c)
}

/// A client of node `id` alone.
fn client_of(cluster: &Cluster, id: u64) -> Journals {
    client(vec![cluster.node(id).expect("a running node").addr.to_string()])
}

/// Creates the journal `acme/moving` in `mode`, retrying while the cluster elects its
/// directory's leader, and (single-writer) claims it for [`A`].
fn create_in(c: &mut Journals, mode: Mode) -> JournalId {
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        match c.create("acme", "moving", mode, StoreDurability::Ordered) {
            Ok(CreateOutcome::Created { id }) => break id,
            Ok(CreateOutcome::Ambiguous) | Err(JournalError::Unavailable(_) | JournalError::Unreachable(_) | JournalError::NoAnswer { .. }) => {
                assert!(Instant::now() < deadline, "create: no verdict within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("create: {other:?}"),
        }
    };
    if mode == Mode::Single {
        assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    }
    id
}

/// [`create_in`] a single-writer journal.
fn create(c: &mut Journals) -> JournalId {
    create_in(c, Mode::Single)
}

/// The voters the directory records for `acme/moving`.
fn recorded(c: &mut Journals) -> Vec<u64> {
    match c.list(Some("acme")).unwrap() {
        ListOutcome::Listed(all) => all.into_iter().find(|j| j.name == "moving").expect("acme/moving is listed").voters,
        ListOutcome::UnknownTenant => panic!("acme is not listed"),
    }
}

/// Configures `id` to survive `f` machines and waits until its group's leader reports the
/// recorded voters; returns them.
fn configure(cluster: &Cluster, c: &mut Journals, id: JournalId, f: u8) -> Vec<u64> {
    assert_eq!(c.configure(id, f).unwrap(), ConfigureOutcome::Configured);
    let want = recorded(c);
    assert_eq!(want.len(), 2 * usize::from(f) + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leader_voters = cluster.ids().find_map(|n| {
            let report = client_of(cluster, n).node_status().ok()??;
            report.groups.into_iter().find(|g| g.tenant == id.tenant && g.journal == id.journal && g.role == "leader").map(|g| {
                let mut v = g.voters;
                v.sort_unstable();
                v
            })
        });
        if leader_voters.as_deref() == Some(&want[..]) {
            return want;
        }
        assert!(Instant::now() < deadline, "{id}: the leader reports voters {leader_voters:?}, not {want:?}, after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `r<seq>` at each seq of `seqs`, asking again while there is no verdict: fenced by
/// [`A`], or (`multi`) at the tail of a multi-writer journal, where each write must land at
/// the seq it is for.
fn write_as(c: &mut Journals, id: JournalId, seqs: std::ops::Range<u64>, multi: bool) {
    for seq in seqs {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let record = [format!("r{seq}")];
            let outcome = if multi { c.write_multi(id, &record) } else { c.write_single(id, A, seq, &record) };
            match outcome {
                Ok(WriteOutcome::Written { seq: s, .. }) => {
                    assert_eq!(s, seq);
                    break;
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
}

/// [`write_as`] fenced by [`A`].
fn write(c: &mut Journals, id: JournalId, seqs: std::ops::Range<u64>) {
    write_as(c, id, seqs, false)
}

/// Reads every record of `id` from node `node` alone (asking again until it serves) and checks
/// they are `r0`, `r1`, ... up to `count`.
fn assert_serves(cluster: &Cluster, node: u64, id: JournalId, count: u64, when: &str) {
    let want: Vec<Vec<u8>> = (0..count).map(|s| format!("r{s}").into_bytes()).collect();
    let mut c = client_of(cluster, node);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.read(id, 0, 0, 0) {
            Ok(ReadOutcome::Page { records, state, .. }) => {
                assert_eq!((state.first_seq, state.next_seq), (0, count), "node {node} {when}: the journal's view");
                assert_eq!(records, want, "node {node} {when}: the records");
                return;
            }
            other => {
                assert!(Instant::now() < deadline, "node {node} {when} did not serve the journal: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn a_node_moved_out_and_back_in_restarts_with_every_record() {
    let mut cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create(&mut c);
    write(&mut c, id, 0..10);
    // Out: one voter left; the other two stop their copies.
    let one = configure(&cluster, &mut c, id, 0);
    write(&mut c, id, 10..15);
    // Back in: the two start again from an empty copy and are sent the whole log, so their
    // command logs now hold entries 1.. twice.
    assert_eq!(configure(&cluster, &mut c, id, 1), vec![1, 2, 3]);
    write(&mut c, id, 15..20);
    let back = (1..=3).find(|n| !one.contains(n)).expect("a node that was moved out");
    assert_serves(&cluster, back, id, 20, "before its restart");
    cluster.kill(back);
    cluster.start_node(back);
    assert_serves(&cluster, back, id, 20, "after its restart");
    // It goes on as a voter: a write after the restart reaches it too.
    write(&mut c, id, 20..21);
    assert_serves(&cluster, back, id, 21, "after a later write");
}

/// Whether node `node` holds a copy of `id`'s group.
fn holds_copy(cluster: &Cluster, node: u64, id: JournalId) -> bool {
    let report = client_of(cluster, node).node_status().unwrap().expect("a cluster node's report");
    report.groups.iter().any(|g| g.tenant == id.tenant && g.journal == id.journal)
}

#[test]
fn a_node_down_while_it_is_moved_out_stops_its_copy_once_back() {
    let mut cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create(&mut c);
    write(&mut c, id, 0..5);
    // The one voter F = 0 keeps, as the cluster places it; another node is down while the
    // group moves there.
    let members: Vec<Member> = (1..=3).map(|node| Member { node, zone: None }).collect();
    let kept = place(id, &members, 1)[0];
    let down = (1..=3).find(|n| *n != kept).unwrap();
    cluster.kill(down);
    let mut c = client(cluster.addrs());
    assert_eq!(configure(&cluster, &mut c, id, 0), vec![kept]);
    write(&mut c, id, 5..10);
    cluster.start_node(down);
    let deadline = Instant::now() + Duration::from_secs(10);
    while holds_copy(&cluster, down, id) {
        assert!(Instant::now() < deadline, "node {down} still holds a copy of the group 10 s after it came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Moved back in, it starts again and serves every record.
    let mut c = client(cluster.addrs());
    assert_eq!(configure(&cluster, &mut c, id, 1), vec![1, 2, 3]);
    write(&mut c, id, 10..12);
    assert_serves(&cluster, down, id, 12, "moved back in");
}

#[test]
fn a_multi_writer_journal_moved_out_and_back_in_applies_each_write_once() {
    let cluster = Cluster::start(&server_bin(), 3, &[]);
    let mut c = client(cluster.addrs());
    let id = create_in(&mut c, Mode::Multi);
    write_as(&mut c, id, 0..10, true);
    let one = configure(&cluster, &mut c, id, 0);
    write_as(&mut c, id, 10..15, true);
    // Back in: the nodes moved out go on from where their copies stopped; a copy that started
    // over from the first entry would append the first ten records again.
    assert_eq!(configure(&cluster, &mut c, id, 1), vec![1, 2, 3]);
    write_as(&mut c, id, 15..20, true);
    for back in (1..=3).filter(|n| !one.contains(n)) {
        assert_serves(&cluster, back, id, 20, "moved back in");
    }
}
