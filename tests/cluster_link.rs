//! The peer transport over real loopback sockets (docs/journals.md §9.4): frames both ways
//! between three nodes, intact and from the right node; a bad peer (another cluster, garbage, an
//! oversized length, a forged sender, a wrong-direction or unknown handshake) closes only its own
//! link, and the link comes back; a newer connection replaces an older one; a node that is gone
//! costs its peers nothing (sends drop at once) and is talked to again once it is back on its
//! address. With TLS (certificates from a test CA): frames both ways; a node whose certificate
//! another CA signed, or one not valid for the host its peers list it at, is refused both as a
//! dialer and as an acceptor while the good links work; a plaintext peer is refused and the TLS
//! node goes on. Every wait is a deadline loop; no sleep is an assertion.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use raft::eraftpb::{Message, MessageType};
use tephra::cluster::link::{Identity, Inbound, LinkStats, Links, HANDSHAKE_TIMEOUT, MAX_FRAME};
use tephra::cluster::peer::{decode_frame, decode_frame_removals, encode_frame, encode_hello, PeerFrame};
use tephra::cluster::tls::PeerTls;
use tephra::config::cluster_id;
use tephra::journal::JournalId;
use tephra_test_support::TestCa;

const DEADLINE: Duration = Duration::from_secs(20);
const G: JournalId = JournalId { tenant: 7, journal: 9 };
const H: JournalId = JournalId { tenant: 7, journal: 10 };

fn cluster() -> u64 {
    cluster_id([1, 2, 3])
}

fn heartbeat(from: u64, to: u64, term: u64) -> Message {
    Message { msg_type: MessageType::MsgHeartbeat as i32, from, to, term, commit: term * 2, ..Message::default() }
}

fn vote(from: u64, to: u64, term: u64) -> Message {
    Message { msg_type: MessageType::MsgRequestVote as i32, from, to, term, log_term: term - 1, index: 40, ..Message::default() }
}

/// The messages of one test frame: two groups, both tagged with `term`.
fn messages(from: u64, to: u64, term: u64) -> Vec<(JournalId, Message)> {
    vec![(G, heartbeat(from, to, term)), (H, vote(from, to, term))]
}

struct Node {
    id: u64,
    links: Links,
    inbox: flume::Receiver<Inbound>,
}

impl Node {
    fn start(id: u64, listener: TcpListener, peers: &BTreeMap<u64, String>) -> Node {
        Node::start_with(id, listener, peers, None)
    }

    fn start_with(id: u64, listener: TcpListener, peers: &BTreeMap<u64, String>, tls: Option<PeerTls>) -> Node {
        Node::start_as(id, incarnation(id), listener, peers, tls)
    }

    /// Node `id` whose data directory is of incarnation `inc`.
    fn start_as(id: u64, inc: u64, listener: TcpListener, peers: &BTreeMap<u64, String>, tls: Option<PeerTls>) -> Node {
        let (tx, inbox) = flume::unbounded();
        let me = Identity { node: id, cluster: cluster(), incarnation: inc };
        let links = Links::start_on(listener, me, peers, tls, tx).expect("links start");
        Node { id, links, inbox }
    }

    fn stats(&self, peer: u64) -> LinkStats {
        self.links.stats().into_iter().find(|s| s.peer == peer).expect("a link to that peer")
    }
}

/// The incarnation of node `id`'s data directory in these tests.
fn incarnation(id: u64) -> u64 {
    0x1000 + id
}

fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

fn peers(addrs: &[(u64, SocketAddr)]) -> BTreeMap<u64, String> {
    addrs.iter().map(|(id, a)| (*id, a.to_string())).collect()
}

