//! The journal messages: our own request and response kinds on protocol v1 (same listener,
//! framing, Hello, TLS and tokens), at field 20 of `Request` and `Response`, a number the
//! reference does not use (it answers such a request `BAD_REQUEST`, as it answers any request
//! without a kind it knows). A DCB client's bytes do not change.
//!
//! Source: docs/protocol.md §15 and docs/journals.md §6; golden bytes in
//! `tests/journal_wire.rs`.
//!
//! Conventions: a leader uuid travels as `bytes`, empty for "none" or exactly 16 bytes
//! big-endian (any other length is answered `INVALID`); ids and seqs are `uint64`.

/// Field 20 of `Request`: one journal call.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalRequest {
    /// Fields 1-8: the call. `None` is answered `INVALID`.
    #[prost(oneof = "journal_request::Call", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9")]
    pub call: ::core::option::Option<journal_request::Call>,
}

/// The `call` oneof of [`JournalRequest`].
pub mod journal_request {
    /// One journal call.
    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Oneof)]
    pub enum Call {
        /// Field 1.
        #[prost(message, tag = "1")]
        Write(super::JournalWrite),
        /// Field 2.
        #[prost(message, tag = "2")]
        Read(super::JournalRead),
        /// Field 3.
        #[prost(message, tag = "3")]
        Truncate(super::JournalTruncate),
        /// Field 4.
        #[prost(message, tag = "4")]
        SetLeader(super::JournalSetLeader),
        /// Field 5.
        #[prost(message, tag = "5")]
        Create(super::JournalCreate),
        /// Field 6.
        #[prost(message, tag = "6")]
        Delete(super::JournalDelete),
        /// Field 7.
        #[prost(message, tag = "7")]
        List(super::JournalList),
        /// Field 8: how this node stands in its cluster (answered `LISTED` with `node`).
        #[prost(message, tag = "8")]
        Status(super::NodeStatusRequest),
        /// Field 9: a journal's new durability (answered `CONFIGURED`).
        #[prost(message, tag = "9")]
        Configure(super::JournalConfigure),
    }
}

/// `configure --survive machines=F`: a cluster journal's group moves to 2F+1 voters; with
/// `tenant_name` set instead of the ids, the tenant's default for journals created in it
/// later (docs/journals.md §9.8).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalConfigure {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: F of `--survive machines=F` (0 to 127).
    #[prost(uint32, tag = "3")]
    pub survive: u32,
    /// Field 4: a tenant's name: set (with both ids 0), the call sets that tenant's default F,
    /// creating the tenant if it is new.
    #[prost(string, tag = "4")]
    pub tenant_name: ::prost::alloc::string::String,
}

/// `Write(leader?, seq, records)`.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalWrite {
    /// Field 1: the tenant id (0 is refused as an unknown journal).
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id (0 is refused as an unknown journal).
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: the leader uuid (16 bytes big-endian) for a single-writer write; empty for a
    /// multi-writer write.
    #[prost(bytes = "vec", tag = "3")]
    pub leader: ::prost::alloc::vec::Vec<u8>,
    /// Field 4: the seq of the first record (single-writer; 0 for multi-writer).
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    /// Field 5: the records, each opaque bytes.
    #[prost(bytes = "vec", repeated, tag = "5")]
    pub records: ::prost::alloc::vec::Vec<::prost::alloc::vec::Vec<u8>>,
}

/// `Read(from_seq, limit, wait_ms)`.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalRead {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: the first seq wanted.
    #[prost(uint64, tag = "3")]
    pub from_seq: u64,
    /// Field 4: most records wanted; 0 = a full page.
    #[prost(uint64, tag = "4")]
    pub limit: u64,
    /// Field 5: how long to wait at the tail, in milliseconds (capped by the server); 0 never
    /// waits.
    #[prost(uint64, tag = "5")]
    pub wait_ms: u64,
}

