//! The subcommands: arguments and implementations.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tephra::client::{ClientError, SequencedEvent, SubEvent};
use tephra::proto::ErrorCode;
use tephra::{AppendCondition, Event, EventType, Position, Query, QueryItem, Tags};

use crate::{connect, jsonl, CliError, Global};

/// Most events per `import` batch by default.
const DEFAULT_BATCH: usize = 1000;
/// Most encoded event bytes per `import` batch, well under the 16 MiB frame cap.
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Query flags: the types are OR'd, the tags AND'd; no flag matches every event.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Match events of this type (repeatable: any of them).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Match events carrying this tag (repeatable: all of them).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
}

impl QueryArgs {
    fn query(&self) -> Result<Query, CliError> {
        item_query(&self.types, &self.tags, "")
    }
}

/// One query item from type and tag flags (`None` of either = any); all events when both
/// are empty. `flag` prefixes the flag names in error messages.
fn item_query(types: &[String], tags: &[String], flag: &str) -> Result<Query, CliError> {
    if types.is_empty() && tags.is_empty() {
        return Ok(Query::all());
    }
    let types = types.iter().map(|t| EventType::new(t.as_str())).collect::<Result<Vec<_>, _>>().map_err(|e| CliError::usage(format!("--{flag}type: {e}")))?;
    let tags = Tags::new(tags.iter().map(String::as_str)).map_err(|e| CliError::usage(format!("--{flag}tag: {e}")))?;
    Ok(Query::item(QueryItem::new(types, tags)))
}

/// `tephra append`.
#[derive(Debug, Args)]
#[command(after_help = "\
Conditions: --if-type/--if-tag/--after/--fail-if-match make the append fail with CONFLICT
(exit 3) if an event matching that query exists after position --after (default 0: anywhere);
with no --if-* flag the query matches every event, so `--after 7` means \"only if nothing was
appended after 7\". --exists-type/--exists-tag/--fail-if-exists make it fail with
ALREADY_EXISTS (exit 3) if a matching event exists anywhere.

