//! Tag and type indexes: what makes selective reads and condition checks cost what they return
//! rather than the size of the log (docs/architecture.md §4.3, §5.2;
//! docs/format.md §8).
//!
//! Every log segment has a [`SegIndex`]:
//! - the active segment an [`active::ActiveIndex`], fed by the writer at each commit, in
//!   position order, before the append is answered (so a client reads its own write through it);
//! - each sealed segment a [`sealed::SealedIndex`], encoded at rollover and persisted in
//!   `tagindex/{base:020}.tix` ([`INDEX_DIR`]), loaded at open when its checksums, base and
//!   count match the log segment, otherwise rebuilt from the log and rewritten.
//!
//! [`view`] holds the one evaluator both kinds share, and the planner's estimate. [`Tips`] is
//! the writer's fast reject for conditions. The log scan stays the oracle: the planner and the
//! index change speed, never answers.

pub mod active;
pub mod sealed;
pub mod view;

use crate::event::EventRef;
use crate::model::Query;
use active::ActiveIndex;
use sealed::SealedIndex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use view::Direction;
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// The folder inside the data directory holding sealed index files. Not the reference's
/// `index/`: neither server reads the other's index files.
pub const INDEX_DIR: &str = "tagindex";

/// Path of the sealed index file of the segment starting at `base`:
/// `{dir}/tagindex/{base:020}.tix`.
pub fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(INDEX_DIR).join(format!("{base:020}.tix"))
}

