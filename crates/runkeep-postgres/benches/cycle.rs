//! Throughput of the drain cycle on PostgreSQL: `claim_next` → one
//! `commit_step` carrying an event, a checkpoint and the finish (two commits
//! per run), with 1, 8 and 16 concurrent workers; and, in the same run, a
//! plain `FOR UPDATE SKIP LOCKED` loop doing the same writes in two round
//! trips (the take: one `UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP
//! LOCKED LIMIT 1) RETURNING`; the completion: `BEGIN`, the event, the
//! checkpoint upsert, the fenced status update and `COMMIT`, pipelined),
//! as the reference for what the database allows on this machine.
//!
//! A benchmark, not a test:
//! `RUNKEEP_TEST_POSTGRES_URL=… cargo bench -p runkeep-postgres --bench cycle`.
//! `RUNKEEP_BENCH_WORKERS` (default `1,8,16`), `RUNKEEP_BENCH_RUNS` (runs
//! drained per measurement, default 2000), `RUNKEEP_BENCH_REPS` (default 1:
//! the two loops alternate within each repetition) and
//! `RUNKEEP_BENCH_LOOPS` (`runkeep,skip-locked`; also `runkeep-unnamed`:
//! runkeep configured as behind a pooler but connected directly, the cost
//! of its unnamed statements; and `runkeep-pgbouncer`: through a private
//! pgbouncer in transaction mode) choose what runs. Each result is also
//! printed as `RESULT <loop> <workers> <cycles/s>`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions, EvidenceStore, Holder,
    NewEvent, Outcome, Step, Ttl,
};
use runkeep_conformance::support;

#[path = "../tests/common/pgbouncer.rs"]
#[allow(dead_code, reason = "the bench uses part of the tests' helper")]
mod pgbouncer;
use runkeep_postgres::{PgOptions, PgStore};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// How the runkeep loop reaches the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Directly, prepared (named, cached) statements: the default.
    Direct,
    /// Directly, but configured as behind a pooler (`PgOptions::direct_url`
    /// set to the same server): unnamed statements, the settings from the
    /// role. The statements' cost alone.
    Unnamed,
    /// Through a private pgbouncer in transaction mode, with as many
    /// server sessions as the store's pool.
    Pgbouncer,
}

