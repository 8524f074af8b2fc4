//! What concurrent reads cost `runkeep serve` in memory, and what they cost
//! another tenant: peak RSS growth while N readers fetch one large
//! checkpoint, then while N readers page through one large transcript, and
//! the p50/p99 of another tenant's run listing meanwhile.
//!
//! ```sh
//! cargo build --release -p runkeep-cli     # the binary measured
//! cargo run --release -p runkeep-server --example read_rss -- \
//!     [--bin target/release/runkeep] [--readers 32] [--transcript-readers 32] \
//!     [--checkpoint-mib 61] [--transcript-mib 400] [--event-kib 4] [--only checkpoint,transcript]
//! ```
//!
//! A fresh `runkeep serve` over a directory root (`root:`) in a temporary
//! directory, with an operator token for tenant `reads` and one for tenant
//! `other` (which has 50 runs). The checkpoint's state is an array of 1 KiB
//! strings; the transcript is events of `--event-kib` KiB. Before each
//! phase the server's high-water mark is reset (`/proc/<pid>/clear_refs`,
//! `5`), so the peak is the phase's own, over the RSS it started from.
//!
//! Readers read each answer to its end without keeping it (so the client's
//! memory is not what is measured). A transcript reader pages: it asks for
//! `sinceSeq`, then for the answer's `nextSinceSeq` while `more` is true
//! (read from the answer's last bytes, where the server puts them); a
//! server without paging answers everything at once and says nothing
//! more. An answer 503 (the server's answer budget full) is retried after
//! its `Retry-After`, and counted. Any `runkeep` binary can be measured, so
//! an older build can be compared with this one.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TENANT: &str = "reads";
const OTHER: &str = "other";

struct Server {
    child: Child,
    url: String,
}

fn token(bin: &str, tokens: &Path, root: &Path, tenant: &str) -> String {
    let out = Command::new(bin)
        .args(["--json", "--store"])
        .arg(format!("root:{}", root.display()))
        .args(["--tenant", tenant, "token", "create", "--role", "operator"])
        .arg("--tokens")
        .arg(tokens)
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e} (build it: cargo build -p runkeep-cli)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("token create's JSON");
    v["token"].as_str().expect("a token").to_string()
}

impl Server {
    fn start(bin: &str, tokens: &Path, root: &Path) -> Server {
        let mut child = Command::new(bin)
            .arg("--store")
            .arg(format!("root:{}", root.display()))
            .args(["serve", "--listen", "127.0.0.1:0", "--tokens"])
            .arg(tokens)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut url = None;
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                url = rest.split_whitespace().next().map(str::to_string);
                break;
            }
        }
        Server {
            child,
            url: url.expect("the server's address"),
        }
    }

    fn status_kib(&self, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        text.lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Resets the high-water mark to the current RSS; the RSS then.
    fn reset_peak(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5")
            .expect("reset the peak RSS (Linux clear_refs)");
        self.status_kib("VmRSS:")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_url(url: &str, tenant: &str, run: &str) -> String {
    format!("{url}/v1/tenants/{tenant}/projects/p/sessions/s/runs/{run}")
}

/// Sends a GET, retrying a 503 after its `Retry-After`; reads the answer to
/// its end, keeping only its last 512 bytes. (status, bytes, tail, 503s)
async fn get_drained(client: &reqwest::Client, url: &str, token: &str) -> (u16, u64, Vec<u8>, u64) {
    let mut refused = 0;
    loop {
        let mut res = match client.get(url).bearer_auth(token).send().await {
            Ok(r) => r,
            Err(e) => panic!("GET {url}: {e}"),
        };
        let status = res.status().as_u16();
        if status == 503 {
            refused += 1;
            let wait = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1);
            let _ = res.bytes().await;
            tokio::time::sleep(Duration::from_secs(wait)).await;
            continue;
        }
        let (mut n, mut tail) = (0u64, Vec::new());
        loop {
            match res.chunk().await {
                Ok(Some(c)) => {
                    n += c.len() as u64;
                    tail.extend_from_slice(&c);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 512);
                    }
                }
                Ok(None) => break,
                Err(e) => panic!("GET {url}: answer cut: {e}"),
            }
        }
        let keep = tail.len().saturating_sub(512);
        tail.drain(..keep);
        return (status, n, tail, refused);
    }
}

