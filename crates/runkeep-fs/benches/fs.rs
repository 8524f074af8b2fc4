//! Directory-backend benchmarks (DESIGN "Targets"), side by side in one run:
//!
//! - claim + release cycles on one run, through the async API on a tokio
//!   runtime, inline (no runtime: the store runs the call on the caller's
//!   thread), and the bare system calls the lease needs (`link` + `unlink` +
//!   `readdir`);
//! - a renewal after 10 and after 100 000 renewals (pruning keeps it flat;
//!   the store prunes by count alone, see [`open`]);
//! - one listing page of 100 over 1 000 and 10 000 runs (first page in both
//!   orders, and a deep page), from the session index (the scale curve to
//!   100 000 runs, filters and `claim_next` are in `listing_scale.rs`);
//! - transcript catch-up: the last 10 events of 1 000 and of 100 000;
//! - the checkpoint-write growth curve: the marginal fenced 4 KiB write into
//!   a run that holds 10, 100, 1 000 and 10 000 checkpoints (flat: ≤ 1.2×).
//!
//! `cargo bench -p runkeep-fs --bench fs`

use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimOptions, EvidenceStore, Holder, ListOptions,
    ListOrder, ListingScope, NewEvent, ProjectId, ReadEventsOptions, RunId, RunScope, SessionId,
    TenantId, Timestamp, Ttl,
};
use runkeep_fs::testing::inline;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map};

/// Polls a future that completes without waiting (the store's calls do
/// when no runtime is present).
fn attribution() -> Attribution {
    Attribution {
        tenant_id: TenantId::new("tnt_bench").unwrap(),
        project_id: ProjectId::new("prj_bench").unwrap(),
        session_id: SessionId::new("ses_bench").unwrap(),
    }
}

fn scope(run: &str) -> RunScope {
    let a = attribution();
    RunScope::new(
        a.tenant_id,
        a.project_id,
        a.session_id,
        RunId::new(run).unwrap(),
    )
}

/// The store, pruning by count alone (`prune_grace` zero): these cases loop
/// on one run, where the default grace period keeps every name of the last
/// 5 s and the loop measures listing that directory instead (100 000
/// renewals would take minutes to set up). What the grace period costs such
/// a loop: `runkeep-bench --grace-off` (BENCHMARKS.md, "The prune grace
/// period").
fn open(base: &Path) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            prune_grace: Duration::ZERO,
            ..Default::default()
        },
    )
    .unwrap()
}

fn checkpoint(id: &str, created: i64) -> Checkpoint {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(1));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "x".repeat(4000)}]),
    );
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        Timestamp::from_millis(created).unwrap(),
        state,
    )
    .with_run_created_at(Timestamp::from_millis(created).unwrap())
}

