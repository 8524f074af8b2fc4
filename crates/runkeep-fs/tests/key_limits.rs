//! The conformance kit's concurrency-key race and fairness figure
//! (`runkeep_conformance::key_limits`) on directories: several `FsStore`s
//! opened on one directory (as several processes would), and a root store.

use std::sync::Arc;
use std::time::Duration;

use runkeep::RunStore;
use runkeep_conformance::key_limits::{drain_keyed, fairness, Fairness, KeyRace};
use runkeep_conformance::support;
use runkeep_fs::{Attribution, FsOptions, FsRootOptions, FsRootStore, FsStore};

/// `n` stores on one session directory.
fn sessions(dir: &std::path::Path, n: usize) -> Vec<Arc<dyn RunStore>> {
    (0..n)
        .map(|_| {
            Arc::new(
                FsStore::open(
                    dir.join("runs"),
                    FsOptions {
                        attribution: Some(Attribution {
                            tenant_id: support::tenant(),
                            project_id: support::project(),
                            session_id: support::session(),
                        }),
                        ..Default::default()
                    },
                )
                .unwrap(),
            ) as Arc<dyn RunStore>
        })
        .collect()
}

/// The kit's drain (runs in blocks of one key, 10 ms holds), 200 runs.
fn race() -> KeyRace {
    KeyRace {
        runs: 200,
        ..KeyRace::full()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_workers_on_four_stores_of_one_directory_never_hold_a_key_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let report = drain_keyed(&sessions(dir.path(), 4), &race()).await;
    eprintln!("{}", report.line("directory"));
    report.assert_clean("directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_workers_on_a_root_never_hold_a_key_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root: Arc<dyn RunStore> =
        Arc::new(FsRootStore::open(dir.path(), FsRootOptions::default()).unwrap());
    let report = drain_keyed(&[root], &race()).await;
    eprintln!("{}", report.line("root"));
    report.assert_clean("root");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let report = fairness(
        &sessions(dir.path(), 4),
        &Fairness {
            workers: 8,
            // Long enough that the big key's queue outlasts the other
            // runs' waits on a loaded CI machine (at 180 one CI run saw the
            // big queue drained while an other-key run, enqueued late,
            // still waited: 19 of 20).
            big_runs: 600,
            big_limit: 2,
            other_runs: 20,
            hold: Duration::from_millis(2),
        },
    )
    .await;
    eprintln!("{}", report.line("directory"));
    assert_eq!(report.big_most, 2, "the big key must be held at its limit");
    assert_eq!(report.cycles.len(), 20);
    assert_eq!(
        report.claimed_while_big_waited,
        20,
        "another key's run waited behind the big key: {}",
        report.line("directory")
    );
}
