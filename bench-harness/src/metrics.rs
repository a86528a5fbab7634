//! Shared measurement pieces of the load generators: latency histograms and their
//! summary, error tallies by code, and the CPU time a process has used.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tephra::client::ClientError;

/// Highest latency a histogram records, in µs (60 s); larger values are clamped.
pub const MAX_LATENCY_US: u64 = 60_000_000;

/// A new latency histogram in µs: 1 µs .. 60 s, 3 significant digits (as the reference's
/// harness).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Records `us` into `h`, clamped into the histogram's range.
pub fn record_us(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.min(MAX_LATENCY_US));
}

/// Percentiles of a latency histogram, in µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Number of samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Smallest sample, µs.
    pub min_us: u64,
    /// Median, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Largest sample, µs.
    pub max_us: u64,
}

impl Latency {
    /// Summarises `h`; `None` when it holds no samples.
    pub fn from_histogram(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        Some(Latency {
            count: h.len(),
            mean_us: h.mean(),
            min_us: h.min(),
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        })
    }
}

/// A short, stable name for a client error: the server's code name without its
/// `ERROR_CODE_` prefix (`CONFLICT`, `SHUTDOWN`, ...), or `io`, `frame`, `eof`, `protocol`.
pub fn error_name(e: &ClientError) -> String {
    match e {
        ClientError::Server { code, .. } => code.short_name().to_owned(),
        ClientError::Io(_) => "io".into(),
        ClientError::Frame(_) => "frame".into(),
        ClientError::UnexpectedEof => "eof".into(),
        ClientError::Protocol(_) => "protocol".into(),
    }
}

/// Error counts by name (see [`error_name`]).
pub type ErrorCounts = BTreeMap<String, u64>;

/// Adds `other` into `into`.
pub fn merge_errors(into: &mut ErrorCounts, other: &ErrorCounts) {
    for (k, v) in other {
        *into.entry(k.clone()).or_default() += v;
    }
}

/// User + system CPU seconds this process has used so far (`getrusage(RUSAGE_SELF)`).
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a zeroed struct of the right type.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU seconds process `pid` has used so far, from `/proc/PID/stat`.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: split after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, field 3 (state) is index 0, so utime (14) is 11 and stime (15) 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some((utime + stime) / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_ordered() {
        let mut h = latency_histogram();
        for v in 1..=10_000u64 {
            record_us(&mut h, v);
        }
        record_us(&mut h, u64::MAX);
        let l = Latency::from_histogram(&h).unwrap();
        assert!(l.min_us <= l.p50_us && l.p50_us <= l.p99_us && l.p99_us <= l.p999_us && l.p999_us <= l.max_us);
        assert_eq!((l.min_us, l.count), (1, 10_001));
        assert!(l.max_us >= MAX_LATENCY_US);
        assert!(Latency::from_histogram(&latency_histogram()).is_none());
    }

    #[test]
    fn cpu_time_of_self_is_readable() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(self_cpu_seconds() > 0.0);
        assert!(process_cpu_seconds(std::process::id()).is_some());
    }
}
