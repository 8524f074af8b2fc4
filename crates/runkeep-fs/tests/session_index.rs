//! The session index behind `list_runs` and `claim_next`: its pages are the walk's pages, byte for byte, whoever changed
//! the directory since the last listing — this store, another store on the
//! same directory, or a writer that knows nothing of any index (the
//! reference layout written by hand: checkpoints renamed into place,
//! holdings written into `claims/`, run directories created, renamed and
//! removed, a checkpoint damaged in place).
//!
//! - `foreign_changes_appear_in_the_next_listing`: one scenario per kind of
//!   change, each followed by a comparison against the walk in both orders
//!   with every filter. Its meta-test re-runs it with the index ignoring
//!   inotify events (mutation `index-ignores-events`) and requires it to
//!   fail: the comparisons are what catches a stale index.
//! - `the_index_lists_what_the_walk_lists_under_random_changes`: the
//!   property: random sequences of store writes and foreign writes, with
//!   every listing of every option set compared page by page (cursors
//!   included) against the walk on the same store.
//! - `a_page_reads_only_its_rows` / `claim_next_reads_a_handful_of_rows`:
//!   the cost, counted in runs whose checkpoints directory was read, not
//!   timed.

mod common;

use std::path::Path;

use common::*;
use proptest::prelude::*;
use runkeep::park::ParkState;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ListOptions, ListOrder, ListingScope, PendingDecision,
    RunPage, RunStatus, Timestamp,
};
use runkeep_fs::FsStore;
use serde_json::{json, Map, Value};

fn listing_scope() -> ListingScope {
    ListingScope::tenant(tenant())
}

/// Every option set the comparison runs: both orders, no filter and each
/// filter (park states, claimed both ways, status).
fn option_sets(now: i64, limit: usize) -> Vec<ListOptions> {
    let mut out = Vec::new();
    for order in [ListOrder::RunId, ListOrder::CreatedAt, ListOrder::Priority] {
        let base = ListOptions {
            order,
            limit: Some(limit),
            now: Some(at(now)),
            ..Default::default()
        };
        out.push(base.clone());
        out.push(ListOptions {
            park: Some(vec![ParkState::Outstanding]),
            ..base.clone()
        });
        out.push(ListOptions {
            park: Some(vec![ParkState::Expired, ParkState::Resolved]),
            ..base.clone()
        });
        out.push(ListOptions {
            claimed: Some(true),
            ..base.clone()
        });
        out.push(ListOptions {
            claimed: Some(false),
            ..base.clone()
        });
        out.push(ListOptions {
            status: Some(vec![RunStatus::Active]),
            ..base.clone()
        });
        out.push(ListOptions {
            min_priority: Some(runkeep::scheduling::Priority::new(1).unwrap()),
            ..base.clone()
        });
        out.push(ListOptions {
            status: Some(vec![RunStatus::Completed, RunStatus::Failed]),
            claimed: Some(false),
            ..base
        });
    }
    out
}

/// Walks every page of `options` through the index and through the walk
/// side by side; the first difference is returned.
fn compare(store: &FsStore, options: &ListOptions) -> Result<usize, String> {
    let rt = rt();
    let mut o = options.clone();
    let mut rows = 0;
    loop {
        let indexed: RunPage = rt
            .block_on(store.list_runs(&listing_scope(), &o))
            .map_err(|e| e.to_string())?;
        let walked = store
            .testing()
            .list_runs_walk(&listing_scope(), &o)
            .map_err(|e| e.to_string())?;
        if indexed != walked {
            return Err(format!(
                "options {o:?}\n indexed {indexed:#?}\n walked {walked:#?}"
            ));
        }
        rows += indexed.entries.len();
        match indexed.cursor {
            Some(c) => o.cursor = Some(c),
            None => return Ok(rows),
        }
    }
}

fn compare_all(store: &FsStore, nows: &[i64], limit: usize) -> Result<usize, String> {
    let mut rows = 0;
    for now in nows {
        for o in option_sets(*now, limit) {
            rows += compare(store, &o)?;
            compare_claim_order(store, &o)?;
        }
    }
    Ok(rows)
}

