//! The blocking journal client: typed answers to the journal calls, the settling of an
//! ambiguous write, and a writer session.
//!
//! [`Journals`] talks to a list of servers (one today; replication adds more) over the same
//! connection, Hello, TLS and token as [`Client`]. Every call returns a typed outcome; a call
//! whose request went out but whose answer never came back is `Ambiguous`, a result and never
//! "not done". Errors ([`JournalError`]) are kept for what is no answer to the call at all: no
//! server reachable, a malformed call, a server that cannot judge calls now, an answer this
//! client does not understand.
//!
//! | call | outcome |
//! |---|---|
//! | [`Journals::create`] | [`CreateOutcome`] |
//! | [`Journals::delete`] | [`DeleteOutcome`] |
//! | [`Journals::list`] | [`ListOutcome`] |
//! | [`Journals::write_single`], [`Journals::write_multi`] | [`WriteOutcome`] |
//! | [`Journals::resolve`] (an ambiguous single-writer write) | [`Resolution`] |
//! | [`Journals::read`] | [`ReadOutcome`] |
//! | [`Journals::set_leader`] | [`SetLeaderOutcome`] |
//! | [`Journals::truncate`] | [`TruncateOutcome`] |
//! | [`JournalWriter::claim`] | [`ClaimOutcome`] |
//! | [`JournalWriter::write`] | [`WriterOutcome`] |
//!
//! The decisions (how an answer maps to an outcome, how an ambiguous write is settled) are
//! pure functions of the answers, so they are tested without a server.
//!
//! The calls themselves (what is sent again and when, settling, the writer session) are
//! written once, in `calls`, over a transport: [`Journals`] runs them blocking, and the async
//! client's [`AsyncJournals`](crate::client::async_client::AsyncJournals) awaits them.
//!
//! Source: docs/journals.md §8; the wire is docs/journals.md §6, the verdicts docs/journals.md §2.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future::block_on;

use self::calls::{Exchange, Policy, Session, Transport};
use super::async_client::AsyncJournalsConfig;
use super::{Client, ClientError};
use crate::journal::{valid_name, JournalId, LeaderUuid, Mode, Seq, StoreDurability, View};
use crate::proto::journal::{self as wire, journal_request::Call, JournalOutcome, JournalResponse};
use crate::proto::{request, response, ErrorCode};

pub(crate) mod calls;

// ---------------------------------------------------------------------------------------
// Leader uuids.

/// A fresh leader uuid: 128 random bits from the operating system's source (two version-4
/// uuids, one turned by 64 bits, so that no bit is fixed), never 0. Draw one for each
/// leadership term (docs/journals.md §1.1).
pub fn fresh_leader() -> LeaderUuid {
    loop {
        let a = uuid::Uuid::new_v4().as_u128();
        let b = uuid::Uuid::new_v4().as_u128();
        let v = a ^ b.rotate_left(64);
        if v != 0 {
            return LeaderUuid(v);
        }
    }
}

/// Why a leader uuid did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UuidError {
    /// Nothing was given.
    #[error("a leader uuid is 1 to 32 hex digits; got nothing")]
    Empty,
    /// More than 32 hex digits.
    #[error("a leader uuid is at most 32 hex digits (128 bits); got {0}")]
    TooLong(usize),
    /// A character that is not a hex digit (nor a dash of the 8-4-4-4-12 form).
    #[error("a leader uuid is hex digits (0-9, a-f), optionally as 8-4-4-4-12 with dashes; {0:?} is not")]
    NotHex(String),
}

/// Parses a leader uuid written in hex: 1 to 32 hex digits (`7`, `0x7`,
/// `1f3a...`), either case, or the dashed 8-4-4-4-12 form of a uuid. The unset uuid `0` parses
/// (a caller that needs a leader refuses it). [`LeaderUuid`]'s `Display` (lower-case hex, no
/// leading zeros) parses back to the same value.
///
/// # Errors
/// [`UuidError`]: empty text, more than 32 digits, or a character that is not a hex digit.
pub fn parse_leader(text: &str) -> Result<LeaderUuid, UuidError> {
    let t = text.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    let dashed = t.len() == 36 && t.split('-').map(str::len).eq([8, 4, 4, 4, 12]);
    let digits: String = if dashed { t.chars().filter(|&c| c != '-').collect() } else { t.to_owned() };
    if digits.is_empty() {
        return Err(UuidError::Empty);
    }
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(UuidError::NotHex(text.to_owned()));
    }
    if digits.len() > 32 {
        return Err(UuidError::TooLong(digits.len()));
    }
    u128::from_str_radix(&digits, 16).map(LeaderUuid).map_err(|_| UuidError::NotHex(text.to_owned()))
}

/// A leader on the wire: empty for none, else 16 bytes big-endian (docs/journals.md §6).
pub fn leader_to_wire(leader: Option<LeaderUuid>) -> Vec<u8> {
    match leader.and_then(LeaderUuid::set) {
        Some(u) => u.0.to_be_bytes().to_vec(),
        None => Vec::new(),
    }
}

/// A leader from the wire: empty (or 16 zero bytes) is none.
///
/// # Errors
/// [`JournalError::Malformed`] for any length but 0 and 16.
pub fn leader_from_wire(bytes: &[u8]) -> Result<Option<LeaderUuid>, JournalError> {
    match bytes.len() {
        0 => Ok(None),
        16 => Ok(LeaderUuid(u128::from_be_bytes(bytes.try_into().expect("16 bytes"))).set()),
        n => Err(JournalError::Malformed(format!("a leader uuid of {n} bytes (not 0 or 16)"))),
    }
}

/// A view from the wire.
///
/// # Errors
/// [`JournalError::Malformed`] when the leader does not decode or `first_seq > next_seq`.
pub fn view_from_wire(v: &wire::JournalView) -> Result<View, JournalError> {
    let view = View { leader: leader_from_wire(&v.leader)?, next_seq: v.next_seq, first_seq: v.first_seq };
    if view.first_seq > view.next_seq {
        return Err(JournalError::Malformed(format!("a view with first_seq {} past next_seq {}", view.first_seq, view.next_seq)));
    }
    Ok(view)
}

// ---------------------------------------------------------------------------------------
// Names.

/// One half of an `id:` name: a hex prefix of a 64-bit id, 1 to 16 digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdPrefix {
    /// The digits' value.
    pub value: u64,
    /// How many hex digits were given (1-16); 16 names the id whole.
    pub digits: u8,
}

impl IdPrefix {
    /// Whether `id`, written as 16 hex digits, starts with this prefix.
    pub fn matches(&self, id: u64) -> bool {
        let shift = 4 * (16 - u32::from(self.digits));
        id.checked_shr(shift).unwrap_or(0) == self.value
    }

    /// The whole id, when all 16 digits were given.
    pub fn whole(&self) -> Option<u64> {
        (self.digits == 16).then_some(self.value)
    }

    fn parse(half: &str, which: &str) -> Result<IdPrefix, NameError> {
        if half.is_empty() || half.len() > 16 || !half.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(NameError::Malformed(format!("the {which} half of an id: name is 1 to 16 hex digits; got {half:?}")));
        }
        let value = u64::from_str_radix(half, 16).expect("checked hex");
        Ok(IdPrefix { value, digits: half.len() as u8 })
    }
}

impl fmt::Display for IdPrefix {
    /// The digits as given (lower case, leading zeros kept).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:0width$x}", self.value, width = usize::from(self.digits))
    }
}

/// A journal as a user names it (docs/journals.md §8.1): `TENANT/JOURNAL`,
/// `paros://TENANT/JOURNAL`, or `id:TENANT/JOURNAL` in hex, where each half may be a unique
/// prefix of the id. Parse with [`str::parse`]; find the journal with
/// [`Journals::resolve_name`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalRef {
    /// By names; both are valid names ([`valid_name`]).
    Named {
        /// The tenant's name.
        tenant: String,
        /// The journal's name within the tenant.
        journal: String,
    },
    /// By hex ids or prefixes of them.
    Ids {
        /// The tenant id, or a prefix of it.
        tenant: IdPrefix,
        /// The journal id, or a prefix of it.
        journal: IdPrefix,
    },
}

impl JournalRef {
    /// The id, when both halves are given whole (no look-up is needed).
    pub fn whole_id(&self) -> Option<JournalId> {
        match self {
            JournalRef::Ids { tenant, journal } => Some(JournalId { tenant: tenant.whole()?, journal: journal.whole()? }),
            JournalRef::Named { .. } => None,
        }
    }
}

impl fmt::Display for JournalRef {
    /// `TENANT/JOURNAL` or `id:T/J`, as parsed (without a `paros://` scheme).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalRef::Named { tenant, journal } => write!(f, "{tenant}/{journal}"),
            JournalRef::Ids { tenant, journal } => write!(f, "id:{tenant}/{journal}"),
        }
    }
}

/// Why a journal name did not parse or did not name exactly one journal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The text is not one of the three forms.
    #[error("{0}")]
    Malformed(String),
    /// No journal has that name (or no id matches the prefixes).
    #[error("no journal {0}")]
    Unknown(String),
    /// Id prefixes that match more than one journal.
    #[error("{name} matches {} journals ({}); give more hex digits", candidates.len(), candidates.join(", "))]
    Ambiguous {
        /// The name as given.
        name: String,
        /// Each match as `id:T/J`.
        candidates: Vec<String>,
    },
}

impl FromStr for JournalRef {
    type Err = NameError;

