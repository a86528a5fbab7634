//! The append workload of the reference's published table (docs/benchmarks.md §2,
//! after the reference's harness): every request is a batch of `batch` events of
//! `event_size` zero bytes; all events of a request share one tag and one type; the tag
//! is `stream-<uuid>-`, renewed every [`APPENDS_PER_STREAM`] appends; the type rotates
//! through `test-0` .. `test-9`. A conditional request carries the condition
//! `{tag, type}` with `after = 0`. That pair has never been written before, so the guard
//! never fires: the run measures the guarded path without conflicts.

use tephra::proto::{self, convert};
use tephra::{AppendCondition, Event, EventType, Query, QueryItem, Tags};

/// How many appends share one `stream-<uuid>-` tag before it is renewed.
pub const APPENDS_PER_STREAM: u64 = 10;

/// The number of rotating event types (`test-0` .. `test-9`).
pub const TYPE_COUNT: usize = 10;

/// What one writer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Events per append request.
    pub batch: usize,
    /// Payload bytes per event (all zero).
    pub event_size: usize,
    /// Guard every append with the never-firing `{tag, type}` condition.
    pub conditional: bool,
}

/// One ready-to-send append request.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// The event, repeated `count` times (one tag, one type).
    pub event: Event,
    /// Events in the request (the batch size).
    pub count: usize,
    /// The condition, for a conditional workload.
    pub condition: Option<AppendCondition>,
}

/// Generates the requests of one writer. Cheap: one uuid per ten appends, the type names
/// are built once, and the payload is shared.
#[derive(Debug)]
pub struct Generator {
    spec: WorkloadSpec,
    types: Vec<EventType>,
    payload: Vec<u8>,
    tags: Option<Tags>,
    n: u64,
}

impl AppendRequest {
    /// The request's events, by reference.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        std::iter::repeat_n(&self.event, self.count)
    }
}

impl Generator {
    /// A generator for `spec`.
    ///
    /// # Panics
    /// Never for the fixed names it uses.
    pub fn new(spec: WorkloadSpec) -> Generator {
        let types = (0..TYPE_COUNT).map(|i| EventType::new(format!("test-{i}")).expect("valid type name")).collect();
        Generator { spec, types, payload: vec![0u8; spec.event_size], tags: None, n: 0 }
    }

    /// The spec this generator follows.
    pub fn spec(&self) -> WorkloadSpec {
        self.spec
    }

    /// Moves to the next append: its type index and tags.
    fn advance(&mut self) -> (usize, Tags) {
        if self.n % APPENDS_PER_STREAM == 0 || self.tags.is_none() {
            let tag = format!("stream-{}-", uuid::Uuid::new_v4());
            self.tags = Some(Tags::new([tag]).expect("valid tag"));
        }
        let ty = (self.n % TYPE_COUNT as u64) as usize;
        self.n += 1;
        (ty, self.tags.clone().expect("set above"))
    }

    fn condition(&self, ty: usize, tags: &Tags) -> Option<AppendCondition> {
        self.spec.conditional.then(|| AppendCondition::new(Query::item(QueryItem::new(vec![self.types[ty].clone()], tags.clone()))))
    }

    /// The next request as model values (for [`tephra::client::Client::append`]).
    ///
    /// # Errors
    /// The event encoder's refusal (e.g. an event larger than the codec allows).
    pub fn next_request(&mut self) -> Result<AppendRequest, tephra::EncodeError> {
        let (ty, tags) = self.advance();
        self.build(ty, &tags)
    }

    fn build(&self, ty: usize, tags: &Tags) -> Result<AppendRequest, tephra::EncodeError> {
        let event = Event::new(&self.types[ty], tags, &self.payload)?;
        Ok(AppendRequest { event, count: self.spec.batch, condition: self.condition(ty, tags) })
    }

    /// Appends the next request to `out` as one complete wire frame (length prefix and
    /// `Request { request_id: id, append }`), without building any per-event value: the
    /// event is encoded once and its bytes repeated `batch` times. Returns the number of
    /// events in it. Byte-for-byte what prost would encode for the same request.
    pub fn next_frame(&mut self, id: u64, out: &mut Vec<u8>) -> usize {
        let (ty, tags) = self.advance();
        self.frame(ty, &tags, id, out);
        self.spec.batch
    }

    fn frame(&self, ty: usize, tags: &Tags, id: u64, out: &mut Vec<u8>) {
        let event = Event::new(&self.types[ty], tags, &self.payload).expect("the fixed workload event encodes");
        let events = vec![&event; self.spec.batch];
        let condition = self.condition(ty, tags).map(|c| convert::condition_to_proto(&c));
        proto::append::encode_append_frame(id, &events, condition.as_ref(), u32::MAX, out).expect("no frame cap");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn tags_renew_every_ten_appends_and_types_rotate() {
        let mut g = Generator::new(WorkloadSpec { batch: 3, event_size: 256, conditional: true });
        let mut tags = Vec::new();
        for i in 0..25 {
            let r = g.next_request().unwrap();
            assert_eq!(r.events().count(), 3);
            let e = &r.event;
            assert_eq!(e.event_type(), format!("test-{}", i % 10));
            assert_eq!(e.data().len(), 256);
            assert!(e.data().iter().all(|b| *b == 0));
            let t: Vec<String> = e.tags().map(str::to_owned).collect();
            assert_eq!(t.len(), 1);
            assert!(t[0].starts_with("stream-") && t[0].ends_with('-'));
            assert!(r.condition.is_some());
            tags.push(t[0].clone());
        }
        assert!(tags[..10].iter().all(|t| *t == tags[0]));
        assert_ne!(tags[10], tags[9]);
        assert!(tags[10..20].iter().all(|t| *t == tags[10]));
        assert_ne!(tags[20], tags[10]);
    }

    #[test]
    fn raw_frames_equal_what_prost_encodes() {
        for (batch, conditional) in [(1, true), (3, false), (64, true)] {
            let g = Generator::new(WorkloadSpec { batch, event_size: 256, conditional });
            let tags = Tags::new(["stream-x-"]).unwrap();
            let model = g.build(4, &tags).unwrap();
            let expected = proto::Request::new(
                77,
                proto::request::Kind::Append(proto::AppendRequest {
                    events: model.events().map(convert::event_to_proto).collect(),
                    condition: model.condition.as_ref().map(convert::condition_to_proto),
                }),
            );
            let mut want = Vec::new();
            proto::encode_frame(&expected, proto::DEFAULT_MAX_FRAME_LEN, &mut want).unwrap();
            let mut got = Vec::new();
            g.frame(4, &tags, 77, &mut got);
            assert_eq!(got, want, "batch {batch} conditional {conditional}");
            assert_eq!(proto::Request::decode(&got[4..]).unwrap(), expected);
        }
    }

    #[test]
    fn unconditional_has_no_condition() {
        let mut g = Generator::new(WorkloadSpec { batch: 1, event_size: 0, conditional: false });
        assert!(g.next_request().unwrap().condition.is_none());
    }
}
