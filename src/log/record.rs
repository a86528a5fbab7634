//! Record framing and the commit rule, pure over byte slices.
//!
//! A record is `len_field u32 LE | crc u32 LE | payload` (docs/format.md §4): bits 0..=29 of
//! `len_field` are the payload length, bit 30 marks a control record, bit 31 must be zero. The
//! CRC-32/IEEE covers the 4 stored length bytes and the payload. A data record's payload is one
//! encoded event (one position); a batch ends with the 17-byte control record
//! `BATCH_COMMIT = [0x01][highest_position u64 LE]`.
//!
//! The commit rule (docs/format.md §6.2): a batch is committed if and only if
//! every record since the previous commit point validates and the run ends in a valid commit
//! marker. [`walk`] applies it; [`classify_tail`] then decides between the three recovery
//! outcomes, refusing corruption that is followed by committed batches (which the reference
//! silently rolls back, docs/compatibility.md §2.1).

/// Bytes before a record's payload: length field and CRC.
pub const RECORD_HEAD: usize = 8;
/// Payload length bits of the length field.
pub const LENGTH_MASK: u32 = 0x3FFF_FFFF;
/// Control-record flag (bit 30).
pub const CONTROL_FLAG: u32 = 0x4000_0000;
/// Control kind of the batch commit marker.
pub const BATCH_COMMIT: u8 = 0x01;
/// Payload length of a commit marker: kind byte + highest position.
pub const MARKER_PAYLOAD: usize = 9;
/// Full size of a commit marker record (head + payload), the per-batch overhead.
pub const MARKER_LEN: usize = RECORD_HEAD + MARKER_PAYLOAD;

/// Appends one framed data record holding `payload` (non-empty, at most [`LENGTH_MASK`] bytes).
pub fn frame_data(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&data_head(payload));
    out.extend_from_slice(payload);
}

/// The head (`len(4) crc(4)`) of the data record holding `payload` (non-empty, at most
/// [`LENGTH_MASK`] bytes), for a caller that lays the payload out itself.
pub fn data_head(payload: &[u8]) -> [u8; RECORD_HEAD] {
    head(payload, 0)
}

/// Appends the 17-byte commit marker closing a batch whose last position is `highest`.
pub fn frame_marker(highest: u64, out: &mut Vec<u8>) {
    let mut payload = [0u8; MARKER_PAYLOAD];
    payload[0] = BATCH_COMMIT;
    payload[1..].copy_from_slice(&highest.to_le_bytes());
    frame_control(&payload, out);
}

/// Appends one framed control record (bit 30 set) holding `payload`, whose first byte is its
/// kind. A walk skips control records of kinds other than [`BATCH_COMMIT`]: they commit nothing.
pub fn frame_control(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&head(payload, CONTROL_FLAG));
    out.extend_from_slice(payload);
}

/// The head of the record holding `payload` (non-empty, at most [`LENGTH_MASK`] bytes): its
/// length with `flags` set, then the CRC over those 4 bytes and the payload.
fn head(payload: &[u8], flags: u32) -> [u8; RECORD_HEAD] {
    debug_assert!(!payload.is_empty() && payload.len() <= LENGTH_MASK as usize);
    let len = (payload.len() as u32 | flags).to_le_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(payload);
    let mut head = [0u8; RECORD_HEAD];
    head[..4].copy_from_slice(&len);
    head[4..].copy_from_slice(&h.finalize().to_le_bytes());
    head
}

/// The payload length declared by the record head at the start of `head` (bits 0..=29 of its
/// length field; the flags are not checked). `head` holds at least the 4-byte length field.
pub fn declared_len(head: &[u8]) -> usize {
    (length_field(head) & LENGTH_MASK) as usize
}

/// The 4-byte little-endian length field at the start of `head`.
fn length_field(head: &[u8]) -> u32 {
    u32::from_le_bytes(head[0..4].try_into().expect("a record head holds a 4-byte length field"))
}

/// The 4 bytes of a record's CRC field, given the record's framed bytes (at least its head):
/// what a segment's [`crate::log::segment::Fingerprint`] is made of.
pub fn crc_field(framed: &[u8]) -> &[u8] {
    &framed[4..RECORD_HEAD]
}

