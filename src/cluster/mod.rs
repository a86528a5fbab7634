//! Replicated journals: each journal is a consensus group over 2F+1 nodes, ordered by tikv's
//! `raft` crate (its sans-IO `RawNode`), while every verdict stays ours: each node applies the
//! decided commands in order with the journal's pure `apply`, so every node answers alike.
//!
//! | module | what it holds |
//! |---|---|
//! | [`replica`] | one node's groups: proposals, peer messages, ticks in; entries and hard states to make durable, messages to send, verdicts out (sans-IO) |
//! | [`group_log`] | one group's log as consensus reads it: terms in memory, entries read back from the command log |
//! | [`durable`] | how those entries and hard states lie in the node's command log |
//! | [`snapshot`] | a journal group's snapshot: the journal's state at the snapshot's index (pure) |
//! | [`placement`] | which members vote in a journal's group (pure) |
//! | [`node`] | the loop that drives one node's replica: command log, peers, calls |
//! | [`peer`] | the frame one node sends another: many groups' consensus messages, checked on receipt |
//! | [`link`] | the peer transport: one TCP connection per node pair carrying those frames, queues that never block the sender |
//! | [`tls`] | mutual TLS 1.3 on those connections when the node serves TLS |
//!
//! The command log and the loop that drives a [`replica::Replica`] live at
//! the edges. Source: docs/journals.md §9.

pub mod durable;
pub mod group_log;
pub mod link;
pub mod node;
pub mod peer;
pub mod placement;
pub mod replica;
pub mod snapshot;
pub mod tls;
