//! The active segment's index: fed by the writer at each commit, read concurrently by every
//! reader shard without a lock held across evaluation and without ever blocking the writer.
//!
//! - Type column: an [`AtomicColumn`] of segment-local type ids (fixed chunks that never move).
//! - Type dictionary: a concurrent map name → id; ids are dense, in order of first appearance;
//!   with a count of events per id for the planner.
//! - Tag postings: a concurrent map tag → [`PostingList`], an append-only list of local
//!   positions (three inline slots, then a chain of chunks doubling in size) with one writer.
//!
//! A reader takes a map shard's read lock only for the probe (to clone an `Arc`), then reads
//! entries with atomic loads. The writer stores entries, then publishes a list's length with a
//! release store; the store's watermark (published after the commit is absorbed) bounds what a
//! reader looks at, so a reader sees exactly the events at or below the watermark it pinned
//! (docs/architecture.md §5.1).

use super::view::{Postings, SegmentView};
use crate::event::EventRef;
use crate::log::column::AtomicColumn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
type SharedMap<V> = dashmap::DashMap<Box<str>, V, ahash::RandomState>;

const INLINE: usize = 3;
const FIRST_CHUNK: usize = 4;
const MAX_CHUNK: usize = 1 << 16;

struct Chunk {
    slots: Box<[AtomicU32]>,
    next: OnceLock<Box<Chunk>>,
}

impl Chunk {
    fn new(cap: usize) -> Chunk {
        Chunk { slots: (0..cap).map(|_| AtomicU32::new(0)).collect(), next: OnceLock::new() }
    }
}

/// An append-only, ascending list of local positions: one writer, any number of readers.
pub struct PostingList {
    len: AtomicU32,
    inline: [AtomicU32; INLINE],
    rest: OnceLock<Box<Chunk>>,
}

impl PostingList {
    fn with_first(p: u32) -> PostingList {
        PostingList { len: AtomicU32::new(1), inline: [AtomicU32::new(p), AtomicU32::new(0), AtomicU32::new(0)], rest: OnceLock::new() }
    }

    /// Published length.
    pub fn published(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }

    fn slot(&self, i: usize) -> Option<&AtomicU32> {
        if i < INLINE {
            return Some(&self.inline[i]);
        }
        let mut i = i - INLINE;
        let mut c = self.rest.get()?;
        loop {
            if i < c.slots.len() {
                return Some(&c.slots[i]);
            }
            i -= c.slots.len();
            c = c.next.get()?;
        }
    }

    /// Appends `p` (writer only; `p` above every entry).
    fn push(&self, p: u32) {
        let n = self.len.load(Ordering::Relaxed) as usize;
        let slot = match self.slot(n) {
            Some(s) => s,
            None => {
                // Grow: a chunk twice the size of the last one (capped).
                let mut c = self.rest.get_or_init(|| Box::new(Chunk::new(FIRST_CHUNK)));
                let mut i = n - INLINE;
                while i >= c.slots.len() {
                    i -= c.slots.len();
                    let cap = (c.slots.len() * 2).min(MAX_CHUNK);
                    c = c.next.get_or_init(|| Box::new(Chunk::new(cap)));
                }
                &c.slots[i]
            }
        };
        slot.store(p, Ordering::Relaxed);
        self.len.store(n as u32 + 1, Ordering::Release);
    }
}

/// A reader's view of a posting list: the published entries below a local bound.
#[derive(Clone)]
pub struct ActivePostings {
    list: Arc<PostingList>,
    len: usize,
}

impl Postings for ActivePostings {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, i: usize) -> u32 {
        self.list.slot(i).expect("a published entry").load(Ordering::Relaxed)
    }
}

/// The index of the active segment (shared between the writer and readers).
pub struct ActiveIndex {
    base: u64,
    types: SharedMap<u32>,
    type_col: AtomicColumn,
    /// Events of each type id (an upper bound for a reader: it may count unpublished events).
    type_counts: AtomicColumn,
    tags: SharedMap<Arc<PostingList>>,
    /// Events absorbed so far (the writer's count; readers clamp to their watermark).
    absorbed: AtomicU32,
}

