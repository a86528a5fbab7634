//! The replica core (src/cluster/replica.rs) in a deterministic simulation: three nodes'
//! replicas joined by an in-memory network that the test partitions, with each node's durable
//! log kept apart so a node can crash (losing what it had not synced) and come back from it.
//! Checked: a write is answered only once decided and applied, every node applies the same
//! commands to the same state, a partitioned leader's writes get no verdict and never two,
//! a restarted node catches up, and a seeded random schedule of writes, partitions and crashes
//! keeps every acknowledged write, and a change from three voters to one finishes when the voter
//! kept never learnt it was decided before the others stopped their copies (docs/journals.md
//! §9, §9.8). Each node's durable items go through
//! the command-log layout (`cluster::durable`) and come back from it on a restart.

use std::collections::{BTreeMap, VecDeque};

use raft::eraftpb::Message;
use tephra::cluster::durable::{self, DIRECTORY};
use tephra::cluster::replica::{Durable, Refused, Replica, ReplicaError, Round, SnapshotCounts, Verdict};
use tephra::journal::{Answer, Command, Directory, EntryId, JournalId, LeaderUuid, Mode, Outcome, StoreDurability};

const SINGLE: JournalId = JournalId { tenant: 1, journal: 1 };
const MULTI: JournalId = JournalId { tenant: 1, journal: 2 };
/// A journal created with its voters recorded (as a cluster creates them), for the
/// reconfiguration test.
const PLACED: JournalId = JournalId { tenant: 1, journal: 3 };
const VOTERS: [u64; 3] = [1, 2, 3];

/// The directory every node starts from: tenant 1 with the two journals (and, when `placed`,
/// [`PLACED`] with voters 1, 2 and 3).
fn directory(placed: bool) -> Directory {
    let mut d = Directory::new();
    d.apply(&Command::CreateTenant { tenant: 1, name: "acme" });
    d.apply(&Command::CreateJournal { journal: SINGLE, name: "orders", mode: Mode::Single, durability: StoreDurability::Ordered });
    d.apply(&Command::CreateJournal { journal: MULTI, name: "events", mode: Mode::Multi, durability: StoreDurability::Batched });
    if placed {
        d.apply(&Command::CreatePlaced {
            journal: PLACED,
            name: "moving",
            mode: Mode::Multi,
            durability: StoreDurability::Ordered,
            survive: 1,
            voters: VOTERS.to_vec(),
        });
    }
    d
}

fn encode(cmd: &Command<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    cmd.encode(EntryId::default(), &mut out);
    out
}

fn write(journal: JournalId, leader: u128, seq: u64, record: &[u8]) -> Vec<u8> {
    encode(&Command::Write { journal, leader: LeaderUuid(leader).set(), seq, records: vec![record] })
}

struct Node {
    replica: Replica<u64>,
    /// What this node made durable, in order, as command-log payloads.
    disk: Vec<Vec<u8>>,
    /// A round whose sync is still running (when syncs lag): its items are not on `disk`
    /// yet, its acknowledgements have not left, and a crash loses it.
    syncing: Option<Round<u64>>,
    up: bool,
    /// Whether it holds [`PLACED`] and the directory group too.
    placed: bool,
}

impl Node {
    /// Starts node `id` from its durable log, read back through the command-log layout
    /// (`placed`: with the groups of [`PLACED`] and of the directory, which records its voters,
    /// too), taking a snapshot candidate every `snapshot_entries` applied entries of a group.
    fn start(id: u64, disk: Vec<Vec<u8>>, placed: bool, snapshot_entries: u64) -> Node {
        let items: Vec<Durable> = disk.iter().map(|p| durable::decode(p).unwrap()).collect();
        let mut replica = Replica::new(id, directory(placed));
        replica.set_snapshot_entries(snapshot_entries);
        let groups: &[JournalId] = if placed { &[SINGLE, MULTI, PLACED, DIRECTORY] } else { &[SINGLE, MULTI] };
        for &j in groups {
            replica.add_group(j, &VOTERS, &items).unwrap();
        }
        Node { replica, disk, syncing: None, up: true, placed }
    }

    fn persist(&mut self, items: Vec<Durable>) {
        for item in items {
            let mut payload = Vec::new();
            durable::encode(&item, &mut payload).unwrap();
            self.disk.push(payload);
        }
    }
}