With --stdin, each line is {\"type\":..,\"tags\":[..],\"payload\":\"<utf-8>\"} (or
\"payload_base64\"); every line is validated before anything is sent, and the whole input is
appended as one atomic batch.")]
pub struct AppendArgs {
    /// The event's type.
    #[arg(long = "type", value_name = "TYPE", required_unless_present = "stdin")]
    event_type: Option<String>,
    /// A tag of the event (repeatable).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// The payload, as UTF-8 text.
    #[arg(long, value_name = "TEXT", conflicts_with = "payload_file")]
    payload: Option<String>,
    /// Read the payload's bytes from PATH (`-` for stdin).
    #[arg(long, value_name = "PATH")]
    payload_file: Option<PathBuf>,
    /// Read events as JSON lines from stdin instead (one atomic batch).
    #[arg(long, conflicts_with_all = ["event_type", "tags", "payload", "payload_file"])]
    stdin: bool,

    /// Fail with CONFLICT if an event matching --if-type/--if-tag (any event without them)
    /// exists after --after.
    #[arg(long)]
    fail_if_match: bool,
    /// Conflict query: an event type (repeatable: any of them). Implies --fail-if-match.
    #[arg(long = "if-type", value_name = "TYPE")]
    if_types: Vec<String>,
    /// Conflict query: a tag (repeatable: all of them). Implies --fail-if-match.
    #[arg(long = "if-tag", value_name = "TAG")]
    if_tags: Vec<String>,
    /// Only events after this position count for the conflict check. Implies
    /// --fail-if-match.
    #[arg(long, value_name = "POSITION")]
    after: Option<u64>,
    /// Fail with ALREADY_EXISTS if an event matching --exists-type/--exists-tag (any event
    /// without them) exists anywhere.
    #[arg(long)]
    fail_if_exists: bool,
    /// Existence query: an event type (repeatable: any of them). Implies --fail-if-exists.
    #[arg(long = "exists-type", value_name = "TYPE")]
    exists_types: Vec<String>,
    /// Existence query: a tag (repeatable: all of them). Implies --fail-if-exists.
    #[arg(long = "exists-tag", value_name = "TAG")]
    exists_tags: Vec<String>,
}

impl AppendArgs {
    fn condition(&self) -> Result<Option<AppendCondition>, CliError> {
        let boundary = self.fail_if_match || !self.if_types.is_empty() || !self.if_tags.is_empty() || self.after.is_some();
        let exists = self.fail_if_exists || !self.exists_types.is_empty() || !self.exists_tags.is_empty();
        let exists_query = if exists { Some(item_query(&self.exists_types, &self.exists_tags, "exists-")?) } else { None };
        if !boundary {
            return Ok(exists_query.map(AppendCondition::exists_only));
        }
        let mut cond = AppendCondition::new(item_query(&self.if_types, &self.if_tags, "if-")?).after(Position(self.after.unwrap_or(0)));
        if let Some(q) = exists_query {
            cond = cond.fail_if_exists(q);
        }
        Ok(Some(cond))
    }

    fn events(&self) -> Result<Vec<Event>, CliError> {
        if self.stdin {
            let events = jsonl::parse_all(io::stdin().lock()).map_err(|e| CliError::usage(format!("stdin {e}")))?;
            if events.is_empty() {
                return Err(CliError::usage("no events on stdin"));
            }
            return Ok(events);
        }
        let ty = EventType::new(self.event_type.clone().unwrap_or_default()).map_err(|e| CliError::usage(format!("--type: {e}")))?;
        let tags = Tags::new(self.tags.iter().map(String::as_str)).map_err(|e| CliError::usage(format!("--tag: {e}")))?;
        let payload = match (&self.payload, &self.payload_file) {
            (Some(p), _) => p.clone().into_bytes(),
            (None, Some(path)) if path.as_os_str() == "-" => {
                let mut buf = Vec::new();
                io::stdin().lock().read_to_end(&mut buf).map_err(|e| CliError::other(format!("reading stdin: {e}")))?;
                buf
            }
            (None, Some(path)) => std::fs::read(path).map_err(|e| CliError::other(format!("--payload-file {}: {e}", path.display())))?,
            (None, None) => Vec::new(),
        };
        let event = Event::new(&ty, &tags, &payload).map_err(|e| CliError::usage(format!("invalid event: {e}")))?;
        Ok(vec![event])
    }
}

/// `tephra append`: validate everything, then one append.
pub fn append(g: &Global, args: &AppendArgs) -> Result<(), CliError> {
    let condition = args.condition()?;
    let events = args.events()?;
    let n = events.len();
    // The largest frame one of these events needs alone (read back, the larger way).
    let largest = events.iter().map(|e| tephra::proto::batch::lone_event_frame_len(tephra::proto::batch::event_body_len(&e.as_ref()))).max().unwrap_or(0);
    // Each event's framed record on the server's log, to tell its per-event limit from its
    // per-append one.
    let records: Vec<u64> = events.iter().map(|e| (tephra::log::record::RECORD_HEAD + e.encoded_len()) as u64).collect();
    let mut client = connect(g, true)?;
    let r = client.append(events, condition).map_err(|e| {
        // An atomic batch over the server's frame cap, or this client's (`--max-frame-len`,
        // refused before sending), cannot be sent as one append at all; `import` helps only
        // when every event fits the cap alone.
        let cap = match &e {
            ClientError::Server { code: ErrorCode::TooLarge, message, .. } => tephra::proto::convert::text::frame_cap_of(message),
            ClientError::Frame(tephra::proto::FrameError::TooLong { max, .. }) => Some(*max),
            _ => None,
        };
        // The server's segments, not its frame cap. The reference's text names the capacity
        // even when the limit hit is the per-event quarter; the size it gives tells which:
        // one event's framed record (that check comes first), or the whole batch's bytes.
        let segments = match &e {
            ClientError::Server { code: ErrorCode::TooLarge, message, .. } => tephra::proto::convert::text::batch_size_of(message),
            _ => None,
        };
        let mut err = CliError::append("append failed", e);
        if n > 1 && cap.is_some_and(|cap| largest as u64 <= u64::from(cap)) {
            err.message.push_str(&format!(
                " (the {n} events are one atomic append and must fit one frame; `tephra import` appends them in batches that fit, not atomically)"
            ));
        }
        match segments {
            Some(_) if n == 1 => err.message.push_str(" (an event may take at most a quarter of the server's segment.size)"),
            // Importing cannot help: the event is refused however it is batched.
            Some(size) if records.contains(&size) => err.message.push_str(&format!(
                " (one of the {n} events is by itself too large for the server's segment.size: an event may take at most a quarter of a segment)"
            )),
            Some(_) => err.message.push_str(
                " (one append must fit one segment, and each event a quarter of one: segment.size; `tephra import` appends in batches that fit, not atomically)",
            ),
            None => {}
        }
        err
    })?;
    let mut out = io::stdout().lock();
    let written = if g.json {
        writeln!(out, "{}", serde_json::json!({ "first": r.first.get(), "last": r.last.get(), "count": n }))
    } else if n == 1 {
        writeln!(out, "appended 1 event at position {}", r.first)
    } else {
        writeln!(out, "appended {n} events at positions {}..={}", r.first, r.last)
    };
    written.map_err(CliError::output)
}

/// `tephra read`.
#[derive(Debug, Args)]
#[command(after_help = "\
Output: one line per event (position, type, tags, payload); a type or tag holding whitespace,
a bracket, a comma, a quote, a backslash or a control character is shown as a JSON string
(\"T x\"). --json gives one JSON object per event (the export format, with \"position\") and
a last line {\"watermark\":N}: the durable tip the read was pinned to. A forward read with
--after past that tip returns nothing and says so in a note on stderr.")]
pub struct ReadArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// Exclusive cursor: events after POSITION (default 0), or before it with --backward
    /// (default: from the tip).
    #[arg(long, value_name = "POSITION")]
    after: Option<u64>,
    /// At most N events.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Newest first.
    #[arg(long)]
    backward: bool,
}

/// `s` with its control characters escaped (`\n`, `\u{0}`), so one event stays one line.
fn visible(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect()
}

/// A type or tag as `read` and `subscribe` print it: as it is, or as a JSON string (quoted,
/// escaped) when it holds anything that would make the line ambiguous or break it: a space or
/// other whitespace, a bracket, a comma (the tag separator), a quote, a backslash or a control
/// character, or nothing at all.
fn shown_name(name: &str) -> String {
    let plain = !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '[' | ']' | ',' | '"' | '\\'));
    if plain {
        name.to_owned()
    } else {
        serde_json::Value::from(name).to_string()
    }
}

