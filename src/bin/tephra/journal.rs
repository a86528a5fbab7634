//! `tephra journal ...`: the journal verbs (docs/journals.md §8.5), over
//! [`Journals`](tephra::client::journal::Journals).
//!
//! Each verb prints one answer: a line of text (`written seq=0 count=2`, `refused leader=b
//! next_seq=2 first_seq=0`), or with `--json` one JSON document with an `outcome`. Reads print
//! one line per record (`seq<TAB>data`) and then `# leader=... next_seq=... first_seq=...`.
//! Notes on the way (a claim made, a leader drawn at random, a gap skipped) go to stderr. The
//! exit code says how the call went ([`JOURNAL_EXIT_CODES`]).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};
use tephra::client::journal::{
    fresh_leader, parse_leader, ClaimOutcome, ConfigureOutcome, CreateOutcome, DeleteOutcome, JournalError, JournalInfo, JournalRef, JournalWriter, Journals,
    JournalsConfig, JournalsTls, ListOutcome, NameError, ReadOutcome, SetLeaderOutcome, TruncateOutcome, WriteOutcome, WriterOutcome,
};
use tephra::client::tls;
use tephra::journal::{JournalId, LeaderUuid, Mode, Seq, StoreDurability, View};

use crate::{CliError, Global};

/// The exit codes of the journal verbs, printed at the end of `tephra journal --help`.
pub const JOURNAL_EXIT_CODES: &str = "\
Exit codes of the journal verbs:
  0  success
  1  any other failure (an answer this client does not understand, a server error)
  2  bad arguments (a malformed name or uuid, an ambiguous id prefix, an invalid name, a
     call the server refused as malformed)
  3  answered, but not what was asked: refused, lost, superseded, not written, truncated,
     wrong mode, too large, name taken, unknown journal or tenant
  4  ambiguous: the request went out and no answer came back; it may or may not be applied
  5  no server answered (or none could serve or decide the call: unserved, busy, not leader,
     unavailable)";

/// Success.
const EXIT_OK: u8 = 0;
/// Any other failure.
const EXIT_OTHER: u8 = 1;
/// Bad arguments.
const EXIT_USAGE: u8 = 2;
/// Answered, but not what was asked.
const EXIT_NOT_DONE: u8 = 3;
/// No answer to a request that went out.
const EXIT_AMBIGUOUS: u8 = 4;
/// No server answered or decided.
const EXIT_NO_SERVER: u8 = 5;

/// How long `tail` asks the server to wait at the tail per read, in ms (the server caps it).
const TAIL_WAIT_MS: u64 = 1_000;

/// The exit code of an answer's outcome (docs/journals.md §8.5).
pub fn exit_for(outcome: &str) -> u8 {
    match outcome {
        "accepted" | "duplicate" | "leader" | "owned" | "trimmed" | "created" | "deleted" | "listed" | "found" | "page" | "configured" => EXIT_OK,
        "refused" | "lost" | "superseded" | "not_written" | "not_owner" | "truncated" | "wrong_mode" | "too_large" | "name_taken" | "unknown_journal"
        | "unknown_tenant" | "unplaceable" => EXIT_NOT_DONE,
        "invalid_name" => EXIT_USAGE,
        "ambiguous" | "unresolved" => EXIT_AMBIGUOUS,
        "busy" | "unserved" | "not_leader" => EXIT_NO_SERVER,
        _ => EXIT_OTHER,
    }
}

/// `tephra journal`: the journal verbs.
#[derive(Debug, Args)]
#[command(after_help = JOURNAL_EXIT_CODES, after_long_help = JOURNAL_EXIT_CODES)]
pub struct JournalArgs {
    /// The servers to ask, HOST:PORT,... (instead of --addr).
    #[arg(long, global = true, env = "TEPHRA_SERVERS", value_delimiter = ',', value_name = "HOST:PORT,...")]
    servers: Vec<String>,
    #[command(subcommand)]
    verb: Verb,
}

/// The verbs. A journal argument `J` is `TENANT/JOURNAL`, `paros://TENANT/JOURNAL` or
/// `id:TENANT/JOURNAL` in hex, where each half may be a unique prefix.
#[derive(Debug, Subcommand)]
enum Verb {
    /// Create a journal (and its tenant when it is missing).
    #[command(override_usage = "tephra journal create [OPTIONS] <TENANT/JOURNAL>")]
    Create(CreateArgs),
    /// Delete a journal and free its disk.
    #[command(override_usage = "tephra journal delete [OPTIONS] <J>")]
    Delete(OneArgs),
    /// Set the machine failures a journal survives (its group moves to 2F+1 voters), or with
    /// --tenant the default of the journals created in a tenant later.
    #[command(override_usage = "tephra journal configure [OPTIONS] (<J> | --tenant <TENANT>) --survive machines=F")]
    Configure(ConfigureArgs),
    /// List the journals of a tenant (of every tenant without one) as a table.
    #[command(override_usage = "tephra journal list [OPTIONS] [TENANT]")]
    List(ListArgs),
    /// Show one journal: id, mode, store durability, leader, first and next seq.
    #[command(override_usage = "tephra journal show [OPTIONS] <J>")]
    Show(OneArgs),
    /// Make --new the leader if --old leads (without --old: whoever leads now).
    #[command(override_usage = "tephra journal set-leader [OPTIONS] <J> --new <U>")]
    SetLeader(SetLeaderArgs),
    /// Write records at the tail: claim the journal under --leader unless it leads, then write.
    #[command(override_usage = "tephra journal write [OPTIONS] <J> <RECORD>...")]
    Write(WriteArgs),
    /// Read records to the tail, one line per record, then the journal's state.
    #[command(override_usage = "tephra journal read [OPTIONS] <J>")]
    Read(ReadArgs),
    /// Follow a journal: print records as they land, until Ctrl-C.
    #[command(override_usage = "tephra journal tail [OPTIONS] <J>")]
    Tail(TailArgs),
    /// Drop every record below --up-to.
    #[command(override_usage = "tephra journal truncate [OPTIONS] <J> --up-to <N>")]
    Truncate(TruncateArgs),
}

/// A journal's writer mode, as an argument.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    /// One fenced writer at a time (the default).
    Single,
    /// Anyone appends; at-least-once.
    Multi,
}

/// A journal's store durability, as an argument.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum StoreArg {
    /// Records, sync, commit marker, sync (the default).
    Ordered,
    /// One sync per commit.
    Batched,
}

