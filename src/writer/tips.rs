//! Durable tips: the highest durable position of every tag and type, a fast reject for
//! conditions (reference engine §4.3 "Fast reject", made exact from open onwards).
//!
//! Invariant: for every tag (type) that occurs at a position above `floor`, the map holds its
//! highest position. Tags absent from the map therefore occur at most at `floor`. The map is
//! built from the whole log at open and kept bounded: when it outgrows [`MAX_ENTRIES`], the
//! floor rises to `head - window` (or to `head` if that is not enough) and entries at or below
//! it are dropped, so `writer.tips_window` is a memory bound, never a correctness knob.

use crate::event::EventRef;
use crate::model::{Query, QueryItem};
use std::collections::HashMap;

/// Entries (tags plus types) above which the window eviction runs.
pub const MAX_ENTRIES: usize = 1 << 20;

/// Highest durable position per tag and per type.
#[derive(Debug, Default)]
pub struct Tips {
    tags: HashMap<Box<str>, u64>,
    types: HashMap<Box<str>, u64>,
    floor: u64,
    window: u64,
    max_entries: usize,
}

impl Tips {
    /// Empty tips with an eviction `window` in positions (`writer.tips_window`).
    pub fn new(window: u64) -> Tips {
        Tips { window, max_entries: MAX_ENTRIES, ..Tips::default() }
    }

    /// Overrides the entry cap (tests use a tiny one to exercise eviction).
    pub fn with_max_entries(mut self, n: usize) -> Tips {
        self.max_entries = n.max(1);
        self
    }

    /// Positions at or below the floor may be missing from the maps.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Records a durable event at `pos` (positions must arrive in ascending order).
    pub fn absorb(&mut self, pos: u64, ev: &EventRef<'_>) {
        match self.types.get_mut(ev.event_type()) {
            Some(p) => *p = pos,
            None => {
                self.types.insert(ev.event_type().into(), pos);
            }
        }
        for t in ev.tags() {
            match self.tags.get_mut(t) {
                Some(p) => *p = pos,
                None => {
                    self.tags.insert(t.into(), pos);
                }
            }
        }
    }

    /// Applies the memory bound after a commit that made `head` durable.
    pub fn evict(&mut self, head: u64) {
        if self.tags.len() + self.types.len() <= self.max_entries {
            return;
        }
        let mut floor = self.floor.max(head.saturating_sub(self.window));
        self.drop_at_or_below(floor);
        if self.tags.len() + self.types.len() > self.max_entries {
            floor = head;
            self.drop_at_or_below(floor);
        }
        self.floor = floor;
    }

    fn drop_at_or_below(&mut self, floor: u64) {
        self.tags.retain(|_, p| *p > floor);
        self.types.retain(|_, p| *p > floor);
    }

    fn tag_max(&self, t: &str) -> u64 {
        self.tags.get(t).copied().unwrap_or(self.floor)
    }

    /// No event above `item_bound` can match `item`; `None` = no event above `after` can.
    pub fn item_bound(&self, item: &QueryItem, after: u64, head: u64) -> Option<u64> {
        let mut hi = head;
        for t in item.tags.iter() {
            hi = hi.min(self.tag_max(t.as_str()));
        }
        if !item.types.is_empty() {
            let ty = item.types.iter().map(|t| self.types.get(t.as_str()).copied().unwrap_or(self.floor)).max().unwrap_or(0);
            hi = hi.min(ty);
        }
        (hi > after).then_some(hi)
    }

    /// The highest position a match of `q` above `after` could have, or `None` when the tips
    /// prove there is none.
    pub fn query_bound(&self, q: &Query, after: u64, head: u64) -> Option<u64> {
        match q {
            Query::All => (head > after).then_some(head),
            Query::Items(items) => items.iter().filter_map(|i| self.item_bound(i, after, head)).max(),
        }
    }
}
