//! Layered resolution: defaults < `--config` file < `TEPHRA__*` environment < flags.
//!
//! The file is parsed into a TOML table and every `TEPHRA__*` variable is merged into that table
//! at its key path. Scalars are then brought to the type their key expects (see `coerce`) and
//! the merged table is deserialized into [`Settings`] once, so unknown keys and wrong types are
//! reported the same way whichever source they came from. Each source is also checked on its own
//! first, so an error names the file position or the variable at fault. Then the flags are
//! applied and the result is validated.
//! See docs/operations.md §1.2.

use std::io;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::cli::ServerArgs;
use super::error::{ConfigError, Origin};
use super::settings::{AuthSettings, ClusterSettings, MetricsSettings, Settings, TlsSettings, TokenSettings};

/// Prefix of the environment variables that set configuration keys, matched without regard to
/// case. The rest of the name is the key path joined with [`ENV_SEPARATOR`], so
/// `TEPHRA__SERVER__KEEPALIVE__IDLE_SECS` sets `server.keepalive.idle_secs`.
pub const ENV_PREFIX: &str = "TEPHRA__";
/// Separator between the path segments of a `TEPHRA__*` variable name.
pub const ENV_SEPARATOR: &str = "__";

/// The configuration file's path and contents, for [`resolve_sources`].
#[derive(Clone, Copy, Debug)]
pub struct FileSource<'a> {
    /// Where the text came from; used in error messages only.
    pub path: &'a Path,
    /// The TOML text.
    pub text: &'a str,
}

/// The command-line layer: the only settings the flags carry. `None` leaves the lower layers'
/// value in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--bind`: replaces `bind`.
    pub bind: Option<String>,
    /// `--data-dir`: replaces `data_dir`.
    pub data_dir: Option<PathBuf>,
    /// `--log`: replaces `log`.
    pub log: Option<String>,
}

impl Overrides {
    /// Writes every set override into `settings`.
    pub fn apply(&self, settings: &mut Settings) {
        if let Some(bind) = &self.bind {
            settings.bind = bind.clone();
        }
        if let Some(dir) = &self.data_dir {
            settings.data_dir = dir.clone();
        }
        if let Some(log) = &self.log {
            settings.log = Some(log.clone());
        }
    }
}

impl From<&ServerArgs> for Overrides {
    fn from(args: &ServerArgs) -> Self {
        Overrides { bind: args.bind.clone(), data_dir: args.data_dir.clone(), log: args.log.clone() }
    }
}

/// Resolves the server's settings exactly as `tephra-server` (and `--healthcheck`) does: reads
/// the `--config` file if given, layers `env` (pass [`process_env`] in the binary; any iterator in
/// tests) and the flags over it, and validates the result.
///
/// Errors: [`ConfigError::FileNotFound`] (`configuration file "/x.toml" not found`),
/// [`ConfigError::FileUnreadable`], [`ConfigError::Syntax`], [`ConfigError::EnvName`],
/// [`ConfigError::Schema`] (unknown key, wrong type), [`ConfigError::Invalid`] (a validation
/// rule). See docs/operations.md §1.2, §7.
pub fn resolve(args: &ServerArgs, env: impl IntoIterator<Item = (String, String)>) -> Result<Settings, ConfigError> {
    let text = args.config.as_deref().map(read_config_file).transpose()?;
    let file = args.config.as_deref().zip(text.as_deref()).map(|(path, text)| FileSource { path, text });
    resolve_sources(file, env, &Overrides::from(args))
}

/// Reads the `--config` file. Like the reference, when `path` is not a regular file the same
/// name with `.toml` appended is tried (`--config /etc/tephra` finds `/etc/tephra.toml`). When
/// neither is a file the error is [`ConfigError::FileNotFound`],
/// `configuration file "<path as given>" not found` ([`ConfigError::IsADirectory`], the same
/// words and why, for a directory); any failure to read the file found
/// (permissions, text that is not UTF-8) is [`ConfigError::FileUnreadable`].
pub fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    let found = if path.is_file() {
        path.to_owned()
    } else {
        let mut with_ext = path.as_os_str().to_owned();
        with_ext.push(".toml");
        let with_ext = PathBuf::from(with_ext);
        if !with_ext.is_file() {
            if path.is_dir() {
                return Err(ConfigError::IsADirectory { path: path.to_owned() });
            }
            return Err(ConfigError::FileNotFound { path: path.to_owned() });
        }
        with_ext
    };
    std::fs::read_to_string(&found).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => ConfigError::FileNotFound { path: path.to_owned() },
        _ => ConfigError::FileUnreadable { path: found, source },
    })
}

