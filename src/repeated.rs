//! A failure that can repeat many times a second (a full disk, an unwritable directory, a
//! damaged file a follower polls), said in the log without a line per occurrence: the first
//! failure at once, then at most one line every [`SAY_AGAIN_EVERY`] counting the failures
//! since, and one line once the operation succeeds again. The callers write the lines; this
//! keeps the counts and decides when.

use std::time::{Duration, Instant};

/// How often a failure that goes on is said again.
pub(crate) const SAY_AGAIN_EVERY: Duration = Duration::from_secs(60);

/// The counts of one repeating failure (see the module notes).
#[derive(Debug, Default)]
pub(crate) struct RepeatedFailure {
    /// Failures since the last success.
    in_a_row: u64,
    /// Failures since the last line said.
    unsaid: u64,
    /// When a failure was last said; `None` while the operation succeeds.
    said_at: Option<Instant>,
}

/// What [`RepeatedFailure::succeeded`] reports when the failures had been said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Failures in a row before this success.
    pub(crate) failures: u64,
    /// Of those, the ones after the last line said.
    pub(crate) unsaid: u64,
}

impl RepeatedFailure {
    /// Counts a failure. `Some(n)` when it is to be said now (the first, or the first
    /// [`SAY_AGAIN_EVERY`] after the last line said), `n` being the failures not said since
    /// that last line.
    pub(crate) fn failed(&mut self) -> Option<u64> {
        self.in_a_row += 1;
        let now = Instant::now();
        match self.said_at {
            Some(t) if now.duration_since(t) < SAY_AGAIN_EVERY => {
                self.unsaid += 1;
                None
            }
            _ => {
                self.said_at = Some(now);
                Some(std::mem::take(&mut self.unsaid))
            }
        }
    }

    /// Counts a success, which ends a run of failures. `Some` when failures had been said, so
    /// that their end is said too.
    pub(crate) fn succeeded(&mut self) -> Option<Recovered> {
        let recovered = self.said_at.take().map(|_| Recovered { failures: self.in_a_row, unsaid: self.unsaid });
        self.in_a_row = 0;
        self.unsaid = 0;
        recovered
    }

    /// Failures since the last success.
    pub(crate) fn in_a_row(&self) -> u64 {
        self.in_a_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_said_the_rest_counted_and_the_recovery_said_once() {
        let mut r = RepeatedFailure::default();
        assert_eq!(r.succeeded(), None, "nothing said, nothing to end");
        assert_eq!(r.failed(), Some(0));
        assert_eq!((r.failed(), r.failed()), (None, None));
        assert_eq!(r.in_a_row(), 3);
        // A minute on, the next failure is said with the two unsaid ones.
        r.said_at = Some(Instant::now() - SAY_AGAIN_EVERY);
        assert_eq!(r.failed(), Some(2));
        assert_eq!(r.failed(), None);
        assert_eq!(r.succeeded(), Some(Recovered { failures: 5, unsaid: 1 }));
        assert_eq!((r.in_a_row(), r.succeeded()), (0, None));
        assert_eq!(r.failed(), Some(0), "a new run is said at once");
    }
}
