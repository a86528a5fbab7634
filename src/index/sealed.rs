//! Sealed index files: one per sealed log segment, written once at rollover, loaded at open.
//!
//! The file is ours (not the reference's `index/*.idx`, docs/format.md §8): it lives in
//! `tagindex/{base:020}.tix` inside the data directory, so neither server ever mistakes the
//! other's file for a corrupt one of its own. Layout, all integers little-endian:
//!
//! ```text
//! [0..64)                 header
//! [64..68)                the log segment's fingerprint ([`crate::log::segment::Fingerprint`])
//! [68..72)                zero
//! [72 .. 72+4*count)      type column: u32 segment-local type id of each event, by local position
//! [.. tagtable_off)       type dictionary: per id, in id order, u16 length + UTF-8 name
//! [tagtable_off ..)       tag table: n_tags entries of 16 bytes, sorted by tag bytes:
//!                         key_off u32 (into the key blob), key_len u32,
//!                         post_off u32 (entry index into postings), post_len u32 (>= 1)
//! [keys_off .. postings_off)  key blob: the tag bytes, concatenated in table order
//! [postings_off .. file_len)  postings: u32 local positions, ascending within each tag
//! ```
//!
//! Header (64 bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `TGIX` |
//! | 4 | 2 | version, 2 (version 1 had no fingerprint and is rebuilt) |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | base position of the log segment |
//! | 16 | 8 | event count of the log segment |
//! | 24 | 4 | number of types |
//! | 28 | 4 | number of distinct tags |
//! | 32 | 8 | `tagtable_off` |
//! | 40 | 8 | `postings_off` |
//! | 48 | 8 | `file_len` |
//! | 56 | 4 | body CRC-32 over `[64..file_len)` |
//! | 60 | 4 | header CRC-32 over `[0..60)` |
//!
//! `keys_off = tagtable_off + 16 * n_tags`; the type dictionary starts at `72 + 4 * count`.
//! The fingerprint ties the file to the segment's content, not just its base and count: an index
//! left over from another log (restored segments, a directory reused) is rebuilt, never trusted.
//! Postings are fixed-width so a reader binary-searches them in place without decoding.
//! Every structural rule is checked at load ([`SealedIndex::load`]); any failure means
//! "rebuild from the log", never "refuse to open" (docs/format.md §8).

use super::view::{Postings, SegmentView};
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// File magic.
pub const MAGIC: [u8; 4] = *b"TGIX";
/// Format version written and accepted.
pub const VERSION: u16 = 2;
/// Header length in bytes.
pub const HEADER_LEN: usize = 64;
/// Start of the type column: the header, the fingerprint and 4 zero bytes.
const TYPECOL_OFF: usize = 72;
const TAG_ENTRY: usize = 16;

/// Why a sealed index file was not usable (each one means: rebuild it from the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexFileError {
    /// Shorter than a header, or `file_len` disagrees with the file's length (torn write).
    #[error("truncated index file: {0}")]
    Truncated(String),
    /// The header's CRC does not match.
    #[error("index header checksum mismatch")]
    HeaderChecksum,
    /// Not a `TGIX` file, or a version this build does not read.
    #[error("not a version-{VERSION} TGIX index file: {0}")]
    Foreign(String),
    /// The body's CRC does not match.
    #[error("index body checksum mismatch")]
    BodyChecksum,
    /// A section or entry breaks the layout rules.
    #[error("malformed index file: {0}")]
    Malformed(String),
    /// The file describes a different log segment (base or count differ).
    #[error("index describes base {found_base} with {found_count} events, the log segment has base {base} with {count}")]
    Mismatch { base: u64, count: u64, found_base: u64, found_count: u64 },
    /// Same base and count, but the segment's content differs (another log's index).
    #[error("index fingerprint {found:08x} does not match the log segment's {expected:08x}")]
    Stale { expected: u32, found: u32 },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encodes the index of a sealed segment.
