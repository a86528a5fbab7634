//! Crash-consistency and fault-injection harness for `tephra-server`.
//!
//! Phases (each a function here, a subcommand of the `tephra-crash` binary):
//! - [`soak`]: seeded concurrent workloads over real connections, SIGKILL at random moments
//!   (also during start-up recovery), restart, check every invariant of [`check`];
//! - [`points`]: every named crash point armed once (`abort`) with small segments and a skip
//!   count, then restart and check;
//! - [`faults`]: injected I/O errors: fdatasync `EIO` and a short write (fail-stop: nothing
//!   acknowledged after, reads still served, a restart recovers all acknowledged), `ENOSPC`
//!   while creating a segment (at start-up and at rollover);
//! - [`corruption`]: damage a closed store's files and check how the server opens it.
//!
//! Every run is reproducible from its seed (up to thread scheduling). On a violation the data
//! directory, the witness and the server log are kept and the error names the seed and cycle.

pub mod check;
pub mod corrupt;
pub mod gen;
pub mod server;
pub mod witness;
pub mod workload;

use gen::Rng;
use server::{signal_of, ServerSpec, Started};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{Ctx, Workload};

/// A failed run: what broke, where, and where the evidence was kept.
#[derive(Debug)]
pub struct Failure {
    /// Seed of the run.
    pub seed: u64,
    /// Phase and cycle (or scenario).
    pub at: String,
    /// What broke.
    pub violations: Vec<String>,
    /// Kept directory: `data/`, `witness/`, `server.log`.
    pub kept: PathBuf,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "VIOLATION seed={} at {}", self.seed, self.at)?;
        for v in &self.violations {
            writeln!(f, "  - {v}")?;
        }
        write!(f, "  kept: {} (data/, witness/, server.log)", self.kept.display())
    }
}

/// One data directory with its witness and server log.
pub struct Site {
    /// Root: `data/`, `witness/`, `server.log`.
    pub root: PathBuf,
    /// The server's data directory.
    pub data: PathBuf,
    /// The witness directory.
    pub witness: PathBuf,
    /// How to start servers on it.
    pub spec: ServerSpec,
    /// Next sequence number.
    pub next_seq: Arc<AtomicU64>,
    /// What the last check saw.
    pub prev: Vec<u64>,
    seed: u64,
}

impl Site {
    /// A fresh site under `root` (removed first if present).
    pub fn new(root: PathBuf, binary: &Path, segment_size: u64, seed: u64) -> Site {
        let _ = std::fs::remove_dir_all(&root);
        let data = root.join("data");
        let witness = root.join("witness");
        std::fs::create_dir_all(&witness).expect("witness dir");
        let spec = ServerSpec { binary: binary.to_owned(), segment_size, log_path: root.join("server.log") };
        Site { root, data, witness, spec, next_seq: Arc::new(AtomicU64::new(1)), prev: Vec::new(), seed }
    }

    /// A workload/check context for a server at `addr`.
    pub fn ctx(&self, addr: std::net::SocketAddr, tag: &str, errors_expected: Option<u32>) -> Ctx {
        Ctx {
            seed: self.seed,
            addr,
            witness_dir: self.witness.clone(),
            next_seq: self.next_seq.clone(),
            tag: tag.to_string(),
            errors_expected,
            acks_after_errors: false,
        }
    }

    /// Checks every invariant against `srv`, remembering what it saw. When the server stops
    /// answering (a liveness failure, see [`hangs`]) the hang is recorded, the server is
    /// killed and restarted, and the check runs again on the new process.
    pub fn check(&mut self, srv: &mut server::Server, tag: &str, rng: &mut Rng) -> Result<check::Checked, Vec<String>> {
        for attempt in 0.. {
            match check::check(&self.ctx(srv.addr(), &format!("{tag}-{attempt}"), None), &self.prev, rng) {
                Ok(c) => {
                    self.prev = c.seqs.clone();
                    return Ok(c);
                }
                Err(v) if attempt < 3 && v.iter().all(|m| is_hang(m)) => {
                    record_hang(format!("check {tag} in {}: {}", self.root.display(), v.join("; ")));
                    srv.kill();
                    *srv = self.spec.start_ok(&self.data, None).map_err(|e| vec![e])?;
                }
                Err(v) => return Err(v),
            }
        }
        unreachable!()
    }

