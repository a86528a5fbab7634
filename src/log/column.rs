//! An append-only column of `u32`, one entry per event of a segment: the record byte offsets
//! of a segment, and the type ids of the active segment's index.
//!
//! The writer is the only appender; readers on other threads look entries up without a lock.
//! Storage is fixed-size chunks that never move, created on first use, so an entry's address is
//! stable once written. Entries are written with relaxed stores and become visible through the
//! store's published watermark (a release store after the entries, an acquire load before).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

const CHUNK: usize = 4096;

/// One `u32` per event of a segment, indexed by local position (`position - base`).
pub struct AtomicColumn {
    chunks: Box<[OnceLock<Box<[AtomicU32]>>]>,
    capacity: usize,
}

impl AtomicColumn {
    /// A table able to hold `capacity` entries (the most records a segment can hold).
    pub fn new(capacity: usize) -> AtomicColumn {
        let n = capacity.div_ceil(CHUNK).max(1);
        AtomicColumn { chunks: (0..n).map(|_| OnceLock::new()).collect(), capacity: n * CHUNK }
    }

    /// Most entries the table can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Stores the entry of local position `i` (writer only).
    ///
    /// # Panics
    /// When `i` is beyond the capacity (a segment cannot hold that many records).
    pub fn set(&self, i: usize, value: u32) {
        let chunk = self.chunks[i / CHUNK].get_or_init(|| (0..CHUNK).map(|_| AtomicU32::new(0)).collect());
        chunk[i % CHUNK].store(value, Ordering::Relaxed);
    }

    /// The entry of local position `i`; only meaningful below the published count.
    pub fn get(&self, i: usize) -> u32 {
        match self.chunks.get(i / CHUNK).and_then(|c| c.get()) {
            Some(c) => c[i % CHUNK].load(Ordering::Relaxed),
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_across_chunks() {
        let t = AtomicColumn::new(10_000);
        for i in 0..10_000 {
            t.set(i, (i * 3) as u32);
        }
        for i in 0..10_000 {
            assert_eq!(t.get(i), (i * 3) as u32);
        }
        assert!(t.capacity() >= 10_000);
    }
}
