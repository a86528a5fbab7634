//! How the replica's durable items lie in the node's command log: one record payload each, in
//! the journal command layout, so every group on a node shares the node's log and its group
//! commit. Pure over bytes.
//!
//! | item | payload |
//! |---|---|
//! | an entry carrying a command | the command, with the entry's term and index in its head (bytes 8..24) |
//! | a new leader's empty entry | a Noop command for the group, with the entry's term and index |
//! | a hard state | kind 6, the group in the head, then `term u64`, `vote u64`, `commit u64` |
//! | a configuration change entry | kind 7, the entry's term and index and the group in the head, then raft's `ConfChangeV2`, protobuf-encoded (empty: leave the joint configuration) |
//! | a snapshot | kind 8, the snapshot's term and index and the group in the head, then `conf_len u32`, raft's `ConfState` protobuf-encoded (`conf_len` bytes), then the snapshot data ([`super::snapshot`]) |
//!
//! A command's group follows from its kind: directory commands (create tenant, create journal,
//! release a deleted journal's name, joins, configure a journal or a tenant's default) and a
//! Noop for `(0, 0)` belong to the directory group
//! [`DIRECTORY`]; the others, a deletion included, to the journal they name. Source: docs/journals.md §9.3.

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};

use super::replica::Durable;
use crate::journal::command::{decode as decode_command, Command, CommandError, EntryId, Kind, COMMAND_HEAD, VERSION};
use crate::journal::JournalId;

/// The group of the directory: tenants, journal names and placement.
pub const DIRECTORY: JournalId = JournalId { tenant: 0, journal: 0 };

/// The kind byte of a hard-state record.
pub const HARD_STATE: u8 = 6;

/// The kind byte of a configuration change entry's record.
pub const CONF_CHANGE: u8 = 7;

/// The kind byte of a snapshot's record.
pub const SNAPSHOT: u8 = 8;

/// Bytes of a hard-state record's payload.
pub const HARD_STATE_LEN: usize = COMMAND_HEAD + 24;

