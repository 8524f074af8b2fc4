//! The concurrency-key race through two `runkeep serve` processes in front
//! of one store (issue 30, item 2): 16 workers, half on each server, 20
//! keys with limits 1–3, 2 000 runs; the store's own holdings history (read
//! back through a server) shows no key past its limit and every run
//! completes. On the directory root and on PostgreSQL. The drain is
//! `runkeep_conformance::key_limits`.
//!
//! `RUNKEEP_KEY_RACE_RUNS` sizes the drain (default: the 2 000);
//! `scripts/test.sh` runs it at 600 to keep CI within its time (the
//! directory root's drain through two servers took 190 s of CI at full
//! size). The full size: `cargo test -p runkeep-cli --test key_limits`.

mod common;

use std::sync::Arc;

use runkeep::RunStore;
use runkeep_conformance::key_limits::{drain_keyed, KeyRace};

use common::servers::{client, drop_schema, pg_store, serve, token};

fn race_through_two_servers(label: &str, store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    let worker = token(store, &tokens, "worker");
    let (s1, s2) = (serve(store, &tokens), serve(store, &tokens));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stores: Vec<Arc<dyn RunStore>> = (0..16)
        .map(|i| client(if i % 2 == 0 { &s1 } else { &s2 }, &worker))
        .collect();
    let mut race = KeyRace::full();
    if let Ok(runs) = std::env::var("RUNKEEP_KEY_RACE_RUNS") {
        race.runs = runs
            .parse()
            .expect("RUNKEEP_KEY_RACE_RUNS is a number of runs");
    }
    let report = rt.block_on(drain_keyed(&stores, &race));
    eprintln!("{}", report.line(label));
    report.assert_clean(label);
}

#[test]
fn two_serve_processes_on_one_directory_root_hold_no_key_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("root:{}", dir.path().join("root").display());
    race_through_two_servers("two runkeep serve, directory root", &store);
}

#[test]
fn two_serve_processes_on_one_postgres_schema_hold_no_key_past_its_limit() {
    let (url, schema, store) = pg_store("keyrace");
    race_through_two_servers("two runkeep serve, PostgreSQL", &store);
    drop_schema(&url, &schema);
}