/// The pure core of [`resolve`]: the same layering and validation over an already-read file (or
/// none), an environment and the flag overrides. Touches neither the filesystem nor the process
/// environment.
pub fn resolve_sources(file: Option<FileSource<'_>>, env: impl IntoIterator<Item = (String, String)>, overrides: &Overrides) -> Result<Settings, ConfigError> {
    let kinds = key_kinds();
    let mut table = match file {
        Some(file) => parse_file(file, &kinds)?,
        None => Table::new(),
    };

    for (var, path, raw) in env_vars(env)? {
        // A negative whole number past what TOML holds (i64) would otherwise be reported as a
        // string where a number belongs (a positive one is clamped by `coerce`).
        if let (Some(Value::Integer(_)), Ok(n)) = (kind_at(&kinds, &path), raw.trim().parse::<i128>()) {
            if n < i128::from(i64::MIN) {
                return Err(ConfigError::Schema {
                    key: path.join("."),
                    message: format!("{n} is out of range: configuration numbers are 64-bit signed integers ({} to {})", i64::MIN, i64::MAX),
                    origin: Origin::Env { var },
                });
            }
        }
        let value = env_value(raw, kind_at(&kinds, &path));
        // Check the variable on its own first, so an error names it.
        let mut alone = Table::new();
        insert_path(&mut alone, &path, value.clone());
        check(alone, &kinds).map_err(|(key, message)| ConfigError::Schema { key, message, origin: Origin::Env { var: var.clone() } })?;
        insert_path(&mut table, &path, value);
    }

    let mut settings = check(table, &kinds).map_err(|(key, message)| ConfigError::Schema { key, message, origin: Origin::Combined })?;
    overrides.apply(&mut settings);
    settings.validate()?;
    Ok(settings)
}

impl Settings {
    /// Parses one TOML document as a complete configuration (defaults for what it leaves out)
    /// and validates it; no environment, no flags. An empty string gives `Settings::default()`.
    /// Errors as for [`resolve_sources`]; positions refer to `<string>`.
    pub fn from_toml_str(text: &str) -> Result<Settings, ConfigError> {
        let file = FileSource { path: Path::new("<string>"), text };
        resolve_sources(Some(file), std::iter::empty(), &Overrides::default())
    }
}

/// The process environment as `(name, value)` pairs for [`resolve`] and
/// [`Settings::log_filter`]. Unlike `std::env::vars` it does not panic on a variable that is not
/// Unicode: such a variable is skipped (it could not name a valid key or value anyway).
pub fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// Parses the file to a table, then checks it against the schema on its own, so that an unknown
/// key or a wrong type is reported with its line and column.
fn parse_file(file: FileSource<'_>, kinds: &Table) -> Result<Table, ConfigError> {
    let table: Table = file.text.parse().map_err(|e: toml::de::Error| {
        let (line, column) = e.span().map_or((1, 1), |span| line_column(file.text, span.start));
        ConfigError::Syntax { path: file.path.to_owned(), line, column, message: one_line(e.message()) }
    })?;
    if let Err((key, message, path)) = check_with_path(table.clone(), kinds) {
        // Point at the offending value, or at the key when the key itself is unknown.
        let at_value = !message.starts_with("unknown field");
        let position = locate(file.text, &path, at_value);
        return Err(ConfigError::Schema { key, message, origin: Origin::File { path: file.path.to_owned(), position } });
    }
    Ok(table)
}

/// Coerces and deserializes a table, reporting the dotted key and serde's message on failure.
fn check(table: Table, kinds: &Table) -> Result<Settings, (String, String)> {
    check_with_path(table, kinds).map_err(|(key, message, _)| (key, message))
}