    /// Parses the three forms; names are checked against [`valid_name`].
    fn from_str(text: &str) -> Result<JournalRef, NameError> {
        const FORMS: &str = "TENANT/JOURNAL, paros://TENANT/JOURNAL or id:TENANT/JOURNAL (hex)";
        if let Some(ids) = text.strip_prefix("id:") {
            let Some((t, j)) = ids.split_once('/') else {
                return Err(NameError::Malformed(format!("{text:?} is not {FORMS}: an id: name needs TENANT/JOURNAL")));
            };
            return Ok(JournalRef::Ids { tenant: IdPrefix::parse(t, "tenant")?, journal: IdPrefix::parse(j, "journal")? });
        }
        let named = text.strip_prefix("paros://").unwrap_or(text);
        let Some((t, j)) = named.split_once('/') else {
            return Err(NameError::Malformed(format!("{text:?} is not {FORMS}")));
        };
        for (half, which) in [(t, "tenant"), (j, "journal")] {
            if !valid_name(half) {
                return Err(NameError::Malformed(format!(
                    "{text:?}: the {which} name {half:?} is not 1 to 64 ASCII letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
                )));
            }
        }
        Ok(JournalRef::Named { tenant: t.to_owned(), journal: j.to_owned() })
    }
}

// ---------------------------------------------------------------------------------------
// Outcomes.

/// Why a journal call got no answer this client can use. An answer with no verdict (`NOT_LEADER`,
/// `UNSERVED`, `BUSY`) and a lost answer are outcomes, not errors.
#[derive(Clone, Debug, thiserror::Error)]
pub enum JournalError {
    /// No server is configured.
    #[error("no server is configured")]
    NoServers,
    /// No configured server could be reached (connect, TLS or Hello failed): nothing was
    /// sent. One line per server.
    #[error("no server answered: {0}")]
    Unreachable(String),
    /// A read-only call (list) was sent and no answer came back.
    #[error("no answer from {server}: {error}")]
    NoAnswer {
        /// The server asked.
        server: String,
        /// The transport error.
        error: String,
    },
    /// The server answered `INVALID`: the call is malformed (a uuid that is not 16 bytes,
    /// no call).
    #[error("the server refused the call as malformed: {0}")]
    Invalid(String),
    /// The server answered `UNAVAILABLE`: its journal log stopped or it is shutting down.
    #[error("the server cannot judge journal calls now: {0}")]
    Unavailable(String),
    /// An outcome this client does not know, or one that does not answer this call.
    #[error("the server answered {outcome} to a {call}, which this client cannot use")]
    Unexpected {
        /// The call (`write`, `read`, ...).
        call: &'static str,
        /// The outcome's name, or its number when unknown.
        outcome: String,
    },
    /// An answer that does not decode (a leader of the wrong length, a missing state).
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The server answered with a protocol error frame instead of a journal answer; a server
    /// that does not serve journal calls (the reference, an older tephra-server) answers
    /// every one `BAD_REQUEST`.
    #[error("server error {code}: {message}{}", if *code == ErrorCode::BadRequest { " (a server that does not serve journal calls answers them BAD_REQUEST)" } else { "" })]
    Server {
        /// The error code.
        code: ErrorCode,
        /// The server's text.
        message: String,
    },
    /// A journal name that did not parse or did not name exactly one journal.
    #[error(transparent)]
    Name(#[from] NameError),
}

/// The answer to a write (docs/journals.md §2.2 and §8.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Accepted at `seq` (`duplicate`: the exact retry of a write accepted before, which moved
    /// nothing).
    Written {
        /// The first record's seq.
        seq: Seq,
        /// How many records.
        count: u32,
        /// Whether this was the exact retry of an accepted write.
        duplicate: bool,
        /// The view after the write.
        state: View,
    },
    /// Refused: a uuid that does not lead, a seq that is not `next_seq`, other records at an
    /// accepted position, or an empty batch. `state` says which.
    Refused {
        /// The view the write was judged against.
        state: View,
    },
    /// A write below `first_seq`: whether it was written can no longer be known.
    Truncated {
        /// The view the write was judged against.
        state: View,
    },
    /// A write shaped for the other writer mode; nothing moved.
    WrongMode {
        /// The view the write was judged against.
        state: View,
    },
    /// Over the node's limits, before anything was logged: split the batch.
    TooLarge {
        /// The node's records-per-write limit.
        max_records: u64,
        /// The node's bytes-per-write limit.
        max_bytes: u64,
    },
    /// No such journal (or an id half is 0).
    UnknownJournal,
    /// The node had too many writes pending until the call's deadline; the write is in no log.
    Busy,
    /// No node gave a verdict: none leads the journal's group (replication).
    NotLeader {
        /// The last server's text.
        message: String,
    },
    /// The request went out and no answer came back: the write may or may not be applied.
    Ambiguous,
}

/// The answer to `SetLeader(new, old)` (docs/journals.md §2.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetLeaderOutcome {
    /// `new` leads now.
    Won {
        /// The view after it.
        state: View,
    },
    /// `old` was not the leader, `new` already led, or `new` is 0.
    Lost {
        /// The view it was judged against.
        state: View,
    },
    /// A multi-writer journal has no leader.
    WrongMode,
    /// No such journal.
    UnknownJournal,
    /// No verdict from any node (replication).
    NotLeader {
        /// The last server's text.
        message: String,
    },
    /// No answer: the leader may or may not have changed. Claim again: a read that names my
    /// uuid shows the claim won.
    Ambiguous,
}

/// The answer to a claim: a read, then `SetLeader(mine, the leader read)` (docs/journals.md
/// §8.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The compare-and-set won; I lead.
    Won {
        /// The view after it.
        state: View,
    },
    /// Another claim came between the read and the compare-and-set.
    Lost {
        /// The view it was judged against.
        state: View,
    },
    /// The read already names my uuid: an earlier claim of mine won (its answer may have been
    /// lost). I lead.
    Owned {
        /// The view read.
        state: View,
    },
    /// No server served the read; nothing was sent to change the leader.
    Unread,
    /// A multi-writer journal.
    WrongMode,
    /// No such journal.
    UnknownJournal,
    /// The compare-and-set got no answer: claim again to learn.
    Ambiguous,
}

/// The answer to a read (docs/journals.md §8.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Records dense from `from` (empty when the wait at the tail ran out).
    Page {
        /// The first record's seq.
        from: Seq,
        /// The records.
        records: Vec<Vec<u8>>,
        /// The journal's view.
        state: View,
    },
    /// `from` is below `first_seq`; `state` says where the journal starts.
    Truncated {
        /// The journal's view.
        state: View,
    },
    /// No such journal (every server said so).
    UnknownJournal,
    /// No server could confirm the read in time. It carries no records, so it is never wrong.
    Unserved,
    /// The request went out and no answer came back.
    Ambiguous,
}

/// The answer to a truncate (docs/journals.md §2.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TruncateOutcome {
    /// Applied (possibly a no-op); the view after it.
    Applied {
        /// The view after it.
        state: View,
    },
    /// A single-writer journal refused a uuid that does not lead.
    Refused {
        /// The view it was judged against.
        state: View,
    },
    /// Shaped for the other writer mode.
    WrongMode,
    /// No such journal.
    UnknownJournal,
    /// No verdict from any node (replication).
    NotLeader {
        /// The last server's text.
        message: String,
    },
    /// No answer: it may or may not be applied (a truncate is safe to send again).
    Ambiguous,
}

/// How an ambiguous single-writer write was settled (docs/journals.md §8.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The write is in the journal at `seq`.
    Written {
        /// The first record's seq.
        seq: Seq,
        /// How many records.
        count: u32,
    },
    /// The write is not in the journal and never will be.
    NotWritten {
        /// The view that proves it.
        state: View,
    },
    /// The position lies below `first_seq`: whether it was written can no longer be known.
    Truncated {
        /// The view.
        state: View,
    },
    /// The budget ran out without a proof either way.
    Unresolved,
}

/// The answer to a create (docs/journals.md §5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The journal exists now under `id` (and its tenant, created when it was missing).
    Created {
        /// The new journal's id.
        id: JournalId,
    },
    /// The name is taken; `id` names the holder.
    NameTaken {
        /// The existing journal's id.
        id: JournalId,
    },
    /// The server refused a name.
    InvalidName {
        /// The server's text.
        message: String,
    },
    /// The cluster cannot place the durability asked for (`--survive machines=F` needs 2F+1
    /// nodes); nothing changed.
    Unplaceable {
        /// The server's text: how many nodes it needs and has.
        message: String,
    },
    /// No answer: create again, and a `NameTaken` names the journal if the first one landed.
    Ambiguous,
}

/// The answer to a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Deleted; its last view.
    Deleted {
        /// The view at deletion.
        state: View,
    },
    /// No such journal.
    UnknownJournal,
    /// No answer: it may or may not be deleted.
    Ambiguous,
}

/// The answer to a configure (docs/journals.md §9.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigureOutcome {
    /// The directory holds the new durability; the journal's group moves to its new voters
    /// next, writes going on.
    Configured,
    /// The cluster cannot place it (`--survive machines=F` needs 2F+1 nodes); nothing changed.
    Unplaceable {
        /// The server's text.
        message: String,
    },
    /// No such journal.
    UnknownJournal,
    /// A tenant name that is not a valid name (1 to 64 bytes of ASCII letters, digits, `.`,
    /// `_` and `-`, not starting with `.` or `-`).
    InvalidName,
    /// No answer: configure again (the same F twice is harmless).
    Ambiguous,
}

/// One journal as a list names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalInfo {
    /// Its id.
    pub id: JournalId,
    /// The tenant's name.
    pub tenant_name: String,
    /// The journal's name within the tenant.
    pub name: String,
    /// The writer mode.
    pub mode: Mode,
    /// The store durability.
    pub durability: StoreDurability,
    /// The view: the journal's state as the answering server holds it (see `state_here`).
    pub state: View,
    /// `false` when the answering cluster node holds no copy of the journal's group: `state`
    /// is then only what that node last knew, not the journal's state (a read, or
    /// [`Journals::show`], gets that from the journal's voters).
    pub state_here: bool,
    /// In a cluster, F of `--survive machines=F` the journal was placed for.
    pub survive: Option<u8>,
    /// In a cluster, the node ids of its group's voters, ascending (empty on a single node).
    pub voters: Vec<u64>,
}