/// `Truncate(up_to)`.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalTruncate {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: the first seq to keep.
    #[prost(uint64, tag = "3")]
    pub up_to: u64,
    /// Field 4: the leader uuid (single-writer) or empty (multi-writer).
    #[prost(bytes = "vec", tag = "4")]
    pub leader: ::prost::alloc::vec::Vec<u8>,
}

/// `SetLeader(new, old)`.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalSetLeader {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: the uuid that wants to lead (16 bytes).
    #[prost(bytes = "vec", tag = "3")]
    pub new: ::prost::alloc::vec::Vec<u8>,
    /// Field 4: the leader it replaces, or empty for "none".
    #[prost(bytes = "vec", tag = "4")]
    pub old: ::prost::alloc::vec::Vec<u8>,
}

/// Creates `tenant_name/journal_name` (and the tenant when it does not exist yet).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalCreate {
    /// Field 1: the tenant's name.
    #[prost(string, tag = "1")]
    pub tenant_name: ::prost::alloc::string::String,
    /// Field 2: the journal's name.
    #[prost(string, tag = "2")]
    pub journal_name: ::prost::alloc::string::String,
    /// Field 3: the writer mode.
    #[prost(enumeration = "JournalMode", tag = "3")]
    pub mode: i32,
    /// Field 4: the store durability.
    #[prost(enumeration = "JournalDurability", tag = "4")]
    pub durability: i32,
    /// Field 5: F of `--survive machines=F` (the journal's group gets 2F+1 voters in a
    /// cluster); unset: the server's default (F = 1 in a cluster, one copy on a single node).
    #[prost(uint32, optional, tag = "5")]
    pub survive: ::core::option::Option<u32>,
}

/// Deletes a journal and frees its disk.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalDelete {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
}

/// Lists the journals of a tenant, or of every tenant when the name is empty.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalList {
    /// Field 1: the tenant's name; empty = all tenants.
    #[prost(string, tag = "1")]
    pub tenant_name: ::prost::alloc::string::String,
}

/// Field 20 of `Response`: the answer to one [`JournalRequest`]. Which fields are set
/// depends on `outcome` (docs/journals.md §6).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalResponse {
    /// Field 1: what happened.
    #[prost(enumeration = "JournalOutcome", tag = "1")]
    pub outcome: i32,
    /// Field 2: the journal's view the call was judged against (or, after a won SetLeader
    /// or a truncation, the view after it).
    #[prost(message, optional, tag = "2")]
    pub state: ::core::option::Option<JournalView>,
    /// Field 3: the first seq of an accepted or duplicate write.
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    /// Field 4: the record count of an accepted or duplicate write.
    #[prost(uint32, tag = "4")]
    pub count: u32,
    /// Field 5: `TOO_LARGE`: the node's records-per-write limit.
    #[prost(uint64, tag = "5")]
    pub max_records: u64,
    /// Field 6: `TOO_LARGE`: the node's bytes-per-write limit.
    #[prost(uint64, tag = "6")]
    pub max_bytes: u64,
    /// Field 7: `PAGE`: the records, dense from `from_seq`.
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub records: ::prost::alloc::vec::Vec<::prost::alloc::vec::Vec<u8>>,
    /// Field 8: `PAGE`: the seq of the first record.
    #[prost(uint64, tag = "8")]
    pub from_seq: u64,
    /// Field 9: `LISTED`: the journals.
    #[prost(message, repeated, tag = "9")]
    pub journals: ::prost::alloc::vec::Vec<JournalInfo>,
    /// Field 10: `CREATED`, `NAME_TAKEN`: the tenant id.
    #[prost(uint64, tag = "10")]
    pub tenant: u64,
    /// Field 11: `CREATED`, `NAME_TAKEN`: the journal id.
    #[prost(uint64, tag = "11")]
    pub journal: u64,
    /// Field 12: a human explanation (`INVALID`, `UNAVAILABLE`, ...).
    #[prost(string, tag = "12")]
    pub message: ::prost::alloc::string::String,
    /// Field 13: a `Status` call's answer: this node in its cluster; unset on a server that
    /// is no cluster member.
    #[prost(message, optional, boxed, tag = "13")]
    pub node: ::core::option::Option<::prost::alloc::boxed::Box<NodeReport>>,
    /// Field 14: `NOT_LEADER`, `UNSERVED`: the node to ask instead, the hint a client follows
    /// (docs/journals.md §9.2): the journal group's leader as the answering node knows it, or
    /// one of the group's voters from a node that holds no copy; 0: none known.
    #[prost(uint64, tag = "14")]
    pub leader_node: u64,
    /// Field 15: the answering node's id in its cluster (0 on a server that is no cluster
    /// member), set on every answer, so a client learns which of its servers is which node.
    #[prost(uint64, tag = "15")]
    pub answered_by: u64,
}

