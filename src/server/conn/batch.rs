//! The `ReadEvents` frame in the making, shared by reads and subscriptions: events go in until
//! the batch is full by the reference's measure, or until one more would not fit
//! `max_frame_len`; each batch is cut into an encoded frame.

use crate::config::ReadsSettings;
use crate::event::EventRef;
use crate::model::Position;
use crate::proto::convert;
use crate::proto::messages::response;
use crate::proto::ReadEventsEncoder;

/// Bytes a `ReadEvents` frame spends around its events (the response's request id and the
/// `kind` field's key and length): kept free when deciding whether one more event fits.
const FRAME_HEAD_ROOM: usize = 24;

/// The `ReadEvents` frames of one stream (request `id`), built one batch at a time.
pub(super) struct Batch {
    id: u64,
    max_frame_len: u32,
    enc: ReadEventsEncoder,
    /// Events in the batch in the making.
    count: usize,
    /// Bytes of those events as the engine encodes them (type, tags, payload and their
    /// lengths, as stored), not their protobuf size.
    bytes: usize,
}

impl Batch {
    /// An empty batch for request `id`, whose frames may be up to `max_frame_len` bytes.
    pub(super) fn new(id: u64, max_frame_len: u32) -> Batch {
        Batch { id, max_frame_len, enc: ReadEventsEncoder::new(), count: 0, bytes: 0 }
    }

    /// Adds the event at `p`. The batch in the making is cut into `frames` first when the
    /// event would push its frame past `max_frame_len` (its body plus up to 24 bytes of
    /// position and field framing), and after it when the batch is full by the reference's
    /// measure (docs/protocol.md §9): `server.reads.batch_events` events or `batch_bytes` bytes,
    /// checked after each event. Returns whether the batch was cut for being full.
    ///
    /// # Errors
    /// Why a frame could not be encoded (over `max_frame_len`): the stream must end there,
    /// after the frames already in `frames` ([`too_large_to_send`]).
    pub(super) fn add(&mut self, p: Position, ev: &EventRef<'_>, cfg: &ReadsSettings, frames: &mut Vec<Vec<u8>>) -> Result<bool, String> {
        let body = crate::proto::batch::event_body_len(ev) + 24;
        if !self.enc.is_empty() && self.enc.events_len() + body + FRAME_HEAD_ROOM > self.max_frame_len as usize {
            self.cut(frames)?;
        }
        self.enc.push(p, ev);
        self.count += 1;
        self.bytes += ev.as_bytes().len();
        if self.count >= cfg.batch_events || self.bytes >= cfg.batch_bytes {
            self.cut(frames)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Ends the frame in the making into `frames` (nothing when the batch is empty) and starts
    /// the next one.
    ///
    /// # Errors
    /// Why the frame could not be encoded (over `max_frame_len`); the batch is emptied anyway.
    pub(super) fn cut(&mut self, frames: &mut Vec<Vec<u8>>) -> Result<(), String> {
        if self.enc.is_empty() {
            return Ok(());
        }
        let cut = self.enc.finish(self.id, self.max_frame_len).map(|f| frames.push(f.to_vec())).map_err(|e| e.to_string());
        self.enc.clear();
        self.count = 0;
        self.bytes = 0;
        cut
    }

    /// Gives back the memory of an empty batch (a read's batch once queued).
    pub(super) fn shrink(&mut self) {
        debug_assert!(self.enc.is_empty());
        self.enc = ReadEventsEncoder::new();
    }
}

/// The error that ends a read or subscription whose next event does not fit one frame.
pub(super) fn too_large_to_send(e: impl std::fmt::Display) -> response::Kind {
    response::Kind::Error(convert::internal_error(format!("event too large to send: {e} (raise server.max_frame_len to read it)")))
}

#[cfg(test)]
mod tests {
    use super::Batch;
    use crate::config::ReadsSettings;
    use crate::proto::messages::response;
    use crate::{Event, EventType, Position, Tags};

    /// The positions in each `ReadEvents` frame, and the frames' body lengths.
    fn decoded(frames: &[Vec<u8>]) -> (Vec<Vec<u64>>, Vec<usize>) {
        let positions = frames
            .iter()
            .map(|f| match <crate::proto::Response as prost::Message>::decode(&f[4..]).unwrap().kind {
                Some(response::Kind::ReadEvents(b)) => b.events.iter().map(|e| e.position).collect(),
                other => panic!("{other:?}"),
            })
            .collect();
        (positions, frames.iter().map(|f| f.len() - 4).collect())
    }

    /// Reads and subscriptions frame alike: a batch is cut once it holds `batch_events`, before
    /// an event that would push its frame past `max_frame_len`, and never empty; an event that
    /// fits no frame is an error.
    #[test]
    fn a_batch_is_cut_when_full_and_before_it_outgrows_a_frame() {
        let ev = Event::new(&EventType::new("E").unwrap(), &Tags::new(["t"]).unwrap(), &[7u8; 100]).unwrap();
        let cfg = ReadsSettings { batch_events: 3, batch_bytes: usize::MAX, ..ReadsSettings::default() };
        let mut frames = Vec::new();
        let mut b = Batch::new(9, 1 << 20);
        let full: Vec<bool> = (1..=7).map(|p| b.add(Position(p), &ev.as_ref(), &cfg, &mut frames).unwrap()).collect();
        assert_eq!(full, [false, false, true, false, false, true, false]);
        b.cut(&mut frames).unwrap();
        b.cut(&mut frames).unwrap();
        let (positions, lens) = decoded(&frames);
        assert_eq!(positions, [vec![1, 2, 3], vec![4, 5, 6], vec![7]]);
        // A frame cap below three events' frame: no frame goes over it, every event is sent.
        let cap = lens[0] as u32 - 1;
        let cfg = ReadsSettings { batch_events: 100, ..cfg };
        let (mut frames, mut b) = (Vec::new(), Batch::new(9, cap));
        for p in 1..=7 {
            assert!(!b.add(Position(p), &ev.as_ref(), &cfg, &mut frames).unwrap());
        }
        b.cut(&mut frames).unwrap();
        let (positions, lens) = decoded(&frames);
        assert!(positions.len() > 2 && lens.iter().all(|&l| l <= cap as usize), "{positions:?} {lens:?}");
        assert_eq!(positions.concat(), (1..=7).collect::<Vec<u64>>());
        // An event larger than any frame.
        let (mut frames, mut b) = (Vec::new(), Batch::new(9, 64));
        assert!(!b.add(Position(1), &ev.as_ref(), &cfg, &mut frames).unwrap());
        assert!(b.cut(&mut frames).is_err() && frames.is_empty());
    }
}
