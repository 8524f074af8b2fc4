//! The conformance kit every runkeep backend runs.
//!
//! Each case is a plain generic async function over `Arc<dyn RunStore>`. A
//! backend opts in with one macro line and a factory that builds a fresh
//! store per case together with a cleanup guard:
//!
//! ```no_run
//! # // in a backend's tests/conformance.rs (needs tokio as a dev-dependency)
//! use std::sync::Arc;
//! use runkeep_conformance::{conformance_tests, support, Fixture};
//!
//! async fn memory() -> Fixture {
//!     // The store judges time by a clock the cases can move.
//!     let clock = support::store_clock();
//!     let store = runkeep::MemoryStore::with_clock(Arc::new(clock.clone()));
//!     Fixture::new(Arc::new(store), 3, ()).with_clock(clock)
//! }
//! conformance_tests!(memory);
//! ```
//!
//! # The store clock
//!
//! Contract v2 judges time by the store's clock when a call passes no
//! instant. Cases that depend on time move a [`ManualClock`] the fixture's
//! store was built on ([`Fixture::with_clock`]); a fixture without one fails
//! those cases loudly (they are never skipped).
//!
//! Every case becomes its own `#[tokio::test]`, named as a sentence, so a
//! failure says which contract rule broke and cases can be run one by one.
//! The guard is dropped after the case, pass or fail. No case is skipped by
//! a capability flag: a backend bound to one tenant must *refuse* a foreign
//! tenant's writes, and the multi-tenant case checks exactly that.
//!
//! The kit has meta-tests (`tests/meta.rs`): stores broken on purpose must
//! fail the cases named for them, so a kit that cannot fail would be caught.
//!
//! # Wrapping a store in tests
//!
//! A test store that changes a few calls of a working store (injects a
//! fault, counts calls, breaks a rule on purpose) implements
//! [`intercept::Intercept`], overriding only those calls, and is used as
//! `Arc::new(Intercepted(wrapper))`; see [`intercept`] for what every call
//! it does not override does.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use runkeep::{ManualClock, RunStore};

pub mod cases;
pub mod differential;
pub mod hijack;
pub mod intercept;
pub mod key_limits;
pub mod scale;
pub mod support;

pub use intercept::{Intercept, Intercepted};

/// The contract revision this kit checks (the core's
/// [`runkeep::CONTRACT_REVISION`]). A backend passes the revision it was
/// written against **as a literal**; passing this constant back would make
/// the version case unfailable.
pub const CONTRACT_VERSION: u32 = runkeep::CONTRACT_REVISION;

/// What changed in each revision, for the refusal of a backend that
/// declares an older one.
pub const CHANGES_IN_V2: &str = "contract v2 added: run lifecycle (finish, reopen, enqueue; status and finished_at in listing rows; the status filter; claim answers Finished), attempts and dead-lettering (a takeover from an expired lease counts; the limit finishes the run as failed \"attempts exhausted\"), deferral (snooze, available_at; claims answer NotBefore), failed attempts (fail_attempt counts, defers by the run's backoff and dead-letters at the limit with the error history) cancel (an operator's cancel finishes the run; the holder's writes answer Cancelled) and timeouts (a run's deadline is judged by its next claim; its attempt timeout rides on every lease), the atomic step (EvidenceStore::commit_step, all or nothing under one fence check), indexed answers (latest_checkpoint, find_pending, resume_point are contract methods), the store clock (CheckpointStore::now judges every call that passes no instant) and watch (CheckpointStore::watch wakes idle workers)";

/// What revision 3 added, for the refusal of a backend that declares an
/// older one.
pub const CHANGES_IN_V3: &str = "contract v3 added: priorities (enqueue's priority, set_priority, claim_next takes the highest first, the listing's priority order and min_priority filter), concurrency keys (a run's key and limit, claim_next skips a key at its limit, key_holdings answers the store's own holdings history), the dedupe window (enqueue_once), schedules (put/get/list/delete/advance_schedule: each tick enqueued once), retention (prune_finished deletes finished runs past their retention, never a reopened or held one) and update_checkpoint (a read-modify-write of one checkpoint, atomic across processes)";

