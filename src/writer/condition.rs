//! The condition verdict (docs/protocol.md §2.3, docs/architecture.md §4.3): pure, no I/O of its own.
//!
//! The boundary clause (`fail_if_events_match` above `after`) is checked first, then, only if it
//! passes, the existence clause (`fail_if_exists` over the whole log). Each clause asks the
//! events staged earlier in the same round first (a hit there is `SameBatch`, retryable: that
//! event may never commit), then the log (a hit is terminal and carries the lowest matching
//! position), in the reference's order (docs/architecture.md §4.3: the staged arm, then the durable arm), so a
//! condition that matches both gets the reference's answer. Neither arm may ever give a false
//! negative.

use crate::event::EventRef;
use crate::model::{AppendCondition, Query};
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Which clause of the condition fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictClause {
    /// `fail_if_events_match` above `after`; wire code `CONFLICT`.
    Boundary,
    /// `fail_if_exists`; wire code `ALREADY_EXISTS`.
    Existence,
}

/// Where the conflicting event lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictSite {
    /// A durable event at this (lowest matching) position: terminal.
    Durable(u64),
    /// An event staged earlier in the same batch: retryable.
    SameBatch,
}

/// The outcome of evaluating a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No clause fired; the append may be staged.
    Pass,
    /// A clause fired.
    Conflict { clause: ConflictClause, at: ConflictSite },
}

/// Events staged in the current group commit, indexed by tag and type so each check touches
/// only candidates (the rarest tag's list) rather than every staged event.
#[derive(Default)]
pub struct Staged<'a> {
    events: Vec<EventRef<'a>>,
    /// Tag → slot in `lists`.
    by_tag: HashMap<&'a str, u32>,
    /// Per tag slot: the staged events naming it, ascending.
    lists: Vec<Vec<u32>>,
    types: HashSet<&'a str>,
    /// The last event's type and tags (encoded) and its tags' slots: a run of events with the
    /// same names (the common case inside one append) is indexed without hashing.
    prev: Option<(&'a [u8], smallvec::SmallVec<[u32; 4]>)>,
}

impl<'a> Staged<'a> {
    /// An empty staging area.
    pub fn new() -> Staged<'a> {
        Staged::default()
    }

    /// Number of staged events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Stages one event.
    pub fn push(&mut self, ev: EventRef<'a>) {
        let i = self.events.len() as u32;
        self.events.push(ev);
        if let Some((names, slots)) = &self.prev {
            if *names == ev.names() {
                for &slot in slots {
                    self.lists[slot as usize].push(i);
                }
                return;
            }
        }
        self.types.insert(ev.event_type());
        let mut slots = smallvec::SmallVec::new();
        for t in ev.tags() {
            let next = self.lists.len() as u32;
            let slot = *self.by_tag.entry(t).or_insert(next);
            if slot == next {
                self.lists.push(Vec::new());
            }
            self.lists[slot as usize].push(i);
            slots.push(slot);
        }
        self.prev = Some((ev.names(), slots));
    }

    /// Does any staged event match `q`?
    pub fn matches(&self, q: &Query) -> bool {
        if self.events.is_empty() {
            return false;
        }
        match q {
            Query::All => true,
            Query::Items(items) => items.iter().any(|item| {
                if let Some(rarest) =
                    item.tags.iter().map(|t| self.by_tag.get(t.as_str()).map_or(&[][..], |&slot| &self.lists[slot as usize][..])).min_by_key(|v| v.len())
                {
                    rarest.iter().any(|&i| item.matches(&self.events[i as usize]))
                } else if item.types.is_empty() {
                    true
                } else {
                    item.types.iter().any(|t| self.types.contains(t.as_str()))
                }
            }),
        }
    }
}

/// Evaluates `cond` against the log up to the tip, committed or staged by earlier rounds
/// (through `durable(query, after)`, which returns the lowest matching position there above
/// `after`; all of it is durable before anyone is answered), and this round's staged events.
///
/// The caller has already checked `after <= tip`.
///
/// # Errors
/// Whatever `durable` fails with (a read error of the log).
pub fn evaluate<E>(cond: &AppendCondition, staged: &Staged<'_>, mut durable: impl FnMut(&Query, u64) -> Result<Option<u64>, E>) -> Result<Verdict, E> {
    let clauses =
        [(ConflictClause::Boundary, Some(&cond.fail_if_events_match), cond.after.get()), (ConflictClause::Existence, cond.fail_if_exists.as_ref(), 0)];
    for (clause, q, after) in clauses {
        let Some(q) = q else { continue };
        if q.is_none() {
            continue;
        }
        if staged.matches(q) {
            return Ok(Verdict::Conflict { clause, at: ConflictSite::SameBatch });
        }
        if let Some(p) = durable(q, after)? {
            return Ok(Verdict::Conflict { clause, at: ConflictSite::Durable(p) });
        }
    }
    Ok(Verdict::Pass)
}

#[cfg(test)]
mod tests {
    //! `evaluate` and `Staged` against linear oracles: the durable arm is answered by a scan of a
    //! durable list, the staged arm must agree exactly with `Query::matches` over the staged
    //! events (never a false negative, and no false positive either: the check is exact).
    use super::*;
    use crate::event::Event;
    use crate::model::Position;
    use proptest::prelude::*;

    fn event() -> impl Strategy<Value = Event> {
        crate::testgen::event(b"p")
    }

    use crate::testgen::query;

