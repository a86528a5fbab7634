//! The writer: the one task that owns the active segment, assigns positions, judges conditions
//! and runs group commit (reference engine §4, seed "Durability", DESIGN "Storage").
//!
//! It runs on a glommio executor (the writer shard). Appends arrive over one bounded queue;
//! each round takes one request, drains whatever else is queued (up to
//! `max_batch_records` requests and `max_batch_bytes` bytes), judges every condition in arrival
//! order, writes the staged records and one commit marker through O_DIRECT (rewriting the
//! partial last block from an aligned buffer), and makes the batch durable with one
//! `fdatasync`. Nobody is answered before the sync returns. A failed write or sync is
//! fail-stop: that batch and every later append get an error; reads go on.

pub mod condition;

use crate::event::{Event, EventRef};
use crate::log::record::{frame_data, frame_marker, LENGTH_MASK, MARKER_LEN, RECORD_HEAD};
use crate::log::segment::{create_segment, Fingerprint, Segment, SegmentConfig};
use crate::model::AppendCondition;
use crate::read::{Cursor, ReadError, Shared};
use condition::{evaluate, ConflictClause, ConflictSite, Staged, Verdict};
use glommio::io::{DmaFile, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;
use crate::index::active::ActiveWriter;
use crate::index::{SegIndex, Tips};
use crate::read::Snapshot;

/// Writer settings (the `[writer]` section of the seed's configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterConfig {
    /// Bounded request queue; a full queue makes the caller wait (16,384).
    pub queue_capacity: usize,
    /// Most requests folded into one group commit (2,048).
    pub max_batch_records: usize,
    /// Byte budget of one group commit (8 MiB); clamped to the segment capacity.
    pub max_batch_bytes: usize,
    /// How far below the head the tips' floor rises when the tips map outgrows
    /// [`crate::index::TIPS_MAX_ENTRIES`] (1,000,000 positions).
    pub tips_window: u64,
    /// Judge every condition by a log scan instead of the tips (false).
    pub condition_force_scan: bool,
    /// Cross-check every fast verdict against a scan; a test-only paranoia switch (false).
    pub verify_tips: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            queue_capacity: 16_384,
            max_batch_records: 2_048,
            max_batch_bytes: 8 * 1024 * 1024,
            tips_window: 1_000_000,
            condition_force_scan: false,
            verify_tips: false,
        }
    }
}

/// An inclusive range of assigned positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PositionRange {
    /// First assigned position.
    pub first: crate::model::Position,
    /// Last assigned position.
    pub last: crate::model::Position,
}

impl PositionRange {
    /// Number of positions in the range.
    pub fn count(&self) -> u64 {
        self.last.get() - self.first.get() + 1
    }
}

/// Why an append was not committed (wire mapping: reference engine §2.3).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// A condition clause matched.
    #[error("append condition conflict ({clause:?}, {at:?})")]
    Conflict { clause: ConflictClause, at: ConflictSite },
    /// The condition's `after` is above the durable tip.
    #[error("after {after} is beyond the durable tip {tip}")]
    AfterBeyondTip { after: u64, tip: u64 },
    /// No events.
    #[error("append with no events")]
    Empty,
    /// A record or the whole batch cannot fit a segment; `size` in bytes.
    #[error("append of {size} bytes is too large for the segment size")]
    TooLarge { size: u64 },
    /// The log could not be written or synced: the writer is stopped (fail-stop).
    #[error("log write failed: {0}")]
    Failed(String),
    /// Reading the log to judge a condition failed.
    #[error("reading the log failed: {0}")]
    Read(String),
    /// The store is shut down.
    #[error("the store is shut down")]
    Shutdown,
    /// This handle belongs to a read-only follower; appends go to the writer.
    #[error("this is a read-only follower; send appends to the writer")]
    ReadOnly,
}

/// The result delivered for one append.
pub type AppendResult = Result<PositionRange, AppendError>;

