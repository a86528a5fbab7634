//! The command codec: how one journal command is laid out as the payload of one data record
//! of the command log. Pure over bytes.
//!
//! Layout (little-endian; docs/journals.md §4.2):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | format version, 1 |
//! | 1 | 1 | kind ([`Kind`]) |
//! | 2 | 6 | reserved, zero |
//! | 8 | 8 | consensus term of the entry (0 on a single node) |
//! | 16 | 8 | consensus index of the entry (0 on a single node) |
//! | 24 | 8 | tenant id |
//! | 32 | 8 | journal id (0 for tenant commands) |
//! | 40 | .. | body, by kind |
//!
//! Bodies: Write `leader u128 | seq u64 | count u32 | count × (len u32 | bytes)`; SetLeader
//! `new u128 | old u128`; Truncate `leader u128 | up_to u64`; Noop, DeleteJournal and
//! ReleaseName empty; Join `incarnation u64` (the node id in the tenant field);
//! CreateTenant `name_len u16 | name`; CreateJournal `mode u8 | durability u8 | name_len u16 |
//! name`; CreatePlaced (a cluster's create) `mode u8 | durability u8 | survive u8 | count u8 |
//! count × voter u64 | name_len u16 | name`; JoinZone `incarnation u64 | zone_len u16 | zone`;
//! Configure `survive u8 | count u8 | count × voter u64`; ConfigureTenant `survive u8 |
//! name_len u16 | name` (the tenant id in the head).
//! A uuid of 0 is "none".

use super::model::{JournalId, LeaderUuid, Mode, Seq, StoreDurability};

/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before a command's body.
pub const COMMAND_HEAD: usize = 40;

/// The kind byte of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A write of records.
    Write = 1,
    /// A leader compare-and-set.
    SetLeader = 2,
    /// A truncation.
    Truncate = 3,
    /// Nothing (consensus no-ops).
    Noop = 4,
    /// A new tenant and its name.
    CreateTenant = 16,
    /// A new journal, its name, mode and store durability.
    CreateJournal = 17,
    /// The end of a journal.
    DeleteJournal = 18,
    /// A cluster's second step of a deletion: the name is free.
    ReleaseName = 19,
    /// A cluster member's data directory.
    Join = 20,
    /// A cluster's new journal, with the machines it survives and its voters.
    CreatePlaced = 21,
    /// A cluster member's data directory and its zone.
    JoinZone = 22,
    /// A cluster journal's new durability and the voters it moves to.
    Configure = 23,
    /// A tenant's default durability for the journals created in it later (the tenant is
    /// created with it if new).
    ConfigureTenant = 24,
}

impl Kind {
    /// Every kind, for decoding.
    const ALL: [Kind; 13] = [
        Kind::Write,
        Kind::SetLeader,
        Kind::Truncate,
        Kind::Noop,
        Kind::CreateTenant,
        Kind::CreateJournal,
        Kind::DeleteJournal,
        Kind::ReleaseName,
        Kind::Join,
        Kind::CreatePlaced,
        Kind::JoinZone,
        Kind::Configure,
        Kind::ConfigureTenant,
    ];

    fn from_u8(b: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == b)
    }
}

/// Where a command sits in a consensus group's log; both 0 on a single node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EntryId {
    /// The consensus term the entry was proposed in.
    pub term: u64,
    /// The entry's index in its group's log.
    pub index: u64,
}

