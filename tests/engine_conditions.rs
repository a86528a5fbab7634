//! The append-condition verdict against a brute-force oracle (docs/protocol.md §2.3, docs/architecture.md §4.3).
//!
//! Random histories (few types, few tags, random tag subsets, multi-event batches) go into
//! stores with tiny segments, so the history crosses segment boundaries; random conditions
//! (`Query::All`, `none`, items with types and tags, unknown names, `after` anywhere from 0 to
//! past the tip) are judged by the store and by a linear scan over the list of events this test
//! appended. Three stores run the same operations: index only, forced log scan, and index with
//! `verify_tips`. Then every store is reopened (the index is rebuilt from the log) and a second
//! run of operations must give the same verdicts again.

mod engine_util;

use engine_util::*;
use proptest::prelude::*;
use tephra::*;

use engine_util::history::*;

#[derive(Clone, Debug)]
struct CondSpec {
    boundary: QSpec,
    /// `after` is this modulo `tip + 2`, so it is sometimes past the tip.
    after_seed: u64,
    exists: Option<QSpec>,
}

#[derive(Clone, Debug)]
struct Op {
    batch: Vec<EvSpec>,
    cond: Option<CondSpec>,
}

fn cond_spec() -> impl Strategy<Value = CondSpec> {
    (q_spec(), any::<u64>(), proptest::option::weighted(0.4, q_spec())).prop_map(|(boundary, after_seed, exists)| CondSpec { boundary, after_seed, exists })
}

fn op() -> impl Strategy<Value = Op> {
    (proptest::collection::vec(ev_spec(), 1..=4), proptest::option::weighted(0.7, cond_spec())).prop_map(|(batch, cond)| Op { batch, cond })
}

/// What the oracle says the append of `op` onto `history` must return.
fn oracle(history: &[EvSpec], op: &Op) -> (Option<AppendCondition>, Result<(u64, u64), AppendError>) {
    let tip = history.len() as u64;
    let pass = Ok((tip + 1, tip + op.batch.len() as u64));
    let Some(c) = &op.cond else { return (None, pass) };
    let after = c.after_seed % (tip + 2);
    let mut cond = AppendCondition::new(c.boundary.query()).after(Position(after));
    if let Some(q) = &c.exists {
        cond = cond.fail_if_exists(q.query());
    }
    if after > tip {
        return (Some(cond), Err(AppendError::AfterBeyondTip { after, tip }));
    }
    let first = |q: &QSpec, after: u64| (after + 1..=tip).find(|&p| q.matches(&history[(p - 1) as usize]));
    if let Some(p) = first(&c.boundary, after) {
        return (Some(cond), Err(AppendError::Conflict { clause: ConflictClause::Boundary, at: ConflictSite::Durable(p) }));
    }
    if let Some(p) = c.exists.as_ref().and_then(|q| first(q, 0)) {
        return (Some(cond), Err(AppendError::Conflict { clause: ConflictClause::Existence, at: ConflictSite::Durable(p) }));
    }
    (Some(cond), pass)
}

fn configs() -> Vec<(&'static str, StoreConfig)> {
    // 512-byte segments hold about a dozen of these events: histories span several segments.
    let mut index = cfg(512);
    index.writer.verify_tips = false;
    let mut scan = cfg(512);
    scan.writer.condition_force_scan = true;
    scan.writer.verify_tips = true;
    let mut verify = cfg(512);
    verify.writer.verify_tips = true;
    vec![("index", index), ("scan", scan), ("index+verify", verify)]
}

