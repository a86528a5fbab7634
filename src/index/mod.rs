//! The in-memory index the writer judges conditions with: tag postings and a type column.
//!
//! Tag → ascending positions, and a dense column of segment-independent type ids (types are
//! low-cardinality, so no type postings). Built from the log at open and fed at each commit,
//! in position order, before the append is answered. A condition check is then exact and
//! touches no disk: walk the rarest tag's postings above `after`, confirm the other tags by
//! binary search and the type through the column (reference engine §4.3 "Index check").
//!
//! Memory: 8 bytes per tag occurrence plus 4 per event. Sealed per-segment index files that
//! bound this are the index issue's work.

use crate::event::EventRef;
use crate::model::{Query, QueryItem};
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// Tag postings and the type column of the whole log.
#[derive(Debug, Default)]
pub struct MemIndex {
    tags: HashMap<Box<str>, Vec<u64>>,
    type_ids: HashMap<Box<str>, u32>,
    /// Type id of position `p` at index `p - 1`.
    type_col: Vec<u32>,
}

impl MemIndex {
    /// An empty index.
    pub fn new() -> MemIndex {
        MemIndex::default()
    }

    /// Number of positions indexed (the head it covers).
    pub fn head(&self) -> u64 {
        self.type_col.len() as u64
    }

    /// Feeds the event at `pos`, which must be `head() + 1`.
    pub fn absorb(&mut self, pos: u64, ev: &EventRef<'_>) {
        debug_assert_eq!(pos, self.head() + 1, "index fed out of order");
        let next_id = self.type_ids.len() as u32;
        let id = match self.type_ids.get(ev.event_type()) {
            Some(&id) => id,
            None => {
                self.type_ids.insert(ev.event_type().into(), next_id);
                next_id
            }
        };
        self.type_col.push(id);
        for t in ev.tags() {
            match self.tags.get_mut(t) {
                Some(v) => v.push(pos),
                None => {
                    self.tags.insert(t.into(), vec![pos]);
                }
            }
        }
    }

    fn postings(&self, tag: &str) -> &[u64] {
        self.tags.get(tag).map_or(&[][..], |v| &v[..])
    }

    /// The lowest indexed position above `after` matching `item`.
    pub fn item_first_match(&self, item: &QueryItem, after: u64) -> Option<u64> {
        let type_ok: Option<Vec<u32>> = if item.types.is_empty() {
            None
        } else {
            let ids: Vec<u32> = item.types.iter().filter_map(|t| self.type_ids.get(t.as_str()).copied()).collect();
            if ids.is_empty() {
                return None;
            }
            Some(ids)
        };
        let type_matches = |p: u64| type_ok.as_ref().is_none_or(|ids| ids.contains(&self.type_col[(p - 1) as usize]));
        if item.tags.is_empty() {
            return (after + 1..=self.head()).find(|&p| type_matches(p));
        }
        let lists: Vec<&[u64]> = item.tags.iter().map(|t| self.postings(t.as_str())).collect();
        let (ri, rarest) = lists.iter().enumerate().min_by_key(|(_, l)| l.len()).map(|(i, l)| (i, *l))?;
        let start = rarest.partition_point(|&p| p <= after);
        rarest[start..].iter().copied().find(|&p| {
            type_matches(p) && lists.iter().enumerate().all(|(i, l)| i == ri || l.binary_search(&p).is_ok())
        })
    }

    /// The lowest indexed position above `after` matching `q`.
    pub fn first_match(&self, q: &Query, after: u64) -> Option<u64> {
        match q {
            Query::All => (self.head() > after).then_some(after + 1),
            Query::Items(items) => items.iter().filter_map(|i| self.item_first_match(i, after)).min(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! `MemIndex::first_match` against a linear scan with the one predicate, `Query::matches`.
    use super::*;
    use crate::event::Event;
    use proptest::prelude::*;

    fn event() -> impl Strategy<Value = Event> {
        crate::testgen::event(b"")
    }

    use crate::testgen::query;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn first_match_equals_a_linear_scan(
            events in proptest::collection::vec(event(), 0..60),
            queries in proptest::collection::vec((query(), 0..64u64), 1..8),
        ) {
            let mut ix = MemIndex::new();
            for (i, e) in events.iter().enumerate() {
                ix.absorb(i as u64 + 1, &e.as_ref());
            }
            prop_assert_eq!(ix.head(), events.len() as u64);
            for (q, after) in &queries {
                let want = (after + 1..=events.len() as u64).find(|&p| q.matches(&events[(p - 1) as usize].as_ref()));
                prop_assert_eq!(ix.first_match(q, *after), want, "{:?} after {}", q, after);
            }
        }
    }
}