/// Where the writer sends an append's result.
pub enum ReplyTo {
    /// A private one-shot channel.
    Oneshot(flume::Sender<AppendResult>),
    /// A per-shard sink: results for the same sink are delivered together, once per commit,
    /// each tagged with the caller's token.
    Batched { sink: flume::Sender<Vec<(u64, AppendResult)>>, token: u64 },
}

/// An append whose events were encoded, framed and checksummed by the caller.
pub struct PreparedAppend {
    records: Vec<u8>,
    count: u32,
    condition: Option<AppendCondition>,
}

impl PreparedAppend {
    /// Frames `events` for `cfg`'s geometry.
    ///
    /// # Errors
    /// [`AppendError::Empty`] for no events; [`AppendError::TooLarge`] when a framed record
    /// exceeds `max_record_len` or the batch plus its marker exceeds the segment capacity.
    pub fn new(events: &[Event], condition: Option<AppendCondition>, cfg: &SegmentConfig) -> Result<PreparedAppend, AppendError> {
        if events.is_empty() {
            return Err(AppendError::Empty);
        }
        let total: u64 = events.iter().map(|e| (RECORD_HEAD + e.encoded_len()) as u64).sum();
        if let Some(e) = events.iter().find(|e| (RECORD_HEAD + e.encoded_len()) as u64 > cfg.max_record_len) {
            return Err(AppendError::TooLarge { size: (RECORD_HEAD + e.encoded_len()) as u64 });
        }
        if total + MARKER_LEN as u64 > cfg.capacity() {
            return Err(AppendError::TooLarge { size: total + MARKER_LEN as u64 });
        }
        let mut records = Vec::with_capacity(total as usize);
        for e in events {
            frame_data(e.as_bytes(), &mut records);
        }
        Ok(PreparedAppend { records, count: events.len() as u32, condition })
    }

    /// Adopts records already framed by a trusted encoder ([`crate::proto::append`]):
    /// `count` valid events whose largest framed record is `largest` bytes.
    ///
    /// # Errors
    /// As [`PreparedAppend::new`].
    pub fn from_framed(records: Vec<u8>, count: u32, largest: usize, condition: Option<AppendCondition>, cfg: &SegmentConfig) -> Result<PreparedAppend, AppendError> {
        if count == 0 {
            return Err(AppendError::Empty);
        }
        if largest as u64 > cfg.max_record_len {
            return Err(AppendError::TooLarge { size: largest as u64 });
        }
        let total = (records.len() + MARKER_LEN) as u64;
        if total > cfg.capacity() {
            return Err(AppendError::TooLarge { size: total });
        }
        Ok(PreparedAppend { records, count, condition })
    }

    /// Framed bytes (without the commit marker).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Always false: an empty append is refused at construction.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Number of events.
    pub fn count(&self) -> u32 {
        self.count
    }
}

/// One queued append.
pub struct Request {
    /// The framed events and condition.
    pub append: PreparedAppend,
    /// Where the result goes.
    pub reply: ReplyTo,
}

/// Messages on the writer's queue.
pub enum WriterMsg {
    /// Append a batch.
    Append(Request),
    /// Finish everything queued ahead, then stop and acknowledge.
    Shutdown(flume::Sender<()>),
}

/// Iterates `(offset, payload)` of framed data records.
fn records(buf: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off >= buf.len() {
            return None;
        }
        let len = (u32::from_le_bytes(buf[off..off + 4].try_into().unwrap()) & LENGTH_MASK) as usize;
        let at = off;
        off += RECORD_HEAD + len;
        Some((at, &buf[at + RECORD_HEAD..off]))
    })
}

const BLOCK: u64 = 4096;

struct Active {
    file: DmaFile,
    seg: Arc<Segment>,
    /// Byte offset just past the last commit marker.
    end: u64,
    /// Bytes `[align_down(end), end)`: the partial last block, rewritten with each batch.
    tail: Vec<u8>,
}