/// Three nodes, the messages between them, and which links are cut.
struct Sim {
    nodes: BTreeMap<u64, Node>,
    /// Whether each round's sync finishes only during the next round, while that round is
    /// taken (as the node loop's syncer does), instead of within its own round.
    lag: bool,
    net: VecDeque<(u64, JournalId, Message)>,
    /// Nodes cut off from every other node.
    isolated: Vec<u64>,
    verdicts: BTreeMap<u64, Verdict>,
    next_call: u64,
    /// Entries between snapshot candidates on every node.
    snapshot_entries: u64,
    /// Snapshots installed and logs compacted by nodes since crashed (their replicas are gone).
    gone: SnapshotCounts,
}

impl Sim {
    fn new() -> Sim {
        Sim::with(false, tephra::cluster::replica::SNAPSHOT_ENTRIES)
    }

    /// [`Sim::new`] whose nodes hold [`PLACED`] too (`placed`) and take a snapshot candidate
    /// every `snapshot_entries` applied entries.
    fn with(placed: bool, snapshot_entries: u64) -> Sim {
        let nodes = VOTERS.iter().map(|&id| (id, Node::start(id, Vec::new(), placed, snapshot_entries))).collect();
        Sim {
            nodes,
            lag: false,
            net: VecDeque::new(),
            isolated: Vec::new(),
            verdicts: BTreeMap::new(),
            next_call: 1,
            snapshot_entries,
            gone: SnapshotCounts::default(),
        }
    }

    /// Snapshots installed and logs compacted over every node, crashed ones included.
    fn snapshots(&self) -> SnapshotCounts {
        let mut c = self.gone;
        for n in self.nodes.values() {
            let s = n.replica.snapshot_counts();
            c.installed += s.installed;
            c.compacted += s.compacted;
        }
        c
    }

    fn take(&mut self, from: u64, round: Round<u64>, sent: bool) {
        for (j, m) in round.send.into_iter().chain(if sent { round.send_after_sync } else { Vec::new() }) {
            self.net.push_back((from, j, m));
        }
        for (call, v) in round.verdicts {
            assert!(self.verdicts.insert(call, v.clone()).is_none(), "call {call} got a second verdict {v:?}");
        }
    }

    /// One round on every node that is up: ready, then persist and tell the replica (in this
    /// round, or with `lag` in the next one, after its ready was taken); then delivers what was
    /// sent (unless a link is cut).
    fn round(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        // A leader's word to nodes out of a group it leads (the peer frame's `removed`).
        let mut removals = Vec::new();
        for id in ids {
            let node = self.nodes.get_mut(&id).unwrap();
            if !node.up {
                continue;
            }
            for (to, j, term) in node.replica.take_removals() {
                removals.push((id, to, j, term));
            }
            let mut r = node.replica.ready();
            let early = Round { send: std::mem::take(&mut r.send), verdicts: std::mem::take(&mut r.verdicts), ..Round::default() };
            let synced = if self.lag { node.syncing.replace(r) } else { Some(r) };
            let mut after = Round::default();
            if let Some(mut s) = synced {
                node.persist(std::mem::take(&mut s.persist));
                node.replica.persisted(&s.readies);
                after.send_after_sync = s.send_after_sync;
            }
            self.take(id, early, false);
            self.take(id, after, true);
        }
        for (from, to, j, term) in removals {
            if self.isolated.contains(&from) == self.isolated.contains(&to) && self.nodes[&to].up {
                self.nodes.get_mut(&to).unwrap().replica.removed(j, from, term);
            }
        }
        for (from, j, m) in std::mem::take(&mut self.net) {
            let to = m.to;
            if self.isolated.contains(&from) != self.isolated.contains(&to) && from != to {
                continue;
            }
            let node = self.nodes.get_mut(&to).unwrap();
            if node.up {
                // A response from a node the group no longer counts (it left in a
                // reconfiguration) is refused by raft, and a message for a group this node
                // does not hold is refused too; both are dropped, as the node loop does.
                match node.replica.step(j, m) {
                    Ok(()) | Err(ReplicaError::Raft(raft::Error::StepPeerNotFound) | ReplicaError::UnknownGroup(_)) => {}
                    Err(e) => panic!("node {to}: {e}"),
                }
            }
        }
    }

    fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            for n in self.nodes.values_mut().filter(|n| n.up) {
                n.replica.tick();
            }
            self.round();
            self.round();
        }
    }

    /// The node that leads `journal`, as the up nodes outside any cut agree; runs until there
    /// is one.
    fn leader(&mut self, journal: JournalId) -> u64 {
        for _ in 0..200 {
            let leaders: Vec<u64> =
                self.nodes.iter().filter(|(id, n)| n.up && !self.isolated.contains(id) && n.replica.is_leader(journal)).map(|(id, _)| *id).collect();
            if let [one] = leaders[..] {
                return one;
            }
            self.run(1);
        }
        panic!("no leader for {journal} after 200 ticks");
    }

    /// Proposes at `node`; returns the call id, or the refusal.
    fn propose(&mut self, node: u64, journal: JournalId, command: Vec<u8>) -> Result<u64, Refused> {
        let call = self.next_call;
        self.next_call += 1;
        self.nodes.get_mut(&node).unwrap().replica.propose(journal, command, call).map(|()| call).map_err(|(_, r)| r)
    }

    /// Runs until `call` has a verdict.
    fn verdict(&mut self, call: u64) -> Verdict {
        for _ in 0..300 {
            if let Some(v) = self.verdicts.get(&call) {
                return v.clone();
            }
            self.run(1);
        }
        panic!("call {call} got no verdict");
    }

    /// Crashes `id` between rounds (losing a sync still running).
    fn crash(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        node.up = false;
        node.syncing = None;
    }

    /// Crashes `id` in the middle of a round: the messages that may leave before the sync have
    /// left, and what it was to make durable is lost with it.
    fn crash_mid_round(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        let r = node.replica.ready();
        node.up = false;
        node.syncing = None;
        let sent = Round { send: r.send, ..Round::default() };
        self.take(id, sent, false);
    }

    fn restart(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        let s = node.replica.snapshot_counts();
        self.gone.installed += s.installed;
        self.gone.compacted += s.compacted;
        let (disk, placed) = (std::mem::take(&mut node.disk), node.placed);
        self.nodes.insert(id, Node::start(id, disk, placed, self.snapshot_entries));
    }

    /// Every up node applied the same commands to the same state.
    fn assert_converged(&mut self) {
        // Long enough for an election (30 to 60 ticks) and the catch-up after it.
        self.run(2 * tephra::cluster::replica::ELECTION_TICKS + 30);
        let states: Vec<(u64, &Directory)> = self.nodes.iter().filter(|(_, n)| n.up).map(|(id, n)| (*id, n.replica.directory())).collect();
        for (id, d) in &states[1..] {
            assert_eq!(*d, states[0].1, "node {id} differs from node {}", states[0].0);
        }
    }

    fn state(&self, node: u64, journal: JournalId) -> tephra::journal::JournalState {
        self.nodes[&node].replica.directory().journal(journal).unwrap().state.clone()
    }
}

fn accepted(v: &Verdict) -> Option<u64> {
    match v {
        Verdict::Applied(Answer::Journal(Outcome::Accepted { seq, .. })) => Some(*seq),
        _ => None,
    }
}

