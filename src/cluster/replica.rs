//! One node's share of the replicated journals: a consensus group (tikv's `RawNode` over its
//! [`GroupLog`]) for each journal this node is a voter of, and the node's journal state machine
//! (the [`Directory`]) to which every group's decided commands are applied in log order.
//!
//! Sans-IO. The caller proposes commands, steps peer messages and ticks; then, each round,
//! carries out what [`Replica::ready`] hands back in this order:
//!
//! | step | what | why |
//! |---|---|---|
//! | 1 | send [`Round::send`] | a leader's appends may leave before its own copy is durable |
//! | 2 | answer [`Round::verdicts`] | what a round applied was decided by a quorum and is durable here |
//! | 3 | make [`Round::persist`] durable, in order (one sync for every group), whenever it suits | entries and hard states |
//! | 4 | then send [`Round::send_after_sync`] | votes and acknowledgements promise what is now durable |
//! | 5 | then call [`Replica::persisted`] with [`Round::readies`] | raft learns what is durable; the next round applies what it decided |
//!
//! Rounds do not wait for their syncs: the caller may take the next round (and step, tick,
//! propose) while an earlier round's items are being synced, as long as rounds are made
//! durable in the order handed out. Raft hands out for applying only entries durable here.
//!
//! A call's verdict comes from applying its decided entry here (chosen is not applied: a write
//! is answered only once this node applied it). Source: docs/journals.md §9.

use std::collections::{BTreeMap, BTreeSet};

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot};
use raft::{Config, ProgressState, RawNode, ReadOnlyOption, SnapshotStatus, StateRole, Storage, INVALID_ID};
use slog::Drain;

use super::durable::DIRECTORY;
use super::group_log::{EntryReader, GroupLog};
use crate::journal::command::Command;
use crate::journal::held::Loc;
use crate::journal::{decode_command, Answer, Directory, JournalId, JournalState};
use std::collections::HashMap;

/// Ticks without word from a leader before a follower stands for election (raft draws the
/// real timeout between this and twice this).
pub const ELECTION_TICKS: usize = 30;

/// Ticks without an applied entry after which a group whose journal holds no record is
/// compacted up to what it applied (docs/journals.md §9.9).
pub const IDLE_TICKS: usize = ELECTION_TICKS;
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 5;
/// Most bytes of entries in one append message.
pub const MAX_MESSAGE_BYTES: u64 = 1 << 20;
/// Most append messages in flight to one follower.
pub const MAX_INFLIGHT: usize = 256;
/// Entries a journal group applies between two snapshot candidates, by default
/// (`cluster.snapshot_entries`, docs/journals.md §9.9).
pub const SNAPSHOT_ENTRIES: u64 = 4096;
/// Ticks a leader waits for a follower to install a snapshot it sent before it sends it again
/// (the message may have been lost with its link).
pub const SNAPSHOT_RETRY_TICKS: u32 = 100;

/// What a round needs durable, in the order handed out: an entry of a group's log (a later
/// entry at an index already held replaces it and everything after it) or a group's hard
/// state (term, vote, commit).
#[derive(Clone, Debug, PartialEq)]
pub enum Durable {
    /// An entry of `journal`'s group log.
    Entry {
        /// The group.
        journal: JournalId,
        /// The entry (its data is one encoded journal command, or empty for a leader's no-op).
        entry: Entry,
    },
    /// `journal`'s group hard state.
    HardState {
        /// The group.
        journal: JournalId,
        /// Term, vote and commit index.
        state: HardState,
    },
    /// A snapshot of `journal`'s group (docs/journals.md §9.9): taken here when the group's
    /// log was compacted, or installed from the leader; the group's log starts after its index.
    Snapshot {
        /// The group.
        journal: JournalId,
        /// Its index, term and configuration, and the journal's state there
        /// ([`super::snapshot`]).
        snapshot: Snapshot,
    },
}

/// What became of a proposal or a read.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The command was decided and applied here; the journal's answer to it.
    Applied(Answer),
    /// The command did not decode: it was decided, and every node skips it alike.
    Undecodable,
    /// No verdict: this node stopped leading, or another entry took the proposal's place. A
    /// write may still have been decided (ambiguous to its caller); `leader` is the node this
    /// one believes leads now.
    NoVerdict {
        /// The leader's node id, when known.
        leader: Option<u64>,
    },
    /// A read is confirmed: this node has applied every entry a quorum had decided when the
    /// read arrived, so its state may answer the read (raft's ReadIndex, safe mode).
    ReadReady,
}

/// Why a proposal or read was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This node does not lead the group (for a read: no leader is known); ask `leader`.
    NotLeader {
        /// The leader's node id, when known.
        leader: Option<u64>,
    },
    /// This node holds no group for the journal.
    UnknownGroup,
}

/// An entry applied on this node, in apply order: what the node's edges need beyond the
/// verdicts (where the records of an accepted write lie, which journals' state moved).
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The group.
    pub group: JournalId,
    /// The entry's index in the group log.
    pub index: u64,
    /// The journal's answer, or `None` for an entry that holds no command (a leader's no-op,
    /// an undecodable entry).
    pub answer: Option<Answer>,
}

/// A cluster member as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The node id (non-zero).
    pub node: u64,
    /// Its zone, when set (voters are spread across zones).
    pub zone: Option<String>,
}

/// Why a group could not be added or a message not stepped.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// Raft refused (a bad configuration, a message for a peer it does not know, storage
    /// that does not hold together).
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The durable log of a group has a gap: an entry past the one after the last.
    #[error("group {journal}: durable entry {index} follows entry {last}: the group log has a gap")]
    Gap {
        /// The group.
        journal: JournalId,
        /// The entry's index.
        index: u64,
        /// The last index held before it.
        last: u64,
    },
    /// A restart found a group's log shorter than its hard state says was decided: entries
    /// were lost (a segment file removed or damaged).
    #[error("group {journal}: the hard state says entries up to {commit} were decided, but the log holds entries only up to {last}: entries were lost (a segment file of journals/ removed?)")]
    LostDecided {
        /// The group.
        journal: JournalId,
        /// The hard state's commit index.
        commit: u64,
        /// The last index held.
        last: u64,
    },
    /// No group for the journal on this node.
    #[error("no group for {0} on this node")]
    UnknownGroup(JournalId),
    /// A leader says this node acknowledged entries up to `commit`, and its log ends at `last`:
    /// this node lost acknowledged entries (its data directory was lost or replaced).
    #[error("group {journal}: the leader knows this node as holding entries up to {commit}, and its log ends at {last}: it lost entries it had acknowledged")]
    LostEntries {
        /// The group.
        journal: JournalId,
        /// The commit index the leader sent.
        commit: u64,
        /// This node's last index.
        last: u64,
    },
    /// The group already exists.
    #[error("the group for {0} already exists on this node")]
    GroupExists(JournalId),
    /// A durable snapshot of the group whose data does not decode.
    #[error("group {journal}: its snapshot does not decode: {why}")]
    Snapshot {
        /// The group.
        journal: JournalId,
        /// What was wrong.
        why: String,
    },
}

