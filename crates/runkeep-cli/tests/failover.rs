//! PostgreSQL replication and failover, end to end:
//!
//! - the doctor's `store.replication` check against the plain test server
//!   (no standby: said so, no warning about standbys), and against a real
//!   primary/standby pair made by `scripts/pg-pair.sh`: asynchronous
//!   (warns), made synchronous (passes), `synchronous_commit` lowered for
//!   the store's role in its database (warns with the fix for that level);
//! - a soak worker started while no server of the pair accepts writes (the
//!   standby before its promotion): it waits instead of exiting, and
//!   connects once the standby is promoted; given a short `--open-wait`
//!   it gives up with an error that says why.
//!
//! The pair tests run the clusters as the `postgres` user: they need root
//! and PostgreSQL 15 (`scripts/test.sh` runs them as root with
//! `--include-ignored`). The plain-server test reads
//! `RUNKEEP_TEST_POSTGRES_URL` (unset: it prints why and returns).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{runkeep, wait_within};
use serde_json::Value;

/// A pair made by `scripts/pg-pair.sh up`, taken down (and its directory
/// removed) when dropped.
struct Pair {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    env: Vec<(String, String)>,
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

impl Pair {
    fn up(mode: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("runkeep-pair-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().join("pair");
        let out = Command::new("bash")
            .arg(script("pg-pair.sh"))
            .args(["up", dir.to_str().unwrap(), mode])
            .output()
            .expect("run scripts/pg-pair.sh");
        assert!(
            out.status.success(),
            "scripts/pg-pair.sh up {mode} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(dir.join("pair.env")).unwrap();
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            dir,
            _tmp: tmp,
            env,
        }
    }

    fn get(&self, key: &str) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {key} in pair.env"))
    }

    /// A URL of one server of the pair (database `rk`).
    fn url(&self, which: &str) -> String {
        let port = self.get(match which {
            "primary" => "PAIR_PRIMARY_PORT",
            _ => "PAIR_STANDBY_PORT",
        });
        format!("postgres://postgres@127.0.0.1:{port}/rk")
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script("pg-pair.sh"))
            .args(["down", self.dir.to_str().unwrap()])
            .output();
    }
}

/// Runs `statements` on `url` (simple protocol) and answers the first
/// column of the first row, if any.
fn sql(url: &str, statements: &str) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        tokio::spawn(conn);
        client
            .simple_query(statements)
            .await
            .unwrap_or_else(|e| panic!("{statements}: {e}"))
            .into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
    })
}

/// The doctor's `store.replication` record (status, message, remediation)
/// for `store`.
fn replication_check(store: &str) -> (String, String, String) {
    let out = runkeep()
        .args(["--store", store, "--json", "doctor", "--category", "store"])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let c = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "store.replication")
        .unwrap_or_else(|| panic!("no store.replication in {doc:#}"))
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    (text("status"), text("message"), text("remediation"))
}

#[test]
fn the_doctor_on_a_server_without_standbys_says_so_and_warns_about_none() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("SKIPPED: RUNKEEP_TEST_POSTGRES_URL is not set (scripts/test.sh sets it)");
        return;
    };
    let schema = format!("rk_failover_doctor_{}", std::process::id());
    let store = format!(
        "{url}{}schema={schema}",
        if url.contains('?') { '&' } else { '?' }
    );
    let migrated = runkeep()
        .args(["--store", &store, "migrate"])
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    let (status, message, _) = replication_check(&store);
    sql(&url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    assert_eq!(status, "pass", "{message}");
    assert!(message.contains("no standby streams"), "{message}");
    assert!(!message.contains("asynchronous"), "{message}");
}

