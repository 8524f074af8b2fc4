//! End-to-end tests of `runkeep` against a real PostgreSQL server: every
//! command with `--store postgres://…`, `runkeep migrate`, read commands
//! refusing a missing or newer schema, the password never printed, the
//! doctor's PostgreSQL checks and a soak with its chaos.
//!
//! `RUNKEEP_TEST_POSTGRES_URL` names the server (`scripts/test.sh` sets
//! it). Set and unreachable, every test fails; unset, each prints why and
//! returns. Every test uses a schema of its own, dropped by a guard.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{runkeep, wait_within};
use serde_json::Value;

const URL_VAR: &str = "RUNKEEP_TEST_POSTGRES_URL";
/// Put into every URL of these tests (trust auth ignores it); no output of
/// any command may contain it.
const PASSWORD: &str = "pw_Sekr3t_q7";

fn url_or_skip(test: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            eprintln!("SKIPPED {test}: {URL_VAR} is not set (scripts/test.sh sets it to postgres://postgres@127.0.0.1:5432/test)");
            None
        }
    }
}

/// Runs SQL on the server with a connection of its own (test setup,
/// read-back and clean-up).
fn sql(url: &str, statements: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_postgres::connect(url, tokio_postgres::NoTls),
        )
        .await
        .unwrap_or_else(|_| panic!("{URL_VAR} is set but the server did not answer within 10 s"))
        .unwrap_or_else(|e| panic!("{URL_VAR} is set but the server is unreachable: {e}"));
        tokio::spawn(conn);
        tokio::time::timeout(Duration::from_secs(30), client.simple_query(statements))
            .await
            .expect("SQL within 30 s")
            .unwrap_or_else(|e| panic!("{statements}: {e}"))
    })
}

/// The first column of the first row `query` answers, as text.
fn scalar(url: &str, query: &str) -> String {
    sql(url, query)
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{query}: no row"))
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A schema of the test's own, dropped when the guard drops (pass or fail).
struct Schema {
    server: String,
    name: String,
}

impl Schema {
    fn new(server: &str, label: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "rkcli_{label}_{}_{n}_{}",
            std::process::id(),
            runkeep::id::random_suffix(4)
        );
        // Reachable, or fail now.
        sql(server, "SELECT 1");
        Self {
            server: server.to_string(),
            name,
        }
    }

    /// The server URL with the test's password and `?schema=`.
    fn address(&self) -> String {
        let with_password =
            self.server
                .replacen("://postgres@", &format!("://postgres:{PASSWORD}@"), 1);
        assert!(
            with_password.contains(PASSWORD),
            "the test URL must name user postgres: {}",
            self.server
        );
        let sep = if with_password.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{with_password}{sep}schema={}", self.name)
    }

    fn cmd(&self, args: &[&str]) -> assert_cmd::Command {
        let mut c = runkeep();
        c.arg("--store").arg(self.address()).args(args);
        c
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            sql(
                &server,
                &format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"),
            )
        })
        .join();
    }
}

/// What one command printed, checked for the password.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(schema: &Schema, args: &[&str]) -> Ran {
    let out = schema.cmd(args).output().expect("run runkeep");
    ran(args, out)
}

fn ran(args: &[&str], out: std::process::Output) -> Ran {
    let r = Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !r.stdout.contains(PASSWORD) && !r.stderr.contains(PASSWORD),
        "{args:?} printed the password:\nstdout: {}\nstderr: {}",
        r.stdout,
        r.stderr
    );
    r
}

fn ok(schema: &Schema, args: &[&str]) -> Ran {
    let r = run(schema, args);
    assert_eq!(
        r.code,
        Some(0),
        "{args:?}\nstdout: {}\nstderr: {}",
        r.stdout,
        r.stderr
    );
    r
}

fn json(schema: &Schema, args: &[&str]) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let r = ok(schema, &full);
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", r.stdout))
}

