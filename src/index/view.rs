//! The one index evaluator, over any segment's index (active or sealed), and the planner's
//! estimate. Pure: no I/O, no runtime.
//!
//! Positions here are segment-local (`position - base`, `u32`). A [`SegmentView`] exposes a
//! type column, a type dictionary and ascending tag posting lists, all clamped to the events
//! the view covers. Evaluation follows docs/architecture.md §5.2: per query item,
//! a tagless item walks the type column; a tagged item walks its shortest posting list and
//! confirms the other tags by binary search and the type through the column; items are unioned.
//! Every path agrees with [`crate::model::Query::matches`].

use crate::model::{Query, QueryItem};

/// An ascending list of local positions.
pub trait Postings {
    /// Number of entries.
    fn len(&self) -> usize;
    /// Entry `i` (`i < len()`).
    fn get(&self, i: usize) -> u32;
    /// True when there are no entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Index of the first entry `>= x`.
    fn lower_bound(&self, x: u32) -> usize {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid) < x {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
    /// True when `x` is an entry.
    fn contains(&self, x: u32) -> bool {
        let i = self.lower_bound(x);
        i < self.len() && self.get(i) == x
    }
}

/// One segment's index as the evaluator sees it.
pub trait SegmentView {
    /// Posting list type.
    type P<'a>: Postings
    where
        Self: 'a;
    /// Events covered: local positions `0..count()`.
    fn count(&self) -> u32;
    /// The segment-local id of a type name, if any covered event has that type.
    fn type_id(&self, name: &str) -> Option<u32>;
    /// Type id of local position `local < count()`.
    fn type_at(&self, local: u32) -> u32;
    /// The posting list of `tag`, clamped to `count()`; `None` when no covered event has it.
    fn postings(&self, tag: &str) -> Option<Self::P<'_>>;
    /// Upper bound of `tag`'s postings (exact for sealed segments).
    fn term_len(&self, tag: &str) -> u64 {
        self.postings(tag).map_or(0, |p| p.len() as u64)
    }
    /// Upper bound of the events of type `name` (exact for sealed segments).
    fn type_count(&self, name: &str) -> u64;
}

/// Which way a search walks its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Ascending positions, the lowest first.
    Forward,
    /// Descending positions, the highest first.
    Backward,
}

/// The matches of `item` in local range `[lo, hi)`, nearest the start of the walk first, at
/// most `limit`.
fn item_matches<V: SegmentView>(v: &V, item: &QueryItem, lo: u32, hi: u32, dir: Direction, limit: usize, out: &mut Vec<u32>) {
    let hi = hi.min(v.count());
    if lo >= hi || limit == 0 {
        return;
    }
    let mut ids = Vec::new();
    if !item.types.is_empty() {
        ids.extend(item.types.iter().filter_map(|t| v.type_id(t.as_str())));
        if ids.is_empty() {
            return;
        }
    }
    let type_ok = |p: u32| ids.is_empty() || ids.contains(&v.type_at(p));
    let start = out.len();
    let take = |p: u32, out: &mut Vec<u32>| {
        out.push(p);
        out.len() - start >= limit
    };
    if item.tags.is_empty() {
        match dir {
            Direction::Forward => {
                for p in lo..hi {
                    if type_ok(p) && take(p, out) {
                        return;
                    }
                }
            }
            Direction::Backward => {
                for p in (lo..hi).rev() {
                    if type_ok(p) && take(p, out) {
                        return;
                    }
                }
            }
        }
        return;
    }
    let mut lists = Vec::with_capacity(item.tags.len());
    for t in item.tags.iter() {
        match v.postings(t.as_str()) {
            Some(p) => lists.push(p),
            None => return,
        }
    }
    let (ri, _) = lists.iter().enumerate().min_by_key(|(_, l)| l.len()).expect("an item with tags");
    let rarest = &lists[ri];
    let (a, b) = (rarest.lower_bound(lo), rarest.lower_bound(hi));
    let hit = |p: u32| type_ok(p) && lists.iter().enumerate().all(|(i, l)| i == ri || l.contains(p));
    match dir {
        Direction::Forward => {
            for i in a..b {
                let p = rarest.get(i);
                if hit(p) && take(p, out) {
                    return;
                }
            }
        }
        Direction::Backward => {
            for i in (a..b).rev() {
                let p = rarest.get(i);
                if hit(p) && take(p, out) {
                    return;
                }
            }
        }
    }
}

/// The local positions in `[lo, hi)` matching `q`, in walk order (ascending for forward,
/// descending for backward), at most `limit`. Work is bounded by `limit` per query item.
pub fn matches<V: SegmentView>(v: &V, q: &Query, lo: u32, hi: u32, dir: Direction, limit: usize) -> Vec<u32> {
    let hi = hi.min(v.count());
    let mut out = Vec::new();
    match q {
        Query::All => {
            let n = ((hi.saturating_sub(lo)) as usize).min(limit) as u32;
            match dir {
                Direction::Forward => out.extend(lo..lo + n),
                Direction::Backward => out.extend((hi - n..hi).rev()),
            }
        }
        Query::Items(items) => {
            for item in items {
                item_matches(v, item, lo, hi, dir, limit, &mut out);
            }
            if items.len() > 1 {
                out.sort_unstable();
                out.dedup();
                if dir == Direction::Backward {
                    out.reverse();
                }
                out.truncate(limit);
            }
        }
    }
    out
}

/// The lowest local position in `[lo, count)` matching `q` (the condition check's question).
pub fn first_match<V: SegmentView>(v: &V, q: &Query, lo: u32) -> Option<u32> {
    match q {
        Query::All => (lo < v.count()).then_some(lo),
        Query::Items(items) => items
            .iter()
            .filter_map(|item| {
                let mut one = Vec::with_capacity(1);
                item_matches(v, item, lo, v.count(), Direction::Forward, 1, &mut one);
                one.first().copied()
            })
            .min(),
    }
}

/// The planner's estimate of `q`'s matches in a range of `width` positions of this segment:
/// per item the shortest of its tags' posting lengths (0 when a tag is absent); for a tagless
/// item the events of its types (the reference takes the full width here: counting types is
/// what lets a read of a rare type use the type column instead of decoding every event); the
/// full width for an item with neither, or [`Query::All`]; summed and capped at `width`
/// (docs/architecture.md §5.2).
pub fn estimate<V: SegmentView>(v: &V, q: &Query, width: u64) -> u64 {
    match q {
        Query::All => width,
        Query::Items(items) => items
            .iter()
            .map(|item| {
                if item.tags.is_empty() && item.types.is_empty() {
                    width
                } else if item.tags.is_empty() {
                    item.types.iter().map(|t| v.type_count(t.as_str())).fold(0u64, |a, b| a.saturating_add(b))
                } else {
                    item.tags.iter().map(|t| v.term_len(t.as_str())).min().unwrap_or(0)
                }
            })
            .fold(0u64, |a, b| a.saturating_add(b))
            .min(width),
    }
}