/// The work of one round (see the module table).
#[derive(Debug)]
pub struct Round<T> {
    /// Messages that may leave now.
    pub send: Vec<(JournalId, Message)>,
    /// What to make durable before [`Round::send_after_sync`] leaves.
    pub persist: Vec<Durable>,
    /// Messages that may leave only once [`Round::persist`] is durable.
    pub send_after_sync: Vec<(JournalId, Message)>,
    /// Calls answered: a proposal's or read's token and its verdict.
    pub verdicts: Vec<(T, Verdict)>,
    /// Each group's ready taken this round, by its number: handed to [`Replica::persisted`]
    /// once [`Round::persist`] is durable.
    pub readies: Vec<(JournalId, u64)>,
    /// Whether [`Round::persist`] holds a promise (an entry, a new term or vote) that must be
    /// synced before [`Round::send_after_sync`] leaves; when false it holds at most higher
    /// commit indexes, which may wait for a later sync (a node that forgets one learns it
    /// again from its leader).
    pub must_sync: bool,
}

impl<T> Default for Round<T> {
    fn default() -> Round<T> {
        Round { send: Vec::new(), persist: Vec::new(), send_after_sync: Vec::new(), verdicts: Vec::new(), readies: Vec::new(), must_sync: false }
    }
}

/// One group as this node sees it ([`Replica::status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// Leader, follower, candidate or pre-candidate.
    pub role: StateRole,
    /// The current term.
    pub term: u64,
    /// The leader, when known.
    pub leader: Option<u64>,
    /// The highest index known decided.
    pub commit: u64,
    /// The highest index applied here.
    pub applied: u64,
    /// This node's proposals waiting for a verdict.
    pub pending: usize,
    /// The group's voters, by node id.
    pub voters: Vec<u64>,
}

/// A proposal waiting for its entry to be applied.
struct Proposal<T> {
    token: T,
    /// The term its entry got in the leader's log: the entry applied at its index is this
    /// proposal's only when it has this term (a leader's entry at an index is unique in its term).
    term: u64,
}

/// One group on this node.
struct Group<T> {
    raw: RawNode<GroupLog>,
    /// By the index its entry got.
    proposals: BTreeMap<u64, Proposal<T>>,
    /// Reads waiting for their read index, by tag.
    reads: BTreeMap<u64, T>,
    /// Reads with a read index, waiting for this node to apply up to it.
    confirmed: Vec<(u64, T)>,
    applied: u64,
    /// The journal's state at an applied index, kept until the journal's `first_seq` passes
    /// every record it holds; the group's log is then compacted to it.
    candidate: Option<Candidate>,
    /// The applied index of the last candidate or snapshot.
    captured: u64,
    /// Followers a snapshot was sent to, and the ticks since.
    snapshot_sent: BTreeMap<u64, u32>,
    /// Resumed from a stopped copy to take a message ([`Replica::resume`]).
    on_demand: bool,
    /// Ticks since this group last applied an entry.
    quiet: usize,
}

/// A journal's state at one applied index, a snapshot to be (docs/journals.md §9.9).
struct Candidate {
    index: u64,
    term: u64,
    conf: ConfState,
    conf_index: u64,
    state: JournalState,
}

/// Snapshots this node's groups sent and installed since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Snapshots sent to followers whose next entry was compacted.
    pub sent: u64,
    /// Snapshots installed here from a leader.
    pub installed: u64,
    /// Group logs compacted here.
    pub compacted: u64,
}

impl<T> Group<T> {
    fn leader(&self) -> Option<u64> {
        let l = self.raw.raft.leader_id;
        (l != INVALID_ID).then_some(l)
    }
}

/// One node's groups and journal state machine.
pub struct Replica<T> {
    node: u64,
    groups: BTreeMap<JournalId, Group<T>>,
    directory: Directory,
    next_tag: u64,
    logger: slog::Logger,
    /// Entries applied since [`Replica::take_applied`] last ran.
    applied: Vec<Applied>,
    /// The cluster's members; empty when groups are added by hand (no directory group).
    members: Vec<Member>,
    /// Durable items of groups this node votes in but has not started yet (their creation is
    /// not applied here yet), kept from the restart.
    dormant: BTreeMap<JournalId, Vec<Durable>>,
    /// The log of each group this node left (its copy stopped), as it was then, with the
    /// index applied: a reconfiguration that names this node again resumes the copy from
    /// there, so the journal's state here (applied up to that index) and the log go on
    /// together, and the copy keeps its term and vote.
    stopped: BTreeMap<JournalId, (GroupLog, u64)>,
    /// Reads durable entries back from the node's command log.
    reader: Option<EntryReader>,
    /// Where each entry found at the restart lies, by group, index and term, until its group
    /// is added.
    stored: HashMap<(JournalId, u64, u64), Loc>,
    /// Proposals that lost their index to a later one of this node, for the next round.
    orphans: Vec<(T, Verdict)>,
    /// Set while [`Replica::member`] restores the groups from the durable log.
    restoring: bool,
    /// This node's proposals waiting for a verdict, over every group.
    waiting: usize,
    /// Entries a journal group applies between snapshot candidates (0: never compacted).
    snapshot_every: u64,
    /// Groups that installed a snapshot since [`Replica::take_installed`] last ran, with its
    /// index and its journal's `next_seq`.
    installed: Vec<(JournalId, u64, u64)>,
    counts: SnapshotCounts,
    /// Nodes to tell that they are no longer voters of a group this node leads: the node, the
    /// group and this node's term (for [`Replica::take_removals`]).
    removals: Vec<(u64, JournalId, u64)>,
}

/// A proposal's or read's context: the proposing node and its tag, so only that node answers.
fn context(node: u64, tag: u64) -> Vec<u8> {
    let mut c = Vec::with_capacity(16);
    c.extend_from_slice(&node.to_le_bytes());
    c.extend_from_slice(&tag.to_le_bytes());
    c
}

/// The tag of a context this node made.
fn own_tag(node: u64, ctx: &[u8]) -> Option<u64> {
    let (n, t) = (ctx.get(..8)?, ctx.get(8..16)?);
    (u64::from_le_bytes(n.try_into().ok()?) == node).then(|| u64::from_le_bytes(t.try_into().unwrap()))
}

