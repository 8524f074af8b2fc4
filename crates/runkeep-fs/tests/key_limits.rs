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
    stores(dir, n)
        .into_iter()
        .map(|s| s as Arc<dyn RunStore>)
        .collect()
}

/// [`sessions`], as `FsStore`s.
fn stores(dir: &std::path::Path, n: usize) -> Vec<Arc<FsStore>> {
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
            )
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

/// The fairness drain on four `FsStore`s of one directory: 600 runs of one
/// key at limit 2 queued, 20 runs of other keys arriving one per drain
/// cycle. `warm`: every store's session index is built (on the empty
/// directory) before the queue is, so the drain's `claim_next` calls take
/// the index's skipping streams; cold, the indexes are built in the
/// background by the drain's first calls, which walk meanwhile.
async fn fairness_on_a_directory(label: &str, warm: bool) {
    let dir = tempfile::tempdir().unwrap();
    let fs = stores(dir.path(), 4);
    if warm {
        for s in &fs {
            s.testing().wait_index().expect("the index is built");
        }
    }
    let report = fairness(
        &fs.iter()
            .map(|s| s.clone() as Arc<dyn RunStore>)
            .collect::<Vec<_>>(),
        &Fairness {
            workers: 8,
            // Long enough that the big key's queue outlasts the other
            // runs' arrivals on a loaded CI machine (at 180 one CI run saw
            // the big queue drained while an other-key run still waited).
            big_runs: 600,
            big_limit: 2,
            other_runs: 20,
            hold: Duration::from_millis(2),
        },
    )
    .await;
    eprintln!("{}", report.line(label));
    assert_eq!(report.big_most, 2, "the big key must be held at its limit");
    assert_eq!(report.cycles.len(), 20);
    assert_eq!(
        report.claimed_while_big_waited,
        20,
        "another key's run waited behind the big key: {}",
        report.line(label)
    );
    // Issue 30's figure: the other keys' runs start within one drain cycle
    // of their enqueue. Counted in calls, not milliseconds (a loaded
    // machine makes each call longer, not the calls more numerous): the
    // median within one cycle, the slowest within two (the calls in
    // flight when a run arrives, up to one per worker, started before it
    // and cannot see it). Before the walk skipped keys at their limit the
    // cold drain measured p50 6.4 / max 9.6 cycles here.
    assert!(
        report.median_cycles() <= 1.0 && report.max_cycles() <= 2.0,
        "the other keys' runs waited more than a drain cycle: {}",
        report.line(label)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_a_directory() {
    fairness_on_a_directory("directory, cold (the drain starts the index builds)", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_an_indexed_directory() {
    fairness_on_a_directory("directory, index built", true).await;
}