/// Three nodes on free ports, each listing all three (its own entry is ignored).
fn three() -> (Vec<Node>, BTreeMap<u64, String>) {
    let listeners: Vec<TcpListener> = (0..3).map(|_| listener()).collect();
    let all = peers(&listeners.iter().enumerate().map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap())).collect::<Vec<_>>());
    let nodes = listeners.into_iter().enumerate().map(|(i, l)| Node::start(i as u64 + 1, l, &all)).collect();
    (nodes, all)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `from` → `to` a frame tagged `term` (again, until one arrives: a frame sent before the
/// link is up is dropped) and returns what arrived. Every frame that arrives on the way must be
/// from `from`.
fn deliver(from: &Node, to: &Node, term: u64) -> Inbound {
    let deadline = Instant::now() + DEADLINE;
    loop {
        from.links.send(to.id, encode_frame(cluster(), from.id, to.id, &messages(from.id, to.id, term)));
        while let Ok(got) = to.inbox.recv_timeout(Duration::from_millis(20)) {
            assert_eq!(got.from, from.id, "{got:?}");
            if got.messages.first().is_some_and(|(_, m)| m.term == term) {
                return got;
            }
        }
        assert!(Instant::now() < deadline, "node {} never heard node {} (term {term})", to.id, from.id);
    }
}

/// Waits until `node` hears `from`'s frame tagged `term`, intact; frames of other terms (resent
/// by [`deliver`]) are passed over.
fn heard(node: &Node, from: u64, term: u64) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = node.inbox.recv_deadline(deadline).unwrap_or_else(|_| panic!("node {} never heard node {from} (term {term})", node.id));
        if got.messages.first().is_some_and(|(_, m)| m.term == term) {
            assert_eq!((got.from, got.messages), (from, messages(from, node.id, term)));
            return;
        }
    }
}

/// A test's own end of a connection, acting as a peer.
struct Fake(TcpStream);

impl Fake {
    fn accept(l: &TcpListener) -> Fake {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        Fake(s)
    }

    fn dial(addr: SocketAddr) -> Fake {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        Fake(s)
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        // The other end may have closed already: what counts is that it closes.
        let _ = self.0.write_all(bytes);
    }

    fn write(&mut self, frame: &[u8]) {
        let mut b = (frame.len() as u32).to_le_bytes().to_vec();
        b.extend_from_slice(frame);
        self.write_raw(&b);
    }

    fn read(&mut self) -> Vec<u8> {
        let mut len = [0; 4];
        self.0.read_exact(&mut len).unwrap();
        let mut frame = vec![0; u32::from_le_bytes(len) as usize];
        self.0.read_exact(&mut frame).unwrap();
        frame
    }

    /// Waits for the other end to close the connection (reading and discarding until then).
    fn closed(&mut self) {
        let mut buf = [0; 4096];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) => panic!("the connection stayed open: {e}"),
            }
        }
    }
}

#[test]
fn three_nodes_exchange_frames_both_ways_intact() {
    let (nodes, _) = three();
    let mut term = 10;
    for a in &nodes {
        for b in &nodes {
            if a.id != b.id {
                term += 1;
                let got = deliver(a, b, term);
                assert_eq!(got.messages, messages(a.id, b.id, term));
            }
        }
    }
    // A burst once connected: every frame arrives, in order (many written per flush).
    let (a, b) = (&nodes[0], &nodes[2]);
    for t in 1_000..2_000 {
        a.links.send(b.id, encode_frame(cluster(), a.id, b.id, &messages(a.id, b.id, t)));
    }
    let mut next = 1_000;
    let deadline = Instant::now() + DEADLINE;
    while next < 2_000 {
        let got = b.inbox.recv_deadline(deadline).expect("the whole burst arrives");
        assert_eq!(got.from, a.id);
        assert_eq!(got.messages, messages(a.id, b.id, next));
        next += 1;
    }
    let s = a.stats(b.id);
    assert!(s.connected && s.connects == 1 && s.sent >= 1_000 && s.refused == 0, "{s:?}");
    assert!(b.stats(a.id).received >= 1_000);
    // One connection per pair: each node has exactly one live link to each other node.
    for n in &nodes {
        for s in n.links.stats() {
            assert_eq!(s.connects, 1, "node {}: {s:?}", n.id);
        }
    }
}

