//! The invariants, checked against a freshly restarted server and the witness.
//!
//! 1. Every acknowledged batch is present at its acknowledged positions, byte for byte.
//! 2. Positions are exactly `1..=head`: no hole, no disorder (reads, stats and watermark agree).
//! 3. Every event present was sent by a writer (its payload names a sent `seq` and the seed).
//! 4. A batch that was not acknowledged (in flight at the kill, or failed) is wholly present at
//!    consecutive positions or wholly absent; a batch rejected by its condition is absent.
//! 5. No torn record is served: every event equals the regenerated one, byte for byte.
//! 6. The next append lands at `head + 1`.
//! 7. Index-backed reads (type/tag queries, forward, backward, from a cursor, subscriptions)
//!    equal a filter of the full log.
//! 8. Conditions still see recovered events: a guard on a present tag is a CONFLICT at that
//!    event's position, `fail_if_exists` on it is ALREADY_EXISTS, absent tags pass.
//!
//! Also: what an earlier check saw (recovered, hence durable) is still there; what was served
//! to a subscriber or reader is there; claims stay unique; condition verdicts were right.

use crate::gen::{self, Rng};
use crate::witness::{Kind, Record, Witness};
use crate::workload::Ctx;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use tephra::client::{Client, ClientError, SequencedEvent, SubEvent};
use tephra::proto::ErrorCode;
use tephra::{AppendCondition, Event, Position, Query};

/// The result of a passing check.
#[derive(Debug, Default, Clone)]
pub struct Checked {
    /// `seq` of the event at each position (index 0 = position 1), probes included.
    pub seqs: Vec<u64>,
    /// Head before the probes.
    pub recovered_head: u64,
    /// Acknowledged batches verified.
    pub acked_batches: u64,
    /// Unacknowledged batches found present / absent.
    pub doubtful_present: u64,
    /// Unacknowledged batches found absent.
    pub doubtful_absent: u64,
}

struct V(Vec<String>);

impl V {
    fn push(&mut self, s: String) {
        if self.0.len() < 50 {
            self.0.push(s);
        }
    }
}

fn client(ctx: &Ctx) -> Result<Client, String> {
    crate::workload::connect_timeout(ctx.addr)
}

/// Runs every invariant; `prev` is what the previous check of this data directory returned.
///
/// # Errors
/// The violations found (at most 50).
pub fn check(ctx: &Ctx, prev: &[u64], rng: &mut Rng) -> Result<Checked, Vec<String>> {
    let mut v = V(Vec::new());
    let out = run(ctx, prev, rng, &mut v);
    match out {
        Ok(c) if v.0.is_empty() => Ok(c),
        Ok(_) => Err(v.0),
        Err(e) => {
            v.push(e);
            Err(v.0)
        }
    }
}