/// `tephra journal create`.
#[derive(Debug, Args)]
struct CreateArgs {
    /// The journal to create, TENANT/JOURNAL.
    #[arg(value_name = "TENANT/JOURNAL")]
    journal: String,
    /// The writer mode, fixed at creation.
    #[arg(long, value_enum, default_value = "single")]
    mode: ModeArg,
    /// How each store commits a batch, fixed at creation.
    #[arg(long, value_enum, default_value = "ordered")]
    store_durability: StoreArg,
    /// The machine failures the journal survives, `machines=F`: its group gets 2F+1 voters
    /// in a cluster (default F = 1); a single node takes only `machines=0`.
    #[arg(long, value_name = "machines=F", value_parser = parse_survive)]
    survive: Option<u8>,
}

/// `machines=F`, F from 0 to 127.
fn parse_survive(s: &str) -> Result<u8, String> {
    let f = s.strip_prefix("machines=").ok_or_else(|| format!("{s:?}: --survive takes machines=F"))?;
    // Digits only: `parse` would take a leading `+` too.
    let digits = !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| f.parse::<u8>().ok()).flatten().filter(|f| *f <= 127).ok_or_else(|| format!("{s:?}: F is a whole number from 0 to 127"))
}

/// `tephra journal configure`.
#[derive(Debug, Args)]
struct ConfigureArgs {
    /// The journal.
    #[arg(value_name = "J", required_unless_present = "tenant", conflicts_with = "tenant")]
    journal: Option<String>,
    /// A tenant instead of a journal: set the default F of the journals created in it later
    /// without --survive (the tenant is created if missing; its journals keep their F).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// `machines=F`: the group gets 2F+1 voters (a single node takes only `machines=0`).
    #[arg(long, value_name = "machines=F", value_parser = parse_survive)]
    survive: u8,
}

/// A verb that takes one journal.
#[derive(Debug, Args)]
struct OneArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
}

/// `tephra journal list`.
#[derive(Debug, Args)]
struct ListArgs {
    /// The tenant (default: every tenant).
    tenant: Option<String>,
}

/// `tephra journal set-leader`.
#[derive(Debug, Args)]
struct SetLeaderArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
    /// The uuid that takes the lead, in hex (not 0).
    #[arg(long, value_name = "U", value_parser = leader_arg)]
    new: LeaderUuid,
    /// The leader it replaces, in hex, or `none` for a journal that never had one (default:
    /// whoever leads now, read first).
    #[arg(long, value_name = "U|none", value_parser = old_arg)]
    old: Option<OldLeader>,
}

/// `--old`: a uuid, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OldLeader(Option<LeaderUuid>);

/// `tephra journal write`.
#[derive(Debug, Args)]
struct WriteArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
    /// The records, each one argument (its UTF-8 bytes), written as one batch.
    #[arg(value_name = "RECORD", required = true, num_args = 1..)]
    records: Vec<String>,
    /// Write as this leader uuid, in hex (default: TEPHRA_LEADER, else one drawn at random and
    /// printed on stderr).
    #[arg(long, value_name = "U", env = "TEPHRA_LEADER", value_parser = leader_arg, conflicts_with = "multi")]
    leader: Option<LeaderUuid>,
    /// Do not claim the journal first (the write is refused unless the uuid leads).
    #[arg(long, conflicts_with = "multi")]
    no_claim: bool,
    /// Write at this seq instead of the tail.
    #[arg(long, value_name = "N", conflicts_with = "multi")]
    seq: Option<Seq>,
    /// A multi-writer write: no uuid, no position, never sent twice.
    #[arg(long)]
    multi: bool,
}

/// `tephra journal read`.
#[derive(Debug, Args)]
struct ReadArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
    /// The first seq to read (default: the journal's first record).
    #[arg(long, value_name = "N")]
    from: Option<Seq>,
    /// Most records to print (default: all, to the tail; 0: one full page of the server's, as the wire's limit 0).
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Wait this long at the tail, in ms, for records to land (the server caps it).
    #[arg(long, value_name = "N", default_value_t = 0)]
    wait_ms: u64,
}

/// `tephra journal tail`.
#[derive(Debug, Args)]
struct TailArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
    /// The first seq to print (default: the next record to land).
    #[arg(long, value_name = "N")]
    from: Option<Seq>,
}

/// `tephra journal truncate`.
#[derive(Debug, Args)]
struct TruncateArgs {
    /// The journal.
    #[arg(value_name = "J")]
    journal: String,
    /// Drop every record below this seq (clamped to the tail).
    #[arg(long, value_name = "N")]
    up_to: Seq,
    /// The leader uuid, in hex (a single-writer journal; default: TEPHRA_LEADER).
    #[arg(long, value_name = "U", env = "TEPHRA_LEADER", value_parser = leader_arg, conflicts_with = "multi")]
    leader: Option<LeaderUuid>,
    /// A multi-writer truncate: no uuid.
    #[arg(long)]
    multi: bool,
}

/// Parses a leader uuid argument: hex, not 0.
fn leader_arg(text: &str) -> Result<LeaderUuid, String> {
    let u = parse_leader(text).map_err(|e| e.to_string())?;
    if u.set().is_none() {
        return Err("0 is the unset uuid, which never leads".to_owned());
    }
    Ok(u)
}

/// Parses `--old`: `none`, or a leader uuid.
fn old_arg(text: &str) -> Result<OldLeader, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(OldLeader(None));
    }
    leader_arg(text).map(|u| OldLeader(Some(u)))
}

// ---------------------------------------------------------------------------------------
// Answers (pure).

/// One answer: its outcome, its text line and its JSON document.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The outcome's name (`accepted`, `refused`, ...), the JSON `outcome`.
    pub outcome: &'static str,
    /// The text form.
    pub text: String,
    /// The JSON form (with `outcome`).
    pub json: Map<String, Value>,
}

impl Answer {
    fn new(outcome: &'static str, text: impl Into<String>) -> Answer {
        let mut json = Map::new();
        json.insert("outcome".into(), outcome.into());
        Answer { outcome, text: text.into(), json }
    }

    /// An answer whose text is the outcome's words followed by the state.
    fn with_state(outcome: &'static str, words: &str, state: &View) -> Answer {
        Answer::new(outcome, format!("{words} {}", state_text(state))).set("state", state_json(state))
    }

    fn set(mut self, key: &str, value: impl Into<Value>) -> Answer {
        self.json.insert(key.into(), value.into());
        self
    }

    /// The process exit code for this answer.
    pub fn exit(&self) -> u8 {
        exit_for(self.outcome)
    }
}

/// A leader for text: hex, or `none`.
fn leader_text(leader: Option<LeaderUuid>) -> String {
    leader.map_or_else(|| "none".to_owned(), |u| u.to_string())
}

/// `leader=... next_seq=... first_seq=...`.
pub fn state_text(v: &View) -> String {
    format!("leader={} next_seq={} first_seq={}", leader_text(v.leader), v.next_seq, v.first_seq)
}