/// The payload of the record at `off` in `buf`, a record already found whole and valid (by a
/// [`walk`], or framed by [`frame_data`]); nothing is checked again.
pub fn payload_at(buf: &[u8], off: usize) -> &[u8] {
    let start = off + RECORD_HEAD;
    &buf[start..start + declared_len(&buf[off..])]
}

/// `(offset, payload)` of each record in `buf`, a run of whole records framed by
/// [`frame_data`] (an append's records before they reach the log); nothing is checked.
pub fn framed_records(buf: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off >= buf.len() {
            return None;
        }
        let at = off;
        let payload = payload_at(buf, at);
        off = at + RECORD_HEAD + payload.len();
        Some((at, payload))
    })
}

/// The payload of `rec`, exactly one data record's head and payload read back by its offset,
/// when its flags are a data record's and its CRC matches; `None` when the record is damaged.
/// A read by position checks each record so, since it does not walk from a commit point.
pub fn verify_data(rec: &[u8]) -> Option<&[u8]> {
    if rec.len() < RECORD_HEAD {
        return None;
    }
    let len_field = length_field(rec);
    let payload = &rec[RECORD_HEAD..];
    if len_field & !LENGTH_MASK != 0 || (len_field & LENGTH_MASK) as usize != payload.len() {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&rec[0..4]);
    h.update(payload);
    (h.finalize() == u32::from_le_bytes(rec[4..8].try_into().unwrap())).then_some(payload)
}

/// One record as read from a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A data record (one event).
    Data(&'a [u8]),
    /// A valid batch commit marker and its highest position.
    Commit(u64),
    /// Another valid control record; skipped, commits nothing.
    OtherControl,
}

/// Why a walk stopped reading records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An all-zero record head, or the buffer ended exactly at a record boundary.
    End,
    /// Fewer than 8 bytes left for a head that is not all zero.
    ShortHead,
    /// Bit 31 of the length field is set.
    BadFlags,
    /// The record's declared end lies past the buffer.
    PastEnd,
    /// The payload CRC does not match.
    BadCrc,
    /// A zero-length data record (never written by a valid writer).
    EmptyRecord,
}

/// Parses the record at `off`; `Err` says why the committed prefix cannot extend past it.
pub fn read_record(buf: &[u8], off: usize) -> Result<(Record<'_>, usize), Stop> {
    if off >= buf.len() {
        return Err(Stop::End);
    }
    if buf.len() - off < RECORD_HEAD {
        return if buf[off..].iter().all(|&b| b == 0) { Err(Stop::End) } else { Err(Stop::ShortHead) };
    }
    let head = &buf[off..off + RECORD_HEAD];
    if head.iter().all(|&b| b == 0) {
        return Err(Stop::End);
    }
    let len_field = length_field(head);
    if len_field & !(LENGTH_MASK | CONTROL_FLAG) != 0 {
        return Err(Stop::BadFlags);
    }
    let len = (len_field & LENGTH_MASK) as usize;
    let end = off + RECORD_HEAD + len;
    if end > buf.len() {
        return Err(Stop::PastEnd);
    }
    let payload = &buf[off + RECORD_HEAD..end];
    let crc = u32::from_le_bytes(head[4..8].try_into().unwrap());
    let mut h = crc32fast::Hasher::new();
    h.update(&head[0..4]);
    h.update(payload);
    if h.finalize() != crc {
        return Err(Stop::BadCrc);
    }
    if len_field & CONTROL_FLAG != 0 {
        if len == MARKER_PAYLOAD && payload[0] == BATCH_COMMIT {
            let highest = u64::from_le_bytes(payload[1..9].try_into().unwrap());
            return Ok((Record::Commit(highest), end));
        }
        return Ok((Record::OtherControl, end));
    }
    if len == 0 {
        return Err(Stop::EmptyRecord);
    }
    Ok((Record::Data(payload), end))
}