impl std::fmt::Debug for ActiveIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveIndex").field("base", &self.base).field("absorbed", &self.absorbed.load(Ordering::Relaxed)).finish()
    }
}

impl ActiveIndex {
    /// Base position of the segment.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Events absorbed (visible to a reader whose watermark covers them).
    pub fn absorbed(&self) -> u32 {
        self.absorbed.load(Ordering::Acquire)
    }

    /// A view covering local positions `0..count` (clamped to what was absorbed).
    pub fn view(&self, count: u32) -> ActiveView<'_> {
        ActiveView { ix: self, count: count.min(self.absorbed()) }
    }
}

/// An [`ActiveIndex`] clamped to a reader's watermark.
pub struct ActiveView<'a> {
    ix: &'a ActiveIndex,
    count: u32,
}

impl SegmentView for ActiveView<'_> {
    type P<'b>
        = ActivePostings
    where
        Self: 'b;

    fn count(&self) -> u32 {
        self.count
    }

    fn type_id(&self, name: &str) -> Option<u32> {
        self.ix.types.get(name).map(|r| *r)
    }

    fn type_at(&self, local: u32) -> u32 {
        self.ix.type_col.get(local as usize)
    }

    fn type_count(&self, name: &str) -> u64 {
        self.type_id(name).map_or(0, |id| self.ix.type_counts.get(id as usize) as u64)
    }

    fn postings(&self, tag: &str) -> Option<ActivePostings> {
        let list = self.ix.tags.get(tag).map(|r| r.clone())?;
        let mut p = ActivePostings { len: list.published(), list };
        // Entries past the view's bound belong to commits the reader does not see.
        p.len = p.lower_bound(self.count);
        (p.len > 0).then_some(p)
    }
}

/// The writer's side of an active index: feeds it and, at rollover, encodes the sealed file.
pub struct ActiveWriter {
    ix: Arc<ActiveIndex>,
    type_names: Vec<Box<str>>,
    type_ids: HashMap<Box<str>, u32>,
}

impl ActiveWriter {
    /// An empty index for the segment starting at `base` that can hold `capacity` events.
    pub fn new(base: u64, capacity: usize) -> ActiveWriter {
        let ix = Arc::new(ActiveIndex {
            base,
            types: SharedMap::default(),
            type_col: AtomicColumn::new(capacity),
            type_counts: AtomicColumn::new(capacity),
            tags: SharedMap::default(),
            absorbed: AtomicU32::new(0),
        });
        ActiveWriter { ix, type_names: Vec::new(), type_ids: HashMap::default() }
    }

    /// The shared index readers use.
    pub fn shared(&self) -> &Arc<ActiveIndex> {
        &self.ix
    }

    /// Events absorbed.
    pub fn absorbed(&self) -> u32 {
        self.ix.absorbed.load(Ordering::Relaxed)
    }

    /// Feeds the event at `pos`, which must be `base + absorbed()`.
    pub fn absorb(&mut self, pos: u64, ev: &EventRef<'_>) {
        self.absorb_run(pos, 1, ev);
    }

    /// Feeds `n` events with `ev`'s type and tags at `pos .. pos + n`; `pos` must be
    /// `base + absorbed()`. One lookup per name for the whole run.
    pub fn absorb_run(&mut self, pos: u64, n: u32, ev: &EventRef<'_>) {
        let local = self.absorbed();
        debug_assert_eq!(pos, self.ix.base + local as u64, "index fed out of order");
        let id = match self.type_ids.get(ev.event_type()) {
            Some(&id) => id,
            None => {
                let id = self.type_names.len() as u32;
                self.type_names.push(ev.event_type().into());
                self.type_ids.insert(ev.event_type().into(), id);
                self.ix.types.insert(ev.event_type().into(), id);
                id
            }
        };
        for l in local..local + n {
            self.ix.type_col.set(l as usize, id);
        }
        self.ix.type_counts.set(id as usize, self.ix.type_counts.get(id as usize) + n);
        for t in ev.tags() {
            let existing = self.ix.tags.get(t).map(|r| r.clone());
            // An event names a tag at most once (tags are a set), so entries stay ascending.
            let (list, from) = match existing {
                Some(list) => (list, local),
                None => {
                    let list = Arc::new(PostingList::with_first(local));
                    self.ix.tags.insert(t.into(), list.clone());
                    (list, local + 1)
                }
            };
            for l in from..local + n {
                list.push(l);
            }
        }
        self.ix.absorbed.store(local + n, Ordering::Release);
    }