/// The answer to a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListOutcome {
    /// The journals (of one tenant, or all).
    Listed(Vec<JournalInfo>),
    /// No tenant of that name.
    UnknownTenant,
}

/// The answer to [`JournalWriter::write`] (docs/journals.md §8.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriterOutcome {
    /// In the journal at `seq`; `resolved` when the first answer was lost and
    /// [`Journals::resolve`] proved it.
    Written {
        /// The first record's seq.
        seq: Seq,
        /// How many records.
        count: u32,
        /// The exact retry of an accepted write.
        duplicate: bool,
        /// Settled after an ambiguous answer.
        resolved: bool,
        /// The view after the write; `None` when it was settled by [`Journals::resolve`],
        /// which learns no view.
        state: Option<View>,
    },
    /// The writer does not lead (never claimed, or superseded): nothing was sent.
    NotOwner,
    /// Another leader took the journal; the writer stops until claimed again.
    Superseded {
        /// The view naming the new leader.
        state: View,
    },
    /// Refused while I still lead (the tail moved): the writer now writes at `state.next_seq`.
    Refused {
        /// The view it was judged against.
        state: View,
    },
    /// The position is below `first_seq`.
    Truncated {
        /// The view.
        state: View,
    },
    /// The first answer was lost, and the write is proven absent for good.
    NotWritten {
        /// The view that proves it.
        state: View,
    },
    /// A multi-writer journal.
    WrongMode {
        /// The view.
        state: View,
    },
    /// Over the node's limits: split the batch.
    TooLarge {
        /// Records per write.
        max_records: u64,
        /// Bytes per write.
        max_bytes: u64,
    },
    /// No such journal.
    UnknownJournal,
    /// Too many writes pending until the deadline; nothing was logged.
    Busy,
    /// No verdict from any node.
    NotLeader {
        /// The last server's text.
        message: String,
    },
    /// The answer was lost and the retry budget did not settle it.
    Ambiguous,
}

// ---------------------------------------------------------------------------------------
// Decoding answers (pure).

/// An outcome's wire name (`NOT_LEADER`), or `outcome N` for a number this client does not
/// know.
fn outcome_name(r: &JournalResponse) -> String {
    match JournalOutcome::try_from(r.outcome) {
        Ok(o) => {
            let mut name = String::new();
            for (i, c) in format!("{o:?}").chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            name
        }
        Err(_) => format!("outcome {}", r.outcome),
    }
}

fn state_of(r: &JournalResponse) -> Result<View, JournalError> {
    match &r.state {
        Some(v) => view_from_wire(v),
        None => Err(JournalError::Malformed(format!("{} without a state", outcome_name(r)))),
    }
}

/// The answers every call can get that are no verdict: `INVALID`, `UNAVAILABLE`, and anything
/// else the call does not expect.
pub(crate) fn common(r: &JournalResponse, call: &'static str) -> JournalError {
    match JournalOutcome::try_from(r.outcome) {
        Ok(JournalOutcome::Invalid) => JournalError::Invalid(r.message.clone()),
        Ok(JournalOutcome::Unavailable) => JournalError::Unavailable(r.message.clone()),
        _ => JournalError::Unexpected { call, outcome: outcome_name(r) },
    }
}

/// The outcome of a write's answer.
///
/// # Errors
/// `INVALID`, `UNAVAILABLE`, outcomes that do not answer a write, malformed states.
pub fn decode_write(r: &JournalResponse) -> Result<WriteOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(o @ (O::Accepted | O::Duplicate)) => WriteOutcome::Written { seq: r.seq, count: r.count, duplicate: o == O::Duplicate, state: state_of(r)? },
        Ok(O::Refused) => WriteOutcome::Refused { state: state_of(r)? },
        Ok(O::Truncated) => WriteOutcome::Truncated { state: state_of(r)? },
        Ok(O::WrongMode) => WriteOutcome::WrongMode { state: state_of(r)? },
        Ok(O::TooLarge) => WriteOutcome::TooLarge { max_records: r.max_records, max_bytes: r.max_bytes },
        Ok(O::UnknownJournal) => WriteOutcome::UnknownJournal,
        Ok(O::Busy) => WriteOutcome::Busy,
        Ok(O::NotLeader) => WriteOutcome::NotLeader { message: r.message.clone() },
        Ok(O::Ambiguous) => WriteOutcome::Ambiguous,
        _ => return Err(common(r, "write")),
    })
}

/// The outcome of a set-leader's answer.
///
/// # Errors
/// As [`decode_write`].
pub fn decode_set_leader(r: &JournalResponse) -> Result<SetLeaderOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Leader) => SetLeaderOutcome::Won { state: state_of(r)? },
        Ok(O::Lost) => SetLeaderOutcome::Lost { state: state_of(r)? },
        Ok(O::WrongMode) => SetLeaderOutcome::WrongMode,
        Ok(O::UnknownJournal) => SetLeaderOutcome::UnknownJournal,
        Ok(O::NotLeader) => SetLeaderOutcome::NotLeader { message: r.message.clone() },
        Ok(O::Ambiguous) => SetLeaderOutcome::Ambiguous,
        _ => return Err(common(r, "set-leader")),
    })
}

/// The outcome of a read's answer (`NOT_LEADER` reads as `Unserved`: no verdict here).
///
/// # Errors
/// As [`decode_write`].
pub fn decode_read(r: &JournalResponse) -> Result<ReadOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Page) => ReadOutcome::Page { from: r.from_seq, records: r.records.clone(), state: state_of(r)? },
        Ok(O::Truncated) => ReadOutcome::Truncated { state: state_of(r)? },
        Ok(O::UnknownJournal) => ReadOutcome::UnknownJournal,
        Ok(O::Unserved | O::NotLeader) => ReadOutcome::Unserved,
        _ => return Err(common(r, "read")),
    })
}

/// The outcome of a truncate's answer.
///
/// # Errors
/// As [`decode_write`].
pub fn decode_truncate(r: &JournalResponse) -> Result<TruncateOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Trimmed) => TruncateOutcome::Applied { state: state_of(r)? },
        Ok(O::TruncateRefused | O::Refused) => TruncateOutcome::Refused { state: state_of(r)? },
        Ok(O::WrongMode) => TruncateOutcome::WrongMode,
        Ok(O::UnknownJournal) => TruncateOutcome::UnknownJournal,
        Ok(O::NotLeader) => TruncateOutcome::NotLeader { message: r.message.clone() },
        Ok(O::Ambiguous) => TruncateOutcome::Ambiguous,
        _ => return Err(common(r, "truncate")),
    })
}

/// The outcome of a create's answer.
///
/// # Errors
/// As [`decode_write`].
pub fn decode_create(r: &JournalResponse) -> Result<CreateOutcome, JournalError> {
    use JournalOutcome as O;
    let id = JournalId { tenant: r.tenant, journal: r.journal };
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Created) => CreateOutcome::Created { id },
        Ok(O::NameTaken) => CreateOutcome::NameTaken { id },
        Ok(O::InvalidName) => CreateOutcome::InvalidName { message: r.message.clone() },
        Ok(O::Unplaceable) => CreateOutcome::Unplaceable { message: r.message.clone() },
        Ok(O::Ambiguous) => CreateOutcome::Ambiguous,
        // Refused before consensus by every server asked (no directory leader reachable).
        Ok(O::NotLeader | O::Unserved) => return Err(JournalError::Unavailable(r.message.clone())),
        _ => return Err(common(r, "create")),
    })
}

/// The outcome of a delete's answer.
///
/// # Errors
/// As [`decode_write`].
pub fn decode_delete(r: &JournalResponse) -> Result<DeleteOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Deleted) => DeleteOutcome::Deleted { state: state_of(r)? },
        Ok(O::UnknownJournal) => DeleteOutcome::UnknownJournal,
        Ok(O::Ambiguous) => DeleteOutcome::Ambiguous,
        _ => return Err(common(r, "delete")),
    })
}

/// The outcome of a configure's answer.
///
/// # Errors
/// As [`decode_write`]; `NOT_LEADER` or `UNSERVED` from every server as
/// [`JournalError::Unavailable`].
pub fn decode_configure(r: &JournalResponse) -> Result<ConfigureOutcome, JournalError> {
    use JournalOutcome as O;
    Ok(match JournalOutcome::try_from(r.outcome) {
        Ok(O::Configured) => ConfigureOutcome::Configured,
        Ok(O::Unplaceable) => ConfigureOutcome::Unplaceable { message: r.message.clone() },
        Ok(O::UnknownJournal) => ConfigureOutcome::UnknownJournal,
        Ok(O::InvalidName) => ConfigureOutcome::InvalidName,
        Ok(O::Ambiguous) => ConfigureOutcome::Ambiguous,
        Ok(O::NotLeader | O::Unserved) => return Err(JournalError::Unavailable(r.message.clone())),
        _ => return Err(common(r, "configure")),
    })
}

/// The call that sets journal `id`'s `--survive machines=F`.
pub fn configure_call(id: JournalId, machines: u8) -> Call {
    Call::Configure(wire::JournalConfigure { tenant: id.tenant, journal: id.journal, survive: u32::from(machines), tenant_name: String::new() })
}

/// The call that sets the default `--survive machines=F` of the tenant named `tenant` (for the
/// journals created in it later without an F of their own; a new tenant is created).
pub fn configure_tenant_call(tenant: &str, machines: u8) -> Call {
    Call::Configure(wire::JournalConfigure { tenant: 0, journal: 0, survive: u32::from(machines), tenant_name: tenant.to_owned() })
}