/// A human-readable line for one event: position, type, tags, payload; a type or tag that
/// could be misread is quoted (see [`shown_name`]), control characters in the payload are
/// escaped (`--json` gives the exact strings).
fn human_line(e: &SequencedEvent) -> String {
    let tags: Vec<String> = e.event.tags().map(shown_name).collect();
    let tags = tags.join(",");
    let data = e.event.data();
    let payload = match std::str::from_utf8(data) {
        Ok(s) => visible(s),
        Err(_) => {
            use base64::Engine as _;
            format!("base64:{}", base64::engine::general_purpose::STANDARD.encode(data))
        }
    };
    format!("{:>8}  {}  [{}]  {}", e.position, shown_name(e.event.event_type()), tags, payload)
}

fn event_output(g: &Global, e: &SequencedEvent) -> String {
    if g.json {
        jsonl::event_line(Some(e.position.get()), &e.event)
    } else {
        human_line(e)
    }
}

/// `tephra read`.
pub fn read(g: &Global, args: &ReadArgs) -> Result<(), CliError> {
    let query = args.query.query()?;
    let mut client = connect(g, true)?;
    let started = if args.backward {
        client.read_back(query, Position(args.after.unwrap_or(u64::MAX)), args.limit)
    } else {
        client.read(query, Position(args.after.unwrap_or(0)), args.limit)
    };
    let mut stream = started.map_err(|e| CliError::client("read failed", e))?;
    let mut out = BufWriter::new(io::stdout().lock());
    let mut count = 0u64;
    for item in stream.by_ref() {
        let e = item.map_err(|e| CliError::client("read failed", e))?;
        if let Err(err) = writeln!(out, "{}", event_output(g, &e)) {
            // Do not drain the rest of a read nobody will see.
            std::mem::forget(stream);
            return Err(CliError::output(err));
        }
        count += 1;
    }
    let watermark = stream.watermark().unwrap_or_default();
    drop(stream);
    if g.json {
        writeln!(out, "{}", serde_json::json!({ "watermark": watermark.get() })).map_err(CliError::output)?;
    }
    out.flush().map_err(CliError::output)?;
    if !g.json {
        eprintln!("({count} event{}, watermark {watermark})", if count == 1 { "" } else { "s" });
    }
    match args.after {
        Some(after) if !args.backward && after > watermark.get() => note(g, &format!("--after {after} is past the tip, {watermark}: no event follows it yet")),
        _ => {}
    }
    Ok(())
}

/// Says on stderr (`tephra: note: ...`, or a `{"note": ...}` line with `--json`) what a
/// successful command's output does not show, such as a start position past the store's tip:
/// the server answers that as any other (docs/protocol.md §8.2: a read from past the tip
/// ends at once with the tip as its watermark, a subscription's cursor starts at its `after`,
/// reported as "caught up at AFTER"), so without a note an empty result looks like no match.
fn note(g: &Global, message: &str) {
    if g.json {
        eprintln!("{}", serde_json::json!({ "note": message }));
    } else {
        eprintln!("tephra: note: {message}");
    }
}

/// `tephra subscribe`.
#[derive(Debug, Args)]
#[command(after_help = "\
Output: events as `read` prints them, as they arrive; the live edge is reported as
\"caught up at N\" on stderr, or as a {\"caught_up\":N} line with --json. With --after past the
store's tip, a note on stderr says so: the subscription is then caught up at --after and shows
only the events after it. Ctrl-C (or SIGTERM) cancels the subscription and exits 0.")]
pub struct SubscribeArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// Start after POSITION (default 0: from the beginning).
    #[arg(long, value_name = "POSITION", default_value_t = 0)]
    after: u64,
}

/// `tephra subscribe`: runs until Ctrl-C.
pub fn subscribe(g: &Global, args: &SubscribeArgs) -> Result<(), CliError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let query = args.query.query()?;
    let mut client = connect(g, false)?;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| CliError::other(format!("installing the Ctrl-C handler: {e}")))?;
    let signal_handle = signals.handle();
    if args.after > 0 {
        let tip = client.stats().map_err(|e| CliError::client("stats failed", e))?.event_count;
        if args.after > tip {
            let after = args.after;
            note(g, &format!("--after {after} is past the current tip, {tip}: the subscription skips the events up to {after} and shows those after it as the store reaches them (caught up at {after} meanwhile)"));
        }
    }
    let (stream, cancel) = client.subscribe(query, Position(args.after)).map_err(|e| CliError::client("subscribe failed", e))?;
    let watcher = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            cancel.cancel();
        }
    });
    let mut out = io::stdout().lock();
    let mut result = Ok(());
    for item in stream {
        let line = match item {
            Ok(SubEvent::Event(e)) => event_output(g, &e),
            Ok(SubEvent::CaughtUp(w)) if g.json => serde_json::json!({ "caught_up": w.get() }).to_string(),
            Ok(SubEvent::CaughtUp(w)) => {
                eprintln!("caught up at {w}");
                continue;
            }
            Err(e) => {
                result = Err(CliError::client("subscription failed", e));
                break;
            }
        };
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            result = Err(CliError::output(e));
            break;
        }
    }
    signal_handle.close();
    let _ = watcher.join();
    result
}