fn check_with_path(mut table: Table, kinds: &Table) -> Result<Settings, (String, String, serde_path_to_error::Path)> {
    coerce(&mut table, kinds);
    serde_path_to_error::deserialize(Value::Table(table)).map_err(|e| {
        let path = e.path().clone();
        (key_path(&path), one_line(e.into_inner().message()), path)
    })
}

/// 1-based line and column of the key (or, with `at_value`, its value) at `path` in the TOML
/// `text`, found by walking a span-preserving parse of the document.
fn locate(text: &str, path: &serde_path_to_error::Path, at_value: bool) -> Option<(usize, usize)> {
    use serde_path_to_error::Segment;
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut item = doc.as_item();
    let mut span = None;
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => {
                let (k, next) = item.as_table_like()?.get_key_value(key)?;
                span = k.span().or(span);
                item = next;
            }
            Segment::Seq { index } => {
                item = item.get(*index)?;
                span = item.span().or(span);
            }
            Segment::Enum { .. } | Segment::Unknown => break,
        }
    }
    if at_value {
        span = item.span().or(span);
    }
    span.map(|span| line_column(text, span.start))
}

/// Parser messages may span lines; the error is printed on one.
fn one_line(message: &str) -> String {
    message.trim().lines().map(str::trim).collect::<Vec<_>>().join("; ")
}

/// `serde_path_to_error` renders the root as `.`; we want an empty string there.
fn key_path(path: &serde_path_to_error::Path) -> String {
    let rendered = path.to_string();
    if rendered == "." {
        String::new()
    } else {
        rendered
    }
}

/// 1-based line and character column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Prefix of the journal seed's own variables, each an alias of a `[journal]` key.
pub const PAROS_PREFIX: &str = "PAROS_";
/// The `PAROS_*` variables (after the prefix) and the `[journal]` key each one sets.
pub const PAROS_KEYS: [(&str, &str); 7] = [
    ("MAX_BATCH_RECORDS", "max_batch_records"),
    ("MAX_BATCH_BYTES", "max_batch_bytes"),
    ("MAX_READ_RECORDS", "max_read_records"),
    ("MAX_READ_BYTES", "max_read_bytes"),
    ("MAX_WAIT_MS", "max_wait_ms"),
    ("MIN_WAIT_MS", "min_wait_ms"),
    ("ADMISSION_ROUNDS", "admission_rounds"),
];

