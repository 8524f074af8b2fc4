//! The `queue` checks: dead-lettered runs, runnable runs nobody takes.

use super::*;

/// Runs dead-lettered by their attempt limit: status `failed` with the
/// reason [`ATTEMPTS_EXHAUSTED`], which the listing row carries
/// ([`RunRow::dead_lettered`]): no lifecycle is read. A run failed by its
/// holder (any other reason) is an outcome, not a finding.
pub(super) async fn dead_lettered(env: &Env) -> CliResult<Outcome> {
    let rows = listing_rows(env).await?;
    if rows.is_empty() {
        return Ok(Outcome::skipped(format!(
            "no runs in {}",
            env.scope.listing()?
        )));
    }
    let dead: Vec<String> = rows
        .iter()
        .filter(|r| r.damaged.is_none() && r.dead_lettered)
        .map(|row| {
            format!(
                "{} ({} attempt(s){})",
                row.scope.run_id,
                row.attempts,
                row.finished_at
                    .map(|t| format!(", failed {}", crate::output::relative(t, env.now)))
                    .unwrap_or_default()
            )
        })
        .collect();
    if dead.is_empty() {
        return Ok(Outcome::pass(format!(
            "no dead-lettered run among {} run(s)",
            rows.len()
        )));
    }
    let first = dead[0].split(' ').next().unwrap_or("RUN").to_string();
    Ok(Outcome::warn(format!(
        "{} run(s) dead-lettered (failed: {ATTEMPTS_EXHAUSTED}): {}",
        dead.len(),
        env.list(dead)
    ))
    .remedy(format!(
        "each was lost by one holder after another (a worker that crashes or stalls on it every time); see what it did with `runkeep events {first}`, fix the cause, then `runkeep reopen {first}` makes it runnable again (attempts restart at 0)"
    )))
}

/// When a runnable row became takeable, as far as the row can tell: the
/// latest of its latest checkpoint (an enqueue writes one; a worker that
/// released it wrote its last one before), its not-before instant, the
/// expiry of a lapsed lease, and the answer (or the missed deadline) of its
/// park.
pub(super) fn runnable_since(row: &RunRow) -> Option<Timestamp> {
    let lapsed = row
        .claim
        .as_ref()
        .filter(|c| c.expired && !c.holder.is_empty())
        .map(|c| c.expires_at);
    let park = row.park.as_ref().and_then(|p| match p.state {
        runkeep::ParkState::Resolved => p.resolved_at,
        runkeep::ParkState::Expired => p.deadline_at,
        runkeep::ParkState::Outstanding => None,
    });
    [row.latest_checkpoint_at, row.available_at, lapsed, park]
        .into_iter()
        .flatten()
        .max()
}