/// A number after `"name":` in `text`.
fn field(text: &str, name: &str) -> Option<String> {
    let at = text.rfind(&format!("\"{name}\":"))? + name.len() + 3;
    Some(
        text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect(),
    )
}

/// Another tenant's listing, over and over until `done`: its latencies.
fn prober(
    client: reqwest::Client,
    url: String,
    token: String,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Duration>> {
    tokio::spawn(async move {
        let mut took = Vec::new();
        let list = format!("{url}/v1/tenants/{OTHER}/runs?limit=50");
        while !done.load(Ordering::Relaxed) {
            let t = Instant::now();
            let res = client.get(&list).bearer_auth(&token).send().await;
            if let Ok(r) = res {
                let _ = r.bytes().await;
            }
            took.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        took
    })
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

struct Phase {
    name: String,
    readers: usize,
    seconds: f64,
    peak_mib: f64,
    bytes_each_mib: f64,
    refused: u64,
    requests: u64,
    list_p50: f64,
    list_p99: f64,
    list_max: f64,
    statuses: String,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let num = |name: &str, d: usize| arg(name).and_then(|v| v.parse().ok()).unwrap_or(d);
    let bin = arg("--bin").unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/runkeep").to_string()
    });
    let readers = num("--readers", 32);
    let transcript_readers = num("--transcript-readers", readers);
    let cp_mib = num("--checkpoint-mib", 61);
    let tr_mib = num("--transcript-mib", 400);
    let event_kib = num("--event-kib", 4);
    let only = arg("--only");
    let wants = |p: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == p));

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let tokens = dir.path().join("tokens.json");
    let tok = token(&bin, &tokens, &root, TENANT);
    let other = token(&bin, &tokens, &root, OTHER);
    let server = Server::start(&bin, &tokens, &root);
    println!("binary: {bin}");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();

    // The other tenant's runs.
    for i in 0..50 {
        let r = client
            .post(format!(
                "{}/checkpoints",
                run_url(&server.url, OTHER, &format!("r{i}"))
            ))
            .bearer_auth(&other)
            .json(
                &serde_json::json!({"checkpoint": {"id": "c1", "createdAt": 1, "state": {"n": i}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }

    let mut phases = Vec::new();
    if wants("checkpoint") {
        let run = run_url(&server.url, TENANT, "big-checkpoint");
        let mut body = br#"{"checkpoint":{"id":"cp_big","createdAt":1,"state":{"x":["#.to_vec();
        let item = format!("\"{}\",", "x".repeat(1022));
        while body.len() < cp_mib << 20 {
            body.extend_from_slice(item.as_bytes());
        }
        body.extend_from_slice(b"\"end\"]}}}");
        let len = body.len();
        let r = client
            .post(format!("{run}/checkpoints"))
            .bearer_auth(&tok)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        let url = format!("{run}/checkpoints/by-id/cp_big");
        phases.push(
            phase(
                &server,
                &client,
                &other,
                &format!("checkpoint {:.0} MiB", len as f64 / (1 << 20) as f64),
                readers,
                |client| {
                    let (url, tok) = (url.clone(), tok.clone());
                    async move {
                        let (status, n, _, refused) = get_drained(&client, &url, &tok).await;
                        (status, n, refused, 1 + refused)
                    }
                },
            )
            .await,
        );
    }
    if wants("transcript") {
        let run = run_url(&server.url, TENANT, "big-transcript");
        let text = "y".repeat(event_kib * 1024 - 64);
        let per_batch = ((4 << 20) / (event_kib * 1024)).max(1);
        let total = (tr_mib << 20) / (event_kib * 1024);
        let mut written = 0;
        let started = Instant::now();
        while written < total {
            let n = per_batch.min(total - written);
            let events: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"type": "note", "payload": {"i": written + i, "text": text}}))
                .collect();
            let r = client
                .post(format!("{run}/events"))
                .bearer_auth(&tok)
                .json(&serde_json::json!({ "events": events }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
            written += n;
        }
        println!(
            "transcript: {total} events of {event_kib} KiB written in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let base = format!("{run}/events");
        phases.push(
            phase(
                &server,
                &client,
                &other,
                &format!("transcript {tr_mib} MiB"),
                transcript_readers,
                |client| {
                    let (base, tok) = (base.clone(), tok.clone());
                    async move {
                        let (mut since, mut bytes, mut refused, mut requests) = (0u64, 0, 0, 0);
                        loop {
                            let url = format!("{base}?sinceSeq={since}");
                            let (status, n, tail, r) = get_drained(&client, &url, &tok).await;
                            bytes += n;
                            refused += r;
                            requests += 1 + r;
                            if status != 200 {
                                return (status, bytes, refused, requests);
                            }
                            let tail = String::from_utf8_lossy(&tail).to_string();
                            if field(&tail, "more").as_deref() != Some("true") {
                                return (status, bytes, refused, requests);
                            }
                            since = field(&tail, "nextSinceSeq")
                                .and_then(|s| s.parse().ok())
                                .expect("nextSinceSeq with more");
                        }
                    }
                },
            )
            .await,
        );
    }
    println!(
        "{:<24} {:>7} {:>8} {:>11} {:>12} {:>9} {:>9} {:>13} {:>13} {:>13}  statuses",
        "phase",
        "readers",
        "seconds",
        "peak +MiB",
        "MiB/reader",
        "requests",
        "503s",
        "list p50 ms",
        "list p99 ms",
        "list max ms"
    );
    for p in phases {
        println!(
            "{:<24} {:>7} {:>8.1} {:>11.0} {:>12.1} {:>9} {:>9} {:>13.1} {:>13.1} {:>13.1}  {}",
            p.name,
            p.readers,
            p.seconds,
            p.peak_mib,
            p.bytes_each_mib,
            p.requests,
            p.refused,
            p.list_p50,
            p.list_p99,
            p.list_max,
            p.statuses
        );
    }
}

async fn phase<F, Fut>(
    server: &Server,
    client: &reqwest::Client,
    other: &str,
    name: &str,
    readers: usize,
    read: F,
) -> Phase
where
    F: Fn(reqwest::Client) -> Fut,
    Fut: std::future::Future<Output = (u16, u64, u64, u64)> + Send + 'static,
{
    // Let the writes' memory settle before the phase's baseline.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = server.reset_peak();
    let done = Arc::new(AtomicBool::new(false));
    let probe = prober(
        client.clone(),
        server.url.clone(),
        other.to_string(),
        done.clone(),
    );
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..readers)
        .map(|_| tokio::spawn(read(client.clone())))
        .collect();
    let (mut refused, mut requests) = (0, 0);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for t in tasks {
        let (status, n, r, q) = t.await.unwrap();
        *statuses.entry(status).or_default() += 1;
        bytes.fetch_add(n, Ordering::Relaxed);
        refused += r;
        requests += q;
    }
    let seconds = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let mut took = probe.await.unwrap();
    took.sort();
    let peak = server.status_kib("VmHWM:").saturating_sub(base);
    Phase {
        name: name.to_string(),
        readers,
        seconds,
        peak_mib: peak as f64 / 1024.0,
        bytes_each_mib: bytes.load(Ordering::Relaxed) as f64 / readers as f64 / (1 << 20) as f64,
        refused,
        requests,
        list_p50: pct(&took, 0.5),
        list_p99: pct(&took, 0.99),
        list_max: took.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        statuses: statuses
            .iter()
            .map(|(s, n)| format!("{s}×{n}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}