#[test]
fn a_bad_peer_closes_only_its_own_link_and_the_link_comes_back() {
    // Node 2 is real, with a real node 1; node 3 is this test, on a listener node 2 dials.
    let (l1, l2, fake3) = (listener(), listener(), listener());
    let addr2 = l2.local_addr().unwrap();
    let all = peers(&[(1, l1.local_addr().unwrap()), (2, addr2), (3, fake3.local_addr().unwrap())]);
    // Node 1 would dial the test's listener too: it knows only node 2.
    let n1 = Node::start(1, l1, &peers(&[(2, addr2)]));
    let n2 = Node::start(2, l2, &all);
    deliver(&n1, &n2, 1);

    let c = cluster();
    // What the bad peer writes, length prefix included.
    let framed = |frame: &[u8]| [&(frame.len() as u32).to_le_bytes()[..], frame].concat();
    let bad: [(&str, Vec<u8>); 4] = [
        ("another cluster", framed(&encode_frame(c ^ 1, 3, 2, &messages(3, 2, 5)))),
        ("garbage", framed(&[0xff; 9])),
        ("an oversized length", ((MAX_FRAME as u32) + 1).to_le_bytes().to_vec()),
        ("a forged sender", framed(&encode_frame(c, 1, 2, &messages(1, 2, 5)))),
    ];
    for (i, (what, bytes)) in bad.iter().enumerate() {
        // Node 2 dials (it has the lower id) and says who it is.
        let mut fake = Fake::accept(&fake3);
        assert_eq!(decode_frame(&fake.read(), c, 3).unwrap(), (2, vec![]), "{what}");
        // The link works both ways ...
        let term = 100 + i as u64;
        fake.write(&encode_frame(c, 3, 2, &messages(3, 2, term)));
        heard(&n2, 3, term);
        wait_until("node 2 sees its link to node 3 up", || n2.stats(3).connected);
        n2.links.send(3, encode_frame(c, 2, 3, &messages(2, 3, term)));
        assert_eq!(decode_frame(&fake.read(), c, 3).unwrap(), (2, messages(2, 3, term)), "{what}");
        // ... until the bad frame, which closes it,
        fake.write_raw(bytes);
        fake.closed();
        assert_eq!(n2.stats(3).refused, i as u64 + 1, "{what}");
        // and only it: node 1 is still heard, on its first connection.
        deliver(&n1, &n2, 200 + i as u64);
        deliver(&n2, &n1, 300 + i as u64);
        assert_eq!(n2.stats(1).connects, 1);
    }
    // The link came back after each refusal.
    Fake::accept(&fake3);
    wait_until("node 2 redialed node 3 a fifth time", || n2.stats(3).connects == 5);
}

#[test]
fn bad_handshakes_are_refused_and_a_newer_connection_replaces_the_old() {
    let (l1, l2, l3) = (listener(), listener(), listener());
    let addr2 = l2.local_addr().unwrap();
    let all = peers(&[(1, l1.local_addr().unwrap()), (2, addr2), (3, l3.local_addr().unwrap())]);
    let n1 = Node::start(1, l1, &all);
    let n2 = Node::start(2, l2, &all);
    drop(l3); // node 3 never runs
    deliver(&n1, &n2, 1);
    let c = cluster();
    let handshakes: [(&str, Vec<u8>); 5] = [
        ("another cluster", encode_frame(c ^ 1, 1, 2, &[])),
        ("a higher id dialing", encode_frame(c, 3, 2, &[])),
        ("an unknown node", encode_frame(c, 9, 2, &[])),
        ("another addressee", encode_frame(c, 1, 4, &[])),
        ("garbage", vec![0xff; 9]),
    ];
    for (i, (what, hello)) in handshakes.iter().enumerate() {
        let mut fake = Fake::dial(addr2);
        fake.write(hello);
        if i == 0 {
            // Another cluster is told why, in a frame of this one.
            let answer: PeerFrame = prost::Message::decode(fake.read().as_slice()).unwrap();
            assert_eq!((answer.cluster, answer.from, answer.to), (c, 2, 1));
            assert!(answer.refused.contains("different sets of nodes") && answer.refused.contains("[1, 2, 3]"), "{}", answer.refused);
        }
        fake.closed();
        assert_eq!(n2.links.refused_handshakes(), i as u64 + 1, "{what}");
    }
    let mut fake = Fake::dial(addr2);
    fake.write_raw(&((MAX_FRAME as u32) + 1).to_le_bytes());
    fake.closed();
    assert_eq!(n2.links.refused_handshakes(), 6);
    // Node 1's link never noticed.
    deliver(&n1, &n2, 2);
    assert_eq!((n1.stats(2).connects, n2.stats(1).connects), (1, 1));

    // A newer connection as node 1 replaces node 1's own: node 2 hears the newcomer, closes the
    // old connection, and node 1 dials again, which in turn replaces the newcomer.
    let mut newer = Fake::dial(addr2);
    newer.write(&encode_frame(c, 1, 2, &[]));
    newer.write(&encode_frame(c, 1, 2, &messages(1, 2, 50)));
    heard(&n2, 1, 50);
    wait_until("node 1 redials", || n1.stats(2).connects >= 2);
    newer.closed();
    deliver(&n1, &n2, 3);
    deliver(&n2, &n1, 4);
    assert_eq!(n2.links.refused_handshakes(), 6);
}