#[test]
fn writes_are_answered_once_applied_and_every_node_applies_the_same() {
    let mut sim = Sim::new();
    let l = sim.leader(SINGLE);
    let claim = sim.propose(l, SINGLE, encode(&Command::SetLeader { journal: SINGLE, new: LeaderUuid(7), old: None })).unwrap();
    assert!(matches!(sim.verdict(claim), Verdict::Applied(Answer::Journal(Outcome::Leader(_)))));
    // Pipelined: twenty writes proposed before any is decided.
    let calls: Vec<u64> = (0..20).map(|seq| sim.propose(l, SINGLE, write(SINGLE, 7, seq, format!("r{seq}").as_bytes())).unwrap()).collect();
    for (seq, call) in calls.into_iter().enumerate() {
        assert_eq!(accepted(&sim.verdict(call)), Some(seq as u64));
    }
    // The exact retry is a duplicate; a stale position is refused: verdicts are apply's.
    let retry = sim.propose(l, SINGLE, write(SINGLE, 7, 19, b"r19")).unwrap();
    assert!(matches!(sim.verdict(retry), Verdict::Applied(Answer::Journal(Outcome::Duplicate { seq: 19, count: 1 }))));
    let stale = sim.propose(l, SINGLE, write(SINGLE, 7, 3, b"other")).unwrap();
    assert!(matches!(sim.verdict(stale), Verdict::Applied(Answer::Journal(Outcome::Refused(_)))));
    // A multi-writer journal: dense seqs.
    let m = sim.leader(MULTI);
    let calls: Vec<u64> = (0..10).map(|i| sim.propose(m, MULTI, write(MULTI, 0, 0, &[i])).unwrap()).collect();
    let seqs: Vec<Option<u64>> = calls.into_iter().map(|c| accepted(&sim.verdict(c))).collect();
    assert_eq!(seqs, (0..10).map(Some).collect::<Vec<_>>());
    // A follower refuses with a hint; a read is confirmed on any node.
    let f = *VOTERS.iter().find(|&&n| n != l).unwrap();
    assert_eq!(sim.propose(f, SINGLE, write(SINGLE, 7, 20, b"x")), Err(Refused::NotLeader { leader: Some(l) }));
    let read = sim.next_call;
    sim.next_call += 1;
    sim.nodes.get_mut(&f).unwrap().replica.read(SINGLE, read).unwrap();
    assert_eq!(sim.verdict(read), Verdict::ReadReady);
    assert_eq!(sim.nodes[&f].replica.directory().journal(SINGLE).unwrap().state.next_seq, 20, "a confirmed read sees every acknowledged write");
    sim.assert_converged();
    assert_eq!(sim.state(f, SINGLE).next_seq, 20);
}

#[test]
fn a_partitioned_leader_gets_no_verdict_and_the_majority_goes_on() {
    let mut sim = Sim::new();
    let old = sim.leader(SINGLE);
    let claim = sim.propose(old, SINGLE, encode(&Command::SetLeader { journal: SINGLE, new: LeaderUuid(7), old: None })).unwrap();
    sim.verdict(claim);
    let first = sim.propose(old, SINGLE, write(SINGLE, 7, 0, b"kept")).unwrap();
    assert_eq!(accepted(&sim.verdict(first)), Some(0));
    sim.isolated = vec![old];
    // The cut-off leader still takes a proposal; it can never be decided.
    let lost = sim.propose(old, SINGLE, write(SINGLE, 7, 1, b"lost")).unwrap();
    sim.run(5);
    let new = {
        let mut n = None;
        for _ in 0..200 {
            n = VOTERS.iter().copied().find(|&x| x != old && sim.nodes[&x].replica.is_leader(SINGLE));
            if n.is_some() {
                break;
            }
            sim.run(1);
        }
        n.expect("the majority elects a leader")
    };
    let next = sim.propose(new, SINGLE, write(SINGLE, 7, 1, b"majority")).unwrap();
    assert_eq!(accepted(&sim.verdict(next)), Some(1));
    // Check-quorum: the old leader steps down on its own, and its proposal gets no verdict.
    assert!(matches!(sim.verdict(lost), Verdict::NoVerdict { .. }), "{:?}", sim.verdicts.get(&lost));
    sim.isolated.clear();
    sim.assert_converged();
    let st = sim.state(old, SINGLE);
    assert_eq!(st.next_seq, 2);
    let digest = tephra::journal::Records(&[b"majority"]).digest();
    assert_eq!(st.batch_at(1).map(|b| b.digest), Some(digest), "the majority's write, not the cut-off one, holds seq 1");
}

#[test]
fn a_crashed_node_comes_back_from_its_durable_log_and_catches_up() {
    let mut sim = Sim::new();
    let l = sim.leader(MULTI);
    for i in 0..5 {
        let c = sim.propose(l, MULTI, write(MULTI, 0, 0, &[i])).unwrap();
        sim.verdict(c);
    }
    let f = *VOTERS.iter().find(|&&n| n != l).unwrap();
    sim.crash(f);
    for i in 5..15 {
        let c = sim.propose(l, MULTI, write(MULTI, 0, 0, &[i])).unwrap();
        assert!(accepted(&sim.verdict(c)).is_some(), "two of three nodes decide");
    }
    sim.restart(f);
    assert!(sim.nodes[&f].replica.directory().journal(MULTI).unwrap().state.next_seq >= 5, "restored from its log");
    sim.assert_converged();
    assert_eq!(sim.state(f, MULTI).next_seq, 15);
    // The leader crashes too: the others elect one and nothing acknowledged is lost.
    sim.crash(l);
    let n = sim.leader(MULTI);
    let c = sim.propose(n, MULTI, write(MULTI, 0, 0, b"after")).unwrap();
    assert_eq!(accepted(&sim.verdict(c)), Some(15));
    sim.restart(l);
    sim.assert_converged();
    assert_eq!(sim.state(l, MULTI).next_seq, 16);
}