/// `Status()`: how the node asked stands in its cluster (docs/journals.md §9.7).
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct NodeStatusRequest {}

/// One cluster node as it sees itself.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct NodeReport {
    /// Field 1: the node id.
    #[prost(uint64, tag = "1")]
    pub node: u64,
    /// Field 2: its zone, empty when unset.
    #[prost(string, tag = "2")]
    pub zone: ::prost::alloc::string::String,
    /// Field 3: each consensus group it holds.
    #[prost(message, repeated, tag = "3")]
    pub groups: ::prost::alloc::vec::Vec<GroupReport>,
    /// Field 4: its links to the other nodes.
    #[prost(message, repeated, tag = "4")]
    pub peers: ::prost::alloc::vec::Vec<PeerReport>,
    /// Field 5: leader changes its groups saw since it started.
    #[prost(uint64, tag = "5")]
    pub leader_changes: u64,
}

/// One consensus group on one node.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct GroupReport {
    /// Field 1: the tenant id (0 with journal 0: the directory group).
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: `leader`, `follower`, `candidate` or `pre-candidate`.
    #[prost(string, tag = "3")]
    pub role: ::prost::alloc::string::String,
    /// Field 4: the leader this node knows, 0 for none.
    #[prost(uint64, tag = "4")]
    pub leader: u64,
    /// Field 5: the current term.
    #[prost(uint64, tag = "5")]
    pub term: u64,
    /// Field 6: the highest entry index known decided here.
    #[prost(uint64, tag = "6")]
    pub commit: u64,
    /// Field 7: the highest entry index applied here.
    #[prost(uint64, tag = "7")]
    pub applied: u64,
    /// Field 8: the group's voters.
    #[prost(uint64, repeated, tag = "8")]
    pub voters: ::prost::alloc::vec::Vec<u64>,
}

/// One node's link to a peer.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct PeerReport {
    /// Field 1: the peer's node id.
    #[prost(uint64, tag = "1")]
    pub node: u64,
    /// Field 2: the peer address this node reaches it at.
    #[prost(string, tag = "2")]
    pub addr: ::prost::alloc::string::String,
    /// Field 3: whether the link is up.
    #[prost(bool, tag = "3")]
    pub connected: bool,
    /// Field 4: the zone the cluster's directory records for the peer (empty: none yet).
    #[prost(string, tag = "4")]
    pub zone: ::prost::alloc::string::String,
}

/// What a client sees of a journal.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalView {
    /// Field 1: the leader uuid (16 bytes big-endian), empty when there is none.
    #[prost(bytes = "vec", tag = "1")]
    pub leader: ::prost::alloc::vec::Vec<u8>,
    /// Field 2: the seq the next record gets.
    #[prost(uint64, tag = "2")]
    pub next_seq: u64,
    /// Field 3: the first seq still held.
    #[prost(uint64, tag = "3")]
    pub first_seq: u64,
}