/// A second process with a running node's id (or a node whose data was lost) dials with another
/// data directory incarnation than the one the cluster records for that id: the acceptor
/// refuses it and says why, and the node it knows keeps its link.
#[test]
fn a_handshake_with_another_incarnation_of_a_known_node_is_refused_and_told_why() {
    let (l1, l2) = (listener(), listener());
    let addr2 = l2.local_addr().unwrap();
    let all = peers(&[(1, l1.local_addr().unwrap()), (2, addr2)]);
    let n1 = Node::start(1, l1, &all);
    let n2 = Node::start(2, l2, &all);
    // Before any record, node 1 is taken on its word.
    deliver(&n1, &n2, 1);
    n2.links.record_incarnation(1, incarnation(1));
    let c = cluster();
    for (i, told) in [incarnation(1) + 1, 0].into_iter().enumerate() {
        let mut fake = Fake::dial(addr2);
        fake.write(&encode_hello(c, 1, 2, told));
        let answer = decode_frame_removals(&fake.read(), c, 1).expect("a refusal for node 1");
        assert_eq!(answer.from, 2);
        assert!(
            answer.refused.contains(&format!("{:016x}", incarnation(1))) && answer.refused.contains("another process runs with that node's id"),
            "{}",
            answer.refused
        );
        fake.closed();
        assert_eq!(n2.links.refused_handshakes(), i as u64 + 1);
    }
    // A real dialer with node 1's id and its own data directory hears the refusal in its inbox.
    let impostor = Node::start_as(1, 0x9999, listener(), &peers(&[(2, addr2)]), None);
    let deadline = Instant::now() + DEADLINE;
    let refused = loop {
        let got = impostor.inbox.recv_deadline(deadline).expect("the impostor is told it was refused");
        if let Some(why) = got.refused {
            break (got.from, why);
        }
    };
    assert_eq!(refused.0, 2);
    assert!(refused.1.contains("0000000000009999"), "{}", refused.1);
    drop(impostor);
    // Node 1's own link never noticed.
    deliver(&n1, &n2, 2);
    deliver(&n2, &n1, 3);
    assert_eq!((n1.stats(2).connects, n2.stats(1).connects), (1, 1));
}

/// A node whose `peers` name another set of nodes (so another cluster id) dials a node of the
/// cluster: it is refused, hears why, counts it, and goes on trying.
#[test]
fn a_node_of_another_cluster_hears_why_its_link_is_refused() {
    let (l1, l2) = (listener(), listener());
    let addr2 = l2.local_addr().unwrap();
    let n2 = Node::start(2, l2, &peers(&[(1, l1.local_addr().unwrap()), (2, addr2)]));
    let (tx, _inbox) = flume::unbounded();
    let other = Identity { node: 1, cluster: cluster_id([1, 2]), incarnation: incarnation(1) };
    let stray = Links::start_on(l1, other, &peers(&[(2, addr2)]), None, tx).unwrap();
    wait_until("the stray node counts two refusals", || stray.stats()[0].refused >= 2);
    assert!(n2.links.refused_handshakes() >= 2);
}