fn ids(doc: &Value) -> Vec<String> {
    doc["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries in {doc}"))
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn read_commands_refuse_an_unmigrated_schema_and_migrate_is_idempotent() {
    let Some(server) = url_or_skip("read_commands_refuse_an_unmigrated_schema") else {
        return;
    };
    let s = Schema::new(&server, "migrate");
    for args in [
        &["runs"][..],
        &["show", "run_x"],
        &["checkpoints", "run_x"],
        &["events", "run_x"],
        &["claim", "run_x"],
        &["enqueue", "run_x"],
    ] {
        let r = run(&s, args);
        assert_eq!(r.code, Some(78), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("never migrated"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("runkeep migrate"),
            "{args:?}: {}",
            r.stderr
        );
    }
    // Nothing was created by the refused commands (not even the schema).
    let rows = scalar(
        &server,
        &format!(
            "SELECT count(*) FROM pg_namespace WHERE nspname = '{}'",
            s.name
        ),
    );
    assert!(rows == "0", "a refused command created the schema");

    let first = ok(&s, &["migrate"]);
    assert!(
        first.stdout.contains(&format!(
            "created the tables: runkeep schema version {}",
            runkeep_postgres::SCHEMA_VERSION
        )),
        "{}",
        first.stdout
    );
    assert!(
        first.stdout.contains(&format!("schema {}", s.name)),
        "{}",
        first.stdout
    );
    let again = json(&s, &["migrate"]);
    assert_eq!(again["version"], runkeep_postgres::SCHEMA_VERSION);
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(json(&s, &["runs"])["entries"].as_array().unwrap().len(), 0);

    // A schema a newer binary migrated is refused by every command (78),
    // and migrate refuses it too.
    sql(
        &server,
        &format!(
            "INSERT INTO \"{}\".runkeep_schema (version) VALUES (99)",
            s.name
        ),
    );
    for args in [&["runs"][..], &["claim", "run_x"], &["migrate"]] {
        let r = run(&s, args);
        assert_eq!(r.code, Some(78), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!(
                "newer than version {}",
                runkeep_postgres::SCHEMA_VERSION
            )),
            "{args:?}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("upgrade runkeep"),
            "{args:?}: {}",
            r.stderr
        );
    }
}