/// The result of walking a segment's records with the commit rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Byte offset just past the last valid commit marker (or the start offset).
    pub committed_end: usize,
    /// Byte offsets of the committed data records, in position order.
    pub offsets: Vec<u32>,
    /// `highest_position` of the last valid marker, if any was seen.
    pub last_marker: Option<u64>,
    /// Where the walk stopped, and why.
    pub stop_offset: usize,
    /// Why the walk stopped.
    pub stop: Stop,
    /// Valid data records after the last commit point, before the stop (a torn batch).
    pub pending: usize,
}

/// Walks records from `start`, keeping only committed batches (docs/format.md §6.2).
pub fn walk(buf: &[u8], start: usize) -> Walk {
    let mut off = start;
    let mut offsets = Vec::new();
    let mut pending: Vec<u32> = Vec::new();
    let mut committed_end = start;
    let mut last_marker = None;
    loop {
        match next_batch(buf, &mut off, &mut pending) {
            Ok(highest) => {
                offsets.append(&mut pending);
                committed_end = off;
                last_marker = Some(highest);
            }
            Err(stop) => {
                return Walk { committed_end, offsets, last_marker, stop_offset: off, stop, pending: pending.len() };
            }
        }
    }
}

/// Reads records from `*off` through the next commit marker, pushing each data record's
/// offset to `records`: `Ok(highest)` of that marker with `*off` just past it, or the stop
/// with `*off` at the record that could not be read.
fn next_batch(buf: &[u8], off: &mut usize, records: &mut Vec<u32>) -> Result<u64, Stop> {
    loop {
        let (record, end) = read_record(buf, *off)?;
        match record {
            Record::Data(_) => records.push(*off as u32),
            Record::Commit(highest) => {
                *off = end;
                return Ok(highest);
            }
            Record::OtherControl => {}
        }
        *off = end;
    }
}

/// What recovery makes of the bytes after the committed prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TailVerdict {
    /// Nothing but zeros after the committed prefix.
    Clean,
    /// An uncommitted tail: discard bytes `[discard_start, discard_end)`, which held at most
    /// `lost_records` events that were never acknowledged.
    Torn { discard_start: usize, discard_end: usize, lost_records: u64 },
    /// Bytes that cannot be a torn tail: a bad record at `offset` is followed by at least one
    /// fully committed batch, so rolling back would drop acknowledged events.
    Corrupt { offset: usize, stop: Stop },
}

/// End of the non-zero region of `buf` (0 when all zero).
pub fn dirty_end(buf: &[u8]) -> usize {
    let mut end = buf.len();
    while end >= 8 {
        let w = u64::from_ne_bytes(buf[end - 8..end].try_into().unwrap());
        if w != 0 {
            break;
        }
        end -= 8;
    }
    while end > 0 && buf[end - 1] == 0 {
        end -= 1;
    }
    end
}

/// Finds the first valid commit marker starting at or after `from`, returning
/// `(offset, highest, end)`.
pub fn find_marker(buf: &[u8], from: usize) -> Option<(usize, u64, usize)> {
    let pat = (MARKER_PAYLOAD as u32 | CONTROL_FLAG).to_le_bytes();
    let mut i = from;
    while i + MARKER_LEN <= buf.len() {
        let rel = memchr::memmem::find(&buf[i..], &pat)?;
        let at = i + rel;
        if let Ok((Record::Commit(highest), end)) = read_record(buf, at) {
            return Some((at, highest, end));
        }
        i = at + 1;
    }
    None
}

/// True when the records from `start` up to the next commit marker are a whole batch: one
/// data record or more, then a valid marker whose highest position is `highest` plus their
/// count. Reads no further than that marker.
fn opens_a_committed_batch(buf: &[u8], start: usize, highest: u64, records: &mut Vec<u32>) -> bool {
    records.clear();
    let mut off = start;
    matches!(next_batch(buf, &mut off, records), Ok(h) if !records.is_empty() && h == highest + records.len() as u64)
}

