//! A checkpoint that vanishes between the directory read and its own
//! read (a concurrent delete or prune) is left out, never an error, for the
//! checkpoint list and for the listing row. The interleaving is forced: the
//! reading process stops at `checkpoints-before-read` (after its `readdir`,
//! before it opens the entries), the file is deleted while it is stopped,
//! then it goes on.

mod common;

use std::time::{Duration, Instant};

use common::*;
use runkeep::{CheckpointStore, ListingScope};

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    let base = std::path::PathBuf::from(env("BASE"));
    let store = open(&base);
    let rt = rt();
    let s = scope("run_v");
    match role.as_str() {
        "list-checkpoints" => match rt.block_on(store.list_checkpoints(&s)) {
            Ok(cps) => report(format!(
                "ok {}",
                cps.iter()
                    .map(|c| c.id.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            Err(e) => report(format!("err {}", e.to_string().replace('\n', " "))),
        },
        "list-runs" => {
            let listing = ListingScope::session(tenant(), project(), session());
            match rt.block_on(store.list_runs(&listing, &Default::default())) {
                Ok(page) => {
                    let row = &page.entries[0];
                    report(format!(
                        "ok count={} damaged={:?}",
                        row.checkpoint_count, row.damaged
                    ))
                }
                Err(e) => report(format!("err {}", e.to_string().replace('\n', " "))),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

/// A run with `cp_keep` (written by the store) and `cp_flicker` (written
/// behind the store's back, so the stored digest is stale and the listing
/// reads the entries too); a worker in `role` stopped after its `readdir`
/// saw both; `cp_flicker` deleted; the worker let go. Its report.
fn vanish_mid_enumeration(role: &str) -> String {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_v");
    rt.block_on(store.write_checkpoint(&s, &cp("cp_keep", 1), None))
        .unwrap();
    let cps = base.join("run_v/checkpoints");
    let body = std::fs::read_to_string(cps.join("cp_keep.json"))
        .unwrap()
        .replace("cp_keep", "cp_flicker");
    std::fs::write(cps.join("cp_flicker.json"), body).unwrap();
    let mut w = spawn(
        role,
        &[
            ("BASE", base.display().to_string()),
            (
                "RUNKEEP_FS_TEST_PAUSE",
                "checkpoints-before-read".to_string(),
            ),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while proc_state(w.pid()) != 'T' {
        assert!(
            Instant::now() < deadline,
            "{role} never stopped between its readdir and its reads: the race did not happen (reports {:?})",
            w.reports
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Listed (it existed before the worker started), now gone.
    std::fs::remove_file(cps.join("cp_flicker.json")).unwrap();
    signal(w.pid(), rustix::process::Signal::Cont);
    let got = w.expect("", Duration::from_secs(30));
    w.finish(Duration::from_secs(30));
    got
}

#[test]
fn a_checkpoint_deleted_after_the_readdir_is_left_out_of_the_list() {
    assert_eq!(vanish_mid_enumeration("list-checkpoints"), "ok cp_keep");
}

#[test]
fn a_checkpoint_deleted_after_the_readdir_does_not_flag_the_listing_row() {
    assert_eq!(
        vanish_mid_enumeration("list-runs"),
        "ok count=1 damaged=None"
    );
}
