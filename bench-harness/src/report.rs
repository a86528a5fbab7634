//! Human-readable rendering of a [`crate::fsync::ProbeReport`], and the JSON and Markdown
//! files every report is written to.

use crate::fsync::{human_bytes, Budget, ProbeReport, RowResult, EVENT_BYTES};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Writes `r` as `<stem>.json` and `markdown` as `<stem>.md` into `out` (created if needed);
/// returns the two paths.
///
/// # Errors
/// Creating the directory or writing a file fails.
pub fn write_json_and_markdown(r: &impl Serialize, markdown: String, out: &Path, stem: &str) -> Result<(PathBuf, PathBuf), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let json = out.join(format!("{stem}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(r).map_err(|e| e.to_string())?).map_err(|e| format!("write {}: {e}", json.display()))?;
    let md = out.join(format!("{stem}.md"));
    std::fs::write(&md, markdown).map_err(|e| format!("write {}: {e}", md.display()))?;
    Ok((json, md))
}

/// Formats a non-negative number with thousands separators and no decimals.
pub fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let n = x.round().max(0.0) as u64;
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn banner(out: &mut String, w: &str) {
    let line = "!".repeat(78);
    let _ = writeln!(out, "{line}");
    for chunk in wrap(&format!("WARNING: {w}"), 74) {
        let _ = writeln!(out, "!! {chunk}");
    }
    let _ = writeln!(out, "{line}");
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Renders the report as a text table with the machine facts, warnings and notes.
pub fn render_table(r: &ProbeReport) -> String {
    let mut out = String::new();
    for w in &r.warnings {
        banner(&mut out, w);
    }
    let m = &r.machine;
    let _ = writeln!(out, "tephra-bench fsync: write + fdatasync per commit, one commit in flight");
    let _ = writeln!(out, "  dir         {}", m.dir);
    let fs = match (&m.fs.mount_fstype, &m.fs.mount_source, &m.fs.mount_point) {
        (Some(t), Some(src), Some(mp)) => format!("{t} (statfs magic {} = {}) from {src}, mounted at {mp}", m.fs.magic, m.fs.magic_name),
        _ => format!("statfs magic {} = {}", m.fs.magic, m.fs.magic_name),
    };
    let _ = writeln!(out, "  filesystem  {fs}");
    match &m.device {
        Some(d) => {
            let _ = writeln!(
                out,
                "  device      {} ({}): write_cache={}, rotational={}, logical block={}, driver={}, model={}{}",
                d.name,
                d.dev,
                d.write_cache.as_deref().unwrap_or("?"),
                d.rotational.map(|r| if r { "1" } else { "0" }).unwrap_or("?"),
                d.logical_block_size.map(|b| b.to_string()).unwrap_or_else(|| "?".into()),
                d.driver.as_deref().unwrap_or("?"),
                d.model.as_deref().unwrap_or("?"),
                if d.virtual_disk { " [virtual disk]" } else { "" },
            );
        }
        None => {
            let _ = writeln!(out, "  device      not discoverable");
        }
    }
    let _ = writeln!(out, "  kernel      {}", m.kernel);
    let _ = writeln!(out, "  cpus        {} online, {} available to this process", m.cpus_online, m.cpus_available);
    let g = &r.glommio;
    let _ = writeln!(
        out,
        "  glommio     {}, io_memory {}, fixed buffers {}, O_DIRECT alignment {}, RLIMIT_MEMLOCK {}{}",
        g.version,
        human_bytes(g.io_memory as u64),
        match g.fixed_buffers_registered {
            Some(true) => "registered",
            Some(false) => "NOT registered",
            None => "n/a",
        },
        g.dma_alignment.map(|a| a.to_string()).unwrap_or_else(|| "?".into()),
        limit(g.memlock_soft),
        if g.memlock_raised { format!(" (raised from {})", limit(g.memlock_soft_before)) } else { String::new() },
    );
    let budget = match r.config.budget {
        Budget::Seconds(s) => format!("{s} s"),
        Budget::Commits(n) => format!("{n} commits"),
    };
    let _ = writeln!(out, "  per row     {budget}, at most {} written", human_bytes(r.config.max_row_bytes));
    let c = |x: Option<f64>, unit: &str| x.map(|v| format!("{v:.2}{unit}")).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        out,
        "  other load  before: 1-min load {}, I/O pressure (some avg10) {}; after (incl. the probe): {}, {}",
        c(r.contention_before.loadavg_1m, ""),
        c(r.contention_before.io_pressure_some_avg10, "%"),
        c(r.contention_after.loadavg_1m, ""),
        c(r.contention_after.io_pressure_some_avg10, "%"),
    );
    let _ = writeln!(out);

    let header = ["row", "commits", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "sync p50", "commits/s", "commits/s", "events/s"];
    let header2 = ["", "", "", "", "", "", "µs", "1/p50", "measured", "(256 B, meas.)"];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect(), header2.iter().map(|s| s.to_string()).collect()];
    for row in &r.rows {
        table.push(row_cells(row));
    }
    let ncols = header.len();
    let widths: Vec<usize> = (0..ncols).map(|c| table.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for (i, cells) in table.iter().enumerate() {
        let mut line = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
        if i == 1 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (ncols - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    for row in &r.rows {
        if let Some(e) = &row.error {
            let _ = writeln!(out, "ERROR in {}: {e}", row.label);
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "commits/s 1/p50 is the ceiling implied by the median commit; measured is commits / \
         wall time. events/s = new bytes per commit / {EVENT_BYTES} x measured commits/s."
    );
    for n in &r.notes {
        for (i, l) in wrap(&format!("note: {n}"), 100).into_iter().enumerate() {
            let _ = writeln!(out, "{}{l}", if i == 0 { "" } else { "      " });
        }
    }
    for w in &r.warnings {
        banner(&mut out, w);
    }
    out
}

fn limit(v: u64) -> String {
    if v == u64::MAX || v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        human_bytes(v)
    }
}

fn row_cells(row: &RowResult) -> Vec<String> {
    let mut label = row.label.clone();
    if row.spec.mode == crate::fsync::IoMode::Direct && !row.o_direct && row.error.is_none() {
        label.push_str(" (O_DIRECT off!)");
    }
    match (&row.commit_latency, &row.fdatasync_latency) {
        (Some(c), Some(s)) => vec![
            label,
            row.commits.to_string(),
            c.p50_us.to_string(),
            c.p99_us.to_string(),
            c.p999_us.to_string(),
            c.max_us.to_string(),
            s.p50_us.to_string(),
            thousands(row.commits_per_s_p50),
            thousands(row.commits_per_s_measured),
            thousands(row.events_per_s_measured),
        ],
        _ => {
            let mut v = vec![label, row.commits.to_string()];
            v.extend(std::iter::repeat_n("-".to_string(), 8));
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1234.0), "1,234");
        assert_eq!(thousands(1234567.0), "1,234,567");
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
    }
}