/// One command, borrowing its records and names from the buffer it was decoded from (or the
/// request it was built from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// A write; `leader` is `None` for the multi-writer shape.
    Write {
        /// The journal.
        journal: JournalId,
        /// The writer's uuid, or `None`.
        leader: Option<LeaderUuid>,
        /// The position of the first record (single-writer shape; 0 otherwise).
        seq: Seq,
        /// The records, each opaque bytes.
        records: Vec<&'a [u8]>,
    },
    /// `SetLeader(new, old)`.
    SetLeader {
        /// The journal.
        journal: JournalId,
        /// The uuid that wants to lead.
        new: LeaderUuid,
        /// The leader it replaces, or `None`.
        old: Option<LeaderUuid>,
    },
    /// `Truncate(up_to)`.
    Truncate {
        /// The journal.
        journal: JournalId,
        /// The leader's uuid, or `None` for the multi-writer shape.
        leader: Option<LeaderUuid>,
        /// The first seq to keep.
        up_to: Seq,
    },
    /// Nothing, for the given journal (or the directory, with a zero id).
    Noop {
        /// The journal, or zeros.
        journal: JournalId,
    },
    /// A new tenant.
    CreateTenant {
        /// Its id (random, non-zero).
        tenant: u64,
        /// Its name.
        name: &'a str,
    },
    /// A new journal.
    CreateJournal {
        /// Its id (both halves non-zero; the tenant exists).
        journal: JournalId,
        /// Its name within the tenant.
        name: &'a str,
        /// Its writer mode.
        mode: Mode,
        /// Its store durability.
        durability: StoreDurability,
    },
    /// The end of a journal: its records and name are dropped (in a cluster, its records:
    /// the name follows with [`Command::ReleaseName`]).
    DeleteJournal {
        /// The journal.
        journal: JournalId,
    },
    /// A cluster's second step of a deletion, in the directory group: the deleted journal's
    /// name is free again (docs/journals.md §9.5).
    ReleaseName {
        /// The journal.
        journal: JournalId,
    },
    /// A cluster member's data directory, recorded in the directory group the first time the
    /// node is seen: a node whose directory was lost finds another incarnation recorded for
    /// its id and stops (docs/journals.md §9.6).
    Join {
        /// The node id.
        node: u64,
        /// The data directory's incarnation, drawn when it was made.
        incarnation: u64,
    },
    /// A cluster's new journal (docs/journals.md §9.5): as [`Command::CreateJournal`], with
    /// the machine failures it survives and the voters the cluster placed its group on, so
    /// every node starts the same group whatever members it knows.
    CreatePlaced {
        /// Its id (both halves non-zero; the tenant exists).
        journal: JournalId,
        /// Its name within the tenant.
        name: &'a str,
        /// Its writer mode.
        mode: Mode,
        /// Its store durability.
        durability: StoreDurability,
        /// F of `--survive machines=F`: the group has 2F+1 voters.
        survive: u8,
        /// The voters' node ids, ascending (at most 255).
        voters: Vec<u64>,
    },
    /// A cluster journal's new `--survive machines=F` and the voters its group moves to
    /// (docs/journals.md §9.8): the directory records them; the group's leader then changes
    /// the group's configuration by joint consensus.
    Configure {
        /// The journal.
        journal: JournalId,
        /// F of `--survive machines=F`.
        survive: u8,
        /// The voters' node ids, ascending (at most 255).
        voters: Vec<u64>,
    },
    /// A tenant's default `--survive machines=F` (docs/journals.md §9.8): journals created in
    /// it later without an F of their own get this one. A tenant of that name that does not
    /// exist yet is created with `tenant` as its id.
    ConfigureTenant {
        /// The id the tenant gets if it is new (an existing tenant keeps its own).
        tenant: u64,
        /// The tenant's name.
        name: &'a str,
        /// F of `--survive machines=F`.
        survive: u8,
    },
    /// As [`Command::Join`], with the node's zone: the directory keeps the zone a member last
    /// said it is in, for placing voters across zones.
    JoinZone {
        /// The node id.
        node: u64,
        /// The data directory's incarnation.
        incarnation: u64,
        /// The node's zone.
        zone: &'a str,
    },
}