#[test]
fn every_command_works_on_postgres_and_never_prints_the_password() {
    let Some(server) = url_or_skip("every_command_works_on_postgres") else {
        return;
    };
    let s = Schema::new(&server, "commands");
    // seed migrates (it creates the store, as it creates a directory).
    let seeded = ok(&s, &["seed"]);
    assert!(
        seeded.stdout.contains("seeded 6 run(s) into postgres://…@"),
        "{}",
        seeded.stdout
    );
    let all = json(&s, &["runs"]);
    assert_eq!(
        ids(&all),
        [
            "run_demo_001",
            "run_demo_002",
            "run_demo_003",
            "run_demo_004",
            "run_demo_005",
            "run_demo_006"
        ]
    );
    assert_eq!(
        ids(&json(&s, &["runs", "--status", "completed"])),
        ["run_demo_001"]
    );
    assert_eq!(
        ids(&json(&s, &["runs", "--park", "outstanding"])),
        ["run_demo_002"]
    );
    let show = json(&s, &["show", "run_demo_002"]);
    assert_eq!(show["park"]["state"], "outstanding", "{show}");
    let cps = json(&s, &["checkpoints", "run_demo_001"]);
    assert_eq!(cps.as_array().map(Vec::len), Some(3), "{cps}");
    let events = ok(&s, &["--json", "events", "run_demo_001"]);
    let seqs: Vec<u64> = events
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);

    // Leases: claim, held by another, renew, release, claim above the tombstone.
    let claim = json(
        &s,
        &["claim", "run_demo_005", "--holder", "alice", "--ttl", "30s"],
    );
    assert_eq!(claim["outcome"], "acquired");
    assert_eq!(claim["lease"]["fence"], 1);
    let held = run(&s, &["claim", "run_demo_005", "--holder", "bob"]);
    assert_eq!(held.code, Some(1));
    assert!(
        held.stderr.contains("is held by alice at fence 1"),
        "{}",
        held.stderr
    );
    let stale = run(&s, &["release", "run_demo_005", "--fence", "7"]);
    assert_eq!(stale.code, Some(1), "{}", stale.stderr);
    assert_eq!(
        json(&s, &["release", "run_demo_005", "--fence", "1"])["released"],
        true
    );
    assert_eq!(
        json(&s, &["claim", "run_demo_005", "--holder", "bob"])["lease"]["fence"],
        3
    );

    // Prune keeps the newest and every unanswered park.
    let pruned = json(&s, &["prune", "run_demo_001", "--keep", "1"]);
    assert_eq!(pruned["remaining"], 1, "{pruned}");
    assert_eq!(
        json(&s, &["checkpoints", "run_demo_001"])
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    // Parks: answer one, close an expired one.
    let resolved = json(
        &s,
        &[
            "park",
            "resolve",
            "run_demo_002",
            "--decision",
            "{\"action\":\"approve\"}",
        ],
    );
    assert_eq!(resolved["checkpointId"], "cp_2", "{resolved}");
    assert_eq!(resolved["decision"]["action"], "approve", "{resolved}");
    assert_eq!(
        json(&s, &["show", "run_demo_002"])["park"]["state"],
        "resolved"
    );
    ok(&s, &["park", "resolve", "run_demo_003", "--expire"]);

    // Lifecycle: enqueue, claim, finish, reopen.
    let enq = json(
        &s,
        &[
            "enqueue",
            "run_q",
            "--input",
            "{\"n\":1}",
            "--max-attempts",
            "3",
        ],
    );
    assert_eq!(enq["checkpoint"]["id"], "cp_enqueued", "{enq}");
    let dup = run(&s, &["enqueue", "run_q"]);
    assert_eq!(
        dup.code,
        Some(1),
        "an existing run is refused: {}",
        dup.stderr
    );
    let fence = json(&s, &["claim", "run_q", "--holder", "w1"])["lease"]["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let finished = json(
        &s,
        &[
            "finish",
            "run_q",
            "--fence",
            &fence,
            "--status",
            "completed",
            "--result",
            "{\"ok\":true}",
        ],
    );
    assert_eq!(finished["lifecycle"]["status"], "completed", "{finished}");
    assert_eq!(
        ids(&json(&s, &["runs", "--status", "completed"])),
        ["run_demo_001", "run_q"]
    );
    let after = run(&s, &["claim", "run_q", "--holder", "w2"]);
    assert_eq!(
        after.code,
        Some(1),
        "a finished run is not claimable: {}",
        after.stderr
    );
    ok(&s, &["reopen", "run_q"]);
    assert_eq!(
        json(&s, &["claim", "run_q", "--holder", "w2"])["outcome"],
        "acquired"
    );

    // Doctor: healthy apart from the seeded findings; its PostgreSQL checks ran.
    let doctor = run(&s, &["--json", "doctor"]);
    let doc: Value = serde_json::from_str(&doctor.stdout).unwrap();
    let status = |id: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {doc}"))["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(doctor.code, Some(0), "{}", doctor.stdout);
    assert_eq!(status("store.reachable"), "pass");
    assert_eq!(status("store.writable"), "pass");
    assert_eq!(status("store.schema-version"), "pass");
    assert_eq!(status("store.row-locks"), "pass");
    assert_eq!(
        status("leases.expired-unreclaimed"),
        "warn",
        "run_demo_006's lease lapsed"
    );
    assert_eq!(status("queue.dead-lettered"), "pass");
    assert_eq!(status("store.hard-links"), "skipped");
    // The doctor's probe left nothing behind.
    let left = scalar(
        &server,
        &format!(
            "SELECT count(*) FROM \"{}\".runs WHERE tenant_id = 'runkeep-doctor'",
            s.name
        ),
    );
    assert!(left == "0", "the probe run was left in the store");
    // Human output names the store without the password.
    let human = ok(&s, &["runs"]);
    assert!(human.stdout.contains("run_demo_001"));
}

