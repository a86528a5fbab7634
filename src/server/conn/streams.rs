//! A connection's streams: reads (`ReadEvents` batches then `ReadEnd`) and subscriptions
//! (catch-up, `CaughtUp`, then live events), each on the shard's bulk task queue, framed by
//! [`Batch`] and queued on the bulk lane.

use super::batch::{too_large_to_send, Batch};
use super::Conn;
use crate::model::QueryMatcher;
use crate::proto::convert::{self, text};
use crate::proto::messages::response;
use crate::proto::{self as pb};
use crate::read::Step;
use shards::sync::Permit;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Query items from which a query is freed on a blocking thread ([`shards::drop_detached`])
/// rather than on the shard, which it would hold up (~60 ns per item).
const WIDE_QUERY_ITEMS: usize = 4096;

/// Lets go of a read's or subscription's query once it is done: a wide one is freed on a
/// blocking thread (if this was its last reference).
fn release(query: Arc<QueryMatcher>) {
    if query.width() >= WIDE_QUERY_ITEMS {
        shards::drop_detached(query);
    }
}

/// Reads of one connection that build a batch at the same time (see `Conn::stream_read`).
pub(super) const READ_SLOTS: u64 = 4;

/// Positions a read or a subscription's catch-up may scan without a match before it checks
/// whether the shard's other work is due (each costs about 0.1 µs: ~50 µs per step).
const READ_STEP: usize = 512;

impl Conn {
    /// Admits a read (running, queued, or refused past `max_inflight_per_conn` of each) and
    /// streams it on the bulk queue.
    pub(super) async fn read(self: Rc<Self>, id: u64, r: pb::ReadRequest, query: Result<Arc<QueryMatcher>, convert::ConvertError>) {
        let query = match query {
            Ok(q) => q,
            Err(e) => return self.lanes.error(id, e.to_error_response()).await,
        };
        // Admission never blocks the reader: a running slot, else a queued slot, else refuse.
        let run_permit = self.read_budget.try_acquire(1);
        let overflow = if run_permit.is_none() {
            match self.read_overflow.try_acquire(1) {
                Some(p) => Some(p),
                None => {
                    release(query);
                    return self.lanes.error(id, convert::bad_request(text::TOO_MANY_READS)).await;
                }
            }
        } else {
            None
        };
        // Pinned now, in request order: a read sees exactly what was durable when it arrived,
        // not an append pipelined after it on this connection that commits before the read's
        // first step (planning waits for that step).
        let reads = if r.reverse {
            self.ctx.store.read_back_prepared(query.clone(), crate::model::Position(r.after), r.limit).without_waiting()
        } else {
            self.ctx.store.read_prepared(query.clone(), crate::model::Position(r.after), r.limit).without_waiting()
        };
        let cancel = self.register_cancel(id);
        self.inflight.set(self.inflight.get() + 1);
        let me = self.clone();
        shards::spawn_bulk(async move {
            let permit = match run_permit {
                Some(p) => Some(p),
                None => {
                    // Queued: until a running slot frees up, or the read is abandoned (cancelled,
                    // its connection closed, the server shutting down).
                    let p = futures_lite::future::or(async { me.read_budget.acquire(1).await }, async {
                        me.abandoned(&cancel).await;
                        None
                    })
                    .await;
                    drop(overflow);
                    p
                }
            };
            // Planning a read (its first step) costs something too: a burst of new reads takes
            // its turn with the running ones rather than all planning before the executor
            // looks at I/O.
            shards::bulk_yield().await;
            if permit.is_some() && !cancel.get() {
                me.stream_read(id, reads, &cancel).await;
            } else {
                // Abandoned before it ran: its clone of the query goes first, so that `release`
                // holds the last reference and a wide one is freed off the shard.
                drop(reads);
            }
            me.unregister_cancel(id, &cancel);
            me.inflight.set(me.inflight.get() - 1);
            drop(permit);
            release(query);
        });
    }

    /// Fetches the range a read stopped at (it is on the disk) on a blocking thread while this
    /// shard serves its other connections; `None` if the fetch panicked (the read then stops
    /// at the same range again) or the read was cancelled (its connection closed, the client
    /// cancelled it, the server is shutting down) meanwhile: a fetch still queued then never
    /// runs, so abandoned reads do not hold up the blocking threads (review: 30 abandoned cold
    /// reads of large events held a new read up for 4 s on a throttled disk).
    async fn fetch(&self, mut warm: crate::read::ColdRange, cancel: &Cell<bool>) -> Option<crate::read::ColdRange> {
        self.ctx.read_disk_fetches.fetch_add(1, Ordering::Relaxed);
        let fetched = shards::run_blocking(move || {
            warm.run();
            warm
        });
        futures_lite::future::or(fetched, async {
            self.abandoned(cancel).await;
            None
        })
        .await
    }

