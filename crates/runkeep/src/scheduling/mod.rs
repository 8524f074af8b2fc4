//! Which run goes next, and for how long finished ones are kept: the
//! queue's rules beyond the lease. Pure functions over plain values, used by
//! every backend under its own lock or transaction.
//!
//! - [`priority`]: a run's priority; `claim_next` takes the highest first,
//!   then the filter's order.
//! - [`concurrency`]: a run's concurrency key and limit; at most `limit`
//!   runs of one key (within one session) are held live at once, and the
//!   store keeps every holding of a keyed run as the key's history.
//! - [`dedupe`]: an enqueue carrying an idempotency key and a window
//!   returns the run a first enqueue with that key created inside the
//!   window instead of creating another.
//! - [`schedule`]: recurring schedules; one run per cron tick, its id
//!   derived from the schedule and the tick.
//! - [`retention`]: when a finished run may be deleted, and what a prune
//!   deletes with it.

pub mod concurrency;
pub mod dedupe;
pub mod priority;
pub mod retention;
pub mod schedule;

pub use concurrency::{Concurrency, KeyBusy, KeyHolding};
pub use dedupe::{Dedupe, DedupeRecord, Enqueued};
pub use priority::Priority;
pub use retention::{PruneDuty, PruneReport, RetentionPolicy};
pub use schedule::{MissedTicks, Schedule, ScheduleEntry};
