//! Tephra, thread-per-core: a DCB event store server built on glommio, wire- and
//! disk-compatible with the reference Tephra server.
//!
//! Module map: [`model`] (positions, names, queries, conditions), [`event`] (the event
//! codec), [`proto`] (protocol v1), [`config`] (server settings), [`client`] (native
//! clients), and the engine and server modules built on them.

pub mod client;
pub mod cluster;
pub mod config;
pub mod event;
pub mod fault;
pub mod follow;
pub mod index;
pub mod journal;
pub mod log;
pub mod model;
pub mod proto;
pub mod read;
mod repeated;
pub mod server;
pub mod store;
#[cfg(test)]
mod testgen;
pub mod writer;

pub use event::{DecodeError, EncodeError, Event, EventRef};
pub use follow::{Follower, FollowerConfig};
pub use log::segment::SegmentConfig;
pub use model::{AppendCondition, EventType, NameError, Position, Query, QueryItem, Tag, Tags, TagsError, MAX_NAME_LEN};
pub use read::{Polled, ReadError, Reads, Step, Subscription, WaitOutcome};
pub use store::{OpenError, ReadConfig, Store, StoreConfig, StoreHandle, StoreStats};
pub use writer::condition::{ConflictClause, ConflictSite};
pub use writer::{AppendError, PositionRange, WriterConfig};