/// Handshakes are read each on a thread of its own and within [`HANDSHAKE_TIMEOUT`] in all: a
/// connection that sends its handshake a byte at a time neither lasts past the timeout nor holds
/// up a real peer's link (the trial found one such connection keeping a link down for good).
#[test]
fn a_handshake_sent_a_byte_at_a_time_holds_up_no_other_and_is_closed_in_time() {
    let (l1, l2) = (listener(), listener());
    let addr2 = l2.local_addr().unwrap();
    let all = peers(&[(1, l1.local_addr().unwrap()), (2, addr2)]);
    let n2 = Node::start(2, l2, &all);
    // Eight connections that announce a 4 KiB handshake and send it a byte every 300 ms.
    let started = Instant::now();
    let dribblers: Vec<std::thread::JoinHandle<Duration>> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut fake = Fake::dial(addr2);
                fake.write_raw(&4096u32.to_le_bytes());
                let opened = Instant::now();
                // Until the node closes it (a write then fails, or a read says so).
                for _ in 0..40 {
                    std::thread::sleep(Duration::from_millis(300));
                    if fake.0.write_all(&[0]).is_err() {
                        break;
                    }
                    fake.0.set_nonblocking(true).unwrap();
                    let mut b = [0u8; 1];
                    let gone = matches!(fake.0.read(&mut b), Ok(0)) || matches!(fake.0.read(&mut b), Err(ref e) if e.kind() == ErrorKind::ConnectionReset);
                    fake.0.set_nonblocking(false).unwrap();
                    if gone {
                        break;
                    }
                }
                opened.elapsed()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // Node 1 comes up meanwhile: its link to node 2 is up long before any dribbler is closed.
    let n1 = Node::start(1, l1, &all);
    deliver(&n1, &n2, 1);
    assert!(started.elapsed() < HANDSHAKE_TIMEOUT, "node 1's link waited for the slow handshakes: {:?}", started.elapsed());
    for d in dribblers {
        let lasted = d.join().unwrap();
        assert!(lasted < HANDSHAKE_TIMEOUT + Duration::from_millis(700), "a dribbling handshake lasted {lasted:?}");
    }
    assert_eq!(n2.links.refused_handshakes(), 8);
}

#[test]
fn a_node_gone_costs_nothing_and_is_heard_again_once_back() {
    let (mut nodes, all) = three();
    deliver(&nodes[0], &nodes[2], 1);
    deliver(&nodes[1], &nodes[2], 2);
    let addr3: SocketAddr = all[&3].parse().unwrap();
    // Dropping a node's links stops its threads and closes its sockets (joined here).
    let gone = nodes.pop().unwrap();
    let (done_tx, done) = flume::bounded(1);
    std::thread::spawn(move || {
        drop(gone);
        done_tx.send(()).unwrap();
    });
    done.recv_timeout(DEADLINE).expect("dropping the links returns");
    for n in &nodes {
        wait_until("the peers see node 3 gone", || !n.stats(3).connected);
        let before = n.stats(3).dropped;
        for t in 0..10_000 {
            n.links.send(3, encode_frame(cluster(), n.id, 3, &messages(n.id, 3, t + 10)));
        }
        assert_eq!(n.stats(3).dropped, before + 10_000);
    }
    // Back on the same address: both peers redial it, and it hears them and they it.
    let back = Node::start(3, TcpListener::bind(addr3).expect("the address is free again"), &all);
    for n in &nodes {
        deliver(n, &back, 50_000 + n.id);
        deliver(&back, n, 60_000 + n.id);
    }
    // Frames for a node that is not a peer go nowhere.
    back.links.send(9, vec![1, 2, 3]);
    assert_eq!(back.links.stats().len(), 2);
}

#[test]
fn start_binds_and_refuses_an_address_in_use() {
    let (tx, _rx) = flume::unbounded();
    let me = |node| Identity { node, cluster: cluster(), incarnation: incarnation(node) };
    let a = Links::start(me(1), "127.0.0.1:0", &BTreeMap::new(), None, tx.clone()).unwrap();
    assert!(a.stats().is_empty() && a.local_addr().port() != 0);
    let e = Links::start(me(2), &a.local_addr().to_string(), &BTreeMap::new(), None, tx).err().expect("the port is taken");
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
}