#[test]
fn errors_never_print_the_password() {
    let Some(server) = url_or_skip("errors_never_print_the_password") else {
        return;
    };
    let s = Schema::new(&server, "errors");
    ok(&s, &["migrate"]);
    // Unknown run, bad schema name, conflicting schemas, unreachable server.
    let unknown = run(&s, &["show", "run_ghost"]);
    assert_eq!(unknown.code, Some(1), "{}", unknown.stderr);
    let bad = ran(
        &["bad schema"],
        runkeep()
            .args([
                "--store",
                &format!("postgres://postgres:{PASSWORD}@127.0.0.1:5432/test?schema=Bad-Name"),
                "runs",
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(bad.code, Some(64), "{}", bad.stderr);
    assert!(bad.stderr.contains("schema name"), "{}", bad.stderr);
    let conflict = run(&s, &["--pg-schema", "other", "runs"]);
    assert_eq!(conflict.code, Some(64), "{}", conflict.stderr);
    // Port 1 on loopback: nothing listens.
    let gone_url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test");
    for args in [&["runs"][..], &["migrate"], &["claim", "run_x"]] {
        let mut c = runkeep();
        c.arg("--store").arg(&gone_url).args(args);
        let r = ran(args, c.output().unwrap());
        assert_eq!(r.code, Some(69), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr
                .contains("cannot reach store postgres://…@127.0.0.1:1/test"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let mut c = runkeep();
    c.args(["--store", &gone_url, "--json", "doctor"]);
    let doctor = ran(&["doctor"], c.output().unwrap());
    assert_eq!(doctor.code, Some(1), "{}", doctor.stdout);
    assert!(
        doctor.stdout.contains("\"store.reachable\""),
        "{}",
        doctor.stdout
    );
    // A password in a query parameter is redacted too.
    let mut c = runkeep();
    c.args([
        "--store",
        &format!("postgres://postgres@127.0.0.1:1/test?password={PASSWORD}"),
        "runs",
    ]);
    let r = ran(&["password="], c.output().unwrap());
    assert!(r.stderr.contains("password=…"), "{}", r.stderr);
    // --help never shows the RUNKEEP_STORE it was given.
    let mut c = runkeep();
    c.env(
        "RUNKEEP_STORE",
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test"),
    )
    .args(["runs", "--help"]);
    let r = ran(&["--help"], c.output().unwrap());
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("RUNKEEP_STORE"), "{}", r.stdout);
    // A store address that does not parse is not echoed when it may hold one.
    let mut c = runkeep();
    c.args(["--store", &format!("mysql://root:{PASSWORD}@db/x"), "runs"]);
    let r = ran(&["mysql"], c.output().unwrap());
    assert_eq!(r.code, Some(64), "{}", r.stderr);
}

#[test]
fn doctor_reports_schema_version_locks_expired_leases_and_dead_letters() {
    let Some(server) = url_or_skip("doctor_reports_schema_version_locks") else {
        return;
    };
    let s = Schema::new(&server, "doctor");
    let check = |doc: &Value, id: &str| -> (String, String) {
        let c = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {doc}"));
        (
            c["status"].as_str().unwrap().to_string(),
            c["message"].as_str().unwrap().to_string(),
        )
    };
    let doctor = |extra: &[&str]| -> (Option<i32>, Value) {
        let mut args = vec!["--json", "doctor"];
        args.extend_from_slice(extra);
        let r = run(&s, &args);
        (
            r.code,
            serde_json::from_str(&r.stdout)
                .unwrap_or_else(|e| panic!("{args:?}: {e}: {}\n{}", r.stdout, r.stderr)),
        )
    };
    // Missing schema: a finding, not a refusal.
    let (code, doc) = doctor(&[]);
    assert_eq!(code, Some(1));
    let (st, msg) = check(&doc, "store.schema-version");
    assert_eq!(st, "fail");
    assert!(msg.contains("never migrated"), "{msg}");
    assert_eq!(check(&doc, "store.reachable").0, "pass");

    ok(&s, &["seed"]);
    // A run whose holders keep losing it: dead-lettered at its limit.
    ok(&s, &["enqueue", "run_poison", "--max-attempts", "1"]);
    ok(
        &s,
        &["claim", "run_poison", "--holder", "w1", "--ttl", "1ms"],
    );
    // The lease lapses on the server's clock (1 ms); the takeover dead-letters.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = run(&s, &["--json", "claim", "run_poison", "--holder", "w2"]);
        if r.stdout.contains("attempts exhausted")
            || r.stderr.contains("attempts exhausted")
            || r.stderr.contains("finished")
            || r.stdout.contains("finished")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "run_poison never dead-lettered: {} {}",
            r.stdout,
            r.stderr
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A transaction of the test's own holds run_demo_004's row lock.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder = rt.block_on(async {
        let url = format!(
            "{server}{}application_name=rk_test_lock_holder",
            if server.contains('?') { '&' } else { '?' }
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "BEGIN; SELECT 1 FROM \"{}\".runs WHERE run_id = 'run_demo_004' FOR UPDATE",
                s.name
            ))
            .await
            .unwrap();
        client
    });
    // Its transaction began before the doctor started: older than 1 ms.
    let (code, doc) = doctor(&["--lock-age", "1ms"]);
    let (st, msg) = check(&doc, "store.row-locks");
    assert_eq!(st, "warn", "{msg}");
    assert!(msg.contains("rk_test_lock_holder"), "{msg}");
    assert!(msg.contains("runs RowShareLock"), "{msg}");
    assert!(msg.contains("idle in transaction"), "{msg}");
    // The doctor's own connections never count (its probe writes meanwhile).
    assert!(!msg.contains("runkeep-doctor"), "{msg}");
    let (st, msg) = check(&doc, "queue.dead-lettered");
    assert_eq!(st, "warn", "{msg}");
    assert!(msg.contains("run_poison (1 attempt(s)"), "{msg}");
    let (st, msg) = check(&doc, "leases.expired-unreclaimed");
    assert_eq!(st, "warn", "{msg}");
    assert!(msg.contains("run_demo_006 (worker-b"), "{msg}");
    assert_eq!(check(&doc, "store.schema-version").0, "pass");
    assert_eq!(code, Some(0), "warnings only: {doc}");
    // Autovacuum: as the server is set (this machine's turns it off), then
    // off for the store's runs table whatever the server says.
    let server_on = scalar(&server, "SHOW autovacuum") == "on";
    let (st, msg) = check(&doc, "store.autovacuum");
    assert_eq!(st, if server_on { "pass" } else { "warn" }, "{msg}");
    assert!(msg.contains("row versions in"), "{msg}");
    // `off`, not `false`: PostgreSQL keeps the spelling it was given.
    sql(
        &server,
        &format!(
            "ALTER TABLE \"{}\".runs SET (autovacuum_enabled = off)",
            s.name
        ),
    );
    let (_, doc) = doctor(&["--category", "store"]);
    let (st, msg) = check(&doc, "store.autovacuum");
    assert_eq!(st, "warn", "{msg}");
    assert!(msg.contains("disabled on table"), "{msg}");
    // Under the default threshold (10 s) the same young lock is no finding.
    let (_, doc) = doctor(&["--category", "leases"]);
    assert_eq!(check(&doc, "store.row-locks").0, "pass");
    rt.block_on(async { holder.batch_execute("ROLLBACK").await.unwrap() });
    let (_, doc) = doctor(&["--lock-age", "1ms", "--category", "leases"]);
    assert_eq!(check(&doc, "store.row-locks").0, "pass", "released: {doc}");

    // A newer schema: the doctor says so.
    sql(
        &server,
        &format!(
            "INSERT INTO \"{}\".runkeep_schema (version) VALUES (99)",
            s.name
        ),
    );
    let (code, doc) = doctor(&[]);
    assert_eq!(code, Some(1));
    let (st, msg) = check(&doc, "store.schema-version");
    assert_eq!(st, "fail");
    assert!(
        msg.contains(&format!(
            "newer than version {}",
            runkeep_postgres::SCHEMA_VERSION
        )),
        "{msg}"
    );
}

#[test]
fn events_follow_is_woken_by_listen_notify() {
    let Some(server) = url_or_skip("events_follow_is_woken_by_listen_notify") else {
        return;
    };
    let s = Schema::new(&server, "follow");
    ok(&s, &["migrate"]);
    // With an hour between polls, only a notification brings the events in time.
    let bin = assert_cmd::cargo::cargo_bin("runkeep");
    let mut child = std::process::Command::new(bin)
        .args([
            "--store",
            &s.address(),
            "--json",
            "events",
            "run_demo_001",
            "--follow",
            "--interval",
            "1h",
        ])
        .env("NO_COLOR", "1")
        .env_remove("RUNKEEP_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err_tx = tx.clone();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(("out", line)).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if err_tx.send(("err", line)).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let recv = |what: &str| {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no {what} within 20 s"))
    };
    let (_, note) = recv("following note");
    assert!(note.contains("woken by the store"), "{note}");
    assert!(!note.contains(PASSWORD));
    // The LISTEN connection is up once the server lists it.
    let listening = Instant::now() + Duration::from_secs(10);
    loop {
        if scalar(
            &server,
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%runkeep_{}%' AND state = 'idle'",
                s.name
            ),
        ) != "0"
        {
            break;
        }
        assert!(Instant::now() < listening, "the follow never LISTENed");
        std::thread::sleep(Duration::from_millis(20));
    }
    ok(&s, &["seed", "--runs", "1"]);
    let mut seqs = Vec::new();
    while seqs.len() < 4 {
        let (stream, line) = recv("the seeded events");
        assert!(!line.contains(PASSWORD));
        if stream == "out" {
            seqs.push(
                serde_json::from_str::<Value>(&line).unwrap()["seq"]
                    .as_u64()
                    .unwrap(),
            );
        }
    }
    assert_eq!(seqs, [1, 2, 3, 4]);
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(30),
        "events --follow after SIGINT",
    );
    assert_eq!(status.code(), Some(0));
}