/// A small deterministic generator (xorshift64*), so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[test]
fn random_schedules_of_writes_partitions_and_crashes_keep_every_acknowledged_write() {
    // Acknowledged (multi-writer, fenced) writes, without and with lagging syncs.
    let mut totals = [(0, 0); 2];
    let mut snapshots = SnapshotCounts::default();
    for seed in 1..=60u64 {
        let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
        // Every third seed, groups compact their logs every few entries once the multi-writer
        // journal's truncations pass them, and nodes back from a crash catch up by snapshots.
        let mut sim = if seed % 3 == 0 { Sim::with(false, 8) } else { Sim::new() };
        // Every other seed, each node's sync lags a round behind its ready.
        sim.lag = seed % 2 == 0;
        // What each acknowledged multi-writer write said: its seq; and how many were sent.
        let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
        let mut calls = Vec::new();
        // Single-writer writes under uuid 7 at the position the writer last learnt, and what
        // each acknowledged one wrote.
        let l = sim.leader(SINGLE);
        let claim = sim.propose(l, SINGLE, encode(&Command::SetLeader { journal: SINGLE, new: LeaderUuid(7), old: None })).unwrap();
        sim.verdict(claim);
        let mut next = 0u64;
        let mut fenced: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut fenced_acked: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut proposed = std::collections::HashSet::new();
        for step in 0..600u64 {
            match rng.below(20) {
                0 => {
                    let id = 1 + rng.below(3);
                    sim.isolated = if sim.isolated.is_empty() { vec![id] } else { Vec::new() };
                }
                1 => {
                    let id = 1 + rng.below(3);
                    let down = sim.nodes.values().filter(|n| !n.up).count();
                    if sim.nodes[&id].up && down == 0 {
                        if rng.below(2) == 0 {
                            sim.crash(id);
                        } else {
                            sim.crash_mid_round(id);
                        }
                    } else if !sim.nodes[&id].up {
                        sim.restart(id);
                    }
                }
                2..=5 => {
                    let at = 1 + rng.below(3);
                    if sim.nodes[&at].up {
                        if let Ok(c) = sim.propose(at, MULTI, write(MULTI, 0, 0, &step.to_le_bytes())) {
                            calls.push(c);
                        }
                    }
                }
                10 => {
                    let at = 1 + rng.below(3);
                    if sim.nodes[&at].up {
                        let up_to = sim.state(at, MULTI).next_seq.saturating_sub(2);
                        let _ = sim.propose(at, MULTI, encode(&Command::Truncate { journal: MULTI, leader: None, up_to }));
                    }
                }
                6..=9 => {
                    let at = 1 + rng.below(3);
                    let record = format!("step {step}").into_bytes();
                    if sim.nodes[&at].up {
                        if let Ok(c) = sim.propose(at, SINGLE, write(SINGLE, 7, next, &record)) {
                            proposed.insert(tephra::journal::Records(&[&record]).digest());
                            fenced.insert(c, record);
                        }
                    }
                }
                _ => sim.run(1),
            }
            for &c in &calls {
                if let Some(seq) = sim.verdicts.get(&c).and_then(accepted) {
                    acked.insert(c, seq);
                }
            }
            for (c, record) in &fenced {
                match sim.verdicts.get(c) {
                    Some(Verdict::Applied(Answer::Journal(Outcome::Accepted { seq, .. }))) => {
                        fenced_acked.insert(*seq, record.clone());
                        next = next.max(seq + 1);
                    }
                    Some(Verdict::Applied(Answer::Journal(Outcome::Refused(v)))) => next = next.max(v.next_seq),
                    _ => {}
                }
            }
            fenced.retain(|c, _| !sim.verdicts.contains_key(c));
        }
        sim.isolated.clear();
        let down: Vec<u64> = sim.nodes.iter().filter(|(_, n)| !n.up).map(|(id, _)| *id).collect();
        for id in down {
            sim.restart(id);
        }
        sim.assert_converged();
        let s = sim.snapshots();
        snapshots.installed += s.installed;
        snapshots.compacted += s.compacted;
        let next = sim.state(1, MULTI).next_seq;
        let mut seqs: Vec<u64> = acked.values().copied().collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), acked.len(), "seed {seed}: two acknowledged writes share a seq");
        assert!(seqs.iter().all(|&s| s < next), "seed {seed}: an acknowledged write lies past next_seq {next}");
        totals[sim.lag as usize].0 += acked.len();
        // Every acknowledged fenced write holds its seq with its own record, on every node.
        let st = sim.state(1, SINGLE);
        totals[sim.lag as usize].1 += fenced_acked.len();
        for (seq, record) in &fenced_acked {
            let mark = st.batch_at(*seq).unwrap_or_else(|| panic!("seed {seed}: no batch at acknowledged seq {seq}"));
            assert_eq!(mark.digest, tephra::journal::Records(&[record]).digest(), "seed {seed}: seq {seq} holds another write");
        }
        // What landed without an acknowledgement was proposed (its answer was lost): nothing
        // appears that no writer wrote.
        for mark in &st.batches {
            assert!(proposed.contains(&mark.digest), "seed {seed}: seq {} holds a record no writer proposed", mark.seq);
        }
    }
    assert!(totals.iter().all(|t| t.0 > 30 * 10 && t.1 > 30 * 10), "too few writes acknowledged to mean anything: {totals:?}");
    assert!(snapshots.compacted > 20 && snapshots.installed > 0, "too few compactions and snapshots to mean anything: {snapshots:?}");
}