/// `tephra stats`.
pub fn stats(g: &Global) -> Result<(), CliError> {
    let mut client = connect(g, true)?;
    let s = client.stats().map_err(|e| CliError::client("stats failed", e))?;
    let text = if g.json {
        let mut v = serde_json::json!({
            "event_count": s.event_count,
            "segment_count": s.segment_count,
            "disk_bytes": s.disk_bytes,
            "uptime_seconds": s.uptime_seconds,
            "active_connections": s.active_connections,
            "active_subscriptions": s.active_subscriptions,
            "version": s.version,
            "connections_refused": s.connections_refused,
            "max_connections": s.max_connections,
            "connections_reaped": s.connections_reaped,
        });
        if !s.writer_stopped.is_empty() {
            v["writer_stopped"] = s.writer_stopped.clone().into();
        }
        v.to_string()
    } else {
        let cap = if s.max_connections == 0 { "unlimited".to_owned() } else { s.max_connections.to_string() };
        let mut lines = vec![
            format!("server version        {}", s.version),
            format!("events                {}", s.event_count),
            format!("segments              {}", s.segment_count),
            format!("disk                  {} ({})", s.disk_bytes, indicatif::BinaryBytes(s.disk_bytes)),
            format!("uptime                {}", indicatif::HumanDuration(std::time::Duration::from_secs(s.uptime_seconds))),
            format!("active connections    {} (max {cap})", s.active_connections),
            format!("active subscriptions  {}", s.active_subscriptions),
            format!("connections refused   {}", s.connections_refused),
            format!("connections reaped    {}", s.connections_reaped),
        ];
        if !s.writer_stopped.is_empty() {
            lines.push(format!("writer stopped        {}", s.writer_stopped));
        }
        lines.join("\n")
    };
    writeln!(io::stdout().lock(), "{text}").map_err(CliError::output)
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
fn progress(len: u64, what: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = format!("{{elapsed_precise}} [{{wide_bar}}] {{human_pos}}/{{human_len}} {what} ({{per_sec}}, eta {{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// SIGINT and SIGTERM caught for a command that stops at a safe point and then says what it
/// did (`import` after the batch in flight is answered, `export --output` after the event in
/// hand). A second signal ends the process at once, with the shell's code for it.
struct Interrupt {
    /// The number of the first signal that arrived, 0 before one did.
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Installs the handlers for the rest of the process.
    fn install() -> Result<Interrupt, CliError> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let signal = Arc::new(AtomicUsize::new(0));
        let caught = Arc::new(AtomicBool::new(false));
        let failed = |e: io::Error| CliError::other(format!("installing the SIGINT/SIGTERM handlers: {e}"));
        for sig in [SIGINT, SIGTERM] {
            // Runs first: at the second signal `caught` is set, and the process exits.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&caught)).map_err(failed)?;
            signal_hook::flag::register(sig, Arc::clone(&caught)).map_err(failed)?;
            signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize).map_err(failed)?;
        }
        Ok(Interrupt { signal })
    }

    /// The signal that arrived, if one did.
    fn caught(&self) -> Option<i32> {
        match self.signal.load(Ordering::Relaxed) {
            0 => None,
            n => i32::try_from(n).ok(),
        }
    }
}

/// A signal's name: `SIGINT` or `SIGTERM`.
fn signal_name(signal: i32) -> &'static str {
    if signal == signal_hook::consts::SIGTERM {
        "SIGTERM"
    } else {
        "SIGINT"
    }
}

/// `path` with `.partial` added to its file name: where `export --output` writes until the
/// export is complete.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// `tephra export`.
#[derive(Debug, Args)]
#[command(after_help = "\
Writes one JSON object per line, oldest first: {\"position\":N,\"type\":..,\"tags\":[..],
\"payload\":\"<utf-8>\"} (\"payload_base64\" when the payload is not UTF-8). `tephra import`
reads it back. A summary goes to stderr (to stdout with --output).

With --output FILE the events go to FILE.partial, which is synced and renamed to FILE once the
export is complete: FILE exists only whole (a FILE that is a symbolic link keeps pointing at
its target, which is replaced so). An export stopped by SIGINT/SIGTERM (exit 130/143) or by an
error leaves FILE.partial, does not create FILE, and says on stderr how many events
FILE.partial holds and the last position written. A FILE.partial already there is refused, not
replaced: it may hold an earlier export's events. FILE that is a FIFO or a device (not a
regular file), or a path through /dev/stdout, /dev/fd or /proc/.../fd, is written directly,
appending.")]
pub struct ExportArgs {
    #[command(flatten)]
    query: QueryArgs,
    /// Export the events after POSITION (default 0: from the first).
    #[arg(long, value_name = "POSITION", default_value_t = 0)]
    after: u64,
    /// ... up to and including POSITION (default: the tip when the export starts).
    #[arg(long, value_name = "POSITION")]
    to: Option<u64>,
    /// Write to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Where `export` writes: stdout, `FILE.partial` until the export is complete (`path` is where
/// it then goes), or straight into a FIFO or device.
enum ExportSink {
    Stdout(BufWriter<io::StdoutLock<'static>>),
    File { out: BufWriter<File>, partial: PathBuf, path: PathBuf },
    Direct { out: BufWriter<File>, path: PathBuf },
}

/// What `export --output PATH` finds at PATH.
enum OutputTarget {
    /// A regular file, or nothing yet: written as `PATH.partial`, then renamed to PATH (a
    /// symbolic link resolved to its target). `mode` is the permissions of the file replaced.
    Replace { path: PathBuf, mode: Option<std::fs::Permissions> },
    /// A FIFO, a device or a socket: written directly, as it cannot be replaced by a rename
    /// (review: `-o /dev/null` as root would have replaced the device with a regular file).
    Direct(PathBuf),
}

/// Judges `path` for `export --output`, following symbolic links one hop at a time (at most
/// 40): a regular file at the end of the chain, or nothing there yet, is replaced by a rename
/// (the links keep pointing at it); a FIFO, a device or a socket is written directly, and so is
/// a path through `/proc/.../fd` or `/dev/fd` (`/dev/stdout`, process substitution), which names
/// an open file rather than a place in a directory (review: `-o /dev/stdout >> app.log` had the
/// export renamed over `app.log`, its earlier lines gone).
///
/// # Errors
/// A directory (or a path ending in `/`), a chain of more than 40 links, or a path that
/// cannot be looked at (exit 1).
fn output_target(path: &Path) -> Result<OutputTarget, CliError> {
    let named = || CliError::other(format!("--output {} is a directory; name a file", path.display()));
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(named());
    }
    let looked = |e: io::Error| CliError::other(format!("--output {}: {e}", path.display()));
    let mut at = path.to_owned();
    for _ in 0..40 {
        if at.starts_with("/proc") || at.starts_with("/dev/fd") {
            return Ok(OutputTarget::Direct(path.to_owned()));
        }
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            // Nothing there yet (at the end of a chain of links, the links' target): created.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OutputTarget::Replace { path: at, mode: None }),
            Err(e) => return Err(looked(e)),
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&at).map_err(looked)?;
            at = match at.parent() {
                Some(dir) if target.is_relative() => dir.join(target),
                _ => target,
            };
            continue;
        }
        if meta.is_dir() {
            return Err(named());
        }
        if meta.is_file() {
            return Ok(OutputTarget::Replace { path: at, mode: Some(meta.permissions()) });
        }
        return Ok(OutputTarget::Direct(at));
    }
    Err(CliError::other(format!("--output {}: too many levels of symbolic links", path.display())))
}