    fn condition() -> impl Strategy<Value = AppendCondition> {
        (query(), 0..40u64, proptest::option::of(query())).prop_map(|(q, after, ex)| {
            let c = AppendCondition::new(q).after(Position(after));
            match ex {
                Some(e) => c.fail_if_exists(e),
                None => c,
            }
        })
    }

    fn linear(events: &[Event], q: &Query, after: u64) -> Option<u64> {
        (after + 1..=events.len() as u64).find(|&p| q.matches(&events[(p - 1) as usize].as_ref()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn staged_matches_equals_a_linear_scan(runs in proptest::collection::vec((event(), 1..4usize), 0..12), q in query()) {
            // Runs of one event repeated, as inside one append (the staging area's fast path).
            let staged: Vec<Event> = runs.iter().flat_map(|(e, n)| std::iter::repeat_n(e.clone(), *n)).collect();
            let mut s = Staged::new();
            for e in &staged {
                s.push(e.as_ref());
            }
            let want = staged.iter().any(|e| q.matches(&e.as_ref()));
            let got = s.matches(&q);
            prop_assert!(!want || got, "false negative: {:?} over {:?}", q, staged);
            prop_assert_eq!(got, want, "false positive: {:?} over {:?}", q, staged);
        }

        #[test]
        fn evaluate_equals_the_oracle(
            durable in proptest::collection::vec(event(), 0..30),
            staged in proptest::collection::vec(event(), 0..8),
            mut cond in condition(),
        ) {
            cond.after = Position(cond.after.get().min(durable.len() as u64));
            let mut s = Staged::new();
            for e in &staged {
                s.push(e.as_ref());
            }
            let mut calls = Vec::new();
            let got = evaluate(&cond, &s, |q, after| {
                calls.push(after);
                Ok::<_, ()>(linear(&durable, q, after))
            })
            .unwrap();
            let clauses = [(ConflictClause::Boundary, Some(&cond.fail_if_events_match), cond.after.get()), (ConflictClause::Existence, cond.fail_if_exists.as_ref(), 0)];
            let mut want = Verdict::Pass;
            for (clause, q, after) in clauses {
                let Some(q) = q else { continue };
                if staged.iter().any(|e| q.matches(&e.as_ref())) {
                    want = Verdict::Conflict { clause, at: ConflictSite::SameBatch };
                    break;
                }
                if let Some(p) = linear(&durable, q, after) {
                    want = Verdict::Conflict { clause, at: ConflictSite::Durable(p) };
                    break;
                }
            }
            prop_assert_eq!(got, want);
            // The existence clause is asked over the whole log, the boundary above `after`.
            prop_assert!(calls.iter().all(|&a| a == 0 || a == cond.after.get()));
        }
    }

    /// A condition matching both a staged event and a durable one is answered `SameBatch`, as
    /// by the reference, whose staged arm goes first (review: ours answered `Durable`, with a
    /// position and not retryable, where the reference said retryable).
    #[test]
    fn the_staged_arm_answers_before_the_log() {
        let e = Event::new(&crate::model::EventType::new("A").unwrap(), &crate::model::Tags::new(["t"]).unwrap(), b"x").unwrap();
        let mut s = Staged::new();
        s.push(e.as_ref());
        let q = Query::item(crate::model::QueryItem::with_tags(crate::model::Tags::new(["t"]).unwrap()));
        let c = AppendCondition::new(q.clone());
        assert_eq!(evaluate(&c, &s, |_, _| Ok::<_, ()>(Some(1))), Ok(Verdict::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::SameBatch }));
        // Not asked of the log at all then; with nothing staged, the log's answer.
        assert_eq!(
            evaluate(&c, &s, |_, _| Err::<Option<u64>, _>("not asked")),
            Ok(Verdict::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::SameBatch })
        );
        assert_eq!(
            evaluate(&c, &Staged::new(), |_, _| Ok::<_, ()>(Some(1))),
            Ok(Verdict::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(1) })
        );
        // The boundary clause still goes before the existence clause: a durable boundary hit
        // wins over a staged existence hit.
        let u = Query::item(crate::model::QueryItem::with_tags(crate::model::Tags::new(["u"]).unwrap()));
        let both = AppendCondition::new(q.clone()).fail_if_exists(u.clone());
        let mut other = Staged::new();
        let f = Event::new(&crate::model::EventType::new("B").unwrap(), &crate::model::Tags::new(["u"]).unwrap(), b"y").unwrap();
        other.push(f.as_ref());
        assert_eq!(
            evaluate(&both, &other, |asked, _| Ok::<_, ()>((asked == &q).then_some(1))),
            Ok(Verdict::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(1) })
        );
        assert_eq!(evaluate(&both, &other, |_, _| Ok::<_, ()>(None)), Ok(Verdict::Conflict { clause: ConflictClause::Existence, at: ConflictSite::SameBatch }));
    }

    #[test]
    fn a_durable_read_error_is_returned_not_swallowed() {
        let s = Staged::new();
        let c = AppendCondition::new(Query::all());
        assert_eq!(evaluate(&c, &s, |_, _| Err::<Option<u64>, _>("io")), Err("io"));
        // A condition with both clauses off never asks the log.
        let off = AppendCondition::new(Query::none()).fail_if_exists(Query::none());
        assert_eq!(evaluate(&off, &s, |_, _| Err::<Option<u64>, _>("io")), Ok(Verdict::Pass));
    }
}
