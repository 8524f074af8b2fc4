//! PostgreSQL for the bench: fresh schemas (dropped afterwards), the
//! server's settings, and the physical baselines measured beside runkeep:
//! `SELECT 1`, a single-row `UPDATE` commit, and a plain
//! `FOR UPDATE SKIP LOCKED` job loop doing the drain cycle's writes in two
//! round trips.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use crate::stats::{sequential, Sample};
use crate::work::Context;

/// The default `--pg-url`.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A base name for this run's schemas: `runkeep_bench_<10 random [a-z0-9]>`.
pub fn base_name() -> String {
    format!(
        "runkeep_bench_{}",
        runkeep::id::random_suffix(10).to_lowercase()
    )
}

/// One connection of its own (its driver task on this runtime).
pub async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .ctx("connect to PostgreSQL")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Drops `schemas` (and everything in them); reports what could not be.
pub async fn drop_schemas(url: &str, schemas: &[String]) -> Result<(), String> {
    let client = connect(url).await?;
    let mut failed = Vec::new();
    for s in schemas {
        if let Err(e) = client
            .batch_execute(&format!(
                "SET client_min_messages = warning; DROP SCHEMA IF EXISTS \"{s}\" CASCADE"
            ))
            .await
        {
            failed.push(format!("{s}: {e}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("could not drop {}", failed.join("; ")))
    }
}

/// The server's version and the settings that bound the figures.
pub async fn server_info(url: &str) -> Result<Value, String> {
    let client = connect(url).await?;
    let version: String = client
        .query_one("SELECT version()", &[])
        .await
        .ctx("SELECT version()")?
        .get(0);
    let mut settings = serde_json::Map::new();
    for name in [
        "server_version",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "full_page_writes",
        "shared_buffers",
        "autovacuum",
        "max_connections",
    ] {
        let row = client
            .query_one("SELECT current_setting($1)", &[&name])
            .await
            .ctx("read the server's settings")?;
        settings.insert(name.into(), json!(row.get::<_, String>(0)));
    }
    Ok(json!({ "version": version, "settings": settings }))
}

/// The baselines' tables, in a schema of their own.
const TABLES: &str = "
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    payload jsonb NOT NULL,
    done_at timestamptz
);
CREATE INDEX jobs_ready ON jobs (queue, id) WHERE state = 0;
CREATE TABLE job_events (
    job_id bigint NOT NULL,
    seq int NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    body jsonb NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE job_checkpoints (
    job_id bigint NOT NULL,
    id text NOT NULL,
    body jsonb NOT NULL,
    PRIMARY KEY (job_id, id)
);
CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO counter VALUES (1, 0);
";

/// One connection of the baselines, with its statements prepared.
struct Conn {
    client: Client,
    select1: Statement,
    update: Statement,
    take: Statement,
    event: Statement,
    checkpoint: Statement,
    done: Statement,
}

/// The PostgreSQL baselines.
pub struct Baselines {
    url: String,
    schema: String,
    conns: tokio::sync::Mutex<Vec<Arc<Conn>>>,
    queues: AtomicU64,
}

impl std::fmt::Debug for Baselines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baselines")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Baselines {
    /// Creates the tables in `schema`.
    pub async fn create(url: &str, schema: &str) -> Result<Self, String> {
        let client = connect(url).await?;
        client
            .batch_execute(&format!(
                "CREATE SCHEMA \"{schema}\"; SET search_path TO \"{schema}\"; {TABLES}"
            ))
            .await
            .ctx("create the baseline tables")?;
        Ok(Self {
            url: url.to_string(),
            schema: schema.to_string(),
            conns: tokio::sync::Mutex::new(Vec::new()),
            queues: AtomicU64::new(0),
        })
    }

    /// `n` connections (opened once, kept for every measurement).
    async fn conns(&self, n: usize) -> Result<Vec<Arc<Conn>>, String> {
        let mut conns = self.conns.lock().await;
        while conns.len() < n {
            let client = connect(&self.url).await?;
            client
                .batch_execute(&format!("SET search_path TO \"{}\"", self.schema))
                .await
                .ctx("SET search_path")?;
            let prep = |sql: &'static str| {
                let c = &client;
                async move { c.prepare(sql).await.ctx(sql) }
            };
            let conn = Conn {
                select1: prep("SELECT 1").await?,
                update: prep("UPDATE counter SET n = n + 1 WHERE id = 1").await?,
                take: prep(
                    "SELECT id, payload FROM jobs WHERE queue = $1 AND state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .await?,
                event: prep("INSERT INTO job_events (job_id, seq, body) VALUES ($1, 1, $2)")
                    .await?,
                checkpoint: prep(
                    "INSERT INTO job_checkpoints (job_id, id, body) VALUES ($1, 'cp_step', $2) ON CONFLICT (job_id, id) DO UPDATE SET body = EXCLUDED.body",
                )
                .await?,
                done: prep("UPDATE jobs SET state = 2, done_at = now() WHERE id = $1").await?,
                client,
            };
            conns.push(Arc::new(conn));
        }
        Ok(conns[..n].to_vec())
    }

    /// `SELECT 1`, one after the other: the round trip.
    pub async fn select1(&self, budget: Duration) -> Result<Sample, String> {
        let c = self.conns(1).await?.remove(0);
        sequential(budget, |_| {
            let c = c.clone();
            async move {
                c.client.query_one(&c.select1, &[]).await.ctx("SELECT 1")?;
                Ok(1.0)
            }
        })
        .await
    }

    /// A single-row `UPDATE` in its own transaction (autocommit): the round
    /// trip plus the commit's WAL flush.
    pub async fn update_commit(&self, budget: Duration) -> Result<Sample, String> {
        let c = self.conns(1).await?.remove(0);
        sequential(budget, |_| {
            let c = c.clone();
            async move {
                c.client.execute(&c.update, &[]).await.ctx("UPDATE")?;
                Ok(1.0)
            }
        })
        .await
    }

    /// A fresh queue of `jobs` jobs (one INSERT, not timed): its name.
    pub async fn fill(&self, jobs: u64) -> Result<String, String> {
        let queue = format!("q{}", self.queues.fetch_add(1, Ordering::Relaxed));
        let c = self.conns(1).await?.remove(0);
        c.client
            .execute(
                "INSERT INTO jobs (queue, payload) SELECT $1, jsonb_build_object('task', 'summarise the ticket', 'ticket', g) FROM generate_series(1, $2::bigint) g",
                &[&queue, &(jobs as i64)],
            )
            .await
            .ctx("fill the jobs table")?;
        Ok(queue)
    }

    /// The plain job loop with `workers` connections on `queue`: in one
    /// transaction, round trip 1 is `BEGIN` + take one row `FOR UPDATE SKIP
    /// LOCKED`; round trip 2 is the event row, the checkpoint row, the row
    /// marked done and `COMMIT` (pipelined), until the queue is empty or
    /// `budget` has passed.
    pub async fn skip_locked(
        &self,
        queue: &str,
        workers: usize,
        budget: Duration,
    ) -> Result<Sample, String> {
        let conns = self.conns(workers).await?;
        let event = json!({"type": "tool_result", "toolCallId": "call_0", "tool": "search", "result": {"hits": 3, "ms": 41}});
        let checkpoint = json!({
            "iteration": 1,
            "messages": [{"role": "user", "content": "summarise the ticket"}],
            "tokenUsage": {"promptTokens": 812, "completionTokens": 96, "totalTokens": 908, "cachedTokens": 0},
            "costInfo": {"totalCost": 0.0031, "cacheDiscount": 0, "unpricedTokens": 0},
            "guardState": {"iterationCount": 1, "elapsedMs": 1200}
        });
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in conns {
            let (queue, event, checkpoint) = (queue.to_string(), event.clone(), checkpoint.clone());
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while started.elapsed() < budget {
                    let t = Instant::now();
                    let take: [&(dyn ToSql + Sync); 1] = [&queue];
                    let (_, row) = tokio::try_join!(
                        c.client.batch_execute("BEGIN"),
                        c.client.query_opt(&c.take, &take)
                    )
                    .ctx("BEGIN + take")?;
                    let Some(row) = row else {
                        c.client.batch_execute("COMMIT").await.ctx("COMMIT")?;
                        break;
                    };
                    let id: i64 = row.get(0);
                    let ev: [&(dyn ToSql + Sync); 2] = [&id, &event];
                    let cp: [&(dyn ToSql + Sync); 2] = [&id, &checkpoint];
                    let done: [&(dyn ToSql + Sync); 1] = [&id];
                    tokio::try_join!(
                        c.client.execute(&c.event, &ev),
                        c.client.execute(&c.checkpoint, &cp),
                        c.client.execute(&c.done, &done),
                        c.client.batch_execute("COMMIT"),
                    )
                    .ctx("writes + COMMIT")?;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
                Ok::<Vec<f64>, String>(latencies)
            }));
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.ctx("job loop worker")??);
        }
        Ok(Sample {
            units: latencies.len() as f64,
            secs: started.elapsed().as_secs_f64(),
            latencies_us: latencies,
        })
    }
}
