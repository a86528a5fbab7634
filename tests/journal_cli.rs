//! `tephra journal ...` against our `tephra-server` (docs/journals.md §8.5), and the journal
//! client's settling of an ambiguous write (docs/journals.md §8.3).
//!
//! The tests marked `` need a server that judges
//! journal calls; un-ignore them when it does. The others run against no server or one that
//! is not there.

use tephra_test_support as support;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Server;
use tephra::client::journal::{JournalRef, Journals, JournalsConfig, ReadOutcome, Resolution, WriteOutcome};
use tephra::journal::LeaderUuid;

fn server() -> Server {
    Server::start(std::path::Path::new(env!("CARGO_BIN_EXE_tephra-server")), &[])
}

/// A `tephra` command for `addr`, isolated from the caller's environment.
fn cli(addr: SocketAddr) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tephra"));
    for var in ["TEPHRA_ADDR", "TEPHRA_TOKEN", "TEPHRA_SERVERS", "TEPHRA_LEADER"] {
        cmd.env_remove(var);
    }
    cmd.arg("--addr").arg(addr.to_string());
    cmd
}

/// Runs `tephra journal args` against `addr`.
fn journal(addr: SocketAddr, args: &[&str]) -> Output {
    cli(addr).arg("journal").args(args).stdin(Stdio::null()).output().expect("run tephra")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_code(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o));
}

