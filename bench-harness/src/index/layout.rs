//! The deterministic layout of the index benchmark's log, and the manifest (`prepare.json`)
//! that describes a prepared data directory.
//!
//! Event number `k` (0-based, in the order `prepare` generates them; the *logical index*)
//! is a pure function of `k` and the [`Layout`]:
//!
//! - **payload**: `event_bytes` bytes, the first 8 of them `k` little-endian, the rest zero
//!   (so a read result can be traced back to the event it must be);
//! - **bulk tag**: `bulk-{k % tags}`: every one of the `tags` bulk tags is on
//!   `events / tags` events (±1), evenly spaced `tags` apart;
//! - **rare tags**: `rare-{j}` for `j < rare_tags` is on exactly `rare_tag_events` events,
//!   one in each of `rare_tag_events` equal stretches of the log (so a scan for it must
//!   read the whole log): occurrence `i` is event
//!   `i*S + j*G + mix(seed, j, i) % G` with `S = events / rare_tag_events` and
//!   `G = S / rare_tags`. Those events carry their bulk tag too;
//! - **type**: `type-rare` on exactly `rare_type_events` events (occurrence `i` is event
//!   `i*R + mix(seed, i) % R`, `R = events / rare_type_events`), otherwise one of the
//!   `common_types` types `type-{mix(seed, k) % common_types}`.
//!
//! `prepare` appends over several connections, so an event's *position* is not `k + 1`:
//! every append of events `k0 .. k0+n` is acknowledged with its first position, and the
//! manifest records these batches ([`Manifest::batches`]); [`PositionMap`] maps both ways.
//! The manifest also lists every rare tag's and the rare type's positions, so a run can
//! check that a read returns exactly them.

use serde::{Deserialize, Serialize};
use std::path::Path;
use tephra::{Event, EventType, Tags};

/// Version of the manifest format; a different one is not reused.
pub const MANIFEST_FORMAT: u32 = 1;
/// Name of the manifest file in a prepared directory.
pub const MANIFEST_FILE: &str = "prepare.json";
/// Type of the events on the rare type.
pub const RARE_TYPE: &str = "type-rare";

/// The parameters of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Events in the log.
    pub events: u64,
    /// Bulk tags (`bulk-0` ..), one per event.
    pub tags: u64,
    /// Rare tags (`rare-0` ..).
    pub rare_tags: u64,
    /// Events each rare tag is on.
    pub rare_tag_events: u64,
    /// Common types (`type-0` ..).
    pub common_types: u64,
    /// Events on the rare type ([`RARE_TYPE`]).
    pub rare_type_events: u64,
    /// Payload bytes per event.
    pub event_bytes: u64,
    /// Seed of the placement jitter and of the common types.
    pub seed: u64,
}