/// The outcome of a list's answer.
///
/// # Errors
/// As [`decode_write`], and an entry whose mode, durability or state does not decode.
pub fn decode_list(r: &JournalResponse) -> Result<ListOutcome, JournalError> {
    use JournalOutcome as O;
    match JournalOutcome::try_from(r.outcome) {
        Ok(O::Listed) => {}
        Ok(O::UnknownTenant) => return Ok(ListOutcome::UnknownTenant),
        _ => return Err(common(r, "list")),
    }
    let mut out = Vec::with_capacity(r.journals.len());
    for j in &r.journals {
        let mode = match wire::JournalMode::try_from(j.mode) {
            Ok(wire::JournalMode::Single) => Mode::Single,
            Ok(wire::JournalMode::Multi) => Mode::Multi,
            Err(_) => return Err(JournalError::Malformed(format!("journal {}/{}: mode {}", j.tenant_name, j.name, j.mode))),
        };
        let durability = match wire::JournalDurability::try_from(j.durability) {
            Ok(wire::JournalDurability::Ordered) => StoreDurability::Ordered,
            Ok(wire::JournalDurability::Batched) => StoreDurability::Batched,
            Err(_) => return Err(JournalError::Malformed(format!("journal {}/{}: durability {}", j.tenant_name, j.name, j.durability))),
        };
        let state = match &j.state {
            Some(v) => view_from_wire(v)?,
            None => return Err(JournalError::Malformed(format!("journal {}/{} without a state", j.tenant_name, j.name))),
        };
        out.push(JournalInfo {
            id: JournalId { tenant: j.tenant, journal: j.journal },
            tenant_name: j.tenant_name.clone(),
            name: j.name.clone(),
            mode,
            durability,
            state,
            survive: j.survive.and_then(|f| u8::try_from(f).ok()),
            voters: j.voters.clone(),
            state_here: !j.elsewhere,
        });
    }
    Ok(ListOutcome::Listed(out))
}

/// The journals of `list` that `name` names.
///
/// # Errors
/// [`NameError::Unknown`] when none does; [`NameError::Ambiguous`] when id prefixes match more
/// than one.
pub fn find_named<'a>(name: &JournalRef, list: &'a [JournalInfo]) -> Result<&'a JournalInfo, NameError> {
    let found: Vec<&JournalInfo> = list
        .iter()
        .filter(|j| match name {
            JournalRef::Named { tenant, journal } => &j.tenant_name == tenant && &j.name == journal,
            JournalRef::Ids { tenant, journal } => tenant.matches(j.id.tenant) && journal.matches(j.id.journal),
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(NameError::Unknown(name.to_string())),
        many => Err(NameError::Ambiguous { name: name.to_string(), candidates: many.iter().map(|j| j.id.to_string()).collect() }),
    }
}

// ---------------------------------------------------------------------------------------
// Settling an ambiguous write (pure).

/// Step 1 of settling an ambiguous single-writer write of `count` records at `seq` under
/// `me`: judge a read-back (docs/journals.md §8.3). `Some` settles it: `first_seq > seq` is
/// `Truncated`; `next_seq <= seq` while another uuid (or none) leads is `NotWritten`, because
/// a write of mine judged after that leader won is refused. `None`: send the write again.
pub fn judge_read_back(seq: Seq, me: LeaderUuid, read: &ReadOutcome) -> Option<Resolution> {
    let state = match read {
        ReadOutcome::Page { state, .. } | ReadOutcome::Truncated { state } => *state,
        _ => return None,
    };
    if state.first_seq > seq {
        return Some(Resolution::Truncated { state });
    }
    if state.next_seq <= seq && state.leader != Some(me) {
        return Some(Resolution::NotWritten { state });
    }
    None
}

/// Step 2: judge the answer to the identical write sent again. `Some` settles it: written
/// or duplicate is `Written`; wrong mode is `NotWritten`; a write below `first_seq` is
/// `Truncated`; a refusal is `NotWritten` when another uuid leads (the journal answers the
/// exact retry of an accepted write `Duplicate` even from a superseded writer, so a refusal
/// proves it absent) or when the position is taken (`next_seq > seq`: another write holds it).
/// Any other answer (a refusal that proves nothing, no verdict, no answer) is `None`: try
/// again while the budget lasts.
pub fn judge_resend(seq: Seq, me: LeaderUuid, answer: &WriteOutcome) -> Option<Resolution> {
    match answer {
        WriteOutcome::Written { seq, count, .. } => Some(Resolution::Written { seq: *seq, count: *count }),
        WriteOutcome::WrongMode { state } => Some(Resolution::NotWritten { state: *state }),
        WriteOutcome::Truncated { state } => Some(Resolution::Truncated { state: *state }),
        WriteOutcome::Refused { state } if state.leader != Some(me) || state.next_seq > seq => Some(Resolution::NotWritten { state: *state }),
        _ => None,
    }
}

/// Settles an ambiguous single-writer write at `seq` under `me` (docs/journals.md §8.3):
/// one read-back ([`judge_read_back`]), then up to `budget` identical re-sends
/// ([`judge_resend`]) with `pause` between them. The calls are the caller's (a server, or a
/// script in tests); an error from one counts as no answer. Both clients settle through the
/// same steps.
pub fn settle(
    seq: Seq,
    me: LeaderUuid,
    budget: u32,
    read_back: impl FnOnce() -> Result<ReadOutcome, JournalError>,
    resend: impl FnMut() -> Result<WriteOutcome, JournalError>,
    pause: impl FnMut(),
) -> Resolution {
    let mut moves = Scripted { read_back: Some(read_back), resend, pause };
    futures_lite::future::block_on(calls::settle_over(seq, me, budget, &mut moves))
}

/// The moves of [`settle`], from the caller's closures.
struct Scripted<R, W, P> {
    read_back: Option<R>,
    resend: W,
    pause: P,
}

impl<R, W, P> calls::Attempts for Scripted<R, W, P>
where
    R: FnOnce() -> Result<ReadOutcome, JournalError>,
    W: FnMut() -> Result<WriteOutcome, JournalError>,
    P: FnMut(),
{
    async fn read_back(&mut self) -> Result<ReadOutcome, JournalError> {
        match self.read_back.take() {
            Some(read_back) => read_back(),
            None => Err(JournalError::Malformed("a second read-back while settling".into())),
        }
    }

    async fn resend(&mut self) -> Result<WriteOutcome, JournalError> {
        (self.resend)()
    }

    async fn pause(&mut self) {
        (self.pause)()
    }
}

// ---------------------------------------------------------------------------------------
// The calls on the wire.

/// The checked name of a create: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, not starting
/// with `.` or `-` ([`valid_name`]).
fn checked_name<'a>(name: &'a str, which: &str) -> Result<&'a str, NameError> {
    if valid_name(name) {
        return Ok(name);
    }
    Err(NameError::Malformed(format!("the {which} name {name:?} is not 1 to 64 ASCII letters, digits, '.', '_' or '-' (not starting with '.' or '-')")))
}

/// The call that creates `tenant/journal` (docs/journals.md §5), for
/// [`Client::journal_call`] and [`AsyncClient::journal_call`](crate::client::AsyncClient::journal_call).
///
/// # Errors
/// [`NameError::Malformed`] for a name that breaks the name rules.
pub fn create_call(tenant: &str, journal: &str, mode: Mode, durability: StoreDurability, survive: Option<u8>) -> Result<Call, JournalError> {
    Ok(Call::Create(wire::JournalCreate {
        tenant_name: checked_name(tenant, "tenant")?.to_owned(),
        journal_name: checked_name(journal, "journal")?.to_owned(),
        mode: match mode {
            Mode::Single => wire::JournalMode::Single,
            Mode::Multi => wire::JournalMode::Multi,
        } as i32,
        durability: match durability {
            StoreDurability::Ordered => wire::JournalDurability::Ordered,
            StoreDurability::Batched => wire::JournalDurability::Batched,
        } as i32,
        survive: survive.map(u32::from),
    }))
}

/// The call that deletes `id`.
pub fn delete_call(id: JournalId) -> Call {
    Call::Delete(wire::JournalDelete { tenant: id.tenant, journal: id.journal })
}

/// The call that lists the journals of the tenant named `tenant`, or of every tenant.
pub fn list_call(tenant: Option<&str>) -> Call {
    Call::List(wire::JournalList { tenant_name: tenant.unwrap_or_default().to_owned() })
}

/// The call that writes `records` to `id`: at `seq` under `leader` for a single-writer
/// journal, with no leader (and seq 0) for a multi-writer one (docs/journals.md §2.2).
pub fn write_call(id: JournalId, leader: Option<LeaderUuid>, seq: Seq, records: &[impl AsRef<[u8]>]) -> Call {
    Call::Write(wire::JournalWrite {
        tenant: id.tenant,
        journal: id.journal,
        leader: leader_to_wire(leader),
        seq,
        records: records.iter().map(|r| r.as_ref().to_vec()).collect(),
    })
}

/// The call that reads up to `limit` records (0: a full page) of `id` from `from`, waiting up
/// to `wait_ms` milliseconds at the tail (docs/journals.md §2 and §7).
pub fn read_call(id: JournalId, from: Seq, limit: u64, wait_ms: u64) -> Call {
    Call::Read(wire::JournalRead { tenant: id.tenant, journal: id.journal, from_seq: from, limit, wait_ms })
}

/// The call `SetLeader(new, old)` on `id` (docs/journals.md §2.3).
pub fn set_leader_call(id: JournalId, new: LeaderUuid, old: Option<LeaderUuid>) -> Call {
    Call::SetLeader(wire::JournalSetLeader { tenant: id.tenant, journal: id.journal, new: leader_to_wire(Some(new)), old: leader_to_wire(old) })
}

/// The call `Truncate(up_to)` on `id`, fenced by `leader` in a single-writer journal
/// (docs/journals.md §2.4).
pub fn truncate_call(id: JournalId, up_to: Seq, leader: Option<LeaderUuid>) -> Call {
    Call::Truncate(wire::JournalTruncate { tenant: id.tenant, journal: id.journal, up_to, leader: leader_to_wire(leader) })
}

/// The error for a journal call whose request is over this client's frame cap: it never left.
pub(crate) fn over_frame_cap(len: u64, max: u32) -> JournalError {
    JournalError::Invalid(format!("the request is {len} bytes, over this client's frame cap of {max}"))
}

