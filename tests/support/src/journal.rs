//! A raw journal connection: protocol v1 frames carrying the journal kind (field 20), for
//! tests that check the server's answers byte for byte rather than through the client
//! library (docs/journals.md §6).

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tephra::proto::*;

/// A connection that has said Hello and sends one journal call at a time.
pub struct JournalConn {
    stream: TcpStream,
    next: u64,
}

/// A journal named by its two ids.
pub type Ids = (u64, u64);

impl JournalConn {
    /// Connects to `addr` and says Hello (no token).
    ///
    /// # Panics
    /// If the connection or the Hello fails.
    pub fn open(addr: SocketAddr) -> JournalConn {
        JournalConn::try_open(addr).expect("a journal connection")
    }

    /// [`JournalConn::open`] that reports a failed connect or Hello instead of panicking.
    ///
    /// # Errors
    /// The transport's error, or `InvalidData` when the answer to the Hello is not a HelloAck.
    pub fn try_open(addr: SocketAddr) -> std::io::Result<JournalConn> {
        JournalConn::try_open_timeout(addr, Duration::from_secs(20))
    }

    /// [`JournalConn::try_open`] where the connect, the Hello and every later call each give
    /// up after `timeout` (a paused server never answers).
    ///
    /// # Errors
    /// As [`JournalConn::try_open`]; a timeout is `WouldBlock` or `TimedOut`.
    pub fn try_open_timeout(addr: SocketAddr, timeout: Duration) -> std::io::Result<JournalConn> {
        let other = |e: FrameError| std::io::Error::other(e.to_string());
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        write_frame(&mut stream, &Request::hello(1, None), DEFAULT_MAX_FRAME_LEN).map_err(other)?;
        let ack: Option<Response> = read_message(&mut stream, DEFAULT_MAX_FRAME_LEN).map_err(other)?;
        match ack {
            Some(Response { kind: Some(response::Kind::HelloAck(_)), .. }) => Ok(JournalConn { stream, next: 2 }),
            other => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("expected a HelloAck, got {other:?}"))),
        }
    }

    /// Sends one call and returns its answer.
    ///
    /// # Errors
    /// The transport's error, or `UnexpectedEof` when the server closed the connection: the
    /// call is then ambiguous.
    pub fn try_call(&mut self, call: journal_request::Call) -> std::io::Result<JournalResponse> {
        let id = self.next;
        self.next += 1;
        let req = Request::new(id, request::Kind::Journal(JournalRequest { call: Some(call) }));
        write_frame(&mut self.stream, &req, DEFAULT_MAX_FRAME_LEN).map_err(|e| std::io::Error::other(e.to_string()))?;
        let resp: Response = read_message(&mut self.stream, DEFAULT_MAX_FRAME_LEN)
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        assert_eq!(resp.request_id, id);
        match resp.kind {
            Some(response::Kind::Journal(j)) => Ok(j),
            other => panic!("expected a journal response, got {other:?}"),
        }
    }

    /// [`JournalConn::try_call`] that must get an answer.
    ///
    /// # Panics
    /// When no answer comes.
    pub fn call(&mut self, call: journal_request::Call) -> JournalResponse {
        self.try_call(call).expect("a journal answer")
    }

    /// Creates `tenant/journal` and returns its ids.
    ///
    /// # Panics
    /// Unless the answer is `CREATED`.
    pub fn create(&mut self, tenant: &str, journal: &str, mode: JournalMode, durability: JournalDurability) -> Ids {
        let r = self.call(journal_request::Call::Create(JournalCreate {
            tenant_name: tenant.into(),
            journal_name: journal.into(),
            mode: mode as i32,
            durability: durability as i32,
            survive: None,
        }));
        assert_eq!(r.outcome(), JournalOutcome::Created, "{r:?}");
        (r.tenant, r.journal)
    }

    /// A write: single-writer under `leader`, or multi-writer with `leader` 0.
    pub fn write(&mut self, j: Ids, leader: u128, seq: u64, records: &[&[u8]]) -> JournalResponse {
        self.call(write_call(j, leader, seq, records))
    }

    /// `SetLeader(new, old)`, `old` 0 for none.
    pub fn set_leader(&mut self, j: Ids, new: u128, old: u128) -> JournalResponse {
        self.call(journal_request::Call::SetLeader(JournalSetLeader { tenant: j.0, journal: j.1, new: new.to_be_bytes().to_vec(), old: uuid_bytes(old) }))
    }

    /// `Truncate(up_to)`: fenced by `leader`, or multi-writer with `leader` 0.
    pub fn truncate(&mut self, j: Ids, leader: u128, up_to: u64) -> JournalResponse {
        self.call(journal_request::Call::Truncate(JournalTruncate { tenant: j.0, journal: j.1, up_to, leader: uuid_bytes(leader) }))
    }

    /// Deletes the journal.
    pub fn delete(&mut self, j: Ids) -> JournalResponse {
        self.call(journal_request::Call::Delete(JournalDelete { tenant: j.0, journal: j.1 }))
    }

    /// `Read(from, limit, wait_ms)`.
    pub fn read(&mut self, j: Ids, from: u64, limit: u64, wait_ms: u64) -> JournalResponse {
        self.call(journal_request::Call::Read(JournalRead { tenant: j.0, journal: j.1, from_seq: from, limit, wait_ms }))
    }
}

/// The write call of [`JournalConn::write`].
pub fn write_call(j: Ids, leader: u128, seq: u64, records: &[&[u8]]) -> journal_request::Call {
    journal_request::Call::Write(JournalWrite {
        tenant: j.0,
        journal: j.1,
        leader: uuid_bytes(leader),
        seq,
        records: records.iter().map(|r| r.to_vec()).collect(),
    })
}

/// A uuid as it travels: empty for 0, else 16 bytes big-endian.
pub fn uuid_bytes(u: u128) -> Vec<u8> {
    if u == 0 {
        Vec::new()
    } else {
        u.to_be_bytes().to_vec()
    }
}

/// The leader named by an answer's state (0 for none).
pub fn leader_of(r: &JournalResponse) -> u128 {
    let l = &r.state.as_ref().expect("an answer with a state").leader;
    if l.is_empty() {
        0
    } else {
        u128::from_be_bytes(l.as_slice().try_into().unwrap())
    }
}