    /// The sealed index file's bytes for everything absorbed ([`super::sealed::encode`]), tied
    /// to the segment by its `fingerprint`.
    pub fn encode_sealed(&self, fingerprint: u32) -> Vec<u8> {
        encode_sealed(&self.ix, &self.type_names, fingerprint)
    }

    /// The sealed index of everything absorbed, in memory ([`super::sealed::SealedIndex`]),
    /// tied to the segment by its `fingerprint`: a rebuilt index at the store's open, and the
    /// follower's index of a segment it saw sealed (0: it is never persisted).
    pub fn to_sealed(&self, fingerprint: u32) -> super::sealed::SealedIndex {
        let count = self.absorbed() as u64;
        super::sealed::SealedIndex::load(self.encode_sealed(fingerprint), self.ix.base, count, fingerprint).expect("a freshly encoded index validates")
    }

    /// Freezes the index (its segment is sealed) into a [`Sealer`] that can encode it on
    /// another thread while readers keep using the shared index.
    pub fn into_sealer(self, fingerprint: u32) -> Sealer {
        Sealer { ix: self.ix, type_names: self.type_names, fingerprint }
    }
}

/// A frozen active index on its way to a sealed index file; `Send`.
pub struct Sealer {
    ix: Arc<ActiveIndex>,
    type_names: Vec<Box<str>>,
    fingerprint: u32,
}

impl Sealer {
    /// Base position of the segment.
    pub fn base(&self) -> u64 {
        self.ix.base
    }

    /// Events indexed.
    pub fn count(&self) -> u64 {
        self.ix.absorbed() as u64
    }

    /// The log segment's fingerprint.
    pub fn fingerprint(&self) -> u32 {
        self.fingerprint
    }

    /// The sealed index file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        encode_sealed(&self.ix, &self.type_names, self.fingerprint)
    }
}

fn encode_sealed(ix: &ActiveIndex, type_names: &[Box<str>], fingerprint: u32) -> Vec<u8> {
    {
        let n = ix.absorbed();
        let view = ix.view(n);
        let names: Vec<&str> = type_names.iter().map(|s| &**s).collect();
        let col: Vec<u32> = (0..n).map(|i| view.type_at(i)).collect();
        let lists: Vec<(Box<str>, Vec<u32>)> = ix
            .tags
            .iter()
            .map(|e| {
                let p = ActivePostings { list: e.value().clone(), len: e.value().published() };
                (e.key().clone(), (0..p.len()).map(|i| p.get(i)).collect())
            })
            .collect();
        let mut tags: Vec<(&str, &[u32])> = lists.iter().map(|(k, v)| (&**k, &v[..])).collect();
        super::sealed::encode(ix.base, fingerprint, &names, &col, &mut tags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posting_lists_grow_across_chunks() {
        let l = PostingList::with_first(0);
        for i in 1..200_000u32 {
            l.push(i * 2);
        }
        let p = ActivePostings { len: l.published(), list: Arc::new(l) };
        assert_eq!(p.len(), 200_000);
        for i in [0usize, 1, 2, 3, 4, 6, 7, 100, 65_535, 199_999] {
            assert_eq!(p.get(i), i as u32 * 2);
        }
        assert!(p.contains(131_070));
        assert!(!p.contains(131_071));
        assert_eq!(p.lower_bound(7), 4);
    }

    /// Readers on other threads see a prefix of the list while the writer appends.
    #[test]
    fn readers_see_ascending_prefixes_during_appends() {
        let l = Arc::new(PostingList::with_first(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let p = ActivePostings { len: l.published(), list: l.clone() };
                        assert!(p.len() >= seen);
                        seen = p.len();
                        for i in 0..p.len() {
                            assert_eq!(p.get(i), i as u32);
                        }
                    }
                })
            })
            .collect();
        for i in 1..50_000 {
            l.push(i);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    }
}