/// `{leader, next_seq, first_seq}`, the leader as hex or null.
pub fn state_json(v: &View) -> Value {
    json!({ "leader": v.leader.map(|u| u.to_string()), "next_seq": v.next_seq, "first_seq": v.first_seq })
}

/// A record for text: UTF-8 with control characters and `\` escaped, so that each record
/// stays on one line; other bytes as `base64:` and their base64.
pub fn data_text(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(s) => {
            let mut out = String::with_capacity(s.len());
            for c in s.chars() {
                if c == '\\' {
                    out.push_str("\\\\");
                } else if c.is_control() {
                    out.extend(c.escape_default());
                } else {
                    out.push(c);
                }
            }
            out
        }
        Err(_) => format!("base64:{}", base64::engine::general_purpose::STANDARD.encode(data)),
    }
}

/// A record for JSON: `{seq, data}` for UTF-8, `{seq, data_base64}` for other bytes.
pub fn record_json(seq: Seq, data: &[u8]) -> Value {
    match std::str::from_utf8(data) {
        Ok(s) => json!({ "seq": seq, "data": s }),
        Err(_) => json!({ "seq": seq, "data_base64": base64::engine::general_purpose::STANDARD.encode(data) }),
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Single => "single",
        Mode::Multi => "multi",
    }
}

fn store_name(d: StoreDurability) -> &'static str {
    match d {
        StoreDurability::Ordered => "ordered",
        StoreDurability::Batched => "batched",
    }
}

/// The answer to a write.
pub fn write_answer(o: &WriteOutcome) -> Answer {
    match o {
        WriteOutcome::Written { seq, count, duplicate, state } => written(*seq, *count, *duplicate, false).set("state", state_json(state)),
        WriteOutcome::Refused { state } => Answer::with_state("refused", "refused", state),
        WriteOutcome::Truncated { state } => Answer::with_state("truncated", "truncated", state),
        WriteOutcome::WrongMode { state } => Answer::with_state("wrong_mode", "wrong mode", state),
        WriteOutcome::TooLarge { max_records, max_bytes } => too_large(*max_records, *max_bytes),
        WriteOutcome::UnknownJournal => unknown_journal(),
        WriteOutcome::Busy => busy(),
        WriteOutcome::NotLeader { message } => not_leader(message),
        WriteOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; the write may or may not be in the journal"),
    }
}

fn written(seq: Seq, count: u32, duplicate: bool, resolved: bool) -> Answer {
    let mut text = format!("written seq={seq} count={count}");
    if duplicate {
        text.push_str(" duplicate");
    }
    if resolved {
        text.push_str(" resolved");
    }
    let mut a = Answer::new(if duplicate { "duplicate" } else { "accepted" }, text).set("seq", seq).set("count", count).set("duplicate", duplicate);
    if resolved {
        a = a.set("resolved", true);
    }
    a
}

fn too_large(max_records: u64, max_bytes: u64) -> Answer {
    Answer::new("too_large", format!("too large max_records={max_records} max_bytes={max_bytes}")).set("max_records", max_records).set("max_bytes", max_bytes)
}

fn unknown_journal() -> Answer {
    Answer::new("unknown_journal", "unknown journal")
}

fn busy() -> Answer {
    Answer::new("busy", "busy: the server had too many writes pending until the deadline; nothing was written")
}

fn not_leader(message: &str) -> Answer {
    Answer::new("not_leader", format!("not leader: no server gave a verdict ({message})")).set("message", message)
}

/// The answer of a writer session's write.
pub fn writer_answer(o: &WriterOutcome) -> Answer {
    match o {
        WriterOutcome::Written { seq, count, duplicate, resolved, state } => {
            let a = written(*seq, *count, *duplicate, *resolved);
            match state {
                Some(state) => a.set("state", state_json(state)),
                None => a,
            }
        }
        WriterOutcome::NotOwner => Answer::new("not_owner", "not owner: this uuid does not lead the journal; nothing was sent"),
        WriterOutcome::Superseded { state } => Answer::with_state("superseded", "superseded", state),
        WriterOutcome::Refused { state } => Answer::with_state("refused", "refused", state),
        WriterOutcome::Truncated { state } => Answer::with_state("truncated", "truncated", state),
        WriterOutcome::NotWritten { state } => Answer::with_state("not_written", "not written", state).set("resolved", true),
        WriterOutcome::WrongMode { state } => Answer::with_state("wrong_mode", "wrong mode", state),
        WriterOutcome::TooLarge { max_records, max_bytes } => too_large(*max_records, *max_bytes),
        WriterOutcome::UnknownJournal => unknown_journal(),
        WriterOutcome::Busy => busy(),
        WriterOutcome::NotLeader { message } => not_leader(message),
        WriterOutcome::Ambiguous => {
            Answer::new("ambiguous", "ambiguous: no answer came back, and reading back and sending again did not settle whether the write is in the journal")
        }
    }
}

/// The answer to a set-leader.
pub fn set_leader_answer(o: &SetLeaderOutcome) -> Answer {
    match o {
        SetLeaderOutcome::Won { state } => Answer::with_state("leader", "leader", state),
        SetLeaderOutcome::Lost { state } => Answer::with_state("lost", "lost", state),
        SetLeaderOutcome::WrongMode => Answer::new("wrong_mode", "wrong mode: a multi-writer journal has no leader"),
        SetLeaderOutcome::UnknownJournal => unknown_journal(),
        SetLeaderOutcome::NotLeader { message } => not_leader(message),
        SetLeaderOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; the leader may or may not have changed"),
    }
}

/// The answer to a claim made on the way to a write, or by `set-leader` without `--old`;
/// `None` when the caller leads now (won or owned).
fn claim_answer(o: &ClaimOutcome) -> Option<Answer> {
    match o {
        ClaimOutcome::Won { .. } | ClaimOutcome::Owned { .. } => None,
        ClaimOutcome::Lost { state } => Some(Answer::with_state("lost", "lost", state)),
        ClaimOutcome::Unread => Some(Answer::new("unserved", "unserved: no server could serve the read of the claim")),
        ClaimOutcome::WrongMode => Some(Answer::new("wrong_mode", "wrong mode: a multi-writer journal has no leader (write --multi)")),
        ClaimOutcome::UnknownJournal => Some(unknown_journal()),
        ClaimOutcome::Ambiguous => Some(Answer::new("ambiguous", "ambiguous: the claim got no answer; the leader may or may not have changed")),
    }
}

/// The answer to a truncate.
pub fn truncate_answer(o: &TruncateOutcome) -> Answer {
    match o {
        TruncateOutcome::Applied { state } => Answer::with_state("trimmed", "trimmed", state),
        TruncateOutcome::Refused { state } => Answer::with_state("refused", "refused", state),
        TruncateOutcome::WrongMode => Answer::new("wrong_mode", "wrong mode: the call is shaped for the other writer mode (--multi)"),
        TruncateOutcome::UnknownJournal => unknown_journal(),
        TruncateOutcome::NotLeader { message } => not_leader(message),
        TruncateOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; the truncation may or may not be applied"),
    }
}