/// One journal in a `LISTED` answer.
#[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
pub struct JournalInfo {
    /// Field 1: the tenant id.
    #[prost(uint64, tag = "1")]
    pub tenant: u64,
    /// Field 2: the journal id.
    #[prost(uint64, tag = "2")]
    pub journal: u64,
    /// Field 3: the tenant's name.
    #[prost(string, tag = "3")]
    pub tenant_name: ::prost::alloc::string::String,
    /// Field 4: the journal's name.
    #[prost(string, tag = "4")]
    pub name: ::prost::alloc::string::String,
    /// Field 5: the writer mode.
    #[prost(enumeration = "JournalMode", tag = "5")]
    pub mode: i32,
    /// Field 6: the store durability.
    #[prost(enumeration = "JournalDurability", tag = "6")]
    pub durability: i32,
    /// Field 7: the view.
    #[prost(message, optional, tag = "7")]
    pub state: ::core::option::Option<JournalView>,
    /// Field 8: in a cluster, F of `--survive machines=F` the journal was placed for.
    #[prost(uint32, optional, tag = "8")]
    pub survive: ::core::option::Option<u32>,
    /// Field 9: in a cluster, the node ids of the journal group's voters, ascending.
    #[prost(uint64, repeated, tag = "9")]
    pub voters: ::prost::alloc::vec::Vec<u64>,
    /// Field 10: set when the answering cluster node holds no copy of the journal's group:
    /// `state` is then only what it last knew (initial, or as of when its copy stopped), not
    /// the journal's state; a read of the journal gets that from its voters.
    #[prost(bool, tag = "10")]
    pub elsewhere: bool,
}

/// A journal's writer mode on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum JournalMode {
    /// Single-writer, fenced by a leader uuid (the default).
    Single = 0,
    /// Multi-writer, at-least-once.
    Multi = 1,
}

/// A journal's store durability on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum JournalDurability {
    /// Two syncs per commit (the default).
    Ordered = 0,
    /// One sync per commit.
    Batched = 1,
}

/// Every answer a journal call can get (docs/journals.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum JournalOutcome {
    /// Never sent; an unknown value reads as this.
    Unspecified = 0,
    /// Write: accepted at `seq`, `count` records.
    Accepted = 1,
    /// Write: the exact retry of an accepted write.
    Duplicate = 2,
    /// Write: refused (stale uuid, wrong seq, other records, empty batch); `state` says why.
    Refused = 3,
    /// Write below `first_seq`, or a read below it.
    Truncated = 4,
    /// A call shaped for the other writer mode.
    WrongMode = 5,
    /// Write over a limit, before anything is logged; `max_records`, `max_bytes`.
    TooLarge = 6,
    /// No such journal (or an id half is 0).
    UnknownJournal = 7,
    /// Write: the node has too many writes pending; nothing was logged, retry later.
    Busy = 8,
    /// SetLeader won.
    Leader = 9,
    /// SetLeader lost.
    Lost = 10,
    /// Truncate applied.
    Trimmed = 11,
    /// Truncate from a uuid that does not lead.
    TruncateRefused = 12,
    /// Read: a page (possibly empty after a wait at the tail).
    Page = 13,
    /// Read: this node could not confirm the read in time; ask another.
    Unserved = 14,
    /// Create: the journal exists now.
    Created = 15,
    /// Create: the name is taken; `tenant`/`journal` name the holder.
    NameTaken = 16,
    /// Create: the name breaks the name rules.
    InvalidName = 17,
    /// Delete: done.
    Deleted = 18,
    /// List: `journals`.
    Listed = 19,
    /// List: no tenant of that name.
    UnknownTenant = 20,
    /// No verdict from this node: it does not lead the journal's group (replication).
    NotLeader = 21,
    /// A malformed call (a uuid that is not 16 bytes, no call); `message` says which.
    Invalid = 22,
    /// The node cannot judge calls now (its journal log stopped after a failed write or is
    /// shutting down); `message` says which.
    Unavailable = 23,
    /// No verdict after the call entered consensus: the node stopped leading, or another
    /// leader's entry took its place, so the call may or may not take effect (replication,
    /// docs/journals.md §9.2). The caller settles it as a lost answer.
    Ambiguous = 24,
    /// Create: the cluster cannot place the durability asked for (`--survive machines=F`
    /// needs 2F+1 nodes); nothing changed. `message` says how many it has.
    Unplaceable = 25,
    /// Configure: the directory holds the journal's new durability; its group moves to its
    /// new voters next, writes going on.
    Configured = 26,
}
