//! Listing at scale (a page costs O(page)): one page of 100 over 1 000, 10 000
//! and 100 000 runs, first and deep (a cursor half-way), in both orders,
//! with the park, claimed and status filters, and a `claim_next` + release
//! cycle — from the session index — plus the walk (the index's fallback and
//! oracle) at 1 000 and 10 000 runs for contrast.
//!
//! The fixtures are written in the reference layout directly (no digest, no
//! lifecycle machinery except a finished run's record), by a small
//! generator, once per size under `/tmp/runkeep-bench-listing-v1-<n>/` and
//! reused by later runs (a `.complete` marker; delete the directory to
//! regenerate). Every 10th run is parked outstanding, every 10th (+5)
//! expired, every 10th (+3) answered; every 3rd run is held by a live lease
//! and every 3rd (+1) by an expired one; every 7th is finished; every 50th
//! has a sub-run. The index holds about four inotify watches per run, up
//! to half of `fs.inotify.max_user_watches`: with the limit at 1 048 576
//! every run of 100 000 is watched; at this VM's default (192 530) about
//! three quarters of them are swept by stamp (the bench prints how many and
//! what one sweep pass costs). `RUNKEEP_BENCH_SIZES=100000` measures one
//! size.
//!
//! `cargo bench -p runkeep-fs --bench listing_scale`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use runkeep::park::ParkState;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, Holder, ListOptions,
    ListOrder, ListingScope, PendingDecision, ProjectId, RunStatus, SessionId, TenantId, Timestamp,
    Ttl,
};
use runkeep_fs::testing::inline;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map, Value};

fn attribution() -> Attribution {
    Attribution {
        tenant_id: TenantId::new("tnt_bench").unwrap(),
        project_id: ProjectId::new("prj_bench").unwrap(),
        session_id: SessionId::new("ses_bench").unwrap(),
    }
}

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
/// Far in the future: live leases.
const LIVE: i64 = 4_000_000_000_000;

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn checkpoint_json(run: &str, created: i64, park: u64) -> Value {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(1));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "list me"}]),
    );
    let mut cp = Checkpoint::new(
        CheckpointId::new("cp_1").unwrap(),
        Timestamp::from_millis(created + 10).unwrap(),
        state,
    )
    .with_run_created_at(Timestamp::from_millis(created).unwrap());
    let parked = Timestamp::from_millis(created + 10).unwrap();
    let pending = match park {
        0 => Some(PendingDecision::new("approval", Map::new(), parked)),
        5 => Some(
            PendingDecision::new("approval", Map::new(), parked)
                .with_deadline(Timestamp::from_millis(created + 20).unwrap()),
        ),
        3 => {
            let mut p = PendingDecision::new("approval", Map::new(), parked);
            p.resolved_at = Some(Timestamp::from_millis(created + 30).unwrap());
            p.decision = Some(json!({"approved": true}));
            Some(p)
        }
        _ => None,
    };
    if let Some(p) = pending {
        cp = cp.with_pending(p);
    }
    let mut m = cp.to_json();
    m.insert("runId".into(), Value::from(run));
    Value::Object(m)
}

/// One run in the reference layout (plus a finished run's record).
fn write_run(dir: &Path, run: &str, i: usize, created: i64) {
    let cps = dir.join("checkpoints");
    std::fs::create_dir_all(&cps).unwrap();
    write_json(
        &cps.join("cp_1.json"),
        &checkpoint_json(run, created, (i % 10) as u64),
    );
    let claims = dir.join("claims");
    match i % 3 {
        0 => {
            std::fs::create_dir_all(&claims).unwrap();
            write_json(
                &claims.join("1.json"),
                &json!({"holder": "ref:1:bench", "expiresAt": LIVE}),
            );
        }
        1 => {
            std::fs::create_dir_all(&claims).unwrap();
            write_json(
                &claims.join("1.json"),
                &json!({"holder": "ref:1:bench", "expiresAt": 1_000}),
            );
        }
        _ => {}
    }
    if i.is_multiple_of(7) {
        std::fs::create_dir_all(&claims).unwrap();
        write_json(
            &claims.join("2.json"),
            &json!({"holder": "", "expiresAt": 0}),
        );
        let meta = dir.join(".runkeep");
        std::fs::create_dir_all(&meta).unwrap();
        write_json(
            &meta.join("lifecycle.json"),
            &json!({
                "format": "runkeep.lifecycle.v1",
                "asOfFence": 2,
                "status": "completed",
                "finishedAt": created + 50,
                "finishedFence": 1,
                "attempts": 0
            }),
        );
    }
}

