//! The documentation against the tree: every section citation in the code names a numbered
//! heading of a `docs/` file, every relative link in `README.md` and `docs/` points at a file
//! that exists, and the README's first session runs, as written, against a real server.
//!
//! A citation is `docs/NAME.md` followed by a section sign and a number (`4`, `8.2`); more
//! numbers may follow with `, `, `-`, ` and `, ` or ` or `/` between them, each one a
//! section of the same file, and a citation may break the line after `docs/NAME.md`. The only
//! other section signs allowed are those of RFCs (`RFC 8446` and a section).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tephra_test_support as support;

/// The section sign, spelled out so that this file holds none of its own.
const SECTION: char = '\u{a7}';

/// The directories whose `.rs` files are scanned for citations.
const CITING: [&str; 5] = ["src", "shards", "bench-harness", "crash", "tests"];

/// Separators allowed between the numbers of one citation.
const SEPARATORS: [&str; 6] = [", ", "-", "\u{2013}", " and ", " or ", "/"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, `target` directories skipped.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The numbered headings of each `docs/*.md` file: `## 4. Framing` gives `4`, `### 8.2 Read`
/// gives `8.2`.
fn sections() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(repo().join("docs")).expect("docs/ exists").flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "md") {
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&p).unwrap();
        let mut numbers = BTreeSet::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced || !line.starts_with('#') {
                continue;
            }
            let rest = line.trim_start_matches('#').trim_start();
            let number: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let number = number.trim_end_matches('.');
            if !number.is_empty() {
                numbers.insert(number.to_owned());
            }
        }
        all.insert(name, numbers);
    }
    all
}

/// The section number starting at `s` (digits and inner dots), and its length in bytes.
fn number_at(s: &str) -> (&str, usize) {
    let len = s.char_indices().find(|(_, c)| !(c.is_ascii_digit() || *c == '.')).map_or(s.len(), |(i, _)| i);
    let n = s[..len].trim_end_matches('.');
    (n, n.len())
}

/// The `docs/NAME.md` a text ends with (after trimming spaces), if any.
fn ends_with_doc(text: &str) -> Option<String> {
    let t = text.trim_end();
    let t = t.strip_suffix(".md")?;
    let start = t.rfind("docs/")?;
    let name = &t[start + 5..];
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '-' || c == '_')).then(|| format!("{name}.md"))
}

/// Checks every section sign of `text`; returns one message per citation that does not
/// resolve (`path:line: why: the line`).
fn check_citations(path: &Path, text: &str, docs: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    let mut previous = "";
    for (i, line) in text.lines().enumerate() {
        // The doc of the last number read on this line, and where that number ended.
        let mut last: Option<(String, usize)> = None;
        for (at, _) in line.match_indices(SECTION) {
            let before = &line[..at];
            let between_ok = |end: usize| SEPARATORS.contains(&&line[end..at]);
            if before.trim_end().rsplit(' ').nth(1) == Some("RFC") {
                last = None;
                continue;
            }
            // `docs/NAME.md` right before it, else the same file as the number before it on
            // this line (behind a separator), else, at the start of a comment line, the
            // `docs/NAME.md` that ended the line before.
            let doc = ends_with_doc(before)
                .filter(|_| before.ends_with(".md "))
                .or_else(|| last.as_ref().filter(|(_, end)| between_ok(*end)).map(|(d, _)| d.clone()))
                .or_else(|| before.trim_start().trim_start_matches(['/', '!']).trim().is_empty().then(|| ends_with_doc(previous)).flatten());
            let after = &line[at + SECTION.len_utf8()..];
            let (number, len) = number_at(after);
            let end = at + SECTION.len_utf8() + len;
            let why = match &doc {
                None => Some("a section sign that names no docs/ file".to_owned()),
                Some(d) => match docs.get(d) {
                    None => Some(format!("docs/{d} does not exist")),
                    Some(numbers) if !numbers.contains(number) => Some(format!("docs/{d} has no numbered heading {number:?}")),
                    Some(_) => None,
                },
            };
            if let Some(why) = why {
                bad.push(format!("{}:{}: {why}: {}", path.display(), i + 1, line.trim()));
            }
            last = doc.map(|d| (d, end));
        }
        previous = line;
    }
    bad
}