/// The writer's state; created by [`crate::store`] from a recovered log.
pub struct Writer {
    dir: PathBuf,
    seg_cfg: SegmentConfig,
    cfg: WriterConfig,
    shared: Arc<Shared>,
    active: Option<Active>,
    active_seg: Arc<Segment>,
    active_end: u64,
    next: u64,
    index: ActiveWriter,
    /// The active segment's fingerprint, fed with each committed record (ties its sealed index
    /// file to its content).
    fingerprint: Fingerprint,
    tips: Tips,
    /// The last index sealing started (awaited at the next rollover and at shutdown, so every
    /// sealed file is on disk when the store closes).
    sealing: Option<std::thread::JoinHandle<()>>,
    failed: Option<String>,
    metrics: Arc<WriterMetrics>,
}

/// Counters and histograms the writer keeps for monitoring.
#[derive(Default)]
pub struct WriterMetrics {
    inner: std::sync::Mutex<MetricsInner>,
}

/// A snapshot of [`WriterMetrics`].
#[derive(Clone)]
pub struct MetricsInner {
    /// fdatasync latency, microseconds.
    pub fsync_us: hdrhistogram::Histogram<u64>,
    /// Events per committed batch.
    pub batch_events: hdrhistogram::Histogram<u64>,
    /// Boundary conflicts answered.
    pub conflicts: u64,
    /// Existence conflicts answered.
    pub already_exists: u64,
    /// Committed batches.
    pub commits: u64,
}

impl Default for MetricsInner {
    fn default() -> Self {
        MetricsInner {
            fsync_us: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2).expect("histogram bounds"),
            batch_events: hdrhistogram::Histogram::new_with_bounds(1, 100_000_000, 2).expect("histogram bounds"),
            conflicts: 0,
            already_exists: 0,
            commits: 0,
        }
    }
}

impl WriterMetrics {
    /// A copy of the current values.
    pub fn snapshot(&self) -> MetricsInner {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

enum Decision {
    Staged { first: u64, count: u32 },
    Done(AppendResult),
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dir: PathBuf,
        seg_cfg: SegmentConfig,
        mut cfg: WriterConfig,
        shared: Arc<Shared>,
        active_seg: Arc<Segment>,
        active_end: u64,
        next: u64,
        index: ActiveWriter,
        fingerprint: Fingerprint,
        metrics: Arc<WriterMetrics>,
    ) -> Writer {
        let cap = (seg_cfg.capacity() as usize).saturating_sub(MARKER_LEN);
        if cfg.max_batch_bytes > cap {
            tracing::warn!(max_batch_bytes = cfg.max_batch_bytes, clamped = cap, "writer.max_batch_bytes clamped to the segment capacity");
            cfg.max_batch_bytes = cap;
        }
        cfg.queue_capacity = cfg.queue_capacity.max(1);
        cfg.max_batch_records = cfg.max_batch_records.max(1);
        let tips = Tips::new(next - 1, cfg.tips_window);
        Writer { dir, seg_cfg, cfg, shared, active: None, active_seg, active_end, next, index, fingerprint, tips, sealing: None, failed: None, metrics }
    }

    async fn open_active(seg: Arc<Segment>, end: u64) -> std::io::Result<Active> {
        let file = OpenOptions::new().read(true).write(true).dma_open(&seg.path).await.map_err(std::io::Error::from)?;
        let start = end & !(BLOCK - 1);
        let mut tail = vec![0u8; (end - start) as usize];
        let got = seg.read_at(&mut tail, start)?;
        if got != tail.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short read of the active segment's last block"));
        }
        Ok(Active { file, seg, end, tail })
    }