/// `claim_next`'s candidates (priority first, then the order) from the
/// index and from the walk, in pages of the options' limit.
fn compare_claim_order(store: &FsStore, options: &ListOptions) -> Result<(), String> {
    let o = ListOptions {
        claimed: Some(false),
        ..options.clone()
    };
    let indexed = store
        .testing()
        .claim_order(&listing_scope(), &o, false)
        .map_err(|e| e.to_string())?;
    let walked = store
        .testing()
        .claim_order(&listing_scope(), &o, true)
        .map_err(|e| e.to_string())?;
    if indexed != walked {
        let show = |rows: &[runkeep::RunRow]| -> Vec<String> {
            rows.iter()
                .map(|r| format!("{}:{}:{:?}", r.scope.run_id, r.priority, r.claim))
                .collect()
        };
        return Err(format!(
            "claim order, options {o:?}\n indexed {:?}\n walked {:?}",
            show(&indexed),
            show(&walked)
        ));
    }
    let keys: Vec<_> = walked.iter().map(|r| r.claim_key(o.order)).collect();
    if !keys.windows(2).all(|w| w[0] < w[1]) {
        return Err(format!("claim order not ascending: {keys:#?}"));
    }
    Ok(())
}

fn check_all(store: &FsStore, what: &str) {
    if let Err(e) = compare_all(store, &[20_000, 500_000], 2) {
        panic!("after {what}: the index disagrees with the walk:\n{e}");
    }
    assert!(
        store.testing().index_status().is_ok(),
        "the index is not in use: {:?}",
        store.testing().index_status()
    );
}

/// A checkpoint as the reference writes it: flat JSON, no `fence`, renamed
/// into `checkpoints/` from a temporary name in the same directory.
fn foreign_cp(
    run_dir: &Path,
    run: &str,
    id: &str,
    created: i64,
    run_created: i64,
    park: Option<Option<i64>>,
) {
    let mut c = cp(id, created).with_run_created_at(at(run_created));
    if let Some(deadline) = park {
        let mut p = PendingDecision::new("approval", Map::new(), at(created));
        if let Some(d) = deadline {
            p = p.with_deadline(at(d));
        }
        c = c.with_pending(p);
    }
    let mut m = c.to_json();
    m.insert("runId".into(), Value::from(run));
    m.remove("fence");
    let dir = run_dir.join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!("{id}.json.tmp.{}", rand_suffix()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&Value::Object(m)).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{id}.json"))).unwrap();
}

