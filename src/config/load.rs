//! Layered resolution: defaults < `--config` file < `TEPHRA__*` environment < flags.
//!
//! The file is parsed into a TOML table, every `TEPHRA__*` variable is merged into that table as
//! a typed value, and the merged table is deserialized into [`Settings`] once, so unknown keys and
//! wrong types are reported the same way whichever source they came from. Each source is also
//! checked on its own first, so an error names the file position or the variable at fault.
//! Then the flags are applied and the result is validated.
//! Seed: "Configuring the server"; reference §2.1.

use std::io;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::cli::ServerArgs;
use super::error::{ConfigError, Origin};
use super::settings::{MetricsSettings, Settings, TlsSettings};

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
        Overrides {
            bind: args.bind.clone(),
            data_dir: args.data_dir.clone(),
            log: args.log.clone(),
        }
    }
}

/// Resolves the server's settings exactly as `tephra-server` (and `--healthcheck`) does: reads
/// the `--config` file if given, layers `env` (pass [`process_env`] in the binary; any iterator in
/// tests) and the flags over it, and validates the result.
///
/// Errors: [`ConfigError::FileNotFound`] (`configuration file "/x.toml" not found`),
/// [`ConfigError::FileUnreadable`], [`ConfigError::Syntax`], [`ConfigError::EnvName`],
/// [`ConfigError::Schema`] (unknown key, wrong type), [`ConfigError::Invalid`] (a validation
/// rule). Seed: "Configuring the server"; reference §2.1, §2.10.
pub fn resolve(
    args: &ServerArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Settings, ConfigError> {
    let text = args.config.as_deref().map(read_config_file).transpose()?;
    let file = args
        .config
        .as_deref()
        .zip(text.as_deref())
        .map(|(path, text)| FileSource { path, text });
    resolve_sources(file, env, &Overrides::from(args))
}

/// Reads the `--config` file. A file that does not exist is [`ConfigError::FileNotFound`]; any
/// other failure (including text that is not UTF-8) is [`ConfigError::FileUnreadable`].
pub fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => ConfigError::FileNotFound {
            path: path.to_owned(),
        },
        _ => ConfigError::FileUnreadable {
            path: path.to_owned(),
            source,
        },
    })
}

/// The pure core of [`resolve`]: the same layering and validation over an already-read file (or
/// none), an environment and the flag overrides. Touches neither the filesystem nor the process
/// environment.
pub fn resolve_sources(
    file: Option<FileSource<'_>>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &Overrides,
) -> Result<Settings, ConfigError> {
    let mut table = match file {
        Some(file) => parse_file(file)?,
        None => Table::new(),
    };

    let vars = env_vars(env)?;
    if !vars.is_empty() {
        let kinds = key_kinds();
        for (var, path, raw) in vars {
            let value = typed_env_value(&kinds, &path, &raw);
            // Check the variable on its own so an error names it.
            let mut alone = Table::new();
            insert_path(&mut alone, &path, value.clone());
            deserialize(alone).map_err(|(key, message)| ConfigError::Schema {
                key,
                message,
                origin: Origin::Env { var: var.clone() },
            })?;
            insert_path(&mut table, &path, value);
        }
    }

    let mut settings = deserialize(table).map_err(|(key, message)| ConfigError::Schema {
        key,
        message,
        origin: Origin::Combined,
    })?;
    overrides.apply(&mut settings);
    settings.validate()?;
    Ok(settings)
}

impl Settings {
    /// Parses one TOML document as a complete configuration (defaults for what it leaves out)
    /// and validates it; no environment, no flags. An empty string gives `Settings::default()`.
    /// Errors as for [`resolve_sources`]; positions refer to `<string>`.
    pub fn from_toml_str(text: &str) -> Result<Settings, ConfigError> {
        let file = FileSource {
            path: Path::new("<string>"),
            text,
        };
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
fn parse_file(file: FileSource<'_>) -> Result<Table, ConfigError> {
    let table: Table = file.text.parse().map_err(|e: toml::de::Error| {
        let (line, column) = e
            .span()
            .map_or((1, 1), |span| line_column(file.text, span.start));
        ConfigError::Syntax {
            path: file.path.to_owned(),
            line,
            column,
            message: one_line(e.message()),
        }
    })?;
    if let Err(e) =
        serde_path_to_error::deserialize::<_, Settings>(toml::Deserializer::new(file.text))
    {
        let key = key_path(e.path());
        let inner = e.into_inner();
        let position = inner.span().map(|span| line_column(file.text, span.start));
        return Err(ConfigError::Schema {
            key,
            message: one_line(inner.message()),
            origin: Origin::File {
                path: file.path.to_owned(),
                position,
            },
        });
    }
    Ok(table)
}

/// Deserializes a merged table, reporting the dotted path and serde's message on failure.
fn deserialize(table: Table) -> Result<Settings, (String, String)> {
    serde_path_to_error::deserialize(Value::Table(table)).map_err(|e| {
        let key = key_path(e.path());
        (key, one_line(e.into_inner().message()))
    })
}

/// Parser messages may span lines; the error is printed on one.
fn one_line(message: &str) -> String {
    message
        .trim()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
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

/// The `TEPHRA__*` variables of `env` as `(name, lower-cased path, value)`, sorted by name so the
/// outcome does not depend on the environment's order.
fn env_vars(
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, Vec<String>, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in env {
        let Some(rest) = name
            .get(..ENV_PREFIX.len())
            .filter(|prefix| prefix.eq_ignore_ascii_case(ENV_PREFIX))
            .map(|_| &name[ENV_PREFIX.len()..])
        else {
            continue;
        };
        let path: Vec<String> = rest
            .split(ENV_SEPARATOR)
            .map(str::to_ascii_lowercase)
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError::EnvName { var: name });
        }
        vars.push((name, path, value));
    }
    vars.sort();
    Ok(vars)
}

/// What type of TOML value a key path holds, learned from the schema itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Bool,
    Unknown,
}

