//! The cases, grouped by the rule they check. Each is `async fn(store,
//! env)` ([`crate::CaseEnv`]: the declared revision and the store clock)
//! and panics with a message naming what broke.

mod actors;
mod attempts;
mod batches;
mod checkpoints;
mod claims;
mod clock;
mod deferral;
mod evidence;
mod failures;
mod fencing;
mod handover;
mod indexed;
mod lifecycle;
mod listing;
mod parks;
mod queue;
mod retention;
mod schedules;
mod scheduling;
mod step;
mod updates;
mod watch;

pub use actors::*;
pub use attempts::*;
pub use batches::*;
pub use checkpoints::*;
pub use claims::*;
pub use clock::*;
pub use deferral::*;
pub use evidence::*;
pub use failures::*;
pub use fencing::*;
pub use handover::*;
pub use indexed::*;
pub use lifecycle::*;
pub use listing::*;
pub use parks::*;
pub use queue::*;
pub use retention::*;
pub use schedules::*;
pub use scheduling::*;
pub use step::*;
pub use updates::*;
pub use watch::*;
