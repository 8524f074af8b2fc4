//! Several `runkeep serve` processes in front of one store, and clients of
//! them holding tokens of one tenant: what the tests of many servers share.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use runkeep::RunStore;
use runkeep_conformance::support;
use runkeep_http::client::{HttpStore, HttpStoreOptions};
use serde_json::Value;

/// Kills the server when the test ends, however it ends.
pub struct Serve {
    child: Child,
    /// Its address.
    pub url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn runkeep(store: &str) -> Command {
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

/// A token of the test tenant with `role`, added to `tokens`.
pub fn token(store: &str, tokens: &Path, role: &str) -> String {
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

/// `runkeep serve` on a free port over `store` with `tokens`.
pub fn serve(store: &str, tokens: &Path) -> Serve {
    serve_with(store, tokens, &[])
}

/// [`serve`] with more `runkeep serve` arguments.
pub fn serve_with(store: &str, tokens: &Path, args: &[&str]) -> Serve {
    let mut child = runkeep(store)
        .args(["--json", "serve", "--listen", "127.0.0.1:0", "--tokens"])
        .arg(tokens)
        .args(args)
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

/// An `HttpStore` of `server` holding `token`.
pub fn client(server: &Serve, token: &str) -> Arc<dyn RunStore> {
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

/// A fresh PostgreSQL schema on the test server, migrated, as a `--store`
/// URL; dropped by [`drop_schema`].
pub fn pg_store(label: &str) -> (String, String, String) {
    let url = std::env::var("RUNKEEP_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .expect("RUNKEEP_TEST_POSTGRES_URL is not set: run scripts/test.sh or set it to postgres://postgres@127.0.0.1:5432/test");
    let schema = format!("rkt_cli_{label}_{}", std::process::id());
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
    (url, schema, store)
}

/// Drops a schema [`pg_store`] made.
pub fn drop_schema(url: &str, schema: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
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