/// What changed since `declared`: each later revision's list, oldest
/// first.
pub fn changes_since(declared: u32) -> String {
    [(2, CHANGES_IN_V2), (3, CHANGES_IN_V3)]
        .into_iter()
        .filter(|(revision, _)| *revision > declared)
        .map(|(_, changes)| changes)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a case is run with besides the store: the declared revision and
/// the store's clock.
#[derive(Clone, Debug)]
pub struct CaseEnv {
    /// The contract revision the backend declares (a literal).
    pub contract_version: u32,
    /// The clock the store was built on, if the fixture provides one.
    pub clock: Option<ManualClock>,
}

impl CaseEnv {
    /// The store's clock, set to [`support::NOW`]. Panics (the case fails,
    /// it is never skipped) when the fixture provides none.
    pub fn clock(&self) -> ManualClock {
        let Some(c) = self.clock.clone() else {
            panic!(
                "this case judges time by the store's clock, but the fixture provides none \
                 (contract v{}): build the store on a ManualClock (support::store_clock()) and \
                 pass it with Fixture::with_clock",
                self.contract_version
            );
        };
        c.set(support::at(0));
        c
    }
}

/// A fresh store for one case, plus whatever must live until the case ends
/// (a temp directory, a database schema) and is cleaned up when dropped.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn RunStore>,
    /// The contract revision the backend declares (a literal).
    pub contract_version: u32,
    /// The clock the store judges time by, when the cases may move it.
    pub clock: Option<ManualClock>,
    _guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .field("contract_version", &self.contract_version)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture with a cleanup guard.
    pub fn new(store: Arc<dyn RunStore>, contract_version: u32, guard: impl Any + Send) -> Self {
        Self {
            store,
            contract_version,
            clock: None,
            _guard: Box::new(guard),
        }
    }

    /// The clock `store` was built on (its store clock), so the cases that
    /// depend on time can move it. Without it those cases fail.
    pub fn with_clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// What the cases are run with.
    pub fn env(&self) -> CaseEnv {
        CaseEnv {
            contract_version: self.contract_version,
            clock: self.clock.clone(),
        }
    }
}

/// A boxed case future.
pub type CaseFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A case as a function of the store and its environment.
pub type CaseFn = fn(Arc<dyn RunStore>, CaseEnv) -> CaseFuture;

/// A case by name, for meta-tests and custom runners.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (its test name).
    pub name: &'static str,
    /// Runs the case against a fixture's store and environment.
    pub run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Runs one case against a fresh fixture; the guard is dropped afterwards,
/// pass or fail, and a failure is re-raised with the case's own message.
pub async fn run_case<F, Fut>(factory: F, case: CaseFn)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Fixture>,
{
    let fixture = factory().await;
    let outcome = tokio::spawn(case(fixture.store.clone(), fixture.env())).await;
    drop(fixture);
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => panic!("case did not complete: {e}"),
        }
    }
}

/// Runs `case` on `store` and answers `Err(message)` if it failed. For
/// meta-tests and custom runners.
pub async fn outcome_of(case: Case, store: Arc<dyn RunStore>, env: CaseEnv) -> Result<(), String> {
    match tokio::spawn((case.run)(store, env)).await {
        Ok(()) => Ok(()),
        Err(e) => match e.try_into_panic() {
            Ok(p) => Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "panicked".into())),
            Err(e) => Err(format!("did not complete: {e}")),
        },
    }
}