/// The answer to a create of `name`.
pub fn create_answer(name: &str, mode: Mode, store: StoreDurability, o: &CreateOutcome) -> Answer {
    match o {
        CreateOutcome::Created { id } => Answer::new("created", format!("created {name} id={id} mode={} store={}", mode_name(mode), store_name(store)))
            .set("journal", name)
            .set("id", id.to_string())
            .set("mode", mode_name(mode))
            .set("store", store_name(store)),
        CreateOutcome::NameTaken { id } => Answer::new("name_taken", format!("name taken: {name} is id={id}")).set("journal", name).set("id", id.to_string()),
        CreateOutcome::InvalidName { message } => Answer::new("invalid_name", format!("invalid name: {message}")).set("message", message.as_str()),
        CreateOutcome::Unplaceable { message } => Answer::new("unplaceable", format!("unplaceable: {message}")).set("message", message.as_str()),
        CreateOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; create again to learn whether it exists"),
    }
}

/// The answer to a delete of `name`.
pub fn delete_answer(name: &str, o: &DeleteOutcome) -> Answer {
    match o {
        DeleteOutcome::Deleted { state } => Answer::with_state("deleted", &format!("deleted {name}"), state).set("journal", name),
        DeleteOutcome::UnknownJournal => unknown_journal(),
        DeleteOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; the journal may or may not be deleted"),
    }
}

/// The answer to a configure of `name` to `survive`.
pub fn configure_answer(name: &str, survive: u8, o: &ConfigureOutcome) -> Answer {
    match o {
        ConfigureOutcome::Configured => {
            Answer::new("configured", format!("configured {name} survive=machines={survive}")).set("journal", name).set("survive", u64::from(survive))
        }
        ConfigureOutcome::Unplaceable { message } => Answer::new("unplaceable", format!("unplaceable: {message}")).set("message", message.as_str()),
        ConfigureOutcome::UnknownJournal => unknown_journal(),
        ConfigureOutcome::InvalidName => invalid_tenant(name),
        ConfigureOutcome::Ambiguous => Answer::new("ambiguous", "ambiguous: no answer came back; configure again"),
    }
}

/// The answer to a configure of tenant `tenant`'s default to `survive`.
pub fn configure_tenant_answer(tenant: &str, survive: u8, o: &ConfigureOutcome) -> Answer {
    match o {
        ConfigureOutcome::Configured => Answer::new("configured", format!("configured tenant {tenant}: new journals survive=machines={survive}"))
            .set("tenant", tenant)
            .set("survive", u64::from(survive)),
        ConfigureOutcome::InvalidName | ConfigureOutcome::UnknownJournal => invalid_tenant(tenant),
        other => configure_answer(tenant, survive, other),
    }
}

/// `invalid_name` for a tenant name.
fn invalid_tenant(tenant: &str) -> Answer {
    let message = not_a_tenant_name(tenant);
    Answer::new("invalid_name", format!("invalid name: {message}")).set("message", message)
}

/// What a tenant name may be, for one that is not.
fn not_a_tenant_name(tenant: &str) -> String {
    format!("{tenant:?} is not a tenant name: 1 to 64 bytes of ASCII letters, digits, '.', '_' and '-', not starting with '.' or '-'")
}

/// A journal as JSON: `{journal, id, mode, store, state}` (`state` null when the answering
/// server holds no copy of the journal), and in a cluster `survive` (F) and `voters` (node
/// ids) when its creation recorded them.
pub fn info_json(j: &JournalInfo) -> Value {
    let mut v = json!({
        "journal": format!("{}/{}", j.tenant_name, j.name),
        "id": j.id.to_string(),
        "mode": mode_name(j.mode),
        "store": store_name(j.durability),
        "state": if j.state_here { state_json(&j.state) } else { Value::Null },
    });
    if let (Some(f), Value::Object(m)) = (j.survive, &mut v) {
        m.insert("survive".into(), json!(f));
        m.insert("voters".into(), json!(j.voters));
    }
    v
}