/// SplitMix64's finalizer: a cheap, well-mixed hash of `x`.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Layout {
    /// Checks that the parameters describe a log the layout can be laid out in.
    ///
    /// # Errors
    /// A message naming the parameter that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if self.events == 0 {
            return Err("--events must be at least 1".into());
        }
        if self.tags == 0 || self.tags > self.events {
            return Err(format!("--tags must be in 1..={} (the events)", self.events));
        }
        if self.rare_tag_events == 0 || self.rare_tags == 0 {
            return Err("--rare-tags and --rare-tag-events must be at least 1".into());
        }
        if self.tags <= self.rare_tag_events {
            return Err(format!("--tags must exceed --rare-tag-events ({})", self.rare_tag_events));
        }
        if self.rare_tags.saturating_mul(self.rare_tag_events) > self.events {
            return Err(format!("{} rare tags × {} events each do not fit in {} events", self.rare_tags, self.rare_tag_events, self.events));
        }
        if self.common_types == 0 || self.common_types > 1000 {
            return Err("--common-types must be in 1..=1000".into());
        }
        if self.rare_type_events == 0 || self.rare_type_events > self.events {
            return Err(format!("--rare-type-events must be in 1..={}", self.events));
        }
        if self.event_bytes < 8 {
            return Err("--event-bytes must be at least 8 (the payload carries the event number)".into());
        }
        Ok(())
    }

    fn rare_stretch(&self) -> (u64, u64) {
        let s = self.events / self.rare_tag_events;
        (s, s / self.rare_tags)
    }

    /// The events (logical indexes, ascending) that carry rare tag `j`.
    pub fn rare_tag_events_of(&self, j: u64) -> Vec<u64> {
        let (s, g) = self.rare_stretch();
        (0..self.rare_tag_events).map(|i| i * s + j * g + mix(self.seed ^ mix(j << 20 | i)) % g).collect()
    }

    /// The rare tag event `k` carries, if any.
    pub fn rare_tag_of(&self, k: u64) -> Option<u64> {
        let (s, g) = self.rare_stretch();
        let i = k / s;
        if i >= self.rare_tag_events {
            return None;
        }
        let j = (k - i * s) / g;
        if j >= self.rare_tags {
            return None;
        }
        (i * s + j * g + mix(self.seed ^ mix(j << 20 | i)) % g == k).then_some(j)
    }

    /// The events (logical indexes, ascending) of the rare type.
    pub fn rare_type_events(&self) -> Vec<u64> {
        let r = self.events / self.rare_type_events;
        (0..self.rare_type_events).map(|i| i * r + mix(self.seed.rotate_left(17) ^ mix(i)) % r).collect()
    }

    /// True when event `k` has the rare type.
    pub fn is_rare_type(&self, k: u64) -> bool {
        let r = self.events / self.rare_type_events;
        let i = k / r;
        i < self.rare_type_events && i * r + mix(self.seed.rotate_left(17) ^ mix(i)) % r == k
    }

    /// The common type number of event `k` (meaningless when it has the rare type).
    pub fn common_type_of(&self, k: u64) -> u64 {
        mix(self.seed ^ k.wrapping_mul(0xD6E8_FEB8_6659_FD93)) % self.common_types
    }

    /// The type of event `k`.
    pub fn type_of(&self, k: u64) -> String {
        if self.is_rare_type(k) {
            RARE_TYPE.to_owned()
        } else {
            common_type_name(self.common_type_of(k))
        }
    }

    /// The bulk tag number of event `k`.
    pub fn bulk_of(&self, k: u64) -> u64 {
        k % self.tags
    }

    /// The tags of event `k`, sorted.
    pub fn tags_of(&self, k: u64) -> Vec<String> {
        let mut v = vec![bulk_tag(self.bulk_of(k))];
        if let Some(j) = self.rare_tag_of(k) {
            v.push(rare_tag(j));
        }
        v.sort();
        v
    }

    /// The payload of event `k`.
    pub fn payload(&self, k: u64) -> Vec<u8> {
        let mut p = vec![0u8; self.event_bytes as usize];
        p[..8].copy_from_slice(&k.to_le_bytes());
        p
    }

    /// Event `k`.
    pub fn event(&self, k: u64) -> Event {
        let ty = EventType::new(self.type_of(k)).expect("valid type");
        let tags = Tags::new(self.tags_of(k)).expect("valid tags");
        Event::new(&ty, &tags, &self.payload(k)).expect("event encodes")
    }

    /// A bulk tag that is on none of rare tag `j`'s events (for a condition that names
    /// `j` and must pass).
    pub fn bulk_without(&self, j: u64) -> u64 {
        let used: Vec<u64> = self.rare_tag_events_of(j).iter().map(|&k| self.bulk_of(k)).collect();
        let mut b = (used[0] + self.tags / 2) % self.tags;
        while used.contains(&b) {
            b = (b + 1) % self.tags;
        }
        b
    }

    /// A short description of the layout, for the manifest and the report.
    pub fn describe(&self) -> String {
        format!(
            "event k (0-based, generation order) has payload = {} bytes (k as u64 LE, then zeros); \
             tags = bulk-(k % {}) plus, on exactly {} events each spread over the whole log, one of \
             rare-0..rare-{}; type = {RARE_TYPE} on exactly {} events, else one of type-0..type-{} \
             (hash of k and seed {}); positions come from the acknowledged batches",
            self.event_bytes,
            self.tags,
            self.rare_tag_events,
            self.rare_tags - 1,
            self.rare_type_events,
            self.common_types - 1,
            self.seed
        )
    }
}

/// Name of bulk tag `b`.
pub fn bulk_tag(b: u64) -> String {
    format!("bulk-{b}")
}

/// Name of rare tag `j`.
pub fn rare_tag(j: u64) -> String {
    format!("rare-{j}")
}

/// Name of common type `c`.
pub fn common_type_name(c: u64) -> String {
    format!("type-{c}")
}

/// One acknowledged append of `prepare`: events `k0 .. k0 + n` at positions
/// `first .. first + n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Logical index of its first event.
    pub k0: u64,
    /// Position of its first event.
    pub first: u64,
    /// Events in it.
    pub n: u64,
}

/// A segment file of the prepared directory as `prepare` left it (to detect a directory
/// that changed since).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentFile {
    /// File name (`{base:020}.log`).
    pub name: String,
    /// Length in bytes.
    pub bytes: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
}

