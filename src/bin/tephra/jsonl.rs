//! The JSON-lines event format shared by `export`, `import`, `append --stdin` and the
//! `--json` output of `read` and `subscribe`.
//!
//! One event per line:
//! `{"position":7,"type":"Registered","tags":["username:alice"],"payload":"{\"n\":1}"}`.
//! The payload is a UTF-8 string under `payload`, or base64 (standard alphabet, padded)
//! under `payload_base64` when it is not valid UTF-8. On input `position` is optional and
//! ignored, `tags` defaults to none, a missing payload is empty, and any other field is an
//! error. Blank lines are skipped.

use std::io::BufRead;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tephra::{Event, EventType, Tags};

#[derive(Serialize)]
struct EventOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    position: Option<u64>,
    #[serde(rename = "type")]
    ty: &'a str,
    tags: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventIn {
    #[allow(dead_code)]
    position: Option<u64>,
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    tags: Vec<String>,
    payload: Option<String>,
    payload_base64: Option<String>,
}

/// One event as a JSON line (without the newline).
pub fn event_line(position: Option<u64>, event: &Event) -> String {
    let data = event.data();
    let (payload, payload_base64) = match std::str::from_utf8(data) {
        Ok(s) => (Some(s), None),
        Err(_) => (None, Some(STANDARD.encode(data))),
    };
    let out = EventOut { position, ty: event.event_type(), tags: event.tags().collect(), payload, payload_base64 };
    serde_json::to_string(&out).expect("serialising plain data cannot fail")
}

/// Parses one line into an event. The error text does not name the line.
pub fn parse_event(line: &str) -> Result<Event, String> {
    let raw: EventIn = serde_json::from_str(line).map_err(|e| {
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let text = text.strip_suffix(&suffix).unwrap_or(&text);
        format!("invalid JSON at column {}: {text}", e.column())
    })?;
    let payload = match (raw.payload, raw.payload_base64) {
        (Some(_), Some(_)) => return Err("both \"payload\" and \"payload_base64\" are set".into()),
        (Some(s), None) => s.into_bytes(),
        (None, Some(b)) => STANDARD.decode(b.trim()).map_err(|e| format!("\"payload_base64\" is not base64: {e}"))?,
        (None, None) => Vec::new(),
    };
    let ty = EventType::new(raw.ty).map_err(|e| format!("invalid event: {e}"))?;
    let tags = Tags::new(raw.tags).map_err(|e| format!("invalid event: {e}"))?;
    Event::new(&ty, &tags, &payload).map_err(|e| format!("invalid event: {e}"))
}

/// Parses every line of `input`, all or nothing.
///
/// # Errors
/// `line N: why` for the first unreadable or invalid line (1-based).
pub fn parse_all(input: impl BufRead) -> Result<Vec<Event>, String> {
    parse_from(input, 0).map(|p| p.events)
}

/// The events of a JSON-lines input and where each came from.
#[derive(Debug)]
pub struct Parsed {
    /// The events, in input order.
    pub events: Vec<Event>,
    /// Each event's line number in the input (1-based, counting skipped and blank lines).
    pub lines: Vec<usize>,
    /// How many lines the input has in all, skipped ones included.
    pub line_count: usize,
}

/// As [`parse_all`], after skipping the first `skip` lines unread (not even checked), with
/// each event's line number in the whole input (1-based; blank lines are skipped too, so
/// the numbers differ from the events' indexes).
///
/// # Errors
/// As [`parse_all`].
pub fn parse_from(input: impl BufRead, skip: usize) -> Result<Parsed, String> {
    let mut parsed = Parsed { events: Vec::new(), lines: Vec::new(), line_count: 0 };
    for line in input.split(b'\n') {
        parsed.line_count += 1;
        let n = parsed.line_count;
        let line = line.map_err(|e| format!("line {n}: read error: {e}"))?;
        if n <= skip {
            continue;
        }
        let line = String::from_utf8(line).map_err(|_| format!("line {n}: not valid UTF-8"))?;
        let line = line.strip_suffix('\r').unwrap_or(&line);
        if line.trim().is_empty() {
            continue;
        }
        parsed.events.push(parse_event(line).map_err(|why| format!("line {n}: {why}"))?);
        parsed.lines.push(n);
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ty: &str, tags: &[&str], payload: &[u8]) -> Event {
        Event::new(&EventType::new(ty).unwrap(), &Tags::new(tags.iter().copied()).unwrap(), payload).unwrap()
    }

    #[test]
    fn lines_round_trip() {
        for e in [ev("A", &["b", "a"], b"{\"x\":1}"), ev("B", &[], b""), ev("C", &["k"], &[0xff, 0, 1])] {
            let line = event_line(Some(3), &e);
            assert_eq!(parse_event(&line).unwrap(), e, "{line}");
        }
        assert_eq!(event_line(Some(7), &ev("T", &["z", "a"], b"hi")), r#"{"position":7,"type":"T","tags":["a","z"],"payload":"hi"}"#);
        assert_eq!(event_line(None, &ev("T", &[], &[0xff])), r#"{"type":"T","tags":[],"payload_base64":"/w=="}"#);
    }

    #[test]
    fn errors_name_the_line() {
        let input = "{\"type\":\"A\"}\n\n{\"type\":\"B\",\"tags\":[\"x\",\"x\"]}\n";
        assert_eq!(parse_all(input.as_bytes()).unwrap_err(), "line 3: invalid event: duplicate tag 'x'");
        let err = parse_all("{\"type\":\"A\"}\n{\"type\": }\n".as_bytes()).unwrap_err();
        assert!(err.starts_with("line 2: invalid JSON at column 10: "), "{err}");
        let err = parse_all("{\"type\":\"A\",\"colour\":1}".as_bytes()).unwrap_err();
        assert!(err.starts_with("line 1: invalid JSON") && err.contains("colour"), "{err}");
        let err = parse_all("{\"type\":\"\"}".as_bytes()).unwrap_err();
        assert_eq!(err, "line 1: invalid event: event type must not be empty");
        let err = parse_all("{\"type\":\"A\",\"payload\":\"a\",\"payload_base64\":\"YQ==\"}".as_bytes()).unwrap_err();
        assert!(err.contains("both"), "{err}");
        assert_eq!(parse_all("\n  \n".as_bytes()).unwrap(), Vec::<Event>::new());
        let p = parse_from("\n{\"type\":\"A\"}\n\n{\"type\":\"B\"}\n".as_bytes(), 0).unwrap();
        assert_eq!(p.events, [ev("A", &[], b""), ev("B", &[], b"")]);
        assert_eq!((p.lines, p.line_count), (vec![2, 4], 4));
    }

    #[test]
    fn skipped_lines_are_not_read_and_keep_their_numbers() {
        let p = parse_from("not json\n{\"type\":\"A\"}\n\n{\"type\":\"B\"}".as_bytes(), 2).unwrap();
        assert_eq!(p.events, [ev("B", &[], b"")]);
        assert_eq!((p.lines, p.line_count), (vec![4], 4));
        assert_eq!(parse_from("{\"type\":\"A\"}\n".as_bytes(), 5).unwrap().line_count, 1);
    }
}