#[test]
fn every_code_citation_names_a_numbered_docs_section() {
    let docs = sections();
    assert!(docs.contains_key("protocol.md") && docs.contains_key("format.md"), "docs/ lacks its specifications: {docs:?}");
    let mut files = Vec::new();
    for dir in CITING {
        rust_files(&repo().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} .rs files", files.len());
    let mut bad = Vec::new();
    let mut cited = 0usize;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        cited += text.matches(SECTION).count();
        bad.extend(check_citations(f.strip_prefix(repo()).unwrap_or(f), &text, &docs));
    }
    assert!(bad.is_empty(), "{} of {cited} section citations do not resolve to a numbered heading of docs/:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn the_citation_checker_accepts_good_forms_and_refuses_bad_ones() {
    let docs: BTreeMap<String, BTreeSet<String>> =
        [("format.md".to_owned(), ["1", "2", "2.1", "10.1"].into_iter().map(String::from).collect())].into_iter().collect();
    let s = SECTION;
    let good = format!(
        "// docs/format.md {s}1, {s}2.1 and {s}10.1.\n// (docs/format.md {s}1-{s}2) and docs/format.md {s}2.\n/// (docs/format.md\n/// {s}2.1).\n// RFC 8446 {s}5.1\n"
    );
    assert_eq!(check_citations(Path::new("x.rs"), &good, &docs), Vec::<String>::new());
    for bad in [
        format!("// reference engine {s}3.4\n"),
        format!("// docs/format.md {s}3\n"),
        format!("// docs/nothing.md {s}1\n"),
        format!("// docs/format.md {s}1 and then {s}2\n"),
    ] {
        assert_eq!(check_citations(Path::new("x.rs"), &bad, &docs).len(), 1, "{bad}");
    }
}

/// The targets of the Markdown links `[text](target)` of `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn relative_links_in_the_readme_and_docs_point_at_files() {
    let root = repo();
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).expect("docs/ exists").flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for target in link_targets(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            checked += 1;
            if !page.parent().unwrap().join(file).exists() {
                bad.push(format!("{}: {target}", page.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(checked > 10, "found only {checked} relative links");
    assert!(bad.is_empty(), "links to missing files:\n{}", bad.join("\n"));
}

/// The lines of the first fenced block of `kind` (`sh`, `console`) after `heading`.
fn block_after(text: &str, heading: &str, kind: &str) -> Vec<String> {
    let start = text.find(heading).unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &text[start..];
    let open = format!("```{kind}\n");
    let from = rest.find(&open).unwrap_or_else(|| panic!("no ```{kind} block after {heading:?}")) + open.len();
    let body = &rest[from..];
    let end = body.find("```").expect("an unclosed block");
    body[..end].lines().map(str::to_owned).collect()
}

/// A server started from the README's command line; killed on drop.
struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Runs the README's `tephra-server` line (its `&` and comment dropped) with
    /// `--bind 127.0.0.1:0`, in a fresh directory, and waits for its readiness line.
    fn start(line: &str, bin: &Path) -> Server {
        let words: Vec<&str> = line.split('#').next().unwrap().trim().trim_end_matches('&').split_whitespace().collect();
        assert_eq!(words.first(), Some(&"tephra-server"), "{line}");
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut child = Command::new(bin.join("tephra-server"))
            .args(&words[1..])
            .args(["--bind", "127.0.0.1:0"])
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tephra-server");
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("tephra server listening addr=").nth(1) {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).expect("the server printed its listening line");
        Server { child, addr, _dir: dir }
    }
}

/// Whether `actual` matches `expected`, where an expected line `...` stands for any lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => (0..=actual.len()).any(|k| lines_match(rest, &actual[k..])),
        Some((e, rest)) => actual.first().is_some_and(|a| a.trim_end() == e.trim_end()) && lines_match(rest, &actual[1..]),
    }
}

/// One `$ command` of the session and the lines shown after it.
struct Step {
    command: String,
    expected: Vec<String>,
    exit: i32,
}

fn session_steps(block: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for line in block {
        if let Some(cmd) = line.strip_prefix("$ ") {
            let exit = cmd.split("# exit code ").nth(1).map_or(0, |n| n.trim().parse().expect("an exit code"));
            steps.push(Step { command: cmd.to_owned(), expected: Vec::new(), exit });
        } else {
            steps.last_mut().expect("output before any command").expected.push(line.clone());
        }
    }
    steps
}

/// The command line with `--addr` inserted after the program name.
fn with_addr(command: &str, addr: &str) -> String {
    let rest = command.strip_prefix("tephra ").unwrap_or_else(|| panic!("not a tephra command: {command}"));
    format!("tephra --addr {addr} {rest}")
}

#[test]
fn the_readme_first_session_runs_against_a_real_server() {
    run_readme_session("## A first session", true);
}

#[test]
fn the_readme_journal_session_runs_against_a_real_server() {
    run_readme_session("## Journals", false);
}