/// runkeep's drain cycle: cycles per second.
async fn runkeep_cycle(url: &str, workers: usize, runs: usize, route: Route) -> f64 {
    let schema = format!("rkb_cycle_{}_{workers}", std::process::id());
    let options = PgOptions {
        schema: schema.clone(),
        pool_size: workers.max(16),
        ..PgOptions::default()
    };
    let mut _bouncer = None;
    let mut role = None;
    let (store_url, options) = match route {
        Route::Direct => (url.to_string(), options),
        Route::Unnamed | Route::Pgbouncer => {
            let (_, _, database) = pgbouncer::target(url);
            let settings = runkeep_postgres::role_settings(&options, &schema, &database);
            role = Some(pgbouncer::RoleGuard::create(url, &schema, &settings));
            let direct = pgbouncer::with_user_port(url, &schema, None);
            let store_url = if route == Route::Pgbouncer {
                let b = pgbouncer::Bouncer::start_with(url, options.pool_size).await;
                b.add_role(&schema).await;
                let u = pgbouncer::with_user_port(url, &schema, Some(b.port));
                _bouncer = Some(b);
                u
            } else {
                direct.clone()
            };
            (
                store_url,
                PgOptions {
                    direct_url: Some(direct),
                    ..options
                },
            )
        }
    };
    let store = Arc::new(
        PgStore::connect(&store_url, options)
            .await
            .expect("connect"),
    );
    // Filled by 16 tasks at once (not timed).
    let mut fill = Vec::new();
    for lane in 0..16 {
        let store = store.clone();
        fill.push(tokio::spawn(async move {
            for i in (lane..runs).step_by(16) {
                let scope = support::run(&format!("b{i:05}"));
                let cp = support::checkpoint("start", 0);
                store
                    .enqueue(&scope, &cp, &EnqueueOptions::default())
                    .await
                    .expect("enqueue");
            }
        }));
    }
    for f in fill {
        f.await.unwrap();
    }
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let opts = ClaimOptions::new(
                Holder::new(format!("bench-{w}")).unwrap(),
                Ttl::from_millis(60_000).unwrap(),
            );
            let mut done = 0usize;
            while let Some((scope, lease)) = store
                .claim_next(&support::listing(), &ClaimNextFilter::default(), &opts)
                .await
                .expect("claim_next")
            {
                let step = Step {
                    events: vec![NewEvent::new("done", serde_json::Map::new())],
                    checkpoint: Some(support::checkpoint("end", 1)),
                    finish: Some(Outcome::completed(None)),
                    ..Step::default()
                };
                store
                    .commit_step(&scope, lease.fence, &step)
                    .await
                    .expect("step");
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(total, runs);
    drop(store);
    admin(url)
        .await
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
    drop(role);
    runs as f64 / secs
}

/// Polls every future in order until all are done (what each sends on its
/// first poll leaves in this order: a pipeline).
async fn in_order<F: Future + Unpin>(mut futs: Vec<F>) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match Pin::new(f).poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// The plain SKIP LOCKED loop with the same writes: cycles per second.
async fn skip_locked_cycle(url: &str, workers: usize, runs: usize) -> f64 {
    let schema = format!("rkb_skip_{}_{workers}", std::process::id());
    let a = admin(url).await;
    a.batch_execute(&format!(
        "CREATE SCHEMA \"{schema}\";
         SET search_path TO \"{schema}\";
         CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL, holder text,
             fence bigint NOT NULL DEFAULT 0, expires_at timestamptz, body jsonb NOT NULL);
         CREATE INDEX jobs_queued ON jobs (id) WHERE status = 'queued';
         CREATE TABLE job_events (job_id bigint NOT NULL, seq bigint NOT NULL, body jsonb NOT NULL,
             PRIMARY KEY (job_id, seq));
         CREATE TABLE job_checkpoints (job_id bigint NOT NULL, id text NOT NULL, body jsonb NOT NULL,
             PRIMARY KEY (job_id, id));"
    ))
    .await
    .unwrap();
    let start = serde_json::Value::Object(support::checkpoint("start", 0).to_json());
    a.execute(
        "INSERT INTO jobs (id, status, body) SELECT g, 'queued', $1 FROM generate_series(1, $2::bigint) g",
        &[&start, &(runs as i64)],
    )
    .await
    .unwrap();
    a.batch_execute("ANALYZE jobs").await.unwrap();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let url = url.to_string();
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            let c = admin(&url).await;
            c.batch_execute(&format!("SET search_path TO \"{schema}\""))
                .await
                .unwrap();
            let take = c
                .prepare(
                    "UPDATE jobs SET status = 'running', holder = $1, fence = fence + 1,
                            expires_at = clock_timestamp() + interval '60 seconds'
                      WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY id
                                  FOR UPDATE SKIP LOCKED LIMIT 1)
                      RETURNING id, fence",
                )
                .await
                .unwrap();
            let event = c
                .prepare("INSERT INTO job_events (job_id, seq, body) VALUES ($1, 1, $2)")
                .await
                .unwrap();
            let checkpoint = c
                .prepare(
                    "INSERT INTO job_checkpoints (job_id, id, body) VALUES ($1, 'end', $2)
                     ON CONFLICT (job_id, id) DO UPDATE SET body = EXCLUDED.body",
                )
                .await
                .unwrap();
            let complete = c
                .prepare(
                    "UPDATE jobs SET status = 'completed', holder = NULL
                      WHERE id = $1 AND fence = $2 AND status = 'running'",
                )
                .await
                .unwrap();
            let holder = format!("bench-{w}");
            let ev = serde_json::Value::Object(
                NewEvent::new("done", serde_json::Map::new())
                    .persist(1, support::at(0), None)
                    .to_json(),
            );
            let cp = serde_json::Value::Object(support::checkpoint("end", 1).to_json());
            let mut done = 0usize;
            loop {
                let rows = c.query(&take, &[&holder]).await.unwrap();
                let Some(r) = rows.first() else { break };
                let id: i64 = r.get(0);
                let fence: i64 = r.get(1);
                type F<'a> =
                    Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send + 'a>>;
                let p_ev: [&(dyn ToSql + Sync); 2] = [&id, &ev];
                let p_cp: [&(dyn ToSql + Sync); 2] = [&id, &cp];
                let p_done: [&(dyn ToSql + Sync); 2] = [&id, &fence];
                let futs: Vec<F<'_>> = vec![
                    Box::pin(async { c.batch_execute("BEGIN").await.map(|()| 0) }),
                    Box::pin(c.execute(&event, &p_ev)),
                    Box::pin(c.execute(&checkpoint, &p_cp)),
                    Box::pin(c.execute(&complete, &p_done)),
                    Box::pin(async { c.batch_execute("COMMIT").await.map(|()| 0) }),
                ];
                for r in in_order(futs).await {
                    r.unwrap();
                }
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(total, runs);
    a.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
    runs as f64 / secs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("cycle bench skipped: RUNKEEP_TEST_POSTGRES_URL is not set");
        return;
    };
    let workers: Vec<usize> = env_or("RUNKEEP_BENCH_WORKERS", "1,8,16")
        .split(',')
        .map(|w| w.trim().parse().expect("RUNKEEP_BENCH_WORKERS: numbers"))
        .collect();
    let runs: usize = env_or("RUNKEEP_BENCH_RUNS", "2000")
        .parse()
        .expect("RUNKEEP_BENCH_RUNS: a number");
    let reps: usize = env_or("RUNKEEP_BENCH_REPS", "1")
        .parse()
        .expect("RUNKEEP_BENCH_REPS: a number");
    let loops = env_or("RUNKEEP_BENCH_LOOPS", "runkeep,skip-locked");
    for rep in 0..reps {
        for &w in &workers {
            for l in loops.split(',') {
                let rate = match l.trim() {
                    "runkeep" => runkeep_cycle(&url, w, runs, Route::Direct).await,
                    "runkeep-unnamed" => runkeep_cycle(&url, w, runs, Route::Unnamed).await,
                    "runkeep-pgbouncer" => runkeep_cycle(&url, w, runs, Route::Pgbouncer).await,
                    "skip-locked" => skip_locked_cycle(&url, w, runs).await,
                    other => panic!("RUNKEEP_BENCH_LOOPS: unknown loop {other:?}"),
                };
                println!(
                    "cycle bench (rep {rep}): {l} with {w} worker(s): {runs} runs drained at {rate:.0} cycles/s"
                );
                println!("RESULT {l} {w} {rate:.1}");
            }
        }
    }
}
