//! The node's journals as one state machine: the directory of tenants and journal names, and
//! each journal's [`JournalState`]. [`Directory::apply`] judges any [`Command`] in log order;
//! like [`super::apply()`] it is pure.
//!
//! Source: docs/journals.md §5.

use std::collections::{BTreeMap, HashMap};

use super::apply::{apply, Call, Outcome};
use super::command::Command;
use super::model::{digest_records, JournalId, JournalState, Mode, StoreDurability};

/// The longest tenant or journal name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `name` is a valid tenant or journal name: 1 to [`MAX_NAME_LEN`] bytes of ASCII
/// letters, digits, `.`, `_` and `-`, not starting with `.` or `-`, and not all hex digits
/// after an `id:` (names never start with `id:` since `:` is not allowed).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(['.', '-'])
}

/// One tenant: its name and its journals by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant's name.
    pub name: String,
    /// Its journals: name to journal id (the second half).
    pub journals: BTreeMap<String, u64>,
    /// In a cluster, F of `--survive machines=F` for the journals created in it without one
    /// ([`Command::ConfigureTenant`]); `None`: the cluster's default.
    pub survive: Option<u8>,
}

/// One journal: its name within its tenant and its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The journal's name within its tenant.
    pub name: String,
    /// Its state.
    pub state: JournalState,
    /// In a cluster, where its group was placed ([`Command::CreatePlaced`]); `None` on a
    /// single node, and for a journal created by [`Command::CreateJournal`] in a cluster (its
    /// voters follow from the members, docs/journals.md §9.5).
    pub placement: Option<Placement>,
}

/// Where a cluster placed a journal's group (docs/journals.md §9.5, §9.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// F of `--survive machines=F`, as last configured.
    pub survive: u8,
    /// The voters' node ids, ascending: 2F+1 of them, as last configured (the group moves to
    /// them by joint consensus).
    pub voters: Vec<u64>,
    /// The voters the group was created with: every copy of the group starts from them and
    /// replays the configuration changes in its log.
    pub initial: Vec<u64>,
}

/// The answer to one command of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The verdict of a journal call.
    Journal(Outcome),
    /// A tenant now exists under this id.
    TenantCreated {
        /// Its id.
        tenant: u64,
    },
    /// A journal now exists under this id.
    JournalCreated {
        /// Its id.
        journal: JournalId,
    },
    /// The name (or the id drawn for it) is taken; `existing` names the holder.
    NameTaken {
        /// The id that holds the name (for a tenant: journal half 0).
        existing: JournalId,
    },
    /// A name that breaks [`valid_name`].
    InvalidName,
    /// The tenant does not exist.
    UnknownTenant,
    /// The journal does not exist (or an id half is 0).
    UnknownJournal,
    /// The journal's new durability is recorded (a cluster's `configure`).
    Configured {
        /// The journal.
        journal: JournalId,
    },
    /// The journal and its records are gone; `view` was its last state.
    Deleted {
        /// Its last state.
        state: Box<JournalState>,
    },
}

/// Every tenant and journal of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Directory {
    tenants: BTreeMap<u64, Tenant>,
    tenant_names: HashMap<String, u64>,
    journals: BTreeMap<JournalId, Entry>,
    /// A cluster's members: node id to the incarnation of its data directory and the zone it
    /// last said it is in.
    members: BTreeMap<u64, (u64, Option<String>)>,
}

impl Directory {
    /// An empty directory.
    pub fn new() -> Directory {
        Directory::default()
    }

    /// The tenant with this id.
    pub fn tenant(&self, id: u64) -> Option<&Tenant> {
        self.tenants.get(&id)
    }

    /// The tenant with this name, and its id.
    pub fn tenant_named(&self, name: &str) -> Option<(u64, &Tenant)> {
        let id = *self.tenant_names.get(name)?;
        Some((id, &self.tenants[&id]))
    }

    /// Every tenant, by id.
    pub fn tenants(&self) -> impl Iterator<Item = (u64, &Tenant)> {
        self.tenants.iter().map(|(id, t)| (*id, t))
    }

    /// The journal with this id.
    pub fn journal(&self, id: JournalId) -> Option<&Entry> {
        self.journals.get(&id)
    }

    /// The journal `tenant/journal` by names.
    pub fn journal_named(&self, tenant: &str, journal: &str) -> Option<(JournalId, &Entry)> {
        let (t, ten) = self.tenant_named(tenant)?;
        let id = JournalId { tenant: t, journal: *ten.journals.get(journal)? };
        Some((id, self.journals.get(&id)?))
    }

    /// Every journal of a tenant, by name.
    pub fn journals_of(&self, tenant: u64) -> impl Iterator<Item = (JournalId, &Entry)> {
        self.tenants.get(&tenant).into_iter().flat_map(move |t| {
            t.journals.values().filter_map(move |&j| {
                let id = JournalId { tenant, journal: j };
                Some((id, self.journals.get(&id)?))
            })
        })
    }