impl<T> Replica<T> {
    /// A node with id `node` (non-zero) and the journal state machine `directory` (the
    /// directory's tenants and journals; each group's commands are applied to it).
    pub fn new(node: u64, directory: Directory) -> Replica<T> {
        assert_ne!(node, INVALID_ID, "node id 0 is raft's 'none'");
        let logger = slog::Logger::root(slog_stdlog::StdLog.fuse(), slog::o!("node" => node));
        Replica {
            node,
            groups: BTreeMap::new(),
            directory,
            next_tag: 1,
            logger,
            applied: Vec::new(),
            members: Vec::new(),
            dormant: BTreeMap::new(),
            stopped: BTreeMap::new(),
            reader: None,
            stored: HashMap::new(),
            orphans: Vec::new(),
            restoring: false,
            waiting: 0,
            snapshot_every: SNAPSHOT_ENTRIES,
            installed: Vec::new(),
            counts: SnapshotCounts::default(),
            removals: Vec::new(),
        }
    }

    /// Sets the entries a journal group applies between snapshot candidates (0: its log is
    /// never compacted). Default [`SNAPSHOT_ENTRIES`].
    pub fn set_snapshot_entries(&mut self, every: u64) {
        self.snapshot_every = every;
    }

    /// The journals whose group installed a snapshot (here, or found at the restart) since the
    /// last call, each with the snapshot's index and the journal's `next_seq` there: the node
    /// drops every record it holds below it. The records between the snapshot's `first_seq`
    /// and `next_seq` that it does not hold lie in compacted entries, and were truncated
    /// before the snapshot was taken, so no read confirmed from then on asks for them
    /// (docs/journals.md §9.9).
    pub fn take_installed(&mut self) -> Vec<(JournalId, u64, u64)> {
        std::mem::take(&mut self.installed)
    }

    /// Snapshots sent and installed, and logs compacted, since the start.
    pub fn snapshot_counts(&self) -> SnapshotCounts {
        self.counts
    }

    /// Notes that `journal`'s entry at `index` of `term` is durable at `loc` in the node's
    /// command log: its group keeps only that location, and reads the entry back when asked.
    pub fn stored(&mut self, journal: JournalId, index: u64, term: u64, loc: Loc) {
        if let Some(g) = self.groups.get_mut(&journal) {
            g.raw.mut_store().stored(index, term, loc);
        } else if let Some((log, _)) = self.stopped.get_mut(&journal) {
            log.stored(index, term, loc);
        }
    }

    /// A member node of a cluster of `members` (this node among them) restarting from
    /// `durable` (every item of its command log, in order; empty on a first start): the
    /// directory group over every member is added, and each journal group this node votes in
    /// is started as soon as the directory applies the journal's creation, from its own
    /// durable items. Each entry of `durable` with a location in `stored` is held as that
    /// location only (its data may be left empty) and read back with `reader` when it is
    /// applied or sent. Source: docs/journals.md §9.5.
    ///
    /// # Errors
    /// As [`Replica::add_group`].
    pub fn member(
        node: u64,
        members: Vec<Member>,
        durable: Vec<Durable>,
        stored: HashMap<(JournalId, u64, u64), Loc>,
        reader: EntryReader,
    ) -> Result<Replica<T>, ReplicaError> {
        let mut r = Replica::new(node, Directory::new());
        r.reader = Some(reader);
        r.stored = stored;
        for d in durable {
            let group = match &d {
                Durable::Entry { journal, .. } | Durable::HardState { journal, .. } | Durable::Snapshot { journal, .. } => *journal,
            };
            r.dormant.entry(group).or_default().push(d);
        }
        let all: Vec<u64> = members.iter().map(|m| m.node).collect();
        r.members = members;
        let items = r.dormant.remove(&DIRECTORY).unwrap_or_default();
        r.restoring = true;
        r.add_group(DIRECTORY, &all, &items)?;
        r.start_created()?;
        r.restoring = false;
        Ok(r)
    }

    /// The voters of `journal`'s group (docs/journals.md §9.5): every member for the
    /// directory; for a journal, those its creation recorded ([`Command::CreatePlaced`]), else
    /// (a journal created before creations recorded them) three placed over the members.
    pub fn voters(&self, journal: JournalId) -> Vec<u64> {
        if journal == DIRECTORY {
            return self.members.iter().map(|m| m.node).collect();
        }
        if let Some(p) = self.directory.journal(journal).and_then(|e| e.placement.as_ref()) {
            return p.voters.clone();
        }
        super::placement::place(journal, &self.members, super::placement::DEFAULT_VOTERS)
    }

    /// The voters `journal`'s group was created with: every copy starts from them and replays
    /// the configuration changes in its log (docs/journals.md §9.8).
    fn initial_voters(&self, journal: JournalId) -> Vec<u64> {
        match self.directory.journal(journal).and_then(|e| e.placement.as_ref()) {
            Some(p) => p.initial.clone(),
            None => self.voters(journal),
        }
    }

    /// Starts the group of every journal created in the applied entries not yet looked at
    /// that this node votes in. A new group's preferred voter (the one at the journal id's
    /// place among the voters, so leaders spread over the nodes) stands at once, so the
    /// journal's first write does not wait for an election timeout; not at a restart, where
    /// the group has its leader already.
    fn start_created(&mut self) -> Result<(), ReplicaError> {
        if self.members.is_empty() {
            return Ok(());
        }
        // A journal's creation, or a configuration that names this node a voter.
        let created: Vec<(JournalId, bool)> = self
            .applied
            .iter()
            .filter_map(|a| match (&a.answer, a.group == DIRECTORY) {
                (Some(Answer::JournalCreated { journal }), true) => Some((*journal, true)),
                // A tenant's default is configured with journal id 0: no group.
                (Some(Answer::Configured { journal }), true) if journal.is_set() => Some((*journal, false)),
                _ => None,
            })
            .collect();
        for (journal, creation) in created {
            let initial = self.initial_voters(journal);
            if !(initial.contains(&self.node) || self.voters(journal).contains(&self.node)) {
                continue;
            }
            // A copy resumed to take one message, now named again: it goes on as a full copy.
            if let Some(g) = self.groups.get_mut(&journal) {
                g.on_demand = false;
                continue;
            }
            // A copy this node stopped goes on from where it stopped: the journal's state here
            // was applied from it (replaying its log from the start again would apply every
            // entry twice).
            if self.resume(journal, false)? {
                continue;
            }
            let items = self.dormant.remove(&journal).unwrap_or_default();
            let fresh = creation && items.is_empty() && !self.restoring;
            self.add_group(journal, &initial, &items)?;
            let voters = initial;
            if fresh && voters[(journal.journal % voters.len() as u64) as usize] == self.node {
                if let Some(g) = self.groups.get_mut(&journal) {
                    let _ = g.raw.campaign();
                }
            }
        }
        Ok(())
    }

    /// This node's proposals waiting for a verdict, over every group.
    pub fn pending(&self) -> usize {
        self.waiting
    }

    /// The entries applied since the last call, in apply order.
    pub fn take_applied(&mut self) -> Vec<Applied> {
        std::mem::take(&mut self.applied)
    }

