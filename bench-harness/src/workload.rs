//! The append workload of the reference's published table (spec §5 of
//! `tephra-protocol-server.md`): every request is a batch of `batch` events of
//! `event_size` zero bytes; all events of a request share one tag and one type; the tag
//! is `stream-<uuid>-`, renewed every [`APPENDS_PER_STREAM`] appends; the type rotates
//! through `test-0` .. `test-9`. A conditional request carries the condition
//! `{tag, type}` with `after = 0`. That pair has never been written before, so the guard
//! never fires: the run measures the guarded path without conflicts.

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
    /// The events (one tag, one type).
    pub events: Vec<Event>,
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

impl Generator {
    /// A generator for `spec`.
    ///
    /// # Panics
    /// Never for the fixed names it uses.
    pub fn new(spec: WorkloadSpec) -> Generator {
        let types = (0..TYPE_COUNT)
            .map(|i| EventType::new(format!("test-{i}")).expect("valid type name"))
            .collect();
        Generator { spec, types, payload: vec![0u8; spec.event_size], tags: None, n: 0 }
    }

    /// The spec this generator follows.
    pub fn spec(&self) -> WorkloadSpec {
        self.spec
    }

    /// The next request. Fails only if the configured event size cannot be encoded.
    ///
    /// # Errors
    /// The event encoder's refusal (e.g. an event larger than the codec allows).
    pub fn next_request(&mut self) -> Result<AppendRequest, tephra::EncodeError> {
        if self.n % APPENDS_PER_STREAM == 0 || self.tags.is_none() {
            let tag = format!("stream-{}-", uuid::Uuid::new_v4());
            self.tags = Some(Tags::new([tag]).expect("valid tag"));
        }
        let tags = self.tags.as_ref().expect("set above");
        let ty = &self.types[(self.n % TYPE_COUNT as u64) as usize];
        self.n += 1;
        let first = Event::new(ty, tags, &self.payload)?;
        let mut events = Vec::with_capacity(self.spec.batch);
        for _ in 1..self.spec.batch {
            events.push(first.clone());
        }
        events.push(first);
        let condition = self
            .spec
            .conditional
            .then(|| AppendCondition::new(Query::item(QueryItem::new(vec![ty.clone()], tags.clone()))));
        Ok(AppendRequest { events, condition })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_renew_every_ten_appends_and_types_rotate() {
        let mut g = Generator::new(WorkloadSpec { batch: 3, event_size: 256, conditional: true });
        let mut tags = Vec::new();
        for i in 0..25 {
            let r = g.next_request().unwrap();
            assert_eq!(r.events.len(), 3);
            let e = &r.events[0];
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
    fn unconditional_has_no_condition() {
        let mut g = Generator::new(WorkloadSpec { batch: 1, event_size: 0, conditional: false });
        assert!(g.next_request().unwrap().condition.is_none());
    }
}