///
/// `fingerprint` is the log segment's [`crate::log::segment::Fingerprint`]; `type_names[id]`
/// names type id `id`; `type_col[i]` is the type id of local position `i` (so `count =
/// type_col.len()`); `tags` holds each distinct tag once with its ascending local positions, in
/// any order (they are sorted here). No creation time is stored: the bytes depend only on the
/// content, so a rebuilt file is byte-identical to the one written at rollover.
pub fn encode(base: u64, fingerprint: u32, type_names: &[&str], type_col: &[u32], tags: &mut [(&str, &[u32])]) -> Vec<u8> {
    tags.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let count = type_col.len();
    let dict_len: usize = type_names.iter().map(|n| 2 + n.len()).sum();
    let keys_len: usize = tags.iter().map(|(k, _)| k.len()).sum();
    let post_len: usize = tags.iter().map(|(_, p)| p.len()).sum();
    let tagtable_off = TYPECOL_OFF + 4 * count + dict_len;
    let keys_off = tagtable_off + TAG_ENTRY * tags.len();
    let postings_off = keys_off + keys_len;
    let file_len = postings_off + 4 * post_len;
    let mut out = Vec::with_capacity(file_len);
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for &t in type_col {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for n in type_names {
        out.extend_from_slice(&(n.len() as u16).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    let (mut key_off, mut post_off) = (0u32, 0u32);
    for (k, p) in tags.iter() {
        for v in [key_off, k.len() as u32, post_off, p.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        key_off += k.len() as u32;
        post_off += p.len() as u32;
    }
    for (k, _) in tags.iter() {
        out.extend_from_slice(k.as_bytes());
    }
    for (_, p) in tags.iter() {
        for &v in p.iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    debug_assert_eq!(out.len(), file_len);
    let body_crc = crc32fast::hash(&out[HEADER_LEN..]);
    let h = &mut out[..HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[8..16].copy_from_slice(&base.to_le_bytes());
    h[16..24].copy_from_slice(&(count as u64).to_le_bytes());
    h[24..28].copy_from_slice(&(type_names.len() as u32).to_le_bytes());
    h[28..32].copy_from_slice(&(tags.len() as u32).to_le_bytes());
    h[32..40].copy_from_slice(&(tagtable_off as u64).to_le_bytes());
    h[40..48].copy_from_slice(&(postings_off as u64).to_le_bytes());
    h[48..56].copy_from_slice(&(file_len as u64).to_le_bytes());
    h[56..60].copy_from_slice(&body_crc.to_le_bytes());
    let hcrc = crc32fast::hash(&h[..60]);
    h[60..64].copy_from_slice(&hcrc.to_le_bytes());
    out
}

/// Where a sealed index file's sections lie, as its header says ([`check_header`]).
struct Layout {
    n_types: usize,
    n_tags: usize,
    dict_off: usize,
    tagtable_off: usize,
    keys_off: usize,
    postings_off: usize,
}

/// Checks a sealed index file's header, in order: length, header CRC, magic and version,
/// reserved bytes, `file_len`, body CRC, base and count, the fingerprint, and section bounds;
/// returns where the sections lie.
fn check_header(bytes: &[u8], base: u64, count: u64, fingerprint: u32) -> Result<Layout, IndexFileError> {
    let malformed = |s: &str| Err(IndexFileError::Malformed(s.to_string()));
    if bytes.len() < HEADER_LEN {
        return Err(IndexFileError::Truncated(format!("{} bytes, the header alone is {HEADER_LEN}", bytes.len())));
    }
    if crc32fast::hash(&bytes[..60]) != u32_at(bytes, 60) {
        return Err(IndexFileError::HeaderChecksum);
    }
    if bytes[0..4] != MAGIC {
        return Err(IndexFileError::Foreign(format!("magic {:02x?}", &bytes[0..4])));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(IndexFileError::Foreign(format!("version {version}")));
    }
    if bytes[6..8] != [0, 0] {
        return malformed("reserved header bytes are not zero");
    }
    let file_len = u64_at(bytes, 48);
    if file_len != bytes.len() as u64 {
        return Err(IndexFileError::Truncated(format!("header says {file_len} bytes, the file has {}", bytes.len())));
    }
    if crc32fast::hash(&bytes[HEADER_LEN..]) != u32_at(bytes, 56) {
        return Err(IndexFileError::BodyChecksum);
    }
    let (found_base, found_count) = (u64_at(bytes, 8), u64_at(bytes, 16));
    if found_base != base || found_count != count {
        return Err(IndexFileError::Mismatch { base, count, found_base, found_count });
    }
    if bytes.len() < TYPECOL_OFF || bytes[68..72] != [0; 4] {
        return malformed("no fingerprint");
    }
    let found = u32_at(bytes, 64);
    if found != fingerprint {
        return Err(IndexFileError::Stale { expected: fingerprint, found });
    }
    if count > u32::MAX as u64 {
        return malformed("event count above u32::MAX");
    }
    let n_types = u32_at(bytes, 24) as usize;
    let n_tags = u32_at(bytes, 28) as usize;
    let tagtable_off = u64_at(bytes, 32);
    let postings_off = u64_at(bytes, 40);
    let dict_off = TYPECOL_OFF as u64 + 4 * count;
    let keys_off = tagtable_off.checked_add(TAG_ENTRY as u64 * n_tags as u64);
    let Some(keys_off) = keys_off.filter(|&k| dict_off <= tagtable_off && k <= postings_off && postings_off <= file_len) else {
        return malformed("sections out of order or out of bounds");
    };
    if (file_len - postings_off) % 4 != 0 {
        return malformed("postings region is not a whole number of u32");
    }
    Ok(Layout {
        n_types,
        n_tags,
        dict_off: dict_off as usize,
        tagtable_off: tagtable_off as usize,
        keys_off: keys_off as usize,
        postings_off: postings_off as usize,
    })
}

/// The type dictionary (each name's id) and the events of each type id.
type Types = (HashMap<Box<str>, u32>, Vec<u32>);

/// Loads the type dictionary (exactly `n_types` distinct UTF-8 names filling its region) and
/// counts the events of each type from the type column (every id within the dictionary).
fn load_types(bytes: &[u8], layout: &Layout) -> Result<Types, IndexFileError> {
    let malformed = |s: &str| Err(IndexFileError::Malformed(s.to_string()));
    let Layout { n_types, dict_off, tagtable_off, .. } = *layout;
    let mut type_ids = HashMap::default();
    let mut at = dict_off;
    for id in 0..n_types {
        if at + 2 > tagtable_off {
            return malformed("type dictionary shorter than its type count");
        }
        let len = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
        let Some(name) = bytes.get(at + 2..at + 2 + len).filter(|_| at + 2 + len <= tagtable_off) else {
            return malformed("type name runs past the dictionary");
        };
        let Ok(name) = std::str::from_utf8(name) else { return malformed("type name is not UTF-8") };
        if type_ids.insert(name.into(), id as u32).is_some() {
            return malformed("type named twice in the dictionary");
        }
        at += 2 + len;
    }
    if at != tagtable_off {
        return malformed("type dictionary longer than its type count");
    }
    let mut type_counts = vec![0u32; n_types];
    for c in bytes[TYPECOL_OFF..dict_off].chunks_exact(4) {
        match type_counts.get_mut(u32::from_le_bytes(c.try_into().unwrap()) as usize) {
            Some(n) => *n += 1,
            None => return malformed("type id beyond the dictionary"),
        }
    }
    Ok((type_ids, type_counts))
}

/// A loaded, validated sealed index, held whole in memory.
pub struct SealedIndex {
    bytes: Vec<u8>,
    base: u64,
    count: u32,
    type_ids: HashMap<Box<str>, u32>,
    /// Events of each type id.
    type_counts: Vec<u32>,
    n_tags: usize,
    tagtable_off: usize,
    keys_off: usize,
    postings_off: usize,
}

impl std::fmt::Debug for SealedIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedIndex").field("base", &self.base).field("count", &self.count).field("tags", &self.n_tags).finish()
    }
}

impl SealedIndex {
    /// Validates `bytes` as the index of the log segment with `base`, `count` events and
    /// `fingerprint`.
    ///
    /// Checks, in order: length, header CRC, magic and version, reserved bytes, `file_len`,
    /// body CRC, base and count, the fingerprint, section bounds, the type dictionary, every
    /// type id, the tag table (keys strictly ascending, ranges in bounds, non-empty lists) and
    /// every posting (strictly ascending within its tag, below `count`).
    ///
    /// # Errors
    /// The first [`IndexFileError`] found.
    pub fn load(bytes: Vec<u8>, base: u64, count: u64, fingerprint: u32) -> Result<SealedIndex, IndexFileError> {
        let layout = check_header(&bytes, base, count, fingerprint)?;
        let (type_ids, type_counts) = load_types(&bytes, &layout)?;
        let Layout { n_tags, tagtable_off, keys_off, postings_off, .. } = layout;
        let ix = SealedIndex { bytes, base, count: count as u32, type_ids, type_counts, n_tags, tagtable_off, keys_off, postings_off };
        ix.check_tags()?;
        Ok(ix)
    }

    /// Checks the tag table (keys strictly ascending UTF-8, ranges in bounds, non-empty
    /// lists) and every posting (strictly ascending within its tag, below the count).
    fn check_tags(&self) -> Result<(), IndexFileError> {
        let malformed = |s: &str| Err(IndexFileError::Malformed(s.to_string()));
        let (keys_len, n_postings) = (self.postings_off - self.keys_off, (self.bytes.len() - self.postings_off) / 4);
        let mut prev: Option<&[u8]> = None;
        for i in 0..self.n_tags {
            let (ko, kl, po, pl) = self.entry(i);
            if ko.checked_add(kl).is_none_or(|e| e > keys_len) || pl == 0 || po.checked_add(pl).is_none_or(|e| e > n_postings) {
                return malformed("tag table entry out of bounds");
            }
            let key = &self.bytes[self.keys_off + ko..self.keys_off + ko + kl];
            if std::str::from_utf8(key).is_err() || prev.is_some_and(|p| p >= key) {
                return malformed("tag keys not UTF-8 or not strictly ascending");
            }
            prev = Some(key);
            let list = self.list(po, pl);
            let mut last: Option<u32> = None;
            for k in 0..pl {
                let p = list.get(k);
                if p >= self.count || last.is_some_and(|l| l >= p) {
                    return malformed("posting out of range or not ascending");
                }
                last = Some(p);
            }
        }
        Ok(())
    }

    /// The file's bytes (what [`encode`] produced).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Base position of the segment it indexes.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Events indexed.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Number of distinct tags.
    pub fn tag_count(&self) -> usize {
        self.n_tags
    }

    fn entry(&self, i: usize) -> (usize, usize, usize, usize) {
        let at = self.tagtable_off + TAG_ENTRY * i;
        let b = &self.bytes;
        (u32_at(b, at) as usize, u32_at(b, at + 4) as usize, u32_at(b, at + 8) as usize, u32_at(b, at + 12) as usize)
    }

    fn key(&self, i: usize) -> &[u8] {
        let (ko, kl, _, _) = self.entry(i);
        &self.bytes[self.keys_off + ko..self.keys_off + ko + kl]
    }

    fn list(&self, post_off: usize, len: usize) -> SealedPostings<'_> {
        let start = self.postings_off + 4 * post_off;
        SealedPostings { bytes: &self.bytes[start..start + 4 * len] }
    }

    fn find(&self, tag: &str) -> Option<usize> {
        let (mut lo, mut hi) = (0usize, self.n_tags);
        let t = tag.as_bytes();
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(t) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }
}

/// A posting list inside a sealed file: fixed-width u32 local positions.
#[derive(Clone, Copy)]
pub struct SealedPostings<'a> {
    bytes: &'a [u8],
}

impl Postings for SealedPostings<'_> {
    fn len(&self) -> usize {
        self.bytes.len() / 4
    }

    fn get(&self, i: usize) -> u32 {
        u32_at(self.bytes, 4 * i)
    }
}

impl SegmentView for SealedIndex {
    type P<'a> = SealedPostings<'a>;

    fn count(&self) -> u32 {
        self.count
    }

    fn type_id(&self, name: &str) -> Option<u32> {
        self.type_ids.get(name).copied()
    }

    fn type_at(&self, local: u32) -> u32 {
        u32_at(&self.bytes, TYPECOL_OFF + 4 * local as usize)
    }

    fn type_count(&self, name: &str) -> u64 {
        self.type_id(name).map_or(0, |id| self.type_counts[id as usize] as u64)
    }

    fn postings(&self, tag: &str) -> Option<SealedPostings<'_>> {
        let (_, _, po, pl) = self.entry(self.find(tag)?);
        Some(self.list(po, pl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a small index are locked: if this fails, the file format changed.
    #[test]
    fn golden_bytes() {
        let mut tags = [("course:c1", &[1u32, 2][..]), ("a", &[0u32][..])];
        let b = encode(7, 0xDEAD_BEEF, &["A", "Enrolled"], &[0, 1, 1], &mut tags);
        let want = concat!(
            "54474958",
            "0200",
            "0000",
            "0700000000000000",
            "0300000000000000",
            "02000000",
            "02000000",
            "6100000000000000",
            "8b00000000000000",
            "9700000000000000",
            "af893a6d",
            "78b57861",
            "efbeadde",
            "00000000",
            "00000000",
            "01000000",
            "01000000",
            "0100",
            "41",
            "0800456e726f6c6c6564",
            "00000000",
            "01000000",
            "00000000",
            "01000000",
            "01000000",
            "09000000",
            "01000000",
            "02000000",
            "61",
            "636f757273653a6331",
            "00000000",
            "01000000",
            "02000000",
        );
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, want);
        let ix = SealedIndex::load(b, 7, 3, 0xDEAD_BEEF).unwrap();
        assert_eq!(ix.type_id("Enrolled"), Some(1));
        assert_eq!(ix.type_at(2), 1);
        let p = ix.postings("course:c1").unwrap();
        assert_eq!((p.len(), p.get(0), p.get(1)), (2, 1, 2));
        assert!(ix.postings("b").is_none());
    }

    fn sample() -> Vec<u8> {
        let mut tags = [("x", &[0u32, 2][..]), ("y", &[1u32][..]), ("zz", &[0u32, 1, 2][..])];
        encode(1, 42, &["T", "U"], &[0, 1, 0], &mut tags)
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        let good = sample();
        SealedIndex::load(good.clone(), 1, 3, 42).unwrap();
        for i in 0..good.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = good.clone();
                b[i] ^= bit;
                assert!(SealedIndex::load(b, 1, 3, 42).is_err(), "flip of bit {bit:#x} at byte {i} accepted");
            }
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let good = sample();
        for n in 0..good.len() {
            assert!(SealedIndex::load(good[..n].to_vec(), 1, 3, 42).is_err(), "truncation to {n} bytes accepted");
        }
    }

    #[test]
    fn a_file_for_another_segment_is_refused() {
        assert!(matches!(SealedIndex::load(sample(), 2, 3, 42), Err(IndexFileError::Mismatch { .. })));
        assert!(matches!(SealedIndex::load(sample(), 1, 4, 42), Err(IndexFileError::Mismatch { .. })));
        // Same base and count, another segment's content.
        assert_eq!(SealedIndex::load(sample(), 1, 3, 43).unwrap_err(), IndexFileError::Stale { expected: 43, found: 42 });
        assert!(matches!(SealedIndex::load(vec![0; 64], 1, 3, 42), Err(IndexFileError::HeaderChecksum)));
    }

    /// A file whose checksums match but whose content breaks the rules (a bug, not a disk
    /// error) is refused too, so queries never index out of bounds.
    #[test]
    fn well_checksummed_nonsense_is_refused() {
        let reseal = |mut b: Vec<u8>| {
            let body = crc32fast::hash(&b[HEADER_LEN..]);
            b[56..60].copy_from_slice(&body.to_le_bytes());
            let h = crc32fast::hash(&b[..60]);
            b[60..64].copy_from_slice(&h.to_le_bytes());
            b
        };
        // Unsorted tags.
        let mut b = sample();
        let keys = u64_at(&b, 32) as usize + 3 * TAG_ENTRY;
        b.swap(keys, keys + 1);
        assert!(matches!(SealedIndex::load(reseal(b), 1, 3, 42), Err(IndexFileError::Malformed(_))));
        // A posting beyond the count.
        let mut b = sample();
        let last = b.len() - 4;
        b[last..].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(SealedIndex::load(reseal(b), 1, 3, 42), Err(IndexFileError::Malformed(_))));
        // A type id beyond the dictionary.
        let mut b = sample();
        b[TYPECOL_OFF..TYPECOL_OFF + 4].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(SealedIndex::load(reseal(b), 1, 3, 42), Err(IndexFileError::Malformed(_))));
    }
}
