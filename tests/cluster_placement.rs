//! Where a cluster places a journal's group (docs/journals.md §9.5), on five real
//! `tephra-server` processes in zones a, a, b, b, c: `--survive machines=F` gets 2F+1 voters
//! (default F = 1), three voters go to three zones, an F the cluster cannot place is refused
//! `UNPLACEABLE` with nothing created, and a journal placed for F = 2 keeps taking writes with
//! two of its voters killed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::cluster::client;
use support::Cluster;
use tephra::client::journal::{ConfigureOutcome, CreateOutcome, JournalError, JournalInfo, Journals, ListOutcome, ReadOutcome, SetLeaderOutcome};
use tephra::journal::{JournalId, LeaderUuid, Mode, StoreDurability};
use tephra_test_support as support;

const ZONES: [&str; 5] = ["a", "a", "b", "b", "c"];
const A: LeaderUuid = LeaderUuid(0xa);

/// Creates `acme/name` surviving `survive` machines (`None`: the default), retrying while the
/// cluster elects its directory's leader.
fn create(c: &mut Journals, name: &str, survive: Option<u8>) -> CreateOutcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = match survive {
            Some(f) => c.create_surviving("acme", name, Mode::Single, StoreDurability::Ordered, f),
            None => c.create("acme", name, Mode::Single, StoreDurability::Ordered),
        };
        match o {
            Ok(CreateOutcome::Ambiguous) | Err(JournalError::Unavailable(_) | JournalError::Unreachable(_) | JournalError::NoAnswer { .. }) => {
                assert!(Instant::now() < deadline, "create {name}: no verdict within 20 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(o) => return o,
            Err(e) => panic!("create {name}: {e}"),
        }
    }
}

fn info(c: &mut Journals, name: &str) -> Option<JournalInfo> {
    match c.list(Some("acme")).unwrap() {
        ListOutcome::Listed(all) => all.into_iter().find(|j| j.name == name),
        ListOutcome::UnknownTenant => None,
    }
}

fn zones_of(voters: &[u64]) -> BTreeSet<&'static str> {
    voters.iter().map(|v| ZONES[*v as usize - 1]).collect()
}