    /// Whether any group has work for a round ([`Replica::ready`]), or a node is to be told it
    /// left a group ([`Replica::take_removals`]).
    pub fn has_ready(&mut self) -> bool {
        !self.orphans.is_empty() || !self.removals.is_empty() || self.groups.values_mut().any(|g| g.raw.has_ready())
    }

    /// The leader this node believes `journal`'s group has.
    pub fn leader(&self, journal: JournalId) -> Option<u64> {
        self.groups.get(&journal).and_then(Group::leader)
    }

    /// Raft's view of `journal`'s group here: role, term, leader, commit and applied index.
    pub fn status(&self, journal: JournalId) -> Option<GroupStatus> {
        self.groups.get(&journal).map(|g| GroupStatus {
            role: g.raw.raft.state,
            term: g.raw.raft.term,
            leader: g.leader(),
            commit: g.raw.raft.raft_log.committed,
            applied: g.applied,
            pending: g.proposals.len(),
            voters: {
                let mut v: Vec<u64> = g.raw.raft.prs().conf().voters().ids().iter().collect();
                v.sort_unstable();
                v
            },
        })
    }

    /// The groups this node holds.
    pub fn groups(&self) -> impl Iterator<Item = JournalId> + '_ {
        self.groups.keys().copied()
    }

    /// The journal state machine, as applied here.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Adds the group of `journal` with `voters` (node ids, this node among them), restoring
    /// what `durable` holds for it (every item of the node's durable log, in order; items of
    /// other groups are skipped) and applying its entries up to the durable commit index.
    ///
    /// # Errors
    /// [`ReplicaError::GroupExists`], [`ReplicaError::Gap`] for a durable log with a gap, or
    /// raft's refusal of the configuration or storage.
    pub fn add_group<'d>(&mut self, journal: JournalId, voters: &[u64], durable: impl IntoIterator<Item = &'d Durable>) -> Result<(), ReplicaError> {
        if self.groups.contains_key(&journal) {
            return Err(ReplicaError::GroupExists(journal));
        }
        let mut storage = GroupLog::new(voters, self.reader.clone());
        let mut restored = None;
        let mut located = Vec::new();
        for d in durable {
            let gap = |g: super::group_log::Gap| ReplicaError::Gap { journal, index: g.index, last: g.last };
            match d {
                // The log starts after it: entries up to its index are compacted or replaced.
                Durable::Snapshot { journal: j, snapshot } if *j == journal => {
                    let index = snapshot.get_metadata().index;
                    if index >= storage.snapshot_index() {
                        match super::snapshot::decode(&snapshot.data) {
                            Ok((_, state)) => restored = Some(state),
                            Err(e) => return Err(ReplicaError::Snapshot { journal, why: e.to_string() }),
                        }
                        let term = snapshot.get_metadata().term;
                        let first = storage.first_index().unwrap_or(1);
                        // Entries held that all follow the snapshot, of its term or later:
                        // written before it, those it covers given back with their segments.
                        let follows = storage.last() >= first && index < first && storage.term(first).is_ok_and(|t| t >= term);
                        if follows {
                            storage.rebase(snapshot.clone());
                        } else if index > storage.last() || storage.term(index).ok() != Some(term) {
                            storage.install(snapshot.clone());
                        } else {
                            storage.compact(snapshot.clone()).map_err(gap)?;
                        }
                    }
                }
                Durable::Entry { journal: j, entry } if *j == journal && entry.index <= storage.snapshot_index() => {
                    self.stored.remove(&(journal, entry.index, entry.term));
                }
                // An index written twice (a new leader overwrote an undecided suffix) is two
                // items of different terms, each with its own location. The same entry (index
                // and term) written twice (this node left the group and came back, and was
                // sent the log again) is one entry: each item of it is read from the one
                // location kept, so neither is held with the empty data of a restored item.
                Durable::Entry { journal: j, entry } if *j == journal => match self.stored.get(&(journal, entry.index, entry.term)) {
                    Some(&loc) => {
                        storage.append_stored(entry.index, entry.term, loc);
                        located.push((journal, entry.index, entry.term));
                    }
                    None => storage.append_replayed(entry),
                },
                Durable::HardState { journal: j, state } if *j == journal => storage.set_hard_state(state.clone()),
                _ => {}
            }
        }
        for key in located {
            self.stored.remove(&key);
        }
        // Segments given back held only entries a snapshot found later covers; any other
        // hole is a loss.
        storage.check_start().map_err(|g| ReplicaError::Gap { journal, index: g.index, last: g.last })?;
        // A hard state never says more is decided than the log held durably with it: a
        // commit index past the last entry means entries were lost (a segment file removed).
        if storage.hard_state().commit > storage.last() {
            return Err(ReplicaError::LostDecided { journal, commit: storage.hard_state().commit, last: storage.last() });
        }
        let commit = storage.hard_state().commit;
        if let Some(state) = restored {
            self.directory.restore_state(journal, state.clone());
            self.installed.push((journal, storage.snapshot_index(), state.next_seq));
        }
        let snapshot_index = storage.snapshot_index();
        let mut changes = Vec::new();
        for index in snapshot_index + 1..=commit {
            let e = storage.entry(index)?;
            if e.get_entry_type() == EntryType::EntryConfChangeV2 {
                changes.push(e.clone());
            }
            let answer = judge(&mut self.directory, journal, &e);
            self.applied.push(Applied { group: journal, index: e.index, answer: answer_of(answer) });
        }
        let raw = RawNode::new(&config(self.node, commit), storage, &self.logger)?;
        let mut g = Group {
            raw,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            confirmed: Vec::new(),
            applied: commit,
            candidate: None,
            captured: snapshot_index,
            snapshot_sent: BTreeMap::new(),
            on_demand: false,
            quiet: 0,
        };
        // The configuration changes applied before the restart, again, in order.
        for e in &changes {
            apply_conf_change(journal, &mut g, e);
        }
        self.groups.insert(journal, g);
        Ok(())
    }

    /// Adds to `out` every segment of the command log holding an entry a group here still
    /// needs: a running group's, a stopped copy's, or one of a group not started
    /// (docs/journals.md §9.9).
    pub fn live_segments(&self, out: &mut BTreeSet<u64>) {
        for g in self.groups.values() {
            g.raw.store().segments(out);
        }
        for (log, _) in self.stopped.values() {
            log.segments(out);
        }
        out.extend(self.stored.values().map(|loc| loc.segment));
    }

    /// Whether only the directory's entries, if any, pin `segment` among the groups' entries,
    /// so that they can be written again at the log's head and the segment go: the index of
    /// the directory's first entry there and the bytes from it to its last entry (all of which
    /// move, so the log keeps its entries in index order), or `Some(None)` when it has none
    /// there. `None` when another entry pins it (a journal group's, a stopped copy's, a not
    /// started group's: those wait for compaction) or the directory's entries from there are
    /// not all durable yet.
    pub fn directory_entries_in(&self, segment: u64) -> Option<Option<(u64, u64)>> {
        let mut directory = None;
        for (journal, g) in &self.groups {
            let log = g.raw.store();
            match log.first_in(segment) {
                Some(index) if *journal == DIRECTORY => directory = Some((index, log.bytes_from(index)?)),
                Some(_) => return None,
                None => {}
            }
        }
        let pinned = self.stopped.values().any(|(log, _)| log.first_in(segment).is_some()) || self.stored.values().any(|loc| loc.segment == segment);
        (!pinned).then_some(directory)
    }

    /// The entries of `journal`'s running group from `index` to its last, read back.
    ///
    /// # Errors
    /// [`ReplicaError::UnknownGroup`], or an entry that cannot be read.
    pub fn entries_from(&self, journal: JournalId, index: u64) -> Result<Vec<Entry>, ReplicaError> {
        let g = self.groups.get(&journal).ok_or(ReplicaError::UnknownGroup(journal))?;
        let log = g.raw.store();
        (index..=log.last()).map(|i| log.entry(i).map_err(ReplicaError::from)).collect()
    }

    /// `journal`'s hard state and snapshot (index 0: none) as this node holds them durably,
    /// whether its group runs, its copy stopped or it was not started: what a durable item
    /// of each says, to write again at the log's head.
    pub fn durable_state(&self, journal: JournalId) -> Option<(HardState, Snapshot)> {
        if let Some(g) = self.groups.get(&journal) {
            let log = g.raw.store();
            return Some((log.hard_state().clone(), log.durable_snapshot().clone()));
        }
        if let Some((log, _)) = self.stopped.get(&journal) {
            return Some((log.hard_state().clone(), log.durable_snapshot().clone()));
        }
        let items = self.dormant.get(&journal)?;
        let hs = items.iter().rev().find_map(|d| if let Durable::HardState { state, .. } = d { Some(state.clone()) } else { None });
        let snap = items.iter().rev().find_map(|d| if let Durable::Snapshot { snapshot, .. } = d { Some(snapshot.clone()) } else { None });
        Some((hs.unwrap_or_default(), snap.unwrap_or_default()))
    }

    /// Whether this node leads `journal`'s group.
    pub fn is_leader(&self, journal: JournalId) -> bool {
        self.groups.get(&journal).is_some_and(|g| g.raw.raft.state == StateRole::Leader)
    }

    /// Proposes one encoded journal command to `journal`'s group; its verdict comes in a later
    /// round with `token`.
    ///
    /// # Errors
    /// The token back with [`Refused::NotLeader`] (this node does not lead, or raft dropped
    /// the proposal during a leader transfer) or [`Refused::UnknownGroup`].
    pub fn propose(&mut self, journal: JournalId, command: Vec<u8>, token: T) -> Result<(), (T, Refused)> {
        let Some(g) = self.groups.get_mut(&journal) else { return Err((token, Refused::UnknownGroup)) };
        if g.raw.raft.state != StateRole::Leader {
            return Err((token, Refused::NotLeader { leader: g.leader() }));
        }
        match g.raw.propose(Vec::new(), command) {
            Ok(()) => {
                let index = g.raw.raft.raft_log.last_index();
                let term = g.raw.raft.term;
                match g.proposals.insert(index, Proposal { token, term }) {
                    // An earlier term's proposal whose index this one took: it gets no verdict.
                    Some(old) => self.orphans.push((old.token, Verdict::NoVerdict { leader: Some(self.node) })),
                    None => self.waiting += 1,
                }
                Ok(())
            }
            Err(_) => Err((token, Refused::NotLeader { leader: g.leader() })),
        }
    }

    /// Proposes `command` to `journal`'s group with no verdict wanted: from a follower, raft
    /// forwards it to the leader. For commands whose repeats are harmless (a released name).
    /// False when this node holds no such group or knows no leader.
    pub fn forward(&mut self, journal: JournalId, command: Vec<u8>) -> bool {
        let Some(g) = self.groups.get_mut(&journal) else { return false };
        g.leader().is_some() && g.raw.propose(Vec::new(), command).is_ok()
    }

    /// Asks for a linearizable read of `journal`: [`Verdict::ReadReady`] comes with `token`
    /// once a quorum confirmed the leader's commit index and this node applied up to it.
    ///
    /// # Errors
    /// The token back with [`Refused::NotLeader`] when no leader is known, or
    /// [`Refused::UnknownGroup`].
    pub fn read(&mut self, journal: JournalId, token: T) -> Result<(), (T, Refused)> {
        let Some(g) = self.groups.get_mut(&journal) else { return Err((token, Refused::UnknownGroup)) };
        if g.leader().is_none() {
            return Err((token, Refused::NotLeader { leader: None }));
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        g.raw.read_index(context(self.node, tag));
        g.reads.insert(tag, token);
        Ok(())
    }

    /// Steps a message from a peer into `journal`'s group.
    ///
    /// # Errors
    /// [`ReplicaError::UnknownGroup`], or raft's refusal (a local message kind, a peer the
    /// group does not know).
    pub fn step(&mut self, journal: JournalId, message: Message) -> Result<(), ReplicaError> {
        // A message for a group whose copy this node stopped: the group may still need this
        // node (a voter that left may have to vote or acknowledge for the voters that stay,
        // when they have not learnt yet that the change that left it out was decided), so the
        // copy takes the message and answers; it stops again at the end of the next round.
        if !self.groups.contains_key(&journal) {
            self.resume(journal, true)?;
        }
        let g = self.groups.get_mut(&journal).ok_or(ReplicaError::UnknownGroup(journal))?;
        // A leader's heartbeat carries a commit index no higher than what this node has
        // acknowledged holding; one past this node's log means it lost acknowledged entries.
        let last = g.raw.raft.raft_log.last_index();
        if message.get_msg_type() == raft::eraftpb::MessageType::MsgHeartbeat && message.term >= g.raw.raft.term && message.commit > last {
            return Err(ReplicaError::LostEntries { journal, commit: message.commit, last });
        }
        // A node this group's leader no longer counts among its voters, and that still talks
        // to the group, missed its removal (it was down or cut off when the change was
        // decided, and a leader sends nothing to a node out of its configuration): it is told,
        // so that it stops its copy (docs/journals.md §9.8). Only with no change in flight,
        // so the configuration told is the group's latest.
        let from = message.from;
        if journal != DIRECTORY && g.raw.raft.state == StateRole::Leader && !g.raw.raft.has_pending_conf() {
            let cs = g.raw.raft.prs().conf().to_conf_state();
            let member = cs.voters.contains(&from) || cs.voters_outgoing.contains(&from) || cs.learners.contains(&from);
            if !member && !self.removals.iter().any(|(to, j, _)| *to == from && *j == journal) {
                self.removals.push((from, journal, g.raw.raft.term));
            }
        }
        g.raw.step(message)?;
        Ok(())
    }

    /// The nodes to tell that they are no longer voters of a group this node leads, since the
    /// last call: each with the group and this node's term. Sent in the peer frame's
    /// `removed` (docs/journals.md §9.4), they reach [`Replica::removed`] there.
    pub fn take_removals(&mut self) -> Vec<(u64, JournalId, u64)> {
        std::mem::take(&mut self.removals)
    }

    /// Node `from`, the leader of `journal`'s group at `term`, says this node is not in the
    /// group's configuration: the group's copy here stops (its waiting calls get no verdict in
    /// the next round) when the directory does not record this node as a voter of the journal
    /// either and the word is not from an older term than this copy knows. A later
    /// reconfiguration that names this node starts the copy again.
    pub fn removed(&mut self, journal: JournalId, from: u64, term: u64) {
        let Some(g) = self.groups.get(&journal) else { return };
        let recorded = self.directory.journal(journal).and_then(|e| e.placement.as_ref()).is_some_and(|p| p.voters.contains(&self.node));
        if journal == DIRECTORY || recorded || term < g.raw.raft.term {
            return;
        }
        tracing::info!(%journal, leader = from, term, "the group's leader no longer counts this node among its voters");
        let mut verdicts = Vec::new();
        self.stop_group(journal, &mut verdicts);
        self.orphans.extend(verdicts);
    }

    /// Advances every group's logical clock by one tick, and moves each group this node leads
    /// toward the voters the directory records for it.
    pub fn tick(&mut self) {
        for g in self.groups.values_mut() {
            g.raw.tick();
            g.quiet = g.quiet.saturating_add(1);
            retry_snapshots(g);
        }
        self.reconfigure();
    }

    /// Joint consensus, driven by each group's leader (docs/journals.md §9.8): a group in a
    /// joint configuration leaves it; a group whose voters are not those the directory records
    /// enters the joint configuration of its voters and those. One change at a time: nothing
    /// is proposed while a change is not yet applied (raft also refuses a new leader's change
    /// until it applied its predecessors' entries).
    fn reconfigure(&mut self) {
        use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2};
        for (journal, g) in &mut self.groups {
            if *journal == DIRECTORY || g.raw.raft.state != StateRole::Leader || g.raw.raft.has_pending_conf() {
                continue;
            }
            let Some(p) = self.directory.journal(*journal).and_then(|e| e.placement.as_ref()) else { continue };
            let cs = g.raw.raft.prs().conf().to_conf_state();
            let cc = if !cs.voters_outgoing.is_empty() {
                ConfChangeV2::default()
            } else {
                let mut current = cs.voters.clone();
                current.sort_unstable();
                if current == p.voters {
                    continue;
                }
                let change = |node_id: u64, add: bool| ConfChangeSingle {
                    change_type: if add { ConfChangeType::AddNode } else { ConfChangeType::RemoveNode } as i32,
                    node_id,
                };
                let mut changes: Vec<ConfChangeSingle> = p.voters.iter().filter(|v| !current.contains(v)).map(|&v| change(v, true)).collect();
                changes.extend(current.iter().filter(|v| !p.voters.contains(v)).map(|&v| change(v, false)));
                ConfChangeV2 { transition: ConfChangeTransition::Explicit as i32, changes, context: Vec::new() }
            };
            if let Err(err) = g.raw.propose_conf_change(Vec::new(), cc) {
                tracing::warn!(%journal, %err, "a configuration change was not proposed; tried again at the next tick");
            }
        }
    }

    /// Stops the groups this node left: a journal group whose recorded voters leave this node
    /// out, and whose applied configuration leaves it out too or whose copy was resumed only to
    /// take a message. Its waiting calls get no verdict.
    ///
    /// A copy resumed to take a message stops after one round even when its own (stale)
    /// configuration still names this node: it was stopped by the word of a leader or by its
    /// applied configuration, and left running it would campaign, its pre-votes resuming the
    /// other left-out copies in turn, so that they never settle.
    fn stop_removed(&mut self, verdicts: &mut Vec<(T, Verdict)>) {
        let gone: Vec<JournalId> = self
            .groups
            .iter()
            .filter(|(j, g)| {
                let cs = g.raw.raft.prs().conf().to_conf_state();
                let left = g.on_demand || (!cs.voters.contains(&self.node) && !cs.voters_outgoing.contains(&self.node));
                **j != DIRECTORY && left && self.directory.journal(**j).and_then(|e| e.placement.as_ref()).is_some_and(|p| !p.voters.contains(&self.node))
            })
            .map(|(j, _)| *j)
            .collect();
        for j in gone {
            self.stop_group(j, verdicts);
        }
    }

    /// Resumes the copy of `journal`'s group this node stopped, from its log, term, vote and
    /// applied index as they were (`on_demand`: to take a message, and stop again); false
    /// when there is none.
    ///
    /// # Errors
    /// Raft's refusal of the kept log.
    fn resume(&mut self, journal: JournalId, on_demand: bool) -> Result<bool, ReplicaError> {
        let Some((storage, applied)) = self.stopped.remove(&journal) else { return Ok(false) };
        let raw = RawNode::new(&config(self.node, applied), storage, &self.logger)?;
        let g = Group {
            raw,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            confirmed: Vec::new(),
            applied,
            candidate: None,
            captured: applied,
            snapshot_sent: BTreeMap::new(),
            on_demand,
            quiet: 0,
        };
        self.groups.insert(journal, g);
        if on_demand {
            tracing::debug!(%journal, applied, "a stopped copy of the journal's group takes a message");
        } else {
            tracing::info!(%journal, applied, "this node rejoined the journal's group where its copy stopped");
        }
        Ok(true)
    }

    /// Stops this node's copy of `journal`'s group; its waiting calls get no verdict. Its log
    /// is kept, for a message the group still sends it and for a later reconfiguration that
    /// names this node again ([`Replica::resume`]).
    fn stop_group(&mut self, journal: JournalId, verdicts: &mut Vec<(T, Verdict)>) {
        let Some(mut g) = self.groups.remove(&journal) else { return };
        let storage = std::mem::replace(g.raw.mut_store(), GroupLog::new(&[], None));
        self.stopped.insert(journal, (storage, g.applied));
        self.waiting -= g.proposals.len();
        verdicts.extend(g.proposals.into_values().map(|p| (p.token, Verdict::NoVerdict { leader: None })));
        verdicts.extend(g.reads.into_values().map(|t| (t, Verdict::NoVerdict { leader: None })));
        verdicts.extend(g.confirmed.into_iter().map(|(_, t)| (t, Verdict::NoVerdict { leader: None })));
        if g.on_demand {
            tracing::debug!(%journal, "a stopped copy of the journal's group stops again");
        } else {
            tracing::info!(%journal, "this node left the journal's group");
        }
    }

    /// Collects the round's work from every group (see the module table) and hands each
    /// group's ready back to raft at once: the round's entries are held in memory (and read
    /// from there) until [`Replica::persisted`] says they are durable.
    pub fn ready(&mut self) -> Round<T> {
        let mut round = Round::default();
        round.verdicts.append(&mut self.orphans);
        for (&journal, g) in &mut self.groups {
            if !g.raw.has_ready() {
                continue;
            }
            let mut rd = g.raw.ready();
            let sent = rd.take_messages();
            for m in sent.iter().filter(|m| m.get_msg_type() == MessageType::MsgSnapshot) {
                self.counts.sent += 1;
                g.snapshot_sent.insert(m.to, 0);
            }
            round.send.extend(sent.into_iter().map(|m| (journal, m)));
            if !rd.snapshot().is_empty() {
                let installed = install(&mut self.directory, journal, g, rd.snapshot().clone());
                round.persist.push(Durable::Snapshot { journal, snapshot: rd.snapshot().clone() });
                match installed {
                    Ok(next_seq) => {
                        self.counts.installed += 1;
                        self.installed.push((journal, rd.snapshot().get_metadata().index, next_seq));
                    }
                    Err(why) => tracing::error!(%journal, %why, "a snapshot from the leader left the journal's state as it was"),
                }
            }
            for rs in rd.take_read_states() {
                if let Some(token) = own_tag(self.node, &rs.request_ctx).and_then(|t| g.reads.remove(&t)) {
                    g.confirmed.push((rs.index, token));
                }
            }
            self.waiting -= apply(&mut self.directory, journal, g, rd.take_committed_entries(), &mut round.verdicts, &mut self.applied);
            if compact(&self.directory, journal, g, self.snapshot_every, &mut round.persist) {
                self.counts.compacted += 1;
            }
            if !rd.entries().is_empty() {
                g.raw.mut_store().append(rd.entries()).expect("raft hands out entries that follow its log");
                round.persist.extend(rd.entries().iter().map(|e| Durable::Entry { journal, entry: e.clone() }));
            }
            if let Some(hs) = rd.hs() {
                g.raw.mut_store().set_hard_state(hs.clone());
                round.persist.push(Durable::HardState { journal, state: hs.clone() });
            }
            if let Some(ss) = rd.ss() {
                let leader = (ss.leader_id != INVALID_ID).then_some(ss.leader_id);
                if ss.raft_state != StateRole::Leader {
                    let lost = std::mem::take(&mut g.proposals);
                    self.waiting -= lost.len();
                    round.verdicts.extend(lost.into_values().map(|p| (p.token, Verdict::NoVerdict { leader })));
                }
                // A read not yet confirmed when the leader changed is lost with the old leader's
                // read state (raft drops it): it gets no verdict, and its caller asks again.
                round.verdicts.extend(std::mem::take(&mut g.reads).into_values().map(|t| (t, Verdict::NoVerdict { leader })));
            }
            round.send_after_sync.extend(rd.take_persisted_messages().into_iter().map(|m| (journal, m)));
            round.must_sync |= rd.must_sync();
            round.readies.push((journal, rd.number()));
            g.raw.advance_append_async(rd);
            advance_apply(g);
        }
        self.start_groups();
        self.stop_removed(&mut round.verdicts);
        round
    }

    /// Tells raft that the items of the rounds that handed out `readies` are durable (every
    /// earlier round's too): each group counts its own entries toward the decision, and the
    /// next [`Replica::ready`] applies what that decided. A group gone since is skipped.
    pub fn persisted(&mut self, readies: &[(JournalId, u64)]) {
        for &(journal, number) in readies {
            if let Some(g) = self.groups.get_mut(&journal) {
                g.raw.on_persist_ready(number);
                advance_apply(g);
            }
        }
    }

    /// [`Replica::start_created`] at the end of a round; a group that cannot start (its
    /// durable items do not hold together) is left out and said so.
    fn start_groups(&mut self) {
        if let Err(e) = self.start_created() {
            tracing::error!(error = %e, "a journal group could not start on this node");
        }
    }
}