/// A holding as the reference writes it.
fn foreign_claim(run_dir: &Path, fence: u64, holder: &str, expires: i64) {
    let dir = run_dir.join("claims");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!(".tmp-foreign-{}", rand_suffix()));
    std::fs::write(
        &tmp,
        serde_json::to_vec(&json!({"holder": holder, "expiresAt": expires})).unwrap(),
    )
    .unwrap();
    std::fs::hard_link(&tmp, dir.join(format!("{fence}.json"))).ok();
    std::fs::remove_file(&tmp).unwrap();
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn rewrite_in_place(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn foreign_changes_appear_in_the_next_listing() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    store.testing().wait_index().unwrap();
    let rt = rt();
    for (i, run) in ["run_a", "run_b", "run_c"].iter().enumerate() {
        let c = cp(&format!("cp_{i}"), 1_000 + i as i64).with_run_created_at(at(900 - i as i64));
        rt.block_on(store.write_checkpoint(&scope(run), &c, None))
            .unwrap();
    }
    check_all(&store, "the store's own writes");

    // A new run directory (an event on the store directory).
    foreign_cp(&base.join("run_d"), "run_d", "cp_d", 1_500, 10, None);
    check_all(&store, "a foreign run created");

    // A checkpoint into an existing run: latest and run start move.
    foreign_cp(&base.join("run_b"), "run_b", "cp_b2", 9_000, 5, Some(None));
    check_all(&store, "a foreign checkpoint (parked) into an existing run");

    // A holding: the claimed filter flips.
    foreign_claim(&base.join("run_a"), 1, "ref:1:x", 100_000);
    check_all(&store, "a foreign holding");

    // A sub-run under a run that had no children/ (its run directory's
    // event, then the new children/ directory's).
    foreign_cp(
        &base.join("run_c").join("children").join("run_k"),
        "run_k",
        "cp_k",
        1_700,
        20,
        Some(Some(10_000)),
    );
    check_all(&store, "a foreign sub-run");

    // A second sub-run into the now watched children/.
    foreign_cp(
        &base.join("run_c").join("children").join("run_j"),
        "run_j",
        "cp_j",
        1_800,
        30,
        None,
    );
    check_all(&store, "a second foreign sub-run");

    // In-place damage of a checkpoint (same inode: no rename).
    rewrite_in_place(&base.join("run_a/checkpoints/cp_0.json"), b"{}");
    check_all(&store, "a checkpoint damaged in place");

    // Another store on the same directory (its own index) finishes a run:
    // the lifecycle record and a tombstone.
    let other = open(&base);
    let lease = rt
        .block_on(other.claim(&scope("run_c"), &opts("w2", 60_000, 2_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(other.finish(
        &scope("run_c"),
        lease.fence,
        &runkeep::Outcome::completed(None),
    ))
    .unwrap();
    check_all(&store, "another store's finish");

    // A run directory renamed, then one removed.
    std::fs::rename(base.join("run_d"), base.join("run_e")).unwrap();
    check_all(&store, "a foreign rename of a run directory");
    std::fs::remove_dir_all(base.join("run_b")).unwrap();
    check_all(&store, "a foreign removal of a run directory");

    // A checkpoint removed; a shell directory that later gains a checkpoint.
    std::fs::remove_file(base.join("run_c/children/run_j/checkpoints/cp_j.json")).unwrap();
    check_all(&store, "a foreign checkpoint removal");
    std::fs::create_dir_all(base.join("run_f/checkpoints")).unwrap();
    check_all(&store, "a shell run directory");
    foreign_cp(&base.join("run_f"), "run_f", "cp_f", 2_000, 1, None);
    check_all(&store, "a checkpoint into the shell");

    // A children/ directory inside a sub-run holds no runs (a grandchild lives beside its parent).
    foreign_cp(
        &base.join("run_c/children/run_k/children/run_deep"),
        "run_deep",
        "cp_x",
        2_100,
        1,
        None,
    );
    check_all(&store, "a children/ directory inside a sub-run");

    // The whole children/ directory of a run removed.
    std::fs::remove_dir_all(base.join("run_c/children")).unwrap();
    check_all(&store, "a foreign removal of children/");
}

/// The meta-test: with the index ignoring inotify events the scenario above
/// must fail (else its comparisons could not catch a stale index).
#[test]
fn the_foreign_change_scenario_fails_against_an_index_that_ignores_events() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "foreign_changes_appear_in_the_next_listing",
            "--exact",
            "--test-threads=1",
        ])
        .env("RUNKEEP_FS_TEST_MUTATION", "index-ignores-events")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the scenario passed against an index that ignores events:\n{stdout}"
    );
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("the index disagrees with the walk"),
        "failed for another reason:\n{text}"
    );
}

/// Changes made while the index is being built — after it read the store
/// directory, before it read any run — are all in the built index: each is
/// either read by the build or queued as an event for the first sync.
#[test]
fn changes_during_the_build_are_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    for run in ["run_a", "run_b", "run_c"] {
        rt.block_on(store.write_checkpoint(&scope(run), &cp("cp_1", 1_000), None))
            .unwrap();
    }
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b, flag) = (base.clone(), ran.clone());
    store.testing().on_index_build(move || {
        // A run the build did not see in its read of the store directory,
        // a checkpoint and a holding into runs it did see, a removal.
        foreign_cp(&b.join("run_new"), "run_new", "cp_n", 1_100, 3, Some(None));
        foreign_cp(&b.join("run_a"), "run_a", "cp_2", 5_000, 2, None);
        foreign_claim(&b.join("run_b"), 1, "ref:2:z", 400_000);
        std::fs::remove_dir_all(b.join("run_c")).unwrap();
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    store.testing().wait_index().unwrap();
    assert!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        "the hook ran inside the build"
    );
    check_all(&store, "changes during the build");
    let page = rt
        .block_on(store.list_runs(&listing_scope(), &ListOptions::default()))
        .unwrap();
    let names: Vec<&str> = page
        .entries
        .iter()
        .map(|r| r.scope.run_id.as_str())
        .collect();
    assert_eq!(names, ["run_a", "run_b", "run_new"]);
}

#[derive(Clone, Debug)]
enum Op {
    /// Through the store (unfenced, as an enqueuer writes).
    Write {
        run: usize,
        id: u8,
        created: i64,
        run_created: i64,
        park: Option<Option<i64>>,
    },
    Claim {
        run: usize,
        ttl: u64,
        now: i64,
    },
    Finish {
        run: usize,
    },
    Release {
        run: usize,
    },
    Foreign {
        run: usize,
        id: u8,
        created: i64,
        run_created: i64,
        park: Option<Option<i64>>,
    },
    ForeignClaim {
        run: usize,
        expires: i64,
    },
    Damage {
        run: usize,
    },
    RemoveRun {
        run: usize,
    },
    RemoveCheckpoint {
        run: usize,
    },
    Shell {
        run: usize,
    },
    List {
        limit: usize,
    },
    Priority {
        run: usize,
        priority: i64,
    },
}

