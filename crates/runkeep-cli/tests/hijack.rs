//! Two `runkeep serve` processes in front of one store, and a second worker
//! token of the tenant flooding the run an honest worker is on under its
//! top fence and the next one (issue 26, item 1): no run hijacked, no
//! foreign event, on the directory root and on PostgreSQL. The flood is
//! `runkeep_conformance::hijack`; the forced interleaving of every fenced
//! act is `runkeep-server/tests/hijack.rs`. Size: `RUNKEEP_HIJACK_RUNS`
//! (default 50).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use runkeep::RunStore;
use runkeep_conformance::{hijack, support};
use runkeep_http::client::{HttpStore, HttpStoreOptions};
use serde_json::Value;

/// Kills the server when the test ends, however it ends.
struct Serve {
    child: Child,
    url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runkeep(store: &str) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_TOKENS",
        "RUNKEEP_PG_SCHEMA",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(["--store", store]);
    cmd
}

fn token(store: &str, tokens: &Path, role: &str) -> String {
    let out = runkeep(store)
        .args(["--json", "--tenant", support::tenant().as_str()])
        .args(["token", "create", "--role", role, "--tokens"])
        .arg(tokens)
        .output()
        .expect("runkeep token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).expect("json");
    created["token"].as_str().expect("a token").to_string()
}

fn serve(store: &str, tokens: &Path) -> Serve {
    let mut child = runkeep(store)
        .args(["--json", "serve", "--listen", "127.0.0.1:0", "--tokens"])
        .arg(tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start runkeep serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the address line");
    let listening: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("runkeep serve printed {line:?}: {e}"));
    let url = listening["address"].as_str().expect("address").to_string();
    Serve { child, url }
}

fn client(server: &Serve, token: &str) -> Arc<dyn RunStore> {
    Arc::new(
        HttpStore::new(
            server.url.clone(),
            HttpStoreOptions {
                request_timeout: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .expect("client")
        .with_token(support::tenant(), token),
    )
}

/// The flood through two `runkeep serve` processes over `store`.
fn flood_two_processes(label: &str, store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    let operator = token(store, &tokens, "operator");
    let honest = token(store, &tokens, "worker");
    let attacker = token(store, &tokens, "worker");
    let (s1, s2) = (serve(store, &tokens), serve(store, &tokens));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(hijack::flood_and_drain(
        client(&s1, &operator),
        client(&s1, &honest),
        vec![client(&s1, &attacker), client(&s2, &attacker)],
        hijack::runs_wanted(50),
    ));
    eprintln!("{}", report.line(label));
    report.assert_clean(label);
}

#[test]
fn two_serve_processes_on_one_directory_root_let_no_second_token_hijack_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("root:{}", dir.path().join("root").display());
    flood_two_processes("two runkeep serve, directory root", &store);
}

#[test]
fn two_serve_processes_on_one_postgres_schema_let_no_second_token_hijack_a_run() {
    let url = std::env::var("RUNKEEP_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .expect("RUNKEEP_TEST_POSTGRES_URL is not set: run scripts/test.sh or set it to postgres://postgres@127.0.0.1:5432/test");
    let schema = format!("rkt_cli_hijack_{}", std::process::id());
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = format!("{url}{sep}schema={schema}");
    let out = runkeep(&store)
        .arg("migrate")
        .output()
        .expect("runkeep migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    flood_two_processes("two runkeep serve, PostgreSQL", &store);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to drop the schema");
        let driver = tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .expect("drop the schema");
        drop(client);
        let _ = driver.await;
    });
}