    /// Runs the group-commit loop until shutdown or until every sender is gone.
    pub async fn run(mut self, rx: flume::Receiver<WriterMsg>) {
        match Self::open_active(self.active_seg.clone(), self.active_end).await {
            Ok(a) => self.active = Some(a),
            Err(e) => self.fail(format!("cannot open the active segment {}: {e}", self.active_seg.path.display())),
        }
        let mut pushback: Option<Request> = None;
        loop {
            let first = match pushback.take() {
                Some(r) => r,
                None => match rx.recv_async().await {
                    Ok(WriterMsg::Append(r)) => r,
                    Ok(WriterMsg::Shutdown(ack)) => {
                        self.finish(ack).await;
                        return;
                    }
                    Err(_) => break,
                },
            };
            let mut bytes = first.append.len();
            let mut drain = vec![first];
            let mut shutdown = None;
            while drain.len() < self.cfg.max_batch_records {
                match rx.try_recv() {
                    Ok(WriterMsg::Append(r)) => {
                        if bytes + r.append.len() > self.cfg.max_batch_bytes {
                            pushback = Some(r);
                            break;
                        }
                        bytes += r.append.len();
                        drain.push(r);
                    }
                    Ok(WriterMsg::Shutdown(ack)) => {
                        shutdown = Some(ack);
                        break;
                    }
                    Err(_) => break,
                }
            }
            self.process(drain).await;
            if let Some(ack) = shutdown {
                if let Some(r) = pushback.take() {
                    self.process(vec![r]).await;
                }
                self.finish(ack).await;
                return;
            }
        }
        self.finish_sealing();
        self.shared.close();
    }

    async fn finish(&mut self, ack: flume::Sender<()>) {
        self.finish_sealing();
        if let Some(a) = self.active.take() {
            let _ = a.file.close().await;
        }
        self.shared.close();
        let _ = ack.send(());
    }

    /// Waits for the last index sealing (it had a whole segment's worth of time, or this is
    /// shutdown).
    fn finish_sealing(&mut self) {
        if let Some(h) = self.sealing.take() {
            let _ = h.join();
        }
    }

    fn fail(&mut self, reason: String) {
        tracing::error!(%reason, "writer stopped: appends are refused until restart, reads continue");
        self.shared.fail(reason.clone());
        self.failed = Some(reason);
    }

    /// The lowest position above `after` matching `q` among the committed and staged events:
    /// the tips narrow `(after, head]` to the ranges where a match can lie, then each segment's
    /// index is probed over them in order with early termination (a scan for a segment without
    /// one); `condition_force_scan` asks the scan instead, `verify_tips` asks both.
    fn durable_match(&self, cursor: &mut Cursor, snap: &Snapshot, q: &crate::model::Query, after: u64) -> Result<Option<u64>, ReadError> {
        let head = self.next - 1;
        if self.cfg.condition_force_scan {
            return cursor.first_match(q, after, head);
        }
        let mut fast = None;
        for (lo, hi) in self.tips.candidates(q, after, head) {
            fast = Self::index_first_match(cursor, snap, q, lo - 1, hi)?;
            if fast.is_some() {
                break;
            }
        }
        if self.cfg.verify_tips {
            let slow = cursor.first_match(q, after, head)?;
            if slow != fast {
                tracing::error!(?fast, ?slow, "index verdict disagrees with the log scan; using the scan");
                debug_assert_eq!(fast, slow, "index verdict differs from the scan");
                return Ok(slow);
            }
        }
        Ok(fast)
    }

    /// The lowest position in `(after, head]` matching `q`, by the segments' indexes.
    fn index_first_match(cursor: &mut Cursor, snap: &Snapshot, q: &crate::model::Query, after: u64, head: u64) -> Result<Option<u64>, ReadError> {
        if after >= head {
            return Ok(None);
        }
        // Segments wholly outside the range are pruned by their position range.
        for i in snap.segment_of(after + 1)..snap.segments.len() {
            if snap.segments[i].base > head {
                break;
            }
            let (lo, hi) = snap.local_range(i, after + 1, head);
            if lo >= hi {
                continue;
            }
            let base = snap.segments[i].base;
            let hit = match snap.indexes[i].first_match(q, lo, hi) {
                Some(local) => local.map(|l| base + l as u64),
                None => cursor.first_match(q, base + lo as u64 - 1, base + hi as u64 - 1)?,
            };
            if hit.is_some() {
                return Ok(hit);
            }
        }
        Ok(None)
    }