#[test]
fn an_acknowledgement_leaves_only_once_the_entry_is_durable() {
    let mut sim = Sim::new();
    let l = sim.leader(MULTI);
    sim.run(10); // the new leader's own entry is decided everywhere
    let others: Vec<u64> = VOTERS.iter().copied().filter(|&n| n != l).collect();
    let (f, t) = (others[0], others[1]);
    sim.isolated = vec![t];
    let c = sim.propose(l, MULTI, write(MULTI, 0, 0, b"once durable")).unwrap();
    // The leader's append reaches the follower, which crashes before its sync: its
    // acknowledgement waited for the sync, so it never left.
    sim.round();
    sim.crash_mid_round(f);
    sim.run(50);
    let v = sim.verdicts.get(&c);
    assert!(accepted(v.unwrap_or(&Verdict::ReadReady)).is_none(), "a write was acknowledged on a follower's copy that never became durable: {v:?}");
    // Back together, the nodes agree on whether it landed (it may: the leader holds it).
    sim.restart(f);
    sim.isolated.clear();
    sim.assert_converged();
}

/// How many configuration change entries of `journal` node `id` holds durably.
fn conf_changes_on_disk(sim: &Sim, id: u64, journal: JournalId) -> usize {
    sim.nodes[&id]
        .disk
        .iter()
        .filter(|p| matches!(durable::decode(p).unwrap(), Durable::Entry { journal: j, entry } if j == journal && entry.get_entry_type() == raft::eraftpb::EntryType::EntryConfChangeV2))
        .count()
}