    /// Judges one command of the log and applies it.
    ///
    /// # Panics
    /// As [`super::apply()`]: only on a broken invariant, a bug.
    /// Every journal, in id order.
    pub fn entries(&self) -> impl Iterator<Item = (JournalId, &Entry)> {
        self.journals.iter().map(|(id, e)| (*id, e))
    }

    /// Rebuilds a directory from its parts, as a checkpoint holds them (docs/journals.md §4.4):
    /// the tenants `(id, name)` and the journals `(id, entry)`.
    ///
    /// # Errors
    /// A sentence naming the first inconsistency: an id of 0, an invalid or repeated name, a
    /// repeated id, a journal of an unknown tenant, or a state that breaks its invariants
    /// ([`JournalState::validate`]).
    pub fn restore(tenants: Vec<(u64, String)>, journals: Vec<(JournalId, Entry)>) -> Result<Directory, String> {
        let mut d = Directory::new();
        for (id, name) in tenants {
            if !matches!(d.create_tenant(id, &name), Answer::TenantCreated { .. }) {
                return Err(format!("tenant {id:016x} ({name:?}) has id 0, an invalid name, or an id or name already used"));
            }
        }
        for (id, entry) in journals {
            let Entry { name, state, placement } = entry;
            state.validate().map_err(|e| format!("journal {id}: {e}"))?;
            if !matches!(d.create_journal(id, &name, state.mode, state.durability), Answer::JournalCreated { .. }) {
                return Err(format!("journal {id} ({name:?}) has an unknown tenant, a zero id, an invalid name, or an id or name already used"));
            }
            let e = d.journals.get_mut(&id).expect("just created");
            e.state = state;
            e.placement = placement;
        }
        Ok(d)
    }

    pub fn apply(&mut self, command: &Command<'_>) -> Answer {
        match command {
            Command::CreateTenant { tenant, name } => self.create_tenant(*tenant, name),
            Command::CreateJournal { journal, name, mode, durability } => self.create_journal(*journal, name, *mode, *durability),
            Command::CreatePlaced { journal, name, mode, durability, survive, voters } => {
                let answer = self.create_journal(*journal, name, *mode, *durability);
                if let (Answer::JournalCreated { .. }, Some(e)) = (&answer, self.journals.get_mut(journal)) {
                    e.placement = Some(Placement { survive: *survive, voters: voters.clone(), initial: voters.clone() });
                }
                answer
            }
            Command::DeleteJournal { journal } => self.delete_journal(*journal),
            Command::ReleaseName { journal } => self.release_name(*journal),
            Command::Join { node, incarnation } => {
                // The first incarnation seen for a node id stays.
                self.members.entry(*node).or_insert((*incarnation, None));
                Answer::Journal(Outcome::Noop)
            }
            Command::Configure { journal, survive, voters } => match self.journals.get_mut(journal) {
                Some(e) if journal.is_set() => {
                    match &mut e.placement {
                        Some(p) => {
                            p.survive = *survive;
                            p.voters = voters.clone();
                        }
                        None => return Answer::UnknownJournal,
                    }
                    Answer::Configured { journal: *journal }
                }
                _ => Answer::UnknownJournal,
            },
            Command::ConfigureTenant { tenant, name, survive } => {
                let id = match self.tenant_names.get(*name) {
                    Some(&id) => id,
                    None => match self.create_tenant(*tenant, name) {
                        Answer::TenantCreated { tenant } => tenant,
                        refused => return refused,
                    },
                };
                if let Some(t) = self.tenants.get_mut(&id) {
                    t.survive = Some(*survive);
                }
                Answer::Configured { journal: JournalId { tenant: id, journal: 0 } }
            }
            Command::JoinZone { node, incarnation, zone } => {
                // As Join; the zone follows what the recorded incarnation last said.
                let m = self.members.entry(*node).or_insert((*incarnation, None));
                if m.0 == *incarnation {
                    m.1 = Some((*zone).to_owned());
                }
                Answer::Journal(Outcome::Noop)
            }
            Command::Write { journal, leader, seq, records } => {
                let call = Call::Write {
                    leader: *leader,
                    seq: *seq,
                    count: u32::try_from(records.len()).unwrap_or(u32::MAX),
                    digest: digest_records(records.iter().copied()),
                };
                self.call(*journal, &call)
            }
            Command::SetLeader { journal, new, old } => self.call(*journal, &Call::SetLeader { new: *new, old: *old }),
            Command::Truncate { journal, leader, up_to } => self.call(*journal, &Call::Truncate { leader: *leader, up_to: *up_to }),
            Command::Noop { journal } => {
                if journal.tenant == 0 && journal.journal == 0 {
                    Answer::Journal(Outcome::Noop)
                } else {
                    self.call(*journal, &Call::Noop)
                }
            }
        }
    }

