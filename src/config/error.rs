//! The one error type of the settings layer.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why the settings could not be resolved. `Display` is the complete, single-line message; the
/// binary prints it as `configuration error: <message>` and exits with code 1 (docs/operations.md §2,
/// docs/operations.md §9). Messages that the reference prints verbatim (the validation rules, the missing-file
/// message, serde's ``unknown field `x` `` wording) are kept verbatim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--config` names a file that does not exist:
    /// `configuration file "/x.toml" not found`.
    #[error("configuration file \"{}\" not found", path.display())]
    FileNotFound {
        /// The path as given on the command line.
        path: PathBuf,
    },

    /// `--config` names a directory (and `NAME.toml` is not a file either): the reference's
    /// "not found" text, saying why:
    /// `configuration file "/etc" not found: it is a directory (--config takes a TOML file)`.
    #[error("configuration file \"{}\" not found: it is a directory (--config takes a TOML file)", path.display())]
    IsADirectory {
        /// The path as given on the command line.
        path: PathBuf,
    },

    /// The file exists but could not be read (permissions, a directory, not UTF-8, ...).
    #[error("cannot read configuration file \"{}\": {source}", path.display())]
    FileUnreadable {
        /// The path as given on the command line.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// The file is not valid TOML (including a key defined twice).
    #[error(
        "configuration file \"{}\" is not valid TOML (line {line}, column {column}): {message}",
        path.display()
    )]
    Syntax {
        /// The path as given on the command line.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column (in characters) of the problem.
        column: usize,
        /// The parser's description.
        message: String,
    },

    /// A `TEPHRA__*` variable whose name maps to no key path (an empty segment, such as
    /// `TEPHRA__` or `TEPHRA__SERVER____X`).
    #[error("environment variable {var} does not name a configuration key")]
    EnvName {
        /// The variable name as found in the environment.
        var: String,
    },

    /// A `PAROS_*` variable that names no journal limit (seed 002, "Limits": an unknown
    /// `PAROS_*` variable stops the server).
    #[error("environment variable {var} is not a journal limit: the PAROS_* variables are {known}")]
    UnknownParos {
        /// The variable name as found in the environment.
        var: String,
        /// The variables that exist, comma-separated.
        known: String,
    },

    /// A value does not fit the settings schema: an unknown key, a wrong type, or an
    /// out-of-range number. Displayed in the reference's wording plus the source, e.g.
    /// ``unknown field `probes`, expected `idle_secs` or `interval_secs` for key
    /// `server.keepalive` in the environment (TEPHRA__SERVER__KEEPALIVE__PROBES)`` or
    /// ``invalid type: string "lots", expected usize for key `writer.queue_capacity` in
    /// configuration file "t.toml" (line 2, column 18)``.
    #[error("{}", schema_message(key, message, origin))]
    Schema {
        /// Dotted path of the offending key, e.g. `writer.queue_capacity`, or for an unknown
        /// key that key itself (`server.keepalive.probes`, `bogus_key`); array elements are
        /// written `auth.tokens[0]`.
        key: String,
        /// serde's description, e.g. ``unknown field `bogus_key`, expected one of ...``.
        message: String,
        /// Which source supplied the offending value.
        origin: Origin,
    },

    /// A value has the right type but breaks a rule, e.g.
    /// `server.backpressure.frame_queue_depth must be at least 1` or
    /// `tls.cert and tls.key must be set together`.
    #[error("{message}")]
    Invalid {
        /// The full message.
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ConfigError::Invalid { message: message.into() }
    }
}

/// The source a [`ConfigError::Schema`] problem came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// The `--config` file, with the 1-based position of the offending text when known.
    File {
        /// The path as given on the command line.
        path: PathBuf,
        /// 1-based line and column, when the parser reported a position.
        position: Option<(usize, usize)>,
    },
    /// One `TEPHRA__*` environment variable.
    Env {
        /// The variable name as found in the environment.
        var: String,
    },
    /// Only the combination of the file and the environment is wrong (for example a file value
    /// that the environment turned into a table).
    Combined,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, position: Some((line, column)) } => write!(f, "configuration file \"{}\" (line {line}, column {column})", path.display()),
            Origin::File { path, position: None } => write!(f, "configuration file \"{}\"", path.display()),
            Origin::Env { var } => write!(f, "the environment ({var})"),
            Origin::Combined => f.write_str("the environment merged over the configuration file"),
        }
    }
}

/// `<serde message> for key `<key>` in <origin>`, the reference's wording plus the origin. For an
/// unknown field serde's message already names the field, so the key shown is the table holding
/// it (none at the top level), as the reference does.
fn schema_message(key: &str, message: &str, origin: &Origin) -> String {
    let names = |field: &str| message.contains(&format!("`{field}`"));
    let shown = match key.rsplit_once('.') {
        Some((table, field)) if names(field) => Some(table),
        None if key.is_empty() || names(key) => None,
        _ => Some(key),
    };
    match shown {
        Some(key) => format!("{message} for key `{key}` in {origin}"),
        None => format!("{message} in {origin}"),
    }
}