/// ` survive=F voters=A,B,C` for a journal placed in a cluster, else nothing.
fn placement_text(j: &JournalInfo) -> String {
    match j.survive {
        Some(f) => format!(" survive=machines={f} voters={}", j.voters.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        None => String::new(),
    }
}

/// The `list` table: a header and one row per journal, columns space-aligned; `?` for the
/// state of a journal the answering server holds no copy of (`journal show` reads it).
pub fn list_table(journals: &[JournalInfo]) -> String {
    let mut rows = vec![["NAME", "ID", "MODE", "STORE", "LEADER", "FIRST", "NEXT"].map(str::to_owned)];
    for j in journals {
        let here = |s: String| if j.state_here { s } else { "?".to_owned() };
        rows.push([
            format!("{}/{}", j.tenant_name, j.name),
            j.id.to_string(),
            mode_name(j.mode).to_owned(),
            store_name(j.durability).to_owned(),
            here(j.state.leader.map_or_else(|| "-".to_owned(), |u| u.to_string())),
            here(j.state.first_seq.to_string()),
            here(j.state.next_seq.to_string()),
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------
// Running the verbs.

/// A [`JournalError`] as a CLI failure; an unknown name is an answer instead
/// ([`unknown_journal`]), so it is handled before this.
fn failed(e: JournalError) -> CliError {
    let code = match &e {
        JournalError::NoServers | JournalError::Invalid(_) => EXIT_USAGE,
        JournalError::Name(NameError::Malformed(_) | NameError::Ambiguous { .. }) => EXIT_USAGE,
        JournalError::Name(NameError::Unknown(_)) => EXIT_NOT_DONE,
        JournalError::Unreachable(_) | JournalError::NoAnswer { .. } | JournalError::Unavailable(_) => EXIT_NO_SERVER,
        JournalError::Unexpected { .. } | JournalError::Malformed(_) | JournalError::Server { .. } => EXIT_OTHER,
    };
    CliError { code, message: e.to_string(), wire: None, details: None }
}

/// Builds the handle from the global options: `--servers` (or `TEPHRA_SERVERS`), else
/// `--addr`; the token and TLS options; `--timeout` as both the request and the read timeout
/// (default 5 s).
pub fn journals(g: &Global, servers: &[String]) -> Result<Journals, CliError> {
    let servers: Vec<String> = servers.iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
    for addr in servers.iter().chain(servers.is_empty().then_some(&g.addr)) {
        if tephra::config::check_listen_addr(addr).is_none() {
            let message = format!("{addr:?} is not a server address: HOST:PORT, e.g. 127.0.0.1:9000");
            return Err(CliError { code: EXIT_USAGE, message, wire: None, details: None });
        }
    }
    let mut config = JournalsConfig::new(if servers.is_empty() { vec![g.addr.clone()] } else { servers });
    config.auth_token = g.token.clone();
    if g.tls || g.tls_ca.is_some() || g.tls_server_name.is_some() {
        let tls_config = match &g.tls_ca {
            Some(path) => tls::config_with_custom_ca(path).map_err(|e| CliError::usage(format!("--tls-ca {}: {e}", path.display())))?,
            None => tls::config_with_native_roots().map_err(|e| CliError::other(format!("TLS roots: {e}")))?,
        };
        config.tls = Some(JournalsTls { config: tls_config, server_name: g.tls_server_name.clone() });
    }
    if let Some(t) = g.timeout {
        config.request_timeout = t;
        config.read_timeout = t;
    }
    Ok(Journals::new(config))
}

/// Prints an answer to stdout (text or JSON).
fn print(g: &Global, a: &Answer) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    let r = if g.json { writeln!(out, "{}", Value::Object(a.json.clone())) } else { writeln!(out, "{}", a.text) };
    r.and_then(|()| out.flush()).map_err(CliError::output)
}

/// Prints the answer and ends the process with its exit code when that is not 0.
fn finish(g: &Global, a: &Answer) -> Result<(), CliError> {
    print(g, a)?;
    exit_with(a.exit())
}

/// Ends the process with `code` (stdout flushed) unless it is 0. The answer on stdout says
/// what happened, so nothing more is printed.
fn exit_with(code: u8) -> Result<(), CliError> {
    if code != EXIT_OK {
        let _ = io::stdout().flush();
        std::process::exit(i32::from(code));
    }
    Ok(())
}

/// A note on stderr (text), or a JSON object with a `note` on stderr (`--json`).
fn note(g: &Global, text: &str) {
    if g.json {
        eprintln!("{}", json!({ "note": text }));
    } else {
        eprintln!("tephra: {text}");
    }
}

fn parse_name(text: &str) -> Result<JournalRef, CliError> {
    text.parse::<JournalRef>().map_err(|e| CliError::usage(e.to_string()))
}

/// Finds the id `text` names; an unknown name ends the command with the `unknown_journal`
/// answer (exit 3).
fn resolve(g: &Global, j: &mut Journals, text: &str) -> Result<JournalId, CliError> {
    let name = parse_name(text)?;
    match j.resolve_name(&name) {
        Ok(id) => Ok(id),
        Err(JournalError::Name(NameError::Unknown(n))) => {
            finish(g, &Answer::new("unknown_journal", format!("unknown journal {n}")).set("journal", n))?;
            unreachable!("finish exits on a non-zero code")
        }
        Err(e) => Err(failed(e)),
    }
}

/// `tephra journal ...`.
pub fn run(g: &Global, args: &JournalArgs) -> Result<(), CliError> {
    let mut j = journals(g, &args.servers)?;
    match &args.verb {
        Verb::Create(a) => create(g, &mut j, a),
        Verb::Delete(a) => {
            let id = resolve(g, &mut j, &a.journal)?;
            let o = j.delete(id).map_err(failed)?;
            finish(g, &delete_answer(&a.journal, &o))
        }
        Verb::Configure(a) => match (&a.journal, &a.tenant) {
            (Some(journal), _) => {
                let id = resolve(g, &mut j, journal)?;
                let o = j.configure(id, a.survive).map_err(failed)?;
                finish(g, &configure_answer(journal, a.survive, &o))
            }
            (None, Some(tenant)) => {
                if !tephra::journal::valid_name(tenant) {
                    return Err(CliError { code: EXIT_USAGE, message: not_a_tenant_name(tenant), wire: None, details: None });
                }
                let o = j.configure_tenant(tenant, a.survive).map_err(failed)?;
                finish(g, &configure_tenant_answer(tenant, a.survive, &o))
            }
            (None, None) => unreachable!("clap requires J or --tenant"),
        },
        Verb::List(a) => list(g, &mut j, a),
        Verb::Show(a) => show(g, &mut j, a),
        Verb::SetLeader(a) => set_leader(g, &mut j, a),
        Verb::Write(a) => write(g, j, a),
        Verb::Read(a) => read(g, &mut j, a),
        Verb::Tail(a) => tail(g, &mut j, a),
        Verb::Truncate(a) => truncate(g, &mut j, a),
    }
}

fn create(g: &Global, j: &mut Journals, a: &CreateArgs) -> Result<(), CliError> {
    let JournalRef::Named { tenant, journal } = parse_name(&a.journal)? else {
        return Err(CliError::usage(format!("{}: create takes TENANT/JOURNAL by name, not by id", a.journal)));
    };
    let mode = match a.mode {
        ModeArg::Single => Mode::Single,
        ModeArg::Multi => Mode::Multi,
    };
    let store = match a.store_durability {
        StoreArg::Ordered => StoreDurability::Ordered,
        StoreArg::Batched => StoreDurability::Batched,
    };
    let o = match a.survive {
        Some(f) => j.create_surviving(&tenant, &journal, mode, store, f),
        None => j.create(&tenant, &journal, mode, store),
    }
    .map_err(failed)?;
    finish(g, &create_answer(&format!("{tenant}/{journal}"), mode, store, &o))
}

fn list(g: &Global, j: &mut Journals, a: &ListArgs) -> Result<(), CliError> {
    if let Some(t) = a.tenant.as_deref().filter(|t| !tephra::journal::valid_name(t)) {
        return Err(CliError { code: EXIT_USAGE, message: not_a_tenant_name(t), wire: None, details: None });
    }
    match j.list(a.tenant.as_deref()).map_err(failed)? {
        ListOutcome::UnknownTenant => {
            let t = a.tenant.clone().unwrap_or_default();
            finish(g, &Answer::new("unknown_tenant", format!("unknown tenant {t}")).set("tenant", t))
        }
        ListOutcome::Listed(all) => {
            if g.json {
                let a = Answer::new("listed", "").set("journals", all.iter().map(info_json).collect::<Vec<_>>());
                print(g, &a)
            } else {
                let mut out = io::stdout().lock();
                out.write_all(list_table(&all).as_bytes()).and_then(|()| out.flush()).map_err(CliError::output)
            }
        }
    }
}

fn show(g: &Global, j: &mut Journals, a: &OneArgs) -> Result<(), CliError> {
    let name = parse_name(&a.journal)?;
    match j.show(&name) {
        Ok(info) => {
            let text = format!(
                "{}/{} id={} mode={} store={} {}{}",
                info.tenant_name,
                info.name,
                info.id,
                mode_name(info.mode),
                store_name(info.durability),
                state_text(&info.state),
                placement_text(&info)
            );
            let mut answer = Answer::new("found", text);
            if let Value::Object(m) = info_json(&info) {
                for (k, v) in m {
                    answer = answer.set(&k, v);
                }
            }
            print(g, &answer)
        }
        Err(JournalError::Name(NameError::Unknown(n))) => finish(g, &Answer::new("unknown_journal", format!("unknown journal {n}")).set("journal", n)),
        Err(e) => Err(failed(e)),
    }
}

fn set_leader(g: &Global, j: &mut Journals, a: &SetLeaderArgs) -> Result<(), CliError> {
    let id = resolve(g, j, &a.journal)?;
    let Some(OldLeader(old)) = a.old else {
        // Take it from whoever leads now: a claim (a read, then the compare-and-set).
        let journals = std::mem::replace(j, Journals::new(j.config().clone()));
        let mut w = JournalWriter::new(journals, id, a.new);
        let o = w.claim().map_err(failed)?;
        if let Some(answer) = claim_answer(&o) {
            return finish(g, &answer);
        }
        let (ClaimOutcome::Won { state } | ClaimOutcome::Owned { state }) = o else { unreachable!("claim_answer") };
        if matches!(o, ClaimOutcome::Owned { .. }) {
            note(g, &format!("{} already leads", a.new));
        }
        return finish(g, &set_leader_answer(&SetLeaderOutcome::Won { state }));
    };
    let o = j.set_leader(id, a.new, old).map_err(failed)?;
    finish(g, &set_leader_answer(&o))
}

fn write(g: &Global, mut j: Journals, a: &WriteArgs) -> Result<(), CliError> {
    let id = resolve(g, &mut j, &a.journal)?;
    let records: Vec<&[u8]> = a.records.iter().map(|r| r.as_bytes()).collect();
    if a.multi {
        let o = j.write_multi(id, &records).map_err(failed)?;
        return finish(g, &write_answer(&o));
    }
    let leader = match a.leader {
        Some(u) => u,
        None => {
            let u = fresh_leader();
            note(g, &format!("writing as leader={u}, drawn at random (pass --leader {u} or set TEPHRA_LEADER to write as it again)"));
            u
        }
    };
    let budget = j.config().retry_budget;
    let mut w = JournalWriter::new(j, id, leader);
    if a.no_claim {
        let tail = match a.seq {
            Some(seq) => seq,
            None => match w.journals().read(id, 0, 1, 0).map_err(failed)? {
                ReadOutcome::Page { state, .. } | ReadOutcome::Truncated { state } => state.next_seq,
                ReadOutcome::UnknownJournal => return finish(g, &unknown_journal()),
                ReadOutcome::Unserved => return finish(g, &Answer::new("unserved", "unserved: no server could serve the read of the tail")),
                ReadOutcome::Ambiguous => return finish(g, &Answer::new("unserved", "unserved: the read of the tail got no answer")),
            },
        };
        w.assume_owned(tail);
    } else {
        let o = w.claim().map_err(failed)?;
        if let Some(answer) = claim_answer(&o) {
            return finish(g, &answer);
        }
        if let ClaimOutcome::Won { state } = &o {
            note(g, &format!("claimed {} as leader={leader} ({})", a.journal, state_text(state)));
        }
        if let Some(seq) = a.seq {
            w.assume_owned(seq);
        }
    }
    let mut tries = 0;
    loop {
        let o = w.write(&records).map_err(failed)?;
        // A refusal while I still lead means the tail moved: write at the tail it named, unless
        // the position was given.
        if let WriterOutcome::Refused { state } = &o {
            if a.seq.is_none() && tries < budget {
                tries += 1;
                note(g, &format!("the tail is at {}; writing there", state.next_seq));
                continue;
            }
        }
        return finish(g, &writer_answer(&o));
    }
}

/// Prints records as text lines (`seq<TAB>data`).
fn print_records(out: &mut impl Write, from: Seq, records: &[Vec<u8>]) -> io::Result<()> {
    for (i, r) in records.iter().enumerate() {
        writeln!(out, "{}\t{}", from + i as u64, data_text(r))?;
    }
    Ok(())
}

/// One read of a read or a tail command: a page, or the command's end with an answer.
enum Step {
    Page { from: Seq, records: Vec<Vec<u8>>, state: View },
    Gap { from: Seq, state: View },
    Nothing,
}

/// One read; unknown journals end the command, and no answer is `Step::Nothing` when
/// `patient` (tail), else it ends the command too.
fn step(g: &Global, j: &mut Journals, id: JournalId, from: Seq, limit: u64, wait_ms: u64, patient: bool) -> Result<Step, CliError> {
    match j.read(id, from, limit, wait_ms).map_err(failed)? {
        ReadOutcome::Page { from, records, state } => Ok(Step::Page { from, records, state }),
        ReadOutcome::Truncated { state } => Ok(Step::Gap { from, state }),
        ReadOutcome::UnknownJournal => finish(g, &unknown_journal()).map(|()| Step::Nothing),
        ReadOutcome::Unserved | ReadOutcome::Ambiguous if patient => Ok(Step::Nothing),
        ReadOutcome::Unserved => finish(g, &Answer::new("unserved", "unserved: no server could serve the read")).map(|()| Step::Nothing),
        ReadOutcome::Ambiguous => finish(g, &Answer::new("unserved", "unserved: the read got no answer")).map(|()| Step::Nothing),
    }
}

fn read(g: &Global, j: &mut Journals, a: &ReadArgs) -> Result<(), CliError> {
    let id = resolve(g, j, &a.journal)?;
    let mut from = a.from.unwrap_or(0);
    // `--limit 0` asks for one full page, as the wire's limit 0 does (docs/journals.md §7).
    let one_page = a.limit == Some(0);
    let mut left = a.limit.filter(|&l| l != 0);
    let mut waited = false;
    let mut records_json = Vec::new();
    let mut gaps = Vec::new();
    let mut last = View::default();
    let mut out = io::stdout().lock();
    while left != Some(0) {
        let wait = if waited { 0 } else { a.wait_ms };
        match step(g, j, id, from, left.unwrap_or(0), wait, false)? {
            Step::Nothing => break,
            Step::Gap { from: gap, state } => {
                last = state;
                if a.from.is_some() {
                    note(g, &format!("records {gap}..{} are truncated; reading on from {}", state.first_seq, state.first_seq));
                    gaps.push(json!({ "from": gap, "to": state.first_seq }));
                }
                from = state.first_seq;
            }
            Step::Page { from: at, records, state } => {
                last = state;
                if g.json {
                    records_json.extend(records.iter().enumerate().map(|(i, r)| record_json(at + i as u64, r)));
                } else {
                    print_records(&mut out, at, &records).map_err(CliError::output)?;
                }
                from = at + records.len() as u64;
                if let Some(l) = left.as_mut() {
                    *l = l.saturating_sub(records.len() as u64);
                }
                if one_page {
                    break;
                }
                if from >= state.next_seq {
                    // At the tail: wait there once (--wait-ms), then stop.
                    if records.is_empty() || waited || a.wait_ms == 0 {
                        break;
                    }
                    waited = true;
                }
            }
        }
    }
    if g.json {
        let doc = json!({ "outcome": "page", "journal": a.journal, "records": records_json, "gaps": gaps, "state": state_json(&last) });
        writeln!(out, "{doc}").map_err(CliError::output)?;
    } else {
        writeln!(out, "# {}", state_text(&last)).map_err(CliError::output)?;
    }
    out.flush().map_err(CliError::output)
}

fn tail(g: &Global, j: &mut Journals, a: &TailArgs) -> Result<(), CliError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let id = resolve(g, j, &a.journal)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| CliError::other(format!("installing the signal handler: {e}")))?;
    }
    let mut last = View::default();
    let mut from = match a.from {
        Some(f) => f,
        None => loop {
            match step(g, j, id, 0, 1, 0, true)? {
                Step::Page { state, .. } | Step::Gap { state, .. } => {
                    last = state;
                    break state.next_seq;
                }
                Step::Nothing if stop.load(Ordering::Relaxed) => return Ok(()),
                Step::Nothing => std::thread::sleep(Duration::from_millis(100)),
            }
        },
    };
    let mut away = false;
    while !stop.load(Ordering::Relaxed) {
        // A server that goes away (a restart, a crash) is waited for, as Ctrl-C ends a tail.
        let stepped = match step(g, j, id, from, 0, TAIL_WAIT_MS, true) {
            Err(e) if e.code == EXIT_NO_SERVER => {
                if !away {
                    note(g, &format!("{}; retrying until it answers (Ctrl-C to stop)", e.message));
                    away = true;
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            other => other?,
        };
        if away {
            note(g, "the server answers again; following on");
            away = false;
        }
        match stepped {
            Step::Nothing => std::thread::sleep(Duration::from_millis(100)),
            Step::Gap { from: gap, state } => {
                last = state;
                note(g, &format!("records {gap}..{} are truncated; following on from {}", state.first_seq, state.first_seq));
                from = state.first_seq;
            }
            Step::Page { from: at, records, state } => {
                last = state;
                if !records.is_empty() {
                    let mut out = io::stdout().lock();
                    if g.json {
                        let recs: Vec<Value> = records.iter().enumerate().map(|(i, r)| record_json(at + i as u64, r)).collect();
                        writeln!(out, "{}", json!({ "outcome": "page", "journal": a.journal, "records": recs, "state": state_json(&state) }))
                            .map_err(CliError::output)?;
                    } else {
                        print_records(&mut out, at, &records).map_err(CliError::output)?;
                    }
                    out.flush().map_err(CliError::output)?;
                }
                from = at + records.len() as u64;
            }
        }
    }
    if !g.json {
        let mut out = io::stdout().lock();
        writeln!(out, "# {}", state_text(&last)).and_then(|()| out.flush()).map_err(CliError::output)?;
    }
    Ok(())
}

fn truncate(g: &Global, j: &mut Journals, a: &TruncateArgs) -> Result<(), CliError> {
    let leader = match (a.multi, a.leader) {
        (true, _) => None,
        (false, Some(u)) => Some(u),
        (false, None) => {
            return Err(CliError::usage("a single-writer truncate needs the leader: --leader U (or TEPHRA_LEADER); --multi for a multi-writer journal"))
        }
    };
    let id = resolve(g, j, &a.journal)?;
    let o = j.truncate(id, a.up_to, leader).map_err(failed)?;
    finish(g, &truncate_answer(&o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(leader: Option<u128>, next_seq: Seq, first_seq: Seq) -> View {
        View { leader: leader.map(LeaderUuid), next_seq, first_seq }
    }

    #[test]
    fn uuid_arguments_are_hex_and_never_zero() {
        assert_eq!(leader_arg("a"), Ok(LeaderUuid(0xa)));
        assert_eq!(leader_arg("0xFF"), Ok(LeaderUuid(0xff)));
        assert!(leader_arg("0").unwrap_err().contains("unset uuid"));
        assert!(leader_arg("00").is_err());
        assert!(leader_arg("g").unwrap_err().contains("hex digits"));
        assert!(leader_arg(&"1".repeat(33)).unwrap_err().contains("at most 32"));
        assert_eq!(old_arg("none"), Ok(OldLeader(None)));
        assert_eq!(old_arg("NONE"), Ok(OldLeader(None)));
        assert_eq!(old_arg("b"), Ok(OldLeader(Some(LeaderUuid(0xb)))));
        assert!(old_arg("0").is_err());
    }

    #[test]
    fn answers_render_as_text_and_json() {
        let s = v(Some(0xb), 2, 0);
        let a = write_answer(&WriteOutcome::Written { seq: 0, count: 2, duplicate: false, state: v(Some(0xa), 2, 0) });
        assert_eq!(a.text, "written seq=0 count=2");
        assert_eq!(
            Value::Object(a.json.clone()),
            json!({"outcome": "accepted", "seq": 0, "count": 2, "duplicate": false, "state": {"leader": "a", "next_seq": 2, "first_seq": 0}})
        );
        assert_eq!(a.exit(), 0);
        let a = write_answer(&WriteOutcome::Written { seq: 0, count: 2, duplicate: true, state: s });
        assert_eq!((a.outcome, a.text.as_str()), ("duplicate", "written seq=0 count=2 duplicate"));
        let a = write_answer(&WriteOutcome::Refused { state: s });
        assert_eq!(a.text, "refused leader=b next_seq=2 first_seq=0");
        assert_eq!(Value::Object(a.json.clone()), json!({"outcome": "refused", "state": {"leader": "b", "next_seq": 2, "first_seq": 0}}));
        assert_eq!(a.exit(), 3);
        let a = write_answer(&WriteOutcome::TooLarge { max_records: 1024, max_bytes: 1048576 });
        assert_eq!(a.text, "too large max_records=1024 max_bytes=1048576");
        assert_eq!(Value::Object(a.json.clone()), json!({"outcome": "too_large", "max_records": 1024, "max_bytes": 1048576}));
        assert_eq!(write_answer(&WriteOutcome::Ambiguous).exit(), 4);
        assert_eq!(write_answer(&WriteOutcome::Busy).exit(), 5);
        assert_eq!(write_answer(&WriteOutcome::UnknownJournal).json["outcome"], "unknown_journal");
        let none = write_answer(&WriteOutcome::WrongMode { state: v(None, 7, 3) });
        assert_eq!(none.text, "wrong mode leader=none next_seq=7 first_seq=3");
        assert_eq!(none.json["state"]["leader"], Value::Null);
        let a = writer_answer(&WriterOutcome::Written { seq: 4, count: 1, duplicate: false, resolved: true, state: None });
        assert!(a.json.get("state").is_none());
        let a = writer_answer(&WriterOutcome::Written { seq: 4, count: 1, duplicate: false, resolved: false, state: Some(s) });
        assert_eq!((a.text.as_str(), a.json["state"]["next_seq"].as_u64()), ("written seq=4 count=1", Some(2)));
        let a = writer_answer(&WriterOutcome::Written { seq: 4, count: 1, duplicate: false, resolved: true, state: None });
        assert_eq!((a.outcome, a.text.as_str()), ("accepted", "written seq=4 count=1 resolved"));
        assert_eq!(a.json["resolved"], true);
        let a = writer_answer(&WriterOutcome::Superseded { state: s });
        assert_eq!((a.text.as_str(), a.exit()), ("superseded leader=b next_seq=2 first_seq=0", 3));
        assert_eq!(writer_answer(&WriterOutcome::NotWritten { state: s }).exit(), 3);
        assert_eq!(set_leader_answer(&SetLeaderOutcome::Won { state: s }).text, "leader leader=b next_seq=2 first_seq=0");
        assert_eq!(set_leader_answer(&SetLeaderOutcome::Lost { state: s }).exit(), 3);
        assert_eq!(truncate_answer(&TruncateOutcome::Applied { state: v(None, 9, 4) }).json["outcome"], "trimmed");
        let id = JournalId { tenant: 1, journal: 0xab };
        let a = create_answer("acme/orders", Mode::Single, StoreDurability::Batched, &CreateOutcome::Created { id });
        assert_eq!(a.text, "created acme/orders id=id:0000000000000001/00000000000000ab mode=single store=batched");
        assert_eq!(a.json["id"], "id:0000000000000001/00000000000000ab");
        let a = create_answer("acme/orders", Mode::Single, StoreDurability::Ordered, &CreateOutcome::NameTaken { id });
        assert_eq!((a.outcome, a.exit()), ("name_taken", 3));
        assert_eq!(create_answer("a/b", Mode::Multi, StoreDurability::Ordered, &CreateOutcome::InvalidName { message: "x".into() }).exit(), 2);
        assert_eq!(delete_answer("a/b", &DeleteOutcome::Deleted { state: s }).text, "deleted a/b leader=b next_seq=2 first_seq=0");
        assert!(claim_answer(&ClaimOutcome::Owned { state: s }).is_none());
        assert_eq!(claim_answer(&ClaimOutcome::Unread).unwrap().exit(), 5);
    }

    #[test]
    fn exit_codes_follow_the_table() {
        for (o, code) in [
            ("accepted", 0),
            ("duplicate", 0),
            ("leader", 0),
            ("trimmed", 0),
            ("created", 0),
            ("page", 0),
            ("refused", 3),
            ("lost", 3),
            ("superseded", 3),
            ("truncated", 3),
            ("wrong_mode", 3),
            ("unknown_journal", 3),
            ("name_taken", 3),
            ("too_large", 3),
            ("not_written", 3),
            ("ambiguous", 4),
            ("busy", 5),
            ("unserved", 5),
            ("not_leader", 5),
            ("invalid_name", 2),
            ("something_new", 1),
        ] {
            assert_eq!(exit_for(o), code, "{o}");
        }
        assert_eq!(failed(JournalError::Unreachable("x".into())).code, 5);
        assert_eq!(failed(JournalError::Invalid("x".into())).code, 2);
        assert_eq!(failed(JournalError::Name(NameError::Malformed("x".into()))).code, 2);
        assert_eq!(failed(JournalError::Name(NameError::Ambiguous { name: "id:1/2".into(), candidates: vec![] })).code, 2);
        assert_eq!(failed(JournalError::Server { code: tephra::proto::ErrorCode::BadRequest, message: "m".into() }).code, 1);
        assert!(failed(JournalError::Server { code: tephra::proto::ErrorCode::BadRequest, message: "m".into() })
            .message
            .contains("does not serve journal calls"));
    }

    #[test]
    fn records_render_as_text_or_base64() {
        assert_eq!(data_text(b"hello"), "hello");
        assert_eq!(data_text(b"a\tb\nc\\d"), "a\\tb\\nc\\\\d");
        assert_eq!(data_text("été".as_bytes()), "été");
        assert_eq!(data_text(&[0xff, 0x00]), "base64:/wA=");
        assert_eq!(record_json(3, b"r0"), json!({"seq": 3, "data": "r0"}));
        assert_eq!(record_json(4, &[0xff]), json!({"seq": 4, "data_base64": "/w=="}));
        let mut out = Vec::new();
        print_records(&mut out, 7, &[b"x".to_vec(), b"y z".to_vec()]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "7\tx\n8\ty z\n");
    }

    #[test]
    fn the_list_is_a_space_aligned_table() {
        let info = |t: &str, n: &str, leader: Option<u128>, first, next| JournalInfo {
            id: JournalId { tenant: 0xa, journal: 0xb },
            tenant_name: t.into(),
            name: n.into(),
            mode: Mode::Single,
            durability: StoreDurability::Ordered,
            state: v(leader, next, first),
            state_here: true,
            survive: None,
            voters: Vec::new(),
        };
        // A journal the answering node holds no copy of: its state is not known there.
        let elsewhere = JournalInfo { state_here: false, ..info("acme", "far", Some(0x7), 1, 9) };
        assert!(list_table(std::slice::from_ref(&elsewhere)).lines().nth(1).unwrap().ends_with("ordered  ?       ?      ?"));
        assert_eq!(info_json(&elsewhere)["state"], Value::Null);
        let table = list_table(&[info("acme", "orders", Some(0x7), 0, 12), info("acme", "b", None, 3, 3)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "NAME         ID                                    MODE    STORE    LEADER  FIRST  NEXT");
        assert_eq!(lines[1], "acme/orders  id:000000000000000a/000000000000000b  single  ordered  7       0      12");
        assert_eq!(lines[2], "acme/b       id:000000000000000a/000000000000000b  single  ordered  -       3      3");
        assert_eq!(list_table(&[]), "NAME  ID  MODE  STORE  LEADER  FIRST  NEXT\n");
        let j = info_json(&info("acme", "orders", Some(0x7), 0, 12));
        assert_eq!(j["journal"], "acme/orders");
        assert_eq!(j["state"]["leader"], "7");
    }
}