fn run(ctx: &Ctx, prev: &[u64], rng: &mut Rng, v: &mut V) -> Result<Checked, String> {
    let rec = Record::load(&ctx.witness_dir).map_err(|e| format!("reading the witness: {e}"))?;
    for b in &rec.bad_lines {
        v.push(format!("unparsable witness line {b}"));
    }
    let mut owner: HashMap<u64, u64> = HashMap::new();
    for b in rec.batches.values() {
        for j in 0..b.n {
            owner.insert(b.seq + j, b.seq);
        }
    }
    let mut c = client(ctx)?;
    let (all, watermark) = c.read_all(Query::all(), Position::ZERO).map_err(|e| format!("full read: {e}"))?;
    let head = all.len() as u64;
    let stats = c.stats().map_err(|e| format!("stats: {e}"))?;
    if watermark.get() != head || stats.event_count != head {
        v.push(format!("full read returned {head} events, watermark {watermark}, stats event_count {}", stats.event_count));
    }
    // 2, 3, 5: dense positions, every event sent and byte-identical.
    let mut pos_of: HashMap<u64, u64> = HashMap::with_capacity(all.len());
    let mut seqs = Vec::with_capacity(all.len());
    for (i, se) in all.iter().enumerate() {
        let pos = se.position.get();
        if pos != i as u64 + 1 {
            v.push(format!("invariant 2 (prefix): read position {pos} at index {i} (hole or disorder)"));
        }
        let seq = match gen::payload_id(se.event.data()) {
            Some((seq, seed)) if seed == ctx.seed => seq,
            _ => {
                v.push(format!("invariant 3/5: event at {pos} carries no seq of this run: {:?}", se.event));
                seqs.push(u64::MAX);
                continue;
            }
        };
        seqs.push(seq);
        let Some(b) = owner.get(&seq).and_then(|h| rec.batches.get(h)) else {
            v.push(format!("invariant 3 (no phantom): event at {pos} has seq {seq}, which no writer sent"));
            continue;
        };
        if se.event != gen::event(ctx.seed, seq, b.kind.claim()) {
            v.push(format!("invariant 5 (no torn record): event at {pos} (seq {seq}) differs from what was sent: {:?}", se.event));
        }
        if let Some(p) = pos_of.insert(seq, pos) {
            v.push(format!("seq {seq} is stored twice, at {p} and {pos}"));
        }
    }
    // 1, 4: acknowledged batches at their positions; doubtful ones all or nothing.
    let mut out = Checked { recovered_head: head, ..Checked::default() };
    for b in rec.batches.values() {
        let present: Vec<Option<u64>> = (0..b.n).map(|j| pos_of.get(&(b.seq + j)).copied()).collect();
        let count = present.iter().filter(|p| p.is_some()).count() as u64;
        if count != 0 && count != b.n {
            v.push(format!("invariant 4 (atomicity): batch seq {}..{} is partly present: {present:?} ({})", b.seq, b.seq + b.n, b.file.display()));
            continue;
        }
        if count == b.n {
            let p0 = present[0].unwrap();
            if present.iter().enumerate().any(|(j, p)| *p != Some(p0 + j as u64)) {
                v.push(format!("invariant 4 (atomicity): batch seq {} is not contiguous: {present:?}", b.seq));
            }
        }
        if let Some((first, last)) = b.acked {
            out.acked_batches += 1;
            if count == 0 {
                v.push(format!("invariant 1 (durability): acknowledged batch seq {} at {first}..={last} is missing ({})", b.seq, b.file.display()));
            } else if present[0] != Some(first) || last + 1 - first != b.n {
                v.push(format!("invariant 1 (durability): acknowledged batch seq {} at {first}..={last} found at {present:?}", b.seq));
            }
        } else if let Some((code, _)) = &b.rejected {
            if count != 0 {
                v.push(format!("batch seq {} was rejected ({code}) but is present at {present:?}", b.seq));
            }
        } else if count == 0 {
            out.doubtful_absent += 1;
        } else {
            out.doubtful_present += 1;
        }
    }
    // What an earlier check or a reader saw stays.
    if head < prev.len() as u64 {
        v.push(format!("the log shrank from {} to {head} events since the last check", prev.len()));
    }
    for (i, (a, b)) in prev.iter().zip(&seqs).enumerate() {
        if a != b {
            v.push(format!("position {} held seq {a} at the last check, now seq {b}", i + 1));
            break;
        }
    }
    for &(p, s) in &rec.seen {
        if p == 0 || p > head || seqs[p as usize - 1] != s {
            v.push(format!("position {p} was served with seq {s} but now holds {:?}", seqs.get(p as usize - 1)));
            break;
        }
    }
    // Condition verdicts, judged against the recovered log.
    verdicts(&rec, &all, &pos_of, v);
    // 7: index-backed reads equal a filter of the log.
    let present_uniq = (!seqs.is_empty()).then(|| seqs[rng.below(seqs.len() as u64) as usize]);
    let claims: Vec<u64> = rec.batches.values().filter_map(|b| b.kind.claim()).take(2).collect();
    reads_agree(&mut c, &all, gen::battery(rng, present_uniq, &claims), rng, v)?;
    // 6 and 8: probes.
    seqs.extend(probes(ctx, &mut c, &all, rng, v)?);
    out.seqs = seqs;
    Ok(out)
}

fn has_tag(e: &Event, tag: &str) -> bool {
    e.tags().any(|t| t == tag)
}

