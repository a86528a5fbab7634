//! The peer frame: what one node sends another over their one connection, many groups'
//! consensus messages at once. Our own message (prost); each consensus message inside is raft's
//! own `eraftpb.Message`, prost-encoded. Pure over bytes.
//!
//! | field | number | what |
//! |---|---:|---|
//! | `cluster` | 1 | the cluster's id: a frame from another cluster is refused whole |
//! | `from` | 2 | the sending node |
//! | `to` | 3 | the receiving node |
//! | `messages` | 4 | repeated: `tenant` (1), `journal` (2), `message` (3, raft's message bytes) |
//! | `removed` | 5 | repeated: `tenant` (1), `journal` (2), `term` (3): groups whose leader, at that term, has applied a configuration without the receiving node |
//! | `incarnation` | 6 | in a handshake ([`encode_hello`]): the incarnation of the dialer's data directory; 0 or absent: not told |
//! | `refused` | 7 | in the one frame an acceptor sends back on a handshake it refuses ([`encode_refusal`]), why: because the cluster knows the dialer's id by another data directory (the dialer stops for good), or because the handshake is of another cluster (the frame is of the acceptor's cluster; the dialer logs it) |
//!
//! Source: docs/journals.md §9.4; golden bytes in `tests/cluster_peer.rs`.

use prost_011::Message as _;
use raft::eraftpb::Message;

use super::durable::{check_entry, DurableError};
use crate::journal::JournalId;

/// One frame between two nodes.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PeerFrame {
    /// The cluster's id.
    #[prost(uint64, tag = "1")]
    pub cluster: u64,
    /// The sending node's id.
    #[prost(uint64, tag = "2")]
    pub from: u64,
    /// The receiving node's id.
    #[prost(uint64, tag = "3")]
    pub to: u64,
    /// The consensus messages, each for one group.
    #[prost(message, repeated, tag = "4")]
    pub messages: Vec<GroupMessage>,
    /// The groups whose leader says the receiving node is no longer among their voters.
    #[prost(message, repeated, tag = "5")]
    pub removed: Vec<GroupRemoved>,
    /// In a handshake: the incarnation of the dialer's data directory (0: not told).
    #[prost(uint64, tag = "6")]
    pub incarnation: u64,
    /// In an acceptor's answer to a handshake it refused for its incarnation: why (empty
    /// otherwise).
    #[prost(string, tag = "7")]
    pub refused: String,
}

/// A group's leader's word to a node that sent it a message and is not in the group's
/// configuration: the leader has applied a configuration without it, and has no change in
/// flight (docs/journals.md §9.8).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct GroupRemoved {
    /// The group's tenant.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// The group's journal.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// The leader's term.
    #[prost(uint64, tag = "3")]
    pub term: u64,
}

/// A decoded frame ([`decode_frame_removals`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The sending node.
    pub from: u64,
    /// The consensus messages, each with its group, in the frame's order.
    pub messages: Vec<(JournalId, Message)>,
    /// Each group whose leader says the receiving node is no longer a voter, with the
    /// leader's term.
    pub removed: Vec<(JournalId, u64)>,
    /// The sender's data directory incarnation, in a handshake (0: not told).
    pub incarnation: u64,
    /// The sender refused this node's handshake, saying why: the cluster knows this node's
    /// id by another data directory (empty: not a refusal).
    pub refused: String,
}

/// One consensus message for one group.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct GroupMessage {
    /// The group's tenant (0 for the directory group).
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// The group's journal (0 for the directory group).
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Raft's `eraftpb.Message`, prost-encoded.
    #[prost(bytes = "vec", tag = "3")]
    pub message: Vec<u8>,
}

/// Why a peer frame was refused. The link it came on is closed; other links go on.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PeerError {
    /// The bytes are not a peer frame.
    #[error("peer frame does not decode: {0}")]
    Malformed(String),
    /// The frame is from a node of another cluster.
    #[error("peer frame from cluster {theirs:016x}, this node is in cluster {ours:016x}")]
    ForeignCluster {
        /// The sender's cluster.
        theirs: u64,
        /// Ours.
        ours: u64,
    },
    /// The frame is addressed to another node.
    #[error("peer frame for node {to}, this is node {me}")]
    NotForMe {
        /// The addressee.
        to: u64,
        /// This node.
        me: u64,
    },
    /// A consensus message inside names another sender or addressee than the frame.
    #[error("group {group}: a message from {from} to {to} inside a frame from {frame_from} to {frame_to}")]
    Misaddressed {
        /// The group.
        group: JournalId,
        /// The message's sender.
        from: u64,
        /// The message's addressee.
        to: u64,
        /// The frame's sender.
        frame_from: u64,
        /// The frame's addressee.
        frame_to: u64,
    },
    /// A consensus message inside does not decode.
    #[error("group {group}: consensus message does not decode: {why}")]
    BadMessage {
        /// The group.
        group: JournalId,
        /// The decoder's words.
        why: String,
    },
    /// An entry inside cannot be logged for its group (not a journal command of the group).
    #[error(transparent)]
    BadEntry(#[from] DurableError),
    /// A snapshot inside whose data is not a journal snapshot, or one for the directory group
    /// (which is never compacted).
    #[error("group {group}: snapshot refused: {why}")]
    BadSnapshot {
        /// The group.
        group: JournalId,
        /// What was wrong.
        why: String,
    },
}