    async fn process(&mut self, drain: Vec<Request>) {
        if let Some(reason) = &self.failed {
            let reason = reason.clone();
            deliver(drain.into_iter().map(|r| (r.reply, Err(AppendError::Failed(reason.clone())))));
            return;
        }
        let tip = self.next - 1;
        let mut decisions = Vec::with_capacity(drain.len());
        let mut staged = Staged::new();
        let mut staged_bytes = 0usize;
        let mut cursor: Option<(Cursor, Arc<Snapshot>)> = None;
        let (mut conflicts, mut exists) = (0u64, 0u64);
        for req in &drain {
            if let Some(c) = &req.append.condition {
                if c.after.get() > tip {
                    decisions.push(Decision::Done(Err(AppendError::AfterBeyondTip { after: c.after.get(), tip })));
                    continue;
                }
                let (cur, snap) = cursor.get_or_insert_with(|| {
                    let snap = self.shared.pin().1;
                    (Cursor::new(snap.clone()), snap)
                });
                match evaluate(c, &staged, |q, after| self.durable_match(cur, snap, q, after)) {
                    Ok(Verdict::Pass) => {}
                    Ok(Verdict::Conflict { clause, at }) => {
                        match clause {
                            ConflictClause::Boundary => conflicts += 1,
                            ConflictClause::Existence => exists += 1,
                        }
                        decisions.push(Decision::Done(Err(AppendError::Conflict { clause, at })));
                        continue;
                    }
                    Err(e) => {
                        decisions.push(Decision::Done(Err(AppendError::Read(e.to_string()))));
                        continue;
                    }
                }
            }
            let first = self.next + staged.len() as u64;
            for (_, payload) in records(&req.append.records) {
                // Framed by PreparedAppend from valid Events.
                staged.push(EventRef::trusted(payload));
            }
            staged_bytes += req.append.records.len();
            decisions.push(Decision::Staged { first, count: req.append.count });
        }
        drop(cursor);
        let n_staged = staged.len() as u64;
        drop(staged);

        let mut outcome: Result<(), String> = Ok(());
        if n_staged > 0 {
            outcome = self.commit(&drain, &decisions, staged_bytes, n_staged).await;
        }
        {
            let mut m = self.metrics.inner.lock().unwrap_or_else(|e| e.into_inner());
            m.conflicts += conflicts;
            m.already_exists += exists;
        }
        let results = drain.into_iter().zip(decisions).map(|(r, d)| {
            let res = match d {
                Decision::Done(res) => res,
                Decision::Staged { first, count } => match &outcome {
                    Ok(()) => Ok(PositionRange { first: first.into(), last: (first + count as u64 - 1).into() }),
                    Err(reason) => Err(AppendError::Failed(reason.clone())),
                },
            };
            (r.reply, res)
        });
        deliver(results);
    }

    async fn rollover(&mut self) -> Result<(), String> {
        if let Some(old) = self.active.take() {
            let _ = old.file.close().await;
        }
        let base = self.next;
        let path = create_segment(&self.dir, base, &self.seg_cfg).map_err(|e| e.to_string())?;
        crate::fault::crash_point("segment_created_before_commit");
        let seg = Arc::new(Segment::open(base, path, &self.seg_cfg).map_err(|e| e.to_string())?);
        // The old segment's index is frozen; readers and conditions keep using it until its
        // sealed form is encoded and persisted off this thread (a failed write only costs a
        // rebuild at the next open).
        self.finish_sealing();
        let mut header = [0u8; crate::log::header::HEADER_LEN];
        let got = seg.read_at(&mut header, 0).map_err(|e| format!("reading the new segment's header: {e}"))?;
        if got != header.len() {
            return Err("short read of the new segment's header".into());
        }
        let fingerprint = std::mem::replace(&mut self.fingerprint, Fingerprint::new(&header)).value();
        let sealer = std::mem::replace(&mut self.index, ActiveWriter::new(base, self.seg_cfg.max_records())).into_sealer(fingerprint);
        self.shared.roll(None, seg.clone(), SegIndex::Active(self.index.shared().clone()));
        // A plain thread, not the executor's blocking pool: it needs nothing from the executor
        // (the snapshot is swapped through `Shared`), so no wake-up has to find its way back.
        let (dir, shared) = (self.dir.clone(), self.shared.clone());
        let sealing = std::thread::Builder::new().name("tephra-seal".into()).spawn(move || {
            let (sealed_base, count) = (sealer.base(), sealer.count());
            match crate::index::persist_sealed(&dir, sealed_base, count, fingerprint, sealer.encode()) {
                Ok(ix) => shared.seal(sealed_base, SegIndex::Sealed(Arc::new(ix))),
                // Cannot happen (the bytes were just encoded); the frozen index stays in use.
                Err(e) => tracing::error!(base = sealed_base, error = %e, "sealing an index failed; keeping the in-memory index"),
            }
        });
        match sealing {
            Ok(h) => self.sealing = Some(h),
            Err(e) => tracing::warn!(error = %e, "cannot start the index sealing thread; the index stays in memory and is rebuilt at the next open"),
        }
        let a = Self::open_active(seg.clone(), crate::log::header::HEADER_LEN as u64).await.map_err(|e| e.to_string())?;
        self.active_seg = seg;
        self.active = Some(a);
        Ok(())
    }

