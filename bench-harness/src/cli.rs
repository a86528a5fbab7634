//! Command-line interface of `tephra-bench` (clap derive).
//!
//! `fsync` is implemented. `append`, `read` and `compare` are **placeholders** that exit
//! with code 2 and "not implemented yet"; the team fills them in later.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Exit code for usage errors, bad environments (e.g. an unusable `--dir`) and
/// subcommands that are not implemented yet.
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the probe ran but at least one row failed with an I/O error.
pub const EXIT_ROW_FAILED: i32 = 1;
/// Exit code after SIGINT/SIGTERM stopped the probe (files removed, partial result printed).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Benchmark harness for the Tephra event store.
#[derive(Debug, Parser)]
#[command(name = "tephra-bench", version, about, long_about = None)]
pub struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure what the disk under DIR can commit: write + fdatasync latency per block
    /// size, buffered vs O_DIRECT (glommio DmaFile), preallocated vs growing file.
    Fsync(FsyncArgs),
    /// PLACEHOLDER, not implemented yet: append throughput/latency against a server.
    Append(PlaceholderArgs),
    /// PLACEHOLDER, not implemented yet: read/query throughput against a server.
    Read(PlaceholderArgs),
    /// PLACEHOLDER, not implemented yet: side-by-side run against the reference tephra-server.
    Compare(PlaceholderArgs),
}

/// Options of `tephra-bench fsync`.
#[derive(Debug, Args)]
pub struct FsyncArgs {
    /// Directory on the filesystem to measure (test files are created and removed there).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Seconds to measure each row [default: 1].
    #[arg(long, value_name = "S", conflicts_with = "commits", value_parser = parse_seconds)]
    pub seconds: Option<f64>,
    /// Commits to measure in each row, instead of a time budget.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub commits: Option<u64>,
    /// Print the result as JSON on stdout (warnings also go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Block (write) sizes, comma separated, multiples of 4 KiB (suffixes k, m).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "4k,16k,64k,256k,1m",
        value_parser = parse_block_size
    )]
    pub block_sizes: Vec<usize>,
    /// At most this many MiB are written (and preallocated) per row.
    #[arg(long, value_name = "MIB", default_value_t = crate::fsync::DEFAULT_MAX_ROW_MIB,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_row_mib: u64,
}

/// Arguments of a placeholder subcommand: anything is accepted and ignored.
#[derive(Debug, Args)]
pub struct PlaceholderArgs {
    /// Ignored until the subcommand is implemented.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub rest: Vec<String>,
}

/// Parses a positive, finite number of seconds.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds in (0, 86400]".into())
    }
}

/// Parses a block size like `4096`, `4k`, `64K`, `1m`, `1MiB`; it must be a positive
/// multiple of 4096 and at most 64 MiB.
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = if let Some(n) = t.strip_suffix('k') {
        (n, 1usize << 10)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1usize << 20)
    } else {
        (t, 1)
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid block size {s:?}"))?;
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("block size {s:?} too large"))?;
    if v == 0 || v % 4096 != 0 || v > 64 << 20 {
        return Err(format!(
            "block size {s:?} must be a multiple of 4 KiB, at most 64 MiB"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("4k"), Ok(4096));
        assert_eq!(parse_block_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_block_size("8192"), Ok(8192));
        assert!(parse_block_size("1000").is_err());
        assert!(parse_block_size("0").is_err());
        assert!(parse_block_size("x").is_err());
    }

    #[test]
    fn seconds_and_commits_conflict() {
        let r = Cli::try_parse_from([
            "tephra-bench",
            "fsync",
            "--dir",
            "/x",
            "--seconds",
            "1",
            "--commits",
            "3",
        ]);
        assert!(r.is_err());
        let ok = Cli::try_parse_from(["tephra-bench", "fsync", "--dir", "/x", "--commits", "3"])
            .unwrap();
        match ok.command {
            Command::Fsync(a) => {
                assert_eq!(a.commits, Some(3));
                assert_eq!(a.block_sizes.len(), 5);
            }
            _ => panic!("wrong subcommand"),
        }
    }
}