/// Runs a command that must exit `code` and returns its stdout.
#[track_caller]
fn expect(addr: SocketAddr, args: &[&str], code: i32) -> String {
    let o = journal(addr, args);
    assert_code(&o, code);
    stdout(&o)
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// An address nothing listens on.
fn dead_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[test]
fn bad_arguments_exit_2_before_anything_is_sent() {
    let addr = dead_addr();
    for (args, why) in [
        (&["write", "acme", "r0"][..], "is not TENANT/JOURNAL"),
        (&["write", "acme/.x", "r0"], "is not 1 to 64 ASCII letters"),
        (&["read", "id:xyz/1"], "1 to 16 hex digits"),
        (&["set-leader", "acme/orders", "--new", "0"], "0 is the unset uuid"),
        (&["set-leader", "acme/orders", "--new", "a", "--old", "zz"], "hex digits"),
        (&["write", "acme/orders", "r0", "--leader", "123456789012345678901234567890123"], "at most 32 hex digits"),
        (&["truncate", "acme/orders", "--up-to", "3"], "needs the leader"),
        (&["write", "acme/orders", "r0", "--multi", "--seq", "1"], "cannot be used with"),
        (&["write", "acme/orders"], "required"),
        (&["create", "id:1/2"], "by name, not by id"),
        (&["list", "café"], "is not a tenant name"),
        (&["configure", "--tenant", "a/b", "--survive", "machines=1"], "is not a tenant name"),
        (&["configure", "--survive", "machines=1"], "required"),
        (&["configure", "acme/orders", "--tenant", "acme", "--survive", "machines=1"], "cannot be used with"),
        (&["configure", "acme/orders", "--survive", "machines=128"], "from 0 to 127"),
        (&["create", "acme/orders", "--survive", "machines=+1"], "from 0 to 127"),
    ] {
        let o = journal(addr, args);
        assert_code(&o, 2);
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
    }
    // A server address that cannot be one is a bad argument too, not a dead server.
    for bad in ["nonsense", "host:port", ":9000"] {
        let o = cli(addr).args(["journal", "--servers", bad, "show", "acme/orders"]).output().unwrap();
        assert_code(&o, 2);
        assert!(stderr(&o).contains("is not a server address"), "{bad}: {}", stderr(&o));
    }
}

#[test]
fn no_server_answering_exits_5() {
    let addr = dead_addr();
    for args in [&["list"][..], &["write", "acme/orders", "r0", "--leader", "a"], &["read", "acme/orders"], &["create", "acme/orders"]] {
        let o = journal(addr, args);
        assert_code(&o, 5);
        assert!(stderr(&o).contains("no server answered"), "{args:?}: {}", stderr(&o));
    }
    // --servers (and TEPHRA_SERVERS) replace --addr.
    let o = cli(addr).args(["journal", "--servers", &format!("{},{}", dead_addr(), dead_addr()), "list"]).output().unwrap();
    assert_code(&o, 5);
    let o = cli(addr).env("TEPHRA_SERVERS", dead_addr().to_string()).args(["journal", "--json", "list"]).output().unwrap();
    assert_code(&o, 5);
    assert_eq!(json(&stderr(&o))["exit_code"], 5);
}

/// The seed's sequence diagram through the CLI: A leads and writes r0 r1 at 0; B takes the
/// lead from A; A's write at 2 is refused naming B; B's write lands at 2; a read shows three
/// records.
#[test]

fn the_seed_sequence_diagram_runs_through_the_cli() {
    let srv = server();
    let a = srv.addr;
    let out = expect(a, &["create", "acme/orders"], 0);
    assert!(out.starts_with("created acme/orders id=id:") && out.contains("mode=single store=ordered"), "{out}");
    let out = expect(a, &["set-leader", "acme/orders", "--new", "a", "--old", "none"], 0);
    assert_eq!(out.trim(), "leader leader=a next_seq=0 first_seq=0");
    let out = expect(a, &["write", "acme/orders", "r0", "r1", "--leader", "a"], 0);
    assert_eq!(out.trim(), "written seq=0 count=2");
    let out = expect(a, &["set-leader", "acme/orders", "--new", "b", "--old", "a"], 0);
    assert_eq!(out.trim(), "leader leader=b next_seq=2 first_seq=0");
    // A, superseded, writes at the tail without claiming: refused, naming B.
    let o = journal(a, &["write", "acme/orders", "r2", "--leader", "a", "--no-claim"]);
    assert_code(&o, 3);
    assert_eq!(stdout(&o).trim(), "superseded leader=b next_seq=2 first_seq=0");
    let o = journal(a, &["write", "acme/orders", "r2", "--leader", "a", "--no-claim", "--seq", "2"]);
    assert_code(&o, 3);
    assert!(stdout(&o).contains("leader=b next_seq=2"), "{}", stdout(&o));
    let out = expect(a, &["write", "acme/orders", "r2'", "--leader", "b"], 0);
    assert_eq!(out.trim(), "written seq=2 count=1");
    let out = expect(a, &["read", "acme/orders"], 0);
    assert_eq!(out, "0\tr0\n1\tr1\n2\tr2'\n# leader=b next_seq=3 first_seq=0\n");
    // The exact retry of B's write is a duplicate; A's set-leader against a stale old is lost.
    let out = expect(a, &["write", "acme/orders", "r2'", "--leader", "b", "--no-claim", "--seq", "2"], 0);
    assert_eq!(out.trim(), "written seq=2 count=1 duplicate");
    let o = journal(a, &["set-leader", "acme/orders", "--new", "c", "--old", "a"]);
    assert_code(&o, 3);
    assert_eq!(stdout(&o).trim(), "lost leader=b next_seq=3 first_seq=0");
}

#[test]

fn json_answers_carry_outcome_seq_count_and_state() {
    let srv = server();
    let a = srv.addr;
    let v = json(&expect(a, &["--json", "create", "acme/orders", "--store-durability", "batched"], 0));
    assert_eq!(v["outcome"], "created");
    assert_eq!(v["store"], "batched");
    let id = v["id"].as_str().unwrap().to_owned();
    let v = json(&expect(a, &["--json", "create", "acme/orders"], 3));
    assert_eq!((v["outcome"].as_str(), v["id"].as_str()), (Some("name_taken"), Some(id.as_str())));
    // A random leader is drawn and named on stderr; the write claims and lands at 0.
    let o = journal(a, &["--json", "write", "acme/orders", "hello"]);
    assert_code(&o, 0);
    assert!(stderr(&o).contains("drawn at random"), "{}", stderr(&o));
    let v = json(&stdout(&o));
    assert_eq!(v["outcome"], "accepted");
    assert_eq!((v["seq"].as_u64(), v["count"].as_u64(), v["duplicate"].as_bool()), (Some(0), Some(1), Some(false)));
    let leader = v["state"]["leader"].as_str().expect("a leader").to_owned();
    assert_eq!(v["state"]["next_seq"], 1);
    // The same leader again, from TEPHRA_LEADER: owned, written at the tail.
    let o = cli(a).env("TEPHRA_LEADER", &leader).args(["journal", "--json", "write", &id, "\u{e9}t\u{e9}"]).output().unwrap();
    assert_code(&o, 0);
    assert_eq!(json(&stdout(&o))["seq"], 1);
    let v = json(&expect(a, &["--json", "read", "acme/orders"], 0));
    assert_eq!(v["outcome"], "page");
    assert_eq!(v["records"], serde_json::json!([{"seq": 0, "data": "hello"}, {"seq": 1, "data": "\u{e9}t\u{e9}"}]));
    assert_eq!(v["state"], serde_json::json!({"leader": leader, "next_seq": 2, "first_seq": 0}));
    let v = json(&expect(a, &["--json", "truncate", "acme/orders", "--up-to", "1", "--leader", &leader], 0));
    assert_eq!(v["outcome"], "trimmed");
    assert_eq!(v["state"]["first_seq"], 1);
    let v = json(&expect(a, &["--json", "truncate", "acme/orders", "--up-to", "2", "--leader", "abc"], 3));
    assert_eq!(v["outcome"], "refused");
    let v = json(&expect(a, &["--json", "write", "nobody/here", "x", "--leader", "1"], 3));
    assert_eq!(v["outcome"], "unknown_journal");
}

#[test]

fn list_show_ids_and_prefixes_name_journals() {
    let srv = server();
    let a = srv.addr;
    expect(a, &["create", "acme/orders"], 0);
    expect(a, &["create", "acme/bills", "--mode", "multi", "--store-durability", "batched"], 0);
    let table = expect(a, &["list", "acme"], 0);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["NAME", "ID", "MODE", "STORE", "LEADER", "FIRST", "NEXT"]);
    assert_eq!(lines.len(), 3, "{table}");
    let bills: Vec<&str> = lines.iter().find(|l| l.starts_with("acme/bills")).unwrap().split_whitespace().collect();
    assert_eq!(&bills[2..], ["multi", "batched", "-", "0", "0"]);
    let id = bills[1];
    // By the whole id, by unique prefixes, and by paros://.
    let (t, j) = id.trim_start_matches("id:").split_once('/').unwrap();
    for name in [id.to_owned(), format!("id:{}/{}", &t[..12], &j[..12]), "paros://acme/bills".to_owned()] {
        let out = expect(a, &["show", &name], 0);
        assert!(out.starts_with(&format!("acme/bills id={id} mode=multi store=batched leader=none")), "{name}: {out}");
    }
    let o = journal(a, &["show", "id:/1"]);
    assert_code(&o, 2);
    let o = journal(a, &["show", "acme/nothing"]);
    assert_code(&o, 3);
    let o = journal(a, &["list", "nobody"]);
    assert_code(&o, 3);
    assert_eq!(stdout(&o).trim(), "unknown tenant nobody");
    let v = json(&expect(a, &["--json", "list"], 0));
    assert_eq!(v["journals"].as_array().unwrap().len(), 2);
    // One node keeps one copy: F = 0 is what a journal or a tenant's default already has.
    let out = expect(a, &["configure", "acme/bills", "--survive", "machines=0"], 0);
    assert_eq!(out.trim(), "configured acme/bills survive=machines=0");
    let out = expect(a, &["configure", "--tenant", "acme", "--survive", "machines=0"], 0);
    assert_eq!(out.trim(), "configured tenant acme: new journals survive=machines=0");
    let v = json(&expect(a, &["--json", "configure", "--tenant", "acme", "--survive", "machines=1"], 3));
    assert_eq!(v["outcome"], "unplaceable", "{v}");
    let out = expect(a, &["delete", "acme/bills"], 0);
    assert!(out.starts_with("deleted acme/bills"), "{out}");
    assert_code(&journal(a, &["show", "acme/bills"]), 3);
}