/// The error for an answer to a journal call that is not a journal answer.
pub(crate) fn not_a_journal_answer(kind: &response::Kind) -> JournalError {
    JournalError::Malformed(ClientError::unexpected(kind, "journal").to_string())
}

// ---------------------------------------------------------------------------------------
// The handle.

/// TLS for [`Journals`]: the rustls configuration and the name to verify (default: the host
/// of each server's address).
#[derive(Clone)]
pub struct JournalsTls {
    /// The client configuration (roots to trust).
    pub config: Arc<rustls::ClientConfig>,
    /// The name to verify in every server's certificate; `None` takes each address's host.
    pub server_name: Option<String>,
}

impl fmt::Debug for JournalsTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalsTls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

/// How [`Journals`] reaches its servers and how long it waits (docs/journals.md §8.2).
#[derive(Clone, Debug)]
pub struct JournalsConfig {
    /// `HOST:PORT` of each server (one today).
    pub servers: Vec<String>,
    /// The bearer token sent in the Hello.
    pub auth_token: Option<String>,
    /// TLS, or `None` for plain TCP.
    pub tls: Option<JournalsTls>,
    /// How long a call that changes a journal may take in all, its re-sends after `BUSY` and
    /// redirects included; also bounds each connect. Default 5 s.
    pub request_timeout: Duration,
    /// How long a read may take beyond its `wait_ms`. Default 5 s.
    pub read_timeout: Duration,
    /// How many times [`Journals::resolve`] sends an ambiguous write again. Default 4.
    pub retry_budget: u32,
    /// The pause between those re-sends. Default 100 ms.
    pub retry_backoff: Duration,
    /// The pause before a write answered `BUSY` is sent again. Default 20 ms.
    pub busy_backoff: Duration,
    /// How many servers a call asks after `NOT_LEADER`. Default 8.
    pub redirect_limit: u32,
}

impl JournalsConfig {
    /// The defaults for these servers: no token, plain TCP, 5 s timeouts, a retry budget of
    /// 4 re-sends 100 ms apart.
    pub fn new(servers: impl IntoIterator<Item = impl Into<String>>) -> JournalsConfig {
        JournalsConfig {
            servers: servers.into_iter().map(Into::into).collect(),
            auth_token: None,
            tls: None,
            request_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            retry_budget: 4,
            retry_backoff: Duration::from_millis(100),
            busy_backoff: Duration::from_millis(20),
            redirect_limit: 8,
        }
    }
}

/// The host of `HOST:PORT` or `[V6]:PORT`.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A blocking handle on the journals of a list of servers (docs/journals.md §8.2). It keeps
/// one connection; after a transport failure the connection is dropped and the next call
/// connects again (to the next server, when there are several). Calls are not retried on
/// their own except as documented: a `BUSY` write is sent again until the deadline, a
/// `NOT_LEADER` answer moves to the next server, and [`resolve`](Self::resolve) settles an
/// ambiguous single-writer write. A multi-writer write is never sent twice.
pub struct Journals {
    config: JournalsConfig,
    conn: Option<Client>,
    /// Whether `conn` has carried an answer: a connection that has may have gone stale since
    /// (the server restarted), so a read-only call that loses its answer on it asks again.
    answered: bool,
    /// The server `conn` talks to, or the next to try.
    current: usize,
    /// Each server's node id as its answers named it (0: not known yet, or no cluster member):
    /// a `NOT_LEADER` answer's hint names a node, and this says which server that is.
    nodes: Vec<u64>,
}

impl fmt::Debug for Journals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journals").field("servers", &self.config.servers).field("connected", &self.conn.is_some()).finish()
    }
}

impl Journals {
    /// A handle; it connects on the first call.
    pub fn new(config: JournalsConfig) -> Journals {
        let nodes = vec![0; config.servers.len()];
        Journals { config, conn: None, answered: false, current: 0, nodes }
    }

    /// The configuration.
    pub fn config(&self) -> &JournalsConfig {
        &self.config
    }

    /// The server the handle talks to now (or will try first).
    pub fn server(&self) -> Option<&str> {
        self.config.servers.get(self.current).map(String::as_str)
    }

    fn dial(&self, addr: &str) -> io::Result<Client> {
        let token = self.config.auth_token.as_deref();
        let limit = self.config.request_timeout;
        match &self.config.tls {
            Some(tls) => {
                let name = tls.server_name.clone().unwrap_or_else(|| host_of(addr).to_owned());
                Client::connect_tls_within(addr, &name, Arc::clone(&tls.config), token, limit)
            }
            None => Client::connect_within(addr, token, limit),
        }
    }

    /// A connection: the one held, or a new one to the first server (from `current` on) that
    /// takes it.
    fn connection(&mut self) -> Result<&mut Client, JournalError> {
        if self.conn.is_none() {
            let n = self.config.servers.len();
            if n == 0 {
                return Err(JournalError::NoServers);
            }
            let mut failures = Vec::new();
            for k in 0..n {
                let i = (self.current + k) % n;
                let addr = self.config.servers[i].clone();
                match self.dial(&addr) {
                    Ok(c) => {
                        self.current = i;
                        self.conn = Some(c);
                        self.answered = false;
                        break;
                    }
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                        failures.push(format!("{addr}: no answer to the connect and Hello within {:?}", self.config.request_timeout))
                    }
                    Err(e) => failures.push(format!("{addr}: {e}")),
                }
            }
            if self.conn.is_none() {
                return Err(JournalError::Unreachable(failures.join("; ")));
            }
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// Drops the connection and moves to the next server.
    fn move_on(&mut self) {
        self.conn = None;
        if !self.config.servers.is_empty() {
            self.current = (self.current + 1) % self.config.servers.len();
        }
    }

    /// Sends `call` and waits up to `timeout` for its answer.
    fn exchange_now(&mut self, call: Call, timeout: Duration) -> Result<Exchange, JournalError> {
        let server = self.server().unwrap_or_default().to_owned();
        let stale = self.conn.is_some() && self.answered;
        let client = match self.connection() {
            Ok(c) => c,
            Err(JournalError::Unreachable(why)) => return Ok(Exchange::Unreachable(why)),
            Err(e) => return Err(e),
        };
        let _ = client.set_timeout(Some(timeout.max(Duration::from_millis(1))));
        let id = match client.send(request::Kind::Journal(wire::JournalRequest { call: Some(call) })) {
            Ok(id) => id,
            Err(ClientError::Server { code, message, .. }) => {
                self.conn = None;
                return Err(JournalError::Server { code, message });
            }
            // A frame over this client's cap never left; anything else may have.
            Err(ClientError::Frame(crate::proto::FrameError::TooLong { len, max })) => return Err(over_frame_cap(len, max)),
            Err(e) => {
                self.move_on();
                return Ok(Exchange::Lost { server, error: e.to_string(), stale });
            }
        };
        match client.recv(id) {
            Ok(response::Kind::Journal(r)) => {
                self.answered = true;
                if let Some(n) = self.nodes.get_mut(self.current) {
                    *n = r.answered_by;
                }
                Ok(Exchange::Answer(r))
            }
            Ok(other) => {
                self.conn = None;
                Err(not_a_journal_answer(&other))
            }
            // A server may close after an error frame: the next call connects afresh.
            Err(ClientError::Server { code, message, .. }) => {
                self.conn = None;
                Err(JournalError::Server { code, message })
            }
            Err(e) => {
                self.move_on();
                Ok(Exchange::Lost { server, error: e.to_string(), stale })
            }
        }
    }

    /// Creates `tenant/journal` with a writer mode and a store durability; the server creates
    /// the tenant when it is missing (docs/journals.md §5).
    ///
    /// # Errors
    /// [`NameError::Malformed`] (nothing sent) for a name that breaks the name rules; no
    /// server reachable; `INVALID`, `UNAVAILABLE` or an answer that is not a create's.
    pub fn create(&mut self, tenant: &str, journal: &str, mode: Mode, durability: StoreDurability) -> Result<CreateOutcome, JournalError> {
        block_on(calls::create(self, tenant, journal, mode, durability, None))
    }

    /// As [`create`](Self::create), asking for a journal that survives the loss of `machines`
    /// nodes (`--survive machines=F`: a group of 2F+1 voters, docs/journals.md §9.5); a
    /// single node takes only 0. `Unplaceable` when the cluster has fewer than 2F+1 nodes.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn create_surviving(
        &mut self,
        tenant: &str,
        journal: &str,
        mode: Mode,
        durability: StoreDurability,
        machines: u8,
    ) -> Result<CreateOutcome, JournalError> {
        block_on(calls::create(self, tenant, journal, mode, durability, Some(machines)))
    }