/// The raft configuration of every group: pre-vote and check-quorum on (a partitioned node
/// neither disrupts the group when it returns nor keeps leading alone), reads confirmed by a
/// quorum (no leases: no clock is trusted).
fn config(node: u64, applied: u64) -> Config {
    Config {
        id: node,
        election_tick: ELECTION_TICKS,
        heartbeat_tick: HEARTBEAT_TICKS,
        applied,
        max_size_per_msg: MAX_MESSAGE_BYTES,
        max_inflight_msgs: MAX_INFLIGHT,
        check_quorum: true,
        pre_vote: true,
        read_only_option: ReadOnlyOption::Safe,
        ..Config::default()
    }
}

/// Applies decided entries in order to the state machine; this node's own proposals get their
/// verdicts, proposals whose index another entry took get none, and confirmed reads the
/// applied index reached are ready.
fn apply<T>(
    directory: &mut Directory,
    journal: JournalId,
    g: &mut Group<T>,
    entries: Vec<Entry>,
    verdicts: &mut Vec<(T, Verdict)>,
    applied: &mut Vec<Applied>,
) -> usize {
    let mut answered = 0;
    for e in entries {
        g.applied = e.index;
        g.quiet = 0;
        if e.get_entry_type() == EntryType::EntryConfChangeV2 {
            apply_conf_change(journal, g, &e);
        }
        let verdict = judge(directory, journal, &e);
        applied.push(Applied { group: journal, index: e.index, answer: answer_of(verdict.clone()) });
        // A proposal below this index that is still waiting lost its place to another leader's
        // entry, as does one at this index whose term is not the entry's.
        while let Some(entry) = g.proposals.first_entry() {
            if *entry.key() > e.index {
                break;
            }
            let (index, p) = entry.remove_entry();
            answered += 1;
            let v = if index == e.index && p.term == e.term { verdict.clone() } else { Verdict::NoVerdict { leader: g.leader() } };
            verdicts.push((p.token, v));
        }
    }
    let applied = g.applied;
    let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut g.confirmed).into_iter().partition(|(index, _)| *index <= applied);
    g.confirmed = waiting;
    verdicts.extend(ready.into_iter().map(|(_, t)| (t, Verdict::ReadReady)));
    answered
}