    /// A failure keeping this site.
    pub fn fail(&self, at: String, violations: Vec<String>) -> Failure {
        Failure { seed: self.seed, at, violations, kept: self.root.clone() }
    }

    /// Removes the site after success.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// True for a client error that means "no answer in time" (the server is alive but silent).
pub fn is_hang(msg: &str) -> bool {
    msg.contains("os error 11") || msg.contains("timed out") || msg.starts_with("HANG")
}

static HANGS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records a liveness failure: an append or read that got no answer within
/// [`workload::ANSWER_TIMEOUT`] from a server that was running. Not a durability violation
/// (the server is restarted and checked), but a bug; printed at the end of every run.
pub fn record_hang(what: String) {
    eprintln!("LIVENESS: {what}");
    HANGS.lock().unwrap_or_else(|e| e.into_inner()).push(what);
}

/// The liveness failures recorded so far.
pub fn hangs() -> Vec<String> {
    HANGS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Soak settings.
#[derive(Clone, Debug)]
pub struct SoakOpts {
    /// Seed of everything random.
    pub seed: u64,
    /// SIGKILL cycles.
    pub cycles: u64,
    /// Workloads to draw from, one per cycle.
    pub workloads: Vec<Workload>,
    /// Cycles per data directory before starting a fresh one.
    pub round: u64,
    /// Segment size.
    pub segment_size: u64,
    /// Kill delay range after the workload starts, milliseconds.
    pub kill_ms: (u64, u64),
    /// Where rounds live; a passing round's directory is removed.
    pub run_dir: PathBuf,
    /// Print a line per round.
    pub verbose: bool,
}

impl SoakOpts {
    /// The soak CI runs: `cycles` over all four workloads, 25 cycles a round, 256 KiB
    /// segments, a kill 20 to 400 ms into the workload, quiet.
    pub fn ci(seed: u64, cycles: u64, run_dir: PathBuf) -> SoakOpts {
        SoakOpts { seed, cycles, workloads: Workload::ALL.to_vec(), round: 25, segment_size: 256 * 1024, kill_ms: (20, 400), run_dir, verbose: false }
    }
}

/// What a soak did.
#[derive(Debug, Default, Clone)]
pub struct SoakReport {
    /// SIGKILLs while a workload ran.
    pub cycles: u64,
    /// Extra SIGKILLs during start-up recovery.
    pub startup_kills: u64,
    /// Restarts checked.
    pub checks: u64,
    /// Acknowledged appends (batches).
    pub acks: u64,
    /// Condition verdicts.
    pub rejects: u64,
    /// Events served to subscribers and readers.
    pub served: u64,
    /// Acknowledged batches verified, summed over checks.
    pub verified_batches: u64,
    /// Unacknowledged batches (in flight at a kill) found wholly present at the end of their round.
    pub doubtful_present: u64,
    /// Unacknowledged batches found wholly absent at the end of their round.
    pub doubtful_absent: u64,
    /// Cycles per workload.
    pub per_workload: Vec<(String, u64)>,
    /// Wall time.
    pub elapsed: Duration,
    /// Largest log checked.
    pub max_events: u64,
    /// Restarts that rolled back a torn tail.
    pub rollbacks: u64,
    /// Restarts that removed a never-written trailing segment.
    pub removed_segments: u64,
    /// Segments created (rollovers), summed over rounds.
    pub segments: u64,
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} SIGKILL cycles (+{} during start-up recovery), {} restarts checked ({} rolled back a torn tail, {} removed a half-created segment; {} segments), {} liveness failures, {} acknowledged appends, {} condition verdicts, {} events served to readers, {} acknowledged-batch verifications, in-flight batches wholly present/absent {}/{}, largest log {} events, workloads {:?}, {:.0} s",
            self.cycles,
            self.startup_kills,
            self.checks,
            self.rollbacks,
            self.removed_segments,
            self.segments,
            hangs().len(),
            self.acks,
            self.rejects,
            self.served,
            self.verified_batches,
            self.doubtful_present,
            self.doubtful_absent,
            self.max_events,
            self.per_workload,
            self.elapsed.as_secs_f64()
        )
    }
}