/// Run slots: top-level runs and sub-runs (of `run_t0` and `run_t1`).
const RUNS: &[(&str, Option<&str>)] = &[
    ("run_t0", None),
    ("run_t1", None),
    ("run_t2", None),
    ("run_t3", None),
    ("run_s0", Some("run_t0")),
    ("run_s1", Some("run_t0")),
    ("run_s2", Some("run_t1")),
];

fn run_scope(i: usize) -> runkeep::RunScope {
    let (run, parent) = RUNS[i % RUNS.len()];
    match parent {
        Some(p) => child_scope(run, p),
        None => scope(run),
    }
}

fn park_strategy() -> impl Strategy<Value = Option<Option<i64>>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(None)),
        1 => (1_000i64..60_000).prop_map(|d| Some(Some(d))),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let run = 0..RUNS.len();
    prop_oneof![
        4 => (run.clone(), 0u8..4, 1_000i64..50_000, 1i64..5_000, park_strategy()).prop_map(
            |(run, id, created, run_created, park)| Op::Write { run, id, created, run_created, park }
        ),
        3 => (run.clone(), 1_000u64..100_000, 1_000i64..30_000)
            .prop_map(|(run, ttl, now)| Op::Claim { run, ttl, now }),
        1 => run.clone().prop_map(|run| Op::Finish { run }),
        1 => run.clone().prop_map(|run| Op::Release { run }),
        3 => (run.clone(), 4u8..8, 1_000i64..50_000, 1i64..5_000, park_strategy()).prop_map(
            |(run, id, created, run_created, park)| Op::Foreign { run, id, created, run_created, park }
        ),
        2 => (run.clone(), 10_000i64..400_000)
            .prop_map(|(run, expires)| Op::ForeignClaim { run, expires }),
        1 => run.clone().prop_map(|run| Op::Damage { run }),
        1 => run.clone().prop_map(|run| Op::RemoveRun { run }),
        1 => run.clone().prop_map(|run| Op::RemoveCheckpoint { run }),
        1 => run.clone().prop_map(|run| Op::Shell { run }),
        2 => (1usize..4).prop_map(|limit| Op::List { limit }),
        2 => (run.clone(), -2i64..3).prop_map(|(run, priority)| Op::Priority { run, priority }),
    ]
}

fn first_entry(dir: &Path) -> Option<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v.into_iter().next()
}