/// Opens the sink for `--output path`.
fn open_output(path: &Path) -> Result<ExportSink, CliError> {
    match output_target(path)? {
        OutputTarget::Direct(path) => {
            // Appending: through `/dev/stdout` to a file the shell opened with `>>`, the
            // export goes after what the file holds, not over its start.
            let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| CliError::other(format!("--output {}: {e}", path.display())))?;
            Ok(ExportSink::Direct { out: BufWriter::new(file), path })
        }
        OutputTarget::Replace { path, mode } => {
            let partial = partial_path(&path);
            let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(&partial) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(CliError::other(format!(
                        "{} already exists: an earlier export to {} stopped short and left it, and it may hold that export's events; move it aside or remove it, then export again",
                        partial.display(),
                        path.display()
                    )))
                }
                Err(e) => return Err(CliError::other(format!("--output {}: {e}", partial.display()))),
            };
            if let Some(mode) = mode {
                // The file replaced keeps its permissions (best effort: a file of another
                // owner's cannot be given them).
                let _ = file.set_permissions(mode);
            }
            Ok(ExportSink::File { out: BufWriter::new(file), partial, path })
        }
    }
}

impl ExportSink {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            ExportSink::Stdout(out) => out,
            ExportSink::File { out, .. } | ExportSink::Direct { out, .. } => out,
        }
    }

    /// A failed write: a closed stdout stops quietly; a file names itself.
    fn write_error(&self, e: io::Error) -> CliError {
        match self {
            ExportSink::Stdout(_) => CliError::output(e),
            ExportSink::File { partial, .. } => CliError::other(format!("writing {}: {e}", partial.display())),
            ExportSink::Direct { path, .. } => CliError::other(format!("writing {}: {e}", path.display())),
        }
    }

    /// Flushes; for a file, syncs FILE.partial, renames it to FILE and syncs the directory.
    fn finish(self) -> Result<(), CliError> {
        match self {
            ExportSink::Stdout(mut out) => out.flush().map_err(CliError::output),
            ExportSink::Direct { mut out, path } => out.flush().map_err(|e| CliError::other(format!("writing {}: {e}", path.display()))),
            ExportSink::File { out, partial, path } => {
                let failed = |what: &str, e: io::Error| CliError::other(format!("{what} {}: {e}", partial.display()));
                let file = out.into_inner().map_err(|e| failed("writing", e.into_error()))?;
                file.sync_all().map_err(|e| failed("syncing", e))?;
                drop(file);
                std::fs::rename(&partial, &path).map_err(|e| CliError::other(format!("renaming {} to {}: {e}", partial.display(), path.display())))?;
                // Make the rename itself durable (best effort: not every file system can).
                let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                if let Ok(d) = File::open(dir) {
                    let _ = d.sync_all();
                }
                Ok(())
            }
        }
    }
}

/// What an export stopped short wrote into `partial`, its FILE.partial (`count` events, at
/// positions `first..=last`): appended to its error message. Exporting the rest to the same
/// FILE would be refused while FILE.partial is there, so the advice says to move it aside first.
fn partial_note(partial: &Path, path: &Path, count: u64, first: u64, last: u64) -> String {
    format!(
        "; the export is incomplete: {} holds {} (positions {first}..={last}; the last position written is {last}: move it aside, and --after {last} exports the rest); {} was not created",
        partial.display(),
        events_word(count),
        path.display()
    )
}

/// What an export stopped short wrote straight into `path` (a FIFO or a device).
fn direct_note(path: &Path, count: u64, first: Option<u64>, last: Option<u64>) -> String {
    match (first, last) {
        (Some(a), Some(b)) => format!(
            "; the export is incomplete: {} was written {} (positions {a}..={b}; the last position written is {b}, and --after {b} exports the rest if its reader took them all: one that stopped reading took fewer)",
            path.display(),
            events_word(count)
        ),
        _ => format!("; the export is incomplete: {} was written 0 events", path.display()),
    }
}