fn verdicts(rec: &Record, all: &[SequencedEvent], pos_of: &HashMap<u64, u64>, v: &mut V) {
    let mut claims: HashMap<String, u64> = HashMap::new();
    for se in all {
        for t in se.event.tags().filter(|t| t.starts_with("claim:")) {
            if let Some(p) = claims.insert(t.to_string(), se.position.get()) {
                v.push(format!("{t} is claimed twice, at {p} and {}", se.position));
            }
        }
    }
    let at = |p: u64| all.get(p.wrapping_sub(1) as usize).map(|se| &se.event);
    for b in rec.batches.values() {
        match (&b.kind, b.acked, &b.rejected) {
            (Kind::Bound { after, entity }, Some((first, _)), _) => {
                let tag = format!("entity:{entity}");
                if let Some(p) = (after + 1..first).find(|&p| at(p).is_some_and(|e| has_tag(e, &tag))) {
                    v.push(format!("boundary guard on {tag} after {after} passed at {first}, but {p} matches"));
                }
            }
            (Kind::Bound { after, entity }, None, Some((code, p)))
                if *p > 0 && (code != "CONFLICT" || *p <= *after || !at(*p).is_some_and(|e| has_tag(e, &format!("entity:{entity}")))) =>
            {
                v.push(format!("boundary guard on entity:{entity} after {after} answered {code} at {p}, which does not match"));
            }
            (Kind::Claim(k), None, Some((code, p))) => {
                let tag = format!("claim:{k}");
                // Position 0: the holder was staged in the same group commit (no durable
                // position yet); it committed with the batch, so someone holds the claim.
                let holds = if *p == 0 { claims.contains_key(&tag) } else { at(*p).is_some_and(|e| has_tag(e, &tag)) };
                if code != "ALREADY_EXISTS" || !holds {
                    v.push(format!("claim {tag} answered {code} at {p}, which does not hold it"));
                }
            }
            (Kind::Claim(k), Some((first, _)), _) if claims.get(&format!("claim:{k}")) != Some(&first) => {
                v.push(format!("claim:{k} acknowledged at {first} but held at {:?}", claims.get(&format!("claim:{k}"))));
            }
            _ => {}
        }
        let _ = pos_of;
    }
}

fn positions(evs: &[SequencedEvent]) -> Vec<u64> {
    evs.iter().map(|e| e.position.get()).collect()
}

fn reads_agree(c: &mut Client, all: &[SequencedEvent], battery: Vec<(String, Query)>, rng: &mut Rng, v: &mut V) -> Result<(), String> {
    let head = all.len() as u64;
    for (name, q) in battery {
        let want: Vec<&SequencedEvent> = all.iter().filter(|se| q.matches(&se.event.as_ref())).collect();
        let (got, _) = c.read_all(q.clone(), Position::ZERO).map_err(|e| format!("read {name}: {e}"))?;
        if got.len() != want.len() || got.iter().zip(&want).any(|(a, b)| a != *b) {
            v.push(format!(
                "invariant 7 (index = scan): {name}: server returned {} events {:?}.., a filter of the log {} {:?}..",
                got.len(),
                &positions(&got)[..got.len().min(8)],
                want.len(),
                want.iter().take(8).map(|e| e.position.get()).collect::<Vec<_>>()
            ));
            continue;
        }
        // From a cursor, with a limit, and backward.
        let after = rng.below(head + 1);
        let limit = rng.range(1, 50);
        let (got, _) = c.read(q.clone(), Position(after), Some(limit)).and_then(|s| s.collect_all()).map_err(|e| format!("read {name}: {e}"))?;
        let want_after: Vec<u64> = want.iter().map(|e| e.position.get()).filter(|&p| p > after).take(limit as usize).collect();
        if positions(&got) != want_after {
            v.push(format!("invariant 7: {name} after {after} limit {limit}: {:?} != {want_after:?}", positions(&got)));
        }
        let (back, _) = c.read_all_back(q.clone(), Position::MAX).map_err(|e| format!("read back {name}: {e}"))?;
        let mut fwd: Vec<u64> = want.iter().map(|e| e.position.get()).collect();
        fwd.reverse();
        if positions(&back) != fwd {
            v.push(format!("invariant 7: {name} backward returned {} events, forward {}", back.len(), fwd.len()));
        }
    }
    // A subscription from a random cursor catches up to exactly the filter.
    let q = gen::tag_query(&format!("shard:{}", rng.below(gen::SHARDS)));
    let after = rng.below(head + 1);
    let want: Vec<u64> = all.iter().filter(|se| se.position.get() > after && q.matches(&se.event.as_ref())).map(|e| e.position.get()).collect();
    let (stream, cancel) = c.subscribe(q, Position(after)).map_err(|e| format!("subscribe: {e}"))?;
    let mut got = Vec::new();
    for item in stream {
        match item.map_err(|e| format!("subscription: {e}"))? {
            SubEvent::Event(se) => got.push(se.position.get()),
            SubEvent::CaughtUp(_) => {
                cancel.cancel();
                break;
            }
        }
    }
    if got != want {
        v.push(format!("invariant 7: subscription after {after} caught up with {} events, a filter has {}", got.len(), want.len()));
    }
    Ok(())
}