    async fn commit(&mut self, drain: &[Request], decisions: &[Decision], staged_bytes: usize, n_staged: u64) -> Result<(), String> {
        let total = (staged_bytes + MARKER_LEN) as u64;
        let end = self.active.as_ref().map(|a| a.end).unwrap_or(u64::MAX);
        if end.saturating_add(total) > self.seg_cfg.segment_size {
            if let Err(e) = self.rollover().await {
                self.fail(format!("cannot create a new segment: {e}"));
                return Err(self.failed.clone().unwrap_or_default());
            }
        }
        let Some(active) = self.active.as_mut() else {
            let reason = "no active segment".to_string();
            self.fail(reason.clone());
            return Err(reason);
        };
        let start = active.end & !(BLOCK - 1);
        let prefix = active.tail.len();
        let data_end = prefix + total as usize;
        let buf_len = (data_end as u64).div_ceil(BLOCK) * BLOCK;
        let mut buf = active.file.alloc_dma_buffer(buf_len as usize);
        let bytes = buf.as_bytes_mut();
        bytes[..prefix].copy_from_slice(&active.tail);
        let mut at = prefix;
        let mut offsets = Vec::with_capacity(n_staged as usize);
        for (req, d) in drain.iter().zip(decisions) {
            if let Decision::Staged { .. } = d {
                let recs = &req.append.records;
                for (off, _) in records(recs) {
                    offsets.push((start as usize + at + off) as u32);
                }
                bytes[at..at + recs.len()].copy_from_slice(recs);
                at += recs.len();
            }
        }
        let highest = self.next + n_staged - 1;
        let mut marker = Vec::with_capacity(MARKER_LEN);
        frame_marker(highest, &mut marker);
        bytes[at..at + MARKER_LEN].copy_from_slice(&marker);
        at += MARKER_LEN;
        // Crash harness: a marker torn mid-write keeps its head and kind byte only.
        let torn_marker = crate::fault::fires("torn_marker");
        if torn_marker {
            bytes[at - 8..at].fill(0);
        }
        bytes[at..].fill(0);
        let new_tail_start = ((start + at as u64) & !(BLOCK - 1)) - start;
        let new_tail = bytes[new_tail_start as usize..at].to_vec();

        let written = async {
            if let Err(e) = crate::fault::io_point("commit_shortwrite") {
                // An injected short write puts the first half of the batch on disk, then fails.
                let half = prefix + total as usize / 2;
                let mut part = active.file.alloc_dma_buffer(buf_len as usize);
                part.as_bytes_mut()[..half].copy_from_slice(&buf.as_bytes()[..half]);
                part.as_bytes_mut()[half..].fill(0);
                let _ = active.file.write_at(part, start).await;
                return Err(e);
            }
            let n = pwrite_blocking(&active.file, buf.as_bytes(), start)?;
            if (n as u64) < buf_len {
                return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {n} of {buf_len} bytes")));
            }
            if torn_marker {
                let _ = active.file.fdatasync().await;
                crate::fault::abort_at("torn_marker");
            }
            crate::fault::crash_point("commit_before_fsync");
            crate::fault::io_point("commit_fsync")?;
            let t = std::time::Instant::now();
            fdatasync_blocking(&active.file)?;
            Ok::<_, std::io::Error>(t.elapsed())
        }
        .await;
        let sync_time = match written {
            Ok(t) => t,
            Err(e) => {
                let reason = format!("{}: {e}", active.seg.path.display());
                self.fail(reason.clone());
                return Err(reason);
            }
        };
        crate::fault::crash_point("after_fsync_before_ack");
        active.end = start + at as u64;
        active.tail = new_tail;
        let seg = active.seg.clone();
        let local0 = (self.next - seg.base) as usize;
        for (i, off) in offsets.iter().enumerate() {
            seg.offsets.set(local0 + i, *off);
        }
        // The index and the tips see every committed event, in position order.
        // Runs of events naming the same type and tags (the usual shape of one append) are
        // fed with one lookup per name.
        let mut pos = self.next;
        let mut run: Option<(u64, u32, EventRef<'_>)> = None;
        for (req, d) in drain.iter().zip(decisions) {
            if let Decision::Staged { .. } = d {
                for (off, payload) in records(&req.append.records) {
                    self.fingerprint.record(&req.append.records[off..off + RECORD_HEAD]);
                    let ev = EventRef::trusted(payload);
                    match &mut run {
                        Some((_, n, prev)) if prev.names() == ev.names() => *n += 1,
                        _ => {
                            if let Some((first, n, prev)) = run.replace((pos, 1, ev)) {
                                self.index.absorb_run(first, n, &prev);
                                self.tips.absorb_run(first, first + n as u64 - 1, &prev);
                            }
                        }
                    }
                    pos += 1;
                }
            }
        }
        if let Some((first, n, prev)) = run {
            self.index.absorb_run(first, n, &prev);
            self.tips.absorb_run(first, first + n as u64 - 1, &prev);
        }
        self.next = highest + 1;
        self.tips.trim(highest);
        self.shared.publish(highest);
        let mut m = self.metrics.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = m.fsync_us.record((sync_time.as_micros() as u64).max(1));
        let _ = m.batch_events.record(n_staged.max(1));
        m.commits += 1;
        Ok(())
    }
}

// The commit's write and sync are plain blocking system calls, not glommio's io_uring ones.
// The writer runs alone on its executor (`Store::open`'s `tephra-writer`, and the server's), so
// blocking it stalls nothing else. Through io_uring both operations are punted to an io-wq
// kernel worker (ext4 does not complete an O_DIRECT write without blocking, and fsync always
// blocks): two extra thread hand-offs per commit, each a wake-up that waits for a CPU. With
// 16 writers × batch 1 on 2 CPUs that made the write take ~240 µs at p50 instead of ~150 µs
// (and the whole commit ~420 µs), the dominant cost of an unbatched append.

/// `pwrite(2)` of the aligned `buf` at `pos` on `file` (O_DIRECT), retried on EINTR.
fn pwrite_blocking(file: &DmaFile, buf: &[u8], pos: u64) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is a live, initialised slice for the whole call.
        let n = unsafe { libc::pwrite(file.as_raw_fd(), buf.as_ptr().cast(), buf.len(), pos as libc::off_t) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `fdatasync(2)` of `file`, retried on EINTR.
fn fdatasync_blocking(file: &DmaFile) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: a plain system call on a descriptor `file` owns.
        if unsafe { libc::fdatasync(file.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends results: one-shots directly, batched sinks once per sink per commit.
fn deliver(results: impl Iterator<Item = (ReplyTo, AppendResult)>) {
    let mut groups: Vec<(flume::Sender<Vec<(u64, AppendResult)>>, Vec<(u64, AppendResult)>)> = Vec::new();
    for (reply, res) in results {
        match reply {
            ReplyTo::Oneshot(tx) => {
                let _ = tx.send(res);
            }
            ReplyTo::Batched { sink, token } => match groups.iter_mut().find(|(s, _)| s.same_channel(&sink)) {
                Some((_, v)) => v.push((token, res)),
                None => groups.push((sink, vec![(token, res)])),
            },
        }
    }
    for (sink, v) in groups {
        let _ = sink.send(v);
    }
}