#[test]
fn soak_on_postgres_survives_kills_stalls_terminated_backends_and_partitions() {
    let Some(server) = url_or_skip("soak_on_postgres") else {
        return;
    };
    // Reachable, or fail now.
    sql(&server, "SELECT 1");
    let address = server.replacen("://postgres@", &format!("://postgres:{PASSWORD}@"), 1);
    let mut c = runkeep();
    c.timeout(Duration::from_secs(90)).args([
        "--store",
        &address,
        "--json",
        "soak",
        "--runs",
        "12",
        "--steps",
        "8",
        "--workers",
        "3",
        "--step-time",
        "40ms",
        "--ttl",
        "600ms",
        "--chaos-every",
        "150ms",
        "--timeout",
        "60s",
    ]);
    let r = ran(&["soak"], c.output().unwrap());
    let report: Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", r.stdout, r.stderr));
    assert_eq!(r.code, Some(0), "{report:#}\n{}", r.stderr);
    assert_eq!(
        report["audit"]["violations"].as_array().map(Vec::len),
        Some(0),
        "{report:#}"
    );
    assert_eq!(report["audit"]["runs_completed"], 12, "{report:#}");
    let store = report["store"].as_str().unwrap();
    assert!(
        store.contains("schema=runkeep_soak_"),
        "a fresh schema per soak: {store}"
    );
    let schema = store.rsplit("schema=").next().unwrap().to_string();
    // The chaos happened: kills, and the backend's own.
    assert!(
        report["kills"].as_u64().unwrap() + report["stalls"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    let backend = &report["backend_chaos"];
    let struck: u64 = backend
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    assert!(struck > 0, "no backend chaos struck: {report:#}");
    // Dropped afterwards (no --keep, no violation).
    let rows = scalar(
        &server,
        &format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"),
    );
    assert!(rows == "0", "schema {schema} was left behind");
    eprintln!(
        "soak on PostgreSQL: {}",
        serde_json::to_string(&report["backend_chaos"]).unwrap()
    );
}