    /// Judges a journal call against its journal's state.
    pub fn call(&mut self, journal: JournalId, call: &Call) -> Answer {
        match self.journals.get_mut(&journal) {
            Some(e) if journal.is_set() => Answer::Journal(apply(&mut e.state, call)),
            _ => Answer::UnknownJournal,
        }
    }

    fn create_tenant(&mut self, tenant: u64, name: &str) -> Answer {
        if !valid_name(name) {
            return Answer::InvalidName;
        }
        if let Some(&existing) = self.tenant_names.get(name) {
            return Answer::NameTaken { existing: JournalId { tenant: existing, journal: 0 } };
        }
        if tenant == 0 || self.tenants.contains_key(&tenant) {
            // A drawn id that is 0 or already used: refused like a taken name, naming the holder.
            return Answer::NameTaken { existing: JournalId { tenant, journal: 0 } };
        }
        self.tenant_names.insert(name.to_owned(), tenant);
        self.tenants.insert(tenant, Tenant { name: name.to_owned(), journals: BTreeMap::new(), survive: None });
        Answer::TenantCreated { tenant }
    }

    fn create_journal(&mut self, journal: JournalId, name: &str, mode: Mode, durability: StoreDurability) -> Answer {
        if !valid_name(name) {
            return Answer::InvalidName;
        }
        let Some(t) = self.tenants.get_mut(&journal.tenant) else {
            return Answer::UnknownTenant;
        };
        if let Some(&existing) = t.journals.get(name) {
            return Answer::NameTaken { existing: JournalId { tenant: journal.tenant, journal: existing } };
        }
        if !journal.is_set() || t.journals.values().any(|&j| j == journal.journal) {
            return Answer::NameTaken { existing: journal };
        }
        t.journals.insert(name.to_owned(), journal.journal);
        self.journals.insert(journal, Entry { name: name.to_owned(), state: JournalState::new(mode, durability), placement: None });
        Answer::JournalCreated { journal }
    }

    /// Replaces journal `journal`'s state with one from a snapshot of its group (docs/journals.md
    /// §9.9); `false` when the directory holds no such journal.
    pub fn restore_state(&mut self, journal: JournalId, state: JournalState) -> bool {
        match self.journals.get_mut(&journal) {
            Some(e) => {
                e.state = state;
                true
            }
            None => false,
        }
    }

    /// A cluster's deletion in the journal's own group (docs/journals.md §9.5): the journal's
    /// state goes, so every later call of that group is answered `UnknownJournal` alike on every
    /// node; its name stays taken until the directory group applies
    /// [`Command::ReleaseName`], so the directory's verdicts never depend on when a node
    /// applied the deletion.
    pub fn drop_journal(&mut self, journal: JournalId) -> Answer {
        match self.journals.remove(&journal) {
            Some(e) => Answer::Deleted { state: Box::new(e.state) },
            None => Answer::UnknownJournal,
        }
    }

    /// The zone cluster member `node` last said it is in, if it joined with one.
    pub fn zone(&self, node: u64) -> Option<&str> {
        self.members.get(&node).and_then(|m| m.1.as_deref())
    }

    /// The incarnation recorded for cluster member `node`, if it joined.
    pub fn member(&self, node: u64) -> Option<u64> {
        self.members.get(&node).map(|m| m.0)
    }

    /// Every member that joined: its node id and the incarnation recorded for it, by id.
    pub fn members(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.members.iter().map(|(&node, m)| (node, m.0))
    }

    /// The names whose journal is gone (deleted in its group, name not yet released).
    pub fn names_to_release(&self) -> Vec<JournalId> {
        self.tenants
            .iter()
            .flat_map(|(&tenant, t)| t.journals.values().map(move |&journal| JournalId { tenant, journal }))
            .filter(|id| !self.journals.contains_key(id))
            .collect()
    }

    /// The directory group's step of a cluster's deletion: the journal's name is free again.
    /// It looks at names only, never at the journal's state (which each node drops when its
    /// copy of the journal's group applies the deletion), so every node answers it alike;
    /// `UnknownJournal` when no name maps to the journal.
    fn release_name(&mut self, journal: JournalId) -> Answer {
        let Some(t) = self.tenants.get_mut(&journal.tenant) else { return Answer::UnknownJournal };
        let before = t.journals.len();
        t.journals.retain(|_, j| *j != journal.journal);
        if t.journals.len() == before {
            return Answer::UnknownJournal;
        }
        Answer::Journal(super::apply::Outcome::Noop)
    }

    fn delete_journal(&mut self, journal: JournalId) -> Answer {
        let Some(e) = self.journals.remove(&journal) else {
            return Answer::UnknownJournal;
        };
        if let Some(t) = self.tenants.get_mut(&journal.tenant) {
            t.journals.remove(&e.name);
        }
        Answer::Deleted { state: Box::new(e.state) }
    }
}
