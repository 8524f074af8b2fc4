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

/// The fairness drain on four `FsStore`s of one directory: `big_runs` runs
/// of one key at limit 2 queued, 20 runs of other keys arriving one per
/// drain cycle, each run held `hold`. `warm`: every store's session index
/// is built (on the empty directory) before the queue is, so the drain's
/// `claim_next` calls take the index's streams; cold, the drain's first
/// calls start the index builds and walk meanwhile (on a loaded machine
/// the whole measurement happens before the indexes are built).
async fn fairness_on_a_directory(label: &str, warm: bool, big_runs: usize, hold: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let fs = stores(dir.path(), 4);
    if warm {
        for s in &fs {
            s.testing().wait_index().expect("the index is built");
        }
    }
    let all: Vec<Arc<dyn RunStore>> = fs.iter().map(|s| s.clone() as Arc<dyn RunStore>).collect();
    let report = fairness(
        &all,
        &Fairness {
            workers: 8,
            big_runs,
            big_limit: 2,
            other_runs: 20,
            hold,
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
    // machine makes each call longer, not the calls more numerous). The
    // median is held to the figure; the slowest to three cycles, a margin
    // for the loaded 2-core machine (the calls in flight when a run
    // arrives started before it and cannot see it), still far below what
    // the walk in pages measured (cold: p50 5.5, max 9.4).
    assert!(
        report.median_cycles() <= 1.0 && report.max_cycles() <= 3.0,
        "the other keys' runs waited more than a drain cycle: {}",
        report.line(label)
    );
}

/// How long each run is held in the fairness drains. The figure is about
/// a key *at its limit*, and with 2 ms holds the big key mostly is not on
/// the loaded test machine: its holding (2 ms and the finish) ends before
/// the next `claim_next` reaches it (5-60 ms a call at load 15: the sync of
/// the other workers' changes, the row read, the key lock), so with the
/// index built the index counted it at its limit in 20 of 620 calls, the
/// other calls rightly took its runs (first in the order), and the waits
/// measured p50 0.5-8.8 cycles, the cold drain p50 1.0 / max 3.1 once.
/// PostgreSQL's calls (about a millisecond) keep it at its limit with 2 ms.
const HOLD: Duration = Duration::from_millis(20);

/// Cold: 600 big-key runs. Mutation: `claim_next`'s walk in pages of 16
/// that tries every row of a saturated key (before `listing::walk_claim`)
/// → p50 5.5 / max 9.4 cycles, fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_a_directory() {
    fairness_on_a_directory(
        "directory, cold (the drain starts the index builds)",
        false,
        600,
        HOLD,
    )
    .await;
}

/// With the index built before the queue: 300 big-key runs outlast the
/// arrivals.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_an_indexed_directory() {
    fairness_on_a_directory("directory, index built", true, 300, HOLD).await;
}