/// `prepare.json`: what a prepared directory holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The layout parameters.
    pub layout: Layout,
    /// Segment size the log was written with (`TEPHRA__SEGMENT__SIZE`), bytes.
    pub segment_bytes: u64,
    /// [`Layout::describe`].
    pub description: String,
    /// Positions of each rare tag's events (`rare_tag_positions[j]` for `rare-{j}`),
    /// ascending.
    pub rare_tag_positions: Vec<Vec<u64>>,
    /// Positions of the rare type's events, ascending.
    pub rare_type_positions: Vec<u64>,
    /// Events per common type (`type_counts[c]` for `type-{c}`).
    pub type_counts: Vec<u64>,
    /// Every acknowledged append, in position order.
    pub batches: Vec<Batch>,
    /// The segment files, by name.
    pub segments: Vec<SegmentFile>,
    /// The server that wrote the log (its `HelloAck` version).
    pub server_version: String,
    /// Connections and events per append used to write it.
    pub connections: u64,
    /// Events per append request.
    pub batch_events: u64,
    /// Seconds the appends took (server start to last acknowledgement).
    pub append_seconds: f64,
    /// Events per second of the appends.
    pub events_per_sec: f64,
    /// Seconds the whole prepare took (server start to manifest).
    pub total_seconds: f64,
    /// When it was written (UTC, `YYYY-MM-DDTHH:MM:SSZ`).
    pub created: String,
}

impl Manifest {
    /// Reads `DIR/prepare.json`.
    ///
    /// # Errors
    /// Missing, unreadable or not a manifest.
    pub fn load(dir: &Path) -> Result<Manifest, String> {
        let p = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: not a manifest: {e}", p.display()))
    }

