//! Protocol v1 (`package tephra.v1`): messages, framing and conversions.
//!
//! Pure code with no runtime: the server and the clients drive their own I/O.
//!
//! - [`messages`] (re-exported here): every request and response message, hand-written
//!   `prost` derives, field numbers per spec §1.3.
//! - [`frame`]: the 4-byte big-endian length prefix framing (spec §1.2), a sans-IO
//!   [`FrameDecoder`] and blocking/async helpers.
//! - [`convert`]: wire <-> model conversion with the reference's refusal texts, and the
//!   error responses of spec §1.6/§1.9.
//! - [`batch`]: a copy-once `ReadEvents` frame encoder for the read path.
//!
//! Spec references are to `reference/tephra-protocol-server.md`.

pub mod append;
pub mod batch;
pub mod convert;
pub mod frame;
pub mod messages;

pub use batch::ReadEventsEncoder;
pub use frame::{
    encode_frame, read_frame, read_frame_async, read_message, read_message_async, write_frame, write_frame_async,
    FrameDecoder, FrameError, DEFAULT_MAX_FRAME_LEN,
};
pub use messages::*;

/// The only protocol version (spec §1.4): a Hello must carry it and a HelloAck echoes it.
pub const PROTOCOL_VERSION: u32 = 1;