#[test]
fn the_voter_kept_finishes_a_change_that_removed_the_others_before_it_learnt_it_was_decided() {
    // Three voters move to one (F = 1 to F = 0), the leader among those that leave. The voter
    // kept holds the entry that leaves the joint configuration but is cut off (and restarts)
    // before it learns that the entry was decided; the other two apply it and stop their
    // copies. It is left in the joint configuration, where an election needs two of the three
    // old voters: their stopped copies take its requests and vote.
    let mut sim = Sim::with(true, tephra::cluster::replica::SNAPSHOT_ENTRIES);
    let leader = sim.leader(PLACED);
    let kept = *VOTERS.iter().find(|&&v| v != leader).unwrap();
    let directory_leader = sim.leader(DIRECTORY);
    let call = sim.propose(directory_leader, DIRECTORY, encode(&Command::Configure { journal: PLACED, survive: 0, voters: vec![kept] })).unwrap();
    assert!(matches!(sim.verdict(call), Verdict::Applied(Answer::Configured { .. })), "the configure");
    // Enter the joint configuration, then leave it: once the kept voter holds the second
    // change (and has acknowledged it), it is cut off.
    let mut rounds = 0;
    while conf_changes_on_disk(&sim, kept, PLACED) < 2 {
        for n in sim.nodes.values_mut().filter(|n| n.up) {
            n.replica.tick();
        }
        sim.round();
        rounds += 1;
        assert!(rounds < 1000, "the kept voter never held the change that leaves the joint configuration");
    }
    sim.isolated = vec![kept];
    sim.run(20);
    for id in VOTERS.iter().filter(|&&v| v != kept) {
        assert!(sim.nodes[id].replica.status(PLACED).is_none(), "node {id} left the group and stops its copy");
    }
    sim.crash(kept);
    sim.restart(kept);
    sim.isolated.clear();
    // The kept voter gets elected (the stopped copies vote), finishes the change, and takes
    // writes alone.
    assert_eq!(sim.leader(PLACED), kept);
    let w = sim.propose(kept, PLACED, write(PLACED, 0, 0, b"after")).unwrap();
    assert_eq!(accepted(&sim.verdict(w)), Some(0));
    sim.run(2 * tephra::cluster::replica::ELECTION_TICKS);
    assert_eq!(sim.nodes[&kept].replica.status(PLACED).unwrap().voters, vec![kept]);
    for id in VOTERS.iter().filter(|&&v| v != kept) {
        assert!(sim.nodes[id].replica.status(PLACED).is_none(), "node {id} holds no copy once the change is over");
    }
}

#[test]
fn voters_left_out_together_stop_their_copies_once_they_hear_the_leader() {
    // Three voters move to one (F = 1 to F = 0), the leader kept. The two that leave are cut
    // off together once one of them acknowledged the entry that leaves the joint configuration:
    // the leader decides it without telling them, and their stale configurations still count
    // both of them. Back on the network, the leader tells each that it left; the pre-votes
    // each sends the other must not start the other's stopped copy for good.
    let mut sim = Sim::with(true, tephra::cluster::replica::SNAPSHOT_ENTRIES);
    let kept = sim.leader(PLACED);
    let left: Vec<u64> = VOTERS.iter().copied().filter(|&v| v != kept).collect();
    let directory_leader = sim.leader(DIRECTORY);
    let call = sim.propose(directory_leader, DIRECTORY, encode(&Command::Configure { journal: PLACED, survive: 0, voters: vec![kept] })).unwrap();
    assert!(matches!(sim.verdict(call), Verdict::Applied(Answer::Configured { .. })), "the configure");
    let mut rounds = 0;
    while !left.iter().any(|&id| conf_changes_on_disk(&sim, id, PLACED) >= 2) {
        for n in sim.nodes.values_mut().filter(|n| n.up) {
            n.replica.tick();
        }
        sim.round();
        rounds += 1;
        assert!(rounds < 1000, "no voter that leaves held the change that leaves the joint configuration");
    }
    sim.isolated.clone_from(&left);
    sim.run(2 * tephra::cluster::replica::ELECTION_TICKS);
    assert_eq!(sim.nodes[&kept].replica.status(PLACED).unwrap().voters, vec![kept], "the kept voter finished the change alone");
    let stale: Vec<u64> = left.iter().copied().filter(|&id| sim.nodes[&id].replica.status(PLACED).is_some()).collect();
    assert!(!stale.is_empty(), "cut off, a voter that left still runs its copy (the case under test)");
    sim.isolated.clear();
    sim.run(4 * tephra::cluster::replica::ELECTION_TICKS);
    // Settled: at the end of every round from here, neither holds a running copy.
    for _ in 0..2 * tephra::cluster::replica::ELECTION_TICKS {
        sim.run(1);
        for &id in &left {
            assert!(sim.nodes[&id].replica.status(PLACED).is_none(), "node {id} runs a copy of a group it left");
        }
    }
    assert_eq!(sim.leader(PLACED), kept);
    let w = sim.propose(kept, PLACED, write(PLACED, 0, 0, b"after")).unwrap();
    assert_eq!(accepted(&sim.verdict(w)), Some(0));
}
