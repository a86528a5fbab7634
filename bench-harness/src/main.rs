//! `tephra-bench` binary: parses the command line and dispatches to the subcommands.

use clap::Parser;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use tephra_bench::cli::{Cli, Command, FsyncArgs, EXIT_INTERRUPTED, EXIT_ROW_FAILED, EXIT_USAGE};
use tephra_bench::fsync::{self, Budget, ProbeConfig};
use tephra_bench::{logcapture, machine, report};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Fsync(args) => run_fsync(args),
        Command::Append(_) => not_implemented("append"),
        Command::Read(_) => not_implemented("read"),
        Command::Compare(_) => not_implemented("compare"),
    };
    ExitCode::from(code as u8)
}

/// Placeholder subcommands: clearly marked, exit 2.
fn not_implemented(name: &str) -> i32 {
    eprintln!("tephra-bench {name}: not implemented yet (placeholder; only `fsync` works today)");
    EXIT_USAGE
}

fn run_fsync(args: FsyncArgs) -> i32 {
    logcapture::install();
    if let Err(e) = fsync::preflight(&args.dir) {
        eprintln!("tephra-bench fsync: error: {e}");
        return EXIT_USAGE;
    }
    let facts = match machine::gather(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "tephra-bench fsync: error: cannot inspect {}: {e}",
                args.dir.display()
            );
            return EXIT_USAGE;
        }
    };
    let budget = match (args.seconds, args.commits) {
        (_, Some(n)) => Budget::Commits(n),
        (Some(s), None) => Budget::Seconds(s),
        (None, None) => Budget::Seconds(fsync::DEFAULT_SECONDS),
    };
    // Leave at least half of the free space alone.
    let mut max_row_bytes = args.max_row_mib << 20;
    let half_free = facts.fs.free_bytes / 2;
    if max_row_bytes > half_free {
        let biggest = args.block_sizes.iter().copied().max().unwrap_or(4096) as u64;
        if half_free < biggest {
            eprintln!(
                "tephra-bench fsync: error: not enough free space in {} ({} bytes free)",
                args.dir.display(),
                facts.fs.free_bytes
            );
            return EXIT_USAGE;
        }
        max_row_bytes = half_free;
    }
    if facts.fs.in_memory {
        // Say it before the run too, not only after.
        eprintln!("WARNING: {}", fsync::in_memory_warning(&facts));
    }
    let config = ProbeConfig {
        dir: facts.dir.clone().into(),
        budget,
        block_sizes: args.block_sizes.clone(),
        max_row_bytes,
    };
    let show_progress = std::io::stderr().is_terminal();
    let mut progress = |done: usize, total: usize, row: &fsync::RowResult| {
        if show_progress {
            eprint!("\r\x1b[2K[{done}/{total}] {}", row.label);
            if done == total {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        }
    };
    fsync::install_interrupt_handler();
    let rep = fsync::run_probe(config, facts, &mut progress);
    let failed = rep.rows.iter().any(|r| r.error.is_some());
    if args.json {
        for w in &rep.warnings {
            eprintln!("WARNING: {w}");
        }
        match serde_json::to_string_pretty(&rep) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("tephra-bench fsync: error: cannot serialize result: {e}");
                return EXIT_ROW_FAILED;
            }
        }
    } else {
        print!("{}", report::render_table(&rep));
    }
    if fsync::interrupted() {
        EXIT_INTERRUPTED
    } else if failed {
        EXIT_ROW_FAILED
    } else {
        0
    }
}