/// Waits until node 1's directory records the zone of every other node (each node asks to be
/// recorded with its zone once the directory has a leader).
fn wait_for_zones(c: &mut Journals) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(r)) = c.node_status() {
            let known: Vec<(u64, String)> = r.peers.iter().map(|p| (p.node, p.zone.clone())).collect();
            if known.len() == 4 && known.iter().all(|(n, z)| z == ZONES[*n as usize - 1]) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the directory did not record every zone within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write(c: &mut Journals, id: JournalId, seq: u64, record: &[u8]) {
    support::cluster::write_until_written(c, id, A, seq, record);
}

#[test]
fn journals_get_two_f_plus_one_voters_across_zones_and_an_unplaceable_f_changes_nothing() {
    let server = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let mut cluster = Cluster::start_zoned(&server, &ZONES, &[]);
    let mut first = client(vec![cluster.node(1).unwrap().addr.to_string()]);
    wait_for_zones(&mut first);
    let mut c = client(cluster.addrs());

    // The default (F = 1) and F = 1 asked for: three voters, one in each zone.
    for (i, survive) in [None, Some(1), None, Some(1), None, Some(1)].into_iter().enumerate() {
        let name = format!("three-{i}");
        assert!(matches!(create(&mut c, &name, survive), CreateOutcome::Created { .. }), "{name}");
        let j = info(&mut c, &name).unwrap();
        assert_eq!(j.survive, Some(1), "{name}");
        assert_eq!(j.voters.len(), 3, "{name}: {:?}", j.voters);
        assert_eq!(zones_of(&j.voters), BTreeSet::from(["a", "b", "c"]), "{name}: voters {:?}", j.voters);
    }
    // F = 0: one voter; F = 2: every node.
    assert!(matches!(create(&mut c, "one", Some(0)), CreateOutcome::Created { .. }));
    let one = info(&mut c, "one").unwrap();
    assert_eq!((one.survive, one.voters.len()), (Some(0), 1));
    let CreateOutcome::Created { id: five } = create(&mut c, "five", Some(2)) else { panic!("five not created") };
    let j = info(&mut c, "five").unwrap();
    assert_eq!((j.survive, j.voters), (Some(2), vec![1, 2, 3, 4, 5]));

    // F = 3 needs seven nodes: refused, and no journal of that name appears.
    match create(&mut c, "seven", Some(3)) {
        CreateOutcome::Unplaceable { message } => assert!(message.contains("needs 7 nodes") && message.contains("has 5"), "{message}"),
        other => panic!("F = 3 on five nodes: {other:?}"),
    }
    assert!(info(&mut c, "seven").is_none(), "an unplaceable create left a journal behind");

    // A tenant's default: set before the tenant exists (it is created), taken by the journals
    // created in it without an F of their own; an F of their own still wins. An unplaceable
    // default and an invalid name change nothing.
    match c.configure_tenant("deep", 3).unwrap() {
        ConfigureOutcome::Unplaceable { message } => assert!(message.contains("needs 7 nodes"), "{message}"),
        other => panic!("tenant default F = 3 on five nodes: {other:?}"),
    }
    assert_eq!(c.list(Some("deep")).unwrap(), ListOutcome::UnknownTenant, "an unplaceable tenant default created the tenant");
    assert_eq!(c.configure_tenant("no/slash", 1).unwrap(), ConfigureOutcome::InvalidName);
    assert_eq!(c.configure_tenant("deep", 2).unwrap(), ConfigureOutcome::Configured);
    assert!(matches!(c.create("deep", "wide", Mode::Multi, StoreDurability::Ordered).unwrap(), CreateOutcome::Created { .. }));
    assert!(matches!(c.create_surviving("deep", "narrow", Mode::Multi, StoreDurability::Ordered, 0).unwrap(), CreateOutcome::Created { .. }));
    let ListOutcome::Listed(deep) = c.list(Some("deep")).unwrap() else { panic!("tenant deep not listed") };
    let of = |name: &str| deep.iter().find(|j| j.name == name).map(|j| (j.survive, j.voters.len()));
    assert_eq!((of("wide"), of("narrow")), (Some((Some(2), 5)), Some((Some(0), 1))));
    // A tenant's default is no journal: no node holds a group for it.
    let groups = c.node_status().unwrap().expect("a cluster member").groups;
    assert!(groups.iter().all(|g| g.journal != 0 || g.tenant == 0), "a group for a tenant's default: {groups:?}");
    // The tenant's existing journals keep their F when its default changes.
    assert_eq!(c.configure_tenant("deep", 1).unwrap(), ConfigureOutcome::Configured);
    let ListOutcome::Listed(deep) = c.list(Some("deep")).unwrap() else { panic!("tenant deep not listed") };
    assert_eq!(deep.iter().find(|j| j.name == "wide").map(|j| j.survive), Some(Some(2)));

    // The F = 2 journal survives two of its voters.
    assert!(matches!(c.set_leader(five, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    write(&mut c, five, 0, b"before");
    cluster.kill(4);
    cluster.kill(5);
    let mut c = client(cluster.addrs()[..3].to_vec());
    write(&mut c, five, 1, b"after");
    match c.read(five, 0, 0, 0).unwrap() {
        ReadOutcome::Page { records, .. } => assert_eq!(records, vec![b"before".to_vec(), b"after".to_vec()]),
        other => panic!("read: {other:?}"),
    }
}

/// The voters of `id`'s group as its leader reports them (`cluster status`), once a leader
/// reports any.
fn group_voters(cluster: &Cluster, id: JournalId) -> Option<Vec<u64>> {
    for addr in cluster.addrs() {
        let mut c = client(vec![addr]);
        if let Ok(Some(r)) = c.node_status() {
            if let Some(g) = r.groups.iter().find(|g| g.tenant == id.tenant && g.journal == id.journal && g.role == "leader") {
                let mut v = g.voters.clone();
                v.sort_unstable();
                return Some(v);
            }
        }
    }
    None
}

/// Waits until `id`'s group's leader reports exactly `want` as voters.
fn wait_for_voters(cluster: &Cluster, id: JournalId, want: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = group_voters(cluster, id);
        if now.as_deref() == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{id}: voters {now:?}, not {want:?}, after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn configure_moves_a_journal_to_more_voters_and_back_while_writes_go_on() {
    let server = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let cluster = Cluster::start_zoned(&server, &ZONES, &[]);
    let mut first = client(vec![cluster.node(1).unwrap().addr.to_string()]);
    wait_for_zones(&mut first);
    let mut c = client(cluster.addrs());
    let CreateOutcome::Created { id } = create(&mut c, "moving", None) else { panic!("not created") };
    let three = info(&mut c, "moving").unwrap().voters;
    assert_eq!(three.len(), 3);
    assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));

    // A writer goes on through both changes; every write it was told landed must be there.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, addrs) = (std::sync::Arc::clone(&stop), cluster.addrs());
        std::thread::spawn(move || {
            let mut c = client(addrs);
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || seq < 20 {
                write(&mut c, id, seq, format!("r{seq}").as_bytes());
                seq += 1;
            }
            seq
        })
    };

    assert_eq!(c.configure(id, 2).unwrap(), ConfigureOutcome::Configured);
    let j = info(&mut c, "moving").unwrap();
    assert_eq!((j.survive, j.voters.clone()), (Some(2), vec![1, 2, 3, 4, 5]));
    wait_for_voters(&cluster, id, &[1, 2, 3, 4, 5]);
    match c.configure(id, 3).unwrap() {
        ConfigureOutcome::Unplaceable { message } => assert!(message.contains("needs 7 nodes"), "{message}"),
        other => panic!("F = 3 on five nodes: {other:?}"),
    }
    assert_eq!(info(&mut c, "moving").unwrap().survive, Some(2), "an unplaceable configure changed nothing");
    assert_eq!(c.configure(id, 1).unwrap(), ConfigureOutcome::Configured);
    let back = info(&mut c, "moving").unwrap().voters;
    assert_eq!(back.len(), 3);
    wait_for_voters(&cluster, id, &back);

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    // Every voter of the final group serves every acknowledged record, in order.
    for v in &back {
        let mut r = client(vec![cluster.node(*v).unwrap().addr.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match r.read(id, 0, 0, 0) {
                Ok(ReadOutcome::Page { records, state, .. }) if state.next_seq >= written && records.len() as u64 >= written => {
                    let want: Vec<Vec<u8>> = (0..written).map(|s| format!("r{s}").into_bytes()).collect();
                    assert_eq!(records[..written as usize], want[..], "node {v}");
                    break;
                }
                other => {
                    assert!(Instant::now() < deadline, "node {v} did not serve the {written} records: {other:?}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    // A node left out by the last change holds no copy any more.
    let out: Vec<u64> = (1..=5).filter(|n| !back.contains(n)).collect();
    for n in out {
        let mut s = client(vec![cluster.node(n).unwrap().addr.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.node_status().unwrap().unwrap().groups.iter().any(|g| g.tenant == id.tenant && g.journal == id.journal) {
            assert!(Instant::now() < deadline, "node {n} still holds the journal's group after it left");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `NOT_LEADER` answers to writes, summed over every node's `/metrics`.
fn not_leader_answers(cluster: &Cluster) -> u64 {
    let mut n = 0;
    for id in cluster.ids().collect::<Vec<_>>() {
        let page = cluster.metrics(id, Duration::from_secs(5)).expect("metrics");
        for line in page.lines().filter(|l| l.starts_with("tephra_journal_calls_total{call=\"write\",outcome=\"NotLeader\"}")) {
            n += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
        }
    }
    n
}

/// A client follows `NOT_LEADER`'s hint (docs/journals.md §9.2): once it has heard from the
/// servers involved, a write to a journal led elsewhere costs one redirect, where walking the
/// list of five would cost 2.5 on average between two journals led by different nodes.
#[test]
fn a_client_follows_the_leader_hint_to_the_server_it_names() {
    let server = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tephra-server"));
    let cluster = Cluster::start(&server, 5, &[("TEPHRA__METRICS__BIND", "127.0.0.1:0")]);
    let mut c = client(cluster.addrs());
    // Two one-voter journals on different nodes (the voter leads its group).
    let mut placed: Vec<(JournalId, u64, String)> = Vec::new();
    for i in 0.. {
        assert!(i < 40, "forty one-voter journals all landed on one node");
        let name = format!("solo-{i}");
        let CreateOutcome::Created { id } = create(&mut c, &name, Some(0)) else { panic!("{name} not created") };
        let voter = info(&mut c, &name).unwrap().voters[0];
        if placed.iter().all(|(_, v, _)| *v != voter) {
            placed.push((id, voter, name));
        }
        if placed.len() == 2 {
            break;
        }
    }
    let (a, b) = (placed[0].0, placed[1].0);
    for id in [a, b] {
        assert!(matches!(c.set_leader(id, A, None).unwrap(), SetLeaderOutcome::Won { .. }));
    }
    // Warm up: the client hears from both voters.
    for seq in 0..2 {
        write(&mut c, a, seq, b"warm");
        write(&mut c, b, seq, b"warm");
    }
    let before = not_leader_answers(&cluster);
    let switches = 20;
    for k in 0..switches / 2 {
        write(&mut c, a, 2 + k, b"a");
        write(&mut c, b, 2 + k, b"b");
    }
    let redirects = not_leader_answers(&cluster) - before;
    assert!(redirects <= switches, "{redirects} NOT_LEADER answers for {switches} switches between journals led by nodes {} and {}", placed[0].1, placed[1].1);

    // Asked first, a node that holds no copy of journal a lists it without its state; show
    // reads the state from a's voter.
    let other = cluster.ids().find(|n| *n != placed[0].1).unwrap();
    let first = cluster.node(other).unwrap().addr.to_string();
    let rest = cluster.addrs().into_iter().filter(|a| *a != first);
    let mut c = client(std::iter::once(first.clone()).chain(rest).collect());
    let listed = info(&mut c, &placed[0].2).unwrap();
    assert!(!listed.state_here, "node {other} holds no copy of the journal, and said it knows its state");
    let shown = c.show(&format!("acme/{}", placed[0].2).parse().unwrap()).unwrap();
    assert!(shown.state_here && shown.state.next_seq == 2 + switches / 2, "{shown:?}");
}