/// Why a command payload did not decode. Each names what was wrong, so that a refused
/// command log says where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The payload ended before the field named.
    #[error("journal command ends inside its {0}")]
    Short(&'static str),
    /// A format version this code does not read.
    #[error("journal command has format version {0}, this server reads version {VERSION}")]
    Version(u8),
    /// An unknown kind byte.
    #[error("journal command has unknown kind {0}")]
    UnknownKind(u8),
    /// Reserved bytes that are not zero.
    #[error("journal command has non-zero reserved bytes")]
    Reserved,
    /// Bytes after the body.
    #[error("journal command has {0} bytes after its body")]
    Trailing(usize),
    /// A name that is not UTF-8.
    #[error("journal command holds a name that is not UTF-8")]
    NameNotUtf8,
    /// An unknown mode or durability byte.
    #[error("journal command has unknown {0} byte {1}")]
    UnknownEnum(&'static str, u8),
}

impl Command<'_> {
    /// The command's kind byte.
    pub fn kind(&self) -> Kind {
        match self {
            Command::Write { .. } => Kind::Write,
            Command::SetLeader { .. } => Kind::SetLeader,
            Command::Truncate { .. } => Kind::Truncate,
            Command::Noop { .. } => Kind::Noop,
            Command::CreateTenant { .. } => Kind::CreateTenant,
            Command::CreateJournal { .. } => Kind::CreateJournal,
            Command::DeleteJournal { .. } => Kind::DeleteJournal,
            Command::ReleaseName { .. } => Kind::ReleaseName,
            Command::Join { .. } => Kind::Join,
            Command::CreatePlaced { .. } => Kind::CreatePlaced,
            Command::JoinZone { .. } => Kind::JoinZone,
            Command::Configure { .. } => Kind::Configure,
            Command::ConfigureTenant { .. } => Kind::ConfigureTenant,
        }
    }

    /// The `(tenant, journal)` the command is about (journal 0 for a tenant command).
    pub fn target(&self) -> JournalId {
        match *self {
            Command::Write { journal, .. }
            | Command::SetLeader { journal, .. }
            | Command::Truncate { journal, .. }
            | Command::Noop { journal }
            | Command::CreateJournal { journal, .. }
            | Command::CreatePlaced { journal, .. }
            | Command::Configure { journal, .. }
            | Command::DeleteJournal { journal }
            | Command::ReleaseName { journal } => journal,
            Command::CreateTenant { tenant, .. } | Command::ConfigureTenant { tenant, .. } => JournalId { tenant, journal: 0 },
            Command::Join { node, .. } | Command::JoinZone { node, .. } => JournalId { tenant: node, journal: 0 },
        }
    }

    /// The encoded size in bytes, for sizing buffers and limits.
    pub fn encoded_len(&self) -> usize {
        COMMAND_HEAD
            + match self {
                Command::Write { records, .. } => 28 + records.iter().map(|r| 4 + r.len()).sum::<usize>(),
                Command::SetLeader { .. } => 32,
                Command::Truncate { .. } => 24,
                Command::Noop { .. } | Command::DeleteJournal { .. } | Command::ReleaseName { .. } => 0,
                Command::CreateTenant { name, .. } => 2 + name.len(),
                Command::Join { .. } => 8,
                Command::CreateJournal { name, .. } => 4 + name.len(),
                Command::CreatePlaced { name, voters, .. } => 6 + 8 * voters.len() + name.len(),
                Command::JoinZone { zone, .. } => 10 + zone.len(),
                Command::Configure { voters, .. } => 2 + 8 * voters.len(),
                Command::ConfigureTenant { name, .. } => 3 + name.len(),
            }
    }

    /// Appends the command, at `entry`, to `out`.
    ///
    /// # Panics
    /// When a name is longer than 65,535 bytes or a record longer than `u32::MAX` bytes: the
    /// edge refuses both long before (names are at most 255 bytes, writes at most the batch
    /// byte limit).
    pub fn encode(&self, entry: EntryId, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.push(VERSION);
        out.push(self.kind() as u8);
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&entry.term.to_le_bytes());
        out.extend_from_slice(&entry.index.to_le_bytes());
        let target = self.target();
        out.extend_from_slice(&target.tenant.to_le_bytes());
        out.extend_from_slice(&target.journal.to_le_bytes());
        let uuid = |u: Option<LeaderUuid>| u.unwrap_or(LeaderUuid::NONE).0.to_le_bytes();
        let name = |n: &str, out: &mut Vec<u8>| {
            out.extend_from_slice(&u16::try_from(n.len()).expect("name over 65,535 bytes").to_le_bytes());
            out.extend_from_slice(n.as_bytes());
        };
        match self {
            Command::Write { leader, seq, records, .. } => {
                out.extend_from_slice(&uuid(*leader));
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&(records.len() as u32).to_le_bytes());
                for r in records {
                    out.extend_from_slice(&u32::try_from(r.len()).expect("record over 4 GiB").to_le_bytes());
                    out.extend_from_slice(r);
                }
            }
            Command::SetLeader { new, old, .. } => {
                out.extend_from_slice(&new.0.to_le_bytes());
                out.extend_from_slice(&uuid(*old));
            }
            Command::Truncate { leader, up_to, .. } => {
                out.extend_from_slice(&uuid(*leader));
                out.extend_from_slice(&up_to.to_le_bytes());
            }
            Command::Noop { .. } | Command::DeleteJournal { .. } | Command::ReleaseName { .. } => {}
            Command::CreateTenant { name: n, .. } => name(n, out),
            Command::Join { incarnation, .. } => out.extend_from_slice(&incarnation.to_le_bytes()),
            Command::CreateJournal { name: n, mode, durability, .. } => {
                out.push(mode_byte(*mode));
                out.push(durability_byte(*durability));
                name(n, out);
            }
            Command::CreatePlaced { name: n, mode, durability, survive, voters, .. } => {
                out.push(mode_byte(*mode));
                out.push(durability_byte(*durability));
                out.push(*survive);
                out.push(u8::try_from(voters.len()).expect("over 255 voters"));
                for v in voters {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                name(n, out);
            }
            Command::JoinZone { incarnation, zone, .. } => {
                out.extend_from_slice(&incarnation.to_le_bytes());
                name(zone, out);
            }
            Command::Configure { survive, voters, .. } => {
                out.push(*survive);
                out.push(u8::try_from(voters.len()).expect("over 255 voters"));
                for v in voters {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Command::ConfigureTenant { name: n, survive, .. } => {
                out.push(*survive);
                name(n, out);
            }
        }
    }
}

/// A mode's byte in the command log and its checkpoints and snapshots: 0 single, 1 multi.
pub(crate) fn mode_byte(mode: Mode) -> u8 {
    match mode {
        Mode::Single => 0,
        Mode::Multi => 1,
    }
}

/// A store durability's byte in the command log and its checkpoints and snapshots: 0 ordered,
/// 1 batched.
pub(crate) fn durability_byte(durability: StoreDurability) -> u8 {
    match durability {
        StoreDurability::Ordered => 0,
        StoreDurability::Batched => 1,
    }
}

/// Reads fields off the front of a payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CommandError> {
        if self.0.len() < n {
            return Err(CommandError::Short(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, CommandError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, CommandError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, CommandError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, CommandError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn uuid(&mut self, what: &'static str) -> Result<LeaderUuid, CommandError> {
        Ok(LeaderUuid(u128::from_le_bytes(self.take(16, what)?.try_into().unwrap())))
    }
    fn mode(&mut self) -> Result<Mode, CommandError> {
        match self.u8("mode")? {
            0 => Ok(Mode::Single),
            1 => Ok(Mode::Multi),
            b => Err(CommandError::UnknownEnum("mode", b)),
        }
    }
    fn durability(&mut self) -> Result<StoreDurability, CommandError> {
        match self.u8("store durability")? {
            0 => Ok(StoreDurability::Ordered),
            1 => Ok(StoreDurability::Batched),
            b => Err(CommandError::UnknownEnum("store durability", b)),
        }
    }
    fn name(&mut self) -> Result<&'a str, CommandError> {
        let n = self.u16("name length")? as usize;
        std::str::from_utf8(self.take(n, "name")?).map_err(|_| CommandError::NameNotUtf8)
    }
}

/// Decodes one command payload: the entry id and the command, borrowing from `payload`.
///
/// # Errors
/// [`CommandError`] for a short payload, an unknown version or kind, non-zero reserved
/// bytes, a name that is not UTF-8, an unknown mode or durability, or trailing bytes.
pub fn decode(payload: &[u8]) -> Result<(EntryId, Command<'_>), CommandError> {
    let mut r = Reader(payload);
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(CommandError::Version(version));
    }
    let kind_byte = r.u8("kind")?;
    let kind = Kind::from_u8(kind_byte).ok_or(CommandError::UnknownKind(kind_byte))?;
    if r.take(6, "reserved bytes")?.iter().any(|&b| b != 0) {
        return Err(CommandError::Reserved);
    }
    let entry = EntryId { term: r.u64("term")?, index: r.u64("index")? };
    let journal = JournalId { tenant: r.u64("tenant id")?, journal: r.u64("journal id")? };
    let command = match kind {
        Kind::Write => {
            let leader = r.uuid("leader uuid")?.set();
            let seq = r.u64("seq")?;
            let count = r.u32("record count")? as usize;
            // Each record costs at least its 4-byte length: bound the allocation by the bytes.
            let mut records = Vec::with_capacity(count.min(r.0.len() / 4));
            for _ in 0..count {
                let len = r.u32("record length")? as usize;
                records.push(r.take(len, "record")?);
            }
            Command::Write { journal, leader, seq, records }
        }
        Kind::SetLeader => Command::SetLeader { journal, new: r.uuid("new uuid")?, old: r.uuid("old uuid")?.set() },
        Kind::Truncate => Command::Truncate { journal, leader: r.uuid("leader uuid")?.set(), up_to: r.u64("up_to")? },
        Kind::Noop => Command::Noop { journal },
        Kind::DeleteJournal => Command::DeleteJournal { journal },
        Kind::ReleaseName => Command::ReleaseName { journal },
        Kind::CreateTenant => Command::CreateTenant { tenant: journal.tenant, name: r.name()? },
        Kind::Join => Command::Join { node: journal.tenant, incarnation: r.u64("incarnation")? },
        Kind::CreateJournal => {
            let (mode, durability) = (r.mode()?, r.durability()?);
            Command::CreateJournal { journal, name: r.name()?, mode, durability }
        }
        Kind::CreatePlaced => {
            let (mode, durability, survive) = (r.mode()?, r.durability()?, r.u8("survive")?);
            let count = r.u8("voter count")? as usize;
            let voters = (0..count).map(|_| r.u64("voter")).collect::<Result<Vec<u64>, _>>()?;
            Command::CreatePlaced { journal, name: r.name()?, mode, durability, survive, voters }
        }
        Kind::Configure => {
            let survive = r.u8("survive")?;
            let count = r.u8("voter count")? as usize;
            let voters = (0..count).map(|_| r.u64("voter")).collect::<Result<Vec<u64>, _>>()?;
            Command::Configure { journal, survive, voters }
        }
        Kind::ConfigureTenant => {
            let survive = r.u8("survive")?;
            Command::ConfigureTenant { tenant: journal.tenant, name: r.name()?, survive }
        }
        Kind::JoinZone => Command::JoinZone { node: journal.tenant, incarnation: r.u64("incarnation")?, zone: r.name()? },
    };
    if !r.0.is_empty() {
        return Err(CommandError::Trailing(r.0.len()));
    }
    Ok((entry, command))
}