/// Applies a decided configuration change entry to the group's configuration (raft's joint
/// consensus: entering the joint configuration of old and new voters, or leaving it).
fn apply_conf_change<T>(journal: JournalId, g: &mut Group<T>, e: &Entry) {
    // A snapshot's configuration already holds the changes up to its `conf_index`.
    if e.index <= g.raw.store().conf_index() {
        return;
    }
    let cc = match super::durable::conf_change(&e.data) {
        Ok(cc) => cc,
        Err(why) => {
            tracing::error!(%journal, index = e.index, %why, "a decided configuration change does not decode; skipped");
            return;
        }
    };
    match g.raw.apply_conf_change(&cc) {
        Ok(cs) => {
            // A leader the change leaves out steps down: raft would go on leading without a
            // progress of its own and panic at the next acknowledgement (a soak found a node
            // elected in the joint configuration whose directory had not yet learnt that it
            // leaves). The voters that stay elect a leader of their own.
            let me = g.raw.raft.id;
            if g.raw.raft.state == StateRole::Leader && !cs.voters.contains(&me) && !cs.voters_outgoing.contains(&me) {
                tracing::info!(%journal, index = e.index, "this node led the group and the change leaves it out: it steps down");
                let term = g.raw.raft.term;
                g.raw.raft.become_follower(term, INVALID_ID);
            }
            g.raw.mut_store().set_conf_state(cs, e.index);
        }
        Err(err) => tracing::error!(%journal, index = e.index, %err, "a decided configuration change was refused by raft"),
    }
}