#[doc(hidden)]
#[macro_export]
macro_rules! __runkeep_cases {
    (@list [$($mode:tt)*]) => {
        $crate::__runkeep_cases! {@expand [$($mode)*]
            declares_the_contract_revision_this_suite_implements,
            gives_the_run_to_the_first_taker_and_refuses_the_second,
            advances_the_fence_on_renewal_so_a_stalled_twin_cannot_write,
            judges_expiry_at_the_injected_instant,
            lets_a_later_worker_take_a_run_whose_holder_went_away,
            returns_the_run_to_the_queue_when_its_holder_releases,
            releases_only_on_the_fence_that_currently_holds_it,
            a_superseded_holders_late_release_leaves_the_new_holder_intact,
            issues_fence_plus_two_after_a_release,
            never_reissues_a_fence_across_claim_release_cycles,
            gives_exactly_one_lease_to_simultaneous_takers,
            reports_no_lease_for_a_run_never_claimed,
            lets_the_current_holder_keep_writing,
            still_accepts_an_unfenced_write_on_a_claimed_run,
            fences_the_stalled_holder_out_at_the_moment_it_writes,
            still_refuses_a_superseded_fence_after_the_new_holder_releases,
            refuses_the_fence_its_own_holder_just_released,
            refuses_a_fence_that_was_never_issued,
            a_refused_write_leaves_nothing_behind,
            fences_every_kind_of_run_evidence,
            reads_back_a_checkpoint_whole,
            stamps_each_checkpoint_with_the_fence_it_was_written_under,
            orders_latest_by_fence_before_clock,
            lists_checkpoints_in_the_total_order,
            replaces_a_checkpoint_written_twice_under_one_id,
            answers_absence_and_deletes_idempotently,
            refuses_an_invalid_checkpoint_and_changes_nothing,
            hands_out_copies_not_references,
            answers_a_park_once_and_refuses_the_second_answer,
            lets_exactly_one_of_concurrent_answers_win,
            expires_a_park_only_after_its_deadline,
            reads_an_answer_after_the_deadline_as_resolved,
            never_prunes_an_unanswered_park,
            agrees_between_pending_lookup_and_listing,
            shows_a_live_park_over_a_newer_resolved_one,
            answers_nothing_for_a_tenant_it_does_not_hold,
            answers_nothing_for_a_project_it_does_not_hold,
            narrows_the_listing_to_a_session,
            rebuilds_an_addressable_row_for_every_run_it_holds,
            keeps_one_tenants_runs_out_of_another_tenants_listing,
            shows_the_queue_reader_which_runs_nobody_holds,
            shows_a_released_run_as_a_tombstone_not_a_live_claim,
            filters_the_listing_by_park_state,
            walks_every_row_exactly_once_in_both_orders,
            keeps_paging_stable_when_a_run_checkpoints_between_pages,
            carries_a_cursor_only_while_rows_remain,
            treats_limit_zero_as_one,
            puts_unrecorded_start_first_and_recorded_zero_after,
            keeps_run_start_when_the_oldest_checkpoint_is_pruned,
            refuses_a_cursor_from_another_order_or_a_forged_one,
            lists_sub_runs_with_their_parent,
            claim_next_takes_only_runs_nobody_holds,
            claim_next_respects_the_park_filter,
            concurrent_claim_next_never_hands_one_run_to_two_workers,
            hands_over_from_a_finished_step_to_the_next_run,
            a_refused_hand_over_claims_nothing,
            a_hand_over_after_its_own_lease_lapsed_takes_the_run_again,
            never_hands_over_to_the_run_the_step_just_finished,
            concurrent_hand_overs_never_give_one_run_to_two_workers,
            claim_next_batch_takes_runs_in_claim_order_each_leased_alone,
            claim_next_batch_counts_its_own_runs_against_a_key_limit,
            claim_next_batch_counts_the_keys_holders_and_its_own_runs_together,
            claim_next_batch_refuses_a_size_of_zero_or_above_the_limit,
            commit_steps_refuses_only_the_stale_step_and_commits_the_others,
            commit_steps_refuses_a_bad_batch_and_writes_nothing,
            numbers_events_contiguously_from_one,
            reads_events_after_since_seq_exclusively,
            never_gives_two_concurrent_appends_one_number,
            stamps_events_with_their_generation,
            reads_back_the_run_record_messages_and_report,
            keeps_the_audit_trail_in_its_own_sequence,
            records_the_last_completion_of_each_tool,
            finishes_a_run_with_each_status_and_keeps_its_result_and_reason,
            refuses_a_finish_under_a_stale_released_or_never_issued_fence,
            spends_the_fence_on_finish_so_writes_under_it_are_refused,
            lists_a_finished_run_with_its_status_and_finish_time,
            answers_finished_to_a_claim_and_claim_next_never_takes_it,
            refuses_a_second_finish_as_a_conflict,
            reopens_a_finished_run_at_a_fence_above_every_fence_issued,
            refuses_to_reopen_an_active_run_or_a_missing_one,
            treats_a_run_without_a_lifecycle_record_as_active,
            counts_an_attempt_only_for_a_takeover_from_an_expired_lease,
            dead_letters_the_run_when_the_takeover_reaches_the_limit,
            takes_the_attempt_limit_from_the_claim_over_the_run_over_the_default,
            snooze_releases_the_run_and_defers_it_until_its_instant,
            claim_next_skips_a_deferred_run_until_it_is_available,
            enqueues_a_runnable_run_with_its_not_before_time_and_attempt_limit,
            refuses_to_enqueue_an_existing_run_or_a_zero_attempt_limit,
            records_a_failed_attempt_and_defers_the_run_by_its_backoff,
            dead_letters_the_run_when_failed_attempts_reach_the_limit,
            counts_takeovers_and_failed_attempts_toward_one_limit,
            refuses_a_failed_attempt_it_cannot_record_and_changes_nothing,
            cancels_a_claimed_run_and_tells_its_holder_why,
            cancels_an_unclaimed_run_and_refuses_what_it_cannot_cancel,
            a_claim_after_a_release_is_a_new_claim_not_a_renewal,
            finishes_a_run_past_its_deadline_at_its_next_claim,
            hands_the_runs_attempt_timeout_to_every_taker,
            commits_a_whole_step_with_its_finish,
            defaults_the_message_boundary_to_the_steps_last_event,
            leaves_nothing_of_a_step_refused_for_its_fence,
            leaves_nothing_of_a_step_with_one_invalid_part,
            leaves_nothing_of_a_step_on_a_finished_run,
            agrees_on_the_latest_checkpoint_with_the_full_read,
            agrees_on_the_pending_park_and_resume_point_with_the_full_read,
            lists_checkpoint_ids_by_prefix_before_and_limit_greatest_first,
            judges_expiry_on_the_store_clock_when_no_instant_is_passed,
            never_lets_two_clients_with_skewed_clocks_both_hold_a_live_lease,
            wakes_a_runnable_watcher_after_a_release_an_enqueue_and_a_reopen,
            wakes_an_events_watcher_after_an_append,
            claim_next_takes_the_highest_priority_first_then_the_order,
            lists_runs_by_priority_and_filters_by_a_lowest_priority,
            sets_a_priority_only_on_an_active_run,
            holds_at_most_the_limit_of_runs_of_one_key,
            claim_next_skips_runs_of_a_key_at_its_limit,
            an_expired_holding_frees_its_slot_and_a_late_renewal_is_judged,
            keeps_every_holding_of_a_keyed_run_in_the_keys_history,
            dedupes_an_enqueue_inside_its_window_and_not_after,
            concurrent_enqueues_with_one_key_create_one_run,
            refuses_bad_scheduling_options_and_changes_nothing,
            keeps_schedules_and_refuses_bad_ones,
            moves_a_schedule_cursor_only_by_compare_and_set,
            enqueues_each_tick_once_whoever_runs_the_scheduler,
            prunes_a_due_finished_run_with_all_its_evidence,
            keeps_every_run_that_is_not_due,
            prunes_at_most_the_limit_and_says_when_more_are_due,
        }
    };
    // Writes made for a principal (`cases::actors`): in process only, where
    // a caller can choose the principal it acts for.
    (@actors [$($mode:tt)*]) => {
        $crate::__runkeep_cases! {@expand [$($mode)*]
            refuses_every_fenced_act_on_a_holding_another_principal_claimed,
            refuses_a_fence_issued_to_another_principal_after_the_act_was_prepared,
            refuses_an_unfenced_write_for_a_principal_while_a_lease_is_on_top,
        }
    };
    // `update_checkpoint` (`cases::updates`): in process only, where the
    // update is a function the store can call; over HTTP the server's
    // thread writes route makes the update, in the server's own store.
    (@updates [$($mode:tt)*]) => {
        $crate::__runkeep_cases! {@expand [$($mode)*]
            updates_a_checkpoint_from_what_is_stored,
            concurrent_updates_of_one_checkpoint_lose_none,
            fences_an_update_like_a_write,
            refuses_a_failed_or_invalid_update_and_changes_nothing,
            an_overtaken_resume_leaves_the_next_question_waiting,
        }
    };
    (@expand [tests $factory:path] $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::run_case($factory, |s, v| ::std::boxed::Box::pin($crate::cases::$case(s, v))).await;
            }
        )*
    };
    (@expand [registry] $($case:ident),* $(,)?) => {
        vec![$(
            $crate::Case {
                name: stringify!($case),
                run: |s, v| ::std::boxed::Box::pin($crate::cases::$case(s, v)),
            }
        ),*]
    };
}

/// Emits one `#[tokio::test]` per conformance case, each building a fresh
/// fixture with `factory` (an `async fn() -> Fixture` in scope).
///
/// `conformance_tests!(factory, over_http)` is for a client whose principal
/// is fixed by its credentials (`HttpStore`): it leaves out the cases of
/// writes made for a chosen principal ([`cases`]' `actors`), which such a
/// client cannot make (the server checks that rule through two tokens in
/// its own tests), and the `update_checkpoint` cases ([`cases`]'
/// `updates`): an update is a function, which such a client refuses to
/// send (the server's thread routes make the update in its own store).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::__runkeep_cases!(@list [tests $factory]);
        $crate::__runkeep_cases!(@actors [tests $factory]);
        $crate::__runkeep_cases!(@updates [tests $factory]);
    };
    ($factory:path, over_http) => {
        $crate::__runkeep_cases!(@list [tests $factory]);
    };
}

/// Every case, by name.
pub fn all_cases() -> Vec<Case> {
    let mut cases = __runkeep_cases!(@list [registry]);
    cases.extend(__runkeep_cases!(@actors [registry]));
    cases.extend(__runkeep_cases!(@updates [registry]));
    cases
}
