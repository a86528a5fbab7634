//! A raw protocol connection (frames in, frames out, nothing else) for wire-level checks.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use prost::Message;
use tephra::proto::{self, FrameDecoder, Request, Response};

/// A raw protocol connection: frames in, frames out, nothing else.
pub struct RawConn {
    /// The socket.
    pub stream: TcpStream,
    /// What has been read of the next frame.
    pub dec: FrameDecoder,
}

impl RawConn {
    /// Connects with `TCP_NODELAY` and a 10 s read timeout (so a broken test fails instead
    /// of hanging).
    pub fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        RawConn { stream, dec: FrameDecoder::new(u32::MAX) }
    }

    /// Connects and completes a token-less Hello with id 1.
    pub fn connect_hello(addr: SocketAddr) -> RawConn {
        let mut c = RawConn::connect(addr);
        c.send(&Request::hello(1, None));
        let ack = c.recv().expect("hello ack");
        assert!(matches!(ack.kind, Some(proto::response::Kind::HelloAck(_))), "{ack:?}");
        c
    }

    /// Sends one message as a frame.
    pub fn send<M: Message>(&mut self, msg: &M) {
        let mut buf = Vec::new();
        proto::encode_frame(msg, u32::MAX, &mut buf).unwrap();
        self.stream.write_all(&buf).unwrap();
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next response, or `None` when the server closed the connection (EOF or reset).
    ///
    /// # Panics
    /// On a timeout, a torn frame or an undecodable body.
    pub fn recv(&mut self) -> Option<Response> {
        match self.dec.read_next(&mut self.stream) {
            Ok(Some(body)) => Some(Response::decode(body).expect("decode response")),
            Ok(None) => None,
            Err(proto::FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading a response: {e}"),
        }
    }

    /// Asserts that the server closes the connection without sending another frame.
    pub fn expect_closed(&mut self) {
        if let Some(r) = self.recv() {
            panic!("expected the connection to close, got {r:?}");
        }
    }
}

/// Runs a frame-level error check: connects (with a Hello), lets `provoke` send the bad
/// input, and expects one error frame with request id 0 followed by a close. Returns that
/// error.
///
/// The reference server occasionally closes such a connection without the error frame
/// (its reply is best-effort; about 1 in 200 attempts here, more under load), so a close
/// with no frame is retried, up to 10 attempts in all. Every attempt must end in a close,
/// and any frame that does arrive must be the id-0 error.
pub fn frame_level_error(addr: SocketAddr, provoke: impl Fn(&mut RawConn)) -> proto::ErrorResponse {
    for _ in 0..10 {
        let mut raw = RawConn::connect_hello(addr);
        provoke(&mut raw);
        match raw.recv() {
            Some(r) => {
                assert_eq!(r.request_id, 0, "frame-level errors are unattributed: {r:?}");
                let Some(proto::response::Kind::Error(e)) = r.kind else { panic!("expected an error frame, got {r:?}") };
                raw.expect_closed();
                return e;
            }
            None => eprintln!("server closed without the frame-level error; retrying"),
        }
    }
    panic!("the server never sent the frame-level error in 10 attempts");
}