#[test]
#[ignore = "needs root and PostgreSQL 15: runs a primary/standby pair (scripts/pg-pair.sh) as postgres; scripts/test.sh runs it as root"]
fn the_doctor_warns_on_an_asynchronous_standby_and_a_lowered_synchronous_commit() {
    let pair = Pair::up("async");
    let store = pair.get("PAIR_URL").to_string();
    let migrated = runkeep()
        .args(["--store", &store, "migrate"])
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");

    // Asynchronous: a warning naming the standby, the fence risk and the fix.
    let (status, message, fix) = replication_check(&store);
    assert_eq!(status, "warn", "{message}");
    assert!(message.contains("standby1 (async)"), "{message}");
    assert!(message.contains("same fence"), "{message}");
    assert!(fix.contains("synchronous_standby_names"), "{fix}");

    // Made synchronous: a pass.
    let primary = pair.url("primary");
    // (two calls: ALTER SYSTEM cannot run in the implicit transaction of
    // a multi-statement query)
    sql(
        &primary,
        "ALTER SYSTEM SET synchronous_standby_names = 'standby1'",
    );
    sql(&primary, "SELECT pg_reload_conf()");
    let sync_seen = (0..200).any(|_| {
        let s = sql(
            &primary,
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'",
        );
        s.as_deref() == Some("sync") || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(sync_seen, "the standby never became sync");
    let (status, message, _) = replication_check(&store);
    assert_eq!(status, "pass", "{message}");
    assert!(
        message.contains("every standby is synchronous (standby1)"),
        "{message}"
    );

    // synchronous_commit lowered for the store's role in its database: a
    // warning whose fix is at that level.
    sql(
        &primary,
        "ALTER ROLE postgres IN DATABASE rk SET synchronous_commit = local",
    );
    let (status, message, fix) = replication_check(&store);
    assert_eq!(status, "warn", "{message}");
    assert!(message.contains("synchronous_commit is local"), "{message}");
    assert!(
        fix.contains("ALTER ROLE \"postgres\" IN DATABASE \"rk\" RESET synchronous_commit"),
        "{fix}"
    );
}

/// Reads `child`'s stderr line by line until a line contains `mark`
/// (panics at its end); answers the lines read.
fn read_until(stderr: &mut impl BufRead, mark: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            panic!("stderr ended before {mark:?}:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains(mark) {
            return seen;
        }
    }
}

fn soak_worker(url: &str, dir: &Path, open_wait: &str) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    c.env("RUNKEEP_STORE", url)
        .env("NO_COLOR", "1")
        .args(["soak-worker", "--soak-dir"])
        .arg(dir)
        .args([
            "--steps",
            "1",
            "--ttl",
            "1500ms",
            "--step-time",
            "10ms",
            "--label",
            "w",
            "--open-wait",
            open_wait,
        ]);
    c
}

#[test]
#[ignore = "needs root and PostgreSQL 15: runs a primary/standby pair (scripts/pg-pair.sh) as postgres; scripts/test.sh runs it as root"]
fn a_worker_started_before_the_promotion_waits_for_a_writable_server() {
    let pair = Pair::up("sync");
    let migrated = runkeep()
        .args(["--store", pair.get("PAIR_URL"), "migrate"])
        .output()
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    let soak_dir = pair.dir.join("soak");
    std::fs::create_dir_all(&soak_dir).unwrap();
    // Only the standby, read-write required: what a multi-host URL meets
    // while the primary is dead and the standby not promoted yet.
    let standby_only = format!(
        "postgres://postgres@127.0.0.1:{}/rk?target_session_attrs=read-write&application_name=rk_waiting_worker",
        pair.get("PAIR_STANDBY_PORT")
    );

    // Given a short wait, it gives up with an error that says why.
    let out = soak_worker(&standby_only, &soak_dir, "600ms")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("does not allow writes"), "{err}");
    assert!(err.contains("gave up after"), "{err}");
    assert!(
        err.contains("longer --open-wait"),
        "the error says what to do: {err}"
    );

    // Started before the promotion, it waits, then connects.
    let mut worker = soak_worker(&standby_only, &soak_dir, "2m")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(worker.stderr.take().unwrap());
    let before = read_until(&mut stderr, "does not answer yet");
    assert!(before.contains("does not allow writes"), "{before}");
    // Still waiting (the interleaving: it did not exit on the refusal).
    assert!(worker.try_wait().unwrap().is_none(), "{before}");
    let primary_pid =
        std::fs::read_to_string(Path::new(pair.get("PAIR_PRIMARY_DATA")).join("postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .trim()
            .to_string();
    let killed = Command::new("kill")
        .args(["-9", &primary_pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let standby = pair.url("standby");
    assert_eq!(
        sql(&standby, "SELECT pg_promote(true, 60)").as_deref(),
        Some("t")
    );
    // Connected to the promoted server: its session shows there.
    let connected = (0..600).any(|_| {
        let n = sql(
            &standby,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rk_waiting_worker'",
        );
        n.as_deref() != Some("0") || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(
        connected,
        "the worker never connected to the promoted standby"
    );
    assert!(worker.try_wait().unwrap().is_none(), "the worker exited");
    let term = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = wait_within(&mut worker, Duration::from_secs(30), "the soak worker");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(status.success(), "{status:?}\n{rest}");
}