/// Tells raft how far this node applied: no further than its log is durable (an installed
/// snapshot counts once it is durable).
fn advance_apply<T>(g: &mut Group<T>) {
    let log = &g.raw.raft.raft_log;
    let to = g.applied.min(log.persisted).min(log.committed);
    if to > log.applied {
        g.raw.advance_apply_to(to);
    }
}

/// Installs `snapshot` from the group's leader (docs/journals.md §9.9): the journal's state
/// becomes the snapshot's, the group's log starts after its index, and its configuration is
/// the snapshot's. Returns the journal's `next_seq`.
///
/// # Errors
/// Snapshot data that does not decode (the peer check lets none through), or a snapshot of a
/// journal this node's directory does not hold; the log follows the snapshot all the same.
fn install<T>(directory: &mut Directory, journal: JournalId, g: &mut Group<T>, snapshot: Snapshot) -> Result<u64, String> {
    // Raft has taken the snapshot already: the log follows it whatever the state says.
    let decoded = super::snapshot::decode(&snapshot.data).map_err(|e| e.to_string());
    let index = snapshot.get_metadata().index;
    g.raw.mut_store().install(snapshot);
    g.applied = index;
    g.captured = index;
    g.candidate = None;
    let (_, state) = decoded?;
    let next_seq = state.next_seq;
    if !directory.restore_state(journal, state) {
        return Err("the journal is not in this node's directory".into());
    }
    Ok(next_seq)
}