fn note(r: &mut SoakReport, c: &check::Checked, last_of_round: bool) {
    r.checks += 1;
    r.verified_batches += c.acked_batches;
    if last_of_round {
        // The last check of a round sees every batch of the round once.
        r.doubtful_present += c.doubtful_present;
        r.doubtful_absent += c.doubtful_absent;
    }
    r.max_events = r.max_events.max(c.recovered_head);
}

/// Phase 1: the random SIGKILL soak.
///
/// # Errors
/// The first violation, with the seed, cycle and kept directory.
pub fn soak(binary: &Path, o: &SoakOpts) -> Result<SoakReport, Failure> {
    let started = Instant::now();
    let mut rng = Rng::new(o.seed);
    let mut rep = SoakReport { per_workload: o.workloads.iter().map(|w| (w.name().to_string(), 0)).collect(), ..SoakReport::default() };
    let mut site: Option<Site> = None;
    for cycle in 0..o.cycles {
        if cycle % o.round == 0 {
            if let Some(s) = site.take() {
                finish_round(s, cycle, &mut rng, &mut rep)?;
            }
            site = Some(Site::new(o.run_dir.join(format!("round-{}", cycle / o.round)), binary, o.segment_size, o.seed ^ (cycle / o.round)));
            if o.verbose && cycle > 0 {
                eprintln!("[soak] cycle {cycle}/{}: {rep}", o.cycles);
            }
        }
        let s = site.as_mut().unwrap();
        let wi = rng.below(o.workloads.len() as u64) as usize;
        let w = o.workloads[wi];
        let at = format!("soak cycle {cycle} ({})", w.name());
        // Sometimes kill the server while it opens (recovery, rollback zeroing).
        if cycle > 0 && rng.chance(1, 8) {
            let mut srv = s.spec.spawn(&s.data, None);
            std::thread::sleep(Duration::from_millis(rng.below(60)));
            srv.kill();
            rep.startup_kills += 1;
        }
        let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail(at.clone(), vec![e]))?;
        let out = srv.output();
        rep.rollbacks += out.contains("recovered with rollback") as u64;
        rep.removed_segments += out.contains("removed a segment whose creation never finished") as u64;
        let c = s.check(&mut srv, &format!("c{cycle}"), &mut rng).map_err(|v| s.fail(format!("{at}: check after restart"), v))?;
        note(&mut rep, &c, false);
        let ctx = s.ctx(srv.addr(), &format!("c{cycle}"), None);
        let run = workload::start(w, &ctx, &mut rng);
        std::thread::sleep(Duration::from_millis(rng.range(o.kill_ms.0, o.kill_ms.1)));
        srv.kill();
        let out = run.stop();
        if !out.violations.is_empty() {
            return Err(s.fail(at, out.violations));
        }
        rep.cycles += 1;
        rep.acks += out.acks;
        rep.rejects += out.rejects;
        rep.served += out.served;
        rep.per_workload[wi].1 += 1;
    }
    if let Some(s) = site.take() {
        finish_round(s, o.cycles, &mut rng, &mut rep)?;
    }
    rep.elapsed = started.elapsed();
    Ok(rep)
}