/// What an export has written so far: how many events, at which positions.
#[derive(Clone, Copy, Default)]
struct Exported {
    count: u64,
    first: Option<u64>,
    last: Option<u64>,
}

/// `tephra export`: one pinned read streamed to JSON lines.
pub fn export(g: &Global, args: &ExportArgs) -> Result<(), CliError> {
    if let Some(to) = args.to.filter(|&to| to < args.after) {
        return Err(CliError::usage(format!(
            "--to {to} is before --after {}: the range (after {}, up to and including {to}) holds no position",
            args.after, args.after
        )));
    }
    let query = args.query.query()?;
    let mut client = connect(g, true)?;
    let tip = client.stats().map_err(|e| CliError::client("stats failed", e))?.event_count;
    if args.after > tip {
        note(g, &format!("--after {} is past the tip, {tip}: no event follows it yet", args.after));
    }
    let end = args.to.map_or(tip, |t| t.min(tip));
    let mut sink = match &args.output {
        Some(path) => open_output(path)?,
        None => ExportSink::Stdout(BufWriter::new(io::stdout().lock())),
    };
    // Installed once the output is open: a signal while a FIFO waits for its reader ends the
    // export at once (review: the handlers let the open go on, and one SIGTERM did nothing).
    let interrupt = if args.output.is_some() { Some(Interrupt::install()?) } else { None };
    let bar = progress(end.saturating_sub(args.after), "events");
    let mut exported = Exported::default();
    match export_events(&mut client, query, args, &mut sink, interrupt.as_ref(), &bar, &mut exported) {
        Ok(()) => sink.finish()?,
        Err(e) => return Err(export_stopped(e, sink, exported, &bar)),
    }
    bar.finish_and_clear();
    let summary = if g.json {
        serde_json::json!({ "exported": exported.count, "first": exported.first, "last": exported.last }).to_string()
    } else {
        match (exported.first, exported.last) {
            (Some(a), Some(b)) => format!("exported {} (positions {a}..={b})", events_word(exported.count)),
            _ => "exported 0 events".to_owned(),
        }
    };
    if args.output.is_some() {
        writeln!(io::stdout().lock(), "{summary}").map_err(CliError::output)
    } else {
        eprintln!("{summary}");
        Ok(())
    }
}

/// Streams the events of `query` in the export's range into `sink`, one JSON line each,
/// counting them in `exported`; stops at a signal caught by `interrupt`.
fn export_events(
    client: &mut tephra::client::Client,
    query: Query,
    args: &ExportArgs,
    sink: &mut ExportSink,
    interrupt: Option<&Interrupt>,
    bar: &ProgressBar,
    exported: &mut Exported,
) -> Result<(), CliError> {
    // Positions are dense, so an unfiltered range is an exact limit.
    let limit = match (args.to, &query) {
        (Some(to), Query::All) => Some(to.saturating_sub(args.after)),
        _ => None,
    };
    let mut stream = client.read(query, Position(args.after), limit).map_err(|e| CliError::client("export failed", e))?;
    for item in stream.by_ref() {
        if let Some(sig) = interrupt.and_then(Interrupt::caught) {
            std::mem::forget(stream);
            return Err(CliError::interrupted(sig, format!("export interrupted by {}", signal_name(sig)), serde_json::Map::new()));
        }
        let e = item.map_err(|e| CliError::client("export failed", e))?;
        let p = e.position.get();
        if args.to.is_some_and(|to| p > to) {
            break;
        }
        if let Err(err) = writeln!(sink.writer(), "{}", jsonl::event_line(Some(p), &e.event)) {
            std::mem::forget(stream);
            return Err(sink.write_error(err));
        }
        exported.count += 1;
        exported.first.get_or_insert(p);
        exported.last = Some(p);
        bar.set_position(p.saturating_sub(args.after));
    }
    Ok(())
}

/// The error `e` of an export stopped short, saying what it left behind: a FILE.partial with
/// events is kept and synced (an empty one is removed), a FIFO or device is flushed.
fn export_stopped(mut e: CliError, sink: ExportSink, exported: Exported, bar: &ProgressBar) -> CliError {
    let Exported { count, first, last } = exported;
    let (mut out, note, file) = match sink {
        ExportSink::File { out, partial, path } => match (first, last) {
            (Some(a), Some(b)) => (out, partial_note(&partial, &path, count, a, b), ("partial_file", partial)),
            _ => {
                // Nothing in it: removed, so that it does not hold up the next export.
                drop(out);
                let _ = std::fs::remove_file(&partial);
                bar.abandon();
                e.message.push_str(&format!("; nothing was exported and {} was not created", path.display()));
                return e;
            }
        },
        ExportSink::Direct { out, path } => (out, direct_note(&path, count, first, last), ("output", path)),
        ExportSink::Stdout(_) => return e,
    };
    let _ = out.flush();
    let _ = out.get_ref().sync_all();
    bar.abandon();
    e.message.push_str(&note);
    let details = e.details.get_or_insert_with(serde_json::Map::new);
    details.insert(file.0.into(), file.1.display().to_string().into());
    details.insert("exported".into(), count.into());
    details.insert("first".into(), first.into());
    details.insert("last".into(), last.into());
    e
}