    /// Deletes a journal and frees its disk.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn delete(&mut self, id: JournalId) -> Result<DeleteOutcome, JournalError> {
        block_on(calls::delete(self, id))
    }

    /// Sets journal `id`'s `--survive machines=F` (docs/journals.md §9.8): in a cluster its
    /// group moves to 2F+1 voters by joint consensus, every record kept and writes going on;
    /// a single node takes only 0.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn configure(&mut self, id: JournalId, machines: u8) -> Result<ConfigureOutcome, JournalError> {
        block_on(calls::configure(self, id, machines))
    }

    /// Sets the default `--survive machines=F` of the tenant named `tenant` (docs/journals.md
    /// §9.8): journals created in it later without an F of their own get 2F+1 voters; journals
    /// it already has keep theirs. A tenant of that name that does not exist yet is created.
    /// A single node takes only 0.
    ///
    /// # Errors
    /// As [`create`](Self::create); an invalid tenant name as [`JournalError::Unexpected`].
    pub fn configure_tenant(&mut self, tenant: &str, machines: u8) -> Result<ConfigureOutcome, JournalError> {
        block_on(calls::configure_tenant(self, tenant, machines))
    }

    /// Lists the journals of the tenant named `tenant`, or of every tenant for `None`.
    ///
    /// # Errors
    /// No server reachable; [`JournalError::NoAnswer`] when the answer was lost; as
    /// [`decode_list`].
    pub fn list(&mut self, tenant: Option<&str>) -> Result<ListOutcome, JournalError> {
        block_on(calls::list(self, tenant))
    }

    /// How the first server of the list stands in its cluster: its groups, their roles and
    /// indexes, its peers' links; `None` from a server that is no cluster member
    /// (docs/journals.md §9.7).
    ///
    /// # Errors
    /// No server reachable; [`JournalError::NoAnswer`] when the answer was lost; an answer
    /// other than `LISTED` as [`JournalError::Unexpected`] (a server too old to know the call
    /// answers `INVALID`).
    pub fn node_status(&mut self) -> Result<Option<crate::proto::NodeReport>, JournalError> {
        block_on(calls::node_status(self))
    }

    /// The journal `name` names, with its mode, durability and view, found by a list (docs/journals.md §8.1).
    ///
    /// # Errors
    /// [`NameError::Unknown`] (an unknown tenant included), [`NameError::Ambiguous`] for id
    /// prefixes that match several journals, and as [`list`](Self::list).
    pub fn show(&mut self, name: &JournalRef) -> Result<JournalInfo, JournalError> {
        block_on(calls::show(self, name))
    }

    /// The id `name` names: taken as it is when both halves are given whole in hex, else
    /// looked up with [`show`](Self::show).
    ///
    /// # Errors
    /// As [`show`](Self::show).
    pub fn resolve_name(&mut self, name: &JournalRef) -> Result<JournalId, JournalError> {
        block_on(calls::resolve_name(self, name))
    }

    /// A single-writer write of `records` at `seq` under `leader` (docs/journals.md §2.2). A
    /// `BUSY` answer is sent again after a short pause until the request timeout. An
    /// `Ambiguous` outcome can be settled with [`resolve`](Self::resolve).
    ///
    /// # Errors
    /// As [`create`](Self::create) (without the name check).
    pub fn write_single(&mut self, id: JournalId, leader: LeaderUuid, seq: Seq, records: &[impl AsRef<[u8]>]) -> Result<WriteOutcome, JournalError> {
        block_on(calls::write(self, write_call(id, Some(leader), seq, records)))
    }

    /// A multi-writer write: no uuid, no position; the journal puts it at its tail. It is never
    /// sent again after an ambiguous answer (there is no deduplication: a second send could
    /// land twice), only after `BUSY`, which logs nothing.
    ///
    /// # Errors
    /// As [`write_single`](Self::write_single).
    pub fn write_multi(&mut self, id: JournalId, records: &[impl AsRef<[u8]>]) -> Result<WriteOutcome, JournalError> {
        block_on(calls::write(self, write_call(id, None, 0, records)))
    }

    /// Settles an ambiguous single-writer write (docs/journals.md §8.3): reads the position
    /// back, then sends the identical write again up to the retry budget, as [`settle`] says.
    /// Never fails: a call that fails counts as no answer.
    pub fn resolve(&mut self, id: JournalId, leader: LeaderUuid, seq: Seq, records: &[impl AsRef<[u8]>]) -> Resolution {
        block_on(calls::resolve(self, id, leader, seq, records))
    }

    /// Reads up to `limit` records (0: a full page) from `from`, waiting up to `wait_ms` at
    /// the tail (docs/journals.md §2 and §7). Each server is asked at most once, in turn; it
    /// moves on after `UNSERVED`, a lost answer or `UNKNOWN_JOURNAL`, and answers
    /// `UnknownJournal` only when every server said so.
    ///
    /// # Errors
    /// No server reachable; `INVALID`, `UNAVAILABLE` or an answer that is not a read's.
    pub fn read(&mut self, id: JournalId, from: Seq, limit: u64, wait_ms: u64) -> Result<ReadOutcome, JournalError> {
        block_on(calls::read(self, id, from, limit, wait_ms))
    }

    /// `SetLeader(new, old)`: a compare-and-set; `old` is `None` on a journal that never had
    /// a leader (docs/journals.md §2.3). Never re-sent after a lost answer (a claim that won
    /// shows in the next read).
    ///
    /// # Errors
    /// As [`write_single`](Self::write_single).
    pub fn set_leader(&mut self, id: JournalId, new: LeaderUuid, old: Option<LeaderUuid>) -> Result<SetLeaderOutcome, JournalError> {
        block_on(calls::set_leader(self, id, new, old))
    }

    /// `Truncate(up_to)`: fenced by `leader` in a single-writer journal, `None` in a
    /// multi-writer one (docs/journals.md §2.4).
    ///
    /// # Errors
    /// As [`write_single`](Self::write_single).
    pub fn truncate(&mut self, id: JournalId, up_to: Seq, leader: Option<LeaderUuid>) -> Result<TruncateOutcome, JournalError> {
        block_on(calls::truncate(self, id, up_to, leader))
    }
}

/// The blocking transport: each exchange blocks the thread, so the calls' futures complete in
/// one poll of `block_on`.
impl Transport for Journals {
    fn policy(&self) -> Policy {
        Policy { timing: AsyncJournalsConfig::from(&self.config), redirect_limit: self.config.redirect_limit, servers: self.config.servers.len() }
    }

    async fn exchange(&mut self, call: Call, timeout: Duration) -> Result<Exchange, JournalError> {
        self.exchange_now(call, timeout)
    }

    fn next_server(&mut self) {
        self.move_on()
    }

    fn redirect(&mut self, leader: u64) {
        let to = redirect_target(self.current, &self.nodes, leader);
        self.conn = None;
        self.current = to;
    }

    async fn pause(&mut self, duration: Duration) {
        std::thread::sleep(duration)
    }
}

/// The server a call goes to after `NOT_LEADER` from server `current` (docs/journals.md §9.2):
/// the server known to be node `leader` (the answer's hint, 0 for none), else the next one
/// after `current` not known to be another node, else simply the next one. `nodes` holds each
/// server's node id as learned from its answers (0: not known).
pub(crate) fn redirect_target(current: usize, nodes: &[u64], leader: u64) -> usize {
    let n = nodes.len().max(1);
    if leader != 0 {
        if let Some(i) = nodes.iter().position(|&id| id == leader) {
            return i;
        }
        if let Some(i) = (1..n).map(|k| (current + k) % n).find(|&i| nodes[i] == 0) {
            return i;
        }
    }
    (current + 1) % n
}

// ---------------------------------------------------------------------------------------
// The writer session.

/// A single-writer session on one journal (docs/journals.md §8.4): it claims the journal
/// under its uuid, writes at the tail (it keeps `next_seq`), settles lost answers with
/// [`Journals::resolve`], and stops writing once another leader supersedes it, until it is
/// claimed again. A claim after a supersession draws a fresh uuid: a uuid leads one term.
///
/// `J` is the handle it writes through: [`Journals`] (blocking `claim` and `write`), or an
/// [`AsyncJournals`](crate::client::async_client::AsyncJournals) (the same calls, async:
/// [`AsyncJournalWriter`](crate::client::async_client::AsyncJournalWriter)).
#[derive(Debug)]
pub struct JournalWriter<J = Journals> {
    journals: J,
    session: Session,
}

impl<J> JournalWriter<J> {
    /// A writer on `id` that will claim under `leader` (not 0: the unset uuid never leads).
    pub fn new(journals: J, id: JournalId, leader: LeaderUuid) -> JournalWriter<J> {
        JournalWriter { journals, session: Session::new(id, leader) }
    }

    /// A writer under a [`fresh_leader`].
    pub fn with_fresh_leader(journals: J, id: JournalId) -> JournalWriter<J> {
        JournalWriter::new(journals, id, fresh_leader())
    }

    /// The uuid it claims and writes under.
    pub fn leader(&self) -> LeaderUuid {
        self.session.leader
    }

    /// The journal.
    pub fn id(&self) -> JournalId {
        self.session.id
    }

    /// The seq of its next write, while it believes it leads.
    pub fn next_seq(&self) -> Option<Seq> {
        self.session.next_seq
    }

    /// The handle, for calls outside the session (reads), or to give an async handle a new
    /// client.
    pub fn journals(&mut self) -> &mut J {
        &mut self.journals
    }

    /// The handle back.
    pub fn into_journals(self) -> J {
        self.journals
    }

    /// Takes the lead as if a claim had won, writing next at `next_seq` (a caller that knows
    /// it leads, as `tephra journal write --no-claim`). The journal still judges every write.
    pub fn assume_owned(&mut self, next_seq: Seq) {
        self.session.next_seq = Some(next_seq);
    }

    /// The session's state and its handle, for the calls of [`calls`].
    pub(crate) fn parts(&mut self) -> (&mut J, &mut Session) {
        (&mut self.journals, &mut self.session)
    }
}

impl JournalWriter<Journals> {
    /// Claims the journal: a read, then `SetLeader(mine, the leader read)`. A read that
    /// already names my uuid is `Owned`. After a supersession, a fresh uuid is drawn first.
    ///
    /// # Errors
    /// As [`Journals::read`] and [`Journals::set_leader`].
    pub fn claim(&mut self) -> Result<ClaimOutcome, JournalError> {
        let (journals, session) = self.parts();
        block_on(calls::claim(journals, session))
    }

    /// Writes `records` at the tail. Nothing is sent while the writer does not lead.
    ///
    /// # Errors
    /// As [`Journals::write_single`].
    pub fn write(&mut self, records: &[impl AsRef<[u8]>]) -> Result<WriterOutcome, JournalError> {
        let (journals, session) = self.parts();
        block_on(calls::write_at_tail(journals, session, records))
    }
}