    /// Returns once the request behind `cancel` is abandoned: cancelled (by the client, or by
    /// its connection closing) or the server is shutting down. Woken by the connection's
    /// [`Conn::cancelled`] and the shutdown, never by a timer: hundreds of queued reads on a
    /// connection cost nothing while they wait (review: their 20 ms polls, 512 reads on each
    /// of 60 connections, kept both CPUs busy).
    pub(super) async fn abandoned(&self, cancel: &Cell<bool>) {
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            let l = self.cancelled.listen();
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            futures_lite::future::or(l, self.ctx.wait_shutdown()).await;
        }
    }

    /// Waits for one of the connection's [`READ_SLOTS`]; `None` once the read is cancelled
    /// (or the server shuts down) meanwhile.
    async fn read_slot(&self, cancel: &Cell<bool>) -> Option<Permit> {
        if let Some(p) = self.read_slots.try_acquire(1) {
            return Some(p);
        }
        futures_lite::future::or(async { self.read_slots.acquire(1).await }, async {
            self.abandoned(cancel).await;
            None
        })
        .await
    }

    /// Streams a read as `ReadEvents` batches then `ReadEnd`; stops silently on cancel.
    ///
    /// Each batch is built while holding one of the connection's [`READ_SLOTS`], given back
    /// with the batch's buffers once the batch is queued: however many reads a connection has
    /// running (up to `max_inflight_per_conn`), at most that many hold a batch in the making or
    /// wait for room in the bulk lane (review: 512 reads on a client that never read its socket
    /// held ~600 MB per connection, each with its own half-built batch).
    async fn stream_read(&self, id: u64, mut reads: crate::read::Reads, cancel: &Cell<bool>) {
        let watermark = reads.watermark().get();
        let cfg = &self.ctx.settings.server.reads;
        let mut batch = Batch::new(id, self.lanes.max_frame_len);
        let mut frames = Vec::new();
        let mut budget = READ_STEP;
        let mut slot = None;
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            if slot.is_none() {
                slot = self.read_slot(cancel).await;
                if slot.is_none() {
                    return;
                }
            }
            let (cut, done) = match reads.step(&mut budget) {
                Step::Blocked(warm) => {
                    if let Some(warm) = self.fetch(warm, cancel).await {
                        reads.fetched(warm);
                    }
                    continue;
                }
                Step::Pending => {
                    // A long non-matching stretch: let the shard's other work run.
                    budget = READ_STEP;
                    shards::bulk_yield().await;
                    continue;
                }
                Step::End => (batch.cut(&mut frames).map(|()| true), true),
                Step::Failed(e) => {
                    // The events before the failure go out first (when they can be encoded).
                    if batch.cut(&mut frames).is_ok() && !self.send_frames(&mut frames, cancel).await {
                        return;
                    }
                    self.stream_bulk(id, response::Kind::Error(convert::internal_error(e)), cancel).await;
                    return;
                }
                // Every frame stays within max_frame_len: the batch sends what it has first.
                Step::Event(p, ev) => (batch.add(p, &ev, cfg, &mut frames), false),
            };
            if !self.send_frames(&mut frames, cancel).await {
                return;
            }
            let full = match cut {
                Ok(full) => full,
                Err(e) => {
                    self.stream_bulk(id, too_large_to_send(e), cancel).await;
                    return;
                }
            };
            if full && !done {
                // Queued: give the slot back, and the memory with it.
                slot = None;
                batch.shrink();
                reads.release_window();
            }
            if done {
                self.stream_bulk(id, response::Kind::ReadEnd(pb::ReadEnd { watermark }), cancel).await;
                return;
            }
            shards::bulk_yield().await;
        }
    }

    /// Queues a read's or subscription's bulk frame once the lane has room, or gives up once
    /// the stream is abandoned (cancelled, its connection closing, a shutdown): a cancel ends a
    /// stream that waits for room toward a client that does not read (review: such a
    /// subscription outlived its cancel and kept its slot under the subscription cap). `false`
    /// when it gave up or the connection is going away.
    async fn stream_frame(&self, f: Vec<u8>, cancel: &Cell<bool>) -> bool {
        futures_lite::future::or(self.lanes.bulk_frame(f), async {
            self.abandoned(cancel).await;
            false
        })
        .await
    }

    /// [`Conn::stream_frame`] of a response to encode (the stream's batches, its end or its
    /// error: every bulk frame of a stream goes through here or `stream_frame`).
    async fn stream_bulk(&self, id: u64, kind: response::Kind, cancel: &Cell<bool>) -> bool {
        match self.lanes.encode(id, kind) {
            Some(f) => self.stream_frame(f, cancel).await,
            None => false,
        }
    }

    /// Queues `frames` in order ([`Conn::stream_frame`]), leaving `frames` empty; `false` when
    /// the stream gave up.
    async fn send_frames(&self, frames: &mut Vec<Vec<u8>>, cancel: &Cell<bool>) -> bool {
        for f in frames.drain(..) {
            if !self.stream_frame(f, cancel).await {
                return false;
            }
        }
        true
    }

    /// Admits a subscription (up to `server.subscriptions.max_concurrent` per connection) and
    /// runs it on the bulk queue.
    pub(super) async fn subscribe(self: Rc<Self>, id: u64, s: pb::SubscribeRequest, query: Result<Arc<QueryMatcher>, convert::ConvertError>) {
        let query = match query {
            Ok(q) => q,
            Err(e) => return self.lanes.error(id, e.to_error_response()).await,
        };
        if self.subscriptions.get() >= self.ctx.settings.server.subscriptions.max_concurrent {
            release(query);
            return self.lanes.error(id, convert::bad_request(text::TOO_MANY_SUBSCRIPTIONS)).await;
        }
        self.subscriptions.set(self.subscriptions.get() + 1);
        self.ctx.active_subscriptions.fetch_add(1, Ordering::SeqCst);
        let cancel = self.register_cancel(id);
        let me = self.clone();
        // Woken by the writer's thread when new events are published (spawn_bulk makes that
        // wake-up reach a sleeping shard).
        shards::spawn_bulk(async move {
            me.run_subscription(id, query.clone(), crate::model::Position(s.after), &cancel).await;
            release(query);
            me.unregister_cancel(id, &cancel);
            me.subscriptions.set(me.subscriptions.get() - 1);
            me.ctx.active_subscriptions.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Runs a subscription: catch-up in reference-sized polls, `CaughtUp` once at the live
    /// edge, then each new event as it is published, until cancelled.
    async fn run_subscription(&self, id: u64, query: Arc<QueryMatcher>, after: crate::model::Position, cancel: &Cell<bool>) {
        shards::bulk_yield().await;
        // Records that must come from the disk are fetched on a blocking thread, never on
        // this shard's (which serves other connections meanwhile).
        let mut sub = self.ctx.store.subscribe_prepared(query, after).without_waiting();
        let cfg = &self.ctx.settings.server.reads;
        let tick = self.ctx.settings.server.subscriptions.wait_tick();
        let mut announced = false;
        let mut batch = Batch::new(id, self.lanes.max_frame_len);
        let mut frames = Vec::new();
        // Events delivered so far in the reference-sized poll under way.
        let mut in_poll = 0usize;
        loop {
            if cancel.get() || self.ctx.is_shutting_down() {
                return;
            }
            let mut failed = None;
            let mut budget = READ_STEP;
            let polled = sub.poll_within(crate::read::POLL_BATCH_EVENTS - in_poll, &mut budget, |p, ev| {
                // A frame that cannot be sent ends the subscription there: nothing after the
                // event that failed may be delivered, or a subscriber resuming from the last
                // position it saw would never get that event.
                if failed.is_none() {
                    failed = batch.add(p, &ev, cfg, &mut frames).err();
                }
            });
            // The reference frames each poll of up to POLL_BATCH_EVENTS events on its own (docs/protocol.md
            // §9); ours may stop a poll early (the step budget, a fetch from the disk)
            // and resume it, so the rest of a batch is sent only where the reference's poll
            // would have ended: that many events, the live edge, or a failure.
            let poll_ended = match &polled {
                Ok(p) => {
                    in_poll += p.delivered;
                    p.caught_up || in_poll >= crate::read::POLL_BATCH_EVENTS
                }
                Err(_) => true,
            };
            if poll_ended {
                in_poll = 0;
            }
            if failed.is_none() && poll_ended {
                failed = batch.cut(&mut frames).err();
            }
            // The frames built before a failure go out first: the subscriber gets every event
            // up to the one that failed, as a read does.
            if !self.send_frames(&mut frames, cancel).await {
                return;
            }
            let polled = match (polled, failed) {
                (Ok(p), None) => p,
                (Err(e), _) => {
                    self.stream_bulk(id, response::Kind::Error(convert::internal_error(e)), cancel).await;
                    return;
                }
                (_, Some(e)) => {
                    self.stream_bulk(id, too_large_to_send(e), cancel).await;
                    return;
                }
            };
            if polled.delivered > 0 || !polled.caught_up {
                if polled.delivered > 0 {
                    announced = false;
                }
                match sub.take_cold_range() {
                    Some(warm) => {
                        if let Some(warm) = self.fetch(warm, cancel).await {
                            sub.fetched(warm);
                        }
                    }
                    None => shards::bulk_yield().await,
                }
                continue;
            }
            if !announced {
                if !self.stream_bulk(id, response::Kind::CaughtUp(pb::SubscribeCaughtUp { watermark: sub.position().get() }), cancel).await {
                    return;
                }
                announced = true;
            }
            let _ = futures_lite::future::or(async { Some(sub.wait().await) }, async {
                shards::sleep(tick).await;
                None
            })
            .await;
        }
    }
}