/// TLS for a node: a certificate `ca` signs for `names`, and `trusted` as the CA of its peers.
fn peer_tls(ca: &TestCa, names: &[&str], trusted: &TestCa) -> PeerTls {
    let (cert, key) = ca.issue(names);
    let chain = rustls_pemfile::certs(&mut cert.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
    let key = rustls_pemfile::private_key(&mut key.as_bytes()).unwrap().unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut trusted.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    PeerTls::new(chain, key, roots).unwrap()
}

/// `n` listeners and the peer map naming each at `127.0.0.1`.
fn listeners(n: usize) -> (Vec<TcpListener>, BTreeMap<u64, String>) {
    let ls: Vec<TcpListener> = (0..n).map(|_| listener()).collect();
    let all = peers(&ls.iter().enumerate().map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap())).collect::<Vec<_>>());
    (ls, all)
}

#[test]
fn tls_links_carry_frames_both_ways_intact() {
    let ca = TestCa::new("cluster CA");
    let (ls, all) = listeners(3);
    let nodes: Vec<Node> = ls.into_iter().enumerate().map(|(i, l)| Node::start_with(i as u64 + 1, l, &all, Some(peer_tls(&ca, &["127.0.0.1"], &ca)))).collect();
    let mut term = 10;
    for a in &nodes {
        for b in &nodes {
            if a.id != b.id {
                term += 1;
                assert_eq!(deliver(a, b, term).messages, messages(a.id, b.id, term));
            }
        }
    }
    // A burst, each way, with a frame of many records among small ones: every frame arrives
    // intact and in order.
    let (a, b) = (&nodes[0], &nodes[2]);
    let big = |t: u64| vec![(G, Message { context: vec![t as u8; 3 << 20], ..heartbeat(a.id, b.id, t) })];
    for t in 1_000..2_000 {
        let m = if t == 1_500 { big(t) } else { messages(a.id, b.id, t) };
        a.links.send(b.id, encode_frame(cluster(), a.id, b.id, &m));
        b.links.send(a.id, encode_frame(cluster(), b.id, a.id, &messages(b.id, a.id, t)));
    }
    let deadline = Instant::now() + DEADLINE;
    for (to, from) in [(b, a), (a, b)] {
        for t in 1_000..2_000 {
            // Passing over what `deliver` sent again before the burst.
            let got = std::iter::from_fn(|| to.inbox.recv_deadline(deadline).ok()).find(|i| i.messages[0].1.term >= 1_000).expect("the whole burst arrives");
            let want = if t == 1_500 && from.id == a.id { big(t) } else { messages(from.id, to.id, t) };
            assert!(got.from == from.id && got.messages == want, "node {} from {}: frame {t}", to.id, from.id);
        }
    }
    for n in &nodes {
        assert_eq!(n.links.refused_handshakes(), 0);
        for s in n.links.stats() {
            assert!(s.connects == 1 && s.refused == 0, "node {}: {s:?}", n.id);
        }
    }
}

/// Sends `from` → `to` frames until `done`; afterwards, every frame `to` heard came from
/// `good` (the bad peer's never arrived).
fn refused_while(from: &Node, to: &Node, good: u64, what: &str, mut done: impl FnMut() -> bool) {
    let mut term = 1;
    wait_until(what, || {
        term += 1;
        from.links.send(to.id, encode_frame(cluster(), from.id, to.id, &messages(from.id, to.id, term)));
        done()
    });
    assert!(to.inbox.drain().all(|i| i.from == good), "node {} heard node {}", to.id, from.id);
}

#[test]
fn a_node_whose_certificate_another_ca_signed_is_refused_both_ways() {
    let (ca, other) = (TestCa::new("cluster CA"), TestCa::new("another CA"));
    // Nodes 1 and 4 have certificates of another CA (trusting the cluster's, so that only
    // the others' refusal keeps them out): node 1 dials 2 and 3, which refuse it as
    // acceptors; 2 and 3 dial 4, and refuse it as dialers.
    let (ls, all) = listeners(4);
    let nodes: Vec<Node> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let id = i as u64 + 1;
            let signer = if id == 1 || id == 4 { &other } else { &ca };
            Node::start_with(id, l, &all, Some(peer_tls(signer, &["127.0.0.1"], &ca)))
        })
        .collect();
    let (n1, n2, n3, n4) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
    deliver(n2, n3, 1);
    deliver(n3, n2, 2);
    refused_while(n1, n2, 3, "nodes 2 and 3 refused node 1 twice each and node 4 refused its dialers", || {
        n2.links.refused_handshakes() >= 2 && n3.links.refused_handshakes() >= 2 && n4.links.refused_handshakes() >= 4
    });
    for good in [n2, n3] {
        for bad in [1, 4] {
            let s = good.stats(bad);
            assert!(!s.connected && s.connects == 0 && s.received == 0, "node {}: {s:?}", good.id);
        }
    }
    // The good link never noticed.
    deliver(n2, n3, 3);
    deliver(n3, n2, 4);
    assert_eq!((n2.stats(3).connects, n3.stats(2).connects), (1, 1));
}