/// The fixture of `n` runs (generated once, reused).
fn fixture(n: usize) -> PathBuf {
    let root = std::env::temp_dir().join(format!("runkeep-bench-listing-v1-{n}"));
    let base = root.join("runs");
    if root.join(".complete").exists() {
        return base;
    }
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&base).unwrap();
    let t = Instant::now();
    for i in 0..n {
        let run = format!("run_{i:06}");
        // Run starts in another order than the ids (a permutation).
        let created = 1_000_000 + ((i * 7_919) % n) as i64 * 1_000;
        let dir = base.join(&run);
        write_run(&dir, &run, i, created);
        if i.is_multiple_of(50) {
            let kid = format!("run_{i:06}_k");
            write_run(&dir.join("children").join(&kid), &kid, i + 1, created + 1);
        }
    }
    std::fs::write(root.join(".complete"), b"").unwrap();
    eprintln!("fixture of {n} runs written in {:?}", t.elapsed());
    base
}

fn open(base: &Path) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            ..Default::default()
        },
    )
    .unwrap()
}

/// `RUNKEEP_BENCH_SIZES=100000` (comma-separated) measures only those sizes.
fn sizes() -> Vec<usize> {
    match std::env::var("RUNKEEP_BENCH_SIZES") {
        Ok(v) => v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn listing(c: &mut Criterion) {
    // The test seams' per-run counters are not the store's cost.
    runkeep_fs::testing::stop_counting();
    let a = attribution();
    let session = ListingScope::session(a.tenant_id, a.project_id, a.session_id);
    let now = Timestamp::now();
    let page = |order: ListOrder| ListOptions {
        order,
        limit: Some(100),
        now: Some(now),
        ..Default::default()
    };
    let mut g = c.benchmark_group("list_scale");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    for n in sizes() {
        let base = fixture(n);
        let store = open(&base);
        let t = Instant::now();
        let built = store.testing().wait_index();
        eprintln!("index of {n} runs: {built:?} in {:?}", t.elapsed());
        if let Ok((entries, swept, watches)) = store.testing().index_counts() {
            eprintln!("  {entries} run directories, {swept} swept by stamp, {watches} inotify watches held");
            if swept > 0 {
                let t = Instant::now();
                let pass = store.testing().index_sweep();
                eprintln!(
                    "  one sweep pass: {pass:?} (checked, re-read) in {:?}",
                    t.elapsed()
                );
            }
        }
        assert!(
            built.is_ok(),
            "the index is not in use at {n} runs ({built:?}); the bench would measure the walk instead"
        );
        // Option sets: (name, options); each measured first and deep.
        let sets: Vec<(&str, ListOptions)> = vec![
            ("run_id", page(ListOrder::RunId)),
            ("created_at", page(ListOrder::CreatedAt)),
            (
                "run_id_park_outstanding",
                ListOptions {
                    park: Some(vec![ParkState::Outstanding]),
                    ..page(ListOrder::RunId)
                },
            ),
            (
                "created_at_unclaimed",
                ListOptions {
                    claimed: Some(false),
                    ..page(ListOrder::CreatedAt)
                },
            ),
            (
                "run_id_claimed",
                ListOptions {
                    claimed: Some(true),
                    ..page(ListOrder::RunId)
                },
            ),
            (
                "created_at_status_active",
                ListOptions {
                    status: Some(vec![RunStatus::Active]),
                    ..page(ListOrder::CreatedAt)
                },
            ),
        ];
        for (name, o) in &sets {
            // The cursor half-way through this listing.
            let mut deep = o.clone();
            let mut seen = 0usize;
            let total = {
                let mut all = o.clone();
                all.limit = Some(1_000);
                let mut count = 0;
                loop {
                    let p = inline(store.list_runs(&session, &all)).unwrap();
                    count += p.entries.len();
                    match p.cursor {
                        Some(c) => all.cursor = Some(c),
                        None => break count,
                    }
                }
            };
            while seen < total / 2 {
                let p = inline(store.list_runs(&session, &deep)).unwrap();
                seen += p.entries.len();
                deep.cursor = p.cursor;
            }
            assert_eq!(
                inline(store.list_runs(&session, o)).unwrap().entries.len(),
                100
            );
            g.bench_with_input(BenchmarkId::new(format!("first_{name}"), n), &n, |b, _| {
                b.iter(|| inline(store.list_runs(&session, o)).unwrap())
            });
            g.bench_with_input(BenchmarkId::new(format!("deep_{name}"), n), &n, |b, _| {
                b.iter(|| inline(store.list_runs(&session, &deep)).unwrap())
            });
        }
        let claim = ClaimOptions::new(
            Holder::new("bench").unwrap(),
            Ttl::from_millis(60_000).unwrap(),
        );
        let filter = ClaimNextFilter::default();
        g.bench_with_input(BenchmarkId::new("claim_next_release", n), &n, |b, _| {
            b.iter(|| {
                let (s, l) = inline(store.claim_next(&session, &filter, &claim))
                    .unwrap()
                    .expect("a claimable run");
                assert!(inline(store.release(&s, l.fence)).unwrap());
            })
        });
        if n <= 10_000 {
            for (name, o) in [
                ("walk_first_run_id", page(ListOrder::RunId)),
                ("walk_first_created_at", page(ListOrder::CreatedAt)),
            ] {
                g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                    b.iter(|| store.testing().list_runs_walk(&session, &o).unwrap())
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, listing);
criterion_main!(benches);