fn probes(ctx: &Ctx, c: &mut Client, all: &[SequencedEvent], rng: &mut Rng, v: &mut V) -> Result<Vec<u64>, String> {
    let mut wit = Witness::open(&ctx.witness_dir, &format!("{}-probe.wit", ctx.tag)).map_err(|e| e.to_string())?;
    let mut appended = Vec::new();
    let mut head = all.len() as u64;
    let mut append = |c: &mut Client, cond: Option<AppendCondition>| -> Result<Result<u64, (ErrorCode, Option<u64>)>, String> {
        let seq = ctx.next_seq.fetch_add(1, Ordering::SeqCst);
        wit.sent(seq, 1, &Kind::Probe);
        match c.append(vec![gen::event(ctx.seed, seq, None)], cond) {
            Ok(r) => {
                wit.acked(seq, r.first.get(), r.last.get());
                appended.push(seq);
                Ok(Ok(r.first.get()))
            }
            Err(ClientError::Server { code, conflict_position, message, .. }) => {
                wit.rejected(seq, code.short_name(), conflict_position.map(|p| p.get()).unwrap_or(0));
                if !matches!(code, ErrorCode::Conflict | ErrorCode::AlreadyExists) {
                    return Err(format!("probe append answered {code:?}: {message}"));
                }
                Ok(Err((code, conflict_position.map(|p| p.get()))))
            }
            Err(e) => Err(format!("probe append: {e}")),
        }
    };
    // 6: the next append lands right after the recovered head.
    match append(c, None)? {
        Ok(first) if first == head + 1 => head += 1,
        other => v.push(format!("invariant 6: the first append after recovery of {head} events answered {other:?}")),
    }
    // 8: conditions against recovered events.
    if !all.is_empty() {
        let se = &all[rng.below(all.len() as u64) as usize];
        let p = se.position.get();
        let uniq = se.event.tags().find(|t| t.starts_with("uniq:")).unwrap_or("uniq:?").to_string();
        let r = append(c, Some(AppendCondition::new(gen::tag_query(&uniq))))?;
        if r != Err((ErrorCode::Conflict, Some(p))) {
            v.push(format!("invariant 8: a guard on {uniq} (recovered at {p}) answered {r:?}, expected CONFLICT at {p}"));
        }
        let r = append(c, Some(AppendCondition::exists_only(gen::tag_query(&uniq))))?;
        if r != Err((ErrorCode::AlreadyExists, Some(p))) {
            v.push(format!("invariant 8: fail_if_exists {uniq} (recovered at {p}) answered {r:?}, expected ALREADY_EXISTS at {p}"));
        }
        match append(c, Some(AppendCondition::new(gen::tag_query(&uniq)).after(Position(head))))? {
            Ok(first) if first == head + 1 => head += 1,
            r => v.push(format!("invariant 8: a guard on {uniq} after the head {head} answered {r:?}")),
        }
    }
    let absent = format!("absent:{}", rng.next_u64());
    match append(c, Some(AppendCondition::new(gen::tag_query(&absent))))? {
        Ok(first) if first == head + 1 => head += 1,
        r => v.push(format!("invariant 8: a guard on an absent tag answered {r:?}")),
    }
    match append(c, Some(AppendCondition::exists_only(gen::tag_query(&absent))))? {
        Ok(first) if first == head + 1 => {}
        r => v.push(format!("invariant 8: fail_if_exists on an absent tag answered {r:?}")),
    }
    Ok(appended)
}