/// Starts the server of the README's first `sh` block on a fresh directory and runs the
/// `console` block after `heading`, command by command, checking each output and exit code;
/// with `stop`, also checks that SIGTERM ends the server with exit code 0.
fn run_readme_session(heading: &str, stop: bool) {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tephra")).parent().unwrap().to_path_buf();
    let setup = block_after(&readme, "## A first session", "sh");
    let server_line = setup.iter().find(|l| l.starts_with("tephra-server ")).expect("the session starts a server");
    assert!(setup.iter().any(|l| l.starts_with("cargo build --release --bin tephra-server --bin tephra")), "{setup:?}");
    let server = Server::start(server_line, &bin);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let steps = session_steps(&block_after(&readme, heading, "console"));
    assert!(steps.len() >= 5, "the session has {} commands", steps.len());
    for step in &steps {
        let line = with_addr(&step.command, &server.addr);
        if step.command.starts_with("tephra subscribe ") {
            run_subscription(&line, &path, &step.expected);
            continue;
        }
        let out = Command::new("sh").args(["-c", &line]).env("PATH", &path).env("NO_COLOR", "1").output().expect("run sh");
        let actual: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().chain(String::from_utf8_lossy(&out.stderr).lines()).map(str::to_owned).collect();
        assert_eq!(out.status.code(), Some(step.exit), "exit code of `{line}`; output:\n{}", actual.join("\n"));
        assert!(lines_match(&step.expected, &actual), "`{line}` printed\n{}\nwhere the README shows\n{}", actual.join("\n"), step.expected.join("\n"));
    }
    if !stop {
        return;
    }
    // "Stop the server with Ctrl-C or SIGTERM: ... then exits 0."
    let mut server = server;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "the server's exit after SIGTERM");
}

/// Runs a `subscribe` until every expected line has arrived, then stops it with SIGINT (the
/// README's Ctrl-C) and expects exit code 0.
fn run_subscription(line: &str, path: &str, expected: &[String]) {
    let mut child = Command::new("sh")
        .args(["-c", &format!("exec {line}")])
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run subscribe");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let readers: Vec<_> = [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())]
        .into_iter()
        .map(|r| {
            let seen = seen.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    seen.lock().unwrap().push(l);
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = seen.lock().unwrap().clone();
        if expected.iter().all(|e| got.iter().any(|g| g.trim_end() == e.trim_end())) {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`{line}` printed\n{}\nwhere the README shows\n{}", got.join("\n"), expected.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    for r in readers {
        let _ = r.join();
    }
    assert_eq!(status.code(), Some(0), "`{line}` after Ctrl-C");
}

/// Every ```` ```kind ```` block of the section under `heading` (up to the next `## `).
fn blocks_in_section(text: &str, heading: &str, kind: &str) -> Vec<Vec<String>> {
    let start = text.find(heading).unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &text[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let open = format!("```{kind}\n");
    section.split(&open).skip(1).map(|b| b[..b.find("```").expect("an unclosed block")].lines().map(str::to_owned).collect()).collect()
}

#[test]
fn the_readme_cluster_walkthrough_runs_against_three_real_servers() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let heading = "## A three-node cluster";
    let setup = block_after(&readme, heading, "sh");
    for var in ["TEPHRA__CLUSTER__NODE_ID=$i", "TEPHRA__CLUSTER__BIND=", "TEPHRA__CLUSTER__PEERS=", "export TEPHRA_SERVERS="] {
        assert!(setup.iter().any(|l| l.contains(var)), "the setup sets {var}: {setup:?}");
    }
    let blocks = blocks_in_section(&readme, heading, "console");
    assert_eq!(blocks.len(), 3, "write, write with node 1 down, read from node 1 back");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tephra")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cluster = support::Cluster::start(&bin.join("tephra-server"), 3, &[]);
    // The README's client addresses 127.0.0.1:9001..9003 stand for the nodes' real ones.
    let mut addrs: Vec<String> = (1..=3).map(|i| cluster.node(i).unwrap().addr.to_string()).collect();
    let run = |block: &[String], addrs: &[String]| {
        let servers = addrs.join(",");
        for step in session_steps(block) {
            let mut line = step.command.clone();
            for (i, a) in addrs.iter().enumerate() {
                line = line.replace(&format!("127.0.0.1:900{}", i + 1), a);
            }
            let out = Command::new("sh").args(["-c", &line]).env("PATH", &path).env("NO_COLOR", "1").env("TEPHRA_SERVERS", &servers).output().expect("run sh");
            let actual: Vec<String> =
                String::from_utf8_lossy(&out.stdout).lines().chain(String::from_utf8_lossy(&out.stderr).lines()).map(str::to_owned).collect();
            assert_eq!(out.status.code(), Some(step.exit), "exit code of `{line}`; output:\n{}", actual.join("\n"));
            assert!(lines_match(&step.expected, &actual), "`{line}` printed\n{}\nwhere the README shows\n{}", actual.join("\n"), step.expected.join("\n"));
        }
    };
    run(&blocks[0], &addrs);
    cluster.kill(1);
    run(&blocks[1], &addrs);
    cluster.start_node(1);
    addrs[0] = cluster.node(1).unwrap().addr.to_string();
    // "It catches up from the others": give it the moment a restart takes.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Command::new(bin.join("tephra"))
        .args(["journal", "--servers", &addrs[0], "read", "acme/payments"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("next_seq=3"))
    {
        assert!(Instant::now() < deadline, "node 1 did not catch up within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    run(&blocks[2], &addrs);
}