/// Classifies what follows a walk's committed prefix (the three recovery outcomes); `base` is
/// the segment's first position.
///
/// Only the last batch can be torn: the writer never starts a batch before the previous one's
/// sync returned. So if any fully committed batch lies beyond the batch in which the walk
/// stopped, the damage hit acknowledged data and the verdict is [`TailVerdict::Corrupt`]. That
/// includes damage to the commit marker of the batch the walk stopped in: the first valid
/// marker after the stop is then the *next* batch's, so the stop is also checked for being a
/// marker-sized hole that closes the pending records, followed by a valid batch that ends
/// exactly at that marker with the position count to match.
pub fn classify_tail(buf: &[u8], w: &Walk, base: u64) -> TailVerdict {
    let dirty = dirty_end(buf);
    if dirty <= w.committed_end {
        return TailVerdict::Clean;
    }
    let prev = w.last_marker.unwrap_or(base.saturating_sub(1));
    let mut lost = w.pending as u64;
    let corrupt = TailVerdict::Corrupt { offset: w.stop_offset, stop: w.stop };
    // A marker after the stop that closes the damaged batch (its position is past the pending
    // records) and is followed by a committed batch: a whole one, a record or more, whose
    // marker continues the positions. Marker-shaped bytes in a torn batch's payload are not
    // that (review: two in a row refused a store a crash had left with a torn last batch).
    // Every candidate is tried, each only up to the next marker-shaped frame after it, so
    // the search stays linear however many the payloads hold (review: a cap of 1,024
    // candidates rolled back acknowledged batches behind a payload of 1,100 markers, and a
    // whole walk per candidate took 13-50 s to open). Bytes crafted to be exactly that, the
    // next positions with valid checksums, cannot be told from real batches, and are
    // refused rather than rolled back.
    let mut from = w.stop_offset;
    let mut first = None;
    let mut records = Vec::new();
    while let Some((at, highest, end)) = find_marker(buf, from) {
        first.get_or_insert((at, highest, end));
        if highest > prev + w.pending as u64 && opens_a_committed_batch(buf, end, highest, &mut records) {
            return corrupt;
        }
        from = at + 1;
    }
    if let Some((at, highest, end)) = first {
        if w.pending > 0 && w.stop_offset + MARKER_LEN <= at {
            let next = walk(buf, w.stop_offset + MARKER_LEN);
            if next.committed_end == end && !next.offsets.is_empty() && prev + w.pending as u64 + next.offsets.len() as u64 == highest {
                return corrupt;
            }
        }
        // The first marker after the stop is this batch's, if it is whole: it counts the
        // records the batch held, but never more than fit in the bytes before it (a data
        // record takes a head and at least one byte); a marker-shaped frame in a torn
        // payload could claim any number.
        let fit = (at.saturating_sub(w.committed_end) / (RECORD_HEAD + 1)) as u64;
        lost = lost.max(highest.saturating_sub(prev).min(fit));
    }
    TailVerdict::Torn { discard_start: w.committed_end, discard_end: dirty, lost_records: lost }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_records_match_the_reference_worked_example() {
        // docs/format.md §7: type `A`, no tags, payload `x`, then its marker (highest 1).
        let mut out = Vec::new();
        frame_data(&[0x01, 0x00, 0x00, 0x00, b'A', b'x'], &mut out);
        frame_marker(1, &mut out);
        let want: &[u8] = &[
            0x06, 0, 0, 0, 0xde, 0x4c, 0x74, 0x92, 0x01, 0, 0, 0, 0x41, 0x78, //
            0x09, 0, 0, 0x40, 0x17, 0x5f, 0x8a, 0xcd, 0x01, 0x01, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(out, want);
        let mut m = Vec::new();
        frame_marker(3, &mut m);
        assert_eq!(&m[..8], &[0x09, 0, 0, 0x40, 0x6a, 0x58, 0xaf, 0x8f]);
    }

    /// The readers of trusted records ([`framed_records`], [`payload_at`], [`declared_len`])
    /// give back what [`frame_data`] framed; [`verify_data`] accepts exactly an intact data
    /// record.
    #[test]
    fn framed_records_read_back_and_verify() {
        let payloads: [&[u8]; 3] = [b"a", b"bcd", &[7u8; 300]];
        let mut buf = Vec::new();
        for p in payloads {
            frame_data(p, &mut buf);
        }
        let read: Vec<(usize, &[u8])> = framed_records(&buf).collect();
        assert_eq!(read.iter().map(|r| r.1).collect::<Vec<_>>(), payloads);
        assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 9, 20]);
        for &(off, p) in &read {
            assert_eq!(payload_at(&buf, off), p);
            assert_eq!(declared_len(&buf[off..]), p.len());
            assert_eq!(crc_field(&buf[off..]), &buf[off + 4..off + 8]);
            assert_eq!(verify_data(&buf[off..off + RECORD_HEAD + p.len()]), Some(p));
        }
        let mut bad = buf[..RECORD_HEAD + 1].to_vec();
        bad[RECORD_HEAD] ^= 1;
        assert_eq!(verify_data(&bad), None);
        let mut marker = Vec::new();
        frame_marker(1, &mut marker);
        assert_eq!(verify_data(&marker), None, "a control record is no data record");
        assert_eq!(verify_data(&[0u8; RECORD_HEAD]), None);
    }

    fn segment(batches: &[&[&[u8]]]) -> (Vec<u8>, Vec<usize>) {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        let mut pos = 0u64;
        for b in batches {
            for r in *b {
                frame_data(r, &mut buf);
                pos += 1;
            }
            frame_marker(pos, &mut buf);
            ends.push(buf.len());
        }
        (buf, ends)
    }

    #[test]
    fn every_truncation_offset_keeps_exactly_the_committed_batches() {
        let (full, ends) = segment(&[&[b"aaaaa", b"bbbbbb"], &[b"ccccccc"], &[b"dd", b"eee", b"ffff"]]);
        for cut in 0..=full.len() {
            let mut buf = full[..cut].to_vec();
            buf.resize(full.len() + 64, 0);
            let w = walk(&buf, 0);
            // A cut that only removes trailing zero bytes of a marker leaves it intact.
            let committed = ends.iter().filter(|&&e| full[cut.min(e)..e].iter().all(|&b| b == 0)).count();
            let want_end = if committed == 0 { 0 } else { ends[committed - 1] };
            assert_eq!(w.committed_end, want_end, "cut {cut}");
            assert_eq!(w.offsets.len(), [0, 2, 3, 6][committed]);
            match classify_tail(&buf, &w, 1) {
                TailVerdict::Clean => assert!(full[want_end..cut.max(want_end)].iter().all(|&b| b == 0), "cut {cut}"),
                TailVerdict::Torn { discard_start, discard_end, .. } => {
                    assert_eq!(discard_start, want_end);
                    assert!(discard_end <= cut && discard_end > want_end);
                }
                v => panic!("cut {cut}: {v:?}"),
            }
        }
    }

    #[test]
    fn garbage_overwrite_of_the_last_batch_is_a_torn_tail() {
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb", b"cc"]]);
        buf[ends[0] + 3] ^= 0x55;
        buf.resize(buf.len() + 100, 0);
        let w = walk(&buf, 0);
        assert_eq!(w.committed_end, ends[0]);
        assert!(matches!(classify_tail(&buf, &w, 1), TailVerdict::Torn { lost_records: 2, .. }));
    }

    #[test]
    fn a_corrupt_record_with_intact_later_batches_is_refused() {
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb", b"cc"], &[b"ddd"]]);
        buf[ends[0] + 10] ^= 0x01; // payload byte of the first record of batch 2
        let w = walk(&buf, 0);
        assert_eq!(w.committed_end, ends[0]);
        assert_eq!(w.stop, Stop::BadCrc);
        assert_eq!(classify_tail(&buf, &w, 1), TailVerdict::Corrupt { offset: ends[0], stop: Stop::BadCrc });
        // Zeroing a head in the middle is corruption too, not an end of log.
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb"], &[b"ddd"]]);
        buf[ends[0]..ends[0] + 8].fill(0);
        let w = walk(&buf, 0);
        assert_eq!(w.stop, Stop::End);
        assert!(matches!(classify_tail(&buf, &w, 1), TailVerdict::Corrupt { .. }));
    }

    #[test]
    fn all_zero_and_all_ff_buffers() {
        let z = vec![0u8; 4096];
        let w = walk(&z, 0);
        assert_eq!((w.committed_end, w.stop), (0, Stop::End));
        assert_eq!(classify_tail(&z, &w, 1), TailVerdict::Clean);
        let f = vec![0xffu8; 4096];
        let w = walk(&f, 0);
        assert_eq!(w.stop, Stop::BadFlags);
        assert!(matches!(classify_tail(&f, &w, 1), TailVerdict::Torn { discard_start: 0, discard_end: 4096, .. }));
    }

    #[test]
    fn unknown_control_records_are_skipped_and_commit_nothing() {
        let mut buf = Vec::new();
        frame_data(b"abcde", &mut buf);
        let len = (2u32 | CONTROL_FLAG).to_le_bytes();
        let mut h = crc32fast::Hasher::new();
        h.update(&len);
        h.update(&[7, 7]);
        buf.extend_from_slice(&len);
        buf.extend_from_slice(&h.finalize().to_le_bytes());
        buf.extend_from_slice(&[7, 7]);
        frame_marker(1, &mut buf);
        let w = walk(&buf, 0);
        assert_eq!(w.offsets, vec![0]);
        assert_eq!(w.committed_end, buf.len());
    }

    #[test]
    fn a_damaged_marker_followed_by_one_committed_batch_is_refused() {
        // The damaged marker closes an acknowledged batch; the first valid marker after the stop
        // is the next batch's, with nothing committed after it. Both with and without an
        // earlier committed batch in the segment (then the segment base gives the count).
        let cases: [&[&[&[u8]]]; 2] = [&[&[b"aaaaa"], &[b"bbbbbb", b"cc"], &[b"ddd"]], &[&[b"bbbbbb", b"cc"], &[b"ddd", b"eeeee"]]];
        for batches in cases {
            let (full, ends) = segment(batches);
            let marker = ends[ends.len() - 2] - MARKER_LEN;
            for off in marker..marker + MARKER_LEN {
                for bit in 0..8 {
                    let mut buf = full.clone();
                    buf[off] ^= 1 << bit;
                    buf.resize(full.len() + 64, 0);
                    let w = walk(&buf, 0);
                    assert_eq!(w.stop_offset, marker, "byte {off} bit {bit}");
                    assert!(
                        matches!(classify_tail(&buf, &w, 1), TailVerdict::Corrupt { offset, .. } if offset == marker),
                        "byte {off} bit {bit}: {:?}",
                        classify_tail(&buf, &w, 1)
                    );
                }
            }
        }
    }

    #[test]
    fn a_torn_batch_with_a_marker_sized_record_is_still_a_torn_tail() {
        // The last batch holds a 17-byte data record (the size of a marker); damaging it must
        // not be mistaken for a damaged marker of an earlier batch: the counts disagree.
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb", b"ninebytes", b"cc"]]);
        let rec = ends[0] + RECORD_HEAD + 6;
        assert_eq!(read_record(&buf, rec).unwrap().1 - rec, MARKER_LEN);
        buf[rec + 10] ^= 0x01;
        buf.resize(buf.len() + 64, 0);
        let w = walk(&buf, 0);
        assert_eq!((w.stop_offset, w.pending), (rec, 1));
        assert!(matches!(classify_tail(&buf, &w, 1), TailVerdict::Torn { discard_start, lost_records: 3, .. } if discard_start == ends[0]));
    }

    #[test]
    fn marker_shaped_bytes_in_a_torn_batch_payload_are_not_committed_batches() {
        // A crash cut the last batch, one record whose payload begins with marker frames (two in
        // a row, then one with a record between, the first naming the last committed position
        // again); the rest of it never reached the disk. Nothing after the stop is a marker
        // past the pending records followed by whole batches that continue its positions.
        let fake = |between: &[u8]| {
            let mut p = Vec::new();
            frame_marker(3, &mut p);
            p.extend_from_slice(between);
            frame_marker(4, &mut p);
            p.extend_from_slice(&[0x5a; 3000]);
            p
        };
        let mut rec = Vec::new();
        frame_data(b"xyz", &mut rec);
        for payload in [fake(b""), fake(&rec)] {
            let (full, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb", b"cc"], &[&payload]]);
            let mut buf = full[..ends[1] + 2048].to_vec();
            buf.resize(full.len() + 64, 0);
            let w = walk(&buf, 0);
            assert_eq!((w.committed_end, w.stop), (ends[1], Stop::BadCrc));
            assert!(
                matches!(classify_tail(&buf, &w, 1), TailVerdict::Torn { discard_start, .. } if discard_start == ends[1]),
                "{:?}",
                classify_tail(&buf, &w, 1)
            );
        }
        // The same bytes with a real committed batch behind the damage are still refused.
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[b"bbbbbb", b"cc"], &[&fake(b"")], &[b"dd"]]);
        buf[ends[1] + RECORD_HEAD + 200] ^= 0x01;
        buf.resize(buf.len() + 64, 0);
        let w = walk(&buf, 0);
        assert!(matches!(classify_tail(&buf, &w, 1), TailVerdict::Corrupt { .. }), "{:?}", classify_tail(&buf, &w, 1));
    }

    #[test]
    fn many_marker_shaped_frames_neither_hide_committed_batches_nor_slow_the_search() {
        // A payload of 1,100 marker frames in a batch damaged later, with committed batches
        // after it: refused (a cap of 1,024 candidates rolled them back; review).
        let mut fakes = Vec::new();
        for h in 0..1100u64 {
            frame_marker(1000 + h, &mut fakes);
        }
        let (mut buf, ends) = segment(&[&[b"aaaaa"], &[&fakes], &[b"c"], &[b"d"], &[b"e"]]);
        buf[ends[0] + RECORD_HEAD + 2] ^= 0x01;
        buf.resize(buf.len() + 64, 0);
        let w = walk(&buf, 0);
        assert_eq!((w.committed_end, w.stop), (ends[0], Stop::BadCrc));
        assert!(matches!(classify_tail(&buf, &w, 1), TailVerdict::Corrupt { .. }), "{:?}", classify_tail(&buf, &w, 1));
        // A torn last batch of 200,000 marker frames (3.4 MB): a torn tail, found in one pass
        // (a whole walk per candidate took seconds to minutes to open; review).
        let mut many = Vec::new();
        for h in 0..200_000u64 {
            frame_marker(5 + h, &mut many);
        }
        let (full, ends) = segment(&[&[b"aaaaa"], &[&many]]);
        let mut buf = full[..full.len() - 4096].to_vec();
        buf.resize(full.len() + 64, 0);
        let w = walk(&buf, 0);
        assert_eq!(w.committed_end, ends[0]);
        let v = classify_tail(&buf, &w, 1);
        assert!(matches!(v, TailVerdict::Torn { discard_start, .. } if discard_start == ends[0]), "{v:?}");
    }

    #[test]
    fn a_marker_shaped_frame_in_a_torn_payload_does_not_inflate_the_lost_count() {
        // The torn batch's one record carries a frame claiming position 1,000,000: the count of
        // lost records is what fits before it (the log warned of a million lost positions).
        let mut payload = b"head".to_vec();
        frame_marker(1_000_000, &mut payload);
        payload.extend_from_slice(&[0x5a; 100]);
        let (full, ends) = segment(&[&[b"aaaaa"], &[&payload]]);
        let mut buf = full[..full.len() - 40].to_vec();
        buf.resize(full.len() + 64, 0);
        let w = walk(&buf, 0);
        assert_eq!(w.committed_end, ends[0]);
        match classify_tail(&buf, &w, 1) {
            TailVerdict::Torn { discard_start, lost_records, .. } => {
                assert_eq!(discard_start, ends[0]);
                assert!((1..=2).contains(&lost_records), "{lost_records} lost records claimed for a batch of one");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn lost_records_of_a_torn_first_batch_count_from_the_segment_base() {
        // No earlier marker in the segment: the marker's highest minus (base - 1).
        let mut buf = Vec::new();
        frame_data(b"aaaaa", &mut buf);
        frame_data(b"bbbbb", &mut buf);
        frame_marker(11, &mut buf);
        buf[RECORD_HEAD + 13 + 2] ^= 0x01; // second record's payload
        buf.resize(buf.len() + 64, 0);
        let w = walk(&buf, 0);
        assert!(matches!(classify_tail(&buf, &w, 10), TailVerdict::Torn { lost_records: 2, .. }), "{:?}", classify_tail(&buf, &w, 10));
    }
}