/// Runnable runs that no worker has taken for longer than `--stale-after`:
/// active, not damaged, nobody holding them live, not deferred past now, not
/// waiting on an outstanding park (a human's answer, not a worker), and
/// [`runnable_since`] more than the threshold ago.
pub(super) async fn stale_runnable(env: &Env) -> CliResult<Outcome> {
    let rows = listing_rows(env).await?;
    if rows.is_empty() {
        return Ok(Outcome::skipped(format!(
            "no runs in {}",
            env.scope.listing()?
        )));
    }
    let threshold = i64::try_from(env.stale_after.as_millis()).unwrap_or(i64::MAX);
    let after = crate::output::human_duration(env.stale_after);
    let runnable: Vec<&RunRow> = rows
        .iter()
        .filter(|r| {
            r.is_claimable(env.now)
                && r.park
                    .as_ref()
                    .is_none_or(|p| p.state != runkeep::ParkState::Outstanding)
        })
        .collect();
    let stale: Vec<String> = runnable
        .iter()
        .filter_map(|r| {
            let since = runnable_since(r)?;
            (env.now.as_millis().saturating_sub(since.as_millis()) > threshold).then(|| {
                format!(
                    "{} (runnable since {})",
                    r.scope.run_id,
                    crate::output::when(since, env.now)
                )
            })
        })
        .collect();
    if stale.is_empty() {
        return Ok(Outcome::pass(format!(
            "no runnable run has waited longer than {after} ({} runnable of {})",
            runnable.len(),
            rows.len()
        )));
    }
    Ok(Outcome::warn(format!(
        "{} runnable run(s) no worker has taken for longer than {after}: {}",
        stale.len(),
        env.list(stale)
    ))
    .remedy("no worker is draining this scope, or every worker is busy: check that workers run against this store and scope, or add workers; `runkeep runs --status active --unclaimed` lists the queue (--stale-after sets the threshold)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runkeep::{CheckpointStore, EnqueueOptions, ManualClock, MemoryStore, PendingDecision};

    const T0: i64 = 1_800_000_000_000;
    const MIN: i64 = 60_000;

    struct Fixture {
        store: Arc<MemoryStore>,
        clock: ManualClock,
        parts: ScopeParts,
    }

    impl Fixture {
        fn new() -> Self {
            let clock = ManualClock::new(Timestamp::from_millis(T0).unwrap());
            Self {
                store: Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
                clock,
                parts: ScopeParts::parse("t", "p", "s").unwrap(),
            }
        }
        fn scope(&self, run: &str) -> RunScope {
            self.parts.run(&run.parse().unwrap(), None).unwrap()
        }
        async fn enqueue(&self, run: &str, options: EnqueueOptions) {
            let now = self.store.now();
            let cp = Checkpoint::new("cp_enqueued".parse().unwrap(), now, Map::new());
            self.store
                .enqueue(&self.scope(run), &cp, &options)
                .await
                .unwrap();
        }
        async fn claim(&self, run: &str, holder: &str, ttl_ms: u64) -> runkeep::ClaimOutcome {
            let opts = ClaimOptions::new(
                Holder::new(holder).unwrap(),
                Ttl::from_millis(ttl_ms).unwrap(),
            );
            self.store.claim(&self.scope(run), &opts).await.unwrap()
        }
        fn env(&self, stale_after_ms: u64) -> Env {
            Env::new(
                StoreAddress::Memory,
                Ok(OpenedStore::memory_for_tests(self.store.clone())),
                self.parts.clone(),
                self.store.now(),
                true,
                std::time::Duration::from_millis(stale_after_ms),
                std::time::Duration::from_secs(10),
            )
        }
    }

    #[tokio::test]
    async fn dead_lettered_runs_warn_by_name_and_a_holders_failure_does_not() {
        let f = Fixture::new();
        let one = EnqueueOptions {
            max_attempts: Some(1),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_poison", one).await;
        f.enqueue("run_failed", EnqueueOptions::default()).await;
        f.enqueue("run_fine", EnqueueOptions::default()).await;
        assert!(dead_lettered(&f.env(1)).await.unwrap().status == Status::Pass);
        // The poison run's holder is lost once: the takeover dead-letters it.
        f.claim("run_poison", "worker-a", 1000)
            .await
            .lease()
            .unwrap();
        // A run its holder finished as failed is an outcome, not a finding.
        let lease = f
            .claim("run_failed", "worker-a", 60_000)
            .await
            .lease()
            .unwrap();
        f.store
            .finish(
                &f.scope("run_failed"),
                lease.fence,
                &runkeep::Outcome::failed("bad input"),
            )
            .await
            .unwrap();
        f.clock.advance(2000);
        assert!(matches!(
            f.claim("run_poison", "worker-b", 1000).await,
            runkeep::ClaimOutcome::Finished(runkeep::RunStatus::Failed)
        ));
        let found = dead_lettered(&f.env(1)).await.unwrap();
        assert_eq!(found.status, Status::Warn, "{}", found.message);
        assert!(
            found.message.contains("run_poison (1 attempt(s)"),
            "{}",
            found.message
        );
        assert!(!found.message.contains("run_failed"), "{}", found.message);
        let fix = found.remediation.unwrap();
        assert!(fix.contains("runkeep reopen run_poison"), "{fix}");
        // Reopened, it is no longer dead-lettered.
        f.store.reopen(&f.scope("run_poison")).await.unwrap();
        assert_eq!(dead_lettered(&f.env(1)).await.unwrap().status, Status::Pass);
    }

    #[tokio::test]
    async fn only_runnable_runs_waiting_past_the_threshold_are_stale() {
        let f = Fixture::new();
        f.enqueue("run_old", EnqueueOptions::default()).await;
        // Deferred until 20 min: not runnable at 11 min.
        let later = EnqueueOptions {
            available_at: Some(Timestamp::from_millis(T0 + 20 * MIN).unwrap()),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_deferred", later).await;
        // Deferred until 5 min: runnable since then (6 min at 11 min).
        let soon = EnqueueOptions {
            available_at: Some(Timestamp::from_millis(T0 + 5 * MIN).unwrap()),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_soon", soon).await;
        f.enqueue("run_held", EnqueueOptions::default()).await;
        f.enqueue("run_lapsed", EnqueueOptions::default()).await;
        f.enqueue("run_done", EnqueueOptions::default()).await;
        f.enqueue("run_parked", EnqueueOptions::default()).await;
        f.claim("run_lapsed", "worker-a", (8 * MIN) as u64)
            .await
            .lease()
            .unwrap();
        let done = f
            .claim("run_done", "worker-a", 60_000)
            .await
            .lease()
            .unwrap();
        f.store
            .finish(
                &f.scope("run_done"),
                done.fence,
                &runkeep::Outcome::completed(None),
            )
            .await
            .unwrap();
        let parked = Checkpoint::new("cp_park".parse().unwrap(), f.store.now(), Map::new())
            .with_pending(PendingDecision::new("review", Map::new(), f.store.now()));
        f.store
            .write_checkpoint(&f.scope("run_parked"), &parked, None)
            .await
            .unwrap();
        f.clock.advance(11 * MIN);
        f.claim("run_held", "worker-b", (10 * MIN) as u64)
            .await
            .lease()
            .unwrap();
        f.enqueue("run_new", EnqueueOptions::default()).await;
        let found = stale_runnable(&f.env((10 * MIN) as u64)).await.unwrap();
        assert_eq!(found.status, Status::Warn, "{}", found.message);
        assert!(
            found.message.starts_with("1 runnable run(s)"),
            "{}",
            found.message
        );
        assert!(
            found.message.contains("run_old (runnable since"),
            "{}",
            found.message
        );
        // A lease that lapsed 3 min ago, a run deferred past now or until
        // 6 min ago, a held, finished, parked or new run: none is stale.
        let found = stale_runnable(&f.env((5 * MIN) as u64)).await.unwrap();
        assert!(found.message.contains("run_soon"), "{}", found.message);
        assert!(!found.message.contains("run_lapsed"), "{}", found.message);
        for quiet in [
            "run_deferred",
            "run_held",
            "run_done",
            "run_parked",
            "run_new",
        ] {
            assert!(!found.message.contains(quiet), "{quiet}: {}", found.message);
        }
        let lapsed = stale_runnable(&f.env((2 * MIN) as u64)).await.unwrap();
        assert!(lapsed.message.contains("run_lapsed"), "{}", lapsed.message);
        assert_eq!(
            stale_runnable(&f.env((60 * MIN) as u64))
                .await
                .unwrap()
                .status,
            Status::Pass
        );
    }
}