fn finish_round(mut s: Site, cycle: u64, rng: &mut Rng, rep: &mut SoakReport) -> Result<(), Failure> {
    let at = format!("final check before cycle {cycle}");
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail(at.clone(), vec![e]))?;
    let c = s.check(&mut srv, &format!("f{cycle}"), rng).map_err(|v| s.fail(at, v))?;
    note(rep, &c, true);
    rep.segments += segment_count(&s.data);
    drop(srv);
    s.remove();
    Ok(())
}

/// Every named crash site, the action armed, and how many hits pass first (`lo..=hi`).
pub const CRASH_SITES: [(&str, &str, u64, u64); 10] = [
    ("segment_extend", "abort", 0, 1),
    ("segment_created_before_commit", "abort", 0, 1),
    ("spare_written_before_naming", "abort", 0, 1),
    ("commit_shortwrite", "abort", 5, 60),
    ("commit_before_fsync", "abort", 5, 60),
    ("torn_marker", "abort", 5, 60),
    ("commit_fsync", "abort", 5, 60),
    ("after_fsync_before_ack", "abort", 5, 60),
    ("partial_ack", "abort", 5, 60),
    ("recovery_midway", "abort", 0, 2),
];

fn run_for(s: &mut Site, srv: &server::Server, tag: &str, w: Workload, ms: u64, rng: &mut Rng) -> Result<workload::Outcome, Failure> {
    let run = workload::start(w, &s.ctx(srv.addr(), tag, None), rng);
    std::thread::sleep(Duration::from_millis(ms));
    Ok(run.stop())
}

/// Restart unarmed, check, run a little more, SIGKILL, restart, check again.
fn recover_and_continue(s: &mut Site, at: &str, rng: &mut Rng) -> Result<String, Failure> {
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail(at.to_string(), vec![e]))?;
    let out = srv.output();
    let c = s.check(&mut srv, &format!("{at}-r1"), rng).map_err(|v| s.fail(format!("{at}: check after restart"), v))?;
    let run = workload::start(Workload::Mixed, &s.ctx(srv.addr(), &format!("{at}-more"), None), rng);
    std::thread::sleep(Duration::from_millis(rng.range(100, 300)));
    srv.kill();
    let o = run.stop();
    if !o.violations.is_empty() {
        return Err(s.fail(format!("{at}: workload after recovery"), o.violations));
    }
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail(at.to_string(), vec![e]))?;
    s.check(&mut srv, &format!("{at}-r2"), rng).map_err(|v| s.fail(format!("{at}: second check"), v))?;
    let rolled = if out.contains("rollback") { ", torn tail rolled back" } else { "" };
    Ok(format!(
        "recovered {} events ({} acknowledged batches verified, in-doubt present/absent {}/{}){rolled}",
        c.recovered_head, c.acked_batches, c.doubtful_present, c.doubtful_absent
    ))
}

/// Phase 2: every crash site armed once with `abort`.
///
/// # Errors
/// The first violation.
pub fn points(binary: &Path, seed: u64, run_dir: &Path, segment_size: u64) -> Result<Vec<String>, Failure> {
    retry_on_hang("crash points", || points_once(binary, seed, run_dir, segment_size))
}

