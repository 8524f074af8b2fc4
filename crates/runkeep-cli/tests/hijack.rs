//! Two `runkeep serve` processes in front of one store, and a second worker
//! token of the tenant flooding the run an honest worker is on under its
//! top fence and the next one (issue 26, item 1): no run hijacked, no
//! foreign event, on the directory root and on PostgreSQL. The flood is
//! `runkeep_conformance::hijack`; the forced interleaving of every fenced
//! act is `runkeep-server/tests/hijack.rs`. Size: `RUNKEEP_HIJACK_RUNS`
//! (default 50).

mod common;

use runkeep_conformance::hijack;

use common::servers::{client, drop_schema, pg_store, serve, token};

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
    let (url, schema, store) = pg_store("hijack");
    flood_two_processes("two runkeep serve, PostgreSQL", &store);
    drop_schema(&url, &schema);
}