/// Encodes the messages `from` sends `to` in `cluster` as one frame.
pub fn encode_frame(cluster: u64, from: u64, to: u64, messages: &[(JournalId, Message)]) -> Vec<u8> {
    encode_frame_removals(cluster, from, to, messages, &[])
}

/// [`encode_frame`] that also tells `to` it is no longer a voter of each group of `removed`
/// (with the term of the group's leader, `from`).
pub fn encode_frame_removals(cluster: u64, from: u64, to: u64, messages: &[(JournalId, Message)], removed: &[(JournalId, u64)]) -> Vec<u8> {
    let messages = messages.iter().map(|(g, m)| GroupMessage { tenant: g.tenant, journal: g.journal, message: m.encode_to_vec() }).collect();
    let removed = removed.iter().map(|(g, term)| GroupRemoved { tenant: g.tenant, journal: g.journal, term: *term }).collect();
    prost::Message::encode_to_vec(&PeerFrame { cluster, from, to, messages, removed, ..PeerFrame::default() })
}

/// The handshake frame a dialer sends first: [`encode_frame`] with no messages and the
/// incarnation of the dialer's data directory (docs/journals.md §9.4).
pub fn encode_hello(cluster: u64, from: u64, to: u64, incarnation: u64) -> Vec<u8> {
    prost::Message::encode_to_vec(&PeerFrame { cluster, from, to, incarnation, ..PeerFrame::default() })
}

/// The frame an acceptor sends back, before closing the connection, on a handshake it refuses
/// because the cluster knows node `to` by another data directory than the handshake's: `why`
/// (docs/journals.md §9.4).
pub fn encode_refusal(cluster: u64, from: u64, to: u64, why: &str) -> Vec<u8> {
    prost::Message::encode_to_vec(&PeerFrame { cluster, from, to, refused: why.to_owned(), ..PeerFrame::default() })
}

/// Decodes a frame for node `me` of `cluster`: its sender and its messages, each checked to
/// be addressed as the frame is and, for an append, to carry only entries its group can log
/// (a read index request carries its context in an entry, which is never logged). The
/// frame's removals are left out: [`decode_frame_removals`] has them.
///
/// # Errors
/// [`PeerError`] naming the first thing wrong; nothing of a refused frame is returned.
pub fn decode_frame(bytes: &[u8], cluster: u64, me: u64) -> Result<(u64, Vec<(JournalId, Message)>), PeerError> {
    decode_frame_removals(bytes, cluster, me).map(|f| (f.from, f.messages))
}

/// [`decode_frame`] with the frame's removals.
///
/// # Errors
/// As [`decode_frame`].
pub fn decode_frame_removals(bytes: &[u8], cluster: u64, me: u64) -> Result<Frame, PeerError> {
    let frame: PeerFrame = prost::Message::decode(bytes).map_err(|e| PeerError::Malformed(e.to_string()))?;
    if frame.cluster != cluster {
        return Err(PeerError::ForeignCluster { theirs: frame.cluster, ours: cluster });
    }
    if frame.to != me {
        return Err(PeerError::NotForMe { to: frame.to, me });
    }
    let mut out = Vec::with_capacity(frame.messages.len());
    for gm in frame.messages {
        let group = JournalId { tenant: gm.tenant, journal: gm.journal };
        let m = Message::decode(gm.message.as_slice()).map_err(|e| PeerError::BadMessage { group, why: e.to_string() })?;
        // A follower forwards a proposal or a read to its leader under the asker's name.
        let forwarded = matches!(m.get_msg_type(), raft::eraftpb::MessageType::MsgPropose | raft::eraftpb::MessageType::MsgReadIndex);
        if (m.from != frame.from && !forwarded) || m.to != frame.to {
            return Err(PeerError::Misaddressed { group, from: m.from, to: m.to, frame_from: frame.from, frame_to: frame.to });
        }
        // Only an append's or a forwarded proposal's entries are logged; a read's entry
        // carries its context.
        if matches!(m.get_msg_type(), raft::eraftpb::MessageType::MsgAppend | raft::eraftpb::MessageType::MsgPropose) {
            for e in &m.entries {
                check_entry(group, e)?;
            }
        }
        if m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
            if group == super::durable::DIRECTORY {
                return Err(PeerError::BadSnapshot { group, why: "the directory group is never compacted".into() });
            }
            super::snapshot::decode(&m.get_snapshot().data).map_err(|e| PeerError::BadSnapshot { group, why: e.to_string() })?;
        }
        out.push((group, m));
    }
    let removed = frame.removed.iter().map(|r| (JournalId { tenant: r.tenant, journal: r.journal }, r.term)).collect();
    Ok(Frame { from: frame.from, messages: out, removed, incarnation: frame.incarnation, refused: frame.refused })
}