#[test]

fn multi_writer_journals_take_unfenced_writes_and_refuse_the_other_shape() {
    let srv = server();
    let a = srv.addr;
    expect(a, &["create", "acme/log", "--mode", "multi"], 0);
    assert_eq!(expect(a, &["write", "acme/log", "x", "--multi"], 0).trim(), "written seq=0 count=1");
    assert_eq!(expect(a, &["write", "acme/log", "y", "z", "--multi"], 0).trim(), "written seq=1 count=2");
    let o = journal(a, &["write", "acme/log", "w", "--leader", "a"]);
    assert_code(&o, 3);
    assert!(stdout(&o).starts_with("wrong mode"), "{}", stdout(&o));
    assert_code(&journal(a, &["set-leader", "acme/log", "--new", "a", "--old", "none"]), 3);
    assert!(expect(a, &["truncate", "acme/log", "--up-to", "1", "--multi"], 0).starts_with("trimmed"));
    // A read from below first_seq notes the gap on stderr and reads on.
    let o = journal(a, &["read", "acme/log", "--from", "0"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "1\ty\n2\tz\n# leader=none next_seq=3 first_seq=1\n");
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    assert_eq!(expect(a, &["read", "acme/log", "--from", "2", "--limit", "1"], 0), "2\tz\n# leader=none next_seq=3 first_seq=1\n");
}

#[test]

fn tail_prints_records_as_they_land_until_interrupted() {
    let srv = server();
    let a = srv.addr;
    expect(a, &["create", "acme/feed", "--mode", "multi"], 0);
    expect(a, &["write", "acme/feed", "old", "--multi"], 0);
    let child = cli(a).args(["journal", "tail", "acme/feed"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    expect(a, &["write", "acme/feed", "new", "--multi"], 0);
    std::thread::sleep(Duration::from_millis(500));
    let o = interrupt(child);
    assert_eq!(stdout(&o), "1\tnew\n# leader=none next_seq=2 first_seq=0\n");
}

/// Stops a running `tail` as Ctrl-C does and returns what it printed; it must exit 0.
fn interrupt(child: std::process::Child) -> Output {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "tail did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert_code(&o, 0);
    o
}

#[test]
fn a_server_that_does_not_answer_is_named_with_the_timeout() {
    let srv = server();
    srv.signal(libc::SIGSTOP);
    let o = cli(srv.addr).args(["--timeout", "1", "journal", "read", "acme/feed"]).output().unwrap();
    srv.signal(libc::SIGCONT);
    assert_code(&o, 5);
    assert!(stderr(&o).contains("no answer to the connect and Hello within 1s"), "{}", stderr(&o));
}

#[test]
fn tail_waits_for_a_server_that_restarts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bind = format!("127.0.0.1:{port}");
    let data = support::scratch_dir();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_tephra-server"));
    let mut srv = Server::start_args(bin, data.path(), &["-b", &bind], &[]);
    let a = srv.addr;
    expect(a, &["create", "acme/feed", "--mode", "multi"], 0);
    let child = cli(a).args(["journal", "tail", "acme/feed"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    srv.restart(bin, &[]);
    assert_eq!(srv.addr, a, "the server came back on its port");
    expect(a, &["write", "acme/feed", "after the restart", "--multi"], 0);
    std::thread::sleep(Duration::from_millis(800));
    let o = interrupt(child);
    assert!(stdout(&o).starts_with("0\tafter the restart\n"), "{}\n{}", stdout(&o), stderr(&o));
}

/// A write whose answer is lost (the server is stopped after the request went out) is
/// `Ambiguous`, and `resolve` settles it once the server runs again.
#[test]

fn an_ambiguous_write_is_settled_by_resolve() {
    let srv = server();
    let mut config = JournalsConfig::new([srv.addr.to_string()]);
    config.request_timeout = Duration::from_millis(500);
    config.read_timeout = Duration::from_millis(500);
    let mut j = Journals::new(config);
    assert!(j.create("acme", "orders", tephra::journal::Mode::Single, tephra::journal::StoreDurability::Ordered).is_ok());
    let id = j.resolve_name(&"acme/orders".parse::<JournalRef>().unwrap()).unwrap();
    let me = LeaderUuid(0xa);
    assert!(matches!(j.set_leader(id, me, None), Ok(tephra::client::journal::SetLeaderOutcome::Won { .. })));
    assert!(matches!(j.read(id, 0, 0, 0), Ok(ReadOutcome::Page { .. })));
    srv.signal(libc::SIGSTOP);
    let answer = j.write_single(id, me, 0, &[b"r0"]);
    srv.signal(libc::SIGCONT);
    assert_eq!(answer.unwrap(), WriteOutcome::Ambiguous);
    assert_eq!(j.resolve(id, me, 0, &[b"r0"]), Resolution::Written { seq: 0, count: 1 });
    // Settled the same way again: a duplicate is still written.
    assert_eq!(j.resolve(id, me, 0, &[b"r0"]), Resolution::Written { seq: 0, count: 1 });
    // Another leader fences a write that never landed: proven absent.
    assert!(matches!(j.set_leader(id, LeaderUuid(0xb), Some(me)), Ok(tephra::client::journal::SetLeaderOutcome::Won { .. })));
    assert!(matches!(j.resolve(id, me, 1, &[b"r1"]), Resolution::NotWritten { .. }));
}

/// The writer session: it claims, writes at the tail, stops once another leader supersedes it
/// (sending nothing more), and a new claim draws a fresh uuid and takes the lead back.
#[test]

fn a_writer_session_claims_writes_and_stops_once_superseded() {
    use tephra::client::journal::{ClaimOutcome, JournalWriter, SetLeaderOutcome, WriterOutcome};
    let srv = server();
    let mut j = Journals::new(JournalsConfig::new([srv.addr.to_string()]));
    j.create("acme", "orders", tephra::journal::Mode::Single, tephra::journal::StoreDurability::Ordered).unwrap();
    let id = j.resolve_name(&"acme/orders".parse::<JournalRef>().unwrap()).unwrap();
    let mut w = JournalWriter::with_fresh_leader(Journals::new(JournalsConfig::new([srv.addr.to_string()])), id);
    assert_eq!(w.write(&[b"too early"]).unwrap(), WriterOutcome::NotOwner);
    assert!(matches!(w.claim().unwrap(), ClaimOutcome::Won { .. }));
    // A second claim under the same uuid finds itself leading.
    assert!(matches!(w.claim().unwrap(), ClaimOutcome::Owned { .. }));
    assert!(matches!(w.write(&[b"r0", b"r1"]).unwrap(), WriterOutcome::Written { seq: 0, count: 2, .. }));
    assert!(matches!(w.write(&[b"r2"]).unwrap(), WriterOutcome::Written { seq: 2, count: 1, .. }));
    let first = w.leader();
    let other = LeaderUuid(0xb);
    assert!(matches!(j.set_leader(id, other, Some(first)).unwrap(), SetLeaderOutcome::Won { .. }));
    match w.write(&[b"r3"]).unwrap() {
        WriterOutcome::Superseded { state } => assert_eq!((state.leader, state.next_seq), (Some(other), 3)),
        o => panic!("{o:?}"),
    }
    assert_eq!(w.write(&[b"r3"]).unwrap(), WriterOutcome::NotOwner);
    assert!(matches!(w.claim().unwrap(), ClaimOutcome::Won { .. }));
    assert_ne!(w.leader(), first, "a claim after a supersession draws a fresh uuid");
    assert!(matches!(w.write(&[b"r3"]).unwrap(), WriterOutcome::Written { seq: 3, count: 1, .. }));
}
