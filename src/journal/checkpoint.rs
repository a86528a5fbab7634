//! The checkpoint codec: the whole journal state (directory, every journal's state and where
//! each held record lies) as of one command position, so the commands up to it need not be
//! replayed and the segments holding no held record can be deleted. Pure over bytes.
//!
//! Layout (little-endian; docs/journals.md §4.4):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `TJCP` |
//! | 4 | 1 | format version, 1 |
//! | 5 | 3 | reserved, zero |
//! | 8 | 8 | position: the last command the checkpoint covers |
//! | 16 | 8 | body length in bytes |
//! | 24 | 4 | CRC-32 (IEEE) of the body |
//! | 28 | 4 | CRC-32 (IEEE) of bytes 0..28 |
//! | 32 | .. | body |
//!
//! Body: `tenants u32`, then per tenant `id u64 | name_len u16 | name`; `journals u32`, then per
//! journal `tenant u64 | journal u64 | name_len u16 | name | mode u8 | durability u8 |
//! leader u128 | term u64 | first_seq u64 | next_seq u64 | marks u32 | marks × (seq u64 |
//! count u32 | leader u128 | digest u128) | runs u32 | runs × (segment u64 | n u32 | n ×
//! (offset u32 | len u32))`. The runs hold the records `first_seq..next_seq` in order.

use std::collections::VecDeque;

use super::directory::{Directory, Entry};
use super::held::{Holdings, Loc};
use super::model::{BatchMark, JournalId, JournalState, LeaderUuid, Mode, StoreDurability};

/// The first bytes of a checkpoint file.
pub const MAGIC: [u8; 4] = *b"TJCP";
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the body.
pub const HEAD_LEN: usize = 32;

/// A decoded checkpoint: the state after the command at `position`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last command position covered (0: none).
    pub position: u64,
    /// The directory and every journal's state.
    pub directory: Directory,
    /// Where every held record lies.
    pub holdings: Holdings,
}