fn points_once(binary: &Path, seed: u64, run_dir: &Path, segment_size: u64) -> Result<Vec<String>, Failure> {
    let mut rng = Rng::new(seed ^ 0x5049_4e54);
    let mut lines = Vec::new();
    for (site_name, action, lo, hi) in CRASH_SITES {
        let mut s = Site::new(run_dir.join(format!("point-{site_name}")), binary, segment_size, seed);
        let at = format!("crash point {site_name}");
        let fail = |s: &Site, v: String| s.fail(at.clone(), vec![v]);
        // Phase A: some data (several segments), ended by SIGKILL.
        let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| fail(&s, e))?;
        let segs_wanted = if site_name == "recovery_midway" { 3 } else { 1 };
        let run = workload::start(Workload::Mixed, &s.ctx(srv.addr(), "a", None), &mut rng);
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(rng.range(150, 400)));
        while segs_wanted > 1 && t.elapsed() < Duration::from_secs(60) && segment_count(&s.data) < segs_wanted {
            std::thread::sleep(Duration::from_millis(50));
        }
        srv.kill();
        let o = run.stop();
        if !o.violations.is_empty() {
            return Err(s.fail(format!("{at}: phase A"), o.violations));
        }
        // Phase B: armed.
        let skip = if site_name == "recovery_midway" { rng.below(segment_count(&s.data).max(1)) } else { rng.range(lo, hi) };
        let arm = format!("{site_name}:{action}:{skip}");
        let (status, output) = if site_name == "recovery_midway" {
            match s.spec.start(&s.data, Some(&arm), Duration::from_secs(60)) {
                Started::Exited(st, out) => (st, out),
                Started::Ready(mut srv) => {
                    srv.kill();
                    return Err(fail(&s, format!("{arm}: the server opened without hitting the crash point")));
                }
            }
        } else {
            let mut srv = s.spec.start_ok(&s.data, Some(&arm)).map_err(|e| fail(&s, e))?;
            let run = workload::start(Workload::Mixed, &s.ctx(srv.addr(), "b", None), &mut rng);
            let st = srv.wait_exit(Duration::from_secs(90));
            let o = run.stop();
            if !o.violations.is_empty() {
                return Err(s.fail(format!("{at}: armed workload"), o.violations));
            }
            let Some(st) = st else {
                srv.kill();
                return Err(fail(&s, format!("{arm}: the crash point never fired in 90 s ({} acks)", o.acks)));
            };
            (st, srv.output())
        };
        if signal_of(status) != Some(libc::SIGABRT) || !output.contains(&format!("crash point {site_name}: abort")) {
            return Err(fail(&s, format!("{arm}: expected an abort at the site, got {status}; output:\n{output}")));
        }
        // Phase C: restart unarmed and check, twice.
        let summary = recover_and_continue(&mut s, &at.to_string(), &mut rng)?;
        lines.push(format!("{arm}: fired; {summary}"));
        s.remove();
    }
    Ok(lines)
}

fn segment_count(data: &Path) -> u64 {
    std::fs::read_dir(data).map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".log")).count() as u64).unwrap_or(0)
}

/// Runs writers against a server armed with an I/O fault until every writer has had two error
/// answers; checks fail-stop: at least one error, every error `INTERNAL`, nothing acknowledged
/// after a writer's first error (checked by the writers), the server's log naming the fault
/// (`logged`: "writer stopped" for a failed write or sync; a failed rollover, which wrote
/// nothing, only refuses the appends that needed it, and the armed fault fails every retry),
/// reads and stats still served and equal to exactly what was acknowledged.
fn fail_stop(s: &mut Site, arm: &str, rng: &mut Rng, expect_zero_acks: bool, logged: &str) -> Result<String, Failure> {
    let at = format!("fault {arm}");
    let fail = |s: &Site, v: String| s.fail(at.clone(), vec![v]);
    let srv = s.spec.start_ok(&s.data, Some(arm)).map_err(|e| fail(s, e))?;
    // What was there before the armed run (a fault may stop the writer before any ack).
    let base_head = workload::connect_timeout(srv.addr())
        .and_then(|mut c| c.stats().map_err(|e| e.to_string()))
        .map_err(|e| fail(s, format!("stats before the fault: {e}")))?
        .event_count;
    let mut ctx = s.ctx(srv.addr(), "fault", Some(2));
    // Only a failed rollover leaves the writer accepting appends after it.
    ctx.acks_after_errors = logged == "rollover failed";
    let run = workload::start(Workload::Pure, &ctx, rng);
    let t = Instant::now();
    while run.live() > 0 && t.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let live = run.live();
    let o = run.stop();
    let mut v = o.violations.clone();
    if live > 0 {
        v.push(format!("{live} writers never got two error answers in 90 s (fault never fired?)"));
    }
    if o.errors.is_empty() || o.errors.iter().any(|c| *c != tephra::proto::ErrorCode::Internal) {
        v.push(format!("expected INTERNAL errors after the fault, got {:?}", o.errors));
    }
    if expect_zero_acks && o.acks != 0 {
        v.push(format!("{} appends acknowledged although every fdatasync failed", o.acks));
    }
    if !srv.output().contains(logged) {
        v.push(format!("the server did not log {logged:?}"));
    }
    // Reads and stats go on, and show exactly what was acknowledged.
    let mut c = workload::connect_timeout(srv.addr()).map_err(|e| fail(s, format!("connect after the fault: {e}")))?;
    match c.read_all(tephra::Query::all(), tephra::Position::ZERO) {
        Ok((evs, wm)) => {
            let want = o.max_acked.max(base_head);
            if wm.get() != want || evs.len() as u64 != want {
                v.push(format!(
                    "after the fault a full read returned {} events (watermark {wm}); {base_head} were there before, the highest acknowledged position is {}",
                    evs.len(),
                    o.max_acked
                ));
            }
        }
        Err(e) => v.push(format!("reads are not served after the fault: {e}")),
    }
    if let Err(e) = c.stats() {
        v.push(format!("stats not served after the fault: {e}"));
    }
    drop(c);
    drop(srv);
    if !v.is_empty() {
        return Err(s.fail(at, v));
    }
    let summary = recover_and_continue(s, &at, rng)?;
    Ok(format!("{arm}: fail-stop after {} acks, {} error answers (all INTERNAL), reads served; restart {summary}", o.acks, o.errors.len()))
}