/// The `[journal]` path a `PAROS_*` variable sets; `Ok(None)` for any other variable.
fn paros_path(name: &str) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(rest) = name.strip_prefix(PAROS_PREFIX) else {
        return Ok(None);
    };
    match PAROS_KEYS.iter().find(|(var, _)| *var == rest) {
        Some((_, key)) => Ok(Some(vec!["journal".to_owned(), (*key).to_owned()])),
        None => Err(ConfigError::UnknownParos {
            var: name.to_owned(),
            known: PAROS_KEYS.iter().map(|(v, _)| format!("{PAROS_PREFIX}{v}")).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The `TEPHRA__*` and `PAROS_*` variables of `env` as `(name, lower-cased path, value)`, sorted
/// so the outcome does not depend on the environment's order: every `PAROS_*` variable comes
/// before every `TEPHRA__*` one, so that `TEPHRA__JOURNAL__*` wins over its `PAROS_*` alias.
fn env_vars(env: impl IntoIterator<Item = (String, String)>) -> Result<Vec<(String, Vec<String>, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in env {
        if let Some(path) = paros_path(&name)? {
            vars.push((name, path, value));
            continue;
        }
        let Some(rest) = name.get(..ENV_PREFIX.len()).filter(|prefix| prefix.eq_ignore_ascii_case(ENV_PREFIX)).map(|_| &name[ENV_PREFIX.len()..]) else {
            continue;
        };
        let path: Vec<String> = rest.split(ENV_SEPARATOR).map(str::to_ascii_lowercase).collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::EnvName { var: name });
        }
        vars.push((name, path, value));
    }
    vars.sort_by(|a, b| (!a.0.starts_with(PAROS_PREFIX), &a.0).cmp(&(!b.0.starts_with(PAROS_PREFIX), &b.0)));
    Ok(vars)
}

/// The settings tree with every optional key filled in (and one token), serialized: the schema
/// that `coerce` types values against. Deriving it from `Settings` keeps it in step with the
/// structs.
fn key_kinds() -> Table {
    let full = Settings {
        log: Some(String::new()),
        metrics: MetricsSettings { bind: Some(String::new()) },
        tls: TlsSettings { cert: Some(PathBuf::new()), key: Some(PathBuf::new()) },
        auth: AuthSettings { tokens: vec![TokenSettings::default()], ..AuthSettings::default() },
        cluster: Some(ClusterSettings { peers: vec![String::new()], zone: Some(String::new()), tls_ca: Some(PathBuf::new()), ..ClusterSettings::default() }),
        ..Settings::default()
    };
    match Value::try_from(&full) {
        Ok(Value::Table(table)) => table,
        _ => Table::new(),
    }
}

/// Brings every scalar in `table` to the type its key expects, as the reference's configuration
/// loader does, so that a file or variable the reference accepts is accepted here too:
///
/// - string keys take any scalar, written out as text (`bind = 9000` is `"9000"`, and so is
///   `TEPHRA__BIND=9000`);
/// - integer keys take a string holding an integer (`queue_capacity = "64"`, and every
///   `TEPHRA__*` variable arrives as a string), and a float or a string holding one, rounded
///   ([`float_to_count`]);
/// - boolean keys take `true`/`false`/`yes`/`no`/`on`/`off`/`1`/`0` as a string in any case, and
///   numbers, or strings holding one (non-zero is true); integer keys take `true`/`false` (and
///   those words as strings) as 1 and 0;
/// - list-of-text keys (`cluster.peers`) take one string as a comma-separated list, so that a
///   variable can set them (`TEPHRA__CLUSTER__PEERS=1=a:9400,2=b:9400`); items are trimmed and
///   empty ones dropped.
///
/// Anything else is left alone for deserialization to reject with its usual message: a string
/// that is not a number for an integer key, a negative integer for a count, a value where a
/// table belongs, and every unknown key.
fn coerce(table: &mut Table, kinds: &Table) {
    for (key, value) in table.iter_mut() {
        if let Some(kind) = kinds.get(key) {
            coerce_value(value, kind);
        }
    }
}

fn coerce_value(value: &mut Value, kind: &Value) {
    let replacement = match (kind, &*value) {
        (Value::Table(kinds), Value::Table(_)) => {
            if let Value::Table(table) = value {
                coerce(table, kinds);
            }
            None
        }
        (Value::Array(kinds), Value::Array(_)) => {
            if let (Some(element_kind), Value::Array(items)) = (kinds.first(), &mut *value) {
                for item in items {
                    coerce_value(item, element_kind);
                }
            }
            None
        }
        (Value::Array(kinds), Value::String(s)) if matches!(kinds.first(), Some(Value::String(_))) => {
            Some(Value::Array(s.split(',').map(str::trim).filter(|item| !item.is_empty()).map(|item| Value::String(item.to_owned())).collect()))
        }
        (Value::String(_), Value::Integer(i)) => Some(Value::String(i.to_string())),
        (Value::String(_), Value::Float(f)) => Some(Value::String(f.to_string())),
        (Value::String(_), Value::Boolean(b)) => Some(Value::String(b.to_string())),
        (Value::Integer(_), Value::String(s)) => match s.parse::<i64>() {
            Ok(n) => Some(Value::Integer(n)),
            // A whole number past i64 (only a variable can hold one): the reference reads its
            // numbers as u64 and clamps larger ones to u64::MAX; TOML stops at i64::MAX, which
            // means "unlimited" or "never" for every key just as well.
            Err(_) if is_whole_number(s) => Some(Value::Integer(i64::MAX)),
            // A truth word is 1 or 0, as for the reference's loader. (A variable holding a
            // float arrives here as a float: `env_value`; in the file, a string holding one is
            // refused, as by the reference.)
            Err(_) => truth_word(s).map(|b| Value::Integer(i64::from(b))),
        },
        (Value::Integer(_), Value::Float(f)) => Some(Value::Integer(float_to_count(*f))),
        (Value::Integer(_), Value::Boolean(b)) => Some(Value::Integer(i64::from(*b))),
        // A truth word (a variable holding another number arrives as that number:
        // `env_value`).
        (Value::Boolean(_), Value::String(s)) => truth_word(s).map(Value::Boolean),
        (Value::Boolean(_), Value::Integer(i)) => Some(Value::Boolean(*i != 0)),
        (Value::Boolean(_), Value::Float(f)) => Some(Value::Boolean(*f != 0.0)),
        _ => None,
    };
    if let Some(replacement) = replacement {
        *value = replacement;
    }
}

/// The value of a `TEPHRA__*` variable for a key of `kind`: the reference's loader reads a
/// variable holding a number as that number, so for a number or boolean key an integer or a
/// float (`1048576.0`, `1e3`, `2`) becomes one (and is then coerced like one in the file:
/// rounded for a count, non-zero for a boolean); anything else stays text (truth words, a
/// whole number past i64, which `coerce` clamps, and what the key then refuses).
fn env_value(raw: String, kind: Option<&Value>) -> Value {
    if matches!(kind, Some(Value::Integer(_)) | Some(Value::Boolean(_))) && truth_word(&raw).is_none() {
        if let Ok(i) = raw.parse::<i64>() {
            return Value::Integer(i);
        }
        if let (false, Ok(f)) = (is_whole_number(&raw), raw.parse::<f64>()) {
            return Value::Float(f);
        }
    }
    Value::String(raw)
}

/// `true`/`yes`/`on`/`1` and `false`/`no`/`off`/`0` in any case, as the reference's loader
/// reads them.
fn truth_word(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// A float where a count belongs, taken as the reference's loader takes it: rounded to the
/// nearest whole number (halves away from zero), a negative one or NaN as 0, and anything past
/// what TOML holds as [`i64::MAX`] (the reference saturates at `u64::MAX`; either means
/// "unlimited" or "never" for every key). So `0.4` is 0 and `2.5` is 3, and the key's own rule
/// then applies (`server.keepalive.idle_secs = 0.4` must be at least 1).
fn float_to_count(f: f64) -> i64 {
    let r = f.round();
    if r.is_nan() || r <= 0.0 {
        0
    } else if r >= i64::MAX as f64 {
        i64::MAX
    } else {
        r as i64
    }
}

/// True for a run of decimal digits, optionally after a `+`.
fn is_whole_number(s: &str) -> bool {
    let digits = s.strip_prefix('+').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The schema's value at `path` in `kinds` (its type is the key's), if the key exists.
fn kind_at<'a>(kinds: &'a Table, path: &[String]) -> Option<&'a Value> {
    let (last, parents) = path.split_last()?;
    let mut table = kinds;
    for segment in parents {
        table = table.get(segment)?.as_table()?;
    }
    table.get(last)
}

