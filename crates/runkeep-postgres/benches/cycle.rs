//! Throughput of the drain cycle on PostgreSQL: `claim_next` → one
//! `commit_step` carrying an event, a checkpoint and the finish (two commits
//! per run), with 1 and 8 concurrent workers. A benchmark, not a test:
//! `RUNKEEP_TEST_POSTGRES_URL=… cargo bench -p runkeep-postgres --bench cycle`.

use std::sync::Arc;
use std::time::Instant;

use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions, EvidenceStore, Holder,
    NewEvent, Outcome, Step, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};

const RUNS: usize = 2000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("cycle bench skipped: RUNKEEP_TEST_POSTGRES_URL is not set");
        return;
    };
    for workers in [1usize, 8] {
        let schema = format!("rkb_cycle_{}_{workers}", std::process::id());
        let store = Arc::new(
            PgStore::connect(
                &url,
                PgOptions {
                    schema: schema.clone(),
                    pool_size: workers.max(2),
                    ..PgOptions::default()
                },
            )
            .await
            .expect("connect"),
        );
        for i in 0..RUNS {
            let scope = support::run(&format!("b{i:05}"));
            let cp = support::checkpoint("start", 0);
            store
                .enqueue(&scope, &cp, &EnqueueOptions::default())
                .await
                .expect("enqueue");
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
        assert_eq!(total, RUNS);
        println!(
            "cycle bench: {workers} worker(s): {RUNS} runs drained in {secs:.2} s = {:.0} cycles/s (claim_next + commit_step with finish)",
            RUNS as f64 / secs
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
    }
}