/// Phase 3: I/O faults.
///
/// # Errors
/// The first violation.
pub fn faults(binary: &Path, seed: u64, run_dir: &Path, segment_size: u64) -> Result<Vec<String>, Failure> {
    retry_on_hang("I/O faults", || faults_once(binary, seed, run_dir, segment_size))
}

fn faults_once(binary: &Path, seed: u64, run_dir: &Path, segment_size: u64) -> Result<Vec<String>, Failure> {
    let mut rng = Rng::new(seed ^ 0x4641_554c);
    let mut lines = Vec::new();
    let warm = |s: &mut Site, rng: &mut Rng| -> Result<(), Failure> {
        let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail("warm-up".into(), vec![e]))?;
        let o = run_for(s, &srv, "warm", Workload::Mixed, rng.range(100, 300), rng)?;
        srv.kill();
        if !o.violations.is_empty() {
            return Err(s.fail("warm-up".into(), o.violations));
        }
        Ok(())
    };
    // fdatasync EIO: on the first sync (zero acks) and after some.
    for (i, skip) in [0, rng.range(5, 40)].into_iter().enumerate() {
        let mut s = Site::new(run_dir.join(format!("fault-eio-{i}")), binary, segment_size, seed);
        if i == 1 {
            warm(&mut s, &mut rng)?;
        }
        lines.push(fail_stop(&mut s, &format!("commit_fsync:eio:{skip}"), &mut rng, skip == 0, "writer stopped")?);
        s.remove();
    }
    // A new segment that cannot be named after its first commit (the rename fails): its
    // batch is not acknowledged and the writer stops, as after a failed fdatasync; the
    // restart finds everything acknowledged.
    let mut s = Site::new(run_dir.join("fault-naming"), binary, segment_size, seed);
    warm(&mut s, &mut rng)?;
    lines.push(fail_stop(&mut s, "segment_naming:eio:0", &mut rng, false, "naming the new segment")?);
    s.remove();
    // A short write: half the batch reaches the disk, then the writer stops.
    let mut s = Site::new(run_dir.join("fault-shortwrite"), binary, segment_size, seed);
    warm(&mut s, &mut rng)?;
    let skip = rng.range(3, 40);
    let line = fail_stop(&mut s, &format!("commit_shortwrite:shortwrite:{skip}"), &mut rng, false, "writer stopped")?;
    if !line.contains("rolled back") {
        return Err(s.fail("fault commit_shortwrite".into(), vec![format!("the half-written batch was not rolled back on restart: {line}")]));
    }
    lines.push(line);
    s.remove();
    // ENOSPC creating the first segment: the server refuses to start, then starts without
    // manual clean-up.
    let mut s = Site::new(run_dir.join("fault-enospc-open"), binary, segment_size, seed);
    match s.spec.start(&s.data, Some("segment_extend:enospc:0"), Duration::from_secs(60)) {
        Started::Exited(st, out) => {
            if st.code() != Some(1) || !out.contains("os error 28") {
                return Err(s.fail("segment_extend:enospc:0".into(), vec![format!("expected exit 1 naming ENOSPC, got {st}:\n{out}")]));
            }
        }
        Started::Ready(_) => return Err(s.fail("segment_extend:enospc:0".into(), vec!["the server started despite ENOSPC on its first segment".into()])),
    }
    let summary = recover_and_continue(&mut s, "segment_extend:enospc:0", &mut rng)?;
    lines.push(format!("segment_extend:enospc:0 (fresh store): start refused with exit 1 naming ENOSPC; restart without clean-up {summary}"));
    s.remove();
    // ENOSPC at every rollover attempt: the appends that need a new segment are refused
    // (nothing was written, so no fail-stop), then the store reopens and rolls over.
    let mut s = Site::new(run_dir.join("fault-enospc-rollover"), binary, segment_size, seed);
    warm(&mut s, &mut rng)?;
    let before = segment_count(&s.data);
    let line = fail_stop(&mut s, "segment_extend:enospc:0", &mut rng, false, "rollover failed")?;
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail("enospc rollover".into(), vec![e]))?;
    let t = Instant::now();
    let run = workload::start(Workload::Pure, &s.ctx(srv.addr(), "roll", None), &mut rng);
    while segment_count(&s.data) <= before + 1 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    srv.kill();
    let o = run.stop();
    let after = segment_count(&s.data);
    if !o.violations.is_empty() || after <= before + 1 {
        let mut v = o.violations;
        v.push(format!("after the ENOSPC restart the store did not roll over: {before} segments before, {after} after"));
        return Err(s.fail("segment_extend:enospc rollover".into(), v));
    }
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail("enospc rollover".into(), vec![e]))?;
    s.check(&mut srv, "roll-check", &mut rng).map_err(|v| s.fail("segment_extend:enospc final check".into(), v))?;
    lines.push(format!("{line}; later rollovers work ({before} -> {after} segments)"));
    s.remove();
    Ok(lines)
}