/// Sends a journal call over a [`Client`] that is already connected, and waits for its
/// answer (docs/journals.md §6). [`Journals`] is the usual way in; this is for callers that
/// hold a connection of their own.
impl Client {
    /// One journal call: `call` at field 20 of a request, its answer at field 20 of the
    /// response.
    ///
    /// # Errors
    /// Transport errors, an error frame (a server that does not serve journal calls answers
    /// `BAD_REQUEST`), an answer of another kind.
    pub fn journal_call(&mut self, call: Call) -> Result<JournalResponse, ClientError> {
        match self.call(request::Kind::Journal(wire::JournalRequest { call: Some(call) }))? {
            response::Kind::Journal(r) => Ok(r),
            other => Err(ClientError::unexpected(&other, "journal")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: LeaderUuid = LeaderUuid(0xa);
    const B: LeaderUuid = LeaderUuid(0xb);

    fn view(leader: Option<LeaderUuid>, next_seq: Seq, first_seq: Seq) -> View {
        View { leader, next_seq, first_seq }
    }

    /// After `NOT_LEADER`: the server known to be the hinted node; else the next server not
    /// known to be another node; without a hint, or when every server is known, the next one.
    #[test]
    fn a_redirect_goes_to_the_hinted_node_when_a_server_is_known_to_be_it() {
        assert_eq!(redirect_target(0, &[1, 2, 3, 4, 5], 4), 3);
        assert_eq!(redirect_target(4, &[1, 2, 3, 4, 5], 1), 0);
        assert_eq!(redirect_target(0, &[1, 2, 0, 0, 5], 4), 2, "the first server not known to be another node");
        assert_eq!(redirect_target(3, &[0, 2, 3, 4, 5], 9), 0, "wraps around to the unknown one");
        assert_eq!(redirect_target(1, &[1, 2, 3], 7), 2, "every server known, none the hint: the next");
        assert_eq!(redirect_target(2, &[1, 2, 3], 0), 0, "no hint: the next");
        assert_eq!(redirect_target(0, &[0], 3), 0, "one server");
        assert_eq!(redirect_target(0, &[], 3), 0, "no servers");
    }

    #[test]
    fn leaders_parse_from_hex_and_print_back() {
        assert_eq!(parse_leader("7"), Ok(LeaderUuid(7)));
        assert_eq!(parse_leader("0x7F"), Ok(LeaderUuid(0x7f)));
        assert_eq!(parse_leader(" ff "), Ok(LeaderUuid(0xff)));
        assert_eq!(parse_leader("0"), Ok(LeaderUuid(0)));
        let max = "f".repeat(32);
        assert_eq!(parse_leader(&max), Ok(LeaderUuid(u128::MAX)));
        assert_eq!(parse_leader("00000000000000000000000000000000007"), Err(UuidError::TooLong(35)));
        assert_eq!(parse_leader("550e8400-e29b-41d4-a716-446655440000"), Ok(LeaderUuid(0x550e8400e29b41d4a716446655440000)));
        assert_eq!(parse_leader(""), Err(UuidError::Empty));
        assert_eq!(parse_leader("0x"), Err(UuidError::Empty));
        assert_eq!(parse_leader("xyz"), Err(UuidError::NotHex("xyz".into())));
        assert_eq!(parse_leader("-7"), Err(UuidError::NotHex("-7".into())));
        assert_eq!(parse_leader("12-34"), Err(UuidError::NotHex("12-34".into())));
        assert_eq!(parse_leader("+7"), Err(UuidError::NotHex("+7".into())));
        for u in [1u128, 0xdead_beef, u128::MAX, 1 << 127] {
            assert_eq!(parse_leader(&LeaderUuid(u).to_string()), Ok(LeaderUuid(u)));
        }
    }

    #[test]
    fn fresh_leaders_are_set_and_differ() {
        let a = fresh_leader();
        let b = fresh_leader();
        assert_ne!(a.0, 0);
        assert_ne!(a, b);
        // Over many draws every bit is seen set and clear: no bit is fixed (as a v4 uuid's are).
        let (mut ones, mut zeros) = (0u128, 0u128);
        for _ in 0..256 {
            let u = fresh_leader().0;
            ones |= u;
            zeros |= !u;
        }
        assert_eq!(ones, u128::MAX);
        assert_eq!(zeros, u128::MAX);
    }

    #[test]
    fn leaders_travel_as_sixteen_bytes_or_none() {
        assert_eq!(leader_to_wire(None), Vec::<u8>::new());
        assert_eq!(leader_to_wire(Some(LeaderUuid(0))), Vec::<u8>::new());
        let w = leader_to_wire(Some(LeaderUuid(0x0102)));
        assert_eq!(w.len(), 16);
        assert_eq!(&w[14..], &[1, 2]);
        assert_eq!(leader_from_wire(&w).unwrap(), Some(LeaderUuid(0x0102)));
        assert_eq!(leader_from_wire(&[]).unwrap(), None);
        assert_eq!(leader_from_wire(&[0; 16]).unwrap(), None);
        assert!(matches!(leader_from_wire(&[1; 15]), Err(JournalError::Malformed(_))));
        let bad = wire::JournalView { leader: vec![], next_seq: 1, first_seq: 2 };
        assert!(matches!(view_from_wire(&bad), Err(JournalError::Malformed(_))));
    }

    #[test]
    fn names_parse_in_three_forms() {
        let named = JournalRef::Named { tenant: "acme".into(), journal: "orders".into() };
        assert_eq!("acme/orders".parse::<JournalRef>(), Ok(named.clone()));
        assert_eq!("paros://acme/orders".parse::<JournalRef>(), Ok(named.clone()));
        assert_eq!(named.to_string(), "acme/orders");
        assert_eq!(named.whole_id(), None);
        let ids: JournalRef = "id:00ab/7".parse().unwrap();
        assert_eq!(ids, JournalRef::Ids { tenant: IdPrefix { value: 0xab, digits: 4 }, journal: IdPrefix { value: 7, digits: 1 } });
        assert_eq!(ids.to_string(), "id:00ab/7");
        assert_eq!(ids.whole_id(), None);
        let whole: JournalRef = "id:0000000000000001/FFFFFFFFFFFFFFFF".parse().unwrap();
        assert_eq!(whole.whole_id(), Some(JournalId { tenant: 1, journal: u64::MAX }));
        for bad in [
            "acme",
            "acme/",
            "/orders",
            "acme/or/ders",
            "acme/.x",
            "-a/b",
            "a b/c",
            "paros://acme",
            "id:",
            "id:12",
            "id:/1",
            "id:1/",
            "id:xyz/1",
            "id:1/00000000000000001",
            "tephra://acme/orders",
        ] {
            assert!(matches!(bad.parse::<JournalRef>(), Err(NameError::Malformed(_))), "{bad}");
        }
        let long = format!("acme/{}", "x".repeat(65));
        assert!(long.parse::<JournalRef>().is_err());
    }

    fn info(tenant: u64, journal: u64, t: &str, j: &str) -> JournalInfo {
        JournalInfo {
            id: JournalId { tenant, journal },
            tenant_name: t.into(),
            name: j.into(),
            mode: Mode::Single,
            durability: StoreDurability::Ordered,
            state: View::default(),
            state_here: true,
            survive: None,
            voters: Vec::new(),
        }
    }

    #[test]
    fn id_prefixes_must_name_exactly_one_journal() {
        let list = [
            info(0xab00_0000_0000_0001, 0x1234_0000_0000_0000, "acme", "orders"),
            info(0xab00_0000_0000_0001, 0x1299_0000_0000_0000, "acme", "bills"),
            info(0x0c00_0000_0000_0000, 0x1234_0000_0000_0000, "zeta", "orders"),
        ];
        let find = |s: &str| find_named(&s.parse().unwrap(), &list).map(|j| j.name.clone());
        assert_eq!(find("id:ab/1234"), Ok("orders".into()));
        assert_eq!(find("id:ab/129"), Ok("bills".into()));
        assert_eq!(find("id:0c/1"), Ok("orders".into()));
        assert_eq!(find("acme/bills"), Ok("bills".into()));
        assert_eq!(find("zeta/bills"), Err(NameError::Unknown("zeta/bills".into())));
        assert_eq!(find("id:c/1"), Err(NameError::Unknown("id:c/1".into())));
        match find("id:ab/12") {
            Err(NameError::Ambiguous { candidates, .. }) => assert_eq!(candidates.len(), 2),
            other => panic!("{other:?}"),
        }
        let p = IdPrefix { value: 0, digits: 16 };
        assert!(p.matches(0) && !p.matches(1));
        let p = IdPrefix { value: 0xf, digits: 1 };
        assert!(p.matches(u64::MAX) && !p.matches(1));
    }

    fn answer(outcome: JournalOutcome, state: Option<View>) -> JournalResponse {
        JournalResponse {
            outcome: outcome as i32,
            state: state.map(|v| wire::JournalView { leader: leader_to_wire(v.leader), next_seq: v.next_seq, first_seq: v.first_seq }),
            ..Default::default()
        }
    }

    #[test]
    fn answers_decode_to_typed_outcomes() {
        let v = view(Some(A), 2, 0);
        let mut r = answer(JournalOutcome::Accepted, Some(v));
        r.seq = 0;
        r.count = 2;
        assert_eq!(decode_write(&r).unwrap(), WriteOutcome::Written { seq: 0, count: 2, duplicate: false, state: v });
        r.outcome = JournalOutcome::Duplicate as i32;
        assert_eq!(decode_write(&r).unwrap(), WriteOutcome::Written { seq: 0, count: 2, duplicate: true, state: v });
        assert_eq!(decode_write(&answer(JournalOutcome::Refused, Some(v))).unwrap(), WriteOutcome::Refused { state: v });
        let mut big = answer(JournalOutcome::TooLarge, None);
        big.max_records = 1024;
        big.max_bytes = 1 << 20;
        assert_eq!(decode_write(&big).unwrap(), WriteOutcome::TooLarge { max_records: 1024, max_bytes: 1 << 20 });
        assert_eq!(decode_write(&answer(JournalOutcome::Busy, None)).unwrap(), WriteOutcome::Busy);
        assert_eq!(decode_write(&answer(JournalOutcome::UnknownJournal, None)).unwrap(), WriteOutcome::UnknownJournal);
        // A verdict without its state is malformed; INVALID, UNAVAILABLE, a foreign and an
        // unknown outcome are errors.
        assert!(matches!(decode_write(&answer(JournalOutcome::Refused, None)), Err(JournalError::Malformed(_))));
        assert!(matches!(decode_write(&answer(JournalOutcome::Invalid, None)), Err(JournalError::Invalid(_))));
        assert!(matches!(decode_write(&answer(JournalOutcome::Unavailable, None)), Err(JournalError::Unavailable(_))));
        assert!(matches!(decode_write(&answer(JournalOutcome::Page, Some(v))), Err(JournalError::Unexpected { call: "write", .. })));
        let unknown = JournalResponse { outcome: 99, ..Default::default() };
        match decode_write(&unknown) {
            Err(e @ JournalError::Unexpected { .. }) => assert!(e.to_string().contains("outcome 99"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(decode_set_leader(&answer(JournalOutcome::Leader, Some(v))).unwrap(), SetLeaderOutcome::Won { state: v });
        assert_eq!(decode_set_leader(&answer(JournalOutcome::Lost, Some(v))).unwrap(), SetLeaderOutcome::Lost { state: v });
        assert_eq!(decode_truncate(&answer(JournalOutcome::Trimmed, Some(v))).unwrap(), TruncateOutcome::Applied { state: v });
        assert_eq!(decode_truncate(&answer(JournalOutcome::TruncateRefused, Some(v))).unwrap(), TruncateOutcome::Refused { state: v });
        let mut page = answer(JournalOutcome::Page, Some(v));
        page.from_seq = 1;
        page.records = vec![b"r1".to_vec()];
        assert_eq!(decode_read(&page).unwrap(), ReadOutcome::Page { from: 1, records: vec![b"r1".to_vec()], state: v });
        assert_eq!(decode_read(&answer(JournalOutcome::Unserved, None)).unwrap(), ReadOutcome::Unserved);
        let mut created = answer(JournalOutcome::Created, None);
        created.tenant = 1;
        created.journal = 2;
        assert_eq!(decode_create(&created).unwrap(), CreateOutcome::Created { id: JournalId { tenant: 1, journal: 2 } });
        assert_eq!(decode_delete(&answer(JournalOutcome::Deleted, Some(v))).unwrap(), DeleteOutcome::Deleted { state: v });
        assert_eq!(decode_list(&answer(JournalOutcome::UnknownTenant, None)).unwrap(), ListOutcome::UnknownTenant);
        let mut listed = answer(JournalOutcome::Listed, None);
        listed.journals = vec![wire::JournalInfo {
            tenant: 1,
            journal: 2,
            tenant_name: "acme".into(),
            name: "orders".into(),
            mode: wire::JournalMode::Multi as i32,
            durability: wire::JournalDurability::Batched as i32,
            state: Some(wire::JournalView { leader: vec![], next_seq: 3, first_seq: 1 }),
            survive: Some(2),
            voters: vec![1, 2, 3, 4, 5],
            elsewhere: false,
        }];
        match decode_list(&listed).unwrap() {
            ListOutcome::Listed(l) => {
                assert_eq!(l[0].mode, Mode::Multi);
                assert_eq!(l[0].durability, StoreDurability::Batched);
                assert_eq!((l[0].survive, l[0].voters.as_slice()), (Some(2), &[1, 2, 3, 4, 5][..]));
                assert_eq!(l[0].state, view(None, 3, 1));
            }
            other => panic!("{other:?}"),
        }
        listed.journals[0].mode = 7;
        assert!(matches!(decode_list(&listed), Err(JournalError::Malformed(_))));
    }

    #[test]
    fn a_read_back_settles_what_it_can_prove() {
        let page = |state| ReadOutcome::Page { from: 5, records: vec![], state };
        // Below first_seq: truncated.
        assert_eq!(judge_read_back(5, A, &ReadOutcome::Truncated { state: view(Some(A), 9, 6) }), Some(Resolution::Truncated { state: view(Some(A), 9, 6) }));
        // Nothing at the position and another leader: never written.
        assert_eq!(judge_read_back(5, A, &page(view(Some(B), 5, 0))), Some(Resolution::NotWritten { state: view(Some(B), 5, 0) }));
        assert_eq!(judge_read_back(5, A, &page(view(None, 3, 0))), Some(Resolution::NotWritten { state: view(None, 3, 0) }));
        // Nothing there yet but I still lead: it may be in flight; send again.
        assert_eq!(judge_read_back(5, A, &page(view(Some(A), 5, 0))), None);
        // Something holds the position: send again to learn whose.
        assert_eq!(judge_read_back(5, A, &page(view(Some(B), 7, 0))), None);
        assert_eq!(judge_read_back(5, A, &ReadOutcome::Unserved), None);
        assert_eq!(judge_read_back(5, A, &ReadOutcome::Ambiguous), None);
    }

    #[test]
    fn a_resend_settles_on_a_verdict_that_proves_it() {
        let w = WriteOutcome::Written { seq: 5, count: 2, duplicate: true, state: view(Some(B), 9, 0) };
        assert_eq!(judge_resend(5, A, &w), Some(Resolution::Written { seq: 5, count: 2 }));
        let s = view(None, 0, 0);
        assert_eq!(judge_resend(5, A, &WriteOutcome::WrongMode { state: s }), Some(Resolution::NotWritten { state: s }));
        let s = view(Some(A), 9, 7);
        assert_eq!(judge_resend(5, A, &WriteOutcome::Truncated { state: s }), Some(Resolution::Truncated { state: s }));
        // Fenced by another leader: the exact retry of an accepted write would be a duplicate.
        let s = view(Some(B), 5, 0);
        assert_eq!(judge_resend(5, A, &WriteOutcome::Refused { state: s }), Some(Resolution::NotWritten { state: s }));
        // Another write holds the position.
        let s = view(Some(A), 6, 0);
        assert_eq!(judge_resend(5, A, &WriteOutcome::Refused { state: s }), Some(Resolution::NotWritten { state: s }));
        // A refusal that proves nothing (I lead, the tail is short of my seq), or no verdict.
        assert_eq!(judge_resend(5, A, &WriteOutcome::Refused { state: view(Some(A), 3, 0) }), None);
        for o in [WriteOutcome::Busy, WriteOutcome::Ambiguous, WriteOutcome::UnknownJournal, WriteOutcome::TooLarge { max_records: 1, max_bytes: 1 }] {
            assert_eq!(judge_resend(5, A, &o), None);
        }
    }

    /// Runs [`settle`] over scripted answers; returns the resolution, the re-sends made and
    /// the pauses taken.
    fn scripted(read: Result<ReadOutcome, JournalError>, answers: Vec<Result<WriteOutcome, JournalError>>, budget: u32) -> (Resolution, usize, usize) {
        let mut answers = answers.into_iter();
        let (mut sent, mut paused) = (0, 0);
        let r = settle(
            5,
            A,
            budget,
            || read,
            || {
                sent += 1;
                answers.next().unwrap_or(Ok(WriteOutcome::Ambiguous))
            },
            || paused += 1,
        );
        (r, sent, paused)
    }

    #[test]
    fn settle_reads_back_then_resends_within_the_budget() {
        let mine = view(Some(A), 5, 0);
        let page = Ok(ReadOutcome::Page { from: 5, records: vec![], state: mine });
        // The read-back settles it: nothing sent.
        let other = Ok(ReadOutcome::Page { from: 5, records: vec![], state: view(Some(B), 5, 0) });
        assert_eq!(scripted(other, vec![], 4), (Resolution::NotWritten { state: view(Some(B), 5, 0) }, 0, 0));
        // The first re-send is accepted.
        let ok = Ok(WriteOutcome::Written { seq: 5, count: 1, duplicate: false, state: view(Some(A), 6, 0) });
        assert_eq!(scripted(page.clone(), vec![ok.clone()], 4), (Resolution::Written { seq: 5, count: 1 }, 1, 0));
        // Lost answers and busy, then a duplicate: settled on the fourth send, 3 pauses.
        let dup = Ok(WriteOutcome::Written { seq: 5, count: 1, duplicate: true, state: view(Some(A), 6, 0) });
        let script = vec![Ok(WriteOutcome::Ambiguous), Err(JournalError::Unreachable("down".into())), Ok(WriteOutcome::Busy), dup];
        assert_eq!(scripted(page.clone(), script, 4), (Resolution::Written { seq: 5, count: 1 }, 4, 3));
        // The budget runs out.
        assert_eq!(scripted(page.clone(), vec![], 4), (Resolution::Unresolved, 4, 3));
        assert_eq!(scripted(page.clone(), vec![], 0), (Resolution::Unresolved, 0, 0));
        // A failed read-back goes on to re-send.
        assert_eq!(scripted(Err(JournalError::Unreachable("x".into())), vec![ok], 4), (Resolution::Written { seq: 5, count: 1 }, 1, 0));
        // Fenced on re-send.
        let fenced = Ok(WriteOutcome::Refused { state: view(Some(B), 5, 0) });
        assert_eq!(scripted(page, vec![fenced], 4), (Resolution::NotWritten { state: view(Some(B), 5, 0) }, 1, 0));
    }

    #[test]
    fn a_handle_without_servers_says_so_and_a_dead_one_is_unreachable() {
        let mut j = Journals::new(JournalsConfig::new(Vec::<String>::new()));
        assert!(matches!(j.list(None), Err(JournalError::NoServers)));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut config = JournalsConfig::new([format!("127.0.0.1:{port}")]);
        config.request_timeout = Duration::from_secs(1);
        let mut j = Journals::new(config);
        let id = JournalId { tenant: 1, journal: 1 };
        assert!(matches!(j.write_multi(id, &[b"x"]), Err(JournalError::Unreachable(_))));
        assert!(matches!(j.read(id, 0, 0, 0), Err(JournalError::Unreachable(_))));
        // resolve never fails: unreachable counts as no answer.
        assert_eq!(j.resolve(id, A, 0, &[b"x"]), Resolution::Unresolved);
    }
}