/// Compacts a journal group's log once its candidate's records are all below the journal's
/// `first_seq` (the log is then compacted to the candidate, which becomes the snapshot a
/// follower that needs those entries gets), and takes a new candidate every `every` applied
/// entries. Returns whether the log was compacted; the snapshot and the hard state go to
/// `persist`. The directory group is never compacted.
fn compact<T>(directory: &Directory, journal: JournalId, g: &mut Group<T>, every: u64, persist: &mut Vec<Durable>) -> bool {
    if journal == DIRECTORY || every == 0 {
        return false;
    }
    let Some(state) = directory.journal(journal).map(|e| &e.state) else { return false };
    let mut compacted = false;
    if g.candidate.as_ref().is_some_and(|c| c.state.next_seq <= state.first_seq && c.index > g.raw.store().snapshot_index()) {
        let c = g.candidate.take().expect("checked above");
        let mut snapshot = Snapshot { data: super::snapshot::encode(c.conf_index, &c.state), ..Snapshot::default() };
        let meta = snapshot.mut_metadata();
        meta.index = c.index;
        meta.term = c.term;
        meta.set_conf_state(c.conf);
        if g.raw.mut_store().compact(snapshot.clone()).is_ok() {
            persist.push(Durable::Snapshot { journal, snapshot });
            // A commit index past the truncation that allowed this, so a restart applies it.
            persist.push(Durable::HardState { journal, state: g.raw.store().hard_state().clone() });
            compacted = true;
        }
    }
    // A journal whose every record is truncated, and whose group applied nothing for a
    // while, is compacted up to what it applied at once (the candidate qualifies as taken):
    // its entries would otherwise keep their segments until `every` more are applied.
    let emptied = state.first_seq == state.next_seq && g.quiet >= IDLE_TICKS && g.applied > g.raw.store().snapshot_index();
    if g.candidate.is_none() && (g.applied >= g.captured + every || (emptied && g.applied > g.captured)) {
        if let Ok(term) = g.raw.store().term(g.applied) {
            g.candidate = Some(Candidate {
                index: g.applied,
                term,
                conf: g.raw.raft.prs().conf().to_conf_state(),
                conf_index: g.raw.store().conf_index(),
                state: state.clone(),
            });
            g.captured = g.applied;
        }
    }
    compacted
}

/// A leader whose follower has not installed the snapshot it was sent within
/// [`SNAPSHOT_RETRY_TICKS`] reports it failed, so raft sends it again.
fn retry_snapshots<T>(g: &mut Group<T>) {
    if g.snapshot_sent.is_empty() {
        return;
    }
    if g.raw.raft.state != StateRole::Leader {
        g.snapshot_sent.clear();
        return;
    }
    let mut failed = Vec::new();
    g.snapshot_sent.retain(|&to, ticks| {
        *ticks += 1;
        let waiting = g.raw.raft.prs().get(to).is_some_and(|p| p.state == ProgressState::Snapshot);
        if waiting && *ticks > SNAPSHOT_RETRY_TICKS {
            failed.push(to);
        }
        waiting && *ticks <= SNAPSHOT_RETRY_TICKS
    });
    for to in failed {
        g.raw.report_snapshot(to, SnapshotStatus::Failure);
    }
}

/// The journal's answer inside a verdict.
fn answer_of(v: Verdict) -> Option<Answer> {
    match v {
        Verdict::Applied(a) => Some(a),
        _ => None,
    }
}

/// Applies one decided entry of `group` to the state machine: the same on every node. A
/// deletion in the journal's own group drops its state only; the directory group frees its
/// name later (docs/journals.md §9.5).
fn judge(directory: &mut Directory, group: JournalId, e: &Entry) -> Verdict {
    match e.get_entry_type() {
        EntryType::EntryNormal if !e.data.is_empty() => match decode_command(&e.data) {
            Ok((_, Command::DeleteJournal { journal })) if group != DIRECTORY => Verdict::Applied(directory.drop_journal(journal)),
            Ok((_, cmd)) => Verdict::Applied(directory.apply(&cmd)),
            Err(_) => Verdict::Undecodable,
        },
        // A new leader's empty entry, or a configuration change (none are proposed yet).
        _ => Verdict::NoVerdict { leader: None },
    }
}
