//! The conformance kit every runkeep backend runs.
//!
//! Each case is a plain generic async function over `Arc<dyn RunStore>`. A
//! backend opts in with one macro line and a factory that builds a fresh
//! store per case together with a cleanup guard:
//!
//! ```no_run
//! # // in a backend's tests/conformance.rs (needs tokio as a dev-dependency)
//! use std::sync::Arc;
//! use runkeep_conformance::{conformance_tests, Fixture};
//!
//! async fn memory() -> Fixture {
//!     Fixture::new(Arc::new(runkeep::MemoryStore::new()), 1, ())
//! }
//! conformance_tests!(memory);
//! ```
//!
//! Every case becomes its own `#[tokio::test]`, named as a sentence, so a
//! failure says which contract rule broke and cases can be run one by one.
//! The guard is dropped after the case, pass or fail. No case is skipped by
//! a capability flag: a backend bound to one tenant must *refuse* a foreign
//! tenant's writes, and the multi-tenant case checks exactly that.
//!
//! The kit has meta-tests (`tests/meta.rs`): stores broken on purpose must
//! fail the cases named for them, so a kit that cannot fail would be caught.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use runkeep::RunStore;

pub mod cases;
pub mod support;

/// The contract revision this kit checks. A backend passes the revision it
/// was written against **as a literal**; passing this constant back would
/// make the version case unfailable.
pub const CONTRACT_VERSION: u32 = 1;

/// A fresh store for one case, plus whatever must live until the case ends
/// (a temp directory, a database schema) and is cleaned up when dropped.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn RunStore>,
    /// The contract revision the backend declares (a literal).
    pub contract_version: u32,
    _guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .field("contract_version", &self.contract_version)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture with a cleanup guard.
    pub fn new(store: Arc<dyn RunStore>, contract_version: u32, guard: impl Any + Send) -> Self {
        Self {
            store,
            contract_version,
            _guard: Box::new(guard),
        }
    }
}

/// A boxed case future.
pub type CaseFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A case by name, for meta-tests and custom runners.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name (its test name).
    pub name: &'static str,
    /// Runs the case against a fixture's store and declared version.
    pub run: fn(Arc<dyn RunStore>, u32) -> CaseFuture,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Runs one case against a fresh fixture; the guard is dropped afterwards,
/// pass or fail, and a failure is re-raised with the case's own message.
pub async fn run_case<F, Fut>(factory: F, case: fn(Arc<dyn RunStore>, u32) -> CaseFuture)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Fixture>,
{
    let fixture = factory().await;
    let outcome = tokio::spawn(case(fixture.store.clone(), fixture.contract_version)).await;
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
pub async fn outcome_of(
    case: Case,
    store: Arc<dyn RunStore>,
    contract_version: u32,
) -> Result<(), String> {
    match tokio::spawn((case.run)(store, contract_version)).await {
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
            numbers_events_contiguously_from_one,
            reads_events_after_since_seq_exclusively,
            never_gives_two_concurrent_appends_one_number,
            stamps_events_with_their_generation,
            reads_back_the_run_record_messages_and_report,
            keeps_the_audit_trail_in_its_own_sequence,
            records_the_last_completion_of_each_tool,
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
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::__runkeep_cases!(@list [tests $factory]);
    };
}

/// Every case, by name.
pub fn all_cases() -> Vec<Case> {
    __runkeep_cases!(@list [registry])
}