/// Why a durable item could not be laid out or read back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurableError {
    /// An entry's data is not a journal command (the proposer and the peer transport let
    /// only commands through, so this is a bug or a misbehaving peer).
    #[error("entry {index} of group {group} does not hold a journal command: {source}")]
    NotACommand {
        /// The group.
        group: JournalId,
        /// The entry's index.
        index: u64,
        /// What was wrong.
        source: CommandError,
    },
    /// An entry's command belongs to another group.
    #[error("entry {index} of group {group} holds a command of group {found}")]
    WrongGroup {
        /// The group.
        group: JournalId,
        /// The entry's index.
        index: u64,
        /// The command's group.
        found: JournalId,
    },
    /// An entry kind that is not logged yet (configuration changes).
    #[error("entry {index} of group {group} is a {kind:?}, which is not logged yet")]
    Unsupported {
        /// The group.
        group: JournalId,
        /// The entry's index.
        index: u64,
        /// Its type.
        kind: EntryType,
    },
    /// A configuration change entry whose change does not decode.
    #[error("entry {index} of group {group}: configuration change does not decode: {why}")]
    BadConfChange {
        /// The group.
        group: JournalId,
        /// The entry's index.
        index: u64,
        /// The decoder's words.
        why: String,
    },
    /// A configuration change record that is short, of an unknown version, or with non-zero
    /// reserved bytes.
    #[error("configuration change record: short, unknown version or non-zero reserved bytes")]
    ConfRecord,
    /// A snapshot record that is short, of an unknown version, with non-zero reserved bytes, a
    /// configuration that does not decode, or data that does not decode.
    #[error("snapshot record: {0}")]
    SnapshotRecord(String),
    /// A payload that is not a durable item.
    #[error("durable item: {0}")]
    Payload(#[from] CommandError),
    /// A hard-state record of the wrong length, version or reserved bytes.
    #[error("hard-state record: {0}")]
    HardState(&'static str),
}

/// The group a command belongs to.
pub fn group_of(command: &Command<'_>) -> JournalId {
    match command.kind() {
        Kind::CreateTenant
        | Kind::CreateJournal
        | Kind::CreatePlaced
        | Kind::ReleaseName
        | Kind::Join
        | Kind::JoinZone
        | Kind::Configure
        | Kind::ConfigureTenant => DIRECTORY,
        _ => command.target(),
    }
}

/// Appends the payload of `item` to `out`.
///
/// # Errors
/// [`DurableError`] for an entry that holds no command of its group, or a configuration
/// change; nothing is appended then.
pub fn encode(item: &Durable, out: &mut Vec<u8>) -> Result<(), DurableError> {
    match item {
        Durable::HardState { journal, state } => {
            out.reserve(HARD_STATE_LEN);
            out.extend_from_slice(&[VERSION, HARD_STATE, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&[0; 16]);
            out.extend_from_slice(&journal.tenant.to_le_bytes());
            out.extend_from_slice(&journal.journal.to_le_bytes());
            for v in [state.term, state.vote, state.commit] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            Ok(())
        }
        Durable::Snapshot { journal, snapshot } => {
            let meta = snapshot.get_metadata();
            out.extend_from_slice(&[VERSION, SNAPSHOT, 0, 0, 0, 0, 0, 0]);
            for v in [meta.term, meta.index, journal.tenant, journal.journal] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            let conf = prost_011::Message::encode_to_vec(meta.get_conf_state());
            out.extend_from_slice(&(conf.len() as u32).to_le_bytes());
            out.extend_from_slice(&conf);
            out.extend_from_slice(&snapshot.data);
            Ok(())
        }
        Durable::Entry { journal, entry } => {
            check_entry(*journal, entry)?;
            let id = EntryId { term: entry.term, index: entry.index };
            if entry.get_entry_type() == EntryType::EntryConfChangeV2 {
                out.extend_from_slice(&[VERSION, CONF_CHANGE, 0, 0, 0, 0, 0, 0]);
                for v in [id.term, id.index, journal.tenant, journal.journal] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&entry.data);
                return Ok(());
            }
            if entry.data.is_empty() {
                Command::Noop { journal: *journal }.encode(id, out);
                return Ok(());
            }
            let start = out.len();
            out.extend_from_slice(&entry.data);
            out[start + 8..start + 16].copy_from_slice(&id.term.to_le_bytes());
            out[start + 16..start + 24].copy_from_slice(&id.index.to_le_bytes());
            Ok(())
        }
    }
}

/// Checks that `entry` can be logged for `group`: a normal entry, empty or holding a journal
/// command of that group. The peer transport checks every entry it is sent with it, so a
/// misbehaving peer's entry is refused before it reaches consensus.
///
/// # Errors
/// [`DurableError::Unsupported`], [`DurableError::NotACommand`] or [`DurableError::WrongGroup`].
pub fn check_entry(group: JournalId, entry: &Entry) -> Result<(), DurableError> {
    let index = entry.index;
    let kind = entry.get_entry_type();
    if kind == EntryType::EntryConfChangeV2 && group != DIRECTORY {
        return conf_change(&entry.data).map(|_| ()).map_err(|why| DurableError::BadConfChange { group, index, why });
    }
    if kind != EntryType::EntryNormal {
        return Err(DurableError::Unsupported { group, index, kind });
    }
    if entry.data.is_empty() {
        return Ok(());
    }
    let (_, cmd) = decode_command(&entry.data).map_err(|source| DurableError::NotACommand { group, index, source })?;
    let found = group_of(&cmd);
    if found != group {
        return Err(DurableError::WrongGroup { group, index, found });
    }
    Ok(())
}

/// Reads a payload written by [`encode`] back.
///
/// # Errors
/// [`DurableError`] naming what was wrong.
pub fn decode(payload: &[u8]) -> Result<Durable, DurableError> {
    if payload.get(1) == Some(&HARD_STATE) {
        if payload.len() != HARD_STATE_LEN {
            return Err(DurableError::HardState("wrong length"));
        }
        if payload[0] != VERSION {
            return Err(DurableError::HardState("unknown version"));
        }
        if payload[2..24].iter().any(|&b| b != 0) {
            return Err(DurableError::HardState("non-zero reserved bytes"));
        }
        let u = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
        let journal = JournalId { tenant: u(24), journal: u(32) };
        let state = HardState { term: u(40), vote: u(48), commit: u(56) };
        return Ok(Durable::HardState { journal, state });
    }
    if payload.get(1) == Some(&CONF_CHANGE) {
        if payload.len() < COMMAND_HEAD || payload[0] != VERSION || payload[2..8].iter().any(|&b| b != 0) {
            return Err(DurableError::ConfRecord);
        }
        let u = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
        let journal = JournalId { tenant: u(24), journal: u(32) };
        let entry =
            Entry { entry_type: EntryType::EntryConfChangeV2 as i32, term: u(8), index: u(16), data: payload[COMMAND_HEAD..].to_vec(), ..Entry::default() };
        check_entry(journal, &entry)?;
        return Ok(Durable::Entry { journal, entry });
    }
    if payload.get(1) == Some(&SNAPSHOT) {
        return decode_snapshot(payload);
    }
    let (id, cmd) = decode_command(payload)?;
    let journal = group_of(&cmd);
    let data = if matches!(cmd, Command::Noop { .. }) { Vec::new() } else { payload.to_vec() };
    let entry = Entry { entry_type: EntryType::EntryNormal as i32, term: id.term, index: id.index, data, ..Entry::default() };
    Ok(Durable::Entry { journal, entry })
}

/// Reads a snapshot record (kind 8) back, checking its data decodes.
fn decode_snapshot(payload: &[u8]) -> Result<Durable, DurableError> {
    let bad = |why: &str| DurableError::SnapshotRecord(why.to_owned());
    if payload.len() < COMMAND_HEAD + 4 || payload[0] != VERSION || payload[2..8].iter().any(|&b| b != 0) {
        return Err(bad("short, unknown version or non-zero reserved bytes"));
    }
    let u = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap());
    let journal = JournalId { tenant: u(24), journal: u(32) };
    let conf_len = u32::from_le_bytes(payload[COMMAND_HEAD..COMMAND_HEAD + 4].try_into().unwrap()) as usize;
    let rest = &payload[COMMAND_HEAD + 4..];
    if rest.len() < conf_len {
        return Err(bad("its configuration is cut short"));
    }
    let conf = <ConfState as prost_011::Message>::decode(&rest[..conf_len]).map_err(|e| bad(&format!("configuration: {e}")))?;
    let data = rest[conf_len..].to_vec();
    super::snapshot::decode(&data).map_err(|e| bad(&e.to_string()))?;
    let mut snapshot = Snapshot { data, ..Snapshot::default() };
    let meta = snapshot.mut_metadata();
    meta.term = u(8);
    meta.index = u(16);
    meta.set_conf_state(conf);
    Ok(Durable::Snapshot { journal, snapshot })
}

/// Decodes a configuration change entry's data (raft's `ConfChangeV2`, protobuf; empty is the
/// change that leaves a joint configuration).
///
/// # Errors
/// The decoder's words.
pub fn conf_change(data: &[u8]) -> Result<raft::eraftpb::ConfChangeV2, String> {
    <raft::eraftpb::ConfChangeV2 as prost_011::Message>::decode(data).map_err(|e| e.to_string())
}