/// Sets `path` in `table` to `value`, creating tables on the way and replacing any non-table
/// value in the way (a later source wins).
fn insert_path(table: &mut Table, path: &[String], value: Value) {
    let (last, parents) = path.split_last().expect("env paths are never empty");
    let mut current = table;
    for segment in parents {
        let entry = current.entry(segment.clone()).or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        current = match entry {
            Value::Table(inner) => inner,
            _ => unreachable!("just made a table"),
        };
    }
    current.insert(last.clone(), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coerced(key: &str, value: Value) -> Value {
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        let mut table = Table::new();
        insert_path(&mut table, &path, value);
        coerce(&mut table, &key_kinds());
        let mut v = &Value::Table(table);
        for p in &path {
            v = &v[p.as_str()];
        }
        v.clone()
    }

    #[test]
    fn scalars_are_coerced_to_the_schema() {
        let s = |x: &str| Value::String(x.to_owned());
        assert_eq!(coerced("bind", Value::Integer(9000)), s("9000"));
        assert_eq!(coerced("tls.cert", Value::Boolean(true)), s("true"));
        assert_eq!(coerced("segment.size", s("4096")), Value::Integer(4096));
        assert_eq!(coerced("segment.size", Value::Float(4096.0)), Value::Integer(4096));
        // Floats are rounded, as by the reference's loader (it starts with all of these).
        assert_eq!(coerced("segment.size", Value::Float(4096.5)), Value::Integer(4097));
        assert_eq!(coerced("server.limits.max_connections", Value::Float(0.4)), Value::Integer(0));
        assert_eq!(coerced("server.limits.max_connections", Value::Float(-1.0)), Value::Integer(0));
        assert_eq!(coerced("server.limits.max_connections", Value::Float(f64::NAN)), Value::Integer(0));
        assert_eq!(coerced("server.limits.max_connections", Value::Float(f64::INFINITY)), Value::Integer(i64::MAX));
        assert_eq!(coerced("server.limits.max_connections", Value::Float(1e30)), Value::Integer(i64::MAX));
        // A string holding a float is refused in the file, as by the reference; a variable
        // holding one arrives as a number (`env_value`).
        assert_eq!(coerced("segment.size", s("1.048576e6")), s("1.048576e6"));
        let kinds = key_kinds();
        let kind = |key: &str| kind_at(&kinds, &key.split('.').map(str::to_owned).collect::<Vec<_>>()).cloned();
        assert_eq!(env_value("1.048576e6".into(), kind("segment.size").as_ref()), Value::Float(1_048_576.0));
        assert_eq!(env_value("1e3".into(), kind("server.limits.max_connections").as_ref()), Value::Float(1000.0));
        assert_eq!(env_value("2".into(), kind("writer.condition_force_scan").as_ref()), Value::Integer(2));
        assert_eq!(env_value("yes".into(), kind("writer.condition_force_scan").as_ref()), s("yes"));
        assert_eq!(env_value("99999999999999999999".into(), kind("segment.size").as_ref()), s("99999999999999999999"));
        assert_eq!(env_value("1e3".into(), kind("bind").as_ref()), s("1e3"));
        assert_eq!(coerced("segment.size", s("lots")), s("lots"));
        assert_eq!(coerced("auth.allow_insecure", s("On")), Value::Boolean(true));
        assert_eq!(coerced("auth.allow_insecure", Value::Integer(0)), Value::Boolean(false));
        assert_eq!(coerced("auth.allow_insecure", s("maybe")), s("maybe"));
        // Numbers where a boolean belongs, and truth values where a count belongs, as the
        // reference's loader takes them (it starts with all of these).
        assert_eq!(coerced("writer.condition_force_scan", Value::Integer(-1)), Value::Boolean(true));
        assert_eq!(coerced("writer.condition_force_scan", Value::Float(0.0)), Value::Boolean(false));
        assert_eq!(coerced("writer.condition_force_scan", Value::Float(1.0)), Value::Boolean(true));
        // In the file a string holding a number other than 0 or 1 is refused, as by the
        // reference.
        assert_eq!(coerced("writer.condition_force_scan", s("2")), s("2"));
        assert_eq!(coerced("server.limits.max_connections", Value::Boolean(true)), Value::Integer(1));
        assert_eq!(coerced("server.limits.max_connections", s("Yes")), Value::Integer(1));
        assert_eq!(coerced("server.limits.max_connections", s("false")), Value::Integer(0));
        assert_eq!(coerced("server", s("3")), s("3"));
        assert_eq!(coerced("server.bogus", s("3")), s("3"));
        let token = |v: Value| Value::Array(vec![Value::Table(Table::from_iter([("token".to_owned(), v)]))]);
        assert_eq!(coerced("auth.tokens", token(Value::Integer(12345))), token(s("12345")));
    }

    #[test]
    fn line_columns_are_one_based() {
        assert_eq!(line_column("a = 1\nbé = 2\n", 0), (1, 1));
        assert_eq!(line_column("a = 1\nbé = 2\n", 6), (2, 1));
        assert_eq!(line_column("a = 1\nbé = 2\n", 10), (2, 4));
    }
}