/// Phase 4: the corruption matrix (see [`corrupt`]).
///
/// # Errors
/// The first case that did not behave.
pub fn corruption(binary: &Path, seed: u64, run_dir: &Path) -> Result<Vec<String>, Failure> {
    retry_on_hang("corruption matrix", || corrupt::corruption(binary, seed, run_dir))
}

/// Runs a phase; when it fails after a liveness failure (a hung server spoils the scenario:
/// the crash point cannot fire, the fault's errors never come), runs it once more. A failure
/// without a hang, or a second failure, stands.
fn retry_on_hang(name: &str, f: impl Fn() -> Result<Vec<String>, Failure>) -> Result<Vec<String>, Failure> {
    let before = hangs().len();
    match f() {
        Err(first) if hangs().len() > before => {
            record_hang(format!("{name} failed after the server stopped answering, running it again; first run: {}", first.violations.join("; ")));
            f().map(|mut l| {
                l.push(format!("{name}: passed on a second run (the first was spoiled by a server hang)"));
                l
            })
        }
        r => r,
    }
}

/// Post-mortem: starts the server on a kept `data/` and runs every check against the kept
/// `witness/` (the event seed of a soak round is the run's seed XOR the round number). The check
/// appends probe events: run it on a copy.
pub fn verify(binary: &Path, seed: u64, root: &Path) -> Result<Vec<String>, Failure> {
    let spec = ServerSpec { binary: binary.to_owned(), segment_size: 256 * 1024, log_path: root.join("verify-server.log") };
    let mut s = Site {
        root: root.to_owned(),
        data: root.join("data"),
        witness: root.join("witness"),
        spec,
        next_seq: Arc::new(AtomicU64::new(u64::MAX / 2)),
        prev: Vec::new(),
        seed,
    };
    let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail("verify".into(), vec![e]))?;
    let c = s.check(&mut srv, "verify", &mut Rng::new(seed)).map_err(|v| s.fail("verify".into(), v))?;
    Ok(vec![format!(
        "{} events, {} acknowledged batches verified, in-flight present/absent {}/{}",
        c.recovered_head, c.acked_batches, c.doubtful_present, c.doubtful_absent
    )])
}