fn claim_release(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("runs"));
    let s = scope("run_cycle");
    let opts = ClaimOptions::new(
        Holder::new("bench").unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    );
    let mut g = c.benchmark_group("claim_release_cycle");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    g.bench_function("async_tokio", |b| {
        b.iter(|| {
            rt.block_on(async {
                let l = store.claim(&s, &opts).await.unwrap().lease().unwrap();
                store.release(&s, l.fence).await.unwrap();
            })
        })
    });
    g.bench_function("inline", |b| {
        b.iter(|| {
            let l = inline(store.claim(&s, &opts)).unwrap().lease().unwrap();
            inline(store.release(&s, l.fence)).unwrap();
        })
    });
    store.testing().force_scratch_publish();
    g.bench_function("inline_scratch_name_publish", |b| {
        b.iter(|| {
            let l = inline(store.claim(&s, &opts)).unwrap().lease().unwrap();
            inline(store.release(&s, l.fence)).unwrap();
        })
    });
    // The system calls a cycle cannot avoid: two whole bodies published by
    // link (claim, tombstone), two directory reads, two prune unlinks.
    let eq = dir.path().join("bare_equivalent");
    std::fs::create_dir_all(&eq).unwrap();
    let mut n = 0u64;
    g.bench_function("bare_equivalent_2x_tmpfile_link_readdir_unlink", |b| {
        b.iter(|| {
            use rustix::fs::{linkat, openat, AtFlags, Mode, OFlags, CWD};
            use std::io::Write;
            use std::os::fd::AsRawFd;
            for _ in 0..2 {
                n += 1;
                let fd = openat(
                    CWD,
                    &eq,
                    OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                let mut f = std::fs::File::from(fd);
                f.write_all(br#"{"holder":"bench","expiresAt":1777777777777}"#)
                    .unwrap();
                let p = format!("/proc/self/fd/{}", f.as_raw_fd());
                linkat(
                    CWD,
                    p.as_str(),
                    CWD,
                    eq.join(format!("{n}.json")),
                    AtFlags::SYMLINK_FOLLOW,
                )
                .unwrap();
                std::fs::read_dir(&eq).unwrap().count();
                if n > 33 {
                    std::fs::remove_file(eq.join(format!("{}.json", n - 33))).unwrap();
                }
            }
        })
    });
    // The bare system calls DESIGN names: link + unlink + readdir.
    let bare = dir.path().join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::write(bare.join("src"), r#"{"holder":"bench","expiresAt":1}"#).unwrap();
    g.bench_function("bare_link_unlink_readdir", |b| {
        b.iter(|| {
            std::fs::hard_link(bare.join("src"), bare.join("1.json")).unwrap();
            std::fs::remove_file(bare.join("1.json")).unwrap();
            std::fs::read_dir(&bare).unwrap().count()
        })
    });
    g.finish();
}

fn renew(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("runs"));
    let opts = ClaimOptions::new(
        Holder::new("bench").unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    );
    let mut g = c.benchmark_group("renew");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    for n in [10u64, 100_000] {
        let s = scope(&format!("run_renew_{n}"));
        for _ in 0..n {
            inline(store.claim(&s, &opts)).unwrap();
        }
        g.bench_with_input(BenchmarkId::new("after", n), &n, |b, _| {
            b.iter(|| inline(store.claim(&s, &opts)).unwrap())
        });
    }
    g.finish();
}

fn listing(c: &mut Criterion) {
    let mut g = c.benchmark_group("list_page_of_100");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    let a = attribution();
    let session = ListingScope::session(a.tenant_id, a.project_id, a.session_id);
    let dirs: Vec<_> = [1_000usize, 10_000]
        .iter()
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    for (n, dir) in [1_000usize, 10_000].into_iter().zip(&dirs) {
        let store = open(&dir.path().join("runs"));
        let opts = ClaimOptions::new(
            Holder::new("bench").unwrap(),
            Ttl::from_millis(60_000).unwrap(),
        );
        for i in 0..n {
            let s = scope(&format!("run_{i:06}"));
            inline(store.write_checkpoint(&s, &checkpoint("cp_1", 1_000 + i as i64), None))
                .unwrap();
            if i % 3 == 0 {
                inline(store.claim(&s, &opts)).unwrap();
            }
        }
        // Measure the session index, not the walk it answers with while it
        // is being built.
        store
            .testing()
            .wait_index()
            .expect("the session index is in use");
        let page = |order: ListOrder, cursor: Option<String>| ListOptions {
            order,
            limit: Some(100),
            cursor,
            now: Some(Timestamp::now()),
            ..Default::default()
        };
        // A cursor in the middle, for the deep page.
        let mut cursor = None;
        for _ in 0..(n / 200) {
            cursor = inline(store.list_runs(&session, &page(ListOrder::RunId, cursor)))
                .unwrap()
                .cursor;
        }
        g.bench_with_input(BenchmarkId::new("first_run_id", n), &n, |b, _| {
            b.iter(|| inline(store.list_runs(&session, &page(ListOrder::RunId, None))).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("deep_run_id", n), &n, |b, _| {
            b.iter(|| {
                inline(store.list_runs(&session, &page(ListOrder::RunId, cursor.clone()))).unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("first_created_at", n), &n, |b, _| {
            b.iter(|| inline(store.list_runs(&session, &page(ListOrder::CreatedAt, None))).unwrap())
        });
        let unclaimed = ListOptions {
            claimed: Some(false),
            ..page(ListOrder::RunId, None)
        };
        g.bench_with_input(BenchmarkId::new("first_unclaimed", n), &n, |b, _| {
            b.iter(|| inline(store.list_runs(&session, &unclaimed)).unwrap())
        });
    }
    g.finish();
}

fn catch_up(c: &mut Criterion) {
    let mut g = c.benchmark_group("catch_up_last_10");
    g.sample_size(30).measurement_time(Duration::from_secs(3));
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("runs"));
    for n in [1_000u64, 100_000] {
        let s = scope(&format!("run_log_{n}"));
        let batch: Vec<NewEvent> = (0..1_000)
            .map(|i| {
                let mut p = Map::new();
                p.insert("i".into(), json!(i));
                p.insert("text".into(), json!("some event payload of moderate size"));
                NewEvent::new("step", p)
            })
            .collect();
        for _ in 0..(n / 1_000) {
            inline(store.append_events(&s, &batch, None)).unwrap();
        }
        let opts = ReadEventsOptions {
            since_seq: n - 10,
            ..Default::default()
        };
        g.bench_with_input(BenchmarkId::new("of", n), &n, |b, _| {
            b.iter(|| {
                let got = inline(store.read_events(&s, &opts)).unwrap();
                assert_eq!(got.events.len(), 10);
            })
        });
    }
    g.finish();
}

/// The marginal fenced 4 KiB checkpoint write at 10 … 10 000 checkpoints in
/// one run. Each timed write adds a new checkpoint; once `n / 10` have been
/// added (untimed) they are removed and the digest rebuilt, so the run
/// stays within 10 % of its nominal size and the digest is fresh when
/// timing resumes.
fn checkpoint_write_growth(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("runs"));
    let opts = ClaimOptions::new(
        Holder::new("bench").unwrap(),
        Ttl::from_millis(3_600_000).unwrap(),
    );
    let mut g = c.benchmark_group("checkpoint_write_at");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for n in [10usize, 100, 1_000, 10_000] {
        let s = scope(&format!("run_growth_{n}"));
        let fence = match inline(store.claim(&s, &opts)).unwrap() {
            runkeep::ClaimOutcome::Acquired(l) => l.fence,
            other => panic!("not acquired: {other:?}"),
        };
        for i in 0..n {
            inline(store.write_checkpoint(
                &s,
                &checkpoint(&format!("cp_{i:06}"), i as i64),
                Some(fence),
            ))
            .unwrap();
        }
        let cps_dir = store.run_dir(&s).join("checkpoints");
        let chunk = (n / 10).max(1);
        let mut next = 0u64;
        let mut added: Vec<String> = Vec::new();
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let id = format!("m_{next}");
                    next += 1;
                    let cp = checkpoint(&id, 1_000_000);
                    let t = std::time::Instant::now();
                    inline(store.write_checkpoint(&s, &cp, Some(fence))).unwrap();
                    total += t.elapsed();
                    added.push(id);
                    if added.len() >= chunk {
                        // Back to n checkpoints, with a fresh digest (untimed).
                        let last = added.pop().unwrap();
                        for id in added.drain(..) {
                            std::fs::remove_file(cps_dir.join(format!("{id}.json"))).unwrap();
                        }
                        let last = CheckpointId::new(last).unwrap();
                        assert!(inline(store.delete_checkpoint(&s, &last, Some(fence))).unwrap());
                    }
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    claim_release,
    renew,
    listing,
    catch_up,
    checkpoint_write_growth
);
criterion_main!(benches);