/// Writes a sealed index file durably: a temporary file, fsync, rename over the final name,
/// fsync of the folder (creating it, and syncing the data directory, on first use). The bytes
/// go to the disk [`INDEX_WRITE_CHUNK`] at a time, each waited for before the next is written:
/// a sealed index of a 256 MiB segment is several MiB, and handed to the disk at once by the
/// fsync it sat in the device queue ahead of the group commits' writes (appends in the ~30 ms
/// it took saw p99 latency double; measured with `tephra-bench append -c 16 -b 64`).
///
/// # Errors
/// The I/O error; the caller logs it and carries on (the file is rebuilt at the next open).
pub fn write_index_file(dir: &Path, base: u64, bytes: &[u8]) -> std::io::Result<()> {
    let folder = dir.join(INDEX_DIR);
    if !folder.exists() {
        std::fs::create_dir_all(&folder)?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    crate::fault::io_point("index_write")?;
    let path = index_path(dir, base);
    let tmp = path.with_extension("tix.tmp");
    let written = write_then_rename(&tmp, &path, &folder, bytes);
    if written.is_err() {
        // A full disk or a failed write leaves no half-written temporary file behind (review).
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The steps of [`write_index_file`] after the folder exists: write `tmp`, sync, rename to
/// `path`, sync `folder`.
fn write_then_rename(tmp: &Path, path: &Path, folder: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(tmp)?;
    let mut at = 0usize;
    for chunk in bytes.chunks(INDEX_WRITE_CHUNK) {
        f.write_all(chunk)?;
        write_out(&f, at, chunk.len())?;
        at += chunk.len();
    }
    f.sync_data()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    std::fs::File::open(folder)?.sync_all()
}

/// How much of a sealed index file [`write_index_file`] hands to the disk at a time, in bytes.
pub const INDEX_WRITE_CHUNK: usize = 256 << 10;

/// Starts writing back `len` bytes of `f` at `offset` and waits until they are written
/// (`sync_file_range`; the data only, not the file's metadata, which the final fsync covers).
fn write_out(f: &std::fs::File, offset: usize, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain system call on a descriptor `f` owns for the duration of the call.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), offset as libc::off64_t, len as libc::off64_t, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Loads the sealed index file of the log segment `base` holding `count` events with
/// `fingerprint` ([`crate::log::segment::Fingerprint`]).
///
/// # Errors
/// A description of why the file is unusable (missing, unreadable, or any
/// [`sealed::IndexFileError`]); the caller rebuilds it from the log.
pub fn load_index_file(dir: &Path, base: u64, count: u64, fingerprint: u32) -> Result<SealedIndex, String> {
    let path = index_path(dir, base);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    SealedIndex::load(bytes, base, count, fingerprint).map_err(|e| format!("{}: {e}", path.display()))
}

/// Persists the bytes of a sealed index ([`write_index_file`]) and loads them for readers. A
/// failed write is returned beside the index, for the caller to say (the file is rebuilt at
/// the next open): the store's open says all of them in one line, the sealing threads at most
/// once a minute.
///
/// # Errors
/// The [`sealed::IndexFileError`] of the load (not expected: the bytes were just encoded).
pub fn persist_sealed_quietly(
    dir: &Path,
    base: u64,
    count: u64,
    fingerprint: u32,
    bytes: Vec<u8>,
) -> Result<(SealedIndex, Option<std::io::Error>), sealed::IndexFileError> {
    let written = write_index_file(dir, base, &bytes).err();
    SealedIndex::load(bytes, base, count, fingerprint).map(|ix| (ix, written))
}

/// A committed record that is no valid event, met while an index was fed from the log.
#[derive(Debug)]
pub struct BadEvent {
    /// Its place among the payloads given (0 for the first).
    pub at: usize,
    /// Why it does not decode.
    pub error: crate::event::DecodeError,
}

/// Feeds `ix` the committed events `payloads` (encoded events in position order, the first at
/// position `first`, which must be where `ix` continues): the one way an index is built from
/// the log, by the store's open (the active segment, and each sealed segment whose index file
/// is missing or unusable, through [`rebuild`]) and by the follower (as commits become
/// visible, and at its open). Stops at the first payload that is no valid event and returns
/// it; the ones before it are fed.
///
/// # Errors
/// [`BadEvent`]: the first payload that does not decode.
pub fn feed<'a>(ix: &mut active::ActiveWriter, first: u64, payloads: impl IntoIterator<Item = &'a [u8]>) -> Result<(), BadEvent> {
    for (k, bytes) in payloads.into_iter().enumerate() {
        match EventRef::from_bytes(bytes) {
            Ok(ev) => ix.absorb(first + k as u64, &ev),
            Err(error) => return Err(BadEvent { at: k, error }),
        }
    }
    Ok(())
}

/// Rebuilds the index of the segment starting at `base`, which can hold `capacity` events,
/// from its committed events `payloads` in position order ([`feed`]); the caller seals it
/// ([`active::ActiveWriter::to_sealed`]) when the segment is sealed.
///
/// # Errors
/// [`BadEvent`]: the first payload that does not decode.
pub fn rebuild<'a>(base: u64, capacity: usize, payloads: impl IntoIterator<Item = &'a [u8]>) -> Result<active::ActiveWriter, BadEvent> {
    let mut ix = active::ActiveWriter::new(base, capacity);
    feed(&mut ix, base, payloads)?;
    Ok(ix)
}

/// One segment's index as readers and the writer see it.
#[derive(Clone, Debug)]
pub enum SegIndex {
    /// The active segment's live index.
    Active(Arc<ActiveIndex>),
    /// A sealed segment's index.
    Sealed(Arc<SealedIndex>),
}

impl SegIndex {
    /// The planner's estimate of matches among local positions `[lo, hi)`.
    pub fn estimate(&self, q: &Query, lo: u32, hi: u32) -> u64 {
        let width = hi.saturating_sub(lo) as u64;
        match self {
            SegIndex::Active(a) => view::estimate(&a.view(hi), q, width),
            SegIndex::Sealed(s) => view::estimate(&**s, q, width),
        }
    }

    /// Matching local positions in `[lo, hi)` in walk order, at most `limit`.
    pub fn matches(&self, q: &Query, lo: u32, hi: u32, dir: Direction, limit: usize) -> Vec<u32> {
        match self {
            SegIndex::Active(a) => view::matches(&a.view(hi), q, lo, hi, dir, limit),
            SegIndex::Sealed(s) => view::matches(&**s, q, lo, hi, dir, limit),
        }
    }

    /// The lowest matching local position in `[lo, hi)`, if any.
    pub fn first_match(&self, q: &Query, lo: u32, hi: u32) -> Option<u32> {
        match self {
            SegIndex::Active(a) => view::first_match(&a.view(hi), q, lo),
            SegIndex::Sealed(s) => view::first_match(&**s, q, lo).filter(|&p| p < hi),
        }
    }
}

/// Most entries [`Tips`] keeps before it raises its floor (the reference's `1 << 20`).
pub const TIPS_MAX_ENTRIES: usize = 1 << 20;

/// The writer's fast reject for conditions: for each tag, the span of positions it occurs at
/// since a floor (docs/architecture.md §4.3, extended with each tag's first
/// occurrence), and for each (tag, type) pair its last occurrence since the floor (our
/// extension: a condition naming a type a stream has never carried is rejected without a
/// look at the stream's events). A tag or pair absent from its map occurs only at or below the
/// floor. An item can only match at or below the lowest last occurrence of its tags, for each
/// of its tags at or below the highest last occurrence of that tag with one of the item's
/// types, and never inside a gap where one of its tags is known to be absent; a query can only
/// match where one of its items can. Tagless items and [`Query::All`] are never narrowed below
/// the tip. Never a false negative: every position that could match stays in
/// [`Tips::candidates`], and the index decides there.
pub struct Tips {
    map: HashMap<Box<str>, TagSpan>,
    /// Last occurrence of each (tag, type) pair, keyed by a 64-bit digest of the pair
    /// ([`Tips::pair_key`]). Two pairs sharing a digest share an entry, whose last occurrence is
    /// then the later of theirs: an over-estimate, never a miss.
    pairs: HashMap<u64, u64>,
    pair_digest: ahash::RandomState,
    floor: u64,
    window: u64,
    max_entries: usize,
}

/// Where one tag occurs: only at or below `since` (the floor when the entry was made, where
/// the tips know nothing) and inside `[first, last]`.
#[derive(Clone, Copy, Debug)]
struct TagSpan {
    since: u64,
    first: u64,
    last: u64,
}

/// Inclusive position ranges, ascending and disjoint: where a query can match
/// ([`Tips::candidates`]). Empty when the tips rule the query out.
pub type Candidates = smallvec::SmallVec<[(u64, u64); 2]>;

impl Tips {
    /// Cold tips over a log whose tip (its last position) is `tip`: every tag sits at or
    /// below it.
    /// `window` is `writer.tips_window`: at eviction the floor rises to `tip - window`.
    pub fn new(tip: u64, window: u64) -> Tips {
        Tips { map: HashMap::default(), pairs: HashMap::default(), pair_digest: ahash::RandomState::new(), floor: tip, window, max_entries: TIPS_MAX_ENTRIES }
    }

    /// The digest a (tag, type) pair is kept under in `pairs`.
    fn pair_key(&self, tag: &str, event_type: &str) -> u64 {
        self.pair_digest.hash_one((tag, event_type))
    }

    /// Most (tag, type) pairs kept: two per tag on average before the floor rises.
    fn max_pairs(&self) -> usize {
        self.max_entries.saturating_mul(2)
    }

    /// Records an event at `pos` (positions only ever rise).
    pub fn absorb(&mut self, pos: u64, ev: &EventRef<'_>) {
        self.absorb_run(pos, pos, ev);
    }

    /// Records events with `ev`'s tags at every position of `first ..= last`.
    pub fn absorb_run(&mut self, first: u64, last: u64, ev: &EventRef<'_>) {
        let ty = ev.event_type();
        for t in ev.tags() {
            match self.map.get_mut(t) {
                Some(span) => span.last = last,
                None => {
                    self.map.insert(t.into(), TagSpan { since: self.floor, first, last });
                }
            }
            let key = self.pair_key(t, ty);
            self.pairs.insert(key, last);
        }
    }

    /// After a round staged up to `tip`: bounds the map by raising the floor. Each trim leaves at
    /// most half the maximum, so its O(entries) pass is paid at most once per `max / 2` new
    /// tags (amortised O(1) per commit).
    pub fn trim(&mut self, tip: u64) {
        if self.map.len() > self.max_entries || self.pairs.len() > self.max_pairs() {
            self.floor = self.floor.max(tip.saturating_sub(self.window));
            let floor = self.floor;
            self.map.retain(|_, s| s.last > floor);
            self.pairs.retain(|_, last| *last > floor);
            if self.map.len() > self.max_entries / 2 || self.pairs.len() > self.max_pairs() / 2 {
                // The window alone did not bound them: drop everything, the floor is the tip.
                self.floor = tip;
                self.map.clear();
                self.pairs.clear();
            }
        }
    }

    /// The positions in `(after, tip]` where `q` can match, as ascending disjoint inclusive
    /// ranges; every matching position lies in one of them.
    pub fn candidates(&self, q: &Query, after: u64, tip: u64) -> Candidates {
        let mut out = Candidates::new();
        if after >= tip {
            return out;
        }
        let items = match q {
            Query::All => {
                out.push((after + 1, tip));
                return out;
            }
            Query::Items(items) => items,
        };
        let mut all: Candidates = Candidates::new();
        for item in items {
            let mut ranges: Candidates = Candidates::new();
            let mut hi = tip;
            for t in item.tags.iter() {
                hi = hi.min(self.map.get(t.as_str()).map_or(self.floor, |s| s.last));
                if !item.types.is_empty() {
                    // The last event with this tag and one of the item's types.
                    let last = item.types.iter().filter_map(|ty| self.pairs.get(&self.pair_key(t.as_str(), ty.as_str()))).max();
                    hi = hi.min(last.map_or(self.floor, |&l| l.max(self.floor)));
                }
            }
            if hi <= after {
                continue;
            }
            ranges.push((after + 1, hi));
            for t in item.tags.iter() {
                if let Some(s) = self.map.get(t.as_str()) {
                    // The tag does not occur in (since, first).
                    subtract(&mut ranges, s.since + 1, s.first.saturating_sub(1));
                }
            }
            all.extend(ranges);
        }
        all.sort_unstable();
        for (lo, hi) in all {
            match out.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        out
    }

    #[cfg(test)]
    fn with_max_entries(mut self, n: usize) -> Tips {
        self.max_entries = n;
        self
    }
}

/// Removes the inclusive range `[lo, hi]` (nothing when `lo > hi`) from ascending disjoint
/// inclusive `ranges`.
fn subtract(ranges: &mut Candidates, lo: u64, hi: u64) {
    if lo > hi {
        return;
    }
    let mut out = Candidates::new();
    for &(a, b) in ranges.iter() {
        if b < lo || a > hi {
            out.push((a, b));
            continue;
        }
        if a < lo {
            out.push((a, lo - 1));
        }
        if b > hi {
            out.push((hi + 1, b));
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    //! The evaluator over active and sealed indexes against a linear scan with the one
    //! predicate, `Query::matches`.
    use super::*;
    use crate::event::Event;
    use proptest::prelude::*;

    fn event() -> impl Strategy<Value = Event> {
        crate::testgen::event(b"")
    }

    use crate::testgen::query;

    /// Builds the sealed index of a segment from its events, in position order, as the store
    /// and the follower rebuild one ([`rebuild`]).
    fn build_sealed<'a>(base: u64, fingerprint: u32, events: impl Iterator<Item = EventRef<'a>>, capacity: usize) -> SealedIndex {
        let events: Vec<EventRef<'a>> = events.collect();
        rebuild(base, capacity, events.iter().map(|e| e.as_bytes())).expect("valid events").to_sealed(fingerprint)
    }

    /// A payload that is no event stops the feeding there, named by its place; the events
    /// before it are fed.
    #[test]
    fn feeding_stops_at_a_record_that_is_no_event() {
        use crate::model::{EventType, Tags};
        let ev = Event::new(&EventType::new("A").unwrap(), &Tags::new(["t"]).unwrap(), b"x").unwrap();
        let payloads: [&[u8]; 3] = [ev.as_bytes(), ev.as_bytes(), &[0xff]];
        let mut ix = active::ActiveWriter::new(5, 10);
        let bad = feed(&mut ix, 5, payloads).unwrap_err();
        assert_eq!((bad.at, ix.absorbed()), (2, 2));
        let sealed = rebuild(5, 10, payloads[..2].iter().copied()).unwrap().to_sealed(9);
        assert_eq!(sealed.bytes(), ix.to_sealed(9).bytes());
    }

    fn linear(events: &[Event], q: &Query, lo: u32, hi: u32, dir: Direction, limit: usize) -> Vec<u32> {
        let hits = (lo..hi.min(events.len() as u32)).filter(|&p| q.matches(&events[p as usize].as_ref()));
        match dir {
            Direction::Forward => hits.take(limit).collect(),
            Direction::Backward => hits.rev().take(limit).collect(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn active_and_sealed_equal_a_linear_scan(
            runs in proptest::collection::vec((event(), 1..4u32), 0..30),
            queries in proptest::collection::vec((query(), 0..64u32, 0..64u32, 1..8usize, any::<bool>()), 1..8),
            visible in 0..64u32,
        ) {
            // Runs of one event repeated are fed as runs (one append's shape), singles one by one.
            let events: Vec<Event> = runs.iter().flat_map(|(e, n)| std::iter::repeat_n(e.clone(), *n as usize)).collect();
            let mut w = active::ActiveWriter::new(10, 1000);
            let mut pos = 10;
            for (e, n) in &runs {
                if *n == 1 {
                    w.absorb(pos, &e.as_ref());
                } else {
                    w.absorb_run(pos, *n, &e.as_ref());
                }
                pos += *n as u64;
            }
            let sealed = SealedIndex::load(w.encode_sealed(7), 10, events.len() as u64, 7).unwrap();
            let rebuilt = build_sealed(10, 7, events.iter().map(|e| e.as_ref()), 1000);
            prop_assert_eq!(sealed.bytes(), rebuilt.bytes());
            let active = SegIndex::Active(w.shared().clone());
            let sealed = SegIndex::Sealed(Arc::new(sealed));
            let visible = visible.min(events.len() as u32);
            for (q, a, b, limit, fwd) in &queries {
                let dir = if *fwd { Direction::Forward } else { Direction::Backward };
                let (lo, hi) = ((*a).min(*b), (*a).max(*b));
                // The active index clamped to what a reader's watermark covers.
                let want = linear(&events[..visible as usize], q, lo, hi.min(visible), dir, *limit);
                prop_assert_eq!(active.matches(q, lo, hi.min(visible), dir, *limit), want.clone(), "active {:?}", q);
                let want = linear(&events, q, lo, hi, dir, *limit);
                prop_assert_eq!(sealed.matches(q, lo, hi.min(events.len() as u32), dir, *limit), want, "sealed {:?}", q);
                let first = linear(&events, q, lo, u32::MAX, Direction::Forward, 1).first().copied();
                let n = events.len() as u32;
                prop_assert_eq!(active.first_match(q, lo, n), first);
                prop_assert_eq!(sealed.first_match(q, lo, n), first);
                prop_assert!(sealed.estimate(q, lo, hi) <= (hi - lo) as u64);
            }
        }

        #[test]
        fn tips_never_rule_out_a_match(
            events in proptest::collection::vec(event(), 0..60),
            queries in proptest::collection::vec((query(), 0..64u64), 1..8),
            preloaded in 0..20usize,
            max in 1..8usize,
        ) {
            // The first `preloaded` events are durable before the tips start (cold).
            let preloaded = preloaded.min(events.len());
            let mut tips = Tips::new(preloaded as u64, 5).with_max_entries(max);
            // Runs of events named alike go in as one run, as the writer feeds them.
            let mut i = preloaded;
            while i < events.len() {
                let name = |e: &Event| (e.as_ref().event_type().to_owned(), e.as_ref().tags().map(str::to_owned).collect::<Vec<_>>());
                let mut j = i + 1;
                while j < events.len() && name(&events[j]) == name(&events[i]) {
                    j += 1;
                }
                tips.absorb_run(i as u64 + 1, j as u64, &events[i].as_ref());
                tips.trim(j as u64);
                i = j;
            }
            let head = events.len() as u64;
            for (q, after) in &queries {
                let cands = tips.candidates(q, *after, head);
                for w in cands.windows(2) {
                    prop_assert!(w[0].1 + 1 < w[1].0, "ranges not ascending and disjoint: {:?}", cands);
                }
                for (i, e) in events.iter().enumerate().skip(*after as usize) {
                    let pos = i as u64 + 1;
                    if q.matches(&e.as_ref()) {
                        prop_assert!(cands.iter().any(|&(lo, hi)| lo <= pos && pos <= hi), "{:?} after {}: match at {} outside {:?}", q, after, pos, cands);
                    }
                }
                prop_assert!(cands.iter().all(|&(lo, hi)| *after < lo && lo <= hi && hi <= head), "{:?} outside ({}, {}]", cands, after, head);
            }
        }
    }

    /// A stream that carried ten types: a condition naming an eleventh is ruled out without a
    /// candidate, one naming a type it carried is narrowed to that type's last occurrence.
    #[test]
    fn tips_rule_out_a_type_a_tag_never_carried() {
        use crate::model::{EventType, QueryItem, Tags};
        let mut tips = Tips::new(0, 100);
        let tag = Tags::new(["stream-1"]).unwrap();
        let other = Tags::new(["stream-2"]).unwrap();
        for k in 0..10u64 {
            let ev = Event::new(&EventType::new(format!("test-{k}")).unwrap(), &tag, b"").unwrap();
            tips.absorb_run(k * 64 + 1, k * 64 + 64, &ev.as_ref());
        }
        let ev = Event::new(&EventType::new("test-3").unwrap(), &other, b"").unwrap();
        tips.absorb_run(641, 700, &ev.as_ref());
        let q = |ty: &str| Query::item(QueryItem::new(vec![EventType::new(ty).unwrap()], tag.clone()));
        assert!(tips.candidates(&q("test-10"), 0, 700).is_empty());
        assert_eq!(tips.candidates(&q("test-3"), 0, 700).as_slice(), &[(1, 256)]);
        // Either of two types: up to the later one's last occurrence.
        let both = Query::item(QueryItem::new(vec![EventType::new("test-1").unwrap(), EventType::new("test-5").unwrap()], tag.clone()));
        assert_eq!(tips.candidates(&both, 0, 700).as_slice(), &[(1, 384)]);
        // Without types the tag's whole span stays.
        assert_eq!(tips.candidates(&Query::item(QueryItem::new(vec![], tag.clone())), 0, 700).as_slice(), &[(1, 640)]);
    }
}