/// A liveness reproducer: `cycles` times, start the server on a small store, then within 3 s
/// connect (Hello), append one event and read it back; SIGKILL. A start whose server does not
/// answer in 3 s (these take milliseconds) is recorded as a hang, with the CPU time of each of
/// the server's threads sampled 1 s apart (asleep executors do not move).
pub fn liveness(binary: &Path, seed: u64, cycles: u64, run_dir: &Path) -> Result<Vec<String>, Failure> {
    let s = Site::new(run_dir.join("liveness"), binary, 256 * 1024, seed);
    let before = hangs().len();
    for cycle in 0..cycles {
        let mut srv = s.spec.start_ok(&s.data, None).map_err(|e| s.fail(format!("liveness cycle {cycle}"), vec![e]))?;
        let (addr, seq) = (srv.addr(), s.next_seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = (|| -> Result<(), String> {
                let mut c = tephra::client::Client::connect(addr).map_err(|e| e.to_string())?;
                let a = c.append(vec![gen::event(seed, seq, None)], None).map_err(|e| e.to_string())?;
                c.read_all(tephra::Query::all(), tephra::Position(a.first.get() - 1)).map_err(|e| e.to_string())?;
                Ok(())
            })();
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(3)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(s.fail(format!("liveness cycle {cycle}"), vec![e])),
            Err(_) => {
                let t1 = thread_ticks(srv.pid());
                std::thread::sleep(Duration::from_secs(1));
                let t2 = thread_ticks(srv.pid());
                record_hang(format!("liveness cycle {cycle}: connect+append+read unanswered for 3 s; thread CPU ticks {t1} -> 1 s later {t2}"));
            }
        }
        srv.kill();
    }
    let n = hangs().len() - before;
    s.remove();
    Ok(vec![format!("{cycles} starts, {n} hung")])
}

fn thread_ticks(pid: u32) -> String {
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
            let (name, rest) = match (stat.find('('), stat.rfind(')')) {
                (Some(a), Some(b)) => (&stat[a + 1..b], &stat[b + 2..]),
                _ => continue,
            };
            let f: Vec<&str> = rest.split(' ').collect();
            let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0) + f.get(12).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0);
            v.push(format!("{name}={ticks}"));
        }
    }
    v.join(",")
}

/// Everything the CI runs: a short soak over all workloads, every crash point, every fault and
/// the corruption matrix.
///
/// # Errors
/// The first violation.
pub fn ci(binary: &Path, seed: u64, cycles: u64, run_dir: &Path) -> Result<Vec<String>, Failure> {
    let mut lines = Vec::new();
    let r = soak(binary, &SoakOpts::ci(seed, cycles, run_dir.join("soak")))?;
    lines.push(format!("soak: {r}"));
    lines.extend(points(binary, seed, run_dir, 64 * 1024)?);
    lines.extend(faults(binary, seed, run_dir, 64 * 1024)?);
    lines.extend(corruption(binary, seed, run_dir)?);
    Ok(lines)
}