/// Why a checkpoint's bytes were refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Fewer bytes than the head, or not as many as the head says the file holds.
    #[error("checkpoint is {got} bytes, its head calls for {need}")]
    Length {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// Not a checkpoint.
    #[error("checkpoint does not start with the magic bytes TJCP")]
    Magic,
    /// A version this code does not read.
    #[error("checkpoint format version {0} is not one this server reads (it reads {VERSION})")]
    Version(u8),
    /// A CRC did not match: the file is damaged.
    #[error("checkpoint {what} CRC mismatch (stored {stored:08x}, computed {computed:08x})")]
    Crc {
        /// `head` or `body`.
        what: &'static str,
        /// The CRC in the file.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// The body's contents do not hold together (a bug in the writer: the CRCs matched).
    #[error("checkpoint body is inconsistent: {0}")]
    Body(String),
}

/// Encodes the state after command `position`.
pub fn encode(position: u64, directory: &Directory, holdings: &Holdings) -> Vec<u8> {
    let mut body = Vec::with_capacity(encoded_len_estimate(directory, holdings));
    let tenants: Vec<_> = directory.tenants().collect();
    put_u32(&mut body, tenants.len() as u32);
    for (id, t) in tenants {
        body.extend_from_slice(&id.to_le_bytes());
        put_name(&mut body, &t.name);
    }
    let journals: Vec<_> = directory.entries().collect();
    put_u32(&mut body, journals.len() as u32);
    for (id, e) in journals {
        encode_journal(&mut body, id, e, holdings);
    }
    let mut out = Vec::with_capacity(HEAD_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&position.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    let head_crc = crc32fast::hash(&out);
    out.extend_from_slice(&head_crc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// About how many bytes [`encode`] writes for this state (for deciding whether a checkpoint
/// is worth its cost).
pub fn encoded_len_estimate(directory: &Directory, holdings: &Holdings) -> usize {
    let journals: usize = directory.entries().map(|(_, e)| 128 + e.name.len() + e.state.batches.len() * 44).sum();
    let tenants: usize = directory.tenants().map(|(_, t)| 10 + t.name.len()).sum();
    HEAD_LEN + 8 + tenants + journals + holdings.records() as usize * 8
}

fn encode_journal(body: &mut Vec<u8>, id: JournalId, e: &Entry, holdings: &Holdings) {
    let s = &e.state;
    body.extend_from_slice(&id.tenant.to_le_bytes());
    body.extend_from_slice(&id.journal.to_le_bytes());
    put_name(body, &e.name);
    body.push(super::command::mode_byte(s.mode));
    body.push(super::command::durability_byte(s.durability));
    body.extend_from_slice(&s.leader.unwrap_or(LeaderUuid::NONE).0.to_le_bytes());
    for v in [s.term, s.first_seq, s.next_seq] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    put_u32(body, s.batches.len() as u32);
    for b in &s.batches {
        body.extend_from_slice(&b.seq.to_le_bytes());
        body.extend_from_slice(&b.count.to_le_bytes());
        body.extend_from_slice(&b.leader.0.to_le_bytes());
        body.extend_from_slice(&b.digest.to_le_bytes());
    }
    let locs: Vec<Loc> = holdings.get(id).map(|h| h.from(s.first_seq).map(|(_, l)| l).collect()).unwrap_or_default();
    let runs: Vec<&[Loc]> = locs.chunk_by(|a, b| a.segment == b.segment).collect();
    put_u32(body, runs.len() as u32);
    for run in runs {
        body.extend_from_slice(&run[0].segment.to_le_bytes());
        put_u32(body, run.len() as u32);
        for l in run {
            put_u32(body, l.offset as u32);
            put_u32(body, l.len);
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// Decodes a checkpoint, checking both CRCs and that the contents hold together (names,
/// ids, every journal's invariants, held records dense from `first_seq` to `next_seq`).
///
/// # Errors
/// [`CheckpointError`] saying what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    if bytes.len() < HEAD_LEN {
        return Err(CheckpointError::Length { need: HEAD_LEN, got: bytes.len() });
    }
    if bytes[..4] != MAGIC {
        return Err(CheckpointError::Magic);
    }
    let head_crc = u32::from_le_bytes(bytes[28..32].try_into().unwrap());
    let computed = crc32fast::hash(&bytes[..28]);
    if head_crc != computed {
        return Err(CheckpointError::Crc { what: "head", stored: head_crc, computed });
    }
    if bytes[4] != VERSION || bytes[5..8] != [0, 0, 0] {
        return Err(CheckpointError::Version(bytes[4]));
    }
    let position = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let body_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    let need = usize::try_from(body_len).ok().and_then(|n| n.checked_add(HEAD_LEN)).unwrap_or(usize::MAX);
    if bytes.len() != need {
        return Err(CheckpointError::Length { need, got: bytes.len() });
    }
    let body = &bytes[HEAD_LEN..];
    let body_crc = u32::from_le_bytes(bytes[24..28].try_into().unwrap());
    let computed = crc32fast::hash(body);
    if body_crc != computed {
        return Err(CheckpointError::Crc { what: "body", stored: body_crc, computed });
    }
    let mut r = Reader { bytes: body, at: 0 };
    let (directory, holdings) = decode_body(&mut r).map_err(CheckpointError::Body)?;
    if r.at != body.len() {
        return Err(CheckpointError::Body(format!("{} bytes after the last journal", body.len() - r.at)));
    }
    Ok(Checkpoint { position, directory, holdings })
}

fn decode_body(r: &mut Reader<'_>) -> Result<(Directory, Holdings), String> {
    let n = r.u32()?;
    let mut tenants = Vec::new();
    for _ in 0..n {
        let id = r.u64()?;
        tenants.push((id, r.name()?));
    }
    let n = r.u32()?;
    let mut journals = Vec::new();
    let mut holdings = Holdings::default();
    for _ in 0..n {
        let (id, entry) = decode_journal(r, &mut holdings)?;
        journals.push((id, entry));
    }
    Ok((Directory::restore(tenants, journals)?, holdings))
}

fn decode_journal(r: &mut Reader<'_>, holdings: &mut Holdings) -> Result<(JournalId, Entry), String> {
    let id = JournalId { tenant: r.u64()?, journal: r.u64()? };
    let name = r.name()?;
    let mode = match r.u8()? {
        0 => Mode::Single,
        1 => Mode::Multi,
        b => return Err(format!("journal {id}: mode byte {b}")),
    };
    let durability = match r.u8()? {
        0 => StoreDurability::Ordered,
        1 => StoreDurability::Batched,
        b => return Err(format!("journal {id}: durability byte {b}")),
    };
    let leader = LeaderUuid(r.u128()?).set();
    let (term, first_seq, next_seq) = (r.u64()?, r.u64()?, r.u64()?);
    let marks = r.u32()?;
    let mut batches = VecDeque::new();
    for _ in 0..marks {
        batches.push_back(BatchMark { seq: r.u64()?, count: r.u32()?, leader: LeaderUuid(r.u128()?), digest: r.u128()? });
    }
    let state = JournalState { mode, durability, leader, term, first_seq, next_seq, batches };
    let mut seq = first_seq;
    holdings.trim(id, first_seq);
    for _ in 0..r.u32()? {
        let segment = r.u64()?;
        for _ in 0..r.u32()? {
            if seq >= next_seq {
                return Err(format!("journal {id}: more held records than next_seq {next_seq} - first_seq {first_seq}"));
            }
            holdings.push(id, seq, Loc { segment, offset: u64::from(r.u32()?), len: r.u32()? });
            seq += 1;
        }
    }
    if seq != next_seq {
        return Err(format!("journal {id}: held records end at {seq}, next_seq is {next_seq}"));
    }
    Ok((id, Entry { name, state, placement: None }))
}

/// A cursor over the body that says what it ran out on.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| format!("ends inside a field at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn u128(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().unwrap()))
    }

    fn name(&mut self) -> Result<String, String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as usize;
        let at = self.at;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| format!("a name at byte {at} is not UTF-8"))
    }
}
