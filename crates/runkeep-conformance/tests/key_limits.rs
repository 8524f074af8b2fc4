//! The concurrency-key race and the fairness figure on the reference
//! model (the backends run the same functions on their own stores).

use std::sync::Arc;
use std::time::Duration;

use runkeep::{MemoryStore, RunStore};
use runkeep_conformance::key_limits::{drain_keyed, fairness, Fairness, KeyRace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_workers_never_hold_a_key_past_its_limit_on_the_reference_model() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let report = drain_keyed(
        &[store],
        &KeyRace {
            runs: 200,
            ..KeyRace::full()
        },
    )
    .await;
    eprintln!("{}", report.line("memory"));
    report.assert_clean("memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_most_of_the_queue_does_not_starve_the_others_on_the_reference_model() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let report = fairness(
        &[store],
        &Fairness {
            workers: 8,
            big_runs: 180,
            big_limit: 2,
            other_runs: 20,
            // Long enough that the big key's 180 runs (2 at a time) outlast
            // the other runs' arrival on a loaded machine: the test asks
            // whether they were claimed while the big key still waited.
            hold: Duration::from_millis(10),
        },
    )
    .await;
    eprintln!("{}", report.line("memory"));
    assert_eq!(report.big_most, 2, "the big key must be held at its limit");
    assert_eq!(report.cycles.len(), 20);
    // Not starved: every other key's run was claimed while big-key runs
    // still waited (the waits in drain cycles are the figure, printed).
    assert_eq!(
        report.claimed_while_big_waited,
        20,
        "another key's run waited behind the big key: {}",
        report.line("memory")
    );
}