/// `tephra import`.
#[derive(Debug, Args)]
#[command(after_help = "\
Reads JSON lines in the `export` format (\"position\" is optional and ignored). Every line is
validated before anything is appended: a bad line is reported with its number (exit 2) and
nothing is written. The events are then appended in order, in batches (each batch is atomic;
if a batch fails, the earlier ones stay and the error says how far the import got). Positions
in the target are assigned afresh: into an empty store, an export from position 1 keeps its
positions.

Running an import again appends every event again: nothing is deduplicated. To resume one
that stopped, skip the lines already appended with --skip-lines N; an import stopped by
SIGINT/SIGTERM (exit 130/143: it stops once the batch in flight is answered) or by a failed
batch says the N to use on stderr. A signal while the input is still being read ends the
import at once, with nothing appended.")]
pub struct ImportArgs {
    /// The JSON-lines file (`-` or none: stdin).
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Events per append (at most; batches also stay under 8 MiB, and one the server refuses
    /// as too large, for its segments or its frame cap, is sent again in halves).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    batch: usize,
    /// Skip the first N lines of the input, unread (to resume an import that stopped after
    /// appending them).
    #[arg(long, value_name = "N", default_value_t = 0)]
    skip_lines: usize,
}

/// "1 event", "2 events".
fn events_word(n: u64) -> String {
    if n == 1 {
        "1 event".to_owned()
    } else {
        format!("{n} events")
    }
}

/// Splits `events` into batches of at most `max` events and about [`MAX_BATCH_BYTES`].
fn batches(events: Vec<Event>, max: usize) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut bytes = 0;
    for e in events {
        let size = e.encoded_len();
        if !cur.is_empty() && (cur.len() >= max || bytes + size > MAX_BATCH_BYTES) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += size;
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The input of an import, read and validated whole: its events, with where they stand in it.
struct ImportInput {
    /// The input's name in messages: its path, or `stdin`.
    name: String,
    /// The events, in input order.
    events: Vec<Event>,
    /// Each event's line number in the input (1-based).
    lines: Vec<usize>,
    /// How many lines the input has in all, skipped ones included.
    line_count: usize,
    /// The lines skipped unread (`--skip-lines`).
    skip_lines: usize,
}

impl ImportInput {
    /// Reads and validates the whole input named by `args` (a file, or stdin).
    ///
    /// # Errors
    /// The file cannot be opened; a line is not an event (exit 2); `--skip-lines` is past
    /// the end of the input (exit 2).
    fn read(args: &ImportArgs) -> Result<ImportInput, CliError> {
        let (name, input): (String, Box<dyn BufRead>) = match &args.file {
            Some(path) if path.as_os_str() != "-" => {
                let file = File::open(path).map_err(|e| CliError::other(format!("{}: {e}", path.display())))?;
                (path.display().to_string(), Box::new(BufReader::new(file)))
            }
            _ => ("stdin".to_owned(), Box::new(io::stdin().lock())),
        };
        let parsed = jsonl::parse_from(input, args.skip_lines).map_err(|e| CliError::usage(format!("{name} {e}")))?;
        if args.skip_lines > parsed.line_count {
            return Err(CliError::usage(format!(
                "--skip-lines {} is more than the {} line{} of {name}",
                args.skip_lines,
                parsed.line_count,
                if parsed.line_count == 1 { "" } else { "s" }
            )));
        }
        let jsonl::Parsed { events, lines, line_count } = parsed;
        Ok(ImportInput { name, events, lines, line_count, skip_lines: args.skip_lines })
    }

    /// The `--skip-lines` that resumes after the first `done` events: every line before the
    /// next event's (blank lines included), or every line once all are appended.
    fn resume_at(&self, done: u64) -> usize {
        self.lines.get(done as usize).map_or(self.line_count, |&n| n - 1)
    }
}

/// How far an import has got: events and batches appended, at which positions.
#[derive(Default)]
struct Imported {
    done: u64,
    batches: usize,
    first: Option<Position>,
    last: Option<Position>,
}

impl Imported {
    /// The error of an import stopped by `sig` before the next batch: what went in, and the
    /// `--skip-lines` that resumes it.
    fn interrupted(&self, sig: i32, input: &ImportInput, total: u64) -> CliError {
        let (done, line_count, name) = (self.done, input.line_count, &input.name);
        let resume = input.resume_at(done);
        let skipped = if input.skip_lines > 0 { format!(" (the first {} skipped)", input.skip_lines) } else { String::new() };
        let appended = match (self.first, self.last) {
            (Some(a), Some(b)) => format!("appended {done} of its {total} events (positions {a}..={b}; the last position written is {b})"),
            _ => format!("appended none of its {}", events_word(total)),
        };
        // Blank lines before the first event count toward `resume`, not as lines in.
        let went_in = match resume {
            _ if done == 0 && input.skip_lines == 0 => "no input line went in".to_owned(),
            _ if done == 0 => "no further input line went in".to_owned(),
            r => format!("input lines {}..={r} went in", input.skip_lines + 1),
        };
        let message = format!(
            "import interrupted by {}: read {line_count} line{} of {name}{skipped}, {appended}; {went_in}. Running the import again appends everything again (nothing is deduplicated): to resume, run it again with --skip-lines {resume}",
            signal_name(sig),
            if line_count == 1 { "" } else { "s" },
        );
        let mut details = serde_json::Map::new();
        details.insert("lines_read".into(), line_count.into());
        details.insert("imported".into(), done.into());
        details.insert("first".into(), self.first.map(Position::get).into());
        details.insert("last".into(), self.last.map(Position::get).into());
        details.insert("resume_skip_lines".into(), resume.into());
        CliError::interrupted(sig, message, details)
    }

    /// The error of a batch of `batch_len` events that failed with `e`: how far the import got,
    /// the failed batch's lines, and how to resume.
    fn failed(&self, e: ClientError, batch_len: usize, input: &ImportInput, total: u64) -> CliError {
        let (done, name) = (self.done, &input.name);
        let so_far = match (self.first, self.last) {
            (Some(a), Some(b)) => format!("{done} of {total} events were appended (positions {a}..={b})"),
            _ => format!("nothing was appended ({} to go)", events_word(total)),
        };
        // Batches go in input order, so the failed one starts at event `done`.
        let failed = match (input.lines.get(done as usize), input.lines.get(done as usize + batch_len - 1)) {
            (Some(a), Some(b)) if a == b => format!("; the failed batch is {name} line {a}"),
            (Some(a), Some(b)) => format!("; the failed batch is {name} lines {a}..={b}"),
            _ => String::new(),
        };
        // Only a lone event is refused for the segments here (larger batches were halved).
        let hint = match &e {
            ClientError::Server { code: ErrorCode::TooLarge, message, .. } if tephra::proto::convert::text::batch_size_of(message).is_some() => {
                " (an event may take at most a quarter of the server's segment.size)"
            }
            _ => "",
        };
        let mut err = CliError::append("import failed", e);
        // A lost connection may have lost the answer to an append that went in.
        let resume = match err.code {
            4 => format!(
                "; the failed batch may or may not be in the store (the connection was lost before its answer): check before resuming with --skip-lines {}",
                input.resume_at(done)
            ),
            _ => format!("; to resume from the failed batch, run the import again with --skip-lines {}", input.resume_at(done)),
        };
        err.message = format!("{}{hint}; {so_far}{failed}{resume}", err.message);
        err
    }

    /// The summary of a finished import: text, or JSON with `--json`.
    fn summary(&self, g: &Global) -> String {
        let count = self.batches;
        if g.json {
            serde_json::json!({
                "imported": self.done,
                "batches": count,
                "first": self.first.map(Position::get),
                "last": self.last.map(Position::get),
            })
            .to_string()
        } else {
            match (self.first, self.last) {
                (Some(a), Some(b)) => {
                    format!("imported {} in {count} batch{} (positions {a}..={b})", events_word(self.done), if count == 1 { "" } else { "es" })
                }
                _ => "imported 0 events".to_owned(),
            }
        }
    }
}

/// Whether an append of more than one event came back refused as too large, so that nothing
/// of it was appended and it can go again in halves. Over the server's frame cap the server
/// closed the connection: `client` is then connected again, and refuses later batches over
/// that cap before sending them.
fn refused_as_too_large<T>(r: &Result<T, ClientError>, client: &mut tephra::client::Client, g: &Global) -> Result<bool, CliError> {
    Ok(match r {
        // Too large for the store's segments (the connection stays open).
        Err(ClientError::Server { code: ErrorCode::TooLarge, message, .. }) => {
            // Or over the server's frame cap: it closed the connection.
            if let Some(cap) = tephra::proto::convert::text::frame_cap_of(message) {
                *client = connect(g, true)?;
                client.set_max_frame_len(cap);
            }
            true
        }
        // Over the cap learned above: refused before anything was sent.
        Err(ClientError::Frame(tephra::proto::FrameError::TooLong { .. })) => true,
        _ => false,
    })
}

/// `tephra import`: validate the whole input, then append batch by batch.
pub fn import(g: &Global, args: &ImportArgs) -> Result<(), CliError> {
    let mut input = ImportInput::read(args)?;
    // Installed once the input is read, so that a signal while it is still being read (from a
    // pipe or a terminal, which the handlers would not interrupt) ends the process at once,
    // before anything is appended (review: the first Ctrl-C waited for the end of the input).
    let interrupt = Interrupt::install()?;
    let total = input.events.len() as u64;
    let mut client = connect(g, true)?;
    let bar = progress(total, "events");
    let mut imported = Imported::default();
    let mut queue: std::collections::VecDeque<Vec<Event>> = batches(std::mem::take(&mut input.events), args.batch).into();
    while let Some(mut batch) = queue.pop_front() {
        if let Some(sig) = interrupt.caught() {
            bar.abandon();
            return Err(imported.interrupted(sig, &input, total));
        }
        let n = batch.len() as u64;
        let r = client.append_refs(&batch, None);
        // Nothing of a batch refused as too large was appended: it goes again in halves.
        if batch.len() > 1 && refused_as_too_large(&r, &mut client, g)? {
            let back = batch.split_off(batch.len() / 2);
            queue.push_front(back);
            queue.push_front(batch);
            continue;
        }
        let r = r.map_err(|e| {
            bar.abandon();
            imported.failed(e, batch.len(), &input, total)
        })?;
        imported.first.get_or_insert(r.first);
        imported.last = Some(r.last);
        imported.done += n;
        imported.batches += 1;
        bar.set_position(imported.done);
    }
    bar.finish_and_clear();
    writeln!(io::stdout().lock(), "{}", imported.summary(g)).map_err(CliError::output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_count_and_size() {
        let ev = |n: usize| Event::new(&EventType::new("E").unwrap(), &Tags::empty(), &vec![0u8; n]).unwrap();
        let sizes: Vec<usize> = batches((0..10).map(|_| ev(1)).collect(), 4).iter().map(Vec::len).collect();
        assert_eq!(sizes, [4, 4, 2]);
        let big = batches((0..5).map(|_| ev(3 * 1024 * 1024)).collect(), 1000);
        assert_eq!(big.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(batches(Vec::new(), 3).is_empty());
    }
}