    /// Writes `DIR/prepare.json` (through a temporary file and a rename).
    ///
    /// # Errors
    /// Writing fails.
    pub fn store(&self, dir: &Path) -> Result<(), String> {
        let p = dir.join(MANIFEST_FILE);
        let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
        let text = serde_json::to_string(self).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, text).map_err(|e| format!("write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &p).map_err(|e| format!("rename to {}: {e}", p.display()))
    }

    /// Checks that the segment files in `dir` are exactly those `prepare` left (same names,
    /// lengths and modification times).
    ///
    /// # Errors
    /// A message naming the first difference.
    pub fn check_segments(&self, dir: &Path) -> Result<(), String> {
        let now = segment_files(dir)?;
        if now == self.segments {
            return Ok(());
        }
        let names = |v: &[SegmentFile]| v.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        if names(&now) != names(&self.segments) {
            return Err(format!(
                "the segment files in {} are not those prepare wrote ({} now, {} then); prepare it again",
                dir.display(),
                now.len(),
                self.segments.len()
            ));
        }
        for (a, b) in now.iter().zip(&self.segments) {
            if a != b {
                return Err(format!(
                    "{} in {} changed since prepare (now {} bytes, mtime {}; then {} bytes, mtime {}); prepare it again",
                    a.name,
                    dir.display(),
                    a.bytes,
                    a.mtime_ns,
                    b.bytes,
                    b.mtime_ns
                ));
            }
        }
        Ok(())
    }
}

/// True for a segment file name: exactly 20 ASCII digits then `.log`.
pub fn is_segment_name(name: &str) -> bool {
    name.strip_suffix(".log").is_some_and(|d| d.len() == 20 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The segment files in `dir`, sorted by name (= by base position).
///
/// # Errors
/// `dir` cannot be listed or a file cannot be inspected.
pub fn segment_files(dir: &Path) -> Result<Vec<SegmentFile>, String> {
    use std::os::unix::fs::MetadataExt;
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))? {
        let e = e.map_err(|e| format!("list {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_segment_name(&name) {
            continue;
        }
        let m = e.metadata().map_err(|e| format!("stat {name}: {e}"))?;
        v.push(SegmentFile { name, bytes: m.len(), mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128 });
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}

/// Maps logical indexes to positions and back, from the acknowledged batches.
#[derive(Debug, Clone)]
pub struct PositionMap {
    by_pos: Vec<Batch>,
    by_k: Vec<Batch>,
}

impl PositionMap {
    /// Builds the map.
    ///
    /// # Errors
    /// The batches do not cover `0..events` and `1..=events` exactly once.
    pub fn new(batches: &[Batch], events: u64) -> Result<PositionMap, String> {
        let mut by_pos = batches.to_vec();
        by_pos.sort_by_key(|b| b.first);
        let mut by_k = batches.to_vec();
        by_k.sort_by_key(|b| b.k0);
        let (mut p, mut k) = (1, 0);
        for (a, b) in by_pos.iter().zip(&by_k) {
            if a.first != p || b.k0 != k {
                return Err(format!("the manifest's batches leave a gap or overlap at position {p} / event {k}"));
            }
            p += a.n;
            k += b.n;
        }
        if p != events + 1 || k != events {
            return Err(format!("the manifest's batches cover {} events, not {events}", p - 1));
        }
        Ok(PositionMap { by_pos, by_k })
    }

    /// The position of event `k`.
    pub fn position(&self, k: u64) -> Option<u64> {
        let i = self.by_k.partition_point(|b| b.k0 <= k).checked_sub(1)?;
        let b = self.by_k[i];
        (k < b.k0 + b.n).then(|| b.first + (k - b.k0))
    }

    /// The event at position `p` (None above the prepared log).
    pub fn event_at(&self, p: u64) -> Option<u64> {
        let i = self.by_pos.partition_point(|b| b.first <= p).checked_sub(1)?;
        let b = self.by_pos[i];
        (p < b.first + b.n).then(|| b.k0 + (p - b.first))
    }
}

/// Builds the manifest's position lists from the layout and the batches.
pub fn positions_of(layout: &Layout, map: &PositionMap) -> (Vec<Vec<u64>>, Vec<u64>) {
    let pos = |k: u64| map.position(k).expect("every event has a position");
    let rare = (0..layout.rare_tags)
        .map(|j| {
            let mut v: Vec<u64> = layout.rare_tag_events_of(j).into_iter().map(pos).collect();
            v.sort_unstable();
            v
        })
        .collect();
    let mut ty: Vec<u64> = layout.rare_type_events().into_iter().map(pos).collect();
    ty.sort_unstable();
    (rare, ty)
}

/// Events per common type.
pub fn type_counts(layout: &Layout) -> Vec<u64> {
    let mut v = vec![0u64; layout.common_types as usize];
    for k in 0..layout.events {
        if !layout.is_rare_type(k) {
            v[layout.common_type_of(k) as usize] += 1;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(events: u64, tags: u64, rare: u64) -> Layout {
        Layout { events, tags, rare_tags: rare, rare_tag_events: 10, common_types: 8, rare_type_events: 10, event_bytes: 256, seed: 42 }
    }

    #[test]
    fn rare_tags_are_exact_and_spread() {
        for l in [layout(20_000, 1_000, 100), layout(1_000, 11, 100), layout(1_234_567, 1_000, 999)] {
            l.validate().unwrap();
            let mut seen = std::collections::HashMap::new();
            for k in 0..l.events {
                if let Some(j) = l.rare_tag_of(k) {
                    *seen.entry(j).or_insert(0u64) += 1;
                }
            }
            assert_eq!(seen.len() as u64, l.rare_tags);
            assert!(seen.values().all(|&n| n == 10));
            for j in 0..l.rare_tags {
                let ks = l.rare_tag_events_of(j);
                assert!(ks.windows(2).all(|w| w[0] < w[1]));
                assert!(ks.iter().all(|&k| l.rare_tag_of(k) == Some(j)));
                // One in each tenth of the log.
                let s = l.events / 10;
                assert!(ks.iter().enumerate().all(|(i, &k)| k / s == i as u64));
                let b = l.bulk_without(j);
                assert!(ks.iter().all(|&k| l.bulk_of(k) != b));
            }
            let rt: Vec<u64> = (0..l.events).filter(|&k| l.is_rare_type(k)).collect();
            assert_eq!(rt, l.rare_type_events());
            assert_eq!(type_counts(&l).iter().sum::<u64>() + 10, l.events);
        }
        assert!(layout(999, 10, 100).validate().is_err());
    }

    #[test]
    fn events_carry_their_number() {
        let l = layout(20_000, 1_000, 100);
        let k = l.rare_tag_events_of(7)[3];
        let e = l.event(k);
        assert_eq!(u64::from_le_bytes(e.data()[..8].try_into().unwrap()), k);
        assert_eq!(e.data().len(), 256);
        let tags: Vec<&str> = e.tags().collect();
        assert_eq!(tags, vec![bulk_tag(k % 1000).as_str(), "rare-7"]);
    }

    #[test]
    fn position_map_round_trips() {
        let batches = vec![Batch { k0: 4, first: 1, n: 3 }, Batch { k0: 0, first: 4, n: 4 }, Batch { k0: 7, first: 8, n: 2 }];
        let m = PositionMap::new(&batches, 9).unwrap();
        for k in 0..9 {
            assert_eq!(m.event_at(m.position(k).unwrap()), Some(k));
        }
        assert_eq!(m.position(0), Some(4));
        assert_eq!(m.event_at(1), Some(4));
        assert_eq!(m.event_at(10), None);
        assert!(PositionMap::new(&batches[..2], 9).is_err());
    }

    #[test]
    fn segment_names() {
        assert!(is_segment_name("00000000000000000001.log"));
        assert!(!is_segment_name("0000000000000000001.log"));
        assert!(!is_segment_name("prepare.json"));
    }
}