/// Runs `ops` on every store (one thread per store, so their fsyncs overlap) and checks each
/// verdict and the final contents against the oracle; `history` is the oracle's log.
fn run_ops(stores: &[(&str, Store)], history: &mut Vec<EvSpec>, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut plan = Vec::with_capacity(ops.len());
    for op in ops {
        let (cond, want) = oracle(history, op);
        if want.is_ok() {
            history.extend(op.batch.iter().cloned());
        }
        plan.push((op.batch.iter().map(EvSpec::event).collect::<Vec<_>>(), cond, want));
    }
    let history = &*history;
    let plan = &plan;
    std::thread::scope(|sc| {
        let runs: Vec<_> = stores
            .iter()
            .map(|(name, s)| {
                let h = s.handle();
                sc.spawn(move || -> Result<(), TestCaseError> {
                    for (i, ((events, cond, want), op)) in plan.iter().zip(ops).enumerate() {
                        let got = h.append(events.clone(), cond.clone()).map(|r| (r.first.get(), r.last.get()));
                        prop_assert_eq!(&got, want, "store {} op {} cond {:?}", name, i, op.cond);
                    }
                    let all = read_all(&h);
                    prop_assert_eq!(all.len(), history.len(), "store {}", name);
                    for ((p, e), (i, spec)) in all.iter().zip(history.iter().enumerate()) {
                        prop_assert_eq!(*p, i as u64 + 1);
                        let want = spec.event();
                        prop_assert_eq!(e.as_bytes(), want.as_bytes(), "store {} position {}", name, p);
                    }
                    Ok(())
                })
            })
            .collect();
        runs.into_iter().try_for_each(|r| r.join().unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn store_verdicts_match_a_brute_force_oracle(
        before in proptest::collection::vec(op(), 4..14),
        after_reopen in proptest::collection::vec(op(), 2..8),
    ) {
        let dirs: Vec<_> = configs().into_iter().map(|(n, c)| (n, c, dir())).collect();
        let mut history = Vec::new();
        {
            let stores: Vec<_> = dirs.iter().map(|(n, c, d)| (*n, Store::open(d.path(), c.clone()).unwrap())).collect();
            run_ops(&stores, &mut history, &before)?;
        }
        let stores: Vec<_> = dirs.iter().map(|(n, c, d)| (*n, Store::open(d.path(), c.clone()).unwrap())).collect();
        for (name, s) in &stores {
            prop_assert_eq!(s.handle().head(), Position(history.len() as u64), "store {} after reopen", name);
        }
        // The conditions of the first run judge the same after the reopen (every one of them now
        // sees the final history), then new ones.
        let replay: Vec<Op> = before.iter().filter(|o| o.cond.is_some()).cloned().chain(after_reopen).collect();
        run_ops(&stores, &mut history, &replay)?;
    }
}

/// A deterministic history over several segments with every query shape; cheap enough to run
/// on every build even when proptest's case count is turned down.
#[test]
fn verdicts_across_segment_boundaries_and_reopen() {
    let d = dir();
    let mut c = cfg(512);
    c.writer.verify_tips = false;
    let q = |types: &[&str], tags: &[&str]| {
        Query::item(QueryItem::new(types.iter().map(|t| EventType::new(*t).unwrap()).collect(), Tags::new(tags.iter().copied()).unwrap()))
    };
    let check = |h: &StoreHandle| {
        let seg_count = h.stats().segment_count;
        assert!(seg_count >= 3, "history should span segments, got {seg_count}");
        let conflict = |clause, p| Err(AppendError::Conflict { clause, at: ConflictSite::Durable(p) });
        let probe = |cond: AppendCondition| h.append(vec![ev("Probe", &["probe"], b"")], Some(cond)).map(|_| ());
        // "k:N" is carried only by position N; "all" by 1..=40; Probe events carry only "probe".
        assert_eq!(probe(AppendCondition::new(q(&[], &["k:7"]))), conflict(ConflictClause::Boundary, 7));
        assert_eq!(probe(AppendCondition::new(q(&[], &["k:40"]))), conflict(ConflictClause::Boundary, 40));
        assert_eq!(probe(AppendCondition::new(q(&["Odd"], &["k:40"]))), Ok(()));
        assert_eq!(probe(AppendCondition::new(q(&["Even"], &["k:40", "all"]))), conflict(ConflictClause::Boundary, 40));
        assert_eq!(probe(AppendCondition::new(q(&["Odd"], &[])).after(Position(30))), conflict(ConflictClause::Boundary, 31));
        assert_eq!(probe(AppendCondition::exists_only(q(&["Even"], &["all"])).after(Position(41))), conflict(ConflictClause::Existence, 2));
        assert_eq!(probe(AppendCondition::new(Query::all()).after(Position(38)).fail_if_exists(q(&[], &["nope"]))), conflict(ConflictClause::Boundary, 39));
        assert_eq!(probe(AppendCondition::new(q(&[], &["k:1"])).after(Position(1)).fail_if_exists(Query::none())), Ok(()));
    };
    {
        let s = Store::open(d.path(), c.clone()).unwrap();
        let h = s.handle();
        for i in 1..=40u64 {
            let ty = if i % 2 == 0 { "Even" } else { "Odd" };
            h.append(vec![ev(ty, &[&format!("k:{i}"), "all"], &[i as u8; 9])], None).unwrap();
        }
        check(&h);
    }
    // Each probe that passed appended one "Probe" event; the same probes judge the same again
    // once the index is rebuilt from the log, with the new events in it.
    let s = Store::open(d.path(), c).unwrap();
    let h = s.handle();
    assert_eq!(h.head(), Position(42));
    check(&h);
}

/// Many threads race uniqueness guards on the same keys, so guards meet in one group commit
/// (the same-batch arm) as well as across commits (the durable arm): exactly one append per key
/// wins, and every loser names the winner's position or `SameBatch`.
#[test]
fn concurrent_uniqueness_guards_admit_exactly_one_winner_per_key() {
    let d = dir();
    let s = Store::open(d.path(), cfg(4096)).unwrap();
    const THREADS: usize = 8;
    const KEYS: usize = 30;
    let barrier = std::sync::Barrier::new(THREADS);
    let results: Vec<Vec<(usize, Result<u64, AppendError>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let h = s.handle();
                let barrier = &barrier;
                sc.spawn(move || {
                    let mut out = Vec::new();
                    for key in 0..KEYS {
                        let tag = format!("key:{key}");
                        let q = Query::item(QueryItem::with_tags(Tags::new([tag.clone()]).unwrap()));
                        // Odd keys use the boundary clause, even keys the existence clause.
                        let cond = if key % 2 == 1 { AppendCondition::new(q) } else { AppendCondition::exists_only(q) };
                        barrier.wait();
                        let r = h.append(vec![ev("Claim", &[&tag, &format!("thread:{t}")], b"")], Some(cond));
                        out.push((key, r.map(|r| r.first.get())));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let h = s.handle();
    let mut same_batch = 0;
    for key in 0..KEYS {
        let outcomes: Vec<&Result<u64, AppendError>> = results.iter().flatten().filter(|(k, _)| *k == key).map(|(_, r)| r).collect();
        let winners: Vec<u64> = outcomes.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
        assert_eq!(winners.len(), 1, "key {key}: {outcomes:?}");
        let clause = if key % 2 == 1 { ConflictClause::Boundary } else { ConflictClause::Existence };
        for r in outcomes.iter().filter(|r| r.is_err()) {
            match r {
                Err(AppendError::Conflict { clause: c, at: ConflictSite::Durable(p) }) => {
                    assert_eq!((*c, *p), (clause, winners[0]), "key {key}");
                }
                Err(AppendError::Conflict { clause: c, at: ConflictSite::SameBatch }) => {
                    assert_eq!(*c, clause);
                    same_batch += 1;
                }
                other => panic!("key {key}: {other:?}"),
            }
        }
        let q = Query::item(QueryItem::with_tags(Tags::new([format!("key:{key}")]).unwrap()));
        let stored: Vec<u64> = h.read(q, Position::ZERO, None).collect_owned().unwrap().into_iter().map(|(p, _)| p.get()).collect();
        assert_eq!(stored, winners, "key {key}: the log holds other claims");
    }
    assert_eq!(h.head(), Position(KEYS as u64));
    eprintln!("same-batch conflicts: {same_batch} of {}", KEYS * (THREADS - 1));
}