fn top_fence(run_dir: &Path) -> u64 {
    std::fs::read_dir(run_dir.join("claims"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_suffix(".json")?
                        .parse::<u64>()
                        .ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

fn apply(store: &FsStore, op: &Op, leases: &mut std::collections::HashMap<usize, runkeep::Fence>) {
    let rt = rt();
    match op {
        Op::Write {
            run,
            id,
            created,
            run_created,
            park,
        } => {
            let mut c = cp(&format!("cp_{id}"), *created).with_run_created_at(at(*run_created));
            if let Some(deadline) = park {
                let mut p = PendingDecision::new("approval", Map::new(), at(*created));
                if let Some(d) = deadline {
                    p = p.with_deadline(at(*d));
                }
                c = c.with_pending(p);
            }
            let _ = rt.block_on(store.write_checkpoint(&run_scope(*run), &c, None));
        }
        Op::Claim { run, ttl, now } => {
            if let Ok(o) = rt.block_on(store.claim(&run_scope(*run), &opts("w", *ttl, *now))) {
                if let Some(l) = o.lease() {
                    leases.insert(*run, l.fence);
                }
            }
        }
        Op::Finish { run } => {
            if let Some(f) = leases.remove(run) {
                let _ = rt.block_on(store.finish(
                    &run_scope(*run),
                    f,
                    &runkeep::Outcome::failed("test"),
                ));
            }
        }
        Op::Release { run } => {
            if let Some(f) = leases.remove(run) {
                let _ = rt.block_on(store.release(&run_scope(*run), f));
            }
        }
        Op::Foreign {
            run,
            id,
            created,
            run_created,
            park,
        } => {
            let s = run_scope(*run);
            foreign_cp(
                &store.run_dir(&s),
                s.run_id.as_str(),
                &format!("cp_{id}"),
                *created,
                *run_created,
                *park,
            );
        }
        Op::ForeignClaim { run, expires } => {
            let d = store.run_dir(&run_scope(*run));
            if d.is_dir() {
                foreign_claim(&d, top_fence(&d) + 1, "ref:9:y", *expires);
            }
        }
        Op::Damage { run } => {
            let d = store.run_dir(&run_scope(*run)).join("checkpoints");
            if let Some(p) = first_entry(&d) {
                rewrite_in_place(&p, b"{\"id\": 3}");
            }
        }
        Op::RemoveRun { run } => {
            let _ = std::fs::remove_dir_all(store.run_dir(&run_scope(*run)));
            leases.remove(run);
        }
        Op::RemoveCheckpoint { run } => {
            let d = store.run_dir(&run_scope(*run)).join("checkpoints");
            if let Some(p) = first_entry(&d) {
                let _ = std::fs::remove_file(p);
            }
        }
        Op::Shell { run } => {
            let _ = std::fs::create_dir_all(store.run_dir(&run_scope(*run)));
        }
        Op::List { .. } => {}
        Op::Priority { run, priority } => {
            let p = runkeep::scheduling::Priority::new(*priority).unwrap();
            let _ = rt.block_on(store.set_priority(&run_scope(*run), p));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_index_lists_what_the_walk_lists_under_random_changes(
        ops in proptest::collection::vec(op_strategy(), 1..40)
    ) {
        random_changes_match_the_walk(&ops, None)?;
    }
}

/// Applies `ops` to a fresh store whose index was built first (so every
/// change reaches it as an event, or, over `budget` watches, by a sweep run
/// before each comparison) and compares every listing with the walk.
fn random_changes_match_the_walk(ops: &[Op], budget: Option<u64>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    if let Some(b) = budget {
        store.testing().set_index_watch_budget(b);
        store.testing().pause_index_sweeper(true);
    }
    let sweep = |store: &FsStore| -> Result<(), TestCaseError> {
        if budget.is_some() {
            prop_assert!(store.testing().index_sweep().is_some());
        }
        Ok(())
    };
    let mut leases = std::collections::HashMap::new();
    prop_assert!(store.testing().wait_index().is_ok());
    for op in ops {
        apply(&store, op, &mut leases);
        if let Op::List { limit } = op {
            sweep(&store)?;
            if let Err(e) = compare_all(&store, &[20_000, 45_000, 500_000], *limit) {
                prop_assert!(false, "after {op:?} in {ops:?}: {e}");
            }
            if let Some(b) = budget {
                let (_, _, watches) = store.testing().index_counts().unwrap();
                prop_assert!(watches <= b, "{watches} watches held");
            }
        }
    }
    sweep(&store)?;
    if let Err(e) = compare_all(&store, &[20_000, 500_000], 2) {
        prop_assert!(false, "at the end of {ops:?}: {e}");
    }
    Ok(())
}

fn seed(store: &FsStore, n: usize) {
    let rt = rt();
    for i in 0..n {
        let c = cp("cp_1", 1_000 + i as i64).with_run_created_at(at(10_000 - i as i64));
        rt.block_on(store.write_checkpoint(&scope(&format!("run_{i:04}")), &c, None))
            .unwrap();
    }
}

/// Claims and finishes (completed) the seeded run `i`.
fn finish_seeded(store: &FsStore, i: usize) {
    let rt = rt();
    let s = scope(&format!("run_{i:04}"));
    let lease = rt
        .block_on(store.claim(&s, &opts("w", 60_000, 2_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.finish(&s, lease.fence, &runkeep::Outcome::completed(None)))
        .unwrap();
}

/// Runs whose checkpoints directory was listed since `before`.
fn runs_read(base: &Path, n: usize, before: &[u64]) -> usize {
    (0..n)
        .filter(|i| {
            runkeep_fs::testing::checkpoint_dir_listings(base.join(format!("run_{i:04}")))
                > before[*i]
        })
        .count()
}

fn listings(base: &Path, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| runkeep_fs::testing::checkpoint_dir_listings(base.join(format!("run_{i:04}"))))
        .collect()
}

#[test]
fn a_page_reads_only_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    let n = 60;
    seed(&store, n);
    let rt = rt();
    let first = ListOptions {
        order: ListOrder::CreatedAt,
        limit: Some(5),
        ..Default::default()
    };
    // The first listing walks and starts the build (which reads every run
    // once).
    let walked = rt
        .block_on(store.list_runs(&listing_scope(), &first))
        .unwrap();
    store.testing().wait_index().unwrap();
    let before = listings(&base, n);
    let page = rt
        .block_on(store.list_runs(&listing_scope(), &first))
        .unwrap();
    assert_eq!(page, walked);
    // Created-at order: the walk reads every run's digest; the index reads
    // the page's rows and the one that says more remain.
    assert_eq!(runs_read(&base, n, &before), 6, "created-at page of 5");
    let before = listings(&base, n);
    let deep = rt
        .block_on(store.list_runs(
            &listing_scope(),
            &ListOptions {
                cursor: page.cursor.clone(),
                ..first.clone()
            },
        ))
        .unwrap();
    assert_eq!(deep.entries.len(), 5);
    assert_eq!(runs_read(&base, n, &before), 6, "the next page");
    // The walk, for contrast, reads them all.
    let before = listings(&base, n);
    store
        .testing()
        .list_runs_walk(&listing_scope(), &first)
        .unwrap();
    assert_eq!(runs_read(&base, n, &before), n, "the walk");
}

#[test]
fn claim_next_reads_a_handful_of_rows() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    let n = 120;
    seed(&store, n);
    let rt = rt();
    let filter = ClaimNextFilter::default();
    let o = opts("w", 60_000, Timestamp::now().as_millis());
    // Walks (the index is being built).
    rt.block_on(store.claim_next(&listing_scope(), &filter, &o))
        .unwrap()
        .unwrap();
    store.testing().wait_index().unwrap();
    rt.block_on(store.claim_next(&listing_scope(), &filter, &o))
        .unwrap()
        .unwrap();
    for _ in 0..3 {
        let before = listings(&base, n);
        let (s, _) = rt
            .block_on(store.claim_next(&listing_scope(), &filter, &o))
            .unwrap()
            .unwrap();
        let read = runs_read(&base, n, &before);
        // The run the previous call claimed (its claims/ changed: re-read
        // by the index) and the run this call claims.
        assert!(
            read <= 2,
            "claim_next of {} read {read} runs' checkpoints",
            s.run_id
        );
    }
}

/// With priorities, `claim_next` takes the highest first (run id among
/// equals) and still reads a handful of runs per call: the index's claim
/// table is in that order.
#[test]
fn claim_next_takes_the_highest_priority_first_reading_a_handful_of_rows() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    let n = 120;
    seed(&store, n);
    let rt = rt();
    // Runs 100..105 at priority 5, 50..53 at 2, the rest at 0.
    for (i, p) in (100..105).map(|i| (i, 5)).chain((50..53).map(|i| (i, 2))) {
        rt.block_on(store.set_priority(
            &scope(&format!("run_{i:04}")),
            runkeep::scheduling::Priority::new(p).unwrap(),
        ))
        .unwrap();
    }
    store.testing().wait_index().unwrap();
    let filter = ClaimNextFilter::default();
    let o = opts("w", 60_000, Timestamp::now().as_millis());
    let mut taken = Vec::new();
    for _ in 0..10 {
        let before = listings(&base, n);
        let (s, _) = rt
            .block_on(store.claim_next(&listing_scope(), &filter, &o))
            .unwrap()
            .unwrap();
        let read = runs_read(&base, n, &before);
        assert!(read <= 2, "claim_next of {} read {read} runs", s.run_id);
        taken.push(s.run_id.to_string());
    }
    assert_eq!(
        taken,
        [
            "run_0100", "run_0101", "run_0102", "run_0103", "run_0104", "run_0050", "run_0051",
            "run_0052", "run_0000", "run_0001"
        ]
    );
}

// ---------------------------------------------------------------------------
// Over the watch budget: run directories swept by stamp.

/// Every run swept (a budget of one watch: the store directory's). Each
/// foreign change is first shown to be missing from the index — the run is
/// swept, nothing told the index — and then present after one sweep pass,
/// compared with the walk in both orders and every filter.
#[test]
fn over_the_watch_budget_a_sweep_brings_in_every_foreign_change() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    for (i, run) in ["run_a", "run_b", "run_c"].iter().enumerate() {
        let c = cp(&format!("cp_{i}"), 1_000 + i as i64).with_run_created_at(at(900 - i as i64));
        rt.block_on(store.write_checkpoint(&scope(run), &c, None))
            .unwrap();
    }
    store.testing().set_index_watch_budget(1);
    store.testing().pause_index_sweeper(true);
    store.testing().wait_index().unwrap();
    let (entries, swept, watches) = store.testing().index_counts().unwrap();
    assert_eq!((entries, swept, watches), (3, 3, 1), "every run swept");
    check_all(&store, "the build");

    // Each change: late before the sweep (the listing whose filter the
    // stale entry fails differs from the walk: nothing told the index),
    // right after it.
    let revealing =
        |park: Option<Vec<ParkState>>, claimed, status: Option<Vec<RunStatus>>| ListOptions {
            park,
            claimed,
            status,
            limit: Some(2),
            now: Some(at(50_000)),
            ..Default::default()
        };
    let step = |what: &str, late: Option<ListOptions>| {
        if let Some(o) = late {
            assert!(
                compare(&store, &o).is_err(),
                "after {what}: the index was not late, so the run was not swept"
            );
        }
        let (_, reread) = store.testing().index_sweep().expect("a sweep");
        assert!(reread >= 1, "after {what}: the sweep re-read nothing");
        check_all(&store, what);
    };
    foreign_cp(&base.join("run_b"), "run_b", "cp_b2", 9_000, 5, Some(None));
    step(
        "a foreign checkpoint (parked) into a swept run",
        Some(revealing(Some(vec![ParkState::Outstanding]), None, None)),
    );
    foreign_claim(&base.join("run_a"), 1, "ref:1:x", 100_000);
    step(
        "a foreign holding on a swept run",
        Some(revealing(None, Some(true), None)),
    );
    foreign_cp(
        &base.join("run_c").join("children").join("run_k"),
        "run_k",
        "cp_k",
        1_700,
        20,
        Some(Some(10_000)),
    );
    step(
        "a foreign sub-run under a swept run",
        Some(revealing(None, None, None)),
    );
    let other = open(&base);
    let lease = rt
        .block_on(other.claim(&scope("run_c"), &opts("w2", 60_000, 2_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(other.finish(
        &scope("run_c"),
        lease.fence,
        &runkeep::Outcome::completed(None),
    ))
    .unwrap();
    step(
        "another store's finish of a swept run",
        Some(revealing(None, None, Some(vec![RunStatus::Completed]))),
    );
    // (A row that stops being a row is left out by the page's own read,
    // so this one cannot be seen late.)
    std::fs::remove_file(base.join("run_c/children/run_k/checkpoints/cp_k.json")).unwrap();
    step("a checkpoint removed from a swept sub-run", None);
    // New run directories appear through the store directory's watch, at
    // once; removal of a swept one too.
    foreign_cp(&base.join("run_d"), "run_d", "cp_d", 1_500, 10, None);
    check_all(&store, "a foreign run created");
    std::fs::remove_dir_all(base.join("run_b")).unwrap();
    check_all(&store, "a swept run removed");
    let (_, swept, watches) = store.testing().index_counts().unwrap();
    assert_eq!(watches, 1, "over the budget");
    assert!(swept >= 3, "{swept} swept");
}

/// Stamps decide: with young stamps trusted, a sweep over unchanged runs
/// re-reads none, and after one run's change exactly that run. (Mutation
/// tried: a stamp that hashes only the directories' inode numbers ->
/// `reread` 0 after the change and the comparison fails.)
#[test]
fn a_sweep_re_reads_exactly_the_runs_whose_stamp_moved() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    seed(&store, 20);
    store.testing().set_index_watch_budget(1);
    store.testing().trust_young_index_stamps();
    store.testing().pause_index_sweeper(true);
    store.testing().wait_index().unwrap();
    // Past the coarsest timestamp tick, so a change cannot share the
    // stamp's tick (kernels with multigrain timestamps never would).
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(
        store.testing().index_sweep(),
        Some((20, 0)),
        "nothing moved"
    );
    foreign_claim(&base.join("run_0007"), 1, "ref:1:x", 4_000_000_000_000);
    assert_eq!(
        store.testing().index_sweep(),
        Some((20, 1)),
        "one run moved"
    );
    check_all(&store, "a holding on one swept run");
    foreign_cp(
        &base.join("run_0003"),
        "run_0003",
        "cp_2",
        9_000,
        5,
        Some(None),
    );
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(store.testing().index_sweep(), Some((20, 1)));
    check_all(&store, "a checkpoint into another");
}

/// The sweeper thread does it unprompted: a foreign change to a swept run
/// shows in a listing within a few seconds (polled; the bound is the
/// sweeper's pace, not asserted as a time).
#[test]
fn the_sweeper_thread_brings_in_a_change_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    seed(&store, 5);
    store.testing().set_index_watch_budget(1);
    store.testing().wait_index().unwrap();
    foreign_claim(&base.join("run_0002"), 1, "ref:1:x", 4_000_000_000_000);
    let claimed = ListOptions {
        claimed: Some(true),
        ..Default::default()
    };
    let rt = rt();
    let mut seen = false;
    for _ in 0..600 {
        let page = rt
            .block_on(store.list_runs(&listing_scope(), &claimed))
            .unwrap();
        if page.entries.len() == 1 {
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(seen, "the sweeper never brought the holding in");
    check_all(&store, "the sweeper's pass");
}

/// A run that is not finished takes the watches of a finished one: with
/// room for three runs, all finished, a new run is first swept (it was
/// never read: a build evicts nothing), and at its first change — seen by a
/// sweep, read as not finished — it takes a finished run's watches, so its
/// next change is in the very next listing, no sweep.
#[test]
fn a_run_that_moves_takes_the_watches_of_a_finished_one() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    seed(&store, 3);
    for i in 0..3 {
        finish_seeded(&store, i);
    }
    let probe = runkeep_fs::IndexOutlook::of(&base);
    store.testing().set_index_watch_budget(probe.watches);
    store.testing().pause_index_sweeper(true);
    store.testing().wait_index().unwrap();
    assert_eq!(
        store.testing().index_counts().unwrap(),
        (3, 0, probe.watches),
        "all watched"
    );
    foreign_cp(&base.join("run_new"), "run_new", "cp_n", 5_000, 7, None);
    check_all(&store, "a new run");
    assert_eq!(
        store.testing().index_counts().unwrap(),
        (4, 1, probe.watches),
        "the new run is swept: a run not read yet evicts nothing"
    );
    foreign_claim(&base.join("run_new"), 1, "ref:1:x", 4_000_000_000_000);
    let (_, reread) = store.testing().index_sweep().unwrap();
    assert!(reread >= 1);
    let (entries, swept, watches) = store.testing().index_counts().unwrap();
    assert_eq!(
        (entries, swept),
        (4, 1),
        "the moving run took a finished run's watches"
    );
    assert!(watches <= probe.watches);
    assert_eq!(store.testing().index_evictions(), Some(1));
    check_all(&store, "the sweep");
    // Watched now: its next holding shows without a sweep, in the very
    // listing whose filter a stale entry would fail (run first: any other
    // listing that reads the run would correct its entry). (Mutation
    // tried: no eviction -> the run stays swept and this fails.)
    foreign_claim(&base.join("run_new"), 2, "", 0);
    let unclaimed = ListOptions {
        claimed: Some(false),
        limit: Some(2),
        now: Some(at(50_000)),
        ..Default::default()
    };
    if let Err(e) = compare(&store, &unclaimed) {
        panic!("the run's release is late, so it was not watched: {e}");
    }
    check_all(&store, "a release of the moving run, no sweep");
}

/// A build evicts nothing, however many of its runs are finished: an
/// eviction drops watches, each dropped watch queues an event, and a build
/// that evicted one finished run per run past the budget overflowed the
/// inotify queue at 100 000 runs (16 384 events) and rebuilt forever (found
/// by the bench at this VM's default watch limit). Mutation tried: runs not
/// read yet may evict -> 3 evictions here.
#[test]
fn a_build_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    let store = open(&base);
    seed(&store, 24);
    for i in (0..24).step_by(2) {
        finish_seeded(&store, i);
    }
    store.testing().set_index_watch_budget(12);
    store.testing().pause_index_sweeper(true);
    store.testing().wait_index().unwrap();
    assert_eq!(store.testing().index_evictions(), Some(0));
    let (entries, swept, watches) = store.testing().index_counts().unwrap();
    assert_eq!(entries, 24);
    assert!(swept >= 20, "{swept} swept with room for 12 watches");
    assert!(watches <= 12);
    check_all(&store, "a build over the budget");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    /// The property above with room for only a few runs' watches: some
    /// runs watched, some swept, watches moving from finished runs to
    /// others; a sweep before each comparison.
    #[test]
    fn over_the_watch_budget_the_index_lists_what_the_walk_lists(
        ops in proptest::collection::vec(op_strategy(), 1..40)
    ) {
        random_changes_match_the_walk(&ops, Some(10))?;
    }
}