/// The settings tree with every optional key filled in, serialized: the schema the environment
/// values are typed against. Deriving it from `Settings` keeps it in step with the structs.
fn key_kinds() -> Table {
    let full = Settings {
        log: Some(String::new()),
        metrics: MetricsSettings {
            bind: Some(String::new()),
        },
        tls: TlsSettings {
            cert: Some(PathBuf::new()),
            key: Some(PathBuf::new()),
        },
        ..Settings::default()
    };
    match Value::try_from(&full) {
        Ok(Value::Table(table)) => table,
        _ => Table::new(),
    }
}

fn kind_at(kinds: &Table, path: &[String]) -> Kind {
    let mut table = kinds;
    for (i, segment) in path.iter().enumerate() {
        match table.get(segment) {
            Some(Value::Table(inner)) if i + 1 < path.len() => table = inner,
            Some(Value::String(_)) if i + 1 == path.len() => return Kind::Str,
            Some(Value::Integer(_)) if i + 1 == path.len() => return Kind::Int,
            Some(Value::Boolean(_)) if i + 1 == path.len() => return Kind::Bool,
            _ => return Kind::Unknown,
        }
    }
    Kind::Unknown
}

/// Types an environment value by the key it sets: strings stay as they are, integers and
/// booleans are parsed (booleans also accept `yes`/`no`, `on`/`off`, `1`/`0`, any case). A value
/// that does not parse is passed on as a string, so deserialization reports a type error naming
/// the expected type. A path outside the schema gets a best guess; it is rejected anyway.
fn typed_env_value(kinds: &Table, path: &[String], raw: &str) -> Value {
    let as_bool = |lenient: bool| match raw.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        "yes" | "on" | "1" if lenient => Some(true),
        "no" | "off" | "0" if lenient => Some(false),
        _ => None,
    };
    let as_int = || raw.parse::<i64>().ok();
    let string = || Value::String(raw.to_owned());
    match kind_at(kinds, path) {
        Kind::Str => string(),
        Kind::Int => as_int().map_or_else(string, Value::Integer),
        Kind::Bool => as_bool(true).map_or_else(string, Value::Boolean),
        Kind::Unknown => as_bool(false)
            .map(Value::Boolean)
            .or_else(|| as_int().map(Value::Integer))
            .unwrap_or_else(string),
    }
}

/// Sets `path` in `table` to `value`, creating tables on the way and replacing any non-table
/// value in the way (a later source wins).
fn insert_path(table: &mut Table, path: &[String], value: Value) {
    let (last, parents) = path.split_last().expect("env paths are never empty");
    let mut current = table;
    for segment in parents {
        let entry = current
            .entry(segment.clone())
            .or_insert_with(|| Value::Table(Table::new()));
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

    #[test]
    fn kinds_follow_the_schema() {
        let kinds = key_kinds();
        let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(kind_at(&kinds, &p("bind")), Kind::Str);
        assert_eq!(kind_at(&kinds, &p("log")), Kind::Str);
        assert_eq!(kind_at(&kinds, &p("tls.cert")), Kind::Str);
        assert_eq!(kind_at(&kinds, &p("metrics.bind")), Kind::Str);
        assert_eq!(kind_at(&kinds, &p("segment.size")), Kind::Int);
        assert_eq!(kind_at(&kinds, &p("server.keepalive.idle_secs")), Kind::Int);
        assert_eq!(kind_at(&kinds, &p("auth.allow_insecure")), Kind::Bool);
        assert_eq!(kind_at(&kinds, &p("server")), Kind::Unknown);
        assert_eq!(kind_at(&kinds, &p("server.bogus")), Kind::Unknown);
        assert_eq!(kind_at(&kinds, &p("bind.x")), Kind::Unknown);
    }

    #[test]
    fn line_columns_are_one_based() {
        assert_eq!(line_column("a = 1\nbé = 2\n", 0), (1, 1));
        assert_eq!(line_column("a = 1\nbé = 2\n", 6), (2, 1));
        assert_eq!(line_column("a = 1\nbé = 2\n", 10), (2, 4));
    }
}
