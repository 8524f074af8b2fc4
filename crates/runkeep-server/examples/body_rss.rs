//! What one request body costs `runkeep serve` in memory: peak RSS per MiB
//! of body, by shape.
//!
//! ```sh
//! cargo build -p runkeep-cli            # the binary measured
//! cargo run -p runkeep-server --example body_rss -- [--bin target/debug/runkeep] [--mib 60] [--shapes zeros,string]
//! ```
//!
//! For each shape a fresh `runkeep serve --demo` (in-memory store) is
//! started; its RSS is read from `/proc/<pid>/status` before the body is
//! sent (`VmRSS`), and its high-water mark (`VmHWM`) after the answer and
//! again after the checkpoint is read back (a reader's cost), and the
//! slowest `/healthz` answer while the body was handled. The figures
//! are the growth over the idle server, in MiB and per MiB of body. Any
//! `runkeep` binary that serves `--demo` can be measured, so an older build
//! can be compared with this one side by side.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TENANT: &str = "default";

struct Server {
    child: Child,
    url: String,
    token: String,
}

impl Server {
    fn start(bin: &str) -> Server {
        let mut child = Command::new(bin)
            .args(["serve", "--demo", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e} (build it: cargo build -p runkeep-cli)"));
        let out = BufReader::new(child.stdout.take().unwrap());
        let (mut url, mut token) = (None, None);
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                url = rest.split_whitespace().next().map(str::to_string);
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() == 2 && words[0] == "operator" {
                token = Some(words[1].to_string());
            }
            if url.is_some() && token.is_some() {
                break;
            }
        }
        Server {
            child,
            url: url.expect("the server's address"),
            token: token.expect("an operator token"),
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `{"checkpoint":{"id":…,"createdAt":1,"state":{"x":<value>}}}` with a
/// value of about `bytes` bytes of the given shape.
fn body(shape: &str, bytes: usize) -> Vec<u8> {
    let mut b = br#"{"checkpoint":{"id":"cp_big","createdAt":1,"state":{"x":"#.to_vec();
    match shape {
        "zeros" => {
            b.push(b'[');
            while b.len() < bytes {
                b.extend_from_slice(b"0,");
            }
            b.extend_from_slice(b"0]");
        }
        "objects" => {
            b.push(b'[');
            while b.len() < bytes {
                b.extend_from_slice(br#"{"a":0},"#);
            }
            b.extend_from_slice(b"{}]");
        }
        "nesting" => {
            let depth = bytes / 2;
            b.extend(std::iter::repeat_n(b'[', depth));
            b.extend(std::iter::repeat_n(b']', depth));
        }
        "string" => {
            b.push(b'"');
            b.extend(std::iter::repeat_n(b'x', bytes));
            b.push(b'"');
        }
        _ => unreachable!(),
    }
    b.extend_from_slice(b"}}}");
    b
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let bin = arg("--bin").unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/debug/runkeep").to_string()
    });
    let mib: usize = arg("--mib").and_then(|v| v.parse().ok()).unwrap_or(60);
    println!("binary: {bin}");
    println!(
        "{:<8} {:>9} {:>7} {:>9} {:>12} {:>12} {:>12} {:>13}",
        "shape",
        "body MiB",
        "status",
        "seconds",
        "peak +MiB",
        "per body MiB",
        "read +MiB",
        "healthz max ms"
    );
    let cases: Vec<(&str, usize)> = vec![
        ("zeros", mib << 20),
        ("objects", mib << 20),
        ("nesting", 8 << 20),
        ("string", mib << 20),
        ("zeros", 2 << 20),
    ];
    let only = arg("--shapes");
    let client = reqwest::Client::new();
    for (shape, bytes) in cases {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|x| x == shape))
        {
            continue;
        }
        let server = Server::start(&bin);
        let payload = body(shape, bytes);
        let len = payload.len();
        let base = server.status_kib("VmRSS:");
        let path = format!(
            "{}/v1/tenants/{TENANT}/projects/rss/sessions/rss/runs/{shape}",
            server.url
        );
        let started = Instant::now();
        // `/healthz` is probed while the body is handled: a parse on the
        // async threads would hold its answer up.
        let done = Arc::new(AtomicBool::new(false));
        let probe = {
            let (client, url, done) = (client.clone(), server.url.clone(), done.clone());
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while !done.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let _ = client.get(format!("{url}/healthz")).send().await;
                    worst = worst.max(t.elapsed());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                worst
            })
        };
        let res = client
            .post(format!("{path}/checkpoints"))
            .bearer_auth(&server.token)
            .header("content-type", "application/json")
            .body(payload)
            .send()
            .await
            .expect("an answer");
        let status = res.status().as_u16();
        let _ = res.bytes().await;
        let secs = started.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let healthz = probe.await.unwrap();
        let peak = server.status_kib("VmHWM:").saturating_sub(base);
        let read = if status == 200 {
            let res = client
                .get(format!("{path}/checkpoints/latest"))
                .bearer_auth(&server.token)
                .send()
                .await
                .expect("an answer");
            let _ = res.bytes().await;
            format!(
                "{:.0}",
                server.status_kib("VmHWM:").saturating_sub(base) as f64 / 1024.0
            )
        } else {
            "-".into()
        };
        let body_mib = len as f64 / (1 << 20) as f64;
        println!(
            "{shape:<8} {body_mib:>9.1} {status:>7} {secs:>9.2} {:>12.0} {:>12.1} {read:>12} {:>13}",
            peak as f64 / 1024.0,
            peak as f64 / 1024.0 / body_mib,
            healthz.as_millis(),
        );
    }
}