#[test]
fn a_certificate_not_valid_for_the_host_a_node_is_listed_at_is_refused_both_ways() {
    let ca = TestCa::new("cluster CA");
    // Everyone lists nodes 1 and 3 at 127.0.0.1, but their certificates name only localhost;
    // node 4 is listed at localhost, which its certificate names.
    let (ls, mut all) = listeners(4);
    let port4 = ls[3].local_addr().unwrap().port();
    all.insert(4, format!("localhost:{port4}"));
    let names: [&[&str]; 4] = [&["localhost"], &["127.0.0.1"], &["localhost"], &["localhost"]];
    let nodes: Vec<Node> = ls.into_iter().enumerate().map(|(i, l)| Node::start_with(i as u64 + 1, l, &all, Some(peer_tls(&ca, names[i], &ca)))).collect();
    let (n1, n2, n3, n4) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
    // A name is checked as a DNS name too: node 2 reaches node 4 at localhost, and node 4
    // finds node 2's certificate valid for 127.0.0.1, where it lists node 2.
    deliver(n2, n4, 1);
    deliver(n4, n2, 2);
    // Node 1 dials node 2 and is refused by it (the acceptor's check, after the handshake
    // frame names node 1); node 2 dials node 3 and refuses its certificate (the dialer's).
    refused_while(n1, n2, 4, "node 2 refused node 1 twice and node 3 refused node 2 twice", || {
        n2.links.refused_handshakes() >= 2 && n3.links.refused_handshakes() >= 2
    });
    for (node, bad) in [(n2, 1), (n2, 3), (n4, 3)] {
        let s = node.stats(bad);
        assert!(!s.connected && s.connects == 0 && s.received == 0, "node {}: {s:?}", node.id);
    }
    deliver(n2, n4, 3);
    assert_eq!((n2.stats(4).connects, n4.stats(2).connects), (1, 1));
}

#[test]
fn a_plaintext_peer_is_refused_by_a_tls_node_which_goes_on() {
    let ca = TestCa::new("cluster CA");
    let (mut ls, all) = listeners(3);
    let l3 = ls.pop().unwrap();
    let addr2 = ls[1].local_addr().unwrap();
    let tls: Vec<Node> = ls.into_iter().enumerate().map(|(i, l)| Node::start_with(i as u64 + 1, l, &all, Some(peer_tls(&ca, &["127.0.0.1"], &ca)))).collect();
    let (n1, n2) = (&tls[0], &tls[1]);
    deliver(n1, n2, 1);
    // A plaintext dialer saying it is node 1, as a node without [tls] would: refused.
    let mut fake = Fake::dial(addr2);
    fake.write(&encode_frame(cluster(), 1, 2, &[]));
    fake.write(&encode_frame(cluster(), 1, 2, &messages(1, 2, 50)));
    fake.closed();
    assert_eq!(n2.links.refused_handshakes(), 1);
    // A plaintext node 3: node 2's TLS dial is refused by it (its hello is no frame), and
    // node 2 never counts a link to it.
    let n3 = Node::start(3, l3, &all);
    refused_while(n2, &n3, 0, "node 3 refused node 2's TLS hello twice", || n3.links.refused_handshakes() >= 2);
    assert!(!n2.stats(3).connected && n2.stats(3).connects == 0);
    // Node 1's link never noticed.
    deliver(n1, n2, 2);
    deliver(n2, n1, 3);
    assert_eq!((n1.stats(2).connects, n2.stats(1).connects), (1, 1));
    assert!(n2.inbox.drain().all(|i| i.from == 1));
}
