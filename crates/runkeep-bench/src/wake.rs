//! `--wake N`: how soon a long-poll on one `runkeep serve` is answered
//! after a write through another server in front of the same PostgreSQL
//! store (issue 31, item 3).
//!
//! Two servers in process, each on a thread and runtime of its own with a
//! store of its own (its own pool and its own `LISTEN` connection), over one
//! fresh schema. Each round: a long-poll (`events/wait`) on server B, a
//! pause for it to reach its wait, then one event appended through server
//! A. Measured from just before the append is sent: when A acknowledges
//! it, and when B's answer has arrived. The servers re-read on their own
//! only every 10 minutes (`watch_fallback`), so every wake-up measured is
//! the store's `NOTIFY`; a round B answers without the event counts as
//! missed (and fails the run).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runkeep::{EvidenceStore, NewEvent, RunScope, RunStore, TenantId};
use runkeep_postgres::{PgOptions, PgStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::output::{BenchError, BenchResult, Exit};
use crate::serve::InProcessServer;
use crate::stats::percentile;
use crate::{pg, BenchArgs};

/// How long B's long-poll may wait (far below the fallback re-read).
const WAIT_MS: u64 = 10_000;
/// The servers' own re-read interval: longer than any round.
const FALLBACK: Duration = Duration::from_secs(600);
/// The pause that lets B's long-poll reach its wait before the write.
const SETTLE: Duration = Duration::from_millis(20);

/// Runs `rounds` rounds and prints the figures.
pub async fn run(args: &BenchArgs, rounds: usize) -> BenchResult<Exit> {
    if rounds == 0 {
        return Err(BenchError::usage("--wake needs at least 1 round"));
    }
    let schema = format!("{}_wake", pg::base_name());
    let options = {
        let schema = schema.clone();
        move || PgOptions {
            schema: schema.clone(),
            pool_size: 4,
            watch_fallback: FALLBACK,
            ..PgOptions::default()
        }
    };
    PgStore::migrate(&args.pg_url, &options())
        .await
        .map_err(|e| BenchError::failed(format!("create the wake schema: {e}")))?;
    let outcome = measure(args, rounds, &options).await;
    if let Err(e) = pg::drop_schemas(&args.pg_url, &[schema]).await {
        crate::output::warn(&e);
    }
    let figures = outcome.map_err(BenchError::failed)?;
    figures.print(rounds);
    Ok(if figures.missed == 0 {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

struct Figures {
    /// Write start → A's acknowledgement, ms.
    acked: Vec<f64>,
    /// Write start → B's answer, ms.
    woke: Vec<f64>,
    missed: usize,
}

impl Figures {
    fn print(&self, rounds: usize) {
        let p = |xs: &[f64], q: f64| percentile(xs, q).unwrap_or(f64::NAN);
        let max = |xs: &[f64]| xs.iter().copied().fold(f64::NAN, f64::max);
        println!(
            "cross-server wake-up over one PostgreSQL store, {rounds} rounds \
             (long-poll on server B, event appended through server A; from the write's start):"
        );
        println!(
            "  B woken:      p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            p(&self.woke, 50.0),
            p(&self.woke, 99.0),
            max(&self.woke)
        );
        println!(
            "  A acknowledged: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            p(&self.acked, 50.0),
            p(&self.acked, 99.0),
            max(&self.acked)
        );
        let after: Vec<f64> = self
            .woke
            .iter()
            .zip(&self.acked)
            .map(|(w, a)| w - a)
            .collect();
        println!(
            "  B woken after A's acknowledgement (negative: before it): p50 {:.1} ms  p99 {:.1} ms",
            p(&after, 50.0),
            p(&after, 99.0)
        );
        println!("  missed (answered without the event): {}", self.missed);
    }
}

async fn measure(
    args: &BenchArgs,
    rounds: usize,
    options: &(impl Fn() -> PgOptions + Clone + Send + 'static),
) -> Result<Figures, String> {
    let tenant = TenantId::new("bench").map_err(|e| e.to_string())?;
    let start = |label: &str| {
        let (url, options) = (args.pg_url.clone(), options.clone());
        InProcessServer::start(
            label,
            tenant.clone(),
            Box::new(move || {
                Box::pin(async move {
                    let store = PgStore::connect(&url, options())
                        .await
                        .map_err(|e| format!("open the served pg store: {e}"))?;
                    Ok(Arc::new(store) as Arc<dyn RunStore>)
                })
            }),
        )
    };
    let a = start("wake-a")?;
    let b = start("wake-b")?;
    let writer = a.client(tenant.clone())?;
    let scope = RunScope::new(
        tenant,
        "p".parse().map_err(|e: runkeep::Error| e.to_string())?,
        "s".parse().map_err(|e: runkeep::Error| e.to_string())?,
        "wake".parse().map_err(|e: runkeep::Error| e.to_string())?,
    );
    let path = format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/{}/events/wait",
        scope.tenant_id, scope.project_id, scope.session_id, scope.run_id
    );
    let append = |i: usize| {
        let writer = &writer;
        let scope = &scope;
        async move {
            writer
                .append_events(
                    scope,
                    &[NewEvent::new("wake", serde_json::Map::new())],
                    None,
                )
                .await
                .map_err(|e| format!("append through server A (round {i}): {e}"))
        }
    };
    let mut last = append(0).await?.last().map_or(0, |e| e.seq);
    let mut figures = Figures {
        acked: Vec::with_capacity(rounds),
        woke: Vec::with_capacity(rounds),
        missed: 0,
    };
    for i in 0..rounds {
        let target = format!("{path}?sinceSeq={last}&timeoutMs={WAIT_MS}");
        let poll = tokio::spawn(long_poll(b.addr(), b.token().to_string(), target));
        tokio::time::sleep(SETTLE).await;
        let t0 = Instant::now();
        let written = append(i + 1).await?;
        figures.acked.push(t0.elapsed().as_secs_f64() * 1e3);
        let answer = poll.await.map_err(|e| e.to_string())??;
        figures.woke.push(t0.elapsed().as_secs_f64() * 1e3);
        last = written.last().map_or(last, |e| e.seq);
        if !answer.contains("\"changed\":true") {
            figures.missed += 1;
        }
    }
    Ok(figures)
}

/// One `GET` on a connection of its own; the whole answer, head and body.
async fn long_poll(addr: SocketAddr, token: String, target: String) -> Result<String, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect to server B: {e}"))?;
    let head = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("send the long-poll: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read the long-poll's answer: {e}"))?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
